/** @file iqn.cpp
 *  @brief The IQN auxiliary head (docs/step-math.md, "IQN loss"): cosine embedding of τ, Hadamard product with
 *  the trunk output, two quantile layers; target quantiles from the target trunk at the primary's
 *  a*; the quantile Huber loss. τ and τ' come from the counter-based generator keyed by (seed,
 *  Adam step) on two streams, so a replayed graph draws fresh numbers and both backends agree.
 */
#include <limits>
#include <string>
#include <vector>

#include "dqn/head_base.hpp"
#include "iqn_ops.hpp"

namespace {

using namespace dqn;

enum Tag : std::int32_t {
  kForward = 0, kTarget = 1, kLoss = 2, kBackward = 3, kWeights = 4, kBackwardHidden = 5, kWeightsOut = 6,
  kWeightsHidden = 7, kOnes = 8
};

constexpr std::uint32_t kTauStream = 0x7A00u;        ///< τ  [B,N]
constexpr std::uint32_t kTauTargetStream = 0x7A01u;  ///< τ' [B,N']

/// The configuration: quantiles, target_quantiles, embed and kappa.
struct Config {
  int N = 0, Nt = 0, E = 0;
  double kappa = 0.0;
};

/// One pass of the quantile network over `rows` = B·n (sample-major) rows.
struct Pass {
  Real tau, cos, phi, x, hq, q;
};

/// The head's parameters (online, target or gradient).
struct Params {
  Real we, be, w1, b1, w2, b2;
};

class IqnHead final : public HeadBase {
 public:
  explicit IqnHead(const HeadCreateInfo& info)
      : HeadBase(info), H2_(info.net->h2()), Hh_(info.net->head_hidden), DA_(info.net->branches * info.net->actions),
        D_(info.net->branches), A_(info.net->actions) {
    if (primary())
      throw std::invalid_argument("iqn is an auxiliary head (it uses the primary's a*); give it role: auxiliary");
    c_.N = int(integer("quantiles"));
    c_.Nt = int(integer("target_quantiles"));
    c_.E = int(integer("embed"));
    c_.kappa = number("kappa");
    if (c_.N < 1 || c_.Nt < 1 || c_.E < 1 || !(c_.kappa > 0.0))
      throw std::invalid_argument("iqn: quantiles, target_quantiles and embed must be >= 1 and kappa > 0");
  }

  void build(BuildContext& ctx) override {
    auto p = [&](const char* n, int rows, int cols, int fan_in, std::uint32_t flags = 0) {
      param(ctx, n, rows, cols, fan_in, kParamAlign | flags);  // each tensor on 16 bytes
    };
    row0_ = ctx.batch_offset();  // the rank's first row of the global batch: its share of the draws
    p("iqn.embed.weight", H2_, c_.E, c_.E);
    p("iqn.embed.bias", H2_, 0, c_.E);
    p("iqn.0.weight", Hh_, H2_, H2_);
    p("iqn.0.bias", Hh_, 0, H2_);
    // The output layer's rows padded to ldq() (zero rows): its forward GEMM writes whole aligned
    // rows of q and gets an aligned tensor-core kernel (D·A = 15 columns got a plain-fp32 one).
    p("iqn.1.weight", DA_, Hh_, Hh_, kParamPadRows);
    p("iqn.1.bias", DA_, 0, Hh_, kParamPadRows);
    const std::int64_t B = batch(), N = c_.N, Nt = c_.Nt, E = c_.E, H2 = H2_, Hh = Hh_, LDA = ldq();
    const auto act = BufferKind::activation;
    buffer(ctx, own("tau"), {B, N}, act);
    buffer(ctx, own("cos"), {B * N, E}, act);
    buffer(ctx, own("phi"), {B * N, H2}, act);
    buffer(ctx, own("x"), {B * N, H2}, act);
    buffer(ctx, own("hq"), {B * N, Hh}, act);
    buffer(ctx, own("q"), {B, N, LDA}, act);
    buffer(ctx, own("tau_target"), {B, Nt}, act);
    buffer(ctx, own("target.cos"), {B * Nt, E}, act);
    buffer(ctx, own("target.phi"), {B * Nt, H2}, act);
    buffer(ctx, own("target.x"), {B * Nt, H2}, act);
    buffer(ctx, own("target.hq"), {B * Nt, Hh}, act);
    buffer(ctx, own("target.q"), {B, Nt, LDA}, act);
    buffer(ctx, own("dq"), {B * N, LDA});
    buffer(ctx, own("dhq"), {B * N, Hh});
    buffer(ctx, own("dx"), {B * N, H2});
    buffer(ctx, own("ones"), {B * N});
    // the loss's device scratch: a word per sample
    buffer(ctx, own("sums"), {quantile_huber_sums(batch())}, BufferKind::scratch, DType::i64);
    // the ones the bias gradients' GEMMs sum with: at the start, beside everything
    stage(ctx, kOnes, "ones", {}, {own("ones")});
    stage(ctx, kForward, "forward", {buf::h2, "params", buf::step},
          {own("tau"), own("cos"), own("phi"), own("x"), own("hq"), own("q")});
    stage(ctx, kTarget, "target", {buf::target_h2, "target", buf::step},
          {own("tau_target"), own("target.cos"), own("target.phi"), own("target.x"), own("target.hq"),
           own("target.q")});
    stage(ctx, kLoss, "loss",
          {own("q"), own("target.q"), own("tau"), buf::actions, buf::a_star, buf::rewards, buf::dones,
           buf::is_weights},
          {loss_buffer(), own("dq"), own("sums")});
    // The input side in two stages: backward.hidden (the masked dhq) and backward (dx → dφ, on to
    // the trunk's ∂L/∂h2). Each layer's weight and bias gradients are a stage of their own that
    // starts as soon as its gradient is there (the output layer's beside the whole input side).
    stage(ctx, kBackwardHidden, "backward.hidden", {own("dq"), own("hq"), "params"}, {own("dhq")});
    stage(ctx, kBackward, "backward", {own("dhq"), own("phi"), buf::h2, "params"}, {own("dx"), dtrunk_buffer()});
    auto grads = [&](const char* layer) {
      const std::string prefix = std::string("iqn.") + layer;
      return std::vector<std::string>{grad_of(prefix + ".weight"), grad_of(prefix + ".bias")};
    };
    stage(ctx, kWeightsOut, "weights.out", {own("dq"), own("hq"), own("ones")}, grads("1"));
    stage(ctx, kWeightsHidden, "weights.hidden", {own("dhq"), own("x"), own("ones")}, grads("0"));
    stage(ctx, kWeights, "weights", {own("dx"), own("cos"), own("ones")}, grads("embed"));
  }

  void resolve(const Resolver& r) override {
    auto params = [&](auto get) {
      return Params{get("iqn.embed.weight"), get("iqn.embed.bias"), get("iqn.0.weight"),
                    get("iqn.0.bias"),       get("iqn.1.weight"),     get("iqn.1.bias")};
    };
    online_ = params([&](const char* n) { return online_param(r, n); });
    target_ = params([&](const char* n) { return target_param(r, n); });
    grad_ = params([&](const char* n) { return grad_param(r, n); });
    auto R = [&](const char* n) { return real(r, own(n)); };
    pass_ = {R("tau"), R("cos"), R("phi"), R("x"), R("hq"), R("q")};
    tpass_ = {R("tau_target"), R("target.cos"), R("target.phi"), R("target.x"), R("target.hq"), R("target.q")};
    dq_ = R("dq");
    dhq_ = R("dhq");
    dx_ = R("dx");
    ones_ = R("ones");
    sums_ = i64(r, own("sums"));
    h2_ = real(r, buf::h2);
    target_h2_ = real(r, buf::target_h2);
    step_ = i64(r, buf::step);
    actions_ = i32(r, buf::actions);
    a_star_ = i32(r, buf::a_star);
    rewards_ = real(r, buf::rewards);
    dones_ = real(r, buf::dones);
    weights_ = real(r, buf::is_weights);
    loss_ = real(r, loss_buffer());
    dtrunk_ = real(r, dtrunk_buffer());
  }

  void step(std::int32_t tag, Backend& be) override {
    const int B = batch();
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
        a.B = B; a.N = c_.N; a.Nt = c_.Nt; a.D = D_; a.A = A_; a.gamma_n = gamma_n(); a.kappa = float(c_.kappa);
        a.ldq = ldq();
        a.sums = sums_;
        quantile_huber(be, a);
        break;
      }
      case kOnes:
        be.fill(ones_, 1.0f, std::int64_t(B) * c_.N);
        break;
      case kBackwardHidden:  // dhq = dq W2, ReLU-masked by hq in the GEMM
        input_grad(be, dq_, DA_, online_.w2, Hh_, B * c_.N, dhq_, ldq(), pass_.hq);
        break;
      case kBackward:
        backward_inputs(be);
        break;
      case kWeightsOut:
        weight_grad(be, dq_, DA_, pass_.hq, Hh_, B * c_.N, grad_.w2, grad_.b2, ldq());
        break;
      case kWeightsHidden:
        weight_grad(be, dhq_, Hh_, pass_.x, H2_, B * c_.N, grad_.w1, grad_.b1);
        break;
      case kWeights:
        weight_grad(be, dx_, H2_, pass_.cos, c_.E, B * c_.N, grad_.we, grad_.be);
        break;
      default:
        break;
    }
  }

 private:
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
    const int rows = batch() * n;
    Uniform u;
    u.out = s.tau; u.n = std::int64_t(rows); u.seed = seed(); u.stream = stream; u.step = step_;
    be.uniform_from(u, row0_ * n);  // τ is [B, n] row-major: this rank's rows of the global draw
    cosine_embedding(be, s.cos, s.tau, rows, c_.E);
    dense(be, s.cos, c_.E, p.we, p.be, s.phi, H2_, rows, Act::relu);
    hadamard(be, s.x, h2, s.phi, batch(), n, H2_);
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
    const int rows = batch() * c_.N;
    input_grad(be, dhq_, Hh_, online_.w1, H2_, rows, dx_);
    // dx → dφ in place, and ∂L/∂h2 summed over the N samples of each row.
    hadamard_backward(be, dx_, dtrunk_, dx_, h2_, pass_.phi, batch(), c_.N, H2_);
    be.relu_backward(dx_, pass_.phi, rows, H2_, H2_);
  }

  Config c_;
  int H2_, Hh_, DA_, D_, A_;
  Params online_{}, target_{}, grad_{};
  Pass pass_{}, tpass_{};
  Real dq_, dhq_, dx_, ones_, h2_, target_h2_, rewards_, dones_, weights_, loss_, dtrunk_;
  std::int64_t* step_ = nullptr;
  std::int64_t row0_ = 0;
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

}  // namespace

DQN_HEAD_PLUGIN(IqnHead, "iqn", "0.1.0",
                "implicit quantile network head on the shared trunk: quantile Huber loss against the target at the "
                "primary's a*",
                0.2, false, kSchema)
