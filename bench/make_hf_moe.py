#!/usr/bin/python3
"""A synthetic Hugging Face Qwen3-MoE checkpoint of any size, written tensor by tensor (one
per-expert matrix in memory at a time), for measuring streamed commands on models larger than
memory. Random bf16 weights (normal, std 0.02; norms 1), sharded with an index, and the real
Qwen3 tokenizer.json from tests/npm when --tokenizer is given.

  /usr/bin/python3 bench/make_hf_moe.py --out big --layers 20   # ~26 GB: d 2048, 128 experts of 768
"""
import argparse
import json
import os
import shutil

import torch


def tensors(c):
    d, hd, e, f = c["hidden_size"], c["head_dim"], c["num_experts"], c["moe_intermediate_size"]
    h, kv = c["num_attention_heads"], c["num_key_value_heads"]
    yield "model.embed_tokens.weight", (c["vocab_size"], d)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", (d,)
        yield p + "post_attention_layernorm.weight", (d,)
        yield p + "self_attn.q_proj.weight", (h * hd, d)
        yield p + "self_attn.k_proj.weight", (kv * hd, d)
        yield p + "self_attn.v_proj.weight", (kv * hd, d)
        yield p + "self_attn.o_proj.weight", (d, h * hd)
        yield p + "self_attn.q_norm.weight", (hd,)
        yield p + "self_attn.k_norm.weight", (hd,)
        yield p + "mlp.gate.weight", (e, d)
        for x in range(e):
            yield p + f"mlp.experts.{x}.gate_proj.weight", (f, d)
            yield p + f"mlp.experts.{x}.up_proj.weight", (f, d)
            yield p + f"mlp.experts.{x}.down_proj.weight", (d, f)
    yield "model.norm.weight", (d,)
    yield "lm_head.weight", (c["vocab_size"], d)


def value(name, shape, gen):
    if len(shape) == 1:
        return torch.ones(shape, dtype=torch.bfloat16)
    return (torch.randn(shape, generator=gen) * 0.02).to(torch.bfloat16)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=20)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--expert-hidden", type=int, default=768)
    ap.add_argument("--shard-gb", type=float, default=4.0)
    ap.add_argument("--tokenizer", default="", help="folder with tokenizer.json / tokenizer_config.json")
    a = ap.parse_args()
    c = dict(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], hidden_size=a.hidden,
             num_hidden_layers=a.layers, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
             intermediate_size=6144, moe_intermediate_size=a.expert_hidden, num_experts=a.experts,
             num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
             vocab_size=151936, rope_theta=1e6, rms_norm_eps=1e-6, max_position_embeddings=4096,
             tie_word_embeddings=False, attention_bias=False, use_sliding_window=False, hidden_act="silu",
             torch_dtype="bfloat16")
    os.makedirs(a.out, exist_ok=True)
    shards, size, limit = [[]], 0, int(a.shard_gb * 1e9)
    for name, shape in tensors(c):
        n = 2 * int(torch.tensor(shape).prod())
        if size and size + n > limit:
            shards.append([])
            size = 0
        shards[-1].append((name, shape, n))
        size += n
    gen = torch.Generator().manual_seed(0)
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        header, offset = {"__metadata__": {"format": "pt"}}, 0
        for name, shape, n in shard:
            header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + n]}
            offset += n
            weight_map[name] = file
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        with open(os.path.join(a.out, file), "wb") as f:
            f.write(len(text).to_bytes(8, "little") + text)
            for name, shape, n in shard:
                f.write(value(name, shape, gen).view(torch.int16).numpy().tobytes())
        total += offset
        print(f"{file}: {offset / 1e9:.2f} GB", flush=True)
    with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if a.tokenizer and os.path.isfile(os.path.join(a.tokenizer, name)):
            shutil.copyfile(os.path.join(a.tokenizer, name), os.path.join(a.out, name))
    print(f"{a.out}: {total / 1e9:.2f} GB of bf16 weights")


if __name__ == "__main__":
    main()
