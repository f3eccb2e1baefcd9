#!/usr/bin/env bash
# On a GPU machine: an A/B comparison of the pipeline's cuda: choices, or of two builds, with the
# run-to-run noise of autotuning averaged out. Each variant ("default", "cuda.x=value[,cuda.y=value]",
# overrides of pipelines/ref.yaml, or "build=DIR": another build folder's tools/dqn with its plugins,
# before and after a change) runs `dqn bench` at B 256, tf32, C51 and all four heads, ROUNDS times
# (default 3) in alternating order, each a fresh process (and so a fresh autotuning); prints every
# figure and the median per variant. With TRACE=1 it also prints each variant's C51 kernel timeline (dqn-trace
# --update-clock), with TRACE=all also the all-heads one. BUILD (default build-gpu) is the build
# folder; its tools/dqn is timed (DQN=path times another build's dqn). OUT=dir: a copy of the
# output in dir/ab.txt.
# Usage: tools/lab/gpu_ab.sh default cuda.pdl=off cuda.gemm=cublaslt,cuda.pdl=off
#        tools/lab/gpu_ab.sh build=.base/build-gpu build=build-gpu
set -uo pipefail
build=${BUILD:-build-gpu}
dqn=${DQN:-$build/tools/dqn}
export DQN_PLUGIN_PATH=${DQN_PLUGIN_PATH:-$PWD/$build/plugins}
all="heads.1.enabled=true heads.2.enabled=true heads.3.enabled=true"
rounds=${ROUNDS:-3}
# with OUT set (a lent machine's folder that comes back), everything printed also goes to $OUT/ab.txt
[ -n "${OUT:-}" ] && { mkdir -p "$OUT"; exec > >(tee "$OUT/ab.txt") 2>&1; }
declare -A res
for r in $(seq "$rounds"); do
  for v in "$@"; do
    ov=""; [ "$v" != default ] && ov=${v//,/ }
    vdqn=$dqn; vplugins=$DQN_PLUGIN_PATH
    if [[ $v == build=* ]]; then
      vdqn=${v#build=}/tools/dqn; vplugins=$PWD/${v#build=}/plugins; ov=""
    fi
    for cfg in c51 all; do
      heads=""; [ $cfg = all ] && heads=$all
      # shellcheck disable=SC2086
      us=$(DQN_PLUGIN_PATH=$vplugins $vdqn bench pipelines/ref.yaml $heads $ov --batch 256 --precision tf32 2>/dev/null |
        awk '$1 == "pipeline" {for (i = 1; i <= NF; i++) if ($i == "device_us") c = i} $1 == "ref" && c {print $c}')
      res["$v|$cfg"]+="$us "
      echo "round $r, $v, $cfg: ${us:-failed} us"  # as it goes: a call cut off by its time box keeps these
    done
  done
done
printf '%-40s %-32s %-9s %-32s %-9s\n' variant "C51 us (rounds)" median "all heads us (rounds)" median
for v in "$@"; do
  med() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
  c=${res["$v|c51"]}; a=${res["$v|all"]}
  printf '%-40s %-32s %-9s %-32s %-9s\n' "$v" "$c" "$(echo "$c" | med)" "$a" "$(echo "$a" | med)"
done
if [ "${TRACE:-0}" = 1 ] || [ "${TRACE:-0}" = all ]; then
  for v in "$@"; do
    [[ $v == build=* ]] && continue  # (the traces are of this build's choices)
    ov=""; [ "$v" != default ] && ov=${v//,/ }
    echo "== trace, $v"
    # shellcheck disable=SC2086
    $build/tools/lab/dqn-trace pipelines/ref.yaml $ov --batch 256 --precision tf32 --update-clock 2>&1
    if [ "$TRACE" = all ]; then
      echo "== trace, all heads, $v"
      # shellcheck disable=SC2086
      $build/tools/lab/dqn-trace pipelines/ref.yaml $all $ov --batch 256 --precision tf32 --update-clock 2>&1
    fi
  done
fi
