/** @file c51.cpp
 *  @brief The C51 primary head as a plugin: distributional dueling branching head on the trunk,
 *  double-DQN a* from the online head, the target network's distribution at a*, the dense
 *  projection, cross-entropy at the taken actions, td_error, and the backward pass.
 */
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "dqn/bdq.hpp"
#include "dqn/head.hpp"
#include "dqn/plugin.hpp"

namespace {

using namespace dqn;

enum Tag : std::int32_t { kForward = 0, kTarget = 1, kLoss = 2, kBackward = 3, kWeights = 4, kWeightsOut = 5, kMean = 6 };

class C51Head final : public Head {
 public:
  explicit C51Head(const HeadCreateInfo& info)
      : name_(info.instance ? info.instance : "c51"), d_(bdq::dims_of(*info.net)), B_(info.batch),
        gamma_n_(info.gamma_n) {}

  int declare(BuildContext& ctx) noexcept override {
    try {
      if (int rc = bdq::declare_params(ctx, "c51", d_, kParamSpectralNorm)) return keep(ctx, rc);
      const std::int64_t B2 = 2 * std::int64_t(B_), B = B_;
      const std::int64_t hc = d_.hidden_cols(), D = d_.D, A = d_.A, Z = d_.Z, LZ = d_.ldz(), LAZ = d_.ldaz();
      struct Decl { std::string n; std::vector<std::int64_t> s; };
      const std::vector<Decl> decls = {
          {b("hidden"), {B2, hc}}, {b("v"), {B2, LZ}}, {b("adv"), {B2, D, LAZ}},
          {b("logp"), {B2, D, A, Z}}, {b("q"), {B2, D, A}},
          {b("target.hidden"), {B, hc}}, {b("target.v"), {B, LZ}}, {b("target.adv"), {B, D, LAZ}},
          // workspace of the fused loss (the CPU twin composes the unfused ops through them)
          {b("work.logp"), {B, D, A, Z}}, {b("work.dlogits"), {B, D, A, Z}},
          {b("dv"), {B, LZ}}, {b("dadv"), {B, D, LAZ}}, {b("dhidden"), {B, hc}},
      };
      for (const auto& x : decls) {
        const bool act = x.n.find("/d") == std::string::npos && x.n.find("/work.") == std::string::npos;
        if (int rc = ctx.buffer(x.n.c_str(), DType::real, x.s.data(), std::int32_t(x.s.size()),
                                act ? BufferKind::activation : BufferKind::scratch))
          return keep(ctx, rc);
      }
      const std::string loss = "loss/" + name_, grad = "grad/" + name_, dtrunk = "dtrunk/" + name_;
      int rc = 0;
      // forward: the online head on states ‖ next_states, with a* of the next states (double DQN);
      // target: the target head's value and advantage layers at s' (runs beside the forward);
      // loss: the target distribution at a*, projection, cross-entropy and dueling backward, fused.
      rc = rc ? rc : stage(ctx, kForward, "forward", {buf::h2, "params"},
                           {b("hidden"), b("v"), b("adv"), b("logp"), b("q"), buf::a_star});
      rc = rc ? rc : stage(ctx, kTarget, "target", {buf::target_h2, "target"},
                           {b("target.hidden"), b("target.v"), b("target.adv")});
      // the loss writes the per-sample losses (td_error); loss.mean, below, the head's loss from them
      rc = rc ? rc : stage(ctx, kLoss, "loss",
                           {b("logp"), b("target.v"), b("target.adv"), buf::a_star, buf::actions, buf::is_weights,
                            buf::rewards, buf::dones},
                           {buf::td_error, buf::target_m, b("dv"), b("dadv"), b("work.logp"), b("work.dlogits")});
      // weights.out: the output layers' gradients, from dv and dadv alone (beside the backward);
      // backward: the input side (on to the trunk); weights: the hidden layers' gradients, beside
      // the trunk's backward. Each writes the gradients of its own tensors.
      auto grads = [&](int layer) {
        std::vector<std::string> g;
        for (const auto& p : bdq::layer_params("c51", d_, layer)) g.push_back(grad + "/" + p);
        return g;
      };
      rc = rc ? rc : stage(ctx, kWeightsOut, "weights.out", {b("dv"), b("dadv"), b("hidden")}, grads(1));
      rc = rc ? rc : stage(ctx, kBackward, "backward", {b("dv"), b("dadv"), b("hidden"), "params"},
                           {b("dhidden"), dtrunk});
      rc = rc ? rc : stage(ctx, kWeights, "weights", {b("dhidden"), buf::h2}, grads(0));
      // loss.mean: the head's loss as the weighted mean of the per-sample losses in a stage of its
      // own (declared last, so the other stages keep their lanes), which only the update waits for:
      // the loss kernel ends without a last block that sums the batch, off the step's critical path
      rc = rc ? rc : stage(ctx, kMean, "loss.mean", {buf::td_error, buf::is_weights}, {loss});
      return keep(ctx, rc);
    } catch (const std::exception& e) {
      error_ = e.what();
      return 1;
    }
  }

  int bind(const Resolver& r) noexcept override {
    try {
      online_ = bdq::resolve(r, "c51", bdq::Which::online);
      target_ = bdq::resolve(r, "c51", bdq::Which::target);
      grad_ = bdq::resolve(r, "c51", bdq::Which::grad);
      act_ = {r.real(b("hidden").c_str()), r.real(b("v").c_str()), r.real(b("adv").c_str()), Real{},
              r.real(b("logp").c_str()), r.real(b("q").c_str())};
      tact_ = {r.real(b("target.hidden").c_str()), r.real(b("target.v").c_str()), r.real(b("target.adv").c_str()),
               Real{}, Real{}, Real{}};  // no logp: the loss fuses the target distribution
      back_ = {r.real(b("dv").c_str()), r.real(b("dadv").c_str()), r.real(b("dhidden").c_str())};
      work_logp_ = r.real(b("work.logp").c_str());
      work_dlogits_ = r.real(b("work.dlogits").c_str());
      h2_ = r.real(buf::h2);
      target_h2_ = r.real(buf::target_h2);
      actions_ = r.i32(buf::actions);
      rewards_ = r.real(buf::rewards);
      dones_ = r.real(buf::dones);
      weights_ = r.real(buf::is_weights);
      a_star_ = r.i32(buf::a_star);
      m_ = r.real(buf::target_m);
      td_ = r.real(buf::td_error);
      loss_ = r.real(("loss/" + name_).c_str());
      dtrunk_ = r.real(("dtrunk/" + name_).c_str());
      act_.a_star = a_star_;
      act_.star_from = B_;
      const bool ok = online_.w1 && target_.w1 && grad_.w1 && act_.hidden && tact_.hidden && back_.dv && work_logp_ &&
                      work_dlogits_ &&
                      h2_ && target_h2_ && actions_ && rewards_ && dones_ && weights_ && a_star_ && m_ && td_ &&
                      loss_ && dtrunk_;
      if (!ok) {
        error_ = "c51: a buffer or parameter it needs is missing";
        return 1;
      }
      return 0;
    } catch (const std::exception& e) {
      error_ = e.what();
      return 1;
    }
  }

  void run(std::int32_t tag, Backend& be) noexcept override {
    const int B = B_, D = d_.D, A = d_.A, Z = d_.Z;
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
        x.a_star = a_star_; x.rewards = rewards_; x.dones = dones_;
        x.work_logp = work_logp_; x.work_dlogits = work_dlogits_;
        x.B = B; x.D = D; x.A = A; x.Z = Z; x.gamma_n = gamma_n_; x.v_min = d_.v_min; x.v_max = d_.v_max;
        be.c51_loss(x);
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
      default:
        break;
    }
  }

  const char* error() const noexcept override { return error_.c_str(); }

 private:
  std::string b(const char* n) const { return name_ + "/" + n; }

  int stage(BuildContext& ctx, Tag tag, const char* what, std::vector<std::string> reads,
            std::vector<std::string> writes) {
    return declare_stage(ctx, name_ + "." + what, tag, reads, writes);
  }
  int keep(BuildContext&, int rc) {
    if (rc && error_.empty()) error_ = "c51: declaration refused by the engine";
    return rc;
  }

  std::string name_;
  bdq::Dims d_;
  int B_;
  float gamma_n_;
  std::string error_;
  bdq::Params online_{}, target_{}, grad_{};
  bdq::Acts act_{}, tact_{};
  bdq::BackScratch back_{};
  Real work_logp_, work_dlogits_, h2_, target_h2_, rewards_, dones_, weights_, m_, td_, loss_, dtrunk_;
  std::int32_t* actions_ = nullptr;
  std::int32_t* a_star_ = nullptr;
};

Head* create(const HeadCreateInfo* info, char* err, std::uint32_t errlen) {
  try {
    if (info->role != Role::primary) {
      std::snprintf(err, errlen, "c51 is a primary head (it produces a*, the target distribution and td_error); "
                                 "use the ensemble plugin for extra distributional heads");
      return nullptr;
    }
    if (info->net->atoms < 2 || !(info->net->v_min < info->net->v_max)) {
      std::snprintf(err, errlen, "c51 needs atoms >= 2 and v_min < v_max");
      return nullptr;
    }
    return new C51Head(*info);
  } catch (const std::exception& e) {
    std::snprintf(err, errlen, "%s", e.what());
    return nullptr;
  }
}

void destroy(Head* h) { delete h; }

const PluginDescriptor kDescriptor{
    kAbiVersion, sizeof(PluginDescriptor), "c51", PluginKind::head, "1.0.0",
    "C51 distributional dueling branching head (primary): double-DQN targets, dense projection, cross-entropy",
    0.0, 1, nullptr, 0, &create, &destroy};

}  // namespace

DQN_PLUGIN_EXPORT(kDescriptor)
