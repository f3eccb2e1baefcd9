/** @file update_cluster.cu
 *  @brief The fused update: the budget's partial sums, then one launch of thread-block clusters
 *  (a cluster per spectrally normed matrix, more for the other parameters) that does the budget,
 *  Adam, the power iteration and the target update.
 */
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "cuda_kernels.cuh"
#include "optim_common.cuh"

namespace dqn::cuda {
namespace {

constexpr int kUpdateMaxHeads = 64;  // clip factors kept in static shared memory
constexpr int kUpdateMaxSn = 64;     // spectrally normed matrices a cluster update takes

// --- the cluster update: the budget's partial sums, then one launch of thread-block clusters --

/// The target update of one element after the step's last write of params (Polyak when
/// period == 0, else a copy; the caller decides whether a hard copy happens at all).
struct TargetRule {
  float* tgt = nullptr;  ///< null: no target update here
  double tau = 0.0;
  bool copy = false;
};

/// What every element of the cluster update needs (the step's constants, read once per block).
struct ClusterStep {
  const float* __restrict__ grads;
  float *g, *mom, *var, *theta;
  const float* clip_sh;
  std::int64_t P;
  int H;
  AdamCoef adam;  ///< set once the step is known finite
  bool finite;
  TargetRule rule;  ///< tgt null: no target update
  const std::int64_t* reach;  ///< Budget::reach (null: every head reaches everything)
  /// One head (H = 1): g = c·g₀ + 0 in float, the bits of the double sum
  /// 0.0 + c·g₀ rounded to float (a product of two floats is exact in double, so both round it
  /// once; + 0 turns −0 into +0 as the double sum does), without its conversions.
  bool one = false;
};

/// ClusterStep::one's g of an element: c·g₀ + 0 in float.
__device__ __forceinline__ float one_head_g(float c, float g0) { return __fadd_rn(__fmul_rn(c, g0), 0.0f); }

/// The cluster update kernel's variants (its template's V): the two launches of a split update
/// (see update_cluster): the main launch (kUpdateSplit), whose clusters take the normed matrices
/// ClusterPlan::sn_of names, and the side launch (kUpdateWide), in blocks of twice the threads,
/// for the matrices whose share of rows passes one tile of a kThreads block (the C51 step's
/// 256 × 256 trunk.1: two tiles). 0: the one launch of an unsplit update.
constexpr int kUpdateSplit = 1, kUpdateWide = 2;
/// The threads of a block of the cluster update's variant v.
constexpr int update_threads(int v) { return (v & kUpdateWide) != 0 ? 2 * kThreads : kThreads; }

constexpr int kClusterPer = 8;        // elements per thread and tile: a tile is one round of loads
constexpr int kClusterEarlyHeads = 2;  // heads whose gradients a tile loads before the clip factors
/// A tile of a block of NT threads (the wide launch's blocks have twice kThreads).
template <int NT>
constexpr std::int64_t kTileOf = std::int64_t{NT} * kClusterPer;
constexpr std::int64_t kClusterTile = kTileOf<kThreads>;

/// One tile's operands in registers: m, v, θ, the target (Polyak) and the first heads' gradients.
struct ClusterTile {
  float m[kClusterPer], v[kClusterPer], th[kClusterPer], tg[kClusterPer];
  float gr[kClusterEarlyHeads][kClusterPer];
};

/// Loads the optimizer's state of the tile's elements i = s + k·NT + threadIdx.x < hi: m, v,
/// θ and, with polyak, the target. Only this kernel writes them (a step's earlier kernels read θ,
/// none writes it), so the loads may run before the kernel's griddepcontrol.wait.
template <int NT = kThreads>
__device__ __forceinline__ void cluster_load_state(const ClusterStep& x, std::int64_t s, std::int64_t hi, bool polyak,
                                                   ClusterTile& r) {
#pragma unroll
  for (int k = 0; k < kClusterPer; ++k) {
    const std::int64_t i = s + k * NT + threadIdx.x;
    r.m[k] = r.v[k] = r.th[k] = r.tg[k] = 0.0f;
    if (i < hi) {
      r.m[k] = x.mom[i];
      r.v[k] = x.var[i];
      r.th[k] = x.theta[i];
      if (polyak) r.tg[k] = x.rule.tgt[i];
    }
  }
}

/// Loads the first heads' gradients of the same elements (written by the kernels before this one:
/// after the wait).
template <int NT = kThreads>
__device__ __forceinline__ void cluster_load_grads(const ClusterStep& x, std::int64_t s, std::int64_t hi,
                                                   ClusterTile& r) {
  // A head whose reach misses the tile has zeros there: not loaded, its term adds +0 (combine_tile).
  bool meets[kClusterEarlyHeads];
#pragma unroll
  for (int h = 0; h < kClusterEarlyHeads; ++h) meets[h] = h < x.H && reach_meets(x.reach, h, s, hi);
#pragma unroll
  for (int k = 0; k < kClusterPer; ++k) {
    const std::int64_t i = s + k * NT + threadIdx.x;
#pragma unroll
    for (int h = 0; h < kClusterEarlyHeads; ++h)
      r.gr[h][k] = meets[h] && i < hi ? x.grads[static_cast<std::int64_t>(h) * x.P + i] : 0.0f;
  }
}

/// Loads the tile's elements i = s + k·NT + threadIdx.x < hi (nothing here depends on the
/// clip factors or the skip decision, so it can run before them).
template <int NT = kThreads>
__device__ __forceinline__ void cluster_load(const ClusterStep& x, std::int64_t s, std::int64_t hi, bool polyak,
                                             ClusterTile& r) {
  cluster_load_state<NT>(x, s, hi, polyak, r);
  cluster_load_grads<NT>(x, s, hi, r);
}

/// acc[k] = Σ_h c_h g_h at the tile's k-th element (double, heads in order, as combine_tile): the
/// first heads' gradients from r.gr, the others' loaded here at index at(k) where ok(k); [lo, hi)
/// holds the tile's elements (for the heads' reach). All zero when some head is not finite.
template <class Ok, class At>
__device__ __forceinline__ void cluster_combine(const ClusterStep& x, std::int64_t lo, std::int64_t hi,
                                                const ClusterTile& r, Ok ok, At at, double (&acc)[kClusterPer]) {
#pragma unroll
  for (int k = 0; k < kClusterPer; ++k) acc[k] = 0.0;
  if (!x.finite) return;
#pragma unroll
  for (int h = 0; h < kClusterEarlyHeads; ++h) {
    if (h >= x.H) break;
    const double c = x.clip_sh[h];
#pragma unroll
    for (int k = 0; k < kClusterPer; ++k) acc[k] += c * static_cast<double>(r.gr[h][k]);
  }
  for (int h = kClusterEarlyHeads; h < x.H; ++h) {
    if (!reach_meets(x.reach, h, lo, hi)) continue;  // zeros there (see combine_tile)
    const double c = x.clip_sh[h];
    const float* gh = x.grads + static_cast<std::int64_t>(h) * x.P;
#pragma unroll
    for (int k = 0; k < kClusterPer; ++k)
      if (ok(k)) acc[k] += c * static_cast<double>(gh[at(k)]);
  }
}

/// The loaded tile: g = Σ_h c_h g_h (double, heads in order, as combine_tile), Adam (adam_element)
/// and, with target, the target update (a copy, or Polyak from r.tg). store_theta false: the new θ
/// only in r.th (a caller that stores it later).
template <int NT = kThreads>
__device__ __forceinline__ void cluster_store(const ClusterStep& x, std::int64_t s, std::int64_t hi, bool target,
                                              ClusterTile& r, bool store_theta = true) {
  double acc[kClusterPer];
  const auto at = [&](int k) { return s + k * NT + threadIdx.x; };
  if (!x.one) cluster_combine(x, s, hi, r, [&](int k) { return at(k) < hi; }, at, acc);
#pragma unroll
  for (int k = 0; k < kClusterPer; ++k) {
    const std::int64_t i = s + k * NT + threadIdx.x;
    if (i >= hi) continue;
    const float gf = !x.one      ? static_cast<float>(acc[k])
                     : x.finite ? one_head_g(x.clip_sh[0], r.gr[0][k])
                                : 0.0f;
    x.g[i] = gf;
    if (!x.finite) continue;
    const float th = adam_element(gf, r.m[k], r.v[k], r.th[k], x.adam);
    x.mom[i] = r.m[k];
    x.var[i] = r.v[k];
    if (store_theta) x.theta[i] = th;
    r.th[k] = th;  // the new θ, for a caller that keeps the tile (the cluster update's early path)
    if (target) x.rule.tgt[i] = x.rule.copy ? th : polyak(x.rule.tau, r.tg[k], th);
  }
}

/// Cluster k < nsn owns normed matrix k (its rows split evenly over the cluster's blocks); the
/// clusters after them update the elements outside every normed matrix, tile by tile.
constexpr int kClusterMaxSegs = kUpdateMaxSn + 1;
struct ClusterPlan {
  int nsn = 0;   ///< normed matrices (one cluster each)
  int nseg = 0;  ///< ranges of params outside every normed matrix
  int rpc = 1;   ///< the most rows a block of a normed matrix holds (max_rows / cluster size, up)
  int max_cols = 1;
  const double* step = nullptr;  ///< {1 − β1^t, 1 − β2^t, t} from budget_partial_kernel
  std::uint64_t* clock = nullptr;  ///< update_cluster's clock (null: off)
  int clock_blocks = 0;
  /// A normed block's second tile of m, v and θ copied into shared memory before the wait and its
  /// first heads' gradients after it (cp.async), read from there by its Adam; and where a row of
  /// a normed matrix is one row of a tile (cols == kThreads), each thread's Σ of W[r, c] u[r] over
  /// the block's rows (Wᵀu) from the new θ in its registers.
  bool stage = false;
  int stage_at = 0;  ///< where the staging area starts in the dynamic shared memory (doubles)
  /// The cluster's Wᵀu sums split over its blocks (each adds its share of the
  /// columns over the ranks, then every block reads the shares from their owners: one remote load
  /// a column where it made CS) and σ's rank sum by one warp. The same sums, so the same bits.
  bool gather = false;
  /// With stage: a normed block's rows of the new θ kept in shared memory from
  /// Adam on (written beside the stores to params), read back by Wᵀu (where it is not summed from
  /// registers), W v and the scaling and target update instead of params; and, for Polyak, the old
  /// target of a block of more than one tile copied into shared memory before the wait. The same
  /// values in the same order: the same bits.
  bool keepw = false;
  /// Each block stores its Wᵀu sums and its Σ x² into every block of the cluster
  /// (a slot per rank in each) instead of the blocks reading them from each other, so that every
  /// block adds the slots in rank order from its own shared memory: no remote load, one cluster
  /// barrier fewer than gathering and none before leaving (the last remote access is a store
  /// before the last barrier). The same sums in the same order: the same bits.
  bool push = false;
  int push_at = 0;  ///< where the slots start in the dynamic shared memory (doubles)
  std::int64_t seg_lo[kClusterMaxSegs] = {}, seg_hi[kClusterMaxSegs] = {};
  std::int64_t seg_tile0[kClusterMaxSegs + 1] = {};  ///< first tile of each range; [nseg]: all tiles
  /// A split update's launches (kUpdateSplit, kUpdateWide): cluster k's matrix in Update::sn_mats.
  unsigned char sn_of[kUpdateMaxSn] = {};
};

/// Dynamic shared memory of the cluster update (doubles): Σ over the block's rows of W[r, c] u[r]
/// [max_cols] (read by the whole cluster), v [max_cols], x = W v of the block's rows [rpc], Σ x²
/// of them [1].
constexpr std::size_t kClusterMaxShared = 40 * 1024;  // with the static shared memory, under the default 48 KiB
std::size_t cluster_update_shared(int max_cols, int rpc) {
  return (2 * static_cast<std::size_t>(max_cols) + static_cast<std::size_t>(rpc) + 2) * sizeof(double);
}
/// The push slots after it (ClusterPlan::push): Wᵀu sums [cs][max_cols] and Σ x² [cs].
std::size_t cluster_push_shared(int cs, int max_cols) {
  return static_cast<std::size_t>(cs) * (static_cast<std::size_t>(max_cols) + 1) * sizeof(double);
}
/// The staging area after those (ClusterPlan::stage): u of the block's rows [rpc], rounded up to
/// 16 bytes, then m, v, θ and the first heads' gradients of a tile [kClusterStaged][kClusterTile].
constexpr int kClusterStaged = 3 + kClusterEarlyHeads;
__host__ __device__ inline std::size_t cluster_stage_u(int rpc) {  // floats
  return (static_cast<std::size_t>(rpc) + 3) / 4 * 4;
}
std::size_t cluster_stage_shared(int rpc) {
  return (cluster_stage_u(rpc) + static_cast<std::size_t>(kClusterStaged) * kClusterTile) * sizeof(float);
}
/// The kept rows after that (ClusterPlan::keepw): the new θ of a block's rows [rpc · max_cols],
/// rounded up to 16 bytes, then their old target as many.
__host__ __device__ inline std::size_t cluster_keep_rows(int rpc, int max_cols) {  // floats
  return (static_cast<std::size_t>(rpc) * static_cast<std::size_t>(max_cols) + 3) / 4 * 4;
}
std::size_t cluster_keep_shared(int rpc, int max_cols) { return 2 * cluster_keep_rows(rpc, max_cols) * sizeof(float); }
/// The most dynamic shared memory a launch of these bounds takes: every area above (cs blocks a
/// cluster; without the push slots where they do not fit, the launch takes less).
std::size_t cluster_most_shared(int cs, int max_cols, int rpc) {
  return cluster_update_shared(max_cols, rpc) + cluster_push_shared(cs, max_cols) + cluster_stage_shared(rpc) +
         cluster_keep_shared(rpc, max_cols);
}
/// The most the kept rows may take (the C51 step's 16 rows of 256 columns take 32 KiB).
constexpr std::size_t kClusterMaxKeep = 64 * 1024;
/// The most dynamic shared memory the cluster update asks for (its function attribute).
constexpr std::size_t kClusterMaxPush = 40 * 1024;  // the slots' most (16 ranks of 256 columns: 32.1 KiB)
constexpr std::size_t kClusterMaxDynamic = kClusterMaxShared + 48 * 1024 + kClusterMaxKeep + kClusterMaxPush;

/// Copies (cp.async, one group) m, v and θ of the tile's elements i = s + k·NT + threadIdx.x
/// < hi into st[0..2][k·NT + threadIdx.x] (zeros past hi), each thread its own elements.
/// Only this kernel writes them: the copies may start before the kernel's griddepcontrol.wait.
template <int NT = kThreads>
__device__ __forceinline__ void cluster_stage_state(const ClusterStep& x, std::int64_t s, std::int64_t hi, float* st) {
#pragma unroll
  for (int k = 0; k < kClusterPer; ++k) {
    const std::int64_t i = s + k * NT + threadIdx.x;
    const bool ok = i < hi;
    const int at = k * NT + threadIdx.x;
    dev::cp_async4(st + at, ok ? x.mom + i : x.mom, ok);
    dev::cp_async4(st + kTileOf<NT> + at, ok ? x.var + i : x.var, ok);
    dev::cp_async4(st + 2 * kTileOf<NT> + at, ok ? x.theta + i : x.theta, ok);
  }
  dev::cp_async_commit();
}

/// The same tile's first heads' gradients into st[3..] (one more group; after the wait): zeros
/// where cluster_load_grads has them (a head past H or whose reach misses the tile, i ≥ hi).
template <int NT = kThreads>
__device__ __forceinline__ void cluster_stage_grads(const ClusterStep& x, std::int64_t s, std::int64_t hi, float* st) {
#pragma unroll
  for (int h = 0; h < kClusterEarlyHeads; ++h) {
    const bool meets = h < x.H && reach_meets(x.reach, h, s, hi);
#pragma unroll
    for (int k = 0; k < kClusterPer; ++k) {
      const std::int64_t i = s + k * NT + threadIdx.x;
      const bool ok = meets && i < hi;
      dev::cp_async4(st + (3 + h) * kTileOf<NT> + k * NT + threadIdx.x,
                     ok ? x.grads + static_cast<std::int64_t>(h) * x.P + i : x.grads, ok);
    }
  }
  dev::cp_async_commit();
}

/// The staged tile into r, as cluster_load(x, s, hi, false, r) would load it (each thread reads
/// back what its own copies wrote, after waiting for them).
template <int NT = kThreads>
__device__ __forceinline__ void cluster_unstage(const float* st, ClusterTile& r) {
  dev::cp_async_wait<0>();
#pragma unroll
  for (int k = 0; k < kClusterPer; ++k) {
    const int at = k * NT + threadIdx.x;
    r.m[k] = st[at];
    r.v[k] = st[kTileOf<NT> + at];
    r.th[k] = st[2 * kTileOf<NT> + at];
    r.tg[k] = 0.0f;
#pragma unroll
    for (int h = 0; h < kClusterEarlyHeads; ++h) r.gr[h][k] = st[(3 + h) * kTileOf<NT> + at];
  }
}

#if DQN_LAB
/// A lab build (meson -Dlab=true): thread 0 stamps slot `slot` of its block (UpdateClockSlot):
/// %globaltimer, and clock64 in the slot kUpdateClockSlots further on. Nothing when the plan has
/// no clock.
__device__ __forceinline__ void clock_stamp(const ClusterPlan& pl, int slot) {
  if (!pl.clock || threadIdx.x != 0 || static_cast<int>(blockIdx.x) >= pl.clock_blocks) return;
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  std::uint64_t* b = pl.clock + static_cast<std::int64_t>(blockIdx.x) * 2 * kUpdateClockSlots;
  b[slot] = t;
  b[kUpdateClockSlots + slot] = static_cast<std::uint64_t>(clock64());
}
#define DQN_LAB_STAMP(pl, slot) clock_stamp(pl, slot)
#else
#define DQN_LAB_STAMP(pl, slot) ((void)0)
#endif

/// Σ over the cluster's blocks, in rank order, of element i of the shared array p (each block's own
/// copy, through distributed shared memory): every block gets the same sum.
template <int CS>
__device__ __forceinline__ double rank_sum(const cooperative_groups::cluster_group& cluster, double* p, int i) {
  double q[CS];
#pragma unroll
  for (int k = 0; k < CS; ++k) q[k] = cluster.map_shared_rank(p, k)[i];
  double sum = 0.0;
#pragma unroll
  for (int k = 0; k < CS; ++k) sum += q[k];
  return sum;
}

/// The update after budget_partial_kernel (with step), in clusters of CS blocks. Every block: the clip
/// factors and the skip decision (budget_clips), t and the bias corrections from the first launch
/// (block 0 stores t); each block's first tile is loaded before that. A normed matrix's cluster
/// updates its elements (g, Adam), then runs the power iteration over distributed shared memory:
/// each block sums Wᵀu over its rows, every block adds the blocks' sums in rank order (all get the
/// same v = Wᵀu/‖Wᵀu‖), computes x = W v for its rows and Σ x² of them; σ adds those in rank order;
/// each block writes u ← x/σ for its rows and scales them by σ_max/σ when σ > σ_max, then their
/// target update. The other clusters do g, Adam and the target update outside the normed
/// matrices. Needs the normed matrices disjoint ranges inside params within the bounds (the caller
/// checks). Skipped: g = 0, nothing else changes.
/// V: 0, or a split update's launch: kUpdateSplit (the main launch): cluster k
/// takes normed matrix pl.sn_of[k];
/// kUpdateWide (its side launch): the same, in blocks of update_threads(V) = 2·kThreads threads
/// (a tile of 2·kClusterTile elements), and none of them the writer block. Each element's
/// operations and each sum's order are those of the default launch: the same bits.
template <int CS, int V>
__global__ void __launch_bounds__(update_threads(V), (V & kUpdateWide) ? 1 : 2)
    update_cluster_kernel(Update u, const double* __restrict__ partial, int nchunks, ClusterPlan pl) {
  constexpr bool Wide = (V & kUpdateWide) != 0, Mapped = (V & (kUpdateSplit | kUpdateWide)) != 0;
  constexpr int NT = update_threads(V);
  constexpr std::int64_t kTile = kTileOf<NT>;
  DQN_LAB_STAMP(pl, kClockPlaced);  // (the clock is no buffer of the kernels this one waits for)
  namespace cg = cooperative_groups;
  extern __shared__ double cu_shared[];
  __shared__ float clip_sh[kUpdateMaxHeads + 4];  // + 4: see budget()
  __shared__ double sh[32];
  const Budget& b = u.budget;
  float* theta = static_cast<float*>(u.adam.params.p);
  const TargetUpdate& tu = u.target;
  ClusterStep x{static_cast<const float*>(b.grads.p),
                static_cast<float*>(b.g.p),
                static_cast<float*>(u.adam.m.p),
                static_cast<float*>(u.adam.v.p),
                theta,
                clip_sh,
                b.P,
                b.H,
                AdamCoef{},
                false,
                TargetRule{static_cast<float*>(tu.target.p), static_cast<double>(tu.tau), tu.period != 0},
                b.reach,
                b.H == 1};
  const bool every = tu.period == 0;  // Polyak: the target's old values are needed (every step)
  // This block's elements: a normed matrix's rows, or tiles of the ranges outside them.
  const int cid = static_cast<int>(blockIdx.x) / CS;
  const bool normed = cid < pl.nsn;
  const int rank = static_cast<int>(blockIdx.x) % CS;
  int rows = 0, cols = 0, r0 = 0, r1 = 0;
  std::int64_t lo = 0, hi = 0;
  SpectralMatrix sm{};
  const int first = pl.nsn * CS, nblocks = static_cast<int>(gridDim.x) - first;
  const std::int64_t tiles = pl.seg_tile0[pl.nseg];
  int q = 0;
  std::int64_t tile = static_cast<int>(blockIdx.x) - first;
  std::int64_t off = 0;  // a normed matrix's W[0, 0] in params
  if (normed) {
    sm = u.sn_mats[Mapped ? pl.sn_of[cid] : cid];
    rows = max(sm.rows, 0);
    cols = max(sm.cols, 0);
    // this matrix's rows evenly over its cluster (at most pl.rpc, the tallest matrix's share): a
    // 128-row matrix gives each block half the rows a 256-row one does, not two tiles to half of them
    const int share = (rows + CS - 1) / CS;
    r0 = min(rows, rank * share);
    r1 = min(rows, r0 + share);
    off = static_cast<float*>(sm.w.p) - theta;
    lo = off + static_cast<std::int64_t>(r0) * cols;
    hi = off + static_cast<std::int64_t>(r1) * cols;
  } else if (tile < tiles) {
    while (pl.seg_tile0[q + 1] <= tile) ++q;
    lo = pl.seg_lo[q] + (tile - pl.seg_tile0[q]) * kTile;
    hi = pl.seg_hi[q];
  }
  ClusterTile reg;  // in flight during the clips
  // The first tile's m, v, θ and target are loaded before griddepcontrol.wait, so that they load
  // while the partial sums (the kernel this one waits for) finish; only this kernel writes them.
  // A normed block of one tile keeps it in registers from Adam to the scaling and target update
  // after the power iteration (its old target loaded here too, for Polyak).
  const bool keep = normed && hi - lo <= kTile;
  // pl.stage: a normed block's second tile staged in shared memory, its copies started here; and
  // where a matrix row is a tile row, Wᵀu's share summed from registers during Adam (u of the
  // block's rows into shared memory first: only this kernel writes u)
  const bool staged = !Wide && pl.stage && normed && hi - lo > kTile;  // (Wide: no staging area)
  const bool colreg = pl.stage && normed && cols == NT;
  // pl.keepw (with stage): the block's rows of the new θ in wsh from Adam on; a block that does not
  // keep its one tile in registers copies its rows' old target into tsh now (Polyak; each thread
  // its own elements, as the tail reads them)
  const bool kept = pl.keepw && pl.stage && normed;
  const bool tstaged = kept && every && !keep;
  float* ush = reinterpret_cast<float*>(cu_shared + pl.stage_at);
  float* stg = ush + cluster_stage_u(pl.rpc);
  float* wsh = stg + (Wide ? 0 : kClusterStaged * kTile);
  float* tsh = wsh + cluster_keep_rows(pl.rpc, pl.max_cols);
  float* uv = normed ? static_cast<float*>(sm.u.p) : nullptr;
  cluster_load_state<NT>(x, lo, min(hi, lo + kTile), every && (!normed || keep), reg);
  if (staged) cluster_stage_state<NT>(x, lo + kTile, min(hi, lo + 2 * kTile), stg);
  if (tstaged) {
    for (std::int64_t i = lo + threadIdx.x; i < hi; i += NT) dev::cp_async4(tsh + (i - lo), x.rule.tgt + i, true);
    dev::cp_async_commit();
  }
  if (colreg || kept)
    for (int r = r0 + static_cast<int>(threadIdx.x); r < r1; r += NT) ush[r - r0] = uv[r];
  // push: an arrival now, awaited before the first store into another block's shared memory (every
  // block of the cluster has started by then)
  const bool push = pl.push && normed;
  double* pw = cu_shared + pl.push_at;  // [CS][max_cols]: the ranks' Wᵀu sums
  double* px = pw + static_cast<std::int64_t>(CS) * pl.max_cols;  // [CS]: their Σ x²
  if (push) asm volatile("barrier.cluster.arrive.relaxed;\n" ::: "memory");
  dev::pdl_entry();
  DQN_LAB_STAMP(pl, kClockWaited);
  const double bc1 = pl.step[0], bc2 = pl.step[1];
  const auto t_new = static_cast<long long>(pl.step[2]);
  cluster_load_grads<NT>(x, lo, min(hi, lo + kTile), reg);
  if (staged) cluster_stage_grads<NT>(x, lo + kTile, min(hi, lo + 2 * kTile), stg);
  // (budget_clips' barriers publish ush)
  const bool writer = !Wide && blockIdx.x == 0;  // (the main launch's block 0 stores the step's reports)
  const bool finite = budget_clips(b, partial, nchunks, clip_sh, writer);
  DQN_LAB_STAMP(pl, kClockClips);
  if (finite && writer && threadIdx.x == 0) *u.adam.t = t_new;
  x.finite = finite;
  if (finite)
    x.adam = adam_coef(u.adam.beta1, u.adam.beta2, u.adam.eps, *static_cast<const float*>(u.adam.lr.p), bc1, bc2);
  const bool target_on = finite && (tu.period == 0 || t_new % tu.period == 0);
  if (!normed) {
    if (tile >= tiles) {
      DQN_LAB_STAMP(pl, kClockAdam);
      DQN_LAB_STAMP(pl, kClockExit);
      return;
    }
    // the block's tiles (the first loaded already)
    std::int64_t s = lo, e = min(hi, lo + kTile);
    cluster_store<NT>(x, s, e, target_on, reg);
    for (;;) {
      tile += nblocks;
      if (tile >= tiles) break;
      while (pl.seg_tile0[q + 1] <= tile) ++q;
      s = pl.seg_lo[q] + (tile - pl.seg_tile0[q]) * kTile;
      e = min(pl.seg_hi[q], s + kTile);
      cluster_load<NT>(x, s, e, every && target_on, reg);
      cluster_store<NT>(x, s, e, target_on, reg);
    }
    DQN_LAB_STAMP(pl, kClockAdam);
    DQN_LAB_STAMP(pl, kClockExit);
    return;
  }
  cg::cluster_group cluster = cg::this_cluster();
  float* W = static_cast<float*>(sm.w.p);
  // colreg: Σ over the block's rows of W[r, c] u[r] for c = threadIdx.x, from each tile's new θ
  // (rows in order, as the loop below adds them: the same sum)
  double wtu = 0.0;
  const auto wtu_tile = [&](std::int64_t s) {
    if (!colreg) return;
    const int rb = static_cast<int>((s - lo) / NT);  // the tile's first row, from r0
#pragma unroll
    for (int k = 0; k < kClusterPer; ++k)
      if (s + k * NT + threadIdx.x < hi)
        wtu += static_cast<double>(reg.th[k]) * static_cast<double>(ush[rb + k]);
  };
  // kept: the tile's new θ into wsh (each thread its own elements; read after a barrier)
  const auto keep_tile = [&](std::int64_t s) {
    if (!kept) return;
#pragma unroll
    for (int k = 0; k < kClusterPer; ++k) {
      const std::int64_t i = s + k * NT + threadIdx.x;
      if (i < hi) wsh[i - lo] = reg.th[k];
    }
  };
  // the block's rows: g and Adam (their target update follows the spectral norm; with the kept
  // rows, their θ too: stored once, after the power iteration, scaled or not). Only with the kept
  // rows: the power iteration reads W v (and, where not summed from registers, Wᵀu) from them,
  // and from params otherwise, which must then hold the new θ — a block keeping its one tile in
  // registers without them (the four heads' grid, in waves, keeps no rows) stores θ beside Adam
  const bool defer = kept;
  // a tile (the first loaded already, the second staged where staged)
  const auto tile_step = [&](std::int64_t s, bool first) {
    if (!first) {
      if (staged && s == lo + kTile)
        cluster_unstage<NT>(stg, reg);
      else
        cluster_load<NT>(x, s, min(hi, s + kTile), false, reg);
    }
    cluster_store<NT>(x, s, min(hi, s + kTile), false, reg, !defer);
    wtu_tile(s);
    keep_tile(s);
  };
  tile_step(lo, true);
  for (std::int64_t s = lo + kTile; s < hi; s += kTile) tile_step(s, false);
  DQN_LAB_STAMP(pl, kClockAdam);
  if (!finite || rows == 0 || cols == 0) {  // the same in every block of the cluster
    if (tstaged) dev::cp_async_wait<0>();  // (no copy outlives the block)
    if (push) asm volatile("barrier.cluster.wait;\n" ::: "memory");  // (its arrival's phase closed)
    DQN_LAB_STAMP(pl, kClockExit);
    return;
  }
  double* part = cu_shared;          // [max_cols]: Σ over this block's rows of W[r, c] u[r]
  double* vv = part + pl.max_cols;   // [max_cols]: v
  double* xr = vv + pl.max_cols;     // [rpc]
  double* xsq = xr + pl.rpc;         // [1]
  // push: the column's sum into slot `rank` of every block's pw
  const auto push_col = [&](int c, double w) {
#pragma unroll
    for (int k = 0; k < CS; ++k) cluster.map_shared_rank(pw, k)[rank * pl.max_cols + c] = w;
  };
  if (push) asm volatile("barrier.cluster.wait;\n" ::: "memory");
  if (colreg) {
    if (push)
      push_col(static_cast<int>(threadIdx.x), wtu);
    else
      part[threadIdx.x] = wtu;  // (the cluster barrier below also orders this block's writes of W)
  } else {
    __syncthreads();  // this block's rows of W are written (and kept)
    for (int c = threadIdx.x; c < cols; c += NT) {
      double acc = 0.0;
      if (kept) {  // the same floats from shared memory, added in the same order
#pragma unroll 8
        for (int r = 0; r < r1 - r0; ++r)
          acc += static_cast<double>(wsh[static_cast<std::int64_t>(r) * cols + c]) * static_cast<double>(ush[r]);
      } else {
#pragma unroll 8
        for (int r = r0; r < r1; ++r)
          acc += static_cast<double>(W[static_cast<std::int64_t>(r) * cols + c]) * static_cast<double>(uv[r]);
      }
      if (push)
        push_col(c, acc);
      else
        part[c] = acc;
    }
  }
  cluster.sync();
  DQN_LAB_STAMP(pl, kClockWtu);
  // Wᵀu: the blocks' sums in rank order, the same in every block
  double vsq = 0.0;
  double* v = vv;  // v = Wᵀu / ‖Wᵀu‖ (in part with pl.gather)
  if (push) {  // the ranks' sums from this block's slots, in rank order (as rank_sum adds them)
    for (int c = threadIdx.x; c < cols; c += NT) {
      double w = 0.0;
#pragma unroll
      for (int k = 0; k < CS; ++k) w += pw[k * pl.max_cols + c];
      vv[c] = w;
      vsq += w * w;
    }
  } else if (pl.gather) {
    // each block sums its share of the columns over the ranks (in rank order) into its vv, then
    // every block reads the shares from their owners into its part (whose sums every block has
    // read before the barrier): the same sums, 1 remote load a column instead of CS
    const int per = (cols + CS - 1) / CS, c0 = rank * per, c1 = min(cols, c0 + per);
    for (int c = c0 + static_cast<int>(threadIdx.x); c < c1; c += NT)
      vv[c] = rank_sum<CS>(cluster, part, c);
    cluster.sync();
    for (int c = threadIdx.x; c < cols; c += NT) {
      const int owner = c / per;
      const double w = owner == rank ? vv[c] : cluster.map_shared_rank(vv, owner)[c];
      part[c] = w;
      vsq += w * w;
    }
    v = part;
  } else {
    for (int c = threadIdx.x; c < cols; c += NT) {
      const double w = rank_sum<CS>(cluster, part, c);
      vv[c] = w;
      vsq += w * w;
    }
  }
  DQN_LAB_STAMP(pl, kClockGather);  // (thread 0's share of the gather)
  const double vn = sqrt(block_sum(vsq, sh));  // its barriers also publish v
  const double vnorm = vn < 1e-12 ? 1e-12 : vn;
  for (int c = threadIdx.x; c < cols; c += NT) v[c] /= vnorm;
  __syncthreads();
  DQN_LAB_STAMP(pl, kClockV);
  // x = W v for this block's rows: a warp per row, lanes along the row
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int r = r0 + warp; r < r1; r += NT / 32) {
    double xs = 0.0;
    const float* wr = kept ? wsh + static_cast<std::int64_t>(r - r0) * cols : W + static_cast<std::int64_t>(r) * cols;
#pragma unroll 8
    for (int c = lane; c < cols; c += 32) xs += static_cast<double>(wr[c]) * v[c];
    xs = warp_sum(xs);
    if (lane == 0) xr[r - r0] = xs;
  }
  __syncthreads();
  DQN_LAB_STAMP(pl, kClockWv);
  if (warp == 0) {
    double sq = 0.0;
    for (int r = lane; r < r1 - r0; r += 32) sq += xr[r] * xr[r];
    sq = warp_sum(sq);
    if (push) {  // lane 0's sum (the lanes' may differ in the last bit) into slot `rank` of each block
      const double s0 = __shfl_sync(0xffffffffu, sq, 0);
      if (lane < CS) *cluster.map_shared_rank(px + rank, lane) = s0;
    } else if (lane == 0) {
      *xsq = sq;
    }
  }
  cluster.sync();
  DQN_LAB_STAMP(pl, kClockSigma);
  double sigma2;
  if (push) {
    sigma2 = 0.0;
#pragma unroll
    for (int k = 0; k < CS; ++k) sigma2 += px[k];
  } else if (pl.gather) {  // the ranks' Σ x² by one warp, added in rank order as rank_sum does
    if (warp == 0) {
      const double q = lane < CS ? *cluster.map_shared_rank(xsq, lane) : 0.0;
      double sum = 0.0;
#pragma unroll
      for (int k = 0; k < CS; ++k) sum += __shfl_sync(0xffffffffu, q, k);
      if (lane == 0) sh[0] = sum;
    }
    __syncthreads();
    sigma2 = sh[0];
  } else {
    sigma2 = rank_sum<CS>(cluster, xsq, 0);
  }
  const double sigma = sqrt(sigma2);
  const double unorm = sigma < 1e-12 ? 1e-12 : sigma;
  for (int r = r0 + threadIdx.x; r < r1; r += NT) uv[r] = static_cast<float>(xr[r - r0] / unorm);
  // the block's rows: scaled when σ > σ_max, then their target update (loads first, per tile)
  const bool scale = sigma > static_cast<double>(u.sigma_max);
  const double factor = scale ? static_cast<double>(u.sigma_max) / sigma : 1.0;
  if (scale || target_on || defer) {
    const bool polyak_on = target_on && !x.rule.copy;
    if (tstaged) dev::cp_async_wait<0>();  // this thread's copies of its elements' target
    for (std::int64_t s = lo; s < hi; s += kTile) {
      float wr[kClusterPer], tr[kClusterPer];
#pragma unroll
      for (int k = 0; k < kClusterPer; ++k) {
        const std::int64_t i = s + k * NT + threadIdx.x;
        wr[k] = tr[k] = 0.0f;
        if (i >= hi) continue;
        if (keep) {  // the new θ and the old target, kept since Adam (the same values as in memory)
          wr[k] = reg.th[k];
          tr[k] = reg.tg[k];
        } else if (kept) {  // the same, from shared memory
          wr[k] = wsh[i - lo];
          if (polyak_on) tr[k] = tsh[i - lo];
        } else {
          wr[k] = theta[i];
          if (polyak_on) tr[k] = x.rule.tgt[i];
        }
      }
#pragma unroll
      for (int k = 0; k < kClusterPer; ++k) {
        const std::int64_t i = s + k * NT + threadIdx.x;
        if (i >= hi) continue;
        float w = wr[k];
        if (scale) w = static_cast<float>(static_cast<double>(w) * factor);
        if (scale || defer) theta[i] = w;
        if (target_on) x.rule.tgt[i] = x.rule.copy ? w : polyak(x.rule.tau, tr[k], w);
      }
    }
  }
  DQN_LAB_STAMP(pl, kClockScaled);
  // no block leaves while another may still read its shared memory (push: none reads another's)
  if (!push) cluster.sync();
  DQN_LAB_STAMP(pl, kClockExit);
}

}  // namespace

std::size_t update_scratch_bytes(int H) {
  return budget_scratch_bytes(H) + 256;  // + 256: the step's constants after the partial sums
}

int update_max_heads() { return kUpdateMaxHeads; }
int update_max_matrices() { return kUpdateMaxSn; }

/// The launch of `blocks` blocks of `threads` (kThreads unless given) in clusters of cs (attr:
/// storage for the attributes the configuration points to; with pdl, also programmatic stream
/// serialization where enabled).
cudaLaunchConfig_t cluster_config(int cs, unsigned blocks, std::size_t shared, cudaStream_t s,
                                  cudaLaunchAttribute (&attr)[2], bool pdl = false, int threads = kThreads) {
  attr[0] = cudaLaunchAttribute{};
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(cs);
  attr[0].val.clusterDim.y = attr[0].val.clusterDim.z = 1;
  attr[1] = dev::pdl_attribute();
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(blocks);
  cfg.blockDim = dim3(static_cast<unsigned>(threads));
  cfg.dynamicSmemBytes = shared;
  cfg.stream = s;
  cfg.attrs = attr;
  cfg.numAttrs = pdl && pdl_for(shared, s) ? 2 : 1;
  return cfg;
}

/// The cluster update's instantiation for cs (16, else 8) blocks a cluster and variant v (0, or at
/// 16 kUpdateSplit or kUpdateWide, a split update's two launches: it runs at 16 blocks a cluster
/// only).
using UpdateKernel = void (*)(Update, const double*, int, ClusterPlan);
/// The variants instantiated at cs = 16: every v below it (kUpdateSplit and kUpdateWide never
/// together), and at 8 those below kUpdateSplit.
constexpr int kUpdateKernels16 = kUpdateSplit | kUpdateWide, kUpdateKernels8 = kUpdateSplit;
template <int CS, int... Vs>
UpdateKernel update_kernel_of(int v, std::integer_sequence<int, Vs...>) {
  UpdateKernel k = update_cluster_kernel<CS, 0>;
  ((v == Vs ? (k = update_cluster_kernel<CS, Vs>, 0) : 0), ...);
  return k;
}
UpdateKernel update_kernel(int cs, int v) {
  return cs == 16 ? update_kernel_of<16>(v, std::make_integer_sequence<int, kUpdateKernels16>{})
                  : update_kernel_of<8>(v, std::make_integer_sequence<int, kUpdateKernels8>{});
}

/// How many clusters of cs blocks of the cluster update the device holds at once with `shared`
/// bytes of dynamic shared memory a block (0 where it cannot say).
int active_clusters(int cs, unsigned blocks, std::size_t shared, int v = 0) {
  cudaLaunchAttribute attr[2]{};
  const cudaLaunchConfig_t cfg = cluster_config(cs, blocks, shared, nullptr, attr, false, update_threads(v));
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, update_kernel(cs, v), &cfg) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return clusters;
}

int update_cluster_size(int want) {
  int dev = 0, ok = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&ok, cudaDevAttrClusterLaunch, dev) != cudaSuccess ||
      !ok) {
    cudaGetLastError();
    return 0;
  }
  // 16 blocks per cluster where the device schedules them (a non-portable size), else 8.
  for (int v = 0; v < kUpdateKernels16; ++v)
    cudaFuncSetAttribute(update_kernel(16, v), cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  cudaGetLastError();
  // room for the staging area, the kept rows and the push slots past the default 48 KiB
  for (int cv = 0; cv < kUpdateKernels16 + kUpdateKernels8; ++cv) {
    const UpdateKernel k = cv < kUpdateKernels16 ? update_kernel(16, cv) : update_kernel(8, cv - kUpdateKernels16);
    cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kClusterMaxDynamic));
    // the most shared memory an SM gives (the kept rows and push slots: two blocks of 111 KiB);
    // the update streams its operands once, so the smaller L1 costs it nothing
    cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
  }
  cudaGetLastError();
  for (int cs : {16, 8}) {
    if (want != 0 && cs != want) continue;
    // one cluster, with the shared memory of a typical large case (33 KiB)
    if (active_clusters(cs, static_cast<unsigned>(cs), cluster_update_shared(2048, 64)) > 0) return cs;
  }
  return 0;
}

bool update_cluster_fits(int cs, int max_rows, int max_cols) {
  if (cs < 1 || max_rows < 0 || max_cols < 0) return false;
  return cluster_update_shared(max_cols, (max_rows + cs - 1) / cs) <= kClusterMaxShared;
}

namespace {
/// A split update's side launch (kUpdateWide) as planned: its plan, grid and dynamic shared memory.
struct ClusterLaunch {
  ClusterPlan pl;
  unsigned blocks = 0;
  std::size_t shared = 0;
};

/// The normed matrices `idx` (indices into Update::sn_mats) in pl, one cluster each in that order
/// (pl.sn_of names them: read by a split update's launches, the identity otherwise), and the rows
/// and columns their blocks' shared memory is sized for.
void plan_normed(ClusterPlan& pl, const std::vector<SnRange>& mats, const std::vector<int>& idx, int cs) {
  pl.nsn = static_cast<int>(idx.size());
  int rows = 0, cols = 0;
  for (std::size_t k = 0; k < idx.size(); ++k) {
    const SnRange& m = mats[static_cast<std::size_t>(idx[k])];
    pl.sn_of[k] = static_cast<unsigned char>(idx[k]);
    if (m.rows <= 0 || m.hi <= m.lo) continue;
    rows = std::max(rows, m.rows);
    cols = std::max(cols, static_cast<int>((m.hi - m.lo) / m.rows));
  }
  pl.max_cols = std::max(cols, 1);
  pl.rpc = std::max((rows + cs - 1) / cs, 1);
}
}  // namespace

cudaError_t update_cluster(cudaStream_t s, const Update& u, void* scratch, int cs, const std::vector<SnRange>& mats,
                           int max_blocks, std::uint64_t* clock, int clock_blocks, int* launched,
                           UpdateChoices* choices, const UpdateSide* side) {
  const Budget& b = u.budget;
  if ((cs != 8 && cs != 16) || u.sn_count > kUpdateMaxSn || !update_cluster_fits(cs, u.sn_max_rows, u.sn_max_cols) ||
      static_cast<int>(mats.size()) != u.sn_count)
    return cudaErrorInvalidValue;
  ClusterPlan pl;  // the main launch's (unsplit: every matrix, in table order)
  // The ranges of params outside every normed matrix, and their tiles.
  std::vector<std::pair<std::int64_t, std::int64_t>> normed;
  for (const SnRange& r : mats)
    if (r.hi > r.lo) normed.emplace_back(r.lo, r.hi);
  std::sort(normed.begin(), normed.end());
  std::int64_t at = 0;
  auto add = [&](std::int64_t lo, std::int64_t hi) {
    if (hi <= lo) return;
    pl.seg_lo[pl.nseg] = lo;
    pl.seg_hi[pl.nseg] = hi;
    pl.seg_tile0[pl.nseg + 1] = pl.seg_tile0[pl.nseg] + (hi - lo + kClusterTile - 1) / kClusterTile;
    ++pl.nseg;
  };
  for (const auto& r : normed) {
    add(at, r.first);
    at = std::max(at, r.second);
  }
  add(at, b.P);
  const std::int64_t tiles = pl.seg_tile0[pl.nseg];
  const std::int64_t plain = std::min<std::int64_t>(tiles, std::max(max_blocks, cs));
  const std::int64_t plain_blocks = (plain + cs - 1) / cs * cs;
  // wide: the matrices whose share of rows passes one tile of a kThreads block go to the side
  // launch (at 16 blocks a cluster, with a side stream); the others stay in the main one. Only
  // where the whole update is resident at once with the most shared memory the main launch may
  // take, a side launch's block counted as two of the main launch's (it takes an SM): the C51
  // step (on an H200 1.4 µs faster with it), not the four heads' update in waves (7 µs slower)
  std::vector<int> main_idx, wide_idx;
  for (int k = 0; k < u.sn_count; ++k) {
    const SnRange& m = mats[static_cast<std::size_t>(k)];
    const bool wide = side && side->stream && cs == 16 && m.rows > 0 && m.hi > m.lo &&
                      static_cast<std::int64_t>((m.rows + cs - 1) / cs) * ((m.hi - m.lo) / m.rows) > kClusterTile;
    (wide ? wide_idx : main_idx).push_back(k);
  }
  if (!wide_idx.empty()) {
    const int mc = std::max(u.sn_max_cols, 1), rpc = std::max((u.sn_max_rows + cs - 1) / cs, 1);
    const std::size_t most = cluster_most_shared(cs, mc, rpc);
    const std::int64_t need =
        static_cast<std::int64_t>(u.sn_count + static_cast<int>(wide_idx.size())) * cs + plain_blocks;
    if (static_cast<std::int64_t>(active_clusters(cs, static_cast<unsigned>(need), most)) * cs < need) {
      main_idx.clear();
      for (int k = 0; k < u.sn_count; ++k) main_idx.push_back(k);
      wide_idx.clear();
    }
  }
  const bool split = !wide_idx.empty();
  plan_normed(pl, mats, main_idx, cs);
  const int variant = split ? kUpdateSplit : 0;
  const auto blocks = static_cast<unsigned>(static_cast<std::int64_t>(pl.nsn) * cs + plain_blocks);
  // Each area of shared memory where the grid stays resident at once with it (the C51 step: 176
  // blocks; measured 1.2 µs faster there with staging and gathering, on an H100), not where its
  // plain blocks run in waves (the four heads' 690 blocks: 1-2 µs slower with them). A split
  // update decides by its main launch.
  std::size_t base = cluster_update_shared(pl.max_cols, pl.rpc);
  // the push slots, where they take at most kClusterMaxPush and the grid stays resident with them
  // and the staging area (and, fit, the kept rows): decided below, laid out here
  const std::size_t push_bytes = cluster_push_shared(cs, pl.max_cols);
  pl.push_at = static_cast<int>(base / sizeof(double));
  const auto fits = [&](std::size_t shared) {
    return static_cast<std::int64_t>(active_clusters(cs, blocks, shared, variant)) * cs >= blocks;
  };
  // an area's choice: where the grid stays resident with `shared` bytes a block
  const auto wants = [&](std::size_t shared) { return blocks > 0 && fits(shared); };
  const std::size_t stage_bytes = cluster_stage_shared(pl.rpc), keep_bytes = cluster_keep_shared(pl.rpc, pl.max_cols);
  const bool pushed = push_bytes <= kClusterMaxPush && wants(cluster_most_shared(cs, pl.max_cols, pl.rpc));
  if (pushed) base += push_bytes;
  pl.stage_at = static_cast<int>(base / sizeof(double));
  const bool staged = wants(base + stage_bytes);
  std::size_t shared = base + (staged ? stage_bytes : 0);
  // the kept rows: with the staging area, where they take at most kClusterMaxKeep and the grid
  // stays resident with them
  const bool kept = staged && keep_bytes <= kClusterMaxKeep && wants(shared + keep_bytes);
  if (kept) shared += keep_bytes;
  const bool gathered = !pushed && wants(shared);
  pl.push = pushed;
  pl.stage = staged;
  pl.gather = gathered;
  pl.keepw = kept;
  auto* partial = static_cast<double*>(scratch);
  auto* step = reinterpret_cast<double*>(static_cast<char*>(scratch) + budget_scratch_bytes(b.H));
  pl.step = step;
  pl.clock = clock;
  pl.clock_blocks = clock ? clock_blocks : 0;
  // The side launch: the main launch's choices, its shared memory laid out for its own matrices
  // (u of a block's rows where the staging area would be: a wide block holds no second tile)
  ClusterLaunch wl;
  if (split) {
    ClusterPlan& w = wl.pl;
    w = pl;
    w.nseg = 0;
    w.seg_tile0[0] = 0;
    plan_normed(w, mats, wide_idx, cs);
    std::size_t wb = cluster_update_shared(w.max_cols, w.rpc);
    w.push_at = static_cast<int>(wb / sizeof(double));
    const std::size_t wpush = cluster_push_shared(cs, w.max_cols);
    w.push = pushed && wpush <= kClusterMaxPush;
    w.gather = gathered || (pushed && !w.push);
    if (w.push) wb += wpush;
    w.stage_at = static_cast<int>(wb / sizeof(double));
    if (staged) wb += cluster_stage_u(w.rpc) * sizeof(float);
    const std::size_t wkeep = cluster_keep_shared(w.rpc, w.max_cols);
    w.keepw = kept && wkeep <= kClusterMaxKeep;
    if (w.keepw) wb += wkeep;
    wl.shared = wb;
    wl.blocks = static_cast<unsigned>(w.nsn * cs);
    // the stamps after the main launch's blocks
    const int left = clock ? clock_blocks - static_cast<int>(blocks) : 0;
    w.clock = left > 0 ? clock + static_cast<std::int64_t>(blocks) * 2 * kUpdateClockSlots : nullptr;
    w.clock_blocks = std::max(left, 0);
  }
  int nchunks = 0;
  if (cudaError_t e = budget_partials(s, b, partial, nchunks, &u.adam, step); e != cudaSuccess) return e;
  if (launched) *launched = static_cast<int>(blocks + wl.blocks);
  if (choices) {
    *choices = {staged, gathered, kept, pushed, b.H == 1, {}, pl.nsn, static_cast<int>(blocks)};
    for (int k = 0; k < pl.nsn; ++k) choices->clusters.push_back(pl.sn_of[k]);
    for (int k : wide_idx) choices->clusters.push_back(k);
  }
  if (split) {
    // forked after the partial sums (the event holds the stream's work so far), launched first,
    // joined back after the main launch
    const UpdateKernel wk = update_kernel(cs, kUpdateWide);
    cudaLaunchAttribute wattr[2]{};
    const cudaLaunchConfig_t wcfg =
        cluster_config(cs, wl.blocks, wl.shared, side->stream, wattr, true, update_threads(kUpdateWide));
    if (cudaError_t e = cudaEventRecord(side->fork, s); e != cudaSuccess) return e;
    if (cudaError_t e = cudaStreamWaitEvent(side->stream, side->fork, 0); e != cudaSuccess) return e;
    if (cudaError_t e = cudaLaunchKernelEx(&wcfg, wk, u, static_cast<const double*>(partial), nchunks, wl.pl);
        e != cudaSuccess)
      return e;
    if (cudaError_t e = cudaEventRecord(side->join, side->stream); e != cudaSuccess) return e;
  }
  if (blocks > 0) {
    const UpdateKernel kernel = update_kernel(cs, variant);
    cudaLaunchAttribute attr[2]{};
    const cudaLaunchConfig_t cfg = cluster_config(cs, blocks, shared, s, attr, true);
    if (cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, u, static_cast<const double*>(partial), nchunks, pl);
        e != cudaSuccess)
      return e;
  }
  return split ? cudaStreamWaitEvent(s, side->join, 0) : cudaSuccess;
}

}  // namespace dqn::cuda
