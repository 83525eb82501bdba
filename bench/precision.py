#!/usr/bin/python3
"""Mixed precision side by side, in ONE run at the same thread count (issue: bf16 with fp32 masters):
bertsweep train in fp32 and bf16 vs Python PyTorch eager fp32 and eager with torch.autocast(cpu, bf16) (fp32
LayerNorm), on bert-mini and bert-base at seq 128, batch 64 (bert-base: 16), effective tokens/s. Prints and records the
CPU model, its bf16 ISA (amx_bf16 / avx512_bf16 / none) and the ISA oneDNN dispatches bf16 matmul to.
Writes bench/results/precision.{json,csv,md}.
Target (issue 35) on a CPU with AMX or AVX512-BF16: bertsweep bf16 (fused) >= 1.3x Python autocast and >= 2.5x
Python eager fp32; bertsweep fp32 (fused) >= 1.3x Python eager fp32 on any CPU. Dropout 0.1 on both sides.

  bench/precision.py [--threads 2] [--models mini,base] [--quick]
"""
import argparse
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib as bl  # noqa: E402


def cpu_flags():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                fl = set(line.split(":", 1)[1].split())
                return "amx_bf16" if "amx_bf16" in fl else "avx512_bf16" if "avx512_bf16" in fl else "none"
    return "unknown"


def onednn_isa():
    """The ISA oneDNN picks for a bf16 matmul in LibTorch (ONEDNN_VERBOSE lines name it)."""
    code = ("import torch; a=torch.randn(256,256).bfloat16(); b=torch.randn(256,256).bfloat16(); "
            "torch.matmul(a,b); torch.matmul(a,b)")
    env = dict(os.environ, ONEDNN_VERBOSE="1", DNNL_VERBOSE="1")
    p = subprocess.run([bl.PY, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    isas = [l for l in p.stdout.splitlines() if ",exec," in l]
    if not isas:
        return "no oneDNN call (bf16 matmul runs on ATen's reference kernel: no bf16 hardware path)"
    return isas[-1].split(",")[4] if len(isas[-1].split(",")) > 4 else isas[-1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models", default="mini,base")
    ap.add_argument("--quick", action="store_true", help="fewer steps (smoke test of the script)")
    a = ap.parse_args()
    info = bl.machine()
    info["cpu_bf16_isa"] = cpu_flags()
    info["onednn_bf16_matmul"] = onednn_isa()
    print("machine:", info, flush=True)
    rows = []
    for model in a.models.split(","):
        batch = 64 if model != "base" else 16
        steps, window = (4, 2) if a.quick else ((9, 3) if model != "base" else (6, 2))
        py_steps = (2, 1) if a.quick else ((6, 2) if model != "base" else (3, 1))
        # The Python user as a new user runs it (glibc's default allocator), and with the allocator settings
        # bertsweep's trainer applies to itself (trainer/Runtime.cpp), so the ratio of the code alone shows too.
        glibc_keep = {"MALLOC_MMAP_THRESHOLD_": "1073741824", "MALLOC_TRIM_THRESHOLD_": "1073741824"}
        for label, extra, env in [("python eager fp32", [], None), ("python autocast bf16", ["--autocast"], None),
                                  ("python eager fp32 +heap", [], glibc_keep),
                                  ("python autocast bf16 +heap", ["--autocast"], glibc_keep)]:
            r = bl.run_python(model, *py_steps, a.threads, extra=["--batch", str(batch), *extra], env_extra=env)
            rows.append({"model": model, "system": label, "batch": batch,
                         "effective_tokens_per_s": r["effective_tokens_per_s"], "tokens_per_s": r["tokens_per_s"],
                         "step_seconds": r["step_seconds"], "command": r["command"]})
            print(rows[-1], flush=True)
        config_model = "mini"
        sets = bl.fixed_budget_sets(batch * steps, window, a.threads)
        # Dropout 0.1 as in the Python baseline (the bert-tiny config the mini config extends trains without it).
        sets.update({"batch.global": str(batch), "batch.micro": str(batch), "data.sampler": "local_presort",
                     "model.dropout": "0.1"})
        if model == "base":
            sets.update({"model.layers": "12", "model.hidden": "768", "model.heads": "12",
                         "model.intermediate": "3072"})
        for precision, kernels in [("fp32", "reference"), ("fp32", "auto"), ("bf16", "reference"), ("bf16", "auto")]:
            s = dict(sets, precision=precision, **{"model.kernels": kernels})
            system = f"bertsweep {precision}" + (" reference" if kernels == "reference" else " (auto: fused)")
            r = bl.run_train(config_model, s, label=f"{system} {model}", timeout=3000)
            rows.append({"model": model, "system": system, "batch": batch,
                         "effective_tokens_per_s": r["effective_tokens_per_s"], "tokens_per_s": r["tokens_per_s"],
                         "step_seconds": r["step_seconds"], "command": r["command"]})
            print(rows[-1], flush=True)
    by = {(r["model"], r["system"]): r["effective_tokens_per_s"] for r in rows}
    for r in rows:
        r["vs_python_fp32"] = r["effective_tokens_per_s"] / by[(r["model"], "python eager fp32")]
        r["vs_python_autocast"] = r["effective_tokens_per_s"] / by[(r["model"], "python autocast bf16")]
        r["vs_python_autocast_heap"] = r["effective_tokens_per_s"] / by[(r["model"], "python autocast bf16 +heap")]
    bl.write_results("precision", {"machine": info, "threads": a.threads, "rows": rows}, rows,
                     ["model", "system", "batch", "effective_tokens_per_s", "tokens_per_s", "step_seconds",
                      "vs_python_fp32", "vs_python_autocast", "vs_python_autocast_heap"])


if __name__ == "__main__":
    main()
