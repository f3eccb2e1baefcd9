/** @file cql_ops.cpp
 *  @brief The CQL penalty's argument checks, its dispatch, and its host half: plain loops in
 *  double, the reference every device result is checked against.
 */
#include "cql_ops.hpp"

#include <algorithm>
#include <cmath>

#include "dqn/own_ops.hpp"

namespace dqn {
namespace {

template <class T>
void cql_penalty_host(const CqlPenalty& a) {
  const T* Q = a.q.as<T>();
  T* DQ = a.dq.as<T>();
  const double scale = static_cast<double>(a.alpha) / (static_cast<double>(a.B) * a.D);
  double total = 0.0;
  for (int bd = 0; bd < a.B * a.D; ++bd) {
    const std::int64_t row = static_cast<std::int64_t>(bd) * a.A;
    double mx = Q[row];
    for (int k = 1; k < a.A; ++k) mx = std::max(mx, static_cast<double>(Q[row + k]));
    double sum = 0.0;
    for (int k = 0; k < a.A; ++k) sum += std::exp(static_cast<double>(Q[row + k]) - mx);
    const double lse = mx + std::log(sum);
    const int taken = a.actions[bd];
    total += lse - static_cast<double>(Q[row + taken]);
    // q may alias dq: every read of this row is done above, except Q[row+k] read before DQ[row+k].
    for (int k = 0; k < a.A; ++k) {
      const double soft = std::exp(static_cast<double>(Q[row + k]) - lse);
      DQ[row + k] = static_cast<T>(scale * (soft - (k == taken ? 1.0 : 0.0)));
    }
  }
  a.loss.as<T>()[0] = static_cast<T>(scale * total);
}

}  // namespace

void cql_penalty(Backend& be, const CqlPenalty& a) noexcept {
  constexpr const char* op = "cql_penalty";
  if (a.B < 0 || a.D < 0 || a.A <= 0) return be.fail(op, "need B, D >= 0, A >= 1");
  if (!real_arg(be, op, a.loss, "loss")) return;
  if (a.B == 0 || a.D == 0) return be.fill(a.loss, 0.0f, 1);
  if (!a.actions) return be.fail(op, "null actions");
  if (!real_arg(be, op, a.dq, "dq") || !real_arg(be, op, a.q, "q")) return;
  if (const DeviceContext* ctx = be.device()) {
    if (!a.sums) return be.fail(op, "null sums (the device scratch: cql_penalty_sums words)");
    // actions live on the device: an out-of-range index turns that row's dq and the loss into NaN
#if DQN_WITH_CUDA
    return cql_penalty_cuda(be, *ctx, a);
#else
    (void)ctx;
    return no_device_code(be, op);
#endif
  }
  for (int k = 0; k < a.B * a.D; ++k)
    if (a.actions[k] < 0 || a.actions[k] >= a.A) return be.fail(op, "action out of range");
  with_host_real(be, [&](auto zero) { cql_penalty_host<decltype(zero)>(a); });
}

}  // namespace dqn
