#!/usr/bin/env bash
# On a GPU machine: build with CUDA, run the suites (gpu included), a CUDA `dqn step`, and the
# benchmark against the PyTorch peer. Logs go to ${OUT:-out}/. Usage: tools/gpu_check.sh [quick]
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"
export PATH=/usr/local/cuda/bin:$PATH
build=build-gpu
if [ ! -f $build/build.ninja ]; then
  meson setup $build -Dcuda=enabled --buildtype=release >"$out/setup.log" 2>&1 || { tail -40 "$out/setup.log"; exit 1; }
fi
ninja -C $build -k 0 -j"$(nproc)" >"$out/build.log" 2>&1 || grep -E "error|FAILED" "$out/build.log" | head -40
grep -E "warning" "$out/build.log" | sort -u | head -10
meson test -C $build --no-rebuild --print-errorlogs --num-processes 8 --suite gpu --suite unit --suite numeric --suite plugins \
  >"$out/test.log" 2>&1
grep -E "^ *[0-9]+/[0-9]+ |^(Ok|Fail|Skipped|Timeout):" "$out/test.log" | tail -30
export DQN_PLUGIN_PATH=$PWD/$build/plugins
$build/tools/dqn step pipelines/c51.yaml --backend cuda --random-batch 1 --steps 10 --out /tmp/o.safetensors &&
  python3 tools/st_check.py /tmp/o.safetensors \
    --expect trunk.0.weight,target.trunk.0.weight,adam.m.trunk.0.weight,adam.v.trunk.0.weight,adam.step,c51.branch.2.1.weight,loss.c51,grad_norm.c51,clip.c51,loss.total,td_error,skipped_steps \
    >"$out/st_check.log" 2>&1; echo "st_check rc=$? ($(head -2 "$out/st_check.log" | tail -1))"
[ "${1:-}" = quick ] && exit 0
$build/tools/dqn bench pipelines/ref.yaml --batch 256,1024,4096 --precision fp32,tf32,bf16 --json >"$out/bench.jsonl" 2>&1
$build/tools/dqn bench pipelines/ref.yaml --batch 256,1024,4096 --precision fp32,tf32,bf16
python3 bench/compare.py --dqn $build/tools/dqn --pipeline pipelines/ref.yaml --batch 256,1024,4096 --precision tf32 \
  --json-out "$out/compare.json" 2>"$out/compare.err" || tail -20 "$out/compare.err"
