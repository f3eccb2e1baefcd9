/** @file head_kernels.cu
 *  @brief The fused head kernels: the dueling distribution (combine, log-softmax, expected Q and
 *  the double-DQN argmax in one pass) and the C51 loss from the target head's outputs to the
 *  dueling gradients. Each reproduces, operation for operation, the unfused kernels it replaces
 *  (same roundings, same fixed summation orders), so it matches the CPU twin as closely as they did.
 *  The fused head forward and backward inputs (tf32 mma.sync, used in tf32 only) and the cluster
 *  head forward are the exception: tf32 operands and float log-softmax, so they match the CPU
 *  within tf32 tolerances.
 */
#include <cooperative_groups.h>

#include <algorithm>
#include <cmath>

#include "cuda_kernels.cuh"
#include "device_util.cuh"
#include "head_kernels.cuh"

namespace dqn::cuda {
namespace {

using dev::launch;
using dev::warp_max;
using dev::warp_sum;

double support_step(float v_min, float v_max, int Z) {
  return Z > 1 ? (static_cast<double>(v_max) - static_cast<double>(v_min)) / (Z - 1) : 0.0;
}

constexpr int kDistMaxWarps = 16;  // warps per block of the distribution kernel (one per action)

/// The distribution kernels' arithmetic type: double (fp32 pipelines: as the CPU twin, which
/// computes these in double) or float (tf32 and bf16 pipelines, whose GEMM operands already round
/// at 5e-4 and 4e-3 relative: float's 6e-8 is lost beneath them, and float exp/log cost a
/// fraction of double's on the GPU).
__device__ __forceinline__ double exp_t(double x) { return exp(x); }
__device__ __forceinline__ float exp_t(float x) { return expf(x); }
__device__ __forceinline__ double log_t(double x) { return log(x); }
__device__ __forceinline__ float log_t(float x) { return logf(x); }
__device__ __forceinline__ float warp_sum_t(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum_t(double v) { return warp_sum(v); }

/// One block per (row, branch), one warp per action (actions beyond the warps loop). Shared:
/// the mean advantage of each atom [Z] and the actions' Q [A]. T: see exp_t.
template <typename T>
__global__ void dueling_dist_kernel(DuelingDist a, double dz_d) {
  dev::pdl_entry();
  extern __shared__ double dd_shared[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int D = a.D, A = a.A, Z = a.Z;
  T* mean = reinterpret_cast<T*>(dd_shared);         // [Z]
  float* qs = reinterpret_cast<float*>(dd_shared + Z);  // [A]
  const float* V = static_cast<const float*>(a.v.p);
  const float* ADV = static_cast<const float*>(a.adv.p);
  float* LP = static_cast<float*>(a.logp.p);
  float* Q = static_cast<float*>(a.q.p);
  const T v_min = a.v_min, dz = static_cast<T>(dz_d);
  const std::int64_t rd = blockIdx.x;
  const std::int64_t r = rd / D;
  const float* adv = ADV + rd * ld_or(a.ldadv, A * Z);
  const float* v = V + r * a.ldv;
  for (int i = threadIdx.x; i < Z; i += blockDim.x) {
    T s = 0;
    for (int act = 0; act < A; ++act) s += static_cast<T>(adv[act * Z + i]);
    mean[i] = s / A;
  }
  __syncthreads();
  for (int act = warp; act < A; act += nwarps) {
    const float* x = adv + act * Z;
    float* lp = LP + (rd * A + act) * Z;
    // logits rounded to float exactly as dueling_combine stores them
    float mx = -INFINITY;
    for (int i = lane; i < Z; i += 32)
      mx = fmaxf(mx, static_cast<float>(static_cast<T>(v[i]) + static_cast<T>(x[i]) - mean[i]));
    mx = warp_max(mx);
    T sum = 0;
    for (int i = lane; i < Z; i += 32) {
      const float xi = static_cast<float>(static_cast<T>(v[i]) + static_cast<T>(x[i]) - mean[i]);
      sum += exp_t(static_cast<T>(xi) - mx);
    }
    sum = warp_sum_t(sum);
    const T lse = static_cast<T>(mx) + log_t(sum);
    T qa = 0;
    for (int i = lane; i < Z; i += 32) {
      const float xi = static_cast<float>(static_cast<T>(v[i]) + static_cast<T>(x[i]) - mean[i]);
      const float l = static_cast<float>(static_cast<T>(xi) - lse);
      lp[i] = l;
      if (Q) qa += (v_min + i * dz) * exp_t(static_cast<T>(l));
    }
    if (Q) {
      qa = warp_sum_t(qa);
      if (lane == 0) {
        const float qf = static_cast<float>(qa);
        Q[rd * A + act] = qf;
        qs[act] = qf;
      }
    }
  }
  if (!a.a_star || r < a.star_from) return;
  __syncthreads();
  if (threadIdx.x == 0) {
    int best = 0;
    for (int act = 1; act < A; ++act)
      if (qs[act] > qs[best]) best = act;  // strict: ties keep the lowest index
    a.a_star[(r - a.star_from) * D + (rd - r * D)] = best;
  }
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
/// block the weighted mean over the batch (fixed order). `G` may be float or T.
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
    weighted[b] = static_cast<double>(wb) * sample;
  }
  if (!dev::last_block(counter)) return;
  double acc = 0.0;
  for (int k = threadIdx.x; k < a.B; k += blockDim.x) acc += __ldcg(weighted + k);
  const double total = dev::block_sum(acc, red);
  if (threadIdx.x == 0) static_cast<float*>(a.loss.p)[0] = static_cast<float>(total / a.B);
}

/// One block per sample, a slot of threads per branch, a thread per atom (loss_shape); PART as
/// c51_loss_warp_kernel's. Shared:
/// per branch the cross-entropy [D] (double) and the taken action's gradient row g [D][Z]; per
/// slot the target probabilities p, the projected support tz and the projection m [Z] each. The
/// last block reduces the weighted per-sample losses (scratch) in a fixed order. T: see exp_t.
template <typename T, int PART = 0>
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
  const float wb = PART != 1 ? static_cast<const float*>(a.weights.p)[b] : 0.0f;
  const T grad_scale = static_cast<T>(static_cast<double>(wb) / (static_cast<double>(a.B) * D));
  const T discount =
      PART != 2 ? static_cast<T>(a.gamma_n) * (T(1) - static_cast<T>(static_cast<const float*>(a.dones.p)[b])) : T(0);
  const T reward = PART != 2 ? static_cast<T>(static_cast<const float*>(a.rewards.p)[b]) : T(0);
  auto add = [](auto x, auto y) { return x + y; };
  auto fmx = [](float x, float y) { return fmaxf(x, y); };
  const int rounds = (D + nslots - 1) / nslots;
  for (int round = 0; round < rounds; ++round) {  // every thread runs every round (block-wide barriers)
    const int d = round * nslots + slot;
    const bool active = d < D;
    const int bd = b * D + d;
    const int star = active && PART != 2 ? a.a_star[bd] : -1, taken = active && PART != 1 ? a.actions[bd] : -1;
    const bool star_ok = star >= 0 && star < A, taken_ok = taken >= 0 && taken < A;
    // The online log-probabilities at the taken action (this thread's first atom), loaded now:
    // in flight while the target distribution is built.
    const float* lp = LP + (static_cast<std::int64_t>(bd) * A + (taken_ok ? taken : 0)) * Z;
    const float lp_first = taken_ok && t < Z ? lp[t] : 0.0f;
    auto lp_at = [&](int i) { return i == t ? lp_first : lp[i]; };
    // 1. the target network's log-probabilities at a*, as dueling_combine + log_softmax (not in
    // part 2, which reads the projection part 1 wrote)
    if constexpr (PART != 2) {
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
    }
    // 2. the dense projection m (as c51_project: each atom sums over j in order), and the
    // cross-entropy's sums at the taken action (as c51_xent)
    float* m = M + static_cast<std::int64_t>(bd) * Z;
    T xs = 0, m_sum = 0;
    for (int i = t; i < Z; i += tpb) {
      float mi = NAN;  // an index the host could not check: visible, never read out of bounds
      if constexpr (PART == 2) {
        if (active) mi = m[i];
      } else {
        if (star_ok) mi = static_cast<float>(project_atom(p, tz, Z, v_min + i * dz, dz));
        if (active) m[i] = mi;
      }
      mm[i] = mi;
      if (taken_ok) {
        xs -= static_cast<T>(mi) * static_cast<T>(lp_at(i));
        m_sum += static_cast<T>(mi);
      }
    }
    if constexpr (PART == 1) {
      __syncthreads();  // p and tz are rewritten by the slot's next branch
      continue;
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
  if constexpr (PART == 1) return;
  c51_sample_end(a, b, G, xent_d, wb, weighted, counter, red);
}

// --- warp-per-(row, branch) variants --------------------------------------------------------
// The same arithmetic as dueling_dist_kernel and c51_loss_kernel, with one warp per (row, branch)
// holding all its atoms and actions in registers: every load of a (row, branch) is issued at once
// and the reductions are warp shuffles, with no block barrier until the branches of a sample meet
// (c51: dv and the sample's loss). Used while Z ≤ 32·kWarpAtoms and A ≤ kWarpMaxA (and, for c51,
// D ≤ kLossMaxWarps warps a block); beyond, the block kernels above.
constexpr int kWarpAtoms = 2;          // atoms per lane
constexpr int kWarpMaxA = 8;           // actions held in registers
constexpr int kDistWarpsPerBlock = 4;  // dueling_dist_warp: (row, branch) pairs per block

__host__ __device__ inline bool warp_head_fits(int A, int Z) { return Z <= 32 * kWarpAtoms && A <= kWarpMaxA; }

/// Whether the warp variants run where they fit: on unless DQN_WARP_HEAD=0 (read once).
bool warp_head_kernels() {
  static const bool on = env_on("DQN_WARP_HEAD");
  return on;
}
constexpr int kLossMaxWarps = 16;  // c51_loss_warp: branches (warps) per block
constexpr int kLossPairMax = 8;    // c51_loss_warp with two warps a branch: branches per block
bool c51_warp(int D, int A, int Z) { return warp_head_fits(A, Z) && D <= kLossMaxWarps && warp_head_kernels(); }

/// Butterfly over the lanes for the first n of K values at once (their shuffles interleaved):
/// each value as warp_sum_t / warp_max would give it.
template <typename R, int K, typename Op>
__device__ __forceinline__ void warp_reduce_n(R (&v)[K], int n, Op op) {
  for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (k < n) v[k] = op(v[k], __shfl_xor_sync(0xffffffffu, v[k], o));
  }
}

/// A (row, branch)'s v [Z] and advantages [A·Z] into a warp's registers as dist_warp holds them:
/// lane l holds atoms l, l + 32 (zeros past Z and past A); every load issued at once.
__device__ __forceinline__ void load_dist_warp(const float* v, const float* adv, int A, int Z,
                                               float (&vv)[kWarpAtoms], float (&x)[kWarpMaxA][kWarpAtoms]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int k = 0; k < kWarpAtoms; ++k) {
    const int i = lane + 32 * k;
    vv[k] = i < Z ? v[i] : 0.0f;
#pragma unroll
    for (int act = 0; act < kWarpMaxA; ++act) x[act][k] = act < A && i < Z ? adv[act * Z + i] : 0.0f;
  }
}

/// One action's dueling logits of a (row, branch) whose values a warp holds as dist_warp does (x
/// [action][k], v [k]: lane l holds atoms l, l + 32): logit[k] = v + x[act] − the mean over the A
/// actions, rounded to float as dueling_combine stores them (0 past Z, where x and v are 0).
/// Returns the lane's max over its atoms below Z when `on` (else −∞), for the warp's reduction.
template <typename T, int KA = kWarpAtoms>
__device__ __forceinline__ float action_logits(const float (&x)[kWarpMaxA][KA], const float (&v)[KA], int A, int act,
                                               int Z, bool on, float (&logit)[KA], int i0 = -1, int istep = 32) {
  const int lane = i0 >= 0 ? i0 : static_cast<int>(threadIdx.x & 31);  // atom k is lane + istep·k
  float mx = -INFINITY;
#pragma unroll
  for (int k = 0; k < KA; ++k) {
    T s = 0;
    float own = 0.0f;
#pragma unroll
    for (int a = 0; a < kWarpMaxA; ++a) {
      if (a < A) s += static_cast<T>(x[a][k]);
      if (a == act) own = x[a][k];
    }
    const T mean = s / A;
    logit[k] = static_cast<float>(static_cast<T>(v[k]) + static_cast<T>(own) - mean);
    if (on && lane + istep * k < Z) mx = fmaxf(mx, logit[k]);
  }
  return mx;
}

/// The distribution of one (row, branch) by one warp: v [Z] and the branch's advantages adv
/// [A·Z] (global or shared memory) → the log-probabilities lp [A·Z], and where Q is not null the
/// expected values Q [A] and, where star is not null, the argmax into *star (ties: the lowest
/// index). Lane l holds atoms l, l + 32, … of every action.
template <typename T>
__device__ __forceinline__ void dist_warp(const float* v, const float* adv, int A, int Z, T v_min, T dz, float* lp,
                                          float* Q, std::int32_t* star) {
  const int lane = threadIdx.x & 31;
  float vv[kWarpAtoms], x[kWarpMaxA][kWarpAtoms];
  load_dist_warp(v, adv, A, Z, vv, x);
  // the mean advantage of each atom, then the logits rounded to float as dueling_combine stores them
  float mx[kWarpMaxA];
#pragma unroll
  for (int act = 0; act < kWarpMaxA; ++act) mx[act] = -INFINITY;
#pragma unroll
  for (int k = 0; k < kWarpAtoms; ++k) {
    T s = 0;
#pragma unroll
    for (int act = 0; act < kWarpMaxA; ++act)
      if (act < A) s += static_cast<T>(x[act][k]);
    const T mean = s / A;
    if (lane + 32 * k >= Z) continue;
#pragma unroll
    for (int act = 0; act < kWarpMaxA; ++act) {
      if (act >= A) break;  // the slots past A hold nothing: no work for them
      x[act][k] = static_cast<float>(static_cast<T>(vv[k]) + static_cast<T>(x[act][k]) - mean);
      mx[act] = fmaxf(mx[act], x[act][k]);
    }
  }
  warp_reduce_n(mx, A, [](float p, float q) { return fmaxf(p, q); });
  T sum[kWarpMaxA];
#pragma unroll
  for (int act = 0; act < kWarpMaxA; ++act) {
    sum[act] = 0;
    if (act >= A) continue;
#pragma unroll
    for (int k = 0; k < kWarpAtoms; ++k)
      if (lane + 32 * k < Z) sum[act] += exp_t(static_cast<T>(x[act][k]) - mx[act]);
  }
  warp_reduce_n(sum, A, [](T p, T q) { return p + q; });
  T qa[kWarpMaxA];
#pragma unroll
  for (int act = 0; act < kWarpMaxA; ++act) {
    qa[act] = 0;
    if (act >= A) continue;
    const T lse = static_cast<T>(mx[act]) + log_t(sum[act]);
#pragma unroll
    for (int k = 0; k < kWarpAtoms; ++k) {
      const int i = lane + 32 * k;
      if (i >= Z) continue;
      const float l = static_cast<float>(static_cast<T>(x[act][k]) - lse);
      lp[act * Z + i] = l;
      if (Q) qa[act] += (v_min + i * dz) * exp_t(static_cast<T>(l));
    }
  }
  if (!Q) return;
  warp_reduce_n(qa, A, [](T p, T q) { return p + q; });
  int best = 0;
  float qbest = static_cast<float>(qa[0]);
#pragma unroll
  for (int act = 0; act < kWarpMaxA; ++act) {
    if (act >= A) continue;
    const float qf = static_cast<float>(qa[act]);
    if (lane == act) Q[act] = qf;
    if (qf > qbest) {  // strict: ties keep the lowest index
      qbest = qf;
      best = act;
    }
  }
  if (star && lane == 0) *star = best;
}

/// dueling_dist with a warp per (row, branch) (dist_warp).
template <typename T>
__global__ void __launch_bounds__(32 * kDistWarpsPerBlock) dueling_dist_warp_kernel(DuelingDist a, double dz_d) {
  dev::pdl_entry();
  const int D = a.D, A = a.A, Z = a.Z;
  const std::int64_t rd = static_cast<std::int64_t>(blockIdx.x) * kDistWarpsPerBlock + (threadIdx.x >> 5);
  if (rd >= static_cast<std::int64_t>(a.rows) * D) return;
  const std::int64_t r = rd / D;
  const float* adv = static_cast<const float*>(a.adv.p) + rd * ld_or(a.ldadv, A * Z);
  const float* v = static_cast<const float*>(a.v.p) + r * a.ldv;
  float* Q = a.q.p ? static_cast<float*>(a.q.p) + rd * A : nullptr;
  std::int32_t* star = Q && a.a_star && r >= a.star_from ? a.a_star + (r - a.star_from) * D + (rd - r * D) : nullptr;
  dist_warp<T>(v, adv, A, Z, static_cast<T>(a.v_min), static_cast<T>(dz_d), static_cast<float*>(a.logp.p) + rd * A * Z,
               Q, star);
}

/// dueling_dist with a warp per (row, branch, action) and a block per (row, branch) (32·A threads,
/// DQN_WARP_HEAD=action): each warp loads its row's v and every action's advantages (the mean
/// needs them all), then computes its own action's log-probabilities and expected value as
/// dist_warp does each action, in the same order (the same bits); the warps meet once, for the
/// argmax. A fifth of dist_warp's instruction chain per warp at A = 5, and five times its warps.
template <typename T>
__global__ void __launch_bounds__(32 * kWarpMaxA) dueling_dist_action_kernel(DuelingDist a, double dz_d) {
  dev::pdl_entry();
  __shared__ float qs[kWarpMaxA];
  const int lane = threadIdx.x & 31, me = threadIdx.x >> 5;
  const int D = a.D, A = a.A, Z = a.Z;
  const std::int64_t rd = blockIdx.x, r = rd / D;
  const float* adv = static_cast<const float*>(a.adv.p) + rd * ld_or(a.ldadv, A * Z);
  const float* v = static_cast<const float*>(a.v.p) + r * a.ldv;
  float* lp = static_cast<float*>(a.logp.p) + (rd * A + me) * Z;
  float* Q = a.q.p ? static_cast<float*>(a.q.p) + rd * A : nullptr;
  const T v_min = static_cast<T>(a.v_min), dz = static_cast<T>(dz_d);
  float vv[kWarpAtoms], x[kWarpMaxA][kWarpAtoms];
  load_dist_warp(v, adv, A, Z, vv, x);
  // the mean advantage of each atom, then this action's logits rounded to float (as dist_warp)
  float lg[kWarpAtoms];
  const float mx = warp_max(action_logits<T>(x, vv, A, me, Z, true, lg));
  T sum = 0;
#pragma unroll
  for (int k = 0; k < kWarpAtoms; ++k)
    if (lane + 32 * k < Z) sum += exp_t(static_cast<T>(lg[k]) - mx);
  sum = warp_sum_t(sum);
  const T lse = static_cast<T>(mx) + log_t(sum);
  T qa = 0;
#pragma unroll
  for (int k = 0; k < kWarpAtoms; ++k) {
    const int i = lane + 32 * k;
    if (i >= Z) continue;
    const float l = static_cast<float>(static_cast<T>(lg[k]) - lse);
    lp[i] = l;
    if (Q) qa += (v_min + i * dz) * exp_t(static_cast<T>(l));
  }
  if (!Q) return;
  qa = warp_sum_t(qa);
  if (lane == 0) {
    Q[me] = static_cast<float>(qa);
    qs[me] = static_cast<float>(qa);
  }
  if (!a.a_star || r < a.star_from) return;  // the same in every warp of the block
  __syncthreads();
  if (threadIdx.x == 0) {
    int best = 0;
    float qbest = qs[0];
    for (int act = 1; act < A; ++act)
      if (qs[act] > qbest) {  // strict: ties keep the lowest index
        qbest = qs[act];
        best = act;
      }
    a.a_star[(r - a.star_from) * D + (rd - r * D)] = best;
  }
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

/// c51_loss with GW warps per (sample, branch) and a block per sample (32·GW·D threads; GW 1: a
/// warp per branch, D ≤ kLossMaxWarps; GW 2 (DQN_LOSS_WARPS=2): two, each holding one of the two
/// atoms a lane of one warp holds, D ≤ kLossPairMax), their sums added warp by warp (GW 2: not
/// the bits of GW 1). PART (C51Loss::part): 0 the whole op, 1 the projection m alone, 2 the rest
/// from m (the same bits as 0 together). Shared: the branches' cross-entropies [D] (double),
/// gradient rows G [D][Z] (float), and per branch the target probabilities p and projected
/// support tz [Z] each (T).
template <typename T, int GW, int PART = 0>
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
  const int star = PART != 2 ? a.a_star[bd] : 0, taken = PART != 1 ? a.actions[bd] : 0;
  const bool star_ok = star >= 0 && star < A, taken_ok = taken >= 0 && taken < A;
  const float wb = PART != 1 ? static_cast<const float*>(a.weights.p)[b] : 0.0f;
  const T v_min = a.v_min, v_max = a.v_max, dz = static_cast<T>(dz_d);
  const T grad_scale = static_cast<T>(static_cast<double>(wb) / (static_cast<double>(a.B) * D));
  const T discount =
      PART != 2 ? static_cast<T>(a.gamma_n) * (T(1) - static_cast<T>(static_cast<const float*>(a.dones.p)[b])) : T(0);
  const T reward = PART != 2 ? static_cast<T>(static_cast<const float*>(a.rewards.p)[b]) : T(0);
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
    tvv[k] = PART != 2 && in ? tv[i] : 0.0f;
#pragma unroll
    for (int act = 0; act < kWarpMaxA; ++act) {
      tx[act][k] = PART != 2 && in && act < A ? tadv[act * Z + i] : 0.0f;
      lpa[act][k] = PART != 1 && in && act < A ? lp[act * Z + i] : 0.0f;
    }
  }
#pragma unroll
  for (int k = 0; k < KA; ++k) {
    lpv[k] = 0.0f;
#pragma unroll
    for (int act = 0; act < kWarpMaxA; ++act)
      if (act == taken) lpv[k] = lpa[act][k];
  }
  // 1. the target network's log-probabilities at a*, as dueling_combine + log_softmax (not in
  // part 2, which reads the projection part 1 wrote)
  if constexpr (PART != 2) {
  float logit[KA];
  const float mx = group_combine<GW>(warp_max(action_logits<T, KA>(tx, tvv, A, star, Z, star_ok, logit, i0, istep)), d,
                                     wg, [](float x, float y) { return fmaxf(x, y); });
  T sum = 0;
  if (star_ok) {
#pragma unroll
    for (int k = 0; k < KA; ++k)
      if (i0 + istep * k < Z) sum += exp_t(static_cast<T>(logit[k]) - mx);
  }
  sum = group_combine<GW>(warp_sum_t(sum), d, wg, add);
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
    if constexpr (PART == 2) {
      mm[k] = m[i];
    } else {
      if (star_ok) mm[k] = static_cast<float>(project_atom(p, tz, Z, v_min + i * dz, dz));
      m[i] = mm[k];
    }
    if (PART != 1 && taken_ok) {
      xs -= static_cast<T>(mm[k]) * static_cast<T>(lpv[k]);
      m_sum += static_cast<T>(mm[k]);
    }
  }
  if constexpr (PART == 1) return;
  xs = group_combine<GW>(warp_sum_t(xs), d, wg, add);
  m_sum = group_combine<GW>(warp_sum_t(m_sum), d, wg, add);
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

constexpr int kColTile = 32, kRowThreads = 32, kRowUnroll = 4;

/// Grid (column tiles, heads). 32 row-threads each mask and sum a fixed stripe of rows of their
/// column (loads batched kRowUnroll at a time: dy and y never alias), then one thread adds the
/// stripes in order.
__global__ void __launch_bounds__(kColTile * kRowThreads)
    relu_bias_grad_kernel(float* __restrict__ dy, const float* __restrict__ y0, float* __restrict__ db, int rows,
                          int cols, int ld, std::int64_t stride_dy, std::int64_t stride_y, std::int64_t stride_db) {
  dev::pdl_entry();
  __shared__ double part[kRowThreads][kColTile + 1];
  const int c = blockIdx.x * kColTile + threadIdx.x, h = blockIdx.y;
  float* __restrict__ d = dy + h * stride_dy;
  const float* __restrict__ y = y0 ? y0 + h * stride_y : nullptr;
  double acc = 0.0;
  if (c < cols) {
    for (int r0 = threadIdx.y; r0 < rows; r0 += kRowThreads * kRowUnroll) {
      float g[kRowUnroll], m[kRowUnroll];
#pragma unroll
      for (int u = 0; u < kRowUnroll; ++u) {
        const int r = r0 + u * kRowThreads;
        const std::int64_t k = static_cast<std::int64_t>(r) * ld + c;
        g[u] = r < rows ? d[k] : 0.0f;
        m[u] = r < rows && y ? y[k] : 1.0f;
      }
#pragma unroll
      for (int u = 0; u < kRowUnroll; ++u) {
        const int r = r0 + u * kRowThreads;
        if (m[u] <= 0.0f) {
          g[u] = 0.0f;
          if (r < rows) d[static_cast<std::int64_t>(r) * ld + c] = 0.0f;
        }
        acc += static_cast<double>(g[u]);
      }
    }
  }
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    double s = 0.0;
    for (int k = 0; k < kRowThreads; ++k) s += part[k][threadIdx.x];
    db[h * stride_db + c] = static_cast<float>(s);
  }
}

// --- the fused head forward (tf32 tensor cores) ----------------------------------------------

constexpr int kHfRows = kHeadBlockRows;
constexpr int kHfWarps = 8;
constexpr int kHfThreads = 32 * kHfWarps;
constexpr int kHfTiles = 5;     // n-tiles of 8 columns a warp carries at once
constexpr int kHfUnroll = 8;    // k-steps of 8 whose weight loads are in flight together

/// Leading dimension (in 4-byte words) of a shared A operand with k columns: ≥ k rounded up to 8,
/// and ≡ 4 (mod 32), so the fragment loads (row g, column t) of a warp hit 32 different banks.
__host__ __device__ constexpr int hf_lda(int k) { return ((k + 7) / 8 * 8 - 4 + 31) / 32 * 32 + 4; }
static_assert(hf_lda(256) == 260 && hf_lda(1) == 36 && hf_lda(40) == 68 && hf_lda(36) == 68 && hf_lda(28) == 36);

using dev::smem_addr;
using dev::to_tf32;

/// c += a · b for one m16n8k8 tile (a row-major 16×8, b column-major 8×8, tf32; c f32).
__device__ __forceinline__ void mma_tf32(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// One segment of a block GEMM: out[16, N] = As[16, K] · Wᵀ with W [N, K] row-major in global
/// memory (or out = As · W with W [K, N], see hf_warp_gemm's NK) and As tf32 words in shared
/// memory (lda as hf_lda, zero beyond K).
struct HfSeg {
  const std::uint32_t* As;
  int lda;
  const float* W;
  int N;
  __device__ __forceinline__ int tiles() const { return (N + 7) / 8; }
};

/// One warp: the n-tiles first, first + 1, … (at most NT) of the two segments' tiles laid end to
/// end (s0's, then s1's). NK: W is [N, K] (out = As Wᵀ), else [K, N] (out = As W).
/// epi(segment, row, col, value) receives every result with col < N of its segment. The
/// accumulation order over k is fixed: the result is deterministic.
template <int NT, bool NK, class Epi>
__device__ __forceinline__ void hf_warp_gemm(const HfSeg& s0, const HfSeg& s1, int K, int first, Epi& epi) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int t0 = s0.tiles(), total = t0 + s1.tiles();
  float acc[NT][4];
  const float* wrow[NT];  // NK: row n of W; else column n of W (stride N)
  int ldw[NT];
  bool ok[NT], seg1[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int tile = first + j;
    seg1[j] = tile >= t0;
    const int N = seg1[j] ? s1.N : s0.N;
    const int n = (seg1[j] ? tile - t0 : tile) * 8 + g;
    ok[j] = tile < total && n < N;
    wrow[j] = (seg1[j] ? s1.W : s0.W) + (ok[j] ? (NK ? static_cast<std::int64_t>(n) * K : n) : 0);
    ldw[j] = NK ? 1 : N;
    acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
  }
  const int K8 = (K + 7) / 8 * 8;
  for (int k0 = 0; k0 < K8; k0 += 8 * kHfUnroll) {
    float b[kHfUnroll][NT][2];
#pragma unroll
    for (int u = 0; u < kHfUnroll; ++u) {
      const int k = k0 + 8 * u + t;
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        b[u][j][0] = ok[j] && k < K ? __ldg(wrow[j] + static_cast<std::int64_t>(k) * ldw[j]) : 0.0f;
        b[u][j][1] = ok[j] && k + 4 < K ? __ldg(wrow[j] + static_cast<std::int64_t>(k + 4) * ldw[j]) : 0.0f;
      }
    }
#pragma unroll
    for (int u = 0; u < kHfUnroll; ++u) {
      const int k = k0 + 8 * u;
      if (k >= K8) break;
      std::uint32_t a0[4], a1[4];
      a0[0] = s0.As[g * s0.lda + k + t];
      a0[1] = s0.As[(g + 8) * s0.lda + k + t];
      a0[2] = s0.As[g * s0.lda + k + t + 4];
      a0[3] = s0.As[(g + 8) * s0.lda + k + t + 4];
      a1[0] = s1.As[g * s1.lda + k + t];
      a1[1] = s1.As[(g + 8) * s1.lda + k + t];
      a1[2] = s1.As[g * s1.lda + k + t + 4];
      a1[3] = s1.As[(g + 8) * s1.lda + k + t + 4];
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const std::uint32_t aj[4] = {seg1[j] ? a1[0] : a0[0], seg1[j] ? a1[1] : a0[1], seg1[j] ? a1[2] : a0[2],
                                     seg1[j] ? a1[3] : a0[3]};
        if (first + j < total) mma_tf32(acc[j], aj, to_tf32(b[u][j][0]), to_tf32(b[u][j][1]));
      }
    }
  }
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int tile = first + j;
    if (tile >= total) continue;
    const int sg = seg1[j] ? 1 : 0, N = seg1[j] ? s1.N : s0.N;
    const int c = (seg1[j] ? tile - t0 : tile) * 8 + 2 * t;
    if (c < N) {
      epi(sg, g, c, acc[j][0]);
      epi(sg, g + 8, c, acc[j][2]);
    }
    if (c + 1 < N) {
      epi(sg, g, c + 1, acc[j][1]);
      epi(sg, g + 8, c + 1, acc[j][3]);
    }
  }
}

/// Every warp of the block takes groups of NT n-tiles of the two segments in turn.
template <int NT = kHfTiles, bool NK = true, class Epi>
__device__ __forceinline__ void hf_block_gemm(const HfSeg& s0, const HfSeg& s1, int K, Epi&& epi) {
  const int warp = threadIdx.x >> 5, total = s0.tiles() + s1.tiles();
  for (int first = warp * NT; first < total; first += kHfWarps * NT) hf_warp_gemm<NT, NK>(s0, s1, K, first, epi);
}

struct HfLayout {  ///< shared memory of one block, in 4-byte words
  int ldx, ldh, x, hv, hb, v, adv, mean, qs, bias, words;
};

/// Loads rows [0, 16) × columns [0, cols_pad) of src (row stride lds; zero at rows ≥ nrows or
/// columns ≥ cols) into dst (row stride ldd), as tf32 words when `tf32`. Each thread issues
/// kHfLoad loads before its first store, so the block has them all in flight at once (a plain
/// strided loop waits for each load in turn).
constexpr int kHfLoad = 8;
__device__ __forceinline__ void hf_load_tile(float* dst, int ldd, const float* __restrict__ src, std::int64_t lds,
                                             int nrows, int cols, int cols_pad, bool tf32) {
  const int total = kHfRows * cols_pad;
  for (int base = threadIdx.x; base < total; base += kHfThreads * kHfLoad) {
    float v[kHfLoad];
#pragma unroll
    for (int u = 0; u < kHfLoad; ++u) {
      const int i = base + u * kHfThreads, r = i / cols_pad, c = i - r * cols_pad;
      v[u] = i < total && r < nrows && c < cols ? __ldg(src + r * lds + c) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kHfLoad; ++u) {
      const int i = base + u * kHfThreads, r = i / cols_pad, c = i - r * cols_pad;
      if (i < total) dst[r * ldd + c] = tf32 ? __uint_as_float(to_tf32(v[u])) : v[u];
    }
  }
}

__host__ __device__ inline HfLayout hf_layout(int H2, int Hh, int A, int Z) {
  HfLayout l{};
  l.ldx = hf_lda(H2);
  l.ldh = hf_lda(Hh);
  l.x = 0;
  l.hv = l.x + kHfRows * l.ldx;
  l.hb = l.hv + kHfRows * l.ldh;
  l.v = l.hb + kHfRows * l.ldh;
  l.adv = l.v + kHfRows * Z;
  l.mean = l.adv + kHfRows * A * Z;
  l.qs = l.mean + kHfRows * Z;
  l.bias = l.qs + kHfRows * A;            // b1 of the value stream and branch d, bb2_d, bv2
  l.words = l.bias + 2 * Hh + A * Z + Z;
  return l;
}

/// Grid (row tiles of 16, D): block (r, d) computes, for its 16 rows, the value stream and branch d
/// from x: hidden_v and hidden_d (ReLU), v and adv_d, then the distribution of branch d (the
/// dueling combine of a branch needs only v and that branch's advantages). Block d = 0 writes
/// hidden_v and v; every block writes its branch's hidden, adv, logp, q and a*. The value stream
/// is computed by every branch's block (cheaper than waiting for one another).
__global__ void __launch_bounds__(kHfThreads) head_forward_kernel(HeadForward a, float dz) {
  dev::pdl_entry();
  extern __shared__ float hf_shared[];
  const int H2 = a.H2, Hh = a.Hh, D = a.D, A = a.A, Z = a.Z, az = A * Z, hc = (1 + D) * Hh;
  const int lda = ld_or(a.ldadv, az);  // adv's (row, branch) stride
  const HfLayout L = hf_layout(H2, Hh, A, Z);
  std::uint32_t* xs = reinterpret_cast<std::uint32_t*>(hf_shared + L.x);
  std::uint32_t* hv = reinterpret_cast<std::uint32_t*>(hf_shared + L.hv);
  std::uint32_t* hb = reinterpret_cast<std::uint32_t*>(hf_shared + L.hb);
  float* vs = hf_shared + L.v;
  float* advs = hf_shared + L.adv;
  float* mean = hf_shared + L.mean;
  float* qs = hf_shared + L.qs;
  const int r0 = blockIdx.x * kHfRows, d = blockIdx.y;
  const int nrows = min(kHfRows, a.rows - r0);
  const float* X = static_cast<const float*>(a.x.p) + static_cast<std::int64_t>(r0) * a.ldx;
  // x tile → tf32 words (zero beyond the rows and beyond H2, up to the padded width)
  hf_load_tile(reinterpret_cast<float*>(xs), L.ldx, X, a.ldx, nrows, H2, (H2 + 7) / 8 * 8, true);
  // the biases this block adds: b1 [0, Hh) and [(1+d)Hh, (2+d)Hh), bb2_d, bv2 (one pass)
  float* bias = hf_shared + L.bias;
  {
    const float* B1 = static_cast<const float*>(a.b1.p);
    const float* BB = static_cast<const float*>(a.bb2.p) + static_cast<std::int64_t>(d) * ld_or(a.wb2_rows, az);
    const float* BV = static_cast<const float*>(a.bv2.p);
    for (int i = threadIdx.x; i < 2 * Hh + az + Z; i += kHfThreads)
      bias[i] = i < Hh ? B1[i] : i < 2 * Hh ? B1[d * Hh + i] : i < 2 * Hh + az ? BB[i - 2 * Hh] : BV[i - 2 * Hh - az];
  }
  const int K8h = (Hh + 7) / 8 * 8;
  for (int i = threadIdx.x; i < kHfRows * (K8h - Hh); i += kHfThreads) {  // the k padding of hv, hb
    const int r = i / (K8h - Hh), c = Hh + i % (K8h - Hh);
    hv[r * L.ldh + c] = 0u;
    hb[r * L.ldh + c] = 0u;
  }
  __syncthreads();
  {  // hidden layers: value stream (W1 rows [0, Hh)) and branch d (rows [(1+d)Hh, (2+d)Hh))
    const float* W1 = static_cast<const float*>(a.w1.p);
    float* HID = static_cast<float*>(a.hidden.p);
    const int col1 = (1 + d) * Hh;
    auto epi = [&](int sg, int r, int c, float acc) {
      const int col = sg ? col1 + c : c;
      const float y = fmaxf(acc + bias[sg * Hh + c], 0.0f);
      (sg ? hb : hv)[r * L.ldh + c] = to_tf32(y);
      if (r < nrows && (sg || d == 0)) HID[static_cast<std::int64_t>(r0 + r) * hc + col] = y;
    };
    hf_block_gemm(HfSeg{xs, L.ldx, W1, Hh}, HfSeg{xs, L.ldx, W1 + static_cast<std::int64_t>(col1) * H2, Hh}, H2, epi);
  }
  __syncthreads();
  {  // output layers: adv_d = hidden_d Wb2_dᵀ + bb2_d, v = hidden_v Wv2ᵀ + bv2
    const float* BB = bias + 2 * Hh;
    const float* BV = BB + az;
    float* VO = static_cast<float*>(a.v.p);
    float* ADVO = static_cast<float*>(a.adv.p);
    auto epi = [&](int sg, int r, int c, float acc) {
      if (sg == 0) {
        const float y = acc + BB[c];
        advs[r * az + c] = y;
        if (r < nrows) ADVO[(static_cast<std::int64_t>(r0 + r) * D + d) * lda + c] = y;
      } else {
        const float y = acc + BV[c];
        vs[r * Z + c] = y;
        if (d == 0 && r < nrows) VO[static_cast<std::int64_t>(r0 + r) * a.ldv + c] = y;
      }
    };
    const std::int64_t wb = static_cast<std::int64_t>(d) * ld_or(a.wb2_rows, az) * Hh;  // branch d's block
    hf_block_gemm(HfSeg{hb, L.ldh, static_cast<const float*>(a.wb2.p) + wb, az},
                  HfSeg{hv, L.ldh, static_cast<const float*>(a.wv2.p), Z}, Hh, epi);
  }
  if (!a.logp.p) return;
  __syncthreads();
  // The distribution of branch d, in float: the mean advantage of every (row, atom), then a thread
  // per (row, action) for the log-softmax of v + adv − mean over the atoms (written over its own
  // advantages) and Q; then coalesced stores, and the double-DQN argmax (ties: lowest index).
  for (int i = threadIdx.x; i < nrows * Z; i += kHfThreads) {
    const int r = i / Z, z = i - r * Z;
    float s = 0.0f;
    for (int act = 0; act < A; ++act) s += advs[r * az + act * Z + z];
    mean[i] = s / A;
  }
  __syncthreads();
  const float v_min = a.v_min;
  for (int item = threadIdx.x; item < nrows * A; item += kHfThreads) {
    const int r = item / A, act = item - r * A;
    float* x = advs + r * az + act * Z;
    const float* vr = vs + r * Z;
    const float* mr = mean + r * Z;
    float mx = -INFINITY;
    for (int i = 0; i < Z; ++i) {
      const float l = vr[i] + x[i] - mr[i];
      x[i] = l;
      mx = fmaxf(mx, l);
    }
    float sum = 0.0f;
    for (int i = 0; i < Z; ++i) sum += expf(x[i] - mx);
    const float lse = mx + logf(sum);
    float qa = 0.0f;
    for (int i = 0; i < Z; ++i) {
      const float l = x[i] - lse;
      x[i] = l;
      qa += (v_min + i * dz) * expf(l);
    }
    qs[item] = qa;
  }
  __syncthreads();
  float* LP = static_cast<float*>(a.logp.p);
  for (int i = threadIdx.x; i < nrows * az; i += kHfThreads) {
    const int r = i / az, c = i - r * az;
    LP[(static_cast<std::int64_t>(r0 + r) * D + d) * az + c] = advs[i];
  }
  if (a.q.p) {
    float* Q = static_cast<float*>(a.q.p);
    for (int i = threadIdx.x; i < nrows * A; i += kHfThreads) {
      const int r = i / A, act = i - r * A;
      Q[(static_cast<std::int64_t>(r0 + r) * D + d) * A + act] = qs[i];
    }
  }
  if (!a.a_star) return;
  for (int r = threadIdx.x; r < nrows; r += kHfThreads) {
    if (r0 + r < a.star_from) continue;
    int best = 0;
    for (int act = 1; act < A; ++act)
      if (qs[r * A + act] > qs[r * A + best]) best = act;  // strict: ties keep the lowest index
    a.a_star[static_cast<std::int64_t>(r0 + r - a.star_from) * D + d] = best;
  }
}

// --- the cluster head forward (tf32 tensor cores, weights shared across a cluster) -----------
//
// The value and advantage layers of head_forward (the distribution is dueling_dist's, after it)
// in 2·(1 + D) blocks per 32 rows: blocks 2s and 2s + 1, a cluster of two, own stream s (s = 0 the
// value stream, s = 1 + d branch d), each half of the stream's hidden columns and half of its
// output columns, so every weight is read once per 32 rows (the block kernel above reads the
// value stream's weights in every branch's block, and every block reads whole layers). A block
// copies its two weight slices into shared memory first, before it waits for the kernel that
// writes its input (programmatic launch: the copies overlap the trunk's last layer). The halves
// of a stream's hidden layer meet in both blocks' shared memory (distributed shared memory) before
// the output layer; the hidden layer's global stores follow the cluster barrier, whose release
// would otherwise wait for them. (The forms measured so far used clusters of all 2·(1 + D)
// blocks, needed only to exchange between streams, and were slower than the GEMMs; eight blocks of
// 192 KiB must find eight free SMs of one GPC, which clusters of two avoid: not yet measured, see
// docs/performance.md.)

constexpr int kHcRows = 2 * kHfRows;  // rows of a cluster: two m16 tiles

__device__ __forceinline__ void cluster_arrive_relaxed() { asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.aligned;" ::: "memory"); }

__host__ __device__ inline int round8(int n) { return (n + 7) / 8 * 8; }
/// Columns of half 0 of n output columns (whole 8-column tiles where n allows).
__host__ __device__ inline int hc_split(int n) { return min(n, round8((n + 1) / 2)); }

struct HcLayout {  ///< shared memory of one block of the cluster head forward, in 4-byte words
  int ldx, ldh, w1, w2, x, h, hf, bias, bar, words;
};

__host__ __device__ inline HcLayout hc_layout(int H2, int Hh, int A, int Z) {
  HcLayout l{};
  const int on_max = max(hc_split(Z), hc_split(A * Z)), hn_max = hc_split(Hh);
  l.ldx = hf_lda(H2);
  l.ldh = hf_lda(Hh);
  l.w1 = 0;                                    // the block's W1 rows [round8(hn), ldx]
  l.w2 = l.w1 + round8(hn_max) * l.ldx;        // its output rows [round8(on), ldh]
  l.x = l.w2 + round8(on_max) * l.ldh;         // the rows' input (tf32) [32, ldx]
  l.h = l.x + kHcRows * l.ldx;                 // the stream's hidden rows (tf32), both halves [32, ldh]
  l.hf = l.h + kHcRows * l.ldh;                // the block's hidden half as floats [32, hn], for the stores
  l.bias = l.hf + kHcRows * hn_max;            // b1 of the hidden half, then the output bias
  l.bar = l.bias + (hn_max + on_max + 3) / 4 * 4;   // two mbarriers (8 bytes each) of the bulk copies
  l.words = l.bar + 4;
  return l;
}

/// Requests rows [0, n) of W (k contiguous floats each) into dst (row stride ld), zero-filling
/// columns [k, round8(k)) and rows [n, round8(n)) (what the mma reads beyond them), then commits
/// the group: a warp per row, lanes along it. 16-byte copies where W is 16-byte aligned and k a
/// multiple of 4.
/// Whether hc_stage copies rows of k floats from W by the bulk copy engine (16-byte aligned rows).
__device__ __forceinline__ bool hc_bulk_ok(const float* W, int k) { return dev::aligned16(W) && k % 4 == 0; }

/// The transaction barrier of one bulk-copied slice: initialised for one arrival (thread 0's,
/// which also announces the bytes to come), then waited on by every thread (phase 0).
__device__ __forceinline__ void mbar_init(std::uint64_t* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void mbar_expect(std::uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(std::uint64_t* bar) {
  unsigned done = 0;
  while (!done)
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_addr(bar))
        : "memory");
}

/// Requests rows [0, n) of W (k contiguous floats each) into dst (row stride ld) as hc_stage does,
/// by the bulk copy engine: a copy per row, issued by lane 0 of each warp, completing on `bar`
/// (whose bytes thread 0 announced); the zero padding by plain stores. Commits an empty cp.async
/// group, so that the count of groups stays the same on either path.
template <int WARPS>
__device__ __forceinline__ void hc_stage_bulk(float* dst, int ld, const float* W, int n, int k, std::uint64_t* bar) {
  const int n8 = round8(n), k8 = round8(k), lane = threadIdx.x & 31;
  for (int r = threadIdx.x >> 5; r < n8; r += WARPS) {
    if (r < n && lane == 0)
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                       smem_addr(dst + r * ld)),
                   "l"(W + static_cast<std::int64_t>(r) * k), "r"(4 * k), "r"(smem_addr(bar))
                   : "memory");
    for (int c = r < n ? k + lane : lane; c < k8; c += 32) dst[r * ld + c] = 0.0f;
  }
  dev::cp_async_commit();
}

template <int WARPS>
__device__ __forceinline__ void hc_stage(float* dst, int ld, const float* W, int n, int k) {
  const int n8 = round8(n), k8 = round8(k), lane = threadIdx.x & 31;
  if (dev::aligned16(W) && k % 4 == 0) {
    for (int r = threadIdx.x >> 5; r < n8; r += WARPS)
      for (int c = 4 * lane; c < k8; c += 128) {
        const bool ok = r < n && c < k;
        dev::cp_async16(dst + r * ld + c, ok ? W + static_cast<std::int64_t>(r) * k + c : W, ok ? 16 : 0);
      }
  } else {
    for (int r = threadIdx.x >> 5; r < n8; r += WARPS)
      for (int c = lane; c < k8; c += 32) {
        const bool ok = r < n && c < k;
        dev::cp_async4(dst + r * ld + c, ok ? W + static_cast<std::int64_t>(r) * k + c : W, ok);
      }
  }
  dev::cp_async_commit();
}

/// The A fragment of one m16n8k8 tf32 mma (rows 0–15, columns k..k + 7 of a row-major tile of
/// 32-bit words) by one ldmatrix.x4: its four 8×8 matrices of 16-bit halves are the 8×4 word
/// blocks (rows 0–7, words 0–3), (8–15, 0–3), (0–7, 4–7), (8–15, 4–7), which give lane (g, t) the
/// words (g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4): a0..a3. p: this lane's row address, row
/// (lane & 7) + (lane & 8), word (lane >> 4)·4 (16-byte aligned).
__device__ __forceinline__ void ldmatrix_a(std::uint32_t (&a)[4], const std::uint32_t* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
               : "r"(smem_addr(p)));
}

/// out[32, N] = As[32, K] · Wsᵀ from shared memory: As tf32 words (row stride lda, zero beyond K
/// up to round8(K)), Ws floats [round8(N), ldw] zero-padded likewise. The block's WARPS warps
/// share the (n-tile, m-tile) pairs: with MT = 2 warp w takes both m-tiles of n-tiles w, w + WARPS,
/// … (NT at once); with MT = 1 the warps pair up, warp w the m-tile w & 1 of n-tiles w / 2,
/// w / 2 + WARPS / 2, …. epi(row, col, value) for every col < N. Fixed order over k.
template <int WARPS, int NT, int MT, class Epi>
__device__ __forceinline__ void hc_gemm_nt(const std::uint32_t* As, int lda, const float* Ws, int ldw, int N, int K,
                                           Epi& epi) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, warp = threadIdx.x >> 5;
  const int lrow = (lane & 7) + (lane & 8), lcol = (lane >> 4) * 4;  // the row and column this lane's ldmatrix address names
  const int tiles = (N + 7) / 8, K8 = round8(K);
  const int m0 = MT == 2 ? 0 : (warp & 1), wn = MT == 2 ? warp : warp >> 1, step = MT == 2 ? WARPS : WARPS / 2;
  for (int first = wn; first < tiles; first += step * NT) {
    float acc[NT][MT][4] = {};
    for (int k = 0; k < K8; k += 8) {
      std::uint32_t a[MT][4];
#pragma unroll
      for (int m = 0; m < MT; ++m) ldmatrix_a(a[m], As + ((m0 + m) * 16 + lrow) * lda + k + lcol);
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const int tile = first + j * step;
        if (tile >= tiles) break;
        const float* wr = Ws + (tile * 8 + g) * ldw + k + t;
        const std::uint32_t b0 = to_tf32(wr[0]), b1 = to_tf32(wr[4]);
#pragma unroll
        for (int m = 0; m < MT; ++m) mma_tf32(acc[j][m], a[m], b0, b1);
      }
    }
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const int tile = first + j * step;
      if (tile >= tiles) break;
      const int c = tile * 8 + 2 * t;
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        const int r = (m0 + m) * 16 + g;
        if (c < N) {
          epi(r, c, acc[j][m][0]);
          epi(r + 8, c, acc[j][m][2]);
        }
        if (c + 1 < N) {
          epi(r, c + 1, acc[j][m][1]);
          epi(r + 8, c + 1, acc[j][m][3]);
        }
      }
    }
  }
}

/// hc_gemm_nt with the pairs spread over the warps: one pair a warp where there are enough,
/// else two m-tiles a warp, then two n-tiles.
template <int WARPS, class Epi>
__device__ __forceinline__ void hc_gemm(const std::uint32_t* As, int lda, const float* Ws, int ldw, int N, int K,
                                        Epi&& epi) {
  const int tiles = (N + 7) / 8;
  if (WARPS >= 16 && 2 * tiles <= WARPS)
    hc_gemm_nt<WARPS, 1, 1>(As, lda, Ws, ldw, N, K, epi);
  else if (WARPS >= 16)
    hc_gemm_nt<WARPS, 2, 1>(As, lda, Ws, ldw, N, K, epi);
  else if (tiles <= WARPS)
    hc_gemm_nt<WARPS, 1, 2>(As, lda, Ws, ldw, N, K, epi);
  else
    hc_gemm_nt<WARPS, 2, 2>(As, lda, Ws, ldw, N, K, epi);
}

/// Grid (2·(1 + D), row tiles of 32), clusters of two along x (see above).
template <int WARPS, bool BULK>
__global__ void __launch_bounds__(32 * WARPS) head_forward_cluster_kernel(HeadForward a) {
  constexpr int kThreads = 32 * WARPS;
  namespace cg = cooperative_groups;
  extern __shared__ float hc_shared[];
  const int H2 = a.H2, Hh = a.Hh, D = a.D, A = a.A, Z = a.Z, az = A * Z, hc = (1 + D) * Hh;
  const int lda = ld_or(a.ldadv, az);  // adv's (row, branch) stride
  const HcLayout L = hc_layout(H2, Hh, A, Z);
  const int s = static_cast<int>(blockIdx.x) >> 1, h = static_cast<int>(blockIdx.x) & 1;  // h: the rank in the pair
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float* w1s = hc_shared + L.w1;
  float* w2s = hc_shared + L.w2;
  std::uint32_t* xs = reinterpret_cast<std::uint32_t*>(hc_shared + L.x);
  std::uint32_t* hs = reinterpret_cast<std::uint32_t*>(hc_shared + L.h);
  float* hf = hc_shared + L.hf;
  float* bias = hc_shared + L.bias;
  // this block's columns: [hc0, hc0 + hn) of the stream's hidden layer, [oc0, oc0 + on) of its output
  const int hsplit = hc_split(Hh), hc0 = h ? hsplit : 0, hn = h ? Hh - hsplit : hsplit;
  const int N2 = s == 0 ? Z : az, osplit = hc_split(N2), oc0 = h ? osplit : 0, on = h ? N2 - osplit : osplit;
  // the weights first: no kernel this one waits for writes them
  const float* W1 = static_cast<const float*>(a.w1.p) + static_cast<std::int64_t>(s * Hh + hc0) * H2;
  const float* W2 = s == 0 ? static_cast<const float*>(a.wv2.p) + static_cast<std::int64_t>(oc0) * Hh
                           : static_cast<const float*>(a.wb2.p) + (static_cast<std::int64_t>(s - 1) * ld_or(a.wb2_rows, az) + oc0) * Hh;
  std::uint64_t* bars = reinterpret_cast<std::uint64_t*>(hc_shared + L.bar);
  const bool bulk1 = BULK && hc_bulk_ok(W1, H2), bulk2 = BULK && hc_bulk_ok(W2, Hh);
  if (BULK) {
    if (threadIdx.x == 0) {
      mbar_init(bars);
      mbar_init(bars + 1);
      asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
      mbar_expect(bars, bulk1 ? 4u * hn * H2 : 0u);
      mbar_expect(bars + 1, bulk2 ? 4u * on * Hh : 0u);
    }
    __syncthreads();
  }
  if (bulk1)
    hc_stage_bulk<WARPS>(w1s, L.ldx, W1, hn, H2, bars);
  else
    hc_stage<WARPS>(w1s, L.ldx, W1, hn, H2);
  if (bulk2)
    hc_stage_bulk<WARPS>(w2s, L.ldh, W2, on, Hh, bars + 1);
  else
    hc_stage<WARPS>(w2s, L.ldh, W2, on, Hh);
  {
    const float* B1 = static_cast<const float*>(a.b1.p) + s * Hh + hc0;
    const float* B2 = s == 0 ? static_cast<const float*>(a.bv2.p) + oc0
                             : static_cast<const float*>(a.bb2.p) + static_cast<std::int64_t>(s - 1) * ld_or(a.wb2_rows, az) + oc0;
    for (int i = threadIdx.x; i < hn + on; i += kThreads) bias[i] = i < hn ? B1[i] : B2[i - hn];
  }
  dev::pdl_entry();
  cluster_arrive_relaxed();  // this block runs: the others may write into its shared memory
  cg::cluster_group cluster = cg::this_cluster();
  const int r0 = blockIdx.y * kHcRows;
  const int nrows = min(kHcRows, a.rows - r0);
  {  // the rows' input → tf32 words (zero beyond the rows and beyond H2, up to round8(H2)); a warp
     // per row, every load of the block in flight at once where the rows allow 16-byte loads
    const float* X = static_cast<const float*>(a.x.p) + static_cast<std::int64_t>(r0) * a.ldx;
    const int w = round8(H2);
    if (dev::aligned16(X) && a.ldx % 4 == 0 && H2 % 4 == 0 && w <= 128 * 2) {  // no float4 straddles H2
      float4 v[kHcRows / WARPS][2];
#pragma unroll
      for (int i = 0; i < kHcRows / WARPS; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int r = warp + i * WARPS, c = 4 * lane + 128 * j;
          v[i][j] = r < nrows && c < H2 ? __ldg(reinterpret_cast<const float4*>(X + static_cast<std::int64_t>(r) * a.ldx + c))
                                        : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
      for (int i = 0; i < kHcRows / WARPS; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int r = warp + i * WARPS, c = 4 * lane + 128 * j;
          if (c >= w) continue;
          std::uint32_t* d = xs + r * L.ldx + c;
          d[0] = to_tf32(v[i][j].x); d[1] = to_tf32(v[i][j].y); d[2] = to_tf32(v[i][j].z); d[3] = to_tf32(v[i][j].w);
        }
    } else {
      for (int r = warp; r < kHcRows; r += WARPS)
        for (int c = lane; c < w; c += 32)
          xs[r * L.ldx + c] = to_tf32(r < nrows && c < H2 ? __ldg(X + static_cast<std::int64_t>(r) * a.ldx + c) : 0.0f);
    }
  }
  const int K8h = round8(Hh);
  for (int i = threadIdx.x; i < kHcRows * (K8h - Hh); i += kThreads) {  // hs's k padding (each block its own)
    const int r = i / (K8h - Hh), c = Hh + i % (K8h - Hh);
    hs[r * L.ldh + c] = 0u;
  }
  dev::cp_async_wait<1>();  // W1's rows are in
  if (BULK) mbar_wait(bars);
  __syncthreads();
  cluster_wait();  // every block of the cluster runs
  {  // 1. the block's half of the stream's hidden layer, into its own and its partner's hs
    std::uint32_t* peer = cluster.map_shared_rank(hs, h ^ 1);
    hc_gemm<WARPS>(xs, L.ldx, w1s, L.ldx, hn, H2, [&](int r, int c, float acc) {
      const float y = fmaxf(acc + bias[c], 0.0f);
      const std::uint32_t u = to_tf32(y);
      hs[r * L.ldh + hc0 + c] = u;
      peer[r * L.ldh + hc0 + c] = u;
      hf[r * hn + c] = y;
    });
  }
  dev::cp_async_wait<0>();  // the output rows are in
  if (BULK) mbar_wait(bars + 1);
  cluster.sync();  // both halves of hs are written (and no block reads another's memory after this)
  {  // the hidden half's stores, a warp per row
    float* HID = static_cast<float*>(a.hidden.p) + static_cast<std::int64_t>(r0) * hc + s * Hh + hc0;
    for (int r = warp; r < nrows; r += WARPS)
      for (int c = lane; c < hn; c += 32) HID[static_cast<std::int64_t>(r) * hc + c] = hf[r * hn + c];
  }
  // 2. the block's half of the stream's output layer
  const float* B2 = bias + hn;
  float* VO = static_cast<float*>(a.v.p);
  float* ADVO = static_cast<float*>(a.adv.p);
  hc_gemm<WARPS>(hs, L.ldh, w2s, L.ldh, on, Hh, [&](int r, int c, float acc) {
    if (r >= nrows) return;
    const float y = acc + B2[c];
    const int col = oc0 + c;
    if (s == 0)
      VO[static_cast<std::int64_t>(r0 + r) * a.ldv + col] = y;
    else
      ADVO[(static_cast<std::int64_t>(r0 + r) * D + (s - 1)) * lda + col] = y;
  });
}

/// Grid (row tiles of 16, 1 + D): block (r, 0) computes dhidden_v = (dv · Wv2) ⊙ [hidden_v > 0]
/// for its 16 rows, block (r, 1 + d) dhidden_d = (dadv_d · Wb2_d) ⊙ [hidden_d > 0]: the segments of
/// dhidden are independent of one another.
__global__ void __launch_bounds__(kHfThreads) head_backward_inputs_kernel(HeadBackward a) {
  dev::pdl_entry();
  extern __shared__ float hb_shared[];
  const int Hh = a.Hh, D = a.D, az = a.A * a.Z, hc = (1 + D) * Hh, s = blockIdx.y;
  const int K = s == 0 ? a.Z : az;
  const int lda = hf_lda(K), K8 = (K + 7) / 8 * 8;
  std::uint32_t* as = reinterpret_cast<std::uint32_t*>(hb_shared);
  float* mask = hb_shared + kHfRows * lda;  // this segment's hidden [16, Hh]
  const int r0 = blockIdx.x * kHfRows;
  const int nrows = min(kHfRows, a.rows - r0);
  const int ldd = ld_or(a.lddadv, az);  // dadv's (row, branch) stride
  const std::int64_t lds = s == 0 ? a.lddv : static_cast<std::int64_t>(D) * ldd;
  const float* src = (s == 0 ? static_cast<const float*>(a.dv.p) : static_cast<const float*>(a.dadv.p) + (s - 1) * ldd) +
                     r0 * lds;
  hf_load_tile(reinterpret_cast<float*>(as), lda, src, lds, nrows, K, K8, true);
  const int col0 = s * Hh;
  hf_load_tile(mask, Hh, static_cast<const float*>(a.hidden.p) + static_cast<std::int64_t>(r0) * hc + col0, hc, nrows,
               Hh, Hh, false);
  __syncthreads();
  const float* W = s == 0 ? static_cast<const float*>(a.wv2.p)
                          : static_cast<const float*>(a.wb2.p) + static_cast<std::int64_t>(s - 1) * ld_or(a.wb2_rows, az) * Hh;
  float* DH = static_cast<float*>(a.dhidden.p);
  auto epi = [&](int, int r, int c, float acc) {
    if (r < nrows) DH[static_cast<std::int64_t>(r0 + r) * hc + col0 + c] = mask[r * Hh + c] > 0.0f ? acc : 0.0f;
  };
  const HfSeg seg{as, lda, W, Hh}, none{as, lda, W, 0};
  hf_block_gemm<2, false>(seg, none, K, epi);
}

std::size_t round_up(std::size_t x, std::size_t a) { return (x + a - 1) / a * a; }

}  // namespace

cudaError_t relu_bias_grad(cudaStream_t s, float* dy, const float* y, float* db, int rows, int cols, int ld,
                           int heads, std::int64_t stride_dy, std::int64_t stride_y, std::int64_t stride_db) {
  if (!db)  // the masks alone, element-parallel (the sums below give a block only 32 columns)
    return y ? relu_mask(s, dy, rows, cols, ld, y, ld, rows, heads, stride_dy, stride_y) : cudaSuccess;
  const dim3 grid((cols + kColTile - 1) / kColTile, heads), block(kColTile, kRowThreads);
  launch(relu_bias_grad_kernel, grid, block, 0, s, dy, y, db, rows, cols, ld, stride_dy, stride_y, stride_db);
  return cudaGetLastError();
}

std::size_t dueling_dist_shared_bytes(int Z, int A) {
  return static_cast<std::size_t>(Z) * sizeof(double) + round_up(static_cast<std::size_t>(A) * sizeof(float), 8);
}

cudaError_t dueling_dist(cudaStream_t s, const DuelingDist& a, bool double_math, bool per_action) {
  const double dz_w = support_step(a.v_min, a.v_max, a.Z);
  if (warp_head_fits(a.A, a.Z) && per_action) {
    const auto blocks = static_cast<unsigned>(static_cast<std::int64_t>(a.rows) * a.D);
    if (double_math)
      launch(dueling_dist_action_kernel<double>, blocks, 32 * a.A, 0, s, a, dz_w);
    else
      launch(dueling_dist_action_kernel<float>, blocks, 32 * a.A, 0, s, a, dz_w);
    return cudaGetLastError();
  }
  if (warp_head_fits(a.A, a.Z) && warp_head_kernels()) {
    const std::int64_t pairs = static_cast<std::int64_t>(a.rows) * a.D;
    const auto blocks = static_cast<unsigned>((pairs + kDistWarpsPerBlock - 1) / kDistWarpsPerBlock);
    if (double_math)
      launch(dueling_dist_warp_kernel<double>, blocks, 32 * kDistWarpsPerBlock, 0, s, a, dz_w);
    else
      launch(dueling_dist_warp_kernel<float>, blocks, 32 * kDistWarpsPerBlock, 0, s, a, dz_w);
    return cudaGetLastError();
  }
  const std::int64_t blocks = static_cast<std::int64_t>(a.rows) * a.D;
  const int warps = a.A < kDistMaxWarps ? a.A : kDistMaxWarps;
  const std::size_t shmem = dueling_dist_shared_bytes(a.Z, a.A);
  const double dz = support_step(a.v_min, a.v_max, a.Z);
  if (double_math)
    launch(dueling_dist_kernel<double>, static_cast<unsigned>(blocks), 32 * warps, shmem, s, a, dz);
  else
    launch(dueling_dist_kernel<float>, static_cast<unsigned>(blocks), 32 * warps, shmem, s, a, dz);
  return cudaGetLastError();
}

std::size_t c51_loss_scratch_bytes(int B) { return round_up(static_cast<std::size_t>(B) * sizeof(double), 256); }

std::size_t c51_loss_shared_bytes(int D, int A, int Z) {
  // sized for double arithmetic (float needs less)
  if (c51_warp(D, A, Z)) return c51_loss_warp_shared_bytes(D, Z, sizeof(double));
  const LossShape sh = loss_shape(D, Z);
  return (static_cast<std::size_t>(D) + static_cast<std::size_t>(D) * Z + static_cast<std::size_t>(sh.slots) * 3 * Z) *
         sizeof(double);
}

namespace {
/// c51_loss's launch for one part (C51Loss::part) of the op.
template <int PART>
cudaError_t c51_loss_part(cudaStream_t s, const C51Loss& a, double* w, unsigned* counter, bool double_math, bool pair) {
  if (c51_warp(a.D, a.A, a.Z)) {
    const double dz_w = support_step(a.v_min, a.v_max, a.Z);
    const std::size_t shmem = c51_loss_warp_shared_bytes(a.D, a.Z, double_math ? sizeof(double) : sizeof(float));
    if (pair && a.D <= kLossPairMax) {
      if (double_math)
        launch(c51_loss_warp_kernel<double, 2, PART>, a.B, 64 * a.D, shmem, s, a, dz_w, w, counter);
      else
        launch(c51_loss_warp_kernel<float, 2, PART>, a.B, 64 * a.D, shmem, s, a, dz_w, w, counter);
    } else if (double_math) {
      launch(c51_loss_warp_kernel<double, 1, PART>, a.B, 32 * a.D, shmem, s, a, dz_w, w, counter);
    } else {
      launch(c51_loss_warp_kernel<float, 1, PART>, a.B, 32 * a.D, shmem, s, a, dz_w, w, counter);
    }
    return cudaGetLastError();
  }
  const LossShape sh = loss_shape(a.D, a.Z);
  const double dz = support_step(a.v_min, a.v_max, a.Z);
  const std::size_t shmem = c51_loss_shared_bytes(a.D, a.A, a.Z);
  if (double_math)
    launch(c51_loss_kernel<double, PART>, a.B, sh.tpb * sh.slots, shmem, s, a, dz, sh, w, counter);
  else
    launch(c51_loss_kernel<float, PART>, a.B, sh.tpb * sh.slots, shmem, s, a, dz, sh, w, counter);
  return cudaGetLastError();
}
}  // namespace

cudaError_t c51_loss(cudaStream_t s, const C51Loss& a, void* scratch, unsigned* counter, bool double_math, bool pair) {
  auto* w = static_cast<double*>(scratch);
  switch (a.part) {
    case 1: return c51_loss_part<1>(s, a, w, counter, double_math, pair);
    case 2: return c51_loss_part<2>(s, a, w, counter, double_math, pair);
    default: return c51_loss_part<0>(s, a, w, counter, double_math, pair);
  }
}

std::size_t head_forward_shared_bytes(int H2, int Hh, int A, int Z) {
  return static_cast<std::size_t>(hf_layout(H2, Hh, A, Z).words) * 4;
}

cudaError_t head_forward(cudaStream_t s, const HeadForward& a) {
  const dim3 grid(static_cast<unsigned>((a.rows + kHfRows - 1) / kHfRows), static_cast<unsigned>(a.D));
  launch(head_forward_kernel, grid, kHfThreads, head_forward_shared_bytes(a.H2, a.Hh, a.A, a.Z), s, a,
         static_cast<float>(support_step(a.v_min, a.v_max, a.Z)));
  return cudaGetLastError();
}

std::size_t head_forward_cluster_shared_bytes(int H2, int Hh, int A, int Z) {
  return static_cast<std::size_t>(hc_layout(H2, Hh, A, Z).words) * 4;
}

cudaError_t head_forward_cluster(cudaStream_t s, const HeadForward& a, int warps, bool bulk) {
  const std::size_t shared = head_forward_cluster_shared_bytes(a.H2, a.Hh, a.A, a.Z);
  cudaLaunchAttribute attr[2]{};
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 2;  // the two halves of a stream
  attr[0].val.clusterDim.y = attr[0].val.clusterDim.z = 1;
  attr[1] = dev::pdl_attribute();
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(2 * (1 + a.D)), static_cast<unsigned>((a.rows + kHcRows - 1) / kHcRows));
  cfg.blockDim = dim3(static_cast<unsigned>(32 * (warps == 16 ? 16 : 8)));
  cfg.dynamicSmemBytes = shared;
  cfg.stream = s;
  cfg.attrs = attr;
  cfg.numAttrs = dev::pdl_for(shared) ? 2 : 1;
  if (warps == 16)
    return bulk ? cudaLaunchKernelEx(&cfg, head_forward_cluster_kernel<16, true>, a)
                : cudaLaunchKernelEx(&cfg, head_forward_cluster_kernel<16, false>, a);
  return bulk ? cudaLaunchKernelEx(&cfg, head_forward_cluster_kernel<8, true>, a)
              : cudaLaunchKernelEx(&cfg, head_forward_cluster_kernel<8, false>, a);
}

std::size_t head_backward_inputs_shared_bytes(int Hh, int A, int Z) {
  const int k = std::max(A * Z, Z);
  return static_cast<std::size_t>(kHfRows) * (hf_lda(k) + Hh) * 4;
}

cudaError_t head_backward_inputs(cudaStream_t s, const HeadBackward& a) {
  const dim3 grid(static_cast<unsigned>((a.rows + kHfRows - 1) / kHfRows), static_cast<unsigned>(1 + a.D));
  launch(head_backward_inputs_kernel, grid, kHfThreads, head_backward_inputs_shared_bytes(a.Hh, a.A, a.Z), s, a);
  return cudaGetLastError();
}

cudaError_t head_kernels_prepare(std::size_t max_shared_bytes) {
  const cudaError_t e = cudaFuncSetAttribute(head_forward_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(max_shared_bytes));
  if (e != cudaSuccess) return e;
  for (auto* k : {head_forward_cluster_kernel<8, false>, head_forward_cluster_kernel<16, false>,
                  head_forward_cluster_kernel<8, true>, head_forward_cluster_kernel<16, true>})
    if (const cudaError_t c =
            cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(max_shared_bytes));
        c != cudaSuccess)
      return c;
  return cudaFuncSetAttribute(head_backward_inputs_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(max_shared_bytes));
}

}  // namespace dqn::cuda
