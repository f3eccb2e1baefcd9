/** @file disagreement_ops.cpp
 *  @brief The ensemble disagreement's argument checks, its dispatch, and its host half: plain
 *  loops in double, the reference every device result is checked against.
 */
#include "disagreement_ops.hpp"

#include <cmath>
#include <cstdint>

#include "dqn/own_ops.hpp"

namespace dqn {
namespace {

template <class T>
void disagreement_host(Real out, Real q, int K, int B, int n) {
  const T* Q = q.as<T>();
  T* O = out.as<T>();
  const std::int64_t member = static_cast<std::int64_t>(B) * n;
  for (int b = 0; b < B; ++b) {
    double acc = 0.0;
    for (int j = 0; j < n; ++j) {
      const std::int64_t at = static_cast<std::int64_t>(b) * n + j;
      double mean = 0.0;
      for (int k = 0; k < K; ++k) mean += static_cast<double>(Q[k * member + at]);
      mean /= K;
      double var = 0.0;
      for (int k = 0; k < K; ++k) {
        const double dev = static_cast<double>(Q[k * member + at]) - mean;
        var += dev * dev;
      }
      acc += std::sqrt(var / K);
    }
    O[b] = static_cast<T>(acc / n);
  }
}

}  // namespace

void ensemble_disagreement(Backend& be, Real out, Real q, int K, int B, int n) noexcept {
  constexpr const char* op = "ensemble_disagreement";
  if (K <= 0 || B < 0 || n <= 0) return be.fail(op, "need K, n >= 1, B >= 0");
  if (B == 0) return;
  if (!real_arg(be, op, out, "out") || !real_arg(be, op, q, "q")) return;
  if (const DeviceContext* ctx = be.device()) {
#if DQN_WITH_CUDA
    return ensemble_disagreement_cuda(be, *ctx, out, q, K, B, n);
#else
    (void)ctx;
    return no_device_code(be, op);
#endif
  }
  with_host_real(be, [&](auto zero) { disagreement_host<decltype(zero)>(out, q, K, B, n); });
}

}  // namespace dqn
