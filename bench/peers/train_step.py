#!/usr/bin/env python3
"""The quickstart model and training step as a PyTorch user writes them (Mixtral / Hugging Face
style: RMSNorm, RoPE, grouped-query attention, a top-k MoE of SwiGLU experts looped per expert,
Switch + z losses, AdamW with weight decay, gradient clipping).

Run by `moeforge bench train` with Debian's python3-torch; prints one JSON line.
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F


class RMSNorm(torch.nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(x, theta=10000.0):  # x: [B, H, T, Dh]
    T, Dh = x.shape[-2], x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, Dh, 2, dtype=torch.float) / Dh)
    ang = torch.outer(torch.arange(T, dtype=torch.float), inv)
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x[..., : Dh // 2], x[..., Dh // 2:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)


class Attention(torch.nn.Module):
    def __init__(self, d, heads, kv_heads):
        super().__init__()
        self.h, self.kv, self.dh = heads, kv_heads, d // heads
        self.q = torch.nn.Linear(d, d, bias=False)
        self.k = torch.nn.Linear(d, kv_heads * self.dh, bias=False)
        self.v = torch.nn.Linear(d, kv_heads * self.dh, bias=False)
        self.o = torch.nn.Linear(d, d, bias=False)

    def forward(self, x):
        B, T, _ = x.shape
        q = rope(self.q(x).view(B, T, self.h, self.dh).transpose(1, 2))
        k = rope(self.k(x).view(B, T, self.kv, self.dh).transpose(1, 2))
        v = self.v(x).view(B, T, self.kv, self.dh).transpose(1, 2)
        k = k.repeat_interleave(self.h // self.kv, 1)
        v = v.repeat_interleave(self.h // self.kv, 1)
        s = q @ k.transpose(-2, -1) / self.dh ** 0.5
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        return self.o((s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, -1))


class MoE(torch.nn.Module):
    def __init__(self, d, experts, k, hidden):
        super().__init__()
        self.k = k
        self.gate = torch.nn.Linear(d, experts, bias=False)
        self.w1 = torch.nn.ModuleList(torch.nn.Linear(d, hidden, bias=False) for _ in range(experts))
        self.w3 = torch.nn.ModuleList(torch.nn.Linear(d, hidden, bias=False) for _ in range(experts))
        self.w2 = torch.nn.ModuleList(torch.nn.Linear(hidden, d, bias=False) for _ in range(experts))

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        logits = self.gate(x)
        probs = F.softmax(logits, dim=-1, dtype=torch.float)
        weights, experts = torch.topk(probs, self.k, dim=-1)
        weights = (weights / weights.sum(-1, keepdim=True)).to(x.dtype)
        E = len(self.w1)
        load = F.one_hot(experts, E).float().sum(1).mean(0) / self.k
        aux = 1e-2 * E * (load * probs.mean(0)).sum() + 1e-3 * torch.logsumexp(logits, -1).pow(2).mean()
        out = torch.zeros_like(x)
        mask = F.one_hot(experts, E).permute(2, 1, 0)  # [E, k, T]
        for e in range(E):
            slot, tok = torch.where(mask[e])
            if tok.numel() == 0:
                continue
            h = x[tok]
            y = self.w2[e](F.silu(self.w1[e](h)) * self.w3[e](h))
            out.index_add_(0, tok, y * weights[tok, slot, None])
        return out.view(shape), aux


class Block(torch.nn.Module):
    def __init__(self, a):
        super().__init__()
        self.n1, self.n2 = RMSNorm(a.d), RMSNorm(a.d)
        self.attn = Attention(a.d, a.heads, a.kv_heads)
        self.moe = MoE(a.d, a.experts, a.top_k, a.expert_hidden)

    def forward(self, x):
        x = x + self.attn(self.n1(x))
        y, aux = self.moe(self.n2(x))
        return x + y, aux


class LM(torch.nn.Module):
    def __init__(self, a):
        super().__init__()
        self.embed = torch.nn.Embedding(a.vocab, a.d)
        self.blocks = torch.nn.ModuleList(Block(a) for _ in range(a.layers))
        self.norm = RMSNorm(a.d)
        self.head = torch.nn.Linear(a.d, a.vocab, bias=False)

    def forward(self, tokens, targets):
        x, aux = self.embed(tokens), 0.0
        for b in self.blocks:
            x, a = b(x)
            aux = aux + a
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1)) + aux / len(self.blocks)


def main():
    p = argparse.ArgumentParser()
    for name in ("d", "layers", "heads", "kv_heads", "experts", "top_k", "expert_hidden", "vocab", "batch", "seq",
                 "steps", "warmup", "threads"):
        p.add_argument("--" + name.replace("_", "-"), type=int, required=True)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--weight-decay", type=float, default=0.1)
    a = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(a.threads)
    model = LM(a)
    for m in model.modules():
        if isinstance(m, (torch.nn.Linear, torch.nn.Embedding)):
            torch.nn.init.normal_(m.weight, std=0.02)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=a.weight_decay)
    t0 = None
    for step in range(a.warmup + a.steps):
        if step == a.warmup:
            t0 = time.perf_counter()
        tokens = torch.randint(0, a.vocab, (a.batch, a.seq + 1))
        loss = model(tokens[:, :-1], tokens[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    seconds = time.perf_counter() - t0
    print(json.dumps({"seconds": seconds, "tokens_per_s": a.steps * a.batch * a.seq / seconds,
                      "loss": loss.item(), "torch": torch.__version__}))


if __name__ == "__main__":
    main()
