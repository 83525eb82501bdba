#!/usr/bin/env bash
# Syntax-checks the GPU-only sources (NCCL/CUDA code that the trainer compiles only against a CUDA LibTorch)
# with nvcc and the CUDA toolkit's headers, so that a GPU-only compile error fails here, on CPU-only machines.
#   cuda_syntax_check.sh NVCC SHIM_DIR "INCLUDE_DIR:INCLUDE_DIR:..." "FLAGS" SOURCE...
# Exit 0: all compile; 1: a source does not; 77 (CTest: skipped): no nvcc here and not in CI.
set -uo pipefail
nvcc=$1 shim=$2 includes=$3 flags=$4
shift 4
if [[ -z "$nvcc" || "$nvcc" == *NOTFOUND* || ! -x "$nvcc" ]]; then
  if [[ "${CI:-}" == true ]]; then
    echo "cuda_syntax_check: nvcc not found, but CI must check the CUDA sources (install the CUDA toolkit or put nvcc on PATH)" >&2
    exit 1
  fi
  echo "cuda_syntax_check: nvcc not found: skipped (install the CUDA toolkit to check the GPU sources)"
  exit 77
fi
# Debian's CPU LibTorch ships c10/cuda headers without the one CMake generates for CUDA builds.
mkdir -p "$shim/c10/cuda/impl"
[[ -f "$shim/c10/cuda/impl/cuda_cmake_macros.h" ]] ||
  printf '#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n' >"$shim/c10/cuda/impl/cuda_cmake_macros.h"
args=(-std=c++17 -DBERTSWEEP_WITH_NCCL=1 -DBERTSWEEP_WITH_CUDA=1 -Xcompiler -fsyntax-only)
IFS=':' read -r -a dirs <<<"$includes"
for d in "${dirs[@]}"; do [[ -n "$d" ]] && args+=("-I$d"); done
args+=("-I$shim")
# shellcheck disable=SC2206
args+=($flags)
echo "$("$nvcc" --version | tail -1)"
failed=0
for src in "$@"; do
  if "$nvcc" "${args[@]}" -c "$src" -o /dev/null; then
    echo "ok: $src"
  else
    echo "FAILED: $src does not compile against the CUDA toolkit" >&2
    failed=1
  fi
done
exit $failed
