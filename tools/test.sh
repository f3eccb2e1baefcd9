#!/usr/bin/env bash
# Sets up (tools/setup.sh), builds and runs every test suite; ends with "N passed, N failed, N skipped".
# Usage: tools/test.sh [BUILD_DIR] [meson test args…]   e.g. tools/test.sh build --suite unit
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build}
[ $# -gt 0 ] && shift
"$here/tools/setup.sh" "$build" || { echo "0 passed, 1 failed"; exit 1; }
cd "$here"
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
