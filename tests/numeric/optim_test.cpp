// Numeric tests of the CPU reference's optimiser ops (budgets, Adam, spectral norm, target update),
// the RNG, memory ops, errors and the CPU runtime.
#include <doctest/doctest.h>

#include "ops_util.hpp"

using namespace ops_util;

namespace {

/// Everything one budget call reads and writes, on one backend.
struct BudgetRig {
  BudgetRig(EngineBackend& be, const Vd& grads, const Vd& fractions, const Vd& losses, float G)
      : es(be.real_size()),
        H(static_cast<int>(fractions.size())),
        P(static_cast<std::int64_t>(grads.size() / fractions.size())),
        grads_v(es, grads), fractions_v(es, fractions), losses_v(es, losses), norms(es, H, kNaN),
        clips(es, H, kNaN), g(es, grads.size() / fractions.size(), kNaN), total(es, 1, kNaN) {
    a.grads = grads_v.r(), a.fractions = fractions_v.r(), a.norms = norms.r(), a.clips = clips.r();
    a.g = g.r(), a.losses = losses_v.r(), a.total_loss = total.r(), a.skip = &skip, a.skipped = &skipped;
    a.H = H, a.P = P, a.max_grad_norm = G;
  }
  std::uint32_t es;
  int H;
  std::int64_t P;
  Vec grads_v, fractions_v, losses_v, norms, clips, g, total;
  std::int32_t skip = -1;
  std::int64_t skipped = 5;
  dqn::Budget a;
};

double norm2(const Vd& x) {
  double s = 0.0;
  for (double v : x) s += v * v;
  return std::sqrt(s);
}

Vd scaled(Vd x, double target_norm) {
  const double f = target_norm / norm2(x);
  for (double& v : x) v *= f;
  return x;
}


}  // namespace

TEST_CASE("ops.budget.primary_alone") {
  Backends be;
  Rng rng(14);
  const int P = 37;
  const float G = 10.0f;
  SUBCASE("norm above G clips to G") {
    const Vd g = scaled(rng.vec(P), 25.0);
    for (EngineBackend* b : {be.f64.get(), be.f32.get()}) {
      BudgetRig r(*b, g, {1.0}, {0.75}, G);
      b->budget(r.a);
      REQUIRE(b->status() == 0);
      const double tol = b->real_size() == 8 ? 1e-12 : 1e-6;
      CHECK(r.skip == 0);
      CHECK(r.skipped == 5);
      CHECK(std::abs(r.norms[0] - 25.0) < 25.0 * tol);
      CHECK(std::abs(r.clips[0] - 10.0 / (25.0 + 1e-6)) < tol);
      CHECK(std::abs(norm2(r.g.get()) - 10.0) < 10.0 * 1e-6);  // 1e-6 is the ε in the clip
      CHECK(r.total[0] == 0.75);
      for (int i = 0; i < P; ++i) CHECK(std::abs(r.g[i] - g[i] * r.clips[0]) < tol);
    }
  }
  SUBCASE("norm below G leaves g bit-identical") {
    const Vd g = scaled(rng.vec(P), 4.0);
    for (EngineBackend* b : {be.f64.get(), be.f32.get()}) {
      BudgetRig r(*b, g, {1.0}, {0.75}, G);
      b->budget(r.a);
      CHECK(r.skip == 0);
      CHECK(r.clips[0] == 1.0);
      CHECK(r.g.bytes() == r.grads_v.bytes());
    }
  }
}

TEST_CASE("ops.budget.two_heads") {
  Backends be;
  Rng rng(15);
  const int P = 37;
  const float G = 10.0f;
  // Head 0 (f = .8, budget 8) at norm 30 and head 1 (f = .2, budget 2) at norm 7: both clip.
  const Vd g0 = scaled(rng.vec(P), 30.0), g1 = scaled(rng.vec(P), 7.0);
  Vd grads = g0;
  grads.insert(grads.end(), g1.begin(), g1.end());
  for (int small = 0; small < 2; ++small) {
    CAPTURE(small);
    Vd gr = grads;
    if (small)  // head 1 at norm 1.5, inside its budget of 2: unclipped
      for (int i = 0; i < P; ++i) gr[P + i] *= 1.5 / 7.0;
    auto run = [&](EngineBackend& b) {
      BudgetRig r(b, gr, {0.8, 0.2}, {1.5, -0.25}, G);
      b.budget(r.a);
      REQUIRE(b.status() == 0);
      CHECK(r.skip == 0);
      CHECK(r.total[0] == 1.25);
      Vd out = r.g.get();
      out.push_back(r.norms[0]), out.push_back(r.norms[1]);
      out.push_back(r.clips[0]), out.push_back(r.clips[1]);
      return out;
    };
    const Vd got = run(*be.f64);
    const double n1 = small ? 1.5 : 7.0;
    const double c0 = 8.0 / (30.0 + 1e-6), c1 = small ? 1.0 : 2.0 / (7.0 + 1e-6);
    CHECK(got[P] == doctest::Approx(30.0).epsilon(1e-13));
    CHECK(got[P + 1] == doctest::Approx(n1).epsilon(1e-13));
    CHECK(got[P + 2] == doctest::Approx(c0).epsilon(1e-13));
    CHECK(got[P + 3] == doctest::Approx(c1).epsilon(1e-13));
    Vd want(P);
    for (int i = 0; i < P; ++i) want[i] = c0 * gr[i] + c1 * gr[P + i];
    CHECK(rel_err(Vd(got.begin(), got.begin() + P), want) < 1e-13);
    CHECK(rel_err(run(*be.f32), got) < 1e-5);
    // Each head's part is inside its budget.
    CHECK(c0 * 30.0 <= 8.0);
    CHECK(c1 * n1 <= 2.0);
  }
}

TEST_CASE("ops.budget.nonfinite_skips_updates") {
  // A NaN or Inf in one head: skip set, counter incremented, g zero; then Adam, spectral norm and
  // target update (Polyak and a due hard copy) leave every array bit-identical.
  Backends be;
  for (double bad : {kNaN, kInf, -kInf}) {
    for (EngineBackend* b : {be.f64.get(), be.f32.get()}) {
      CAPTURE(bad);
      CAPTURE(b->name());
      const std::uint32_t es = b->real_size();
      Rng rng(16);
      const int P = 6 * 5 + 7;  // a 6×5 matrix then 7 more
      Vd grads = rng.vec(2 * P);
      grads[P + 11] = bad;
      BudgetRig r(*b, grads, {0.8, 0.2}, {1.0, 2.0}, 10.0f);
      b->budget(r.a);
      REQUIRE(b->status() == 0);
      CHECK(r.skip == 1);
      CHECK(r.skipped == 6);
      for (int i = 0; i < P; ++i) CHECK(r.g[i] == 0.0);

      Vec params(es, rng.vec(P)), m(es, rng.vec(P)), v(es, rng.vec(P, 0.0, 1.0)), lr(es, Vd{1e-3});
      Vec target(es, rng.vec(P)), u(es, scaled(rng.vec(6), 1.0));
      std::int64_t t = 12;
      const auto p0 = params.bytes(), m0 = m.bytes(), v0 = v.bytes(), tg0 = target.bytes(), u0 = u.bytes();

      dqn::Adam ad;
      ad.params = params.r(), ad.g = r.g.r(), ad.m = m.r(), ad.v = v.r(), ad.P = P, ad.t = &t, ad.lr = lr.r();
      ad.skip = &r.skip;
      b->adam(ad);
      dqn::SpectralMatrix sm{params.r(), u.r(), 6, 5};
      b->spectral_norm(&sm, 1, 6, 5, 1e-3f, &r.skip);  // σ_max tiny: would rescale if it ran
      dqn::TargetUpdate tu;
      tu.target = target.r(), tu.params = params.r(), tu.P = P, tu.tau = 0.5f, tu.t = &t, tu.skip = &r.skip;
      b->target_update(tu);
      tu.period = 4;  // t = 12 is a multiple: a hard copy would be due
      b->target_update(tu);
      REQUIRE(b->status() == 0);
      CHECK(t == 12);
      CHECK(params.bytes() == p0);
      CHECK(m.bytes() == m0);
      CHECK(v.bytes() == v0);
      CHECK(target.bytes() == tg0);
      CHECK(u.bytes() == u0);

      // The next finite step clears skip and leaves the counter.
      BudgetRig ok(*b, rng.vec(2 * P), {0.8, 0.2}, {1.0, 2.0}, 10.0f);
      ok.skipped = 6;
      b->budget(ok.a);
      CHECK(ok.skip == 0);
      CHECK(ok.skipped == 6);
    }
  }
}

TEST_CASE("ops.adam.two_steps") {
  // β1 = .5, β2 = .75 and g chosen so every step works out by hand, e.g. element 0:
  // step 1 m = 1, v = 1, m̂ = 2, v̂ = 4 → θ = 1 − .1·2/(2+ε); step 2 (lr .05, g = −2)
  // m = −.5, v = 1.75, m̂ = −2/3, v̂ = 4 → θ += .05/3.
  Backends be;
  for (EngineBackend* b : {be.f64.get(), be.f32.get()}) {
    CAPTURE(b->name());
    const std::uint32_t es = b->real_size();
    Vec theta(es, Vd{1.0, -0.5, 2.0}), g(es, Vd{2.0, -1.0, 0.5}), m(es, 3), v(es, 3), lr(es, Vd{0.1});
    std::int64_t t = 0;
    const std::int32_t skip = 0;
    dqn::Adam a;
    a.params = theta.r(), a.g = g.r(), a.m = m.r(), a.v = v.r(), a.P = 3, a.t = &t, a.lr = lr.r();
    a.beta1 = 0.5f, a.beta2 = 0.75f, a.eps = 1e-8f, a.skip = &skip;
    b->adam(a);
    REQUIRE(b->status() == 0);
    const double tol = es == 8 ? 1e-15 : 1e-7;
    CHECK(t == 1);
    CHECK(std::abs(theta[0] - 0.90000000049999995) < tol);
    CHECK(std::abs(theta[1] - -0.40000000099999999) < tol);
    CHECK(std::abs(theta[2] - 1.9000000019999999) < tol);
    CHECK(m.get() == Vd{1.0, -0.5, 0.25});
    CHECK(v.get() == Vd{1.0, 0.25, 0.0625});

    g.set(0, -2.0), g.set(1, 3.0);
    lr.set(0, 0.05);  // read from memory at every step
    b->adam(a);
    CHECK(t == 2);
    CHECK(std::abs(theta[0] - 0.91666666708333333) < tol);
    CHECK(std::abs(theta[1] - -0.4353049402561075) < tol);
    CHECK(std::abs(theta[2] - 1.8500000029999999) < tol);
    CHECK(m.get() == Vd{-0.5, 1.25, 0.375});
    CHECK(v.get() == Vd{1.75, 2.4375, 0.109375});
  }
}

TEST_CASE("ops.adam.f32_vs_f64") {
  Backends be;
  Rng rng(17);
  const int P = 29;
  const Vd theta0 = rng.vec(P);
  std::vector<Vd> gs;
  for (int s = 0; s < 5; ++s) gs.push_back(rng.vec(P));
  auto run = [&](EngineBackend& b) {
    const std::uint32_t es = b.real_size();
    Vec theta(es, theta0), g(es, P), m(es, P), v(es, P), lr(es, Vd{1e-3});
    std::int64_t t = 0;
    const std::int32_t skip = 0;
    dqn::Adam a;
    a.params = theta.r(), a.g = g.r(), a.m = m.r(), a.v = v.r(), a.P = P, a.t = &t, a.lr = lr.r(), a.skip = &skip;
    for (const Vd& gi : gs) {
      for (int i = 0; i < P; ++i) g.set(i, gi[i]);
      b.adam(a);
    }
    CHECK(t == 5);
    Vd out = theta.get();
    for (int i = 0; i < P; ++i) out.push_back(m[i]), out.push_back(v[i]);
    return out;
  };
  const Vd got64 = run(*be.f64);
  CHECK(rel_err(run(*be.f32), got64) < 1e-5);
  // Five bias-corrected steps of size ≈ lr each way at most.
  for (int i = 0; i < P; ++i) CHECK(std::abs(got64[i] - theta0[i]) <= 5e-3 * (1 + 1e-6));
}

/// σ_max(W) of a dense row-major matrix: power iteration on WᵀW until it stops moving.
double dense_sigma(const Vd& W, int rows, int cols) {
  Vd x(cols, 1.0), y(rows);
  for (int c = 0; c < cols; ++c) x[c] += 0.01 * c;
  double lambda = 0.0;
  for (int it = 0; it < 20000; ++it) {
    for (int r = 0; r < rows; ++r) {
      y[r] = 0.0;
      for (int c = 0; c < cols; ++c) y[r] += W[r * cols + c] * x[c];
    }
    Vd z(cols, 0.0);
    for (int c = 0; c < cols; ++c)
      for (int r = 0; r < rows; ++r) z[c] += W[r * cols + c] * y[r];
    lambda = norm2(z);
    for (int c = 0; c < cols; ++c) x[c] = z[c] / lambda;
  }
  return std::sqrt(lambda);
}

TEST_CASE("ops.spectral_norm.power_iteration") {
  // Many calls with σ_max out of reach: u converges to the top left singular vector, so ‖Wᵀu‖ is
  // σ_max(W); W itself is left alone. Two matrices per call (wide and tall).
  Backends be;
  Rng rng(18);
  const int r0 = 7, c0 = 13, r1 = 13, c1 = 5;
  const Vd W0 = rng.vec(r0 * c0), W1 = rng.vec(r1 * c1);
  const double s0 = dense_sigma(W0, r0, c0), s1 = dense_sigma(W1, r1, c1);
  for (EngineBackend* b : {be.f64.get(), be.f32.get()}) {
    CAPTURE(b->name());
    const std::uint32_t es = b->real_size();
    Vec w0(es, W0), w1(es, W1), u0(es, scaled(rng.vec(r0), 1.0)), u1(es, scaled(rng.vec(r1), 1.0));
    const auto w0_bytes = w0.bytes(), w1_bytes = w1.bytes();
    const dqn::SpectralMatrix mats[2] = {{w0.r(), u0.r(), r0, c0}, {w1.r(), u1.r(), r1, c1}};
    const std::int32_t skip = 0;
    for (int it = 0; it < 2000; ++it) b->spectral_norm(mats, 2, 13, 13, 1e9f, &skip);
    REQUIRE(b->status() == 0);
    CHECK(w0.bytes() == w0_bytes);
    CHECK(w1.bytes() == w1_bytes);
    auto sigma_from_u = [](const Vd& W, const Vd& u, int rows, int cols) {
      Vd wtu(cols, 0.0);
      for (int c = 0; c < cols; ++c)
        for (int r = 0; r < rows; ++r) wtu[c] += W[r * cols + c] * u[r];
      return norm2(wtu);
    };
    const double tol = es == 8 ? 1e-10 : 1e-5;
    CHECK(std::abs(norm2(u0.get()) - 1.0) < tol);
    CHECK(std::abs(norm2(u1.get()) - 1.0) < tol);
    CHECK(std::abs(sigma_from_u(W0, u0.get(), r0, c0) - s0) < tol * s0);
    CHECK(std::abs(sigma_from_u(W1, u1.get(), r1, c1) - s1) < tol * s1);
  }
}

TEST_CASE("ops.spectral_norm.rescales_to_sigma_max") {
  Backends be;
  EngineBackend& b = *be.f64;
  Rng rng(19);
  const int rows = 7, cols = 13;
  const Vd W = rng.vec(rows * cols);
  const double sigma = dense_sigma(W, rows, cols);
  Vec w(8, W), u(8, scaled(rng.vec(rows), 1.0));
  const dqn::SpectralMatrix mat{w.r(), u.r(), rows, cols};
  const std::int32_t skip = 0;
  for (int it = 0; it < 2000; ++it) b.spectral_norm(&mat, 1, rows, cols, 1e9f, &skip);  // converge u
  // σ_max between the converged σ and the true one would be a coin toss: far below it.
  const float sigma_max = static_cast<float>(0.5 * sigma);
  b.spectral_norm(&mat, 1, rows, cols, sigma_max, &skip);
  REQUIRE(b.status() == 0);
  const double after = dense_sigma(w.get(), rows, cols);
  CHECK(after <= sigma_max * (1 + 1e-6));
  CHECK(after >= sigma_max * (1 - 1e-6));
  // W is only scaled: every element by the same factor.
  const double factor = w[0] / W[0];
  for (int i = 0; i < rows * cols; ++i) CHECK(w[i] == doctest::Approx(W[i] * factor).epsilon(1e-13));
  // Already inside σ_max: W bit-identical.
  const auto bytes = w.bytes();
  b.spectral_norm(&mat, 1, rows, cols, 2.0f * sigma_max, &skip);
  CHECK(w.bytes() == bytes);
}

TEST_CASE("ops.target_update.polyak") {
  Backends be;
  Rng rng(20);
  const int P = 23;
  const Vd T0 = rng.vec(P), TH = rng.vec(P);
  auto run = [&](EngineBackend& b) {
    Vec target(b.real_size(), T0), params(b.real_size(), TH);
    std::int64_t t = 7;
    const std::int32_t skip = 0;
    dqn::TargetUpdate a;
    a.target = target.r(), a.params = params.r(), a.P = P, a.tau = 0.3f, a.period = 0, a.t = &t, a.skip = &skip;
    b.target_update(a);
    b.target_update(a);
    REQUIRE(b.status() == 0);
    return target.get();
  };
  const double tau = 0.3f;
  Vd want(P);
  for (int i = 0; i < P; ++i) {
    const double once = T0[i] + tau * (TH[i] - T0[i]);
    want[i] = once + tau * (TH[i] - once);
  }
  const Vd got64 = run(*be.f64);
  CHECK(rel_err(got64, want) < 1e-15);
  CHECK(rel_err(run(*be.f32), got64) < 1e-5);
}

TEST_CASE("ops.target_update.hard_period") {
  Backends be;
  Rng rng(21);
  const int P = 23;
  for (EngineBackend* b : {be.f64.get(), be.f32.get()}) {
    const std::uint32_t es = b->real_size();
    Vec target(es, rng.vec(P)), params(es, rng.vec(P));
    std::int64_t t = 0;
    const std::int32_t skip = 0;
    dqn::TargetUpdate a;
    a.target = target.r(), a.params = params.r(), a.P = P, a.tau = 0.5f, a.period = 3, a.t = &t, a.skip = &skip;
    const auto original = target.bytes();
    for (std::int64_t step : {1, 2, 4, 5}) {
      t = step;
      b->target_update(a);
      CHECK(target.bytes() == original);  // not due: untouched (τ is not used with a period)
    }
    t = 6;
    b->target_update(a);
    CHECK(target.bytes() == params.bytes());
    REQUIRE(b->status() == 0);
  }
}

// ---- elementwise and memory ---------------------------------------------------------------------

TEST_CASE("ops.uniform") {
  Backends be;
  const std::int64_t n = 100003;
  const std::int64_t step = 41;
  auto draw = [&](EngineBackend& b, std::uint64_t seed, std::uint32_t stream, const std::int64_t* st) {
    Vec out(b.real_size(), static_cast<std::size_t>(n));
    dqn::Uniform u;
    u.out = out.r(), u.n = n, u.seed = seed, u.stream = stream, u.step = st;
    b.uniform(u);
    REQUIRE(b.status() == 0);
    return out.get();
  };
  const Vd x = draw(*be.f64, 7, 1, &step);
  double mean = 0.0;
  for (std::int64_t i = 0; i < n; ++i) {
    REQUIRE(x[i] > 0.0);
    REQUIRE(x[i] < 1.0);
    mean += x[i] / static_cast<double>(n);
  }
  CHECK(std::abs(mean - 0.5) < 0.005);  // ~5 standard errors
  for (std::int64_t i = 0; i < n; i += 997) CHECK(x[i] == dqn::philox::uniform(7, 41, 1, static_cast<std::uint64_t>(i)));
  CHECK(draw(*be.f64, 7, 1, &step) == x);  // reproducible
  CHECK(draw(*be.f32, 7, 1, &step) == x);  // the f32 backend draws the same numbers

  auto fraction_differing = [&](const Vd& y) {
    std::int64_t diff = 0;
    for (std::int64_t i = 0; i < n; ++i) diff += y[i] != x[i];
    return static_cast<double>(diff) / static_cast<double>(n);
  };
  const std::int64_t other_step = 42;
  CHECK(fraction_differing(draw(*be.f64, 7, 1, &other_step)) > 0.99);
  CHECK(fraction_differing(draw(*be.f64, 7, 2, &step)) > 0.99);
  CHECK(fraction_differing(draw(*be.f64, 8, 1, &step)) > 0.99);
  // A null step pointer means step 0.
  const std::int64_t zero = 0;
  CHECK(draw(*be.f64, 7, 1, nullptr) == draw(*be.f64, 7, 1, &zero));

  // uniform_from(u, first): values first … first + n − 1 of the same draw (a rank's rows of it)
  for (EngineBackend* b : {be.f64.get(), be.f32.get()}) {
    CAPTURE(b->name());
    const std::int64_t first = 4000, m = 1000;
    Vec part(b->real_size(), static_cast<std::size_t>(m));
    dqn::Uniform u;
    u.out = part.r(), u.n = m, u.seed = 7, u.stream = 1, u.step = &step;
    b->uniform_from(u, first);
    REQUIRE(b->status() == 0);
    CHECK(part.get() == Vd(x.begin() + first, x.begin() + first + m));
    b->uniform_from(u, -1);
    CHECK(b->status() != 0);
    CHECK(std::string(b->message()).find("negative first value") != std::string::npos);
  }
}

TEST_CASE("ops.memory.fill_copy_axpy") {
  Backends be;
  Rng rng(22);
  const int n = 19;
  const Vd X = rng.vec(n), Y = rng.vec(n);
  for (EngineBackend* b : {be.f64.get(), be.f32.get()}) {
    CAPTURE(b->name());
    const std::uint32_t es = b->real_size();
    Vec x(es, X), y(es, Y), z(es, n + 2, -7.0);
    b->fill(z.r(1), 0.25f, n);
    CHECK(z[0] == -7.0);
    CHECK(z[n + 1] == -7.0);
    for (int i = 1; i <= n; ++i) CHECK(z[i] == 0.25);
    b->copy(z.r(1), x.r(), n);
    for (int i = 0; i < n; ++i) CHECK(z[i + 1] == x[i]);
    b->axpy(y.r(), x.r(), -1.5f, n);
    for (int i = 0; i < n; ++i) CHECK(y[i] == doctest::Approx(Y[i] - 1.5 * X[i]).epsilon(es == 8 ? 1e-15 : 1e-6));
    REQUIRE(b->status() == 0);
  }
}

TEST_CASE("ops.memory.upload_download") {
  Backends be;
  Rng rng(23);
  const int n = 11;
  std::vector<float> host(n);
  for (float& h : host) h = static_cast<float>(rng.uniform());
  for (EngineBackend* b : {be.f64.get(), be.f32.get()}) {
    CAPTURE(b->name());
    const std::uint32_t es = b->real_size();
    Vec dev(es, n, kNaN);
    b->upload_reals(dev.r(), host.data(), n);
    for (int i = 0; i < n; ++i) CHECK(dev[i] == static_cast<double>(host[i]));  // widening is exact
    std::vector<float> back(n, -1.0f);
    b->download_reals(back.data(), dev.r(), n);
    CHECK(back == host);

    std::vector<std::int32_t> ints = {3, -1, 4, 1, 5}, dst(5, 0), back_ints(5, 0);
    b->upload(dst.data(), ints.data(), ints.size() * sizeof(std::int32_t));
    CHECK(dst == ints);
    b->download(back_ints.data(), dst.data(), dst.size() * sizeof(std::int32_t));
    CHECK(back_ints == ints);
    REQUIRE(b->status() == 0);
  }
}

TEST_CASE("ops.errors.element_size_mismatch") {
  // A Real of the wrong element size is a bug in the caller: recorded (first error kept), no write.
  auto b = dqn::make_cpu_backend(true);
  Vec x32(4, 8, 1.0), y64(8, 8, 2.0);
  b->fill(x32.r(), 3.0f, 8);
  CHECK(b->status() != 0);
  const std::string first = b->message();
  CHECK(first.find("fill") != std::string::npos);
  CHECK(x32.get() == Vd(8, 1.0));
  b->copy(y64.r(), Real{nullptr, 8}, 8);
  CHECK(std::string(b->message()) == first);
  CHECK(y64.get() == Vd(8, 2.0));
}

TEST_CASE("ops.cpu_runtime") {
  for (bool f64 : {false, true}) {
    CAPTURE(f64);
    auto rt = dqn::make_cpu_runtime(f64);
    CHECK(rt->ops().real_size() == (f64 ? 8u : 4u));
    CHECK_FALSE(rt->captures());
    CHECK(rt->describe().find("cpu") != std::string::npos);
    void* arena = rt->alloc_arena(1000);
    REQUIRE(arena != nullptr);
    CHECK(reinterpret_cast<std::uintptr_t>(arena) % 256 == 0);
    std::memset(arena, 0xAB, 1000);
    CHECK(rt->peak_bytes() >= 1000);
    CHECK_THROWS_AS(rt->alloc_arena(10), std::logic_error);
    void* host = rt->alloc_host(64);
    REQUIRE(host != nullptr);
    CHECK(reinterpret_cast<std::uintptr_t>(host) % 256 == 0);
    rt->copy_to_host_async(host, arena, 64, 0);
    CHECK(rt->ready(0));
    rt->synchronize();
    CHECK(static_cast<unsigned char*>(host)[63] == 0xAB);
    rt->free_host(host);
  }
}

