/** @file cuda_kernels.cuh
 *  @brief Launchers for the small fused kernels behind the CUDA op table. Each takes a stream and
 *  pre-resolved device pointers, never allocates or synchronises, and returns the launch status.
 *  Sizes are validated by the caller (CudaBackend); here they are trusted.
 */
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/engine_ops.hpp"
#include "dqn/backend.hpp"

namespace dqn::cuda {

/// Programmatic dependent launch's policies (the pipeline's cuda.pdl, CudaSpec::Pdl, in its order).
enum class PdlMode : int { automatic = 0, small = 1, all = 2, off = 3 };

/// The launch policy of the kernels launched on stream s from now on: programmatic dependent
/// launch as `mode` says, `wide` while s captures a step spread over many lanes
/// (automatic then keeps it for kernels with at most 16 KiB of dynamic shared memory). A stream
/// never set launches as (automatic, not wide). The same results in every policy.
void set_stream_pdl(cudaStream_t s, PdlMode mode, bool wide) noexcept;
/// Drops s's policy (before the stream is destroyed: its handle may be reused).
void forget_stream_pdl(cudaStream_t s) noexcept;
/// Whether a kernel with `shared` bytes of dynamic shared memory launches on s with programmatic
/// stream serialization.
bool pdl_for(std::size_t shared, cudaStream_t s) noexcept;
/// The most dynamic shared memory a kernel may have and still launch on s with programmatic
/// stream serialization; -1: none does (DeviceContext::pdl_max_shared).
std::int64_t pdl_shared_limit(cudaStream_t s) noexcept;

cudaError_t bias_act(cudaStream_t s, float* y, const float* bias, int rows, int cols, int ldy, bool relu);
cudaError_t relu_backward(cudaStream_t s, float* dy, const float* y, int rows, int cols, int ld);
/// The ReLU backward by a mask, every batch entry i in one launch (Gemm::mask after a GEMM that
/// did not apply it; relu_bias_grad without db): c_i[r, j] = 0 where mask_i[(r mod mask_rows)·ldmask
/// + j] <= 0 (r < rows, j < cols; mask_rows 0: rows), c_i = c + i·stride_c, mask_i = mask +
/// i·stride_mask. Four columns at a time where the layout allows.
cudaError_t relu_mask(cudaStream_t s, float* c, int rows, int cols, int ldc, const float* mask, int ldmask,
                      int mask_rows, int batch, std::int64_t stride_c, std::int64_t stride_mask);
cudaError_t bias_grad(cudaStream_t s, float* db, const float* dy, int rows, int cols, int ldy, float beta);

cudaError_t dueling_combine(cudaStream_t s, float* logits, const float* v, int ldv, const float* adv,
                            int rows, int D, int A, int Z);
/// dadv's (row, branch) blocks lie lddadv (>= A·Z) apart; dlogits is compact.
cudaError_t dueling_backward(cudaStream_t s, float* dv, int lddv, float* dadv, int lddadv, const float* dlogits,
                             int rows, int D, int A, int Z);
cudaError_t log_softmax(cudaStream_t s, float* logp, const float* x, int rows, int n);
cudaError_t expected_q(cudaStream_t s, float* q, const float* logp, int rows, int Z, float v_min, float v_max);
cudaError_t argmax(cudaStream_t s, std::int32_t* idx, const float* q, int rows, int n);
cudaError_t expected_q_backward(cudaStream_t s, float* dlogits, const float* dq, const float* logp, int rows, int Z,
                                float v_min, float v_max);

/// Scratch budget needs: one partial sum of squares per (head, chunk), at most 512 chunks a head.
std::size_t budget_scratch_bytes(int H);
/// Two launches: partial sums, then norms/clips/skip/total loss (in every block) and g.
/// max_blocks bounds the second launch's grid (about one wave); results do not depend on it.
cudaError_t budget(cudaStream_t s, const Budget& a, void* scratch, int max_blocks);

/// One launch of at most max_blocks blocks (about one wave), which also advances *t; needs
/// 0 <= *t < 2^40. Results do not depend on max_blocks.
cudaError_t adam(cudaStream_t s, const Adam& a, int max_blocks);
/// Scratch spectral_norm needs: per (matrix, 32-column chunk), Σ (Wᵀu)² and max_rows doubles of W v.
std::size_t spectral_norm_scratch_bytes(int count, int max_rows, int max_cols);
/// Two launches over (matrix, column chunk) and (matrix, row block) grids; count <= 65535.
cudaError_t spectral_norm(cudaStream_t s, const SpectralMatrix* mats, int count, int max_rows, int max_cols,
                          float sigma_max, const std::int32_t* skip, void* scratch);
cudaError_t target_update(cudaStream_t s, const TargetUpdate& a, int max_blocks);

/// Scratch of the cluster update below: the budget's partial sums and the step's constants.
std::size_t update_scratch_bytes(int H);
/// The most heads and normed matrices the cluster update takes.
int update_max_heads();
int update_max_matrices();
/// What a cluster update launch did, decided from what the device holds at once (see
/// update_cluster): the areas of shared memory it used and how its clusters map to the normed
/// matrices.
struct UpdateChoices {
  bool staged = false, gathered = false, kept = false, pushed = false, one = false;
  /// The normed matrix (its index in Update::sn_mats) of each cluster, in launch order: the main
  /// launch's clusters, then the side launch's (wide).
  std::vector<int> clusters;
  int main_normed = 0;  ///< how many of them the main launch holds (the rest: the side launch's)
  int main_blocks = 0;  ///< the main launch's blocks (the side launch's stamp the clock after them)
  bool wide() const noexcept { return static_cast<int>(clusters.size()) > main_normed; }
};
/// A normed matrix of the cluster update as the host knows it: its elements [lo, hi) in params
/// ([0, 0) when it has none) and its rows.
struct SnRange {
  std::int64_t lo = 0, hi = 0;
  int rows = 0;
};
/// Where a split update runs its second launch: a stream, and two events for the fork from s and
/// the join back into it.
struct UpdateSide {
  cudaStream_t stream = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
};
/// The update (budget, Adam, spectral norm, target update) as two launches: the budget's partial
/// sums, then thread-block clusters of `cs` blocks (update_cluster_size), one per normed matrix
/// (its elements' g and Adam, the power iteration over distributed shared memory, the scaling
/// and the target update of its rows) and more for the elements outside the normed matrices (g,
/// Adam, target update). Needs H <= update_max_heads(), sn_count <= update_max_matrices(), the
/// Update's shared pointers consistent (adam.g is budget.g, the skips one, target.params/t/P
/// adam's), the normed matrices disjoint ranges inside params, update_cluster_fits(cs,
/// sn_max_rows, sn_max_cols), and `mats`: each normed matrix's element range [lo, hi) in params
/// and rows, in table order ([0, 0) for an empty one). Equal to the four ops bit for bit except
/// the normed matrices, their u and their target rows, whose power iteration sums in another
/// order (double sums: the floats may differ in the last bit). max_blocks bounds the clusters
/// outside the normed matrices; results do not depend on it.
/// How it runs (the same results in every way): each block's first tile of m, v, θ and the
/// target is loaded before the kernel's griddepcontrol.wait, and a normed block of one tile
/// keeps it in registers for its scaling and target update; with one head g = c·g₀ in float
/// (the bits of the double sum). Where the grid is resident at once with them (the C51 step at
/// the reference sizes, not the four heads' update, whose plain blocks run in waves), four areas
/// of shared memory: a normed block's second tile of m, v and θ staged before the wait (and,
/// where a matrix row is as long as a block is wide, its share of Wᵀu summed from the new θ in
/// registers); its rows of the new θ kept from Adam on (read by the power iteration and the
/// scaling, and stored once, after it; a two-tile block's old target copied in before the
/// wait); each block's Wᵀu sums and Σ x² pushed into a slot of every block of its cluster (added
/// in rank order from its own memory), or else the Wᵀu sums gathered in column shares. And, with
/// `side` at 16 blocks a cluster where the whole update stays resident, the normed matrices whose
/// share of rows passes one tile of a block (the C51 step's 256 × 256 trunk.1) in a second launch
/// on side->stream, forked after the partial sums and joined after the main launch, in blocks of
/// twice the threads (one graph node more). *choices (if not null) says what the launch did.
/// `clock` (null: off; a measurement tool's, see cuda_backend/lab.hpp): per block
/// kUpdateClockSlots %globaltimer stamps then as many clock64 ones (UpdateClockSlot), for blocks
/// below clock_blocks; the launch's block count in *blocks.
cudaError_t update_cluster(cudaStream_t s, const Update& u, void* scratch, int cs, const std::vector<SnRange>& mats,
                           int max_blocks, std::uint64_t* clock = nullptr, int clock_blocks = 0, int* blocks = nullptr,
                           UpdateChoices* choices = nullptr, const UpdateSide* side = nullptr);
/// The moments the cluster update's blocks stamp when given a clock: placed (before waiting for
/// the kernels before it), the wait over, the clip factors known, its elements' g and Adam done,
/// the blocks' shares of Wᵀu published over the cluster (normed blocks), the cluster's sums
/// gathered through distributed shared memory (normed), v normalised (normed), W v of its rows
/// done (normed), σ known (normed), its rows scaled and their target updated (normed), leaving.
enum UpdateClockSlot : int { kClockPlaced, kClockWaited, kClockClips, kClockAdam, kClockWtu, kClockGather, kClockV,
                             kClockWv, kClockSigma, kClockScaled, kClockExit, kUpdateClockSlots };
/// Blocks per cluster of the cluster update on the current device: `want` (16 or 8) or, with 0,
/// 16 where the device schedules such clusters, else 8; 0 when it cannot run.
int update_cluster_size(int want = 0);
/// Whether a block of the cluster update holds its shared memory (two doubles per column of the
/// widest normed matrix, one per row of its share of the tallest) at cluster size cs.
bool update_cluster_fits(int cs, int max_rows, int max_cols);

/// One row-major GEMM for tile_gemm: C_z = act(alpha·op(A_z)·op(B_z) + beta·C_in,z + bias_z) for
/// z < batch (the Gemm of backend.hpp with raw pointers; C_in is read only when beta != 0 and is
/// C itself in the step, a separate buffer when autotuning writes elsewhere).
struct TileGemm {
  bool ta = false, tb = false, relu = false;
  int m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0, batch = 1;
  float alpha = 1.0f, beta = 0.0f;
  const float* a = nullptr;
  const float* b = nullptr;
  const float* c_in = nullptr;
  float* c = nullptr;
  const float* bias = nullptr;
  std::int64_t stride_a = 0, stride_b = 0, stride_c = 0, stride_bias = 0;
  /// Gemm::mask (mask_rows resolved: > 0): the ReLU backward in the epilogue.
  const float* mask = nullptr;
  int ldmask = 0, mask_rows = 1;
  std::int64_t stride_mask = 0;
  /// Gemm::batch2: grid z runs over batch × batch2 entries, entry (i, j) at i·stride + j·stride2.
  int batch2 = 1;
  std::int64_t stride2_a = 0, stride2_b = 0, stride2_c = 0, stride2_bias = 0, stride2_mask = 0;
  /// The k loop reads the fragments of A (not transposed) and B (transposed) from shared memory
  /// by ldmatrix, one instruction for what takes two or four shared loads (CudaSpec::TileLoads:
  /// timed against the plain loads by autotuning unless chosen; the same bits). Nothing changes
  /// on a layout without such an operand (tile_gemm_ldmatrix_layout).
  bool ldmatrix = false;
};
/// Whether layout (ta, tb) has a k-contiguous operand for ldmatrix (A not transposed or B
/// transposed): else TileGemm::ldmatrix runs the same kernel as without.
constexpr bool tile_gemm_ldmatrix_layout(bool ta, bool tb) { return !ta || tb; }
/// The tile shapes of tile_gemm: block tiles 16×32, 32×32 and 64×64 of C ("16x32", "32x32", "64x64").
inline constexpr int kTileGemmConfigs = 3;
const char* tile_gemm_name(int config);
/// Whether `config` can run `g` (k > 0, batch and tile counts within the grid's limits).
bool tile_gemm_fits(const TileGemm& g, int config);
/// Once per device before the first tile_gemm: the kernels' shared memory beyond 48 KiB.
cudaError_t tile_gemm_prepare();
/// The tf32 tensor-core GEMM (tf32 operands rounded to nearest, f32 accumulation) with its
/// epilogue fused; deterministic. cudaErrorInvalidValue when !tile_gemm_fits(g, config).
cudaError_t tile_gemm(cudaStream_t s, const TileGemm& g, int config);

/// C[r, c] (row stride ldc) = Σ_s part[s][r][c], the slices of a split-k GEMM (compact [S, m, n]),
/// summed in order in double.
cudaError_t sum_slices(cudaStream_t s, float* c, int m, int n, int ldc, const float* part, int slices);
cudaError_t fill(cudaStream_t s, float* x, float value, std::int64_t n);
cudaError_t axpy(cudaStream_t s, float* y, const float* x, float alpha, std::int64_t n);
/// out[0] = (1/n) Σ w[i]·x[i] in double, one block in a fixed order (n = 0: 0), launched without
/// programmatic serialization.
cudaError_t weighted_mean(cudaStream_t s, float* out, const float* x, const float* w, std::int64_t n);
/// Values first … first + n − 1 of the draw a describes.
cudaError_t uniform(cudaStream_t s, const Uniform& a, std::int64_t first);

/// The device replay (ReplayInsert, ReplaySample, ReplayPriorities; arguments checked by the caller).
cudaError_t replay_insert(cudaStream_t s, const ReplayInsert& a);
cudaError_t replay_sample(cudaStream_t s, const ReplaySample& a);
cudaError_t replay_priorities(cudaStream_t s, const ReplayPriorities& a);

/// dst[b][r][c] (compact, bf16) = src[b*stride + r*ld + c] for b < batch, r < rows, c < cols.
cudaError_t to_bf16(cudaStream_t s, void* dst, const float* src, int rows, int cols, std::int64_t ld,
                    std::int64_t stride, int batch);
/// C_b[r, c] = beta * C_b[r, c] (beta == 0 writes 0): the k == 0 GEMM.
cudaError_t scale_matrix(cudaStream_t s, float* c, int rows, int cols, std::int64_t ld, std::int64_t stride,
                         int batch, float beta);

}  // namespace dqn::cuda
