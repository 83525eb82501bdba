#!/usr/bin/python3
"""Two MPI ranks (1 thread each), bert-mini, side by side in one run:
  A. clipping: bucket_before_allreduce at clip.bucket_mb 1/4/25 (overlap fraction, step time) vs
     global_after_allreduce vs local_before_allreduce (step time);
  B. samplers random / global_sort / local_presort / packing: step time, padding waste, imbalance, overlap and
     eval masked-LM accuracy after the same fixed sample budget.
Writes bench/results/distributed_{clip,samplers}.{json,csv,md}.

  bench/distributed.py [--clip-samples 768] [--sampler-samples 3000] [--sampler-batch 256 --sampler-micro 16]
                      [--model mini]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib as bl  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mini")
    ap.add_argument("--clip-samples", type=int, default=768)
    ap.add_argument("--sampler-samples", type=int, default=2048)
    ap.add_argument("--eval-samples", type=int, default=256)
    ap.add_argument("--skip-samplers", action="store_true")
    # Samplers differ in padding only when a rank's batch is split into several micro-batches (82% of Brown
    # samples are full 128-token rows): 2 ranks x 128 samples in micro-batches of 16 by default.
    ap.add_argument("--sampler-batch", type=int, default=256)
    ap.add_argument("--sampler-micro", type=int, default=16)
    a = ap.parse_args()
    info = bl.machine()
    base = {"distributed.backend": "mpi", "batch.global": "64", "batch.micro": "32"}

    clip_rows = []
    variants = [("bucket_before_allreduce", 1), ("bucket_before_allreduce", 4), ("bucket_before_allreduce", 25),
                ("global_after_allreduce", 4), ("local_before_allreduce", 4)]
    for mode, mb in variants:
        sets = bl.fixed_budget_sets(a.clip_samples, 3, 1)
        sets.update(base)
        sets.update({"clip.mode": mode, "clip.bucket_mb": str(mb), "data.sampler": "local_presort"})
        r = bl.run_train(a.model, sets, ranks=2, label=f"{mode}/{mb}MB")
        r.update({"clip_mode": mode, "bucket_mb": mb})
        clip_rows.append(r)
        print({k: r[k] for k in ("label", "step_seconds", "compute_seconds", "overlap")}, flush=True)
    cols = ["clip_mode", "bucket_mb", "step_seconds", "compute_seconds", "overlap", "samples_per_s", "tokens_per_s",
            "imbalance"]
    bl.write_results("distributed_clip", {"machine": info, "model": a.model, "ranks": 2, "threads_per_rank": 1,
                                          "samples": a.clip_samples, "rows": clip_rows,
                                          "loadavg_at_end": os.getloadavg()}, clip_rows, cols)
    if a.skip_samplers:
        return
    s_rows = []
    for sampler in ["random", "global_sort", "local_presort", "packing"]:
        sets = bl.fixed_budget_sets(a.sampler_samples, 2, 1, eval_samples=a.eval_samples)
        sets.update(base)
        sets.update({"batch.global": str(a.sampler_batch), "batch.micro": str(a.sampler_micro)})
        sets.update({"clip.mode": "bucket_before_allreduce", "clip.bucket_mb": "4", "data.sampler": sampler})
        r = bl.run_train(a.model, sets, ranks=2, timeout=1800, label=sampler)
        r["sampler"] = sampler
        s_rows.append(r)
        print({k: r[k] for k in ("label", "step_seconds", "padding_waste", "imbalance", "eval_mlm_accuracy")},
              flush=True)
    cols = ["sampler", "step_seconds", "samples_per_s", "effective_tokens_per_s", "padding_waste", "imbalance",
            "overlap", "eval_mlm_accuracy", "final_loss", "process_wall_s"]
    bl.write_results("distributed_samplers", {"machine": info, "model": a.model, "ranks": 2, "threads_per_rank": 1,
                                              "samples": a.sampler_samples, "eval_samples": a.eval_samples,
                                              "global_batch": a.sampler_batch, "micro_batch": a.sampler_micro,
                                              "rows": s_rows, "loadavg_at_end": os.getloadavg()}, s_rows, cols)


if __name__ == "__main__":
    main()
