/** @file cql.cpp
 *  @brief The discrete CQL penalty as an auxiliary head (docs/step-math.md, "CQL penalty"): α·(logsumexp_a Q −
 *  Q(s, a_data)) on the C51 primary's online expected Q-values at `states`, per branch; its
 *  gradient flows back through the C51 head and the trunk into this head's own gradient row.
 */
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "cql_ops.hpp"
#include "dqn/bdq.hpp"
#include "dqn/head_base.hpp"

namespace {

using namespace dqn;

enum Tag : std::int32_t { kLoss = 0, kBackward = 1, kWeights = 2 };

class CqlHead final : public HeadBase {
 public:
  explicit CqlHead(const HeadCreateInfo& info)
      : HeadBase(info), primary_(text("primary")), d_(bdq::dims_of(*info.net)), alpha_(float(number("alpha"))) {
    if (primary())
      throw std::invalid_argument(
          "cql is an auxiliary head (a penalty on the primary's Q-values); give it role: auxiliary");
    if (const double alpha = number("alpha"); !(alpha >= 0.0)) {
      char got[32];
      std::snprintf(got, sizeof got, "%g", alpha);
      throw std::invalid_argument(std::string("cql: alpha must be >= 0, got ") + got);
    }
  }

  void build(BuildContext& ctx) override {
    const std::int64_t B = batch(), D = d_.D, A = d_.A, Z = d_.Z, hc = d_.hidden_cols();
    buffer(ctx, own("dq"), {B, D, A});
    buffer(ctx, own("dlogits"), {B, D, A, Z});
    buffer(ctx, own("dv"), {B, d_.ldz()});
    buffer(ctx, own("dadv"), {B, D, d_.ldaz()});
    buffer(ctx, own("dhidden"), {B, hc});
    // the penalty's device scratch: a word per (sample, branch)
    buffer(ctx, own("sums"), {cql_penalty_sums(batch(), d_.D)}, BufferKind::scratch, DType::i64);
    stage(ctx, kLoss, "loss", {prim("q"), buf::actions}, {loss_buffer(), own("dq"), own("sums")});
    // backward: the input side, on to the trunk; weights: the gradients of the primary's head
    // parameters (in this head's row), beside the trunk's backward.
    stage(ctx, kBackward, "backward", {own("dq"), prim("logp"), prim("hidden"), "params"},
          {own("dlogits"), own("dv"), own("dadv"), own("dhidden"), dtrunk_buffer()});
    std::vector<std::string> grads;
    for (int layer : {0, 1})
      for (const auto& p : bdq::layer_params("c51", d_, layer)) grads.push_back(grad_of(p));
    stage(ctx, kWeights, "weights", {own("dv"), own("dadv"), own("dhidden"), prim("hidden"), buf::h2}, grads);
  }

  void resolve(const Resolver& r) override {
    online_ = bdq::resolve(r, "c51", bdq::Which::online);
    grad_ = bdq::resolve(r, "c51", bdq::Which::grad);  // through this head's resolver: its own row
    if (!online_.w1 || !grad_.w1) throw std::invalid_argument("the c51 primary's parameters are not there" + hint());
    q_ = primary_real(r, "q");
    logp_ = primary_real(r, "logp");
    act_ = bdq::Acts{primary_real(r, "hidden"), Real{}, Real{}, Real{}, logp_, q_};
    dq_ = real(r, own("dq"));
    sums_ = i64(r, own("sums"));
    dlogits_ = real(r, own("dlogits"));
    back_ = {real(r, own("dv")), real(r, own("dadv")), real(r, own("dhidden"))};
    h2_ = real(r, buf::h2);
    actions_ = i32(r, buf::actions);
    loss_ = real(r, loss_buffer());
    dtrunk_ = real(r, dtrunk_buffer());
  }

  void step(std::int32_t tag, Backend& be) override {
    const int B = batch();
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

 private:
  /// "<primary>/<n>": a buffer of the C51 primary's.
  std::string prim(const char* n) const { return primary_ + "/" + n; }
  std::string hint() const { return " (is the primary a c51 head named '" + primary_ + "'?)"; }
  /// The primary's buffer n, or a refusal that names the configured primary.
  Real primary_real(const Resolver& r, const char* n) const {
    const Real p = r.real(prim(n).c_str());
    if (!p) throw std::invalid_argument("'" + prim(n) + "' is not there" + hint());
    return p;
  }

  std::string primary_;  ///< the C51 primary's instance name (the "primary" key)
  bdq::Dims d_;
  float alpha_;
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

}  // namespace

DQN_HEAD_PLUGIN(CqlHead, "cql", "1.0.0",
                "discrete CQL penalty alpha*(logsumexp_a Q - Q(s,a_data)) on the C51 primary's online Q-values, "
                "per branch",
                0.1, false, kSchema)
