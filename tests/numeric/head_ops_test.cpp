// The built-in heads' own ops (plugins/*/..._ops): finite differences of their gradients, hand-
// computed values, and the f32 reference against the f64 one — through the same free functions
// the heads call, on the CPU backends.
#include <doctest/doctest.h>

#include "c51_ops.hpp"
#include "cql_ops.hpp"
#include "disagreement_ops.hpp"
#include "iqn_ops.hpp"
#include "ops_util.hpp"

using namespace ops_util;

TEST_CASE("ops.c51_project.rows_sum_to_one") {
  Backends be;
  Rng rng(12);
  const int B = 7, D = 3, A = 5, Z = 11;
  const float gamma = 0.99f, v_min = -10.0f, v_max = 10.0f;
  const Vd TLP = naive_log_softmax(rng.vec(B * D * A * Z, -3.0, 3.0), B * D * A, Z);
  const Vd R = {-15.0, -3.3, 0.0, 2.7, 14.0, 0.15, -9.9};  // some beyond the support: clamped
  const Vd done = {0, 1, 0, 0, 1, 0, 0};
  std::vector<std::int32_t> a_star(B * D);
  for (auto& a : a_star) a = rng.below(A);
  const Vd want = naive_project(TLP, a_star, R, done, B, D, A, Z, gamma, v_min, v_max);
  auto run = [&](Backend& b) {
    Vec tlp(b.real_size(), TLP), r(b.real_size(), R), dn(b.real_size(), done), m(b.real_size(), B * D * Z, kNaN);
    dqn::C51Project p;
    p.m = m.r(), p.target_logp = tlp.r(), p.a_star = a_star.data(), p.rewards = r.r(), p.dones = dn.r();
    p.B = B, p.D = D, p.A = A, p.Z = Z, p.gamma_n = gamma, p.v_min = v_min, p.v_max = v_max;
    dqn::c51_project(b, p);
    REQUIRE(b.status() == 0);
    return m.get();
  };
  const Vd got64 = run(*be.f64);
  for (int row = 0; row < B * D; ++row) {
    double s = 0.0;
    for (int i = 0; i < Z; ++i) {
      CHECK(got64[row * Z + i] >= 0.0);
      s += got64[row * Z + i];
    }
    CHECK(std::abs(s - 1.0) < 1e-12);
  }
  for (std::size_t i = 0; i < want.size(); ++i) CHECK(std::abs(got64[i] - want[i]) < 1e-12);
  CHECK(rel_err(run(*be.f32), got64) < 1e-5);
}

TEST_CASE("ops.c51_project.hand_computed") {
  // Z = 3 on {−1, 0, 1}; A = 2, a* picks the row. Target probs: a0 = (.6 .3 .1), a1 = (.2 .3 .5).
  Backends be;
  Backend& b = *be.f64;
  const Vd tlp = {std::log(0.6), std::log(0.3), std::log(0.1), std::log(0.2), std::log(0.3), std::log(0.5)};
  const int B = 3;
  Vd TLP;
  for (int i = 0; i < B; ++i) TLP.insert(TLP.end(), tlp.begin(), tlp.end());
  const std::vector<std::int32_t> a_star = {1, 1, 0};
  Vec t(8, TLP), r(8, Vd{0.5, 0.5, 0.5}), dn(8, Vd{0.0, 1.0, 0.0}), m(8, B * 3);
  dqn::C51Project p;
  p.m = m.r(), p.target_logp = t.r(), p.a_star = a_star.data(), p.rewards = r.r(), p.dones = dn.r();
  p.B = B, p.D = 1, p.A = 2, p.Z = 3, p.gamma_n = 1.0f, p.v_min = -1.0f, p.v_max = 1.0f;
  dqn::c51_project(b, p);
  REQUIRE(b.status() == 0);
  // r = .5, γ = 1, not done: Tz = (−.5, .5, 1) → m = (.5 p0, .5 p0 + .5 p1, .5 p1 + p2).
  // done: Tz = .5 everywhere → m = (0, .5, .5).
  const Vd want = {0.1, 0.25, 0.65, 0.0, 0.5, 0.5, 0.3, 0.45, 0.25};
  for (int i = 0; i < 9; ++i) CHECK(std::abs(m[i] - want[i]) < 1e-12);

  // r = 0, γ = .5, not done: Tz = (−.5, 0, .5) → m = (.5 p0, .5 p0 + p1 + .5 p2, .5 p2).
  r.set(0, 0.0);
  p.B = 1, p.gamma_n = 0.5f;
  dqn::c51_project(b, p);
  const Vd want2 = {0.1, 0.1 + 0.3 + 0.25, 0.25};
  for (int i = 0; i < 3; ++i) CHECK(std::abs(m[i] - want2[i]) < 1e-12);
}

TEST_CASE("ops.c51_xent.dueling: the fused dueling backward equals c51_xent then dueling_backward, bit for bit") {
  Backends be;
  Rng rng(15);
  const int B = 3, D = 2, A = 3, Z = 5, K = 2, ldv = Z + 2, ldd = A * Z + 3;
  const std::size_t n = static_cast<std::size_t>(K) * B * D * A * Z;
  Vd lp = rng.vec(n), m = rng.vec(static_cast<std::size_t>(B) * D * Z), w = rng.vec(B);
  for (auto& x : lp) x = -std::abs(x) - 0.1;  // log-probabilities are negative
  for (auto& x : m) x = std::abs(x);
  const std::vector<std::int32_t> actions{0, 2, 1, 1, 2, 0};
  for (Backend* b : {be.f64.get(), be.f32.get()}) {
    CAPTURE(b->name());
    const std::uint32_t es = b->real_size();
    Vec lpv(es, lp), mv(es, m), wv(es, w), loss1(es, 1), loss2(es, 1), dl1(es, n), dl2(es, n);
    Vec dv1(es, static_cast<std::size_t>(K) * B * ldv, 7.0), dv2(es, static_cast<std::size_t>(K) * B * ldv, 7.0);
    Vec da1(es, static_cast<std::size_t>(K) * B * D * ldd, 7.0), da2(es, static_cast<std::size_t>(K) * B * D * ldd, 7.0);
    dqn::C51Xent x;
    x.B = B, x.D = D, x.A = A, x.Z = Z, x.members = K, x.scale = 0.5f;
    x.logp = lpv.r(), x.m = mv.r(), x.weights = wv.r(), x.actions = actions.data();
    dqn::C51Xent fused = x;
    fused.loss = loss1.r(), fused.dlogits = dl1.r(), fused.dv = dv1.r(), fused.lddv = ldv, fused.dadv = da1.r(),
    fused.lddadv = ldd;
    dqn::c51_xent(*b, fused);
    dqn::C51Xent plain = x;
    plain.loss = loss2.r(), plain.dlogits = dl2.r();
    dqn::c51_xent(*b, plain);
    const std::int64_t per = std::int64_t(B) * D * A * Z;
    for (int k = 0; k < K; ++k)
      b->dueling_backward(dv2.r() + std::int64_t(k) * B * ldv, ldv, da2.r() + std::int64_t(k) * B * D * ldd, ldd,
                          dl2.r() + k * per, B, D, A, Z);
    REQUIRE(b->status() == 0);
    CHECK(loss1.bytes() == loss2.bytes());
    CHECK(dl1.bytes() == dl2.bytes());
    CHECK(dv1.bytes() == dv2.bytes());
    CHECK(da1.bytes() == da2.bytes());
  }
}

TEST_CASE("ops.c51_xent.fd") {
  // loss(logits) = c51_xent(log_softmax(logits)); its dlogits against central differences, with
  // non-uniform weights, a scale, and m rows that do not sum to 1 (so the p·Σm term matters).
  Backends be;
  Backend& b = *be.f64;
  Rng rng(13);
  const int B = 3, D = 2, A = 5, Z = 7;
  const std::size_t n = static_cast<std::size_t>(B) * D * A * Z;
  const float scale = 0.37f;
  const Vd Wt = {0.5, 1.7, 1.1};
  std::vector<std::int32_t> actions(B * D);
  for (auto& a : actions) a = rng.below(A);
  const Vd M = rng.vec(B * D * Z, 0.0, 0.5);
  Vec logits(8, rng.vec(n, -2.0, 2.0)), logp(8, n), m(8, M), w(8, Wt), dlogits(8, n, kNaN), loss(8, 1, kNaN),
      lps(8, B, kNaN);
  auto args = [&](Vec& lp, Vec& mm, Vec& ww, Vec& dl, Vec& lo, Vec* per_sample) {
    dqn::C51Xent x;
    x.loss_per_sample = per_sample ? per_sample->r() : Real{nullptr, lp.r().esize};
    x.loss = lo.r(), x.dlogits = dl.r(), x.logp = lp.r(), x.actions = actions.data();
    x.m = mm.r(), x.weights = ww.r(), x.B = B, x.D = D, x.A = A, x.Z = Z, x.scale = scale;
    return x;
  };
  auto forward = [&] {
    b.log_softmax(logp.r(), logits.r(), B * D * A, Z);
    dqn::c51_xent(b, args(logp, m, w, dlogits, loss, &lps));
    return loss[0];
  };
  forward();
  REQUIRE(b.status() == 0);
  const Vd grad = dlogits.get();

  // Loss and per-sample loss against the formula.
  const Vd LP = logp.get();
  double want_loss = 0.0;
  for (int s = 0; s < B; ++s) {
    double L = 0.0;
    for (int d = 0; d < D; ++d)
      for (int i = 0; i < Z; ++i) L -= M[(s * D + d) * Z + i] * LP[((s * D + d) * A + actions[s * D + d]) * Z + i];
    L /= D;
    CHECK(lps[s] == doctest::Approx(L).epsilon(1e-14));
    want_loss += Wt[s] * L;
  }
  want_loss *= static_cast<double>(scale) / B;
  CHECK(loss[0] == doctest::Approx(want_loss).epsilon(1e-14));

  // The gradient: exactly zero off the taken actions, central differences everywhere.
  for (int s = 0; s < B; ++s)
    for (int d = 0; d < D; ++d)
      for (int a = 0; a < A; ++a)
        if (a != actions[s * D + d])
          for (int i = 0; i < Z; ++i) CHECK(grad[((s * D + d) * A + a) * Z + i] == 0.0);
  CHECK(grad_err(logits, grad, forward) < 1e-6);

  // accumulate adds to loss; a null loss_per_sample is not written.
  Vec acc(8, Vd{2.5}), dl2(8, n);
  dqn::C51Xent x = args(logp, m, w, dl2, acc, nullptr);
  x.accumulate = true;
  dqn::c51_xent(b, x);
  REQUIRE(b.status() == 0);
  CHECK(acc[0] == doctest::Approx(2.5 + want_loss).epsilon(1e-14));
  CHECK(rel_err(dl2.get(), grad) == 0.0);

  // f32 against f64.
  Vec lp32(4, LP), m32(4, M), w32(4, Wt), dl32(4, n, kNaN), loss32(4, 1), lps32(4, B);
  dqn::c51_xent(*be.f32, args(lp32, m32, w32, dl32, loss32, &lps32));
  REQUIRE(be.f32->status() == 0);
  CHECK(rel_err(dl32.get(), grad) < 1e-5);
  CHECK(rel_err(lps32.get(), lps.get()) < 1e-5);
  CHECK(loss32[0] == doctest::Approx(loss[0]).epsilon(1e-5));
}

// ---- auxiliary heads (ABI 2) ------------------------------------------------------------------

TEST_CASE("ops.cql_penalty.fd") {
  // loss(q) = α/(B·D) Σ [logsumexp_a q − q(a_d)] against the formula, dq against central
  // differences; large Q-values (stable logsumexp); f32 against f64.
  Backends be;
  Backend& b = *be.f64;
  Rng rng(21);
  const int B = 4, D = 3, A = 5;
  const std::size_t n = static_cast<std::size_t>(B) * D * A;
  const float alpha = 0.6f;
  std::vector<std::int32_t> actions(B * D);
  for (auto& a : actions) a = rng.below(A);
  Vd Q0 = rng.vec(n, -3.0, 3.0);
  Q0[0] += 500.0;  // one huge entry: exp would overflow without the max shift
  Vec q(8, Q0), dq(8, n, kNaN), loss(8, 1, kNaN);
  auto args = [&](Vec& qq, Vec& dd, Vec& lo) {
    dqn::CqlPenalty p;
    p.loss = lo.r(), p.dq = dd.r(), p.q = qq.r(), p.actions = actions.data(), p.B = B, p.D = D, p.A = A, p.alpha = alpha;
    return p;
  };
  auto forward = [&] {
    dqn::cql_penalty(b, args(q, dq, loss));
    return loss[0];
  };
  forward();
  REQUIRE(b.status() == 0);
  const Vd grad = dq.get();
  double want = 0.0;
  for (int r = 0; r < B * D; ++r) {
    double mx = -kInf;
    for (int a = 0; a < A; ++a) mx = std::max(mx, Q0[r * A + a]);
    double s = 0.0;
    for (int a = 0; a < A; ++a) s += std::exp(Q0[r * A + a] - mx);
    want += mx + std::log(s) - Q0[r * A + actions[r]];
    // Each row's gradient sums to zero (softmax minus a one-hot).
    double gs = 0.0;
    for (int a = 0; a < A; ++a) gs += grad[r * A + a];
    CHECK(std::abs(gs) < 1e-15);
  }
  want *= static_cast<double>(alpha) / (B * D);
  CHECK(std::isfinite(loss[0]));
  CHECK(loss[0] == doctest::Approx(want).epsilon(1e-13));
  CHECK(grad_err(q, grad, forward) < 1e-6);

  Vec q32(4, Q0), dq32(4, n, kNaN), loss32(4, 1, kNaN);
  dqn::cql_penalty(*be.f32, args(q32, dq32, loss32));
  REQUIRE(be.f32->status() == 0);
  CHECK(rel_err(dq32.get(), grad) < 1e-5);
  CHECK(loss32[0] == doctest::Approx(loss[0]).epsilon(1e-5));

  // An action out of range is an error, not a read outside the row.
  auto e = dqn::make_cpu_backend(true);
  actions[2] = A;
  dqn::cql_penalty(*e, args(q, dq, loss));
  CHECK(e->status() != 0);
  CHECK(std::string(e->message()).find("action out of range") != std::string::npos);
}

TEST_CASE("ops.ensemble_disagreement") {
  // out[b] = (1/n) Σ_j population std over k of q[k,b,j], against a two-pass reference; identical
  // members disagree by exactly 0.
  Backends be;
  Rng rng(23);
  const int K = 3, B = 4, n = 6;
  const Vd Q = rng.vec(static_cast<std::size_t>(K) * B * n, -5.0, 5.0);
  Vec q(8, Q), out(8, B, kNaN);
  dqn::ensemble_disagreement(*be.f64, out.r(), q.r(), K, B, n);
  REQUIRE(be.f64->status() == 0);
  for (int b = 0; b < B; ++b) {
    double want = 0.0;
    for (int j = 0; j < n; ++j) {
      Vd x;
      for (int k = 0; k < K; ++k) x.push_back(Q[(k * B + b) * n + j]);
      const double mean = (x[0] + x[1] + x[2]) / 3.0;
      want += std::sqrt(((x[0] - mean) * (x[0] - mean) + (x[1] - mean) * (x[1] - mean) + (x[2] - mean) * (x[2] - mean)) / 3.0);
    }
    CHECK(out[b] == doctest::Approx(want / n).epsilon(1e-13));
  }
  Vd same(static_cast<std::size_t>(K) * B * n);
  for (int k = 0; k < K; ++k)
    for (int i = 0; i < B * n; ++i) same[k * B * n + i] = Q[i];
  Vec qs(4, same), outs(4, B, kNaN);
  dqn::ensemble_disagreement(*be.f32, outs.r(), qs.r(), K, B, n);
  REQUIRE(be.f32->status() == 0);
  for (int b = 0; b < B; ++b) CHECK(outs[b] == 0.0);
}

TEST_CASE("ops.cosine_embedding") {
  Backends be;
  Rng rng(24);
  const int rows = 5, E = 7;
  const Vd T = rng.vec(rows, 0.0, 1.0);
  Vec tau(8, T), out(8, static_cast<std::size_t>(rows) * E, kNaN);
  dqn::cosine_embedding(*be.f64, out.r(), tau.r(), rows, E);
  REQUIRE(be.f64->status() == 0);
  for (int r = 0; r < rows; ++r)
    for (int i = 0; i < E; ++i) CHECK(out[r * E + i] == doctest::Approx(std::cos(M_PI * i * T[r])).epsilon(1e-15));
  for (int r = 0; r < rows; ++r) CHECK(out[r * E] == 1.0);  // i = 0: the constant feature
}

TEST_CASE("ops.hadamard.fd") {
  // L = Σ c ⊙ (h2 broadcast ⊙ phi): dphi and dh2 from hadamard_backward against central differences.
  Backends be;
  Backend& b = *be.f64;
  Rng rng(25);
  const int B = 3, N = 4, H = 5;
  const std::size_t nx = static_cast<std::size_t>(B) * N * H;
  const Vd C = rng.vec(nx);
  Vec h2(8, rng.vec(static_cast<std::size_t>(B) * H)), phi(8, rng.vec(nx)), x(8, nx, kNaN), c(8, C),
      dphi(8, nx, kNaN), dh2(8, static_cast<std::size_t>(B) * H, kNaN);
  auto forward = [&] {
    dqn::hadamard(b, x.r(), h2.r(), phi.r(), B, N, H);
    double s = 0.0;
    for (std::size_t i = 0; i < nx; ++i) s += C[i] * x[i];
    return s;
  };
  forward();
  for (int bb = 0; bb < B; ++bb)
    for (int n = 0; n < N; ++n)
      for (int h = 0; h < H; ++h) CHECK(x[(bb * N + n) * H + h] == h2[bb * H + h] * phi[(bb * N + n) * H + h]);
  dqn::hadamard_backward(b, dphi.r(), dh2.r(), c.r(), h2.r(), phi.r(), B, N, H);
  REQUIRE(b.status() == 0);
  const Vd gphi = dphi.get(), gh2 = dh2.get();
  CHECK(grad_err(phi, gphi, forward) < 1e-6);
  CHECK(grad_err(h2, gh2, forward) < 1e-6);
  // dphi may alias dx.
  Vec inplace(8, C), dh2b(8, static_cast<std::size_t>(B) * H, kNaN);
  dqn::hadamard_backward(b, inplace.r(), dh2b.r(), inplace.r(), h2.r(), phi.r(), B, N, H);
  CHECK(inplace.get() == gphi);
  CHECK(dh2b.get() == gh2);
}

TEST_CASE("ops.quantile_huber.fd") {
  // The IQN loss against a direct transcription of the spec, dq against central differences
  // (zero off the taken actions), deltas on both sides of κ, f32 against f64.
  Backends be;
  Backend& b = *be.f64;
  Rng rng(26);
  const int B = 3, N = 4, Nt = 5, D = 2, A = 3;
  const float kappa = 1.0f, gamma = 0.9f;
  std::vector<std::int32_t> actions(B * D), a_star(B * D);
  for (auto& a : actions) a = rng.below(A);
  for (auto& a : a_star) a = rng.below(A);
  const Vd Q = rng.vec(static_cast<std::size_t>(B) * N * D * A, -2.0, 2.0);
  const Vd QT = rng.vec(static_cast<std::size_t>(B) * Nt * D * A, -2.0, 2.0);
  const Vd TAU = rng.vec(static_cast<std::size_t>(B) * N, 0.0, 1.0);
  const Vd R = {0.5, -1.0, 0.25}, DONE = {0.0, 1.0, 0.0}, W = {1.0, 0.5, 1.5};
  Vec q(8, Q), qt(8, QT), tau(8, TAU), r(8, R), done(8, DONE), w(8, W), dq(8, Q.size(), kNaN), loss(8, 1, kNaN),
      lps(8, B, kNaN);
  auto args = [&](Vec& qq, Vec& qqt, Vec& tt, Vec& rr, Vec& dd, Vec& ww, Vec& dqq, Vec& lo, Vec* per) {
    dqn::QuantileHuber a;
    a.loss = lo.r(), a.loss_per_sample = per ? per->r() : Real{nullptr, lo.r().esize}, a.dq = dqq.r(), a.q = qq.r();
    a.q_target = qqt.r(), a.actions = actions.data(), a.a_star = a_star.data(), a.tau = tt.r(), a.rewards = rr.r();
    a.dones = dd.r(), a.weights = ww.r(), a.B = B, a.N = N, a.Nt = Nt, a.D = D, a.A = A, a.gamma_n = gamma;
    a.kappa = kappa;
    return a;
  };
  auto forward = [&] {
    dqn::quantile_huber(b, args(q, qt, tau, r, done, w, dq, loss, &lps));
    return loss[0];
  };
  forward();
  REQUIRE(b.status() == 0);
  const Vd grad = dq.get();
  double want = 0.0;
  int beyond_kappa = 0;
  for (int s = 0; s < B; ++s) {
    double L = 0.0;
    for (int d = 0; d < D; ++d)
      for (int i = 0; i < N; ++i)
        for (int j = 0; j < Nt; ++j) {
          const double theta = Q[((s * N + i) * D + d) * A + actions[s * D + d]];
          const double T = R[s] + gamma * (1.0 - DONE[s]) * QT[((s * Nt + j) * D + d) * A + a_star[s * D + d]];
          const double delta = T - theta;
          const double rho = std::abs(delta) <= kappa ? 0.5 * delta * delta : kappa * (std::abs(delta) - 0.5 * kappa);
          beyond_kappa += std::abs(delta) > kappa;
          L += std::abs(TAU[s * N + i] - (delta < 0 ? 1.0 : 0.0)) * rho / kappa / Nt;
        }
    L /= D;
    CHECK(lps[s] == doctest::Approx(L).epsilon(1e-13));
    want += W[s] * L;
  }
  CHECK(beyond_kappa > 0);
  CHECK(loss[0] == doctest::Approx(want / B).epsilon(1e-13));
  for (int s = 0; s < B; ++s)
    for (int i = 0; i < N; ++i)
      for (int d = 0; d < D; ++d)
        for (int a = 0; a < A; ++a)
          if (a != actions[s * D + d]) CHECK(grad[((s * N + i) * D + d) * A + a] == 0.0);
  CHECK(grad_err(q, grad, forward) < 1e-6);

  Vec q32(4, Q), qt32(4, QT), tau32(4, TAU), r32(4, R), d32(4, DONE), w32(4, W), dq32(4, Q.size(), kNaN),
      loss32(4, 1, kNaN);
  dqn::quantile_huber(*be.f32, args(q32, qt32, tau32, r32, d32, w32, dq32, loss32, nullptr));
  REQUIRE(be.f32->status() == 0);
  CHECK(rel_err(dq32.get(), grad) < 1e-5);
  CHECK(loss32[0] == doctest::Approx(loss[0]).epsilon(1e-5));

  // Rows ldq = D·A + 2 apart (q, target q and dq padded): the same loss and dq, bit for bit, and
  // dq's padding untouched; a stride below D·A is refused.
  {
    const int ldq = D * A + 2;
    Vd QP(static_cast<std::size_t>(B) * N * ldq, 0.0), QTP(static_cast<std::size_t>(B) * Nt * ldq, 0.0);
    for (int row = 0; row < B * N; ++row)
      for (int k = 0; k < D * A; ++k) QP[std::size_t(row * ldq + k)] = Q[std::size_t(row * D * A + k)];
    for (int row = 0; row < B * Nt; ++row)
      for (int k = 0; k < D * A; ++k) QTP[std::size_t(row * ldq + k)] = QT[std::size_t(row * D * A + k)];
    Vec qp(8, QP), qtp(8, QTP), dqp(8, QP.size(), kNaN), lossp(8, 1, kNaN);
    auto ap = args(qp, qtp, tau, r, done, w, dqp, lossp, nullptr);
    ap.ldq = ldq;
    dqn::quantile_huber(b, ap);
    REQUIRE(b.status() == 0);
    CHECK(lossp[0] == loss[0]);
    int bad = 0, pad_written = 0;
    for (int row = 0; row < B * N; ++row)
      for (int k = 0; k < ldq; ++k) {
        const double x = dqp[std::size_t(row * ldq + k)];
        if (k >= D * A) pad_written += !std::isnan(x);
        else bad += x != grad[std::size_t(row * D * A + k)];
      }
    CHECK(bad == 0);
    CHECK(pad_written == 0);
    Backends be2;
    ap.ldq = D * A - 1;
    dqn::quantile_huber(*be2.f64, ap);
    CHECK(be2.f64->status() != 0);
  }

  // A NaN target quantile reaches the gradient (a finite ±κ there would hide it from the budget's skip).
  Vec qtn(8, QT), dqn_(8, Q.size(), kNaN), lossn(8, 1, kNaN);
  for (int j = 0; j < Nt; ++j) qtn.set(((0 * Nt + j) * D + 0) * A + a_star[0], kNaN);
  dqn::quantile_huber(b, args(q, qtn, tau, r, done, w, dqn_, lossn, nullptr));
  CHECK(std::isnan(lossn[0]));
  CHECK(std::isnan(dqn_[((0 * N + 0) * D + 0) * A + actions[0]]));
}
