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
