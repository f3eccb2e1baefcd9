/** @file ensemble.cpp
 *  @brief K extra distributional dueling branching heads on the shared online trunk, as one
 *  auxiliary head (spec "Ensemble loss"): each member is trained on the primary's projected
 *  target m with the C51 cross-entropy; L_ens = (1/K) Σ_k (1/B) Σ_b w_b L^k(b). The members'
 *  disagreement (std over members of Q at `states`, averaged over branches and actions) goes to
 *  ensemble/disagreement [B].
 *
 *  The members run one after another through the existing ops (K launches of each);
 *  batching them into strided-batched GEMMs is still to do.
 */
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "dqn/bdq.hpp"
#include "dqn/head.hpp"
#include "dqn/plugin.hpp"

namespace {

using namespace dqn;

enum Tag : std::int32_t { kForward = 0, kLoss = 1, kBackward = 2 };

class EnsembleHead final : public Head {
 public:
  EnsembleHead(const HeadCreateInfo& info, int members)
      : name_(info.instance ? info.instance : "ensemble"), d_(bdq::dims_of(*info.net)), B_(info.batch), K_(members) {}

  int declare(BuildContext& ctx) noexcept override {
    try {
      for (int k = 0; k < K_; ++k)
        if (int rc = bdq::declare_params(ctx, prefix(k), d_, 0)) return keep(rc);
      const std::int64_t K = K_, B = B_, hc = d_.hidden_cols(), D = d_.D, A = d_.A, Z = d_.Z;
      // Activations carry the member as the leading dimension (ready for batched GEMMs).
      struct Decl { std::string n; std::vector<std::int64_t> s; BufferKind kind; };
      const std::vector<Decl> decls = {
          {own("hidden"), {K, B, hc}, BufferKind::activation}, {own("v"), {K, B, Z}, BufferKind::activation},
          {own("adv"), {K, B, D, A, Z}, BufferKind::activation}, {own("logits"), {K, B, D, A, Z}, BufferKind::activation},
          {own("logp"), {K, B, D, A, Z}, BufferKind::activation}, {own("q"), {K, B, D, A}, BufferKind::activation},
          {own("disagreement"), {B}, BufferKind::activation},
          {own("dlogits"), {K, B, D, A, Z}, BufferKind::scratch}, {own("dv"), {B, Z}, BufferKind::scratch},
          {own("dadv"), {B, D, A, Z}, BufferKind::scratch}, {own("dhidden"), {B, hc}, BufferKind::scratch},
      };
      for (const auto& x : decls)
        if (int rc = ctx.buffer(x.n.c_str(), DType::real, x.s.data(), std::int32_t(x.s.size()), x.kind)) return keep(rc);
      const std::string loss = "loss/" + name_, grad = "grad/" + name_, dtrunk = "dtrunk/" + name_;
      int rc = stage(ctx, kForward, "forward", {buf::h2, "params"},
                     {own("hidden"), own("v"), own("adv"), own("logits"), own("logp"), own("q"), own("disagreement")});
      rc = rc ? rc : stage(ctx, kLoss, "loss", {own("logp"), buf::target_m, buf::actions, buf::is_weights},
                           {loss, own("dlogits")});
      rc = rc ? rc : stage(ctx, kBackward, "backward", {own("dlogits"), own("hidden"), buf::h2, "params"},
                           {own("dv"), own("dadv"), own("dhidden"), grad, dtrunk});
      return keep(rc);
    } catch (const std::exception& e) {
      error_ = e.what();
      return 1;
    }
  }

  int bind(const Resolver& r) noexcept override {
    try {
      const std::int64_t B = B_, hc = d_.hidden_cols(), daz = std::int64_t(d_.D) * d_.az();
      const Real hidden = r.real(own("hidden").c_str()), v = r.real(own("v").c_str()), adv = r.real(own("adv").c_str()),
                 logits = r.real(own("logits").c_str()), logp = r.real(own("logp").c_str()), q = r.real(own("q").c_str()),
                 dlogits = r.real(own("dlogits").c_str());
      bool ok = hidden && v && adv && logits && logp && q && dlogits;
      members_.clear();
      for (int k = 0; k < K_ && ok; ++k) {
        Member m;
        m.online = bdq::resolve(r, prefix(k), bdq::Which::online);
        m.grad = bdq::resolve(r, prefix(k), bdq::Which::grad);
        m.act = {hidden + k * B * hc, v + k * B * d_.Z, adv + k * B * daz, logits + k * B * daz, logp + k * B * daz,
                 q + k * B * d_.D * d_.A};
        m.dlogits = dlogits + k * B * daz;
        ok = ok && m.online.w1 && m.grad.w1;
        members_.push_back(m);
      }
      back_ = {r.real(own("dv").c_str()), r.real(own("dadv").c_str()), r.real(own("dhidden").c_str())};
      q_ = q;
      disagreement_ = r.real(own("disagreement").c_str());
      h2_ = r.real(buf::h2);
      m_ = r.real(buf::target_m);
      weights_ = r.real(buf::is_weights);
      actions_ = r.i32(buf::actions);
      loss_ = r.real(("loss/" + name_).c_str());
      dtrunk_ = r.real(("dtrunk/" + name_).c_str());
      if (!(ok && disagreement_ && back_.dv && back_.dadv && back_.dhidden && h2_ && m_ && weights_ && actions_ &&
            loss_ && dtrunk_)) {
        error_ = "ensemble: a buffer or parameter it needs is missing";
        return 1;
      }
      return 0;
    } catch (const std::exception& e) {
      error_ = e.what();
      return 1;
    }
  }

  void run(std::int32_t tag, Backend& be) noexcept override {
    const int B = B_;
    switch (tag) {
      case kForward:  // states only (rows 0..B-1 of h2): the members take no part in the targets
        for (const Member& m : members_) bdq::forward(be, d_, m.online, h2_, B, m.act);
        be.ensemble_disagreement(disagreement_, q_, K_, B, d_.D * d_.A);
        break;
      case kLoss:
        for (int k = 0; k < K_; ++k) {
          C51Xent x;
          x.loss_per_sample = Real{nullptr, h2_.esize};
          x.loss = loss_; x.dlogits = members_[std::size_t(k)].dlogits; x.logp = members_[std::size_t(k)].act.logp;
          x.actions = actions_; x.m = m_; x.weights = weights_;
          x.B = B; x.D = d_.D; x.A = d_.A; x.Z = d_.Z;
          x.scale = 1.0f / float(K_);
          x.accumulate = k > 0;
          be.c51_xent(x);
        }
        break;
      case kBackward:  // dtrunk = Σ_k ∂L/∂h2 through member k
        for (int k = 0; k < K_; ++k) {
          const Member& m = members_[std::size_t(k)];
          bdq::backward(be, d_, m.online, m.grad, h2_, B, m.act, m.dlogits, back_, dtrunk_, k == 0 ? 0.0f : 1.0f);
        }
        break;
      default:
        break;
    }
  }

  const char* error() const noexcept override { return error_.c_str(); }

 private:
  struct Member {
    bdq::Params online{}, grad{};
    bdq::Acts act{};
    Real dlogits;
  };

  std::string own(const char* n) const { return name_ + "/" + n; }
  static std::string prefix(int k) { return "ensemble." + std::to_string(k); }

  int stage(BuildContext& ctx, Tag tag, const char* what, std::vector<std::string> reads,
            std::vector<std::string> writes) {
    const std::string stage_name = name_ + "." + what;
    std::vector<const char*> r, w;
    for (const auto& s : reads) r.push_back(s.c_str());
    for (const auto& s : writes) w.push_back(s.c_str());
    StageDesc desc{stage_name.c_str(), tag, r.data(), std::uint32_t(r.size()), w.data(), std::uint32_t(w.size())};
    return ctx.stage(desc);
  }
  int keep(int rc) {
    if (rc && error_.empty()) error_ = "ensemble: declaration refused by the engine";
    return rc;
  }

  std::string name_;
  bdq::Dims d_;
  int B_, K_;
  std::string error_;
  std::vector<Member> members_;
  bdq::BackScratch back_{};
  Real q_, disagreement_, h2_, m_, weights_, loss_, dtrunk_;
  std::int32_t* actions_ = nullptr;
};

const ParamSchema kSchema[] = {
    {"members", ParamType::integer, "4", "K: number of ensemble members (distributional dueling branching heads)", 1, 64},
};

Head* create(const HeadCreateInfo* info, char* err, std::uint32_t errlen) {
  try {
    if (info->role != Role::auxiliary) {
      std::snprintf(err, errlen, "ensemble is an auxiliary head (trained on the primary's target); give it role: auxiliary");
      return nullptr;
    }
    std::int64_t members = 4;
    for (std::uint32_t i = 0; i < info->n_params; ++i)
      if (std::strcmp(info->params[i].key, "members") == 0) members = info->params[i].i;
    if (members < 1 || members > 64) {
      std::snprintf(err, errlen, "ensemble: members must be in 1..64, got %lld", static_cast<long long>(members));
      return nullptr;
    }
    return new EnsembleHead(*info, int(members));
  } catch (const std::exception& e) {
    std::snprintf(err, errlen, "%s", e.what());
    return nullptr;
  }
}

void destroy(Head* h) { delete h; }

const PluginDescriptor kDescriptor{
    kAbiVersion, sizeof(PluginDescriptor), "ensemble", PluginKind::head, "0.1.0",
    "K distributional dueling branching heads on the shared trunk, trained on the C51 primary's projected target",
    0.1, 0, kSchema, std::uint32_t(sizeof(kSchema) / sizeof(kSchema[0])), &create, &destroy};

}  // namespace

DQN_PLUGIN_EXPORT(kDescriptor)
