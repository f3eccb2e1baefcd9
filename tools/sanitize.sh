#!/usr/bin/env bash
# The sanitizers, in one place: the CPU code under AddressSanitizer and UndefinedBehaviorSanitizer
# (host), the CUDA code under compute-sanitizer on a GPU machine (cuda).
#
# Usage: tools/sanitize.sh host [address] [undefined] [--build DIR] [-- MESON_TEST_ARGS…]
#   The unit, numeric and plugins suites under the sanitizers named (default both; address checks
#   leaks too), in a CPU-only clang build of their own (DIR, default build-san), which builds what
#   those suites need and nothing else. MESON_TEST_ARGS replace the suites (e.g. -- --suite unit).
#   Any report fails the test that made it. Ends with "N passed, N failed, N skipped". Needs
#   clang 16 (tools/setup.sh installs it).
#
# Usage: tools/sanitize.sh cuda [--build DIR] [--logs DIR] [--box SECONDS] [--jobs N] [--tag TAG]
#          [--san-arg ARG]... [--only REGEX] [--set KEY=VALUE]... [--ops] [--case PATTERN]... TOOL...
#   TOOL: memcheck, racecheck, initcheck, synccheck. compute-sanitizer after a CUDA build (DIR,
#   default build-gpu, as tools/gpu_check.sh builds it), each run in a time box of its own (--box,
#   default 300 s), --jobs at once. By default over whole captured steps, the workloads:
#     step_{c51,all}_{fp32,tf32,bf16}: `dqn step pipelines/ref.yaml` (C51 alone, or all four heads),
#       3 steps on a random batch, autotuning off (the first kernel choice; the step's graph as built);
#     epoch_{c51,all}: `dqn bench --epoch` drawing every batch from the replay on the device, uniform
#       and prioritised (the sample, the priority update and the tree), 3 steps an epoch;
#     train_{uniform,prioritized}: `dqn train pipelines/default.yaml` on CUDA: acting, n-step
#       inserts into the device replay, training steps, a checkpoint read back from the device;
#     lt_all_bf16: step_all_bf16's cuBLASLt calls (logged by the library) replayed by cuBLASLt alone
#       (tools/lab/dqn-lt-replay): what a tool reports there is the library's, not the engine's.
#   --only: the workloads whose name matches; --set: an override for every workload (e.g.
#   cuda.gemm=cublaslt; lt_all_bf16 logs its step with them). --jobs defaults to 4.
#   --ops: gpu.ops instead, one doctest case (-tc pattern) at a time, so that every case that
#   finishes gives a verdict even when the whole binary would not fit the time (racecheck of all of
#   gpu.ops in one run has never finished). --case PATTERN (implies --ops): the cases to run
#   (default: those whose kernels use shared memory; `all`: every case of gpu.ops). --jobs defaults
#   to 1; with more, the cases matching *update* run alone, last (their clusters need whole GPCs).
#   --san-arg: a compute-sanitizer option (e.g. --san-arg=--kernel-name-exclude
#   --san-arg=kns=sm90_xmma: a library's kernels left uninstrumented; they still run); --tag: added
#   to the log names. The logs go to --logs (default ${OUT:-out}), one per run: san_TOOL[_TAG]_NAME.log.
#   One line per run: tool, workload or case, rc (0 clean, 1 an error or hazard, 124 out of time),
#   seconds, the tool's summary line; then "TOOL: N clean, N failed, N out of time" for each tool.
#   Exit status: 0 when every run was clean.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
me=tools/sanitize.sh
usage() {  # usage [STATUS]: to stderr, unless asked for (-h, --help)
  [ "${1:-2}" = 0 ] && exec 2>&1
  cat >&2 <<'EOF'
usage: tools/sanitize.sh host [address] [undefined] [--build DIR] [-- MESON_TEST_ARGS...]
       tools/sanitize.sh cuda [--build DIR] [--logs DIR] [--box SECONDS] [--jobs N] [--tag TAG] [--san-arg ARG]...
                              [--only REGEX] [--set KEY=VALUE]... [--ops] [--case PATTERN]... TOOL...
       TOOL: memcheck, racecheck, initcheck, synccheck (the file's header says more)
EOF
  exit "${1:-2}"
}

# ---- host: ASan and UBSan over the CPU suites ----------------------------------------------------

host() {
  local build=build-san sans=() args=()
  while [ $# -gt 0 ]; do
    case $1 in
      address | undefined) [[ " ${sans[*]} " == *" $1 "* ]] || sans+=("$1"); shift ;;
      --build) build=${2:?--build needs a folder}; shift 2 ;;
      --) shift; args=("$@"); break ;;
      -h | --help) usage 0 ;;
      *) echo "$me host: '$1': not a sanitizer (address, undefined) or an option" >&2; usage ;;
    esac
  done
  [ ${#sans[@]} -gt 0 ] || sans=(address undefined)
  [ ${#args[@]} -gt 0 ] || args=(--suite unit --suite numeric --suite plugins)
  local want=""  # (meson's order: address,undefined)
  [[ " ${sans[*]} " == *" address "* ]] && want=address
  [[ " ${sans[*]} " == *" undefined "* ]] && want=${want:+$want,}undefined
  cd "$here" || exit 2
  if [ ! -f "$build/build.ninja" ]; then
    # clang 16: it compiles this build in about a third of GCC 12's time, and is the first clang
    # that takes the tests' lambda captures of structured bindings (doctest's CAPTURE)
    command -v clang++-16 >/dev/null ||
      { echo "$me host: no clang++-16 (tools/setup.sh installs it)"; echo "0 passed, 1 failed, 0 skipped"; exit 1; }
    CC=clang-16 CXX=clang++-16 meson setup "$build" -Dcuda=disabled -Db_sanitize="$want" -Db_lundef=false \
      -Dbuildtype=debugoptimized >"$build.setup.log" 2>&1 ||
      { tail -20 "$build.setup.log"; echo "0 passed, 1 failed, 0 skipped"; exit 1; }
  elif [ "$(build_option "$build" b_sanitize)" != "$want" ]; then
    meson configure "$build" -Db_sanitize="$want" >"$build.setup.log" 2>&1 ||
      { tail -20 "$build.setup.log"; echo "0 passed, 1 failed, 0 skipped"; exit 1; }
  fi
  # Only what the chosen tests need: their executables and what they depend on (the plugins, the
  # test fixtures, dqn), as `meson test` would rebuild them, but quietly.
  local targets
  targets=$(test_targets "$build" "${args[@]}") || { echo "0 passed, 1 failed, 0 skipped"; exit 1; }
  # shellcheck disable=SC2086
  ninja -C "$build" $targets >"$build.ninja.log" 2>&1 ||
    { grep -E "error|FAILED" "$build.ninja.log" | head -20; echo "0 passed, 1 failed, 0 skipped"; exit 1; }
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:halt_on_error=1
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  "$here/tools/run_tests.sh" "$build" --no-rebuild --timeout-multiplier 4 "${args[@]}"
}

build_option() {  # build_option BUILD NAME: the configured value, lists comma-joined
  python3 - "$1/meson-info/intro-buildoptions.json" "$2" <<'PY'
import json, sys
for o in json.load(open(sys.argv[1])):
    if o["name"] == sys.argv[2]:
        v = o["value"]
        print(",".join(v) if isinstance(v, list) else v)
PY
}

test_targets() {  # test_targets BUILD MESON_TEST_ARGS…: the ninja targets the chosen tests need
  local build=$1
  shift
  # meson's own selection (suites, names) lists the tests; introspection gives their depends
  meson test -C "$build" --no-rebuild --list "$@" >"$build/selected_tests.txt" 2>&1 ||
    { tail -3 "$build/selected_tests.txt" >&2; return 1; }
  python3 - "$build" <<'PY'
import json, os, sys
build = sys.argv[1]
info = os.path.join(build, "meson-info")
files = {t["id"]: t["filename"] for t in json.load(open(os.path.join(info, "intro-targets.json")))}
chosen = {l.strip().split(" / ")[-1] for l in open(os.path.join(build, "selected_tests.txt")) if l.strip()}
out = set()
for t in json.load(open(os.path.join(info, "intro-tests.json"))):
    if t["name"] in chosen:
        for d in t["depends"]:
            out.update(os.path.relpath(f, os.path.abspath(build)) for f in files.get(d, []))
if not out:
    sys.exit("sanitize.sh host: no test selected")
print(" ".join(sorted(out)))
PY
}

# ---- cuda: compute-sanitizer on a GPU machine ----------------------------------------------------

cuda() {
  local build=build-gpu logs=${OUT:-out} only=. box=300 jobs="" tag="" ops=0 sets=() san=() tools=() cases=()
  while [ $# -gt 0 ]; do
    case $1 in
      --build) build=${2:?--build needs a folder}; shift 2 ;;
      --logs) logs=${2:?--logs needs a folder}; shift 2 ;;
      --only) only=${2:?--only needs a regex}; shift 2 ;;
      --set) sets+=("${2:?--set needs KEY=VALUE}"); shift 2 ;;
      --san-arg) san+=("${2:?--san-arg needs an argument}"); shift 2 ;;
      --san-arg=*) san+=("${1#--san-arg=}"); shift ;;
      --box) box=${2:?--box needs seconds}; shift 2 ;;
      --jobs) jobs=${2:?--jobs needs a number}; shift 2 ;;
      --tag) tag=_${2:?--tag needs a word}; shift 2 ;;
      --ops) ops=1; shift ;;
      --case) cases+=("${2:?--case needs a pattern}"); ops=1; shift 2 ;;
      memcheck | racecheck | initcheck | synccheck) [[ " ${tools[*]} " == *" $1 "* ]] || tools+=("$1"); shift ;;
      -h | --help) usage 0 ;;
      *) echo "$me cuda: '$1': not an option or a tool (memcheck, racecheck, initcheck, synccheck)" >&2; usage ;;
    esac
  done
  [ ${#tools[@]} -gt 0 ] || { echo "$me cuda: name at least one TOOL" >&2; usage; }
  [[ "$box" =~ ^[0-9]+$ ]] || { echo "$me cuda: --box '$box' is not a whole number of seconds" >&2; exit 2; }
  [ -n "$jobs" ] || { jobs=4; [ "$ops" = 1 ] && jobs=1; }
  [[ "$jobs" =~ ^[1-9][0-9]*$ ]] || { echo "$me cuda: --jobs '$jobs' is not a positive whole number" >&2; exit 2; }
  if [ "$ops" = 1 ] && { [ "$only" != . ] || [ ${#sets[@]} -gt 0 ]; }; then
    echo "$me cuda: --only and --set choose whole-step workloads; with --ops, --case chooses" >&2; exit 2
  fi
  case $build in /*) ;; *) build=$PWD/$build ;; esac
  mkdir -p "$logs" && logs=$(cd "$logs" && pwd) || exit 2
  cd "$here" || exit 2  # (the workloads name pipelines/ from the repository's root)
  export DQN_PLUGIN_PATH=$build/plugins DQN_PLUGIN_DEFAULT_DIRS=''
  if [ "$ops" = 1 ]; then ops_runs; else step_runs; fi
}

# run_one TOOL NAME LOGNAME COMMAND…: one run under compute-sanitizer in its time box; its log, its
# rc in LOG.rc (so that --jobs runs can go side by side) and a line
run_one() {
  local tool=$1 name=$2 log=$logs/san_${1}${tag}_$3.log t0 rc secs summary
  shift 3
  t0=$(date +%s)
  timeout "$box" compute-sanitizer --tool "$tool" --error-exitcode 1 "${san[@]}" "$@" >"$log" 2>&1
  rc=$?
  secs=$(($(date +%s) - t0))
  summary=$(grep -hE '(ERROR|RACECHECK|INITCHECK|SYNCCHECK) SUMMARY' "$log" | tail -1 | sed 's/^=* *//')
  echo "$rc" >"$log.rc"
  echo "$tool${tag} $name: rc=$rc, ${secs} s${summary:+, $summary}"
}

# tally LOGNAME…: "TOOL: N clean, N failed, N out of time" for each tool; status 1 unless all clean
tally() {
  local status=0 tool n clean failed late
  for tool in "${tools[@]}"; do
    clean=0 failed=0 late=0
    for n in "$@"; do
      case $(cat "$logs/san_${tool}${tag}_$n.log.rc" 2>/dev/null || echo 1) in
        0) clean=$((clean + 1)) ;;
        124) late=$((late + 1)); status=1 ;;
        *) failed=$((failed + 1)); status=1 ;;
      esac
    done
    echo "$tool${tag}: $clean clean, $failed failed, $late out of time"
  done
  return $status
}

step_runs() {  # the whole-step workloads
  local dqn=$build/tools/dqn work all heads extra prec kind p n kv line running=0 tool status
  [ -x "$dqn" ] || { echo "$me cuda: no $dqn (build with -Dcuda=enabled first)" >&2; exit 2; }
  work=$(mktemp -d /tmp/sanitize_cuda.XXXXXX)
  all="heads.1.enabled=true heads.2.enabled=true heads.3.enabled=true"
  # The workloads: name and command line (word-split; no argument holds a space).
  declare -A cmd
  for heads in c51 all; do
    extra=""; [ $heads = all ] && extra=$all
    for prec in fp32 tf32 bf16; do
      cmd[step_${heads}_$prec]="$dqn step pipelines/ref.yaml $extra precision=$prec cuda.autotune=false --backend cuda
        --random-batch 1 --steps 3 --out @W@/step.safetensors"
    done
    cmd[epoch_$heads]="$dqn bench --epoch pipelines/ref.yaml $extra cuda.autotune=false --backend cuda
      --replay uniform,prioritized --replay-size 4096 --epoch-steps 3 --warmup 1 --repeats 1"
  done
  for kind in uniform prioritized; do
    p=false; [ $kind = prioritized ] && p=true
    # 1,000 random-action steps fill the replay, then 60 training steps (train_every 2, 8 copies)
    # and a checkpoint at 1,080
    cmd[train_$kind]="$dqn train pipelines/default.yaml --backend cuda --steps 1120 -q --out @W@/run
      --set cuda.autotune=false --set training.replay.prioritized=$p --set training.eval.every=1000000
      --set training.checkpoint_every=1080 --set training.stop_at_return=0"
  done
  [ -x "$build/tools/lab/dqn-lt-replay" ] && cmd[lt_all_bf16]="$build/tools/lab/dqn-lt-replay $work/lt_all_bf16.log"

  local names=()
  for n in $(printf '%s\n' "${!cmd[@]}" | sort); do [[ $n =~ $only ]] && names+=("$n"); done
  [ ${#names[@]} -gt 0 ] || { echo "$me cuda: --only '$only' matches no workload" >&2; exit 2; }
  local overrides=""
  # an override goes after the pipeline as --set, which every dqn command takes
  for kv in "${sets[@]}"; do overrides="$overrides --set $kv"; done
  if [[ " ${names[*]} " == *" lt_all_bf16 "* ]]; then  # the library's log of the step's calls, once
    # shellcheck disable=SC2086
    CUBLASLT_LOG_LEVEL=2 CUBLASLT_LOG_FILE=$work/lt_all_bf16.log ${cmd[step_all_bf16]//@W@/$work} $overrides \
      >/dev/null 2>&1 ||
      echo "$me cuda: step_all_bf16 failed without a tool: lt_all_bf16 replays what it logged" >&2
  fi
  for tool in "${tools[@]}"; do
    for n in "${names[@]}"; do
      mkdir -p "$work/$tool$tag-$n"
      line=${cmd[$n]//@W@/$work/$tool$tag-$n}
      [ "$n" = lt_all_bf16 ] || line="$line$overrides"  # (the replay takes its step's log alone)
      # shellcheck disable=SC2086
      run_one "$tool" "$n" "$n" $line &
      running=$((running + 1))
      if [ "$running" -ge "$jobs" ]; then wait -n; running=$((running - 1)); fi
    done
  done
  wait
  tally "${names[@]}"
  status=$?
  rm -rf "$work"
  exit $status
}

ops_runs() {  # gpu.ops, one doctest case at a time
  local bin=$build/tests/test_gpu_ops tc tool running=0 alone=() names=()
  [ -x "$bin" ] || { echo "$me cuda: no $bin (build with -Dcuda=enabled first)" >&2; exit 2; }
  if [ ${#cases[@]} -eq 0 ]; then
    cases=('*update*' '*c51_loss*' '*c51_xent*' '*dueling_dist*' '*relu_bias_grad*' '*head_backward*' '*head_forward*'
      '*tile_gemm*')
  elif [ "${cases[*]}" = all ]; then
    # every case of gpu.ops: its name up to its colon and then any text (doctest's -tc splits at
    # commas, which the text after the colon may hold); a name without a colon as it is
    mapfile -t cases < <("$bin" --list-test-cases 2>/dev/null | grep -E '^gpu\.ops[.:]' |
      sed -E 's/^([^:]*):.*/\1:*/' | sort -u)
    [ ${#cases[@]} -gt 0 ] || { echo "$me cuda: $bin listed no gpu.ops case" >&2; exit 2; }
  fi
  # the test setup's environment (tests/meson.build's test_env)
  export DQN_SOURCE_DIR=$PWD DQN_BUILD_DIR=$build
  for tc in "${cases[@]}"; do names+=("${tc//[^A-Za-z0-9_]/}"); done
  for tool in "${tools[@]}"; do
    alone=()
    for tc in "${cases[@]}"; do
      if [ "$jobs" -gt 1 ] && [[ "$tc" == *update* ]]; then alone+=("$tc"); continue; fi
      if [ "$jobs" -eq 1 ]; then run_one "$tool" "$tc" "${tc//[^A-Za-z0-9_]/}" "$bin" -tc="$tc"; continue; fi
      run_one "$tool" "$tc" "${tc//[^A-Za-z0-9_]/}" "$bin" -tc="$tc" &
      running=$((running + 1))
      if [ "$running" -ge "$jobs" ]; then wait -n; running=$((running - 1)); fi
    done
    wait
    running=0
    for tc in "${alone[@]}"; do run_one "$tool" "$tc" "${tc//[^A-Za-z0-9_]/}" "$bin" -tc="$tc"; done
  done
  tally "${names[@]}"
  exit $?
}

case ${1:-} in
  host) shift; host "$@" ;;
  cuda) shift; cuda "$@" ;;
  -h | --help) usage 0 ;;
  *) echo "$me: first say host (ASan and UBSan, the CPU suites) or cuda (compute-sanitizer, a GPU machine)" >&2; usage ;;
esac
