#!/usr/bin/env bash
# The performance benchmarks of docs/benchmarks.md, each repeated --runs times (JSON per run
# under --out), then one table of medians and spreads (scripts/bench_summary.py). Run it on a
# quiet machine: every ratio is measured within one run, but this VM's neighbours move the
# absolute numbers by 10-30 %.
# Issues 39 and 41 ask for these figures on an AVX2-only machine as well as an AVX-512 one.
# usage: scripts/bench_all.sh [--runs N] [--out DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=5 out=bench_results
while [ $# -gt 0 ]; do
  case $1 in
    --runs) runs=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
MF=build/release/moeforge
mkdir -p "$out"
for i in $(seq 1 "$runs"); do
  echo "== run $i of $runs"
  $MF bench moe --shape all --json "$out/moe_$i.json"
  $MF bench kernels --json "$out/kernels_$i.json"
  $MF bench unif --json "$out/unif_$i.json"
  $MF bench train --json "$out/train_$i.json"
  $MF bench generate --json "$out/generate_$i.json"
  $MF bench generate bench/models/moe64-top8.toml --tokens 64 --peer '' --llama '' --json "$out/generate64_$i.json"
  $MF bench serve --clients 16 --requests 8 --tokens 64 --json "$out/serve_$i.json"
  $MF bench moe --shape scaling --peer '' --json "$out/scaling_$i.json"
done
python3 scripts/bench_summary.py "$out" | tee "$out/summary.md"
