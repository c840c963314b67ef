#!/usr/bin/env bash
# The long reliability run (results in docs/reliability.md): rounds of the kill harness with
# random kills, and the fuzzers with many cases, until --minutes have passed. With --asan the
# fuzzers run from build/asan (AddressSanitizer + UBSan), built first; the kill harness stays
# on build/release (the SentencePiece shim is dlopen'ed with RTLD_DEEPBIND, which ASan refuses).
# usage: scripts/stress.sh [--minutes N] [--kills K] [--fuzz-cases N] [--asan | --build DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=30 kills=10 fuzz=20000 build=build/release release=build/release
while [ $# -gt 0 ]; do
  case $1 in
    --minutes) minutes=$2; shift 2 ;;
    --kills) kills=$2; shift 2 ;;
    --fuzz-cases) fuzz=$2; shift 2 ;;
    --asan) build=build/asan; shift ;;
    --build) build=$2 release=$2; shift 2 ;;  # another release build directory
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
if [ "$build" = build/asan ]; then
  cmake --preset asan > /dev/null
  cmake --build --preset asan -j "$(nproc)" --target test_reliability
  export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
fi
work=$(mktemp -d /tmp/mf_stress.XXXXXX)
end=$(( $(date +%s) + 60 * minutes ))
rounds=0 total_kills=0 fuzz_cases=0 start=$(date +%s)
while [ "$(date +%s)" -lt "$end" ]; do
  rounds=$((rounds + 1))
  MOEFORGE_FUZZ_CASES=$fuzz MOEFORGE_FUZZ_SEED=$rounds MOEFORGE_SOURCE_DIR=$PWD "$build/tests/test_reliability" > "$work/fuzz.log" 2>&1 || {
    cat "$work/fuzz.log"; echo "stress: the fuzzers failed in round $rounds" >&2; exit 1; }
  grep '^\[ fuzz \]' "$work/fuzz.log"
  # files, TOML, --set, Unicode, Unicode through Hugging Face's library x2 tokenizers; requests; HF dirs, tokenizer.json
  fuzz_cases=$((fuzz_cases + 6 * fuzz + fuzz / 5 + 2 * (fuzz / 10)))
  out=$(MOEFORGE=$release/moeforge tests/reliability/kill_resume.sh "$work/kill" "$kills" "$rounds") || {
    echo "$out"; echo "stress: the kill harness failed in round $rounds" >&2; exit 1; }
  echo "$out"
  total_kills=$((total_kills + 6 + kills))
done
echo "stress: $rounds rounds in $(( ($(date +%s) - start) / 60 )) min: $total_kills kills, $fuzz_cases fuzz cases" \
     "($build), 0 crashes, 0 hangs, 0 unclear errors (a 5xx from the server is one), 0 corrupt checkpoints"
