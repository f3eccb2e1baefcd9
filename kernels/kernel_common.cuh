/** @file kernel_common.cuh
 *  @brief What the kernel files share (private to kernels/): the block size, grid sizing, the
 *  index type of a grid-stride loop, the support step of a distribution, a batch's weighted mean.
 */
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "device_util.cuh"

namespace dqn::cuda {
namespace {

constexpr int kThreads = 256;


inline unsigned blocks_for(std::int64_t n, int threads = kThreads) {
  const std::int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::clamp<std::int64_t>(b, 1, std::int64_t{1} << 20));
}

/// Calls body(I{}) with I = std::uint32_t when every index of an n-element grid-stride loop
/// (plus one grid's stride) fits 32 bits, else with I = std::int64_t.
template <class F>
void with_index_type(std::int64_t n, F&& body) {
  if (n >= 0 && n < (std::int64_t{1} << 31))
    body(std::uint32_t{});
  else
    body(std::int64_t{});
}

using dev::aligned16;
using dev::block_sum;
using dev::grid_start;
using dev::grid_step;
using dev::launch;
using dev::warp_max;
using dev::warp_sum;


inline std::size_t round_up(std::size_t x, std::size_t a) { return (x + a - 1) / a * a; }

/// Δz of Z atoms on [v_min, v_max] (0 for a single atom), in double.
inline double support_step(float v_min, float v_max, int Z) {
  return Z > 1 ? (static_cast<double>(v_max) - static_cast<double>(v_min)) / (Z - 1) : 0.0;
}

/// For each member k in order, loss (=, or += when accumulating or after the first member) scale ·
/// (1/B) Σ_b weighted[k·B + b], summed in a fixed order for a given block size (every thread of
/// the block calls it; `sh` holds 32 doubles): what weighted_means_kernel runs, and the last block
/// of the kernels that fill `weighted` where they do it themselves (c51_xent, quantile_huber with a
/// counter).
__device__ inline void weighted_mean(float* loss, const double* weighted, int B, float scale, bool accumulate, int members,
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

}  // namespace

/// loss (=, or += when accumulating or after the first member) scale · (1/B) Σ_b weighted[k·B +
/// b] for each of `members` in order, in one block (weighted_mean above): the batch means of the
/// per-sample losses a loss kernel left in scratch (c51_xent, quantile_huber).
cudaError_t weighted_means(cudaStream_t s, float* loss, const double* weighted, int B, float scale, bool accumulate,
                           int members);

}  // namespace dqn::cuda
