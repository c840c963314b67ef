#!/usr/bin/env python3
"""Medians and spreads (min-max) over the runs of scripts/bench_all.sh, as Markdown tables."""
import glob
import json
import os
import statistics
import sys


def load(pattern):
    return [json.load(open(f)) for f in sorted(glob.glob(pattern))]


def num(v):
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"


def stat(values):
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    if len(values) == 1:
        return num(values[0])
    return f"{num(statistics.median(values))} ({num(min(values))}-{num(max(values))})"


def main(d):
    runs = load(os.path.join(d, "moe_*.json"))
    print(f"## MoE layer, forward + backward ({len(runs)} runs: median (min-max))\n")
    print("| shape | implementation | tokens/s | GFLOP/s | vs dense |\n|---|---|---|---|---|")
    keys = []
    for r in runs[0] if runs else []:
        keys.append((r["shape"], r["impl"]))
    for shape, impl in keys:
        rows = [x for run in runs for x in run if x["shape"] == shape and x["impl"] == impl and "note" not in x]
        if not rows:
            note = next(x["note"] for run in runs for x in run if x["shape"] == shape and x["impl"] == impl)
            print(f"| {shape} | {impl} | {note} | | |")
            continue
        print(f"| {shape} | {impl} | {stat([x['tokens_per_s'] for x in rows])} | "
              f"{stat([x['gflops'] for x in rows])} | {stat([x['vs_dense'] for x in rows])} |")
    scaling = load(os.path.join(d, "scaling*.json"))
    if scaling:
        print(f"\n## Scaling: E = 8..256 at fixed active width k F = 1024 ({len(scaling)} runs: median (min-max))\n")
        paths = list(dict.fromkeys(x["impl"].strip() for x in scaling[0] if not x["impl"].startswith("dense")))
        print("| E | dense ms | " + " | ".join(f"{p}: ms, vs dense" for p in paths) + " |")
        print("|---|---|" + "---|" * len(paths))
        for shape in dict.fromkeys(x["shape"] for x in scaling[0]):
            def rows(impl):
                return [x for run in scaling for x in run if x["shape"] == shape and x["impl"].strip() == impl]
            dense = next(x["impl"] for x in scaling[0] if x["impl"].startswith("dense"))
            cells = [f"{stat([1e3 * x['seconds'] for x in rows(p)])}, {stat([x['vs_dense'] for x in rows(p)])}x"
                     for p in paths]
            print(f"| {shape[1:]} | {stat([1e3 * x['seconds'] for x in rows(dense)])} | " + " | ".join(cells) + " |")
    runs = load(os.path.join(d, "kernels_*.json"))
    print(f"\n## Kernels vs their LibTorch compositions ({len(runs)} runs)\n")
    print("| kernel | shape | ours ms | LibTorch ms | speed-up | GFLOP/s | rel. error |\n|---|---|---|---|---|---|---|")
    for i, k in enumerate(runs[0] if runs else []):
        rows = [run[i] for run in runs]
        if "note" in k:
            print(f"| {k['kernel']} | {k['shape']} | {k['note']} | | | | |")
            continue
        print(f"| {k['kernel']} | {k['shape']} | {stat([1e3 * r['ours_s'] for r in rows])} | "
              f"{stat([1e3 * r['libtorch_s'] for r in rows])} | "
              f"{stat([r['libtorch_s'] / r['ours_s'] for r in rows])} | "
              f"{stat([r['flops'] / r['ours_s'] / 1e9 for r in rows])} | {max(r['relative_error'] for r in rows):.1e} |")
    runs = load(os.path.join(d, "unif_*.json"))
    if runs:
        print(f"\n## UniF-MoE layer vs top-2 ({len(runs)} runs)\n")
        print("| input scale | layer | mean C_B | inference ms | fwd+bwd ms | inference vs top-2 | fwd+bwd vs top-2 | "
              "C_B / top-2 |\n|---|---|---|---|---|---|---|---|")
        for i, row in enumerate(runs[0]):
            rows = [run[i] for run in runs]
            print(f"| {row.get('input_scale')} | {row.get('layer')} | {row.get('mean_blocks', 0):.2f} | "
                  f"{stat([1e3 * r['infer_seconds'] for r in rows])} | {stat([1e3 * r['train_seconds'] for r in rows])} | "
                  f"{stat([r['infer_vs_top2'] for r in rows])} | {stat([r['train_vs_top2'] for r in rows])} | "
                  f"{row['blocks_vs_top2']:.2f} |")
    runs = load(os.path.join(d, "train_*.json"))
    if runs:
        print(f"\n## Training step ({len(runs)} runs)\n")
        ours = [r["moeforge"]["tokens_per_s"] for r in runs]
        print("| | tokens/s | model GFLOP/s / sgemm | ours vs it |\n|---|---|---|---|")
        print(f"| moeforge | {stat(ours)} | {stat([r['moeforge']['model_gflops'] / r['sgemm_gflops'] for r in runs])} | |")
        for key, name in (("pytorch_tuned", "PyTorch, our environment"), ("pytorch_default", "PyTorch, default")):
            tps = [r[key].get("tokens_per_s") for r in runs]
            print(f"| {name} | {stat(tps)} | | {stat([o / t for o, t in zip(ours, tps) if t])} |")
    generation(load(os.path.join(d, "generate_*.json")))
    generation(load(os.path.join(d, "generate64_*.json")))
    runs = load(os.path.join(d, "serve_*.json"))
    if runs:
        print(f"\n## Server, 16 clients arriving over 2 s ({len(runs)} runs)\n")
        print("| batching | tokens/s | p50 ms | p95 ms |\n|---|---|---|---|")
        for batching in dict.fromkeys(x["batching"] for x in runs[0]):
            rows = [x for run in runs for x in run if x["batching"] == batching]
            print(f"| {batching} | {stat([x['tokens_per_s'] for x in rows])} | {stat([x['p50_ms'] for x in rows])} | "
                  f"{stat([x['p95_ms'] for x in rows])} |")


def vs_bound(run):
    """batch 1's decode steps over the bound measured beside them (bench generate's rounds since
    2026-12-07), or, in older results, over the bound of the reads at the benchmark's start and end"""
    ours = run["moeforge"]
    return ours["batch1_vs_bound"] if "batch1_vs_bound" in ours else \
        ours["batch1_steps_tokens_per_s"] / run["bound_tokens_per_s"]


def bound(run):
    """batch 1's bound in tokens/s: of the round vs_bound took, or of the start and end reads"""
    ours = run["moeforge"]
    if "batch1_read_gbs" in ours:
        return ours["batch1_read_gbs"] * 1e9 / run["weight_bytes_per_step"]
    return run["bound_tokens_per_s"]


def generation(runs):
    if not runs:
        return
    print(f"\n## Generation, greedy with the KV cache: {runs[0]['source']} ({len(runs)} runs)\n")
    print("| batch | ours tokens/s | decode steps vs bound | PyTorch tokens/s | ours vs PyTorch | bandwidth bound "
          "(batch 1) |\n|---|---|---|---|---|---|")
    for b in (1, 8):
        k = f"batch{b}_tokens_per_s"
        ours = [r["moeforge"][k] for r in runs]
        theirs = [r["pytorch"].get(k) for r in runs]
        print(f"| {b} | {stat(ours)} | {stat([vs_bound(r) for r in runs]) if b == 1 else ''} | {stat(theirs)} | "
              f"{stat([o / t for o, t in zip(ours, theirs) if t])} | "
              f"{stat([bound(r) for r in runs]) if b == 1 else ''} |")
    ratio = [r["moeforge"]["batch8_tokens_per_s"] / r["moeforge"]["batch1_tokens_per_s"] for r in runs]
    print(f"\nbatch 8 / batch 1: {stat(ratio)}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench_results")
