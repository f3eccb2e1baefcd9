/** @file disagreement_ops.cu
 *  @brief The ensemble disagreement's device half: a warp per sample, reproducing the host twin's
 *  arithmetic (in double; the columns summed per lane in order, then a fixed-order warp sum).
 *  Launched on the stage's stream through the SDK (dqn/device.cuh).
 */
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "disagreement_ops.hpp"
#include "dqn/device.cuh"

namespace dqn {
namespace {

constexpr int kThreads = 256;

/// One warp per sample: each lane takes columns j, the K members in order, then a warp sum.
__global__ void ensemble_disagreement_kernel(float* out, const float* q, int K, int B, int n) {
  dev::pdl_entry();
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * (blockDim.x >> 5);
  const int lane = threadIdx.x & 31;
  const std::int64_t member = static_cast<std::int64_t>(B) * n;
  for (std::int64_t b = dev::grid_start() >> 5; b < B; b += warps) {
    double acc = 0.0;
    for (int j = lane; j < n; j += 32) {
      const std::int64_t at = b * n + j;
      double mean = 0.0;
      for (int k = 0; k < K; ++k) mean += static_cast<double>(q[k * member + at]);
      mean /= K;
      double var = 0.0;
      for (int k = 0; k < K; ++k) {
        const double dev = static_cast<double>(q[k * member + at]) - mean;
        var += dev * dev;
      }
      acc += sqrt(var / K);
    }
    acc = dev::warp_sum(acc);
    if (lane == 0) out[b] = static_cast<float>(acc / n);
  }
}

}  // namespace

void ensemble_disagreement_cuda(Backend& be, const DeviceContext& ctx, Real out, Real q, int K, int B,
                                int n) noexcept {
  launched(be, "ensemble_disagreement",
           launch(ctx, ensemble_disagreement_kernel, dev::blocks_for(static_cast<std::int64_t>(B) * 32, kThreads),
                  kThreads, 0, out.as<float>(), q.as<const float>(), K, B, n));
}

}  // namespace dqn
