// Numeric tests of the CPU reference op table's layer, distribution and auxiliary-head ops: each
// against a naive double reference written here, the f32 backend against the f64 one, and central
// differences for every backward op.
#include <doctest/doctest.h>

#include "ops_util.hpp"

using namespace ops_util;

TEST_CASE("ops.names") {
  Backends be;
  CHECK(std::string(be.f64->name()) == "cpu-f64");
  CHECK(std::string(be.f32->name()) == "cpu");
  CHECK(be.f64->real_size() == 8);
  CHECK(be.f32->real_size() == 4);
  CHECK_FALSE(be.f64->is_device());
  CHECK(be.f64->status() == 0);
  CHECK(std::string(be.f64->message()).empty());
}

TEST_CASE("ops.gemm.forward") {
  Backends be;
  Rng rng(1);
  const int m = 7, n = 5, k = 13, batch = 3;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      CAPTURE(ta);
      CAPTURE(tb);
      dqn::Gemm g;
      g.ta = ta != 0;
      g.tb = tb != 0;
      g.m = m, g.n = n, g.k = k;
      g.alpha = 0.75f, g.beta = -1.25f;
      const int rows_a = g.ta ? k : m, rows_b = g.tb ? n : k;
      g.lda = (g.ta ? m : k) + 2;
      g.ldb = (g.tb ? k : n) + 3;
      g.ldc = n + 1;
      g.batch = batch;
      g.stride_a = rows_a * g.lda + 3;
      g.stride_b = rows_b * g.ldb + 1;
      g.stride_c = m * g.ldc + 2;
      const Vd A = rng.vec(g.stride_a * batch), B = rng.vec(g.stride_b * batch), C0 = rng.vec(g.stride_c * batch);
      const Vd want = naive_gemm(g, A, B, C0);  // padding of C stays as it was
      auto run = [&](Backend& b) {
        Vec a(b.real_size(), A), bb(b.real_size(), B), c(b.real_size(), C0);
        g.a = a.r(), g.b = bb.r(), g.c = c.r();
        b.gemm(g);
        REQUIRE(b.status() == 0);
        return c.get();
      };
      const Vd got64 = run(*be.f64);
      CHECK(rel_err(got64, want) < 1e-13);
      CHECK(rel_err(run(*be.f32), got64) < 1e-5);
    }
}

TEST_CASE("ops.gemm.beta_zero_ignores_nan") {
  Backends be;
  Rng rng(2);
  dqn::Gemm g;
  g.m = 7, g.n = 5, g.k = 13, g.lda = 13, g.ldb = 5, g.ldc = 6, g.alpha = 1.0f, g.beta = 0.0f;
  const Vd A = rng.vec(7 * 13), B = rng.vec(13 * 5);
  Vd want = naive_gemm(g, A, B, Vd(7 * 6, 0.0));
  for (int i = 0; i < 7; ++i) want[i * 6 + 5] = kNaN;  // the padding column is not touched
  for (Backend* b : {be.f64.get(), be.f32.get()}) {
    Vec a(b->real_size(), A), bb(b->real_size(), B), c(b->real_size(), 7 * 6, kNaN);
    g.a = a.r(), g.b = bb.r(), g.c = c.r();
    b->gemm(g);
    const Vd got = c.get();
    for (int i = 0; i < 7; ++i)
      for (int j = 0; j < 6; ++j) {
        if (j == 5) {
          CHECK(std::isnan(got[i * 6 + j]));
        } else {
          CHECK(std::isfinite(got[i * 6 + j]));
          CHECK(got[i * 6 + j] == doctest::Approx(want[i * 6 + j]).epsilon(1e-5));
        }
      }
  }
}

TEST_CASE("ops.gemm.epilogue: bias and activation equal gemm then bias_act, bit for bit") {
  Backends be;
  Rng rng(3);
  const int m = 6, n = 5, k = 9, batch = 3;
  for (const int kk : {k, 0})
    for (const float beta : {0.0f, 0.5f})
      for (const int with_bias : {1, 0})
        for (const dqn::Act act : {dqn::Act::none, dqn::Act::relu}) {
          if (!with_bias && act == dqn::Act::none) continue;
          CAPTURE(kk);
          CAPTURE(beta);
          CAPTURE(with_bias);
          CAPTURE(static_cast<int>(act));
          dqn::Gemm g;
          g.tb = true;
          g.m = m, g.n = n, g.k = kk;
          g.alpha = 0.75f, g.beta = beta;
          g.lda = k + 1, g.ldb = k + 2, g.ldc = n + 1;
          g.batch = batch;
          g.stride_a = m * g.lda, g.stride_b = n * g.ldb + 1, g.stride_c = m * g.ldc + 2;
          const std::int64_t stride_bias = n + 3;
          const Vd A = rng.vec(g.stride_a * batch), B = rng.vec(g.stride_b * batch), C0 = rng.vec(g.stride_c * batch),
                   bias = rng.vec(stride_bias * batch);
          for (Backend* b : {be.f64.get(), be.f32.get()}) {
            CAPTURE(b->name());
            Vec a(b->real_size(), A), bb(b->real_size(), B), bv(b->real_size(), bias);
            Vec fused(b->real_size(), C0), split(b->real_size(), C0);
            dqn::Gemm f = g;
            f.a = a.r(), f.b = bb.r(), f.c = fused.r();
            if (with_bias) f.bias = bv.r(), f.stride_bias = stride_bias;
            f.act = act;
            b->gemm(f);
            dqn::Gemm p = g;
            p.a = a.r(), p.b = bb.r(), p.c = split.r();
            b->gemm(p);
            for (int i = 0; i < batch; ++i)
              b->bias_act(split.r() + i * g.stride_c, with_bias ? bv.r() + i * stride_bias : Real{nullptr, b->real_size()},
                          m, n, g.ldc, act);
            REQUIRE(b->status() == 0);
            CHECK(fused.bytes() == split.bytes());
          }
        }
  // An unknown activation is refused.
  auto cpu = dqn::make_cpu_backend(false);
  Vec c(4, 4, 0.0);
  dqn::Gemm g;
  g.m = 2, g.n = 2, g.k = 0, g.ldc = 2, g.c = c.r();
  g.act = static_cast<dqn::Act>(7);
  cpu->gemm(g);
  CHECK(cpu->status() != 0);
}

TEST_CASE("ops.gemm.mask: the ReLU backward in the GEMM equals gemm then relu_backward, bit for bit") {
  // Gemm::mask (ABI 8): C[r, c] = 0 where mask[(r mod mask_rows)·ldmask + c] <= 0, last (after the
  // bias and activation); per batch entry mask + i·stride_mask; mask_rows 0 means m.
  Backends be;
  Rng rng(11);
  const int m = 12, n = 5, k = 7, batch = 2;
  for (const int mask_rows : {0, 4})
    for (const int kk : {k, 0})
      for (const int with_bias : {0, 1}) {
        CAPTURE(mask_rows);
        CAPTURE(kk);
        CAPTURE(with_bias);
        dqn::Gemm g;
        g.tb = true;
        g.m = m, g.n = n, g.k = kk;
        g.beta = kk == 0 ? 0.5f : 0.0f;
        g.lda = k + 1, g.ldb = k + 2, g.ldc = n + 1;
        g.batch = batch;
        g.stride_a = m * g.lda, g.stride_b = n * g.ldb + 1, g.stride_c = m * g.ldc + 2;
        const int rows = mask_rows > 0 ? mask_rows : m, ldmask = n + 3;
        const std::int64_t stride_mask = rows * ldmask + 1;
        Vd M = rng.vec(static_cast<std::size_t>(stride_mask * batch));
        for (std::size_t i = 0; i < M.size(); i += 4) M[i] = 0.0;  // zeros mask too
        const Vd A = rng.vec(g.stride_a * batch), B = rng.vec(g.stride_b * batch), C0 = rng.vec(g.stride_c * batch),
                 bias = rng.vec(n);
        // the mask as relu_backward reads it: a full [m, n] block per batch entry with C's row stride
        Vd full(static_cast<std::size_t>(m) * g.ldc * batch, 1.0);
        for (int i = 0; i < batch; ++i)
          for (int r = 0; r < m; ++r)
            for (int c = 0; c < n; ++c)
              full[static_cast<std::size_t>((i * m + r) * g.ldc + c)] =
                  M[static_cast<std::size_t>(i * stride_mask + (r % rows) * ldmask + c)];
        for (Backend* b : {be.f64.get(), be.f32.get()}) {
          CAPTURE(b->name());
          Vec a(b->real_size(), A), bb(b->real_size(), B), bv(b->real_size(), bias), mk(b->real_size(), M),
              fm(b->real_size(), full);
          Vec fused(b->real_size(), C0), split(b->real_size(), C0);
          dqn::Gemm f = g;
          f.a = a.r(), f.b = bb.r(), f.c = fused.r();
          if (with_bias) f.bias = bv.r(), f.act = dqn::Act::relu;
          f.mask = mk.r(), f.ldmask = ldmask, f.mask_rows = mask_rows, f.stride_mask = stride_mask;
          b->gemm(f);
          dqn::Gemm p = f;
          p.c = split.r(), p.mask = Real{};
          b->gemm(p);
          for (int i = 0; i < batch; ++i)
            b->relu_backward(split.r() + i * g.stride_c, fm.r() + i * m * g.ldc, m, n, g.ldc);
          REQUIRE(b->status() == 0);
          CHECK(fused.bytes() == split.bytes());
        }
      }
  // a mask row shorter than n, or a negative period, is refused with the reason
  auto cpu = dqn::make_cpu_backend(false);
  Vec c(4, 8, 1.0), mk(4, 8, 1.0);
  dqn::Gemm g;
  g.m = 2, g.n = 4, g.k = 0, g.ldc = 4, g.c = c.r(), g.mask = mk.r(), g.ldmask = 3;
  cpu->gemm(g);
  CHECK(cpu->status() != 0);
  CHECK(std::string(cpu->message()).find("mask needs ldmask >= n") != std::string::npos);
}

TEST_CASE("ops.gemm.batch2: a second batch dimension equals one call per entry, bit for bit") {
  // Gemm::batch2 (ABI 9): entry (i, j) at X + i·stride_x + j·stride2_x for a, b, c, bias, mask.
  Backends be;
  Rng rng(13);
  const int m = 6, n = 5, k = 7, batch = 2, batch2 = 3;
  dqn::Gemm g;
  g.tb = true;
  g.m = m, g.n = n, g.k = k;
  g.lda = k + 1, g.ldb = k + 2, g.ldc = n + 1, g.ldmask = n + 2;
  g.batch = batch, g.batch2 = batch2;
  // the second dimension interleaved inside the first's entries, as an ensemble's branches are
  g.stride2_a = 3, g.stride2_b = 2, g.stride2_c = m * g.ldc, g.stride2_bias = n, g.stride2_mask = 1;
  g.stride_a = m * g.lda + 3 * batch2, g.stride_b = n * g.ldb + 2 * batch2, g.stride_c = m * g.ldc * batch2 + 1;
  g.stride_bias = n * batch2, g.stride_mask = m * g.ldmask + batch2;
  g.act = dqn::Act::relu;
  const Vd A = rng.vec(g.stride_a * batch), B = rng.vec(g.stride_b * batch), C0 = rng.vec(g.stride_c * batch),
           bias = rng.vec(g.stride_bias * batch), M = rng.vec(g.stride_mask * batch);
  for (Backend* b : {be.f64.get(), be.f32.get()}) {
    CAPTURE(b->name());
    Vec a(b->real_size(), A), bb(b->real_size(), B), bv(b->real_size(), bias), mk(b->real_size(), M);
    Vec both(b->real_size(), C0), each(b->real_size(), C0);
    dqn::Gemm f = g;
    f.a = a.r(), f.b = bb.r(), f.c = both.r(), f.bias = bv.r(), f.mask = mk.r();
    b->gemm(f);
    dqn::Gemm e = f;
    e.c = each.r();
    for (int j = 0; j < batch2; ++j) {
      const dqn::Gemm one = dqn::batch2_entry(e, j);
      CHECK(one.batch2 == 1);
      CHECK(one.c.p == static_cast<const void*>(static_cast<char*>(each.r().p) + j * g.stride2_c * b->real_size()));
      b->gemm(one);
    }
    REQUIRE(b->status() == 0);
    CHECK(both.bytes() == each.bytes());
    CHECK(both.bytes() != Vec(b->real_size(), C0).bytes());  // it wrote something
  }
  auto cpu = dqn::make_cpu_backend(false);
  Vec c(4, 8, 1.0);
  dqn::Gemm bad;
  bad.m = 2, bad.n = 4, bad.k = 0, bad.ldc = 4, bad.c = c.r(), bad.batch2 = 0;
  cpu->gemm(bad);
  CHECK(cpu->status() != 0);
  CHECK(std::string(cpu->message()).find("batch2 must be at least 1") != std::string::npos);
}

TEST_CASE("ops.gemm.sum_batch: the entries' products summed into one C equal one GEMM over their k, bit for bit") {
  // Gemm::sum_batch (ABI 9): C = alpha·Σ_i A_i B_i, as the ensemble's ∂L/∂h2 = Σ_k dhidden_k W1_k.
  Backends be;
  Rng rng(14);
  const int m = 5, n = 6, k = 4, batch = 3;
  dqn::Gemm g;
  g.m = m, g.n = n, g.k = k, g.alpha = 0.5f;
  g.lda = k + 1, g.ldb = n + 2, g.ldc = n + 3;
  g.batch = batch, g.sum_batch = 1;
  g.stride_a = m * g.lda + 1, g.stride_b = k * g.ldb + 2;
  const Vd A = rng.vec(g.stride_a * batch), B = rng.vec(g.stride_b * batch);
  // the same numbers as one GEMM over k·batch: A's entries side by side, B's stacked
  Vd Acat(static_cast<std::size_t>(m) * k * batch), Bcat(static_cast<std::size_t>(k) * batch * n);
  for (int i = 0; i < batch; ++i)
    for (int p = 0; p < k; ++p) {
      for (int r = 0; r < m; ++r)
        Acat[static_cast<std::size_t>(r * k * batch + i * k + p)] = A[static_cast<std::size_t>(i * g.stride_a + r * g.lda + p)];
      for (int c = 0; c < n; ++c)
        Bcat[static_cast<std::size_t>((i * k + p) * n + c)] = B[static_cast<std::size_t>(i * g.stride_b + p * g.ldb + c)];
    }
  for (Backend* b : {be.f64.get(), be.f32.get()}) {
    CAPTURE(b->name());
    Vec a(b->real_size(), A), bb(b->real_size(), B), ac(b->real_size(), Acat), bc(b->real_size(), Bcat);
    Vec summed(b->real_size(), static_cast<std::size_t>(m) * g.ldc, kNaN), one(b->real_size(), static_cast<std::size_t>(m) * g.ldc, kNaN);
    dqn::Gemm f = g;
    f.a = a.r(), f.b = bb.r(), f.c = summed.r();
    b->gemm(f);
    dqn::Gemm w;
    w.m = m, w.n = n, w.k = k * batch, w.alpha = g.alpha, w.lda = k * batch, w.ldb = n, w.ldc = g.ldc;
    w.a = ac.r(), w.b = bc.r(), w.c = one.r();
    b->gemm(w);
    REQUIRE(b->status() == 0);
    CHECK(summed.bytes() == one.bytes());
    // no entries: the empty sum, C = 0 in its m × n (as a GEMM with k = 0 and beta 0), the row
    // padding untouched; A and B are not read
    Vec empty(b->real_size(), static_cast<std::size_t>(m) * g.ldc, kNaN);
    dqn::Gemm z = g;
    z.batch = 0, z.a = dqn::Real{}, z.b = dqn::Real{}, z.c = empty.r();
    b->gemm(z);
    REQUIRE(b->status() == 0);
    for (int r = 0; r < m; ++r)
      for (int c = 0; c < g.ldc; ++c) {
        const double v = empty[static_cast<std::size_t>(r * g.ldc + c)];
        if (c < n) CHECK(v == 0.0);
        else CHECK(std::isnan(v));
      }
  }
  // an epilogue, beta or a second batch dimension with it is refused, with the reason
  auto cpu = dqn::make_cpu_backend(false);
  Vec a(4, 64, 1.0), c(4, 64, 1.0);
  dqn::Gemm bad = g;
  bad.a = a.r(), bad.b = a.r(), bad.c = c.r(), bad.stride_a = bad.stride_b = 0, bad.beta = 1.0f;
  cpu->gemm(bad);
  CHECK(std::string(cpu->message()).find("sum_batch needs beta 0") != std::string::npos);
  auto cpu2 = dqn::make_cpu_backend(false);
  bad.beta = 0.0f, bad.batch2 = 2;
  cpu2->gemm(bad);
  CHECK(std::string(cpu2->message()).find("sum_batch needs batch2 1") != std::string::npos);
}

TEST_CASE("ops.relu_bias_grad.mask_only: a null db masks and sums nothing") {
  Backends be;
  Rng rng(12);
  const int rows = 6, cols = 5, ld = 7, heads = 3;
  const std::int64_t stride = rows * ld + 2;
  const Vd y = rng.vec(static_cast<std::size_t>(rows) * ld), dy = rng.vec(static_cast<std::size_t>(stride) * heads);
  for (Backend* b : {be.f64.get(), be.f32.get()}) {
    CAPTURE(b->name());
    Vec yv(b->real_size(), y), masked(b->real_size(), dy), ref(b->real_size(), dy);
    b->relu_bias_grad(masked.r(), yv.r(), Real{}, rows, cols, ld, heads, stride, 0, 0);
    for (int h = 0; h < heads; ++h) b->relu_backward(ref.r() + h * stride, yv.r(), rows, cols, ld);
    REQUIRE(b->status() == 0);
    CHECK(masked.bytes() == ref.bytes());
  }
}

TEST_CASE("ops.gemm.fd") {
  // A dense layer Y_i = X_i W_iᵀ per batch entry, L = ½‖Y − T‖²; its backward gemms are the ones a
  // layer uses: dX = dY·W and dW = dYᵀ·X (here in two row blocks, the second with beta = 1).
  Backends be;
  Backend& b = *be.f64;
  Rng rng(3);
  const int batch = 3, rows = 7, in = 13, out = 5;
  // Small inputs keep L near 5: the FD roundoff grows with |L|/eps.
  Vec X(8, rng.vec(batch * rows * in, -0.5, 0.5)), W(8, rng.vec(batch * out * in, -0.5, 0.5)), Y(8, batch * rows * out);
  const Vd T = rng.vec(batch * rows * out, -0.3, 0.3);
  auto forward = [&] {
    dqn::Gemm g;
    g.tb = true, g.m = rows, g.n = out, g.k = in;
    g.a = X.r(), g.lda = in, g.b = W.r(), g.ldb = in, g.c = Y.r(), g.ldc = out;
    g.batch = batch, g.stride_a = rows * in, g.stride_b = out * in, g.stride_c = rows * out;
    b.gemm(g);
    double L = 0.0;
    for (std::size_t i = 0; i < T.size(); ++i) L += 0.5 * (Y[i] - T[i]) * (Y[i] - T[i]);
    return L;
  };
  forward();
  Vd dy(T.size());
  for (std::size_t i = 0; i < T.size(); ++i) dy[i] = Y[i] - T[i];
  Vec dY(8, dy), dX(8, X.size(), kNaN), dW(8, W.size(), kNaN);

  dqn::Gemm gx;
  gx.m = rows, gx.n = in, gx.k = out;
  gx.a = dY.r(), gx.lda = out, gx.b = W.r(), gx.ldb = in, gx.c = dX.r(), gx.ldc = in;
  gx.batch = batch, gx.stride_a = rows * out, gx.stride_b = out * in, gx.stride_c = rows * in;
  b.gemm(gx);

  dqn::Gemm gw;
  gw.ta = true, gw.m = out, gw.n = in, gw.k = 4;
  gw.a = dY.r(), gw.lda = out, gw.b = X.r(), gw.ldb = in, gw.c = dW.r(), gw.ldc = in;
  gw.batch = batch, gw.stride_a = rows * out, gw.stride_b = rows * in, gw.stride_c = out * in;
  b.gemm(gw);
  gw.k = rows - 4, gw.a = dY.r(4 * out), gw.b = X.r(4 * in), gw.beta = 1.0f;
  b.gemm(gw);
  REQUIRE(b.status() == 0);

  CHECK(grad_err(X, dX.get(), forward) < 1e-6);
  CHECK(grad_err(W, dW.get(), forward) < 1e-6);
}

TEST_CASE("ops.bias_act.forward") {
  Backends be;
  Rng rng(4);
  const int rows = 7, cols = 13, ld = 16;
  const Vd Y0 = rng.vec(rows * ld), bias = rng.vec(cols);
  for (int mode = 0; mode < 3; ++mode) {  // none, relu, relu without a bias
    CAPTURE(mode);
    const dqn::Act act = mode == 0 ? dqn::Act::none : dqn::Act::relu;
    Vd want = Y0;
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c) {
        double x = Y0[r * ld + c] + (mode == 2 ? 0.0 : bias[c]);
        if (act == dqn::Act::relu && x < 0.0) x = 0.0;
        want[r * ld + c] = x;
      }
    auto run = [&](Backend& b) {
      Vec y(b.real_size(), Y0), bb(b.real_size(), bias);
      b.bias_act(y.r(), mode == 2 ? Real{nullptr, b.real_size()} : bb.r(), rows, cols, ld, act);
      REQUIRE(b.status() == 0);
      return y.get();
    };
    const Vd got64 = run(*be.f64);
    CHECK(rel_err(got64, want) < 1e-15);
    CHECK(rel_err(run(*be.f32), got64) < 1e-5);
  }
}

TEST_CASE("ops.bias_grad.fd") {
  // Y = X Wᵀ + b (Y with a padded row stride), L = ½‖Y − T‖², db = Σ_rows dY.
  Backends be;
  Backend& b = *be.f64;
  Rng rng(5);
  const int rows = 7, in = 13, out = 5, ldy = out + 2;
  Vec X(8, rng.vec(rows * in)), W(8, rng.vec(out * in)), bias(8, rng.vec(out)), Y(8, rows * ldy);
  const Vd T = rng.vec(rows * ldy);
  auto forward = [&] {
    dqn::Gemm g;
    g.tb = true, g.m = rows, g.n = out, g.k = in;
    g.a = X.r(), g.lda = in, g.b = W.r(), g.ldb = in, g.c = Y.r(), g.ldc = ldy;
    b.gemm(g);
    b.bias_act(Y.r(), bias.r(), rows, out, ldy, dqn::Act::none);
    double L = 0.0;
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < out; ++c) L += 0.5 * std::pow(Y[r * ldy + c] - T[r * ldy + c], 2);
    return L;
  };
  forward();
  Vd dy(rows * ldy, kNaN);  // padding is garbage that must not be read
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < out; ++c) dy[r * ldy + c] = Y[r * ldy + c] - T[r * ldy + c];
  Vec dY(8, dy), db(8, out, kNaN);
  b.bias_grad(db.r(), dY.r(), rows, out, ldy, 0.0f);  // beta 0 ignores the NaN in db
  REQUIRE(b.status() == 0);
  const Vd grad = db.get();
  CHECK(grad_err(bias, grad, forward) < 1e-6);

  // beta accumulates: db = 0.5·db + Σ dY.
  const Vd prev = rng.vec(out);
  Vec acc(8, prev);
  b.bias_grad(acc.r(), dY.r(), rows, out, ldy, 0.5f);
  for (int c = 0; c < out; ++c) CHECK(acc[c] == doctest::Approx(0.5 * prev[c] + grad[c]).epsilon(1e-14));

  Vec dY32(4, dy), acc32(4, prev);
  be.f32->bias_grad(acc32.r(), dY32.r(), rows, out, ldy, 0.5f);
  CHECK(rel_err(acc32.get(), acc.get()) < 1e-5);
}

TEST_CASE("ops.relu_backward.fd") {
  // Y = relu(X Wᵀ + b), L = ½‖Y − T‖²; dpre = relu_backward(dY, Y), then db and dW from dpre.
  Backends be;
  Backend& b = *be.f64;
  Rng rng(6);
  const int rows = 7, in = 13, out = 5, ld = out + 3;
  Vec X(8, rng.vec(rows * in)), W(8, rng.vec(out * in)), bias(8, rng.vec(out, -0.3, 0.3)), Y(8, rows * ld);
  const Vd T = rng.vec(rows * ld);
  auto pre_activation = [&] {
    dqn::Gemm g;
    g.tb = true, g.m = rows, g.n = out, g.k = in;
    g.a = X.r(), g.lda = in, g.b = W.r(), g.ldb = in, g.c = Y.r(), g.ldc = ld;
    b.gemm(g);
    b.bias_act(Y.r(), bias.r(), rows, out, ld, dqn::Act::none);
  };
  auto forward = [&] {
    pre_activation();
    b.bias_act(Y.r(), Real{nullptr, 8}, rows, out, ld, dqn::Act::relu);
    double L = 0.0;
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < out; ++c) L += 0.5 * std::pow(Y[r * ld + c] - T[r * ld + c], 2);
    return L;
  };
  // Away from the kink: no pre-activation within FD reach of 0; and both signs present.
  pre_activation();
  int negative = 0;
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < out; ++c) {
      REQUIRE(std::abs(Y[r * ld + c]) > 1e-3);
      negative += Y[r * ld + c] < 0.0;
    }
  REQUIRE(negative > 5);
  REQUIRE(negative < rows * out - 5);

  forward();
  Vd dy(rows * ld, 0.0);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < out; ++c) dy[r * ld + c] = Y[r * ld + c] - T[r * ld + c];
  Vec dpre(8, dy);
  b.relu_backward(dpre.r(), Y.r(), rows, out, ld);
  Vec db(8, out), dW(8, out * in);
  b.bias_grad(db.r(), dpre.r(), rows, out, ld, 0.0f);
  dqn::Gemm gw;
  gw.ta = true, gw.m = out, gw.n = in, gw.k = rows;
  gw.a = dpre.r(), gw.lda = ld, gw.b = X.r(), gw.ldb = in, gw.c = dW.r(), gw.ldc = in;
  b.gemm(gw);
  REQUIRE(b.status() == 0);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < out; ++c)
      if (Y[r * ld + c] <= 0.0) CHECK(dpre[r * ld + c] == 0.0);
  CHECK(grad_err(bias, db.get(), forward) < 1e-6);
  CHECK(grad_err(W, dW.get(), forward) < 1e-6);

  Vec dpre32(4, dy), Y32(4, Y.get());
  be.f32->relu_backward(dpre32.r(), Y32.r(), rows, out, ld);
  CHECK(rel_err(dpre32.get(), dpre.get()) < 1e-5);
}

// ---- distributional head ------------------------------------------------------------------------

TEST_CASE("ops.dueling.forward") {
  Backends be;
  Rng rng(7);
  const int rows = 3, D = 3, A = 5, Z = 7, ldv = Z + 3;
  const Vd V = rng.vec(rows * ldv), Adv = rng.vec(rows * D * A * Z);
  Vd want(Adv.size());
  for (int b = 0; b < rows; ++b)
    for (int d = 0; d < D; ++d)
      for (int a = 0; a < A; ++a)
        for (int i = 0; i < Z; ++i) {
          double mean = 0.0;
          for (int a2 = 0; a2 < A; ++a2) mean += Adv[((b * D + d) * A + a2) * Z + i] / A;
          want[((b * D + d) * A + a) * Z + i] = V[b * ldv + i] + Adv[((b * D + d) * A + a) * Z + i] - mean;
        }
  auto run = [&](Backend& b, bool in_place) {
    Vec v(b.real_size(), V), adv(b.real_size(), Adv), logits(b.real_size(), Adv.size(), kNaN);
    Vec& out = in_place ? adv : logits;
    b.dueling_combine(out.r(), v.r(), ldv, adv.r(), rows, D, A, Z);
    REQUIRE(b.status() == 0);
    return out.get();
  };
  const Vd got64 = run(*be.f64, false);
  CHECK(rel_err(got64, want) < 1e-14);
  CHECK(rel_err(run(*be.f64, true), want) < 1e-14);
  CHECK(rel_err(run(*be.f32, false), got64) < 1e-5);
}

TEST_CASE("ops.dueling.fd") {
  // L = Σ c ⊙ tanh(logits(v, adv)); dueling_backward maps dL/dlogits to dv and dadv.
  Backends be;
  Backend& b = *be.f64;
  Rng rng(8);
  const int rows = 3, D = 3, A = 5, Z = 7, ldv = Z + 2;
  const std::size_t n = static_cast<std::size_t>(rows) * D * A * Z;
  Vec v(8, rng.vec(rows * ldv)), adv(8, rng.vec(n)), logits(8, n);
  const Vd c = rng.vec(n);
  auto forward = [&] {
    b.dueling_combine(logits.r(), v.r(), ldv, adv.r(), rows, D, A, Z);
    double L = 0.0;
    for (std::size_t i = 0; i < n; ++i) L += c[i] * std::tanh(logits[i]);
    return L;
  };
  forward();
  Vd dl(n);
  for (std::size_t i = 0; i < n; ++i) dl[i] = c[i] * (1.0 - std::pow(std::tanh(logits[i]), 2));
  Vec dlogits(8, dl), dv(8, rows * ldv, kNaN), dadv(8, n, kNaN);
  b.dueling_backward(dv.r(), ldv, dadv.r(), 0, dlogits.r(), rows, D, A, Z);
  REQUIRE(b.status() == 0);
  // dv's padding columns are not written; v's padding does not enter the loss.
  Vd dv_full = dv.get();
  for (int r = 0; r < rows; ++r)
    for (int i = Z; i < ldv; ++i) {
      CHECK(std::isnan(dv_full[r * ldv + i]));
      dv_full[r * ldv + i] = 0.0;
    }
  CHECK(grad_err(v, dv_full, forward) < 1e-6);
  CHECK(grad_err(adv, dadv.get(), forward) < 1e-6);

  // In place (dadv aliasing dlogits) gives the same; f32 agrees with f64.
  Vec inplace(8, dl), dv2(8, rows * ldv);
  b.dueling_backward(dv2.r(), ldv, inplace.r(), 0, inplace.r(), rows, D, A, Z);
  CHECK(rel_err(inplace.get(), dadv.get()) < 1e-15);
  // A padded dadv (each (row, branch) block lddadv = A·Z + 3 apart): the same values, the
  // padding set to zero (ABI 9: column sums over whole blocks then give zero padding gradients).
  const int ldd = A * Z + 3;
  Vec padded(8, static_cast<std::size_t>(rows) * D * ldd, kNaN), dv3(8, rows * ldv);
  b.dueling_backward(dv3.r(), ldv, padded.r(), ldd, dlogits.r(), rows, D, A, Z);
  REQUIRE(b.status() == 0);
  {
    const Vd pg = padded.get(), want = dadv.get();
    int bad = 0, pad_zero = 0;
    for (int rd = 0; rd < rows * D; ++rd)
      for (int k = 0; k < ldd; ++k) {
        const double x = pg[static_cast<std::size_t>(rd) * ldd + k];
        if (k >= A * Z) pad_zero += x == 0.0;
        else bad += x != want[static_cast<std::size_t>(rd) * A * Z + k];
      }
    CHECK(bad == 0);
    CHECK(pad_zero == rows * D * 3);
  }
  b.dueling_backward(dv3.r(), ldv, padded.r(), A * Z - 1, dlogits.r(), rows, D, A, Z);
  CHECK(b.status() != 0);  // a stride shorter than a block is refused
  Vec dl32(4, dl), dv32(4, rows * ldv, kNaN), dadv32(4, n);
  be.f32->dueling_backward(dv32.r(), ldv, dadv32.r(), 0, dl32.r(), rows, D, A, Z);
  CHECK(rel_err(dadv32.get(), dadv.get()) < 1e-5);
  Vd dv32_full = dv32.get();
  for (int r = 0; r < rows; ++r)
    for (int i = Z; i < ldv; ++i) dv32_full[r * ldv + i] = 0.0;
  CHECK(rel_err(dv32_full, dv_full) < 1e-5);
}

TEST_CASE("ops.log_softmax.forward") {
  Backends be;
  Rng rng(9);
  const int rows = 3, n = 13;
  const Vd X = rng.vec(rows * n, -3.0, 3.0);
  const Vd want = naive_log_softmax(X, rows, n);
  auto run = [&](Backend& b) {
    Vec x(b.real_size(), X), y(b.real_size(), X.size());
    b.log_softmax(y.r(), x.r(), rows, n);
    REQUIRE(b.status() == 0);
    return y.get();
  };
  const Vd got64 = run(*be.f64);
  CHECK(rel_err(got64, want) < 1e-14);
  for (int r = 0; r < rows; ++r) {
    double s = 0.0;
    for (int i = 0; i < n; ++i) s += std::exp(got64[r * n + i]);
    CHECK(s == doctest::Approx(1.0).epsilon(1e-14));
  }
  CHECK(rel_err(run(*be.f32), got64) < 1e-5);
}

TEST_CASE("ops.log_softmax.huge_logits") {
  Backends be;
  const Vd X = {1e4, 0.0, -1e4, 1e4 - 1.0, -1e4, -1e4, -1e4, -1e4};
  const double l = std::log1p(std::exp(-1.0));  // logsumexp of the first row is 1e4 + l
  const Vd want = {-l, -1e4 - l, -2e4 - l, -1.0 - l, -std::log(4.0), -std::log(4.0), -std::log(4.0), -std::log(4.0)};
  for (Backend* b : {be.f64.get(), be.f32.get()}) {
    CAPTURE(b->name());
    Vec x(b->real_size(), X), y(b->real_size(), X.size());
    b->log_softmax(y.r(), x.r(), 2, 4);
    for (std::size_t i = 0; i < X.size(); ++i) {
      CHECK(std::isfinite(y[i]));
      CHECK(std::abs(y[i] - want[i]) < (b->real_size() == 8 ? 1e-9 : 2e-3));
    }
  }
}

TEST_CASE("ops.expected_q") {
  Backends be;
  Rng rng(10);
  const int rows = 15, Z = 11;
  const float v_min = -10.0f, v_max = 10.0f;
  const Vd LP = naive_log_softmax(rng.vec(rows * Z, -2.0, 2.0), rows, Z);
  Vd want(rows);
  for (int r = 0; r < rows; ++r)
    for (int i = 0; i < Z; ++i) want[r] += (-10.0 + 2.0 * i) * std::exp(LP[r * Z + i]);
  auto run = [&](Backend& b) {
    Vec lp(b.real_size(), LP), q(b.real_size(), rows);
    b.expected_q(q.r(), lp.r(), rows, Z, v_min, v_max);
    REQUIRE(b.status() == 0);
    return q.get();
  };
  const Vd got64 = run(*be.f64);
  CHECK(rel_err(got64, want) < 1e-13);
  CHECK(rel_err(run(*be.f32), got64) < 1e-5);

  // A uniform distribution on a symmetric support has mean 0; a point mass sits on its atom.
  Vec uniform(8, Vd(51, -std::log(51.0))), q(8, 1);
  be.f64->expected_q(q.r(), uniform.r(), 1, 51, -10.0f, 10.0f);
  CHECK(std::abs(q[0]) < 1e-12);
  Vd point(51, -1e300);
  point[37] = 0.0;
  Vec pm(8, point);
  be.f64->expected_q(q.r(), pm.r(), 1, 51, -10.0f, 10.0f);
  CHECK(q[0] == doctest::Approx(-10.0 + 37 * 0.4).epsilon(1e-14));
}

TEST_CASE("ops.argmax.ties") {
  Backends be;
  const int n = 5;
  const Vd Q = {1, 3, 3, 2, 0,  5, 5, 5, 5, 5,  -1, -2, -1, -0.5, -0.5,  0, 0, 0, 0, 7};
  const std::vector<std::int32_t> want = {1, 0, 3, 4};
  for (Backend* b : {be.f64.get(), be.f32.get()}) {
    Vec q(b->real_size(), Q);
    std::vector<std::int32_t> idx(4, -1);
    b->argmax(idx.data(), q.r(), 4, n);
    REQUIRE(b->status() == 0);
    CHECK(idx == want);
  }
  Rng rng(11);
  const int rows = 9, m = 7;
  const Vd R = rng.vec(rows * m);
  Vec q(8, R);
  std::vector<std::int32_t> idx(rows);
  be.f64->argmax(idx.data(), q.r(), rows, m);
  for (int r = 0; r < rows; ++r) {
    const auto first = R.begin() + r * m;
    CHECK(idx[r] == static_cast<int>(std::max_element(first, first + m) - first));
  }
}

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
    b.c51_project(p);
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
  b.c51_project(p);
  REQUIRE(b.status() == 0);
  // r = .5, γ = 1, not done: Tz = (−.5, .5, 1) → m = (.5 p0, .5 p0 + .5 p1, .5 p1 + p2).
  // done: Tz = .5 everywhere → m = (0, .5, .5).
  const Vd want = {0.1, 0.25, 0.65, 0.0, 0.5, 0.5, 0.3, 0.45, 0.25};
  for (int i = 0; i < 9; ++i) CHECK(std::abs(m[i] - want[i]) < 1e-12);

  // r = 0, γ = .5, not done: Tz = (−.5, 0, .5) → m = (.5 p0, .5 p0 + p1 + .5 p2, .5 p2).
  r.set(0, 0.0);
  p.B = 1, p.gamma_n = 0.5f;
  b.c51_project(p);
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
    b->c51_xent(fused);
    dqn::C51Xent plain = x;
    plain.loss = loss2.r(), plain.dlogits = dl2.r();
    b->c51_xent(plain);
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
    b.c51_xent(args(logp, m, w, dlogits, loss, &lps));
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
  b.c51_xent(x);
  REQUIRE(b.status() == 0);
  CHECK(acc[0] == doctest::Approx(2.5 + want_loss).epsilon(1e-14));
  CHECK(rel_err(dl2.get(), grad) == 0.0);

  // f32 against f64.
  Vec lp32(4, LP), m32(4, M), w32(4, Wt), dl32(4, n, kNaN), loss32(4, 1), lps32(4, B);
  be.f32->c51_xent(args(lp32, m32, w32, dl32, loss32, &lps32));
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
    b.cql_penalty(args(q, dq, loss));
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
  be.f32->cql_penalty(args(q32, dq32, loss32));
  REQUIRE(be.f32->status() == 0);
  CHECK(rel_err(dq32.get(), grad) < 1e-5);
  CHECK(loss32[0] == doctest::Approx(loss[0]).epsilon(1e-5));

  // An action out of range is an error, not a read outside the row.
  auto e = dqn::make_cpu_backend(true);
  actions[2] = A;
  e->cql_penalty(args(q, dq, loss));
  CHECK(e->status() != 0);
  CHECK(std::string(e->message()).find("action out of range") != std::string::npos);
}

TEST_CASE("ops.expected_q_backward.fd") {
  // L(logits) = Σ_r c_r Q_r(log_softmax(logits)) with fixed c: dlogits against central differences.
  Backends be;
  Backend& b = *be.f64;
  Rng rng(22);
  const int rows = 7, Z = 9;
  const float v_min = -3.0f, v_max = 4.0f;
  const Vd C = rng.vec(rows, -2.0, 2.0);
  Vec logits(8, rng.vec(static_cast<std::size_t>(rows) * Z, -2.0, 2.0)), logp(8, static_cast<std::size_t>(rows) * Z),
      q(8, rows), c(8, C), dl(8, static_cast<std::size_t>(rows) * Z, kNaN);
  auto forward = [&] {
    b.log_softmax(logp.r(), logits.r(), rows, Z);
    b.expected_q(q.r(), logp.r(), rows, Z, v_min, v_max);
    double s = 0.0;
    for (int r = 0; r < rows; ++r) s += C[r] * q[r];
    return s;
  };
  forward();
  b.expected_q_backward(dl.r(), c.r(), logp.r(), rows, Z, v_min, v_max);
  REQUIRE(b.status() == 0);
  const Vd grad = dl.get();
  CHECK(grad_err(logits, grad, forward) < 1e-6);

  Vec lp32(4, logp.get()), c32(4, C), dl32(4, static_cast<std::size_t>(rows) * Z, kNaN);
  be.f32->expected_q_backward(dl32.r(), c32.r(), lp32.r(), rows, Z, v_min, v_max);
  REQUIRE(be.f32->status() == 0);
  CHECK(rel_err(dl32.get(), grad) < 1e-5);
}

TEST_CASE("ops.ensemble_disagreement") {
  // out[b] = (1/n) Σ_j population std over k of q[k,b,j], against a two-pass reference; identical
  // members disagree by exactly 0.
  Backends be;
  Rng rng(23);
  const int K = 3, B = 4, n = 6;
  const Vd Q = rng.vec(static_cast<std::size_t>(K) * B * n, -5.0, 5.0);
  Vec q(8, Q), out(8, B, kNaN);
  be.f64->ensemble_disagreement(out.r(), q.r(), K, B, n);
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
  be.f32->ensemble_disagreement(outs.r(), qs.r(), K, B, n);
  REQUIRE(be.f32->status() == 0);
  for (int b = 0; b < B; ++b) CHECK(outs[b] == 0.0);
}

TEST_CASE("ops.cosine_embedding") {
  Backends be;
  Rng rng(24);
  const int rows = 5, E = 7;
  const Vd T = rng.vec(rows, 0.0, 1.0);
  Vec tau(8, T), out(8, static_cast<std::size_t>(rows) * E, kNaN);
  be.f64->cosine_embedding(out.r(), tau.r(), rows, E);
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
    b.hadamard(x.r(), h2.r(), phi.r(), B, N, H);
    double s = 0.0;
    for (std::size_t i = 0; i < nx; ++i) s += C[i] * x[i];
    return s;
  };
  forward();
  for (int bb = 0; bb < B; ++bb)
    for (int n = 0; n < N; ++n)
      for (int h = 0; h < H; ++h) CHECK(x[(bb * N + n) * H + h] == h2[bb * H + h] * phi[(bb * N + n) * H + h]);
  b.hadamard_backward(dphi.r(), dh2.r(), c.r(), h2.r(), phi.r(), B, N, H);
  REQUIRE(b.status() == 0);
  const Vd gphi = dphi.get(), gh2 = dh2.get();
  CHECK(grad_err(phi, gphi, forward) < 1e-6);
  CHECK(grad_err(h2, gh2, forward) < 1e-6);
  // dphi may alias dx.
  Vec inplace(8, C), dh2b(8, static_cast<std::size_t>(B) * H, kNaN);
  b.hadamard_backward(inplace.r(), dh2b.r(), inplace.r(), h2.r(), phi.r(), B, N, H);
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
    b.quantile_huber(args(q, qt, tau, r, done, w, dq, loss, &lps));
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
  be.f32->quantile_huber(args(q32, qt32, tau32, r32, d32, w32, dq32, loss32, nullptr));
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
    b.quantile_huber(ap);
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
    be2.f64->quantile_huber(ap);
    CHECK(be2.f64->status() != 0);
  }

  // A NaN target quantile reaches the gradient (a finite ±κ there would hide it from the budget's skip).
  Vec qtn(8, QT), dqn_(8, Q.size(), kNaN), lossn(8, 1, kNaN);
  for (int j = 0; j < Nt; ++j) qtn.set(((0 * Nt + j) * D + 0) * A + a_star[0], kNaN);
  b.quantile_huber(args(q, qtn, tau, r, done, w, dqn_, lossn, nullptr));
  CHECK(std::isnan(lossn[0]));
  CHECK(std::isnan(dqn_[((0 * N + 0) * D + 0) * A + actions[0]]));
}
