/** @file device_util.cuh
 *  @brief Device helpers of the kernel files beyond the SDK's (dqn/device.cuh: reductions, the
 *  entry and launch): the launch by the stream's policy, asynchronous copies to shared memory,
 *  tf32 rounding, alignment and four-wide ReLU masks.
 */
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "cuda_kernels.cuh"
#include "dqn/device.cuh"

namespace dqn::cuda::dev {

using ::dqn::dev::block_sum;
using ::dqn::dev::grid_start;
using ::dqn::dev::grid_step;
using ::dqn::dev::last_block;
using ::dqn::dev::pdl_attribute;
using ::dqn::dev::pdl_entry;
using ::dqn::dev::warp_max;
using ::dqn::dev::warp_sum;

/// Every kernel of kernels/ launches through this and starts with pdl_entry() (dqn/device.cuh):
/// kernel<<<grid, block, shmem, s>>>(args...), with programmatic stream serialization where
/// pdl_for(shmem, s) (the stream's policy: set_stream_pdl).
template <class... P, class... A>
cudaError_t launch(void (*kernel)(P...), dim3 grid, dim3 block, std::size_t shmem, cudaStream_t s, A&&... args) {
  return ::dqn::dev::launch_on(s, pdl_for(shmem, s), kernel, grid, block, shmem, std::forward<A>(args)...);
}

/// The shared-memory window address of p (a pointer into this block's shared memory), as the
/// PTX instructions on shared memory take it.
__device__ __forceinline__ unsigned smem_addr(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }

/// 4 bytes global → shared, asynchronously (cp.async); valid false: nothing is read, the
/// destination is zero-filled.
__device__ __forceinline__ void cp_async4(float* dst, const float* src, bool valid) {
  const int n = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(n));
}
/// 16 bytes, of which the first `bytes` (0, 4, 8, 12 or 16) are read and the rest zero-filled.
__device__ __forceinline__ void cp_async16(float* dst, const float* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
/// Waits until at most N of this thread's committed groups are still in flight (a barrier must
/// follow before other threads read what they copied).
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
/// x rounded to tf32 (to nearest, ties away from zero), as the mma operand's 32-bit word.
__device__ __forceinline__ std::uint32_t to_tf32(float x) {
  std::uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}

/// Whether p lies on a 16-byte boundary (float4 loads, 16-byte cp.async).
__host__ __device__ inline bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

/// The ReLU backward of four consecutive elements (16-byte aligned): dy zeroed where y <= 0, the
/// others stored back unchanged.
__device__ __forceinline__ void relu_mask4(float* dy, const float* y) {
  const float4 yv = *reinterpret_cast<const float4*>(y);
  float4 d = *reinterpret_cast<float4*>(dy);
  if (yv.x <= 0.0f) d.x = 0.0f;
  if (yv.y <= 0.0f) d.y = 0.0f;
  if (yv.z <= 0.0f) d.z = 0.0f;
  if (yv.w <= 0.0f) d.w = 0.0f;
  *reinterpret_cast<float4*>(dy) = d;
}

}  // namespace dqn::cuda::dev
