#!/usr/bin/python3
"""Plain PyTorch eager BERT pretraining loop: the baseline bertsweep's throughput is compared against.

Same model as trainer/BertModel.h (post-LN, GELU(erf), fused QKV, tied MLM decoder with its own bias, MLM head only
on the masked rows, NSP head on [CLS]), same HDF5 shards (read with h5py), torch.optim.AdamW, random batches padded
to the full sequence length as a typical user would. Prints one JSON object.

  bench/python_baseline.py --data data/brown --model mini --batch 64 --steps 10 --warmup 3 --threads 2
  bench/python_baseline.py --gemm-only      # float32 GEMM ceiling (1024^3 and the model's shapes)
  bench/python_baseline.py --profile ...    # adds the torch profiler's top operators
"""
import argparse
import glob
import json
import math
import os
import sys
import time

MODELS = {"tiny": dict(layers=2, hidden=128, heads=2, intermediate=512),
          "mini": dict(layers=4, hidden=256, heads=4, intermediate=1024),
          "base": dict(layers=12, hidden=768, heads=12, intermediate=3072),
          "large": dict(layers=24, hidden=1024, heads=16, intermediate=4096)}


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="data/brown")
    p.add_argument("--model", choices=sorted(MODELS), default="mini")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=10, help="timed steps after warmup")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--gemm-only", action="store_true")
    p.add_argument("--gemm", action="store_true", help="also measure the GEMM ceiling")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--profile-tsv", default="",
                   help="with --profile: per-op self time as TSV (op, calls, self_seconds), ops inside a bs:: scope "
                        "named 'scope/op', as bertsweep's log.op_profile writes it (bench/op_profile.py reads both)")
    p.add_argument("--device", default="cpu", help="cpu | cuda")
    p.add_argument("--dtype", default="float32", help="float32 | bfloat16")
    p.add_argument("--autocast", action="store_true",
                   help="fp32 weights, torch.autocast(device, dtype=torch.bfloat16) around forward (mixed precision)")
    p.add_argument("--synthetic-vocab", type=int, default=0,
                   help="random full-length batches with this vocab instead of the shards (bench/gpu_check.sh)")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--wait-policy", choices=["passive", "default"], default="passive",
                   help="OMP_WAIT_POLICY: passive (as bertsweep sets it) or the OpenMP default")
    return p.parse_args()


args = parse_args()
# Must be set before torch loads its OpenMP runtime.
if args.wait_policy == "passive":
    os.environ["OMP_WAIT_POLICY"] = "passive"
else:
    os.environ.pop("OMP_WAIT_POLICY", None)
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

torch.set_num_threads(args.threads)
torch.manual_seed(args.seed)


class LayerNorm32(nn.LayerNorm):
    """LayerNorm in fp32: torch 1.13's CPU autocast leaves layer_norm uncast and fails on bf16 input."""

    def forward(self, x):
        return F.layer_norm(x.float(), self.normalized_shape, self.weight.float(), self.bias.float(), self.eps)


class Layer(nn.Module):
    def __init__(self, H, A, I, p):
        super().__init__()
        self.heads, self.p = A, p
        self.qkv = nn.Linear(H, 3 * H)
        self.attn_out = nn.Linear(H, H)
        self.ln1 = LayerNorm32(H, eps=1e-12)
        self.inter = nn.Linear(H, I)
        self.out = nn.Linear(I, H)
        self.ln2 = LayerNorm32(H, eps=1e-12)

    def forward(self, x, bias):  # x [B, L, H], bias [B, 1, 1, L]
        B, L, H = x.shape
        d = H // self.heads
        q, k, v = self.qkv(x).view(B, L, 3, self.heads, d).permute(2, 0, 3, 1, 4)
        s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d) + bias
        a = F.dropout(torch.softmax(s, dim=-1), self.p, self.training)
        ctx = torch.matmul(a, v).transpose(1, 2).reshape(B, L, H)
        x = self.ln1(x + F.dropout(self.attn_out(ctx), self.p, self.training))
        h = self.out(F.gelu(self.inter(x)))
        return self.ln2(x + F.dropout(h, self.p, self.training))


class Bert(nn.Module):
    def __init__(self, V, layers, hidden, heads, intermediate, max_pos=512, p=0.1):
        super().__init__()
        H = hidden
        self.p = p
        self.word = nn.Embedding(V, H)
        self.pos = nn.Embedding(max_pos, H)
        self.seg = nn.Embedding(2, H)
        self.ln = LayerNorm32(H, eps=1e-12)
        self.layers = nn.ModuleList([Layer(H, heads, intermediate, p) for _ in range(layers)])
        self.mlm_dense = nn.Linear(H, H)
        self.mlm_ln = LayerNorm32(H, eps=1e-12)
        self.mlm_bias = nn.Parameter(torch.zeros(V))
        self.pooler = nn.Linear(H, H)
        self.nsp = nn.Linear(H, 2)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, ids, seg, mask, mlm_pos):
        B, L = ids.shape
        x = self.word(ids) + self.pos(torch.arange(L, device=ids.device).unsqueeze(0)) + self.seg(seg)
        x = F.dropout(self.ln(x), self.p, self.training)
        bias = ((1.0 - mask.to(x.dtype)) * -10000.0).view(B, 1, 1, L)
        for layer in self.layers:
            x = layer(x, bias)
        flat = x.reshape(B * L, -1)
        rows = flat.index_select(0, mlm_pos)  # masked rows only (same FLOPs as bertsweep)
        h = self.mlm_ln(F.gelu(self.mlm_dense(rows)))
        mlm_logits = F.linear(h, self.word.weight, self.mlm_bias)
        nsp_logits = self.nsp(torch.tanh(self.pooler(x[:, 0])))
        return mlm_logits, nsp_logits


def load_shards(folder):
    import h5py
    files = sorted(f for f in glob.glob(os.path.join(folder, "*.hdf5")) if not f.endswith("eval.hdf5"))
    if not files:
        sys.exit(f"no train shards (*.hdf5) in {folder}: run `bertsweep data prepare` first")
    keys = ["input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids", "next_sentence_labels"]
    parts = {k: [] for k in keys}
    for f in files:
        with h5py.File(f, "r") as h:
            for k in keys:
                parts[k].append(h[k][()])
    return {k: np.concatenate(v) for k, v in parts.items()}


def make_batch(d, idx):
    ids = torch.from_numpy(d["input_ids"][idx].astype(np.int64))
    mask = torch.from_numpy(d["input_mask"][idx].astype(np.int64))
    seg = torch.from_numpy(d["segment_ids"][idx].astype(np.int64))
    pos = torch.from_numpy(d["masked_lm_positions"][idx].astype(np.int64))
    lab = torch.from_numpy(d["masked_lm_ids"][idx].astype(np.int64))
    nsp = torch.from_numpy(d["next_sentence_labels"][idx].astype(np.int64))
    B, L = ids.shape
    valid = lab != 0  # 0-padded prediction slots
    flat_pos = (pos + torch.arange(B).unsqueeze(1) * L)[valid]
    return ids, seg, mask, flat_pos, lab[valid], nsp, int(mask.sum())


def synthetic(V, L, n, max_pred=20, seed=1):
    """Full-length random samples (no padding) in the shard layout, for GPU runs without a dataset."""
    g = np.random.default_rng(seed)
    pos = np.sort(np.stack([g.choice(np.arange(1, L), max_pred, replace=False) for _ in range(n)]), axis=1)
    return {"input_ids": g.integers(5, V, (n, L)), "input_mask": np.ones((n, L), np.int64),
            "segment_ids": (np.arange(L)[None, :] >= L // 2).astype(np.int64).repeat(n, 0),
            "masked_lm_positions": pos, "masked_lm_ids": g.integers(5, V, (n, max_pred)),
            "next_sentence_labels": g.integers(0, 2, n)}


def training_flops(c, V, rows, L, M):  # same formula as bs::training_flops
    H, I, Ly = c["hidden"], c["intermediate"], c["layers"]
    T = rows * L
    enc = Ly * (2 * T * (4 * H * H + 2 * H * I) + 4 * rows * L * L * H)
    heads = 2 * M * H * H + 2 * M * H * V + 2 * rows * H * H + 2 * rows * H * 2
    return 3 * (enc + heads)


def gemm_ceiling(c, tokens):
    """Best-of-several float32 matmul GFLOP/s for 1024^3 and the model's projection shapes."""
    H, I = c["hidden"], c["intermediate"]
    shapes = {"1024x1024x1024": (1024, 1024, 1024), f"qkv {tokens}x{H}x{3*H}": (tokens, H, 3 * H),
              f"ffn_in {tokens}x{H}x{I}": (tokens, H, I), f"ffn_out {tokens}x{I}x{H}": (tokens, I, H)}
    out = {}
    for name, (m, k, n) in shapes.items():
        a, b = torch.randn(m, k), torch.randn(k, n)
        torch.matmul(a, b)
        best = float("inf")
        for _ in range(5):
            t = time.perf_counter()
            reps = 3
            for _ in range(reps):
                torch.matmul(a, b)
            best = min(best, (time.perf_counter() - t) / reps)
        out[name] = 2.0 * m * k * n / best / 1e9
    return out


def scope(name):
    """A named region in the profile (a no-op cost when not profiling)."""
    return torch.profiler.record_function(name)


def write_profile_tsv(prof, wall, path):
    """Self time per op, each op filed under its innermost enclosing bs:: scope, in log.op_profile's format."""
    totals = {}
    for ev in prof.events():
        sc, p = None, ev.cpu_parent
        while p is not None and sc is None:
            sc = p.name if p.name.startswith("bs::") else None
            p = p.cpu_parent
        key = ev.name if sc is None or ev.name.startswith("bs::") else f"{sc}/{ev.name}"
        calls, secs = totals.get(key, (0, 0.0))
        totals[key] = (calls + 1, secs + ev.self_cpu_time_total / 1e6)
    in_ops = sum(v[1] for v in totals.values())
    with open(path, "w") as f:
        f.write("op\tcalls\tself_seconds\n")
        for k, (n, sec) in sorted(totals.items(), key=lambda kv: -kv[1][1]):
            f.write(f"{k}\t{n}\t{sec}\n")
        f.write(f"(outside any op)\t0\t{max(0.0, wall - in_ops)}\n(profiled wall)\t0\t{wall}\n")


def main():
    c = MODELS[args.model]
    res = {"tool": "python_baseline", "torch": torch.__version__, "threads": torch.get_num_threads(),
           "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "model": args.model, "batch": args.batch}
    if args.gemm_only or args.gemm:
        res["gemm_gflops"] = gemm_ceiling(c, args.batch * 128)
        if args.gemm_only:
            print(json.dumps(res))
            return
    if args.synthetic_vocab:
        d = synthetic(args.synthetic_vocab, args.seq_len, args.batch * (args.warmup + args.steps))
        V = args.synthetic_vocab
    else:
        d = load_shards(args.data)
        with open(os.path.join(args.data, "vocab.txt")) as f:
            V = sum(1 for _ in f)
    L = d["input_ids"].shape[1]
    dev, dt = torch.device(args.device), getattr(torch, args.dtype)
    model = Bert(V, **c).to(device=dev, dtype=dt)
    model.train()
    decay = [p for n, p in model.named_parameters() if p.dim() > 1]
    no_decay = [p for n, p in model.named_parameters() if p.dim() <= 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=2e-3, betas=(0.9, 0.999), eps=1e-6)
    rng = np.random.default_rng(args.seed)
    order = rng.permutation(d["input_ids"].shape[0])

    def step(i):
        idx = np.sort(order[i * args.batch:(i + 1) * args.batch])  # h5py-style sorted fancy index
        with scope("bs::collate"):
            ids, seg, mask, pos, lab, nsp, real = (t.to(dev) if torch.is_tensor(t) else t for t in make_batch(d, idx))
        if args.autocast:
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                mlm_logits, nsp_logits = model(ids, seg, mask, pos)
        else:
            mlm_logits, nsp_logits = model(ids, seg, mask, pos)
        loss = F.cross_entropy(mlm_logits.float(), lab) + F.cross_entropy(nsp_logits.float(), nsp)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        with scope("bs::bucket_finish"):  # bertsweep's name for the clipping (and allreduce) after backward
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        with scope("bs::optimizer_step"):
            opt.step()
        return real, int(lab.numel()), float(loss)

    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    for i in range(args.warmup):
        step(i)
    sync()
    prof = None
    if args.profile:
        from torch.profiler import profile, ProfilerActivity
        prof = profile(activities=[ProfilerActivity.CPU])
        prof.__enter__()
    real = masked = 0
    t0 = time.perf_counter()
    for i in range(args.warmup, args.warmup + args.steps):
        r, m, loss = step(i)
        real += r
        masked += m
    sync()
    wall = time.perf_counter() - t0
    if prof is not None:
        prof.__exit__(None, None, None)
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)
        res["profile_top"] = table
        if args.profile_tsv:
            write_profile_tsv(prof, wall, args.profile_tsv)
    computed = args.steps * args.batch * L
    flops = training_flops(c, V, args.batch, L, masked / args.steps)
    res.update({"vocab": V, "seq_len": L, "device": args.device, "dtype": args.dtype, "autocast": args.autocast, "steps": args.steps, "warmup": args.warmup,
                "step_seconds": wall / args.steps, "samples_per_s": args.steps * args.batch / wall,
                "tokens_per_s": computed / wall, "effective_tokens_per_s": real / wall,
                "padding_waste": 1 - real / computed, "train_gflops": flops / (wall / args.steps) / 1e9,
                "final_loss": loss})
    print(json.dumps(res))


if __name__ == "__main__":
    main()
