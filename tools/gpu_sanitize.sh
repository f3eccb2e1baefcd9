#!/usr/bin/env bash
# compute-sanitizer on gpu.ops one test case (doctest -tc pattern) at a time, each in a time box of
# its own, so that every case that finishes gives a verdict even when the whole run would not fit
# the device time (racecheck of all of gpu.ops in one run has never finished). Per case: the exit
# status (0 clean, 1 an error or hazard, 124 the box ran out), the seconds it took and the tool's
# summary line.
# Usage: tools/gpu_sanitize.sh TOOL BOX_SECONDS [PATTERN...]
#   TOOL: memcheck, racecheck, initcheck or synccheck; PATTERN: doctest -tc patterns (default: the
#   cases whose kernels use shared memory). BUILD (default build-gpu) is the Meson build folder;
#   LOGS (default ${OUT:-out}) gets a log per case. Ends with "N clean, N failed, N out of time".
set -uo pipefail
tool=${1:?usage: tools/gpu_sanitize.sh TOOL BOX_SECONDS [PATTERN...]}
box=${2:?usage: tools/gpu_sanitize.sh TOOL BOX_SECONDS [PATTERN...]}
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
    '*gemm_wgrad*' '*gemm_chain*' '*tile_gemm*'
fi
clean=0 failed=0 late=0
for tc in "$@"; do
  name=${tc//[^A-Za-z0-9_]/}
  log="$logs/san_${tool}_${name}.log"
  rm -f "$build/meson-logs/testlog-$tool.txt"  # (a case cut off by its box leaves none of its own)
  t0=$(date +%s)
  # the setup's environment (the plugin path and the rest) through meson, the tool through the setup
  timeout "$box" meson test -C "$build" --no-rebuild --setup "$tool" gpu.ops --test-args="-tc=$tc" >"$log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - t0 ))
  # the sanitizer's own summary (in Meson's test log)
  summary=$(grep -hE '(ERROR|RACECHECK|INITCHECK|SYNCCHECK) SUMMARY' "$build/meson-logs/testlog-$tool.txt" 2>/dev/null |
    tail -1)
  cp "$build/meson-logs/testlog-$tool.txt" "$log.testlog" 2>/dev/null
  case $rc in
    0) clean=$((clean + 1)) ;;
    124) late=$((late + 1)) ;;
    *) failed=$((failed + 1)) ;;
  esac
  echo "$tool $tc: rc=$rc, ${secs} s${summary:+, $summary}"
done
echo "$tool: $clean clean, $failed failed, $late out of time"
[ "$failed" -eq 0 ]
