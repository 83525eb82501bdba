"""Reference BERT for pretraining in plain PyTorch with Hugging Face / NVIDIA parameter names, written to
mirror bertsweep's model (trainer/BertModel.cpp): post-LayerNorm encoder (eps 1e-12), erf GELU, additive
-1e4 mask on padded keys, MLM head dense + GELU + LayerNorm + decoder tied to the word embeddings with its own
bias, NSP head pooler dense + tanh + 2-way classifier.

usage: init_checkpoint_reference.py OUT_DIR VOCAB HIDDEN LAYERS HEADS INTERMEDIATE MAX_POSITION
Writes to OUT_DIR:
  state_dict.pt   torch.save(model.state_dict()) (HF names, incl. the tied decoder weight and a buffer)
  reference.pt    torch.save of a dict: the fixed inputs and the eval-mode MLM/NSP logits
  missing.pt      the state dict without bert.encoder.layer.1.output.dense.weight
  bad_shape.pt    the state dict with cls.seq_relationship.weight of shape [3, HIDDEN]
"""
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

EPS = 1e-12


class SelfAttention(nn.Module):
    def __init__(self, h):
        super().__init__()
        self.query = nn.Linear(h, h)
        self.key = nn.Linear(h, h)
        self.value = nn.Linear(h, h)


class AttentionOutput(nn.Module):
    def __init__(self, h):
        super().__init__()
        self.dense = nn.Linear(h, h)
        self.LayerNorm = nn.LayerNorm(h, eps=EPS)


class Attention(nn.Module):
    def __init__(self, h):
        super().__init__()
        self.self = SelfAttention(h)
        self.output = AttentionOutput(h)


class Intermediate(nn.Module):
    def __init__(self, h, i):
        super().__init__()
        self.dense = nn.Linear(h, i)


class Output(nn.Module):
    def __init__(self, h, i):
        super().__init__()
        self.dense = nn.Linear(i, h)
        self.LayerNorm = nn.LayerNorm(h, eps=EPS)


class Layer(nn.Module):
    def __init__(self, h, i, heads):
        super().__init__()
        self.heads = heads
        self.attention = Attention(h)
        self.intermediate = Intermediate(h, i)
        self.output = Output(h, i)

    def forward(self, x, mask_bias):  # x [B, L, H], mask_bias [B, 1, 1, L]
        b, l, h = x.shape
        d = h // self.heads
        sa = self.attention.self

        def split(t):
            return t.view(b, l, self.heads, d).permute(0, 2, 1, 3)

        q, k, v = split(sa.query(x)), split(sa.key(x)), split(sa.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d) + mask_bias
        ctx = torch.matmul(torch.softmax(scores, dim=-1), v).permute(0, 2, 1, 3).reshape(b, l, h)
        a = self.attention.output.LayerNorm(self.attention.output.dense(ctx) + x)
        f = self.output.dense(F.gelu(self.intermediate.dense(a)))
        return self.output.LayerNorm(f + a)


class Embeddings(nn.Module):
    def __init__(self, vocab, h, max_pos):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, h)
        self.position_embeddings = nn.Embedding(max_pos, h)
        self.token_type_embeddings = nn.Embedding(2, h)
        self.LayerNorm = nn.LayerNorm(h, eps=EPS)
        self.register_buffer("position_ids", torch.arange(max_pos).unsqueeze(0))  # as HF keeps it


class Encoder(nn.Module):
    def __init__(self, h, i, heads, n):
        super().__init__()
        self.layer = nn.ModuleList([Layer(h, i, heads) for _ in range(n)])


class Pooler(nn.Module):
    def __init__(self, h):
        super().__init__()
        self.dense = nn.Linear(h, h)


class Bert(nn.Module):
    def __init__(self, vocab, h, n, heads, i, max_pos):
        super().__init__()
        self.embeddings = Embeddings(vocab, h, max_pos)
        self.encoder = Encoder(h, i, heads, n)
        self.pooler = Pooler(h)


class Transform(nn.Module):
    def __init__(self, h):
        super().__init__()
        self.dense = nn.Linear(h, h)
        self.LayerNorm = nn.LayerNorm(h, eps=EPS)


class Predictions(nn.Module):
    def __init__(self, vocab, h):
        super().__init__()
        self.transform = Transform(h)
        self.decoder = nn.Linear(h, vocab, bias=False)
        self.bias = nn.Parameter(torch.zeros(vocab))


class Heads(nn.Module):
    def __init__(self, vocab, h):
        super().__init__()
        self.predictions = Predictions(vocab, h)
        self.seq_relationship = nn.Linear(h, 2)


class BertForPreTraining(nn.Module):
    def __init__(self, vocab, h, n, heads, i, max_pos):
        super().__init__()
        self.bert = Bert(vocab, h, n, heads, i, max_pos)
        self.cls = Heads(vocab, h)
        self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight  # tied

    def forward(self, ids, seg, pos, attn, mlm_positions, nsp_positions):
        e = self.bert.embeddings
        x = e.LayerNorm(e.word_embeddings(ids) + e.position_embeddings(pos) + e.token_type_embeddings(seg))
        mask_bias = (attn == 0).to(x.dtype).mul(-1e4)[:, None, None, :]
        for layer in self.bert.encoder.layer:
            x = layer(x, mask_bias)
        flat = x.reshape(-1, x.shape[-1])
        p = self.cls.predictions
        m = p.transform.LayerNorm(F.gelu(p.transform.dense(flat[mlm_positions])))
        mlm = F.linear(m, p.decoder.weight, p.bias)
        nsp = self.cls.seq_relationship(torch.tanh(self.bert.pooler.dense(flat[nsp_positions])))
        return mlm, nsp


def main():
    out = sys.argv[1]
    vocab, h, n, heads, i, max_pos = (int(a) for a in sys.argv[2:8])
    torch.manual_seed(1234)
    model = BertForPreTraining(vocab, h, n, heads, i, max_pos)
    # Every parameter random and away from its default (LayerNorm 1/0, zero biases): a swapped or dropped
    # tensor changes the logits.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm.weight" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.05 * torch.randn_like(p))
    model.eval()
    b, l = 3, 24
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(5, vocab, (b, l), generator=g)
    lengths = [24, 17, 9]
    attn = torch.zeros(b, l, dtype=torch.long)
    seg = torch.zeros(b, l, dtype=torch.long)
    for r, n_tok in enumerate(lengths):
        attn[r, :n_tok] = 1
        seg[r, n_tok // 2:n_tok] = 1
        ids[r, n_tok:] = 0
    pos = torch.arange(l).unsqueeze(0).repeat(b, 1)
    mlm_positions = torch.tensor([1, 5, 11, 23, 24 + 2, 24 + 16, 48 + 3, 48 + 8])
    nsp_positions = torch.tensor([0, 24, 48])
    with torch.no_grad():
        mlm, nsp = model(ids, seg, pos, attn, mlm_positions, nsp_positions)
    sd = model.state_dict()
    torch.save(sd, os.path.join(out, "state_dict.pt"))
    torch.save({"input_ids": ids, "segment_ids": seg, "position_ids": pos, "attention_ids": attn,
                "mlm_positions": mlm_positions, "nsp_positions": nsp_positions,
                "mlm_logits": mlm, "nsp_logits": nsp}, os.path.join(out, "reference.pt"))
    missing = {k: v for k, v in sd.items() if k != "bert.encoder.layer.1.output.dense.weight"}
    torch.save(missing, os.path.join(out, "missing.pt"))
    bad = dict(sd)
    bad["cls.seq_relationship.weight"] = torch.zeros(3, h)
    torch.save(bad, os.path.join(out, "bad_shape.pt"))
    print("wrote", out, "mlm", tuple(mlm.shape), "nsp", tuple(nsp.shape))


if __name__ == "__main__":
    main()
