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
std::size_t dueling_dist_shared_bytes(int Z, int A);
/// double_math: the distribution in double (fp32 pipelines, as the CPU twin); else in float.
/// While Z ≤ 64 and A ≤ 8: a warp per action and a block per (row, branch) where rows·D ≤ 2,048,
/// else a warp per (row, branch); beyond, a block per (row, branch). The same results bit for bit.
cudaError_t dueling_dist(cudaStream_t s, const DuelingDist& a, bool double_math);

/// Scratch c51_loss needs (one double per sample) and its dynamic shared memory.
std::size_t c51_loss_scratch_bytes(int B);
std::size_t c51_loss_shared_bytes(int D, int A, int Z);
/// `counter`: a device word that is 0 and that no concurrently running kernel uses; null where
/// a.loss is (no last block sums the batch).
/// double_math: as dueling_dist's. While Z ≤ 64, A ≤ 8 and D ≤ 16 a warp kernel: two warps a
/// (sample, branch) where D ≤ 8, each with one of the two atoms a lane holds (the sums over atoms
/// add the two warps' partial sums), else one; beyond, a block per sample.
cudaError_t c51_loss(cudaStream_t s, const C51Loss& a, void* scratch, unsigned* counter, bool double_math);

/// relu_backward + bias_grad for `heads` gradients sharing the activation y (grid: tiles × heads);
/// db null: the masks alone (element-parallel).
cudaError_t relu_bias_grad(cudaStream_t s, float* dy, const float* y, float* db, int rows, int cols, int ld,
                           int heads, std::int64_t stride_dy, std::int64_t stride_y, std::int64_t stride_db);

}  // namespace dqn::cuda
