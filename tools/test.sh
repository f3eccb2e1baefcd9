#!/usr/bin/env bash
# Sets up (tools/setup.sh), builds and runs every test suite; ends with "N passed, N failed, N skipped".
# Usage: tools/test.sh [BUILD_DIR] [meson test args…]   e.g. tools/test.sh build --suite unit
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build}
[ $# -gt 0 ] && shift
"$here/tools/setup.sh" "$build" || { echo "0 passed, 1 failed"; exit 1; }
cd "$here"
exec "$here/tools/run_tests.sh" "$build" "$@"
