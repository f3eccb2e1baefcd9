/** @file head_kernels.cu
 *  @brief The fused head kernels: the dueling distribution (combine, log-softmax, expected Q and
 *  the double-DQN argmax in one pass) and the C51 loss from the target head's outputs to the
 *  dueling gradients. Each reproduces, operation for operation, the unfused kernels it replaces
 *  (same roundings, same fixed summation orders), so it matches the CPU twin as closely as they did.
 */
#include <algorithm>
#include <cmath>

#include "cuda_kernels.cuh"
#include "device_util.cuh"
#include "head_kernels.cuh"
#include "kernel_common.cuh"

namespace dqn::cuda {
namespace {

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

// --- warp-per-(row, branch) variants --------------------------------------------------------
// The same arithmetic as dueling_dist_kernel and c51_loss_kernel, with one warp per (row, branch)
// holding all its atoms and actions in registers: every load of a (row, branch) is issued at once
// and the reductions are warp shuffles, with no block barrier until the branches of a sample meet
// (c51: dv and the sample's loss). Used while Z ≤ 32·kWarpAtoms and A ≤ kWarpMaxA (and, for c51,
// D ≤ kLossMaxWarps warps a block); beyond, the block kernels above.
constexpr int kWarpAtoms = 2;          // atoms per lane
constexpr int kWarpMaxA = 8;           // actions held in registers
constexpr int kDistWarpsPerBlock = 4;  // dueling_dist_warp: (row, branch) pairs per block
/// dueling_dist runs a warp per action (dueling_dist_action_kernel) up to this many (row, branch) pairs.
constexpr std::int64_t kDistPerActionPairs = 2048;

__host__ __device__ inline bool warp_head_fits(int A, int Z) { return Z <= 32 * kWarpAtoms && A <= kWarpMaxA; }

constexpr int kLossMaxWarps = 16;  // c51_loss_warp: branches (warps) per block
constexpr int kLossPairMax = 8;    // c51_loss_warp with two warps a branch: branches per block

bool c51_warp(int D, int A, int Z) { return warp_head_fits(A, Z) && D <= kLossMaxWarps; }

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

/// dueling_dist with a warp per (row, branch, action) and a block per (row, branch) (32·A threads;
/// where the step has few (row, branch) pairs, kDistPerActionPairs): each warp loads its row's v and every action's advantages (the mean
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
    if (star_ok) mm[k] = static_cast<float>(project_atom(p, tz, Z, v_min + i * dz, dz));
    m[i] = mm[k];
    if (taken_ok) {
      xs -= static_cast<T>(mm[k]) * static_cast<T>(lpv[k]);
      m_sum += static_cast<T>(mm[k]);
    }
  }
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

cudaError_t dueling_dist(cudaStream_t s, const DuelingDist& a, bool double_math) {
  const double dz_w = support_step(a.v_min, a.v_max, a.Z);
  // a warp per action where there are few (row, branch) pairs (the C51 primary's 512 rows × 3
  // branches at B = 256 fill the GPU that way; the ensemble's 1,024 × 3 are faster a warp each)
  const bool per_action = static_cast<std::int64_t>(a.rows) * a.D <= kDistPerActionPairs;
  if (warp_head_fits(a.A, a.Z) && per_action) {
    const auto blocks = static_cast<unsigned>(static_cast<std::int64_t>(a.rows) * a.D);
    if (double_math)
      launch(dueling_dist_action_kernel<double>, blocks, 32 * a.A, 0, s, a, dz_w);
    else
      launch(dueling_dist_action_kernel<float>, blocks, 32 * a.A, 0, s, a, dz_w);
    return cudaGetLastError();
  }
  if (warp_head_fits(a.A, a.Z)) {
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

cudaError_t c51_loss(cudaStream_t s, const C51Loss& a, void* scratch, unsigned* counter, bool double_math) {
  auto* w = static_cast<double*>(scratch);
  if (c51_warp(a.D, a.A, a.Z)) {
    const double dz_w = support_step(a.v_min, a.v_max, a.Z);
    const std::size_t shmem = c51_loss_warp_shared_bytes(a.D, a.Z, double_math ? sizeof(double) : sizeof(float));
    // two warps a (sample, branch) where the block has room (D ≤ kLossPairMax), else one
    if (a.D <= kLossPairMax) {
      if (double_math)
        launch(c51_loss_warp_kernel<double, 2>, a.B, 64 * a.D, shmem, s, a, dz_w, w, counter);
      else
        launch(c51_loss_warp_kernel<float, 2>, a.B, 64 * a.D, shmem, s, a, dz_w, w, counter);
    } else if (double_math) {
      launch(c51_loss_warp_kernel<double, 1>, a.B, 32 * a.D, shmem, s, a, dz_w, w, counter);
    } else {
      launch(c51_loss_warp_kernel<float, 1>, a.B, 32 * a.D, shmem, s, a, dz_w, w, counter);
    }
    return cudaGetLastError();
  }
  const LossShape sh = loss_shape(a.D, a.Z);
  const double dz = support_step(a.v_min, a.v_max, a.Z);
  const std::size_t shmem = c51_loss_shared_bytes(a.D, a.A, a.Z);
  if (double_math)
    launch(c51_loss_kernel<double>, a.B, sh.tpb * sh.slots, shmem, s, a, dz, sh, w, counter);
  else
    launch(c51_loss_kernel<float>, a.B, sh.tpb * sh.slots, shmem, s, a, dz, sh, w, counter);
  return cudaGetLastError();
}

}  // namespace dqn::cuda
