/** @file qr_ops.cpp
 *  @brief The QR-DQN ops' argument checks, their dispatch, and their host half: plain loops that
 *  accumulate in double in a fixed order, the reference the device half (qr_ops.cu) follows
 *  operation for operation. The math is in qr_ops.hpp.
 */
#include "qr_ops.hpp"

#include <cmath>

#include "dqn/own_ops.hpp"

namespace dqn::qr {
namespace {

/// θ, Q and a* of every (row, branch). The mean over actions is taken per quantile before θ is
/// rounded to T; Q sums the rounded θ over the quantiles in order and is rounded to T; a* is the
/// argmax of the rounded Q (strict comparison: ties keep the lowest index), so it is the action
/// an argmax of the stored Q picks.
template <class T>
void values_host(const QrValues& a) {
  const int D = a.D, A = a.A, N = a.N;
  const std::int64_t ldadv = ld_or(a.ldadv, A * N);
  const T* V = a.v.as<T>();
  const T* Adv = a.adv.as<T>();
  for (int r = 0; r < a.rows; ++r) {
    const T* v = V + static_cast<std::int64_t>(r) * a.ldv;
    for (int d = 0; d < D; ++d) {
      const std::int64_t rd = static_cast<std::int64_t>(r) * D + d;
      const T* adv = Adv + rd * ldadv;
      int best = 0;
      T best_q = T(0);
      for (int act = 0; act < A; ++act) {
        double sum = 0.0;  // Σ_i θ[r,d,act,i]
        for (int i = 0; i < N; ++i) {
          double mean = 0.0;  // (1/A) Σ_a' adv[r,d,a',i]
          for (int k = 0; k < A; ++k) mean += static_cast<double>(adv[k * N + i]);
          mean /= A;
          const T th = static_cast<T>(static_cast<double>(v[i]) + static_cast<double>(adv[act * N + i]) - mean);
          if (a.theta) a.theta.as<T>()[(rd * A + act) * N + i] = th;
          sum += static_cast<double>(th);
        }
        const T q = static_cast<T>(sum / N);
        if (a.q) a.q.as<T>()[rd * A + act] = q;
        if (act == 0 || q > best_q) {
          best = act;
          best_q = q;
        }
      }
      if (a.a_star && r >= a.star_from) a.a_star[static_cast<std::int64_t>(r - a.star_from) * D + d] = best;
    }
  }
}

/// The loss of every sample and its gradient (qr_ops.hpp): per (b, d, i) the sum over the N
/// targets j in order; the sample's loss sums the (d, i) pairs in that order, then divides by D.
template <class T>
void loss_host(const QrLoss& a) {
  const int D = a.D, A = a.A, N = a.N;
  const double kappa = a.kappa;
  const T* TH = a.theta.as<T>();
  const T* TT = a.theta_target.as<T>();
  const T* W = a.weights.as<T>();
  T* DT = a.dtheta.as<T>();
  for (int b = 0; b < a.B; ++b) {
    const double discount = static_cast<double>(a.gamma_n) * (1.0 - static_cast<double>(a.dones.as<T>()[b]));
    const double reward = a.rewards.as<T>()[b];
    const double gscale = static_cast<double>(W[b]) / (static_cast<double>(a.B) * D * N * kappa);
    double sample = 0.0;
    for (int d = 0; d < D; ++d) {
      const int taken = a.actions[b * D + d], best = a.a_star[b * D + d];
      const std::int64_t base = (static_cast<std::int64_t>(b) * D + d) * A * N;  // θ[b,d,0,0]
      for (int i = 0; i < N; ++i) {
        const double tau = (2.0 * i + 1.0) / (2.0 * N);  // τ̂_i
        const double theta = TH[base + static_cast<std::int64_t>(taken) * N + i];
        double l = 0.0, g = 0.0;  // Σ_j |τ̂ − 1{δ<0}| L_κ(δ), Σ_j −|τ̂ − 1{δ<0}| ψ(δ)
        for (int j = 0; j < N; ++j) {
          const double target = reward + discount * static_cast<double>(TT[base + static_cast<std::int64_t>(best) * N + j]);
          const double delta = target - theta, ad = std::abs(delta);
          const double w = std::abs(tau - (delta < 0.0 ? 1.0 : 0.0));
          l += w * (ad <= kappa ? 0.5 * delta * delta : kappa * (ad - 0.5 * kappa));
          g -= w * (ad > kappa ? (delta > 0.0 ? kappa : -kappa) : delta);  // a NaN δ stays NaN
        }
        sample += l / (N * kappa);
        for (int k = 0; k < A; ++k)
          DT[base + static_cast<std::int64_t>(k) * N + i] = static_cast<T>(k == taken ? gscale * g : 0.0);
      }
    }
    a.loss_per_sample.as<T>()[b] = static_cast<T>(sample / D);
  }
}

}  // namespace

void qr_values(Backend& be, const QrValues& a) noexcept {
  constexpr const char* op = "qr_values";
  if (a.rows < 0 || a.D <= 0 || a.A <= 0 || a.N <= 0) return be.fail(op, "need rows >= 0 and D, A, N >= 1");
  if (a.a_star && (a.star_from < 0 || a.star_from > a.rows)) return be.fail(op, "star_from outside [0, rows]");
  if (a.ldv < a.N) return be.fail(op, "ldv smaller than N");
  if (ld_or(a.ldadv, a.A * a.N) < a.A * a.N) return be.fail(op, "ldadv smaller than A·N");
  if (a.rows == 0 || (!a.theta && !a.q && !a.a_star)) return;
  if (!real_arg(be, op, a.v, "v") || !real_arg(be, op, a.adv, "adv")) return;
  if ((a.theta && !real_arg(be, op, a.theta, "theta")) || (a.q && !real_arg(be, op, a.q, "q"))) return;
  if (const DeviceContext* ctx = be.device()) {
#if DQN_WITH_CUDA
    return qr_values_cuda(be, *ctx, a);
#else
    (void)ctx;
    return no_device_code(be, op);
#endif
  }
  with_host_real(be, [&](auto zero) { values_host<decltype(zero)>(a); });
}

void qr_loss(Backend& be, const QrLoss& a) noexcept {
  constexpr const char* op = "qr_loss";
  if (a.B < 0 || a.D <= 0 || a.A <= 0 || a.N <= 0) return be.fail(op, "need B >= 0 and D, A, N >= 1");
  if (!(a.kappa > 0.0f) || !std::isfinite(a.kappa)) return be.fail(op, "kappa must be finite and > 0");
  if (a.B == 0) return;
  if (!a.actions || !a.a_star) return be.fail(op, "null actions/a_star");
  if (!real_arg(be, op, a.dtheta, "dtheta") || !real_arg(be, op, a.loss_per_sample, "loss_per_sample") ||
      !real_arg(be, op, a.theta, "theta") || !real_arg(be, op, a.theta_target, "theta_target") ||
      !real_arg(be, op, a.rewards, "rewards") || !real_arg(be, op, a.dones, "dones") ||
      !real_arg(be, op, a.weights, "weights"))
    return;
  if (const DeviceContext* ctx = be.device()) {
    // actions/a_star live on the device: an out-of-range index poisons that sample with NaN there
#if DQN_WITH_CUDA
    return qr_loss_cuda(be, *ctx, a);
#else
    (void)ctx;
    return no_device_code(be, op);
#endif
  }
  for (std::int64_t k = 0; k < static_cast<std::int64_t>(a.B) * a.D; ++k)
    if (a.actions[k] < 0 || a.actions[k] >= a.A || a.a_star[k] < 0 || a.a_star[k] >= a.A)
      return be.fail(op, "action or a_star out of range");
  with_host_real(be, [&](auto zero) { loss_host<decltype(zero)>(a); });
}

}  // namespace dqn::qr
