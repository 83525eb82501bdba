#!/usr/bin/python3
"""Single-process throughput and arithmetic efficiency, in ONE run at the same thread count:
Python PyTorch eager (random padded batches) vs `bertsweep train` with the random, local_presort and packing
samplers, bert-tiny and bert-mini, batch 64; plus the float32 GEMM ceiling measured in the same run.
Writes bench/results/throughput.{json,csv,md}.  Target: bertsweep local_presort >= 2x Python effective tokens/s.

  bench/throughput.py [--threads 2] [--quick]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib as bl  # noqa: E402

AVG_MASKED_PER_SAMPLE = None  # read from data/brown/meta.yaml


def masked_per_sample():
    meta = {}
    with open(os.path.join(bl.ROOT, "data", "brown", "meta.yaml")) as f:
        for line in f:
            if ":" in line and not line.startswith(" "):
                k, v = line.split(":", 1)
                meta[k.strip()] = v.strip()
    return int(meta["train_masked_positions"]) / int(meta["train_instances"]), int(meta["vocab_size"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="fewer steps (smoke test of the script)")
    a = ap.parse_args()
    steps = {"tiny": (24, 6), "mini": (9, 3)}  # (bertsweep steps, steps per throughput window)
    py_steps = {"tiny": (10, 3), "mini": (6, 2)}
    if a.quick:
        steps = {"tiny": (6, 2), "mini": (4, 2)}
        py_steps = {"tiny": (2, 1), "mini": (2, 1)}
    batch = 64
    mps, vocab = masked_per_sample()
    info = bl.machine()
    rows = []
    gemm = bl.run_python("mini", 1, 0, a.threads, extra=["--gemm-only"])["gemm_gflops"]
    ceiling = max(gemm.values())
    print("GEMM GFLOP/s:", gemm, flush=True)
    for model in ["tiny", "mini"]:
        flops = bl.training_flops(model, vocab, batch, 128, batch * mps)
        py = bl.run_python(model, *py_steps[model], a.threads)
        rows.append({"model": model, "system": "python eager", "sampler": "random (padded)",
                     "step_seconds": py["step_seconds"], "samples_per_s": py["samples_per_s"],
                     "tokens_per_s": py["tokens_per_s"], "effective_tokens_per_s": py["effective_tokens_per_s"],
                     "padding_waste": py["padding_waste"], "gflops": flops / py["step_seconds"] / 1e9,
                     "command": py["command"]})
        print(rows[-1], flush=True)
        if model == "mini":
            pyd = bl.run_python(model, 3, 1, a.threads, extra=["--wait-policy", "default"])
            rows.append({"model": model, "system": "python eager (OMP default wait policy)",
                         "sampler": "random (padded)", "step_seconds": pyd["step_seconds"],
                         "samples_per_s": pyd["samples_per_s"], "tokens_per_s": pyd["tokens_per_s"],
                         "effective_tokens_per_s": pyd["effective_tokens_per_s"],
                         "padding_waste": pyd["padding_waste"], "gflops": flops / pyd["step_seconds"] / 1e9,
                         "command": pyd["command"]})
            print(rows[-1], flush=True)
        n, every = steps[model]
        for sampler in ["random", "local_presort", "packing"]:
            sets = bl.fixed_budget_sets(n * batch, every, a.threads)
            sets.update({"data.sampler": sampler, "batch.global": str(batch), "batch.micro": str(batch)})
            r = bl.run_train(model, sets, label=f"{model}/{sampler}")
            r.update({"system": "bertsweep", "sampler": sampler})
            # FLOPs of a padded 64x128 step: exact for `random`; for presort/packing this counts the useful
            # work of the same samples at full length, i.e. an "effective" rate.
            r["gflops"] = flops * (r["samples_per_s"] / batch) / 1e9
            rows.append(r)
            print({k: r[k] for k in ("label", "step_seconds", "tokens_per_s", "effective_tokens_per_s")}, flush=True)
    # Ratios against Python at the same model.
    for r in rows:
        base = next(x for x in rows if x["model"] == r["model"] and x["system"] == "python eager")
        r["x_python_effective"] = r["effective_tokens_per_s"] / base["effective_tokens_per_s"]
        r["pct_gemm_ceiling"] = 100 * r["gflops"] / ceiling
    target = {m: next(r for r in rows if r["model"] == m and r.get("sampler") == "local_presort")["x_python_effective"]
              for m in ["tiny", "mini"]}
    payload = {"machine": info, "threads": a.threads, "batch": batch, "masked_per_sample": mps, "vocab": vocab,
               "gemm_gflops": gemm, "gemm_ceiling_gflops": ceiling, "rows": rows,
               "target_local_presort_ge_2x_python_effective": {m: {"ratio": v, "met": v >= 2} for m, v in target.items()},
               "loadavg_at_end": os.getloadavg()}
    cols = ["model", "system", "sampler", "step_seconds", "samples_per_s", "tokens_per_s", "effective_tokens_per_s",
            "padding_waste", "x_python_effective", "gflops", "pct_gemm_ceiling"]
    bl.write_results("throughput", payload, rows, cols)
    print("GEMM ceiling GFLOP/s:", {k: round(v, 1) for k, v in gemm.items()})
    print("target local_presort >= 2x python effective tokens/s:", payload["target_local_presort_ge_2x_python_effective"])


if __name__ == "__main__":
    main()
