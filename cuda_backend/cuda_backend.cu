/** @file cuda_backend.cu
 *  @brief The CUDA runtime (one non-blocking stream, cuBLAS/cuBLASLt with an explicit workspace,
 *  the arena, planned scratch, graph capture and replay, pinned report copies) and its op table.
 *  Ops never allocate, synchronise or read device memory from the host, so any sequence of them
 *  can be captured into one graph as it is.
 */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <compare>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "cuda_kernels.cuh"
#include "device_util.cuh"
#include "head_kernels.cuh"
#include "dqn/runtime.hpp"

namespace dqn {
namespace {

constexpr std::size_t kWorkspaceBytes = std::size_t{8} << 20;        // cuBLAS + cuBLASLt, per lane
constexpr std::size_t kInitialScratchBytes = std::size_t{4} << 20;   // per lane, usable without a plan
constexpr int kReportSlots = 64;
constexpr int kMaxLanes = 16;                                         // concurrent streams of a captured step
/// Stream slots: one per lane, then one side slot per lane (kMaxLanes + lane) on which an op of
/// that lane may run a part of itself beside the rest (head_forward's value GEMM).
constexpr int kSlots = 2 * kMaxLanes;
constexpr std::size_t kCounterBytes = kSlots * 32 * sizeof(unsigned);  // one 128-byte slot each

std::string where(const char* file, int line, int device) {
  return std::string(" at ") + file + ":" + std::to_string(line) + " (cuda device " + std::to_string(device) + ")";
}

std::string cuda_text(cudaError_t e, const char* stmt, const char* file, int line, int device) {
  return std::string(stmt) + " failed: " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")" +
         where(file, line, device);
}

std::string cublas_text(cublasStatus_t s, const char* stmt, const char* file, int line, int device) {
  return std::string(stmt) + " failed: " + cublasGetStatusName(s) + " (" + cublasGetStatusString(s) + ")" +
         where(file, line, device);
}

std::size_t round_up(std::size_t x, std::size_t a) { return (x + a - 1) / a * a; }

/// The largest power of two (at most 256) dividing the address and, when batched, the batch stride.
std::uint32_t alignment_of(const void* p, std::int64_t stride_bytes) {
  const std::uintptr_t x = reinterpret_cast<std::uintptr_t>(p) | static_cast<std::uintptr_t>(stride_bytes);
  if (x == 0) return 256;
  return static_cast<std::uint32_t>(std::min<std::uintptr_t>(x & (~x + 1), 256));
}

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::fp32: return "fp32";
    case Precision::tf32: return "tf32";
    case Precision::bf16: return "bf16";
  }
  return "?";
}

/// One column-major problem for cuBLASLt (the row-major Gemm with operands swapped), the key of
/// the descriptor/heuristic cache: everything the algorithm choice depends on except pointers.
struct LtKey {
  int op_a = 0, op_b = 0, m = 0, n = 0, k = 0;
  std::int64_t lda = 0, ldb = 0, ldc = 0;
  int batch = 1;
  std::int64_t stride_a = 0, stride_b = 0, stride_c = 0;
  int ab_type = 0;
  std::uint32_t align_a = 0, align_b = 0, align_c = 0;
  bool beta_zero = true;
  /// The fused epilogue (CUBLASLT_EPILOGUE_DEFAULT: none) and, with a bias, the bias vector's
  /// alignment (its address and batch stride) and batch stride in elements.
  int epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  std::uint32_t align_bias = 0;
  std::int64_t stride_bias = 0;
  /// Gemm::batch2 (tile_gemm's keys only: the library runs such a call entry by entry).
  int batch2 = 1;
  std::int64_t stride2_a = 0, stride2_b = 0, stride2_c = 0, stride2_bias = 0;
  auto operator<=>(const LtKey&) const = default;
};

/// Most algorithms asked of the heuristic (and timed, when autotuning) per GEMM key.
constexpr int kMaxAlgos = 8;
/// Autotuning: each candidate runs kTuneReps times in one small graph, timed kTuneSamples times
/// (the median counts); another candidate replaces the current best only when it is faster by
/// more than kTuneMargin (so near-ties keep the heuristic's order and choices are stabler).
constexpr int kTuneReps = 8, kTuneSamples = 5;
constexpr float kTuneMargin = 0.03f;
/// With DQN_GEMM_TUNE_SPLIT_K=1, autotuning also times split-k variants (k cut into 2 or 4
/// slices, summed in the workspace in a fixed order) of the heuristic's first kSplitKBase
/// algorithms, when each slice keeps at least kSplitKMinSlice of k: the step's GEMMs are small in
/// m·n (a few 64×64 tiles for 132 SMs) and the heuristic ranks by throughput, not by the latency
/// a step sees.
constexpr int kSplitKBase = 4, kSplitKMinSlice = 64;

/// A named wrapper: nvcc's front end trips over std containers of the anonymous-struct typedef.
struct LtAlgo {
  cublasLtMatmulAlgo_t algo;
};

struct LtPlan {
  /// false: no cuBLASLt algorithm was found (or, for a fused key, none runs the epilogue here):
  /// cublasGemmStridedBatchedEx instead (a fused key: the plain key's plan, then bias_act).
  bool use_lt = false;
  bool has_bias = false;  ///< the epilogue reads a bias: BIAS_POINTER is set before each call
  /// The algorithm is fixed for good: tuned, taken from the process's tuned choices, used by a
  /// real run or a capture, or there was nothing to choose from. Never changes afterwards.
  bool decided = false;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo{};
  std::vector<LtAlgo> candidates;  ///< the heuristic's, best first; emptied once decided
  void release() noexcept {
    if (desc) cublasLtMatmulDescDestroy(desc);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    desc = nullptr;
    la = lb = lc = nullptr;
  }
};

using cuda::env_on;

/// A switch that is off unless set (to anything env_on takes for on).
bool env_set(const char* name) noexcept { return std::getenv(name) && env_on(name); }
/// A three-way switch: `unset` where `name` is unset or empty, else `on` (env_on) or `off`.
template <class Mode>
Mode mode_from_env(const char* name, Mode unset, Mode on, Mode off) noexcept {
  const char* v = std::getenv(name);
  if (!v || !*v) return unset;
  return env_on(name) ? on : off;
}
/// Whether the variable is set to exactly `value`.
bool env_is(const char* name, const char* value) noexcept {
  const char* v = std::getenv(name);
  return v && std::strcmp(v, value) == 0;
}

/// DQN_GEMM_AUTOTUNE=0 keeps the heuristic's first algorithm for every GEMM.
bool autotune_from_env() noexcept { return env_on("DQN_GEMM_AUTOTUNE"); }
/// DQN_GEMM_TUNE_SPLIT_K=1 lets autotuning also time cuBLASLt split-k variants (off unless set:
/// on the H200 the C51 step measured 123.5 µs with them against 122.9 without).
bool tune_split_k_from_env() noexcept { return env_set("DQN_GEMM_TUNE_SPLIT_K"); }
/// DQN_UPDATE_STAGE, _GATHER, _KEEPW, _PUSH: unset (or empty) → fit, 0/off → off, anything else
/// → on.
cuda::FitMode fit_mode_from_env(const char* name) noexcept {
  return mode_from_env(name, cuda::FitMode::fit, cuda::FitMode::on, cuda::FitMode::off);
}
/// The cluster update's options from the environment (cuda::UpdateOptions; the same results in
/// every way), read per backend:
/// - DQN_UPDATE_EARLY (on unless 0/off): the first tile's optimizer state loaded before the wait.
///   Faster or equal in every measurement: on the H200 (2026-12-05, three processes each)
///   86.5-87.2 µs against 86.9-88.0 for the C51 step and 247.8-248.1 against 248.6-253.1 with all
///   four heads; on an H100 86.1 / 257.6 against 86.2 / 258.3 (one each).
/// - DQN_UPDATE_STAGE: a normed block's second tile staged in shared memory, Wᵀu summed from
///   registers; DQN_UPDATE_GATHER: Wᵀu summed in column shares over the cluster and gathered, σ's
///   sum by one warp. Unset: where the grid is resident at once (the C51 step, not the four
///   heads'); 1 always, 0/off never. On an H100 (2026-12-05, three processes each): C51 85.5-85.9
///   µs with both against 86.7-86.9 with neither; with all four heads gathering alone 255.2-255.7
///   against 252.9-255.2 with neither, both 255.1-256.8.
/// - DQN_UPDATE_KEEPW (with the staging area): a normed block keeps its rows of the new θ (and a
///   two-tile block its rows' old target) in shared memory for the power iteration and the
///   scaling and target update; DQN_UPDATE_PUSH: the power iteration's cluster sums stored into
///   every block's slots instead of loaded from each other (replaces gathering). Unset: where the
///   grid is resident at once with them; 1 always, 0/off never. On an H100 (2026-12-05, three
///   processes each): C51 82.94-84.06 µs with both against 84.03-85.89 with keeping alone and
///   84.41-86.33 with neither.
/// - DQN_UPDATE_ONEHEAD (on unless 0/off): with one head g = c·g₀ in float, the bits of the
///   double sum without its conversions. On an H100: C51 83.89, 84.23, 84.36 µs against 84.44,
///   84.42, 84.55 off (trunk.1's Adam phase 0.2 µs shorter in the update's clock).
/// - DQN_UPDATE_DEFER_THETA (on unless 0/off): a normed block keeping its rows' new θ in shared
///   memory stores it once, after the power iteration. On an H100: C51 82.82, 82.91, 82.90 µs against 82.96, 83.62,
///   83.05 off.
/// - DQN_UPDATE_WIDE: the normed matrices whose blocks hold more than one tile (the C51 step's
///   trunk.1, whose Adam over two tiles ended the update) in a launch of their own beside the main
///   one, on the lane's side slot, in blocks of 512 threads (one tile a thread; the same bits; one
///   graph node more). Unset: where the whole update is resident at once with it (the C51 step,
///   not the four heads'); 1 always, 0/off never. On an H200 (2026-12-05, three processes each):
///   C51 84.23, 84.29, 84.19 µs against 85.86, 85.65, 84.93 without; all four heads (with it
///   always) 255.77, 256.01, 259.03 against 251.77, 248.78, 248.72. (Measured in the same call and
///   removed: DQN_UPDATE_ONELOOP, one copy of a tile's code, 85.71 / 248.63; DQN_UPDATE_FLAT, a
///   tile's Adam as one stretch of arithmetic, 84.98 / 253.27, and 84.35 / 257.39 with the wide
///   launch, no better than the wide launch alone.)
cuda::UpdateOptions update_options_from_env() noexcept {
  cuda::UpdateOptions o;
  o.early = env_on("DQN_UPDATE_EARLY");
  o.stage = fit_mode_from_env("DQN_UPDATE_STAGE");
  o.gather = fit_mode_from_env("DQN_UPDATE_GATHER");
  o.keepw = fit_mode_from_env("DQN_UPDATE_KEEPW");
  o.push = fit_mode_from_env("DQN_UPDATE_PUSH");
  o.one = env_on("DQN_UPDATE_ONEHEAD");
  o.defer = env_on("DQN_UPDATE_DEFER_THETA");
  o.wide = fit_mode_from_env("DQN_UPDATE_WIDE");
  return o;
}

/// How the update (budget, Adam, spectral norm, target update) runs, from DQN_FUSED_UPDATE: unset
/// or cluster → two launches (partial sums; thread-block clusters, one per normed matrix, and more
/// for the other elements) where the device launches clusters and the normed matrices are
/// disjoint ranges inside params, else the four ops (with all four heads the cluster update
/// measured 3.4 µs faster than the four ops: 276.5 against 279.9 µs, three processes each);
/// 0/off → the four ops as they are (six launches). The same results either way, but for the
/// cluster update's power iteration, which sums in another order (update_cluster()). (One
/// cooperative launch, =1, and four launches, =split, measured slower in every run through the
/// seventh and were removed on 2026-12-05; anything but 0/off now means the cluster update.)
enum class UpdateMode { separate, cluster };
UpdateMode update_mode_from_env() noexcept {
  return std::getenv("DQN_FUSED_UPDATE") && !env_on("DQN_FUSED_UPDATE") ? UpdateMode::separate : UpdateMode::cluster;
}

/// DQN_LOSS_WARPS: c51_loss's warps a (sample, branch) where its warp kernel runs: unset or 2 →
/// two (each one of a lane's two atoms; D ≤ 8, else one), 1 → one. Two measured 89.3 µs against
/// 90.6 for the C51 step on the H200 (2026-12-05, two processes each; the loss 8.8 µs against
/// 10.2) and 249.5 against 248.1 with all four heads (247.0 and 251.9: within the rounds'
/// spread). Anything else is refused.
bool loss_pair_from_env() {
  const char* v = std::getenv("DQN_LOSS_WARPS");
  if (!v || !*v || std::strcmp(v, "2") == 0) return true;
  if (std::strcmp(v, "1") == 0) return false;
  throw std::invalid_argument(std::string("DQN_LOSS_WARPS='") + v + "': expected 1 or 2");
}

/// dueling_dist a warp per action where the warp kernels run (DQN_WARP_HEAD): where rows·D ≤
/// kDistPerActionPairs (unset or auto: the C51 primary's 512 rows × 3 branches at B = 256, not
/// the ensemble's 1,024 × 3), always (action), or never (row: a warp per (row, branch)
/// everywhere; 0/off keeps the block kernels, so never too). On the H200 (2026-12-05, two
/// processes each, C51 / all four heads at B = 256): a warp per (row, branch) 89.02 / 251.43
/// µs, auto 88.29 / 251.12; `action` had measured 90.10 / 255.40 against 90.62 / 248.13 (the
/// ensemble's rows slower per action).
enum class DistPerAction { never, always, small };
constexpr std::int64_t kDistPerActionPairs = 2048;
DistPerAction dist_per_action_from_env() noexcept {
  if (!env_on("DQN_WARP_HEAD") || env_is("DQN_WARP_HEAD", "row")) return DistPerAction::never;
  if (env_is("DQN_WARP_HEAD", "action")) return DistPerAction::always;
  return DistPerAction::small;
}

/// DQN_TILE_LDMATRIX: unset (or empty) → autotuning times each tile shape with and without
/// ldmatrix and keeps the faster (without autotuning: without); 0/off → never; anything else →
/// always. ldmatrix for every tile GEMM measured −1.2 µs for the C51 step and +2.0 with all four
/// heads on the H200 (2026-12-05, three processes each: 86.2 against 87.4, 250.6 against 248.6),
/// +0.2 and +4.7 on an H100 (one process): faster for some problems, slower for others.
enum class LdmMode { timed = 0, off = 1, on = 2 };
LdmMode ldm_mode_from_env() noexcept {
  return mode_from_env("DQN_TILE_LDMATRIX", LdmMode::timed, LdmMode::on, LdmMode::off);
}

/// DQN_UPDATE_CLUSTER=8 or 16: the cluster update's blocks per cluster (default: 16 where the
/// device schedules such clusters, else 8).
int cluster_size_from_env() noexcept {
  const char* v = std::getenv("DQN_UPDATE_CLUSTER");
  if (v && std::strcmp(v, "8") == 0) return 8;
  if (v && std::strcmp(v, "16") == 0) return 16;
  return 0;
}

/// Whether tf32 GEMMs may run on tile_gemm (the tensor-core kernel for small shapes), from
/// DQN_TILE_GEMM: unset → autotuning times its tile shapes against the cuBLASLt algorithm it chose
/// and keeps the fastest (with DQN_GEMM_AUTOTUNE=0: cuBLASLt); 0/off → cuBLASLt only; 1/on →
/// tile_gemm always, the fastest tile shape (the first without autotuning; the split-k shapes only
/// with DQN_TILE_SPLITK=1); 16x32, 32x32, 64x64, 32x32k2 or 32x32k4 → tile_gemm always, that shape
/// (for tests and comparisons). Other precisions: cuBLASLt.
struct TileMode {
  bool on = true;      ///< tile_gemm may run
  bool forced = false; ///< tile_gemm runs whenever it fits (never cuBLASLt)
  int config = -1;     ///< forced to this shape; -1: timed (or the first)
};
TileMode tile_mode_from_env() noexcept {
  TileMode t;
  const char* v = std::getenv("DQN_TILE_GEMM");
  if (!v || !*v) return t;
  if (!env_on("DQN_TILE_GEMM")) {
    t.on = false;
    return t;
  }
  for (int c = 0; c < cuda::kTileGemmConfigs; ++c)
    if (std::strcmp(v, cuda::tile_gemm_name(c)) == 0) t.config = c;
  t.forced = true;
  return t;
}

/// DQN_GEMM_SPLIT_K=0 runs tall-k GEMMs whole instead of split into slices (for comparisons).
bool split_k_from_env() noexcept { return env_on("DQN_GEMM_SPLIT_K"); }

/// Tuned choices, shared by every backend of the process: two engines built alike run the same
/// algorithms, so their results agree bit for bit (tuning itself is timing, hence noisy).
struct TunedAlgo {
  cublasComputeType_t compute;
  cublasLtMatmulAlgo_t algo;
};
using TuneKey = std::tuple<int, int, LtKey>;  // device, precision, problem
std::mutex& tuned_mutex() {
  static std::mutex m;
  return m;
}
std::map<TuneKey, TunedAlgo>& tuned_algos() {
  static std::map<TuneKey, TunedAlgo> m;
  return m;
}

/// The tile_gemm choice per problem (-1: cuBLASLt, else the tile shape), shared like tuned_algos.
std::map<TuneKey, int>& tuned_tiles() {
  static std::map<TuneKey, int> m;
  return m;
}

// Inside CudaBackend ops: record the first failure (statement, file:line, device) and go on.
#define DQN_CUDA_OK(op, stmt) cuda_ok((op), (stmt), #stmt, __FILE__, __LINE__)
#define DQN_CUBLAS_OK(op, stmt) cublas_ok((op), (stmt), #stmt, __FILE__, __LINE__)
// Outside ops (creation, runtime methods): throw with the same text.
#define DQN_CUDA_THROW(stmt) throw_cuda((stmt), #stmt, __FILE__, __LINE__, device_)
#define DQN_CUBLAS_THROW(stmt) throw_cublas((stmt), #stmt, __FILE__, __LINE__, device_)

void throw_cuda(cudaError_t e, const char* stmt, const char* file, int line, int device) {
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear a non-sticky error so later launch checks do not see it
    throw std::runtime_error("cuda: " + cuda_text(e, stmt, file, line, device));
  }
}

void throw_cublas(cublasStatus_t s, const char* stmt, const char* file, int line, int device) {
  if (s != CUBLAS_STATUS_SUCCESS) throw std::runtime_error("cuda: " + cublas_text(s, stmt, file, line, device));
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(Precision precision, int device) : precision_(precision), device_(device) {
    try {
      DQN_CUDA_THROW(cudaSetDevice(device));
      DQN_CUDA_THROW(cudaGetDeviceProperties(&props_, device));
      // One stream per slot (lane 0 is the runtime's stream; the others join a capture forked from
      // it). Each slot has its own slice of the library workspace and of the scratch, so ops on
      // different lanes may run concurrently.
      for (auto& st : streams_) DQN_CUDA_THROW(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
      for (auto& e : side_events_) DQN_CUDA_THROW(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      stream_ = streams_[0];
      DQN_CUBLAS_THROW(cublasCreate(&blas_));
      DQN_CUBLAS_THROW(cublasLtCreate(&lt_));
      DQN_CUDA_THROW(cudaMalloc(&workspace_base_, kWorkspaceBytes * kSlots));
      // Zeroed once: some cuBLASLt kernels read words of the workspace they have not written
      // (initcheck), whose values they do not use; zero keeps those reads defined.
      DQN_CUDA_THROW(cudaMemset(workspace_base_, 0, kWorkspaceBytes * kSlots));
      workspace_ = workspace_base_;
      note_device_bytes(kWorkspaceBytes * kSlots);
      // cublasSetStream resets the workspace to cuBLAS's own pool: set the stream first.
      DQN_CUBLAS_THROW(cublasSetStream(blas_, stream_));
      DQN_CUBLAS_THROW(cublasSetWorkspace(blas_, workspace_, kWorkspaceBytes));
      DQN_CUBLAS_THROW(cublasSetMathMode(blas_, precision == Precision::fp32 ? CUBLAS_PEDANTIC_MATH : CUBLAS_DEFAULT_MATH));
      DQN_CUDA_THROW(cudaMalloc(&scratch_base_, kInitialScratchBytes * kSlots));
      DQN_CUDA_THROW(cudaMemset(scratch_base_, 0, kInitialScratchBytes * kSlots));
      scratch_ = scratch_base_;
      // "last block done" counters, one slot per lane: 0 between kernels (each kernel resets its own)
      DQN_CUDA_THROW(cudaMalloc(&counters_, kCounterBytes));
      DQN_CUDA_THROW(cudaMemset(counters_, 0, kCounterBytes));
      note_device_bytes(kCounterBytes);
      scratch_bytes_ = kInitialScratchBytes;
      note_device_bytes(kInitialScratchBytes * kSlots);
      // tile_gemm's shared memory beyond 48 KiB, granted once (tf32 only; without it, cuBLASLt).
      if (precision_ == Precision::tf32 && tile_.on && cuda::tile_gemm_prepare() != cudaSuccess) {
        cudaGetLastError();
        tile_ = TileMode{false, false, -1};
      }
      // tile_gemm_wgrad (Gemm::wgrad_x in one launch, tf32): its shared memory and clusters, once.
      if (precision_ == Precision::tf32) {
        wgrad_kernel_ = cuda::tile_gemm_wgrad_prepare() == cudaSuccess;
        if (!wgrad_kernel_) cudaGetLastError();
        chain_kernel_ = cuda::tile_gemm_chain_prepare() == cudaSuccess;  // and tile_gemm_chain's
        if (!chain_kernel_) cudaGetLastError();
      }
      if (update_mode_ == UpdateMode::cluster) update_cluster_ = cuda::update_cluster_size(cluster_size_from_env());
      // DQN_UPDATE_CLOCK=1: the cluster update's blocks stamp their phases here (dqn-trace reads them)
      if (update_cluster_ > 0 && env_set("DQN_UPDATE_CLOCK")) {
        DQN_CUDA_THROW(cudaMalloc(&clock_, kClockBytes));
        DQN_CUDA_THROW(cudaMemset(clock_, 0, kClockBytes));
        note_device_bytes(kClockBytes);
      }
      // The memsets above run on the legacy stream, which does not order work on the lanes
      // (non-blocking streams): done before any op can run on a lane (the counters must be 0).
      DQN_CUDA_THROW(cudaDeviceSynchronize());
    } catch (...) {
      release();
      throw;
    }
  }
  ~CudaBackend() override { release(); }
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  const char* name() const noexcept override { return "cuda"; }
  std::uint32_t real_size() const noexcept override { return 4; }
  bool is_device() const noexcept override { return true; }

  // --- dense layers -------------------------------------------------------------------------

  /// Gemm::mask runs in tile_gemm's epilogue where the GEMM runs there (as autotuned, keyed apart
  /// from the unmasked problem); on every other path, relu_mask after the GEMM.
  void gemm(const Gemm& g) noexcept override {
    constexpr const char* op = "gemm";
    if (g.chain_b) return gemm_chain(g);
    if (g.wgrad_x) return gemm_wgrad(g);
    if (g.batch2 != 1) {
      if (g.batch2 < 1) return fail(op, "batch2 must be at least 1");
      if (g.sum_batch) return fail(op, "sum_batch needs batch2 1");
      // Entry 0 decides the path (gemm_body takes batch2_: tile_gemm's choice is timed with every
      // entry in its one launch, against the library's launch per entry); where that is
      // tile_gemm, its launch runs every entry, else each entry is a call of its own.
      batch2_ = &g;
      ran_batch2_ = false;
      gemm(batch2_entry(g, 0));
      batch2_ = nullptr;
      for (int j = 1; j < g.batch2 && !ran_batch2_ && status_ == 0; ++j) gemm(batch2_entry(g, j));
      return;
    }
    if (g.mask && (!real_ok(g.mask, op, "mask") || g.ldmask < g.n || g.mask_rows < 0))
      return fail(op, "mask needs ldmask >= n and mask_rows >= 0");
    masked_in_kernel_ = false;
    gemm_body(g);
    if (!g.mask || masked_in_kernel_ || status_ != 0 || planning_ || g.m == 0 || g.n == 0) return;
    const bool batched = g.batch > 1;
    DQN_CUDA_OK(op, cuda::relu_mask(stream_, g.c.as<float>(), g.m, g.n, g.ldc, g.mask.as<const float>(), g.ldmask,
                                    g.mask_rows, g.batch, batched ? g.stride_c : 0, batched ? g.stride_mask : 0));
  }

  /// Gemm::wgrad_x: in tf32 one launch of tile_gemm_wgrad where it fits; else (and in fp32 and
  /// bf16) the GEMM, then the groups' bias sums (relu_bias_grad) and Cᵀx (a GEMM batched over the
  /// groups), in this stream.
  void gemm_wgrad(const Gemm& g) noexcept {
    constexpr const char* op = "gemm";
    if (const char* why = wgrad_invalid(g)) return fail(op, why);
    if (!real_ok(g.wgrad_x, op, "wgrad_x") || !real_ok(g.dw, op, "dw") || (g.db && !real_ok(g.db, op, "db"))) return;
    if (g.mask && (!real_ok(g.mask, op, "mask") || g.ldmask < g.n || g.mask_rows < 0))
      return fail(op, "mask needs ldmask >= n and mask_rows >= 0");
    if (wgrad_kernel_ && g.act == Act::none && g.m > 0 && g.n > 0 && g.k > 0 && real_ok(g.a, op, "a") &&
        real_ok(g.b, op, "b") && real_ok(g.c, op, "c") && g.lda >= g.k && g.ldb >= g.n && g.ldc >= g.n) {
      cuda::TileGemm t = tile_args(g);
      cuda::TileWgrad w;
      w.x = g.wgrad_x.as<const float>();
      w.ldx = g.ldx;
      w.x_cols = g.x_cols;
      w.rows = g.wgrad_rows;
      w.dw = g.dw.as<float>();
      w.lddw = g.lddw;
      w.stride_dw = g.stride_dw;
      w.db = g.db ? g.db.as<float>() : nullptr;
      w.stride_db = g.stride_db;
      if (cuda::tile_gemm_wgrad_fits(t, w)) {
        if (!planning_) DQN_CUDA_OK(op, cuda::tile_gemm_wgrad(stream_, t, w));
        return;
      }
    }
    if (status_ != 0) return;
    gemm(without_wgrad(g));
    if (status_ != 0) return;
    if (g.db)
      relu_bias_grad(g.c, Real{}, g.db, g.wgrad_rows, g.n, g.ldc, g.m / g.wgrad_rows,
                     std::int64_t(g.wgrad_rows) * g.ldc, 0, g.stride_db);
    gemm(wgrad_weights(g));
  }

  /// Gemm::chain_b: in tf32 one launch of tile_gemm_chain where it fits (the first layer up to 256
  /// wide, weights stored [out, in], batch entries in one grid); else the two GEMMs in turn, in
  /// this stream.
  void gemm_chain(const Gemm& g) noexcept {
    constexpr const char* op = "gemm";
    if (const char* why = chain_invalid(g)) return fail(op, why);
    if (!real_ok(g.chain_b, op, "chain_b") || !real_ok(g.chain_c, op, "chain_c") ||
        (g.chain_bias && !real_ok(g.chain_bias, op, "chain_bias")))
      return;
    if (chain_kernel_ && g.chain_tb && (g.act == Act::none || g.act == Act::relu) && g.m > 0 && g.k > 0 &&
        real_ok(g.a, op, "a") && real_ok(g.b, op, "b") && real_ok(g.c, op, "c") && g.lda >= g.k && g.ldb >= g.k &&
        g.ldc >= g.n) {
      const cuda::TileGemm t = tile_args(g);
      cuda::TileChain c;
      c.b2 = g.chain_b.as<const float>();
      c.ldb2 = g.ldb2;
      c.n2 = g.chain_n;
      c.ldc2 = g.ldc2;
      c.bias2 = g.chain_bias ? g.chain_bias.as<const float>() : nullptr;
      c.relu2 = g.chain_act == Act::relu;
      c.c2 = g.chain_c.as<float>();
      if (g.batch > 1) {
        c.stride_b2 = g.stride_b2;
        c.stride_bias2 = g.chain_bias ? g.stride_bias2 : 0;
        c.stride_c2 = g.stride_c2;
      }
      if (cuda::tile_gemm_chain_fits(t, c)) {
        if (!planning_) DQN_CUDA_OK(op, cuda::tile_gemm_chain(stream_, t, c));
        return;
      }
    }
    if (status_ != 0) return;
    gemm(without_chain(g));
    if (status_ == 0) gemm(chain_second(g));
  }

  void gemm_body(const Gemm& g) noexcept {
    constexpr const char* op = "gemm";
    const Gemm* const g2 = batch2_;  // this call only, not the calls it makes (split-k's)
    batch2_ = nullptr;
    if (g.m < 0 || g.n < 0 || g.k < 0 || g.batch < 0) return fail(op, "negative size");
    if (g.m == 0 || g.n == 0 || (g.batch == 0 && !g.sum_batch)) return;
    const int a_rows = g.ta ? g.k : g.m, a_cols = g.ta ? g.m : g.k;
    const int b_rows = g.tb ? g.n : g.k, b_cols = g.tb ? g.k : g.n;
    if (g.k > 0 && g.batch > 0 && (g.lda < std::max(1, a_cols) || g.ldb < std::max(1, b_cols)))
      return fail(op, "lda/ldb smaller than the row length of A/B");
    if (g.ldc < g.n) return fail(op, "ldc smaller than n");
    if (!real_ok(g.c, op, "c")) return;
    if (g.k > 0 && g.batch > 0 && (!real_ok(g.a, op, "a") || !real_ok(g.b, op, "b"))) return;
    if (g.bias && !real_ok(g.bias, op, "bias")) return;
    if (g.act != Act::none && g.act != Act::relu) return fail(op, "unknown activation");
    const bool epilogue = g.bias || g.act != Act::none;
    if (g.sum_batch) return sum_batch(g);
    if (g.k == 0) {  // C = act(beta C + bias): no library call
      if (planning_) return;
      if (!DQN_CUDA_OK(op, cuda::scale_matrix(stream_, g.c.as<float>(), g.m, g.n, g.ldc, g.stride_c, g.batch, g.beta)))
        return;
      if (epilogue) separate_epilogue(g);
      return;
    }
    if (const int slices = split_slices(g); slices > 1) return split_k(g, slices);
    const bool batched = g.batch > 1;
    const bool bf16 = precision_ == Precision::bf16;
    // Row-major C = op(A) op(B) is column-major Cᵀ = op(B)ᵀ op(A)ᵀ: B is cuBLAS's first operand.
    LtKey key;
    key.op_a = g.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    key.op_b = g.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    key.m = g.n;
    key.n = g.m;
    key.k = g.k;
    key.ldc = g.ldc;
    key.batch = g.batch;
    key.stride_c = batched ? g.stride_c : 0;
    key.beta_zero = g.beta == 0.0f;
    key.align_c = alignment_of(g.c.p, batched ? g.stride_c * 4 : 0);
    // bf16: operands are converted into compact copies in scratch (a broadcast operand, stride 0, once).
    const int copies_a = batched && g.stride_a != 0 ? g.batch : 1;
    const int copies_b = batched && g.stride_b != 0 ? g.batch : 1;
    const std::size_t bytes_a = round_up(std::size_t{2} * copies_a * a_rows * a_cols, 256);
    const std::size_t bytes_b = round_up(std::size_t{2} * copies_b * b_rows * b_cols, 256);
    if (bf16) {
      key.ab_type = CUDA_R_16BF;
      key.lda = b_cols;
      key.ldb = a_cols;
      key.stride_a = batched && copies_b > 1 ? static_cast<std::int64_t>(b_rows) * b_cols : 0;
      key.stride_b = batched && copies_a > 1 ? static_cast<std::int64_t>(a_rows) * a_cols : 0;
      key.align_a = key.align_b = 256;  // scratch is 256-aligned, and so is each copy
    } else {
      key.ab_type = CUDA_R_32F;
      key.lda = g.ldb;
      key.ldb = g.lda;
      key.stride_a = batched ? g.stride_b : 0;
      key.stride_b = batched ? g.stride_a : 0;
      key.align_a = alignment_of(g.b.p, key.stride_a * 4);
      key.align_b = alignment_of(g.a.p, key.stride_b * 4);
    }
    // tile_gemm (tf32): decided once per problem (forced, or timed against cuBLASLt below).
    int* tile = nullptr;
    cuda::TileGemm tg;
    LtKey tkey = key;
    if (precision_ == Precision::tf32 && tile_.on) {
      tg = tile_args(g);
      tkey.epilogue = (g.bias ? 1 : 0) | (g.act == Act::relu ? 2 : 0) | (g.mask ? 4 : 0);
      tkey.stride_bias = g.bias && batched ? g.stride_bias : 0;
      if (g2) {  // entry 0 of a batch2 call: one launch for every entry
        tg.batch2 = tkey.batch2 = g2->batch2;
        tg.stride2_a = tkey.stride2_a = g2->stride2_a;
        tg.stride2_b = tkey.stride2_b = g2->stride2_b;
        tg.stride2_c = tkey.stride2_c = g2->stride2_c;
        tg.stride2_bias = tkey.stride2_bias = g.bias ? g2->stride2_bias : 0;
        tg.stride2_mask = g.mask ? g2->stride2_mask : 0;
      }
      if (!(tile = tile_slot(tkey))) return;
      if (*tile == kTileUndecided && tile_.forced) *tile = forced_tile(tkey, tg, g.c.as<const float>());
      if (status_ != 0) return;
      if (*tile >= 0) return tile_chosen(tg, *tile);
      if (*tile == kTileUndecided && (capturing_ || !autotune_)) *tile = kTileLt;
      if (*tile == kTileLt) tile = nullptr;  // cuBLASLt from here on
    }
    // The fused epilogue (beta == 0 only: then C = act(alpha·AB + bias) without any doubt about
    // where beta·C enters). Our n is cuBLAS's m, the rows of column-major D: the bias runs along
    // them and is broadcast over D's columns (our m rows), as cuBLASLt's bias epilogue does.
    LtKey fkey = key;
    LtPlan* plan = nullptr;
    bool fused = false;
    if (epilogue && g.beta == 0.0f) {
      const bool relu = g.act == Act::relu;
      fkey.epilogue = !g.bias ? CUBLASLT_EPILOGUE_RELU : relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS;
      if (g.bias) {
        fkey.stride_bias = batched ? g.stride_bias : 0;
        fkey.align_bias = alignment_of(g.bias.p, fkey.stride_bias * 4);
      }
      plan = plan_for(fkey, g.bias.p);
      if (!plan) return;
      fused = plan->use_lt;
    }
    if (!fused && !(plan = plan_for(key, nullptr))) return;
    const void* pa = g.b.p;  // cuBLAS's A (our B)
    const void* pb = g.a.p;  // cuBLAS's B (our A)
    // Autotune on the first run of a key outside capture (in the engine: while planning), with
    // these very operands; D goes to a private buffer, so nothing the caller sees is written.
    const bool tune = wants_tuning(plan);
    if (bf16) {
      const std::size_t need = bytes_a + bytes_b;
      void* s = nullptr;
      if (planning_) {
        plan_need_ = std::max(plan_need_, need);
        // Tuning needs the operand copies now; scratch grows only at plan_end: too small, and the
        // key keeps the heuristic's first algorithm (fixed at the capture or first real run).
        if (!tune || need > scratch_bytes_) return;
        s = scratch_;
      } else if (!(s = scratch(op, need))) {
        return;
      }
      void* a16 = s;                                  // our A in bf16
      void* b16 = static_cast<char*>(s) + bytes_a;    // our B in bf16
      if (!DQN_CUDA_OK(op, cuda::to_bf16(stream_, a16, g.a.as<const float>(), a_rows, a_cols, g.lda, g.stride_a, copies_a)))
        return;
      if (!DQN_CUDA_OK(op, cuda::to_bf16(stream_, b16, g.b.as<const float>(), b_rows, b_cols, g.ldb, g.stride_b, copies_b)))
        return;
      pa = b16;
      pb = a16;
    } else if (planning_ && !tune && !tile) {
      return;
    }
    const float alpha = g.alpha, beta = g.beta;
    float* c = g.c.as<float>();
    if (tune) {
      autotune(*plan, fused ? fkey : key, pa, pb, c, g.bias.p, alpha, beta);
      if (fused && !plan->use_lt) {  // no algorithm ran the fused epilogue after all: plain GEMM + bias_act
        fused = false;
        if (!(plan = plan_for(key, nullptr))) return;
        if (wants_tuning(plan)) autotune(*plan, key, pa, pb, c, nullptr, alpha, beta);
      }
    }
    if (tile) {  // undecided: the tile shapes against the cuBLASLt algorithm just chosen
      *tile = timed_tile(tkey, tg, *plan, fused, pa, pb, c, g.bias.p, alpha, beta);
      if (status_ != 0) return;
      if (*tile >= 0) return tile_chosen(tg, *tile);
    }
    if (planning_) return;
    plan->decided = true;  // from this run (or capture) on, the algorithm never changes
    plan->candidates.clear();
    if (fused) {
      const cublasStatus_t s = lt_matmul(*plan, plan->algo, pa, pb, c, c, g.bias.p, alpha, beta);
      if (s == CUBLAS_STATUS_SUCCESS) return;
      if (s != CUBLAS_STATUS_NOT_SUPPORTED) {
        cublas_ok(op, s, "cublasLtMatmul(lt, desc (fused bias/activation epilogue), ...)", __FILE__, __LINE__);
        return;
      }
      // Refused at launch, before anything was enqueued (also under capture): this key runs
      // unfused from now on.
      plan->use_lt = false;
      if (!(plan = plan_for(key, nullptr))) return;
      if (wants_tuning(plan)) autotune(*plan, key, pa, pb, c, nullptr, alpha, beta);
      plan->decided = true;
      plan->candidates.clear();
    }
    if (plan->use_lt) {
      if (!DQN_CUBLAS_OK(op, lt_matmul(*plan, plan->algo, pa, pb, c, c, nullptr, alpha, beta))) return;
    } else {
      const auto t = static_cast<cudaDataType_t>(key.ab_type);
      if (!DQN_CUBLAS_OK(op, cublasGemmStridedBatchedEx(
                            blas_, static_cast<cublasOperation_t>(key.op_a), static_cast<cublasOperation_t>(key.op_b),
                            key.m, key.n, key.k, &alpha, pa, t, static_cast<int>(key.lda), key.stride_a, pb, t,
                            static_cast<int>(key.ldb), key.stride_b, &beta, c, CUDA_R_32F, static_cast<int>(key.ldc),
                            key.stride_c, key.batch, plan->compute, CUBLAS_GEMM_DEFAULT)))
        return;
    }
    if (epilogue) separate_epilogue(g);
  }

  /// Tall reductions (k large, few output tiles: the weight gradients over B·N rows) leave most of
  /// the GPU idle in one GEMM. Such a GEMM runs as a strided-batched GEMM over slices of k into
  /// scratch, then a fixed-order sum of the slices (deterministic). 0: run it whole.
  int split_slices(const Gemm& g) const noexcept {
    if (!split_k_ || in_split_ || precision_ == Precision::bf16 || g.batch != 1 || g.beta != 0.0f || g.bias ||
        g.act != Act::none || g.k < kSplitMinK)
      return 0;
    const int sms = std::max(props_.multiProcessorCount, 1);
    const long tiles = static_cast<long>((g.m + 63) / 64) * ((g.n + 63) / 64);
    if (tiles * 4 > sms) return 0;  // enough output tiles already
    const long by_k = g.k / kSplitMinSlice, by_tiles = std::max(2L, 2L * sms / std::max(tiles, 1L));
    return static_cast<int>(std::min({static_cast<long>(kSplitMaxSlices), by_k, by_tiles}));
  }

  /// Gemm::sum_batch: the entries' products as one batched GEMM into scratch, then their sum in
  /// entry order (in double, rounded once; sum_slices, as split-k's).
  void sum_batch(const Gemm& g) noexcept {
    constexpr const char* op = "gemm";
    if (g.beta != 0.0f || g.bias || g.act != Act::none || g.mask)
      return fail(op, "sum_batch needs beta 0 and no bias, activation or mask");
    if (g.batch == 0) {  // the empty sum: C = 0
      if (!planning_)
        DQN_CUDA_OK(op, cuda::scale_matrix(stream_, g.c.as<float>(), g.m, g.n, g.ldc, 0, 1, 0.0f));
      return;
    }
    const std::int64_t mn = static_cast<std::int64_t>(g.m) * g.n;
    void* s = scratch(op, static_cast<std::size_t>(g.batch) * static_cast<std::size_t>(mn) * 4);
    if (!s && !planning_) return;
    auto* part = static_cast<float*>(planning_ ? scratch_ : s);
    Gemm sub = g;
    sub.sum_batch = 0;
    sub.c = Real{part, 4};
    sub.ldc = g.n;
    sub.stride_c = mn;
    gemm(sub);
    if (planning_ || status_ != 0) return;
    DQN_CUDA_OK(op, cuda::sum_slices(stream_, g.c.as<float>(), g.m, g.n, g.ldc, part, g.batch));
  }

  void split_k(const Gemm& g, int slices) noexcept {
    constexpr const char* op = "gemm";
    // slices of a multiple of 4 along k: 16-byte aligned operands when k runs along a row
    const int ks = ((g.k + slices - 1) / slices + 3) / 4 * 4, full = g.k / ks, rem = g.k - full * ks;
    const int parts = full + (rem > 0 ? 1 : 0);
    const std::int64_t mn = static_cast<std::int64_t>(g.m) * g.n;
    const std::size_t bytes = static_cast<std::size_t>(parts) * static_cast<std::size_t>(mn) * 4;
    void* s = scratch(op, bytes);
    // While planning, the slices' GEMMs are still planned (and tuned) against the scratch's
    // address, which is where they will write.
    if (!s && !planning_) return;
    auto* part = static_cast<float*>(planning_ ? scratch_ : s);
    in_split_ = true;
    Gemm sub = g;  // slice i: k in [i·ks, (i+1)·ks); the mask (gemm()) after the sum
    sub.mask = Real{};
    sub.k = ks;
    sub.batch = full;
    sub.stride_a = g.ta ? static_cast<std::int64_t>(ks) * g.lda : ks;
    sub.stride_b = g.tb ? ks : static_cast<std::int64_t>(ks) * g.ldb;
    sub.c = Real{part, 4};
    sub.ldc = g.n;
    sub.stride_c = mn;
    gemm(sub);
    if (rem > 0) {
      const std::int64_t k0 = static_cast<std::int64_t>(full) * ks;
      Gemm last = g;
      last.mask = Real{};
      last.k = rem;
      last.a = g.a + (g.ta ? k0 * g.lda : k0);
      last.b = g.b + (g.tb ? k0 : k0 * g.ldb);
      last.c = Real{part + static_cast<std::int64_t>(full) * mn, 4};
      last.ldc = g.n;
      gemm(last);
    }
    in_split_ = false;
    if (planning_) return;
    DQN_CUDA_OK(op, cuda::sum_slices(stream_, g.c.as<float>(), g.m, g.n, g.ldc, part, parts));
  }

  void bias_act(Real y, Real bias, int rows, int cols, int ldy, Act act) noexcept override {
    constexpr const char* op = "bias_act";
    if (!matrix_ok(op, rows, cols, ldy) || rows == 0 || cols == 0) return;
    if (!real_ok(y, op, "y")) return;
    if (bias && !real_ok(bias, op, "bias")) return;  // null bias: activation only
    if (act != Act::none && act != Act::relu) return fail(op, "unknown activation");
    if (planning_) return;
    DQN_CUDA_OK(op, cuda::bias_act(stream_, y.as<float>(), bias ? bias.as<const float>() : nullptr, rows, cols, ldy,
                                   act == Act::relu));
  }

  void relu_backward(Real dy, Real y, int rows, int cols, int ld) noexcept override {
    constexpr const char* op = "relu_backward";
    if (!matrix_ok(op, rows, cols, ld) || rows == 0 || cols == 0) return;
    if (!real_ok(dy, op, "dy") || !real_ok(y, op, "y")) return;
    if (planning_) return;
    DQN_CUDA_OK(op, cuda::relu_backward(stream_, dy.as<float>(), y.as<const float>(), rows, cols, ld));
  }

  void bias_grad(Real db, Real dy, int rows, int cols, int ldy, float beta) noexcept override {
    constexpr const char* op = "bias_grad";
    if (!matrix_ok(op, rows, cols, ldy) || cols == 0) return;
    if (!real_ok(db, op, "db")) return;
    if (rows > 0 && !real_ok(dy, op, "dy")) return;
    if (planning_) return;
    DQN_CUDA_OK(op, cuda::bias_grad(stream_, db.as<float>(), dy.as<const float>(), rows, cols, ldy, beta));
  }

  // --- distributional head ------------------------------------------------------------------

  void dueling_combine(Real logits, Real v, int ldv, Real adv, int rows, int D, int A, int Z) noexcept override {
    constexpr const char* op = "dueling_combine";
    if (rows < 0 || D < 0 || A < 0 || Z < 0) return fail(op, "negative size");
    if (rows == 0 || D == 0 || A == 0 || Z == 0) return;
    if (ldv < Z) return fail(op, "ldv smaller than Z");
    if (!real_ok(logits, op, "logits") || !real_ok(v, op, "v") || !real_ok(adv, op, "adv")) return;
    if (planning_) return;
    DQN_CUDA_OK(op, cuda::dueling_combine(stream_, logits.as<float>(), v.as<const float>(), ldv, adv.as<const float>(),
                                          rows, D, A, Z));
  }

  void dueling_backward(Real dv, int lddv, Real dadv, int lddadv, Real dlogits, int rows, int D, int A,
                        int Z) noexcept override {
    constexpr const char* op = "dueling_backward";
    if (rows < 0 || D < 0 || A < 0 || Z < 0) return fail(op, "negative size");
    if (rows == 0 || Z == 0) return;
    if (lddv < Z) return fail(op, "lddv smaller than Z");
    const int ldd = ld_or(lddadv, A * Z);
    if (ldd < A * Z) return fail(op, "lddadv smaller than A·Z");
    if (!real_ok(dv, op, "dv")) return;
    const bool any = D > 0 && A > 0;
    if (any && (!real_ok(dadv, op, "dadv") || !real_ok(dlogits, op, "dlogits"))) return;
    if (planning_) return;
    DQN_CUDA_OK(op, cuda::dueling_backward(stream_, dv.as<float>(), lddv, any ? dadv.as<float>() : nullptr, ldd,
                                           any ? dlogits.as<const float>() : nullptr, rows, any ? D : 0, A, Z));
  }

  void log_softmax(Real logp, Real x, int rows, int n) noexcept override {
    constexpr const char* op = "log_softmax";
    if (rows < 0 || n < 0) return fail(op, "negative size");
    if (rows == 0 || n == 0) return;
    if (!real_ok(logp, op, "logp") || !real_ok(x, op, "x")) return;
    if (planning_) return;
    DQN_CUDA_OK(op, cuda::log_softmax(stream_, logp.as<float>(), x.as<const float>(), rows, n));
  }

  void expected_q(Real q, Real logp, int rows, int Z, float v_min, float v_max) noexcept override {
    constexpr const char* op = "expected_q";
    if (rows < 0 || Z < 0) return fail(op, "negative size");
    if (rows == 0) return;
    if (!real_ok(q, op, "q") || (Z > 0 && !real_ok(logp, op, "logp"))) return;
    if (planning_) return;
    DQN_CUDA_OK(op, cuda::expected_q(stream_, q.as<float>(), logp.as<const float>(), rows, Z, v_min, v_max));
  }

  void argmax(std::int32_t* idx, Real q, int rows, int n) noexcept override {
    constexpr const char* op = "argmax";
    if (rows < 0 || n <= 0) return fail(op, "rows < 0 or n <= 0");
    if (rows == 0) return;
    if (!idx) return fail(op, "null idx");
    if (!real_ok(q, op, "q")) return;
    if (planning_) return;
    DQN_CUDA_OK(op, cuda::argmax(stream_, idx, q.as<const float>(), rows, n));
  }

  void c51_project(const C51Project& a) noexcept override {
    constexpr const char* op = "c51_project";
    if (a.B < 0 || a.D < 0 || a.A <= 0 || a.Z < 2) return fail(op, "need B, D >= 0, A >= 1, Z >= 2");
    if (!(a.v_max > a.v_min)) return fail(op, "v_max must exceed v_min");
    if (a.B == 0 || a.D == 0) return;
    if (!a.a_star) return fail(op, "null a_star");
    if (!real_ok(a.m, op, "m") || !real_ok(a.target_logp, op, "target_logp") || !real_ok(a.rewards, op, "rewards") ||
        !real_ok(a.dones, op, "dones"))
      return;
    // a_star lives on the device: an out-of-range index turns that row of m into NaN there.
    if (planning_) return;
    DQN_CUDA_OK(op, cuda::c51_project(stream_, a));
  }

  void c51_xent(const C51Xent& a) noexcept override {
    constexpr const char* op = "c51_xent";
    if (a.B < 0 || a.D < 0 || a.A <= 0 || a.Z <= 0) return fail(op, "need B, D >= 0, A, Z >= 1");
    if (a.B == 0 || a.D == 0) {
      if (a.loss && real_ok(a.loss, op, "loss") && !a.accumulate && !planning_)
        DQN_CUDA_OK(op, cuda::fill(stream_, a.loss.as<float>(), 0.0f, 1));
      return;
    }
    if (!a.actions) return fail(op, "null actions");
    if (!real_ok(a.dlogits, op, "dlogits") || !real_ok(a.logp, op, "logp") || !real_ok(a.m, op, "m") ||
        !real_ok(a.weights, op, "weights"))
      return;
    if (a.loss && !real_ok(a.loss, op, "loss")) return;
    if (a.loss_per_sample && !real_ok(a.loss_per_sample, op, "loss_per_sample")) return;
    if (a.members < 1 || a.members > 65535) return fail(op, "members outside [1, 65535]");
    if (a.dv) {
      if (!real_ok(a.dv, op, "dv") || !real_ok(a.dadv, op, "dadv")) return;
      if (a.lddv < a.Z || ld_or(a.lddadv, a.A * a.Z) < a.A * a.Z) return fail(op, "lddv < Z or lddadv < A·Z");
      if (static_cast<std::size_t>(a.D) * (sizeof(double) + a.Z * sizeof(float)) > 48 * 1024)
        return fail(op, "D·Z too large for the fused dueling backward");
    }
    void* s = scratch(op, cuda::c51_xent_scratch_bytes(a.B * a.members));
    if (!s) return;
    DQN_CUDA_OK(op, cuda::c51_xent(stream_, a, s));
  }

  // --- optimisation -------------------------------------------------------------------------

  void budget(const Budget& a) noexcept override {
    constexpr const char* op = "budget";
    if (a.H < 0 || a.P < 0) return fail(op, "negative size");
    if (a.H > kMaxBudgetHeads) return fail(op, "more than 8192 heads");
    if (!a.skip || !a.skipped) return fail(op, "null skip/skipped");
    if (a.H > 0 && (!real_ok(a.fractions, op, "fractions") || !real_ok(a.norms, op, "norms") ||
                    !real_ok(a.clips, op, "clips") || !real_ok(a.losses, op, "losses")))
      return;
    if (a.H > 0 && a.P > 0 && !real_ok(a.grads, op, "grads")) return;
    if (a.P > 0 && !real_ok(a.g, op, "g")) return;
    if (!real_ok(a.total_loss, op, "total_loss")) return;
    void* s = scratch(op, cuda::budget_scratch_bytes(a.H));
    if (!s) return;
    DQN_CUDA_OK(op, cuda::budget(stream_, a, s, wave_blocks()));
  }

  void adam(const Adam& a) noexcept override {
    constexpr const char* op = "adam";
    if (a.P < 0) return fail(op, "negative size");
    if (!a.skip || !a.t) return fail(op, "null skip/t");
    if (!real_ok(a.lr, op, "lr")) return;
    if (a.P > 0 && (!real_ok(a.params, op, "params") || !real_ok(a.g, op, "g") || !real_ok(a.m, op, "m") ||
                    !real_ok(a.v, op, "v")))
      return;
    if (planning_) return;
    DQN_CUDA_OK(op, cuda::adam(stream_, a, wave_blocks()));
  }

  void spectral_norm(const SpectralMatrix* mats, int count, int max_rows, int max_cols, float sigma_max,
                     const std::int32_t* skip) noexcept override {
    constexpr const char* op = "spectral_norm";
    if (count < 0) return fail(op, "negative count");
    if (!skip) return fail(op, "null skip");
    if (count == 0) return;
    if (!mats) return fail(op, "null mats");
    if (max_rows <= 0 || max_cols <= 0) return fail(op, "max_rows and max_cols must be positive");
    if (count > 65535) return fail(op, "more than 65535 matrices");
    void* s = scratch(op, cuda::spectral_norm_scratch_bytes(count, max_rows, max_cols));
    if (!s) return;
    DQN_CUDA_OK(op, cuda::spectral_norm(stream_, mats, count, max_rows, max_cols, sigma_max, skip, s));
  }

  void target_update(const TargetUpdate& a) noexcept override {
    constexpr const char* op = "target_update";
    if (a.P < 0 || a.period < 0) return fail(op, "negative size or period");
    if (!a.skip) return fail(op, "null skip");
    if (a.P == 0) return;
    if (!real_ok(a.target, op, "target") || !real_ok(a.params, op, "params")) return;
    if (a.period > 0 && !a.t) return fail(op, "null t with a hard-copy period");
    if (planning_) return;
    DQN_CUDA_OK(op, cuda::target_update(stream_, a, wave_blocks()));
  }

  void update(const Update& u) noexcept override {
    constexpr const char* op = "update";
    const Budget& b = u.budget;
    const Adam& a = u.adam;
    const TargetUpdate& t = u.target;
    // The cluster update where the arguments have the engine's shape, the normed matrices are
    // disjoint ranges inside params and fit its shared memory; otherwise the four ops, each
    // checking its own arguments.
    const bool shaped = b.H >= 1 && b.H <= cuda::update_max_heads() && b.P > 0 && u.sn_count >= 0 &&
                        u.sn_count <= cuda::update_max_matrices() && a.P == b.P && t.P == b.P && a.g.p == b.g.p &&
                        a.skip == b.skip && t.skip == b.skip && t.t == a.t && t.params.p == a.params.p &&
                        t.period >= 0 && (u.sn_count == 0 || (u.sn_mats && u.sn_max_rows > 0 && u.sn_max_cols > 0));
    const bool cluster = shaped && update_cluster_ > 0 &&
                         cuda::update_cluster_fits(update_cluster_, u.sn_max_rows, u.sn_max_cols) && sn_tidy(u);
    if (!cluster) {
      budget(b);
      adam(a);
      if (u.sn_count > 0) spectral_norm(u.sn_mats, u.sn_count, u.sn_max_rows, u.sn_max_cols, u.sigma_max, b.skip);
      target_update(t);
      return;
    }
    if (!b.skip || !b.skipped || !a.t) return fail(op, "null skip/skipped/t");
    if (!real_ok(b.grads, op, "grads") || !real_ok(b.fractions, op, "fractions") || !real_ok(b.norms, op, "norms") ||
        !real_ok(b.clips, op, "clips") || !real_ok(b.losses, op, "losses") || !real_ok(b.g, op, "g") ||
        !real_ok(b.total_loss, op, "total_loss") || !real_ok(a.params, op, "params") || !real_ok(a.m, op, "m") ||
        !real_ok(a.v, op, "v") || !real_ok(a.lr, op, "lr") || !real_ok(t.target, op, "target"))
      return;
    void* s = scratch(op, cuda::update_scratch_bytes(b.H));
    if (!s) return;
    if (planning_) return;
    // a split update's side launch (DQN_UPDATE_WIDE) on the lane's side slot (its fork and join
    // are graph edges when captured)
    const cuda::UpdateSide side{streams_[kMaxLanes + lane_], side_events_[0], side_events_[1]};
    DQN_CUDA_OK(op, cuda::update_cluster(stream_, u, s, update_cluster_, sn_ranges(u), wave_blocks(), clock_,
                                         kClockBlocks, &clock_launch_.blocks, update_opt_, &update_choices_, &side));
    clock_launch_.cs = update_cluster_;
    clock_launch_.normed = u.sn_count;
  }

  /// Whether the update's normed matrices are disjoint ranges inside params, each within the
  /// bounds (what the cluster update needs). The table lives on the device: read once,
  /// outside capture (when the engine plans), and remembered for that table with the matrices'
  /// ranges (sn_ranges); during a capture an unseen table counts as not tidy (the separate ops
  /// then run).
  bool sn_tidy(const Update& u) noexcept {
    if (u.sn_count == 0) return true;
    if (const SnTable* known = sn_table(u)) return known->tidy;
    if (capturing_) return false;
    std::vector<SpectralMatrix> mats(static_cast<std::size_t>(u.sn_count));
    if (cudaMemcpyAsync(mats.data(), u.sn_mats, mats.size() * sizeof(SpectralMatrix), cudaMemcpyDeviceToHost,
                        stream_) != cudaSuccess ||
        cudaStreamSynchronize(stream_) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    const auto* params = static_cast<const float*>(u.adam.params.p);
    SnTable tab{sn_key(u), true, {}};
    for (const SpectralMatrix& m : mats) {
      cuda::SnRange r;
      if (m.rows > 0 && m.cols > 0) {
        r.lo = static_cast<const float*>(m.w.p) - params;
        r.hi = r.lo + std::int64_t(m.rows) * m.cols;
        r.rows = m.rows;
        if (r.lo < 0 || r.hi > u.adam.P || m.rows > u.sn_max_rows || m.cols > u.sn_max_cols) tab.tidy = false;
      }
      tab.ranges.push_back(r);
    }
    std::vector<std::pair<std::int64_t, std::int64_t>> sorted;
    for (const cuda::SnRange& r : tab.ranges) sorted.emplace_back(r.lo, r.hi);
    std::sort(sorted.begin(), sorted.end());
    for (std::size_t i = 1; i < sorted.size(); ++i)
      if (sorted[i].first < sorted[i - 1].second && sorted[i - 1].second > sorted[i - 1].first) tab.tidy = false;
    sn_tables_.push_back(std::move(tab));
    return sn_tables_.back().tidy;
  }
  /// The normed matrices' ranges in params and rows, in table order (after sn_tidy said tidy).
  const std::vector<cuda::SnRange>& sn_ranges(const Update& u) const noexcept {
    static const std::vector<cuda::SnRange> none;
    const SnTable* known = sn_table(u);
    return known ? known->ranges : none;
  }

  /// Where the library workspace and the scratch lie (for mapping a sanitizer's addresses).
  const void* workspace_base() const noexcept { return workspace_base_; }
  const void* scratch_base() const noexcept { return scratch_base_; }

  /// ", what" (on), ", what where the grid fits (last launch: yes|no)" (fit) or nothing (off).
  static std::string fit_text(cuda::FitMode m, bool last, const char* what) {
    if (m == cuda::FitMode::off) return "";
    if (m == cuda::FitMode::on) return std::string(", ") + what;
    return std::string(", ") + what + " where the grid fits (last launch: " + (last ? "yes)" : "no)");
  }

  /// ", N normed matrices in a wide launch beside it" (DQN_UPDATE_WIDE on), nothing (off),
  /// or ", a wide launch where the grid fits (last launch: N normed matrices)" (unset: fit).
  std::string wide_text() const {
    const int n = static_cast<int>(update_choices_.clusters.size()) - update_choices_.main_normed;
    const std::string mats = std::to_string(n) + " normed matri" + (n == 1 ? "x" : "ces");
    switch (update_opt_.wide) {
      case cuda::FitMode::on: return ", " + mats + " in a wide launch beside it";
      case cuda::FitMode::fit: return ", a wide launch where the grid fits (last launch: " + mats + ")";
      default: return "";
    }
  }

  /// How the update runs (for describe()).
  std::string update_path() const {
    if (update_cluster_ > 0)
      return "cluster (" + std::to_string(update_cluster_) + " blocks a cluster" +
             fit_text(update_opt_.stage, update_choices_.staged, "second tiles staged") +
             fit_text(update_opt_.gather, update_choices_.gathered, "Wᵀu gathered by shares") +
             fit_text(update_opt_.keepw, update_choices_.kept, "normed rows kept in shared memory") +
             fit_text(update_opt_.push, update_choices_.pushed, "sums pushed to every block") +
             (update_choices_.one ? ", one head's g in float" : "") +
             (update_opt_.defer && update_choices_.kept ? ", normed θ stored once" : "") +
             wide_text() + ")";
    return "as separate kernels";
  }

  /// Grid bound of the one-wave optimiser kernels: a few blocks per SM (their results do not
  /// depend on it). The budget's combine keeps its clips in H floats of shared memory.
  static constexpr int kMaxBudgetHeads = 8192;
  int wave_blocks() const noexcept { return 4 * std::max(props_.multiProcessorCount, 1); }

  // --- elementwise and memory ---------------------------------------------------------------

  void fill(Real x, float value, std::int64_t n) noexcept override {
    constexpr const char* op = "fill";
    if (n < 0) return fail(op, "negative size");
    if (n == 0 || !real_ok(x, op, "x") || planning_) return;
    DQN_CUDA_OK(op, cuda::fill(stream_, x.as<float>(), value, n));
  }

  void copy(Real dst, Real src, std::int64_t n) noexcept override {
    constexpr const char* op = "copy";
    if (n < 0) return fail(op, "negative size");
    if (n == 0 || !real_ok(dst, op, "dst") || !real_ok(src, op, "src")) return;
    if (dst.p == src.p) return;
    const auto d = reinterpret_cast<std::uintptr_t>(dst.p), s = reinterpret_cast<std::uintptr_t>(src.p);
    const auto bytes = static_cast<std::uintptr_t>(n) * 4;
    if (d < s + bytes && s < d + bytes) return fail(op, "overlapping ranges are not supported on the device");
    if (planning_) return;
    DQN_CUDA_OK(op, cudaMemcpyAsync(dst.p, src.p, bytes, cudaMemcpyDeviceToDevice, stream_));
  }

  void axpy(Real y, Real x, float alpha, std::int64_t n) noexcept override {
    constexpr const char* op = "axpy";
    if (n < 0) return fail(op, "negative size");
    if (n == 0 || !real_ok(y, op, "y") || !real_ok(x, op, "x") || planning_) return;
    DQN_CUDA_OK(op, cuda::axpy(stream_, y.as<float>(), x.as<const float>(), alpha, n));
  }

  void weighted_mean(Real out, Real x, Real w, std::int64_t n) noexcept override {
    constexpr const char* op = "weighted_mean";
    if (n < 0) return fail(op, "negative size");
    if (!real_ok(out, op, "out") || (n > 0 && (!real_ok(x, op, "x") || !real_ok(w, op, "w"))) || planning_) return;
    DQN_CUDA_OK(op, cuda::weighted_mean(stream_, out.as<float>(), n > 0 ? x.as<const float>() : nullptr,
                                        n > 0 ? w.as<const float>() : nullptr, n));
  }

  void uniform(const Uniform& a) noexcept override {
    constexpr const char* op = "uniform";
    if (a.n < 0) return fail(op, "negative size");
    if (a.n == 0 || !real_ok(a.out, op, "out") || planning_) return;
    DQN_CUDA_OK(op, cuda::uniform(stream_, a));
  }

  // Init and checkpoint I/O: synchronous with respect to the runtime's stream (so they are
  // ordered after every op queued before), refused during capture; they run while planning,
  // since they are data movement rather than step work.
  void upload(void* dst, const void* src, std::size_t bytes) noexcept override { transfer("upload", dst, src, bytes); }
  void download(void* dst, const void* src, std::size_t bytes) noexcept override {
    transfer("download", dst, src, bytes);
  }
  void upload_reals(Real dst, const float* src, std::int64_t n) noexcept override {
    constexpr const char* op = "upload_reals";
    if (n < 0) return fail(op, "negative size");
    if (n == 0 || !real_ok(dst, op, "dst")) return;
    if (!src) return fail(op, "null src");
    transfer(op, dst.p, src, static_cast<std::size_t>(n) * 4);
  }
  void download_reals(float* dst, Real src, std::int64_t n) noexcept override {
    constexpr const char* op = "download_reals";
    if (n < 0) return fail(op, "negative size");
    if (n == 0 || !real_ok(src, op, "src")) return;
    if (!dst) return fail(op, "null dst");
    transfer(op, dst, src.p, static_cast<std::size_t>(n) * 4);
  }

  int status() const noexcept override { return status_; }
  const char* message() const noexcept override { return message_; }

  // --- auxiliary heads (ABI 2) ----------------------------------------------------------------

  void cql_penalty(const CqlPenalty& a) noexcept override {
    constexpr const char* op = "cql_penalty";
    if (a.B < 0 || a.D < 0 || a.A <= 0) return fail(op, "need B, D >= 0, A >= 1");
    if (!real_ok(a.loss, op, "loss")) return;
    if (a.B == 0 || a.D == 0) {
      if (!planning_) DQN_CUDA_OK(op, cuda::fill(stream_, a.loss.as<float>(), 0.0f, 1));
      return;
    }
    if (!a.actions) return fail(op, "null actions");
    if (!real_ok(a.dq, op, "dq") || !real_ok(a.q, op, "q")) return;
    // actions live on the device: an out-of-range index turns that row's dq and the loss into NaN.
    void* s = scratch(op, cuda::cql_penalty_scratch_bytes(a.B, a.D));
    if (!s) return;
    DQN_CUDA_OK(op, cuda::cql_penalty(stream_, a, s));
  }

  void expected_q_backward(Real dlogits, Real dq, Real logp, int rows, int Z, float v_min,
                           float v_max) noexcept override {
    constexpr const char* op = "expected_q_backward";
    if (rows < 0 || Z < 0) return fail(op, "negative size");
    if (rows == 0 || Z == 0) return;
    if (!real_ok(dlogits, op, "dlogits") || !real_ok(dq, op, "dq") || !real_ok(logp, op, "logp")) return;
    if (planning_) return;
    DQN_CUDA_OK(op, cuda::expected_q_backward(stream_, dlogits.as<float>(), dq.as<const float>(),
                                              logp.as<const float>(), rows, Z, v_min, v_max));
  }

  void ensemble_disagreement(Real out, Real q, int K, int B, int n) noexcept override {
    constexpr const char* op = "ensemble_disagreement";
    if (K <= 0 || B < 0 || n <= 0) return fail(op, "need K, n >= 1, B >= 0");
    if (B == 0) return;
    if (!real_ok(out, op, "out") || !real_ok(q, op, "q")) return;
    if (planning_) return;
    DQN_CUDA_OK(op, cuda::ensemble_disagreement(stream_, out.as<float>(), q.as<const float>(), K, B, n));
  }
  void cosine_embedding(Real out, Real tau, int rows, int E) noexcept override {
    constexpr const char* op = "cosine_embedding";
    if (rows < 0 || E < 0) return fail(op, "negative size");
    if (rows == 0 || E == 0) return;
    if (!real_ok(out, op, "out") || !real_ok(tau, op, "tau")) return;
    if (planning_) return;
    DQN_CUDA_OK(op, cuda::cosine_embedding(stream_, out.as<float>(), tau.as<const float>(), rows, E));
  }

  void hadamard(Real x, Real h2, Real phi, int B, int N, int H) noexcept override {
    constexpr const char* op = "hadamard";
    if (B < 0 || N < 0 || H < 0) return fail(op, "negative size");
    if (B == 0 || N == 0 || H == 0) return;
    if (!real_ok(x, op, "x") || !real_ok(h2, op, "h2") || !real_ok(phi, op, "phi")) return;
    if (planning_) return;
    DQN_CUDA_OK(op, cuda::hadamard(stream_, x.as<float>(), h2.as<const float>(), phi.as<const float>(), B, N, H));
  }

  void hadamard_backward(Real dphi, Real dh2, Real dx, Real h2, Real phi, int B, int N, int H) noexcept override {
    constexpr const char* op = "hadamard_backward";
    if (B < 0 || N < 0 || H < 0) return fail(op, "negative size");
    if (B == 0 || H == 0) return;
    if (!real_ok(dh2, op, "dh2")) return;
    if (N == 0) {
      if (!planning_) DQN_CUDA_OK(op, cuda::fill(stream_, dh2.as<float>(), 0.0f, static_cast<std::int64_t>(B) * H));
      return;
    }
    if (!real_ok(dphi, op, "dphi") || !real_ok(dx, op, "dx") || !real_ok(h2, op, "h2") || !real_ok(phi, op, "phi"))
      return;
    if (planning_) return;
    DQN_CUDA_OK(op, cuda::hadamard_backward(stream_, dphi.as<float>(), dh2.as<float>(), dx.as<const float>(),
                                            h2.as<const float>(), phi.as<const float>(), B, N, H));
  }

  void quantile_huber(const QuantileHuber& a) noexcept override {
    constexpr const char* op = "quantile_huber";
    if (a.B < 0 || a.N < 0 || a.Nt <= 0 || a.D < 0 || a.A <= 0) return fail(op, "need B, N, D >= 0, N', A >= 1");
    if (!(a.kappa > 0.0f)) return fail(op, "kappa must be > 0");
    if (!real_ok(a.loss, op, "loss")) return;
    if (a.B == 0 || a.N == 0 || a.D == 0) {
      if (!planning_) DQN_CUDA_OK(op, cuda::fill(stream_, a.loss.as<float>(), 0.0f, 1));
      return;
    }
    if (!a.actions || !a.a_star) return fail(op, "null actions/a_star");
    if (!real_ok(a.dq, op, "dq") || !real_ok(a.q, op, "q") || !real_ok(a.q_target, op, "q_target") ||
        !real_ok(a.tau, op, "tau") || !real_ok(a.rewards, op, "rewards") || !real_ok(a.dones, op, "dones") ||
        !real_ok(a.weights, op, "weights"))
      return;
    if (a.loss_per_sample && !real_ok(a.loss_per_sample, op, "loss_per_sample")) return;
    if (ld_or(a.ldq, a.D * a.A) < a.D * a.A) return fail(op, "ldq smaller than D·A");
    if (cuda::quantile_huber_shared_bytes(a.D, a.N) > 48 * 1024) return fail(op, "D·N too large (over 6144 pairs)");
    // actions/a_star live on the device: an out-of-range index poisons that sample's dq and loss.
    void* s = scratch(op, cuda::quantile_huber_scratch_bytes(a.B));
    if (!s) return;
    DQN_CUDA_OK(op, cuda::quantile_huber(stream_, a, s));
  }

  // --- fused head ops (ABI 3) ---------------------------------------------------------------

  /// The distribution kernels (dueling_dist, c51_loss) compute in double in fp32 pipelines, as
  /// the CPU twin does, and in float in tf32 and bf16 ones (see head_kernels.cu).
  bool double_math() const noexcept { return precision_ == Precision::fp32; }

  void dueling_dist(const DuelingDist& a) noexcept override {
    constexpr const char* op = "dueling_dist";
    if (a.rows < 0 || a.D < 0 || a.A <= 0 || a.Z <= 0) return fail(op, "need rows, D >= 0, A, Z >= 1");
    if (a.star_from < 0 || a.star_from > a.rows) return fail(op, "star_from outside [0, rows]");
    if (a.a_star && !a.q) return fail(op, "a_star needs q");
    if (a.rows == 0 || a.D == 0) return;
    if (a.ldv < a.Z) return fail(op, "ldv smaller than Z");
    if (ld_or(a.ldadv, a.A * a.Z) < a.A * a.Z) return fail(op, "ldadv smaller than A·Z");
    if (!real_ok(a.logp, op, "logp") || !real_ok(a.v, op, "v") || !real_ok(a.adv, op, "adv")) return;
    if (a.q && !real_ok(a.q, op, "q")) return;
    if (cuda::dueling_dist_shared_bytes(a.Z, a.A) > 48 * 1024) return fail(op, "Z too large for shared memory");
    if (std::int64_t(a.rows) * a.D > 0x7fffffff) return fail(op, "rows·D too large");
    if (planning_) return;
    const bool per_action = dist_per_action_ == DistPerAction::always ||
                            (dist_per_action_ == DistPerAction::small &&
                             static_cast<std::int64_t>(a.rows) * a.D <= kDistPerActionPairs);
    DQN_CUDA_OK(op, cuda::dueling_dist(stream_, a, double_math(), per_action));
  }

  /// head_forward_composed with the value GEMM on the lane's side slot, beside the advantage
  /// GEMM (both read only the hidden layer; each is a few blocks, and on one stream the value
  /// GEMM's 5 µs sat on the step's critical path).
  void head_forward(const HeadForward& a) noexcept override {
    if ((a.wv2_rows != 0 && a.wv2_rows < a.Z) || (a.wb2_rows != 0 && a.wb2_rows < a.A * a.Z))
      return fail("head_forward", "wv2_rows/wb2_rows smaller than Z/A·Z");
    const HeadForwardOps o = head_forward_ops(a);
    gemm(o.hidden);
    if (!beside("head_forward", o.value, o.adv)) return;
    if (a.logp) dueling_dist(o.dist);
  }

  /// head_backward_inputs_composed with the value GEMM on the side slot, beside the branches'
  /// GEMM (they write disjoint columns of dhidden; on one stream they ran one after the other).
  void head_backward_inputs(const HeadBackward& a) noexcept override {
    if (a.wb2_rows != 0 && a.wb2_rows < a.A * a.Z) return fail("head_backward_inputs", "wb2_rows smaller than A·Z");
    const HeadBackwardOps o = head_backward_ops(a);  // each GEMM masked by its hidden columns
    beside("head_backward_inputs", o.value, o.branch);
  }

  /// `side` on the lane's side slot and `main` on its own stream, side by side, both after what
  /// the lane enqueued before and both before what it enqueues after. Captured, the fork and join
  /// are graph edges. False after recording an error.
  bool beside(const char* op, const Gemm& side, const Gemm& main) noexcept {
    const int lane = lane_;
    const bool events = !planning_;  // while planning, nothing is launched
    bool ok = status_ == 0 && (!events || DQN_CUDA_OK(op, cudaEventRecord(side_events_[0], stream_)));
    if (ok && switch_slot(op, kMaxLanes + lane)) {
      if (events) ok = DQN_CUDA_OK(op, cudaStreamWaitEvent(stream_, side_events_[0], 0));
      if (ok) gemm(side);
      if (ok && events) ok = DQN_CUDA_OK(op, cudaEventRecord(side_events_[1], stream_));
      ok = switch_slot(op, lane) && ok;
    }
    if (!ok) return false;
    gemm(main);
    return !events || DQN_CUDA_OK(op, cudaStreamWaitEvent(stream_, side_events_[1], 0));
  }

  /// use_slot for an op (records a failure instead of throwing).
  bool switch_slot(const char* op, int slot) noexcept {
    try {
      use_slot(slot);
      return true;
    } catch (const std::exception& e) {
      record(1, op, e.what());
      return false;
    }
  }

  void relu_bias_grad(Real dy, Real y, Real db, int rows, int cols, int ld, int heads, std::int64_t stride_dy,
                      std::int64_t stride_y, std::int64_t stride_db) noexcept override {
    constexpr const char* op = "relu_bias_grad";
    if (!matrix_ok(op, rows, cols, ld) || cols == 0 || heads == 0) return;
    if (heads < 0 || heads > 65535) return fail(op, "heads outside [0, 65535]");
    if (!db && !y) return;  // neither masks nor sums
    if (db && !real_ok(db, op, "db")) return;
    if (rows > 0 && !real_ok(dy, op, "dy")) return;
    if (rows > 0 && y && !real_ok(y, op, "y")) return;
    if (!db && rows == 0) return;
    if (planning_) return;
    DQN_CUDA_OK(op, cuda::relu_bias_grad(stream_, rows > 0 ? dy.as<float>() : nullptr,
                                         rows > 0 && y ? y.as<const float>() : nullptr,
                                         db ? db.as<float>() : nullptr, rows, cols, ld, heads, stride_dy, stride_y,
                                         stride_db));
  }

  void c51_loss(const C51Loss& a) noexcept override {
    constexpr const char* op = "c51_loss";
    if (a.B < 0 || a.D <= 0 || a.A <= 0 || a.Z < 2) return fail(op, "need B >= 0, D, A >= 1, Z >= 2");
    if (!(a.v_max > a.v_min)) return fail(op, "v_max must exceed v_min");
    if (a.part < 0 || a.part > 2) return fail(op, "part must be 0 (all), 1 (the projection) or 2 (the rest)");
    if (a.loss && !real_ok(a.loss, op, "loss")) return;
    if (a.B == 0) {
      if (a.loss && a.part != 1 && !planning_) DQN_CUDA_OK(op, cuda::fill(stream_, a.loss.as<float>(), 0.0f, 1));
      return;
    }
    if (!a.actions || !a.a_star) return fail(op, "null actions/a_star");
    if (a.lddv < a.Z || a.ldtv < a.Z) return fail(op, "lddv/ldtv smaller than Z");
    if (ld_or(a.ldtadv, a.A * a.Z) < a.A * a.Z || ld_or(a.lddadv, a.A * a.Z) < a.A * a.Z)
      return fail(op, "ldtadv/lddadv smaller than A·Z");
    if (!real_ok(a.m, op, "m") || !real_ok(a.dv, op, "dv") || !real_ok(a.dadv, op, "dadv") ||
        !real_ok(a.logp, op, "logp") || !real_ok(a.weights, op, "weights") || !real_ok(a.tv, op, "tv") ||
        !real_ok(a.tadv, op, "tadv") || !real_ok(a.rewards, op, "rewards") || !real_ok(a.dones, op, "dones"))
      return;
    if (a.loss_per_sample && !real_ok(a.loss_per_sample, op, "loss_per_sample")) return;
    if (cuda::c51_loss_shared_bytes(a.D, a.A, a.Z) > 48 * 1024) return fail(op, "D·Z too large for shared memory");
    // a_star/actions live on the device: an out-of-range index poisons that branch with NaN.
    void* s = scratch(op, cuda::c51_loss_scratch_bytes(a.B));
    if (!s) return;
    // no loss: the blocks end after their samples, with no last block summing the batch
    DQN_CUDA_OK(op, cuda::c51_loss(stream_, a, s, a.loss ? counter() : nullptr, double_math(), loss_pair_));
  }



  // --- what the runtime needs ---------------------------------------------------------------

  cudaStream_t stream() const noexcept { return stream_; }
  /// The current lane's "last block done" counter (0 between kernels; see dev::last_block).
  unsigned* counter() const noexcept { return counters_ + lane_ * 32; }
  Precision precision() const noexcept { return precision_; }
  const cudaDeviceProp& props() const noexcept { return props_; }
  /// The stamps of the last cluster update that ran (after a synchronize), or empty.
  Runtime::UpdateClock update_clock() const {
    Runtime::UpdateClock out;
    if (!clock_ || clock_launch_.blocks <= 0 || clock_launch_.cs <= 0) return out;
    const int n = std::min(clock_launch_.blocks, kClockBlocks);
    out.slots = cuda::kUpdateClockSlots;
    out.stamps.assign(static_cast<std::size_t>(n) * 2 * out.slots, 0);
    if (cudaMemcpy(out.stamps.data(), clock_, out.stamps.size() * sizeof(std::uint64_t), cudaMemcpyDeviceToHost) !=
        cudaSuccess) {
      cudaGetLastError();
      return {};
    }
    out.cluster_size = clock_launch_.cs;
    out.normed = clock_launch_.normed;
    // each block's normed matrix: the main launch's clusters, its other blocks, then the side
    // launch's clusters (a split update), as update_choices_ says
    const cuda::UpdateChoices& ch = update_choices_;
    const int cs = clock_launch_.cs;
    out.group.assign(static_cast<std::size_t>(n), -1);
    for (int blk = 0; blk < n; ++blk) {
      const int cid = blk < ch.main_blocks ? blk / cs : ch.main_normed + (blk - ch.main_blocks) / cs;
      const bool normed = blk < ch.main_blocks ? cid < ch.main_normed : cid < static_cast<int>(ch.clusters.size());
      if (normed) out.group[static_cast<std::size_t>(blk)] = ch.clusters[static_cast<std::size_t>(cid)];
    }
    int clock_khz = 0;
    if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device_) != cudaSuccess) cudaGetLastError();
    out.clock_khz = clock_khz;
    return out;
  }

  bool planning() const noexcept { return planning_; }
  void set_capturing(bool on) noexcept { capturing_ = on; }
  std::size_t scratch_bytes() const noexcept { return scratch_bytes_; }
  std::size_t peak_device_bytes() const noexcept { return peak_bytes_; }
  void note_device_bytes(std::size_t bytes) noexcept {
    device_bytes_ += bytes;
    peak_bytes_ = std::max(peak_bytes_, device_bytes_);
  }
  void forget_device_bytes(std::size_t bytes) noexcept { device_bytes_ -= bytes; }

  void begin_plan() noexcept {
    planning_ = true;
    plan_need_ = 0;
  }
  /// Ends planning; returns the scratch the plan needs (the runtime grows it if it must).
  std::size_t end_plan() noexcept {
    planning_ = false;
    return plan_need_;
  }
  /// Replaces the scratch with one of `bytes` (never inside a step: synchronises). Throws.
  void grow_scratch(std::size_t bytes) {
    if (bytes <= scratch_bytes_) return;
    bytes = round_up(bytes, 256);
    DQN_CUDA_THROW(cudaDeviceSynchronize());
    DQN_CUDA_THROW(cudaFree(scratch_base_));
    forget_device_bytes(scratch_bytes_ * kSlots);
    scratch_ = scratch_base_ = nullptr;
    scratch_bytes_ = 0;
    DQN_CUDA_THROW(cudaMalloc(&scratch_base_, bytes * kSlots));
    DQN_CUDA_THROW(cudaMemset(scratch_base_, 0, bytes * kSlots));
    DQN_CUDA_THROW(cudaDeviceSynchronize());  // (the legacy stream's memset before the lanes' work)
    scratch_bytes_ = bytes;
    scratch_ = static_cast<char*>(scratch_base_) + static_cast<std::size_t>(lane_) * scratch_bytes_;
    note_device_bytes(bytes * kSlots);
  }

  /// Makes the following ops run on lane `lane` (its stream, workspace, scratch and counter).
  /// Host-side only: allowed while capturing. Throws on a bad lane.
  void set_lane(int lane) {
    if (lane < 0 || lane >= kMaxLanes)
      throw std::runtime_error("cuda: lane " + std::to_string(lane) + " outside [0, " + std::to_string(kMaxLanes) + ")");
    use_slot(lane);
  }
  int lane() const noexcept { return lane_; }

 private:
  /// Makes the following ops run on stream slot `lane` (a lane, or kMaxLanes + lane: its side slot).
  void use_slot(int lane) {
    if (lane == lane_) return;
    lane_ = lane;
    stream_ = streams_[lane];
    workspace_ = static_cast<char*>(workspace_base_) + static_cast<std::size_t>(lane) * kWorkspaceBytes;
    scratch_ = static_cast<char*>(scratch_base_) + static_cast<std::size_t>(lane) * scratch_bytes_;
    // cublasSetStream resets the workspace to cuBLAS's own pool: set the stream first.
    DQN_CUBLAS_THROW(cublasSetStream(blas_, stream_));
    DQN_CUBLAS_THROW(cublasSetWorkspace(blas_, workspace_, kWorkspaceBytes));
  }

  void fail(const char* op, const char* why) noexcept { record(1, op, why); }

  void record(int code, const char* op, const std::string& why) noexcept {
    if (status_ != 0) return;  // the first failure wins: later ones are usually its consequences
    status_ = code;
    std::snprintf(message_, sizeof message_, "cuda %s: %s", op, why.c_str());
  }

  bool cuda_ok(const char* op, cudaError_t e, const char* stmt, const char* file, int line) noexcept {
    if (e == cudaSuccess) return true;
    try {
      record(static_cast<int>(e), op, cuda_text(e, stmt, file, line, device_));
    } catch (...) {
      record(static_cast<int>(e), op, "CUDA error (out of memory formatting the message)");
    }
    return false;
  }

  bool cublas_ok(const char* op, cublasStatus_t s, const char* stmt, const char* file, int line) noexcept {
    if (s == CUBLAS_STATUS_SUCCESS) return true;
    try {
      record(static_cast<int>(s), op, cublas_text(s, stmt, file, line, device_));
    } catch (...) {
      record(static_cast<int>(s), op, "cuBLAS error (out of memory formatting the message)");
    }
    return false;
  }

  bool real_ok(const Real& r, const char* op, const char* what) noexcept {
    char buf[128];
    if (!r.p) {
      std::snprintf(buf, sizeof buf, "null pointer '%s'", what);
      fail(op, buf);
      return false;
    }
    if (r.esize != 4) {
      std::snprintf(buf, sizeof buf, "'%s' has element size %u, this backend stores 4-byte reals", what, r.esize);
      fail(op, buf);
      return false;
    }
    return true;
  }

  bool matrix_ok(const char* op, int rows, int cols, int ld) noexcept {
    if (rows < 0 || cols < 0) {
      fail(op, "negative size");
      return false;
    }
    if (rows > 0 && ld < cols) {
      fail(op, "row stride smaller than the number of columns");
      return false;
    }
    return true;
  }

  /// The op's scratch: while planning, only noted (and null returned: the op does no work);
  /// otherwise the reserved scratch if it is large enough, else a recorded error.
  void* scratch(const char* op, std::size_t bytes) noexcept {
    if (planning_) {
      plan_need_ = std::max(plan_need_, bytes);
      return nullptr;
    }
    if (bytes > scratch_bytes_) {
      char buf[200];
      std::snprintf(buf, sizeof buf,
                    "needs %zu bytes of scratch, %zu reserved: plan the step first (plan_begin, the ops, plan_end)",
                    bytes, scratch_bytes_);
      fail(op, buf);
      return nullptr;
    }
    return scratch_;
  }

  void transfer(const char* op, void* dst, const void* src, std::size_t bytes) noexcept {
    if (bytes == 0) return;
    if (!dst || !src) return fail(op, "null pointer");
    if (capturing_) return fail(op, "host transfers are not allowed while capturing a graph");
    if (!DQN_CUDA_OK(op, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_))) return;
    DQN_CUDA_OK(op, cudaStreamSynchronize(stream_));
  }

  /// The cached cuBLASLt descriptors and algorithm for this problem, found on first use (in plan
  /// mode, or the first run outside capture). For a fused key, `bias` is the first call's bias
  /// pointer: the heuristic reads its alignment from it. Null after recording an error.
  LtPlan* plan_for(const LtKey& key, const void* bias) noexcept {
    constexpr const char* op = "gemm";
    if (auto it = plans_.find(key); it != plans_.end()) return &it->second;
    std::vector<cublasComputeType_t> candidates;
    switch (precision_) {
      case Precision::fp32: candidates = {CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_COMPUTE_32F}; break;
      case Precision::tf32: candidates = {CUBLAS_COMPUTE_32F_FAST_TF32}; break;
      case Precision::bf16: candidates = {CUBLAS_COMPUTE_32F}; break;
    }
    const auto epilogue = static_cast<cublasLtEpilogue_t>(key.epilogue);
    const bool has_bias = epilogue == CUBLASLT_EPILOGUE_BIAS || epilogue == CUBLASLT_EPILOGUE_RELU_BIAS;
    LtPlan plan;
    plan.compute = candidates.front();
    plan.has_bias = has_bias;
    const auto ab = static_cast<cudaDataType_t>(key.ab_type);
    const auto op_a = static_cast<cublasOperation_t>(key.op_a), op_b = static_cast<cublasOperation_t>(key.op_b);
    for (const cublasComputeType_t compute : candidates) {
      LtPlan p;
      p.compute = compute;
      p.has_bias = has_bias;
      cublasLtMatmulPreference_t pref = nullptr;
      bool ok = DQN_CUBLAS_OK(op, cublasLtMatmulDescCreate(&p.desc, compute, CUDA_R_32F)) &&
                DQN_CUBLAS_OK(op, cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a)) &&
                DQN_CUBLAS_OK(op, cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b)) &&
                make_layout(&p.la, ab, op_a == CUBLAS_OP_N ? key.m : key.k, op_a == CUBLAS_OP_N ? key.k : key.m,
                            key.lda, key.batch, key.stride_a) &&
                make_layout(&p.lb, ab, op_b == CUBLAS_OP_N ? key.k : key.n, op_b == CUBLAS_OP_N ? key.n : key.k,
                            key.ldb, key.batch, key.stride_b) &&
                make_layout(&p.lc, CUDA_R_32F, key.m, key.n, key.ldc, key.batch, key.stride_c) &&
                DQN_CUBLAS_OK(op, cublasLtMatmulPreferenceCreate(&pref));
      if (ok && epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
        ok = DQN_CUBLAS_OK(op, cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
        if (ok && has_bias) {
          const std::int32_t bias_type = CUDA_R_32F;
          ok = DQN_CUBLAS_OK(op, cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type)) &&
               DQN_CUBLAS_OK(op, cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
          if (ok && key.batch > 1)
            ok = DQN_CUBLAS_OK(op, cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, &key.stride_bias, sizeof key.stride_bias));
        }
      }
      if (ok) {
        const std::uint64_t ws = kWorkspaceBytes;
        ok = DQN_CUBLAS_OK(op, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws)) &&
             DQN_CUBLAS_OK(op, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &key.align_a, sizeof key.align_a)) &&
             DQN_CUBLAS_OK(op, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &key.align_b, sizeof key.align_b)) &&
             DQN_CUBLAS_OK(op, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &key.align_c, sizeof key.align_c)) &&
             DQN_CUBLAS_OK(op, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &key.align_c, sizeof key.align_c));
      }
      if (ok) {
        std::array<cublasLtMatmulHeuristicResult_t, kMaxAlgos> results{};
        int found = 0;
        // "No algorithm" is not an error: it falls through to the next candidate or to cuBLAS
        // (for a fused key: to the plain GEMM and bias_act).
        const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(lt_, p.desc, p.la, p.lb, p.lc, p.lc, pref,
                                                                autotune_ ? kMaxAlgos : 1, results.data(), &found);
        if (s == CUBLAS_STATUS_SUCCESS) {
          try {
            for (int i = 0; i < std::min(found, kMaxAlgos); ++i)
              if (results[static_cast<std::size_t>(i)].state == CUBLAS_STATUS_SUCCESS)
                p.candidates.push_back(LtAlgo{results[static_cast<std::size_t>(i)].algo});
            if (autotune_ && tune_split_k_) add_split_k_variants(p, key);
          } catch (...) {
            p.candidates.clear();  // out of memory: the heuristic's first below, if any
            if (found > 0 && results[0].state == CUBLAS_STATUS_SUCCESS) p.candidates.assign(1, LtAlgo{results[0].algo});
          }
        }
        if (!p.candidates.empty()) {
          p.use_lt = true;
          p.algo = p.candidates.front().algo;
        }
      }
      if (pref) cublasLtMatmulPreferenceDestroy(pref);
      if (!ok) {
        p.release();
        return nullptr;
      }
      if (p.use_lt) {
        plan = p;
        break;
      }
      p.release();
    }
    if (plan.use_lt && autotune_ && plan.candidates.size() > 1) {
      // Tuned before in this process (another engine, the same problem): take that choice.
      std::lock_guard<std::mutex> lock(tuned_mutex());
      const auto& tuned = tuned_algos();
      if (auto it = tuned.find(TuneKey{device_, static_cast<int>(precision_), key});
          it != tuned.end() && it->second.compute == plan.compute) {
        plan.algo = it->second.algo;
        plan.candidates.clear();
      }
    }
    if (!plan.use_lt || !autotune_ || plan.candidates.size() <= 1) {
      plan.decided = true;  // nothing to choose from
      plan.candidates.clear();
    }
    try {
      return &plans_.emplace(key, std::move(plan)).first->second;
    } catch (...) {
      plan.release();
      fail(op, "out of memory caching a GEMM plan");
      return nullptr;
    }
  }

  /// Appends to p.candidates the split-k variants (see kSplitKBase) that cuBLASLt accepts for
  /// this problem within the workspace. Reduction in the workspace in the compute type: a fixed
  /// order, so the result does not change from run to run.
  void add_split_k_variants(LtPlan& p, const LtKey& key) {
    const std::size_t base = std::min<std::size_t>(p.candidates.size(), kSplitKBase);
    for (std::size_t i = 0; i < base; ++i) {
      const cublasLtMatmulAlgo_t& algo = p.candidates[i].algo;
      std::int32_t splits = 1, support = 0;
      std::uint32_t schemes = 0;
      std::size_t got = 0;
      if (cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits, sizeof splits, &got) !=
              CUBLAS_STATUS_SUCCESS || splits != 1)
        continue;
      int id = 0;
      if (cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &got) != CUBLAS_STATUS_SUCCESS)
        continue;
      cublasLtMatmulAlgo_t probe{};
      if (cublasLtMatmulAlgoInit(lt_, p.compute, CUDA_R_32F, static_cast<cudaDataType_t>(key.ab_type),
                                 static_cast<cudaDataType_t>(key.ab_type), CUDA_R_32F, CUDA_R_32F, id, &probe) !=
              CUBLAS_STATUS_SUCCESS ||
          cublasLtMatmulAlgoCapGetAttribute(&probe, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &support, sizeof support, &got) !=
              CUBLAS_STATUS_SUCCESS ||
          !support ||
          cublasLtMatmulAlgoCapGetAttribute(&probe, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK, &schemes, sizeof schemes,
                                            &got) != CUBLAS_STATUS_SUCCESS ||
          !(schemes & CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE))
        continue;
      for (const std::int32_t n : {2, 4}) {
        if (key.k / n < kSplitKMinSlice) break;
        cublasLtMatmulAlgo_t v = algo;
        const std::uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
        cublasLtMatmulHeuristicResult_t check{};
        if (cublasLtMatmulAlgoConfigSetAttribute(&v, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &n, sizeof n) ==
                CUBLAS_STATUS_SUCCESS &&
            cublasLtMatmulAlgoConfigSetAttribute(&v, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof scheme) ==
                CUBLAS_STATUS_SUCCESS &&
            cublasLtMatmulAlgoCheck(lt_, p.desc, p.la, p.lb, p.lc, p.lc, &v, &check) == CUBLAS_STATUS_SUCCESS &&
            check.state == CUBLAS_STATUS_SUCCESS && check.workspaceSize <= kWorkspaceBytes)
          p.candidates.push_back(LtAlgo{v});
      }
    }
  }

  bool wants_tuning(const LtPlan* p) const noexcept {
    return autotune_ && !capturing_ && p->use_lt && !p->decided && p->candidates.size() > 1;
  }

  /// One cuBLASLt call of `p` with `algo`: D = d (C = c read only when beta != 0); a bias
  /// epilogue gets its pointer here (a host-side attribute of the cached descriptor, read at
  /// the call: safe under capture, each captured call keeps its own pointer).
  cublasStatus_t lt_matmul(const LtPlan& p, const cublasLtMatmulAlgo_t& algo, const void* a, const void* b,
                           const float* c, float* d, const void* bias, float alpha, float beta) noexcept {
    if (p.has_bias) {
      const cublasStatus_t s = cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
      if (s != CUBLAS_STATUS_SUCCESS) return s;
    }
    return cublasLtMatmul(lt_, p.desc, &alpha, a, p.la, b, p.lb, &beta, c, p.lc, d, p.lc, &algo, workspace_,
                          kWorkspaceBytes, stream_);
  }

  // --- tile_gemm -------------------------------------------------------------------------------

  static constexpr int kTileUndecided = -2, kTileLt = -1;
  /// A tile choice >= 0 is a shape (< kTileGemmConfigs), + kTileLdm where its k loop reads the
  /// fragments by ldmatrix (TileGemm::ldmatrix: the same bits, timed as another candidate).
  static constexpr int kTileLdm = 64;
  static_assert(cuda::kTileGemmConfigs <= kTileLdm, "a shape index below kTileLdm");

  static cuda::TileGemm tile_args(const Gemm& g) noexcept {
    cuda::TileGemm t;
    t.ta = g.ta;
    t.tb = g.tb;
    t.relu = g.act == Act::relu;
    t.m = g.m;
    t.n = g.n;
    t.k = g.k;
    t.lda = g.lda;
    t.ldb = g.ldb;
    t.ldc = g.ldc;
    t.batch = g.batch;
    t.alpha = g.alpha;
    t.beta = g.beta;
    t.a = g.a.as<const float>();
    t.b = g.b.as<const float>();
    t.c = g.c.as<float>();
    t.c_in = t.c;
    t.bias = g.bias ? g.bias.as<const float>() : nullptr;
    const bool batched = g.batch > 1;
    t.stride_a = batched ? g.stride_a : 0;
    t.stride_b = batched ? g.stride_b : 0;
    t.stride_c = batched ? g.stride_c : 0;
    t.stride_bias = batched && g.bias ? g.stride_bias : 0;
    t.mask = g.mask ? g.mask.as<const float>() : nullptr;
    t.ldmask = g.ldmask;
    t.mask_rows = g.mask_rows > 0 ? g.mask_rows : g.m;
    t.stride_mask = batched && g.mask ? g.stride_mask : 0;
    return t;
  }

  /// This problem's tile choice (kTileUndecided until decided), taken from the process's shared
  /// choices when another backend decided it by timing. Null after recording an error.
  int* tile_slot(const LtKey& tkey) noexcept {
    try {
      auto [it, fresh] = tiles_.try_emplace(tkey, kTileUndecided);
      if (fresh && !tile_.forced) {
        std::lock_guard<std::mutex> lock(tuned_mutex());
        const auto& shared = tuned_tiles();
        if (auto s = shared.find(tile_key(tkey)); s != shared.end())
          it->second = s->second;
      }
      return &it->second;
    } catch (...) {
      fail("gemm", "out of memory caching a GEMM plan");
      return nullptr;
    }
  }
  void remember_tile(const LtKey& tkey, int choice) noexcept {
    if (tile_.forced) return;  // a forced choice is this backend's own
    try {
      std::lock_guard<std::mutex> lock(tuned_mutex());
      tuned_tiles().emplace(tile_key(tkey), choice);
    } catch (...) {
      // not shared with later engines; this one keeps its choice
    }
  }

  /// tile_gemm shape `config` runs tg (while planning: nothing runs); a batch2 call's entries are
  /// all in that launch (the shape was chosen for tg with them: tile_gemm_fits holds).
  void tile_chosen(const cuda::TileGemm& tg, int choice) noexcept {
    if (tg.batch2 > 1) ran_batch2_ = true;
    if (!planning_) run_tile(tg, choice);
  }
  void run_tile(const cuda::TileGemm& tg, int choice) noexcept {
    if (DQN_CUDA_OK("gemm", launch_tile(tg, choice)) && tg.mask) masked_in_kernel_ = true;
  }
  /// Launches tile choice `choice` (a shape, + kTileLdm for its ldmatrix kernel) of tg.
  cudaError_t launch_tile(const cuda::TileGemm& tg, int choice) noexcept {
    cuda::TileGemm t = tg;
    t.ldmatrix = choice >= kTileLdm;
    return cuda::tile_gemm(stream_, t, choice % kTileLdm);
  }

  /// DQN_TILE_GEMM=1 or a shape: the named shape, or the fastest that fits (timed, outside
  /// capture with autotuning on; else the first); cuBLASLt only when no shape fits.
  int forced_tile(const LtKey& tkey, const cuda::TileGemm& tg, const float* c) noexcept {
    int choice = kTileLt;
    const int ldm = ldm_candidate(0) ? 0 : kTileLdm;  // untimed: plain loads unless ldmatrix is forced
    if (tile_.config >= 0) {
      if (cuda::tile_gemm_fits(tg, tile_.config)) choice = tile_.config + ldm;
    } else {
      for (int cfg = 0; cfg < cuda::kTileGemmConfigs && choice < 0; ++cfg)
        if (tile_shape_on(cfg) && cuda::tile_gemm_fits(tg, cfg)) choice = cfg + ldm;  // the first that fits
      float* d = choice >= 0 && autotune_ && !capturing_ ? tune_buffer(tile_extent(tg)) : nullptr;
      if (d && tune_events()) choice = fastest_tile(tg, c, d, INFINITY, choice);
    }
    remember_tile(tkey, choice);
    return choice;
  }

  /// Times the cuBLASLt algorithm `p` holds (fixed by its own tuning just before) and every tile
  /// shape that fits, on these operands (D in the private buffer). kTileLt when timing is not
  /// possible.
  int timed_tile(const LtKey& tkey, const cuda::TileGemm& tg, const LtPlan& p, bool fused, const void* pa,
                 const void* pb, const float* c, const void* bias, float alpha, float beta) noexcept {
    int choice = kTileLt;
    float* d = tune_buffer(tile_extent(tg));
    if (d && tune_events()) {
      float best = INFINITY;
      if (p.use_lt) {
        bool works = false;
        best = time_algo(p, p.algo, pa, pb, c, d, fused ? bias : nullptr, alpha, beta, works);
        if (status_ != 0) return kTileLt;
        if (!works) best = INFINITY;
        // Unfused, the cuBLASLt path also runs bias_act, which tile_gemm does not need: not
        // counted, so a tile shape must win on the GEMM alone. The mask's kernel is counted: it
        // runs after cuBLASLt on every path but tile_gemm's.
        if (tg.mask && std::isfinite(best)) {
          best += time_graph([&] {
            return cuda::relu_mask(stream_, d, tg.m, tg.n, tg.ldc, tg.mask, tg.ldmask, tg.mask_rows, tg.batch,
                                   tg.stride_c, tg.stride_mask) == cudaSuccess;
          });
          if (status_ != 0) return kTileLt;
        }
        // A batch2 call: the library runs one entry per launch, one after the other; tile_gemm
        // (timed below) all of them in one.
        best *= static_cast<float>(std::max(tg.batch2, 1));
      }
      choice = fastest_tile(tg, c, d, best, choice);
    }
    remember_tile(tkey, choice);
    return choice;
  }

  /// The key of a tile choice among the process's: the problem, and which shapes were candidates
  /// (a backend with DQN_TILE_SPLITK=1 has one more, and DQN_TILE_LDMATRIX set to 0 or 1 half or
  /// only the ldmatrix kernels, so each keeps its own choices).
  TuneKey tile_key(const LtKey& tkey) const noexcept {
    const int candidates = 3 * (tile_splitk_ ? 1 : 0) + static_cast<int>(tile_ldm_);
    return TuneKey{device_, 6 * static_cast<int>(precision_) + candidates, tkey};
  }

  /// Whether autotuning (or DQN_TILE_GEMM=1) may pick tile shape `cfg`: the split-k shapes only
  /// with DQN_TILE_SPLITK=1 (DQN_TILE_GEMM=32x32k2 or 32x32k4 names one in any case).
  bool tile_shape_on(int cfg) const noexcept { return cfg < cuda::kTileSplitK || tile_splitk_; }
  /// Whether the plain loads (ldm 0) or ldmatrix (kTileLdm) are a candidate (DQN_TILE_LDMATRIX).
  bool ldm_candidate(int ldm) const noexcept {
    return ldm == 0 ? tile_ldm_ != LdmMode::on : tile_ldm_ != LdmMode::off;
  }

  /// Times every tile shape that fits, each with and without ldmatrix (DQN_TILE_LDMATRIX unset;
  /// =0 / =1: only without / with); one replaces the incumbent `choice` (timed at `best` ms, +inf:
  /// none yet) only when faster by more than kTuneMargin. kTileLt after a sticky error.
  int fastest_tile(const cuda::TileGemm& tg, const float* c, float* d, float best, int choice) noexcept {
    for (int cfg = 0; cfg < cuda::kTileGemmConfigs; ++cfg) {
      if (!tile_shape_on(cfg) || !cuda::tile_gemm_fits(tg, cfg)) continue;
      for (const int ldm : {0, kTileLdm}) {
        if (!ldm_candidate(ldm)) continue;
        // a layout without a k-contiguous operand runs the same kernel with ldmatrix: timed once
        if (ldm != 0 && ldm_candidate(0) && !cuda::tile_gemm_ldmatrix_layout(tg.ta, tg.tb)) continue;
        const float ms = time_tile(tg, cfg + ldm, c, d);
        if (status_ != 0) return kTileLt;
        if (ms < best * (1.0f - kTuneMargin)) {
          best = ms;
          choice = cfg + ldm;
        }
      }
    }
    return choice;
  }

  /// Elements from C's first to one past its last (row-major, batched): the tune buffer's need.
  static std::size_t tile_extent(const cuda::TileGemm& tg) noexcept {
    const std::int64_t extent = (tg.batch > 1 ? (tg.batch - 1) * tg.stride_c : 0) +
                                (tg.batch2 > 1 ? (tg.batch2 - 1) * tg.stride2_c : 0) +
                                static_cast<std::int64_t>(tg.m - 1) * tg.ldc + tg.n;
    return static_cast<std::size_t>(extent) * 4;
  }

  float time_tile(const cuda::TileGemm& tg, int choice, const float* c, float* d) noexcept {
    cuda::TileGemm t = tg;
    t.c_in = c;  // beta·C from the caller's C, D to the private buffer
    t.c = d;
    const bool works = launch_tile(t, choice) == cudaSuccess;  // also the warm-up
    if (!works) {
      cudaGetLastError();
      return INFINITY;
    }
    return time_graph([&] { return launch_tile(t, choice) == cudaSuccess; });
  }

  /// The unfused epilogue: C_i = act(C_i + bias_i) with the bias_act kernel, one launch when the
  /// batch entries sit side by side in C's rows with their biases contiguous (bdq's branches).
  void separate_epilogue(const Gemm& g) noexcept {
    constexpr const char* op = "gemm";
    const float* bias = g.bias ? g.bias.as<const float>() : nullptr;
    const bool relu = g.act == Act::relu;
    float* c = g.c.as<float>();
    const std::int64_t wide = static_cast<std::int64_t>(g.batch) * g.n;
    if (g.batch > 1 && g.stride_c == g.n && (!bias || g.stride_bias == g.n) && wide <= g.ldc) {
      DQN_CUDA_OK(op, cuda::bias_act(stream_, c, bias, g.m, static_cast<int>(wide), g.ldc, relu));
      return;
    }
    for (int i = 0; i < g.batch; ++i)
      if (!DQN_CUDA_OK(op, cuda::bias_act(stream_, c + i * g.stride_c, bias ? bias + i * g.stride_bias : nullptr, g.m,
                                          g.n, g.ldc, relu)))
        return;
  }

  /// Times every candidate of `p` on these operands (D in a private buffer shaped like C, so
  /// nothing the caller can see is written) and keeps the fastest; fixes the plan for good.
  /// Never inside a capture: it synchronises. A candidate cuBLASLt refuses is dropped; when all
  /// are, the plan turns to its fallback (use_lt = false). Timing trouble keeps the heuristic's
  /// order; only a sticky CUDA error is recorded.
  void autotune(LtPlan& p, const LtKey& key, const void* a, const void* b, const float* c, const void* bias,
                float alpha, float beta) noexcept {
    p.decided = true;
    std::vector<LtAlgo> cands;
    cands.swap(p.candidates);
    if (cands.size() <= 1 || capturing_) return;
    const std::int64_t extent = (key.batch > 1 ? (key.batch - 1) * key.stride_c : 0) +
                                static_cast<std::int64_t>(key.n - 1) * key.ldc + key.m;
    float* d = tune_buffer(static_cast<std::size_t>(extent) * 4);
    if (!d || !tune_events()) return;
    int best = -1;
    float best_ms = 0.0f;
    bool any_works = false;
    for (std::size_t i = 0; i < cands.size(); ++i) {
      bool works = false;
      const float ms = time_algo(p, cands[i].algo, a, b, c, d, bias, alpha, beta, works);
      if (status_ != 0) return;  // a sticky error (recorded): leave it there
      if (!works) continue;
      if (!any_works) {
        any_works = true;
        best = static_cast<int>(i);
        best_ms = ms;
      } else if (ms < best_ms * (1.0f - kTuneMargin)) {
        best = static_cast<int>(i);
        best_ms = ms;
      }
    }
    if (!any_works) {
      p.use_lt = false;
      return;
    }
    p.algo = cands[static_cast<std::size_t>(best)].algo;
    try {
      std::lock_guard<std::mutex> lock(tuned_mutex());
      tuned_algos().emplace(TuneKey{device_, static_cast<int>(precision_), key}, TunedAlgo{p.compute, p.algo});
    } catch (...) {
      // not shared with later engines; this one keeps its choice
    }
  }

  /// The median over kTuneSamples of kTuneReps calls replayed from a graph (so host launch gaps
  /// do not count: the GEMM runs as it will in the step), in ms; +inf when timing failed.
  /// works: cuBLASLt accepted the algorithm for this problem.
  float time_algo(const LtPlan& p, const cublasLtMatmulAlgo_t& algo, const void* a, const void* b, const float* c,
                  float* d, const void* bias, float alpha, float beta, bool& works) noexcept {
    works = lt_matmul(p, algo, a, b, c, d, bias, alpha, beta) == CUBLAS_STATUS_SUCCESS;  // also the warm-up
    if (!works) return INFINITY;
    return time_graph([&] { return lt_matmul(p, algo, a, b, c, d, bias, alpha, beta) == CUBLAS_STATUS_SUCCESS; });
  }

  /// The median over kTuneSamples of kTuneReps calls of `enqueue` (one launch on stream_ each)
  /// replayed from a graph, in ms; +inf when timing failed. Synchronises: never inside a capture.
  template <class F>
  float time_graph(F&& enqueue) noexcept {
    constexpr const char* op = "gemm (autotune)";
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    float result = INFINITY;
    if (cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal) == cudaSuccess) {
      bool ok = true;
      for (int r = 0; r < kTuneReps && ok; ++r) ok = enqueue();
      const cudaError_t e = cudaStreamEndCapture(stream_, &graph);
      if (ok && e == cudaSuccess && graph && cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess &&
          cudaGraphLaunch(exec, stream_) == cudaSuccess) {
        bool timed = true;
        for (int s = 0; s < kTuneSamples && timed; ++s)
          timed = cudaEventRecord(tune_events_[2 * s], stream_) == cudaSuccess &&
                  cudaGraphLaunch(exec, stream_) == cudaSuccess &&
                  cudaEventRecord(tune_events_[2 * s + 1], stream_) == cudaSuccess;
        std::array<float, kTuneSamples> ms{};
        if (timed && DQN_CUDA_OK(op, cudaEventSynchronize(tune_events_[2 * kTuneSamples - 1]))) {
          for (int s = 0; s < kTuneSamples && timed; ++s)
            timed = cudaEventElapsedTime(&ms[static_cast<std::size_t>(s)], tune_events_[2 * s], tune_events_[2 * s + 1]) ==
                    cudaSuccess;
          if (timed) {
            std::sort(ms.begin(), ms.end());
            result = ms[kTuneSamples / 2];
          }
        }
      }
    }
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();  // a failed capture or launch above is not the step's error
    // Whatever ran must be done before the next candidate (and before the step's work).
    DQN_CUDA_OK(op, cudaStreamSynchronize(stream_));
    return result;
  }

  /// The private D of autotuning, grown as needed (outside capture only); kept until release.
  float* tune_buffer(std::size_t bytes) noexcept {
    if (bytes <= tune_bytes_) return static_cast<float*>(tune_d_);
    bytes = round_up(bytes, 256);
    if (tune_d_) {
      cudaFree(tune_d_);
      forget_device_bytes(tune_bytes_);
      tune_d_ = nullptr;
      tune_bytes_ = 0;
    }
    if (cudaMalloc(&tune_d_, bytes) != cudaSuccess) {
      cudaGetLastError();
      tune_d_ = nullptr;
      return nullptr;  // no tuning for this key, nothing failed
    }
    tune_bytes_ = bytes;
    note_device_bytes(bytes);
    return static_cast<float*>(tune_d_);
  }

  bool tune_events() noexcept {
    if (tune_events_[0]) return true;
    for (auto& e : tune_events_) {
      if (cudaEventCreate(&e) != cudaSuccess) {
        cudaGetLastError();
        for (auto& x : tune_events_) {
          if (x) cudaEventDestroy(x);
          x = nullptr;
        }
        return false;
      }
    }
    return true;
  }

  bool make_layout(cublasLtMatrixLayout_t* l, cudaDataType_t type, int rows, int cols, std::int64_t ld, int batch,
                   std::int64_t stride) noexcept {
    constexpr const char* op = "gemm";
    if (!DQN_CUBLAS_OK(op, cublasLtMatrixLayoutCreate(l, type, static_cast<std::uint64_t>(rows),
                                                       static_cast<std::uint64_t>(cols), ld)))
      return false;
    if (batch <= 1) return true;
    const std::int32_t count = batch;
    return DQN_CUBLAS_OK(op, cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count)) &&
           DQN_CUBLAS_OK(op, cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
  }

  void release() noexcept {
    for (auto& [key, plan] : plans_) plan.release();
    plans_.clear();
    for (auto st : streams_)
      if (st) cudaStreamSynchronize(st);
    for (auto& e : tune_events_) {
      if (e) cudaEventDestroy(e);
      e = nullptr;
    }
    if (tune_d_) cudaFree(tune_d_);
    tune_d_ = nullptr;
    tune_bytes_ = 0;
    if (scratch_base_) cudaFree(scratch_base_);
    if (counters_) cudaFree(counters_);
    counters_ = nullptr;
    if (clock_) cudaFree(clock_);
    clock_ = nullptr;
    if (workspace_base_) cudaFree(workspace_base_);
    if (lt_) cublasLtDestroy(lt_);
    if (blas_) cublasDestroy(blas_);
    for (auto& st : streams_) {
      if (st) cudaStreamDestroy(st);
      st = nullptr;
    }
    for (auto& e : side_events_) {
      if (e) cudaEventDestroy(e);
      e = nullptr;
    }
    scratch_ = workspace_ = scratch_base_ = workspace_base_ = nullptr;
    lt_ = nullptr;
    blas_ = nullptr;
    stream_ = nullptr;
  }

  Precision precision_;
  int device_;
  cudaDeviceProp props_{};
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  void* workspace_ = nullptr;
  void* scratch_ = nullptr;
  unsigned* counters_ = nullptr;
  cudaStream_t streams_[kSlots] = {};
  cudaEvent_t side_events_[2] = {};  ///< fork and join of an op's side slot (see head_forward)
  void* workspace_base_ = nullptr;  ///< kSlots slices of kWorkspaceBytes; workspace_ is the slot's
  void* scratch_base_ = nullptr;    ///< kSlots slices of scratch_bytes_; scratch_ is the slot's
  std::size_t scratch_bytes_ = 0;
  std::size_t device_bytes_ = 0, peak_bytes_ = 0;
  bool planning_ = false, capturing_ = false;
  int lane_ = 0;
  const Gemm* batch2_ = nullptr;  ///< a gemm with batch2 > 1 whose entry 0 runs next (see gemm())
  bool ran_batch2_ = false;       ///< tile_gemm ran (or, planning, will run) all of its entries
  std::size_t plan_need_ = 0;
  std::map<LtKey, LtPlan> plans_;
  std::map<LtKey, int> tiles_;  ///< tile_gemm choice per problem (key with the epilogue's bias/relu bits)
  TileMode tile_ = tile_mode_from_env();  ///< DQN_TILE_GEMM, read once per backend
  bool autotune_ = autotune_from_env();  ///< DQN_GEMM_AUTOTUNE, read once per backend
  bool tune_split_k_ = tune_split_k_from_env();  ///< DQN_GEMM_TUNE_SPLIT_K, read once per backend
  int update_cluster_ = 0;               ///< the cluster update's blocks per cluster (0: not used)
  cuda::UpdateOptions update_opt_ = update_options_from_env();  ///< DQN_UPDATE_*, read per backend
  cuda::UpdateChoices update_choices_;  ///< what the last cluster update launch did
  /// DQN_TILE_LDMATRIX: whether tile_gemm's k loop reads the fragments of its k-contiguous
  /// operands by ldmatrix (TileGemm::ldmatrix; the same bits). Read per backend.
  LdmMode tile_ldm_ = ldm_mode_from_env();
  /// DQN_TILE_SPLITK=1: autotuning also times tile_gemm's 32x32k2 and 32x32k4 shapes (each block
  /// tile's k steps split over two or four groups of four warps, their sums added in the block: a
  /// half or a quarter of each warp's chain of multiplies). Off unless set: within the noise on
  /// an H100 (2026-12-05).
  bool tile_splitk_ = env_set("DQN_TILE_SPLITK");
  /// c51_loss two warps a (sample, branch) where the warp kernel runs and D ≤ 8 (unset or
  /// DQN_LOSS_WARPS=2; =1: one warp; read when the backend is made, anything else refused).
  bool loss_pair_ = loss_pair_from_env();
  /// dueling_dist a warp per action where the warp kernels fit: where rows·D ≤
  /// kDistPerActionPairs (the default), always or never (dist_per_action_from_env; read when the
  /// backend is made).
  DistPerAction dist_per_action_ = dist_per_action_from_env();
  bool wgrad_kernel_ = false;            ///< tile_gemm_wgrad runs here (tf32, clusters launch)
  bool chain_kernel_ = false;            ///< tile_gemm_chain runs here (tf32)
  static constexpr int kClockBlocks = 4096;  ///< blocks of the cluster update that stamp (DQN_UPDATE_CLOCK)
  static constexpr std::size_t kClockBytes = std::size_t{kClockBlocks} * 2 * cuda::kUpdateClockSlots * sizeof(std::uint64_t);
  std::uint64_t* clock_ = nullptr;       ///< their stamps [kClockBlocks][2·kUpdateClockSlots], or null
  struct ClockLaunch {
    int blocks = 0, cs = 0, normed = 0;  ///< of the last cluster update enqueued
  } clock_launch_;

  bool masked_in_kernel_ = false;        ///< gemm(): tile_gemm applied the Gemm's mask
  UpdateMode update_mode_ = update_mode_from_env();
  struct SnKey {
    const void* mats;
    int count;
    const void* params;
    std::int64_t P;
    int max_rows, max_cols;
    bool operator==(const SnKey&) const = default;
  };
  struct SnTable {
    SnKey key;
    bool tidy;
    std::vector<cuda::SnRange> ranges;  ///< per matrix, [0, 0) when empty
  };
  static SnKey sn_key(const Update& u) noexcept {
    return SnKey{u.sn_mats, u.sn_count, u.adam.params.p, u.adam.P, u.sn_max_rows, u.sn_max_cols};
  }
  const SnTable* sn_table(const Update& u) const noexcept {
    const SnKey key = sn_key(u);
    for (const auto& tab : sn_tables_)
      if (tab.key == key) return &tab;
    return nullptr;
  }
  std::vector<SnTable> sn_tables_;  ///< sn_tidy's verdicts and ranges, per table
  bool in_split_ = false;                ///< inside split_k: its slices are never split again
  bool split_k_ = split_k_from_env();     ///< DQN_GEMM_SPLIT_K, read once per backend
  static constexpr int kSplitMinK = 1024, kSplitMinSlice = 256, kSplitMaxSlices = 32;
  void* tune_d_ = nullptr;               ///< autotuning's private D
  std::size_t tune_bytes_ = 0;
  std::array<cudaEvent_t, 2 * kTuneSamples> tune_events_{};
  int status_ = 0;
  char message_[512] = {};
};

class CudaRuntime final : public Runtime {
 public:
  CudaRuntime(Precision precision, int device) : backend_(precision, device), device_(device) {
    try {
      events_.reserve(kReportSlots);
      for (int i = 0; i < kReportSlots; ++i) {
        cudaEvent_t e = nullptr;
        DQN_CUDA_THROW(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        events_.push_back(e);
      }
      DQN_CUDA_THROW(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
    } catch (...) {
      release();
      throw;
    }
  }
  ~CudaRuntime() override { release(); }

  Backend& ops() noexcept override { return backend_; }

  void* alloc_arena(std::size_t bytes) override {
    if (arena_) throw std::runtime_error("cuda: alloc_arena called twice (the arena is allocated once, at freeze)");
    bytes = std::max<std::size_t>(round_up(bytes, 256), 256);
    DQN_CUDA_THROW(cudaMalloc(&arena_, bytes));  // cudaMalloc aligns to at least 256 bytes
    // Zeroed once, so every byte of it is defined before the first step (as the CPU runtime's).
    DQN_CUDA_THROW(cudaMemset(arena_, 0, bytes));
    DQN_CUDA_THROW(cudaDeviceSynchronize());
    arena_bytes_ = bytes;
    backend_.note_device_bytes(bytes);
    return arena_;
  }

  void plan_begin() override {
    if (capturing_) throw std::runtime_error("cuda: plan_begin during graph capture");
    backend_.begin_plan();
  }

  void plan_end() override {
    if (!backend_.planning()) throw std::runtime_error("cuda: plan_end without plan_begin");
    const std::size_t need = backend_.end_plan();
    if (need > backend_.scratch_bytes() && exec_)
      throw std::runtime_error("cuda: plan_end needs " + std::to_string(need) +
                               " bytes of scratch, but a captured graph already uses the current " +
                               std::to_string(backend_.scratch_bytes()) + ": plan before capturing");
    backend_.grow_scratch(need);
  }

  bool captures() const noexcept override { return true; }

  void begin_capture() override {
    if (backend_.planning()) throw std::runtime_error("cuda: begin_capture while planning (call plan_end first)");
    if (capturing_) throw std::runtime_error("cuda: begin_capture while already capturing");
    backend_.set_lane(0);
    DQN_CUDA_THROW(cudaStreamBeginCapture(backend_.stream(), cudaStreamCaptureModeThreadLocal));
    capturing_ = true;
    backend_.set_capturing(true);
    cuda::dev::set_noting(true);
    // The other lanes join the capture by waiting on this event (on their first stage).
    DQN_CUDA_THROW(cudaEventRecord(fork_, backend_.stream()));
    for (auto& j : joined_) j = false;
    joined_[0] = true;
    for (auto& l : lane_last_) l = -1;
    node_stage_.clear();
    wide_ = false;
  }

  int lanes() const noexcept override { return kMaxLanes; }

  /// More than kNarrowLanes lanes: a wide step (dev::pdl_for). Set for this capture; end_capture
  /// clears it.
  static constexpr int kNarrowLanes = 8;
  void capture_width(int lanes) override {
    if (!capturing_) return;
    wide_ = lanes > kNarrowLanes;
    cuda::dev::set_pdl_wide(wide_);
  }

  void stage_begin(int lane, const std::vector<int>& after) override {
    if (!capturing_) return;
    backend_.set_lane(lane);
    cudaStream_t st = backend_.stream();
    if (!joined_[lane]) {
      DQN_CUDA_THROW(cudaStreamWaitEvent(st, fork_, 0));
      joined_[lane] = true;
    }
    for (int id : after) {
      if (id < 0 || id >= int(stage_events_.size()) || !stage_events_[std::size_t(id)])
        throw std::runtime_error("cuda: stage_begin waits on stage " + std::to_string(id) + ", which was not marked done");
      DQN_CUDA_THROW(cudaStreamWaitEvent(st, stage_events_[std::size_t(id)], 0));
    }
  }

  void stage_done(int id) override {
    if (!capturing_) return;
    if (id < 0) throw std::runtime_error("cuda: stage_done with a negative id");
    if (std::size_t(id) >= stage_events_.size()) stage_events_.resize(std::size_t(id) + 1, nullptr);
    cudaEvent_t& e = stage_events_[std::size_t(id)];
    if (!e) DQN_CUDA_THROW(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    DQN_CUDA_THROW(cudaEventRecord(e, backend_.stream()));
    lane_last_[backend_.lane()] = id;
    note_stage_nodes(id);
  }

  void end_capture() override {
    if (!capturing_) throw std::runtime_error("cuda: end_capture without begin_capture");
    // Join: lane 0 waits for the last stage of every other lane that took part.
    backend_.set_lane(0);
    for (int l = 1; l < kMaxLanes; ++l)
      if (joined_[l] && lane_last_[l] >= 0)
        DQN_CUDA_THROW(cudaStreamWaitEvent(backend_.stream(), stage_events_[std::size_t(lane_last_[l])], 0));
    capturing_ = false;
    backend_.set_capturing(false);
    cuda::dev::set_pdl_wide(false);
    cuda::dev::set_noting(false);
    cudaGraph_t graph = nullptr;
    const cudaError_t e = cudaStreamEndCapture(backend_.stream(), &graph);
    if (e != cudaSuccess) {
      cudaGetLastError();
      std::string text = "cuda: capture failed: " + cuda_text(e, "cudaStreamEndCapture(stream, &graph)", __FILE__,
                                                              __LINE__, device_);
      if (backend_.status() != 0) text += "; first op error: " + std::string(backend_.message());
      throw std::runtime_error(text);
    }
    if (backend_.status() != 0) {
      cudaGraphDestroy(graph);
      throw std::runtime_error(std::string("cuda: an op failed during capture, graph discarded: ") + backend_.message());
    }
    if (priority_) prioritize(graph);
    std::vector<Edge> joins = joins_ ? programmatic_joins(graph) : std::vector<Edge>{};
    // Re-capture cheaply: update the instantiated graph in place when the topology allows.
    if (exec_) {
      cudaGraphExecUpdateResultInfo info{};
      if (cudaGraphExecUpdate(exec_, graph, &info) == cudaSuccess) {
        if (graph_) cudaGraphDestroy(graph_);
        graph_ = graph;
        joins_made_ = joins.size();
        return;
      }
      cudaGetLastError();
      cudaGraphExecDestroy(exec_);
      exec_ = nullptr;
    }
    const unsigned long long flags = priority_ ? cudaGraphInstantiateFlagUseNodePriority : 0;
    cudaError_t ie = cudaGraphInstantiate(&exec_, graph, flags);
    if (ie != cudaSuccess && !joins.empty()) {  // a driver that refuses the joins: the edges as captured
      cudaGetLastError();
      exec_ = nullptr;
      if (restore_joins(graph, joins)) ie = cudaGraphInstantiate(&exec_, graph, flags);
      joins.clear();
    }
    if (ie != cudaSuccess) {
      cudaGraphDestroy(graph);
      exec_ = nullptr;
      throw_cuda(ie, "cudaGraphInstantiate(&exec, graph, 0)", __FILE__, __LINE__, device_);
    }
    if (graph_) cudaGraphDestroy(graph_);
    graph_ = graph;
    joins_made_ = joins.size();
    DQN_CUDA_THROW(cudaGraphUpload(exec_, backend_.stream()));
  }

  void replay() override {
    if (!exec_) throw std::runtime_error("cuda: replay before a graph was captured (begin_capture/end_capture)");
    DQN_CUDA_THROW(cudaGraphLaunch(exec_, backend_.stream()));
  }

  std::int64_t graph_nodes() const noexcept override {
    if (!graph_) return 0;
    std::size_t n = 0;
    if (cudaGraphGetNodes(graph_, nullptr, &n) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return static_cast<std::int64_t>(n);
  }

  UpdateClock update_clock() const override { return backend_.update_clock(); }

  std::vector<GraphNode> graph_node_info() const override {
    std::vector<GraphNode> out;
    std::vector<cudaGraphNode_t> nodes;
    std::vector<std::vector<int>> deps;
    std::vector<std::vector<char>> programmatic;
    if (!graph_ || !graph_edges(graph_, nodes, deps, &programmatic)) return out;
    for (std::size_t i = 0; i < nodes.size(); ++i) {
      GraphNode g;
      g.handle = nodes[i];
      const auto st = node_stage_.find(nodes[i]);
      g.stage = st == node_stage_.end() ? -1 : st->second;
      const cudaGraphNodeType type = node_type(nodes[i]);
      g.kernel = type == cudaGraphNodeTypeKernel;
      g.copy = type == cudaGraphNodeTypeMemcpy;
      g.deps = std::move(deps[i]);
      g.programmatic = std::move(programmatic[i]);
      out.push_back(std::move(g));
    }
    return out;
  }

  void* alloc_host(std::size_t bytes) override {
    void* p = nullptr;
    DQN_CUDA_THROW(cudaMallocHost(&p, std::max<std::size_t>(bytes, 1)));
    return p;
  }

  void free_host(void* p) noexcept override {
    if (p && cudaFreeHost(p) != cudaSuccess) cudaGetLastError();
  }

  void copy_to_host_async(void* dst, const void* src, std::size_t bytes, int slot) override {
    if (slot < 0 || slot >= kReportSlots)
      throw std::runtime_error("cuda: report slot " + std::to_string(slot) + " out of range [0, " +
                               std::to_string(kReportSlots) + ")");
    DQN_CUDA_THROW(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, backend_.stream()));
    DQN_CUDA_THROW(cudaEventRecord(events_[static_cast<std::size_t>(slot)], backend_.stream()));
  }

  bool ready(int slot) override {
    if (slot < 0 || slot >= kReportSlots)
      throw std::runtime_error("cuda: report slot " + std::to_string(slot) + " out of range");
    const cudaError_t e = cudaEventQuery(events_[static_cast<std::size_t>(slot)]);
    if (e == cudaSuccess) return true;
    if (e == cudaErrorNotReady) {
      cudaGetLastError();
      return false;
    }
    throw_cuda(e, "cudaEventQuery(events[slot])", __FILE__, __LINE__, device_);
    return false;
  }

  void synchronize() override { DQN_CUDA_THROW(cudaStreamSynchronize(backend_.stream())); }

  // CUDA events on the runtime's stream around the enqueued work (timing events made here, once
  // per call: timing is never inside a step).
  double time_us(const std::function<void()>& work) override {
    cudaEvent_t start = nullptr, stop = nullptr;
    DQN_CUDA_THROW(cudaEventCreate(&start));
    DQN_CUDA_THROW(cudaEventCreate(&stop));
    DQN_CUDA_THROW(cudaStreamSynchronize(backend_.stream()));
    DQN_CUDA_THROW(cudaEventRecord(start, backend_.stream()));
    work();
    DQN_CUDA_THROW(cudaEventRecord(stop, backend_.stream()));
    DQN_CUDA_THROW(cudaEventSynchronize(stop));
    float ms = 0;
    DQN_CUDA_THROW(cudaEventElapsedTime(&ms, start, stop));
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    return double(ms) * 1000.0;
  }

  std::string describe() const override {
    const cudaDeviceProp& p = backend_.props();
    char buf[640];
    std::snprintf(buf, sizeof buf,
                  "cuda device %d: %s (sm_%d%d, %d SMs, %.1f GiB), precision %s, cuBLASLt workspace %zu MiB, "
                  "scratch %zu KiB, arena %zu KiB at %p (workspace at %p, scratch at %p), update %s",
                  device_, p.name, p.major, p.minor, p.multiProcessorCount,
                  static_cast<double>(p.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0), precision_name(backend_.precision()),
                  kWorkspaceBytes >> 20, backend_.scratch_bytes() >> 10, arena_bytes_ >> 10, arena_,
                  backend_.workspace_base(), backend_.scratch_base(), backend_.update_path().c_str());
    std::string text = buf;
    if (graph_)
      text += ", " + std::to_string(joins_made_) + " programmatic join(s) in the graph" +
              (joins_ ? "" : " (DQN_PDL_JOINS off)");
    return text;
  }

  std::size_t peak_bytes() const noexcept override { return backend_.peak_device_bytes(); }

  void profile_range(bool on) noexcept override {
    if ((on ? cudaProfilerStart() : cudaProfilerStop()) != cudaSuccess) cudaGetLastError();  // no profiler: fine
  }

 private:
  void release() noexcept {
    if (capturing_) {
      try {
        backend_.set_lane(0);  // the capture began on lane 0's stream
      } catch (...) {
      }
      cudaGraph_t g = nullptr;
      if (cudaStreamEndCapture(backend_.stream(), &g) == cudaSuccess && g) cudaGraphDestroy(g);
      cudaGetLastError();
      capturing_ = false;
      cuda::dev::set_pdl_wide(false);
      cuda::dev::set_noting(false);
    }
    cudaStreamSynchronize(backend_.stream());
    if (exec_) cudaGraphExecDestroy(exec_);
    if (graph_) cudaGraphDestroy(graph_);
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    for (cudaEvent_t e : stage_events_)
      if (e) cudaEventDestroy(e);
    stage_events_.clear();
    if (fork_) cudaEventDestroy(fork_);
    fork_ = nullptr;
    if (arena_) cudaFree(arena_);
    exec_ = nullptr;
    graph_ = nullptr;
    events_.clear();
    arena_ = nullptr;
  }

  /// Each kernel node's launch priority from the longest chain of kernels that still follows it
  /// in the graph (list scheduling's rank): where the step's lanes fill the GPU, the block
  /// scheduler then places the blocks of the chain that sets the step's length first. The graph
  /// is instantiated to honour node priorities. Results are the same either way. On unless
  /// DQN_PRIORITY=0 (the H200, 2026-12-04: all four heads 263.3 against 271.9 µs, C51 89.9 both).
  static bool priority_from_env() noexcept { return cuda::env_on("DQN_PRIORITY"); }

  /// A graph edge from -> to.
  struct Edge {
    cudaGraphNode_t from, to;
  };
  /// Programmatic joins (DQN_PDL_JOINS=1; off unless set: within the noise on an H100, 2026-12-05):
  /// a kernel launched with the programmatic attribute is placed early only after the one kernel
  /// before it in its stream; a stage that waits for another lane's stage (a join) was captured
  /// with plain edges, so its first kernel was placed only after both had finished (about 1 µs
  /// after, where an early placement waits 0.5–0.7). Here every plain edge between two kernels
  /// into a kernel that begins with pdl_entry() (dev::is_pdl_kernel) and would take the attribute
  /// (dev::pdl_for_width, as captured) becomes programmatic: the kernel is placed once every
  /// kernel it waits for has passed its own wait, and its griddepcontrol.wait then waits for their
  /// completion and their writes, as the plain edge did. Returns the edges changed
  /// (restore_joins undoes them).
  static bool joins_from_env() noexcept { return env_set("DQN_PDL_JOINS"); }
  /// An edge that triggers when every block of its kernel has passed launch_dependents (or ended).
  static cudaGraphEdgeData programmatic_edge() noexcept {
    cudaGraphEdgeData e{};
    e.type = cudaGraphDependencyTypeProgrammatic;
    e.from_port = cudaGraphKernelNodePortProgrammatic;
    return e;
  }
  std::vector<Edge> programmatic_joins(cudaGraph_t graph) noexcept {
    std::vector<Edge> changed;
    std::vector<cudaGraphNode_t> nodes;
    if (!graph_node_list(graph, nodes)) return changed;
    try {
      for (cudaGraphNode_t to : nodes) {
        if (node_type(to) != cudaGraphNodeTypeKernel) continue;
        cudaKernelNodeParams kp{};
        if (cudaGraphKernelNodeGetParams(to, &kp) != cudaSuccess) {
          cudaGetLastError();
          continue;
        }
        if (!cuda::dev::is_pdl_kernel(kp.func) || !cuda::dev::pdl_for_width(kp.sharedMemBytes, wide_)) continue;
        std::size_t nd = 0;
        if (cudaGraphNodeGetDependencies(to, nullptr, nullptr, &nd) != cudaSuccess) {
          cudaGetLastError();
          continue;
        }
        std::vector<cudaGraphNode_t> from(nd);
        std::vector<cudaGraphEdgeData> data(nd);
        if (nd == 0 || cudaGraphNodeGetDependencies(to, from.data(), data.data(), &nd) != cudaSuccess) {
          cudaGetLastError();
          continue;
        }
        for (std::size_t k = 0; k < nd; ++k) {
          if (data[k].type != cudaGraphDependencyTypeDefault || data[k].from_port != cudaGraphKernelNodePortDefault ||
              node_type(from[k]) != cudaGraphNodeTypeKernel)
            continue;
          const cudaGraphEdgeData pe = programmatic_edge();
          if (cudaGraphRemoveDependencies(graph, &from[k], &to, &data[k], 1) != cudaSuccess) {
            cudaGetLastError();
            continue;
          }
          if (cudaGraphAddDependencies(graph, &from[k], &to, &pe, 1) != cudaSuccess) {
            cudaGetLastError();
            if (cudaGraphAddDependencies(graph, &from[k], &to, &data[k], 1) != cudaSuccess) cudaGetLastError();
            continue;
          }
          changed.push_back(Edge{from[k], to});
        }
      }
    } catch (...) {
      // out of memory listing edges: the rest stay as captured (those changed are recorded)
    }
    return changed;
  }
  /// The edges programmatic_joins changed, plain again. False if one could not be restored.
  static bool restore_joins(cudaGraph_t graph, const std::vector<Edge>& joins) noexcept {
    bool ok = true;
    const cudaGraphEdgeData pe = programmatic_edge(), plain{};
    for (const Edge& e : joins) {
      if (cudaGraphRemoveDependencies(graph, &e.from, &e.to, &pe, 1) != cudaSuccess ||
          cudaGraphAddDependencies(graph, &e.from, &e.to, &plain, 1) != cudaSuccess) {
        cudaGetLastError();
        ok = false;
      }
    }
    return ok;
  }
  void prioritize(cudaGraph_t graph) noexcept {
    std::vector<cudaGraphNode_t> nodes;
    std::vector<std::vector<int>> deps;
    int least = 0, greatest = 0;
    if (!graph_edges(graph, nodes, deps) || cudaDeviceGetStreamPriorityRange(&least, &greatest) != cudaSuccess) {
      cudaGetLastError();
      return;
    }
    const std::size_t n = nodes.size();
    std::vector<std::vector<std::size_t>> succ(n);
    std::vector<int> indeg(n, 0), kernel(n, 0);
    for (std::size_t i = 0; i < n; ++i) {
      kernel[i] = node_type(nodes[i]) == cudaGraphNodeTypeKernel;
      for (int d : deps[i]) {
        succ[std::size_t(d)].push_back(i);
        ++indeg[i];
      }
    }
    // a topological order (Kahn), then the ranks from the sinks back
    std::vector<std::size_t> order;
    for (std::size_t i = 0; i < n; ++i)
      if (indeg[i] == 0) order.push_back(i);
    for (std::size_t q = 0; q < order.size(); ++q)
      for (std::size_t j : succ[order[q]])
        if (--indeg[j] == 0) order.push_back(j);
    std::vector<int> rank(n, 0);
    int top = 1;
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      int r = 0;
      for (std::size_t j : succ[*it]) r = std::max(r, rank[j]);
      rank[*it] = r + kernel[*it];
      top = std::max(top, rank[*it]);
    }
    const int levels = least - greatest;  // e.g. 0 (least) … −5 (greatest): 6 levels
    for (std::size_t i = 0; i < n; ++i) {
      if (!kernel[i]) continue;
      cudaLaunchAttributeValue v{};
      v.priority = least - static_cast<int>(std::lround(static_cast<double>(levels) * rank[i] / top));
      if (cudaGraphKernelNodeSetAttribute(nodes[i], cudaLaunchAttributePriority, &v) != cudaSuccess) cudaGetLastError();
    }
  }

  /// A graph's nodes (in the graph's order) and, per node, the indices of those it depends on
  /// (the query takes the edge data too: without it, it fails on programmatic edges). False on an
  /// error (cleared).
  static bool graph_edges(cudaGraph_t g, std::vector<cudaGraphNode_t>& nodes, std::vector<std::vector<int>>& deps,
                          std::vector<std::vector<char>>* programmatic = nullptr) {
    if (!graph_node_list(g, nodes)) return false;
    std::map<cudaGraphNode_t, int> index;
    for (std::size_t i = 0; i < nodes.size(); ++i) index[nodes[i]] = int(i);
    deps.assign(nodes.size(), {});
    if (programmatic) programmatic->assign(nodes.size(), {});
    for (std::size_t i = 0; i < nodes.size(); ++i) {
      std::size_t nd = 0;
      if (cudaGraphNodeGetDependencies(nodes[i], nullptr, nullptr, &nd) != cudaSuccess) return clear_false();
      std::vector<cudaGraphNode_t> on(nd);
      std::vector<cudaGraphEdgeData> edges(nd);
      if (nd > 0 && cudaGraphNodeGetDependencies(nodes[i], on.data(), edges.data(), &nd) != cudaSuccess)
        return clear_false();
      for (std::size_t k = 0; k < nd; ++k)
        if (const auto it = index.find(on[k]); it != index.end()) {
          deps[i].push_back(it->second);
          if (programmatic) (*programmatic)[i].push_back(edges[k].type == cudaGraphDependencyTypeProgrammatic);
        }
    }
    return true;
  }
  static bool clear_false() noexcept {
    cudaGetLastError();
    return false;
  }
  static cudaGraphNodeType node_type(cudaGraphNode_t n) noexcept {
    cudaGraphNodeType t{};
    if (cudaGraphNodeGetType(n, &t) != cudaSuccess) {
      cudaGetLastError();
      return cudaGraphNodeTypeEmpty;
    }
    return t;
  }
  /// A graph's nodes (false on an error, which is cleared).
  static bool graph_node_list(cudaGraph_t g, std::vector<cudaGraphNode_t>& nodes) {
    std::size_t n = 0;
    if (cudaGraphGetNodes(g, nullptr, &n) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    nodes.resize(n);
    if (n > 0 && cudaGraphGetNodes(g, nodes.data(), &n) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    nodes.resize(n);
    return true;
  }
  /// While capturing, at a stage's end: the capture graph's nodes not seen before belong to stage
  /// `id` (what graph_node_info reports; tools only, so a failure to ask is ignored).
  void note_stage_nodes(int id) {
    cudaStreamCaptureStatus status{};
    cudaGraph_t g = nullptr;
    std::vector<cudaGraphNode_t> nodes;
    if (cudaStreamGetCaptureInfo(backend_.stream(), &status, nullptr, &g) != cudaSuccess || !g ||
        !graph_node_list(g, nodes)) {
      cudaGetLastError();
      return;
    }
    for (cudaGraphNode_t n : nodes) node_stage_.emplace(n, id);
  }

  CudaBackend backend_;
  int device_;
  void* arena_ = nullptr;
  std::size_t arena_bytes_ = 0;
  bool capturing_ = false;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  std::vector<cudaEvent_t> events_;
  cudaEvent_t fork_ = nullptr;
  std::vector<cudaEvent_t> stage_events_;  ///< by stage id, made on first use (at capture)
  bool joined_[kMaxLanes] = {};
  int lane_last_[kMaxLanes] = {};
  std::map<cudaGraphNode_t, int> node_stage_;  ///< the capture's nodes by the stage that enqueued them
  bool priority_ = priority_from_env();        ///< DQN_PRIORITY (read once per runtime)
  bool joins_ = joins_from_env();              ///< DQN_PDL_JOINS (read once per runtime)
  bool wide_ = false;                          ///< this capture's width (capture_width)
  std::size_t joins_made_ = 0;                 ///< programmatic joins in graph_
};

}  // namespace

std::unique_ptr<Runtime> make_cuda_runtime(const CudaSpec& cuda, Precision precision, int device) {
  (void)cuda;  // (read by the backend once its switches come from the pipeline)
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    cudaGetLastError();
    throw std::runtime_error(std::string("cuda: no usable CUDA device (cudaGetDeviceCount: ") +
                             (e != cudaSuccess ? cudaGetErrorString(e) : "0 devices") + ")");
  }
  if (device < 0 || device >= count)
    throw std::runtime_error("cuda: device " + std::to_string(device) + " does not exist (" + std::to_string(count) +
                             " present)");
  return std::make_unique<CudaRuntime>(precision, device);
}

bool cuda_available() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return count > 0;
}

}  // namespace dqn
