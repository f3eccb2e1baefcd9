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
# Any report fails the test that made it. tools/test.sh builds, runs the suites and counts.
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:halt_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
exec "$here/tools/test.sh" "$build" --timeout-multiplier 4 --suite unit --suite numeric --suite plugins
