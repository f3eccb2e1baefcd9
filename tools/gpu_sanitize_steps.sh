#!/usr/bin/env bash
# compute-sanitizer over whole captured steps, on a GPU machine, after a CUDA build: each workload
# under each TOOL, in a time box of its own, a few at once. The workloads:
#   step_{c51,all}_{fp32,tf32,bf16}: `dqn step pipelines/ref.yaml` (C51 alone, or all four heads),
#     3 steps on a random batch, autotuning off (the first kernel choice; the step's graph as built);
#   epoch_{c51,all}: `dqn bench --epoch` drawing every batch from the replay on the device, uniform
#     and prioritised (the sample, the priority update and the tree), 3 steps an epoch;
#   train_{uniform,prioritized}: `dqn train pipelines/default.yaml` on CUDA: acting, n-step inserts
#     into the device replay, training steps, a checkpoint read back from the device;
#   lt_all_bf16: step_all_bf16's cuBLASLt calls (logged by the library) replayed by cuBLASLt alone
#     (tools/lab/dqn-lt-replay): what a tool reports there is the library's, not the engine's.
# One line per run: tool, workload, rc (0 clean, 1 an error or hazard, 124 out of time), seconds,
# the tool's summary line; then "TOOL: N clean, N failed, N out of time" for each tool.
# Usage: tools/gpu_sanitize_steps.sh [--only REGEX] [--set KEY=VALUE]... [--san-arg ARG]...
#          [--box SECONDS] [--jobs N] [--tag TAG] TOOL...
#   TOOL: memcheck, racecheck, initcheck, synccheck. --only: the workloads whose name matches;
#   --set: an override for every workload (e.g. cuda.gemm=cublaslt); --san-arg: a compute-sanitizer
#   option (e.g. --san-arg=--kernel-name-exclude --san-arg=kns=tile_gemm); --tag: added to the log
#   names. BUILD (default build-gpu) is the Meson build folder; LOGS (default ${OUT:-out}) the logs.
# Exit status: 0 when every run was clean.
set -uo pipefail
usage() { echo "usage: tools/gpu_sanitize_steps.sh [--only REGEX] [--set K=V]... [--san-arg ARG]... [--box S] [--jobs N] [--tag T] TOOL..." >&2; exit 2; }
only=. box=300 jobs=4 tag="" sets=() san=() tools=()
while [ $# -gt 0 ]; do
  case $1 in
    --only) only=${2:?}; shift 2 ;;
    --set) sets+=("${2:?}"); shift 2 ;;
    --san-arg) san+=("${2:?}"); shift 2 ;;
    --san-arg=*) san+=("${1#--san-arg=}"); shift ;;
    --box) box=${2:?}; shift 2 ;;
    --jobs) jobs=${2:?}; shift 2 ;;
    --tag) tag=_${2:?}; shift 2 ;;
    memcheck | racecheck | initcheck | synccheck) tools+=("$1"); shift ;;
    *) echo "gpu_sanitize_steps.sh: '$1': not an option or a tool (memcheck, racecheck, initcheck, synccheck)" >&2; usage ;;
  esac
done
[ ${#tools[@]} -gt 0 ] || usage
[[ "$box" =~ ^[0-9]+$ ]] || { echo "gpu_sanitize_steps.sh: --box '$box' is not a whole number of seconds" >&2; exit 2; }
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || { echo "gpu_sanitize_steps.sh: --jobs '$jobs' is not a positive whole number" >&2; exit 2; }
build=${BUILD:-build-gpu}
case $build in /*) ;; *) build=$PWD/$build ;; esac
dqn=$build/tools/dqn
[ -x "$dqn" ] || { echo "gpu_sanitize_steps.sh: no $dqn (build with -Dcuda=enabled first)" >&2; exit 2; }
logs=${LOGS:-${OUT:-out}}
mkdir -p "$logs"
work=$(mktemp -d /tmp/gpu_sanitize_steps.XXXXXX)
export DQN_PLUGIN_PATH=$build/plugins DQN_PLUGIN_DEFAULT_DIRS=''

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

run_one() {  # run_one TOOL NAME
  local tool=$1 name=$2 w log t0 rc secs summary line
  w=$work/$tool$tag-$name; mkdir -p "$w"
  log=$logs/san_${tool}${tag}_$name.log
  line=${cmd[$name]//@W@/$w}
  # an override goes after the pipeline as --set, which every command takes
  for kv in "${sets[@]}"; do line="$line --set $kv"; done
  t0=$(date +%s)
  # shellcheck disable=SC2086
  timeout "$box" compute-sanitizer --tool "$tool" --error-exitcode 1 "${san[@]}" $line >"$log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - t0 ))
  summary=$(grep -hE '(ERROR|RACECHECK|INITCHECK|SYNCCHECK) SUMMARY' "$log" | tail -1 | sed 's/^=* *//')
  echo "$rc" >"$log.rc"
  echo "$tool${tag} $name: rc=$rc, ${secs} s${summary:+, $summary}"
}

names=()
for n in $(printf '%s\n' "${!cmd[@]}" | sort); do [[ $n =~ $only ]] && names+=("$n"); done
[ ${#names[@]} -gt 0 ] || { echo "gpu_sanitize_steps.sh: --only '$only' matches no workload" >&2; exit 2; }
if [[ " ${names[*]} " == *" lt_all_bf16 "* ]]; then  # the library's log of the step's calls, once
  # shellcheck disable=SC2086
  CUBLASLT_LOG_LEVEL=2 CUBLASLT_LOG_FILE=$work/lt_all_bf16.log ${cmd[step_all_bf16]//@W@/$work} >/dev/null 2>&1 ||
    echo "gpu_sanitize_steps.sh: step_all_bf16 failed without a tool: lt_all_bf16 replays what it logged" >&2
fi
running=0
for tool in "${tools[@]}"; do
  for n in "${names[@]}"; do
    run_one "$tool" "$n" &
    running=$((running + 1))
    if [ "$running" -ge "$jobs" ]; then wait -n; running=$((running - 1)); fi
  done
done
wait
status=0
for tool in "${tools[@]}"; do
  clean=0 failed=0 late=0
  for n in "${names[@]}"; do
    case $(cat "$logs/san_${tool}${tag}_$n.log.rc" 2>/dev/null || echo 1) in
      0) clean=$((clean + 1)) ;;
      124) late=$((late + 1)); status=1 ;;
      *) failed=$((failed + 1)); status=1 ;;
    esac
  done
  echo "$tool${tag}: $clean clean, $failed failed, $late out of time"
done
rm -rf "$work"
exit $status
