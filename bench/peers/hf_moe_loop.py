#!/usr/bin/env python3
"""The per-expert loop users write today (Mixtral / Hugging Face style), timed forward+backward.

Run by `moeforge bench moe` with Debian's python3-torch; prints one JSON line.
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F


class LoopMoE(torch.nn.Module):
    def __init__(self, d, e, k, f):
        super().__init__()
        self.k = k
        self.gate = torch.nn.Linear(d, e, bias=False)
        self.w1 = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(f, d) * 0.02) for _ in range(e)])
        self.w3 = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(f, d) * 0.02) for _ in range(e)])
        self.w2 = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(d, f) * 0.02) for _ in range(e)])

    def forward(self, x):
        probs = F.softmax(self.gate(x), dim=-1, dtype=torch.float)
        weights, experts = torch.topk(probs, self.k, dim=-1)
        weights = (weights / weights.sum(dim=-1, keepdim=True)).to(x.dtype)
        out = torch.zeros_like(x)
        mask = F.one_hot(experts, num_classes=len(self.w1)).permute(2, 1, 0)  # [E, k, T]
        for e in range(len(self.w1)):
            slot, tok = torch.where(mask[e])
            if tok.numel() == 0:
                continue
            h = x[tok]
            y = F.linear(F.silu(F.linear(h, self.w1[e])) * F.linear(h, self.w3[e]), self.w2[e])
            out.index_add_(0, tok, y * weights[tok, slot, None])
        return out


def main():
    p = argparse.ArgumentParser()
    for name in ("tokens", "d", "experts", "top_k", "hidden", "iters", "threads"):
        p.add_argument("--" + name.replace("_", "-"), type=int, required=True)
    a = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(a.threads)
    m = LoopMoE(a.d, a.experts, a.top_k, a.hidden)
    x = torch.randn(a.tokens, a.d, requires_grad=True)
    grad = torch.ones(a.tokens, a.d)
    best = float("inf")
    for i in range(a.iters + 1):  # first iteration warms up
        t0 = time.perf_counter()
        m(x).backward(grad)
        dt = time.perf_counter() - t0
        if i:
            best = min(best, dt)
    flops = 18.0 * a.tokens * a.top_k * a.d * a.hidden  # forward + backward of the active experts
    print(json.dumps({"seconds": best, "tokens_per_s": a.tokens / best, "gflops": flops / best / 1e9,
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
