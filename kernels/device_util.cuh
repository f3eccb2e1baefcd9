/** @file device_util.cuh
 *  @brief Device helpers shared by the kernel files: grid-stride indices, fixed-order warp and
 *  block reductions, and the "last block done" handshake for single-launch reductions.
 */
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "cuda_kernels.cuh"

namespace dqn::cuda::dev {

/// Programmatic dependent launch. Every kernel of kernels/ launches through launch() below and
/// starts with pdl_entry(): it waits until every kernel it depends on has finished and their
/// writes are visible (griddepcontrol.wait), then lets the next kernel of its stream place its
/// blocks (griddepcontrol.launch_dependents), which wait in turn. So a kernel's launch and block
/// placement overlap the kernel before it instead of following its end. Launched without the
/// attribute (the stream's policy says no: set_stream_pdl), both instructions do nothing.
__device__ __forceinline__ void pdl_entry() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/// The launch attribute that lets a kernel start while the previous one of its stream runs
/// (it must begin with pdl_entry()).
inline cudaLaunchAttribute pdl_attribute() {
  cudaLaunchAttribute a{};
  a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  a.val.programmaticStreamSerializationAllowed = 1;
  return a;
}

/// kernel<<<grid, block, shmem, s>>>(args...), with programmatic stream serialization where
/// pdl_for(shmem, s). Returns the launch's error (also left as the last error, as <<<>>> does).
template <class... P, class... A>
cudaError_t launch(void (*kernel)(P...), dim3 grid, dim3 block, std::size_t shmem, cudaStream_t s, A&&... args) {
  cudaLaunchAttribute attr = pdl_attribute();
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = shmem;
  cfg.stream = s;
  cfg.attrs = &attr;
  cfg.numAttrs = pdl_for(shmem, s) ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...);
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
