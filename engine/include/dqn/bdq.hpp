/** @file bdq.hpp
 *  @brief The distributional dueling branching head (spec "Network"), forward and backward,
 *  written once against the op table. Shared by the c51 plugin and the ensemble members.
 *
 *  Layout trick: the value and branch hidden layers are declared back to back, so their weights
 *  form one [(1+D)·Hh, H2] matrix and one GEMM computes all of them; the D branch output layers
 *  run as one strided-batched GEMM.
 */
#pragma once

#include <string>

#include "dqn/backend.hpp"
#include "dqn/head.hpp"

namespace dqn::bdq {

struct Dims {
  int H2 = 0, Hh = 0, D = 0, A = 0, Z = 0;
  float v_min = -10.0f, v_max = 10.0f;
  int hidden_cols() const { return (1 + D) * Hh; }
  int az() const { return A * Z; }
};

inline Dims dims_of(const NetworkDims& n) {
  return Dims{n.h2(), n.head_hidden, n.branches, n.actions, n.atoms, n.v_min, n.v_max};
}

inline std::string pname(const std::string& prefix, const std::string& rest) { return prefix + "." + rest; }

/// Declares the head's parameters under `prefix` ("c51", "ensemble.0") in the contiguous order
/// the forward relies on. flags go to every weight matrix (spectral norm for the primary).
inline int declare_params(BuildContext& ctx, const std::string& prefix, const Dims& d, std::uint32_t weight_flags) {
  int rc = 0;
  auto p = [&](const std::string& name, int rows, int cols, int fan_in, std::uint32_t flags) {
    if (rc == 0) rc = ctx.param(pname(prefix, name).c_str(), rows, cols, fan_in, flags);
  };
  p("value.0.weight", d.Hh, d.H2, d.H2, weight_flags);
  for (int b = 0; b < d.D; ++b) p("branch." + std::to_string(b) + ".0.weight", d.Hh, d.H2, d.H2, weight_flags);
  p("value.0.bias", d.Hh, 0, d.H2, 0);
  for (int b = 0; b < d.D; ++b) p("branch." + std::to_string(b) + ".0.bias", d.Hh, 0, d.H2, 0);
  p("value.1.weight", d.Z, d.Hh, d.Hh, weight_flags);
  p("value.1.bias", d.Z, 0, d.Hh, 0);
  for (int b = 0; b < d.D; ++b) p("branch." + std::to_string(b) + ".1.weight", d.az(), d.Hh, d.Hh, weight_flags);
  for (int b = 0; b < d.D; ++b) p("branch." + std::to_string(b) + ".1.bias", d.az(), 0, d.Hh, 0);
  return rc;
}

/// The head's parameters as concatenated blocks (online, target or a gradient).
struct Params {
  Real w1;   ///< [(1+D)Hh, H2]
  Real b1;   ///< [(1+D)Hh]
  Real wv2;  ///< [Z, Hh]
  Real bv2;  ///< [Z]
  Real wb2;  ///< D × [A·Z, Hh]
  Real bb2;  ///< [D·A·Z]
};

enum class Which { online, target, grad };

inline Params resolve(const Resolver& r, const std::string& prefix, Which which) {
  auto get = [&](const std::string& n) {
    const std::string full = pname(prefix, n);
    return which == Which::online ? r.param(full.c_str())
         : which == Which::target ? r.target(full.c_str())
                                  : r.grad(full.c_str());
  };
  return Params{get("value.0.weight"), get("value.0.bias"), get("value.1.weight"),
                get("value.1.bias"), get("branch.0.1.weight"), get("branch.0.1.bias")};
}

/// Activation buffers of one forward pass over `rows` rows.
struct Acts {
  Real hidden;  ///< [rows, (1+D)Hh] post-ReLU
  Real v;       ///< [rows, Z]
  Real adv;     ///< [rows, D, A, Z]
  Real logits;  ///< [rows, D, A, Z] (unused by forward: the fused distribution op needs none)
  Real logp;    ///< [rows, D, A, Z] (null: stop after the value and advantage layers)
  Real q;       ///< [rows, D, A] (may be null: not computed)
  std::int32_t* a_star = nullptr;  ///< argmax_a q of rows ≥ star_from, [rows − star_from, D] (may be null)
  int star_from = 0;
};

/// Forward over `rows` rows of h2 [rows, H2].
inline void forward(Backend& be, const Dims& d, const Params& p, Real h2, int rows, const Acts& a) {
  const int hc = d.hidden_cols(), az = d.az();
  Gemm g;  // hidden = relu(h2 · W1ᵀ + b1), bias and ReLU fused into the GEMM
  g.tb = true; g.m = rows; g.n = hc; g.k = d.H2;
  g.a = h2; g.lda = d.H2; g.b = p.w1; g.ldb = d.H2; g.c = a.hidden; g.ldc = hc; g.weight_operand = 2;
  g.bias = p.b1; g.act = Act::relu;
  be.gemm(g);

  Gemm gv;  // v = hv · Wv2ᵀ + bv2
  gv.tb = true; gv.m = rows; gv.n = d.Z; gv.k = d.Hh;
  gv.a = a.hidden; gv.lda = hc; gv.b = p.wv2; gv.ldb = d.Hh; gv.c = a.v; gv.ldc = d.Z; gv.weight_operand = 2;
  gv.bias = p.bv2;
  be.gemm(gv);

  Gemm gb;  // adv_d = hb_d · Wb2_dᵀ + bb2_d, all branches in one batched GEMM
  gb.tb = true; gb.m = rows; gb.n = az; gb.k = d.Hh;
  gb.a = a.hidden + d.Hh; gb.lda = hc; gb.stride_a = d.Hh;
  gb.b = p.wb2; gb.ldb = d.Hh; gb.stride_b = std::int64_t(az) * d.Hh;
  gb.c = a.adv; gb.ldc = d.D * az; gb.stride_c = az;
  gb.batch = d.D; gb.weight_operand = 2;
  gb.bias = p.bb2; gb.stride_bias = az;  // the D branch biases are contiguous
  be.gemm(gb);

  if (!a.logp) return;  // outputs only (the C51 loss fuses the target head's distribution)
  DuelingDist dd;
  dd.logp = a.logp; dd.q = a.q; dd.v = a.v; dd.ldv = d.Z; dd.adv = a.adv;
  dd.a_star = a.a_star; dd.star_from = a.star_from;
  dd.rows = rows; dd.D = d.D; dd.A = d.A; dd.Z = d.Z; dd.v_min = d.v_min; dd.v_max = d.v_max;
  be.dueling_dist(dd);
}

/// Scratch of one backward pass over B rows.
struct BackScratch {
  Real dv;       ///< [B, Z]
  Real dadv;     ///< [B, D, A, Z]
  Real dhidden;  ///< [B, (1+D)Hh]
};

/// The input side of the backward from the dueling gradients s.dv [B, Z] and s.dadv [B, D, A, Z]:
/// s.dhidden (ReLU-masked), the hidden layers' bias gradient and dh2 = beta_dh2·dh2 + ∂L/∂h2
/// [B, H2]. `a` holds the forward activations of those B rows.
inline void backward_inputs(Backend& be, const Dims& d, const Params& p, const Params& grad, int B, const Acts& a,
                            const BackScratch& s, Real dh2, float beta_dh2) {
  const int hc = d.hidden_cols(), az = d.az();
  Gemm gx;  // dhv = dv · Wv2
  gx.m = B; gx.n = d.Hh; gx.k = d.Z;
  gx.a = s.dv; gx.lda = d.Z; gx.b = p.wv2; gx.ldb = d.Hh; gx.c = s.dhidden; gx.ldc = hc; gx.weight_operand = 2;
  be.gemm(gx);
  Gemm gbx;  // dhb_d = dadv_d · Wb2_d, batched over d
  gbx.m = B; gbx.n = d.Hh; gbx.k = az;
  gbx.a = s.dadv; gbx.lda = d.D * az; gbx.stride_a = az;
  gbx.b = p.wb2; gbx.ldb = d.Hh; gbx.stride_b = std::int64_t(az) * d.Hh;
  gbx.c = s.dhidden + d.Hh; gbx.ldc = hc; gbx.stride_c = d.Hh;
  gbx.batch = d.D; gbx.weight_operand = 2;
  be.gemm(gbx);
  // hidden layers (value and branches as one matrix)
  be.relu_bias_grad(s.dhidden, a.hidden, grad.b1, B, hc, hc, 1, 0, 0, 0);
  Gemm gh;  // dh2 = dhidden · W1
  gh.m = B; gh.n = d.H2; gh.k = hc;
  gh.a = s.dhidden; gh.lda = hc; gh.b = p.w1; gh.ldb = d.H2; gh.beta = beta_dh2; gh.c = dh2; gh.ldc = d.H2;
  gh.weight_operand = 2;
  be.gemm(gh);
}

/// The weight side: the output layers' bias gradients and every weight gradient (overwriting),
/// from s.dv, s.dadv and the masked s.dhidden of backward_inputs. Independent of dh2, so it can
/// run beside the trunk's backward.
inline void backward_weights(Backend& be, const Dims& d, const Params& grad, Real h2, int B, const Acts& a,
                             const BackScratch& s) {
  const int hc = d.hidden_cols(), az = d.az();
  be.relu_bias_grad(s.dv, Real{}, grad.bv2, B, d.Z, d.Z, 1, 0, 0, 0);
  be.relu_bias_grad(s.dadv, Real{}, grad.bb2, B, d.D * az, d.D * az, 1, 0, 0, 0);
  Gemm gw;  // dWv2 = dvᵀ · hv
  gw.ta = true; gw.m = d.Z; gw.n = d.Hh; gw.k = B;
  gw.a = s.dv; gw.lda = d.Z; gw.b = a.hidden; gw.ldb = hc; gw.c = grad.wv2; gw.ldc = d.Hh;
  be.gemm(gw);
  Gemm gbw;  // dWb2_d = dadv_dᵀ · hb_d
  gbw.ta = true; gbw.m = az; gbw.n = d.Hh; gbw.k = B;
  gbw.a = s.dadv; gbw.lda = d.D * az; gbw.stride_a = az;
  gbw.b = a.hidden + d.Hh; gbw.ldb = hc; gbw.stride_b = d.Hh;
  gbw.c = grad.wb2; gbw.ldc = d.Hh; gbw.stride_c = std::int64_t(az) * d.Hh;
  gbw.batch = d.D;
  be.gemm(gbw);
  Gemm g1;  // dW1 = dhiddenᵀ · h2
  g1.ta = true; g1.m = hc; g1.n = d.H2; g1.k = B;
  g1.a = s.dhidden; g1.lda = hc; g1.b = h2; g1.ldb = d.H2; g1.c = grad.w1; g1.ldc = d.H2;
  be.gemm(g1);
}

/// Backward from the dueling gradients: backward_inputs then backward_weights.
inline void backward_from_dueling(Backend& be, const Dims& d, const Params& p, const Params& grad, Real h2,
                                  int B, const Acts& a, const BackScratch& s, Real dh2, float beta_dh2) {
  backward_inputs(be, d, p, grad, B, a, s, dh2, beta_dh2);
  backward_weights(be, d, grad, h2, B, a, s);
}

/// Backward from dlogits [B, D, A, Z] (through the dueling combine first); see
/// backward_from_dueling.
inline void backward(Backend& be, const Dims& d, const Params& p, const Params& grad, Real h2, int B,
                     const Acts& a, Real dlogits, const BackScratch& s, Real dh2, float beta_dh2) {
  be.dueling_backward(s.dv, d.Z, s.dadv, dlogits, B, d.D, d.A, d.Z);
  backward_from_dueling(be, d, p, grad, h2, B, a, s, dh2, beta_dh2);
}

}  // namespace dqn::bdq
