/** @file head_kernels.cu
 *  @brief The fused head kernels: the dueling distribution (combine, log-softmax, expected Q and
 *  the double-DQN argmax in one pass) and the ReLU backward with bias gradients of several heads.
 *  Each reproduces, operation for operation, the unfused kernels it replaces (same roundings, same
 *  fixed summation orders), so it matches the CPU twin as closely as they did.
 */
#include <algorithm>
#include <cmath>

#include "cuda_kernels.cuh"
#include "device_util.cuh"
#include "dqn/dist_device.cuh"
#include "head_kernels.cuh"
#include "kernel_common.cuh"

namespace dqn::cuda {
namespace {

using ::dqn::dev::action_logits;
using ::dqn::dev::exp_t;
using ::dqn::dev::kWarpAtoms;
using ::dqn::dev::kWarpMaxA;
using ::dqn::dev::load_dist_warp;
using ::dqn::dev::log_t;
using ::dqn::dev::warp_head_fits;
using ::dqn::dev::warp_reduce_n;

constexpr int kDistMaxWarps = 16;  // warps per block of the distribution kernel (one per action)

/// One block per (row, branch), one warp per action (actions beyond the warps loop). Shared:
/// the mean advantage of each atom [Z] (every warp sums a share of the actions) and each warp's
/// best action so far (value, index), so any
/// number of actions fits: a warp walks its actions in ascending order keeping the first maximum,
/// and thread 0 merges the warps the same way (the argmax a scan over all actions gives, ties and
/// NaN included: action 0 is always a candidate, a NaN never replaces one). T: see exp_t.
template <typename T>
__global__ void dueling_dist_kernel(DuelingDist a, double dz_d) {
  dev::pdl_entry();
  extern __shared__ double dd_shared[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int D = a.D, A = a.A, Z = a.Z;
  T* mean = reinterpret_cast<T*>(dd_shared);                    // [Z]
  float* wq = reinterpret_cast<float*>(dd_shared + Z);           // [warps]: a warp's best value
  int* wa = reinterpret_cast<int*>(wq + kDistMaxWarps);          // [warps]: its index (−1: none)
  const float* V = static_cast<const float*>(a.v.p);
  const float* ADV = static_cast<const float*>(a.adv.p);
  float* LP = static_cast<float*>(a.logp.p);
  float* Q = static_cast<float*>(a.q.p);
  const T v_min = a.v_min, dz = static_cast<T>(dz_d);
  const std::int64_t rd = blockIdx.x;
  const std::int64_t r = rd / D;
  const float* adv = ADV + rd * ld_or(a.ldadv, A * Z);
  const float* v = V + r * a.ldv;
  // the mean over actions, 32 atoms at a time: warp w sums actions w, w + warps, … of lane's atom,
  // then warp 0 adds the warps' sums in order (a fixed order: the same bits every run)
  __shared__ T part[kDistMaxWarps][32];
  for (int i0 = 0; i0 < Z; i0 += 32) {
    const int i = i0 + lane;
    T s = 0;
    if (i < Z)
      for (int act = warp; act < A; act += nwarps) s += static_cast<T>(adv[act * Z + i]);
    part[warp][lane] = s;
    __syncthreads();
    if (warp == 0 && i < Z) {
      T m = 0;
      for (int w = 0; w < nwarps; ++w) m += part[w][lane];
      mean[i] = m / A;
    }
    __syncthreads();
  }
  float best_q = -INFINITY;
  int best_a = -1;
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
    sum = warp_sum(sum);
    const T lse = static_cast<T>(mx) + log_t(sum);
    T qa = 0;
    for (int i = lane; i < Z; i += 32) {
      const float xi = static_cast<float>(static_cast<T>(v[i]) + static_cast<T>(x[i]) - mean[i]);
      const float l = static_cast<float>(static_cast<T>(xi) - lse);
      lp[i] = l;
      if (Q) qa += (v_min + i * dz) * exp_t(static_cast<T>(l));
    }
    if (Q) {
      qa = warp_sum(qa);
      if (lane == 0) {
        const float qf = static_cast<float>(qa);
        Q[rd * A + act] = qf;
        if (act == 0 || qf > best_q) {  // strict: ties keep the lowest index
          best_q = qf;
          best_a = act;
        }
      }
    }
  }
  if (!a.a_star || r < a.star_from) return;
  if (lane == 0) {
    wq[warp] = best_q;
    wa[warp] = best_a;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int best = wa[0];  // warp 0 holds action 0
    float qbest = wq[0];
    for (int w = 1; w < nwarps; ++w)
      if (wa[w] >= 0 && (wq[w] > qbest || (wq[w] == qbest && wa[w] < best))) {
        qbest = wq[w];
        best = wa[w];
      }
    a.a_star[(r - a.star_from) * D + (rd - r * D)] = best;
  }
}

// --- warp-per-(row, branch) variants --------------------------------------------------------
// The same arithmetic as dueling_dist_kernel, with one warp per (row, branch) holding all its atoms
// and actions in registers (dqn/dist_device.cuh): every load of a (row, branch) is issued at once
// and the reductions are warp shuffles. Used while Z ≤ 32·kWarpAtoms and A ≤ kWarpMaxA; beyond,
// the block kernel above.
constexpr int kDistWarpsPerBlock = 4;  // dueling_dist_warp: (row, branch) pairs per block
/// dueling_dist runs a warp per action (dueling_dist_action_kernel) up to this many (row, branch) pairs.
constexpr std::int64_t kDistPerActionPairs = 2048;

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
  sum = warp_sum(sum);
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
  qa = warp_sum(qa);
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

std::size_t dueling_dist_shared_bytes(int Z) {
  return static_cast<std::size_t>(Z) * sizeof(double) + kDistMaxWarps * (sizeof(float) + sizeof(int));
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
  const std::size_t shmem = dueling_dist_shared_bytes(a.Z);
  const double dz = support_step(a.v_min, a.v_max, a.Z);
  if (double_math)
    launch(dueling_dist_kernel<double>, static_cast<unsigned>(blocks), 32 * warps, shmem, s, a, dz);
  else
    launch(dueling_dist_kernel<float>, static_cast<unsigned>(blocks), 32 * warps, shmem, s, a, dz);
  return cudaGetLastError();
}

}  // namespace dqn::cuda
