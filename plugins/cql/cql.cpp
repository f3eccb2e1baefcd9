/** @file cql.cpp
 *  @brief The discrete CQL penalty as an auxiliary head (docs/step-math.md, "CQL penalty"): α·(logsumexp_a Q −
 *  Q(s, a_data)) on the C51 primary's online expected Q-values at `states`, per branch; its
 *  gradient flows back through the C51 head and the trunk into this head's own gradient row.
 */
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <string>
#include <vector>

#include "cql_ops.hpp"
#include "dqn/bdq.hpp"
#include "dqn/head.hpp"
#include "dqn/plugin.hpp"

namespace {

using namespace dqn;

enum Tag : std::int32_t { kLoss = 0, kBackward = 1, kWeights = 2 };

class CqlHead final : public Head {
 public:
  CqlHead(const HeadCreateInfo& info, double alpha, std::string primary)
      : name_(info.instance ? info.instance : "cql"), primary_(std::move(primary)), d_(bdq::dims_of(*info.net)),
        B_(info.batch), alpha_(float(alpha)) {}

  int declare(BuildContext& ctx) noexcept override {
    try {
      const std::int64_t B = B_, D = d_.D, A = d_.A, Z = d_.Z, hc = d_.hidden_cols();
      struct Decl { std::string n; std::vector<std::int64_t> s; };
      const std::vector<Decl> decls = {
          {own("dq"), {B, D, A}}, {own("dlogits"), {B, D, A, Z}}, {own("dv"), {B, std::int64_t(d_.ldz())}},
          {own("dadv"), {B, D, std::int64_t(d_.ldaz())}}, {own("dhidden"), {B, hc}},
      };
      for (const auto& x : decls)
        if (int rc = ctx.buffer(x.n.c_str(), DType::real, x.s.data(), std::int32_t(x.s.size()), BufferKind::scratch))
          return keep(rc);
      {  // the penalty's device scratch: a word per (sample, branch)
        const std::int64_t words = cql_penalty_sums(B_, d_.D);
        if (int rc = ctx.buffer(own("sums").c_str(), DType::i64, &words, 1, BufferKind::scratch)) return keep(rc);
      }
      const std::string loss = "loss/" + name_, grad = "grad/" + name_, dtrunk = "dtrunk/" + name_;
      int rc = stage(ctx, kLoss, "loss", {prim("q"), buf::actions}, {loss, own("dq"), own("sums")});
      // backward: the input side, on to the trunk; weights: the gradients of the primary's head
      // parameters (in this head's row), beside the trunk's backward.
      rc = rc ? rc : stage(ctx, kBackward, "backward", {own("dq"), prim("logp"), prim("hidden"), "params"},
                           {own("dlogits"), own("dv"), own("dadv"), own("dhidden"), dtrunk});
      std::vector<std::string> grads;
      for (int layer : {0, 1})
        for (const auto& p : bdq::layer_params("c51", d_, layer)) grads.push_back(grad + "/" + p);
      rc = rc ? rc : stage(ctx, kWeights, "weights", {own("dv"), own("dadv"), own("dhidden"), prim("hidden"), buf::h2},
                           grads);
      return keep(rc);
    } catch (const std::exception& e) {
      error_ = e.what();
      return 1;
    }
  }

  int bind(const Resolver& r) noexcept override {
    try {
      online_ = bdq::resolve(r, "c51", bdq::Which::online);
      grad_ = bdq::resolve(r, "c51", bdq::Which::grad);  // through this head's resolver: its own row
      q_ = r.real(prim("q").c_str());
      logp_ = r.real(prim("logp").c_str());
      act_ = bdq::Acts{r.real(prim("hidden").c_str()), Real{}, Real{}, Real{}, logp_, q_};
      dq_ = r.real(own("dq").c_str());
      sums_ = r.i64(own("sums").c_str());
      dlogits_ = r.real(own("dlogits").c_str());
      back_ = {r.real(own("dv").c_str()), r.real(own("dadv").c_str()), r.real(own("dhidden").c_str())};
      h2_ = r.real(buf::h2);
      actions_ = r.i32(buf::actions);
      loss_ = r.real(("loss/" + name_).c_str());
      dtrunk_ = r.real(("dtrunk/" + name_).c_str());
      if (!(online_.w1 && grad_.w1 && q_ && logp_ && act_.hidden && dq_ && dlogits_ && back_.dv && back_.dadv &&
            back_.dhidden && h2_ && actions_ && loss_ && dtrunk_ && sums_)) {
        error_ = "cql: a buffer or parameter it needs is missing (is the primary a c51 head named '" + primary_ + "'?)";
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
      case kLoss: {  // rows 0..B-1 of the primary's q are the states
        CqlPenalty p;
        p.loss = loss_; p.dq = dq_; p.q = q_; p.actions = actions_; p.B = B; p.D = d_.D; p.A = d_.A; p.alpha = alpha_;
        p.sums = sums_;
        cql_penalty(be, p);
        break;
      }
      case kBackward:
        be.expected_q_backward(dlogits_, dq_, logp_, B * d_.D * d_.A, d_.Z, d_.v_min, d_.v_max);
        be.dueling_backward(back_.dv, d_.ldz(), back_.dadv, d_.ldaz(), dlogits_, B, d_.D, d_.A, d_.Z);
        bdq::backward_inputs(be, d_, online_, B, act_, back_, dtrunk_, 0.0f);
        break;
      case kWeights:
        bdq::backward_weights(be, d_, grad_, h2_, B, act_, back_);
        break;
      default:
        break;
    }
  }

  const char* error() const noexcept override { return error_.c_str(); }

 private:
  std::string own(const char* n) const { return name_ + "/" + n; }
  std::string prim(const char* n) const { return primary_ + "/" + n; }

  int stage(BuildContext& ctx, Tag tag, const char* what, std::vector<std::string> reads,
            std::vector<std::string> writes) {
    return declare_stage(ctx, name_ + "." + what, tag, reads, writes);
  }
  int keep(int rc) {
    if (rc && error_.empty()) error_ = "cql: declaration refused by the engine";
    return rc;
  }

  std::string name_, primary_;
  bdq::Dims d_;
  int B_;
  float alpha_;
  std::string error_;
  bdq::Params online_{}, grad_{};
  bdq::Acts act_{};
  bdq::BackScratch back_{};
  Real q_, logp_, dq_, dlogits_, h2_, loss_, dtrunk_;
  std::int32_t* actions_ = nullptr;
  std::int64_t* sums_ = nullptr;  ///< the penalty's device scratch (cql_penalty_sums words)
};

constexpr double kInf = std::numeric_limits<double>::infinity();

const ParamSchema kSchema[] = {
    {"alpha", ParamType::number, "1.0", "weight α of the penalty", 0.0, kInf},
    {"primary", ParamType::string, "c51", "instance name of the C51 primary whose Q-values are penalised", -kInf, kInf},
};

Head* create(const HeadCreateInfo* info, char* err, std::uint32_t errlen) {
  try {
    if (info->role != Role::auxiliary) {
      std::snprintf(err, errlen, "cql is an auxiliary head (a penalty on the primary's Q-values); give it role: auxiliary");
      return nullptr;
    }
    double alpha = 1.0;
    std::string primary = "c51";
    for (std::uint32_t i = 0; i < info->n_params; ++i) {
      const ParamValue& v = info->params[i];
      if (std::strcmp(v.key, "alpha") == 0) alpha = v.d;
      else if (std::strcmp(v.key, "primary") == 0 && v.s) primary = v.s;
    }
    if (!(alpha >= 0.0)) {
      std::snprintf(err, errlen, "cql: alpha must be >= 0, got %g", alpha);
      return nullptr;
    }
    return new CqlHead(*info, alpha, primary);
  } catch (const std::exception& e) {
    std::snprintf(err, errlen, "%s", e.what());
    return nullptr;
  }
}

void destroy(Head* h) { delete h; }

const PluginDescriptor kDescriptor{
    kAbiMajor, kAbiMinor, sizeof(PluginDescriptor), PluginKind::head, "cql", "1.0.0",
    "discrete CQL penalty alpha*(logsumexp_a Q - Q(s,a_data)) on the C51 primary's online Q-values, per branch",
    0.1, 0, std::uint32_t(sizeof(kSchema) / sizeof(kSchema[0])), kSchema, &create, &destroy};

}  // namespace

DQN_PLUGIN_EXPORT(kDescriptor)
