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
/// A warp per (row, branch) while Z ≤ 64 and A ≤ 8 (the same arithmetic; DQN_WARP_HEAD=0 keeps
/// the block per (row, branch)); c51_loss likewise while also D ≤ 16.
/// per_action (DQN_WARP_HEAD=action): where the warp kernels fit, a warp per action and a block
/// per (row, branch) instead of a warp per (row, branch); the same results bit for bit.
cudaError_t dueling_dist(cudaStream_t s, const DuelingDist& a, bool double_math, bool per_action = false);

/// Scratch c51_loss needs (one double per sample) and its dynamic shared memory.
std::size_t c51_loss_scratch_bytes(int B);
std::size_t c51_loss_shared_bytes(int D, int A, int Z);
/// `counter`: a device word that is 0 and that no concurrently running kernel uses; null where
/// a.loss is (no last block sums the batch).
/// double_math: as dueling_dist's.
/// pair (the backend's default; DQN_LOSS_WARPS=1 turns it off): where the warp kernel runs and D ≤ 8, two warps a (sample, branch),
/// each with one of the two atoms a lane holds (the sums over atoms add the two warps' partial
/// sums: equal within rounding, not bit for bit).
cudaError_t c51_loss(cudaStream_t s, const C51Loss& a, void* scratch, unsigned* counter, bool double_math,
                     bool pair = false);

/// relu_backward + bias_grad for `heads` gradients sharing the activation y (grid: tiles × heads);
/// db null: the masks alone (element-parallel).
cudaError_t relu_bias_grad(cudaStream_t s, float* dy, const float* y, float* db, int rows, int cols, int ld,
                           int heads, std::int64_t stride_dy, std::int64_t stride_y, std::int64_t stride_db);

}  // namespace dqn::cuda
