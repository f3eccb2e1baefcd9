/** @file iqn.cpp
 *  @brief The IQN auxiliary head (docs/step-math.md, "IQN loss"): cosine embedding of τ, Hadamard product with
 *  the trunk output, two quantile layers; target quantiles from the target trunk at the primary's
 *  a*; the quantile Huber loss. τ and τ' come from the counter-based generator keyed by (seed,
 *  Adam step) on two streams, so a replayed graph draws fresh numbers and both backends agree.
 */
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <string>
#include <vector>

#include "dqn/backend.hpp"
#include "dqn/head.hpp"
#include "dqn/plugin.hpp"
#include "iqn_ops.hpp"

namespace {

using namespace dqn;

enum Tag : std::int32_t {
  kForward = 0, kTarget = 1, kLoss = 2, kBackward = 3, kWeights = 4, kBackwardHidden = 5, kWeightsOut = 6,
  kWeightsHidden = 7, kOnes = 8
};

constexpr std::uint32_t kTauStream = 0x7A00u;        ///< τ  [B,N]
constexpr std::uint32_t kTauTargetStream = 0x7A01u;  ///< τ' [B,N']

struct Config {
  int N = 32, Nt = 32, E = 64;
  double kappa = 1.0;
};

/// One pass of the quantile network over `rows` = B·n (sample-major) rows.
struct Pass {
  Real tau, cos, phi, x, hq, q;
};

/// The head's parameters (online, target or gradient).
struct Params {
  Real we, be, w1, b1, w2, b2;
};

class IqnHead final : public Head {
 public:
  IqnHead(const HeadCreateInfo& info, const Config& c)
      : name_(info.instance ? info.instance : "iqn"), c_(c), B_(info.batch), H2_(info.net->h2()),
        Hh_(info.net->head_hidden), DA_(info.net->branches * info.net->actions), D_(info.net->branches),
        A_(info.net->actions), gamma_n_(info.gamma_n), seed_(info.seed) {}

  int declare(BuildContext& ctx) noexcept override {
    try {
      int rc = 0;
      auto p = [&](const char* n, int rows, int cols, int fan_in, std::uint32_t flags = 0) {
        if (rc == 0) rc = ctx.param(n, rows, cols, fan_in, kParamAlign | flags);  // each tensor on 16 bytes
      };
      p("iqn.embed.weight", H2_, c_.E, c_.E);
      p("iqn.embed.bias", H2_, 0, c_.E);
      p("iqn.0.weight", Hh_, H2_, H2_);
      p("iqn.0.bias", Hh_, 0, H2_);
      // The output layer's rows padded to ldq() (zero rows): its forward GEMM writes whole aligned
      // rows of q and gets an aligned tensor-core kernel (D·A = 15 columns got a plain-fp32 one).
      p("iqn.1.weight", DA_, Hh_, Hh_, kParamPadRows);
      p("iqn.1.bias", DA_, 0, Hh_, kParamPadRows);
      if (rc) return keep(rc);
      const std::int64_t B = B_, N = c_.N, Nt = c_.Nt, E = c_.E, H2 = H2_, Hh = Hh_, LDA = ldq();
      struct Decl { std::string n; std::vector<std::int64_t> s; BufferKind kind; };
      const BufferKind act = BufferKind::activation, scr = BufferKind::scratch;
      const std::vector<Decl> decls = {
          {own("tau"), {B, N}, act}, {own("cos"), {B * N, E}, act}, {own("phi"), {B * N, H2}, act},
          {own("x"), {B * N, H2}, act}, {own("hq"), {B * N, Hh}, act}, {own("q"), {B, N, LDA}, act},
          {own("tau_target"), {B, Nt}, act}, {own("target.cos"), {B * Nt, E}, act},
          {own("target.phi"), {B * Nt, H2}, act}, {own("target.x"), {B * Nt, H2}, act},
          {own("target.hq"), {B * Nt, Hh}, act}, {own("target.q"), {B, Nt, LDA}, act},
          {own("dq"), {B * N, LDA}, scr}, {own("dhq"), {B * N, Hh}, scr}, {own("dx"), {B * N, H2}, scr},
          {own("ones"), {B * N}, scr},
      };
      for (const auto& x : decls)
        if (int r = ctx.buffer(x.n.c_str(), DType::real, x.s.data(), std::int32_t(x.s.size()), x.kind)) return keep(r);
      {  // the loss's device scratch: a word per sample
        const std::int64_t words = quantile_huber_sums(B_);
        if (int r = ctx.buffer(own("sums").c_str(), DType::i64, &words, 1, scr)) return keep(r);
      }
      const std::string loss = "loss/" + name_, grad = "grad/" + name_, dtrunk = "dtrunk/" + name_;
      // the ones the bias gradients' GEMMs sum with: at the start, beside everything
      rc = stage(ctx, kOnes, "ones", {}, {own("ones")});
      rc = rc ? rc : stage(ctx, kForward, "forward", {buf::h2, "params", buf::step},
                 {own("tau"), own("cos"), own("phi"), own("x"), own("hq"), own("q")});
      rc = rc ? rc : stage(ctx, kTarget, "target", {buf::target_h2, "target", buf::step},
                           {own("tau_target"), own("target.cos"), own("target.phi"), own("target.x"),
                            own("target.hq"), own("target.q")});
      rc = rc ? rc : stage(ctx, kLoss, "loss",
                           {own("q"), own("target.q"), own("tau"), buf::actions, buf::a_star, buf::rewards,
                            buf::dones, buf::is_weights},
                           {loss, own("dq"), own("sums")});
      // The input side in two stages: backward.hidden (the masked dhq) and backward (dx → dφ, on to
      // the trunk's ∂L/∂h2). Each layer's weight and bias gradients are a stage of their own that
      // starts as soon as its gradient is there (the output layer's beside the whole input side).
      rc = rc ? rc : stage(ctx, kBackwardHidden, "backward.hidden", {own("dq"), own("hq"), "params"}, {own("dhq")});
      rc = rc ? rc : stage(ctx, kBackward, "backward", {own("dhq"), own("phi"), buf::h2, "params"},
                           {own("dx"), dtrunk});
      auto grads = [&](const char* layer) {
        return std::vector<std::string>{grad + "/iqn." + layer + ".weight", grad + "/iqn." + layer + ".bias"};
      };
      rc = rc ? rc : stage(ctx, kWeightsOut, "weights.out", {own("dq"), own("hq"), own("ones")}, grads("1"));
      rc = rc ? rc : stage(ctx, kWeightsHidden, "weights.hidden", {own("dhq"), own("x"), own("ones")}, grads("0"));
      rc = rc ? rc : stage(ctx, kWeights, "weights", {own("dx"), own("cos"), own("ones")}, grads("embed"));
      return keep(rc);
    } catch (const std::exception& e) {
      error_ = e.what();
      return 1;
    }
  }

  int bind(const Resolver& r) noexcept override {
    try {
      auto params = [&](auto get) {
        return Params{get("iqn.embed.weight"), get("iqn.embed.bias"), get("iqn.0.weight"),
                      get("iqn.0.bias"), get("iqn.1.weight"), get("iqn.1.bias")};
      };
      online_ = params([&](const char* n) { return r.param(n); });
      target_ = params([&](const char* n) { return r.target(n); });
      grad_ = params([&](const char* n) { return r.grad(n); });
      auto R = [&](const char* n) { return r.real(own(n).c_str()); };
      pass_ = {R("tau"), R("cos"), R("phi"), R("x"), R("hq"), R("q")};
      tpass_ = {R("tau_target"), R("target.cos"), R("target.phi"), R("target.x"), R("target.hq"), R("target.q")};
      dq_ = R("dq");
      dhq_ = R("dhq");
      dx_ = R("dx");
      ones_ = R("ones");
      sums_ = r.i64(own("sums").c_str());
      h2_ = r.real(buf::h2);
      target_h2_ = r.real(buf::target_h2);
      step_ = r.i64(buf::step);
      actions_ = r.i32(buf::actions);
      a_star_ = r.i32(buf::a_star);
      rewards_ = r.real(buf::rewards);
      dones_ = r.real(buf::dones);
      weights_ = r.real(buf::is_weights);
      loss_ = r.real(("loss/" + name_).c_str());
      dtrunk_ = r.real(("dtrunk/" + name_).c_str());
      const bool ok = online_.we && online_.b2 && target_.we && target_.b2 && grad_.we && grad_.b2 && pass_.tau &&
                      pass_.q && tpass_.tau && tpass_.q && pass_.cos && pass_.phi && pass_.x && pass_.hq &&
                      tpass_.cos && tpass_.phi && tpass_.x && tpass_.hq && dq_ && dhq_ && dx_ && ones_ && h2_ && target_h2_ &&
                      step_ && actions_ && a_star_ && rewards_ && dones_ && weights_ && loss_ && dtrunk_ && sums_;
      if (!ok) {
        error_ = "iqn: a buffer or parameter it needs is missing";
        return 1;
      }
      return 0;
    } catch (const std::exception& e) {
      error_ = e.what();
      return 1;
    }
  }

  void run(std::int32_t tag, Backend& be) noexcept override {
    switch (tag) {
      case kForward:
        forward(be, online_, h2_, c_.N, kTauStream, pass_);
        break;
      case kTarget:
        forward(be, target_, target_h2_, c_.Nt, kTauTargetStream, tpass_);
        break;
      case kLoss: {
        QuantileHuber a;
        a.loss = loss_; a.loss_per_sample = Real{nullptr, h2_.esize}; a.dq = dq_; a.q = pass_.q;
        a.q_target = tpass_.q; a.actions = actions_; a.a_star = a_star_; a.tau = pass_.tau;
        a.rewards = rewards_; a.dones = dones_; a.weights = weights_;
        a.B = B_; a.N = c_.N; a.Nt = c_.Nt; a.D = D_; a.A = A_; a.gamma_n = gamma_n_; a.kappa = float(c_.kappa);
        a.ldq = ldq();
        a.sums = sums_;
        quantile_huber(be, a);
        break;
      }
      case kOnes:
        be.fill(ones_, 1.0f, std::int64_t(B_) * c_.N);
        break;
      case kBackwardHidden:  // dhq = dq W2, ReLU-masked by hq in the GEMM
        input_grad(be, dq_, DA_, online_.w2, Hh_, B_ * c_.N, dhq_, ldq(), pass_.hq);
        break;
      case kBackward:
        backward_inputs(be);
        break;
      case kWeightsOut:
        weight_grad(be, dq_, DA_, pass_.hq, Hh_, B_ * c_.N, grad_.w2, grad_.b2, ldq());
        break;
      case kWeightsHidden:
        weight_grad(be, dhq_, Hh_, pass_.x, H2_, B_ * c_.N, grad_.w1, grad_.b1);
        break;
      case kWeights:
        weight_grad(be, dx_, H2_, pass_.cos, c_.E, B_ * c_.N, grad_.we, grad_.be);
        break;
      default:
        break;
    }
  }

  const char* error() const noexcept override { return error_.c_str(); }

 private:
  std::string own(const char* n) const { return name_ + "/" + n; }
  /// Row stride of the quantile values q, target q and dq: D·A rounded up to 4, so their rows
  /// start 16-byte aligned and the GEMMs on them get aligned kernels.
  int ldq() const { return static_cast<int>(align_elems(DA_)); }

  /// Row-major dense layer y = act(x Wᵀ + b) over `rows` rows (y's row stride ldy, 0: out).
  static void dense(Backend& be, Real x, int in, Real w, Real b, Real y, int out, int rows, Act act, int ldy = 0) {
    Gemm g;
    g.tb = true; g.m = rows; g.n = out; g.k = in;
    g.a = x; g.lda = in; g.b = w; g.ldb = in; g.c = y; g.ldc = ld_or(ldy, out); g.weight_operand = 2;
    g.bias = b; g.act = act;  // fused epilogue
    be.gemm(g);
  }

  void forward(Backend& be, const Params& p, Real h2, int n, std::uint32_t stream, const Pass& s) const {
    const int rows = B_ * n;
    Uniform u;
    u.out = s.tau; u.n = std::int64_t(rows); u.seed = seed_; u.stream = stream; u.step = step_;
    be.uniform(u);
    cosine_embedding(be, s.cos, s.tau, rows, c_.E);
    dense(be, s.cos, c_.E, p.we, p.be, s.phi, H2_, rows, Act::relu);
    hadamard(be, s.x, h2, s.phi, B_, n, H2_);
    dense(be, s.x, H2_, p.w1, p.b1, s.hq, Hh_, rows, Act::relu);
    dense(be, s.hq, Hh_, p.w2, p.b2, s.q, ldq(), rows, Act::none);  // the padded rows too (zero columns)
  }

  /// dW = dyᵀ · x (overwriting) for a layer of `out` × `in` over `rows` rows, and its bias
  /// db = dyᵀ · 1 as a GEMM: rows = B·N is tall, which the column-sum kernel handles poorly.
  /// dy's row stride is ldy (0: out).
  void weight_grad(Backend& be, Real dy, int out, Real x, int in, int rows, Real dw, Real db, int ldy = 0) const {
    const int ld = ld_or(ldy, out);
    Gemm gb;
    gb.ta = true; gb.m = out; gb.n = 1; gb.k = rows;
    gb.a = dy; gb.lda = ld; gb.b = ones_; gb.ldb = 1; gb.c = db; gb.ldc = 1;
    be.gemm(gb);
    Gemm g;
    g.ta = true; g.m = out; g.n = in; g.k = rows;
    g.a = dy; g.lda = ld; g.b = x; g.ldb = in; g.c = dw; g.ldc = in;
    be.gemm(g);
  }

  /// dx = dy · W for W [out, in] (dy's row stride ldy, 0: out); with mask, ReLU-masked by it
  /// ([rows, in], the layer's output) in the GEMM.
  static void input_grad(Backend& be, Real dy, int out, Real w, int in, int rows, Real dx, int ldy = 0,
                         Real mask = {}) {
    Gemm g;
    g.m = rows; g.n = in; g.k = out;
    g.a = dy; g.lda = ld_or(ldy, out); g.b = w; g.ldb = in; g.c = dx; g.ldc = in; g.weight_operand = 2;
    if (mask) g.mask = mask, g.ldmask = in;
    be.gemm(g);
  }

  /// The input side after the masked dhq (backward.hidden): dx → dφ (masked) and ∂L/∂h2 into dtrunk.
  void backward_inputs(Backend& be) const {
    const int rows = B_ * c_.N;
    input_grad(be, dhq_, Hh_, online_.w1, H2_, rows, dx_);
    // dx → dφ in place, and ∂L/∂h2 summed over the N samples of each row.
    hadamard_backward(be, dx_, dtrunk_, dx_, h2_, pass_.phi, B_, c_.N, H2_);
    be.relu_backward(dx_, pass_.phi, rows, H2_, H2_);
  }

  int stage(BuildContext& ctx, Tag tag, const char* what, std::vector<std::string> reads,
            std::vector<std::string> writes) {
    return declare_stage(ctx, name_ + "." + what, tag, reads, writes);
  }
  int keep(int rc) {
    if (rc && error_.empty()) error_ = "iqn: declaration refused by the engine";
    return rc;
  }

  std::string name_;
  Config c_;
  int B_, H2_, Hh_, DA_, D_, A_;
  float gamma_n_;
  std::uint64_t seed_;
  std::string error_;
  Params online_{}, target_{}, grad_{};
  Pass pass_{}, tpass_{};
  Real dq_, dhq_, dx_, ones_, h2_, target_h2_, rewards_, dones_, weights_, loss_, dtrunk_;
  std::int64_t* step_ = nullptr;
  std::int32_t* actions_ = nullptr;
  std::int32_t* a_star_ = nullptr;
  std::int64_t* sums_ = nullptr;  ///< the loss's device scratch (quantile_huber_sums words)
};

constexpr double kInf = std::numeric_limits<double>::infinity();

const ParamSchema kSchema[] = {
    {"quantiles", ParamType::integer, "32", "N: quantile samples τ per state for the online head", 1, 1024},
    {"target_quantiles", ParamType::integer, "32", "N': quantile samples τ' per next state for the target", 1, 1024},
    {"embed", ParamType::integer, "64", "E: size of the cosine embedding of τ", 1, 4096},
    {"kappa", ParamType::number, "1.0", "κ: Huber threshold of the quantile loss (> 0)", 1e-6, kInf},
};

Head* create(const HeadCreateInfo* info, char* err, std::uint32_t errlen) {
  try {
    if (info->role != Role::auxiliary) {
      std::snprintf(err, errlen, "iqn is an auxiliary head (it uses the primary's a*); give it role: auxiliary");
      return nullptr;
    }
    Config c;
    for (std::uint32_t i = 0; i < info->n_params; ++i) {
      const ParamValue& v = info->params[i];
      if (std::strcmp(v.key, "quantiles") == 0) c.N = int(v.i);
      else if (std::strcmp(v.key, "target_quantiles") == 0) c.Nt = int(v.i);
      else if (std::strcmp(v.key, "embed") == 0) c.E = int(v.i);
      else if (std::strcmp(v.key, "kappa") == 0) c.kappa = v.d;
    }
    if (c.N < 1 || c.Nt < 1 || c.E < 1 || !(c.kappa > 0.0)) {
      std::snprintf(err, errlen, "iqn: quantiles, target_quantiles and embed must be >= 1 and kappa > 0");
      return nullptr;
    }
    return new IqnHead(*info, c);
  } catch (const std::exception& e) {
    std::snprintf(err, errlen, "%s", e.what());
    return nullptr;
  }
}

void destroy(Head* h) { delete h; }

const PluginDescriptor kDescriptor{
    kAbiMajor, kAbiMinor, sizeof(PluginDescriptor), PluginKind::head, "iqn", "0.1.0",
    "implicit quantile network head on the shared trunk: quantile Huber loss against the target at the primary's a*",
    0.2, 0, std::uint32_t(sizeof(kSchema) / sizeof(kSchema[0])), kSchema, &create, &destroy};

}  // namespace

DQN_PLUGIN_EXPORT(kDescriptor)
