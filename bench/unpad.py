#!/usr/bin/python3
"""Unpadded compute side by side, in ONE run (issue 35): bertsweep train with model.unpad off and on, fused
kernels, dropout 0.1, bf16 and fp32, samplers random and local_presort, batch 64 at seq 128 (bert-mini), the
two settings interleaved run by run (off, on, off, on, ...) so that the machine's drift hits both alike. Two
datasets: data/brown as the configs use it (short_seq_prob 0.1: ~8% padding), and data/brown-short, the same
corpus and vocab prepared with --short-seq-prob 0.5 (made here if missing): a padding-heavy mix.
Effective tokens/s (real tokens only) of each run after its warm-up window; the median of the repeats and the
ratio on/off. The padding share of the rows is the data's: the most unpadding can save on the token-wise work
(`bound`). Attention runs per sequence unpadded (trainer/TokenLayout.h), so it saves more than that share of
the attention work, and with `packing` it no longer computes the scores between the segments of a row.
Writes bench/results/unpad.{json,csv,md}.

  bench/unpad.py [--threads 2] [--repeats 3] [--model mini]
"""
import argparse
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib as bl  # noqa: E402


def short_data():
    """data/brown-short: Brown with half its documents cut to shorter targets (more padding per batch)."""
    out = os.path.join(bl.ROOT, "data", "brown-short")
    if not os.path.exists(os.path.join(out, "meta.yaml")):
        print("unpad: preparing data/brown-short (--short-seq-prob 0.5, data/brown's vocab)", flush=True)
        subprocess.run([bl.binary(), "data", "prepare", "--corpus", "brown", "--vocab",
                        os.path.join(bl.ROOT, "data", "brown", "vocab.txt"), "--seq-len", "128", "--out", out,
                        "--short-seq-prob", "0.5", "--quiet"], check=True, cwd=bl.ROOT)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model", default="mini", choices=sorted(bl.CONFIGS))
    ap.add_argument("--steps", type=int, default=9)
    a = ap.parse_args()
    batch, window = 64, 3
    info = bl.machine()
    print(f"unpad: {info.get('cpu', '?')}, {a.threads} threads, bert-{a.model}, batch {batch}", flush=True)
    rows = []
    conditions = [("brown", s, p) for s in ["random", "local_presort"] for p in ["bf16", "fp32"]]
    conditions += [("brown-short", s, p) for s in ["random", "packing"] for p in ["bf16", "fp32"]]
    for data, sampler, precision in conditions:
        got = {"off": [], "on": []}
        waste = None
        for rep in range(a.repeats):
            for unpad in ["off", "on"]:
                sets = bl.fixed_budget_sets(batch * a.steps, window, a.threads)
                sets.update({"batch.global": str(batch), "batch.micro": str(batch), "data.sampler": sampler,
                             "precision": precision, "model.kernels": "fused", "model.dropout": "0.1",
                             "model.unpad": unpad})
                if data != "brown":
                    sets["data.dir"] = short_data()
                r = bl.run_train(a.model, sets, label=f"{sampler} {precision} unpad {unpad}")
                got[unpad].append(r["effective_tokens_per_s"])
                waste = r["padding_waste"]
                print(f"  {data:11s} {sampler:13s} {precision} unpad {unpad:3s} run {rep + 1}: "
                      f"{r['effective_tokens_per_s']:8.0f} effective tokens/s", flush=True)
        off, on = statistics.median(got["off"]), statistics.median(got["on"])
        rows.append({"model": a.model, "data": data, "sampler": sampler, "precision": precision, "padding_share": waste,
                     "off_tokens_per_s": off, "on_tokens_per_s": on, "on_over_off": f"{on / off:.3f}",
                     "bound": f"{1 / (1 - waste):.3f}" if waste is not None and waste < 1 else None,
                     "off_runs": got["off"], "on_runs": got["on"]})
    bl.write_results("unpad", {"machine": info, "threads": a.threads, "batch": batch, "steps": a.steps,
                               "repeats": a.repeats, "rows": rows},
                     rows, ["model", "data", "sampler", "precision", "padding_share", "off_tokens_per_s", "on_tokens_per_s",
                            "on_over_off", "bound"])


if __name__ == "__main__":
    main()
