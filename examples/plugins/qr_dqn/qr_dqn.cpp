/** @file qr_dqn.cpp
 *  @brief QR-DQN (quantile regression DQN, Dabney et al. 2017) as a primary head: the engine's
 *  dueling branching head (dqn/bdq.hpp) with its Z outputs per action read as N quantiles of the
 *  return, double-DQN a* from the online head, the target head's quantiles at a*, and the quantile
 *  Huber loss at the taken actions (the math: qr_ops.hpp). A third-party example: it sees the
 *  installed SDK only (dqn-engine.pc).
 *
 *  Configuration: `quantiles` (N, 2..256, default 32) and `kappa` (κ > 0, default 1). The
 *  network's atoms, v_min and v_max are not used: N takes the place of Z.
 *
 *  The primary's contract (dqn/head.hpp): it writes target/a_star (the online greedy action at
 *  next_states), report/td_error (L(b), the per-sample loss), its loss and dtrunk, and act/q (the
 *  mean of the quantiles) in its act stage. It writes nothing else for auxiliaries: heads that
 *  need c51's target/m cannot be combined with it.
 *
 *  Stages (B = batch, M = the act step's rows):
 *    forward     online head on states ‖ next_states (2B rows): v, adv, then θ, Q of all rows
 *                and a* of the next states' rows
 *    target      target head on next_states (B rows): θ'
 *    loss        qr_loss: dθ and td_error; then the dueling backward of dθ into dv, dadv
 *    loss.mean   loss = (1/B) Σ_b w_b td_error[b]
 *    weights.out the output layers' gradients (from dv, dadv)
 *    backward    dhidden and dtrunk = ∂loss/∂h2
 *    weights     the hidden layers' gradients (from dhidden)
 *    act         online head on act/h2 (M rows), Q into act/q
 */
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "dqn/bdq.hpp"
#include "dqn/head_base.hpp"
#include "qr_ops.hpp"

namespace {

using namespace dqn;

enum Tag : std::int32_t { kForward, kTarget, kLoss, kBackward, kWeights, kWeightsOut, kMean, kAct };

constexpr const char* kPrefix = "qr";  // the parameters' names: "qr.value.0.weight", …

class QrHead final : public HeadBase {
 public:
  explicit QrHead(const HeadCreateInfo& info) : HeadBase(info), d_(bdq::dims_of(*info.net)) {
    if (!primary())
      throw std::invalid_argument("qr_dqn is a primary head (it produces a*, td_error and the act step's Q); it "
                                  "cannot be an auxiliary: give it role: primary");
    const std::int64_t n = integer("quantiles");
    kappa_ = static_cast<float>(number("kappa"));
    if (n < 2 || n > 256) throw std::invalid_argument("quantiles must be in [2, 256]");
    if (!(kappa_ > 0.0f) || !std::isfinite(kappa_)) throw std::invalid_argument("kappa must be finite and > 0");
    d_.Z = static_cast<int>(n);  // bdq's Z outputs per action are the N quantiles
  }

  void build(BuildContext& ctx) override {
    accepted(bdq::declare_params(ctx, kPrefix, d_, kParamSpectralNorm));
    act_rows_ = ctx.act_rows();
    const std::int64_t B2 = 2 * std::int64_t(batch()), B = batch(), M = act_rows_;
    const std::int64_t hc = d_.hidden_cols(), D = d_.D, A = d_.A, N = d_.Z, LZ = d_.ldz(), LAZ = d_.ldaz();
    const auto act = BufferKind::activation;
    buffer(ctx, own("hidden"), {B2, hc}, act);
    buffer(ctx, own("v"), {B2, LZ}, act);
    buffer(ctx, own("adv"), {B2, D, LAZ}, act);
    buffer(ctx, own("theta"), {B2, D, A, N}, act);
    buffer(ctx, own("q"), {B2, D, A}, act);
    buffer(ctx, own("target.hidden"), {B, hc}, act);
    buffer(ctx, own("target.v"), {B, LZ}, act);
    buffer(ctx, own("target.adv"), {B, D, LAZ}, act);
    buffer(ctx, own("target.theta"), {B, D, A, N}, act);
    buffer(ctx, own("dtheta"), {B, D, A, N});
    buffer(ctx, own("dv"), {B, LZ});
    buffer(ctx, own("dadv"), {B, D, LAZ});
    buffer(ctx, own("dhidden"), {B, hc});
    buffer(ctx, own("act.hidden"), {M, hc}, act);
    buffer(ctx, own("act.v"), {M, LZ}, act);
    buffer(ctx, own("act.adv"), {M, D, LAZ}, act);
    // forward: the online head on states ‖ next_states, θ and Q of every row, a* of the next
    // states (double DQN); target: the target head's θ' at s' (runs beside the forward)
    stage(ctx, kForward, "forward", {buf::h2, "params"},
          {own("hidden"), own("v"), own("adv"), own("theta"), own("q"), buf::a_star});
    stage(ctx, kTarget, "target", {buf::target_h2, "target"},
          {own("target.hidden"), own("target.v"), own("target.adv"), own("target.theta")});
    // loss: the per-sample quantile Huber losses (td_error) and dθ, then the dueling backward
    stage(ctx, kLoss, "loss",
          {own("theta"), own("target.theta"), buf::a_star, buf::actions, buf::rewards, buf::dones, buf::is_weights},
          {buf::td_error, own("dtheta"), own("dv"), own("dadv")});
    // weights.out: the output layers' gradients from dv and dadv alone (beside the backward);
    // backward: the input side, on to the trunk; weights: the hidden layers' gradients
    auto grads = [&](int layer) {
      std::vector<std::string> g;
      for (const auto& p : bdq::layer_params(kPrefix, d_, layer)) g.push_back(grad_of(p));
      return g;
    };
    stage(ctx, kWeightsOut, "weights.out", {own("dv"), own("dadv"), own("hidden")}, grads(1));
    stage(ctx, kBackward, "backward", {own("dv"), own("dadv"), own("hidden"), "params"},
          {own("dhidden"), dtrunk_buffer()});
    stage(ctx, kWeights, "weights", {own("dhidden"), buf::h2}, grads(0));
    // loss.mean: the head's loss, the weighted mean of the per-sample losses, in a stage of its
    // own that only the update waits for
    stage(ctx, kMean, "loss.mean", {buf::td_error, buf::is_weights}, {loss_buffer()});
    // act: the online head over the act step's rows, the quantiles' mean Q into act/q
    act_stage(ctx, kAct, "act", {buf::act_h2, buf::act_params}, {own("act.hidden"), own("act.v"), own("act.adv"), buf::act_q});
  }

  void resolve(const Resolver& r) override {
    online_ = bdq::resolve(r, kPrefix, bdq::Which::online);
    acting_params_ = bdq::resolve(r, kPrefix, bdq::Which::act);
    target_ = bdq::resolve(r, kPrefix, bdq::Which::target);
    grad_ = bdq::resolve(r, kPrefix, bdq::Which::grad);
    if (!online_.w1 || !target_.w1 || !grad_.w1) throw std::invalid_argument("qr_dqn's parameters are not there");
    // bdq::forward with logp null stops after v and adv: θ, Q and a* are qr_values'
    fwd_ = {real(r, own("hidden")), real(r, own("v")), real(r, own("adv")), Real{}, Real{}, Real{}};
    tfwd_ = {real(r, own("target.hidden")), real(r, own("target.v")), real(r, own("target.adv")), Real{}, Real{},
             Real{}};
    acting_ = {real(r, own("act.hidden")), real(r, own("act.v")), real(r, own("act.adv")), Real{}, Real{}, Real{}};
    back_ = {real(r, own("dv")), real(r, own("dadv")), real(r, own("dhidden"))};
    theta_ = real(r, own("theta"));
    q_ = real(r, own("q"));
    target_theta_ = real(r, own("target.theta"));
    dtheta_ = real(r, own("dtheta"));
    a_star_ = i32(r, buf::a_star);
    actions_ = i32(r, buf::actions);
    h2_ = real(r, buf::h2);
    target_h2_ = real(r, buf::target_h2);
    act_h2_ = real(r, buf::act_h2);
    act_q_ = real(r, buf::act_q);
    rewards_ = real(r, buf::rewards);
    dones_ = real(r, buf::dones);
    weights_ = real(r, buf::is_weights);
    td_ = real(r, buf::td_error);
    loss_ = real(r, loss_buffer());
    dtrunk_ = real(r, dtrunk_buffer());
  }

  void step(std::int32_t tag, Backend& be) override {
    const int B = batch(), D = d_.D, A = d_.A, N = d_.Z;
    switch (tag) {
      case kForward:  // θ, Q of states ‖ next_states; a* = argmax_a Q of the next states
        bdq::forward(be, d_, online_, h2_, 2 * B, fwd_);
        qr::qr_values(be, values(fwd_, 2 * B, theta_, q_, a_star_, B));
        break;
      case kTarget:  // θ' of the target head at s'
        bdq::forward(be, d_, target_, target_h2_, B, tfwd_);
        qr::qr_values(be, values(tfwd_, B, target_theta_, Real{}, nullptr, 0));
        break;
      case kLoss: {
        qr::QrLoss x;
        x.dtheta = dtheta_; x.loss_per_sample = td_;
        x.theta = theta_;  // its first B rows: the states'
        x.theta_target = target_theta_; x.actions = actions_; x.a_star = a_star_;
        x.rewards = rewards_; x.dones = dones_; x.weights = weights_;
        x.B = B; x.D = D; x.A = A; x.N = N; x.gamma_n = gamma_n(); x.kappa = kappa_;
        qr::qr_loss(be, x);
        // θ = v + adv − mean_a adv: dv = Σ_{d,a} dθ, dadv = dθ − mean_a dθ
        be.dueling_backward(back_.dv, d_.ldz(), back_.dadv, d_.ldaz(), dtheta_, B, D, A, N);
        break;
      }
      case kMean:
        be.weighted_mean(loss_, td_, weights_, B);
        break;
      case kBackward:
        bdq::backward_inputs(be, d_, online_, B, fwd_, back_, dtrunk_, 0.0f);
        break;
      case kWeights:
        bdq::backward_weights_hidden(be, d_, grad_, h2_, B, back_);
        break;
      case kWeightsOut:
        bdq::backward_weights_out(be, d_, grad_, B, fwd_, back_);
        break;
      case kAct:
        bdq::forward(be, d_, acting_params_, act_h2_, act_rows_, acting_);
        qr::qr_values(be, values(acting_, act_rows_, Real{}, act_q_, nullptr, 0));
        break;
      default:
        break;
    }
  }

  /// The acting network after the trunk: the dueling outputs θ = v + adv − mean_a adv read as N
  /// quantiles (bdq::export_dueling), Q = their mean; N and the quantile midpoints in the manifest.
  static void export_policy(const HeadCreateInfo& info, PolicyGraph& graph) {
    const GraphBuilder g{graph};
    bdq::Dims d = bdq::dims_of(*info.net);
    d.Z = static_cast<int>(ParamValues("qr_dqn", info.params, info.n_params).integer("quantiles"));
    const std::string theta = bdq::export_dueling(g, kPrefix, d);
    const std::vector<std::int64_t> quantile_axis{3};
    const std::string q4 = g.node("ReduceMean", {theta}, "qr/q4",
                                  {GraphBuilder::attr_ints("axes", quantile_axis), GraphBuilder::attr("keepdims", 1)});
    const std::string q =
        g.node("Reshape", {q4, g.constant_i64("qr/shape_q", {-1, d.D, d.A}, {3})}, "qr/q");
    graph.q_values(q.c_str());
    std::string taus = "[";
    for (int i = 0; i < d.Z; ++i) taus += (i ? ", " : "") + std::to_string((2.0 * i + 1.0) / (2.0 * d.Z));
    graph.manifest("quantiles", (taus + "]").c_str());
  }

 private:
  /// qr_values' arguments for `rows` rows of a forward's v and adv.
  qr::QrValues values(const bdq::Acts& f, int rows, Real theta, Real q, std::int32_t* a_star, int star_from) const {
    qr::QrValues x;
    x.theta = theta; x.q = q; x.a_star = a_star; x.star_from = star_from;
    x.v = f.v; x.ldv = d_.ldz(); x.adv = f.adv; x.ldadv = d_.ldaz();
    x.rows = rows; x.D = d_.D; x.A = d_.A; x.N = d_.Z;
    return x;
  }

  bdq::Dims d_;
  float kappa_ = 1.0f;
  int act_rows_ = 0;
  bdq::Params online_{}, target_{}, grad_{}, acting_params_{};
  bdq::Acts fwd_{}, tfwd_{}, acting_{};
  bdq::BackScratch back_{};
  Real theta_, q_, target_theta_, dtheta_, h2_, target_h2_, act_h2_, act_q_, rewards_, dones_, weights_, td_, loss_,
      dtrunk_;
  std::int32_t* a_star_ = nullptr;
  std::int32_t* actions_ = nullptr;
};

constexpr double kInf = std::numeric_limits<double>::infinity();

const ParamSchema kSchema[] = {
    {"quantiles", ParamType::integer, "32", "N: quantiles per action (fixed midpoints τ̂_i = (2i+1)/(2N))", 2, 256},
    {"kappa", ParamType::number, "1.0", "κ: Huber threshold of the quantile loss (> 0)", 1e-6, kInf},
};

}  // namespace

DQN_HEAD_PLUGIN(QrHead, "qr_dqn", "0.1.0",
                "QR-DQN quantile regression head (primary) on the dueling branching network: N fixed quantiles, "
                "double-DQN targets, quantile Huber loss",
                0.0, true, kSchema)
