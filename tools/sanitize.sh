#!/usr/bin/env bash
# The unit, numeric and plugins suites under AddressSanitizer (leaks included) and
# UndefinedBehaviorSanitizer, in a build directory of their own (CPU backend only: compute-sanitizer
# checks the CUDA side on a GPU). Ends with "N passed, N failed, N skipped".
# Usage: tools/sanitize.sh [BUILD_DIR]   (default: build-san; tools/setup.sh installs what it needs)
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build-san}
cd "$here"
if [ ! -f "$build/build.ninja" ]; then
  # (-Wno-maybe-uninitialized: GCC 12 warns falsely on std::variant's moves under the sanitizers)
  meson setup "$build" -Dcuda=disabled -Db_sanitize=address,undefined -Db_lundef=false \
    -Dbuildtype=debugoptimized -Dcpp_args=-Wno-maybe-uninitialized >"$build.setup.log" 2>&1 || { tail -20 "$build.setup.log"; echo "0 passed, 1 failed"; exit 1; }
fi
ninja -C "$build" || { echo "0 passed, 1 failed"; exit 1; }
# Any report fails the test that made it.
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:halt_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
meson test -C "$build" --print-errorlogs --num-processes "$(nproc)" --timeout-multiplier 4 \
  --suite unit --suite numeric --suite plugins
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
