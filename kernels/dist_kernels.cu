/** @file dist_kernels.cu
 *  @brief The distributional head's unfused ops: dueling combine and backward, log-softmax, the
 *  expected Q with its backward, and the argmax.
 */
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cuda_kernels.cuh"
#include "kernel_common.cuh"

namespace dqn::cuda {
namespace {

// --- distributional head --------------------------------------------------------------------

/// One thread per (b, d, atom): the mean over actions is read before any of them is written, so
/// logits may alias adv.
__global__ void dueling_combine_kernel(float* logits, const float* v, int ldv, const float* adv, int rows,
                                       int D, int A, int Z) {
  dev::pdl_entry();
  const std::int64_t n = static_cast<std::int64_t>(rows) * D * Z;
  for (std::int64_t k = grid_start(); k < n; k += grid_step()) {
    const std::int64_t b = k / (static_cast<std::int64_t>(D) * Z);
    const int rem = static_cast<int>(k - b * D * Z), d = rem / Z, i = rem - d * Z;
    const std::int64_t base = (b * D + d) * A * Z + i;
    double mean = 0.0;
    for (int a = 0; a < A; ++a) mean += static_cast<double>(adv[base + a * Z]);
    mean /= A;
    const double vi = v[b * ldv + i];
    for (int a = 0; a < A; ++a)
      logits[base + a * Z] = static_cast<float>(vi + static_cast<double>(adv[base + a * Z]) - mean);
  }
}

/// One thread per (b, atom), same summation order as the CPU twin; each branch's entries are
/// all read before they are written, so dadv may alias dlogits (when compact: lddadv == A·Z).
__global__ void dueling_backward_kernel(float* dv, int lddv, float* dadv, int lddadv, const float* dl, int rows,
                                        int D, int A, int Z) {
  dev::pdl_entry();
  const std::int64_t n = static_cast<std::int64_t>(rows) * Z;
  for (std::int64_t k = grid_start(); k < n; k += grid_step()) {
    const std::int64_t b = k / Z;
    const int i = static_cast<int>(k - b * Z);
    const std::int64_t row = b * D * A * Z + i;
    double total = 0.0;
    for (int d = 0; d < D; ++d)
      for (int a = 0; a < A; ++a) total += static_cast<double>(dl[row + (d * A + a) * Z]);
    dv[b * lddv + i] = static_cast<float>(total);
    for (int d = 0; d < D; ++d) {
      double mean = 0.0;
      for (int a = 0; a < A; ++a) mean += static_cast<double>(dl[row + (d * A + a) * Z]);
      mean /= A;
      const std::int64_t drow = (b * D + d) * lddadv + i;
      for (int a = 0; a < A; ++a) {
        const std::int64_t j = row + (d * A + a) * Z;
        dadv[drow + a * Z] = static_cast<float>(static_cast<double>(dl[j]) - mean);
      }
      for (int q = A * Z + i; q < lddadv; q += Z) dadv[drow - i + q] = 0.0f;  // the block's padding
    }
  }
}

/// One warp per row.
__global__ void log_softmax_kernel(float* logp, const float* x, int rows, int n) {
  dev::pdl_entry();
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * (blockDim.x >> 5);
  const int lane = threadIdx.x & 31;
  for (std::int64_t r = grid_start() >> 5; r < rows; r += warps) {
    const float* xr = x + r * n;
    float* yr = logp + r * n;
    float mx = -INFINITY;
    for (int i = lane; i < n; i += 32) mx = fmaxf(mx, xr[i]);
    mx = warp_max(mx);
    // A row of NaN: fmaxf skips NaN, the CPU's std::max keeps the first element; both end NaN below.
    double sum = 0.0;
    for (int i = lane; i < n; i += 32) sum += exp(static_cast<double>(xr[i]) - mx);
    sum = warp_sum(sum);
    const double lse = static_cast<double>(mx) + log(sum);
    for (int i = lane; i < n; i += 32) yr[i] = static_cast<float>(static_cast<double>(xr[i]) - lse);
  }
}

/// One warp per row: q = Σ z_i exp(logp_i).
__global__ void expected_q_kernel(float* q, const float* logp, int rows, int Z, float v_min, double dz) {
  dev::pdl_entry();
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * (blockDim.x >> 5);
  const int lane = threadIdx.x & 31;
  for (std::int64_t r = grid_start() >> 5; r < rows; r += warps) {
    double acc = 0.0;
    for (int i = lane; i < Z; i += 32)
      acc += (static_cast<double>(v_min) + i * dz) * exp(static_cast<double>(logp[r * Z + i]));
    acc = warp_sum(acc);
    if (lane == 0) q[r] = static_cast<float>(acc);
  }
}

__global__ void argmax_kernel(std::int32_t* idx, const float* q, int rows, int n) {
  dev::pdl_entry();
  for (std::int64_t r = grid_start(); r < rows; r += grid_step()) {
    const float* row = q + r * n;
    int best = 0;
    for (int a = 1; a < n; ++a)
      if (row[a] > row[best]) best = a;  // strict: ties keep the lowest index
    idx[r] = best;
  }
}

/// One warp per row: Q = Σ z_i p_i (warp sum), then dlogits_i = dq · p_i (z_i − Q).
__global__ void expected_q_backward_kernel(float* dlogits, const float* dq, const float* logp, int rows, int Z,
                                           float v_min, double dz) {
  dev::pdl_entry();
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * (blockDim.x >> 5);
  const int lane = threadIdx.x & 31;
  for (std::int64_t r = grid_start() >> 5; r < rows; r += warps) {
    const float* lp = logp + r * Z;
    double q = 0.0;
    for (int i = lane; i < Z; i += 32) q += (static_cast<double>(v_min) + i * dz) * exp(static_cast<double>(lp[i]));
    q = warp_sum(q);
    const double g = dq[r];
    for (int i = lane; i < Z; i += 32)
      dlogits[r * Z + i] =
          static_cast<float>(g * exp(static_cast<double>(lp[i])) * ((static_cast<double>(v_min) + i * dz) - q));
  }
}

}  // namespace

cudaError_t dueling_combine(cudaStream_t s, float* logits, const float* v, int ldv, const float* adv, int rows,
                            int D, int A, int Z) {
  launch(dueling_combine_kernel, blocks_for(static_cast<std::int64_t>(rows) * D * Z), kThreads, 0, s,
         logits, v, ldv, adv, rows, D, A, Z);
  return cudaGetLastError();
}

cudaError_t dueling_backward(cudaStream_t s, float* dv, int lddv, float* dadv, int lddadv, const float* dlogits,
                             int rows, int D, int A, int Z) {
  launch(dueling_backward_kernel, blocks_for(static_cast<std::int64_t>(rows) * Z), kThreads, 0, s,
         dv, lddv, dadv, lddadv, dlogits, rows, D, A, Z);
  return cudaGetLastError();
}

cudaError_t log_softmax(cudaStream_t s, float* logp, const float* x, int rows, int n) {
  launch(log_softmax_kernel, blocks_for(static_cast<std::int64_t>(rows) * 32), kThreads, 0, s, logp, x, rows, n);
  return cudaGetLastError();
}

cudaError_t expected_q(cudaStream_t s, float* q, const float* logp, int rows, int Z, float v_min, float v_max) {
  launch(expected_q_kernel, blocks_for(static_cast<std::int64_t>(rows) * 32), kThreads, 0, s,
         q, logp, rows, Z, v_min, support_step(v_min, v_max, Z));
  return cudaGetLastError();
}

cudaError_t argmax(cudaStream_t s, std::int32_t* idx, const float* q, int rows, int n) {
  launch(argmax_kernel, blocks_for(rows), kThreads, 0, s, idx, q, rows, n);
  return cudaGetLastError();
}

cudaError_t expected_q_backward(cudaStream_t s, float* dlogits, const float* dq, const float* logp, int rows, int Z,
                                float v_min, float v_max) {
  launch(expected_q_backward_kernel, blocks_for(static_cast<std::int64_t>(rows) * 32), kThreads, 0, s,
         dlogits, dq, logp, rows, Z, v_min, support_step(v_min, v_max, Z));
  return cudaGetLastError();
}

}  // namespace dqn::cuda
