#!/bin/bash
# The streamed commands on a Hugging Face checkpoint larger than this machine's memory, with wall
# time and peak RSS (docs/benchmarks.md). DIR holds `big` (bench/make_hf_moe.py --out DIR/big) and
# calib.txt (any text):  MOEFORGE=build/release/moeforge bench/measure_streamed.sh DIR
set -u
M=$(realpath "${MOEFORGE:-build/release/moeforge}")
cd "${1:-.}"
run() { local name=$1; shift; /usr/bin/time -f "%e s, %M KB" "$@" > "$name.out" 2> "$name.time"; echo "$name: $(tail -1 $name.time)"; }
sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null
run info $M info big
run saliency $M saliency big --calib calib.txt --samples 16 --seq-len 64 --layerwise
run gguf_big $M export big --format gguf --dtype q8_0 -o big_q8_0.gguf
ls -la big_q8_0.gguf; rm -f big_q8_0.gguf
run umoe $M umoe big --calib calib.txt --samples 16 --seq-len 64 --layerwise --prune-only --prune 0.75 -o big_pruned
du -sh big_pruned
run gguf_pruned $M export big_pruned --format gguf --dtype q8_0 -o big_pruned_q8_0.gguf
ls -la big_pruned_q8_0.gguf
echo done
