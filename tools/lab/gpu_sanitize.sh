#!/usr/bin/env bash
# compute-sanitizer on gpu.ops one test case (doctest -tc pattern) at a time, each in a time box of
# its own, so that every case that finishes gives a verdict even when the whole run would not fit
# the device time (racecheck of all of gpu.ops in one run has never finished). Per case: the exit
# status (0 clean, 1 an error or hazard, 124 the box ran out), the seconds it took and the tool's
# summary line.
# Usage: tools/lab/gpu_sanitize.sh TOOL BOX_SECONDS [PATTERN...]
#   TOOL: memcheck, racecheck, initcheck or synccheck; PATTERN: doctest -tc patterns (default: the
#   cases whose kernels use shared memory; `all`: every case of gpu.ops). BUILD (default build-gpu) is the Meson build folder;
#   LOGS (default ${OUT:-out}) gets a log per case; JOBS (default 1) cases run at once (those
#   matching *update* alone, last); SAN_ARGS more compute-sanitizer options, e.g.
#   SAN_ARGS='--kernel-name-exclude kns=sm90_xmma' to leave a library's kernels uninstrumented (they
#   still run). Ends with "N clean, N failed, N out of time".
set -uo pipefail
tool=${1:?usage: tools/lab/gpu_sanitize.sh TOOL BOX_SECONDS [PATTERN...]}
box=${2:?usage: tools/lab/gpu_sanitize.sh TOOL BOX_SECONDS [PATTERN...]}
shift 2
case "$tool" in memcheck | racecheck | initcheck | synccheck) ;; *)
  echo "gpu_sanitize.sh: TOOL '$tool': expected memcheck, racecheck, initcheck or synccheck" >&2
  exit 2
  ;;
esac
[[ "$box" =~ ^[0-9]+$ ]] || { echo "gpu_sanitize.sh: BOX_SECONDS '$box' is not a whole number" >&2; exit 2; }
build=${BUILD:-build-gpu}
logs=${LOGS:-${OUT:-out}}
mkdir -p "$logs"
[ -x "$build/tests/test_gpu_ops" ] || { echo "gpu_sanitize.sh: no $build/tests/test_gpu_ops (build first)" >&2; exit 2; }
if [ $# -eq 0 ]; then
  set -- '*update*' '*c51_loss*' '*c51_xent*' '*dueling_dist*' '*relu_bias_grad*' '*head_backward*' '*head_forward*' \
    '*tile_gemm*'
elif [ "$1" = all ] && [ $# -eq 1 ]; then
  # every case of gpu.ops: its name up to its colon and then any text (doctest's -tc splits at
  # commas, which the text after the colon may hold); a name without a colon as it is
  mapfile -t cases < <("$build/tests/test_gpu_ops" --list-test-cases 2>/dev/null | grep -E '^gpu\.ops[.:]' |
    sed -E 's/^([^:]*):.*/\1:*/' | sort -u)
  [ ${#cases[@]} -gt 0 ] || { echo "gpu_sanitize.sh: $build/tests/test_gpu_ops listed no gpu.ops case" >&2; exit 2; }
  set -- "${cases[@]}"
fi
# the test setup's environment (tests/meson.build's test_env)
case $build in /*) ;; *) build=$PWD/$build ;; esac
export DQN_PLUGIN_PATH=$build/plugins DQN_PLUGIN_DEFAULT_DIRS='' DQN_SOURCE_DIR=$PWD DQN_BUILD_DIR=$build
# One case: compute-sanitizer on the test binary (as the Meson setup's wrapper), its log and its
# verdict ("rc seconds") in files of its own, so that JOBS cases can run side by side.
run_case() {
  local tc=$1 name log t0 rc secs summary
  name=${tc//[^A-Za-z0-9_]/}
  log="$logs/san_${tool}_${name}.log"
  t0=$(date +%s)
  # shellcheck disable=SC2086
  timeout "$box" compute-sanitizer --tool "$tool" --error-exitcode 1 ${SAN_ARGS:-} "$build/tests/test_gpu_ops" -tc="$tc" \
    >"$log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - t0 ))
  summary=$(grep -hE '(ERROR|RACECHECK|INITCHECK|SYNCCHECK) SUMMARY' "$log" | tail -1)
  echo "$rc" >"$log.rc"
  echo "$tool $tc: rc=$rc, ${secs} s${summary:+, $summary}"
}
# JOBS (default 1): cases at once. The update's clusters of 16 blocks each need a whole GPC free,
# so a case matching *update* runs alone, after the others.
jobs=${JOBS:-1}
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || { echo "gpu_sanitize.sh: JOBS '$jobs' is not a positive whole number" >&2; exit 2; }
alone=()
running=0
for tc in "$@"; do
  if [ "$jobs" -gt 1 ] && [[ "$tc" == *update* ]]; then alone+=("$tc"); continue; fi
  if [ "$jobs" -eq 1 ]; then run_case "$tc"; continue; fi
  run_case "$tc" &
  running=$((running + 1))
  if [ "$running" -ge "$jobs" ]; then wait -n; running=$((running - 1)); fi
done
wait
for tc in "${alone[@]}"; do run_case "$tc"; done
clean=0 failed=0 late=0
for tc in "$@"; do
  rc=$(cat "$logs/san_${tool}_${tc//[^A-Za-z0-9_]/}.log.rc" 2>/dev/null || echo 1)
  case $rc in
    0) clean=$((clean + 1)) ;;
    124) late=$((late + 1)) ;;
    *) failed=$((failed + 1)) ;;
  esac
done
echo "$tool: $clean clean, $failed failed, $late out of time"
[ "$failed" -eq 0 ]
