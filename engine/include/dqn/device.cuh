/** @file device.cuh
 *  @brief What a head's own CUDA kernels need (compile with nvcc): the launch through the
 *  backend's DeviceContext (its stream, programmatic dependent launch, nothing while the engine
 *  plans), the entry every such kernel starts with, fixed-order warp and block reductions, and the
 *  "last block done" handshake of single-launch reductions. The engine's own kernels use the same.
 */
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "dqn/backend.hpp"

namespace dqn::dev {

/// Programmatic dependent launch. A kernel launched through dqn::launch starts with pdl_entry():
/// it waits until every kernel it depends on has finished and their writes are visible
/// (griddepcontrol.wait), then lets the next kernel of its stream place its blocks
/// (griddepcontrol.launch_dependents), which wait in turn. So a kernel's launch and block
/// placement overlap the kernel before it instead of following its end. Launched without the
/// attribute, both instructions do nothing.
__device__ __forceinline__ void pdl_entry() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/// The launch attribute that lets a kernel start while the previous one of its stream runs (it
/// must begin with pdl_entry()).
inline cudaLaunchAttribute pdl_attribute() {
  cudaLaunchAttribute a{};
  a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  a.val.programmaticStreamSerializationAllowed = 1;
  return a;
}

/// kernel<<<grid, block, shmem, s>>>(args...), with programmatic stream serialization when
/// `pdl` (the kernel must then begin with pdl_entry()). Returns the launch's error (also left as
/// the last error, as <<<>>> does).
template <class... P, class... A>
cudaError_t launch_on(cudaStream_t s, bool pdl, void (*kernel)(P...), dim3 grid, dim3 block, std::size_t shmem,
                      A&&... args) {
  cudaLaunchAttribute attr = pdl_attribute();
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = shmem;
  cfg.stream = s;
  cfg.attrs = &attr;
  cfg.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...);
}

__device__ __forceinline__ std::int64_t grid_start() {
  return static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::int64_t grid_step() {
  return static_cast<std::int64_t>(gridDim.x) * blockDim.x;
}

/// Butterfly sums and maximum: every lane ends with the same value, in a fixed order.
__device__ __forceinline__ double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
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
/// arrives last (it then sees every other block's writes). `counter` must be 0 before the launch
/// (a buffer the head declared: the registry starts it at 0); the last block resets it, so the
/// next kernel (stream-ordered) finds it at 0 again.
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

/// Blocks of `threads` for a grid-stride loop over n elements (at least 1, at most 2^20).
inline unsigned blocks_for(std::int64_t n, int threads) {
  const std::int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : b > (std::int64_t{1} << 20) ? (std::int64_t{1} << 20) : b);
}

/// Calls body(I{}) with I = std::uint32_t when every index of an n-element grid-stride loop
/// (plus one grid's stride) fits 32 bits, else with I = std::int64_t (32-bit division is several
/// times cheaper).
template <class F>
void with_index_type(std::int64_t n, F&& body) {
  if (n >= 0 && n < (std::int64_t{1} << 31))
    body(std::uint32_t{});
  else
    body(std::int64_t{});
}

/// For each member k in order, loss (=, or += when accumulating or after the first member) scale ·
/// (1/B) Σ_b weighted[k·B + b], summed in a fixed order for a given block size (every thread of
/// the block calls it; `sh` holds 32 doubles): the batch mean of per-sample losses a loss kernel
/// left in scratch, in one block (or in the last block of that kernel: last_block).
__device__ inline void batch_mean(float* loss, const double* weighted, int B, float scale, bool accumulate, int members,
                                  double* sh) {
  for (int k = 0; k < members; ++k) {
    double acc = 0.0;
    for (int b = threadIdx.x; b < B; b += blockDim.x) acc += __ldcg(weighted + static_cast<std::int64_t>(k) * B + b);
    const double total = block_sum(acc, sh);
    if (threadIdx.x == 0) {
      const double l = static_cast<double>(scale) * total / B;
      *loss = static_cast<float>(accumulate || k > 0 ? static_cast<double>(*loss) + l : l);
    }
    __syncthreads();
  }
}

}  // namespace dqn::dev

namespace dqn {

/// The stream of a device backend's context.
inline cudaStream_t stream_of(const DeviceContext& ctx) { return static_cast<cudaStream_t>(ctx.stream); }

/// A head's kernel on the stage's stream: programmatic dependent launch where the context allows
/// it for `shmem` bytes of dynamic shared memory (the kernel must begin with dev::pdl_entry()),
/// and nothing at all while the engine plans (cudaSuccess).
template <class... P, class... A>
cudaError_t launch(const DeviceContext& ctx, void (*kernel)(P...), dim3 grid, dim3 block, std::size_t shmem,
                   A&&... args) {
  if (ctx.planning) return cudaSuccess;
  const bool pdl = ctx.pdl_max_shared >= 0 && shmem <= static_cast<std::size_t>(ctx.pdl_max_shared);
  return dev::launch_on(stream_of(ctx), pdl, kernel, grid, block, shmem, std::forward<A>(args)...);
}

/// Records a failed launch on the backend as op's failure; true when e is cudaSuccess.
inline bool launched(Backend& be, const char* op, cudaError_t e) noexcept {
  if (e == cudaSuccess) return true;
  be.fail(op, cudaGetErrorString(e));
  return false;
}

}  // namespace dqn
