#!/bin/bash
# The GPU check: one prepared script of under 9 minutes for a machine with one NVIDIA GPU and PyTorch 2.x
# (it may lack yaml-cpp/HDF5/MPI/SQLite: the core-only build needs LibTorch, CUDA and NCCL only).
#  1. builds bench_gpu_check against PyTorch's LibTorch (CMake prefix from torch.utils.cmake_prefix_path)
#  2. runs it: CUDA vs CPU forward/backward, flat optimizers vs float64, NCCL allreduce fp32/bf16, buckets through
#     NCCL vs local clipped gradients, bf16 bert-mini loss falls, bert-large seq 128 bf16 step throughput
#  3. runs PyTorch eager with autocast (bench/python_baseline.py) on the same bert-large batch and compares
# Prints "N passed, N failed" and writes bench/results/gpu_check.json.
#   bench/gpu_check.sh [BATCH=32] [STEPS=10]        (PY=python-with-cuda-torch, BUILD_GPU=build folder)
#   bench/gpu_check.sh --cpu-selftest               the same checks on the CPU with tiny models (no GPU needed)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PY:-python3}"
BUILD_GPU="${BUILD_GPU:-$ROOT/build-gpu}"
RESULTS="$ROOT/bench/results"
mkdir -p "$RESULTS"
start=$(date +%s)
elapsed() { echo "$(( $(date +%s) - start ))s"; }

if [[ "${1:-}" == "--cpu-selftest" ]]; then
  # Tests the script's C++ side here: a core-only build against whatever LibTorch CMake finds, tiny models.
  cmake -S "$ROOT" -B "$BUILD_GPU" -DCMAKE_BUILD_TYPE=Release -DBERTSWEEP_CORE_ONLY=ON ${CMAKE_PREFIX_PATH:+-DCMAKE_PREFIX_PATH="$CMAKE_PREFIX_PATH"} >/dev/null
  cmake --build "$BUILD_GPU" --target bench_gpu_check -j"$(nproc)"
  exec "$BUILD_GPU/bench_gpu_check" --device cpu --quick --json "$RESULTS/gpu_check_cpu_selftest.json"
fi

BATCH="${1:-32}"
STEPS="${2:-10}"
command -v nvidia-smi >/dev/null && nvidia-smi -L || { echo "bench/gpu_check.sh: no GPU (nvidia-smi missing); try --cpu-selftest" >&2; exit 3; }
PREFIX="$($PY -c 'import torch;print(torch.utils.cmake_prefix_path)')"
$PY -c 'import torch,sys; assert torch.cuda.is_available(), "torch without CUDA"; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))'

echo "== build (core only) [$(elapsed)]"
cmake -S "$ROOT" -B "$BUILD_GPU" -DCMAKE_BUILD_TYPE=Release -DBERTSWEEP_CORE_ONLY=ON -DCMAKE_PREFIX_PATH="$PREFIX" >/dev/null
cmake --build "$BUILD_GPU" --target bench_gpu_check -j"$(nproc)" 2>&1 | tail -3

echo "== checks [$(elapsed)]"
set +e
timeout 300 "$BUILD_GPU/bench_gpu_check" --device cuda --large-batch "$BATCH" --large-steps "$STEPS" --json "$RESULTS/gpu_check_cpp.json"
cpp_rc=$?
set -e

echo "== PyTorch eager + autocast, bert-large seq 128 [$(elapsed)]"
set +e
PYR="$(timeout 180 $PY "$ROOT/bench/python_baseline.py" --model large --device cuda --dtype float32 --autocast \
        --synthetic-vocab 30522 --batch "$BATCH" --steps "$STEPS" --warmup 3 --threads "$(nproc)" | tail -1)"
py_rc=$?
set -e

$PY - "$RESULTS/gpu_check_cpp.json" "$PYR" "$py_rc" "$RESULTS/gpu_check.json" <<'PYEOF'
import json, sys
cpp = json.load(open(sys.argv[1]))
checks = cpp["checks"]
try:
    py = json.loads(sys.argv[2]) if sys.argv[3] == "0" else None
except ValueError:
    py = None
large = cpp.get("large", {})
if py and large.get("tokens_per_s"):
    ratio = large["tokens_per_s"] / py["tokens_per_s"]
    checks.append({"name": "large_vs_pytorch_autocast", "status": "passed" if ratio >= 1.0 else "failed",
                   "detail": f"bertsweep {large['tokens_per_s']:.0f} tok/s vs PyTorch eager autocast "
                             f"{py['tokens_per_s']:.0f} tok/s: {ratio:.2f}x (target >= 1.0)"})
else:
    checks.append({"name": "large_vs_pytorch_autocast", "status": "failed", "detail": "the PyTorch side did not run"})
print(f"{checks[-1]['name']:30s} {checks[-1]['status']:8s} {checks[-1]['detail']}")
passed = sum(c["status"] == "passed" for c in checks)
failed = sum(c["status"] == "failed" for c in checks)
out = dict(cpp, checks=checks, passed=passed, failed=failed, python_eager_autocast=py)
json.dump(out, open(sys.argv[4], "w"), indent=1)
print(f"{passed} passed, {failed} failed")
sys.exit(0 if failed == 0 else 1)
PYEOF
echo "== done [$(elapsed)]: bench/results/gpu_check.json"
