/** @file cuda_ops.hpp
 *  @brief The CUDA op table's class: one non-blocking stream per lane (and a side stream each),
 *  cuBLAS/cuBLASLt with an explicit workspace, planned scratch, and the ops over the kernels of
 *  kernels/. Ops never allocate, synchronise or read device memory from the host, so any sequence
 *  of them can be captured into one graph as it is. It implements the plugins' op table and the
 *  engine's own ops (core/engine_ops.hpp). The methods are defined by role: cuda_ops.cpp (set-up,
 *  lanes, errors, the element and head ops, the replay), cuda_gemm.cpp (GEMM planning and launch),
 *  gemm_autotune.cpp (timing candidates), cuda_update.cpp (the optimiser's ops).
 */
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <array>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "core/engine_ops.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/cuda_lab.hpp"
#include "cuda_kernels.cuh"
#include "dqn/backend.hpp"
#include "pipeline/spec.hpp"

namespace dqn::cuda {

inline constexpr std::size_t kWorkspaceBytes = std::size_t{8} << 20;        // cuBLAS + cuBLASLt, per lane
constexpr std::size_t kInitialScratchBytes = std::size_t{4} << 20;   // per lane, usable without a plan
constexpr int kMaxLanes = 16;                                         // concurrent streams of a captured step
/// Stream slots: one per lane, then one side slot per lane (kMaxLanes + lane) on which an op of
/// that lane may run a part of itself beside the rest (head_forward's value GEMM).
constexpr int kSlots = 2 * kMaxLanes;

/// The largest power of two (at most 256) dividing the address and, when batched, the batch stride.
inline std::uint32_t alignment_of(const void* p, std::int64_t stride_bytes) {
  const std::uintptr_t x = reinterpret_cast<std::uintptr_t>(p) | static_cast<std::uintptr_t>(stride_bytes);
  if (x == 0) return 256;
  return static_cast<std::uint32_t>(std::min<std::uintptr_t>(x & (~x + 1), 256));
}

inline const char* precision_name(Precision p) {
  switch (p) {
    case Precision::fp32: return "fp32";
    case Precision::tf32: return "tf32";
    case Precision::bf16: return "bf16";
  }
  return "?";
}

/// The kernels' launch policy for the pipeline's cuda.pdl.
inline PdlMode pdl_mode(CudaSpec::Pdl p) {
  switch (p) {
    case CudaSpec::Pdl::automatic: return PdlMode::automatic;
    case CudaSpec::Pdl::small: return PdlMode::small;
    case CudaSpec::Pdl::all: return PdlMode::all;
    case CudaSpec::Pdl::off: return PdlMode::off;
  }
  return PdlMode::automatic;
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

/// How tf32 GEMMs may use tile_gemm (the tensor-core kernel for small shapes), from CudaSpec::gemm:
/// automatic → autotuning times its tile shapes against the cuBLASLt algorithm it chose and keeps
/// the fastest (without autotuning: cuBLASLt); cublaslt → never; tile → whenever it fits, the
/// fastest shape (the first without autotuning); tile16x32 … → whenever it fits, that shape.
/// Other precisions: cuBLASLt.
struct TileMode {
  bool on = true;      ///< tile_gemm may run
  bool forced = false; ///< tile_gemm runs whenever it fits (never cuBLASLt)
  int config = -1;     ///< forced to this shape; -1: timed (or the first)
};
/// CudaSpec::tile_loads: timed (autotuning times each tile shape with and without ldmatrix and keeps
/// the faster; without autotuning: without), never, or always.
enum class LdmMode { timed = 0, off = 1, on = 2 };
inline LdmMode ldm_mode_of(CudaSpec::TileLoads t) noexcept {
  switch (t) {
    case CudaSpec::TileLoads::automatic: return LdmMode::timed;
    case CudaSpec::TileLoads::plain: return LdmMode::off;
    case CudaSpec::TileLoads::ldmatrix: return LdmMode::on;
  }
  return LdmMode::timed;
}

inline TileMode tile_mode_of(CudaSpec::Gemm g) noexcept {
  switch (g) {
    case CudaSpec::Gemm::automatic: return TileMode{};
    case CudaSpec::Gemm::cublaslt: return TileMode{false, false, -1};
    case CudaSpec::Gemm::tile: return TileMode{true, true, -1};
    case CudaSpec::Gemm::tile16x32: return TileMode{true, true, 0};
    case CudaSpec::Gemm::tile32x32: return TileMode{true, true, 1};
    case CudaSpec::Gemm::tile64x64: return TileMode{true, true, 2};
  }
  return TileMode{};
}

/// Tuned choices, shared by every backend of the process: two engines built alike run the same
/// algorithms, so their results agree bit for bit (tuning itself is timing, hence noisy).
struct TunedAlgo {
  cublasComputeType_t compute;
  cublasLtMatmulAlgo_t algo;
};
using TuneKey = std::tuple<int, int, LtKey>;  // device, precision, problem
std::mutex& tuned_mutex();
std::map<TuneKey, TunedAlgo>& tuned_algos();

/// The tile_gemm choice per problem (-1: cuBLASLt, else the tile shape), shared like tuned_algos.
std::map<TuneKey, int>& tuned_tiles();

class CudaBackend final : public EngineBackend {
 public:
  CudaBackend(const CudaSpec& spec, Precision precision, int device);
  ~CudaBackend() override { release(); }
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;
  const char* name() const noexcept override { return "cuda"; }
  std::uint32_t real_size() const noexcept override { return 4; }
  bool is_device() const noexcept override { return true; }
  /// The current lane's stream, its launch policy, and whether the engine is planning.
  const DeviceContext* device() const noexcept override;
  void fail(const char* op, const char* why) noexcept override { record(1, op, why); }

  // --- dense layers -------------------------------------------------------------------------

  /// Gemm::mask runs in tile_gemm's epilogue where the GEMM runs there (as autotuned, keyed apart
  /// from the unmasked problem); on every other path, relu_mask after the GEMM.
  void gemm(const Gemm& g) noexcept override;
  void gemm_body(const Gemm& g) noexcept;

  /// Tall reductions (k large, few output tiles: the weight gradients over B·N rows) leave most of
  /// the GPU idle in one GEMM. Such a GEMM runs as a strided-batched GEMM over slices of k into
  /// scratch, then a fixed-order sum of the slices (deterministic). 0: run it whole.
  int split_slices(const Gemm& g) const noexcept;

  /// Gemm::sum_batch: the entries' products as one batched GEMM into scratch, then their sum in
  /// entry order (in double, rounded once; sum_slices, as split-k's).
  void sum_batch(const Gemm& g) noexcept;
  void split_k(const Gemm& g, int slices) noexcept;
  void bias_act(Real y, Real bias, int rows, int cols, int ldy, Act act) noexcept override;
  void relu_backward(Real dy, Real y, int rows, int cols, int ld) noexcept override;
  void bias_grad(Real db, Real dy, int rows, int cols, int ldy, float beta) noexcept override;

  // --- distributional head ------------------------------------------------------------------

  void dueling_combine(Real logits, Real v, int ldv, Real adv, int rows, int D, int A, int Z) noexcept override;
  void dueling_backward(Real dv, int lddv, Real dadv, int lddadv, Real dlogits, int rows, int D, int A,
                        int Z) noexcept override;

  void log_softmax(Real logp, Real x, int rows, int n) noexcept override;
  void expected_q(Real q, Real logp, int rows, int Z, float v_min, float v_max) noexcept override;
  void argmax(std::int32_t* idx, Real q, int rows, int n) noexcept override;

  // --- optimisation -------------------------------------------------------------------------

  void budget(const Budget& a) noexcept override;
  void adam(const Adam& a) noexcept override;
  void spectral_norm(const SpectralMatrix* mats, int count, int max_rows, int max_cols, float sigma_max,
                     const std::int32_t* skip) noexcept override;

  void target_update(const TargetUpdate& a) noexcept override;
  void update(const Update& u) noexcept override;

  /// Whether the update's normed matrices are disjoint ranges inside params, each within the
  /// bounds (what the cluster update needs). The table lives on the device: read once,
  /// outside capture (when the engine plans), and remembered for that table with the matrices'
  /// ranges (sn_ranges); during a capture an unseen table counts as not tidy (the separate ops
  /// then run).
  bool sn_tidy(const Update& u) noexcept;
  /// The normed matrices' ranges in params and rows, in table order (after sn_tidy said tidy).
  const std::vector<cuda::SnRange>& sn_ranges(const Update& u) const noexcept;

  /// Where the library workspace and the scratch lie (for mapping a sanitizer's addresses).
  const void* workspace_base() const noexcept { return workspace_base_; }
  const void* scratch_base() const noexcept { return scratch_base_; }

  /// How the update runs (for describe()): the cluster update and what its last launch did, or
  /// the separate kernels.
  std::string update_path() const;

  /// Grid bound of the one-wave optimiser kernels: a few blocks per SM (their results do not
  /// depend on it). The budget's combine keeps its clips in H floats of shared memory.
  static constexpr int kMaxBudgetHeads = 8192;
  int wave_blocks() const noexcept { return 4 * std::max(props_.multiProcessorCount, 1); }

  // --- elementwise and memory ---------------------------------------------------------------

  void fill(Real x, float value, std::int64_t n) noexcept override;
  void copy(Real dst, Real src, std::int64_t n) noexcept override;
  void axpy(Real y, Real x, float alpha, std::int64_t n) noexcept override;
  void weighted_mean(Real out, Real x, Real w, std::int64_t n) noexcept override;
  void uniform(const Uniform& a) noexcept override;
  void uniform_from(const Uniform& a, std::int64_t first) noexcept override;
  void replay_insert(const ReplayInsert& a) noexcept override;
  void replay_sample(const ReplaySample& a) noexcept override;
  void replay_priorities(const ReplayPriorities& a) noexcept override;

  // Init and checkpoint I/O: synchronous with respect to the runtime's stream (so they are
  // ordered after every op queued before), refused during capture; they run while planning,
  // since they are data movement rather than step work.
  void upload(void* dst, const void* src, std::size_t bytes) noexcept override { transfer("upload", dst, src, bytes); }
  void download(void* dst, const void* src, std::size_t bytes) noexcept override {
    transfer("download", dst, src, bytes);
  }
  void upload_reals(Real dst, const float* src, std::int64_t n) noexcept override;
  void download_reals(float* dst, Real src, std::int64_t n) noexcept override;
  int status() const noexcept override { return status_; }
  const char* message() const noexcept override { return message_; }

  void expected_q_backward(Real dlogits, Real dq, Real logp, int rows, int Z, float v_min,
                           float v_max) noexcept override;


  /// The distribution kernels (dueling_dist, and the heads' own through DeviceContext::precision)
  /// compute in double in fp32 pipelines, as the CPU twin does, and in float in tf32 and bf16 ones
  /// (see head_kernels.cu).
  bool double_math() const noexcept { return precision_ == Precision::fp32; }

  void dueling_dist(const DuelingDist& a) noexcept override;

  /// head_forward_composed with the value GEMM on the lane's side slot, beside the advantage
  /// GEMM (both read only the hidden layer; each is a few blocks, and on one stream the value
  /// GEMM's 5 µs sat on the step's critical path).
  void head_forward(const HeadForward& a) noexcept override;

  /// head_backward_inputs_composed with the value GEMM on the side slot, beside the branches'
  /// GEMM (they write disjoint columns of dhidden; on one stream they ran one after the other).
  void head_backward_inputs(const HeadBackward& a) noexcept override;

  /// `side` on the lane's side slot and `main` on its own stream, side by side, both after what
  /// the lane enqueued before and both before what it enqueues after. Captured, the fork and join
  /// are graph edges. False after recording an error.
  bool beside(const char* op, const Gemm& side, const Gemm& main) noexcept;

  /// use_slot for an op (records a failure instead of throwing).
  bool switch_slot(const char* op, int slot) noexcept;
  void relu_bias_grad(Real dy, Real y, Real db, int rows, int cols, int ld, int heads, std::int64_t stride_dy,
                      std::int64_t stride_y, std::int64_t stride_db) noexcept override;




  // --- what the runtime needs ---------------------------------------------------------------

  cudaStream_t stream() const noexcept { return stream_; }
  Precision precision() const noexcept { return precision_; }
  const cudaDeviceProp& props() const noexcept { return props_; }
  /// The stamps of the last cluster update that ran (after a synchronize), or empty.
  lab::UpdateClock update_clock() const;
  /// The cluster update's blocks per cluster (0: the update runs as its separate kernels) and what
  /// its last launch did.
  int update_cluster() const noexcept { return update_cluster_; }
  const cuda::UpdateChoices& update_choices() const noexcept { return update_choices_; }
  /// The launch policy of this backend's streams: the pipeline's pdl, and whether the step being
  /// captured spreads over many lanes (pdl_for).
  void set_wide(bool wide) noexcept {
    for (cudaStream_t st : streams_)
      if (st) cuda::set_stream_pdl(st, pdl_mode(spec_.pdl), wide);
  }
  /// The pipeline's cuda: section as this backend applies it (for describe()).
  std::string options_text() const;
  bool planning() const noexcept { return planning_; }
  void set_capturing(bool on) noexcept { capturing_ = on; }
  std::size_t scratch_bytes() const noexcept { return scratch_bytes_; }
  std::size_t peak_device_bytes() const noexcept { return peak_bytes_; }
  void note_device_bytes(std::size_t bytes) noexcept;
  void forget_device_bytes(std::size_t bytes) noexcept { device_bytes_ -= bytes; }

  void begin_plan() noexcept;
  /// Ends planning; returns the scratch the plan needs (the runtime grows it if it must).
  std::size_t end_plan() noexcept;
  /// Replaces the scratch with one of `bytes` (never inside a step: synchronises). Throws.
  void grow_scratch(std::size_t bytes);

  /// Makes the following ops run on lane `lane` (its stream, workspace and scratch).
  /// Host-side only: allowed while capturing. Throws on a bad lane.
  void set_lane(int lane);
  int lane() const noexcept { return lane_; }

 private:
  /// Makes the following ops run on stream slot `lane` (a lane, or kMaxLanes + lane: its side slot).
  void use_slot(int lane);

  void record(int code, const char* op, const std::string& why) noexcept;
  bool cuda_ok(const char* op, cudaError_t e, const char* stmt, const char* file, int line) noexcept;
  bool cublas_ok(const char* op, cublasStatus_t s, const char* stmt, const char* file, int line) noexcept;
  bool real_ok(const Real& r, const char* op, const char* what) noexcept;
  bool matrix_ok(const char* op, int rows, int cols, int ld) noexcept;

  /// The op's scratch: while planning, only noted (and null returned: the op does no work);
  /// otherwise the reserved scratch if it is large enough, else a recorded error.
  void* scratch(const char* op, std::size_t bytes) noexcept;
  void transfer(const char* op, void* dst, const void* src, std::size_t bytes) noexcept;

  /// The cached cuBLASLt descriptors and algorithm for this problem, found on first use (in plan
  /// mode, or the first run outside capture). For a fused key, `bias` is the first call's bias
  /// pointer: the heuristic reads its alignment from it. Null after recording an error.
  LtPlan* plan_for(const LtKey& key, const void* bias) noexcept;
  bool wants_tuning(const LtPlan* p) const noexcept {
    return autotune_ && !capturing_ && p->use_lt && !p->decided && p->candidates.size() > 1;
  }

  /// One cuBLASLt call of `p` with `algo`: D = d (C = c read only when beta != 0); a bias
  /// epilogue gets its pointer here (a host-side attribute of the cached descriptor, read at
  /// the call: safe under capture, each captured call keeps its own pointer).
  cublasStatus_t lt_matmul(const LtPlan& p, const cublasLtMatmulAlgo_t& algo, const void* a, const void* b,
                           const float* c, float* d, const void* bias, float alpha, float beta) noexcept;

  // --- tile_gemm -------------------------------------------------------------------------------

  static constexpr int kTileUndecided = -2, kTileLt = -1;
  /// A tile choice >= 0 is a shape (< kTileGemmConfigs), + kTileLdm where its k loop reads the
  /// fragments by ldmatrix (TileGemm::ldmatrix: the same bits, timed as another candidate).
  static constexpr int kTileLdm = 64;
  static_assert(cuda::kTileGemmConfigs <= kTileLdm, "a shape index below kTileLdm");
  static cuda::TileGemm tile_args(const Gemm& g) noexcept;

  /// This problem's tile choice (kTileUndecided until decided), taken from the process's shared
  /// choices when another backend decided it by timing. Null after recording an error.
  int* tile_slot(const LtKey& tkey) noexcept;
  void remember_tile(const LtKey& tkey, int choice) noexcept;

  /// tile_gemm shape `config` runs tg (while planning: nothing runs); a batch2 call's entries are
  /// all in that launch (the shape was chosen for tg with them: tile_gemm_fits holds).
  void tile_chosen(const cuda::TileGemm& tg, int choice) noexcept;
  void run_tile(const cuda::TileGemm& tg, int choice) noexcept {
    if (DQN_CUDA_OK("gemm", launch_tile(tg, choice)) && tg.mask) masked_in_kernel_ = true;
  }
  /// Launches tile choice `choice` (a shape, + kTileLdm for its ldmatrix kernel) of tg.
  cudaError_t launch_tile(const cuda::TileGemm& tg, int choice) noexcept;

  /// cuda.gemm tile or a shape: the named shape, or the fastest that fits (timed, outside capture
  /// with autotuning on; else the first); cuBLASLt only when no shape fits.
  int forced_tile(const LtKey& tkey, const cuda::TileGemm& tg, const float* c) noexcept;

  /// Times the cuBLASLt algorithm `p` holds (fixed by its own tuning just before) and every tile
  /// shape that fits, on these operands (D in the private buffer). kTileLt when timing is not
  /// possible.
  int timed_tile(const LtKey& tkey, const cuda::TileGemm& tg, const LtPlan& p, bool fused, const void* pa,
                 const void* pb, const float* c, const void* bias, float alpha, float beta) noexcept;

  /// The key of a tile choice among the process's: the problem, and which loads were candidates
  /// (a backend whose CudaSpec::tile_loads names one keeps its own choices).
  TuneKey tile_key(const LtKey& tkey) const noexcept {
    return TuneKey{device_, 3 * static_cast<int>(precision_) + static_cast<int>(tile_ldm_), tkey};
  }

  /// Whether the plain loads (ldm 0) or ldmatrix (kTileLdm) are a candidate (CudaSpec::tile_loads).
  bool ldm_candidate(int ldm) const noexcept {
    return ldm == 0 ? tile_ldm_ != LdmMode::on : tile_ldm_ != LdmMode::off;
  }

  /// Times every tile shape that fits, each with and without ldmatrix (cuda.tile_loads auto;
  /// plain / ldmatrix: only without / with); one replaces the incumbent `choice` (timed at `best` ms, +inf:
  /// none yet) only when faster by more than kTuneMargin. kTileLt after a sticky error.
  int fastest_tile(const cuda::TileGemm& tg, const float* c, float* d, float best, int choice) noexcept;

  /// Elements from C's first to one past its last (row-major, batched): the tune buffer's need.
  static std::size_t tile_extent(const cuda::TileGemm& tg) noexcept;
  float time_tile(const cuda::TileGemm& tg, int choice, const float* c, float* d) noexcept;

  /// The unfused epilogue: C_i = act(C_i + bias_i) with the bias_act kernel, one launch when the
  /// batch entries sit side by side in C's rows with their biases contiguous (bdq's branches).
  void separate_epilogue(const Gemm& g) noexcept;

  /// Times every candidate of `p` on these operands (D in a private buffer shaped like C, so
  /// nothing the caller can see is written) and keeps the fastest; fixes the plan for good.
  /// Never inside a capture: it synchronises. A candidate cuBLASLt refuses is dropped; when all
  /// are, the plan turns to its fallback (use_lt = false). Timing trouble keeps the heuristic's
  /// order; only a sticky CUDA error is recorded.
  void autotune(LtPlan& p, const LtKey& key, const void* a, const void* b, const float* c, const void* bias,
                float alpha, float beta) noexcept;

  /// The median over kTuneSamples of kTuneReps calls replayed from a graph (so host launch gaps
  /// do not count: the GEMM runs as it will in the step), in ms; +inf when timing failed.
  /// works: cuBLASLt accepted the algorithm for this problem.
  float time_algo(const LtPlan& p, const cublasLtMatmulAlgo_t& algo, const void* a, const void* b, const float* c,
                  float* d, const void* bias, float alpha, float beta, bool& works) noexcept;

  /// The median over kTuneSamples of kTuneReps calls of `enqueue` (one launch on stream_ each)
  /// replayed from a graph, in ms; +inf when timing failed. Synchronises: never inside a capture.
  template <class F>
  float time_graph(F&& enqueue) noexcept;

  /// The private D of autotuning, grown as needed (outside capture only); kept until release.
  float* tune_buffer(std::size_t bytes) noexcept;
  bool tune_events() noexcept;
  bool make_layout(cublasLtMatrixLayout_t* l, cudaDataType_t type, int rows, int cols, std::int64_t ld, int batch,
                   std::int64_t stride) noexcept;

  void release() noexcept;
  cudaDeviceProp props_{};
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  void* workspace_ = nullptr;
  void* scratch_ = nullptr;
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
  CudaSpec spec_;                        ///< the pipeline's cuda: section
  Precision precision_;
  int device_;
  TileMode tile_;                        ///< where tile_gemm may run (CudaSpec::gemm)
  bool autotune_;                        ///< CudaSpec::autotune
  /// Whether tile_gemm's k loop reads the fragments of its k-contiguous operands by ldmatrix
  /// (CudaSpec::tile_loads; TileGemm::ldmatrix; the same bits).
  LdmMode tile_ldm_;
  int update_cluster_ = 0;               ///< the cluster update's blocks per cluster (0: not used)
  cuda::UpdateChoices update_choices_;  ///< what the last cluster update launch did
  static constexpr int kClockBlocks = 4096;  ///< blocks of the cluster update that stamp (lab::record_update_clock)
  static constexpr std::size_t kClockBytes = std::size_t{kClockBlocks} * 2 * cuda::kUpdateClockSlots * sizeof(std::uint64_t);
  std::uint64_t* clock_ = nullptr;       ///< their stamps [kClockBlocks][2·kUpdateClockSlots], or null
  struct ClockLaunch {
    int blocks = 0, cs = 0, normed = 0;  ///< of the last cluster update enqueued
  } clock_launch_;

  bool masked_in_kernel_ = false;        ///< gemm(): tile_gemm applied the Gemm's mask
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
  const SnTable* sn_table(const Update& u) const noexcept;
  std::vector<SnTable> sn_tables_;  ///< sn_tidy's verdicts and ranges, per table
  bool in_split_ = false;                ///< inside split_k: its slices are never split again
  static constexpr int kSplitMinK = 1024, kSplitMinSlice = 256, kSplitMaxSlices = 32;
  void* tune_d_ = nullptr;               ///< autotuning's private D
  std::size_t tune_bytes_ = 0;
  std::array<cudaEvent_t, 2 * kTuneSamples> tune_events_{};
  int status_ = 0;
  char message_[512] = {};
  mutable DeviceContext context_;  ///< what device() returns, refreshed by each call
};

}  // namespace dqn::cuda
