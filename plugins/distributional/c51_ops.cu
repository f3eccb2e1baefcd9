/** @file c51_ops.cu
 *  @brief The C51 ops' device half: the dense projection, the cross-entropy with its gradient (and
 *  the fused dueling backward), and the fused loss from the target head's outputs to the dueling
 *  gradients. Each kernel reproduces, operation for operation, the host twin's arithmetic (same
 *  roundings, fixed summation orders); in fp32 pipelines the distribution math is in double, as
 *  the host's (DeviceContext::precision), else in float. Launched on the stage's stream through
 *  the SDK (dqn/device.cuh), never allocating: scratch comes from the head's registry buffers.
 */
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "c51_ops.hpp"
#include "dqn/device.cuh"
#include "dqn/dist_device.cuh"

namespace dqn {
namespace {

using dev::action_logits;
using dev::block_sum;
using dev::exp_t;
using dev::kWarpAtoms;
using dev::kWarpMaxA;
using dev::log_t;
using dev::warp_head_fits;
using dev::warp_max;
using dev::warp_sum;

constexpr int kLossMaxWarps = 16;  // c51_loss_warp: branches (warps) per block
constexpr int kLossPairMax = 8;    // c51_loss_warp with two warps a branch: branches per block

bool c51_warp(int D, int A, int Z) { return warp_head_fits(A, Z) && D <= kLossMaxWarps; }

/// One block per (b, d): the target probabilities and projected support go to shared memory,
/// then each thread owns atoms i and sums over j in order (the dense, atomic-free projection).
__global__ void c51_project_kernel(float* m, const float* target_logp, const std::int32_t* a_star,
                                   const float* rewards, const float* dones, int D, int A, int Z,
                                   float gamma_n, float v_min_f, float v_max_f, double dz) {
  dev::pdl_entry();
  extern __shared__ double shp[];
  double* p = shp;       // [Z]
  double* tz = shp + Z;  // [Z]
  const int bd = blockIdx.x, b = bd / D;
  const int act = a_star[bd];
  float* mo = m + static_cast<std::int64_t>(bd) * Z;
  if (act < 0 || act >= A) {  // an index the host could not check: make it visible, never read OOB
    for (int i = threadIdx.x; i < Z; i += blockDim.x) mo[i] = NAN;
    return;
  }
  const double v_min = v_min_f, v_max = v_max_f;
  const double discount = static_cast<double>(gamma_n) * (1.0 - static_cast<double>(dones[b]));
  const double r = rewards[b];
  const float* lp = target_logp + (static_cast<std::int64_t>(bd) * A + act) * Z;
  for (int j = threadIdx.x; j < Z; j += blockDim.x) {
    p[j] = exp(static_cast<double>(lp[j]));
    tz[j] = fmin(fmax(r + discount * (v_min + j * dz), v_min), v_max);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < Z; i += blockDim.x) {
    const double zi = v_min + i * dz;
    double acc = 0.0;
    for (int j = 0; j < Z; ++j) {
      const double w = fmin(fmax(1.0 - fabs(tz[j] - zi) / dz, 0.0), 1.0);
      acc += w * p[j];
    }
    mo[i] = static_cast<float>(acc);
  }
}

/// One block per sample, one warp per branch: per-branch cross-entropy (warp sums), the
/// gradient of every (action, atom) of the branch, then the sample's loss from the branches in
/// order. The weighted per-sample loss goes to scratch for the fixed-order mean in
/// batch_means_kernel after.
__global__ void c51_xent_kernel(C51Xent a, double* weighted) {
  dev::pdl_entry();
  extern __shared__ double xent_d[];  // [D], then with dv the taken actions' rows g [D][Z] (float)
  float* g_rows = reinterpret_cast<float*>(xent_d + a.D);
  // block = member · B + sample: member k's logp and dlogits are member 0's + k·B·D·A·Z
  const int member = blockIdx.x / a.B, b = blockIdx.x - member * a.B;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int Z = a.Z, A = a.A, D = a.D;
  const std::int64_t moff = static_cast<std::int64_t>(member) * a.B * D * A * Z;
  const float* LP = static_cast<const float*>(a.logp.p) + moff;
  const float* M = static_cast<const float*>(a.m.p);
  float* DL = static_cast<float*>(a.dlogits.p) + moff;
  const float wb = static_cast<const float*>(a.weights.p)[b];
  const double grad_scale = static_cast<double>(a.scale) * wb / (static_cast<double>(a.B) * D);
  for (int d = warp; d < D; d += nwarps) {
    const int bd = b * D + d;
    const int taken = a.actions[bd];
    const std::int64_t rows0 = static_cast<std::int64_t>(bd) * A * Z;
    // with dv: this (sample, branch)'s block of dadv, member k's at + k·B rows
    const int ldd = a.lddadv != 0 ? a.lddadv : A * Z;
    float* dadv = a.dv.p ? static_cast<float*>(a.dadv.p) +
                               (static_cast<std::int64_t>(member) * a.B * D + bd) * ldd
                         : nullptr;
    if (taken < 0 || taken >= A) {  // out of range: poison this branch instead of reading OOB
      for (int k = lane; k < A * Z; k += 32) DL[rows0 + k] = NAN;
      if (dadv) {
        for (int k = lane; k < A * Z; k += 32) dadv[k] = NAN;
        for (int q = A * Z + lane; q < ldd; q += 32) dadv[q] = 0.0f;  // the padding, as on every row
        for (int i = lane; i < Z; i += 32) g_rows[d * Z + i] = NAN;
      }
      if (lane == 0) xent_d[d] = NAN;
      continue;
    }
    const float* m = M + static_cast<std::int64_t>(bd) * Z;
    const float* lp_taken = LP + rows0 + static_cast<std::int64_t>(taken) * Z;
    double xent = 0.0, m_sum = 0.0;
    for (int i = lane; i < Z; i += 32) {
      xent -= static_cast<double>(m[i]) * static_cast<double>(lp_taken[i]);
      m_sum += static_cast<double>(m[i]);
    }
    xent = warp_sum(xent);  // also orders every lane's reads of logp before the writes below
    m_sum = warp_sum(m_sum);
    for (int act = 0; act < A; ++act) {
      const std::int64_t row = rows0 + static_cast<std::int64_t>(act) * Z;
      for (int i = lane; i < Z; i += 32) {
        if (act != taken) {
          DL[row + i] = 0.0f;
        } else {
          const double p = exp(static_cast<double>(LP[row + i]));
          const float g = static_cast<float>(grad_scale * (p * m_sum - static_cast<double>(m[i])));
          DL[row + i] = g;
          if (dadv) {  // dueling_backward's arithmetic on a row that is g at `taken`, 0 elsewhere
            g_rows[d * Z + i] = g;
            const double mean = static_cast<double>(g) / A;
            const float other = static_cast<float>(0.0 - mean), own = static_cast<float>(static_cast<double>(g) - mean);
            for (int b2 = 0; b2 < A; ++b2) dadv[b2 * Z + i] = b2 == taken ? own : other;
          }
        }
      }
    }
    if (dadv)
      for (int q = A * Z + lane; q < ldd; q += 32) dadv[q] = 0.0f;  // the padding
    if (lane == 0) xent_d[d] = xent;
  }
  __syncthreads();
  if (a.dv.p) {  // dv[b, :] = Σ_d g_d (branches in order, as dueling_backward's Σ_{d,a})
    float* dv = static_cast<float*>(a.dv.p) + (static_cast<std::int64_t>(member) * a.B + b) * a.lddv;
    for (int i = threadIdx.x; i < Z; i += blockDim.x) {
      double total = 0.0;
      for (int d = 0; d < D; ++d) total += static_cast<double>(g_rows[d * Z + i]);
      dv[i] = static_cast<float>(total);
    }
  }
  if (threadIdx.x == 0) {
    double sample = 0.0;
    for (int d = 0; d < D; ++d) sample += xent_d[d];
    sample /= D;
    if (a.loss_per_sample.p) static_cast<float*>(a.loss_per_sample.p)[blockIdx.x] = static_cast<float>(sample);
    weighted[blockIdx.x] = static_cast<double>(wb) * sample;
  }
}

/// One block: the batch means of the members' weighted per-sample losses (dev::batch_mean).
__global__ void batch_means_kernel(float* loss, const double* weighted, int B, float scale, bool accumulate,
                                       int members) {
  dev::pdl_entry();
  __shared__ double sh[32];
  dev::batch_mean(loss, weighted, B, scale, accumulate, members, sh);
}


/// The c51 loss kernel's shape: a block per sample, in it a slot of `tpb` threads per branch
/// (Z rounded up to whole warps, at most kLossMaxSlotThreads: a thread per atom) and `slots`
/// branches at a time (at most kLossMaxThreads threads); more branches take more rounds.
constexpr int kLossMaxSlotThreads = 256, kLossMaxThreads = 512;
struct LossShape {
  int tpb = 32, slots = 1;
};
__host__ __device__ inline LossShape loss_shape(int D, int Z) {
  LossShape s;
  s.tpb = (Z + 31) / 32 * 32;
  if (s.tpb > kLossMaxSlotThreads) s.tpb = kLossMaxSlotThreads;
  if (s.tpb < 32) s.tpb = 32;
  s.slots = kLossMaxThreads / s.tpb;
  if (s.slots > D) s.slots = D;
  if (s.slots < 1) s.slots = 1;
  return s;
}

/// Reduction over the threads of each slot (`W` warps each, in fixed order: lanes by butterfly,
/// then the slot's warps in turn). Every thread of the block calls it; each gets its slot's result.
template <typename R, typename Op>
__device__ __forceinline__ R slot_reduce(R v, R* red, int W, int slot, Op op) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  R r = red[slot * W];
  for (int k = 1; k < W; ++k) r = op(r, red[slot * W + k]);
  __syncthreads();  // red is reused by the next reduction
  return r;
}

/// slot_reduce of two values at once (one pair of barriers): each as slot_reduce would give it.
template <typename R, typename Op>
__device__ __forceinline__ void slot_reduce2(R& a, R& b, R* red_a, R* red_b, int W, int slot, Op op) {
  for (int o = 16; o > 0; o >>= 1) {
    a = op(a, __shfl_xor_sync(0xffffffffu, a, o));
    b = op(b, __shfl_xor_sync(0xffffffffu, b, o));
  }
  if ((threadIdx.x & 31) == 0) {
    red_a[threadIdx.x >> 5] = a;
    red_b[threadIdx.x >> 5] = b;
  }
  __syncthreads();
  R ra = red_a[slot * W], rb = red_b[slot * W];
  for (int k = 1; k < W; ++k) {
    ra = op(ra, red_a[slot * W + k]);
    rb = op(rb, red_b[slot * W + k]);
  }
  __syncthreads();  // red_a and red_b are reused by the next reduction
  a = ra;
  b = rb;
}

/// The projection weights' division by Δz: exact in double (fp32 pipelines, as the CPU); in float
/// a multiply by 1/Δz (one rounding more, far below the float tolerance, and no division subroutine).
__device__ __forceinline__ double over_dz(double x, double dz) { return x / dz; }
__device__ __forceinline__ float over_dz(float x, float dz) { return x * (1.0f / dz); }

/// The dense projection's atom at zi (as c51_project: the sum over j in order) from the target
/// probabilities p and projected support tz [Z] in shared memory. tz is non-decreasing in j, so
/// the j with a non-zero weight |tz_j − zi| < Δz form one run: find its start, sum it in order
/// (the zero terms of the dense sum change nothing).
template <typename T>
__device__ __forceinline__ T project_atom(const T* p, const T* tz, int Z, T zi, T dz) {
  int lo = 0, hi = Z;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (tz[mid] > zi - dz) hi = mid;
    else lo = mid + 1;
  }
  T acc = 0;
  for (int j = lo; j < Z && tz[j] < zi + dz; ++j)
    acc += fmin(fmax(T(1) - over_dz(fabs(tz[j] - zi), dz), T(0)), T(1)) * p[j];
  return acc;
}

/// The end of a sample's block in both c51 loss kernels, after its branches' gradient rows G
/// [D][Z] and cross-entropies xent_d [D] are in shared memory (and a barrier): dv[b,:] = Σ_d
/// g[d,:] (branches in order), the sample's loss from the branches in order, and in the last
/// block the weighted mean over the batch (fixed order; with counter null, not: a.loss is null).
/// `G` may be float or T.
template <typename GT>
__device__ __forceinline__ void c51_sample_end(const C51Loss& a, int b, const GT* G, const double* xent_d, float wb,
                                               double* weighted, unsigned* counter, double* red) {
  const int D = a.D, Z = a.Z;
  float* dv = static_cast<float*>(a.dv.p) + static_cast<std::int64_t>(b) * a.lddv;
  for (int i = threadIdx.x; i < Z; i += blockDim.x) {
    double total = 0.0;
    for (int d = 0; d < D; ++d) total += static_cast<double>(G[static_cast<std::int64_t>(d) * Z + i]);
    dv[i] = static_cast<float>(total);
  }
  if (threadIdx.x == 0) {
    double sample = 0.0;
    for (int d = 0; d < D; ++d) sample += xent_d[d];
    sample /= D;
    if (a.loss_per_sample.p) static_cast<float*>(a.loss_per_sample.p)[b] = static_cast<float>(sample);
    if (counter) weighted[b] = static_cast<double>(wb) * sample;  // (read only by the batch sum below)
  }
  if (!counter) return;  // no loss asked for (C51Loss::loss null): no batch sum
  if (!dev::last_block(counter)) return;
  double acc = 0.0;
  for (int k = threadIdx.x; k < a.B; k += blockDim.x) acc += __ldcg(weighted + k);
  const double total = dev::block_sum(acc, red);
  if (threadIdx.x == 0) static_cast<float*>(a.loss.p)[0] = static_cast<float>(total / a.B);
}

/// One block per sample, a slot of threads per branch, a thread per atom (loss_shape). Shared:
/// per branch the cross-entropy [D] (double) and the taken action's gradient row g [D][Z]; per
/// slot the target probabilities p, the projected support tz and the projection m [Z] each. The
/// last block reduces the weighted per-sample losses (scratch) in a fixed order. T: see exp_t.
template <typename T>
__global__ void c51_loss_kernel(C51Loss a, double dz_d, LossShape shape, double* weighted, unsigned* counter) {
  dev::pdl_entry();
  extern __shared__ double cl_shared[];
  __shared__ double red[32], red2[32];
  const int tpb = shape.tpb, nslots = shape.slots, W = tpb >> 5;
  const int slot = (threadIdx.x >> 5) / W, t = threadIdx.x - slot * tpb;
  const int b = blockIdx.x, D = a.D, A = a.A, Z = a.Z;
  double* xent_d = cl_shared;                                              // [D]
  T* G = reinterpret_cast<T*>(xent_d + D);                                 // [D][Z]
  T* p = G + static_cast<std::int64_t>(D) * Z + static_cast<std::int64_t>(slot) * 3 * Z;  // [Z] per slot
  T* tz = p + Z;                                                           // [Z] per slot
  T* mm = tz + Z;                                                          // [Z] per slot
  const float* TV = static_cast<const float*>(a.tv.p);
  const float* TADV = static_cast<const float*>(a.tadv.p);
  const float* LP = static_cast<const float*>(a.logp.p);
  float* M = static_cast<float*>(a.m.p);
  float* DADV = static_cast<float*>(a.dadv.p);
  const T v_min = a.v_min, v_max = a.v_max, dz = static_cast<T>(dz_d);
  const float wb = static_cast<const float*>(a.weights.p)[b];
  const T grad_scale = static_cast<T>(static_cast<double>(wb) / (static_cast<double>(a.B) * D));
  const T discount = static_cast<T>(a.gamma_n) * (T(1) - static_cast<T>(static_cast<const float*>(a.dones.p)[b]));
  const T reward = static_cast<T>(static_cast<const float*>(a.rewards.p)[b]);
  auto add = [](auto x, auto y) { return x + y; };
  auto fmx = [](float x, float y) { return fmaxf(x, y); };
  const int rounds = (D + nslots - 1) / nslots;
  for (int round = 0; round < rounds; ++round) {  // every thread runs every round (block-wide barriers)
    const int d = round * nslots + slot;
    const bool active = d < D;
    const int bd = b * D + d;
    const int star = active ? a.a_star[bd] : -1, taken = active ? a.actions[bd] : -1;
    const bool star_ok = star >= 0 && star < A, taken_ok = taken >= 0 && taken < A;
    // The online log-probabilities at the taken action (this thread's first atom), loaded now:
    // in flight while the target distribution is built.
    const float* lp = LP + (static_cast<std::int64_t>(bd) * A + (taken_ok ? taken : 0)) * Z;
    const float lp_first = taken_ok && t < Z ? lp[t] : 0.0f;
    auto lp_at = [&](int i) { return i == t ? lp_first : lp[i]; };
    // 1. the target network's log-probabilities at a*, as dueling_combine + log_softmax
    float mx = -INFINITY;
    if (star_ok) {
      const float* tadv = TADV + static_cast<std::int64_t>(bd) * ld_or(a.ldtadv, A * Z);
      const float* tv = TV + static_cast<std::int64_t>(b) * a.ldtv;
      for (int i = t; i < Z; i += tpb) {
        T s = 0;
        for (int act = 0; act < A; ++act) s += static_cast<T>(tadv[act * Z + i]);
        const T mean = s / A;
        const float x = static_cast<float>(static_cast<T>(tv[i]) + static_cast<T>(tadv[star * Z + i]) - mean);
        p[i] = x;  // the logit, for now
        mx = fmaxf(mx, x);
      }
    }
    mx = slot_reduce(mx, reinterpret_cast<float*>(red), W, slot, fmx);
    T sum = 0;
    if (star_ok)
      for (int i = t; i < Z; i += tpb) sum += exp_t(p[i] - mx);
    sum = slot_reduce(sum, reinterpret_cast<T*>(red), W, slot, add);
    if (star_ok) {
      const T lse = static_cast<T>(mx) + log_t(sum);
      for (int i = t; i < Z; i += tpb) {
        const float l = static_cast<float>(p[i] - lse);
        p[i] = exp_t(static_cast<T>(l));
        tz[i] = fmin(fmax(reward + discount * (v_min + i * dz), v_min), v_max);
      }
    }
    __syncthreads();  // the slot's p and tz are complete
    // 2. the dense projection m (as c51_project: each atom sums over j in order), and the
    // cross-entropy's sums at the taken action (as c51_xent)
    float* m = M + static_cast<std::int64_t>(bd) * Z;
    T xs = 0, m_sum = 0;
    for (int i = t; i < Z; i += tpb) {
      float mi = NAN;  // an index the host could not check: visible, never read out of bounds
      if (star_ok) mi = static_cast<float>(project_atom(p, tz, Z, v_min + i * dz, dz));
      if (active) m[i] = mi;
      mm[i] = mi;
      if (taken_ok) {
        xs -= static_cast<T>(mi) * static_cast<T>(lp_at(i));
        m_sum += static_cast<T>(mi);
      }
    }
    slot_reduce2(xs, m_sum, reinterpret_cast<T*>(red), reinterpret_cast<T*>(red2), W, slot, add);
    // 3. the gradient row of the taken action, and 4. the dueling backward of that dlogits (zero
    // off the taken action): dadv = dl − mean_a dl
    if (active) {
      float* dadv = DADV + static_cast<std::int64_t>(bd) * ld_or(a.lddadv, A * Z);
      for (int i = t; i < Z; i += tpb) {
        float g = NAN;
        if (taken_ok) g = static_cast<float>(grad_scale * (exp_t(static_cast<T>(lp_at(i))) * m_sum - mm[i]));
        G[static_cast<std::int64_t>(d) * Z + i] = g;
        const T mean = static_cast<T>(g) / A;
        const float other = static_cast<float>(T(0) - mean), own = static_cast<float>(static_cast<T>(g) - mean);
        for (int act = 0; act < A; ++act) dadv[act * Z + i] = taken_ok && act != taken ? other : own;
      }
      for (int q = A * Z + t; q < ld_or(a.lddadv, A * Z); q += tpb) dadv[q] = 0.0f;  // the padding (as dueling_backward)
      if (t == 0) xent_d[d] = taken_ok ? static_cast<double>(xs) : NAN;
    }
    __syncthreads();  // p, tz and mm are rewritten by the slot's next branch
  }
  c51_sample_end(a, b, G, xent_d, wb, weighted, counter, red);
}

/// c51_loss with a warp per (sample, branch) and a block per sample (32·D threads, D ≤
/// kLossMaxWarps). Shared: the branches' cross-entropies [D] (double), gradient rows G [D][Z]
/// (float), and per warp the target probabilities p and projected support tz [Z] each (T).
std::size_t c51_loss_warp_shared_bytes(int D, int Z, std::size_t t_size) {
  return static_cast<std::size_t>(D) * sizeof(double) + (static_cast<std::size_t>(D) * Z + 1) / 2 * sizeof(double) +
         static_cast<std::size_t>(D) * 2 * Z * t_size;
}

/// The group's combination of its warps' values (GW > 1: each warp's lane 0 puts its value in
/// slot [group][warp of the group], a barrier of the group's threads, every thread reads them in
/// order); GW 1: the value itself (and no shared memory).
template <int GW, typename R, typename Op>
__device__ __forceinline__ R group_combine(R v, int grp, int wg, Op op) {
  if constexpr (GW == 1) {
    return v;
  } else {
    __shared__ R slots[kLossPairMax][GW];
    if ((threadIdx.x & 31) == 0) slots[grp][wg] = v;
    asm volatile("bar.sync %0, %1;" ::"r"(1 + grp), "r"(32 * GW) : "memory");
    R r = slots[grp][0];
#pragma unroll
    for (int w = 1; w < GW; ++w) r = op(r, slots[grp][w]);
    asm volatile("bar.sync %0, %1;" ::"r"(1 + grp), "r"(32 * GW) : "memory");  // the slots are reused
    return r;
  }
}

/// c51_loss with GW warps per (sample, branch) and a block per sample (32·GW·D threads; GW 2 where
/// D ≤ kLossPairMax: two, each holding one of the two atoms a lane of one warp holds; GW 1 for
/// larger D, up to kLossMaxWarps: a warp per branch), their sums added warp by warp (GW 2: not
/// the bits of GW 1). Shared: the branches' cross-entropies [D] (double),
/// gradient rows G [D][Z] (float), and per branch the target probabilities p and projected
/// support tz [Z] each (T).
template <typename T, int GW>
__global__ void __launch_bounds__(32 * kLossMaxWarps)
    c51_loss_warp_kernel(C51Loss a, double dz_d, double* weighted, unsigned* counter) {
  static_assert(kWarpAtoms % GW == 0, "whole atoms per lane");
  constexpr int KA = kWarpAtoms / GW;  // atoms a lane holds: i = lane + 32·(GW·k + wg)
  dev::pdl_entry();
  extern __shared__ double clw_shared[];
  __shared__ double red[32];
  const int lane = threadIdx.x & 31, d = (threadIdx.x >> 5) / GW, wg = (threadIdx.x >> 5) % GW;
  const int i0 = lane + 32 * wg;  // the lane's first atom
  constexpr int istep = 32 * GW;
  const int b = blockIdx.x, D = a.D, A = a.A, Z = a.Z;
  double* xent_d = clw_shared;                           // [D]
  float* G = reinterpret_cast<float*>(xent_d + D);       // [D][Z]
  T* p = reinterpret_cast<T*>(xent_d + D + (static_cast<std::int64_t>(D) * Z + 1) / 2) + 2 * d * Z;  // [Z]
  T* tz = p + Z;                                         // [Z]
  const int bd = b * D + d;
  const int star = a.a_star[bd], taken = a.actions[bd];
  const bool star_ok = star >= 0 && star < A, taken_ok = taken >= 0 && taken < A;
  const float wb = static_cast<const float*>(a.weights.p)[b];
  const T v_min = a.v_min, v_max = a.v_max, dz = static_cast<T>(dz_d);
  const T grad_scale = static_cast<T>(static_cast<double>(wb) / (static_cast<double>(a.B) * D));
  const T discount = static_cast<T>(a.gamma_n) * (T(1) - static_cast<T>(static_cast<const float*>(a.dones.p)[b]));
  const T reward = static_cast<T>(static_cast<const float*>(a.rewards.p)[b]);
  const auto add = [](T x, T y) { return x + y; };
  // every load of the (sample, branch) at once, none waiting for a* or the taken action: the
  // target's value and advantages, and the online log-probabilities of every action (the taken
  // one selected after)
  const float* tadv = static_cast<const float*>(a.tadv.p) + static_cast<std::int64_t>(bd) * ld_or(a.ldtadv, A * Z);
  const float* tv = static_cast<const float*>(a.tv.p) + static_cast<std::int64_t>(b) * a.ldtv;
  const float* lp = static_cast<const float*>(a.logp.p) + static_cast<std::int64_t>(bd) * A * Z;
  float tx[kWarpMaxA][KA], tvv[KA], lpv[KA], lpa[kWarpMaxA][KA];
#pragma unroll
  for (int k = 0; k < KA; ++k) {
    const int i = i0 + istep * k;
    const bool in = i < Z;
    tvv[k] = in ? tv[i] : 0.0f;
#pragma unroll
    for (int act = 0; act < kWarpMaxA; ++act) {
      tx[act][k] = in && act < A ? tadv[act * Z + i] : 0.0f;
      lpa[act][k] = in && act < A ? lp[act * Z + i] : 0.0f;
    }
  }
#pragma unroll
  for (int k = 0; k < KA; ++k) {
    lpv[k] = 0.0f;
#pragma unroll
    for (int act = 0; act < kWarpMaxA; ++act)
      if (act == taken) lpv[k] = lpa[act][k];
  }
  // 1. the target network's log-probabilities at a*, as dueling_combine + log_softmax
  {
    float logit[KA];
    const float mx = group_combine<GW>(warp_max(action_logits<T, KA>(tx, tvv, A, star, Z, star_ok, logit, i0, istep)), d,
                                       wg, [](float x, float y) { return fmaxf(x, y); });
    T sum = 0;
    if (star_ok) {
#pragma unroll
      for (int k = 0; k < KA; ++k)
        if (i0 + istep * k < Z) sum += exp_t(static_cast<T>(logit[k]) - mx);
    }
    sum = group_combine<GW>(warp_sum(sum), d, wg, add);
    if (star_ok) {
      const T lse = static_cast<T>(mx) + log_t(sum);
#pragma unroll
      for (int k = 0; k < KA; ++k) {
        const int i = i0 + istep * k;
        if (i >= Z) continue;
        const float l = static_cast<float>(static_cast<T>(logit[k]) - lse);
        p[i] = exp_t(static_cast<T>(l));
        tz[i] = fmin(fmax(reward + discount * (v_min + i * dz), v_min), v_max);
      }
    }
    // the group's p and tz are complete
    if constexpr (GW == 1) __syncwarp();
    else asm volatile("bar.sync %0, %1;" ::"r"(1 + d), "r"(32 * GW) : "memory");
  }
  // 2. the dense projection m (as c51_project: each atom sums over j in order) and the
  // cross-entropy's sums at the taken action (as c51_xent)
  float* m = static_cast<float*>(a.m.p) + static_cast<std::int64_t>(bd) * Z;
  float mm[KA];
  T xs = 0, m_sum = 0;
#pragma unroll
  for (int k = 0; k < KA; ++k) {
    const int i = i0 + istep * k;
    mm[k] = NAN;  // an index the host could not check: visible, never read out of bounds
    if (i >= Z) continue;
    if (star_ok) mm[k] = static_cast<float>(project_atom(p, tz, Z, v_min + i * dz, dz));
    m[i] = mm[k];
    if (taken_ok) {
      xs -= static_cast<T>(mm[k]) * static_cast<T>(lpv[k]);
      m_sum += static_cast<T>(mm[k]);
    }
  }
  xs = group_combine<GW>(warp_sum(xs), d, wg, add);
  m_sum = group_combine<GW>(warp_sum(m_sum), d, wg, add);
  // 3. the gradient row of the taken action, and 4. the dueling backward of that dlogits (zero
  // off the taken action): dadv = dl − mean_a dl
  float* dadv = static_cast<float*>(a.dadv.p) + static_cast<std::int64_t>(bd) * ld_or(a.lddadv, A * Z);
#pragma unroll
  for (int k = 0; k < KA; ++k) {
    const int i = i0 + istep * k;
    if (i >= Z) continue;
    float g = NAN;
    if (taken_ok) g = static_cast<float>(grad_scale * (exp_t(static_cast<T>(lpv[k])) * m_sum - static_cast<T>(mm[k])));
    G[static_cast<std::int64_t>(d) * Z + i] = g;
    const T mean = static_cast<T>(g) / A;
    const float other = static_cast<float>(T(0) - mean), own = static_cast<float>(static_cast<T>(g) - mean);
    for (int act = 0; act < A; ++act) dadv[act * Z + i] = taken_ok && act != taken ? other : own;
  }
  for (int q = A * Z + i0; q < ld_or(a.lddadv, A * Z); q += istep) dadv[q] = 0.0f;  // the padding (as dueling_backward)
  if (i0 == 0) xent_d[d] = taken_ok ? static_cast<double>(xs) : NAN;
  __syncthreads();
  c51_sample_end(a, b, G, xent_d, wb, weighted, counter, red);
}

std::size_t c51_loss_shared_bytes(int D, int A, int Z) {
  // sized for double arithmetic (float needs less)
  if (c51_warp(D, A, Z)) return c51_loss_warp_shared_bytes(D, Z, sizeof(double));
  const LossShape sh = loss_shape(D, Z);
  return (static_cast<std::size_t>(D) + static_cast<std::size_t>(D) * Z + static_cast<std::size_t>(sh.slots) * 3 * Z) *
         sizeof(double);
}

}  // namespace

void c51_project_cuda(Backend& be, const DeviceContext& ctx, const C51Project& a) noexcept {
  const int threads = std::min(256, (a.Z + 31) / 32 * 32);
  const std::size_t shmem = 2 * static_cast<std::size_t>(a.Z) * sizeof(double);
  if (shmem > 48 * 1024) return be.fail("c51_project", "Z too large for shared memory (over 3072 atoms)");
  launched(be, "c51_project",
           launch(ctx, c51_project_kernel, a.B * a.D, threads, shmem, a.m.as<float>(), a.target_logp.as<const float>(),
                  a.a_star, a.rewards.as<const float>(), a.dones.as<const float>(), a.D, a.A, a.Z, a.gamma_n, a.v_min,
                  a.v_max, support_step(a.v_min, a.v_max, a.Z)));
}

void c51_xent_cuda(Backend& be, const DeviceContext& ctx, const C51Xent& a) noexcept {
  constexpr const char* op = "c51_xent";
  if (a.dv && static_cast<std::size_t>(a.D) * (sizeof(double) + a.Z * sizeof(float)) > 48 * 1024)
    return be.fail(op, "D·Z too large for the fused dueling backward");
  auto* weighted = static_cast<double*>(a.sums);
  const int warps = std::min(a.D, 8);
  const std::size_t shared = static_cast<std::size_t>(a.D) * sizeof(double) +
                             (a.dv ? static_cast<std::size_t>(a.D) * a.Z * sizeof(float) : 0);
  if (!launched(be, op, launch(ctx, c51_xent_kernel, a.B * a.members, 32 * warps, shared, a, weighted))) return;
  if (a.loss)
    launched(be, op, launch(ctx, batch_means_kernel, 1, 256, 0, a.loss.as<float>(), static_cast<const double*>(weighted),
                            a.B, a.scale, a.accumulate, a.members));
}

void c51_loss_cuda(Backend& be, const DeviceContext& ctx, const C51Loss& a) noexcept {
  constexpr const char* op = "c51_loss";
  if (c51_loss_shared_bytes(a.D, a.A, a.Z) > 48 * 1024) return be.fail(op, "D·Z too large for shared memory");
  const bool double_math = ctx.precision == 0;
  auto* w = static_cast<double*>(a.sums);
  // no loss: the blocks end after their samples, with no last block summing the batch
  unsigned* counter = a.loss ? reinterpret_cast<unsigned*>(a.counter) : nullptr;
  cudaError_t e = cudaSuccess;
  if (c51_warp(a.D, a.A, a.Z)) {
    const double dz_w = support_step(a.v_min, a.v_max, a.Z);
    const std::size_t shmem = c51_loss_warp_shared_bytes(a.D, a.Z, double_math ? sizeof(double) : sizeof(float));
    // two warps a (sample, branch) where the block has room (D ≤ kLossPairMax), else one
    if (a.D <= kLossPairMax) {
      e = double_math ? launch(ctx, c51_loss_warp_kernel<double, 2>, a.B, 64 * a.D, shmem, a, dz_w, w, counter)
                      : launch(ctx, c51_loss_warp_kernel<float, 2>, a.B, 64 * a.D, shmem, a, dz_w, w, counter);
    } else {
      e = double_math ? launch(ctx, c51_loss_warp_kernel<double, 1>, a.B, 32 * a.D, shmem, a, dz_w, w, counter)
                      : launch(ctx, c51_loss_warp_kernel<float, 1>, a.B, 32 * a.D, shmem, a, dz_w, w, counter);
    }
  } else {
    const LossShape sh = loss_shape(a.D, a.Z);
    const double dz = support_step(a.v_min, a.v_max, a.Z);
    const std::size_t shmem = c51_loss_shared_bytes(a.D, a.A, a.Z);
    e = double_math ? launch(ctx, c51_loss_kernel<double>, a.B, sh.tpb * sh.slots, shmem, a, dz, sh, w, counter)
                    : launch(ctx, c51_loss_kernel<float>, a.B, sh.tpb * sh.slots, shmem, a, dz, sh, w, counter);
  }
  launched(be, op, e);
}

}  // namespace dqn
