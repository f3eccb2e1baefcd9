#!/usr/bin/env bash
# On a GPU machine: per-kernel device time of the captured step (ncu, one kernel node at a time)
# for the C51-only ref workload and ref with all heads, B 256, tf32. CSVs go to ${OUT:-out}/
# (tools/lab/ncu_summary.py out/ncu_c51.csv: the last replayed step's kernels in order, and the total).
# Usage: tools/lab/gpu_profile.sh [batch]   (NCU_CACHE=none: caches left warm between kernels, as in a replay;
#        NCU_METRICS=list: other metrics than the duration, e.g. the memory traffic per kernel:
#        NCU_METRICS=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct)
#        tools/lab/gpu_profile.sh source REGEX [batch] [key=value ...]
#   source: the full ncu section set for the kernels whose names match REGEX (one replayed step of
#   ref, C51 unless overrides follow), the details page and the per-line source counters (stall
#   samples per SASS instruction, alone and under their CUDA lines) as gzipped CSV. NCU_CACHE
#   (default all: flushed before each kernel) and NCU_CLOCK (default base: locked clocks) as ncu's
#   --cache-control and --clock-control (none and none: as in a replay).
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"
export PATH=/usr/local/cuda/bin:$PATH
build=build-gpu
if [ ! -f $build/build.ninja ]; then
  meson setup $build -Dcuda=enabled --buildtype=release >"$out/setup.log" 2>&1 || { tail -40 "$out/setup.log"; exit 1; }
fi
ninja -C $build -j"$(nproc)" >"$out/build.log" 2>&1 || { grep -E "error|FAILED" "$out/build.log" | head -40; exit 1; }
export DQN_PLUGIN_PATH=$PWD/$build/plugins
if [ "${1:-}" = source ]; then
  regex=$2; b=${3:-256}; shift; shift; [ $# -gt 0 ] && shift
  rep=$(mktemp -d)/prof
  # one replayed step: collection only inside the bench's profiler range (--profile-range), so the
  # capture, the autotuning's thousands of launches and the warm-up are not profiled (an ncu run
  # without it ran into a 500 s limit); --launch-count keeps the first N matches
  ncu --profile-from-start off --graph-profiling node --kernel-name "regex:$regex" --launch-count "${NCU_COUNT:-16}" \
    --cache-control "${NCU_CACHE:-all}" --clock-control "${NCU_CLOCK:-base}" \
    --set full --import-source yes -o "$rep" $build/tools/dqn bench pipelines/ref.yaml "$@" --batch "$b" \
    --precision tf32 --warmup 1 --iters 1 --repeats 1 --profile-range >"$out/ncu_run.log" 2>&1 ||
    tail -20 "$out/ncu_run.log"
  ncu -i "$rep.ncu-rep" --page details >"$out/ncu_details.txt" 2>&1
  ncu -i "$rep.ncu-rep" --page source --csv --print-source cuda 2>&1 | gzip >"$out/ncu_source_cuda.csv.gz"
  ncu -i "$rep.ncu-rep" --page source --csv --print-source sass 2>&1 | gzip >"$out/ncu_source_sass.csv.gz"
  # each SASS instruction under its CUDA line (the cuda page alone came back without metrics on
  # 2026-12-05: the sass page has them, but no line numbers)
  ncu -i "$rep.ncu-rep" --page source --csv --print-source cuda,sass 2>&1 | gzip >"$out/ncu_source_cuda_sass.csv.gz"
  exit 0
fi
b=${1:-256}
all="heads.1.enabled=true heads.2.enabled=true heads.3.enabled=true"
for cfg in c51 full; do
  ov=""; [ $cfg = full ] && ov=$all
  # warm-up 1, then 2 profiled replays (only those: the bench's profiler range)
  ncu --profile-from-start off --clock-control none --cache-control ${NCU_CACHE:-all} --graph-profiling node \
    --metrics "${NCU_METRICS:-gpu__time_duration.sum}" --csv --print-units base \
    $build/tools/dqn bench pipelines/ref.yaml $ov --batch $b --precision tf32 --warmup 1 --iters 2 --repeats 1 \
    --profile-range >"$out/ncu_$cfg.csv" 2>"$out/ncu_$cfg.err" || tail -5 "$out/ncu_$cfg.err"
done
