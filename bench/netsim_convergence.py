#!/usr/bin/python3
"""Does where you clip change how fast BERT learns? The same (optimizer, batch, lr) trained to the bert-tiny
target with 2 MPI ranks under each clip mode, several seeds each: samples to target per mode with a 95%
bootstrap interval of the mean. Samples to target do not depend on the link, so these runs use plain
mpirun; time to target on each simulated link is then samples to target / batch x the step time that
bench/netsim_sweep.py measured for that mode and link (bench/results/netsim_steps.json).
Writes bench/results/netsim_convergence.{json,csv,md} and netsim_time_to_target.{json,csv,md}.

  bench/netsim_convergence.py [--seeds 1,2,3] [--target 0.08] [--batch 64] [--lr 0.003] [--optimizer adamw]
"""
import argparse
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib as bl  # noqa: E402

MODES = ["bucket_before_allreduce", "global_after_allreduce", "local_before_allreduce"]


def bootstrap_mean_ci(xs, n=5000, seed=0):
    rng = random.Random(seed)
    means = sorted(sum(rng.choice(xs) for _ in xs) / len(xs) for _ in range(n))
    return means[int(0.025 * n)], means[int(0.975 * n) - 1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--target", type=float, default=0.08)
    ap.add_argument("--max-samples", type=int, default=40000)
    ap.add_argument("--eval-every", type=int, default=2048)
    ap.add_argument("--eval-samples", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", default="0.003")
    ap.add_argument("--optimizer", default="adamw")
    ap.add_argument("--max-norm", default="1.0")
    ap.add_argument("--time-only", action="store_true",
                    help="no training: recompute time to target from the stored runs and a new netsim_steps.json")
    a = ap.parse_args()
    info = bl.machine()
    os.environ.update({"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"})
    seeds = [int(s) for s in a.seeds.split(",")]
    runs = []
    if a.time_only:
        with open(os.path.join(bl.RESULTS, "netsim_convergence.json")) as f:
            stored = json.load(f)
        runs, info, seeds = stored["runs"], stored["machine"], stored["setup"]["seeds"]
        a.batch = stored["setup"]["batch"]
    for seed in seeds if not a.time_only else []:  # seeds outermost: an interrupted run still has every mode for the first seeds
        for mode in MODES:
            sets = {"distributed.backend": "mpi", "batch.global": str(a.batch), "batch.micro": str(a.batch // 2),
                    "optimizer.name": a.optimizer, "optimizer.lr": a.lr, "clip.mode": mode, "clip.bucket_mb": "4",
                    "clip.max_norm": a.max_norm, "seed": str(seed), "target.mlm_accuracy": str(a.target),
                    "target.max_samples": str(a.max_samples), "target.eval_every_samples": str(a.eval_every),
                    "data.eval_samples": str(a.eval_samples), "threads": "1", "precision": "fp32",
                    "log.progress_every_steps": "20"}
            r = bl.run_train("tiny", sets, ranks=2, timeout=3600, label=f"{mode} seed {seed}")
            r.update({"clip_mode": mode, "seed": seed})
            runs.append(r)
            print({k: r.get(k) for k in ("label", "reached", "samples_to_target", "eval_mlm_accuracy")}, flush=True)
    summary = []
    for mode in MODES:
        xs = [r["samples_to_target"] for r in runs if r["clip_mode"] == mode and r.get("reached")]
        row = {"clip_mode": mode, "runs": sum(r["clip_mode"] == mode for r in runs), "reached": len(xs)}
        if xs:
            lo, hi = bootstrap_mean_ci(xs)
            row.update({"mean_samples_to_target": sum(xs) / len(xs), "ci95_low": lo, "ci95_high": hi,
                        "samples": " ".join(str(int(x)) for x in xs)})
        summary.append(row)
    cols = ["clip_mode", "runs", "reached", "mean_samples_to_target", "ci95_low", "ci95_high", "samples"]
    setup = {"model": "tiny", "ranks": 2, "threads_per_rank": 1, "batch": a.batch, "optimizer": a.optimizer,
             "lr": a.lr, "max_norm": a.max_norm, "target": a.target, "seeds": seeds, "eval_every": a.eval_every}
    if a.time_only:
        setup = stored["setup"]
    if not a.time_only:
        bl.write_results("netsim_convergence", {"machine": info, "setup": setup, "runs": runs, "summary": summary},
                         summary, cols)

    steps_file = os.path.join(bl.RESULTS, "netsim_steps.json")
    if not os.path.exists(steps_file):
        print("no bench/results/netsim_steps.json: run bench/netsim_sweep.py for time to target")
        return
    with open(steps_file) as f:
        steps = json.load(f)
    ttt = []
    for s in summary:
        if "mean_samples_to_target" not in s:
            continue
        for row in steps["rows"]:
            if row["clip_mode"] != s["clip_mode"] or row["bucket_mb"] != 4:
                continue
            per_step = row["step_seconds"]
            ttt.append({"clip_mode": s["clip_mode"], "rate": row["rate"], "step_seconds": per_step,
                        "mean_samples_to_target": s["mean_samples_to_target"],
                        "seconds_to_target": s["mean_samples_to_target"] / a.batch * per_step,
                        "ci95_low_s": s["ci95_low"] / a.batch * per_step,
                        "ci95_high_s": s["ci95_high"] / a.batch * per_step})
    ttt.sort(key=lambda r: (bl.rate_bits(r["rate"]), r["clip_mode"]), reverse=False)
    bl.write_results("netsim_time_to_target", {"machine": info, "setup": setup, "steps_from": steps_file,
                                               "steps_machine": steps.get("machine"), "rows": ttt}, ttt,
                     ["rate", "clip_mode", "step_seconds", "mean_samples_to_target", "seconds_to_target",
                      "ci95_low_s", "ci95_high_s"])


if __name__ == "__main__":
    main()
