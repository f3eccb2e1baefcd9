/** @file c51_ops.cpp
 *  @brief The C51 ops' argument checks, their dispatch, and their host half: plain loops in
 *  double, the reference every device result is checked against.
 */
#include "c51_ops.hpp"

#include <algorithm>
#include <cmath>
#include <new>
#include <string>
#include <vector>

#include "dqn/own_ops.hpp"

namespace dqn {
namespace {

template <class T>
void project_host(const C51Project& a) {
  const int Z = a.Z;
  const double v_min = a.v_min, v_max = a.v_max, dz = support_step(a.v_min, a.v_max, Z);
  const T* LP = a.target_logp.as<T>();
  const T* R = a.rewards.as<T>();
  const T* Dn = a.dones.as<T>();
  T* M = a.m.as<T>();
  // Each target atom's position and probability, computed once per row: the scratch grows to the
  // largest Z seen and stays, so steps after the first allocate nothing.
  thread_local std::vector<double> tz, p;
  if (tz.size() < static_cast<std::size_t>(Z)) tz.resize(static_cast<std::size_t>(Z)), p.resize(static_cast<std::size_t>(Z));
  for (int b = 0; b < a.B; ++b) {
    const double discount = static_cast<double>(a.gamma_n) * (1.0 - static_cast<double>(Dn[b]));
    for (int j = 0; j < Z; ++j)
      tz[j] = std::clamp(static_cast<double>(R[b]) + discount * (v_min + j * dz), v_min, v_max);
    for (int d = 0; d < a.D; ++d) {
      const int bd = b * a.D + d;
      const T* lp = LP + (static_cast<std::int64_t>(bd) * a.A + a.a_star[bd]) * Z;
      T* m = M + static_cast<std::int64_t>(bd) * Z;
      for (int j = 0; j < Z; ++j) p[j] = std::exp(static_cast<double>(lp[j]));
      for (int i = 0; i < Z; ++i) {
        const double zi = v_min + i * dz;
        double acc = 0.0;
        for (int j = 0; j < Z; ++j) {
          const double weight = std::clamp(1.0 - std::abs(tz[j] - zi) / dz, 0.0, 1.0);
          acc += weight * p[j];
        }
        m[i] = static_cast<T>(acc);
      }
    }
  }
}

/// One member's cross-entropy and gradient (no dueling backward).
template <class T>
void xent_host(const C51Xent& a) {
  const int Z = a.Z;
  const T* LP = a.logp.as<T>();
  const T* M = a.m.as<T>();
  const T* W = a.weights.as<T>();
  T* DL = a.dlogits.as<T>();
  const double scale = a.scale;
  double total = 0.0;
  for (int b = 0; b < a.B; ++b) {
    const double grad_scale = scale * static_cast<double>(W[b]) / (static_cast<double>(a.B) * a.D);
    double sample = 0.0;
    for (int d = 0; d < a.D; ++d) {
      const int bd = b * a.D + d;
      const int taken = a.actions[bd];
      const T* m = M + static_cast<std::int64_t>(bd) * Z;
      // Loss and Σm first: after that only row `taken` of logp is read, element by element,
      // so dlogits may alias logp.
      double xent = 0.0, m_sum = 0.0;
      const T* lp_taken = LP + (static_cast<std::int64_t>(bd) * a.A + taken) * Z;
      for (int i = 0; i < Z; ++i) {
        xent -= static_cast<double>(m[i]) * static_cast<double>(lp_taken[i]);
        m_sum += static_cast<double>(m[i]);
      }
      sample += xent;
      for (int act = 0; act < a.A; ++act) {
        const std::int64_t row = (static_cast<std::int64_t>(bd) * a.A + act) * Z;
        for (int i = 0; i < Z; ++i) {
          if (act != taken) {
            DL[row + i] = T(0);
          } else {
            const double p = std::exp(static_cast<double>(LP[row + i]));
            DL[row + i] = static_cast<T>(grad_scale * (p * m_sum - static_cast<double>(m[i])));
          }
        }
      }
    }
    sample /= a.D;
    if (a.loss_per_sample) a.loss_per_sample.as<T>()[b] = static_cast<T>(sample);
    total += static_cast<double>(W[b]) * sample;
  }
  if (a.loss) {
    const double loss = scale * total / a.B;
    T& out = a.loss.as<T>()[0];
    out = static_cast<T>(a.accumulate ? static_cast<double>(out) + loss : loss);
  }
}

bool indices_ok(Backend& be, const char* op, const std::int32_t* idx, std::int64_t n, int A, const char* what) {
  for (std::int64_t k = 0; k < n; ++k)
    if (idx[k] < 0 || idx[k] >= A) {
      be.fail(op, (std::string(what) + " out of range").c_str());
      return false;
    }
  return true;
}

}  // namespace

void c51_project(Backend& be, const C51Project& a) noexcept {
  constexpr const char* op = "c51_project";
  if (a.B < 0 || a.D < 0 || a.A <= 0 || a.Z < 2) return be.fail(op, "need B, D >= 0, A >= 1, Z >= 2");
  if (!(a.v_max > a.v_min)) return be.fail(op, "v_max must exceed v_min");
  if (a.B == 0 || a.D == 0) return;
  if (!a.a_star) return be.fail(op, "null a_star");
  if (!real_arg(be, op, a.m, "m") || !real_arg(be, op, a.target_logp, "target_logp") ||
      !real_arg(be, op, a.rewards, "rewards") || !real_arg(be, op, a.dones, "dones"))
    return;
  if (const DeviceContext* ctx = be.device()) {
    // a_star lives on the device: an out-of-range index turns that row of m into NaN there
#if DQN_WITH_CUDA
    return c51_project_cuda(be, *ctx, a);
#else
    (void)ctx;
    return no_device_code(be, op);
#endif
  }
  if (!indices_ok(be, op, a.a_star, std::int64_t(a.B) * a.D, a.A, "a_star")) return;
  try {
    with_host_real(be, [&](auto zero) { project_host<decltype(zero)>(a); });
  } catch (const std::bad_alloc&) {
    be.fail(op, "out of memory for the projection's scratch");
  }
}

void c51_xent(Backend& be, const C51Xent& a) noexcept {
  constexpr const char* op = "c51_xent";
  if (a.B < 0 || a.D < 0 || a.A <= 0 || a.Z <= 0) return be.fail(op, "need B, D >= 0, A, Z >= 1");
  if (a.members < 1 || a.members > 65535) return be.fail(op, "members outside [1, 65535]");
  if (a.loss && !real_arg(be, op, a.loss, "loss")) return;
  const DeviceContext* ctx = be.device();
  if (a.B == 0 || a.D == 0) {
    if (a.loss && !a.accumulate) be.fill(a.loss, 0.0f, 1);
    return;
  }
  if (!a.actions) return be.fail(op, "null actions");
  if (!real_arg(be, op, a.dlogits, "dlogits") || !real_arg(be, op, a.logp, "logp") || !real_arg(be, op, a.m, "m") ||
      !real_arg(be, op, a.weights, "weights"))
    return;
  if (a.loss_per_sample && !real_arg(be, op, a.loss_per_sample, "loss_per_sample")) return;
  if (a.dv) {
    if (!real_arg(be, op, a.dv, "dv") || !real_arg(be, op, a.dadv, "dadv")) return;
    if (a.lddv < a.Z || ld_or(a.lddadv, a.A * a.Z) < a.A * a.Z) return be.fail(op, "lddv < Z or lddadv < A·Z");
  }
  if (ctx) {
    if (!a.sums) return be.fail(op, "null sums (the device scratch: c51_xent_sums words)");
#if DQN_WITH_CUDA
    return c51_xent_cuda(be, *ctx, a);
#else
    return no_device_code(be, op);
#endif
  }
  if (!indices_ok(be, op, a.actions, std::int64_t(a.B) * a.D, a.A, "action")) return;
  const std::int64_t n = std::int64_t(a.B) * a.D * a.A * a.Z;
  for (int k = 0; k < a.members; ++k) {
    C51Xent x = a;
    x.members = 1;
    x.logp = a.logp + k * n;
    x.dlogits = a.dlogits + k * n;
    if (a.loss_per_sample) x.loss_per_sample = a.loss_per_sample + std::int64_t(k) * a.B;
    x.accumulate = a.accumulate || k > 0;
    with_host_real(be, [&](auto zero) { xent_host<decltype(zero)>(x); });
    if (a.dv)  // the dueling backward of this member's dlogits
      be.dueling_backward(a.dv + std::int64_t(k) * a.B * a.lddv, a.lddv,
                          a.dadv + std::int64_t(k) * a.B * a.D * ld_or(a.lddadv, a.A * a.Z), a.lddadv, x.dlogits, a.B,
                          a.D, a.A, a.Z);
  }
}

void c51_loss(Backend& be, const C51Loss& a) noexcept {
  constexpr const char* op = "c51_loss";
  if (a.B < 0 || a.D <= 0 || a.A <= 0 || a.Z < 2) return be.fail(op, "need B >= 0, D, A >= 1, Z >= 2");
  if (!(a.v_max > a.v_min)) return be.fail(op, "v_max must exceed v_min");
  if (a.loss && !real_arg(be, op, a.loss, "loss")) return;
  if (a.B == 0) {
    if (a.loss) be.fill(a.loss, 0.0f, 1);
    return;
  }
  if (!a.actions || !a.a_star) return be.fail(op, "null actions/a_star");
  if (a.lddv < a.Z || a.ldtv < a.Z) return be.fail(op, "lddv/ldtv smaller than Z");
  if (ld_or(a.ldtadv, a.A * a.Z) < a.A * a.Z || ld_or(a.lddadv, a.A * a.Z) < a.A * a.Z)
    return be.fail(op, "ldtadv/lddadv smaller than A·Z");
  if (!real_arg(be, op, a.m, "m") || !real_arg(be, op, a.dv, "dv") || !real_arg(be, op, a.dadv, "dadv") ||
      !real_arg(be, op, a.logp, "logp") || !real_arg(be, op, a.weights, "weights") || !real_arg(be, op, a.tv, "tv") ||
      !real_arg(be, op, a.tadv, "tadv") || !real_arg(be, op, a.rewards, "rewards") ||
      !real_arg(be, op, a.dones, "dones"))
    return;
  if (a.loss_per_sample && !real_arg(be, op, a.loss_per_sample, "loss_per_sample")) return;
  if (const DeviceContext* ctx = be.device()) {
    if (a.loss && (!a.sums || !a.counter)) return be.fail(op, "null sums/counter (the device scratch of the loss)");
    // a_star/actions live on the device: an out-of-range index poisons that branch with NaN
#if DQN_WITH_CUDA
    return c51_loss_cuda(be, *ctx, a);
#else
    (void)ctx;
    return no_device_code(be, op);
#endif
  }
  // The host twin: the unfused ops in sequence, through the workspace.
  if (!real_arg(be, op, a.work_logp, "work_logp") || !real_arg(be, op, a.work_dlogits, "work_dlogits")) return;
  DuelingDist t;  // the target's log-probabilities (no Q, no argmax)
  t.logp = a.work_logp; t.v = a.tv; t.ldv = a.ldtv; t.adv = a.tadv; t.ldadv = a.ldtadv;
  t.rows = a.B; t.D = a.D; t.A = a.A; t.Z = a.Z; t.v_min = a.v_min; t.v_max = a.v_max;
  be.dueling_dist(t);
  C51Project p;
  p.m = a.m; p.target_logp = a.work_logp; p.a_star = a.a_star; p.rewards = a.rewards; p.dones = a.dones;
  p.B = a.B; p.D = a.D; p.A = a.A; p.Z = a.Z; p.gamma_n = a.gamma_n; p.v_min = a.v_min; p.v_max = a.v_max;
  if (be.status() == 0) c51_project(be, p);
  C51Xent x;
  x.loss_per_sample = a.loss_per_sample; x.loss = a.loss; x.dlogits = a.work_dlogits; x.logp = a.logp;
  x.actions = a.actions; x.m = a.m; x.weights = a.weights; x.B = a.B; x.D = a.D; x.A = a.A; x.Z = a.Z;
  if (be.status() == 0) c51_xent(be, x);
  if (be.status() == 0) be.dueling_backward(a.dv, a.lddv, a.dadv, a.lddadv, a.work_dlogits, a.B, a.D, a.A, a.Z);
}

}  // namespace dqn
