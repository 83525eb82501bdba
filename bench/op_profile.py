#!/usr/bin/python3
"""Where a training step's time goes, per operator class, side by side in ONE run (issue 35's profile table):
bertsweep bf16 on the reference path and on the fused path (`log.op_profile`: RecordFunction self times) and the
Python eager autocast bf16 user (torch.profiler self CPU times, `python_baseline.py --profile-tsv`), bert-mini,
batch 64, seq 128, dropout 0.1, 2 threads. Each side's seconds are per step over the same timed steps (warm-up
excluded). Writes bench/results/op_profile.{json,md}.

  bench/op_profile.py [--threads 2] [--model mini|base] [--steps 9] [--precision bf16|fp32]
  (base: batch 16, writes op_profile_base.*; fp32: both bertsweep sides in fp32 and the Python side eager fp32,
  writes op_profile[_base]_fp32.*)

Profiling costs a few percent on each side (a callback per op); use scripts/bench precision for throughput.
"""
import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib as bl  # noqa: E402

# Operator classes, first match wins: (class, test on the op name; scope-prefixed names are "bs::scope/aten::op").
CLASSES = [
    ("optimizer step", lambda n: n.startswith("bs::optimizer_step") or n.startswith("bs::fused_adam")
     or n.startswith("Optimizer.")),
    ("bf16 copy refresh", lambda n: n.startswith("bs::compute_copy_refresh")),
    ("clipping / bucket finish", lambda n: n.startswith("bs::bucket_finish")),
    ("data path (collate)", lambda n: n.startswith("bs::collate")),
    ("GEMMs (linear, matmul)", lambda n: any(n == f"aten::{k}" for k in ("mm", "addmm", "bmm", "matmul", "linear"))),
    ("attention softmax (+mask, +dropout fused)", lambda n: n.startswith("bs::softmax_dropout")
     or n in ("aten::_softmax", "aten::_softmax_backward_data", "aten::softmax")),
    ("dropout (RNG + apply)", lambda n: n.startswith("bs::philox") or n.startswith("bs::dropout")
     or any(n == f"aten::{k}" for k in ("bernoulli_", "dropout", "native_dropout", "native_dropout_backward",
                                         "_fused_dropout", "_masked_scale"))),
    ("LayerNorm (+bias, residual, dropout fused)", lambda n: n.startswith("bs::bias_dropout_add_layer_norm")
     or "layer_norm" in n),
    ("GELU (+bias fused)", lambda n: n.startswith("bs::bias_gelu") or "gelu" in n),
    ("loss (log-softmax, NLL / fused CE)", lambda n: n.startswith("bs::cross_entropy") or "log_softmax" in n
     or "nll_loss" in n),
    ("casts and copies", lambda n: any(n == f"aten::{k}" for k in ("copy_", "_to_copy", "to", "contiguous",
                                                                    "clone"))),
    ("allocation and fill", lambda n: any(n == f"aten::{k}" for k in ("empty", "empty_strided", "empty_like",
                                                                       "zeros", "zero_", "fill_", "ones"))),
    ("elementwise (add, mul, sum, ...)", lambda n: any(n == f"aten::{k}" for k in (
        "add", "add_", "mul", "mul_", "div", "div_", "sum", "sub", "neg", "tanh", "tanh_backward",
        "embedding_dense_backward", "index_select", "index_add_", "masked_fill_", "eq", "ne"))),
]


def classify(name):
    for label, test in CLASSES:
        if test(name):
            return label
    if name == "(outside any op)":
        return "outside any op (host glue)"
    return "other ops (views, autograd engine, ...)"


def read_tsv(path, steps):
    per_class, wall = {}, 0.0
    with open(path) as f:
        next(f)
        for line in f:
            name, _calls, secs = line.rstrip("\n").split("\t")
            if name == "(profiled wall)":
                wall = float(secs)
                continue
            c = classify(name)
            per_class[c] = per_class.get(c, 0.0) + float(secs)
    return {k: v / steps for k, v in per_class.items()}, wall / steps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default="mini")
    ap.add_argument("--steps", type=int, default=9)
    ap.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    a = ap.parse_args()
    batch, window = (16, 2) if a.model == "base" else (64, 3)
    shape = {"model.layers": "12", "model.hidden": "768", "model.heads": "12", "model.intermediate": "3072"}
    info = bl.machine()
    print("machine:", info, flush=True)
    sides = {}
    for kernels in ["reference", "auto"]:
        tsv = tempfile.NamedTemporaryFile(prefix="bs-prof-", suffix=".tsv", delete=False).name
        sets = bl.fixed_budget_sets(batch * a.steps, window, a.threads)
        sets.update({"batch.global": str(batch), "batch.micro": str(batch), "data.sampler": "local_presort",
                     "model.dropout": "0.1", "precision": a.precision, "model.kernels": kernels, "log.op_profile": tsv})
        if a.model == "base":
            sets.update(shape)
        r = bl.run_train("mini", sets, label=f"profile {kernels}", timeout=3000)
        label = f"bertsweep {a.precision} " + ("reference" if kernels == "reference" else "fused (auto)")
        sides[label] = read_tsv(tsv, a.steps - window) + (r["effective_tokens_per_s"],)
        os.unlink(tsv)
        print(label, "done", flush=True)
    tsv = tempfile.NamedTemporaryFile(prefix="py-prof-", suffix=".tsv", delete=False).name
    py_steps, py_warm = (3, 1) if a.model == "base" else (6, 2)
    r = bl.run_python(a.model, py_steps, py_warm, a.threads,
                      extra=["--batch", str(batch), "--profile", "--profile-tsv", tsv]
                      + (["--autocast"] if a.precision == "bf16" else []))
    sides["python autocast bf16" if a.precision == "bf16" else "python eager fp32"] = read_tsv(tsv, py_steps) + (r["effective_tokens_per_s"],)
    os.unlink(tsv)
    classes = [c for c, _ in CLASSES] + ["other ops (views, autograd engine, ...)", "outside any op (host glue)"]
    labels = list(sides)
    rows = []
    for c in classes:
        row = {"class": c}
        for l in labels:
            row[l + " ms/step"] = round(1000 * sides[l][0].get(c, 0.0), 1)
        rows.append(row)
    total = {"class": "profiled step (wall)"}
    speed = {"class": "effective tokens/s while profiled"}
    for l in labels:
        total[l + " ms/step"] = round(1000 * sides[l][1], 1)
        speed[l + " ms/step"] = round(sides[l][2])
    rows += [total, speed]
    name = ("op_profile" if a.model == "mini" else f"op_profile_{a.model}") + ("" if a.precision == "bf16" else "_fp32")
    bl.write_results(name, {"machine": info, "threads": a.threads, "model": a.model, "batch": batch,
                                    "rows": rows}, rows, ["class"] + [l + " ms/step" for l in labels])


if __name__ == "__main__":
    main()
