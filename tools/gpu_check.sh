#!/usr/bin/env bash
# On a GPU machine, in one call: build with CUDA, run the suites (gpu included), a CUDA `dqn step`,
# the benchmark against the PyTorch peer (C51 alone and all four heads), the pipeline's cuda:
# choices against the defaults, and compute-sanitizer on the update, head and loss ops and on whole
# steps. Logs and JSON go to ${OUT:-out}/; a short summary is printed last.
# Usage: tools/gpu_check.sh [quick|bench|fast|verify|epoch|sanitize|scaling]   quick: build, tests, step; bench: build and
# benchmarks only; fast: build, tests, step, then the two comparisons at B 256 and the replayed
# steps' kernel timelines (dqn-trace) (for iterating on kernels: about half the device time of a
# full run); verify: build, the gpu suite alone, step, the C51 timeline,
# the C51 comparison at B 256 against the graph peer (what a change to the default kernels needs
# first, in about 150 s); epoch: build, the gpu suite, the epoch comparison drawing from a full
# replay (uniform and prioritised, B 256, tf32) and compute-sanitizer on the replay's kernels;
# sanitize: build, then compute-sanitizer over whole captured steps (tools/sanitize.sh cuda:
# every head, each precision, the device replay, dqn train on CUDA) with each tool of SANITIZE_STEP;
# scaling: build, gpu.ranks, then dqn bench (C51 and all four heads, B 256 and 4096 per GPU, tf32)
# on 1, 2, 4 and 8 GPUs, as many as the machine has (steps/s, samples/s, the all-reduce's time).
# Environment: CHOICES="cuda.x=a ..." runs only those rows of the cuda: choices against the
# defaults (cuda.x=a,cuda.y=b sets both for one row); SANITIZE_OPS / SANITIZE_STEP the
# compute-sanitizer tools (default memcheck racecheck / memcheck initcheck, in sanitize mode
# memcheck initcheck racecheck); SAN_BOX each one's time box in seconds; SAN_JOBS how many
# sanitized whole steps run at once.
set -uo pipefail
mode=${1:-all}
all="heads.1.enabled=true heads.2.enabled=true heads.3.enabled=true"
out=${OUT:-out}; mkdir -p "$out"
export PATH=/usr/local/cuda/bin:$PATH
build=build-gpu
summary="$out/summary.txt"; : >"$summary"
note() { echo "$*" | tee -a "$summary"; }
# Everything in one archive beside the summary and the comparisons (a lent machine returns only a
# few files, the first in name order). The archive is written outside $out first: tar reading the
# folder it writes into complains ("file changed as we read it") and exits non-zero.
pack() {
  local tgz
  tgz=$(mktemp /tmp/gpu_check_logs.XXXXXX)
  tar -czf "$tgz" -C "$out" . 2>/dev/null; mv "$tgz" "$out/logs.tgz"
  [ -s "$out/logs.tgz" ] &&
    find "$out" -maxdepth 1 -type f ! -name logs.tgz ! -name summary.txt ! -name 'compare_*.json' -delete
}
# The replayed step's kernel timeline (tools/lab/trace): C51 into the summary, all four heads into a
# file. (The update kernel's phase stamps need a lab build: meson -Dlab=true, dqn-trace --update-clock.)
trace() {
  $build/tools/lab/dqn-trace pipelines/ref.yaml --batch 256 --precision tf32 >"$out/trace_c51.txt" 2>&1
  cat "$out/trace_c51.txt" >>"$summary"; head -3 "$out/trace_c51.txt"
  # shellcheck disable=SC2086
  $build/tools/lab/dqn-trace pipelines/ref.yaml $all --batch 256 --precision tf32 >"$out/trace_full.txt" 2>&1
  head -3 "$out/trace_full.txt" | tee -a "$summary"
}
t0=$(date +%s)
compute-sanitizer --version 2>/dev/null | tail -1 | tee -a "$summary"
if [ ! -f $build/build.ninja ]; then
  meson setup $build -Dcuda=enabled --buildtype=release >"$out/setup.log" 2>&1 || { tail -40 "$out/setup.log"; exit 1; }
  note "$(grep -m1 -o 'NCCL: .*' "$out/setup.log" || echo 'NCCL: not found (gpu.ranks skips; -Dnccl_root=DIR)')"
fi
ninja -C $build -k 0 -j"$(nproc)" >"$out/build.log" 2>&1 || { grep -E "error|FAILED" "$out/build.log" | head -40; exit 1; }
note "build: $(( $(date +%s) - t0 )) s, $(grep -c 'warning' "$out/build.log") warning lines"
export DQN_PLUGIN_PATH=$PWD/$build/plugins

if [ "$mode" = sanitize ]; then
  # shellcheck disable=SC2086
  tools/sanitize.sh cuda --build $build --logs "$out" --box "${SAN_BOX:-300}" --jobs "${SAN_JOBS:-4}" \
    ${SANITIZE_STEP:-memcheck initcheck racecheck} | tee -a "$summary"
  note "total: $(( $(date +%s) - t0 )) s"
  pack
  exit 0
fi
if [ "$mode" = scaling ]; then
  $build/tests/test_gpu_step -tc='gpu.ranks*' >"$out/ranks.log" 2>&1
  note "gpu.ranks: rc=$? $(grep -E '^\[doctest\] (test cases|assertions)|skipped:' "$out/ranks.log" | tr -s ' ' | tr '\n' ' ')"
  gpus=$(nvidia-smi -L | grep -c '^GPU')
  for n in 1 2 4 8; do
    [ "$n" -le "$gpus" ] || break
    devices=$(seq -s, 0 $((n - 1)))
    for extra in "" "$all"; do
      # shellcheck disable=SC2086
      $build/tools/dqn bench pipelines/ref.yaml $extra "devices=[$devices]" --batch 256,4096 --precision tf32 --json \
        >>"$out/compare_scaling.json" 2>>"$out/scaling.err"
    done
    # C51 drawing every batch from a full prioritised replay of each rank's own
    $build/tools/dqn bench --epoch pipelines/ref.yaml "devices=[$devices]" --replay prioritized --precision tf32 \
      --json | grep '"replay":"prioritized"' >>"$out/compare_scaling.json" 2>>"$out/scaling.err"
  done
  python3 - "$out/compare_scaling.json" <<'PY' | tee -a "$summary"
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        j = json.loads(l)
        print(f"{len(j['heads'])} heads B {j['batch']:5d} x {j['ranks']} GPUs{' epoch' if j.get('mode') else ''}: "
              f"{j['us_per_step_median']:9.2f} us/step {j['steps_per_s']:9.0f} steps/s {j['samples_per_s']:11.0f} "
              f"samples/s all-reduce {j.get('allreduce_us', float('nan')):7.2f} us")
PY
  note "total: $(( $(date +%s) - t0 )) s"
  pack
  exit 0
fi
if [ "$mode" != bench ]; then
  t1=$(date +%s)
  suites=(--suite gpu --suite unit --suite numeric --suite plugins)
  { [ "$mode" = verify ] || [ "$mode" = epoch ]; } && suites=(--suite gpu)  # (the others run in CI too)
  meson test -C $build --no-rebuild --print-errorlogs --num-processes 8 "${suites[@]}" >"$out/test.log" 2>&1
  grep -E "^ *[0-9]+/[0-9]+ " "$out/test.log" | tee -a "$summary"
  note "tests: $(( $(date +%s) - t1 )) s"
  cp $build/meson-logs/testlog.txt "$out/testlog.txt" 2>/dev/null
  # A gpu binary that failed runs again a test case at a time: a kernel that faults poisons the
  # CUDA context for every case after it in the same process, which would hide their results.
  for bin in ops step; do
    grep -qE "gpu\.$bin +(FAIL|TIMEOUT)" "$out/test.log" || continue
    # a case's name up to its colon and then any text (doctest's -tc splits at commas, which the
    # text after the colon may hold); a name without a colon as it is
    $build/tests/test_gpu_$bin --list-test-cases 2>/dev/null | grep -E "^gpu\.${bin}[.:]" |
      sed -E 's/^([^:]*):.*/\1:*/' | sort -u |
      while read -r pattern; do
        log="$out/case_${pattern//[^A-Za-z0-9_]/_}.log"
        timeout 300 $build/tests/test_gpu_$bin -tc="$pattern" >"$log" 2>&1
        rc=$?
        note "  $pattern: rc=$rc $(grep -E '^\[doctest\] (test cases|assertions)' "$log" | tr -s ' ' | tr '\n' ' ')"
      done
  done
  $build/tools/dqn step pipelines/c51.yaml --backend cuda --random-batch 1 --steps 10 --out /tmp/o.safetensors \
    >"$out/step.log" 2>&1 && python3 tools/st_check.py /tmp/o.safetensors \
    --expect trunk.0.weight,target.trunk.0.weight,adam.m.trunk.0.weight,adam.v.trunk.0.weight,adam.step,c51.branch.2.1.weight,loss.c51,grad_norm.c51,clip.c51,loss.total,td_error,skipped_steps \
    >"$out/st_check.log" 2>&1; note "cuda dqn step + st_check rc=$?"
  if [ "$mode" = verify ]; then
    # the C51 step's kernel timeline
    $build/tools/lab/dqn-trace pipelines/ref.yaml --batch 256 --precision tf32 >"$out/trace_c51.txt" 2>&1
    head -3 "$out/trace_c51.txt" | tee -a "$summary"
    python3 tools/bench/compare.py --dqn $build/tools/dqn --pipeline pipelines/ref.yaml --batch 256 --precision tf32 \
      --peer-modes graph --json-out "$out/compare_c51.json" 2>"$out/compare_c51.err" | tee -a "$summary" ||
      tail -5 "$out/compare_c51.err"
    note "total: $(( $(date +%s) - t0 )) s"
    pack
    exit 0
  fi
  # The captured graphs: nodes, lanes, and stages queued behind one they do not need (want 0).
  for extra in "" "heads.1.enabled=true heads.2.enabled=true heads.3.enabled=true"; do
    # shellcheck disable=SC2086
    $build/tools/dqn step pipelines/ref.yaml $extra --backend cuda --random-batch 1 --steps 1 --out /tmp/explain.st \
      --explain 2>&1 | grep -o '^captured: [^:]*' | tee -a "$summary"
  done
  # what a kernel boundary, a grid or cluster barrier, a flag hand-off and a load cost here, and how far
  # apart a replayed graph starts its independent chains (dqn-latency)
  [ -x $build/tools/lab/dqn-latency ] && { timeout 180 $build/tools/lab/dqn-latency 2>&1 | tee -a "$summary"; }
fi
if [ "$mode" = quick ]; then pack; exit 0; fi
if [ "$mode" = epoch ]; then
  python3 tools/bench/compare.py --dqn $build/tools/dqn --pipeline pipelines/ref.yaml --batch 256 --precision tf32 --epoch \
    --json-out "$out/compare_epoch.json" 2>"$out/compare_epoch.err" | tee -a "$summary" || tail -5 "$out/compare_epoch.err"
  # dqn train's training steps per second in the learner-bound run against the epoch benchmark of
  # the same pipeline (the median of the metrics lines once learning has run a while).
  $build/tools/dqn bench --epoch pipelines/learner_bound.yaml --backend cuda --replay prioritized --json \
    >"$out/bench_learner_bound.json" 2>&1
  $build/tools/dqn train pipelines/learner_bound.yaml --backend cuda --steps 12000 -q --out "$out/train_lb" \
    --set training.eval.every=1000000 >"$out/train_lb.log" 2>&1
  python3 - "$out/train_lb/metrics.jsonl" "$out/bench_learner_bound.json" <<'PY' | tee -a "$summary"
import json, statistics, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
tps = [m["train_steps_per_s"] for m in lines if m.get("train_steps", 0) > 8000 and not m.get("final")]
bench = [json.loads(l) for l in open(sys.argv[2]) if l.startswith("{")]
epoch = [b for b in bench if b.get("replay") == "prioritized"][0]["steps_per_s"]
train = statistics.median(tps)
print(f"learner-bound dqn train: {train:.0f} training steps/s; dqn bench --epoch (prioritized): {epoch:.0f}; "
      f"ratio {train / epoch:.2f}")
PY
  # default.yaml learning CartPole on CUDA, three seeds (backend auto picks the GPU)
  meson test -C $build --no-rebuild --print-errorlogs learning.cartpole >"$out/learning.log" 2>&1
  rc=$?; cp $build/meson-logs/testlog.txt "$out/learning_testlog.txt" 2>/dev/null
  note "learning.cartpole on CUDA: rc=$rc $(grep -E 'OK: seed|FAIL' "$out/learning_testlog.txt" | tr '\n' ' ')"
  for tool in memcheck racecheck; do
    timeout "${SAN_BOX:-150}" meson test -C $build --no-rebuild --setup $tool gpu.step \
      --test-args='-tc=gpu.replay.*' >"$out/san_${tool}_replay.log" 2>&1
    note "$tool gpu.step (gpu.replay.*): rc=$?"
  done
  note "total: $(( $(date +%s) - t0 )) s"
  pack
  exit 0
fi

if [ "$mode" = fast ]; then
  for cfg in c51 full; do
    extra=""; [ $cfg = full ] && extra="--heads c51,iqn,ensemble,cql $(for s in $all; do printf -- '--set %s ' "$s"; done)"
    python3 tools/bench/compare.py --dqn $build/tools/dqn --pipeline pipelines/ref.yaml --batch 256 --precision tf32 $extra \
      --json-out "$out/compare_$cfg.json" 2>"$out/compare_$cfg.err" | tee -a "$summary" || tail -5 "$out/compare_$cfg.err"
  done
  trace
  # FAST_CHOICES="cuda.x=a cuda.y=b": the C51 and all-heads steps at B 256 with each choice.
  for kv in ${FAST_CHOICES:-}; do
    for extra in "" "$all"; do
      # shellcheck disable=SC2086
      $build/tools/dqn bench pipelines/ref.yaml $extra ${kv//,/ } --batch 256 --precision tf32 2>&1 |
        grep -v "^pipeline" | sed "s|^|$kv ${extra:+(all heads)}: |" | tee -a "$summary"
    done
  done
  note "total: $(( $(date +%s) - t0 )) s"
  pack
  exit 0
fi
# The engine and the PyTorch peer in one invocation each (ratio = peer / engine).
python3 tools/bench/compare.py --dqn $build/tools/dqn --pipeline pipelines/ref.yaml --batch 256,1024,4096 --precision tf32 \
  --json-out "$out/compare_c51.json" >"$out/compare_c51.txt" 2>"$out/compare_c51.err" || tail -5 "$out/compare_c51.err"
python3 tools/bench/compare.py --dqn $build/tools/dqn --pipeline pipelines/ref.yaml --batch 256,1024,4096 --precision tf32 \
  --heads c51,iqn,ensemble,cql $(for s in $all; do printf -- '--set %s ' "$s"; done) \
  --json-out "$out/compare_full.json" >"$out/compare_full.txt" 2>"$out/compare_full.err" || tail -5 "$out/compare_full.err"
$build/tools/dqn bench pipelines/ref.yaml --batch 256,1024,4096 --precision fp32,bf16 >"$out/bench_prec.txt" 2>&1
# The pipeline's cuda: choices against the defaults (the same results, other kernels or launches),
# B 256, one labelled line each: the update as its separate kernels; cuBLASLt for every GEMM; no
# programmatic dependent launch, or only for kernels with little shared memory, or for every
# kernel even in a wide step.
: >"$out/bench_choices.txt"
choice() {  # choice LABEL CONFIG BATCHES OVERRIDES (comma-separated)
  local label=$1 cfg=$2 batches=$3 ov=$4
  local heads=""; [ "$cfg" = all ] && heads=$all
  # shellcheck disable=SC2086
  $build/tools/dqn bench pipelines/ref.yaml $heads ${ov//,/ } --batch "$batches" --precision tf32 2>&1 |
    grep -v "^pipeline" | sed "s|^|$label ($cfg): |" >>"$out/bench_choices.txt"
}
# CHOICES="cuda.x=a cuda.y=b": only these rows (C51 and all heads at B 256), for a shorter run.
for kv in ${CHOICES:-}; do
  for cfg in c51 all; do choice "$kv" $cfg 256 "$kv"; done
done
for cfg in c51 all; do
  [ -n "${CHOICES:-}" ] && break
  for kv in cuda.update_cluster=off cuda.gemm=cublaslt cuda.pdl=off cuda.pdl=small cuda.pdl=all; do
    choice "$kv" $cfg 256 "$kv"
  done
done
{
  echo "== C51 (ref), tf32: engine vs PyTorch graph"; cat "$out/compare_c51.txt"
  echo "== all four heads (ref), tf32"; cat "$out/compare_full.txt"
  echo "== C51, fp32 and bf16"; cat "$out/bench_prec.txt"
  echo "== cuda: choices, tf32"
  cat "$out/bench_choices.txt"
} | tee -a "$summary"
grep -o '"device": "[^"]*"' "$out/compare_c51.json" | head -1 | tee -a "$summary"
if [ "$mode" = bench ]; then pack; exit 0; fi
trace

# compute-sanitizer (time-boxed): the update and head ops, and whole steps with all four heads. The
# zero-sync test is left out: it subscribes to CUPTI, which the sanitizer holds.
# racecheck (shared-memory hazards) leaves out gemm_mask: its six GEMM paths (cuBLASLt and bf16
# among them) took it past the time box, and the mask in tile_gemm's epilogue reads no shared memory.
for tool in ${SANITIZE_OPS:-memcheck racecheck}; do
  cases='*update*,*head_*,*c51_loss*,*c51_xent*,*dueling_dist*,*tile_gemm*,*relu_bias_grad*'
  [ "$tool" = memcheck ] && cases="$cases,*gemm_mask*,*gemm_batch2*,*gemm_sum_batch*"
  timeout "${SAN_BOX:-120}" meson test -C $build --no-rebuild --setup $tool gpu.ops --test-args="-tc=$cases" \
    >"$out/san_${tool}_ops.log" 2>&1; note "$tool gpu.ops ($cases): rc=$?"
done
for tool in ${SANITIZE_STEP:-memcheck initcheck}; do
  timeout "${SAN_BOX:-100}" meson test -C $build --no-rebuild --setup $tool gpu.step \
    --test-args='-tc=*aux_fraction*,*replay_equals*,*nan_skips*' >"$out/san_${tool}_step.log" 2>&1
  note "$tool gpu.step (aux fractions with four heads, replay, NaN skip): rc=$?"
done
note "total: $(( $(date +%s) - t0 )) s"
pack
