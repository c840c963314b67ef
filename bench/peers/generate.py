#!/usr/bin/env python3
"""Greedy decoding with a KV cache of the quickstart model as a PyTorch user writes it (the
modules of train_step.py; attention keeps its keys and values). Run by `moeforge bench
generate` with Debian's python3-torch; prints one JSON line of tokens/s per batch size.
"""
import argparse
import json
import time

import torch

from train_step import LM


def rope_at(x, start, theta=10000.0):  # x: [B, H, T, Dh], positions start .. start + T - 1
    T, Dh = x.shape[-2], x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, Dh, 2, dtype=torch.float) / Dh)
    ang = torch.outer(torch.arange(start, start + T, dtype=torch.float), inv)
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x[..., : Dh // 2], x[..., Dh // 2:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)


def attend(attn, x, cache):
    B, T, _ = x.shape
    start = 0 if cache.get("k") is None else cache["k"].shape[2]
    q = rope_at(attn.q(x).view(B, T, attn.h, attn.dh).transpose(1, 2), start)
    k = rope_at(attn.k(x).view(B, T, attn.kv, attn.dh).transpose(1, 2), start)
    v = attn.v(x).view(B, T, attn.kv, attn.dh).transpose(1, 2)
    if start:
        k, v = torch.cat([cache["k"], k], 2), torch.cat([cache["v"], v], 2)
    cache["k"], cache["v"] = k, v
    k = k.repeat_interleave(attn.h // attn.kv, 1)
    v = v.repeat_interleave(attn.h // attn.kv, 1)
    s = q @ k.transpose(-2, -1) / attn.dh ** 0.5
    S = k.shape[2]
    s = s.masked_fill(torch.ones(T, S, dtype=torch.bool).triu(start + 1), float("-inf"))
    return attn.o((s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, -1))


def forward(model, tokens, caches):
    x = model.embed(tokens)
    for block, cache in zip(model.blocks, caches):
        x = x + attend(block.attn, block.n1(x), cache)
        y, _ = block.moe(block.n2(x))
        x = x + y
    return model.head(model.norm(x))


@torch.no_grad()
def decode(model, prompts, new_tokens):
    caches = [{} for _ in model.blocks]
    logits = forward(model, prompts, caches)
    out = []
    for _ in range(new_tokens):
        nxt = logits[:, -1].argmax(-1, keepdim=True)
        out.append(nxt)
        logits = forward(model, nxt, caches)
    return torch.cat(out, 1)


def main():
    p = argparse.ArgumentParser()
    for name in ("d", "layers", "heads", "kv_heads", "experts", "top_k", "expert_hidden", "vocab", "prompt",
                 "new_tokens", "threads"):
        p.add_argument("--" + name.replace("_", "-"), type=int, required=True)
    p.add_argument("--batches", type=str, default="1,8")
    a = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(a.threads)
    model = LM(a).eval()
    result = {"torch": torch.__version__}
    for batch in (int(b) for b in a.batches.split(",")):
        prompts = (torch.arange(a.prompt).repeat(batch, 1) * 7 + torch.arange(batch)[:, None] * 13 + 1) % a.vocab
        decode(model, prompts, 4)  # warm-up
        t0 = time.perf_counter()
        out = decode(model, prompts, a.new_tokens)
        result[f"batch{batch}_tokens_per_s"] = out.numel() / (time.perf_counter() - t0)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
