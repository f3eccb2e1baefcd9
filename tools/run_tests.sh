#!/usr/bin/env bash
# Runs `meson test` in BUILD_DIR with the arguments given, then prints the tally that .ci/run adds
# up, from meson's test log: "N passed, N failed, N skipped". Exit status: meson test's.
# Usage: tools/run_tests.sh BUILD_DIR [meson test args…]
set -uo pipefail
build=$1
shift
meson test -C "$build" --print-errorlogs --num-processes "$(nproc)" "$@"
rc=$?
log="$build/meson-logs/testlog.json"
passed=0; failed=0; skipped=0
if [ -f "$log" ]; then
  passed=$(grep -c '"result": "OK"' "$log" || true)
  skipped=$(grep -c '"result": "SKIP"' "$log" || true)
  failed=$(grep -cE '"result": "(FAIL|TIMEOUT|ERROR|UNEXPECTEDPASS)"' "$log" || true)
fi
[ "$rc" -ne 0 ] && [ "$failed" -eq 0 ] && failed=1
echo "${passed} passed, ${failed} failed, ${skipped} skipped"
exit $rc
