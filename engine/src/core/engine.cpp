// The engine: step construction (registry + stages + schedule), capture and replay.
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
  std::int32_t act_rows() const noexcept override { return e.act_->rows(); }
  std::int64_t batch_offset() const noexcept override { return std::int64_t(e.opt_.rank) * e.spec_.batch; }
  /// The act stages of an auxiliary are accepted and never run (only the primary acts).
  int act_stage(const StageDesc& d) noexcept override {
    std::vector<Stage> dropped;
    return add(d, head == e.primary_ ? e.act_->stages() : dropped);
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
    return guard([&] { return e.reg_.param_in(e.act_->snapshot(), n); }, Real{});
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
    reports_.release(*rt_);
    free_replay_staging();
    if (act_) act_->release();
  }
  rt_.reset();  // the graph goes before the heads and their libraries
  heads_.clear();
}

void Engine::build(const PluginLoader& plugins) {
  const int B = spec_.batch;
  // Trunk parameters first (engine-owned), then each head's.
  trunk_ = std::make_unique<TrunkStages>();
  {
    StepBuild b = step_build();
    trunk_->declare_params(b);
  }
  std::vector<double> fractions;

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
    fractions.push_back(f);
  }
  if (heads_.empty()) throw std::invalid_argument("pipeline has no enabled head");
  update_ = std::make_unique<UpdateStages>(std::move(fractions));

  act_ = std::make_unique<ActStages>(*trunk_, std::max({1, spec_.training.num_envs, spec_.training.eval.episodes}));
  StepBuild b = step_build();
  declare_shared_buffers(b);
  declare_replay_buffers();
  act_->declare_buffers(b);
  trunk_->add_front_stages(b);
  act_->add_front_stages(b);
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
  act_->declare_after_heads(b);
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
  update_->declare_after_heads(b);
  trunk_->add_back_stages(b);
  if (opt_.group) add_rank_stages();
  update_->add_back_stages(b);
  add_replay_stage_back();
  if (!act_->has_stage_of(head_names_[primary_]))
    throw std::runtime_error("head '" + head_names_[primary_] + "' (" + heads_[primary_].plugin().path +
                             ") is the primary but declared no act stage: a primary writes act/q for acting "
                             "(BuildContext::act_stage; dqn/head.hpp, \"The primary's contract\")");
  act_->add_back_stages(b);

  // The ops index a buffer with 32-bit ints (the replay's own kernels with 64-bit ones).
  for (const std::string& name : reg_.buffer_order()) {
    const auto* d = reg_.find(name);
    if (d->view_of.empty() && name.rfind("replay/", 0) != 0 && d->numel() > std::numeric_limits<std::int32_t>::max())
      throw std::invalid_argument("buffer '" + name + "' (" + d->owner + ") would hold " + std::to_string(d->numel()) +
                                  " elements, more than the 2^31 - 1 the ops index: lower batch or the network's "
                                  "sizes (network.trunk, head_hidden, branches, actions, atoms)");
  }
  reg_.freeze(*rt_);
  bind_shared();
  trunk_->bind(b);
  update_->bind(b);
  bind_replay();
  act_->bind(b);
  for (std::size_t h = 0; h < heads_.size(); ++h) {
    HeadResolver r(*this, h);
    if (heads_[h]->bind(r) != 0 || !r.message.empty()) {
      std::string why = r.message.empty() ? heads_[h]->error() : r.message;
      throw std::runtime_error("head '" + head_names_[h] + "': bind failed: " + why);
    }
  }
  order_ = schedule(stages_, reg_);
  schedule(act_->stages(), reg_);  // checks the act stages' names (they run in declaration order)

  update_->upload(b);
  reports_.bind(reg_, *rt_, replay_.on ? kReplayStatsBuffer : nullptr);
  if (rt_->ops().status() != 0) throw std::runtime_error(std::string("backend error during build: ") + rt_->ops().message());

  // Plan (scratch sizes) of both steps, then capture each once; from here on nothing is looked up.
  if (rt_->captures()) {
    rt_->plan_begin();
    for (auto i : order_) stages_[i].run(rt_->ops());
    for (auto& st : act_->stages()) st.run(rt_->ops());
    rt_->plan_end();
    rt_->begin_capture(Runtime::kStepGraph);
    capture_stages();
    rt_->end_capture();
    if (rt_->ops().status() != 0) throw std::runtime_error(std::string("backend error during capture: ") + rt_->ops().message());
    act_->capture([this](const Stage& s) { check_capture(s); });
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

StepBuild Engine::step_build() { return StepBuild{spec_, net_, head_names_, primary_, reg_, *rt_, stages_}; }

void Engine::declare_shared_buffers(StepBuild& b) {
  const std::int64_t B = spec_.batch, S = net_.state, D = net_.branches;
  reg_.declare(buf::states2, DType::real, {2 * B, S}, BufferKind::input, "engine");
  reg_.declare(buf::actions, DType::i32, {B, D}, BufferKind::input, "engine");
  reg_.declare(buf::rewards, DType::real, {B}, BufferKind::input, "engine");
  reg_.declare(buf::dones, DType::real, {B}, BufferKind::input, "engine");
  reg_.declare(buf::is_weights, DType::real, {B}, BufferKind::input, "engine");
  trunk_->declare_buffers(b);
  update_->declare_buffers(b);
  reg_.declare(buf::a_star, DType::i32, {B, D}, BufferKind::activation, "engine");
  reports_.declare(reg_, head_names_, spec_.batch);
}

void Engine::bind_shared() {
  params_ = reg_.real("params");
  target_ = reg_.real("target");
  adam_m_ = reg_.real("adam.m");
  adam_v_ = reg_.real("adam.v");
  grad_all_ = reg_.real("grad/all");
  states2_ = reg_.real(buf::states2);
  actions_ = reg_.i32(buf::actions);
  rewards_ = reg_.real(buf::rewards);
  dones_ = reg_.real(buf::dones);
  weights_ = reg_.real(buf::is_weights);
  t_ = reg_.i64(buf::step);
  losses_ = reg_.real("report/losses");
  td_error_ = reg_.real(buf::td_error);
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
  if (spec_.report_every > 0 && steps_ % spec_.report_every == 0) reports_.request(*rt_, reg_, steps_);
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

std::optional<StepReport> Engine::latest_report() { return reports_.latest(*rt_, update_->fractions()); }

StepReport Engine::read_report() { return reports_.read(*rt_, reg_, update_->fractions(), steps_, t_); }

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
    os << "  " << head_names_[h] << " (" << heads_[h].plugin().descriptor->name << ", budget " << update_->fractions()[h] << ")";
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
