/** @file device_util.cuh
 *  @brief Device helpers shared by the kernel files: grid-stride indices, fixed-order warp and
 *  block reductions, and the "last block done" handshake for single-launch reductions.
 */
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dqn::cuda::dev {

/// Whether p lies on a 16-byte boundary (float4 loads, 16-byte cp.async).
__host__ __device__ inline bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

__device__ __forceinline__ std::int64_t grid_start() {
  return static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::int64_t grid_step() {
  return static_cast<std::int64_t>(gridDim.x) * blockDim.x;
}

/// Butterfly sum: every lane ends with the same value, in a fixed order.
__device__ __forceinline__ double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
/// `sh` holds 32 doubles. Safe to call repeatedly with the same `sh`.
__device__ inline double block_sum(double v, double* sh) {
  v = warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  if (warp == 0) {
    double r = lane < nwarps ? sh[lane] : 0.0;
    r = warp_sum(r);
    if (lane == 0) sh[0] = r;
  }
  __syncthreads();
  return sh[0];
}

/// Call from every thread after the block's results are written: true in the one block that
/// arrives last (it then sees every other block's writes). `counter` must be 0 before the launch;
/// the last block resets it, so the next kernel (stream-ordered) finds it at 0 again.
__device__ inline bool last_block(unsigned* counter) {
  __shared__ bool is_last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned prev = atomicAdd(counter, 1u);
    is_last = prev == gridDim.x * gridDim.y * gridDim.z - 1;
    if (is_last) *counter = 0u;
  }
  __syncthreads();
  if (is_last) __threadfence();
  return is_last;
}

}  // namespace dqn::cuda::dev
