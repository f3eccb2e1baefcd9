// The engine: step construction (registry + stages + schedule), trunk, budgets/Adam/SN/target,
// capture and replay, checkpoints and reports.
#include "core/engine.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <stdexcept>

#include "core/philox.h"
#include "pipeline/parse.hpp"
#include "spdlog/spdlog.h"

namespace dqn {

namespace {
std::vector<std::string> to_strings(const char* const* p, std::uint32_t n) {
  std::vector<std::string> out;
  for (std::uint32_t i = 0; i < n; ++i) out.emplace_back(p[i] ? p[i] : "");
  return out;
}
}  // namespace

// ---------------------------------------------------------------------------------------------
// Build-time context handed to heads.
struct Engine::BuildCtx final : BuildContext {
  Engine& e;
  std::size_t head;
  std::string owner;
  std::string message;
  BuildCtx(Engine& en, std::size_t h, std::string o) : e(en), head(h), owner(std::move(o)) {}

  const NetworkDims& net() const noexcept override { return e.net_; }
  std::int32_t batch() const noexcept override { return e.spec_.batch; }
  int param(const char* name, std::int32_t rows, std::int32_t cols, std::int32_t fan_in,
            std::uint32_t flags) noexcept override {
    try {
      e.reg_.declare_param(name, rows, cols, fan_in, flags, owner);
      return 0;
    } catch (const std::exception& ex) {
      return fail(ex.what());
    }
  }
  int buffer(const char* name, DType dtype, const std::int64_t* shape, std::int32_t rank,
             BufferKind kind) noexcept override {
    try {
      e.reg_.declare(name, dtype, std::vector<std::int64_t>(shape, shape + rank), kind, owner);
      return 0;
    } catch (const std::exception& ex) {
      return fail(ex.what());
    }
  }
  int stage(const StageDesc& d) noexcept override { return add(d, e.stages_); }
  std::int32_t act_rows() const noexcept override { return e.act_rows_; }
  std::int64_t batch_offset() const noexcept override { return std::int64_t(e.opt_.rank) * e.spec_.batch; }
  /// The act stages of an auxiliary are accepted and never run (only the primary acts).
  int act_stage(const StageDesc& d) noexcept override {
    std::vector<Stage> dropped;
    return add(d, head == e.primary_ ? e.act_stages_ : dropped);
  }
  int add(const StageDesc& d, std::vector<Stage>& to) noexcept {
    try {
      Stage s;
      s.name = d.name ? d.name : "";
      s.owner = owner;
      s.reads = to_strings(d.reads, d.n_reads);
      s.writes = to_strings(d.writes, d.n_writes);
      Head* h = e.heads_[head].get();
      const std::int32_t tag = d.tag;
      s.run = [h, tag](Backend& be) { h->run(tag, be); };
      to.push_back(std::move(s));
      return 0;
    } catch (const std::exception& ex) {
      return fail(ex.what());
    }
  }
  int fail(const char* m) noexcept override {
    if (message.empty()) message = m ? m : "unknown error";
    return 1;
  }
};

// Bind-time resolution for one head: registry lookups, errors kept with the head's name.
struct Engine::HeadResolver final : Resolver {
  const Engine& e;
  std::size_t head;
  mutable std::string message;
  HeadResolver(const Engine& en, std::size_t h) : e(en), head(h) {}

  template <class F>
  auto guard(F&& f, decltype(f()) fallback) const noexcept -> decltype(f()) {
    try {
      return f();
    } catch (const std::exception& ex) {
      if (message.empty()) message = ex.what();
      return fallback;
    }
  }
  Real real(const char* n) const noexcept override { return guard([&] { return e.reg_.real(n); }, Real{}); }
  std::int32_t* i32(const char* n) const noexcept override {
    return guard([&] { return e.reg_.i32(n); }, static_cast<std::int32_t*>(nullptr));
  }
  std::int64_t* i64(const char* n) const noexcept override {
    return guard([&] { return e.reg_.i64(n); }, static_cast<std::int64_t*>(nullptr));
  }
  Real param(const char* n) const noexcept override { return guard([&] { return e.reg_.param_in(e.params_, n); }, Real{}); }
  Real target(const char* n) const noexcept override { return guard([&] { return e.reg_.param_in(e.target_, n); }, Real{}); }
  Real grad(const char* n) const noexcept override {
    return guard([&] { return e.reg_.param_in(e.grad_all_ + std::int64_t(head) * e.reg_.param_count(), n); }, Real{});
  }
  Real act_param(const char* n) const noexcept override {
    return guard([&] { return e.reg_.param_in(e.act_params_, n); }, Real{});
  }
};

BackendKind resolve_backend(const PipelineSpec& spec, std::optional<BackendKind> override_backend) {
  if (override_backend) return *override_backend;
  if (spec.backend_auto) return cuda_available() ? BackendKind::cuda : BackendKind::cpu;
  return spec.backend;
}

// ---------------------------------------------------------------------------------------------
Engine::Engine(const PipelineSpec& spec, const PluginLoader& plugins, const EngineOptions& opt)
    : spec_(spec), opt_(opt) {
  backend_ = resolve_backend(spec, opt.backend);
  if (backend_ == BackendKind::cuda && opt.f64)
    throw std::invalid_argument("the f64 reference exists on the cpu backend only");
  const auto& n = spec.network;
  if (n.trunk.empty() || int(n.trunk.size()) > kMaxTrunkLayers)
    throw std::invalid_argument("network.trunk must have 1.." + std::to_string(kMaxTrunkLayers) + " layers");
  net_.state = n.state;
  net_.trunk_layers = int(n.trunk.size());
  for (int i = 0; i < net_.trunk_layers; ++i) net_.trunk[i] = n.trunk[i];
  net_.head_hidden = n.head_hidden;
  net_.branches = n.branches;
  net_.actions = n.actions;
  net_.atoms = n.atoms;
  net_.v_min = float(n.v_min);
  net_.v_max = float(n.v_max);
  int device = opt.device;
  if (opt.group) {
    if (opt.rank < 0 || opt.rank >= opt.group->ranks())
      throw std::invalid_argument("rank " + std::to_string(opt.rank) + " outside the group's " +
                                  std::to_string(opt.group->ranks()) + " ranks");
    device = opt.group->devices()[std::size_t(opt.rank)];
  }
  rt_ = backend_ == BackendKind::cuda ? make_cuda_runtime(spec.cuda, spec.precision, device) : make_cpu_runtime(opt.f64);
  build(plugins);
}

Engine::~Engine() {
  if (rt_) {
    try {
      rt_->synchronize();
    } catch (...) {
    }
    for (auto*& p : report_host_)
      if (p) rt_->free_host(p), p = nullptr;
    free_replay_staging();
    free_act_staging();
  }
  rt_.reset();  // the graph goes before the heads and their libraries
  heads_.clear();
}

void Engine::build(const PluginLoader& plugins) {
  const int B = spec_.batch;
  const int L = net_.trunk_layers;
  // Trunk parameters first (engine-owned), then each head's.
  for (int i = 0; i < L; ++i) {
    const int in = i == 0 ? net_.state : net_.trunk[i - 1];
    const std::string p = "trunk." + std::to_string(i);
    reg_.declare_param(p + ".weight", net_.trunk[i], in, in, kParamSpectralNorm | kParamAlign, "engine");
    reg_.declare_param(p + ".bias", net_.trunk[i], 0, in, kParamAlign, "engine");
  }

  // Heads: create from their plugins with resolved parameters and budgets.
  std::vector<std::vector<std::string>> storage;
  for (std::size_t i = 0; i < spec_.heads.size(); ++i) {
    const HeadSpec& hs = spec_.heads[i];
    if (!hs.enabled) continue;
    const PluginDescriptor* d = plugins.find(hs.plugin);
    if (!d)
      throw PipelineError(hs.plugin_loc, "heads[" + std::to_string(i) + "].plugin", hs.plugin,
                          "plugin not found (search path: " + plugins.search_path() + ")");
    storage.emplace_back();
    std::vector<ParamValue> values = resolve_head_params(hs, *d, storage.back());
    const double f = resolved_budget(spec_, i);
    HeadCreateInfo info{};
    const std::string inst = hs.name.empty() ? hs.plugin : hs.name;
    info.instance = inst.c_str();
    info.role = hs.role;
    info.budget = f;
    info.net = &net_;
    info.batch = B;
    info.gamma_n = float(spec_.gamma_n());
    info.seed = spec_.seed;
    info.params = values.data();
    info.n_params = std::uint32_t(values.size());
    if (hs.role == Role::primary) primary_ = heads_.size();
    heads_.push_back(plugins.create(hs.plugin, info));
    head_names_.push_back(inst);
    fractions_.push_back(f);
  }
  if (heads_.empty()) throw std::invalid_argument("pipeline has no enabled head");

  act_rows_ = std::max({1, spec_.training.num_envs, spec_.training.eval.episodes});
  declare_engine_buffers();
  declare_replay_buffers();
  declare_act_buffers();
  add_engine_stages_front();
  add_act_stage_front();
  for (std::size_t h = 0; h < heads_.size(); ++h) {
    BuildCtx ctx(*this, h, head_names_[h]);
    if (heads_[h]->declare(ctx) != 0) {
      std::string why = ctx.message.empty() ? heads_[h]->error() : ctx.message;
      throw std::runtime_error("head '" + head_names_[h] + "' (" + heads_[h].plugin().path + "): declare failed: " + why);
    }
  }
  // The flat parameter-shaped buffers can be sized only now that every head has declared.
  const std::int64_t P = reg_.param_count();
  const std::int64_t H = std::int64_t(heads_.size());
  reg_.declare("params", DType::real, {P}, BufferKind::parameter, "engine");
  reg_.declare("target", DType::real, {P}, BufferKind::parameter, "engine");
  reg_.declare("adam.m", DType::real, {P}, BufferKind::optimizer, "engine");
  reg_.declare("adam.v", DType::real, {P}, BufferKind::optimizer, "engine");
  reg_.declare("grad/all", DType::real, {H, P}, BufferKind::gradient, "engine");
  reg_.declare("grad/total", DType::real, {P}, BufferKind::gradient, "engine");
  declare_act_snapshot();
  // Per head: its whole gradient row "grad/<head>", and a window of it per parameter,
  // "grad/<head>/<parameter>", for every parameter (a head's gradient may reach another head's
  // parameters: CQL's reaches c51's), so stages that write different tensors of one row (a layer's
  // weight and bias gradients, the input side of a backward and its weight gradients) can say so
  // and run side by side.
  for (std::size_t h = 0; h < heads_.size(); ++h) {
    const std::string g = "grad/" + head_names_[h];
    reg_.declare_view(g, "grad/all", std::int64_t(h) * P, {P}, "engine");
    for (const auto& p : reg_.params())
      reg_.declare_view(g + "/" + p.name, "grad/all", std::int64_t(h) * P + p.offset, {p.numel()}, "engine");
  }
  if (spec_.spectral_norm.enabled) {
    for (const auto& p : reg_.params()) {
      if (!(p.flags & kParamSpectralNorm) || p.cols == 0) continue;
      // Only the trunk and the primary head are normed (docs/step-math.md: 2 + 2 + 2D matrices).
      const bool primary_owned = p.owner == "engine" || p.owner == head_names_[primary_];
      if (!primary_owned) continue;
      const std::string u = "sn.u." + p.name;
      reg_.declare(u, DType::real, {p.rows}, BufferKind::optimizer, "engine");
      sn_params_.emplace_back(p.name, u);
      sn_max_rows_ = std::max(sn_max_rows_, p.rows);
      sn_max_cols_ = std::max(sn_max_cols_, p.cols);
    }
    sn_count_ = int(sn_params_.size());
    const std::int64_t words = (std::int64_t(sn_count_) * std::int64_t(sizeof(SpectralMatrix)) + 7) / 8;
    reg_.declare("sn/table", DType::i64, {std::max<std::int64_t>(words, 1)}, BufferKind::optimizer, "engine");
  }
  add_engine_stages_back();
  add_replay_stage_back();
  add_act_stage_back();
  reg_.declare("budget/reach", DType::i64, {H * kBudgetReach * 2}, BufferKind::optimizer, "engine");

  // The ops index a buffer with 32-bit ints (the replay's own kernels with 64-bit ones).
  for (const std::string& name : reg_.buffer_order()) {
    const auto* b = reg_.find(name);
    if (b->view_of.empty() && name.rfind("replay/", 0) != 0 && b->numel() > std::numeric_limits<std::int32_t>::max())
      throw std::invalid_argument("buffer '" + name + "' (" + b->owner + ") would hold " + std::to_string(b->numel()) +
                                  " elements, more than the 2^31 - 1 the ops index: lower batch or the network's "
                                  "sizes (network.trunk, head_hidden, branches, actions, atoms)");
  }
  reg_.freeze(*rt_);
  bind_engine();
  bind_replay();
  bind_act();
  for (std::size_t h = 0; h < heads_.size(); ++h) {
    HeadResolver r(*this, h);
    if (heads_[h]->bind(r) != 0 || !r.message.empty()) {
      std::string why = r.message.empty() ? heads_[h]->error() : r.message;
      throw std::runtime_error("head '" + head_names_[h] + "': bind failed: " + why);
    }
  }
  order_ = schedule(stages_, reg_);
  schedule(act_stages_, reg_);  // checks the act stages' names (they run in declaration order)

  // Constants in device memory: lr, budget fractions, the spectral-norm table.
  set_lr(spec_.adam.lr);
  set_fractions(fractions_);
  if (sn_count_ > 0) {
    std::vector<SpectralMatrix> table;
    for (std::size_t i = 0; i < sn_params_.size(); ++i) {
      const auto* p = reg_.find_param(sn_params_[i].first);
      table.push_back(SpectralMatrix{params_ + p->offset, sn_u_[i], p->rows, p->cols});
    }
    rt_->ops().upload(sn_table_, table.data(), table.size() * sizeof(SpectralMatrix));
  }
  upload_budget_reach();
  const auto [rb, re] = reg_.report_range();
  report_begin_ = rb;
  report_bytes_ = re - rb;
  for (auto*& p : report_host_) {
    p = static_cast<unsigned char*>(rt_->alloc_host(std::max<std::size_t>(report_bytes_, 8)));
    std::memset(p, 0, std::max<std::size_t>(report_bytes_, 8));
  }
  if (rt_->ops().status() != 0) throw std::runtime_error(std::string("backend error during build: ") + rt_->ops().message());

  // Plan (scratch sizes) of both steps, then capture each once; from here on nothing is looked up.
  if (rt_->captures()) {
    rt_->plan_begin();
    for (auto i : order_) stages_[i].run(rt_->ops());
    for (auto& st : act_stages_) st.run(rt_->ops());
    rt_->plan_end();
    rt_->begin_capture(Runtime::kStepGraph);
    capture_stages();
    rt_->end_capture();
    if (rt_->ops().status() != 0) throw std::runtime_error(std::string("backend error during capture: ") + rt_->ops().message());
    capture_act();
    if (rt_->ops().status() != 0)
      throw std::runtime_error(std::string("backend error during the act step's capture: ") + rt_->ops().message());
    ++captures_;
    captured_ = true;
  }
  reg_.seal();
  spdlog::debug("engine: {} stages, {} parameters, arena {} bytes, backend {}", order_.size(), reg_.param_count(),
                reg_.arena_bytes(), rt_->describe());
}

// Captures the stages in order, spread over the runtime's lanes (plan_lanes: each stage waits
// only for the stages it depends on while lanes last), so stages that share no buffer run
// concurrently inside the one graph.
void Engine::capture_stages() {
  const LanePlan plan = plan_lanes(dependencies(stages_, order_, reg_), rt_->lanes());
  rt_->capture_width(plan.used);
  for (std::size_t k = 0; k < order_.size(); ++k) {
    std::vector<int> after(plan.after[k].begin(), plan.after[k].end());
    rt_->stage_begin(plan.lane[k], after);
    stages_[order_[k]].run(rt_->ops());
    check_capture(stages_[order_[k]]);
    rt_->stage_done(int(k));
  }
  lanes_ = plan;
}

void Engine::check_capture(const Stage& s) {
  const std::string fault = rt_->capture_fault();
  if (fault.empty()) return;
  std::string who = "the engine's stage '" + s.name + "'";
  for (std::size_t h = 0; h < heads_.size(); ++h)
    if (head_names_[h] == s.owner)
      who = "plugin '" + std::string(heads_[h].plugin().descriptor->name) + "' (" + heads_[h].plugin().path +
            "), head '" + s.owner + "', stage '" + s.name + "'";
  throw std::runtime_error(who + " broke the CUDA graph capture: " + fault +
                           ". A stage may only enqueue work on the backend's stream (DeviceContext::stream): "
                           "it must not synchronise, allocate, or copy to or from the host");
}

void Engine::declare_engine_buffers() {
  const std::int64_t B = spec_.batch, S = net_.state, D = net_.branches;
  const std::int64_t H = std::int64_t(heads_.size());
  const int L = net_.trunk_layers;
  const std::int64_t H2 = net_.h2();
  reg_.declare(buf::states2, DType::real, {2 * B, S}, BufferKind::input, "engine");
  reg_.declare(buf::actions, DType::i32, {B, D}, BufferKind::input, "engine");
  reg_.declare(buf::rewards, DType::real, {B}, BufferKind::input, "engine");
  reg_.declare(buf::dones, DType::real, {B}, BufferKind::input, "engine");
  reg_.declare(buf::is_weights, DType::real, {B}, BufferKind::input, "engine");
  for (int i = 0; i < L; ++i) {
    const bool last = i == L - 1;
    const std::string online = last ? std::string(buf::h2) : "trunk/a" + std::to_string(i);
    const std::string target = last ? std::string(buf::target_h2) : "target/a" + std::to_string(i);
    const std::int64_t w = net_.trunk[i];
    reg_.declare(online, DType::real, {2 * B, w}, BufferKind::activation, "engine");
    reg_.declare(target, DType::real, {B, w}, BufferKind::activation, "engine");
    if (!last)  // the last layer's gradient is dtrunk/all
      reg_.declare("trunk/dz" + std::to_string(i), DType::real, {H * B, net_.trunk[i]}, BufferKind::scratch, "engine");
  }
  reg_.declare(buf::step, DType::i64, {1}, BufferKind::optimizer, "engine");
  reg_.declare("opt/lr", DType::real, {1}, BufferKind::optimizer, "engine");
  reg_.declare("opt/fractions", DType::real, {H}, BufferKind::optimizer, "engine");
  reg_.declare("opt/skip", DType::i32, {1}, BufferKind::scratch, "engine");
  reg_.declare(buf::a_star, DType::i32, {B, D}, BufferKind::activation, "engine");
  // The report block: one contiguous range, copied to the host in one async copy.
  reg_.declare("report/losses", DType::real, {H}, BufferKind::report, "engine");
  reg_.declare("report/norms", DType::real, {H}, BufferKind::report, "engine");
  reg_.declare("report/clips", DType::real, {H}, BufferKind::report, "engine");
  reg_.declare("report/total_loss", DType::real, {1}, BufferKind::report, "engine");
  reg_.declare(buf::td_error, DType::real, {B}, BufferKind::report, "engine");
  reg_.declare("report/skipped", DType::i64, {1}, BufferKind::report, "engine");
  for (std::size_t h = 0; h < heads_.size(); ++h) {
    reg_.declare_view("loss/" + head_names_[h], "report/losses", std::int64_t(h), {1}, "engine");
  }
  // Every head's ∂L/∂h2 in one block, so the trunk backward runs once for all heads.
  reg_.declare("dtrunk/all", DType::real, {H * B, H2}, BufferKind::gradient, "engine");
  for (std::size_t h = 0; h < heads_.size(); ++h) {
    reg_.declare_view("dtrunk/" + head_names_[h], "dtrunk/all", std::int64_t(h) * B * H2, {B, H2}, "engine");
  }
}

void Engine::add_engine_stages_front() {
  const int L = net_.trunk_layers;
  std::vector<std::string> acts, tacts;
  for (int i = 0; i < L; ++i) {
    const bool last = i == L - 1;
    acts.push_back(last ? std::string(buf::h2) : "trunk/a" + std::to_string(i));
    tacts.push_back(last ? std::string(buf::target_h2) : "target/a" + std::to_string(i));
  }
  // The online trunk a stage per layer (trunk.forward.<i>), the target's one stage, two roots of
  // the step's graph that start in no fixed order. (Making the target chain wait for the online
  // first layer, one root, measured slower for C51 on the H200, 91.70 against 88.98 µs: waiting
  // delays the target chain, which then holds the loss back; declaring the target's stage first,
  // so that it is captured first, measured slower too: 91.09-93.13 against 86.17-86.59 µs on an
  // H100, 2026-12-05.)
  for (int i = 0; i < L; ++i) {
    std::vector<std::string> reads{i == 0 ? std::string(buf::states2) : acts[std::size_t(i - 1)], "params"};
    stages_.push_back(Stage{"trunk.forward." + std::to_string(i), "engine", reads, {acts[std::size_t(i)]},
                            [this, i](Backend& be) { trunk_forward_layer(be, i, false); }});
  }
  stages_.push_back(Stage{"target.trunk.forward", "engine", {buf::states2, "target"}, tacts,
                          [this, L](Backend& be) {
                            for (int i = 0; i < L; ++i) trunk_forward_layer(be, i, true);
                          }});
}

void Engine::add_engine_stages_back() {
  const int L = net_.trunk_layers;
  std::vector<std::string> acts, dz;  // per layer its activation and its gradient (masked in place)
  for (int i = 0; i < L; ++i) {
    acts.push_back(i == L - 1 ? std::string(buf::h2) : "trunk/a" + std::to_string(i));
    dz.push_back(i == L - 1 ? std::string("dtrunk/all") : "trunk/dz" + std::to_string(i));
  }
  // One trunk backward for every head: the heads' ∂L/∂h2 stacked [H·B, H2], the top layer's ReLU
  // mask in one pass, then per layer d(input) as one GEMM over H·B rows that also applies the
  // layer below's mask (Gemm::mask), bias gradients as column sums over every head and dW as one
  // GEMM batched over heads. A stage per layer for the input side (trunk.backward.<i>: the top
  // layer's mask, d(input); the first layer has none below the top); its bias gradient
  // (trunk.bias.<i>) and weight gradient (trunk.weights.<i>) need only the masked gradient and so
  // run beside the layers below.
  for (int i = L - 1; i >= 0; --i) {
    const std::string li = std::to_string(i);
    const std::string& dz_i = dz[std::size_t(i)];
    const bool top = i == L - 1;
    if (top || i > 0) {
      std::vector<std::string> reads{dz_i}, writes;
      if (top) {
        reads.push_back(acts[std::size_t(i)]);
        writes.push_back(dz_i);
      }
      if (i > 0) {
        reads.push_back(acts[std::size_t(i - 1)]);
        reads.push_back("params");
        writes.push_back(dz[std::size_t(i - 1)]);
      }
      stages_.push_back(Stage{"trunk.backward." + li, "engine", reads, writes,
                              [this, i](Backend& be) { trunk_backward_layer(be, i); }});
    }
    std::vector<std::string> bwrites;
    for (const auto& h : head_names_) bwrites.push_back("grad/" + h + "/trunk." + li + ".bias");
    stages_.push_back(Stage{"trunk.bias." + li, "engine", {dz_i}, bwrites,
                            [this, i](Backend& be) { trunk_bias_layer(be, i); }});
    std::vector<std::string> wreads{dz_i, i == 0 ? std::string(buf::states2) : acts[std::size_t(i - 1)]}, wwrites;
    for (const auto& h : head_names_) wwrites.push_back("grad/" + h + "/trunk." + li + ".weight");
    stages_.push_back(Stage{"trunk.weights." + li, "engine", wreads, wwrites,
                            [this, i](Backend& be) { trunk_weights_layer(be, i); }});
  }
  if (opt_.group) add_rank_stages();
  // Budgets, Adam, spectral norm and the target update: one stage, one op (a backend may fuse it;
  // the CUDA backend does, as thread-block clusters).
  std::vector<std::string> writes{"grad/total", "report/norms", "report/clips", "report/total_loss", "opt/skip",
                                  "report/skipped", "params", "adam.m", "adam.v", buf::step, "target"};
  for (const auto& [p, u] : sn_params_) writes.push_back(u);
  std::vector<std::string> reads{"grad/all", "opt/fractions", "report/losses", "opt/lr", "params", "target",
                                 "adam.m", "adam.v", buf::step};
  if (sn_count_ > 0) reads.push_back("sn/table");
  reads.push_back("budget/reach");
  for (const auto& [p, u] : sn_params_) reads.push_back(u);
  stages_.push_back(Stage{"update", "engine", reads, writes, [this](Backend&) {
                            Update u;
                            Budget& b = u.budget;
                            b.grads = grad_all_; b.fractions = fractions_dev_; b.norms = norms_; b.clips = clips_;
                            b.g = grad_total_; b.losses = losses_; b.total_loss = total_loss_; b.skip = skip_;
                            b.skipped = skipped_; b.H = int(heads_.size()); b.P = reg_.param_count();
                            b.max_grad_norm = float(spec_.max_grad_norm);
                            b.reach = budget_reach_; b.reach_max = budget_reach_max_;
                            Adam& a = u.adam;
                            a.params = params_; a.g = grad_total_; a.m = adam_m_; a.v = adam_v_; a.P = reg_.param_count();
                            a.t = t_; a.lr = lr_; a.beta1 = float(spec_.adam.beta1); a.beta2 = float(spec_.adam.beta2);
                            a.eps = float(spec_.adam.eps); a.skip = skip_;
                            u.sn_mats = sn_table_; u.sn_count = sn_count_; u.sn_max_rows = sn_max_rows_;
                            u.sn_max_cols = sn_max_cols_; u.sigma_max = float(spec_.spectral_norm.sigma_max);
                            TargetUpdate& t = u.target;
                            t.target = target_; t.params = params_; t.P = reg_.param_count();
                            t.tau = float(spec_.target.polyak); t.period = spec_.target.period; t.t = t_; t.skip = skip_;
                            rt_->ops().update(u);
                          }, true});
}

void Engine::bind_engine() {
  params_ = reg_.real("params");
  target_ = reg_.real("target");
  adam_m_ = reg_.real("adam.m");
  adam_v_ = reg_.real("adam.v");
  grad_all_ = reg_.real("grad/all");
  grad_total_ = reg_.real("grad/total");
  lr_ = reg_.real("opt/lr");
  fractions_dev_ = reg_.real("opt/fractions");
  states2_ = reg_.real(buf::states2);
  actions_ = reg_.i32(buf::actions);
  rewards_ = reg_.real(buf::rewards);
  dones_ = reg_.real(buf::dones);
  weights_ = reg_.real(buf::is_weights);
  t_ = reg_.i64(buf::step);
  skip_ = reg_.i32("opt/skip");
  skipped_ = reg_.i64("report/skipped");
  losses_ = reg_.real("report/losses");
  norms_ = reg_.real("report/norms");
  clips_ = reg_.real("report/clips");
  total_loss_ = reg_.real("report/total_loss");
  td_error_ = reg_.real(buf::td_error);
  dtrunk_all_ = reg_.real("dtrunk/all");
  const int L = net_.trunk_layers;
  for (int i = 0; i < L; ++i) {
    const std::string p = "trunk." + std::to_string(i);
    trunk_w_.push_back(reg_.param_in(params_, p + ".weight"));
    trunk_b_.push_back(reg_.param_in(params_, p + ".bias"));
    trunk_tw_.push_back(reg_.param_in(target_, p + ".weight"));
    trunk_tb_.push_back(reg_.param_in(target_, p + ".bias"));
    const bool last = i == L - 1;
    trunk_a_.push_back(reg_.real(last ? std::string(buf::h2) : "trunk/a" + std::to_string(i)));
    trunk_ta_.push_back(reg_.real(last ? std::string(buf::target_h2) : "target/a" + std::to_string(i)));
    trunk_dz_.push_back(last ? dtrunk_all_ : reg_.real("trunk/dz" + std::to_string(i)));
  }
  const std::int64_t P = reg_.param_count();
  for (std::size_t h = 0; h < heads_.size(); ++h) {
    const Real g = grad_all_ + std::int64_t(h) * P;
    trunk_gw_.emplace_back();
    trunk_gb_.emplace_back();
    for (int i = 0; i < L; ++i) {
      const std::string p = "trunk." + std::to_string(i);
      trunk_gw_.back().push_back(reg_.param_in(g, p + ".weight"));
      trunk_gb_.back().push_back(reg_.param_in(g, p + ".bias"));
    }
  }
  for (const auto& [p, u] : sn_params_) sn_u_.push_back(reg_.real(u));
  if (sn_count_ > 0) sn_table_ = reinterpret_cast<SpectralMatrix*>(reg_.i64("sn/table"));
  budget_reach_ = reg_.i64("budget/reach");
  const auto* rb = reg_.find("report/losses");
  const std::size_t base = reg_.report_range().first;
  rl_.losses = rb->offset_bytes - base;
  rl_.norms = reg_.find("report/norms")->offset_bytes - base;
  rl_.clips = reg_.find("report/clips")->offset_bytes - base;
  rl_.total = reg_.find("report/total_loss")->offset_bytes - base;
  rl_.td = reg_.find(buf::td_error)->offset_bytes - base;
  rl_.skipped = reg_.find("report/skipped")->offset_bytes - base;
}

// h_i = relu(W_i h_{i-1} + b_i); online over states ‖ next_states (2B rows), target over s'.
// Trunk layer i of the online network (on states2: 2B rows) or of the target (on next_states).
Gemm Engine::trunk_layer_gemm(int i, bool target) const {
  const int B = spec_.batch;
  const auto& a = target ? trunk_ta_ : trunk_a_;
  const auto& w = target ? trunk_tw_ : trunk_w_;
  const auto& b = target ? trunk_tb_ : trunk_b_;
  Gemm g;
  g.tb = true; g.m = target ? B : 2 * B; g.n = net_.trunk[i]; g.k = i == 0 ? net_.state : net_.trunk[i - 1];
  g.a = i > 0 ? a[std::size_t(i - 1)] : target ? states2_ + std::int64_t(B) * net_.state : states2_;
  g.lda = g.k; g.b = w[std::size_t(i)]; g.ldb = g.k; g.c = a[std::size_t(i)]; g.ldc = g.n;
  g.weight_operand = 2;
  g.bias = b[std::size_t(i)]; g.act = Act::relu;  // fused epilogue
  return g;
}

void Engine::trunk_forward_layer(Backend& be, int i, bool target) { be.gemm(trunk_layer_gemm(i, target)); }

// Budget::reach: head h's gradient row is written only where the stages say ("grad/<h>" whole, or
// "grad/<h>/<param>": its parameters, the trunk's, another head's it reaches); the rest stays 0
// from the arena's zero fill, so the norms need only these ranges (the all-heads step read four
// whole rows where under half of it can be non-zero). Merged into at most kBudgetReach ranges
// (closing the smallest gaps: zeros add nothing).
std::vector<std::pair<std::int64_t, std::int64_t>> Engine::gradient_writes(std::size_t h) const {
  const std::int64_t P = reg_.param_count();
  const std::string g = "grad/" + head_names_[h];
  std::vector<std::pair<std::int64_t, std::int64_t>> r;
  for (const auto& st : stages_)
    for (const auto& w : st.writes) {
      if (w == g) {
        r.emplace_back(0, P);
      } else if (w.size() > g.size() + 1 && w.compare(0, g.size() + 1, g + "/") == 0) {
        if (const auto* p = reg_.find_param(w.substr(g.size() + 1))) r.emplace_back(p->offset, p->offset + p->stored());
      }
    }
  return r;
}

void Engine::upload_budget_reach() {
  std::vector<std::int64_t> reach(heads_.size() * kBudgetReach * 2, 0);
  budget_reach_max_ = 0;
  for (std::size_t h = 0; h < heads_.size(); ++h) {
    const auto m = merge_ranges(gradient_writes(h), std::size_t(kBudgetReach));
    std::int64_t len = 0;
    for (std::size_t q = 0; q < m.size(); ++q) {
      reach[(h * kBudgetReach + q) * 2] = m[q].first;
      reach[(h * kBudgetReach + q) * 2 + 1] = m[q].second;
      len += m[q].second - m[q].first;
    }
    budget_reach_max_ = std::max(budget_reach_max_, len);
  }
  rt_->ops().upload(budget_reach_, reach.data(), reach.size() * sizeof(std::int64_t));
}

// Backprop every head's gradient (rows of `states`) through trunk layer i: at the top layer
// (dtrunk/all: the heads' ∂L_h/∂h_L) its ReLU mask first; below the first layer, d(input) with
// the layer below's mask applied (so its gradient arrives masked).
void Engine::trunk_backward_layer(Backend& be, int i) {
  const int B = spec_.batch, H = int(heads_.size());
  const int w = net_.trunk[i];
  const int in_w = i == 0 ? net_.state : net_.trunk[i - 1];
  const Real dz = trunk_dz_[i];  // [H·B, w]
  if (i == net_.trunk_layers - 1) trunk_top_mask(be, i);
  if (i == 0) return;
  Gemm gx;  // d(in) = dz · W over all H·B rows, masked by layer i − 1's activation (period B rows)
  gx.m = H * B; gx.n = in_w; gx.k = w;
  gx.a = dz; gx.lda = w; gx.b = trunk_w_[i]; gx.ldb = in_w; gx.c = trunk_dz_[i - 1]; gx.ldc = in_w;
  gx.weight_operand = 2;
  gx.mask = trunk_a_[i - 1]; gx.ldmask = in_w; gx.mask_rows = B;
  be.gemm(gx);
}

// The top layer's ReLU mask on every head's ∂L/∂h (rows 0..B of the 2B activation block are
// `states`: the same mask for every head).
void Engine::trunk_top_mask(Backend& be, int i) {
  const int B = spec_.batch, H = int(heads_.size());
  const int w = net_.trunk[i];
  be.relu_bias_grad(trunk_dz_[i], trunk_a_[i], Real{}, B, w, w, H, std::int64_t(B) * w, 0, 0);
}

// db_h = Σ_rows dz_h of trunk layer i from its masked gradient, every head in one op (grad/all
// rows are P apart).
void Engine::trunk_bias_layer(Backend& be, int i) {
  const int B = spec_.batch, H = int(heads_.size());
  const int w = net_.trunk[i];
  be.relu_bias_grad(trunk_dz_[i], Real{}, trunk_gb_[0][i], B, w, w, H, std::int64_t(B) * w, 0, reg_.param_count());
}

// dW_h = dz_hᵀ · in of trunk layer i from its masked gradient, batched over heads (grad/all rows
// are P apart).
void Engine::trunk_weights_layer(Backend& be, int i) {
  const int B = spec_.batch, H = int(heads_.size());
  const std::int64_t P = reg_.param_count();
  const int w = net_.trunk[i];
  const int in_w = i == 0 ? net_.state : net_.trunk[i - 1];
  Gemm gw;
  gw.ta = true; gw.m = w; gw.n = in_w; gw.k = B;
  gw.a = trunk_dz_[i]; gw.lda = w; gw.stride_a = std::int64_t(B) * w;
  gw.b = i == 0 ? states2_ : trunk_a_[i - 1]; gw.ldb = in_w; gw.stride_b = 0;
  gw.c = trunk_gw_[0][i]; gw.ldc = in_w; gw.stride_c = P;
  gw.batch = H;
  be.gemm(gw);
}

// ---------------------------------------------------------------------------------------------
void Engine::step() {
  prime_replay_batch();
  if (captured_) {
    rt_->replay();
  } else {
    for (auto i : order_) stages_[i].run(rt_->ops());
  }
  ++steps_;
  if (spec_.report_every > 0 && steps_ % spec_.report_every == 0) request_report();
}

void Engine::step_uncaptured() {
  prime_replay_batch();
  for (auto i : order_) stages_[i].run(rt_->ops());
  ++steps_;
}

void Engine::forward_backward() {
  for (auto i : order_)
    if (!stages_[i].update) stages_[i].run(rt_->ops());
}

std::vector<double> Engine::host_buffer(const std::string& name) {
  const auto* b = reg_.find(name);
  if (!b) throw std::invalid_argument("host_buffer: no buffer named '" + name + "'");
  rt_->synchronize();
  std::vector<unsigned char> raw(b->bytes);
  rt_->ops().download(raw.data(), reg_.base() + b->offset_bytes, b->bytes);
  std::vector<double> out(std::size_t(b->numel()));
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (b->dtype == DType::i32) {
      std::int32_t v; std::memcpy(&v, raw.data() + i * 4, 4); out[i] = v;
    } else if (b->dtype == DType::i64) {
      std::int64_t v; std::memcpy(&v, raw.data() + i * 8, 8); out[i] = double(v);
    } else if (reg_.real_size() == 8) {
      std::memcpy(&out[i], raw.data() + i * 8, 8);
    } else {
      float v; std::memcpy(&v, raw.data() + i * 4, 4); out[i] = v;
    }
  }
  return out;
}

void Engine::host_write(const std::string& name, std::int64_t index, double value) {
  const auto* b = reg_.find(name);
  if (!b) throw std::invalid_argument("host_write: no buffer named '" + name + "'");
  if (index < 0 || index >= b->numel()) throw std::out_of_range("host_write: index outside '" + name + "'");
  rt_->synchronize();
  const std::size_t es = reg_.element_size(b->dtype);
  unsigned char bytes[8];
  if (b->dtype == DType::i32) { std::int32_t v = std::int32_t(value); std::memcpy(bytes, &v, 4); }
  else if (b->dtype == DType::i64) { std::int64_t v = std::int64_t(value); std::memcpy(bytes, &v, 8); }
  else if (es == 8) std::memcpy(bytes, &value, 8);
  else { float v = float(value); std::memcpy(bytes, &v, 4); }
  rt_->ops().upload(reg_.base() + b->offset_bytes + std::size_t(index) * es, bytes, es);
}

void Engine::set_fraction(std::size_t head, double f) {
  if (head >= fractions_.size()) throw std::out_of_range("set_fraction: no head " + std::to_string(head));
  std::vector<double> all = fractions_;
  all[head] = f;
  set_fractions(all);
}

void Engine::set_fractions(const std::vector<double>& f) {
  if (f.size() != fractions_.size())
    throw std::invalid_argument("set_fractions: " + std::to_string(f.size()) + " fractions for " +
                                std::to_string(fractions_.size()) + " heads");
  double sum = 0.0;
  for (std::size_t h = 0; h < f.size(); ++h) {
    if (!(f[h] >= 0.0 && f[h] <= 1.0))
      throw std::invalid_argument("set_fraction: head " + std::to_string(h) + " (" + head_names_[h] +
                                  "): a fraction must be in [0,1], got " + std::to_string(f[h]) +
                                  "; nothing was changed");
    sum += f[h];
  }
  // The budgets share max_grad_norm: the clipped gradients' norms add up to at most Σ f_h · G.
  if (sum > 1.0 + kFractionSlack) {
    std::ostringstream text;
    text << "set_fraction: the fractions would sum to " << sum << " (";
    for (std::size_t h = 0; h < f.size(); ++h) text << (h ? ", " : "") << head_names_[h] << " " << f[h];
    text << "), more than 1: lower another head's first (or set them together with set_fractions); nothing "
            "was changed";
    throw std::invalid_argument(text.str());
  }
  std::vector<float> v(f.begin(), f.end());
  rt_->ops().upload_reals(fractions_dev_, v.data(), std::int64_t(v.size()));
  if (rt_->ops().status() != 0) throw std::runtime_error(std::string("set_fraction: ") + rt_->ops().message());
  fractions_ = f;
}

void Engine::set_lr(double lr) {
  if (!(lr > 0.0)) throw std::invalid_argument("set_lr: learning rate must be > 0");
  const float v = float(lr);
  rt_->ops().upload_reals(lr_, &v, 1);
  if (rt_->ops().status() != 0) throw std::runtime_error(std::string("set_lr: ") + rt_->ops().message());
}

void Engine::request_report() {
  const int slot = int(report_seq_ % 2);
  rt_->copy_to_host_async(report_host_[slot], reg_.base() + report_begin_, report_bytes_, slot);
  report_step_[slot] = steps_;
  ++report_seq_;
}

std::optional<StepReport> Engine::latest_report() {
  // Newest first; ready() never blocks.
  for (int k = 0; k < 2; ++k) {
    const int slot = int((report_seq_ - 1 - k) % 2 + 2) % 2;
    if (report_seq_ - 1 - k < 0 || report_step_[slot] < 0) continue;
    if (!rt_->ready(slot)) continue;
    std::vector<unsigned char> bytes(report_host_[slot], report_host_[slot] + report_bytes_);
    StepReport r = parse_report(bytes);
    r.step_index = report_step_[slot];
    r.adam_step = -1;
    return r;
  }
  return std::nullopt;
}

StepReport Engine::parse_report(const std::vector<unsigned char>& bytes) const {
  const std::uint32_t es = reg_.real_size();
  auto real_at = [&](std::size_t off, std::size_t i) -> double {
    if (es == 8) {
      double v;
      std::memcpy(&v, bytes.data() + off + i * 8, 8);
      return v;
    }
    float v;
    std::memcpy(&v, bytes.data() + off + i * 4, 4);
    return v;
  };
  StepReport r;
  r.heads = head_names_;
  r.fractions = fractions_;
  for (std::size_t h = 0; h < heads_.size(); ++h) {
    r.losses.push_back(real_at(rl_.losses, h));
    r.grad_norms.push_back(real_at(rl_.norms, h));
    r.clips.push_back(real_at(rl_.clips, h));
  }
  r.total_loss = real_at(rl_.total, 0);
  for (int b = 0; b < spec_.batch; ++b) r.td_error.push_back(float(real_at(rl_.td, std::size_t(b))));
  std::memcpy(&r.skipped_steps, bytes.data() + rl_.skipped, 8);
  if (replay_.on) {
    ReplayStats st;
    st.size = std::int64_t(real_at(rl_.replay, 0));
    st.beta = real_at(rl_.replay, 1);
    st.max_priority = real_at(rl_.replay, 2);
    st.total_priority = real_at(rl_.replay, 3);
    r.replay = st;
  }
  r.step_index = steps_;
  return r;
}

StepReport Engine::read_report() {
  rt_->synchronize();
  std::vector<unsigned char> bytes(report_bytes_);
  rt_->ops().download(bytes.data(), reg_.base() + report_begin_, report_bytes_);
  StepReport r = parse_report(bytes);
  rt_->ops().download(&r.adam_step, t_, 8);
  return r;
}

void Engine::set_batch(const HostBatch& b) {
  b.check(spec_, "batch");
  rt_->synchronize();
  EngineOps& io = rt_->ops();
  const std::int64_t n = std::int64_t(b.B) * b.S;
  io.upload_reals(states2_, b.states.data(), n);
  io.upload_reals(states2_ + n, b.next_states.data(), n);
  io.upload(actions_, b.actions.data(), b.actions.size() * 4);
  io.upload_reals(rewards_, b.rewards.data(), b.B);
  io.upload_reals(dones_, b.dones.data(), b.B);
  io.upload_reals(weights_, b.is_weights.data(), b.B);
  if (rt_->ops().status()) throw std::runtime_error(std::string("set_batch: ") + rt_->ops().message());
}

std::vector<std::pair<std::string, std::vector<std::string>>> Engine::stage_waits() const {
  const auto deps = dependencies(stages_, order_, reg_);
  std::vector<std::pair<std::string, std::vector<std::string>>> out;
  for (std::size_t k = 0; k < order_.size(); ++k) {
    std::vector<std::string> names;
    for (auto j : deps[k]) names.push_back(stages_[order_[j]].name);
    out.emplace_back(stages_[order_[k]].name, std::move(names));
  }
  return out;
}

std::string Engine::explain() const {
  std::ostringstream os;
  os << "pipeline '" << spec_.name << "' on " << rt_->describe() << "\n";
  if (backend_ != BackendKind::cuda)  // (a CUDA runtime's describe() says how it applies them)
    os << "cuda: autotune " << (spec_.cuda.autotune ? "true" : "false") << ", gemm " << to_string(spec_.cuda.gemm)
       << ", tile_loads " << to_string(spec_.cuda.tile_loads) << ", update_cluster "
       << update_cluster_text(spec_.cuda.update_cluster) << ", pdl " << to_string(spec_.cuda.pdl)
       << " (not used by the cpu backend)\n";
  os << "heads:";
  for (std::size_t h = 0; h < heads_.size(); ++h)
    os << "  " << head_names_[h] << " (" << heads_[h].plugin().descriptor->name << ", budget " << fractions_[h] << ")";
  const auto deps = dependencies(stages_, order_, reg_);
  os << "\nstages in order (" << order_.size() << "):\n" << dqn::explain(stages_, order_, &deps);
  os << "registry:\n" << reg_.layout_text();
  if (captured_) {
    os << "captured: 1 graph, " << rt_->graph_nodes() << " nodes over " << lanes_used() << " lane(s), "
       << lanes_.false_deps << " stage(s) queued behind one they do not need:";
    for (std::size_t k = 0; k < order_.size() && k < lanes_.lane.size(); ++k)
      os << (k ? ", " : " ") << stages_[order_[k]].name << "@" << lanes_.lane[k];
    os << "\n";
  }
  return os.str();
}

}  // namespace dqn
