/** @file c51.cpp
 *  @brief The C51 primary head as a plugin: distributional dueling branching head on the trunk,
 *  double-DQN a* from the online head, the target network's distribution at a*, the dense
 *  projection, cross-entropy at the taken actions, td_error, the backward pass, and the act
 *  step's expected Q. Besides the primary's contract it writes target/m (kC51TargetM), the
 *  projected target distribution the ensemble's members learn against.
 */
#include <string>
#include <vector>

#include "c51_ops.hpp"
#include "dqn/bdq.hpp"
#include "dqn/head_base.hpp"

namespace {

using namespace dqn;

enum Tag : std::int32_t { kForward, kTarget, kLoss, kBackward, kWeights, kWeightsOut, kMean, kAct };

class C51Head final : public HeadBase {
 public:
  explicit C51Head(const HeadCreateInfo& info) : HeadBase(info), d_(bdq::dims_of(*info.net)) {
    if (!primary())
      throw std::invalid_argument("c51 is a primary head (it produces a*, the target distribution and td_error); "
                                  "use the ensemble plugin for extra distributional heads");
    if (info.net->atoms < 2 || !(info.net->v_min < info.net->v_max))
      throw std::invalid_argument("c51 needs atoms >= 2 and v_min < v_max");
  }

  void build(BuildContext& ctx) override {
    accepted(bdq::declare_params(ctx, "c51", d_, kParamSpectralNorm));
    act_rows_ = ctx.act_rows();
    const std::int64_t B2 = 2 * std::int64_t(batch()), B = batch(), M = act_rows_;
    const std::int64_t hc = d_.hidden_cols(), D = d_.D, A = d_.A, Z = d_.Z, LZ = d_.ldz(), LAZ = d_.ldaz();
    const auto act = BufferKind::activation;
    buffer(ctx, own("hidden"), {B2, hc}, act);
    buffer(ctx, own("v"), {B2, LZ}, act);
    buffer(ctx, own("adv"), {B2, D, LAZ}, act);
    buffer(ctx, own("logp"), {B2, D, A, Z}, act);
    buffer(ctx, own("q"), {B2, D, A}, act);
    buffer(ctx, own("target.hidden"), {B, hc}, act);
    buffer(ctx, own("target.v"), {B, LZ}, act);
    buffer(ctx, own("target.adv"), {B, D, LAZ}, act);
    buffer(ctx, kC51TargetM, {B, D, Z}, act);
    // host workspace of the fused loss (the CPU twin composes the unfused ops through them)
    buffer(ctx, own("work.logp"), {B, D, A, Z});
    buffer(ctx, own("work.dlogits"), {B, D, A, Z});
    buffer(ctx, own("dv"), {B, LZ});
    buffer(ctx, own("dadv"), {B, D, LAZ});
    buffer(ctx, own("dhidden"), {B, hc});
    // the act step's forward over M rows
    buffer(ctx, own("act.hidden"), {M, hc}, act);
    buffer(ctx, own("act.v"), {M, LZ}, act);
    buffer(ctx, own("act.adv"), {M, D, LAZ}, act);
    buffer(ctx, own("act.logp"), {M, D, A, Z}, act);
    // forward: the online head on states ‖ next_states, with a* of the next states (double DQN);
    // target: the target head's value and advantage layers at s' (runs beside the forward);
    // loss: the target distribution at a*, projection, cross-entropy and dueling backward, fused.
    stage(ctx, kForward, "forward", {buf::h2, "params"},
          {own("hidden"), own("v"), own("adv"), own("logp"), own("q"), buf::a_star});
    stage(ctx, kTarget, "target", {buf::target_h2, "target"}, {own("target.hidden"), own("target.v"), own("target.adv")});
    // the loss writes the per-sample losses (td_error); loss.mean, below, the head's loss from them
    stage(ctx, kLoss, "loss",
          {own("logp"), own("target.v"), own("target.adv"), buf::a_star, buf::actions, buf::is_weights, buf::rewards,
           buf::dones},
          {buf::td_error, kC51TargetM, own("dv"), own("dadv"), own("work.logp"), own("work.dlogits")});
    // weights.out: the output layers' gradients, from dv and dadv alone (beside the backward);
    // backward: the input side (on to the trunk); weights: the hidden layers' gradients, beside
    // the trunk's backward. Each writes the gradients of its own tensors.
    auto grads = [&](int layer) {
      std::vector<std::string> g;
      for (const auto& p : bdq::layer_params("c51", d_, layer)) g.push_back(grad_of(p));
      return g;
    };
    stage(ctx, kWeightsOut, "weights.out", {own("dv"), own("dadv"), own("hidden")}, grads(1));
    stage(ctx, kBackward, "backward", {own("dv"), own("dadv"), own("hidden"), "params"},
          {own("dhidden"), dtrunk_buffer()});
    stage(ctx, kWeights, "weights", {own("dhidden"), buf::h2}, grads(0));
    // loss.mean: the head's loss as the weighted mean of the per-sample losses in a stage of its
    // own (declared last, so the other stages keep their lanes), which only the update waits for:
    // the loss kernel ends without a last block that sums the batch, off the step's critical path
    stage(ctx, kMean, "loss.mean", {buf::td_error, buf::is_weights}, {loss_buffer()});
    // act: the online head over the act step's rows, its expected Q into act/q
    act_stage(ctx, kAct, "act", {buf::act_h2, buf::act_params},
              {own("act.hidden"), own("act.v"), own("act.adv"), own("act.logp"), buf::act_q});
  }

  void resolve(const Resolver& r) override {
    online_ = bdq::resolve(r, "c51", bdq::Which::online);
    acting_params_ = bdq::resolve(r, "c51", bdq::Which::act);
    target_ = bdq::resolve(r, "c51", bdq::Which::target);
    grad_ = bdq::resolve(r, "c51", bdq::Which::grad);
    if (!online_.w1 || !target_.w1 || !grad_.w1) throw std::invalid_argument("c51's parameters are not there");
    act_ = {real(r, own("hidden")), real(r, own("v")), real(r, own("adv")), Real{}, real(r, own("logp")),
            real(r, own("q"))};
    act_.a_star = i32(r, buf::a_star);
    act_.star_from = batch();
    tact_ = {real(r, own("target.hidden")), real(r, own("target.v")), real(r, own("target.adv")), Real{}, Real{},
             Real{}};  // no logp: the loss fuses the target distribution
    back_ = {real(r, own("dv")), real(r, own("dadv")), real(r, own("dhidden"))};
    acting_ = {real(r, own("act.hidden")), real(r, own("act.v")), real(r, own("act.adv")), Real{},
               real(r, own("act.logp")), real(r, buf::act_q)};
    work_logp_ = real(r, own("work.logp"));
    work_dlogits_ = real(r, own("work.dlogits"));
    h2_ = real(r, buf::h2);
    target_h2_ = real(r, buf::target_h2);
    act_h2_ = real(r, buf::act_h2);
    actions_ = i32(r, buf::actions);
    rewards_ = real(r, buf::rewards);
    dones_ = real(r, buf::dones);
    weights_ = real(r, buf::is_weights);
    m_ = real(r, kC51TargetM);
    td_ = real(r, buf::td_error);
    loss_ = real(r, loss_buffer());
    dtrunk_ = real(r, dtrunk_buffer());
  }

  void step(std::int32_t tag, Backend& be) override {
    const int B = batch(), D = d_.D, A = d_.A, Z = d_.Z;
    switch (tag) {
      case kForward:  // online head on states ‖ next_states; a* = argmax of the next states' Q
        bdq::forward(be, d_, online_, h2_, 2 * B, act_);
        break;
      case kTarget:  // the target head at s' up to its value and advantage layers
        bdq::forward(be, d_, target_, target_h2_, B, tact_);
        break;
      case kLoss: {
        C51Loss x;
        x.m = m_; x.loss_per_sample = td_;  // (the head's loss: loss.mean's)
        x.dv = back_.dv; x.lddv = d_.ldz(); x.dadv = back_.dadv;
        x.logp = act_.logp; x.actions = actions_; x.weights = weights_; x.tv = tact_.v; x.ldtv = d_.ldz();
        x.tadv = tact_.adv; x.ldtadv = d_.ldaz(); x.lddadv = d_.ldaz();
        x.a_star = act_.a_star; x.rewards = rewards_; x.dones = dones_;
        x.work_logp = work_logp_; x.work_dlogits = work_dlogits_;
        x.B = B; x.D = D; x.A = A; x.Z = Z; x.gamma_n = gamma_n(); x.v_min = d_.v_min; x.v_max = d_.v_max;
        c51_loss(be, x);
        break;
      }
      case kMean:
        be.weighted_mean(loss_, td_, weights_, B);
        break;
      case kBackward:
        bdq::backward_inputs(be, d_, online_, B, act_, back_, dtrunk_, 0.0f);
        break;
      case kWeights:
        bdq::backward_weights_hidden(be, d_, grad_, h2_, B, back_);
        break;
      case kWeightsOut:
        bdq::backward_weights_out(be, d_, grad_, B, act_, back_);
        break;
      case kAct:
        bdq::forward(be, d_, acting_params_, act_h2_, act_rows_, acting_);
        break;
      default:
        break;
    }
  }

  /// The acting network after the trunk (docs/step-math.md, "Network"): the value and branch
  /// streams, the dueling combination in logit space (v + adv − mean over actions), the softmax
  /// over atoms, Q = Σ_i z_i p_i; the support in the manifest.
  static void export_policy(const HeadCreateInfo& info, PolicyGraph& graph) {
    const GraphBuilder g{graph};
    const NetworkDims& n = *info.net;
    const std::int64_t D = n.branches, A = n.actions, Z = n.atoms;
    const std::string logits = bdq::export_dueling(g, "c51", bdq::dims_of(n));
    const std::string p = g.node("Softmax", {logits}, "c51/p", {GraphBuilder::attr("axis", 3)});
    std::vector<float> z(static_cast<std::size_t>(Z));
    std::string support = "[";
    const double dz = (double(n.v_max) - double(n.v_min)) / double(Z - 1);
    for (std::int64_t i = 0; i < Z; ++i) {
      z[std::size_t(i)] = float(double(n.v_min) + double(i) * dz);
      support += (i ? ", " : "") + std::to_string(z[std::size_t(i)]);
    }
    support += "]";
    const std::string q = g.node("Reshape", {g.node("MatMul", {p, g.constant("c51/support", z, {Z, 1})}, "c51/q4"),
                                             g.constant_i64("c51/shape_q", {-1, D, A}, {3})},
                                 "c51/q");
    graph.q_values(q.c_str());
    graph.manifest("support", support.c_str());
  }

 private:
  bdq::Dims d_;
  int act_rows_ = 0;
  bdq::Params online_{}, target_{}, grad_{}, acting_params_{};
  bdq::Acts act_{}, tact_{}, acting_{};
  bdq::BackScratch back_{};
  Real work_logp_, work_dlogits_, h2_, target_h2_, act_h2_, rewards_, dones_, weights_, m_, td_, loss_, dtrunk_;
  std::int32_t* actions_ = nullptr;
};

}  // namespace

DQN_HEAD_PLUGIN_NO_SCHEMA(C51Head, "c51", "1.1.0",
                          "C51 distributional dueling branching head (primary): double-DQN targets, dense projection, "
                          "cross-entropy",
                          0.0, true)
