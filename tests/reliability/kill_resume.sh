#!/usr/bin/env bash
# Kill harness: a run is killed (SIGKILL) at every phase of a checkpoint write and rotation
# (MOEFORGE_FAILPOINT, see core/util.h) and at RANDOM_KILLS random moments, resumed each time,
# and must end with tensors byte-identical to a straight run; after every kill, every step_*
# directory present must load.
# usage: MOEFORGE=build/release/moeforge kill_resume.sh WORK_DIR [RANDOM_KILLS] [SEED]
set -euo pipefail
MF=$(realpath "${MOEFORGE:?set MOEFORGE to the moeforge binary}")
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$1
RANDOM_KILLS=${2:-3}
RANDOM=${3:-1}
mkdir -p "$WORK" && cd "$WORK"
fail() { echo "kill harness: FAIL: $*" >&2; exit 1; }

cp "$HERE/tiny_moe.toml" kill.toml
"$MF" data prepare kill.toml > prepare.log 2>&1 || { cat prepare.log; fail "data prepare"; }
rm -rf straight killed
"$MF" train kill.toml --set run.out_dir=straight > straight.log 2>&1 || { cat straight.log; fail "straight run"; }

checked=0
check_all_load() {  # every step_* present loads, model and optimizer
  for d in killed/k/checkpoints/step_*; do
    [ -d "$d" ] || continue
    "$MF" eval "$d" --dump-logits check.logits --tokens 1,2,3 > /dev/null 2>&1 || fail "$d does not load after a kill"
    /usr/bin/python3 "$HERE/same_tensors.py" "$d" "$d" > /dev/null || fail "$d: unreadable tensors"
    checked=$((checked + 1))
  done
}
train_killed() {  # runs the killed run once (fresh or resumed); returns its exit code
  if [ -f killed/k/config.toml ]; then  # else fresh: a run dir without a checkpoint starts again
    "$MF" train --resume killed/k > killed.log 2>&1
  else
    "$MF" train kill.toml --set run.out_dir=killed > killed.log 2>&1
  fi
}

kills=0
t0=$(date +%s)
for phase in checkpoint.model_written@2 checkpoint.written@3 checkpoint.renamed@2 checkpoint.moved_out@1 \
             checkpoint.model_written@1 checkpoint.moved_out@2; do
  set +e; (MOEFORGE_FAILPOINT=$phase train_killed) 2>/dev/null; rc=$?; set -e
  [ "$rc" = 137 ] || { cat killed.log; fail "failpoint $phase: expected SIGKILL (137), got $rc"; }
  kills=$((kills + 1))
  check_all_load
done
for ((i = 0; i < RANDOM_KILLS; i++)); do
  ( train_killed ) 2>/dev/null &
  pid=$!
  sleep "$(printf '0.%03d' $((RANDOM % 1000)))"; sleep $((RANDOM % 3))
  # kill the whole process group member: the subshell's child is moeforge
  pkill -9 -P "$pid" moeforge 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  kills=$((kills + 1))
  check_all_load
done
while :; do  # finish (a random kill may have landed after the end)
  train_killed || { cat killed.log; fail "resume to the end"; }
  grep -q '"finished": true' killed/k/summary.json 2>/dev/null && break
done
a=$(ls -d straight/k/checkpoints/step_* | tail -1)
b=$(ls -d killed/k/checkpoints/step_* | tail -1)
[ "$(basename "$a")" = "$(basename "$b")" ] || fail "final checkpoints differ: $a vs $b"
/usr/bin/python3 "$HERE/same_tensors.py" "$a" "$b" || fail "resumed run differs from the straight run"
for leftover in killed/k/checkpoints/.tmp-* killed/k/checkpoints/.del-*; do
  [ -e "$leftover" ] && fail "leftover $leftover after the final run"
done
echo "kill harness: $kills kills (6 failpoint phases, $RANDOM_KILLS random), $checked checkpoint loads after kills, final tensors identical; $(( $(date +%s) - t0 )) s"
