/** @file ensemble.cpp
 *  @brief K extra distributional dueling branching heads on the shared online trunk, as one
 *  auxiliary head (docs/step-math.md, "Ensemble loss"): each member is trained on the primary's projected
 *  target m with the C51 cross-entropy; L_ens = (1/K) Σ_k (1/B) Σ_b w_b L^k(b). The members'
 *  disagreement (std over members of Q at `states`, averaged over branches and actions) goes to
 *  ensemble/disagreement [B].
 *
 *  The members' parameter blocks are declared back to back with one layout, so member k's
 *  tensors sit k·stride after member 0's: every GEMM runs once, strided-batched over the K
 *  members (the shared h2 with stride 0), and the elementwise ops run once over all K·B rows.
 *  Per member remain only the bias ops and the cross-entropy (different bias vectors, one m).
 */
#include <string>
#include <vector>

#include "c51_ops.hpp"
#include "disagreement_ops.hpp"
#include "dqn/bdq.hpp"
#include "dqn/head_base.hpp"

namespace {

using namespace dqn;

enum Tag : std::int32_t {
  kForward = 0, kLoss = 1, kBackward = 2, kWeights = 3, kTrunk = 4, kWeightsHidden = 5, kBias = 6, kDisagreement = 7,
  kBiasHidden = 8
};

class EnsembleHead final : public HeadBase {
 public:
  explicit EnsembleHead(const HeadCreateInfo& info) : HeadBase(info), d_(bdq::dims_of(*info.net)) {
    if (primary())
      throw std::invalid_argument(
          "ensemble is an auxiliary head (trained on the primary's target); give it role: auxiliary");
    const std::int64_t members = integer("members");
    if (members < 1 || members > 64)
      throw std::invalid_argument("ensemble: members must be in 1..64, got " + std::to_string(members));
    K_ = int(members);
  }

  void build(BuildContext& ctx) override {
    for (int k = 0; k < K_; ++k) accepted(bdq::declare_params(ctx, prefix(k), d_, 0));
    const std::int64_t K = K_, B = batch(), hc = d_.hidden_cols(), D = d_.D, A = d_.A, Z = d_.Z, LZ = d_.ldz(),
                       LAZ = d_.ldaz();
    // Activations carry the member as the leading dimension (ready for batched GEMMs).
    const auto act = BufferKind::activation;
    buffer(ctx, own("hidden"), {K, B, hc}, act);
    buffer(ctx, own("v"), {K, B, LZ}, act);
    buffer(ctx, own("adv"), {K, B, D, LAZ}, act);
    buffer(ctx, own("logits"), {K, B, D, A, Z}, act);
    buffer(ctx, own("logp"), {K, B, D, A, Z}, act);
    buffer(ctx, own("q"), {K, B, D, A}, act);
    buffer(ctx, own("disagreement"), {B}, act);
    buffer(ctx, own("dlogits"), {K, B, D, A, Z});
    buffer(ctx, own("dv"), {K, B, LZ});
    buffer(ctx, own("dadv"), {K, B, D, LAZ});
    buffer(ctx, own("dhidden"), {K, B, hc});
    // the cross-entropy's device scratch: a word per (member, sample)
    buffer(ctx, own("sums"), {c51_xent_sums(batch(), K_)}, BufferKind::scratch, DType::i64);
    stage(ctx, kForward, "forward", {buf::h2, "params"},
          {own("hidden"), own("v"), own("adv"), own("logits"), own("logp"), own("q")});
    // the disagreement (a metric): beside the loss and backward, not before them
    stage(ctx, kDisagreement, "disagreement", {own("q")}, {own("disagreement")});
    // loss: the cross-entropy with the dueling backward of its gradient (dv, dadv) in one op
    stage(ctx, kLoss, "loss", {own("logp"), kC51TargetM, buf::actions, buf::is_weights},
          {loss_buffer(), own("dlogits"), own("dv"), own("dadv"), own("sums")});
    // backward: the input side down to dhidden (ReLU-masked in its GEMMs); trunk: ∂L/∂h2 from
    // it; weights and bias (the output layers), weights.hidden and bias.hidden (the hidden
    // layers): the other gradients, on lanes of their own beside the trunk stage and the
    // trunk's backward.
    std::vector<std::string> hidden_biases, weights, biases, hidden_weights;
    for (int k = 0; k < K_; ++k)
      for (int layer : {0, 1})
        for (const auto& p : bdq::layer_params(prefix(k), d_, layer)) {
          const bool bias = p.size() > 5 && p.compare(p.size() - 5, 5, ".bias") == 0;
          (layer == 1 ? (bias ? biases : weights) : bias ? hidden_biases : hidden_weights).push_back(grad_of(p));
        }
    stage(ctx, kBackward, "backward", {own("dv"), own("dadv"), own("hidden"), "params"}, {own("dhidden")});
    stage(ctx, kBiasHidden, "bias.hidden", {own("dhidden")}, hidden_biases);
    stage(ctx, kTrunk, "trunk", {own("dhidden"), "params"}, {dtrunk_buffer()});
    stage(ctx, kWeights, "weights", {own("dv"), own("dadv"), own("hidden")}, weights);
    stage(ctx, kBias, "bias", {own("dv"), own("dadv")}, biases);
    stage(ctx, kWeightsHidden, "weights.hidden", {own("dhidden"), buf::h2}, hidden_weights);
  }

  void resolve(const Resolver& r) override {
    const std::int64_t B = batch(), hc = d_.hidden_cols(), daz = std::int64_t(d_.D) * d_.az();
    const Real hidden = real(r, own("hidden")), v = real(r, own("v")), adv = real(r, own("adv")),
               logits = real(r, own("logits")), logp = real(r, own("logp")), q = real(r, own("q")),
               dlogits = real(r, own("dlogits"));
    members_.clear();
    for (int k = 0; k < K_; ++k) {
      Member m;
      m.online = bdq::resolve(r, prefix(k), bdq::Which::online);
      m.grad = bdq::resolve(r, prefix(k), bdq::Which::grad);
      if (!m.online.w1 || !m.grad.w1)
        throw std::invalid_argument("member " + std::to_string(k) + "'s parameters (" + prefix(k) +
                                    ".*) are not there");
      m.act = {hidden + k * B * hc, v + k * B * d_.ldz(), adv + k * B * std::int64_t(d_.D) * d_.ldaz(),
               logits + k * B * daz, logp + k * B * daz, q + k * B * d_.D * d_.A};
      m.dlogits = dlogits + k * B * daz;
      members_.push_back(m);
    }
    back_ = {real(r, own("dv")), real(r, own("dadv")), real(r, own("dhidden"))};
    all_ = {hidden, v, adv, logits, logp, q};
    if (!uniform_stride())
      throw std::invalid_argument(
          "the members' parameters are not laid out at one stride (the batched GEMMs rely on it)");
    q_ = q;
    disagreement_ = real(r, own("disagreement"));
    h2_ = real(r, buf::h2);
    m_ = real(r, kC51TargetM);
    sums_ = i64(r, own("sums"));
    weights_ = real(r, buf::is_weights);
    actions_ = i32(r, buf::actions);
    loss_ = real(r, loss_buffer());
    dtrunk_ = real(r, dtrunk_buffer());
  }

  void step(std::int32_t tag, Backend& be) override {
    const int B = batch();
    switch (tag) {
      case kForward:  // states only (rows 0..B-1 of h2): the members take no part in the targets
        forward(be);
        break;
      case kDisagreement:
        ensemble_disagreement(be, disagreement_, q_, K_, B, d_.D * d_.A);
        break;
      case kLoss: {  // every member against the primary's projected target, in one call
        C51Xent x;
        x.loss_per_sample = Real{nullptr, h2_.esize};
        x.loss = loss_; x.dlogits = members_[0].dlogits; x.logp = members_[0].act.logp;
        x.actions = actions_; x.m = m_; x.weights = weights_;
        x.B = B; x.D = d_.D; x.A = d_.A; x.Z = d_.Z;
        x.scale = 1.0f / float(K_);
        x.members = K_;
        x.dv = back_.dv; x.lddv = d_.ldz(); x.dadv = back_.dadv; x.lddadv = d_.ldaz();
        x.sums = sums_;
        c51_xent(be, x);
        break;
      }
      case kBackward:
        backward_inputs(be);
        break;
      case kTrunk:
        backward_trunk(be);
        break;
      case kWeights:
        backward_weights_out(be);
        break;
      case kBias:
        backward_bias_out(be);
        break;
      case kBiasHidden:
        backward_bias_hidden(be);
        break;
      case kWeightsHidden:
        backward_weights_hidden(be);
        break;
      default:
        break;
    }
  }

 private:
  struct Member {
    bdq::Params online{}, grad{};
    bdq::Acts act{};
    Real dlogits;
  };

  /// Member k's tensors are member 0's plus k·stride_ (checked at bind, for θ and the gradient).
  bool uniform_stride() {
    const std::uint32_t es = members_[0].online.w1.esize;
    auto diff = [&](Real a, Real b) { return (static_cast<char*>(a.p) - static_cast<char*>(b.p)) / std::ptrdiff_t(es); };
    stride_ = K_ > 1 ? diff(members_[1].online.w1, members_[0].online.w1) : 0;
    for (int k = 0; k < K_; ++k) {
      for (auto which : {&Member::online, &Member::grad}) {
        const bdq::Params& p = members_[std::size_t(k)].*which;
        const bdq::Params& p0 = members_[0].*which;
        const Real a[] = {p.w1, p.b1, p.wv2, p.bv2, p.wb2, p.bb2}, a0[] = {p0.w1, p0.b1, p0.wv2, p0.bv2, p0.wb2, p0.bb2};
        for (int t = 0; t < 6; ++t)
          if (diff(a[t], a0[t]) != std::ptrdiff_t(k) * stride_) return false;
      }
    }
    return true;
  }

  /// A GEMM batched over the members: operands advance by the given strides from member to member.
  Gemm batched(bool ta, bool tb, int m, int n, int k, Real a, int lda, std::int64_t sa, Real b, int ldb,
               std::int64_t sb, Real c, int ldc, std::int64_t sc) const {
    Gemm g;
    g.ta = ta; g.tb = tb; g.m = m; g.n = n; g.k = k;
    g.a = a; g.lda = lda; g.stride_a = sa; g.b = b; g.ldb = ldb; g.stride_b = sb;
    g.c = c; g.ldc = ldc; g.stride_c = sc; g.batch = K_;
    return g;
  }

  void forward(Backend& be) const {
    const int B = batch(), hc = d_.hidden_cols(), Hh = d_.Hh, Z = d_.Z, LZ = d_.ldz(), laz = d_.ldaz();
    const int dlaz = d_.D * laz;  // adv rows: D blocks of ldaz (aligned GEMM kernels)
    const std::int64_t sh = std::int64_t(B) * hc;
    const bdq::Params& p = members_[0].online;
    // Biases ride in the GEMM epilogue; member k's bias is member 0's + k·stride_ (uniform_stride).
    Gemm g = batched(false, true, B, hc, d_.H2, h2_, d_.H2, 0, p.w1, d_.H2, stride_, all_.hidden, hc, sh);
    g.weight_operand = 2;
    g.bias = p.b1; g.stride_bias = stride_; g.act = Act::relu;
    be.gemm(g);
    // The output layers write whole padded rows (wv2_rows = ldz, wb2_rows = ldaz columns; the
    // zero weight rows give zero columns): aligned GEMM kernels.
    g = batched(false, true, B, d_.wv2_rows(), Hh, all_.hidden, hc, sh, p.wv2, Hh, stride_, all_.v, LZ,
                std::int64_t(B) * LZ);
    g.weight_operand = 2;
    g.bias = p.bv2; g.stride_bias = stride_;
    be.gemm(g);
    {  // every member's and branch's advantage layer in one call (members × branches)
      const BranchAt at = branch_at(0), step = branch_step();
      g = batched(false, true, B, d_.wb2_rows(), Hh, all_.hidden + at.hidden, hc, sh, p.wb2 + at.weight, Hh, stride_,
                  all_.adv + at.adv, dlaz, std::int64_t(B) * dlaz);
      g.weight_operand = 2;
      g.bias = p.bb2 + at.bias; g.stride_bias = stride_;
      g.batch2 = d_.D;
      g.stride2_a = step.hidden; g.stride2_b = step.weight; g.stride2_c = step.adv; g.stride2_bias = step.bias;
      be.gemm(g);
    }
    DuelingDist dd;  // every member's distribution and Q in one pass
    dd.logp = all_.logp; dd.q = all_.q; dd.v = all_.v; dd.ldv = LZ; dd.adv = all_.adv; dd.ldadv = laz;
    dd.rows = K_ * B; dd.D = d_.D; dd.A = d_.A; dd.Z = Z; dd.v_min = d_.v_min; dd.v_max = d_.v_max;
    be.dueling_dist(dd);
  }

  /// The input side for every member from the dueling gradients: dhidden (ReLU-masked in the GEMMs).
  void backward_inputs(Backend& be) const {
    const int B = batch(), hc = d_.hidden_cols(), az = d_.az(), Hh = d_.Hh, Z = d_.Z;
    const int LZ = d_.ldz(), laz = d_.ldaz(), dlaz = d_.D * laz;  // padded rows (aligned GEMM kernels)
    const std::int64_t sh = std::int64_t(B) * hc, sv = std::int64_t(B) * LZ, sa = std::int64_t(B) * dlaz;
    const bdq::Params& p = members_[0].online;
    // (dv and dadv come from the loss stage: c51_xent's fused dueling backward)
    // value output layer: dhv = dv Wv2, ReLU-masked by the hidden activations in the GEMM
    Gemm g = batched(false, false, B, Hh, Z, back_.dv, LZ, sv, p.wv2, Hh, stride_, back_.dhidden, hc, sh);
    g.weight_operand = 2;
    g.mask = all_.hidden; g.ldmask = hc; g.stride_mask = sh;
    be.gemm(g);
    {  // the branch output layers: members × branches in one call, masked alike
      const BranchAt at = branch_at(0), step = branch_step();
      g = batched(false, false, B, Hh, az, back_.dadv + at.adv, dlaz, sa, p.wb2 + at.weight, Hh, stride_,
                  back_.dhidden + at.hidden, hc, sh);
      g.weight_operand = 2;
      g.mask = all_.hidden + at.hidden; g.ldmask = hc; g.stride_mask = sh;
      g.batch2 = d_.D;
      g.stride2_a = step.adv; g.stride2_b = step.weight; g.stride2_c = step.hidden; g.stride2_mask = step.hidden;
      be.gemm(g);
    }
  }

  /// The hidden layers' bias gradients for every member (overwriting): column sums of the masked
  /// dhidden (a stage beside the trunk's input gradient, which needs only dhidden).
  void backward_bias_hidden(Backend& be) const {
    const int B = batch(), hc = d_.hidden_cols();
    const std::int64_t sh = std::int64_t(B) * hc;
    be.relu_bias_grad(back_.dhidden, Real{}, members_[0].grad.b1, B, hc, hc, K_, sh, 0, stride_);
  }

  /// ∂L/∂h2 = Σ_k dhidden_k W1_k, members in order, in one call (Gemm::sum_batch: on CUDA the
  /// member-batched GEMM and one fixed-order sum; a chain of beta-accumulating GEMMs ran the K
  /// products one after another, each a few blocks over a long k, and a GEMM, a copy and K − 1
  /// axpys after it were five launches in a row).
  void backward_trunk(Backend& be) const {
    const int B = batch(), hc = d_.hidden_cols(), H2 = d_.H2;
    const std::int64_t sh = std::int64_t(B) * hc;
    const bdq::Params& p = members_[0].online;
    Gemm g = batched(false, false, B, H2, hc, back_.dhidden, hc, sh, p.w1, H2, stride_, dtrunk_, H2, 0);
    g.weight_operand = 2;
    g.sum_batch = 1;
    be.gemm(g);
  }

  /// The output layers' weight gradients for every member (overwriting), from dv and dadv.
  void backward_weights_out(Backend& be) const {
    const int B = batch(), hc = d_.hidden_cols(), az = d_.az(), Hh = d_.Hh, Z = d_.Z;
    const int LZ = d_.ldz(), laz = d_.ldaz(), dlaz = d_.D * laz;
    const std::int64_t sh = std::int64_t(B) * hc, sv = std::int64_t(B) * LZ, sa = std::int64_t(B) * dlaz;
    const bdq::Params& gp = members_[0].grad;
    // dWv2 = dvᵀ hv
    be.gemm(batched(true, false, Z, Hh, B, back_.dv, LZ, sv, all_.hidden, hc, sh, gp.wv2, Hh, stride_));
    // dWb2_d = dadv_dᵀ hb_d, members × branches in one call (the zero rows' gradients stay 0)
    const BranchAt at = branch_at(0), step = branch_step();
    Gemm g = batched(true, false, az, Hh, B, back_.dadv + at.adv, dlaz, sa, all_.hidden + at.hidden, hc, sh,
                     gp.wb2 + at.weight, Hh, stride_);
    g.batch2 = d_.D;
    g.stride2_a = step.adv; g.stride2_b = step.hidden; g.stride2_c = step.weight;
    be.gemm(g);
  }

  /// The output layers' bias gradients for every member (overwriting): column sums of dv and of
  /// dadv. dadv's padding columns are zero (the loss stage's fused dueling backward writes them,
  /// as dueling_backward does), so one call covers every branch's block (ldaz columns each, as the
  /// biases' blocks are wb2_rows = ldaz apart), the padding biases' gradients included (zero).
  void backward_bias_out(Backend& be) const {
    const int B = batch(), Z = d_.Z, LZ = d_.ldz(), dlaz = d_.D * d_.ldaz();
    const std::int64_t sv = std::int64_t(B) * LZ, sa = std::int64_t(B) * dlaz;
    const bdq::Params& gp = members_[0].grad;
    be.relu_bias_grad(back_.dv, Real{}, gp.bv2, B, Z, LZ, K_, sv, 0, stride_);
    be.relu_bias_grad(back_.dadv, Real{}, gp.bb2, B, dlaz, dlaz, K_, sa, 0, stride_);
  }

  /// dW1 = dhiddenᵀ h2 for every member (overwriting), from the masked dhidden.
  void backward_weights_hidden(Backend& be) const {
    const int B = batch(), hc = d_.hidden_cols(), H2 = d_.H2;
    const std::int64_t sh = std::int64_t(B) * hc;
    be.gemm(batched(true, false, hc, H2, B, back_.dhidden, hc, sh, h2_, H2, 0, members_[0].grad.w1, H2, stride_));
  }

  static std::string prefix(int k) { return "ensemble." + std::to_string(k); }

  /// Where branch d starts: in a member's output-layer weights and biases (padded rows,
  /// wb2_rows apart), in a row of adv/dadv (ldaz apart) and in a row of hidden (after the value
  /// stream's Hh columns).
  struct BranchAt {
    std::int64_t weight, bias, adv, hidden;
  };
  BranchAt branch_at(int d) const {
    const std::int64_t r = d_.wb2_rows();
    return BranchAt{d * r * d_.Hh, d * r, std::int64_t(d) * d_.ldaz(), std::int64_t(d_.Hh) * (1 + d)};
  }
  /// From one branch to the next (the second batch dimension's strides).
  BranchAt branch_step() const {
    const BranchAt a = branch_at(0), b = branch_at(1);
    return BranchAt{b.weight - a.weight, b.bias - a.bias, b.adv - a.adv, b.hidden - a.hidden};
  }

  bdq::Dims d_;
  int K_ = 0;
  std::vector<Member> members_;
  bdq::BackScratch back_{};  ///< [K,B,...]: every member's
  bdq::Acts all_{};          ///< [K,B,...]: every member's activations
  std::int64_t stride_ = 0;  ///< elements from one member's parameter block to the next
  Real q_, disagreement_, h2_, m_, weights_, loss_, dtrunk_;
  std::int32_t* actions_ = nullptr;
  std::int64_t* sums_ = nullptr;  ///< the cross-entropy's device scratch (c51_xent_sums words)
};

const ParamSchema kSchema[] = {
    {"members", ParamType::integer, "4", "K: number of ensemble members (distributional dueling branching heads)", 1, 64},
};

}  // namespace

DQN_HEAD_PLUGIN(EnsembleHead, "ensemble", "0.1.0",
                "K distributional dueling branching heads on the shared trunk, trained on the C51 primary's "
                "projected target",
                0.1, false, kSchema)
