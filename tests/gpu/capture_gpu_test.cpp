// gpu.ops: a miniature step planned, run directly, rerun and replayed from a graph: the same bits.
#include <doctest/doctest.h>

#include "c51_ops.hpp"
#include "gpu_ops_util.hpp"

using namespace dqn;
using namespace gpu_ops;

namespace {

/// A miniature C51 step (forward, projection, loss, one weight gradient, budget, Adam, spectral
/// norm, Polyak target, τ draw) on one runtime, for determinism and capture tests.
struct MiniStep {
  static constexpr int B = 37, S = 29, Hd = 53, D = 3, A = 5, Z = 51, DAZ = D * A * Z;
  static constexpr std::int64_t P2 = static_cast<std::int64_t>(DAZ) * Hd;
  Gpu& gpu;
  // inputs (constant) and state (changes every step)
  Real x, b1, rewards, dones, weights, lr, fractions;
  std::int32_t* actions;
  Real W1, u1, W2, m2, v2, W2t;
  std::int64_t *t, *skipped;
  // derived
  Real y1, logits, logp, q, mdist, loss, td, dlogits, dW2, norms, clips, g, total, taus;
  std::int32_t *a_star, *skip;
  void* sums;  // c51_xent's device scratch
  SpectralMatrix* table;
  // initial state, for resets
  std::vector<float> W1_0, u1_0, W2_0, W2t_0;

  explicit MiniStep(Gpu& g_) : gpu(g_) {
    x = gpu.put(random_vec(static_cast<std::size_t>(B) * S, -1, 1, 80));
    b1 = gpu.put(random_vec(Hd, -0.1f, 0.1f, 81));
    rewards = gpu.put(random_vec(B, -2, 2, 82));
    auto dn = random_vec(B, 0, 1, 83);
    for (float& d : dn) d = d < 0.2f ? 1.0f : 0.0f;
    dones = gpu.put(dn);
    weights = gpu.put(random_vec(B, 0.5f, 1.5f, 84));
    lr = gpu.put(std::vector<float>{1e-3f});
    fractions = gpu.put(std::vector<float>{1.0f});
    actions = gpu.put_typed(random_ints(static_cast<std::size_t>(B) * D, 0, A - 1, 85));
    W1_0 = random_vec(static_cast<std::size_t>(Hd) * S, -0.6f, 0.6f, 86);
    u1_0 = random_vec(Hd, -0.2f, 0.2f, 87);
    W2_0 = random_vec(static_cast<std::size_t>(P2), -0.3f, 0.3f, 88);
    W2t_0 = random_vec(static_cast<std::size_t>(P2), -0.3f, 0.3f, 89);
    W1 = gpu.put(W1_0);
    u1 = gpu.put(u1_0);
    W2 = gpu.put(W2_0);
    W2t = gpu.put(W2t_0);
    m2 = gpu.reals(P2);
    v2 = gpu.reals(P2);
    t = gpu.put_typed(std::vector<std::int64_t>{0});
    skipped = gpu.put_typed(std::vector<std::int64_t>{0});
    y1 = gpu.reals(static_cast<std::int64_t>(B) * Hd);
    logits = gpu.reals(static_cast<std::int64_t>(B) * DAZ);
    logp = gpu.reals(static_cast<std::int64_t>(B) * DAZ);
    q = gpu.reals(static_cast<std::int64_t>(B) * D * A);
    mdist = gpu.reals(static_cast<std::int64_t>(B) * D * Z);
    loss = gpu.reals(1);
    td = gpu.reals(B);
    dlogits = gpu.reals(static_cast<std::int64_t>(B) * DAZ);
    dW2 = gpu.reals(P2);
    norms = gpu.reals(1);
    clips = gpu.reals(1);
    g = gpu.reals(P2);
    total = gpu.reals(1);
    taus = gpu.reals(static_cast<std::int64_t>(B) * 4);
    a_star = static_cast<std::int32_t*>(gpu.raw(static_cast<std::size_t>(B) * D * 4));
    skip = static_cast<std::int32_t*>(gpu.raw(4));
    sums = gpu.raw(8 * std::size_t(c51_xent_sums(B, 1)));
    table = gpu.put_typed(std::vector<SpectralMatrix>{{W1, u1, Hd, S}});
  }

  /// State back to the start, every derived buffer poisoned.
  void reset() {
    gpu.set(W1, W1_0);
    gpu.set(u1, u1_0);
    gpu.set(W2, W2_0);
    gpu.set(W2t, W2t_0);
    gpu.set(m2, std::vector<float>(static_cast<std::size_t>(P2), 0.0f));
    gpu.set(v2, std::vector<float>(static_cast<std::size_t>(P2), 0.0f));
    gpu.set_typed(t, std::vector<std::int64_t>{0});
    gpu.set_typed(skipped, std::vector<std::int64_t>{0});
    for (auto [r, n] : derived()) gpu.poison(r, n);
    gpu.set_typed(a_star, std::vector<std::int32_t>(static_cast<std::size_t>(B) * D, -1));
    gpu.set_typed(skip, std::vector<std::int32_t>{-1});
    gpu.ok();
  }

  std::vector<std::pair<Real, std::int64_t>> derived() const {
    return {{y1, B * Hd}, {logits, B * DAZ}, {logp, B * DAZ}, {q, B * D * A}, {mdist, B * D * Z}, {loss, 1},
            {td, B}, {dlogits, B * DAZ}, {dW2, P2}, {norms, 1}, {clips, 1}, {g, P2}, {total, 1}, {taus, B * 4}};
  }

  void enqueue() {
    EngineBackend& ops = gpu.ops;
    Gemm g1;  // y1 = relu(x W1ᵀ + b1)
    g1.tb = true;
    g1.m = B;
    g1.n = Hd;
    g1.k = S;
    g1.a = x;
    g1.lda = S;
    g1.b = W1;
    g1.ldb = S;
    g1.c = y1;
    g1.ldc = Hd;
    ops.gemm(g1);
    ops.bias_act(y1, b1, B, Hd, Hd, Act::relu);
    Gemm g2 = g1;  // logits = y1 W2ᵀ
    g2.n = DAZ;
    g2.k = Hd;
    g2.a = y1;
    g2.lda = Hd;
    g2.b = W2;
    g2.ldb = Hd;
    g2.c = logits;
    g2.ldc = DAZ;
    ops.gemm(g2);
    ops.log_softmax(logp, logits, B * D * A, Z);
    ops.expected_q(q, logp, B * D * A, Z, -10.0f, 10.0f);
    ops.argmax(a_star, q, B * D, A);
    C51Project pr;
    pr.m = mdist;
    pr.target_logp = logp;
    pr.a_star = a_star;
    pr.rewards = rewards;
    pr.dones = dones;
    pr.B = B;
    pr.D = D;
    pr.A = A;
    pr.Z = Z;
    c51_project(ops, pr);
    C51Xent xe;
    xe.loss_per_sample = td;
    xe.loss = loss;
    xe.dlogits = dlogits;
    xe.logp = logp;
    xe.actions = actions;
    xe.m = mdist;
    xe.weights = weights;
    xe.B = B;
    xe.D = D;
    xe.A = A;
    xe.Z = Z;
    xe.sums = sums;
    c51_xent(ops, xe);
    Gemm g3;  // dW2 = dlogitsᵀ y1
    g3.ta = true;
    g3.m = DAZ;
    g3.n = Hd;
    g3.k = B;
    g3.a = dlogits;
    g3.lda = DAZ;
    g3.b = y1;
    g3.ldb = Hd;
    g3.c = dW2;
    g3.ldc = Hd;
    ops.gemm(g3);
    Budget bu;
    bu.grads = dW2;
    bu.fractions = fractions;
    bu.norms = norms;
    bu.clips = clips;
    bu.g = g;
    bu.losses = loss;
    bu.total_loss = total;
    bu.skip = skip;
    bu.skipped = skipped;
    bu.H = 1;
    bu.P = P2;
    ops.budget(bu);
    Adam ad;
    ad.params = W2;
    ad.g = g;
    ad.m = m2;
    ad.v = v2;
    ad.P = P2;
    ad.t = t;
    ad.lr = lr;
    ad.skip = skip;
    ops.adam(ad);
    ops.spectral_norm(table, 1, Hd, S, 2.0f, skip);
    TargetUpdate tu;
    tu.target = W2t;
    tu.params = W2;
    tu.P = P2;
    tu.t = t;
    tu.skip = skip;
    ops.target_update(tu);
    Uniform un;
    un.out = taus;
    un.n = B * 4;
    un.seed = 7;
    un.stream = 1;
    un.step = t;
    ops.uniform(un);
  }

  struct Snapshot {
    std::vector<std::vector<float>> reals;
    std::vector<std::int32_t> a_star;
    std::int64_t t = -1, skipped = -1;
  };
  Snapshot snapshot() {
    gpu.ok();
    Snapshot s;
    const std::pair<Real, std::int64_t> state[] = {{W1, Hd * S}, {u1, Hd}, {W2, P2}, {m2, P2}, {v2, P2}, {W2t, P2}};
    for (auto [r, n] : state) s.reals.push_back(gpu.get(r, n));
    for (auto [r, n] : derived()) s.reals.push_back(gpu.get(r, n));
    s.a_star = gpu.get_typed(a_star, static_cast<std::size_t>(B) * D);
    s.t = gpu.get_typed(t, 1)[0];
    s.skipped = gpu.get_typed(skipped, 1)[0];
    return s;
  }
};

void expect_same(const MiniStep::Snapshot& a, const MiniStep::Snapshot& b, const std::string& what) {
  REQUIRE(a.reals.size() == b.reals.size());
  for (std::size_t i = 0; i < a.reals.size(); ++i) expect_same_bits(a.reals[i], b.reals[i], what + ", buffer " + std::to_string(i));
  expect_same_bits(a.a_star, b.a_star, what + ", a_star");
  CHECK(a.t == b.t);
  CHECK(a.skipped == b.skipped);
}

}  // namespace

TEST_CASE("gpu.ops.capture: plan, direct runs, reruns and graph replays agree bit for bit") {
  Gpu gpu(Precision::tf32);
  MiniStep st(gpu);
  constexpr int kSteps = 3;

  st.reset();
  gpu.rt().plan_begin();
  st.enqueue();
  gpu.rt().plan_end();
  gpu.ok();
  for (float x : gpu.get(st.loss, 1)) CHECK(std::isnan(x));  // planning launched nothing
  CHECK(gpu.get_typed(st.t, 1)[0] == 0);

  for (int i = 0; i < kSteps; ++i) st.enqueue();
  const auto direct = st.snapshot();
  CHECK(direct.t == kSteps);
  CHECK(direct.skipped == 0);
  for (const auto& buf : direct.reals)
    for (float x : buf) REQUIRE(std::isfinite(x));
  CHECK(direct.reals[2] != st.W2_0);  // Adam moved the weights

  st.reset();
  for (int i = 0; i < kSteps; ++i) st.enqueue();
  expect_same(st.snapshot(), direct, "second direct run");

  st.reset();
  gpu.rt().begin_capture();
  st.enqueue();
  gpu.rt().end_capture();
  gpu.ok();
  CHECK(gpu.get_typed(st.t, 1)[0] == 0);  // capturing ran nothing
  const std::int64_t nodes = gpu.rt().graph_nodes();
  MESSAGE("mini step graph: " << nodes << " nodes");
  CHECK(nodes >= 16);
  for (int i = 0; i < kSteps; ++i) gpu.rt().replay();
  expect_same(st.snapshot(), direct, "graph replays");

  // A second capture of the same stages updates the instantiated graph in place.
  st.reset();
  gpu.rt().begin_capture();
  st.enqueue();
  gpu.rt().end_capture();
  for (int i = 0; i < kSteps; ++i) gpu.rt().replay();
  expect_same(st.snapshot(), direct, "replays after re-capture");

  // Reports: an async copy into pinned memory, observed through the slot's event.
  auto* pinned = static_cast<float*>(gpu.rt().alloc_host(sizeof(float)));
  *pinned = kNaN;
  gpu.rt().replay();
  gpu.rt().copy_to_host_async(pinned, st.loss.p, sizeof(float), 3);
  gpu.rt().synchronize();
  CHECK(gpu.rt().ready(3));
  const float loss = gpu.get(st.loss, 1)[0];
  CHECK(std::memcmp(pinned, &loss, sizeof loss) == 0);
  CHECK(gpu.get_typed(st.t, 1)[0] == kSteps + 1);
  gpu.rt().free_host(pinned);
  CHECK_THROWS_AS(gpu.rt().copy_to_host_async(pinned, st.loss.p, 4, 1 << 20), std::runtime_error);
}

TEST_CASE("gpu.ops.capture: an op error during capture discards the graph and says why") {
  Gpu gpu;
  Real a = gpu.reals(16);
  gpu.rt().begin_capture();
  gpu.ops.fill(a, 1.0f, 16);
  Real wide = a;
  wide.esize = 8;
  gpu.ops.fill(wide, 1.0f, 16);
  std::string why;
  try {
    gpu.rt().end_capture();
  } catch (const std::runtime_error& e) {
    why = e.what();
  }
  CHECK_MESSAGE(why.find("element size") != std::string::npos, "end_capture said: '" << why << "'");
  CHECK_THROWS_AS(gpu.rt().replay(), std::runtime_error);
}
