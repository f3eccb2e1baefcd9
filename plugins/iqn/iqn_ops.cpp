/** @file iqn_ops.cpp
 *  @brief The IQN ops' argument checks, their dispatch, and their host half: plain loops in
 *  double, the reference every device result is checked against.
 */
#include "iqn_ops.hpp"

#include <cmath>

#include "dqn/own_ops.hpp"

namespace dqn {
namespace {

constexpr double kPi = 3.14159265358979323846;

template <class T>
void cosine_embedding_host(Real out, Real tau, int rows, int E) {
  T* O = out.as<T>();
  const T* t = tau.as<T>();
  for (int r = 0; r < rows; ++r)
    for (int i = 0; i < E; ++i)
      O[static_cast<std::int64_t>(r) * E + i] = static_cast<T>(std::cos(kPi * i * static_cast<double>(t[r])));
}

template <class T>
void hadamard_host(Real x, Real h2, Real phi, int B, int N, int H) {
  T* X = x.as<T>();
  const T* Hv = h2.as<T>();
  const T* P = phi.as<T>();
  for (int b = 0; b < B; ++b)
    for (int n = 0; n < N; ++n)
      for (int h = 0; h < H; ++h) {
        const std::int64_t at = (static_cast<std::int64_t>(b) * N + n) * H + h;
        X[at] = static_cast<T>(static_cast<double>(Hv[static_cast<std::int64_t>(b) * H + h]) * static_cast<double>(P[at]));
      }
}

/// (N >= 1: the dispatch fills dh2 with zeros for N = 0.)
template <class T>
void hadamard_backward_host(Real dphi, Real dh2, Real dx, Real h2, Real phi, int B, int N, int H) {
  T* DP = dphi.as<T>();
  T* DH = dh2.as<T>();
  const T* DX = dx.as<T>();
  const T* Hv = h2.as<T>();
  const T* P = phi.as<T>();
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h) {
      const double hv = static_cast<double>(Hv[static_cast<std::int64_t>(b) * H + h]);
      double acc = 0.0;
      for (int n = 0; n < N; ++n) {
        const std::int64_t at = (static_cast<std::int64_t>(b) * N + n) * H + h;
        const double g = DX[at];  // read before dphi (which may alias dx) is written
        acc += g * static_cast<double>(P[at]);
        DP[at] = static_cast<T>(g * hv);
      }
      DH[static_cast<std::int64_t>(b) * H + h] = static_cast<T>(acc);
    }
}

template <class T>
void quantile_huber_host(const QuantileHuber& a) {
  const int N = a.N, Nt = a.Nt, D = a.D, A = a.A;
  const std::int64_t ldq = ld_or(a.ldq, D * A);
  const double kappa = a.kappa;
  const T* Q = a.q.as<T>();
  const T* QT = a.q_target.as<T>();
  const T* TAU = a.tau.as<T>();
  const T* W = a.weights.as<T>();
  T* DQ = a.dq.as<T>();
  double total = 0.0;
  for (int b = 0; b < a.B; ++b) {
    const double discount = static_cast<double>(a.gamma_n) * (1.0 - static_cast<double>(a.dones.as<T>()[b]));
    const double r = a.rewards.as<T>()[b];
    const double gscale = static_cast<double>(W[b]) / (static_cast<double>(a.B) * D * Nt * kappa);
    double sample = 0.0;
    for (int d = 0; d < D; ++d) {
      const int act = a.actions[b * D + d], best = a.a_star[b * D + d];
      for (int i = 0; i < N; ++i) {
        const std::int64_t row = (static_cast<std::int64_t>(b) * N + i) * ldq + std::int64_t(d) * A;
        const double theta = Q[row + act], tau = TAU[static_cast<std::int64_t>(b) * N + i];
        double l = 0.0, g = 0.0;
        for (int j = 0; j < Nt; ++j) {
          const double t = r + discount * static_cast<double>(QT[(static_cast<std::int64_t>(b) * Nt + j) * ldq + std::int64_t(d) * A + best]);
          const double delta = t - theta, ad = std::abs(delta);
          const double w = std::abs(tau - (delta < 0.0 ? 1.0 : 0.0));
          l += w * (ad <= kappa ? 0.5 * delta * delta : kappa * (ad - 0.5 * kappa));
          g -= w * (ad > kappa ? (delta > 0.0 ? kappa : -kappa) : delta);  // ∂/∂θ = −∂/∂δ; a NaN δ stays NaN
        }
        sample += l / (Nt * kappa);
        for (int k = 0; k < A; ++k) DQ[row + k] = static_cast<T>(k == act ? gscale * g : 0.0);
      }
    }
    sample /= D;
    if (a.loss_per_sample) a.loss_per_sample.as<T>()[b] = static_cast<T>(sample);
    total += static_cast<double>(W[b]) * sample;
  }
  a.loss.as<T>()[0] = static_cast<T>(total / a.B);
}

}  // namespace

void cosine_embedding(Backend& be, Real out, Real tau, int rows, int E) noexcept {
  constexpr const char* op = "cosine_embedding";
  if (rows < 0 || E < 0) return be.fail(op, "negative size");
  if (rows == 0 || E == 0) return;
  if (!real_arg(be, op, out, "out") || !real_arg(be, op, tau, "tau")) return;
  if (const DeviceContext* ctx = be.device()) {
#if DQN_WITH_CUDA
    return cosine_embedding_cuda(be, *ctx, out, tau, rows, E);
#else
    (void)ctx;
    return no_device_code(be, op);
#endif
  }
  with_host_real(be, [&](auto zero) { cosine_embedding_host<decltype(zero)>(out, tau, rows, E); });
}

void hadamard(Backend& be, Real x, Real h2, Real phi, int B, int N, int H) noexcept {
  constexpr const char* op = "hadamard";
  if (B < 0 || N < 0 || H < 0) return be.fail(op, "negative size");
  if (B == 0 || N == 0 || H == 0) return;
  if (!real_arg(be, op, x, "x") || !real_arg(be, op, h2, "h2") || !real_arg(be, op, phi, "phi")) return;
  if (const DeviceContext* ctx = be.device()) {
#if DQN_WITH_CUDA
    return hadamard_cuda(be, *ctx, x, h2, phi, B, N, H);
#else
    (void)ctx;
    return no_device_code(be, op);
#endif
  }
  with_host_real(be, [&](auto zero) { hadamard_host<decltype(zero)>(x, h2, phi, B, N, H); });
}

void hadamard_backward(Backend& be, Real dphi, Real dh2, Real dx, Real h2, Real phi, int B, int N, int H) noexcept {
  constexpr const char* op = "hadamard_backward";
  if (B < 0 || N < 0 || H < 0) return be.fail(op, "negative size");
  if (B == 0 || H == 0) return;
  if (!real_arg(be, op, dh2, "dh2")) return;
  if (N == 0) return be.fill(dh2, 0.0f, static_cast<std::int64_t>(B) * H);  // an empty sum
  if (!real_arg(be, op, dphi, "dphi") || !real_arg(be, op, dx, "dx") || !real_arg(be, op, h2, "h2") ||
      !real_arg(be, op, phi, "phi"))
    return;
  if (const DeviceContext* ctx = be.device()) {
#if DQN_WITH_CUDA
    return hadamard_backward_cuda(be, *ctx, dphi, dh2, dx, h2, phi, B, N, H);
#else
    (void)ctx;
    return no_device_code(be, op);
#endif
  }
  with_host_real(be, [&](auto zero) { hadamard_backward_host<decltype(zero)>(dphi, dh2, dx, h2, phi, B, N, H); });
}

void quantile_huber(Backend& be, const QuantileHuber& a) noexcept {
  constexpr const char* op = "quantile_huber";
  if (a.B < 0 || a.N < 0 || a.Nt <= 0 || a.D < 0 || a.A <= 0) return be.fail(op, "need B, N, D >= 0, N', A >= 1");
  if (!(a.kappa > 0.0f)) return be.fail(op, "kappa must be > 0");
  if (!real_arg(be, op, a.loss, "loss")) return;
  if (a.B == 0 || a.N == 0 || a.D == 0) return be.fill(a.loss, 0.0f, 1);
  if (!a.actions || !a.a_star) return be.fail(op, "null actions/a_star");
  if (!real_arg(be, op, a.dq, "dq") || !real_arg(be, op, a.q, "q") || !real_arg(be, op, a.q_target, "q_target") ||
      !real_arg(be, op, a.tau, "tau") || !real_arg(be, op, a.rewards, "rewards") ||
      !real_arg(be, op, a.dones, "dones") || !real_arg(be, op, a.weights, "weights"))
    return;
  if (a.loss_per_sample && !real_arg(be, op, a.loss_per_sample, "loss_per_sample")) return;
  if (ld_or(a.ldq, a.D * a.A) < a.D * a.A) return be.fail(op, "ldq smaller than D·A");
  if (const DeviceContext* ctx = be.device()) {
    if (!a.sums) return be.fail(op, "null sums (the device scratch: quantile_huber_sums words)");
    // actions/a_star live on the device: an out-of-range index poisons that sample's dq and loss
#if DQN_WITH_CUDA
    return quantile_huber_cuda(be, *ctx, a);
#else
    (void)ctx;
    return no_device_code(be, op);
#endif
  }
  for (int k = 0; k < a.B * a.D; ++k)
    if (a.actions[k] < 0 || a.actions[k] >= a.A || a.a_star[k] < 0 || a.a_star[k] >= a.A)
      return be.fail(op, "action or a_star out of range");
  with_host_real(be, [&](auto zero) { quantile_huber_host<decltype(zero)>(a); });
}

}  // namespace dqn
