/** @file dist_device.cuh
 *  @brief Device math of the distributional dueling head's output (compile with nvcc), shared by
 *  the engine's dueling_dist kernels and heads' own kernels that read the same distributions: the
 *  arithmetic type's exp and log, and a warp holding a (row, branch)'s value and advantages in
 *  registers (lane l holds atoms l, l + 32, … of every action) with its dueling logits.
 */
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "dqn/device.cuh"

namespace dqn::dev {

/// The distribution kernels' arithmetic type: double (fp32 pipelines: as the CPU twin, which
/// computes these in double) or float (tf32 and bf16 pipelines, whose GEMM operands already round
/// at 5e-4 and 4e-3 relative: float's 6e-8 is lost beneath them, and float exp/log cost a
/// fraction of double's on the GPU).
__device__ __forceinline__ double exp_t(double x) { return exp(x); }
__device__ __forceinline__ float exp_t(float x) { return expf(x); }
__device__ __forceinline__ double log_t(double x) { return log(x); }
__device__ __forceinline__ float log_t(float x) { return logf(x); }

/// A warp holding a (row, branch) in registers: kWarpAtoms atoms a lane, at most kWarpMaxA actions.
constexpr int kWarpAtoms = 2;
constexpr int kWarpMaxA = 8;
__host__ __device__ inline bool warp_head_fits(int A, int Z) { return Z <= 32 * kWarpAtoms && A <= kWarpMaxA; }

/// Butterfly over the lanes for the first n of K values at once (their shuffles interleaved):
/// each value as warp_sum / warp_max would give it.
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

}  // namespace dqn::dev
