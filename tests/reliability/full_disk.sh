#!/usr/bin/env bash
# Full disk: a run writes its checkpoints onto a tmpfs too small for the second one. It must
# stop with a clear error (exit 1), leave the first checkpoint loadable and nothing partial
# visible, and, once there is room, resume to tensors identical to a straight run.
# Needs permission to mount a tmpfs (root); exits 77 (skipped) where that is refused.
# usage: MOEFORGE=build/release/moeforge full_disk.sh WORK_DIR
set -euo pipefail
MF=$(realpath "${MOEFORGE:?set MOEFORGE to the moeforge binary}")
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$1
mkdir -p "$WORK" && cd "$WORK"
fail() { echo "full disk: FAIL: $*" >&2; exit 1; }
cp "$HERE/tiny_moe.toml" run.toml
"$MF" data prepare run.toml > prepare.log 2>&1 || { cat prepare.log; fail "data prepare"; }
rm -rf straight && "$MF" train run.toml --set run.out_dir=straight > straight.log 2>&1 || fail "straight run"
mkdir -p disk
umount disk 2>/dev/null || true
mount -t tmpfs -o size=1000k tmpfs disk 2>/dev/null || { echo "full disk: skipped (cannot mount a tmpfs here)"; exit 77; }
trap 'cd "$WORK" && umount disk 2>/dev/null || true' EXIT
set +e; "$MF" train run.toml --set run.out_dir=disk > full.log 2>&1; rc=$?; set -e
[ "$rc" = 1 ] || { cat full.log; fail "expected exit 1 on a full disk, got $rc"; }
grep -q "disk full\|No space left" full.log || { cat full.log; fail "the error does not say the disk is full"; }
[ "$(grep -c ' error ' full.log)" = 1 ] || { cat full.log; fail "expected one error line"; }
latest=$(ls -d disk/k/checkpoints/step_* | tail -1)
[ -n "$latest" ] || fail "no checkpoint survived"
"$MF" eval "$latest" --dump-logits check.logits --tokens 1,2,3 > /dev/null 2>&1 || fail "$latest does not load"
for partial in disk/k/checkpoints/.tmp-* disk/k/checkpoints/.del-*; do
  [ -e "$partial" ] && fail "partial write left behind: $partial"
done
mount -o remount,size=50m disk
"$MF" train --resume disk/k > resume.log 2>&1 || { cat resume.log; fail "resume after freeing space"; }
/usr/bin/python3 "$HERE/same_tensors.py" "$(ls -d straight/k/checkpoints/step_* | tail -1)" \
  "$(ls -d disk/k/checkpoints/step_* | tail -1)" > /dev/null || fail "resumed run differs from the straight run"
echo "full disk: stopped at $(basename "$latest") with '$(grep ' error ' full.log | sed 's/.* error //' | cut -c1-100)'; resumed to identical tensors"
