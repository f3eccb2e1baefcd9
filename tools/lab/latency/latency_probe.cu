// dqn-latency: the costs a fused or persistent step would trade against each other, measured on
// the GPU at hand. The C51 step's critical path is a chain of 13 dependent kernels of a few
// MFLOP each (docs/performance.md): what a kernel boundary costs in a replayed graph (with and
// without programmatic dependent launch), against a grid-wide barrier of one cooperative kernel,
// a thread-block cluster barrier, a hand-off through a flag in global memory from one SM to the
// next, a load from L2 and from device memory, and how far apart a replayed graph starts its
// independent chains (the step's lanes: with all four heads the online trunk, where the critical
// path begins, started 9.3 µs into the step, behind the other roots; also with the replays queued
// back to back, as the step is replayed, and the first chain on the capturing stream, as the
// engine captures its lane 0). Each figure: CUDA events around many
// repetitions after a warm-up, the median of five runs, per repetition (barriers and hand-offs:
// the difference between many and none, so the launch itself drops out). n/a (JSON: -1): that
// measurement could not run here.
// With --gemm, the floor of the C51 step's GEMMs as the library runs them: each GEMM shape of the
// step's critical path (B = 256 of pipelines/ref.yaml) alone, as a chain of dependent cuBLASLt tf32
// GEMMs in a replayed graph on an otherwise idle GPU (no kernel beside it), the fastest of the
// heuristic's algorithms: what one layer costs before any contention, boundary included; and the
// forward's four layers with the target network's problem beside the online one (two launches,
// as the step runs them) against both in one strided launch.
// Usage: dqn-latency [--json] [--roots | --gemm]   (--roots: only the graph-root rows; --gemm:
// only the GEMM chain rows)
#include <cooperative_groups.h>
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace cg = cooperative_groups;

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "dqn-latency: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

void check_lt(cublasStatus_t e, const char* what) {
  if (e != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "dqn-latency: %s: cuBLAS status %d\n", what, static_cast<int>(e));
    std::exit(1);
  }
}

/// Milliseconds of whatever `enqueue` puts on `s`, by events.
float time_on(cudaStream_t s, const std::function<void()>& enqueue) {
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "cudaEventCreate");
  check(cudaEventCreate(&b), "cudaEventCreate");
  check(cudaEventRecord(a, s), "cudaEventRecord");
  enqueue();
  check(cudaEventRecord(b, s), "cudaEventRecord");
  check(cudaEventSynchronize(b), "cudaEventSynchronize");
  float ms = 0.0f;
  check(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms;
}

/// The median over five runs (after one warm-up) of the milliseconds of what `enqueue` puts on
/// `s`; `before` (if any) runs ahead of each, outside the timed part.
double median_ms(cudaStream_t s, const std::function<void()>& enqueue, const std::function<void()>& before = {}) {
  auto once = [&] {
    if (before) before();
    return time_on(s, enqueue);
  };
  once();
  std::vector<float> t;
  for (int i = 0; i < 5; ++i) t.push_back(once());
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

/// Milliseconds per repetition of what run(n) times n of (a barrier, a hop, a load): run(n)
/// less run(0), over n, so that the launch drops out.
double per_rep_ms(const std::function<double(int)>& run, int n) { return (run(n) - run(0)) / n; }

/// One link of a kernel chain: every thread reads its slot (written by the kernel before) and
/// writes it + 1, so each kernel depends on the one before through memory.
__global__ void link_kernel(int* x, bool pdl) {
  if (pdl) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  }
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  x[i] += 1;
}

/// µs per item of what `enqueue` puts on `s` (`items` of them: kernels, GEMMs), captured once into
/// a graph and the graph replayed `reps` times.
double replayed_us(cudaStream_t s, const std::function<void()>& enqueue, int items, int reps) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "capture");
  enqueue();
  check(cudaStreamEndCapture(s, &graph), "end capture");
  check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  const double ms = median_ms(s, [&] {
    for (int r = 0; r < reps; ++r) check(cudaGraphLaunch(exec, s), "graph launch");
  });
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return ms * 1000.0 / (static_cast<double>(items) * reps);
}

/// µs per kernel of a captured chain of `n` link kernels of `blocks` blocks, replayed `reps` times.
double chain_us(cudaStream_t s, int* x, int blocks, bool pdl, int n = 64, int reps = 200) {
  return replayed_us(
      s,
      [&] {
        for (int k = 0; k < n; ++k) {
          cudaLaunchAttribute attr{};
          attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
          attr.val.programmaticStreamSerializationAllowed = 1;
          cudaLaunchConfig_t cfg{};
          cfg.gridDim = dim3(static_cast<unsigned>(blocks));
          cfg.blockDim = dim3(128);
          cfg.stream = s;
          cfg.attrs = &attr;
          cfg.numAttrs = pdl ? 1 : 0;
          check(cudaLaunchKernelEx(&cfg, link_kernel, x, pdl), "link launch");
        }
      },
      n, reps);
}

/// `rounds` barriers of the cluster (CLUSTER) or of the whole grid (a cooperative launch).
template <bool CLUSTER>
__global__ void barrier_kernel(int rounds, int* sink) {
  int v = 0;
  for (int r = 0; r < rounds; ++r) {
    v += threadIdx.x;
    if constexpr (CLUSTER) cg::this_cluster().sync();
    else cg::this_grid().sync();
  }
  if (v == -1) *sink = v;
}

double grid_barrier_us(cudaStream_t s, int blocks, int* sink) {
  auto run = [&](int rounds) {
    return median_ms(s, [&] {
      void* args[] = {&rounds, &sink};
      check(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(barrier_kernel<false>), dim3(blocks), dim3(128), args, 0, s),
            "cooperative launch");
    });
  };
  return per_rep_ms(run, 2000) * 1000.0;
}

double cluster_barrier_us(cudaStream_t s, int cs, int clusters, int* sink) {
  if (cs > 8) cudaFuncSetAttribute(barrier_kernel<true>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = static_cast<unsigned>(cs);
  attr.val.clusterDim.y = attr.val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(cs * clusters));
  cfg.blockDim = dim3(128);
  cfg.stream = s;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  if (cudaLaunchKernelEx(&cfg, barrier_kernel<true>, 0, sink) != cudaSuccess || cudaStreamSynchronize(s) != cudaSuccess) {
    cudaGetLastError();
    return -1.0;  // clusters of this size do not launch here (no figure)
  }
  auto run = [&](int rounds) {
    return median_ms(s, [&] { check(cudaLaunchKernelEx(&cfg, barrier_kernel<true>, rounds, sink), "cluster launch"); });
  };
  return per_rep_ms(run, 2000) * 1000.0;
}

/// A token passed from block to block through flags in global memory, `rounds` times around
/// (a cooperative launch, so that every block is resident): block b waits until flag[b] reaches
/// the round, then raises the next block's flag. A wait that outlasts about 2^27 polls gives up
/// and raises flag[n] (the host reports it) rather than hang.
__global__ void flag_ring_kernel(unsigned* flags, int rounds) {
  const unsigned b = blockIdx.x, n = gridDim.x;
  if (threadIdx.x != 0) return;
  volatile unsigned* f = flags;
  for (int r = 0; r < rounds; ++r) {
    const unsigned want = static_cast<unsigned>(r) * n + b;  // the token's hops so far when it reaches b
    long long polls = 0;
    while (f[b] < want) {
      if (++polls > (1ll << 27) || f[n] != 0) {
        f[n] = 1;
        return;
      }
    }
    __threadfence();
    f[(b + 1) % n] = want + 1;
  }
}

double flag_hop_us(cudaStream_t s, int blocks, unsigned* flags) {
  // flags[blocks] (a wait gave up) is cleared once, here, so that every run's verdict stays
  check(cudaMemsetAsync(flags, 0, sizeof(unsigned) * (blocks + 1), s), "memset");  // (s: non-blocking)
  auto run = [&](int rounds) {
    return median_ms(
        s,
        [&] {
          void* args[] = {&flags, &rounds};
          check(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(flag_ring_kernel), dim3(blocks), dim3(32), args, 0, s),
                "cooperative launch");
        },
        [&] { check(cudaMemsetAsync(flags, 0, sizeof(unsigned) * blocks, s), "memset"); });
  };
  const double us = per_rep_ms(run, 200) * 1000.0 / blocks;
  unsigned gave_up = 0;
  check(cudaMemcpyAsync(&gave_up, flags + blocks, sizeof gave_up, cudaMemcpyDeviceToHost, s), "cudaMemcpy");
  check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  return gave_up ? -1.0 : us;  // -1: a wait gave up (no figure)
}

/// One thread follows `steps` dependent loads through a random cycle, from where the last launch
/// stopped (*sink), so that repeated launches do not walk the same lines again (on 2026-12-05 they
/// did: the 256 MiB walk's 20,000 lines came from L2 after the first launch, 145 ns like the 4 MiB one).
__global__ void chase_kernel(const unsigned* next, int steps, unsigned* sink) {
  unsigned i = *sink;
  for (int k = 0; k < steps; ++k) i = __ldcg(next + i);
  *sink = i;
}

/// Reads every element of p (into L2), storing nothing unless the sum is a value it never is.
__global__ void touch_kernel(const unsigned* p, std::size_t n, unsigned* sink) {
  unsigned acc = 0;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    acc += __ldcg(p + i);
  if (acc == 0xffffffffu) sink[1] = acc;
}

/// ns per dependent load through a random cycle over `bytes`; `warm`: the whole array read into
/// L2 before each timing (it must fit), else each timing walks lines no timing walked before
/// (device memory when the array is well over L2). sink: two unsigned of device memory.
double chase_ns(cudaStream_t s, std::size_t bytes, unsigned* sink, bool warm) {
  const std::size_t len = bytes / sizeof(unsigned);
  std::vector<unsigned> order(len), next(len);
  for (std::size_t i = 0; i < len; ++i) order[i] = static_cast<unsigned>(i);
  std::uint64_t seed = 12345;
  for (std::size_t i = len - 1; i > 0; --i) {  // a random cycle, lines apart
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    std::swap(order[i], order[(seed >> 33) % (i + 1)]);
  }
  for (std::size_t i = 0; i < len; ++i) next[order[i]] = order[(i + 1) % len];
  unsigned* d = nullptr;
  check(cudaMalloc(&d, bytes), "cudaMalloc");
  check(cudaMemcpyAsync(d, next.data(), bytes, cudaMemcpyHostToDevice, s), "cudaMemcpy");
  check(cudaMemsetAsync(sink, 0, 2 * sizeof(unsigned), s), "cudaMemset");
  check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  auto run = [&](int steps) {
    return median_ms(
        s, [&] { chase_kernel<<<1, 1, 0, s>>>(d, steps, sink); },
        [&] {
          if (warm) touch_kernel<<<264, 256, 0, s>>>(d, len, sink);
        });
  };
  const double ns = per_rep_ms(run, 20000) * 1e6;
  cudaFree(d);
  return ns;
}

/// Thread 0 of block 0 stamps %globaltimer into *at (not null); every thread then spins until
/// `ns` nanoseconds have passed since it started (a stage's few µs of work).
__device__ void stamp_and_spin(unsigned long long* at, unsigned ns) {
  unsigned long long t0, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  if (at && blockIdx.x == 0 && threadIdx.x == 0) *at = t0;
  do asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  while (now - t0 < ns);
}

/// stamp_and_spin into t[slot] (slot < 0: no stamp).
__global__ void root_kernel(unsigned long long* t, int slot, unsigned ns) {
  stamp_and_spin(slot >= 0 ? t + slot : nullptr, ns);
}

/// The streams a captured graph's chains run on: per chain a stream and the event that joins it
/// back, and the fork event the chains wait for (destroyed with it).
struct ChainLanes {
  std::vector<cudaStream_t> lanes;
  std::vector<cudaEvent_t> joins;
  cudaEvent_t fork = nullptr;
  explicit ChainLanes(int n) : lanes(static_cast<std::size_t>(n)), joins(static_cast<std::size_t>(n)) {
    check(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming), "cudaEventCreate");
    for (std::size_t r = 0; r < lanes.size(); ++r) {
      check(cudaStreamCreateWithFlags(&lanes[r], cudaStreamNonBlocking), "cudaStreamCreate");
      check(cudaEventCreateWithFlags(&joins[r], cudaEventDisableTiming), "cudaEventCreate");
    }
  }
  ~ChainLanes() {
    for (std::size_t r = 0; r < lanes.size(); ++r) {
      cudaStreamDestroy(lanes[r]);
      cudaEventDestroy(joins[r]);
    }
    cudaEventDestroy(fork);
  }
  ChainLanes(const ChainLanes&) = delete;
  ChainLanes& operator=(const ChainLanes&) = delete;
};

double median_of(std::vector<double>& v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// When a replayed graph starts its independent chains: `roots` chains of `len` kernels (`blocks`
/// blocks of 128 threads, 2 µs each), each captured on a stream of its own in turn and joined at
/// the end; with `kickoff` an empty one-block kernel first that every chain waits for (one root).
/// Per replay the start of each chain's first kernel; medians over the replays of the first
/// captured chain's start after the earliest chain's and of the latest start after the earliest.
struct RootSkew {
  double first_us = -1.0, spread_us = -1.0;
};
RootSkew root_skew(cudaStream_t s, int roots, int len, int blocks, bool kickoff, unsigned long long* t) {
  const ChainLanes c(roots);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "capture");
  if (kickoff) root_kernel<<<1, 32, 0, s>>>(t, -1, 0);
  check(cudaEventRecord(c.fork, s), "cudaEventRecord");
  for (int r = 0; r < roots; ++r) {
    cudaStream_t l = c.lanes[std::size_t(r)];
    check(cudaStreamWaitEvent(l, c.fork, 0), "cudaStreamWaitEvent");
    for (int k = 0; k < len; ++k) root_kernel<<<blocks, 128, 0, l>>>(t, k == 0 ? r : -1, 2000);
    check(cudaEventRecord(c.joins[std::size_t(r)], l), "cudaEventRecord");
    check(cudaStreamWaitEvent(s, c.joins[std::size_t(r)], 0), "cudaStreamWaitEvent");
  }
  check(cudaStreamEndCapture(s, &graph), "end capture");
  check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  check(cudaGraphUpload(exec, s), "upload");
  std::vector<double> first, spread;
  std::vector<unsigned long long> h(static_cast<std::size_t>(roots));
  for (int rep = 0; rep < 210; ++rep) {
    check(cudaGraphLaunch(exec, s), "graph launch");
    check(cudaMemcpyAsync(h.data(), t, h.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost, s), "cudaMemcpy");
    check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    if (rep < 10) continue;  // warm-up
    const auto [lo, hi] = std::minmax_element(h.begin(), h.end());
    first.push_back(static_cast<double>(h[0] - *lo) * 1e-3);
    spread.push_back(static_cast<double>(*hi - *lo) * 1e-3);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return RootSkew{median_of(first), median_of(spread)};
}

/// The root chains' start in replays queued back to back, as `dqn bench` and training replay the
/// step (root_skew synchronises after each replay, so its graph starts on an idle GPU): `roots`
/// chains of three kernels as root_skew's; with `origin` the first chain on the capturing stream
/// itself, as the engine captures its lane 0 (the online trunk), the others on streams of their
/// own; with `pdl` every kernel launched with programmatic stream serialization (as the step's
/// kernels are) and waiting for its predecessor (griddepcontrol.wait); with `kickoff` the empty
/// kernel first. A last kernel on the capturing stream stamps the replay's end and counts the
/// replay (the stamps' row). Medians over the replays after the first ten: the first captured
/// chain's start after the earliest, the latest start after the earliest, and the earliest start
/// after the previous replay's end.
__global__ void queued_kernel(unsigned long long* t, const unsigned* count, int stride, int slot, unsigned ns,
                              bool pdl) {
  if (pdl) asm volatile("griddepcontrol.wait;" ::: "memory");
  stamp_and_spin(slot >= 0 ? t + static_cast<std::size_t>(*count) * stride + slot : nullptr, ns);
}

__global__ void queued_tail_kernel(unsigned long long* t, unsigned* count, int stride, int slot, bool pdl) {
  if (pdl) asm volatile("griddepcontrol.wait;" ::: "memory");
  unsigned long long now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  t[static_cast<std::size_t>(*count) * stride + slot] = now;
  *count += 1;
}

struct QueuedSkew {
  double first_us = -1.0, spread_us = -1.0, gap_us = -1.0;
};
QueuedSkew queued_skew(cudaStream_t s, int roots, int blocks, bool origin, bool pdl, bool kickoff) {
  constexpr int kReps = 210, kLen = 3;
  const int stride = roots + 1;  // the chains' first stamps, then the replay's end
  unsigned long long* t = nullptr;
  unsigned* count = nullptr;
  check(cudaMalloc(&t, sizeof(unsigned long long) * kReps * static_cast<std::size_t>(stride)), "cudaMalloc");
  check(cudaMalloc(&count, sizeof(unsigned)), "cudaMalloc");
  const ChainLanes c(roots);
  auto launch = [&](cudaStream_t st, auto kernel, unsigned grid, auto... args) {
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(128);
    cfg.stream = st;
    cfg.attrs = &attr;
    cfg.numAttrs = pdl ? 1 : 0;
    check(cudaLaunchKernelEx(&cfg, kernel, args...), "queued launch");
  };
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "capture");
  if (kickoff) launch(s, queued_kernel, 1u, t, static_cast<const unsigned*>(count), stride, -1, 0u, pdl);
  check(cudaEventRecord(c.fork, s), "cudaEventRecord");
  for (int r = 0; r < roots; ++r) {
    cudaStream_t l = origin && r == 0 ? s : c.lanes[std::size_t(r)];
    if (l != s) check(cudaStreamWaitEvent(l, c.fork, 0), "cudaStreamWaitEvent");
    for (int k = 0; k < kLen; ++k)
      launch(l, queued_kernel, static_cast<unsigned>(blocks), t, static_cast<const unsigned*>(count), stride,
             k == 0 ? r : -1, 2000u, pdl);
    if (l != s) {
      check(cudaEventRecord(c.joins[std::size_t(r)], l), "cudaEventRecord");
      check(cudaStreamWaitEvent(s, c.joins[std::size_t(r)], 0), "cudaStreamWaitEvent");
    }
  }
  launch(s, queued_tail_kernel, 1u, t, count, stride, roots, pdl);
  check(cudaStreamEndCapture(s, &graph), "end capture");
  check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  check(cudaGraphUpload(exec, s), "upload");
  check(cudaMemsetAsync(count, 0, sizeof(unsigned), s), "cudaMemset");
  for (int rep = 0; rep < kReps; ++rep) check(cudaGraphLaunch(exec, s), "graph launch");
  std::vector<unsigned long long> h(static_cast<std::size_t>(kReps) * stride);
  check(cudaMemcpyAsync(h.data(), t, h.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost, s), "cudaMemcpy");
  check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  std::vector<double> first, spread, gap;
  for (int rep = 10; rep < kReps; ++rep) {
    const unsigned long long* row = h.data() + static_cast<std::size_t>(rep) * stride;
    const auto [lo, hi] = std::minmax_element(row, row + roots);
    first.push_back(static_cast<double>(row[0] - *lo) * 1e-3);
    spread.push_back(static_cast<double>(*hi - *lo) * 1e-3);
    const unsigned long long last_end = h[static_cast<std::size_t>(rep - 1) * stride + roots];
    gap.push_back((static_cast<double>(*lo) - static_cast<double>(last_end)) * 1e-3);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaFree(t);
  cudaFree(count);
  return QueuedSkew{median_of(first), median_of(spread), median_of(gap)};
}

/// One GEMM of the C51 step's critical path in the engine's row-major terms: C[m × n] from A[m × k]
/// and the weights, as the engine hands it to cuBLASLt (operands swapped, column-major): `tn` the
/// forward (C = A·Wᵀ, W [n × k]), `nn` a d(input) (C = A·W, W [k × n]), `nt` a weight gradient
/// (C = Aᵀ·X over k batch rows: A [k × m], X [k × n]); `batch` > 1: that many independent
/// problems in one strided launch (the branches' layers).
struct PathGemm {
  const char* what;
  char kind;  // 't' tn, 'n' nn, 'w' nt
  int m, n, k, batch;
};

/// One PathGemm set up for cuBLASLt (its descriptor, layouts, operands and the heuristic's first
/// eight algorithms), enqueued with `algo`.
struct LtGemm {
  cublasLtHandle_t lt = nullptr;
  void* ws = nullptr;
  std::size_t ws_bytes = 0;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  float *a = nullptr, *b = nullptr, *c = nullptr;
  cublasLtMatmulAlgo_t algos[8] = {};
  int n_algos = 0;
  int algo = -1;  // the fastest alone (set by gemm_alone_us)

  LtGemm(cudaStream_t s, cublasLtHandle_t h, void* w, std::size_t wb, const PathGemm& g) : lt(h), ws(w), ws_bytes(wb) {
    // cuBLAS's column-major problem: D (mm × nn) = op(A) · op(B) with our C = D in row-major.
    const int mm = g.n, nn = g.m, kk = g.k;
    cublasOperation_t op_a = CUBLAS_OP_N, op_b = CUBLAS_OP_N;
    int a_rows = mm, a_cols = kk, b_rows = kk, b_cols = nn;
    if (g.kind == 't') {  // A = W stored [n × k] row-major = (k × n) col-major, transposed; B = our A (k × m)
      op_a = CUBLAS_OP_T;
      a_rows = kk;
      a_cols = mm;
    } else if (g.kind == 'w') {  // A = X (n × k col-major from [k × n] row-major); B = our A [k × m] → (m × k)ᵀ
      op_b = CUBLAS_OP_T;
      b_rows = nn;
      b_cols = kk;
    }
    const std::int64_t sa = std::int64_t(a_rows) * a_cols, sb = std::int64_t(b_rows) * b_cols,
                       sc = std::int64_t(mm) * nn;
    check(cudaMalloc(&a, sizeof(float) * sa * g.batch), "cudaMalloc");
    check(cudaMalloc(&b, sizeof(float) * sb * g.batch), "cudaMalloc");
    check(cudaMalloc(&c, sizeof(float) * sc * g.batch), "cudaMalloc");
    check(cudaMemsetAsync(a, 0, sizeof(float) * sa * g.batch, s), "cudaMemset");
    check(cudaMemsetAsync(b, 0, sizeof(float) * sb * g.batch, s), "cudaMemset");
    check_lt(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F), "desc");
    check_lt(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a), "transa");
    check_lt(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b), "transb");
    auto layout = [&](cublasLtMatrixLayout_t* l, int rows, int cols, std::int64_t stride) {
      check_lt(cublasLtMatrixLayoutCreate(l, CUDA_R_32F, std::uint64_t(rows), std::uint64_t(cols), rows), "layout");
      if (g.batch > 1) {
        const std::int32_t count = g.batch;
        check_lt(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count), "batch");
        check_lt(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride),
                 "stride");
      }
    };
    layout(&la, a_rows, a_cols, sa);
    layout(&lb, b_rows, b_cols, sb);
    layout(&lc, mm, nn, sc);
    cublasLtMatmulPreference_t pref = nullptr;
    check_lt(cublasLtMatmulPreferenceCreate(&pref), "preference");
    const std::uint64_t wsb = ws_bytes;
    check_lt(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb), "ws");
    cublasLtMatmulHeuristicResult_t found[8];
    int n_found = 0;
    check_lt(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 8, found, &n_found), "heuristic");
    cublasLtMatmulPreferenceDestroy(pref);
    for (int i = 0; i < n_found; ++i)
      if (found[i].state == CUBLAS_STATUS_SUCCESS) algos[n_algos++] = found[i].algo;
  }
  ~LtGemm() {
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(desc);
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
  }
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  cublasStatus_t enqueue(cudaStream_t s, int i) const {
    const float alpha = 1.0f, beta = 0.0f;
    return cublasLtMatmul(lt, desc, &alpha, a, la, b, lb, &beta, c, lc, c, lc, &algos[i], ws, ws_bytes, s);
  }
};

/// µs per GEMM of a captured chain of `len` g's (each reading the same operands and writing the
/// same C, so stream order alone chains them), replayed `reps` times; the fastest of g's
/// algorithms (each timed the same way), which g keeps. -1: no algorithm ran.
double gemm_alone_us(cudaStream_t s, LtGemm& g, int len = 16, int reps = 100) {
  double best = -1.0;
  for (int i = 0; i < g.n_algos; ++i) {
    if (g.enqueue(s, i) != CUBLAS_STATUS_SUCCESS || cudaStreamSynchronize(s) != cudaSuccess) {
      cudaGetLastError();
      continue;  // this algorithm does not run here
    }
    const double us = replayed_us(
        s,
        [&] {
          for (int j = 0; j < len; ++j) check_lt(g.enqueue(s, i), "matmul");
        },
        len, reps);
    if (best < 0 || us < best) {
      best = us;
      g.algo = i;
    }
  }
  return best;
}

/// µs per pair of a captured chain of `len` pairs: x on `s` and, beside it, y on a stream of its
/// own (forked at the start, joined at the end), as the step runs the online network's layer and
/// the target network's; each with its fastest algorithm alone. -1: either has none.
double gemm_pair_us(cudaStream_t s, const LtGemm& x, const LtGemm& y, int len = 16, int reps = 100) {
  if (x.algo < 0 || y.algo < 0) return -1.0;
  const ChainLanes side(1);
  return replayed_us(
      s,
      [&] {
        check(cudaEventRecord(side.fork, s), "cudaEventRecord");
        check(cudaStreamWaitEvent(side.lanes[0], side.fork, 0), "cudaStreamWaitEvent");
        for (int j = 0; j < len; ++j) {
          check_lt(x.enqueue(s, x.algo), "matmul");
          check_lt(y.enqueue(side.lanes[0], y.algo), "matmul");
        }
        check(cudaEventRecord(side.joins[0], side.lanes[0]), "cudaEventRecord");
        check(cudaStreamWaitEvent(s, side.joins[0], 0), "cudaStreamWaitEvent");
      },
      len, reps);
}

/// The GEMMs on the C51 step's critical path at B = 256 (pipelines/ref.yaml: state 64, trunk
/// 256 × 256, head 128, 3 branches × 5 actions × 51 atoms), as dqn-trace lists it: the online
/// forward over states and next states (512 rows), the backward over the batch's 256, and the
/// step's last gradient (trunk.1's weights, beside trunk.0's, which end with them).
const PathGemm kPathGemms[] = {
    {"trunk.0 forward, 512 x 256, k 64 (tn)", 't', 512, 256, 64, 1},
    {"trunk.1 forward, 512 x 256, k 256 (tn)", 't', 512, 256, 256, 1},
    {"head hidden forward, 512 x 512, k 256 (tn)", 't', 512, 512, 256, 1},
    {"branch output forward, 3 x 512 x 255, k 128 (tn)", 't', 512, 255, 128, 3},
    {"branch output d(input), 3 x 256 x 128, k 255 (nn)", 'n', 256, 128, 255, 3},
    {"head hidden d(input), 256 x 256, k 512 (nn)", 'n', 256, 256, 512, 1},
    {"trunk.1 d(input), 256 x 256, k 256 (nn)", 'n', 256, 256, 256, 1},
    {"trunk.1 weights, 256 x 256, k 256 (nt)", 'w', 256, 256, 256, 1},
};

/// The forward's four GEMMs as the step runs them, the online network's (states and next states,
/// 512 rows) beside the target network's (next states, 256 rows), against both as one strided
/// launch (the target over 512 rows too, so that the two problems have one shape): what merging
/// the two networks' layers would trade.
struct ForwardPair {
  const char* what;
  PathGemm online, target, merged;
};
const ForwardPair kForwardPairs[] = {
    {"trunk.0", {"", 't', 512, 256, 64, 1}, {"", 't', 256, 256, 64, 1}, {"", 't', 512, 256, 64, 2}},
    {"trunk.1", {"", 't', 512, 256, 256, 1}, {"", 't', 256, 256, 256, 1}, {"", 't', 512, 256, 256, 2}},
    {"head hidden", {"", 't', 512, 512, 256, 1}, {"", 't', 256, 512, 256, 1}, {"", 't', 512, 512, 256, 2}},
    {"branch output", {"", 't', 512, 255, 128, 3}, {"", 't', 256, 255, 128, 3}, {"", 't', 512, 255, 128, 6}},
};

}  // namespace

int main(int argc, char** argv) {
  bool json = false, roots_only = false, gemm_only = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) {
      json = true;
    } else if (std::strcmp(argv[i], "--roots") == 0) {
      roots_only = true;
    } else if (std::strcmp(argv[i], "--gemm") == 0) {
      gemm_only = true;
    } else {
      std::fprintf(stderr, "dqn-latency: unknown argument '%s'\nusage: dqn-latency [--json] [--roots | --gemm]\n",
                   argv[i]);
      return 2;
    }
  }
  if (roots_only && gemm_only) {
    std::fprintf(stderr, "dqn-latency: --roots and --gemm each choose one group of rows: give one\n");
    return 2;
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::fprintf(stderr, "dqn-latency: no CUDA device\n");
    return 1;
  }
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, 0), "cudaGetDeviceProperties");
  const int sms = p.multiProcessorCount;
  cudaStream_t s;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  int* x = nullptr;
  unsigned* flags = nullptr;
  check(cudaMalloc(&x, sizeof(int) * 128 * 2 * static_cast<std::size_t>(sms)), "cudaMalloc");
  check(cudaMemsetAsync(x, 0, sizeof(int) * 128 * 2 * static_cast<std::size_t>(sms), s), "cudaMemset");
  check(cudaMalloc(&flags, sizeof(unsigned) * (2 * static_cast<std::size_t>(sms) + 1)), "cudaMalloc");
  int max_coop = 0;
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&max_coop, barrier_kernel<false>, 128, 0), "occupancy");

  std::vector<std::pair<std::string, double>> rows;
  if (!roots_only) {  // the C51 path's GEMMs, each alone in a chain (--gemm: only these rows)
    cublasLtHandle_t lt = nullptr;
    check_lt(cublasLtCreate(&lt), "cublasLtCreate");
    constexpr std::size_t kWs = std::size_t{8} << 20;  // as the engine's cuBLASLt workspace per lane
    void* ws = nullptr;
    check(cudaMalloc(&ws, kWs), "cudaMalloc");
    // a sum of figures, -1 (no figure) if any of them is
    auto add = [](double& sum, double us) { sum = sum < 0 || us < 0 ? -1.0 : sum + us; };
    double sum = 0.0;
    for (const PathGemm& g : kPathGemms) {
      LtGemm lg(s, lt, ws, kWs, g);
      const double us = gemm_alone_us(s, lg);
      rows.emplace_back(std::string("GEMM alone in a chain: ") + g.what + " (us)", us);
      add(sum, us);
    }
    rows.emplace_back("GEMM alone in a chain: the eight above, summed (us)", sum);
    double pairs = 0.0, merged = 0.0;
    for (const ForwardPair& f : kForwardPairs) {
      LtGemm on(s, lt, ws, kWs, f.online), tg(s, lt, ws, kWs, f.target), mg(s, lt, ws, kWs, f.merged);
      gemm_alone_us(s, on);
      gemm_alone_us(s, tg);
      const double pair = gemm_pair_us(s, on, tg), one = gemm_alone_us(s, mg);
      rows.emplace_back(std::string("forward ") + f.what + ": online beside target, two launches (us)", pair);
      rows.emplace_back(std::string("forward ") + f.what + ": online and target in one launch (us)", one);
      add(pairs, pair);
      add(merged, one);
    }
    rows.emplace_back("forward, the four layers summed: online beside target (us)", pairs);
    rows.emplace_back("forward, the four layers summed: in one launch each (us)", merged);
    cudaFree(ws);
    cublasLtDestroy(lt);
  }
  if (!roots_only && !gemm_only) {  // --roots: only the graph-root rows below
    for (const int blocks : {1, sms, 2 * sms})
      for (const bool pdl : {false, true})
        rows.emplace_back("kernel boundary in a graph, " + std::to_string(blocks) + " blocks" + (pdl ? ", PDL" : "") +
                              " (us)",
                          chain_us(s, x, blocks, pdl));
    for (const int blocks : {sms, 2 * sms})
      if (blocks <= max_coop * sms)
        rows.emplace_back("grid barrier, " + std::to_string(blocks) + " blocks (us)", grid_barrier_us(s, blocks, x));
    for (const int cs : {2, 8, 16})
      rows.emplace_back("cluster barrier, clusters of " + std::to_string(cs) + " (us)",
                        cluster_barrier_us(s, cs, std::max(1, sms / cs), x));
    rows.emplace_back("flag hand-off to the next SM (us)", flag_hop_us(s, sms, flags));
    rows.emplace_back("dependent load, 4 MiB (L2) (ns)", chase_ns(s, std::size_t{4} << 20, flags, true));
    rows.emplace_back("dependent load, 256 MiB (device memory) (ns)",
                      chase_ns(s, std::size_t{256} << 20, flags, false));
  }
  if (!gemm_only) {
    unsigned long long* stamps = nullptr;
    check(cudaMalloc(&stamps, sizeof(unsigned long long) * 16), "cudaMalloc");
    for (const bool kickoff : {false, true})
      for (const int roots : {2, 6, 16}) {
        const RootSkew k = root_skew(s, roots, 3, sms, kickoff, stamps);
        const std::string what = "graph of " + std::to_string(roots) + " chains" + (kickoff ? " after a kickoff" : " (roots)");
        rows.emplace_back(what + ": first captured starts after the earliest (us)", k.first_us);
        rows.emplace_back(what + ": latest start after the earliest (us)", k.spread_us);
      }
    cudaFree(stamps);
    for (const int roots : {2, 6})
      for (const int mode : {0, 1, 2, 3}) {  // as root_skew's; the first chain on the capturing stream; + PDL; + kickoff
        const bool origin = mode >= 1, pdl = mode >= 2, kickoff = mode == 3;
        const QueuedSkew q = queued_skew(s, roots, sms, origin, pdl, kickoff);
        const std::string what = "queued replays, " + std::to_string(roots) + " chains" +
                                 (origin ? ", the first on the capturing stream" : "") + (pdl ? ", PDL" : "") +
                                 (kickoff ? ", after a kickoff" : "");
        rows.emplace_back(what + ": first captured starts after the earliest (us)", q.first_us);
        rows.emplace_back(what + ": latest start after the earliest (us)", q.spread_us);
        rows.emplace_back(what + ": earliest start after the last replay's end (us)", q.gap_us);
      }
  }

  if (json) {
    std::printf("{\"device\": \"%s\", \"sms\": %d, \"rows\": [", p.name, sms);
    for (std::size_t i = 0; i < rows.size(); ++i)
      std::printf("%s{\"what\": \"%s\", \"value\": %.4f}", i ? ", " : "", rows[i].first.c_str(), rows[i].second);
    std::printf("]}\n");
  } else {
    std::printf("dqn-latency on %s (%d SMs); medians of 5 runs\n", p.name, sms);
    for (const auto& [what, v] : rows) {
      if (v < 0) std::printf("  %-62s %10s\n", what.c_str(), "n/a");
      else std::printf("  %-62s %10.3f\n", what.c_str(), v);
    }
  }
  cudaFree(x);
  cudaFree(flags);
  cudaStreamDestroy(s);
  return 0;
}
