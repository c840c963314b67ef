#!/usr/bin/env python3
"""scripts/bench_summary.py on two runs of hand-made results: medians with their spreads, the
batch-8 / batch-1 ratio and the bound, one generation table per model, the server's rows."""
import json
import os
import subprocess
import sys
import tempfile


def generate(source, b1, b8, steps1, bound, beside=None):
    """beside: (vs_bound, read GB/s) of the round bench generate measured beside batch 1; without,
    the results of before 2026-12-07 (one bound from the reads at the start and end)"""
    run = {"source": source, "bound_tokens_per_s": bound, "pytorch": {"skipped": "--peer ''"},
           "weight_bytes_per_step": 500e6,
           "moeforge": {"batch1_tokens_per_s": b1, "batch8_tokens_per_s": b8, "batch1_steps_tokens_per_s": steps1}}
    if beside:
        run["moeforge"].update({"batch1_vs_bound": beside[0], "batch1_read_gbs": beside[1]})
    return run


def serve(tps, p50, p95):
    return [{"batching": "continuous", "tokens_per_s": tps, "p50_ms": p50, "p95_ms": p95},
            {"batching": "static", "tokens_per_s": tps / 2, "p50_ms": 2 * p50, "p95_ms": 2 * p95}]


def main(script):
    files = {
        "generate_1.json": generate("configs/quickstart.toml", 1000, 2000, 1200, 1500),
        "generate_2.json": generate("configs/quickstart.toml", 2000, 3000, 1800, 1500),
        "generate64_1.json": generate("bench/models/moe64-top8.toml", 50, 100, 60, 100, (0.9, 40.0)),
        "generate64_2.json": generate("bench/models/moe64-top8.toml", 70, 210, 80, 100, (0.7, 60.0)),
        "serve_1.json": serve(3000, 50, 60),
        "serve_2.json": serve(3600, 60, 80),
    }
    with tempfile.TemporaryDirectory() as d:
        for name, body in files.items():
            with open(os.path.join(d, name), "w") as f:
                json.dump(body, f)
        out = subprocess.run([sys.executable, script, d], check=True, capture_output=True, text=True).stdout
    expected = [
        "## Generation, greedy with the KV cache: configs/quickstart.toml (2 runs)",
        "| 1 | 1500 (1000-2000) | 1.00 (0.80-1.20) | - | - | 1500 (1500-1500) |",  # steps / bound
        "batch 8 / batch 1: 1.75 (1.50-2.00)",
        "## Generation, greedy with the KV cache: bench/models/moe64-top8.toml (2 runs)",
        "| 1 | 60.0 (50.0-70.0) | 0.80 (0.70-0.90) | - | - | 100 (80.0-120) |",  # the rounds' own: 40 and 60 GB/s
        "batch 8 / batch 1: 2.50 (2.00-3.00)",
        "| continuous | 3300 (3000-3600) | 55.0 (50.0-60.0) | 70.0 (60.0-80.0) |",
        "| static | 1650 (1500-1800) | 110 (100-120) | 140 (120-160) |",
    ]
    missing = [line for line in expected if line not in out.splitlines()]
    if missing:
        print("bench_summary.py's tables lack:\n  " + "\n  ".join(missing) + "\n--- its output:\n" + out)
        return 1
    print(f"bench_summary: {len(expected)} lines as computed by hand")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
