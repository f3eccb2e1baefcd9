// gpu.ops: the optimiser's ops (budgets, Adam, spectral norm, target update) and the fused update
// against the separate ops and the CPU twin; memory ops, errors and planning.
#include <doctest/doctest.h>

#include "gpu_ops_util.hpp"

using namespace dqn;
using namespace gpu_ops;

namespace {

/// Device and host copies of one budget problem (H heads over P parameters).
struct BudgetCase {
  static constexpr int H = 3;
  static constexpr std::int64_t P = 10007;
  std::vector<float> grads, fractions{0.7f, 0.2f, 0.1f}, losses{1.25f, 0.5f, -0.125f};
  explicit BudgetCase(float bad_value = 0.0f, bool bad = false) {
    grads = random_vec(static_cast<std::size_t>(H * P), -1, 1, 21);
    for (std::int64_t i = 0; i < P; ++i) {
      grads[static_cast<std::size_t>(P + i)] *= 1e-3f;  // head 1: small norm, clip 1
      grads[static_cast<std::size_t>(2 * P + i)] = 0.0f;  // head 2: norm 0, clip 1
    }
    if (bad) grads[static_cast<std::size_t>(P + 1234)] = bad_value;
  }
};

}  // namespace

TEST_CASE("gpu.ops.budget: norms, clips, combined gradient, total loss; NaN/Inf skip") {
  const struct {
    const char* why;
    bool bad;
    float value;
  } cases[] = {{"all finite", false, 0.0f}, {"NaN in head 1", true, kNaN},
               {"Inf in head 1", true, std::numeric_limits<float>::infinity()}};
  for (const auto& c : cases) {
    INFO(c.why);
    Gpu gpu;
    Cpu cpu;
    BudgetCase bc(c.value, c.bad);
    const int H = BudgetCase::H;
    const std::int64_t P = BudgetCase::P;
    Budget b;
    b.H = H;
    b.P = P;
    b.max_grad_norm = 10.0f;
    Budget bd = b, bh = b;
    bd.grads = gpu.put(bc.grads);
    bd.fractions = gpu.put(bc.fractions);
    bd.losses = gpu.put(bc.losses);
    bd.norms = gpu.poisoned(H);
    bd.clips = gpu.poisoned(H);
    bd.g = gpu.poisoned(P);
    bd.total_loss = gpu.poisoned(1);
    bd.skip = gpu.put_typed(std::vector<std::int32_t>{-7});
    bd.skipped = gpu.put_typed(std::vector<std::int64_t>{5});
    gpu.ops.budget(bd);
    gpu.ok();
    std::vector<float> norms(H, kNaN), clips(H, kNaN), g(static_cast<std::size_t>(P), kNaN), total{kNaN};
    std::int32_t skip = -7;
    std::int64_t skipped = 5;
    bh.grads = host(bc.grads);
    bh.fractions = host(bc.fractions);
    bh.losses = host(bc.losses);
    bh.norms = host(norms);
    bh.clips = host(clips);
    bh.g = host(g);
    bh.total_loss = host(total);
    bh.skip = &skip;
    bh.skipped = &skipped;
    cpu.ops->budget(bh);
    cpu.ok();
    expect_close(gpu.get(bd.norms, H), norms, kReduction, "budget norms");
    expect_close(gpu.get(bd.clips, H), clips, kReduction, "budget clips");
    expect_close(gpu.get(bd.g, P), g, kReduction, "budget g");
    expect_close(gpu.get(bd.total_loss, 1), total, kReduction, "budget total loss");
    CHECK(gpu.get_typed(bd.skip, 1)[0] == (c.bad ? 1 : 0));
    CHECK(gpu.get_typed(bd.skipped, 1)[0] == (c.bad ? 6 : 5));
    CHECK(skip == (c.bad ? 1 : 0));
    if (!c.bad) CHECK(clips[0] < 1.0f);  // the case really clips head 0
  }
}

TEST_CASE("gpu.ops.adam: t and lr from device memory; skip leaves everything bit-identical") {
  const std::int64_t P = 10007;
  auto params = random_vec(P, -1, 1, 22), g = random_vec(P, -0.1f, 0.1f, 23), m = random_vec(P, -0.01f, 0.01f, 24);
  auto v = random_vec(P, 0, 1e-2f, 25);
  for (float& x : v) x *= x;
  const std::vector<float> lr{1e-3f};
  for (const int skip : {0, 1}) {
    INFO("skip " << skip);
    Gpu gpu;
    Cpu cpu;
    Adam a;
    a.P = P;
    Adam ad = a, ac = a;
    ad.params = gpu.put(params);
    ad.g = gpu.put(g);
    ad.m = gpu.put(m);
    ad.v = gpu.put(v);
    ad.lr = gpu.put(lr);
    ad.t = gpu.put_typed(std::vector<std::int64_t>{5});
    ad.skip = gpu.put_typed(std::vector<std::int32_t>{skip});
    gpu.ops.adam(ad);
    gpu.ok();
    auto pc = params, mc = m, vc = v, lrc = lr;
    std::int64_t t = 5;
    const std::int32_t skip_c = skip;
    ac.params = host(pc);
    ac.g = host(g);
    ac.m = host(mc);
    ac.v = host(vc);
    ac.lr = host(lrc);
    ac.t = &t;
    ac.skip = &skip_c;
    cpu.ops->adam(ac);
    cpu.ok();
    const auto pg = gpu.get(ad.params, P), mg = gpu.get(ad.m, P), vg = gpu.get(ad.v, P);
    const auto tg = gpu.get_typed(ad.t, 1)[0];
    CHECK(tg == t);
    CHECK(tg == (skip ? 5 : 6));
    if (skip) {
      expect_same_bits(pg, params, "adam skipped: params");
      expect_same_bits(mg, m, "adam skipped: m");
      expect_same_bits(vg, v, "adam skipped: v");
    } else {
      expect_close(pg, pc, kElementwise, "adam params");
      expect_close(mg, mc, kElementwise, "adam m");
      expect_close(vg, vc, kElementwise, "adam v");
    }
  }
}

namespace {

/// Three matrices: one with σ far above σ_max (scaled), one below (untouched), one tiny.
struct SpectralCase {
  struct M {
    int rows, cols;
    float gain;
  };
  std::vector<M> shapes{{37, 53, 1.0f}, {51, 128, 0.05f}, {7, 5, 1.0f}};
  std::vector<std::vector<float>> w, u;
  SpectralCase() {
    std::uint32_t seed = 30;
    for (const M& s : shapes) {
      auto wm = random_vec(static_cast<std::size_t>(s.rows) * s.cols, -1, 1, seed++);
      for (float& x : wm) x *= s.gain;
      auto um = random_vec(s.rows, -1, 1, seed++);
      double n = 0;
      for (float x : um) n += static_cast<double>(x) * x;
      for (float& x : um) x = static_cast<float>(x / std::sqrt(n));
      w.push_back(wm);
      u.push_back(um);
    }
  }
};

}  // namespace

TEST_CASE("gpu.ops.spectral_norm: one launch for all matrices; skip leaves W and u unchanged") {
  const int max_rows = 51, max_cols = 128;
  for (const int skip : {0, 1}) {
    INFO("skip " << skip);
    Gpu gpu;
    Cpu cpu;
    SpectralCase sc;
    std::vector<SpectralMatrix> dev, hst;
    std::vector<Real> wd, ud;
    for (std::size_t k = 0; k < sc.shapes.size(); ++k) {
      wd.push_back(gpu.put(sc.w[k]));
      ud.push_back(gpu.put(sc.u[k]));
      dev.push_back({wd.back(), ud.back(), sc.shapes[k].rows, sc.shapes[k].cols});
    }
    auto wc = sc.w, uc = sc.u;
    for (std::size_t k = 0; k < sc.shapes.size(); ++k)
      hst.push_back({host(wc[k]), host(uc[k]), sc.shapes[k].rows, sc.shapes[k].cols});
    auto* table = gpu.put_typed(dev);
    auto* skip_d = gpu.put_typed(std::vector<std::int32_t>{skip});
    const std::int32_t skip_c = skip;
    for (int iter = 0; iter < 2; ++iter) {  // two steps: the second starts from the updated u
      gpu.ops.spectral_norm(table, static_cast<int>(dev.size()), max_rows, max_cols, 2.0f, skip_d);
      cpu.ops->spectral_norm(hst.data(), static_cast<int>(hst.size()), max_rows, max_cols, 2.0f, &skip_c);
    }
    gpu.ok();
    cpu.ok();
    for (std::size_t k = 0; k < sc.shapes.size(); ++k) {
      const std::int64_t n = static_cast<std::int64_t>(sc.w[k].size());
      const auto wg = gpu.get(wd[k], n), ug = gpu.get(ud[k], sc.shapes[k].rows);
      if (skip) {
        expect_same_bits(wg, sc.w[k], "spectral skipped: W " + std::to_string(k));
        expect_same_bits(ug, sc.u[k], "spectral skipped: u " + std::to_string(k));
      } else {
        expect_close(wg, wc[k], kReduction, "spectral W " + std::to_string(k));
        expect_close(ug, uc[k], kReduction, "spectral u " + std::to_string(k));
      }
    }
    if (!skip) {
      CHECK(wc[0][0] != sc.w[0][0]);  // the first matrix really was scaled
      CHECK(wc[1] == sc.w[1]);        // the second was not
    }
  }
}

TEST_CASE("gpu.ops.target_update: Polyak, hard copy on the period, no copy off it, skip") {
  const std::int64_t P = 10007;
  const auto params = random_vec(P, -1, 1, 40), target0 = random_vec(P, -1, 1, 41);
  const struct {
    const char* why;
    std::int64_t period, t;
    int skip;
  } cases[] = {{"polyak", 0, 3, 0}, {"hard, t on the period", 4, 8, 0}, {"hard, t off the period", 4, 9, 0},
               {"polyak, skipped", 0, 3, 1}, {"hard, on the period, skipped", 4, 8, 1}};
  for (const auto& c : cases) {
    INFO(c.why);
    Gpu gpu;
    Cpu cpu;
    TargetUpdate tu;
    tu.P = P;
    tu.tau = 0.005f;
    tu.period = c.period;
    TargetUpdate td = tu, tc = tu;
    td.target = gpu.put(target0);
    td.params = gpu.put(params);
    td.t = gpu.put_typed(std::vector<std::int64_t>{c.t});
    td.skip = gpu.put_typed(std::vector<std::int32_t>{c.skip});
    gpu.ops.target_update(td);
    gpu.ok();
    auto tgt = target0, src = params;
    const std::int64_t t = c.t;
    const std::int32_t skip = c.skip;
    tc.target = host(tgt);
    tc.params = host(src);
    tc.t = &t;
    tc.skip = &skip;
    cpu.ops->target_update(tc);
    cpu.ok();
    const auto got = gpu.get(td.target, P);
    if (c.skip || c.period > 0) {
      expect_same_bits(got, tgt, "target update (copy or untouched: exact)");
    } else {
      expect_close(got, tgt, kElementwise, "polyak target");
    }
    if (c.skip) expect_same_bits(got, target0, "skipped target update");
  }
}

// --- elementwise and memory -------------------------------------------------------------------

TEST_CASE("gpu.ops.uniform: the same Philox numbers as the CPU, keyed by the device step") {
  const std::int64_t n = 1001;
  Gpu gpu;
  Cpu cpu;
  const std::int64_t step = 42;
  auto* step_d = gpu.put_typed(std::vector<std::int64_t>{step});
  Uniform u;
  u.n = n;
  u.seed = 0x1234567890ABCDEFull;
  u.stream = 3;
  for (const bool with_step : {true, false}) {
    INFO("step pointer " << with_step);
    Uniform ud = u, uc = u;
    ud.out = gpu.poisoned(n);
    ud.step = with_step ? step_d : nullptr;
    gpu.ops.uniform(ud);
    gpu.ok();
    std::vector<float> ref(static_cast<std::size_t>(n), kNaN);
    uc.out = host(ref);
    uc.step = with_step ? &step : nullptr;
    cpu.ops->uniform(uc);
    cpu.ok();
    const auto got = gpu.get(ud.out, n);
    expect_same_bits(got, ref, "uniform");
    for (float x : got) REQUIRE((x > 0.0f && x < 1.0f));
    // uniform_from: values 600 … 1000 of the same draw
    Uniform part = ud;
    part.out = gpu.poisoned(n - 600);
    part.n = n - 600;
    gpu.ops.uniform_from(part, 600);
    gpu.ok();
    expect_same_bits(gpu.get(part.out, n - 600), std::vector<float>(ref.begin() + 600, ref.end()), "uniform_from");
  }
}

TEST_CASE("gpu.ops.fill, copy, axpy, and the host transfers") {
  const std::int64_t n = 1001;
  Gpu gpu;
  Cpu cpu;
  auto x = random_vec(n, -1, 1, 50), y = random_vec(n, -1, 1, 51);
  Real xd = gpu.put(x), yd = gpu.put(y), fd = gpu.poisoned(n), cd = gpu.poisoned(n);
  gpu.ops.fill(fd, 0.25f, n);
  gpu.ops.copy(cd, xd, n);
  gpu.ops.axpy(yd, xd, -0.3f, n);
  gpu.ok();
  CHECK(gpu.get(fd, n) == std::vector<float>(static_cast<std::size_t>(n), 0.25f));
  expect_same_bits(gpu.get(cd, n), x, "copy");
  auto yc = y;
  cpu.ops->axpy(host(yc), host(x), -0.3f, n);
  cpu.ok();
  expect_close(gpu.get(yd, n), yc, kElementwise, "axpy");

  // Raw bytes round trip (upload/download) of an odd size.
  std::vector<unsigned char> bytes(777), back(777, 0);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>(i * 37 + 11);
  void* raw = gpu.raw(bytes.size());
  gpu.ops.upload(raw, bytes.data(), bytes.size());
  gpu.ops.download(back.data(), raw, back.size());
  gpu.ok();
  CHECK(back == bytes);
}

// --- errors, plan mode ------------------------------------------------------------------------

TEST_CASE("gpu.ops.errors: first error wins; runtime misuse throws") {
  Gpu gpu;
  CHECK(gpu.ops.status() == 0);
  Real wide = gpu.reals(8);
  wide.esize = 8;
  gpu.ops.fill(wide, 1.0f, 4);
  CHECK(gpu.ops.status() != 0);
  const std::string first = gpu.ops.message();
  CHECK(first.find("element size") != std::string::npos);
  gpu.ops.fill(gpu.reals(4), 1.0f, -1);
  CHECK(std::string(gpu.ops.message()) == first);

  CHECK_THROWS_AS(gpu.rt().alloc_arena(1024), std::runtime_error);  // the arena is allocated once
  CHECK_THROWS_AS(gpu.rt().replay(), std::runtime_error);           // nothing captured yet
  CHECK_THROWS_AS(gpu.rt().plan_end(), std::runtime_error);         // no plan begun
  CHECK_THROWS_AS(make_cuda_runtime(CudaSpec{}, Precision::fp32, 4096), std::runtime_error);
  CHECK(gpu.rt().captures());
  CHECK(gpu.rt().describe().find("cuda device 0") != std::string::npos);
  CHECK(gpu.rt().peak_bytes() >= (std::size_t{64} << 20));
}

TEST_CASE("gpu.ops.plan: scratch beyond the reserve needs a plan; planning does no work") {
  // A bf16 GEMM whose operand copies (~9.8 MB) exceed the scratch reserved at creation (8 MiB).
  const int m = 16384, n = 3, k = 300;
  auto A = random_vec(static_cast<std::size_t>(m) * k, -1, 1, 60), B = random_vec(static_cast<std::size_t>(n) * k, -1, 1, 61);
  Gemm g;
  g.tb = true;
  g.m = m;
  g.n = n;
  g.k = k;
  g.lda = k;
  g.ldb = k;
  g.ldc = n;
  {
    Gpu gpu(Precision::bf16);
    Gemm gd = g;
    gd.a = gpu.put(A);
    gd.b = gpu.put(B);
    gd.c = gpu.poisoned(static_cast<std::int64_t>(m) * n);
    gpu.ops.gemm(gd);
    gpu.rt().synchronize();
    CHECK(gpu.ops.status() != 0);
    CHECK(std::string(gpu.ops.message()).find("plan") != std::string::npos);
  }
  Gpu gpu(Precision::bf16);
  Gemm gd = g;
  gd.a = gpu.put(A);
  gd.b = gpu.put(B);
  gd.c = gpu.poisoned(static_cast<std::int64_t>(m) * n);
  gpu.rt().plan_begin();
  gpu.ops.gemm(gd);
  gpu.rt().plan_end();
  gpu.ok();
  for (float x : gpu.get(gd.c, static_cast<std::int64_t>(m) * n)) REQUIRE(std::isnan(x));  // planning ran nothing
  gpu.ops.gemm(gd);
  gpu.ok();
  std::vector<float> C(static_cast<std::size_t>(m) * n, kNaN);
  Cpu cpu;
  Gemm gc = g;
  gc.a = host(A);
  gc.b = host(B);
  gc.c = host(C);
  cpu.ops->gemm(gc);
  cpu.ok();
  expect_close(gpu.get(gd.c, static_cast<std::int64_t>(m) * n), C, kBf16Gemm, "planned bf16 gemm");
}

// --- skip chain, determinism, capture ---------------------------------------------------------

TEST_CASE("gpu.ops.skip_chain: budget → adam → spectral norm → target, finite and with a NaN head") {
  for (const bool bad : {false, true}) {
    INFO("NaN head " << bad);
    Gpu gpu;
    Cpu cpu;
    BudgetCase bc(kNaN, bad);
    const int H = BudgetCase::H;
    const std::int64_t P = BudgetCase::P;
    // Parameters: the first 37·53 of them also form the spectrally normed matrix.
    const int rows = 37, cols = 53;
    auto params = random_vec(P, -1, 1, 70), m = random_vec(P, -0.01f, 0.01f, 71), v = random_vec(P, 0, 1e-4f, 72);
    auto target = random_vec(P, -1, 1, 73), u = random_vec(rows, -0.2f, 0.2f, 74);
    const std::vector<float> lr{1e-3f};
    struct Side {
      Budget b;
      Adam a;
      TargetUpdate t;
      SpectralMatrix s;
    };
    auto build = [&](Side& sd, auto&& real, std::int32_t* skip, std::int64_t* skipped, std::int64_t* t) {
      sd.b.H = H;
      sd.b.P = P;
      sd.b.grads = real(bc.grads);
      sd.b.fractions = real(bc.fractions);
      sd.b.losses = real(bc.losses);
      sd.b.norms = real(std::vector<float>(H, kNaN));
      sd.b.clips = real(std::vector<float>(H, kNaN));
      sd.b.g = real(std::vector<float>(static_cast<std::size_t>(P), kNaN));
      sd.b.total_loss = real(std::vector<float>{kNaN});
      sd.b.skip = skip;
      sd.b.skipped = skipped;
      sd.a.P = P;
      sd.a.params = real(params);
      sd.a.g = sd.b.g;
      sd.a.m = real(m);
      sd.a.v = real(v);
      sd.a.lr = real(lr);
      sd.a.t = t;
      sd.a.skip = skip;
      sd.s = {sd.a.params, real(u), rows, cols};
      sd.t.P = P;
      sd.t.target = real(target);
      sd.t.params = sd.a.params;
      sd.t.t = t;
      sd.t.skip = skip;
    };
    Side dg, hc;
    std::int32_t* skip_d = gpu.put_typed(std::vector<std::int32_t>{-1});
    std::int64_t* skipped_d = gpu.put_typed(std::vector<std::int64_t>{2});
    std::int64_t* t_d = gpu.put_typed(std::vector<std::int64_t>{10});
    build(dg, [&](const std::vector<float>& h) { return gpu.put(h); }, skip_d, skipped_d, t_d);
    std::deque<std::vector<float>> store;  // host buffers; a deque never moves its elements
    std::int32_t skip_h = -1;
    std::int64_t skipped_h = 2, t_h = 10;
    build(hc, [&](const std::vector<float>& h) { store.push_back(h); return host(store.back()); }, &skip_h, &skipped_h, &t_h);
    auto* table = gpu.put_typed(std::vector<SpectralMatrix>{dg.s});

    gpu.ops.budget(dg.b);
    gpu.ops.adam(dg.a);
    gpu.ops.spectral_norm(table, 1, rows, cols, 2.0f, skip_d);
    gpu.ops.target_update(dg.t);
    gpu.ok();
    cpu.ops->budget(hc.b);
    cpu.ops->adam(hc.a);
    cpu.ops->spectral_norm(&hc.s, 1, rows, cols, 2.0f, &skip_h);
    cpu.ops->target_update(hc.t);
    cpu.ok();

    const auto pg = gpu.get(dg.a.params, P), mg = gpu.get(dg.a.m, P), vg = gpu.get(dg.a.v, P);
    const auto tg = gpu.get(dg.t.target, P), ug = gpu.get(dg.s.u, rows);
    CHECK(gpu.get_typed(skip_d, 1)[0] == (bad ? 1 : 0));
    CHECK(gpu.get_typed(skipped_d, 1)[0] == (bad ? 3 : 2));
    CHECK(gpu.get_typed(t_d, 1)[0] == (bad ? 10 : 11));
    CHECK(t_h == (bad ? 10 : 11));
    if (bad) {
      expect_same_bits(pg, params, "skipped: params");
      expect_same_bits(mg, m, "skipped: m");
      expect_same_bits(vg, v, "skipped: v");
      expect_same_bits(tg, target, "skipped: target");
      expect_same_bits(ug, u, "skipped: u");
    } else {
      auto hv = [](const Real& r, std::int64_t n) {
        return std::vector<float>(r.as<float>(), r.as<float>() + n);
      };
      expect_close(pg, hv(hc.a.params, P), kElementwise, "chain params");
      expect_close(mg, hv(hc.a.m, P), kElementwise, "chain m");
      expect_close(vg, hv(hc.a.v, P), kElementwise, "chain v");
      expect_close(tg, hv(hc.t.target, P), kElementwise, "chain target");
      expect_close(ug, hv(hc.s.u, rows), kReduction, "chain u");
    }
  }
}

/// The state an update reads and writes, on the host: an Update's buffers are made from these by
/// update_args.
struct UpdateState {
  int H = 0;
  std::int64_t P = 0;
  std::vector<float> grads, fractions, losses, params, m, v, lr, target;
  std::int64_t period = 0;
};

/// The state two updates write, a's and b's buffer side by side (for expect_same_reals): params,
/// m, v, target, g and the norms.
std::vector<RealPair> update_pairs(const Update& a, const Update& b) {
  const std::int64_t P = a.budget.P;
  return {{"params", a.adam.params, b.adam.params, P},       {"m", a.adam.m, b.adam.m, P},
          {"v", a.adam.v, b.adam.v, P},                      {"target", a.target.target, b.target.target, P},
          {"g", a.budget.g, b.budget.g, P},                  {"norms", a.budget.norms, b.budget.norms, a.budget.H}};
}

/// An Update (no normed matrices yet) over `st`, every buffer made by real(host vector); the outputs
/// (norms, clips, g, total loss) NaN-poisoned; skip, skipped and t given.
template <class MakeReal>
Update update_args(const UpdateState& st, MakeReal&& real, std::int32_t* skip, std::int64_t* skipped,
                   std::int64_t* t) {
  Update up;
  Budget& b = up.budget;
  b.H = st.H;
  b.P = st.P;
  b.grads = real(st.grads);
  b.fractions = real(st.fractions);
  b.losses = real(st.losses);
  b.norms = real(std::vector<float>(static_cast<std::size_t>(st.H), kNaN));
  b.clips = real(std::vector<float>(static_cast<std::size_t>(st.H), kNaN));
  b.g = real(std::vector<float>(static_cast<std::size_t>(st.P), kNaN));
  b.total_loss = real(std::vector<float>{kNaN});
  b.skip = skip;
  b.skipped = skipped;
  Adam& a = up.adam;
  a.P = st.P;
  a.params = real(st.params);
  a.g = b.g;
  a.m = real(st.m);
  a.v = real(st.v);
  a.lr = real(st.lr);
  a.t = t;
  a.skip = skip;
  up.sigma_max = 2.0f;
  TargetUpdate& tu = up.target;
  tu.P = st.P;
  tu.target = real(st.target);
  tu.params = a.params;
  tu.tau = 0.005f;
  tu.period = st.period;
  tu.t = t;
  tu.skip = skip;
  return up;
}

TEST_CASE("gpu.ops.update: the cluster update equals budget → adam → spectral norm → target, bit for bit") {
  // The cluster update (two launches where the device runs clusters) against the
  // four separate CUDA ops on a copy of the same state (the same kernels' arithmetic: equal
  // bits) and against the CPU twin (float rounding). Cases: finite and a NaN head; Polyak, a hard
  // copy on and off the period; normed matrices inside params (the target update of their rows
  // fused into the spectral-norm pass), one outside params (the target update after everything),
  // none.
  struct Case {
    const char* why;
    bool bad;
    std::int64_t period, t0;
    int layout;  // 0: two matrices inside params, 1: one inside and one outside, 2: none
  };
  const Case cases[] = {
      {"polyak, two normed matrices in params", false, 0, 10, 0},
      {"hard copy on the period", false, 4, 11, 0},
      {"hard copy off the period", false, 4, 12, 0},
      {"a normed matrix outside params", false, 0, 10, 1},
      {"no spectral norm", false, 0, 10, 2},
      {"a NaN head skips everything", true, 0, 10, 0},
      {"a NaN head, hard copy on the period", true, 4, 11, 1},
  };
  // With a normed matrix outside params the cluster update runs the separate ops. The cluster
  // update's power iteration adds its double sums in another order: its normed matrices, their u
  // and their target rows may differ from the separate ops' in the last bit of a float
  // (kSumOrder), everything else is equal bit for bit.
  constexpr double kSumOrder = 1e-7;
  for (const Case& c : cases) {
    INFO(c.why);
    Gpu gpu;
    Cpu cpu;
    REQUIRE_MESSAGE(cuda::lab::update_info(gpu.rt()).cluster_size > 0,
                    "no cluster update on this device: only the separate kernels would be compared");
    BudgetCase bc(kNaN, c.bad);
    const int H = BudgetCase::H;
    const std::int64_t P = BudgetCase::P;
    // Matrix 0: params[100 .. 100+37·53), matrix 1: params[3000 .. 3000+61·41) (layout 0) or its
    // own buffer (layout 1).
    const int r0 = 37, c0 = 53, r1 = 61, c1 = 41;
    const std::int64_t off0 = 100, off1 = 3000;
    auto params = random_vec(P, -1, 1, 70), m = random_vec(P, -0.01f, 0.01f, 71), v = random_vec(P, 0, 1e-4f, 72);
    auto target = random_vec(P, -1, 1, 73), u0 = random_vec(r0, -0.2f, 0.2f, 74), u1 = random_vec(r1, -0.2f, 0.2f, 75);
    auto outside = random_vec(static_cast<std::size_t>(r1) * c1, -1, 1, 76);
    const std::vector<float> lr{1e-3f};
    const int nsn = c.layout == 2 ? 0 : 2;
    struct Side {
      Update up;
      std::vector<SpectralMatrix> mats;
      Real u0, u1, outside;
    };
    const UpdateState st{H, P, bc.grads, bc.fractions, bc.losses, params, m, v, lr, target, c.period};
    auto build = [&](Side& sd, auto&& real, std::int32_t* skip, std::int64_t* skipped, std::int64_t* t) {
      sd.up = update_args(st, real, skip, skipped, t);
      sd.u0 = real(u0);
      sd.u1 = real(u1);
      sd.outside = real(outside);
      if (nsn > 0) {
        sd.mats.push_back({sd.up.adam.params + off0, sd.u0, r0, c0});
        sd.mats.push_back({c.layout == 1 ? sd.outside : sd.up.adam.params + off1, sd.u1, r1, c1});
      }
      sd.up.sn_count = nsn;
      sd.up.sn_max_rows = std::max(r0, r1);
      sd.up.sn_max_cols = std::max(c0, c1);
    };
    // cluster update (gpu f), separate ops (gpu s), cpu
    Side f, sp, hc;
    auto on_gpu = [&](const std::vector<float>& h) { return gpu.put(h); };
    std::int32_t* skip_f = gpu.put_typed(std::vector<std::int32_t>{-1});
    std::int32_t* skip_s = gpu.put_typed(std::vector<std::int32_t>{-1});
    std::int64_t* skipped_f = gpu.put_typed(std::vector<std::int64_t>{2});
    std::int64_t* skipped_s = gpu.put_typed(std::vector<std::int64_t>{2});
    std::int64_t* t_f = gpu.put_typed(std::vector<std::int64_t>{c.t0});
    std::int64_t* t_s = gpu.put_typed(std::vector<std::int64_t>{c.t0});
    build(f, on_gpu, skip_f, skipped_f, t_f);
    build(sp, on_gpu, skip_s, skipped_s, t_s);
    std::deque<std::vector<float>> store;  // host buffers; a deque never moves its elements
    std::int32_t skip_h = -1;
    std::int64_t skipped_h = 2, t_h = c.t0;
    build(hc, [&](const std::vector<float>& h) { store.push_back(h); return host(store.back()); }, &skip_h, &skipped_h,
          &t_h);
    f.up.sn_mats = nsn ? gpu.put_typed(f.mats) : nullptr;
    sp.up.sn_mats = nsn ? gpu.put_typed(sp.mats) : nullptr;
    hc.up.sn_mats = nsn ? hc.mats.data() : nullptr;

    gpu.ops.update(f.up);
    gpu.ops.budget(sp.up.budget);
    gpu.ops.adam(sp.up.adam);
    if (nsn) gpu.ops.spectral_norm(sp.up.sn_mats, nsn, sp.up.sn_max_rows, sp.up.sn_max_cols, 2.0f, skip_s);
    gpu.ops.target_update(sp.up.target);
    gpu.ok();
    // Where the grid is resident at once (these 48 blocks) every area of shared memory is used:
    // second tiles staged, the normed rows kept, the sums pushed to every block; and on a backend
    // of its own, twice on the same state, the same bits as the first
    const cuda::lab::UpdateInfo info = cuda::lab::update_info(gpu.rt());
    if (c.layout == 0) {
      CHECK(info.last.pushed);
      CHECK(info.last.staged);
      CHECK(info.last.kept);
      CHECK_FALSE(info.last.wide());  // (these matrices hold one tile a block: nothing to split)
    }
    {
      Gpu gq;
      for (int round = 0; round < 2; ++round) {
        INFO("again, launch " << round + 1);
        Side q;
        std::int32_t* skip_q = gq.put_typed(std::vector<std::int32_t>{-1});
        std::int64_t* skipped_q = gq.put_typed(std::vector<std::int64_t>{2});
        std::int64_t* t_q = gq.put_typed(std::vector<std::int64_t>{c.t0});
        build(q, [&](const std::vector<float>& h) { return gq.put(h); }, skip_q, skipped_q, t_q);
        q.up.sn_mats = nsn ? gq.put_typed(q.mats) : nullptr;
        gq.ops.update(q.up);
        gq.ok();
        auto pairs = update_pairs(q.up, f.up);
        pairs.insert(pairs.end(), {{"clips", q.up.budget.clips, f.up.budget.clips, H},
                                   {"total loss", q.up.budget.total_loss, f.up.budget.total_loss, 1},
                                   {"u0", q.u0, f.u0, r0},
                                   {"u1", q.u1, f.u1, r1},
                                   {"outside matrix", q.outside, f.outside, static_cast<std::int64_t>(r1) * c1}});
        expect_same_reals(gq, gpu, "again vs first", pairs);
        CHECK(gq.get_typed(skip_q, 1)[0] == gpu.get_typed(skip_f, 1)[0]);
        CHECK(gq.get_typed(skipped_q, 1)[0] == gpu.get_typed(skipped_f, 1)[0]);
        CHECK(gq.get_typed(t_q, 1)[0] == gpu.get_typed(t_f, 1)[0]);
      }
    }
    cpu.ops->update(hc.up);
    cpu.ok();

    auto hv = [](const Real& r, std::int64_t n) { return std::vector<float>(r.as<float>(), r.as<float>() + n); };
    const struct {
      const char* name;
      Real fr, sr, hr;
      std::int64_t n;
    } outs[] = {
        {"params", f.up.adam.params, sp.up.adam.params, hc.up.adam.params, P},
        {"m", f.up.adam.m, sp.up.adam.m, hc.up.adam.m, P},
        {"v", f.up.adam.v, sp.up.adam.v, hc.up.adam.v, P},
        {"target", f.up.target.target, sp.up.target.target, hc.up.target.target, P},
        {"g", f.up.budget.g, sp.up.budget.g, hc.up.budget.g, P},
        {"norms", f.up.budget.norms, sp.up.budget.norms, hc.up.budget.norms, H},
        {"clips", f.up.budget.clips, sp.up.budget.clips, hc.up.budget.clips, H},
        {"total loss", f.up.budget.total_loss, sp.up.budget.total_loss, hc.up.budget.total_loss, 1},
        {"u0", f.u0, sp.u0, hc.u0, r0},
        {"u1", f.u1, sp.u1, hc.u1, r1},
        {"outside matrix", f.outside, sp.outside, hc.outside, static_cast<std::int64_t>(r1) * c1},
    };
    for (const auto& o : outs) {
      const auto got = gpu.get(o.fr, o.n);
      const std::string name = o.name;
      const bool sum_order = c.layout == 0 && !c.bad &&
                             (name == "params" || name == "target" || name == "u0" || name == "u1");
      if (sum_order) expect_close(got, gpu.get(o.sr, o.n), kSumOrder, "cluster vs separate: " + name);
      else expect_same_bits(got, gpu.get(o.sr, o.n), std::string("cluster vs separate: ") + o.name);
      if (c.bad && std::string(o.name) != "norms" && std::string(o.name) != "clips" && std::string(o.name) != "g" &&
          std::string(o.name) != "total loss")
        continue;  // unchanged state is checked bit for bit below
      expect_close(got, hv(o.hr, o.n), kReduction, std::string("cluster vs cpu: ") + o.name);
    }
    CHECK(gpu.get_typed(skip_f, 1)[0] == (c.bad ? 1 : 0));
    CHECK(gpu.get_typed(skipped_f, 1)[0] == (c.bad ? 3 : 2));
    CHECK(gpu.get_typed(t_f, 1)[0] == (c.bad ? c.t0 : c.t0 + 1));
    CHECK(t_h == (c.bad ? c.t0 : c.t0 + 1));
    if (c.bad) {
      expect_same_bits(gpu.get(f.up.adam.params, P), params, "skipped: params");
      expect_same_bits(gpu.get(f.up.adam.m, P), m, "skipped: m");
      expect_same_bits(gpu.get(f.up.target.target, P), target, "skipped: target");
      expect_same_bits(gpu.get(f.u0, r0), u0, "skipped: u0");
    } else {
      // the step did something: params moved and (Polyak or a copy on the period) so did the target
      CHECK(gpu.get(f.up.adam.params, P) != params);
      const bool moved = gpu.get(f.up.target.target, P) != target;
      CHECK(moved == (c.period == 0 || (c.t0 + 1) % c.period == 0));
    }
  }
}

TEST_CASE("gpu.ops.update.shapes: the cluster update on the step's and awkward matrix shapes against the separate ops and the CPU") {
  // Normed matrices of the step's shapes and awkward ones inside one params. A block takes
  // ceil(rows / cluster size) rows of its matrix (at 16 blocks a cluster: 19 of 300 × 256, 16 of
  // 256 × 256, 13 of 200 × 250, 8 of 128 × 256, 3 of 37 × 53), so its share is three tiles of
  // 2,048 elements (300 × 256), two (256 × 256, 200 × 250), one (128 × 256, 255 × 128) or a part
  // of one (256 × 64, 51 × 128, 37 × 53, 1 × 9), and some blocks hold no row (37 × 53 fills 13 of
  // 16, 1 × 9 one). One is scaled down so that σ < σ_max (not
  // rescaled); the others are rescaled. Two heads, the second clipped. The cluster's power
  // iteration sums in another order: params, target and u within kSumOrder of the separate ops;
  // m, v, g, norms and clips equal bit for bit.
  struct Mat {
    int rows, cols;
    float scale;
  };
  const Mat mats[] = {{256, 256, 1.0f}, {200, 250, 1.0f}, {128, 256, 1.0f}, {255, 128, 1.0f}, {256, 64, 1.0f},
                      {37, 53, 1.0f},   {1, 9, 1.0f},     {300, 256, 1.0f}, {51, 128, 0.01f}};
  constexpr int H = 2;
  constexpr double kSumOrder = 1e-7;
  std::vector<std::int64_t> offs;
  std::int64_t P = 77;  // a gap before the first matrix, and between all of them
  for (const Mat& m : mats) {
    offs.push_back(P);
    P += static_cast<std::int64_t>(m.rows) * m.cols + 131;
  }
  int max_rows = 0, max_cols = 0;
  for (const Mat& m : mats) {
    max_rows = std::max(max_rows, m.rows);
    max_cols = std::max(max_cols, m.cols);
  }
  const int nsn = static_cast<int>(std::size(mats));
  auto params = random_vec(static_cast<std::size_t>(P), -1, 1, 80);
  for (int k = 0; k < nsn; ++k)
    for (std::int64_t i = 0; i < static_cast<std::int64_t>(mats[k].rows) * mats[k].cols; ++i)
      params[static_cast<std::size_t>(offs[static_cast<std::size_t>(k)] + i)] *= mats[k].scale;
  const auto m0 = random_vec(static_cast<std::size_t>(P), -0.01f, 0.01f, 81);
  const auto v0 = random_vec(static_cast<std::size_t>(P), 0, 1e-4f, 82);
  const auto target0 = random_vec(static_cast<std::size_t>(P), -1, 1, 83);
  auto grads = random_vec(static_cast<std::size_t>(H * P), -1, 1, 84);
  for (std::int64_t i = 0; i < P; ++i) grads[static_cast<std::size_t>(P + i)] *= 1e-3f;  // head 1: clip 1
  const std::vector<float> fractions{0.8f, 0.2f}, losses{1.5f, 0.25f}, lr{1e-3f};
  std::vector<std::vector<float>> us;
  for (int k = 0; k < nsn; ++k) us.push_back(random_vec(static_cast<std::size_t>(mats[k].rows), -0.2f, 0.2f, 90 + k));

  struct Case {
    const char* why;
    bool bad;
    std::int64_t period, t0;
  };
  const Case cases[] = {{"polyak", false, 0, 10}, {"hard copy on the period", false, 4, 11},
                        {"hard copy off the period", false, 4, 12}, {"a NaN head skips everything", true, 0, 10}};
  for (const Case& c : cases) {
    INFO(c.why);
    auto g = grads;
    if (c.bad) g[static_cast<std::size_t>(P + 4321)] = kNaN;
    // Side: one update's state on one backend (cl: the cluster update, sep: the four separate
    // ops, cpu: the CPU twin)
    struct Side {
      Update up;
      std::vector<SpectralMatrix> mats;
      std::vector<Real> u;
      std::int32_t* skip;
      std::int64_t *skipped, *t;
    };
    const UpdateState st{H, P, g, fractions, losses, params, m0, v0, lr, target0, c.period};
    auto build = [&](Side& sd, auto&& real, auto&& i32, auto&& i64) {
      sd.skip = i32(std::vector<std::int32_t>{-1});
      sd.skipped = i64(std::vector<std::int64_t>{2});
      sd.t = i64(std::vector<std::int64_t>{c.t0});
      sd.up = update_args(st, real, sd.skip, sd.skipped, sd.t);
      for (int k = 0; k < nsn; ++k) {
        sd.u.push_back(real(us[static_cast<std::size_t>(k)]));
        sd.mats.push_back(
            {sd.up.adam.params + offs[static_cast<std::size_t>(k)], sd.u.back(), mats[k].rows, mats[k].cols});
      }
      sd.up.sn_count = nsn;
      sd.up.sn_max_rows = max_rows;
      sd.up.sn_max_cols = max_cols;
    };
    auto on = [&](Gpu& gpu, Side& sd) {
      build(sd, [&](const std::vector<float>& h) { return gpu.put(h); },
            [&](const std::vector<std::int32_t>& h) { return gpu.put_typed(h); },
            [&](const std::vector<std::int64_t>& h) { return gpu.put_typed(h); });
      sd.up.sn_mats = gpu.put_typed(sd.mats);
    };
    Side cl, sep, hc;
    Gpu gr;
    REQUIRE_MESSAGE(cuda::lab::update_info(gr.rt()).cluster_size > 0, "no cluster update on this device");
    on(gr, cl);
    on(gr, sep);
    std::deque<std::vector<float>> store;  // host buffers; a deque never moves its elements
    std::deque<std::vector<std::int32_t>> store32;
    std::deque<std::vector<std::int64_t>> store64;
    build(hc, [&](const std::vector<float>& h) { store.push_back(h); return host(store.back()); },
          [&](const std::vector<std::int32_t>& h) { store32.push_back(h); return store32.back().data(); },
          [&](const std::vector<std::int64_t>& h) { store64.push_back(h); return store64.back().data(); });
    hc.up.sn_mats = hc.mats.data();

    gr.ops.update(cl.up);
    gr.ops.budget(sep.up.budget);
    gr.ops.adam(sep.up.adam);
    gr.ops.spectral_norm(sep.up.sn_mats, nsn, max_rows, max_cols, 2.0f, sep.skip);
    gr.ops.target_update(sep.up.target);
    gr.ok();
    // Where the grid fits (these 160 blocks): Wᵀu summed in shares of ceil(cols / 16) columns (1
    // of the 1 × 9 matrix's, 4 of 37 × 53, 16 of 250 and 256, so some blocks own none); the second
    // tile of the 256 × 256, 200 × 250 and 300 × 256 blocks in shared memory, the third loaded as
    // before, Wᵀu from registers for the three of 256 columns; every normed block's rows of the
    // new θ in shared memory, read back from there by Wᵀu for the columns of the other six, by W v
    // and the scaling, and the old target of the two- and three-tile blocks copied there before
    // the wait; the push slots do not fit beside them here (117 KiB a block); no wide launch
    // (the whole update is not resident with it)
    {
      const cuda::lab::UpdateInfo info = cuda::lab::update_info(gr.rt());
      CHECK(info.last.staged);
      CHECK(info.last.gathered);
      CHECK(info.last.kept);
      CHECK_FALSE(info.last.pushed);
    }
    // At 8 blocks a cluster (cuda.update_cluster: 8) the cluster's sums add other partial sums:
    // within kSumOrder of the separate ops below, m, v, g and the norms equal bit for bit
    CudaSpec eight;
    eight.update_cluster = 8;
    Gpu g8(Precision::fp32, eight);
    Side c8;
    on(g8, c8);
    g8.ops.update(c8.up);
    g8.ok();
    CHECK(cuda::lab::update_info(g8.rt()).cluster_size == 8);
    Cpu cpu;
    cpu.ops->update(hc.up);
    cpu.ok();

    auto hv = [](const Real& r, std::int64_t n) { return std::vector<float>(r.as<float>(), r.as<float>() + n); };
    struct Out {
      std::string name;
      Real cl, s, h;
      std::int64_t n;
      bool summed;  // from the power iteration (sums in another order)
    };
    std::vector<Out> outs = {
        {"params", cl.up.adam.params, sep.up.adam.params, hc.up.adam.params, P, true},
        {"target", cl.up.target.target, sep.up.target.target, hc.up.target.target, P, true},
        {"m", cl.up.adam.m, sep.up.adam.m, hc.up.adam.m, P, false},
        {"v", cl.up.adam.v, sep.up.adam.v, hc.up.adam.v, P, false},
        {"g", cl.up.budget.g, sep.up.budget.g, hc.up.budget.g, P, false},
        {"norms", cl.up.budget.norms, sep.up.budget.norms, hc.up.budget.norms, H, false},
        {"clips", cl.up.budget.clips, sep.up.budget.clips, hc.up.budget.clips, H, false},
    };
    for (int k = 0; k < nsn; ++k)
      outs.push_back({"u of matrix " + std::to_string(k) + " (" + std::to_string(mats[k].rows) + " x " +
                          std::to_string(mats[k].cols) + ")",
                      cl.u[static_cast<std::size_t>(k)],
                      sep.u[static_cast<std::size_t>(k)], hc.u[static_cast<std::size_t>(k)], mats[k].rows, true});
    std::vector<Real> at8 = {c8.up.adam.params, c8.up.target.target, c8.up.adam.m, c8.up.adam.v, c8.up.budget.g,
                             c8.up.budget.norms, c8.up.budget.clips};
    for (int k = 0; k < nsn; ++k) at8.push_back(c8.u[static_cast<std::size_t>(k)]);
    for (std::size_t i = 0; i < outs.size(); ++i) {
      const Out& o = outs[i];
      const auto got = gr.get(o.cl, o.n);
      const auto sep_got = gr.get(o.s, o.n);
      if (o.summed && !c.bad) {
        expect_close(got, sep_got, kSumOrder, "cluster vs separate: " + o.name);
        expect_close(g8.get(at8[i], o.n), sep_got, kSumOrder, "cluster of 8 vs separate: " + o.name);
      } else {
        expect_same_bits(got, sep_got, "cluster vs separate: " + o.name);
        expect_same_bits(g8.get(at8[i], o.n), sep_got, "cluster of 8 vs separate: " + o.name);
      }
      if (!c.bad || o.name == "norms" || o.name == "clips" || o.name == "g")
        expect_close(got, hv(o.h, o.n), kReduction, "cluster vs cpu: " + o.name);
    }
    // each matrix's elements moved (or, skipped, stayed) and the scaled-down one was not rescaled
    const auto p_after = gr.get(cl.up.adam.params, P);
    for (int k = 0; k < nsn; ++k) {
      const auto at = static_cast<std::size_t>(offs[static_cast<std::size_t>(k)]);
      const std::size_t n = static_cast<std::size_t>(mats[k].rows) * static_cast<std::size_t>(mats[k].cols);
      const std::vector<float> before(params.begin() + static_cast<std::ptrdiff_t>(at),
                                      params.begin() + static_cast<std::ptrdiff_t>(at + n));
      const std::vector<float> after(p_after.begin() + static_cast<std::ptrdiff_t>(at),
                                     p_after.begin() + static_cast<std::ptrdiff_t>(at + n));
      if (c.bad) expect_same_bits(after, before, "skipped: matrix " + std::to_string(k));
      else CHECK_MESSAGE(after != before, "matrix " << k << " unchanged");
    }
    CHECK(gr.get_typed(cl.skip, 1)[0] == (c.bad ? 1 : 0));
    CHECK(gr.get_typed(cl.skipped, 1)[0] == (c.bad ? 3 : 2));
    CHECK(gr.get_typed(cl.t, 1)[0] == (c.bad ? c.t0 : c.t0 + 1));
  }
}

