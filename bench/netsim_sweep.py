#!/usr/bin/python3
"""The paper's clipping idea on a communication-bound cluster simulated by bench/netsim (root): 2 ranks x 1
thread, each in its own network namespace, MPI over TCP on links shaped to each bandwidth. Side by side in one
run, per link: step time, exposed communication (step - compute) and overlap for
  bucket_before_allreduce at clip.bucket_mb 1/4/25, global_after_allreduce and local_before_allreduce (4 MB),
with fp32 gradient allreduce (bert-tiny, fp32: the model of bench/netsim_convergence.py); and fp32 vs bf16 allreduce of the same bf16 training
(grad_dtype fp32 vs compute; bert-tiny, since bf16 compute is emulated and slow on CPUs without it).
Each row also carries a simple model: compute (the variant's step time on the fastest link) plus the ring
allreduce of the gradient bytes, 2 (n-1)/n x bytes at the link rate, either fully exposed (no overlap) or
hidden behind compute (full overlap). Writes bench/results/netsim_{steps,dtype}.{json,csv,md} and
bench/results/netsim_steps.png.

  bench/netsim_sweep.py [--rates 10gbit,1gbit,200mbit,50mbit] [--samples 640] [--skip-dtype]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib as bl  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
RANKS = 2


def allreduce_seconds(params, bytes_per_value, rate):
    """Ring allreduce: each rank sends 2 (n-1)/n of the gradient bytes over its link."""
    return 2 * (RANKS - 1) / RANKS * params * bytes_per_value * 8 / bl.rate_bits(rate)


def netsim(rate, prefix):
    return [os.path.join(HERE, "netsim"), "run", "--ranks", str(RANKS), "--rate", rate, "--prefix", prefix, "--"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rates", default="10gbit,1gbit,200mbit,50mbit")
    ap.add_argument("--samples", type=int, default=640)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--skip-dtype", action="store_true")
    ap.add_argument("--dtype-model", default="tiny")
    ap.add_argument("--dtype-samples", type=int, default=256)
    ap.add_argument("--prefix", default="bsnsw")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("netsim_sweep: bench/netsim needs root (network namespaces, tc)")
    rates = a.rates.split(",")
    info = bl.machine()
    os.environ.update({"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"})
    base = {"distributed.backend": "mpi", "batch.global": "64", "batch.micro": "32", "data.sampler": "local_presort",
            "precision": "fp32"}
    variants = [("bucket_before_allreduce", 1), ("bucket_before_allreduce", 4), ("bucket_before_allreduce", 25),
                ("global_after_allreduce", 4), ("local_before_allreduce", 4)]
    rows = []
    for rate in rates:  # the fastest first: its step times are the models' compute
        for mode, mb in variants:
            sets = bl.fixed_budget_sets(a.samples, 2, 1)
            sets.update(base)
            sets.update({"clip.mode": mode, "clip.bucket_mb": str(mb)})
            r = bl.run_train(a.model, sets, ranks=RANKS, label=f"{rate} {mode}/{mb}MB",
                             launcher=netsim(rate, a.prefix), timeout=1800)
            r.update({"rate": rate, "clip_mode": mode, "bucket_mb": mb, "grad_dtype": "fp32",
                      "exposed_seconds": r["step_seconds"] - r["compute_seconds"]})
            rows.append(r)
            print({k: (round(r[k], 3) if isinstance(r[k], float) else r[k])
                   for k in ("label", "step_seconds", "compute_seconds", "exposed_seconds", "overlap")}, flush=True)
    fastest = {(r["clip_mode"], r["bucket_mb"]): r["step_seconds"] for r in rows if r["rate"] == rates[0]}
    for r in rows:
        comm = allreduce_seconds(r["parameters"], 4, r["rate"])
        compute = fastest[(r["clip_mode"], r["bucket_mb"])] - allreduce_seconds(r["parameters"], 4, rates[0])
        r.update({"allreduce_model_seconds": comm, "slowdown_vs_fastest_link": r["step_seconds"] - compute,
                  "model_no_overlap_seconds": compute + comm,
                  "model_full_overlap_seconds": max(compute, comm)})
    cols = ["rate", "clip_mode", "bucket_mb", "step_seconds", "compute_seconds", "exposed_seconds", "overlap",
            "slowdown_vs_fastest_link", "allreduce_model_seconds", "model_no_overlap_seconds", "model_full_overlap_seconds", "samples_per_s"]
    bl.write_results("netsim_steps", {"machine": info, "model": a.model, "ranks": RANKS, "threads_per_rank": 1,
                                      "samples": a.samples, "rates": rates, "latency": "none (no sch_netem here)",
                                      "rows": rows, "loadavg_at_end": os.getloadavg()}, rows, cols)
    plot(rows, rates, info, a.model)

    if a.skip_dtype:
        return
    drows = []
    for rate in [rates[-1], rates[0]]:
        for dtype in ("fp32", "compute"):
            sets = bl.fixed_budget_sets(a.dtype_samples, 2, 1)
            sets.update(base)
            sets.update({"precision": "bf16", "distributed.grad_dtype": dtype, "clip.mode": "bucket_before_allreduce",
                         "clip.bucket_mb": "4"})
            r = bl.run_train(a.dtype_model, sets, ranks=RANKS, label=f"{rate} bf16 compute, {dtype} allreduce",
                             launcher=netsim(rate, a.prefix), timeout=1800)
            r.update({"rate": rate, "grad_dtype": "bf16" if dtype == "compute" else "fp32",
                      "exposed_seconds": r["step_seconds"] - r["compute_seconds"],
                      "allreduce_model_seconds": allreduce_seconds(r["parameters"], 2 if dtype == "compute" else 4,
                                                                   rate)})
            drows.append(r)
            print({k: (round(r[k], 3) if isinstance(r[k], float) else r[k])
                   for k in ("label", "step_seconds", "exposed_seconds", "overlap")}, flush=True)
    dcols = ["rate", "grad_dtype", "step_seconds", "compute_seconds", "exposed_seconds", "overlap",
             "allreduce_model_seconds", "samples_per_s"]
    bl.write_results("netsim_dtype", {"machine": info, "model": a.dtype_model, "precision": "bf16", "ranks": RANKS,
                                      "samples": a.dtype_samples, "rows": drows}, drows, dcols)


def plot(rows, rates, info, model):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("netsim_sweep: no matplotlib; no plot")
        return
    fig, ax = plt.subplots(figsize=(7, 4.2))
    x = [bl.rate_bits(r) / 1e9 for r in rates]
    for mode, mb in sorted({(r["clip_mode"], r["bucket_mb"]) for r in rows}):
        ys = [next(r["step_seconds"] for r in rows if r["rate"] == rate and r["clip_mode"] == mode
                   and r["bucket_mb"] == mb) for rate in rates]
        ax.plot(x, ys, marker="o", label=f"{mode} {mb} MB")
    no_overlap = [next(r["model_no_overlap_seconds"] for r in rows if r["rate"] == rate
                       and r["clip_mode"] == "local_before_allreduce") for rate in rates]
    ax.plot(x, no_overlap, "k--", linewidth=1, label="model: compute + allreduce (no overlap)")
    ax.set_xscale("log")
    ax.set_xlabel("link bandwidth per rank (Gbit/s, tc tbf)")
    ax.set_ylabel("step time (s)")
    ax.set_title(f"bert-{model}, 2 ranks x 1 thread, MPI over TCP between namespaces\n{info.get('cpu', '?')}",
                 fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    out = os.path.join(bl.RESULTS, "netsim_steps.png")
    fig.savefig(out, dpi=120)
    print("wrote", out)


if __name__ == "__main__":
    main()
