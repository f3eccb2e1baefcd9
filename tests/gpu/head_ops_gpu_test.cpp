// gpu.ops (the built-in heads' own ops): each plugin's device half against its host twin, through
// the free functions the heads call (plugins/*/..._ops), outputs poisoned with NaN first. The
// device scratch a head declares in the registry is allocated here.
#include <doctest/doctest.h>

#include "c51_ops.hpp"
#include "gpu_ops_util.hpp"
#include "iqn_ops.hpp"

using namespace dqn;
using namespace gpu_ops;

TEST_CASE("gpu.ops.cosine_embedding and hadamard (IQN) against the CPU") {
  Gpu gpu;
  Cpu cpu;
  {  // cos(π i τ): the GPU reduces i·τ mod 2 exactly and takes a float cospi
    const int rows = 333, E = 64;
    auto tau = random_vec(rows, 0, 1, 7);
    tau[0] = 0.0f;
    tau[1] = 0.99999994f;
    std::vector<float> out(static_cast<std::size_t>(rows) * E);
    Real od = gpu.put(out), td = gpu.put(tau);
    cosine_embedding(gpu.ops, od, td, rows, E);
    gpu.ok();
    cosine_embedding(*cpu.ops, host(out), host(tau), rows, E);
    cpu.ok();
    const auto g = gpu.get(od, rows * E);
    double worst = 0.0;
    for (std::size_t i = 0; i < g.size(); ++i) worst = std::max(worst, std::fabs(double(g[i]) - double(out[i])));
    CHECK(worst < 1e-6);  // absolute: every value lies in [-1, 1]
  }
  for (const int H : {64, 61}) {  // 64: the four-column kernel; 61: the scalar one
    CAPTURE(H);
    const int B = 7, N = 5;
    auto h2 = random_vec(static_cast<std::size_t>(B) * H, -1, 1, 8);
    auto phi = random_vec(static_cast<std::size_t>(B) * N * H, -1, 1, 9);
    std::vector<float> x(phi.size());
    Real xd = gpu.put(x), hd = gpu.put(h2), pd = gpu.put(phi);
    hadamard(gpu.ops, xd, hd, pd, B, N, H);
    gpu.ok();
    hadamard(*cpu.ops, host(x), host(h2), host(phi), B, N, H);
    cpu.ok();
    expect_same_bits(gpu.get(xd, static_cast<std::int64_t>(x.size())), x, "hadamard (one product each)");
  }
}


TEST_CASE("gpu.ops.c51_project: dense projection with clamped support and terminal states") {
  const int B = 37, D = 3, A = 5, Z = 51;
  Gpu gpu;
  Cpu cpu;
  auto tlp = random_logp(B * D * A, Z, 13);
  auto a_star = random_ints(static_cast<std::size_t>(B) * D, 0, A - 1, 14);
  auto rewards = random_vec(B, -3, 3, 15);
  rewards[0] = 30.0f;  // beyond v_max: all mass at the top atom
  rewards[1] = -30.0f;
  auto dones = random_vec(B, 0, 1, 16);
  for (float& d : dones) d = d < 0.3f ? 1.0f : 0.0f;
  C51Project p;
  p.B = B;
  p.D = D;
  p.A = A;
  p.Z = Z;
  p.gamma_n = 0.99f;
  C51Project pd = p, pc = p;
  std::vector<float> m(static_cast<std::size_t>(B) * D * Z, kNaN);
  pd.m = gpu.poisoned(static_cast<std::int64_t>(m.size()));
  pd.target_logp = gpu.put(tlp);
  pd.a_star = gpu.put_typed(a_star);
  pd.rewards = gpu.put(rewards);
  pd.dones = gpu.put(dones);
  c51_project(gpu.ops, pd);
  gpu.ok();
  pc.m = host(m);
  pc.target_logp = host(tlp);
  pc.a_star = a_star.data();
  pc.rewards = host(rewards);
  pc.dones = host(dones);
  c51_project(*cpu.ops, pc);
  cpu.ok();
  expect_close(gpu.get(pd.m, static_cast<std::int64_t>(m.size())), m, kReduction, "c51_project");
}

TEST_CASE("gpu.ops.c51_xent: per-sample loss, weighted mean, gradient; = and +=") {
  const int B = 37, D = 3, A = 5, Z = 51;
  const std::size_t n = static_cast<std::size_t>(B) * D * A * Z;
  auto lp = random_logp(B * D * A, Z, 17);
  auto mlog = random_logp(B * D, Z, 18);
  std::vector<float> m(mlog.size());
  for (std::size_t i = 0; i < m.size(); ++i) m[i] = std::exp(mlog[i]);
  auto actions = random_ints(static_cast<std::size_t>(B) * D, 0, A - 1, 19);
  auto w = random_vec(B, 0.5f, 1.5f, 20);
  for (const bool accumulate : {false, true}) {
    for (const bool per_sample : {true, false}) {
      INFO("accumulate " << accumulate << ", per-sample output " << per_sample);
      Gpu gpu;
      Cpu cpu;
      C51Xent x;
      x.B = B;
      x.D = D;
      x.A = A;
      x.Z = Z;
      x.scale = 0.25f;
      x.accumulate = accumulate;
      const std::vector<float> loss0{accumulate ? 1.5f : kNaN};
      C51Xent xd = x, xc = x;
      xd.loss_per_sample = per_sample ? gpu.poisoned(B) : Real{};
      xd.loss = gpu.put(loss0);
      xd.dlogits = gpu.poisoned(static_cast<std::int64_t>(n));
      xd.logp = gpu.put(lp);
      xd.actions = gpu.put_typed(actions);
      xd.m = gpu.put(m);
      xd.weights = gpu.put(w);
      xd.sums = gpu.raw(8 * std::size_t(c51_xent_sums(B, 1)));
      c51_xent(gpu.ops, xd);
      gpu.ok();
      std::vector<float> lps(B, kNaN), loss = loss0, dl(n, kNaN);
      xc.loss_per_sample = per_sample ? host(lps) : Real{};
      xc.loss = host(loss);
      xc.dlogits = host(dl);
      xc.logp = host(lp);
      xc.actions = actions.data();
      xc.m = host(m);
      xc.weights = host(w);
      c51_xent(*cpu.ops, xc);
      cpu.ok();
      expect_close(gpu.get(xd.loss, 1), loss, kReduction, "c51_xent loss");
      expect_close(gpu.get(xd.dlogits, static_cast<std::int64_t>(n)), dl, kElementwise, "c51_xent dlogits");
      if (per_sample) expect_close(gpu.get(xd.loss_per_sample, B), lps, kReduction, "c51_xent loss_per_sample");
    }
  }
}

TEST_CASE("gpu.ops.c51_xent.dueling: the fused dueling backward (dv, padded dadv) over members, against the CPU") {
  // the ensemble's loss: K members against one m, dv [K·B, ldv] and dadv [K·B, D, ldd]
  const int B = 37, D = 3, A = 5, Z = 51, K = 3, ldv = Z + 1, ldd = A * Z + 1;
  const std::size_t n = static_cast<std::size_t>(K) * B * D * A * Z;
  auto lp = random_logp(K * B * D * A, Z, 27);
  auto mlog = random_logp(B * D, Z, 28);
  std::vector<float> m(mlog.size());
  for (std::size_t i = 0; i < m.size(); ++i) m[i] = std::exp(mlog[i]);
  auto actions = random_ints(static_cast<std::size_t>(B) * D, 0, A - 1, 29);
  auto w = random_vec(B, 0.5f, 1.5f, 30);
  Gpu gpu;
  Cpu cpu;
  C51Xent x;
  x.B = B; x.D = D; x.A = A; x.Z = Z; x.scale = 1.0f / K; x.members = K; x.lddv = ldv; x.lddadv = ldd;
  const std::size_t nv = static_cast<std::size_t>(K) * B * ldv, na = static_cast<std::size_t>(K) * B * D * ldd;
  C51Xent xd = x, xc = x;
  xd.loss = gpu.put(std::vector<float>{kNaN});
  xd.dlogits = gpu.poisoned(static_cast<std::int64_t>(n));
  xd.logp = gpu.put(lp); xd.actions = gpu.put_typed(actions); xd.m = gpu.put(m); xd.weights = gpu.put(w);
  xd.dv = gpu.poisoned(static_cast<std::int64_t>(nv)); xd.dadv = gpu.poisoned(static_cast<std::int64_t>(na));
  xd.sums = gpu.raw(8 * std::size_t(c51_xent_sums(B, K)));
  c51_xent(gpu.ops, xd);
  gpu.ok();
  std::vector<float> loss{kNaN}, dl(n, kNaN), dv(nv, kNaN), dadv(na, kNaN);
  xc.loss = host(loss); xc.dlogits = host(dl); xc.logp = host(lp); xc.actions = actions.data(); xc.m = host(m);
  xc.weights = host(w); xc.dv = host(dv); xc.dadv = host(dadv);
  c51_xent(*cpu.ops, xc);
  cpu.ok();
  expect_close(gpu.get(xd.loss, 1), loss, kReduction, "c51_xent loss");
  expect_close(gpu.get(xd.dlogits, static_cast<std::int64_t>(n)), dl, kElementwise, "c51_xent dlogits");
  // dv's padding column stays poisoned on both sides (NaN = NaN in expect_close); dadv's is zero
  expect_close(gpu.get(xd.dv, static_cast<std::int64_t>(nv)), dv, kReduction, "c51_xent dv");
  const auto got = gpu.get(xd.dadv, static_cast<std::int64_t>(na));
  expect_close(got, dadv, kElementwise, "c51_xent dadv");
  std::size_t zeros = 0;
  for (std::size_t i = 0; i < na; ++i) zeros += i % ldd >= static_cast<std::size_t>(A * Z) && got[i] == 0.0f;
  CHECK(zeros == static_cast<std::size_t>(K) * B * D * (ldd - A * Z));

  // An action out of range (the CPU refuses it with an error): that branch's rows are NaN in every
  // member, its padding zero like every other row's, and the other branches are as before.
  auto bad_actions = actions;
  const int bad = 5 * D + 1;  // sample 5, branch 1
  bad_actions[static_cast<std::size_t>(bad)] = A;
  xd.actions = gpu.put_typed(bad_actions);
  xd.dadv = gpu.poisoned(static_cast<std::int64_t>(na));
  c51_xent(gpu.ops, xd);
  gpu.ok();
  const auto poisoned = gpu.get(xd.dadv, static_cast<std::int64_t>(na));
  std::size_t nan_rows = 0, pad_zeros = 0, same = 0;
  for (std::size_t i = 0; i < na; ++i) {
    const std::size_t row = i / ldd, col = i % ldd, bd = row % (static_cast<std::size_t>(B) * D);
    if (col >= static_cast<std::size_t>(A * Z)) pad_zeros += poisoned[i] == 0.0f;
    else if (bd == static_cast<std::size_t>(bad)) nan_rows += std::isnan(poisoned[i]);
    else same += poisoned[i] == got[i];
  }
  CHECK(pad_zeros == static_cast<std::size_t>(K) * B * D * (ldd - A * Z));
  CHECK(nan_rows == static_cast<std::size_t>(K) * A * Z);
  CHECK(same == static_cast<std::size_t>(K) * (B * D - 1) * A * Z);
}

// --- optimisation -----------------------------------------------------------------------------


TEST_CASE("gpu.ops.c51_loss: fused target distribution, projection, cross-entropy and dueling backward") {
  const struct {
    int B, D, A, Z;
  } shapes[] = {{37, 3, 5, 51}, {5, 11, 4, 21}, {64, 1, 2, 101}, {9, 40, 3, 13}, {7, 2, 3, 300},
                {21, 2, 8, 64}, {6, 16, 3, 17}, {6, 17, 3, 17}, {4, 3, 9, 10}};
  // A warp per (sample, branch) while Z <= 64, A <= 8 and D <= 16 (shapes 1, 2, 6, 7); the block
  // kernel beyond (Z 101 or 300, D 40 or 17, A 9).
  // fp32: double arithmetic; tf32: float (kFloatMath). The last two shapes take several rounds
  // of branches per block, and several atoms per thread. pad: tadv's and dadv's (sample, branch)
  // blocks A·Z + pad apart (0: compact); dadv's padding must stay poisoned. Two warps a (sample,
  // branch) where the warp kernel runs and D <= 8 (shapes 1 and 6), one for larger D (2 and 7).
  for (const int pad : {0, 3})
  for (const Precision prec : {Precision::fp32, Precision::tf32})
  for (const auto& sh : shapes) {
    INFO("B " << sh.B << " D " << sh.D << " A " << sh.A << " Z " << sh.Z
              << (prec == Precision::fp32 ? " (double math)" : " (float math)") << " adv padding " << pad);
    const double tol = prec == Precision::fp32 ? kReduction : kFloatMath;
    Gpu gpu(prec);
    Cpu cpu;
    const int B = sh.B, D = sh.D, A = sh.A, Z = sh.Z, ld = Z + 2;
    const std::size_t n = static_cast<std::size_t>(B) * D * A * Z;
    const int ldadv = pad ? A * Z + pad : 0;
    const std::size_t na = pad ? static_cast<std::size_t>(B) * D * ldadv : n;  // tadv and dadv
    auto lp = random_logp(B * D * A, Z, 41);
    auto tv = random_vec(static_cast<std::size_t>(B) * ld, -2, 2, 42);
    auto tadv = random_vec(na, -3, 3, 43);
    auto actions = random_ints(static_cast<std::size_t>(B) * D, 0, A - 1, 44);
    auto a_star = random_ints(static_cast<std::size_t>(B) * D, 0, A - 1, 45);
    auto rewards = random_vec(B, -3, 3, 46);
    rewards[0] = 40.0f;  // beyond v_max: all mass at the top atom
    auto dones = random_vec(B, 0, 1, 47);
    for (float& d : dones) d = d < 0.3f ? 1.0f : 0.0f;
    auto w = random_vec(B, 0.5f, 1.5f, 48);
    C51Loss a;
    a.lddv = ld; a.ldtv = ld; a.B = B; a.D = D; a.A = A; a.Z = Z; a.gamma_n = 0.97f; a.v_min = -10.0f; a.v_max = 10.0f;
    a.ldtadv = ldadv; a.lddadv = ldadv;
    C51Loss ad = a, ac = a;
    ad.m = gpu.poisoned(static_cast<std::int64_t>(B) * D * Z);
    ad.loss_per_sample = gpu.poisoned(B);
    ad.loss = gpu.poisoned(1);
    ad.dv = gpu.put(std::vector<float>(static_cast<std::size_t>(B) * ld, kNaN));  // padding stays poisoned
    ad.dadv = gpu.poisoned(static_cast<std::int64_t>(na));
    ad.logp = gpu.put(lp);
    ad.actions = gpu.put_typed(actions);
    ad.weights = gpu.put(w);
    ad.tv = gpu.put(tv);
    ad.tadv = gpu.put(tadv);
    ad.a_star = gpu.put_typed(a_star);
    ad.rewards = gpu.put(rewards);
    ad.dones = gpu.put(dones);
    ad.work_logp = gpu.poisoned(static_cast<std::int64_t>(n));
    ad.work_dlogits = gpu.poisoned(static_cast<std::int64_t>(n));
    ad.sums = gpu.raw(8 * std::size_t(c51_loss_sums(B)));
    ad.counter = gpu.put_typed(std::vector<std::int32_t>{0});  // a registry buffer starts at 0
    for (int rep = 0; rep < 3; ++rep) {  // the last-block counter must be back at 0 for the next launch
      c51_loss(gpu.ops, ad);
      gpu.ok();
    }
    std::vector<float> m(static_cast<std::size_t>(B) * D * Z, kNaN), lps(B, kNaN), loss(1, kNaN),
        dv(static_cast<std::size_t>(B) * ld, kNaN), dadv(na, kNaN), wl(n, kNaN), wd(n, kNaN);
    ac.m = host(m); ac.loss_per_sample = host(lps); ac.loss = host(loss); ac.dv = host(dv); ac.dadv = host(dadv);
    ac.logp = host(lp); ac.actions = actions.data(); ac.weights = host(w); ac.tv = host(tv); ac.tadv = host(tadv);
    ac.a_star = a_star.data(); ac.rewards = host(rewards); ac.dones = host(dones); ac.work_logp = host(wl);
    ac.work_dlogits = host(wd);
    c51_loss(*cpu.ops, ac);
    cpu.ok();
    expect_close(gpu.get(ad.m, static_cast<std::int64_t>(m.size())), m, tol, "c51_loss m");
    expect_close(gpu.get(ad.loss_per_sample, B), lps, tol, "c51_loss per sample");
    expect_close(gpu.get(ad.loss, 1), loss, tol, "c51_loss loss");
    expect_close(gpu.get(ad.dv, static_cast<std::int64_t>(dv.size())), dv, tol, "c51_loss dv");
    expect_close(gpu.get(ad.dadv, static_cast<std::int64_t>(na)), dadv, tol, "c51_loss dadv");
    // the same bits in two results of the op (k elements from the device)
    const std::int64_t nm = static_cast<std::int64_t>(m.size()), ndv = static_cast<std::int64_t>(dv.size()),
                       nadv = static_cast<std::int64_t>(na);
    auto same = [&](const Real& x, const Real& y, std::int64_t k, const std::string& what) {
      expect_same_bits(gpu.get(x, k), gpu.get(y, k), what);
    };
    // without the loss (C51Loss::loss null: no last block sums the batch) the same bits
    // everywhere else; the loss then by weighted_mean from the per-sample losses and the weights,
    // as the CPU twin's, and close to the fused one (which weights each sample before rounding it)
    C51Loss an = ad;
    an.loss = Real{};
    an.m = gpu.poisoned(static_cast<std::int64_t>(B) * D * Z);
    an.loss_per_sample = gpu.poisoned(B);
    an.dv = gpu.put(std::vector<float>(static_cast<std::size_t>(B) * ld, kNaN));
    an.dadv = gpu.poisoned(nadv);
    c51_loss(gpu.ops, an);
    gpu.ok();
    same(an.m, ad.m, nm, "c51_loss without loss: m");
    same(an.loss_per_sample, ad.loss_per_sample, B, "c51_loss without loss: per sample");
    same(an.dv, ad.dv, ndv, "c51_loss without loss: dv");
    same(an.dadv, ad.dadv, nadv, "c51_loss without loss: dadv");
    const Real mean = gpu.poisoned(1);
    gpu.ops.weighted_mean(mean, an.loss_per_sample, ad.weights, B);
    gpu.ok();
    std::vector<float> mean_cpu(1, kNaN);
    cpu.ops->weighted_mean(host(mean_cpu), host(lps), host(w), B);
    cpu.ok();
    expect_close(gpu.get(mean, 1), mean_cpu, tol, "weighted_mean of the per-sample losses against the CPU's");
    expect_close(gpu.get(mean, 1), gpu.get(ad.loss, 1), kReduction, "weighted_mean against the fused loss");
    // and the fused loss again after it (its last-block counter untouched by the launch without)
    const Real again = gpu.poisoned(1);
    C51Loss aa = ad;
    aa.loss = again;
    c51_loss(gpu.ops, aa);
    gpu.ok();
    same(again, ad.loss, 1, "c51_loss after one without loss: loss");
  }
}
