/** @file trunk_stages.cpp
 *  @brief The trunk's buffers, stages and math (trunk_stages.hpp).
 */
#include "core/trunk_stages.hpp"

#include <string>

namespace dqn {

namespace {
/// Layer i's online and target activation names (the last layer's are the heads' inputs).
std::string online_act(int i, int L) { return i == L - 1 ? std::string(buf::h2) : "trunk/a" + std::to_string(i); }
std::string target_act(int i, int L) { return i == L - 1 ? std::string(buf::target_h2) : "target/a" + std::to_string(i); }
/// Layer i's gradient over every head's rows (the last layer's is the heads' ∂L/∂h2, stacked).
std::string layer_grad(int i, int L) { return i == L - 1 ? std::string("dtrunk/all") : "trunk/dz" + std::to_string(i); }
std::string param(int i, const char* what) { return "trunk." + std::to_string(i) + "." + what; }
}  // namespace

void TrunkStages::declare_params(StepBuild& b) {
  net_ = b.net;
  for (int i = 0; i < net_.trunk_layers; ++i) {
    const int in = i == 0 ? net_.state : net_.trunk[i - 1];
    b.reg.declare_param(param(i, "weight"), net_.trunk[i], in, in, kParamSpectralNorm | kParamAlign, "engine");
    b.reg.declare_param(param(i, "bias"), net_.trunk[i], 0, in, kParamAlign, "engine");
  }
}

void TrunkStages::declare_buffers(StepBuild& b) {
  B_ = b.spec.batch;
  H_ = int(b.heads.size());
  const std::int64_t B = B_, H = H_;
  const int L = net_.trunk_layers;
  for (int i = 0; i < L; ++i) {
    const std::int64_t w = net_.trunk[i];
    b.reg.declare(online_act(i, L), DType::real, {2 * B, w}, BufferKind::activation, "engine");
    b.reg.declare(target_act(i, L), DType::real, {B, w}, BufferKind::activation, "engine");
    if (i < L - 1) b.reg.declare(layer_grad(i, L), DType::real, {H * B, w}, BufferKind::scratch, "engine");
  }
  // Every head's ∂L/∂h2 in one block, so the trunk backward runs once for all heads.
  const std::int64_t H2 = net_.h2();
  b.reg.declare("dtrunk/all", DType::real, {H * B, H2}, BufferKind::gradient, "engine");
  for (std::size_t h = 0; h < b.heads.size(); ++h)
    b.reg.declare_view("dtrunk/" + b.heads[h], "dtrunk/all", std::int64_t(h) * B * H2, {B, H2}, "engine");
}

// The online trunk a stage per layer (trunk.forward.<i>), the target's one stage: two roots of the
// step's graph that start in no fixed order.
void TrunkStages::add_front_stages(StepBuild& b) {
  const int L = net_.trunk_layers;
  std::vector<std::string> tacts;
  for (int i = 0; i < L; ++i) tacts.push_back(target_act(i, L));
  for (int i = 0; i < L; ++i) {
    std::vector<std::string> reads{i == 0 ? std::string(buf::states2) : online_act(i - 1, L), "params"};
    b.stages.push_back(Stage{"trunk.forward." + std::to_string(i), "engine", reads, {online_act(i, L)},
                             [this, i](Backend& be) { be.gemm(layer_gemm(i, false)); }});
  }
  b.stages.push_back(Stage{"target.trunk.forward", "engine", {buf::states2, "target"}, tacts, [this, L](Backend& be) {
                             for (int i = 0; i < L; ++i) be.gemm(layer_gemm(i, true));
                           }});
}

// One trunk backward for every head: the heads' ∂L/∂h2 stacked [H·B, H2], the top layer's ReLU
// mask in one pass, then per layer d(input) as one GEMM over H·B rows that also applies the layer
// below's mask (Gemm::mask), bias gradients as column sums over every head and dW as one GEMM
// batched over heads. A stage per layer for the input side (trunk.backward.<i>: the top layer's
// mask, d(input); the first layer has none below the top); its bias gradient (trunk.bias.<i>) and
// weight gradient (trunk.weights.<i>) need only the masked gradient and so run beside the layers
// below.
void TrunkStages::add_back_stages(StepBuild& b) {
  const int L = net_.trunk_layers;
  for (int i = L - 1; i >= 0; --i) {
    const std::string li = std::to_string(i);
    const std::string dz_i = layer_grad(i, L);
    const bool top = i == L - 1;
    if (top || i > 0) {
      std::vector<std::string> reads{dz_i}, writes;
      if (top) {
        reads.push_back(online_act(i, L));
        writes.push_back(dz_i);
      }
      if (i > 0) {
        reads.push_back(online_act(i - 1, L));
        reads.push_back("params");
        writes.push_back(layer_grad(i - 1, L));
      }
      b.stages.push_back(Stage{"trunk.backward." + li, "engine", reads, writes,
                               [this, i](Backend& be) { backward_layer(be, i); }});
    }
    std::vector<std::string> bwrites;
    for (const auto& h : b.heads) bwrites.push_back("grad/" + h + "/" + param(i, "bias"));
    b.stages.push_back(Stage{"trunk.bias." + li, "engine", {dz_i}, bwrites, [this, i](Backend& be) { bias_layer(be, i); }});
    std::vector<std::string> wreads{dz_i, i == 0 ? std::string(buf::states2) : online_act(i - 1, L)}, wwrites;
    for (const auto& h : b.heads) wwrites.push_back("grad/" + h + "/" + param(i, "weight"));
    b.stages.push_back(Stage{"trunk.weights." + li, "engine", wreads, wwrites,
                             [this, i](Backend& be) { weights_layer(be, i); }});
  }
}

void TrunkStages::bind(StepBuild& b) {
  const Registry& reg = b.reg;
  const Real params = reg.real("params"), target = reg.real("target"), grads = reg.real("grad/all");
  P_ = reg.param_count();
  states2_ = reg.real(buf::states2);
  const int L = net_.trunk_layers;
  for (int i = 0; i < L; ++i) {
    w_.push_back(reg.param_in(params, param(i, "weight")));
    b_.push_back(reg.param_in(params, param(i, "bias")));
    tw_.push_back(reg.param_in(target, param(i, "weight")));
    tb_.push_back(reg.param_in(target, param(i, "bias")));
    a_.push_back(reg.real(online_act(i, L)));
    ta_.push_back(reg.real(target_act(i, L)));
    dz_.push_back(reg.real(layer_grad(i, L)));
    gw_.push_back(reg.param_in(grads, param(i, "weight")));
    gb_.push_back(reg.param_in(grads, param(i, "bias")));
  }
}

Gemm TrunkStages::layer_gemm(int i, bool target) const {
  const auto& a = target ? ta_ : a_;
  Gemm g;
  g.tb = true; g.m = target ? B_ : 2 * B_; g.n = net_.trunk[i]; g.k = i == 0 ? net_.state : net_.trunk[i - 1];
  g.a = i > 0 ? a[std::size_t(i - 1)] : target ? states2_ + std::int64_t(B_) * net_.state : states2_;
  g.lda = g.k; g.b = (target ? tw_ : w_)[std::size_t(i)]; g.ldb = g.k; g.c = a[std::size_t(i)]; g.ldc = g.n;
  g.weight_operand = 2;
  g.bias = (target ? tb_ : b_)[std::size_t(i)]; g.act = Act::relu;  // fused epilogue
  return g;
}

// Backprop every head's gradient (rows of `states`) through trunk layer i: at the top layer
// (dtrunk/all: the heads' ∂L_h/∂h_L) its ReLU mask first; below the first layer, d(input) with
// the layer below's mask applied (so its gradient arrives masked).
void TrunkStages::backward_layer(Backend& be, int i) const {
  const int w = net_.trunk[i];
  const int in_w = i == 0 ? net_.state : net_.trunk[i - 1];
  if (i == net_.trunk_layers - 1) top_mask(be, i);
  if (i == 0) return;
  Gemm gx;  // d(in) = dz · W over all H·B rows, masked by layer i − 1's activation (period B rows)
  gx.m = H_ * B_; gx.n = in_w; gx.k = w;
  gx.a = dz_[std::size_t(i)]; gx.lda = w; gx.b = w_[std::size_t(i)]; gx.ldb = in_w;
  gx.c = dz_[std::size_t(i - 1)]; gx.ldc = in_w;
  gx.weight_operand = 2;
  gx.mask = a_[std::size_t(i - 1)]; gx.ldmask = in_w; gx.mask_rows = B_;
  be.gemm(gx);
}

// The top layer's ReLU mask on every head's ∂L/∂h (rows 0..B of the 2B activation block are
// `states`: the same mask for every head).
void TrunkStages::top_mask(Backend& be, int i) const {
  const int w = net_.trunk[i];
  be.relu_bias_grad(dz_[std::size_t(i)], a_[std::size_t(i)], Real{}, B_, w, w, H_, std::int64_t(B_) * w, 0, 0);
}

// db_h = Σ_rows dz_h of trunk layer i from its masked gradient, every head in one op (grad/all
// rows are P apart).
void TrunkStages::bias_layer(Backend& be, int i) const {
  const int w = net_.trunk[i];
  be.relu_bias_grad(dz_[std::size_t(i)], Real{}, gb_[std::size_t(i)], B_, w, w, H_, std::int64_t(B_) * w, 0, P_);
}

// dW_h = dz_hᵀ · in of trunk layer i from its masked gradient, batched over heads (grad/all rows
// are P apart).
void TrunkStages::weights_layer(Backend& be, int i) const {
  const int w = net_.trunk[i];
  const int in_w = i == 0 ? net_.state : net_.trunk[i - 1];
  Gemm gw;
  gw.ta = true; gw.m = w; gw.n = in_w; gw.k = B_;
  gw.a = dz_[std::size_t(i)]; gw.lda = w; gw.stride_a = std::int64_t(B_) * w;
  gw.b = i == 0 ? states2_ : a_[std::size_t(i - 1)]; gw.ldb = in_w; gw.stride_b = 0;
  gw.c = gw_[std::size_t(i)]; gw.ldc = in_w; gw.stride_c = P_;
  gw.batch = H_;
  be.gemm(gw);
}

}  // namespace dqn
