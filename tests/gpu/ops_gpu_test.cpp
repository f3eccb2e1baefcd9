// gpu.ops: the element, distribution and head ops against their CPU twins, outputs poisoned with NaN
// first, on awkward sizes.
#include <doctest/doctest.h>

#include "gpu_ops_util.hpp"

using namespace dqn;
using namespace gpu_ops;

TEST_CASE("gpu.ops.bias_act: bias + activation on a padded matrix") {
  const int rows = 37, cols = 53, ldy = 60;
  for (const Act act : {Act::none, Act::relu}) {
    for (const bool with_bias : {true, false}) {
      INFO("relu " << (act == Act::relu) << ", bias " << with_bias);
      Gpu gpu;
      Cpu cpu;
      auto y = random_vec(static_cast<std::size_t>(rows) * ldy, -1, 1, 1);
      auto b = random_vec(cols, -0.5f, 0.5f, 2);
      Real yd = gpu.put(y), bd = with_bias ? gpu.put(b) : Real{};
      gpu.ops.bias_act(yd, bd, rows, cols, ldy, act);
      gpu.ok();
      cpu.ops->bias_act(host(y), with_bias ? host(b) : Real{}, rows, cols, ldy, act);
      cpu.ok();
      expect_close(gpu.get(yd, rows * ldy), y, kElementwise, "bias_act (padding must stay as it was)");
    }
  }
}

TEST_CASE("gpu.ops.relu_backward: masks where y <= 0, zeros included") {
  // 53 of 59: the scalar kernel; 52 of 56 (multiples of 4, aligned rows): the four-column one
  struct Shape { int cols, ld; };
  for (const Shape sh : {Shape{53, 59}, Shape{52, 56}}) {
    CAPTURE(sh.cols);
    const int rows = 37, cols = sh.cols, ld = sh.ld;
    Gpu gpu;
    Cpu cpu;
    auto y = random_vec(static_cast<std::size_t>(rows) * ld, -1, 1, 3);
    for (std::size_t i = 0; i < y.size(); i += 4) y[i] = 0.0f;
    auto dy = random_vec(y.size(), -1, 1, 4);
    Real dyd = gpu.put(dy), yd = gpu.put(y);
    gpu.ops.relu_backward(dyd, yd, rows, cols, ld);
    gpu.ok();
    cpu.ops->relu_backward(host(dy), host(y), rows, cols, ld);
    cpu.ok();
    expect_same_bits(gpu.get(dyd, rows * ld), dy, "relu_backward (a mask is exact; padding untouched)");
  }
}

TEST_CASE("gpu.ops.bias_grad: deterministic column sums, beta 0 overwrites") {
  const int rows = 301, cols = 53, ldy = 60;
  for (const float beta : {0.0f, 0.5f}) {
    INFO("beta " << beta);
    Gpu gpu;
    Cpu cpu;
    auto dy = random_vec(static_cast<std::size_t>(rows) * ldy, -1, 1, 5);
    auto db = beta == 0.0f ? std::vector<float>(cols, kNaN) : random_vec(cols, -1, 1, 6);
    Real dyd = gpu.put(dy), dbd = gpu.put(db);
    gpu.ops.bias_grad(dbd, dyd, rows, cols, ldy, beta);
    gpu.ok();
    cpu.ops->bias_grad(host(db), host(dy), rows, cols, ldy, beta);
    cpu.ok();
    expect_close(gpu.get(dbd, cols), db, kReduction, "bias_grad");
  }
}

// --- distributional head ----------------------------------------------------------------------

TEST_CASE("gpu.ops.dueling_combine and dueling_backward, separate and in place") {
  const int rows = 37, D = 3, A = 5, Z = 51, ldv = 60;
  const std::size_t n = static_cast<std::size_t>(rows) * D * A * Z;
  for (const bool in_place : {false, true}) {
    INFO("in place " << in_place);
    Gpu gpu;
    Cpu cpu;
    auto v = random_vec(static_cast<std::size_t>(rows) * ldv, -1, 1, 7);
    auto adv = random_vec(n, -1, 1, 8);
    Real vd = gpu.put(v), advd = gpu.put(adv);
    Real ld = in_place ? advd : gpu.poisoned(static_cast<std::int64_t>(n));
    gpu.ops.dueling_combine(ld, vd, ldv, advd, rows, D, A, Z);
    gpu.ok();
    std::vector<float> logits_c = in_place ? adv : std::vector<float>(n, kNaN);
    auto adv_c = adv;
    cpu.ops->dueling_combine(host(logits_c), host(v), ldv, in_place ? host(logits_c) : host(adv_c), rows, D, A, Z);
    cpu.ok();
    expect_close(gpu.get(ld, static_cast<std::int64_t>(n)), logits_c, kElementwise, "dueling_combine");

    auto dl = random_vec(n, -1, 1, 9);
    // Compact dadv (separate or in place), then (not in place) a padded one whose (row, branch)
    // blocks lie A·Z + 3 apart: the padding set to zero on both sides.
    for (const int ldd : in_place ? std::vector<int>{0} : std::vector<int>{0, A * Z + 3}) {
      INFO("lddadv " << ldd);
      const std::size_t nd = ldd ? static_cast<std::size_t>(rows) * D * ldd : n;
      std::vector<float> dv(static_cast<std::size_t>(rows) * ldv, kNaN);  // padding stays poisoned on both sides
      Real dld = gpu.put(dl), dvd = gpu.put(dv);
      Real dad = in_place ? dld : gpu.poisoned(static_cast<std::int64_t>(nd));
      gpu.ops.dueling_backward(dvd, ldv, dad, ldd, dld, rows, D, A, Z);
      gpu.ok();
      std::vector<float> dadv_c = in_place ? dl : std::vector<float>(nd, kNaN);
      auto dl_c = dl;
      cpu.ops->dueling_backward(host(dv), ldv, host(dadv_c), ldd, in_place ? host(dadv_c) : host(dl_c), rows, D, A, Z);
      cpu.ok();
      expect_close(gpu.get(dvd, rows * ldv), dv, kReduction, "dueling_backward dv");
      const auto got = gpu.get(dad, static_cast<std::int64_t>(nd));
      expect_close(got, dadv_c, kElementwise, "dueling_backward dadv");
      if (ldd > A * Z) {
        std::size_t zeros = 0;
        for (std::size_t i = 0; i < nd; ++i) zeros += static_cast<int>(i % static_cast<std::size_t>(ldd)) >= A * Z && got[i] == 0.0f;
        CHECK(zeros == static_cast<std::size_t>(rows) * D * (ldd - A * Z));
      }
    }
  }
}

TEST_CASE("gpu.ops.log_softmax: rows shorter than, near and longer than a warp") {
  const struct {
    int rows, n;
  } shapes[] = {{555, 51}, {37, 200}, {9, 7}, {3, 1}};
  for (const auto& s : shapes) {
    INFO("rows " << s.rows << ", n " << s.n);
    Gpu gpu;
    Cpu cpu;
    auto x = random_vec(static_cast<std::size_t>(s.rows) * s.n, -20, 20, 10);
    std::vector<float> lp(x.size(), kNaN);
    Real xd = gpu.put(x), lpd = gpu.poisoned(static_cast<std::int64_t>(x.size()));
    gpu.ops.log_softmax(lpd, xd, s.rows, s.n);
    gpu.ok();
    cpu.ops->log_softmax(host(lp), host(x), s.rows, s.n);
    cpu.ok();
    expect_close(gpu.get(lpd, static_cast<std::int64_t>(x.size())), lp, kElementwise, "log_softmax");
  }
}

TEST_CASE("gpu.ops.expected_q and argmax (ties keep the lowest index)") {
  const int rows = 37 * 15, Z = 51;
  Gpu gpu;
  Cpu cpu;
  auto lp = random_logp(rows, Z, 11);
  std::vector<float> q(rows, kNaN);
  Real lpd = gpu.put(lp), qd = gpu.poisoned(rows);
  gpu.ops.expected_q(qd, lpd, rows, Z, -10.0f, 10.0f);
  gpu.ok();
  cpu.ops->expected_q(host(q), host(lp), rows, Z, -10.0f, 10.0f);
  cpu.ok();
  expect_close(gpu.get(qd, rows), q, kReduction, "expected_q");

  const int arows = 111, n = 5;
  auto levels = random_ints(static_cast<std::size_t>(arows) * n, 0, 2, 12);  // three levels: many ties
  std::vector<float> qa(levels.size());
  for (std::size_t i = 0; i < qa.size(); ++i) qa[i] = 0.5f * levels[i] - 0.25f;
  std::vector<std::int32_t> idx_c(arows, -1), poison(arows, -1);
  Real qad = gpu.put(qa);
  auto* idx_d = gpu.put_typed(poison);
  gpu.ops.argmax(idx_d, qad, arows, n);
  gpu.ok();
  cpu.ops->argmax(idx_c.data(), host(qa), arows, n);
  cpu.ok();
  expect_same_bits(gpu.get_typed(idx_d, arows), idx_c, "argmax");
}

TEST_CASE("gpu.ops.dueling_dist: combine + log-softmax + Q + argmax in one pass, against the unfused CPU ops") {
  const struct {
    int rows, D, A, Z, star_from;
    bool q;
    int repeat;  // > 0: action a's advantages are action (a mod repeat)'s, so the maximum ties
  } shapes[] = {{2 * 37, 3, 5, 51, 37, true, 0}, {19, 2, 7, 101, 0, true, 0}, {13, 4, 3, 9, 13, true, 0},
                {11, 3, 5, 33, 0, false, 0}, {17, 2, 8, 64, 5, true, 0}, {9, 1, 9, 20, 0, true, 0},
                {6, 2, 1, 1, 0, true, 0}, {5, 2, 40, 51, 1, true, 0}, {7, 3, 100, 51, 0, true, 7},
                {3, 1, 15625, 51, 0, true, 0}};
  // While Z <= 64 and A <= 8 (the first, third, fourth, fifth and last shapes) a warp kernel: a
  // warp per action where rows·D <= 2048 (all of these; gpu.ops.dueling_dist.warps checks the
  // warp per (row, branch) beyond, bit for bit), a block per (row, branch) beyond (the second:
  // Z 101; the sixth: A 9; the last three: more actions than the block's 16 warps, each warp's
  // first maximum merged, with ties across warps, and the single branch over a 6-link reacher's
  // 15,625 joint actions).
  // fp32: the kernel's double arithmetic, as the CPU's; tf32: its float arithmetic (kFloatMath).
  // pad: adv's (row, branch) blocks A·Z + pad apart (0: compact, ldadv unset).
  for (const int pad : {0, 5})
  for (const Precision prec : {Precision::fp32, Precision::tf32})
  for (const auto& sh : shapes) {
    INFO("rows " << sh.rows << " D " << sh.D << " A " << sh.A << " Z " << sh.Z << " star_from " << sh.star_from
                 << (prec == Precision::fp32 ? " (double math)" : " (float math)") << " adv padding " << pad);
    const double tol_e = prec == Precision::fp32 ? kElementwise : kFloatMath;
    const double tol_r = prec == Precision::fp32 ? kReduction : kFloatMath;
    Gpu gpu(prec);
    Cpu cpu;
    const int ldv = sh.Z + 3;
    const std::size_t n = static_cast<std::size_t>(sh.rows) * sh.D * sh.A * sh.Z;
    const std::size_t nq = static_cast<std::size_t>(sh.rows) * sh.D * sh.A;
    const std::size_t ns = static_cast<std::size_t>(sh.rows - sh.star_from) * sh.D;
    auto v = random_vec(static_cast<std::size_t>(sh.rows) * ldv, -2, 2, 31);
    const int ldadv = pad ? sh.A * sh.Z + pad : 0;
    auto adv = random_vec(pad ? static_cast<std::size_t>(sh.rows) * sh.D * ldadv : n, -3, 3, 32);
    if (sh.repeat > 0)
      for (std::size_t rd = 0; rd < static_cast<std::size_t>(sh.rows) * sh.D; ++rd)
        for (int act = sh.repeat; act < sh.A; ++act)
          for (int i = 0; i < sh.Z; ++i) {
            const std::size_t base = rd * static_cast<std::size_t>(pad ? ldadv : sh.A * sh.Z);
            adv[base + static_cast<std::size_t>(act) * sh.Z + i] = adv[base + static_cast<std::size_t>(act % sh.repeat) * sh.Z + i];
          }
    DuelingDist a;
    a.ldv = ldv; a.rows = sh.rows; a.D = sh.D; a.A = sh.A; a.Z = sh.Z; a.star_from = sh.q ? sh.star_from : 0;
    a.ldadv = ldadv;
    a.v_min = -10.0f; a.v_max = 10.0f;
    DuelingDist ad = a, ac = a;
    std::vector<std::int32_t> poison(ns, -1), star_c(ns, -1);
    std::vector<float> lp(n, kNaN), q(nq, kNaN);
    ad.logp = gpu.poisoned(static_cast<std::int64_t>(n));
    ad.q = sh.q ? gpu.poisoned(static_cast<std::int64_t>(nq)) : Real{};
    ad.v = gpu.put(v);
    ad.adv = gpu.put(adv);
    ad.a_star = sh.q ? gpu.put_typed(poison) : nullptr;
    gpu.ops.dueling_dist(ad);
    gpu.ok();
    ac.logp = host(lp);
    ac.q = sh.q ? host(q) : Real{};
    ac.v = host(v);
    ac.adv = host(adv);
    ac.a_star = sh.q ? star_c.data() : nullptr;
    cpu.ops->dueling_dist(ac);
    cpu.ok();
    expect_close(gpu.get(ad.logp, static_cast<std::int64_t>(n)), lp, tol_e, "dueling_dist logp");
    if (sh.q) {
      expect_close(gpu.get(ad.q, static_cast<std::int64_t>(nq)), q, tol_r, "dueling_dist q");
      expect_same_bits(gpu.get_typed(ad.a_star, ns), star_c, "dueling_dist a_star");
    }
  }
}

TEST_CASE("gpu.ops.dueling_dist.warps: a warp per action and a warp per (row, branch) give the same bits") {
  // 1,400 rows × 3 branches (4,200 pairs, over the 2,048 of a warp per action) run a warp per
  // (row, branch) in one call, and a warp per action in four calls of 350 rows (1,050 pairs): the
  // same arithmetic in the same order, so the same bits; both against the CPU.
  constexpr int kRows = 1400, kChunk = 350, D = 3, A = 5, Z = 51;
  static_assert(kRows % kChunk == 0, "whole chunks");
  for (const Precision prec : {Precision::fp32, Precision::tf32}) {
    const bool fp32 = prec == Precision::fp32;
    INFO(std::string(fp32 ? "double math" : "float math"));
    Gpu gpu(prec);
    Cpu cpu;
    const int ldv = Z + 1;
    const std::size_t n = std::size_t{kRows} * D * A * Z, nq = std::size_t{kRows} * D * A, ns = std::size_t{kRows} * D;
    auto v = random_vec(std::size_t{kRows} * ldv, -2, 2, 61);
    auto adv = random_vec(n, -3, 3, 62);
    DuelingDist a;
    a.ldv = ldv; a.D = D; a.A = A; a.Z = Z; a.v_min = -10.0f; a.v_max = 10.0f;
    const Real v_d = gpu.put(v), adv_d = gpu.put(adv);
    DuelingDist whole = a;
    whole.rows = kRows;
    whole.v = v_d; whole.adv = adv_d;
    whole.logp = gpu.poisoned(static_cast<std::int64_t>(n));
    whole.q = gpu.poisoned(static_cast<std::int64_t>(nq));
    whole.a_star = gpu.put_typed(std::vector<std::int32_t>(ns, -1));
    gpu.ops.dueling_dist(whole);
    const Real part_logp = gpu.poisoned(static_cast<std::int64_t>(n)), part_q = gpu.poisoned(static_cast<std::int64_t>(nq));
    std::int32_t* part_star = gpu.put_typed(std::vector<std::int32_t>(ns, -1));
    for (int r0 = 0; r0 < kRows; r0 += kChunk) {
      DuelingDist c = a;
      c.rows = kChunk;
      c.v = v_d + std::int64_t{r0} * ldv;
      c.adv = adv_d + std::int64_t{r0} * D * A * Z;
      c.logp = part_logp + std::int64_t{r0} * D * A * Z;
      c.q = part_q + std::int64_t{r0} * D * A;
      c.a_star = part_star + std::int64_t{r0} * D;
      gpu.ops.dueling_dist(c);
    }
    gpu.ok();
    std::vector<float> lp(n), q(nq);
    std::vector<std::int32_t> star_c(ns, -1);
    DuelingDist ac = a;
    ac.rows = kRows;
    ac.v = host(v); ac.adv = host(adv); ac.logp = host(lp); ac.q = host(q); ac.a_star = star_c.data();
    cpu.ops->dueling_dist(ac);
    cpu.ok();
    const auto wq = gpu.get(whole.q, static_cast<std::int64_t>(nq)), pq = gpu.get(part_q, static_cast<std::int64_t>(nq));
    INFO("q[0..2]: a warp per (row, branch) " << wq[0] << " " << wq[1] << " " << wq[2] << ", a warp per action " << pq[0]
                                               << " " << pq[1] << " " << pq[2] << ", cpu " << q[0] << " " << q[1] << " "
                                               << q[2]);
    const double tol = fp32 ? kReduction : kFloatMath;
    expect_close(gpu.get(whole.logp, static_cast<std::int64_t>(n)), lp, fp32 ? kElementwise : kFloatMath,
                 "a warp per (row, branch): logp against the CPU");
    expect_close(gpu.get(part_logp, static_cast<std::int64_t>(n)), lp, fp32 ? kElementwise : kFloatMath,
                 "a warp per action: logp against the CPU");
    expect_close(wq, q, tol, "a warp per (row, branch): q against the CPU");
    expect_close(pq, q, tol, "a warp per action: q against the CPU");
    expect_same_bits(gpu.get_typed(whole.a_star, ns), star_c, "a warp per (row, branch): a_star against the CPU");
    expect_same_bits(gpu.get_typed(part_star, ns), star_c, "a warp per action: a_star against the CPU");
    expect_same_bits(gpu.get(part_logp, static_cast<std::int64_t>(n)), gpu.get(whole.logp, static_cast<std::int64_t>(n)),
                     "logp: per action against per (row, branch)");
    expect_same_bits(pq, wq, "q: per action against per (row, branch)");
  }
}

TEST_CASE("gpu.ops.head_forward: the GEMMs side by side and dueling_dist against the CPU's composition") {
  // tf32 keeps 10 mantissa bits of every GEMM operand: ≈5e-4 relative per product, so the
  // outputs get 5e-3 (norm-wise); a* is checked against the CPU's Q with the same allowance.
  constexpr double kTf32 = 5e-3;
  // x_pad: x's rows H2 + x_pad apart (0: unpadded, as the step's h2).
  const struct {
    int rows, H2, Hh, D, A, Z, star_from;
    bool dist;
    int x_pad;
  } shapes[] = {{74, 256, 128, 3, 5, 51, 37, true, 5}, {37, 72, 40, 2, 3, 11, 20, true, 5},
                {5, 13, 9, 1, 2, 3, 0, true, 5},       {21, 30, 17, 4, 3, 7, 0, false, 5},
                {83, 256, 128, 3, 5, 51, 0, false, 5}, {19, 40, 24, 3, 8, 64, 3, true, 5},
                {70, 256, 128, 3, 5, 51, 35, true, 0}};
  // pad: adv's (row, branch) blocks A·Z + pad apart (as bdq's ldaz: 255 → 256); 0: compact.
  for (const int pad : {0, 1})
  for (const auto& sh : shapes) {
    INFO("rows " << sh.rows << " H2 " << sh.H2 << " Hh " << sh.Hh << " D " << sh.D << " A " << sh.A << " Z " << sh.Z
                 << " adv padding " << pad);
    Gpu gpu(Precision::tf32);
    Cpu cpu;
    const int rows = sh.rows, H2 = sh.H2, Hh = sh.Hh, D = sh.D, A = sh.A, Z = sh.Z, hc = (1 + D) * Hh, az = A * Z;
    const int ldx = H2 + sh.x_pad, ldv = Z + 2, lda = az + pad;
    const std::size_t n_out = static_cast<std::size_t>(rows) * D * az, nq = static_cast<std::size_t>(rows) * D * A;
    const std::size_t n_adv = static_cast<std::size_t>(rows) * D * lda;
    const std::size_t ns = static_cast<std::size_t>(rows - sh.star_from) * D;
    const float s1 = 1.0f / std::sqrt(static_cast<float>(H2)), s2 = 1.0f / std::sqrt(static_cast<float>(Hh));
    auto x = random_vec(static_cast<std::size_t>(rows) * ldx, -1.5f, 1.5f, 61);
    auto w1 = random_vec(static_cast<std::size_t>(hc) * H2, -s1, s1, 62);
    auto b1 = random_vec(static_cast<std::size_t>(hc), -0.2f, 0.2f, 63);
    auto wv2 = random_vec(static_cast<std::size_t>(Z) * Hh, -s2, s2, 64);
    auto bv2 = random_vec(static_cast<std::size_t>(Z), -0.2f, 0.2f, 65);
    auto wb2 = random_vec(static_cast<std::size_t>(D) * az * Hh, -s2, s2, 66);
    auto bb2 = random_vec(static_cast<std::size_t>(D) * az, -0.2f, 0.2f, 67);
    HeadForward a;
    a.ldx = ldx; a.ldv = ldv; a.rows = rows; a.H2 = H2; a.Hh = Hh; a.D = D; a.A = A; a.Z = Z;
    a.star_from = sh.star_from; a.v_min = -10.0f; a.v_max = 10.0f; a.ldadv = pad ? lda : 0;
    HeadForward ag = a, ac = a;
    // one poisoned row beyond `rows` in every output: nothing may be written there
    ag.x = gpu.put(x); ag.w1 = gpu.put(w1); ag.b1 = gpu.put(b1); ag.wv2 = gpu.put(wv2); ag.bv2 = gpu.put(bv2);
    ag.wb2 = gpu.put(wb2); ag.bb2 = gpu.put(bb2);
    ag.hidden = gpu.poisoned(static_cast<std::int64_t>(rows + 1) * hc);
    ag.v = gpu.poisoned(static_cast<std::int64_t>(rows + 1) * ldv);
    ag.adv = gpu.poisoned(static_cast<std::int64_t>(rows + 1) * D * lda);
    std::vector<std::int32_t> poison(ns + D, -1);
    if (sh.dist) {
      ag.logp = gpu.poisoned(static_cast<std::int64_t>(n_out + static_cast<std::size_t>(D) * az));
      ag.q = gpu.poisoned(static_cast<std::int64_t>(nq + static_cast<std::size_t>(D) * A));
      ag.a_star = gpu.put_typed(poison);
    }
    for (int rep = 0; rep < 2; ++rep) gpu.ops.head_forward(ag);  // reruns give the same
    gpu.ok();
    std::vector<float> hid(static_cast<std::size_t>(rows) * hc, kNaN), v(static_cast<std::size_t>(rows) * ldv, kNaN),
        adv(n_adv, kNaN), lp(n_out, kNaN), q(nq, kNaN);
    std::vector<std::int32_t> star_c(ns, -1);
    ac.x = host(x); ac.w1 = host(w1); ac.b1 = host(b1); ac.wv2 = host(wv2); ac.bv2 = host(bv2); ac.wb2 = host(wb2);
    ac.bb2 = host(bb2); ac.hidden = host(hid); ac.v = host(v); ac.adv = host(adv);
    if (sh.dist) {
      ac.logp = host(lp);
      ac.q = host(q);
      ac.a_star = star_c.data();
    }
    cpu.ops->head_forward(ac);
    cpu.ok();
    auto hid_g = gpu.get(ag.hidden, static_cast<std::int64_t>(rows + 1) * hc);
    auto v_g = gpu.get(ag.v, static_cast<std::int64_t>(rows + 1) * ldv);
    auto adv_g = gpu.get(ag.adv, static_cast<std::int64_t>(rows + 1) * D * lda);
    auto all_nan = [](const std::vector<float>& h, std::size_t from, std::size_t to) {
      for (std::size_t i = from; i < to; ++i)
        if (!std::isnan(h[i])) return false;
      return true;
    };
    CHECK_MESSAGE(all_nan(hid_g, hid.size(), hid_g.size()), "hidden written beyond rows");
    CHECK_MESSAGE(all_nan(adv_g, n_adv, adv_g.size()), "adv written beyond rows");
    CHECK_MESSAGE(all_nan(v_g, v.size(), v_g.size()), "v written beyond rows");
    bool pad_kept = true;  // v's columns beyond Z keep what they held
    for (int r = 0; r < rows; ++r)
      for (int c = Z; c < ldv; ++c) pad_kept = pad_kept && std::isnan(v_g[static_cast<std::size_t>(r) * ldv + c]);
    CHECK_MESSAGE(pad_kept, "v's padding columns written");
    hid_g.resize(hid.size());
    adv_g.resize(n_adv);  // adv's padding: NaN on both sides (compared as equal)
    v_g.resize(v.size());
    for (std::size_t i = 0; i < v.size(); ++i)
      if (static_cast<int>(i % static_cast<std::size_t>(ldv)) >= Z) v_g[i] = v[i] = 0.0f;
    expect_close(hid_g, hid, kTf32, "head_forward hidden");
    expect_close(v_g, v, kTf32, "head_forward v");
    expect_close(adv_g, adv, kTf32, "head_forward adv");
    if (!sh.dist) continue;
    auto lp_g = gpu.get(ag.logp, static_cast<std::int64_t>(n_out + static_cast<std::size_t>(D) * az));
    auto q_g = gpu.get(ag.q, static_cast<std::int64_t>(nq + static_cast<std::size_t>(D) * A));
    auto star_g = gpu.get_typed(ag.a_star, ns + static_cast<std::size_t>(D));
    CHECK_MESSAGE(all_nan(lp_g, n_out, lp_g.size()), "logp written beyond rows");
    CHECK_MESSAGE(all_nan(q_g, nq, q_g.size()), "q written beyond rows");
    bool star_tail = true;
    for (std::size_t i = ns; i < star_g.size(); ++i) star_tail = star_tail && star_g[i] == -1;
    CHECK_MESSAGE(star_tail, "a* written beyond its rows");
    lp_g.resize(n_out);
    q_g.resize(nq);
    expect_close(lp_g, lp, kTf32, "head_forward logp");
    expect_close(q_g, q, kTf32, "head_forward q");
    int bad = 0;  // the GPU's a* must be a best action by the CPU's Q, up to the tf32 allowance
    for (std::size_t i = 0; i < ns; ++i) {
      const std::size_t r = static_cast<std::size_t>(sh.star_from) + i / static_cast<std::size_t>(D),
                        d = i % static_cast<std::size_t>(D);
      const float* qr = q.data() + (r * static_cast<std::size_t>(D) + d) * static_cast<std::size_t>(A);
      const int g = star_g[i];
      if (g < 0 || g >= A) {
        ++bad;
        continue;
      }
      const float best = qr[star_c[i]];
      if (qr[g] < best - 1e-2f * (1.0f + std::fabs(best))) ++bad;
    }
    CHECK_MESSAGE(bad == 0, bad << " of " << ns << " a* are not a best action");
  }
}

TEST_CASE("gpu.ops.head_backward_inputs: the masked GEMMs side by side against the CPU's composition") {
  constexpr double kTf32 = 5e-3;  // as head_forward: tf32 operands
  const struct {
    int rows, Hh, D, A, Z;
  } shapes[] = {{256, 128, 3, 5, 51}, {37, 40, 2, 3, 11}, {5, 9, 1, 2, 3}};
  for (const int pad : {0, 1})  // dadv's (row, branch) blocks A·Z + pad apart; 0: compact
  for (const auto& sh : shapes) {
    INFO("rows " << sh.rows << " Hh " << sh.Hh << " D " << sh.D << " A " << sh.A << " Z " << sh.Z << " dadv padding " << pad);
    Gpu gpu(Precision::tf32);
    Cpu cpu;
    const int rows = sh.rows, Hh = sh.Hh, D = sh.D, A = sh.A, Z = sh.Z, hc = (1 + D) * Hh, az = A * Z, lddv = Z + 3;
    auto dv = random_vec(static_cast<std::size_t>(rows) * lddv, -1, 1, 71);
    auto dadv = random_vec(static_cast<std::size_t>(rows) * D * (az + pad), -1, 1, 72);
    auto wv2 = random_vec(static_cast<std::size_t>(Z) * Hh, -0.3f, 0.3f, 73);
    auto wb2 = random_vec(static_cast<std::size_t>(D) * az * Hh, -0.3f, 0.3f, 74);
    auto hidden = random_vec(static_cast<std::size_t>(rows) * hc, -1, 1, 75);
    for (std::size_t i = 0; i < hidden.size(); i += 7) hidden[i] = 0.0f;  // exact zeros mask too
    HeadBackward a;
    a.lddv = lddv; a.rows = rows; a.Hh = Hh; a.D = D; a.A = A; a.Z = Z; a.lddadv = pad ? az + pad : 0;
    HeadBackward ag = a, ac = a;
    ag.dv = gpu.put(dv); ag.dadv = gpu.put(dadv); ag.wv2 = gpu.put(wv2); ag.wb2 = gpu.put(wb2);
    ag.hidden = gpu.put(hidden);
    ag.dhidden = gpu.poisoned(static_cast<std::int64_t>(rows + 1) * hc);  // one row beyond: untouched
    for (int rep = 0; rep < 2; ++rep) gpu.ops.head_backward_inputs(ag);
    gpu.ok();
    std::vector<float> dh(static_cast<std::size_t>(rows) * hc, kNaN);
    ac.dv = host(dv); ac.dadv = host(dadv); ac.wv2 = host(wv2); ac.wb2 = host(wb2); ac.hidden = host(hidden);
    ac.dhidden = host(dh);
    cpu.ops->head_backward_inputs(ac);
    cpu.ok();
    auto got = gpu.get(ag.dhidden, static_cast<std::int64_t>(rows + 1) * hc);
    bool tail = true;
    for (std::size_t i = dh.size(); i < got.size(); ++i) tail = tail && std::isnan(got[i]);
    CHECK_MESSAGE(tail, "dhidden written beyond rows");
    got.resize(dh.size());
    std::size_t mask_bad = 0;
    for (std::size_t i = 0; i < dh.size(); ++i)
      if (hidden[i] <= 0.0f && !(got[i] == 0.0f && dh[i] == 0.0f)) ++mask_bad;
    CHECK_MESSAGE(mask_bad == 0, mask_bad << " masked elements are not 0");
    expect_close(got, dh, kTf32, "head_backward_inputs dhidden");
  }
}

TEST_CASE("gpu.ops.weighted_mean: (1/n) Σ w·x against the CPU twin, awkward sizes") {
  Gpu gpu;
  Cpu cpu;
  for (const int n : {0, 1, 37, 256, 1000, 5003}) {
    INFO("n " << n);
    const auto x = random_vec(static_cast<std::size_t>(n), -4, 9, 61);
    const auto w = random_vec(static_cast<std::size_t>(n), 0.1f, 2, 62);
    const Real out = gpu.poisoned(1);
    const Real xd = n > 0 ? gpu.put(x) : Real{}, wd = n > 0 ? gpu.put(w) : Real{};
    gpu.ops.weighted_mean(out, xd, wd, n);
    gpu.ok();
    std::vector<float> ref(1, kNaN);
    auto xc = x, wc = w;
    cpu.ops->weighted_mean(host(ref), n > 0 ? host(xc) : Real{}, n > 0 ? host(wc) : Real{}, n);
    cpu.ok();
    double exact = 0.0;
    for (std::size_t i = 0; i < x.size(); ++i) exact += static_cast<double>(w[i]) * x[i];
    exact = n > 0 ? exact / n : 0.0;
    CHECK(ref[0] == doctest::Approx(exact).epsilon(1e-6));
    expect_close(gpu.get(out, 1), ref, kReduction, "weighted_mean");
    if (n == 0) CHECK(gpu.get(out, 1)[0] == 0.0f);
  }
  // a negative size is refused, with the op's name and the reason
  Gpu bad;
  bad.ops.weighted_mean(bad.poisoned(1), Real{}, Real{}, -1);
  CHECK(bad.ops.status() != 0);
  CHECK(std::string(bad.ops.message()).find("weighted_mean: negative size") != std::string::npos);
}

TEST_CASE("gpu.ops.relu_bias_grad: masks and column sums for several heads sharing the activation") {
  const int rows = 37, cols = 75, ld = 80, heads = 3;
  const std::int64_t stride_dy = std::int64_t(rows) * ld + 16, stride_db = 97;
  Gpu gpu;
  Cpu cpu;
  auto y = random_vec(static_cast<std::size_t>(rows) * ld, -1, 1, 51);
  for (std::size_t i = 0; i < y.size(); i += 7) y[i] = 0.0f;  // zeros mask too
  auto dy = random_vec(static_cast<std::size_t>(stride_dy) * heads, -1, 1, 52);
  std::vector<float> db(static_cast<std::size_t>(stride_db) * heads, kNaN);
  Real dyd = gpu.put(dy), yd = gpu.put(y), dbd = gpu.put(db);
  gpu.ops.relu_bias_grad(dyd, yd, dbd, rows, cols, ld, heads, stride_dy, 0, stride_db);
  gpu.ok();
  cpu.ops->relu_bias_grad(host(dy), host(y), host(db), rows, cols, ld, heads, stride_dy, 0, stride_db);
  cpu.ok();
  expect_close(gpu.get(dyd, static_cast<std::int64_t>(dy.size())), dy, 0.0, "relu_bias_grad dy");
  expect_close(gpu.get(dbd, static_cast<std::int64_t>(db.size())), db, kReduction, "relu_bias_grad db");
  // per-head activations (ensemble members), and no mask at all (a plain bias gradient per head)
  auto y3 = random_vec(static_cast<std::size_t>(stride_dy) * heads, -1, 1, 53);
  auto dy2 = random_vec(dy.size(), -1, 1, 54), dy3 = dy2;
  Real dy2d = gpu.put(dy2), y3d = gpu.put(y3);
  gpu.ops.relu_bias_grad(dy2d, y3d, dbd, rows, cols, ld, heads, stride_dy, stride_dy, stride_db);
  gpu.ok();
  cpu.ops->relu_bias_grad(host(dy2), host(y3), host(db), rows, cols, ld, heads, stride_dy, stride_dy, stride_db);
  expect_close(gpu.get(dy2d, static_cast<std::int64_t>(dy2.size())), dy2, 0.0, "relu_bias_grad per-head y");
  expect_close(gpu.get(dbd, static_cast<std::int64_t>(db.size())), db, kReduction, "relu_bias_grad per-head db");
  Real dy3d = gpu.put(dy3);
  gpu.ops.relu_bias_grad(dy3d, Real{}, dbd, rows, cols, ld, heads, stride_dy, 0, stride_db);
  gpu.ok();
  cpu.ops->relu_bias_grad(host(dy3), Real{}, host(db), rows, cols, ld, heads, stride_dy, 0, stride_db);
  cpu.ok();
  expect_close(gpu.get(dbd, static_cast<std::int64_t>(db.size())), db, kReduction, "relu_bias_grad no mask");
  // no db: the masks alone (the trunk backward's critical path), four columns at a time where
  // the shape allows and one at a time where it does not; db must stay as it was
  const std::vector<float> db_before = gpu.get(dbd, static_cast<std::int64_t>(db.size()));
  const struct {
    int rows, cols, ld;
    std::int64_t stride;
  } masks[] = {{37, 64, 68, 37 * 68 + 4}, {37, 64, 68, 37 * 68 + 1}, {rows, cols, ld, stride_dy}, {300, 12, 12, 3600}};
  for (const auto& m : masks) {
    INFO("mask only: rows " << m.rows << " cols " << m.cols << " ld " << m.ld << " head stride " << m.stride);
    auto ym = random_vec(static_cast<std::size_t>(m.stride) * heads, -1, 1, 55);
    auto dym = random_vec(ym.size(), -1, 1, 56);
    Real dymd = gpu.put(dym), ymd = gpu.put(ym);
    gpu.ops.relu_bias_grad(dymd, ymd, Real{}, m.rows, m.cols, m.ld, heads, m.stride, m.stride, 0);
    gpu.ok();
    cpu.ops->relu_bias_grad(host(dym), host(ym), Real{}, m.rows, m.cols, m.ld, heads, m.stride, m.stride, 0);
    cpu.ok();
    expect_close(gpu.get(dymd, static_cast<std::int64_t>(dym.size())), dym, 0.0, "relu_bias_grad mask only");
  }
  expect_same_bits(gpu.get(dbd, static_cast<std::int64_t>(db.size())), db_before, "db untouched by mask-only calls");
}
