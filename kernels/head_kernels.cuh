/** @file head_kernels.cuh
 *  @brief Launchers of the head kernels (head_kernels.cu). Sizes are validated by the
 *  caller (CudaBackend); here they are trusted.
 */
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "dqn/backend.hpp"

namespace dqn::cuda {

/// Dynamic shared memory dueling_dist needs (must stay under the default 48 KiB).
std::size_t dueling_dist_shared_bytes(int Z);
/// double_math: the distribution in double (fp32 pipelines, as the CPU twin); else in float.
/// While Z ≤ 64 and A ≤ 8: a warp per action and a block per (row, branch) where rows·D ≤ 2,048,
/// else a warp per (row, branch); beyond, a block per (row, branch). The same results bit for bit.
cudaError_t dueling_dist(cudaStream_t s, const DuelingDist& a, bool double_math);

/// relu_backward + bias_grad for `heads` gradients sharing the activation y (grid: tiles × heads);
/// db null: the masks alone (element-parallel).
cudaError_t relu_bias_grad(cudaStream_t s, float* dy, const float* y, float* db, int rows, int cols, int ld,
                           int heads, std::int64_t stride_dy, std::int64_t stride_y, std::int64_t stride_db);

}  // namespace dqn::cuda
