#!/usr/bin/python3
"""Independent reference of the Hugging Face decoder architectures moeforge imports (LLaMA,
Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE), written from a reading of their modeling code in
transformers (not available here): it writes a tiny random model in exact Hugging Face layout
(config.json, model.safetensors or shards + index, F32 / BF16 / F16) and the logits and router
top-k choices of a fixed batch, computed in float32 from the stored weights.

usage: hf_reference.py --arch mixtral --dtype bf16 --shards 2 --out DIR
writes DIR/config.json, DIR/model*.safetensors, DIR/reference.safetensors (ids, logits,
topk.<layer>)"""
import argparse
import json
import math
import os
import shutil
import struct

import torch

CONFIGS = {
    "llama": dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=32, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, intermediate_size=48, vocab_size=97,
                  rope_theta=10000.0, rms_norm_eps=1e-5, max_position_embeddings=64, tie_word_embeddings=True,
                  attention_bias=True, hidden_act="silu"),
    "mixtral": dict(model_type="mixtral", architectures=["MixtralForCausalLM"], hidden_size=32, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, intermediate_size=24, vocab_size=101,
                    num_local_experts=4, num_experts_per_tok=2, rope_theta=1e6, rms_norm_eps=1e-5,
                    max_position_embeddings=64, tie_word_embeddings=False, sliding_window=None, hidden_act="silu",
                    router_aux_loss_coef=0.02),
    "qwen2_moe": dict(model_type="qwen2_moe", architectures=["Qwen2MoeForCausalLM"], hidden_size=32,
                      num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
                      moe_intermediate_size=16, shared_expert_intermediate_size=40, num_experts=6,
                      num_experts_per_tok=2, norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[1],
                      vocab_size=89, rope_theta=1e6, rms_norm_eps=1e-6, max_position_embeddings=64,
                      tie_word_embeddings=False, use_sliding_window=False, sliding_window=4096, hidden_act="silu"),
    "qwen3_moe": dict(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], hidden_size=32,
                      num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                      intermediate_size=48, moe_intermediate_size=16, num_experts=8, num_experts_per_tok=3,
                      norm_topk_prob=True, decoder_sparse_step=2, mlp_only_layers=[], vocab_size=103,
                      rope_theta=1e6, rms_norm_eps=1e-6, max_position_embeddings=64, tie_word_embeddings=False,
                      attention_bias=False, use_sliding_window=False, hidden_act="silu"),
    "olmoe": dict(model_type="olmoe", architectures=["OlmoeForCausalLM"], hidden_size=32, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, intermediate_size=16, num_experts=8,
                  num_experts_per_tok=2, norm_topk_prob=False, vocab_size=91, rope_theta=10000.0, rms_norm_eps=1e-5,
                  max_position_embeddings=64, tie_word_embeddings=False, attention_bias=False, clip_qkv=None,
                  hidden_act="silu"),
}


def head_dim(c):
    return c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]


def sparse_layers(c):
    t = c["model_type"]
    if t == "llama":
        return []
    if t in ("mixtral", "olmoe"):
        return list(range(c["num_hidden_layers"]))
    step = c.get("decoder_sparse_step", 1)
    return [i for i in range(c["num_hidden_layers"]) if i not in c.get("mlp_only_layers", []) and (i + 1) % step == 0]


def make_weights(c, gen):
    """Random weights under the Hugging Face names of c's architecture."""
    t, D, H, KV, hd = c["model_type"], c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], head_dim(c)
    w = {}

    def rnd(*shape, std=0.1, mean=0.0):
        return torch.randn(*shape, generator=gen) * std + mean

    w["model.embed_tokens.weight"] = rnd(c["vocab_size"], D, std=0.5)
    attn_bias = c.get("attention_bias", False)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = rnd(D, mean=1.0)
        w[p + "post_attention_layernorm.weight"] = rnd(D, mean=1.0)
        w[p + "self_attn.q_proj.weight"] = rnd(H * hd, D, std=0.2)
        w[p + "self_attn.k_proj.weight"] = rnd(KV * hd, D, std=0.2)
        w[p + "self_attn.v_proj.weight"] = rnd(KV * hd, D, std=0.2)
        w[p + "self_attn.o_proj.weight"] = rnd(D, H * hd, std=0.2)
        if attn_bias or t == "qwen2_moe":
            for n, rows in (("q", H * hd), ("k", KV * hd), ("v", KV * hd)):
                w[p + f"self_attn.{n}_proj.bias"] = rnd(rows)
        if attn_bias:
            w[p + "self_attn.o_proj.bias"] = rnd(D)
        if t == "qwen3_moe":
            w[p + "self_attn.q_norm.weight"] = rnd(hd, mean=1.0)
            w[p + "self_attn.k_norm.weight"] = rnd(hd, mean=1.0)
        if t == "olmoe":
            w[p + "self_attn.q_norm.weight"] = rnd(H * hd, mean=1.0)
            w[p + "self_attn.k_norm.weight"] = rnd(KV * hd, mean=1.0)
        if i in sparse_layers(c):
            E = c.get("num_local_experts") or c["num_experts"]
            F = c["intermediate_size"] if t in ("mixtral", "olmoe") else c["moe_intermediate_size"]
            m = "block_sparse_moe" if t == "mixtral" else "mlp"
            names = ("w1", "w3", "w2") if t == "mixtral" else ("gate_proj", "up_proj", "down_proj")
            w[p + f"{m}.gate.weight"] = rnd(E, D, std=0.5)
            for e in range(E):
                w[p + f"{m}.experts.{e}.{names[0]}.weight"] = rnd(F, D, std=0.2)
                w[p + f"{m}.experts.{e}.{names[1]}.weight"] = rnd(F, D, std=0.2)
                w[p + f"{m}.experts.{e}.{names[2]}.weight"] = rnd(D, F, std=0.2)
            if t == "qwen2_moe":
                S = c["shared_expert_intermediate_size"]
                w[p + "mlp.shared_expert.gate_proj.weight"] = rnd(S, D, std=0.2)
                w[p + "mlp.shared_expert.up_proj.weight"] = rnd(S, D, std=0.2)
                w[p + "mlp.shared_expert.down_proj.weight"] = rnd(D, S, std=0.2)
                w[p + "mlp.shared_expert_gate.weight"] = rnd(1, D, std=0.5)
        else:
            Fd = c["intermediate_size"]
            w[p + "mlp.gate_proj.weight"] = rnd(Fd, D, std=0.2)
            w[p + "mlp.up_proj.weight"] = rnd(Fd, D, std=0.2)
            w[p + "mlp.down_proj.weight"] = rnd(D, Fd, std=0.2)
    w["model.norm.weight"] = rnd(D, mean=1.0)
    if not c.get("tie_word_embeddings", False):
        w["lm_head.weight"] = rnd(c["vocab_size"], D, std=0.2)
    return w


DTYPES = {"f32": (torch.float32, "F32"), "bf16": (torch.bfloat16, "BF16"), "f16": (torch.float16, "F16")}


def tensor_bytes(t):
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().tobytes()
    return t.numpy().tobytes()


def write_safetensors(path, tensors, names):
    header, offset, blobs = {"__metadata__": {"format": "pt"}}, 0, []
    for n, (t, code) in ((n, tensors[n]) for n in names):
        b = tensor_bytes(t)
        header[n] = {"dtype": code, "shape": list(t.shape), "data_offsets": [offset, offset + len(b)]}
        offset += len(b)
        blobs.append(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def read_dir(path):
    """Every tensor of a Hugging Face directory (model.safetensors or the shards its index lists), float32."""
    index = os.path.join(path, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]
    codes = {code: dtype for dtype, code in DTYPES.values()}
    out = {}
    for file in files:
        with open(os.path.join(path, file), "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header, data = json.loads(f.read(n)), f.read()
        for name, e in header.items():
            if name == "__metadata__":
                continue
            b, end = e["data_offsets"]
            raw = bytearray(data[b:end])
            if e["dtype"] == "BF16":
                t = torch.frombuffer(raw, dtype=torch.int16).view(torch.bfloat16)
            else:
                t = torch.frombuffer(raw, dtype=codes[e["dtype"]])
            out[name] = t.reshape(e["shape"]).float()
    return out


def check_dir(path):
    """The directory's tensors are exactly the names and shapes its config.json implies (make_weights,
    written from transformers' modeling code); then the reference's logits on fixed ids."""
    c = json.load(open(os.path.join(path, "config.json")))
    expected = {n: tuple(t.shape) for n, t in make_weights(c, torch.Generator().manual_seed(0)).items()}
    found = read_dir(path)
    problems = [f"missing {n} {s}" for n, s in expected.items() if n not in found]
    problems += [f"unexpected {n}" for n in found if n not in expected]
    problems += [f"{n}: shape {tuple(found[n].shape)}, config implies {s}" for n, s in expected.items()
                 if n in found and tuple(found[n].shape) != s]
    if problems:
        raise SystemExit(f"{path}: " + "; ".join(problems))
    ids = torch.arange(14).reshape(2, 7) * 5 % c["vocab_size"]
    with torch.no_grad():
        logits, _ = forward(c, found, ids)
    out = {"ids": (ids, "I64"), "logits": (logits.contiguous(), "F32")}
    write_safetensors(os.path.join(path, "check.safetensors"), out, list(out))
    print(f"{path}: {len(found)} tensors as config.json implies")


# ---- the forward pass, float32, from each architecture's modeling code ----

def rms_norm(x, weight, eps):  # LlamaRMSNorm and its copies: variance in float32, then the weight
    v = x.float().pow(2).mean(-1, keepdim=True)
    return weight * (x.float() * torch.rsqrt(v + eps))


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope(T, hd, theta):
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    freqs = torch.outer(torch.arange(T, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def linear(x, w, b=None):
    y = x @ w.t()
    return y if b is None else y + b


def attention(c, w, p, x):
    B, T, _ = x.shape
    H, KV, hd, eps = c["num_attention_heads"], c["num_key_value_heads"], head_dim(c), c["rms_norm_eps"]
    g = lambda n: w.get(p + n)
    q = linear(x, g("self_attn.q_proj.weight"), g("self_attn.q_proj.bias"))
    k = linear(x, g("self_attn.k_proj.weight"), g("self_attn.k_proj.bias"))
    v = linear(x, g("self_attn.v_proj.weight"), g("self_attn.v_proj.bias"))
    if c["model_type"] == "olmoe":  # norm over the whole projection, before the head split
        q, k = rms_norm(q, g("self_attn.q_norm.weight"), eps), rms_norm(k, g("self_attn.k_norm.weight"), eps)
    q, k, v = q.view(B, T, H, hd), k.view(B, T, KV, hd), v.view(B, T, KV, hd)
    if c["model_type"] == "qwen3_moe":  # per head, before RoPE
        q, k = rms_norm(q, g("self_attn.q_norm.weight"), eps), rms_norm(k, g("self_attn.k_norm.weight"), eps)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    cos, sin = rope(T, hd, c["rope_theta"])
    q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
    scores = q @ k.transpose(2, 3) / math.sqrt(hd)
    scores = scores + torch.full((T, T), float("-inf")).triu(1)
    out = torch.softmax(scores, dim=-1, dtype=torch.float32) @ v
    out = out.transpose(1, 2).reshape(B, T, H * hd)
    return linear(out, g("self_attn.o_proj.weight"), g("self_attn.o_proj.bias"))


def swiglu(x, gate, up, down):
    return linear(torch.nn.functional.silu(linear(x, gate)) * linear(x, up), down)


def sparse_block(c, w, p, x, topk_out):
    t = c["model_type"]
    m = "block_sparse_moe" if t == "mixtral" else "mlp"
    names = ("w1", "w3", "w2") if t == "mixtral" else ("gate_proj", "up_proj", "down_proj")
    B, T, D = x.shape
    xs = x.reshape(-1, D)
    logits = linear(xs, w[p + f"{m}.gate.weight"])
    probs = torch.softmax(logits, dim=1, dtype=torch.float)
    top_w, top_i = torch.topk(probs, c["num_experts_per_tok"], dim=-1)
    if t == "mixtral" or c.get("norm_topk_prob", False):
        top_w = top_w / top_w.sum(dim=-1, keepdim=True)
    topk_out.append(top_i)
    y = torch.zeros_like(xs)
    for tok in range(xs.shape[0]):
        for j in range(top_i.shape[1]):
            e = int(top_i[tok, j])
            pe = p + f"{m}.experts.{e}."
            y[tok] += top_w[tok, j] * swiglu(xs[tok], w[pe + names[0] + ".weight"], w[pe + names[1] + ".weight"],
                                             w[pe + names[2] + ".weight"])
    if t == "qwen2_moe":
        s = swiglu(xs, w[p + "mlp.shared_expert.gate_proj.weight"], w[p + "mlp.shared_expert.up_proj.weight"],
                   w[p + "mlp.shared_expert.down_proj.weight"])
        y = y + torch.sigmoid(linear(xs, w[p + "mlp.shared_expert_gate.weight"])) * s
    return y.view(B, T, D)


def forward(c, w, ids):
    x = w["model.embed_tokens.weight"][ids]
    topk = {}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = x + attention(c, w, p, rms_norm(x, w[p + "input_layernorm.weight"], c["rms_norm_eps"]))
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], c["rms_norm_eps"])
        if i in sparse_layers(c):
            chosen = []
            x = x + sparse_block(c, w, p, h, chosen)
            topk[i] = chosen[0]
        else:
            x = x + swiglu(h, w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"], w[p + "mlp.down_proj.weight"])
    x = rms_norm(x, w["model.norm.weight"], c["rms_norm_eps"])
    head = w["model.embed_tokens.weight"] if c.get("tie_word_embeddings", False) else w["lm_head.weight"]
    return linear(x, head), topk


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", default="",
                    help="check a directory instead: names and shapes against its config.json, and the reference's "
                         "logits on fixed ids written to DIR/check.safetensors")
    ap.add_argument("--arch", choices=sorted(CONFIGS))
    ap.add_argument("--dtype", default="f32", choices=sorted(DTYPES))
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out")
    ap.add_argument("--scale", type=int, default=1,
                    help="multiply widths by this (a multi-gigabyte model for the import benchmark)")
    ap.add_argument("--layers", type=int, default=0, help="override num_hidden_layers")
    ap.add_argument("--no-reference", action="store_true", help="write the model only")
    ap.add_argument("--vocab", type=int, default=0, help="override vocab_size (to fit a real tokenizer)")
    ap.add_argument("--tokenizer", default="",
                    help="a folder whose tokenizer.json / tokenizer_config.json / tokenizer.model are copied")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=JSON",
                    help="override a config.json key, e.g. mlp_only_layers=[] (repeatable)")
    a = ap.parse_args()
    if a.check:
        return check_dir(a.check)
    if not a.arch or not a.out:
        ap.error("--arch and --out are required (or --check DIR)")
    c = dict(CONFIGS[a.arch])
    for key in ("hidden_size", "intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size"):
        if key in c:
            c[key] *= a.scale
    if "head_dim" in c:
        c["head_dim"] *= a.scale
    if a.layers:
        c["num_hidden_layers"] = a.layers
    if a.vocab:
        c["vocab_size"] = a.vocab
    for item in a.set:
        key, value = item.split("=", 1)
        c[key] = json.loads(value)
    gen = torch.Generator().manual_seed(a.seed)
    dtype, code = DTYPES[a.dtype]
    stored = {n: (t.to(dtype), code) for n, t in make_weights(c, gen).items()}
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(dict(c, torch_dtype={"f32": "float32", "bf16": "bfloat16", "f16": "float16"}[a.dtype]), f, indent=2)
    names = list(stored)
    if a.shards == 1:
        write_safetensors(os.path.join(a.out, "model.safetensors"), stored, names)
    else:
        per = math.ceil(len(names) / a.shards)
        weight_map = {}
        for s in range(a.shards):
            file = f"model-{s + 1:05d}-of-{a.shards:05d}.safetensors"
            part = names[s * per:(s + 1) * per]
            write_safetensors(os.path.join(a.out, file), stored, part)
            weight_map.update({n: file for n in part})
        with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f, indent=2)
    for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model"):
        if a.tokenizer and os.path.isfile(os.path.join(a.tokenizer, name)):
            shutil.copyfile(os.path.join(a.tokenizer, name), os.path.join(a.out, name))
    if a.no_reference:
        return
    weights = {n: t.float() for n, (t, _) in stored.items()}  # compute in float32 from what is stored
    ids = torch.randint(0, c["vocab_size"], (2, 7), generator=gen)
    with torch.no_grad():
        logits, topk = forward(c, weights, ids)
    out = {"ids": (ids, "I64"), "logits": (logits.contiguous(), "F32")}
    out.update({f"topk.{i}": (t.contiguous(), "I64") for i, t in topk.items()})
    write_safetensors(os.path.join(a.out, "reference.safetensors"), out, list(out))


if __name__ == "__main__":
    main()
