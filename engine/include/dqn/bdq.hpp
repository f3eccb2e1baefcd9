/** @file bdq.hpp
 *  @brief The distributional dueling branching head (docs/step-math.md, "Network"), forward and backward,
 *  written once against the op table. Shared by the c51 plugin and the ensemble members.
 *
 *  Layout trick: the value and branch hidden layers are declared back to back, so their weights
 *  form one [(1+D)·Hh, H2] matrix and one GEMM computes all of them; the D branch output layers
 *  run as one strided-batched GEMM.
 */
#pragma once

#include <string>
#include <vector>

#include "dqn/backend.hpp"
#include "dqn/head.hpp"
#include "dqn/policy_graph.hpp"

namespace dqn::bdq {

struct Dims {
  int H2 = 0, Hh = 0, D = 0, A = 0, Z = 0;
  float v_min = -10.0f, v_max = 10.0f;
  int hidden_cols() const { return (1 + D) * Hh; }
  int az() const { return A * Z; }
  /// Row stride of the value-stream buffers ([rows, ldz] for v and dv): Z rounded up to 4, so
  /// their rows start 16-byte aligned and the GEMMs reading or writing them get aligned kernels.
  int ldz() const { return static_cast<int>(align_elems(Z)); }
  /// Stride of one (row, branch) block of the advantage buffers ([rows, D, ldaz] for adv and
  /// dadv): A·Z rounded up to 4, for the same reason.
  int ldaz() const { return static_cast<int>(align_elems(std::int64_t(A) * Z)); }
  /// Rows stored for the value output layer (value.1.weight, value.1.bias) and for each branch's
  /// (branch.d.1.*): Z and A·Z padded with zero rows (kParamPadRows), so that the output GEMMs
  /// write whole aligned rows of v and adv (ldz and ldaz columns).
  int wv2_rows() const { return ldz(); }
  int wb2_rows() const { return ldaz(); }
};

inline Dims dims_of(const NetworkDims& n) {
  return Dims{n.h2(), n.head_hidden, n.branches, n.actions, n.atoms, n.v_min, n.v_max};
}

inline std::string pname(const std::string& prefix, const std::string& rest) { return prefix + "." + rest; }

/// Declares the head's parameters under `prefix` ("c51", "ensemble.0") in the contiguous order
/// the forward relies on. flags go to every weight matrix (spectral norm for the primary). Each
/// concatenated block (Params) starts on 16 bytes (kParamAlign), so the GEMMs on it, and on the
/// next ensemble member's, get aligned kernels; inside a block the tensors follow directly. The
/// output layers' rows are padded (kParamPadRows: wv2_rows, wb2_rows), so one branch's block
/// follows the previous one wb2_rows rows on.
inline int declare_params(BuildContext& ctx, const std::string& prefix, const Dims& d, std::uint32_t weight_flags) {
  int rc = 0;
  auto p = [&](const std::string& name, int rows, int cols, int fan_in, std::uint32_t flags) {
    if (rc == 0) rc = ctx.param(pname(prefix, name).c_str(), rows, cols, fan_in, flags);
  };
  const std::uint32_t start = kParamAlign;  // the first tensor of a block
  const std::uint32_t pad = kParamPadRows;  // the output layers
  p("value.0.weight", d.Hh, d.H2, d.H2, weight_flags | start);
  for (int b = 0; b < d.D; ++b) p("branch." + std::to_string(b) + ".0.weight", d.Hh, d.H2, d.H2, weight_flags);
  p("value.0.bias", d.Hh, 0, d.H2, start);
  for (int b = 0; b < d.D; ++b) p("branch." + std::to_string(b) + ".0.bias", d.Hh, 0, d.H2, 0);
  p("value.1.weight", d.Z, d.Hh, d.Hh, weight_flags | start | pad);
  p("value.1.bias", d.Z, 0, d.Hh, start | pad);
  for (int b = 0; b < d.D; ++b)
    p("branch." + std::to_string(b) + ".1.weight", d.az(), d.Hh, d.Hh, weight_flags | (b == 0 ? start : 0) | pad);
  for (int b = 0; b < d.D; ++b) p("branch." + std::to_string(b) + ".1.bias", d.az(), 0, d.Hh, (b == 0 ? start : 0) | pad);
  return rc;
}

/// The names of the parameters of one layer of the head under `prefix`: layer 0 the hidden layers
/// (value and branch weights and biases), layer 1 the output layers. For stage declarations:
/// "grad/<head>/<name>" is that tensor's gradient.
inline std::vector<std::string> layer_params(const std::string& prefix, const Dims& d, int layer) {
  const std::string l = std::to_string(layer);
  std::vector<std::string> names{pname(prefix, "value." + l + ".weight"), pname(prefix, "value." + l + ".bias")};
  for (int b = 0; b < d.D; ++b) {
    names.push_back(pname(prefix, "branch." + std::to_string(b) + "." + l + ".weight"));
    names.push_back(pname(prefix, "branch." + std::to_string(b) + "." + l + ".bias"));
  }
  return names;
}

/// The head's parameters as concatenated blocks (online, target or a gradient).
struct Params {
  Real w1;   ///< [(1+D)Hh, H2]
  Real b1;   ///< [(1+D)Hh]
  Real wv2;  ///< [Z, Hh] (wv2_rows rows stored)
  Real bv2;  ///< [Z] (wv2_rows stored)
  Real wb2;  ///< D × [A·Z, Hh], wb2_rows·Hh apart
  Real bb2;  ///< D × [A·Z], wb2_rows apart
};

enum class Which { online, target, grad, act };  ///< act: the acting snapshot (Resolver::act_param)

inline Params resolve(const Resolver& r, const std::string& prefix, Which which) {
  auto get = [&](const std::string& n) {
    const std::string full = pname(prefix, n);
    return which == Which::online ? r.param(full.c_str())
         : which == Which::target ? r.target(full.c_str())
         : which == Which::act    ? r.act_param(full.c_str())
                                  : r.grad(full.c_str());
  };
  return Params{get("value.0.weight"), get("value.0.bias"), get("value.1.weight"),
                get("value.1.bias"), get("branch.0.1.weight"), get("branch.0.1.bias")};
}

/// Activation buffers of one forward pass over `rows` rows.
struct Acts {
  Real hidden;  ///< [rows, (1+D)Hh] post-ReLU
  Real v;       ///< [rows, ldz]
  Real adv;     ///< [rows, D, ldaz] (the first A·Z of each block)
  Real logits;  ///< [rows, D, A, Z] (unused by forward: the fused distribution op needs none)
  Real logp;    ///< [rows, D, A, Z] (null: stop after the value and advantage layers)
  Real q;       ///< [rows, D, A] (may be null: not computed)
  std::int32_t* a_star = nullptr;  ///< argmax_a q of rows ≥ star_from, [rows − star_from, D] (may be null)
  int star_from = 0;
};

/// Forward over `rows` rows of h2 [rows, H2]: the backend's head_forward (one fused kernel on
/// CUDA in tf32; the three GEMMs and dueling_dist elsewhere).
inline void forward(Backend& be, const Dims& d, const Params& p, Real h2, int rows, const Acts& a) {
  HeadForward f;
  f.x = h2; f.ldx = d.H2;
  f.w1 = p.w1; f.b1 = p.b1; f.wv2 = p.wv2; f.bv2 = p.bv2; f.wb2 = p.wb2; f.bb2 = p.bb2;
  f.hidden = a.hidden; f.v = a.v; f.ldv = d.ldz(); f.adv = a.adv; f.ldadv = d.ldaz();
  f.wv2_rows = d.wv2_rows(); f.wb2_rows = d.wb2_rows();
  f.logp = a.logp; f.q = a.q; f.a_star = a.a_star; f.star_from = a.star_from;
  f.rows = rows; f.H2 = d.H2; f.Hh = d.Hh; f.D = d.D; f.A = d.A; f.Z = d.Z; f.v_min = d.v_min; f.v_max = d.v_max;
  be.head_forward(f);
}

/// Scratch of one backward pass over B rows.
struct BackScratch {
  Real dv;       ///< [B, ldz]
  Real dadv;     ///< [B, D, ldaz]
  Real dhidden;  ///< [B, (1+D)Hh]
};

/// The input side of the backward from the dueling gradients s.dv [B, ldz] and s.dadv [B, D, ldaz]:
/// s.dhidden (ReLU-masked, the backend's head_backward_inputs) and dh2 = beta_dh2·dh2 + ∂L/∂h2
/// [B, H2]. `a` holds the forward activations of those B rows. The hidden layers' bias gradient
/// is backward_weights' (it needs only the masked s.dhidden).
inline void backward_inputs(Backend& be, const Dims& d, const Params& p, int B, const Acts& a, const BackScratch& s,
                            Real dh2, float beta_dh2) {
  const int hc = d.hidden_cols();
  HeadBackward hb;
  hb.dv = s.dv; hb.lddv = d.ldz(); hb.dadv = s.dadv; hb.lddadv = d.ldaz(); hb.wv2 = p.wv2; hb.wb2 = p.wb2;
  hb.hidden = a.hidden; hb.dhidden = s.dhidden;
  hb.rows = B; hb.Hh = d.Hh; hb.D = d.D; hb.A = d.A; hb.Z = d.Z; hb.wb2_rows = d.wb2_rows();
  be.head_backward_inputs(hb);
  Gemm gh;  // dh2 = dhidden · W1
  gh.m = B; gh.n = d.H2; gh.k = hc;
  gh.a = s.dhidden; gh.lda = hc; gh.b = p.w1; gh.ldb = d.H2; gh.beta = beta_dh2; gh.c = dh2; gh.ldc = d.H2;
  gh.weight_operand = 2;
  be.gemm(gh);
}

/// The output layers' weight side: the gradients of bv2, bb2, Wv2 and Wb2 (overwriting), from
/// s.dv and s.dadv alone (so it can run beside backward_inputs).
inline void backward_weights_out(Backend& be, const Dims& d, const Params& grad, int B, const Acts& a,
                                 const BackScratch& s) {
  const int hc = d.hidden_cols(), az = d.az(), laz = d.ldaz(), azr = d.wb2_rows();
  be.relu_bias_grad(s.dv, Real{}, grad.bv2, B, d.Z, d.ldz(), 1, 0, 0, 0);
  be.relu_bias_grad(s.dadv, Real{}, grad.bb2, B, az, d.D * laz, d.D, laz, 0, azr);  // a "head" per branch
  Gemm gw;  // dWv2 = dvᵀ · hv
  gw.ta = true; gw.m = d.Z; gw.n = d.Hh; gw.k = B;
  gw.a = s.dv; gw.lda = d.ldz(); gw.b = a.hidden; gw.ldb = hc; gw.c = grad.wv2; gw.ldc = d.Hh;
  be.gemm(gw);
  Gemm gbw;  // dWb2_d = dadv_dᵀ · hb_d
  gbw.ta = true; gbw.m = az; gbw.n = d.Hh; gbw.k = B;
  gbw.a = s.dadv; gbw.lda = d.D * laz; gbw.stride_a = laz;
  gbw.b = a.hidden + d.Hh; gbw.ldb = hc; gbw.stride_b = d.Hh;
  gbw.c = grad.wb2; gbw.ldc = d.Hh; gbw.stride_c = std::int64_t(azr) * d.Hh;  // the zero rows' gradient stays 0
  gbw.batch = d.D;
  be.gemm(gbw);
}

/// The hidden layers' weight side: the gradients of b1 and W1 (overwriting), from the masked
/// s.dhidden of backward_inputs. Independent of dh2, so it can run beside the trunk's backward.
inline void backward_weights_hidden(Backend& be, const Dims& d, const Params& grad, Real h2, int B,
                                    const BackScratch& s) {
  const int hc = d.hidden_cols();
  be.relu_bias_grad(s.dhidden, Real{}, grad.b1, B, hc, hc, 1, 0, 0, 0);  // already masked: column sums
  Gemm g1;  // dW1 = dhiddenᵀ · h2
  g1.ta = true; g1.m = hc; g1.n = d.H2; g1.k = B;
  g1.a = s.dhidden; g1.lda = hc; g1.b = h2; g1.ldb = d.H2; g1.c = grad.w1; g1.ldc = d.H2;
  be.gemm(g1);
}

/// The weight side: every bias and weight gradient of the head (overwriting), from s.dv, s.dadv
/// and the masked s.dhidden of backward_inputs.
inline void backward_weights(Backend& be, const Dims& d, const Params& grad, Real h2, int B, const Acts& a,
                             const BackScratch& s) {
  backward_weights_hidden(be, d, grad, h2, B, s);
  backward_weights_out(be, d, grad, B, a, s);
}

/// The network under `prefix` in an exported policy (PluginDescriptor::export_policy): the trunk's
/// output → the dueling outputs v + adv − mean_a adv, float [rows, D, A, Z], as forward computes
/// them (the head turns them into Q: a softmax over the support for C51, a mean of quantiles for
/// QR-DQN). Values are named "<prefix>/…".
inline std::string export_dueling(const GraphBuilder& g, const std::string& prefix, const Dims& d) {
  const std::string h = g.g.trunk_output();
  const std::int64_t A = d.A, Z = d.Z;
  const std::string hv = g.node("Relu", {g.dense(h, prefix + ".value.0", prefix + "/value.0")}, prefix + "/value.0/relu");
  const std::string v = g.node("Reshape", {g.dense(hv, prefix + ".value.1", prefix + "/v"),
                                           g.constant_i64(prefix + "/shape_v", {-1, 1, 1, Z}, {4})},
                               prefix + "/v4");
  std::vector<std::string> advs;
  for (int b = 0; b < d.D; ++b) {
    const std::string layer = prefix + ".branch." + std::to_string(b), o = prefix + "/branch." + std::to_string(b);
    const std::string hb = g.node("Relu", {g.dense(h, layer + ".0", o + ".0")}, o + ".0/relu");
    advs.push_back(g.node("Reshape", {g.dense(hb, layer + ".1", o + ".1"), g.constant_i64(o + "/shape", {-1, 1, A, Z}, {4})},
                          o + "/adv"));
  }
  const std::string adv = d.D == 1 ? advs[0] : g.node("Concat", advs, prefix + "/adv", {GraphBuilder::attr("axis", 1)});
  const std::vector<std::int64_t> actions_axis{2};
  const std::string mean = g.node("ReduceMean", {adv}, prefix + "/adv_mean",
                                  {GraphBuilder::attr_ints("axes", actions_axis), GraphBuilder::attr("keepdims", 1)});
  return g.node("Add", {v, g.node("Sub", {adv, mean}, prefix + "/adv_centred")}, prefix + "/dueling");
}

}  // namespace dqn::bdq
