#!/usr/bin/env bash
# Data parallel on c10d (Gloo, loopback): 2 ranks == 1 process with the same global batch,
# bitwise (two-rank sums are exact), for a dense model and an MoE with the aux-free bias;
# resume of a 2-rank run on 1 rank and back; kill -9 of a worker stops the run within 60 s, so
# does a stalled one (SIGSTOP); a rank that never joins or two workers with one RANK stop every rank;
# a bad world is a clear error; expert parallel (experts sharded: each rank holds its own)
# equals one process (layer in float64, training runs within float32 reassociation), UniPool
# included, and its checkpoints resume on 1 process and under expert parallel again.
# Usage: MOEFORGE=path/to/moeforge data_parallel.sh WORKDIR
set -euo pipefail
MF=${MOEFORGE:?set MOEFORGE to the binary}
W=${1:?work directory}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$W" && mkdir -p "$W" && cd "$W"
fail() { echo "FAIL: $*" >&2; exit 1; }
# the tiny LM of the CLI tests, with two micro-batches per step (one per rank) and every step logged
cp "$SRC/tests/fixtures/tiny.toml" tiny.toml
sed -i 's/^log_every = .*/log_every = 1/; s/^\[train\]$/[train]\ngrad_accum = 2/' tiny.toml
"$MF" data prepare tiny.toml > prep.txt 2>&1 || { cat prep.txt; fail "data prepare"; }
same_model() {  # same_model RUN_A RUN_B: final logits byte-identical, and the logged losses
  for r in "$1" "$2"; do
    "$MF" eval runs/$r --dump-logits $r.logits --tokens 5,6,7,8,9 > /dev/null 2>&1 || fail "dump $r"
    grep -o '"loss":[^,]*' runs/$r/metrics.jsonl > $r.losses
  done
  cmp "$1.logits" "$2.logits" || fail "$2 ended with other weights than $1"
  cmp "$1.losses" "$2.losses" || { paste "$1.losses" "$2.losses"; fail "$2 logged other losses than $1"; }
}
MOE=(--set model.ffn=moe --set model.moe.num_experts=4 --set model.moe.top_k=2 --set model.moe.expert_hidden=16
     --set model.moe.bias_update=0.01 --set train.overlap_grad_sum=true)
for kind in dense moe; do
  # the dense run's rank 0 writes single files and sums the gradients after the backward; the MoE
  # run's ranks write a shard each and start the sums during the backward
  args=(--set train.shard_checkpoints=false); [ $kind = moe ] && args=("${MOE[@]}")
  "$MF" train tiny.toml "${args[@]}" --set run.name=${kind}_one > one.txt 2>&1 || { cat one.txt; fail "$kind one process"; }
  "$MF" launch --nproc 2 train tiny.toml "${args[@]}" --set run.name=${kind}_two > two.txt 2>&1 ||
    { cat two.txt; fail "$kind two ranks"; }
  grep -q '"world":2' runs/${kind}_two/metrics.jsonl || fail "no world size in the 2-rank metrics"
  grep -q '"comm_s_per_step"' runs/${kind}_two/metrics.jsonl || fail "no communication time in the metrics"
  same_model ${kind}_one ${kind}_two
done
last() { ls -d runs/$1/checkpoints/step_* | tail -1; }
[ -f "$(last dense_two)/model.safetensors" ] || fail "train.shard_checkpoints=false did not write a single file"
for f in model-00001-of-00002.safetensors model-00002-of-00002.safetensors optimizer-00002-of-00002.safetensors \
         model.safetensors.index.json optimizer.safetensors.index.json; do
  [ -f "$(last moe_two)/$f" ] || fail "the 2-rank checkpoint lacks $f"
done
# export gathers the shards into single files that give the same model
"$MF" export runs/moe_two --format checkpoint -o runs/gathered/checkpoints/step_00000001 > /dev/null 2>&1 || fail "gather"
[ -f runs/gathered/checkpoints/step_00000001/model.safetensors ] || fail "gathered checkpoint is not a single file"
cp runs/moe_two/metrics.jsonl runs/gathered/
same_model moe_two gathered
# expert parallel: each rank computes half of every layer's experts, tokens travel by all-to-all;
# the losses equal one process's within float32 reassociation (1e-5 relative), and so does
# UniPool's shared pool; a run stopped under expert parallel resumes on one process
close_losses() {  # close_losses RUN_A RUN_B
  python3 - "runs/$1/metrics.jsonl" "runs/$2/metrics.jsonl" <<'PY' || fail "$2's losses differ from $1's"
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(p) if '"loss"' in l] for p in sys.argv[1:])
assert len(a) == len(b) and len(a) > 0, (len(a), len(b))
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
print(f"{len(a)} losses, largest relative difference {worst:.2e}")
sys.exit(0 if worst < 1e-5 else 1)
PY
}
"$MF" launch --nproc 2 train tiny.toml "${MOE[@]}" --set run.name=moe_ep --expert-parallel > ep.txt 2>&1 ||
  { cat ep.txt; fail "expert parallel"; }
grep -q "expert parallel: 2 MoE layers, their experts split over 2 ranks (each keeps 1/2 of their" ep.txt ||
  fail "expert parallel not enabled"
grep -q '"parallel": "data parallel over 2 ranks; expert parallel: 2 MoE layers' runs/moe_ep/environment.json ||
  fail "environment.json does not say the run was expert parallel"
close_losses moe_one moe_ep
POOL=(--set model.ffn=moe --set model.moe.num_experts=4 --set model.moe.top_k=2 --set model.moe.expert_hidden=16
      --set model.moe.unipool.groups=1 --set model.moe.router=norm_topk)
"$MF" train tiny.toml "${POOL[@]}" --set run.name=pool_one > /dev/null 2>&1 || fail "unipool one process"
"$MF" launch --nproc 2 train tiny.toml "${POOL[@]}" --set run.name=pool_ep --expert-parallel > /dev/null 2>&1 ||
  fail "unipool expert parallel"
close_losses pool_one pool_ep
# with UniPool's pool loss the ranks average their one-step-behind fractions every round of
# micro-batches (a collective per micro-batch: a mismatch would hang or fail here)
"$MF" launch --nproc 2 train tiny.toml "${POOL[@]}" --set model.moe.unipool.aux_loss_coef=0.01 --set run.name=pool_aux \
  --expert-parallel > pool_aux.txt 2>&1 || { cat pool_aux.txt; fail "unipool pool loss on 2 ranks"; }
grep -q 'pool_aux' runs/pool_aux/metrics.jsonl || fail "no pool loss logged"
"$MF" launch --nproc 2 train tiny.toml "${MOE[@]}" --set run.name=ep_one --expert-parallel --stop-after 3 > /dev/null 2>&1 ||
  fail "stop under expert parallel"
"$MF" train --resume runs/ep_one > /dev/null 2>&1 || fail "resume an expert-parallel run on 1 process"
close_losses moe_one ep_one
# the expert slices are gathered whole into the checkpoint (here by rank 0 alone, single files),
# and a whole checkpoint resumes under expert parallel (weights and AdamW moments cut to the slices)
"$MF" launch --nproc 2 train tiny.toml "${MOE[@]}" --set run.name=ep_ep --set train.shard_checkpoints=false \
  --expert-parallel --stop-after 3 > /dev/null 2>&1 || fail "stop under expert parallel, single-file checkpoint"
[ -f "$(ls -d runs/ep_ep/checkpoints/step_* | tail -1)/model.safetensors" ] || fail "no single-file checkpoint"
"$MF" launch --nproc 2 train --resume runs/ep_ep --expert-parallel > ep_ep.txt 2>&1 ||
  { cat ep_ep.txt; fail "resume under expert parallel"; }
close_losses moe_one ep_ep
# UniF-MoE routes (expert, block) units itself: its layers stay whole and data parallel
"$MF" launch --nproc 2 train tiny.toml "${MOE[@]}" --set model.moe.bias_update=0 --set model.moe.unif.blocks=2 --set run.name=unif_ep \
  --expert-parallel > unif_ep.txt 2>&1 || { cat unif_ep.txt; fail "UniF-MoE under --expert-parallel"; }
grep -q "expert parallel: no layer to split" unif_ep.txt || { cat unif_ep.txt; fail "UniF-MoE layers were split"; }
set +e
out=$("$MF" launch --nproc 2 train tiny.toml "${MOE[@]}" --set model.moe.num_experts=3 --set run.name=ep3 --expert-parallel 2>&1)
rc=$?
set -e
[ $rc -ne 0 ] && grep -q "3 experts do not split evenly over WORLD_SIZE = 2" <<<"$out" || fail "3 experts on 2 ranks: $out"
# stopped on 2 ranks, resumed on 1; stopped on 1, resumed on 2: both equal the straight run
"$MF" launch --nproc 2 train tiny.toml "${MOE[@]}" --set run.name=two_one --stop-after 3 > /dev/null 2>&1 || fail "stop 2"
"$MF" train --resume runs/two_one > /dev/null 2>&1 || fail "resume on 1"
same_model moe_one two_one
"$MF" train tiny.toml "${MOE[@]}" --set run.name=one_two --stop-after 3 > /dev/null 2>&1 || fail "stop 1"
"$MF" launch --nproc 2 train --resume runs/one_two > /dev/null 2>&1 || fail "resume on 2"
same_model moe_one one_two
# signal_worker SIGNAL NAME [env...]: a 2-rank run NAME; once it logged step 2 one worker gets
# SIGNAL; the run must stop (launch exiting non-zero) within 60 s, leaving no worker. Sets STOPPED_S.
signal_worker() {
  local sig=$1 name=$2 victim="" launch rc start
  shift 2
  env "$@" "$MF" launch --nproc 2 --grace 2 train tiny.toml --set train.steps=100000 --set run.name=$name \
    > $name.txt 2>&1 &
  launch=$!
  for _ in $(seq 300); do
    victim=$(pgrep -f "moeforge train tiny.toml --set train.steps=100000 --set run.name=$name" | tail -1 || true)
    [ -n "$victim" ] && grep -q '"step":2,' runs/$name/metrics.jsonl 2>/dev/null && break
    sleep 0.2
  done
  [ -n "$victim" ] || fail "$name: no worker to signal"
  kill -$sig "$victim"
  start=$(date +%s)
  set +e; wait $launch; rc=$?; set -e
  STOPPED_S=$(( $(date +%s) - start ))
  [ "$rc" -ne 0 ] || fail "$name: launch exited 0 after SIG$sig to a worker"
  [ "$STOPPED_S" -le 60 ] || fail "$name: the run took $STOPPED_S s to stop after SIG$sig to a worker"
  if pgrep -f "run.name=$name" > /dev/null; then fail "$name: a worker outlived the run"; fi
}
# a worker killed with SIGKILL: the run stops, naming it, within 60 s
signal_worker KILL killed
ELAPSED=$STOPPED_S
grep -q "was killed by signal 9" killed.txt || { cat killed.txt; fail "launch did not name the killed worker"; }
grep -q "a collective with the other ranks failed\|was killed by signal 9; stopping" killed.txt || fail "no clear error"

# a bad world: clear errors
set +e
out=$(WORLD_SIZE=2 RANK=0 "$MF" train tiny.toml --set run.name=bad 2>&1); rc=$?
set -e
[ $rc -ne 0 ] && grep -q "MASTER_ADDR is not set" <<<"$out" || fail "missing MASTER_ADDR: $out"
set +e
out=$("$MF" launch --nproc 2 train tiny.toml --set train.grad_accum=3 --set run.name=bad3 2>&1); rc=$?
set -e
[ $rc -ne 0 ] && grep -q "must be a multiple of WORLD_SIZE" <<<"$out" || fail "grad_accum 3 on 2 ranks: $out"
# the all-to-all of expert parallelism, unequal splits, checked value by value
"$MF" launch --nproc 2 bench comm --tokens 64 --d 16 --iters 1 > comm.txt 2>&1 || { cat comm.txt; fail "bench comm"; }
grep -q "all-to-all check passed (2 ranks" comm.txt || { cat comm.txt; fail "all-to-all check"; }
grep -q "expert-parallel check passed" comm.txt || { cat comm.txt; fail "expert-parallel layer check"; }
# 3 ranks: 64 x top-8 pairs do not split evenly (the remainder stays with its sender)
"$MF" launch --nproc 3 bench comm --tokens 64 --d 16 --iters 1 > comm3.txt 2>&1 || { cat comm3.txt; fail "bench comm, 3 ranks"; }
grep -q "expert-parallel check passed" comm3.txt || { cat comm3.txt; fail "expert-parallel layer check, 3 ranks"; }
# the rendezvous port held by another program: a clear error naming it
python3 - "$MF" <<'PY' || fail "port in use"
import socket, subprocess, sys
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(); port = s.getsockname()[1]
r = subprocess.run([sys.argv[1], "launch", "--nproc", "2", "--master", f"127.0.0.1:{port}", "train", "tiny.toml",
                    "--set", "run.name=port"], capture_output=True, text=True, timeout=120)
sys.exit(0 if r.returncode != 0 and f"could not join the group at MASTER_ADDR:MASTER_PORT = 127.0.0.1:{port}" in r.stderr
         and "Address already in use" in r.stderr else 1)
PY
# a worker that never joins: the others stop within MOEFORGE_DIST_TIMEOUT, naming the missing rank;
# two workers with one RANK: refused, and every rank stops at once
python3 - "$MF" <<'PY' || fail "duplicate or missing rank"
import os, socket, subprocess, sys, time
def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p
def start(rank, world, port, name):
    env = dict(os.environ, WORLD_SIZE=str(world), RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               MOEFORGE_DIST_TIMEOUT="8")
    return subprocess.Popen([sys.argv[1], "train", "tiny.toml", "--set", f"run.name={name}"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
def finish(procs, bound):
    t0 = time.time(); errs = []
    for p in procs:
        try: errs.append(p.communicate(timeout=max(1, bound - (time.time() - t0)))[1])
        except subprocess.TimeoutExpired:
            for q in procs: q.kill()
            sys.exit(f"a worker still ran {bound} s later")
        if p.returncode == 0: sys.exit("a worker exited 0: " + errs[-1])
    return errs
port = free_port()
errs = finish([start(0, 2, port, "alone")], 40)
if "rank(s) 1 did not join within 8 s (MOEFORGE_DIST_TIMEOUT)" not in errs[0]: sys.exit(errs[0])
port = free_port()
first = start(0, 2, port, "rank0a"); time.sleep(2)
errs = finish([start(0, 2, port, "rank0b"), first], 40)
if "Address already in use" not in errs[0] or "did not join" not in errs[1]: sys.exit("\n".join(errs))
port = free_port()
errs = finish([start(0, 3, port, "dup0"), start(1, 3, port, "dup1"), start(1, 3, port, "dup2")], 30)
if not all("two workers were started with RANK=1 (WORLD_SIZE = 3)" in e for e in errs): sys.exit("\n".join(errs))
PY
# a stalled worker (SIGSTOP): the other's collective times out, launch stops the run, nothing is left
signal_worker STOP stalled MOEFORGE_DIST_TIMEOUT=10
STALLED=$STOPPED_S
grep -q "a collective with the other ranks failed" stalled.txt || { cat stalled.txt; fail "no clear error for a stall"; }
echo "data parallel: all checks passed (killed run stopped in ${ELAPSED} s, stalled run in ${STALLED} s)"
