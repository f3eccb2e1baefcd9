#!/usr/bin/env bash
# Runs every libFuzzer target (tests/fuzz: the pipeline parser and validator, the overrides, the
# safetensors reader, the dataset reader) for SECONDS each, under AddressSanitizer and
# UndefinedBehaviorSanitizer, from the seed corpora in tests/fuzz/corpus (and pipelines/ for the
# parser). A crash, a sanitizer report, an input taking over 10 s or a leak fails its target; the
# input that did it is kept in BUILD_DIR/findings/<target>/. Prints each target's executions and
# ends with "N passed, N failed".
# Usage: tools/fuzz.sh [SECONDS] [BUILD_DIR]   (default 60 and build-fuzz; needs clang 16, as
#        tools/sanitize.sh host does, which tools/setup.sh installs)
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
seconds=${1:-60}
build=${2:-build-fuzz}
cd "$here" || exit 2
[[ "$seconds" =~ ^[1-9][0-9]*$ ]] || { echo "fuzz.sh: SECONDS '$seconds' is not a positive whole number" >&2; exit 2; }
if [ ! -f "$build/build.ninja" ]; then
  CC=clang-16 CXX=clang++-16 meson setup "$build" -Dcuda=disabled -Dfuzz=true -Db_sanitize=address,undefined \
    -Db_lundef=false -Dbuildtype=debugoptimized >"$build.setup.log" 2>&1 ||
    { tail -20 "$build.setup.log"; echo "0 passed, 1 failed"; exit 1; }
fi
targets=(pipeline override safetensors dataset)
# the targets and the plugins they load, no more (tests/fuzz/meson.build's alias)
ninja -C "$build" fuzz >"$build.ninja.log" 2>&1 ||
  { grep -E "error|FAILED" "$build.ninja.log" | head -20; echo "0 passed, 1 failed"; exit 1; }
export DQN_PLUGIN_PATH=$here/$build/plugins DQN_PLUGIN_DEFAULT_DIRS='' DQN_SOURCE_DIR=$here
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
passed=0; failed=0; total=0
jobs=$(nproc); [ "$jobs" -gt ${#targets[@]} ] && jobs=${#targets[@]}
run() {  # one target: a fresh working corpus (the repo's seeds are read, never written)
  local t=$1 work="$build/corpus/$1" found="$build/findings/$1"
  rm -rf "$work" "$found"; mkdir -p "$work" "$found"
  local seeds=("tests/fuzz/corpus/$t")
  [ "$t" = pipeline ] && seeds+=(pipelines)
  "$build/tests/fuzz/fuzz_$t" "$work" "${seeds[@]}" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 \
    -max_len=65536 -print_final_stats=1 -artifact_prefix="$found/" >"$build/fuzz_$t.log" 2>&1
  echo $? >"$build/fuzz_$t.rc"
}
# Two at a time (a core each): every target gets its full SECONDS.
i=0
for t in "${targets[@]}"; do
  run "$t" &
  i=$((i + 1))
  [ $((i % jobs)) -eq 0 ] && wait
done
wait
for t in "${targets[@]}"; do
  rc=$(cat "$build/fuzz_$t.rc" 2>/dev/null || echo 1)
  execs=$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+)/\1/p' "$build/fuzz_$t.log" | tail -1)
  total=$((total + ${execs:-0}))
  if [ "$rc" -eq 0 ] && [ -n "$execs" ]; then
    passed=$((passed + 1)); echo "fuzz.$t: ${execs} executions in ${seconds} s, no finding"
  else
    failed=$((failed + 1)); echo "fuzz.$t: FAILED (rc $rc, ${execs:-?} executions); findings in $build/findings/$t/:"
    grep -E "ERROR|SUMMARY|runtime error|Test unit written" "$build/fuzz_$t.log" | head -8 | sed 's/^/  /'
  fi
done
echo "fuzz: ${total} executions in all"
echo "${passed} passed, ${failed} failed"
[ "$failed" -eq 0 ]
