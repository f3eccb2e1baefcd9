/** @file head_kernels.cuh
 *  @brief Launchers of the fused head kernels (head_kernels.cu). Sizes are validated by the
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
/// `counter`: a device word that is 0 and that no concurrently running kernel uses.
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

/// Rows of one block of the fused head kernels (one m16 tile of the tf32 mma); a launch has
/// ceil(rows / 16) × D blocks (head_forward) or × (1 + D) (head_backward_inputs).
inline constexpr int kHeadBlockRows = 16;

/// The fused head forward (tf32 mma): its dynamic shared memory for these sizes and the launch.
std::size_t head_forward_shared_bytes(int H2, int Hh, int A, int Z);
cudaError_t head_forward(cudaStream_t s, const HeadForward& a);
/// The cluster head forward (tf32 mma; head_forward's value and advantage layers, 2·(1 + D)
/// blocks per 32 rows, a cluster of two per stream sharing its weights; logp, q and a* are not
/// written: dueling_dist's): its dynamic shared memory and the launch.
std::size_t head_forward_cluster_shared_bytes(int H2, int Hh, int A, int Z);
/// warps: 8 or 16 a block (DQN_HC_WARPS); bulk: the weight rows by the bulk copy engine
/// (cp.async.bulk, one request a row) instead of 16-byte cp.async (DQN_HC_BULK).
cudaError_t head_forward_cluster(cudaStream_t s, const HeadForward& a, int warps, bool bulk);
/// The fused input side of the head's backward (head_backward_inputs): shared memory and launch.
std::size_t head_backward_inputs_shared_bytes(int Hh, int A, int Z);
cudaError_t head_backward_inputs(cudaStream_t s, const HeadBackward& a);
/// Both fused head kernels may use up to `max_shared_bytes` of shared memory (once, outside capture).
cudaError_t head_kernels_prepare(std::size_t max_shared_bytes);

}  // namespace dqn::cuda
