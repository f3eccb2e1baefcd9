/** @file optim_common.cuh
 *  @brief What the optimiser's kernels and the cluster update share (private to kernels/): the
 *  budget's partial-sum shape and clip factors, Adam's constants and one element's step, the
 *  Polyak step, and the launch of the budget's partial sums.
 */
#pragma once

#include <cstdint>

#include "kernel_common.cuh"

namespace dqn::cuda {
namespace {

// --- budgets --------------------------------------------------------------------------------

constexpr int kBudgetPer = 8;                                                // elements per thread per tile
constexpr std::int64_t kBudgetTile = std::int64_t{kThreads} * kBudgetPer;   // elements per block per tile
constexpr std::int64_t kBudgetMaxChunks = 512;                               // partial sums per head, at most

/// Elements per partial-sum chunk (whole tiles, at most kBudgetMaxChunks chunks per head). A
/// function of P only, so the reduction's shape, and its rounding, is the same on every device.
inline std::int64_t budget_chunk(std::int64_t P) {
  const std::int64_t tiles = std::max<std::int64_t>(1, (P + kBudgetTile - 1) / kBudgetTile);
  return kBudgetTile * ((tiles + kBudgetMaxChunks - 1) / kBudgetMaxChunks);
}
inline int budget_chunks(std::int64_t P) {
  const std::int64_t c = budget_chunk(P);
  return static_cast<int>(std::max<std::int64_t>(1, (P + c - 1) / c));
}

/// The partial sums' shape: chunks of whole tiles over the longest row the norms read (P, or the
/// most elements one head reaches), at most kBudgetMaxChunks of them.
struct BudgetShape {
  std::int64_t chunk;
  int nchunks;
};
inline BudgetShape budget_shape(const Budget& b) {
  const std::int64_t len = b.reach ? std::max<std::int64_t>(b.reach_max, 1) : b.P;
  return BudgetShape{budget_chunk(len), budget_chunks(len)};
}

/// Head h's range q in Budget::reach: {lo, hi}.
__device__ __forceinline__ const std::int64_t* reach_range(const std::int64_t* reach, int h, int q) {
  return reach + (static_cast<std::int64_t>(h) * kBudgetReach + q) * 2;
}

/// Every block: the norms and clip factors of the H heads from the partial sums (a warp per head,
/// the same fixed order in every block, so all blocks agree) into clip_sh [H]; returns whether
/// every head is finite (the same in every thread). The writer block also stores norms, clips,
/// the total loss, skip and skipped.
__device__ inline bool budget_clips(const Budget& a, const double* __restrict__ partial, int nchunks, float* clip_sh,
                             bool writer) {
  const int H = a.H;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  int ok = 1;
  for (int h = warp; h < H; h += nwarps) {
    // every load of the lane at once, then the sum in the same order as a loop would take them
    // (a loop waited for each load in turn: up to 16 trips to L2 in a row before the first clip)
    constexpr int kPer = (kBudgetMaxChunks + 31) / 32;
    const double* ph = partial + static_cast<std::int64_t>(h) * nchunks;
    double x[kPer];
#pragma unroll
    for (int q = 0; q < kPer; ++q) x[q] = lane + 32 * q < nchunks ? ph[lane + 32 * q] : 0.0;
    double sq = 0.0;  // + 0.0 past nchunks changes nothing (the sum starts at +0 and stays >= 0)
#pragma unroll
    for (int q = 0; q < kPer; ++q) sq += x[q];
    const double norm = sqrt(warp_sum(sq));
    // A head whose norm is not finite contributes nothing (the step is skipped anyway).
    const bool finite = isfinite(norm);
    const double clip =
        finite ? fmin(1.0, static_cast<double>(static_cast<const float*>(a.fractions.p)[h]) *
                               static_cast<double>(a.max_grad_norm) / (norm + 1e-6))
               : 0.0;
    if (!finite) ok = 0;
    if (lane == 0) {
      clip_sh[h] = static_cast<float>(clip);
      if (writer) {
        static_cast<float*>(a.norms.p)[h] = static_cast<float>(norm);
        static_cast<float*>(a.clips.p)[h] = static_cast<float>(clip);
      }
    }
  }
  const bool all_finite = __syncthreads_and(ok) != 0;  // also publishes clip_sh
  if (writer && threadIdx.x == 0) {
    const float* losses = static_cast<const float*>(a.losses.p);
    double total_loss = 0.0;
    for (int h = 0; h < H; ++h) total_loss += static_cast<double>(losses[h]);
    static_cast<float*>(a.total_loss.p)[0] = static_cast<float>(total_loss);
    *a.skip = all_finite ? 0 : 1;
    if (!all_finite) ++*a.skipped;
  }
  return all_finite;
}

/// Whether head h's reach (Budget::reach; null: everything) meets elements [s, e).
__device__ __forceinline__ bool reach_meets(const std::int64_t* reach, int h, std::int64_t s, std::int64_t e) {
  if (!reach) return true;
  for (int q = 0; q < kBudgetReach; ++q) {
    const std::int64_t* r = reach_range(reach, h, q);
    if (r[0] < e && s < r[1]) return true;
  }
  return false;
}

/// Adam's constants for one step, rounded to float once: β1, 1 − β1, β2, 1 − β2, lr / (1 − β1^t),
/// 1 / (1 − β2^t) and ε (bc1 = 1 − β1^t, bc2 = 1 − β2^t for the step's new t, in double).
struct AdamCoef {
  float b1, c1, b2, c2, step, inv_bc2, eps;
};
__device__ __forceinline__ AdamCoef adam_coef(double b1, double b2, double eps, double lr, double bc1, double bc2) {
  return AdamCoef{static_cast<float>(b1),       static_cast<float>(1.0 - b1), static_cast<float>(b2),
                  static_cast<float>(1.0 - b2), static_cast<float>(lr / bc1), static_cast<float>(1.0 / bc2),
                  static_cast<float>(eps)};
}

/// One element's Adam update, in float arithmetic (the CPU twin computes in double; the two
/// differ by float rounding, about 1e-7 relative): m and v in place; returns the new θ. Each
/// operation is rounded explicitly, so every kernel that uses it computes the same bits. A double
/// chain here (two divisions and a square root per element) set the length of the update kernels.
/// The square root and the division are IEEE's (__fsqrt_rn, __fdiv_rn), whose fast paths do not
/// take a zero: a zero operand goes through a slow-path subroutine, a call per lane, and the
/// warp waits for it. Parameters whose gradient has been zero so far (dead units, padding rows)
/// have v = m = 0; the nineteenth session's profile had a third of the update's warps in those
/// calls for every element. So a zero gets its result by select: sqrt(±0) = ±0, and ±0 / d = ±0
/// for d > 0 (d = sqrt(v̂) + ε, +inf included), the values the IEEE operations give; the
/// operations themselves get 1 there, so that they stay on their fast paths. The same bits.
__device__ __forceinline__ float adam_element(float g, float& m, float& v, float theta, const AdamCoef& c) {
  const float mi = __fmaf_rn(c.b1, m, __fmul_rn(c.c1, g));
  const float vi = __fmaf_rn(c.b2, v, __fmul_rn(__fmul_rn(c.c2, g), g));
  m = mi;
  v = vi;
  const float vh = __fmul_rn(vi, c.inv_bc2);
  const bool v_zero = vh == 0.0f;
  const float den = __fadd_rn(v_zero ? vh : __fsqrt_rn(v_zero ? 1.0f : vh), c.eps);
  const float num = __fmul_rn(c.step, mi);
  const bool n_zero = num == 0.0f && den > 0.0f;
  return __fsub_rn(theta, n_zero ? num : __fdiv_rn(n_zero ? 1.0f : num, den));
}

/// The Polyak step of one target element: old + τ (src − old), in float (one rounding each).
__device__ __forceinline__ float polyak(double tau, float old, float src) {
  return __fmaf_rn(static_cast<float>(tau), __fsub_rn(src, old), old);
}

}  // namespace

/// The budget's first pass (budget_partial_kernel): the partial sums into `partial`, their count
/// per head in nchunks; with adam and step (the cluster update), also the step's new t and Adam's
/// bias corrections into step[0..2].
cudaError_t budget_partials(cudaStream_t s, const Budget& b, double* partial, int& nchunks,
                            const Adam* adam = nullptr, double* step = nullptr);

}  // namespace dqn::cuda
