// The engine core: the step built from the heads and the engine's stage providers (registry,
// stages, schedule), captured once, then replayed.
#include "core/engine.hpp"

#include <algorithm>
#include <limits>
#include <stdexcept>

#include "pipeline/parse.hpp"
#include "spdlog/spdlog.h"

namespace dqn {

namespace {
std::vector<std::string> to_strings(const char* const* p, std::uint32_t n) {
  std::vector<std::string> out;
  for (std::uint32_t i = 0; i < n; ++i) out.emplace_back(p[i] ? p[i] : "");
  return out;
}

/// What the build hands one head while it declares (BuildContext), errors kept with the head.
struct HeadBuild final : BuildContext {
  StepBuild& b;
  Head* head;
  bool primary;
  std::int64_t offset;  ///< the head's batch rows in a global batch (data parallel)
  ActStages& act;
  std::string owner;
  std::string message;
  HeadBuild(StepBuild& sb, Head* h, bool is_primary, std::int64_t batch_offset, ActStages& a, std::string o)
      : b(sb), head(h), primary(is_primary), offset(batch_offset), act(a), owner(std::move(o)) {}

  const NetworkDims& net() const noexcept override { return b.net; }
  std::int32_t batch() const noexcept override { return b.spec.batch; }
  int param(const char* name, std::int32_t rows, std::int32_t cols, std::int32_t fan_in,
            std::uint32_t flags) noexcept override {
    try {
      b.reg.declare_param(name, rows, cols, fan_in, flags, owner);
      return 0;
    } catch (const std::exception& ex) {
      return fail(ex.what());
    }
  }
  int buffer(const char* name, DType dtype, const std::int64_t* shape, std::int32_t rank,
             BufferKind kind) noexcept override {
    try {
      b.reg.declare(name, dtype, std::vector<std::int64_t>(shape, shape + rank), kind, owner);
      return 0;
    } catch (const std::exception& ex) {
      return fail(ex.what());
    }
  }
  int stage(const StageDesc& d) noexcept override { return add(d, b.stages); }
  std::int32_t act_rows() const noexcept override { return act.rows(); }
  std::int64_t batch_offset() const noexcept override { return offset; }
  /// The act stages of an auxiliary are accepted and never run (only the primary acts).
  int act_stage(const StageDesc& d) noexcept override {
    std::vector<Stage> dropped;
    return add(d, primary ? act.stages() : dropped);
  }
  int add(const StageDesc& d, std::vector<Stage>& to) noexcept {
    try {
      Stage s;
      s.name = d.name ? d.name : "";
      s.owner = owner;
      s.reads = to_strings(d.reads, d.n_reads);
      s.writes = to_strings(d.writes, d.n_writes);
      Head* h = head;
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

/// Bind-time resolution for one head (Resolver): registry lookups, errors kept with the head.
struct HeadBind final : Resolver {
  const Registry& reg;
  const StepBuffers& bufs;
  Real grad_row;   ///< the head's row of grad/all
  Real snapshot;   ///< the act step's parameters
  mutable std::string message;
  HeadBind(const Registry& r, const StepBuffers& sb, std::size_t head, Real snap)
      : reg(r), bufs(sb), grad_row(sb.grad_all + std::int64_t(head) * r.param_count()), snapshot(snap) {}

  template <class F>
  auto guard(F&& f, decltype(f()) fallback) const noexcept -> decltype(f()) {
    try {
      return f();
    } catch (const std::exception& ex) {
      if (message.empty()) message = ex.what();
      return fallback;
    }
  }
  Real real(const char* n) const noexcept override { return guard([&] { return reg.real(n); }, Real{}); }
  std::int32_t* i32(const char* n) const noexcept override {
    return guard([&] { return reg.i32(n); }, static_cast<std::int32_t*>(nullptr));
  }
  std::int64_t* i64(const char* n) const noexcept override {
    return guard([&] { return reg.i64(n); }, static_cast<std::int64_t*>(nullptr));
  }
  Real param(const char* n) const noexcept override { return guard([&] { return reg.param_in(bufs.params, n); }, Real{}); }
  Real target(const char* n) const noexcept override { return guard([&] { return reg.param_in(bufs.target, n); }, Real{}); }
  Real grad(const char* n) const noexcept override { return guard([&] { return reg.param_in(grad_row, n); }, Real{}); }
  Real act_param(const char* n) const noexcept override { return guard([&] { return reg.param_in(snapshot, n); }, Real{}); }
};

/// The batch the step trains on and a*, declared before the parts declare theirs.
void declare_batch(Registry& reg, const PipelineSpec& spec, const NetworkDims& net) {
  const std::int64_t B = spec.batch, S = net.state, D = net.branches;
  reg.declare(buf::states2, DType::real, {2 * B, S}, BufferKind::input, "engine");
  reg.declare(buf::actions, DType::i32, {B, D}, BufferKind::input, "engine");
  reg.declare(buf::rewards, DType::real, {B}, BufferKind::input, "engine");
  reg.declare(buf::dones, DType::real, {B}, BufferKind::input, "engine");
  reg.declare(buf::is_weights, DType::real, {B}, BufferKind::input, "engine");
  reg.declare(buf::a_star, DType::i32, {B, D}, BufferKind::activation, "engine");
}

/// The flat parameter-shaped buffers, sized once every head has declared; per head its whole
/// gradient row "grad/<head>" and a window of it per parameter, "grad/<head>/<parameter>", for
/// every parameter (a head's gradient may reach another head's parameters: CQL's reaches c51's),
/// so stages that write different tensors of one row (a layer's weight and bias gradients, the
/// input side of a backward and its weight gradients) can say so and run side by side.
void declare_parameter_buffers(Registry& reg, const std::vector<std::string>& heads) {
  const std::int64_t P = reg.param_count();
  const std::int64_t H = std::int64_t(heads.size());
  reg.declare("params", DType::real, {P}, BufferKind::parameter, "engine");
  reg.declare("target", DType::real, {P}, BufferKind::parameter, "engine");
  reg.declare("adam.m", DType::real, {P}, BufferKind::optimizer, "engine");
  reg.declare("adam.v", DType::real, {P}, BufferKind::optimizer, "engine");
  reg.declare("grad/all", DType::real, {H, P}, BufferKind::gradient, "engine");
  reg.declare("grad/total", DType::real, {P}, BufferKind::gradient, "engine");
  for (std::size_t h = 0; h < heads.size(); ++h) {
    const std::string g = "grad/" + heads[h];
    reg.declare_view(g, "grad/all", std::int64_t(h) * P, {P}, "engine");
    for (const auto& p : reg.params())
      reg.declare_view(g + "/" + p.name, "grad/all", std::int64_t(h) * P + p.offset, {p.numel()}, "engine");
  }
}

/// Throws when stage s broke the capture (a plugin stage that synchronised, allocated or copied
/// to the host), naming its plugin and the stage.
void check_capture(Runtime& rt, const std::vector<HeadHandle>& heads, const std::vector<std::string>& names,
                   const Stage& s) {
  const std::string fault = rt.capture_fault();
  if (fault.empty()) return;
  std::string who = "the engine's stage '" + s.name + "'";
  for (std::size_t h = 0; h < heads.size(); ++h)
    if (names[h] == s.owner)
      who = "plugin '" + std::string(heads[h].plugin().descriptor->name) + "' (" + heads[h].plugin().path +
            "), head '" + s.owner + "', stage '" + s.name + "'";
  throw std::runtime_error(who + " broke the CUDA graph capture: " + fault +
                           ". A stage may only enqueue work on the backend's stream (DeviceContext::stream): "
                           "it must not synchronise, allocate, or copy to or from the host");
}
}  // namespace

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
    if (replay_) replay_->release();
    if (act_) act_->release();
  }
  rt_.reset();  // the graph goes before the heads and their libraries
  heads_.clear();
}

ReplayStages& Engine::replay() {
  if (!replay_) throw std::logic_error("this engine has no replay (EngineOptions::replay)");
  return *replay_;
}

void Engine::build(const PluginLoader& plugins) {
  StepBuild b{spec_, net_, head_names_, primary_, reg_, *rt_, plan_.stages};
  // Trunk parameters first (engine-owned), then each head's.
  trunk_ = std::make_unique<TrunkStages>();
  trunk_->declare_params(b);  // (the one part with parameters of its own: before the heads')
  std::vector<double> fractions;

  // Heads: create from their plugins with resolved parameters and budgets.
  for (std::size_t i = 0; i < spec_.heads.size(); ++i) {
    const HeadSpec& hs = spec_.heads[i];
    if (!hs.enabled) continue;
    const PluginDescriptor* d = plugins.find(hs.plugin);
    if (!d)
      throw PipelineError(hs.plugin_loc, "heads[" + std::to_string(i) + "].plugin", hs.plugin,
                          "plugin not found (search path: " + plugins.search_path() + ")");
    const HeadInfo h(spec_, i, *d, net_);
    if (hs.role == Role::primary) primary_ = heads_.size();
    heads_.push_back(plugins.create(hs.plugin, h.info));
    head_names_.push_back(h.instance);
    fractions.push_back(h.info.budget);
  }
  if (heads_.empty()) throw std::invalid_argument("pipeline has no enabled head");
  b.primary = primary_;
  update_ = std::make_unique<UpdateStages>(std::move(fractions));
  ranks_ = std::make_unique<RankStages>(opt_.group, opt_.rank, spec_.seed, *update_);
  if (opt_.replay) replay_ = std::make_unique<ReplayStages>(*opt_.replay, ranks_->seed());
  act_ = std::make_unique<ActStages>(*trunk_, std::max({1, spec_.training.num_envs, spec_.training.eval.episodes}));
  parts_ = {trunk_.get(), ranks_.get(), update_.get(), &reports_};
  if (replay_) parts_.push_back(replay_.get());
  parts_.push_back(act_.get());

  declare_batch(reg_, spec_, net_);
  for (StageProvider* p : parts_) p->declare_buffers(b);
  for (StageProvider* p : parts_) p->add_front_stages(b);
  for (std::size_t h = 0; h < heads_.size(); ++h) {
    HeadBuild ctx(b, heads_[h].get(), h == primary_, std::int64_t(opt_.rank) * spec_.batch, *act_, head_names_[h]);
    if (heads_[h]->declare(ctx) != 0) {
      std::string why = ctx.message.empty() ? heads_[h]->error() : ctx.message;
      throw std::runtime_error("head '" + head_names_[h] + "' (" + heads_[h].plugin().path + "): declare failed: " + why);
    }
  }
  declare_parameter_buffers(reg_, head_names_);
  for (StageProvider* p : parts_) p->declare_after_heads(b);
  for (StageProvider* p : parts_) p->add_back_stages(b);
  if (!act_->has_stage_of(head_names_[primary_]))
    throw std::runtime_error("head '" + head_names_[primary_] + "' (" + heads_[primary_].plugin().path +
                             ") is the primary but declared no act stage: a primary writes act/q for acting "
                             "(BuildContext::act_stage; dqn/head.hpp, \"The primary's contract\")");

  // The ops index a buffer with 32-bit ints (the replay's own kernels with 64-bit ones).
  for (const std::string& name : reg_.buffer_order()) {
    const auto* d = reg_.find(name);
    if (d->view_of.empty() && name.rfind("replay/", 0) != 0 && d->numel() > std::numeric_limits<std::int32_t>::max())
      throw std::invalid_argument("buffer '" + name + "' (" + d->owner + ") would hold " + std::to_string(d->numel()) +
                                  " elements, more than the 2^31 - 1 the ops index: lower batch or the network's "
                                  "sizes (network.trunk, head_hidden, branches, actions, atoms)");
  }
  reg_.freeze(*rt_);
  bufs_.params = reg_.real("params");
  bufs_.target = reg_.real("target");
  bufs_.adam_m = reg_.real("adam.m");
  bufs_.adam_v = reg_.real("adam.v");
  bufs_.grad_all = reg_.real("grad/all");
  bufs_.states2 = reg_.real(buf::states2);
  bufs_.actions = reg_.i32(buf::actions);
  bufs_.rewards = reg_.real(buf::rewards);
  bufs_.dones = reg_.real(buf::dones);
  bufs_.is_weights = reg_.real(buf::is_weights);
  bufs_.step = reg_.i64(buf::step);
  for (StageProvider* p : parts_) p->bind(b);
  for (std::size_t h = 0; h < heads_.size(); ++h) {
    HeadBind r(reg_, bufs_, h, act_->snapshot());
    if (heads_[h]->bind(r) != 0 || !r.message.empty()) {
      std::string why = r.message.empty() ? heads_[h]->error() : r.message;
      throw std::runtime_error("head '" + head_names_[h] + "': bind failed: " + why);
    }
  }
  plan_.order = schedule(plan_.stages, reg_);
  schedule(act_->stages(), reg_);  // checks the act stages' names (they run in declaration order)

  for (StageProvider* p : parts_) p->upload(b);
  if (rt_->ops().status() != 0) throw std::runtime_error(std::string("backend error during build: ") + rt_->ops().message());

  // Plan (scratch sizes) of both steps, then capture each once; from here on nothing is looked up.
  if (rt_->captures()) {
    rt_->plan_begin();
    for (auto i : plan_.order) plan_.stages[i].run(rt_->ops());
    for (auto& st : act_->stages()) st.run(rt_->ops());
    rt_->plan_end();
    rt_->begin_capture(Runtime::kStepGraph);
    capture_stages();
    rt_->end_capture();
    if (rt_->ops().status() != 0) throw std::runtime_error(std::string("backend error during capture: ") + rt_->ops().message());
    act_->capture([this](const Stage& s) { check_capture(*rt_, heads_, head_names_, s); });
    if (rt_->ops().status() != 0)
      throw std::runtime_error(std::string("backend error during the act step's capture: ") + rt_->ops().message());
    ++captures_;
    plan_.captured = true;
  }
  reg_.seal();
  spdlog::debug("engine: {} stages, {} parameters, arena {} bytes, backend {}", plan_.order.size(), reg_.param_count(),
                reg_.arena_bytes(), rt_->describe());
}

// Captures the stages in order, spread over the runtime's lanes (plan_lanes: each stage waits
// only for the stages it depends on while lanes last), so stages that share no buffer run
// concurrently inside the one graph.
void Engine::capture_stages() {
  const LanePlan lanes = plan_lanes(dependencies(plan_.stages, plan_.order, reg_), rt_->lanes());
  rt_->capture_width(lanes.used);
  for (std::size_t k = 0; k < plan_.order.size(); ++k) {
    const Stage& s = plan_.stages[plan_.order[k]];
    std::vector<int> after(lanes.after[k].begin(), lanes.after[k].end());
    rt_->stage_begin(lanes.lane[k], after);
    s.run(rt_->ops());
    check_capture(*rt_, heads_, head_names_, s);
    rt_->stage_done(int(k));
  }
  plan_.lanes = lanes;
}


// ---------------------------------------------------------------------------------------------
void Engine::step() {
  if (replay_) replay_->prime();
  if (plan_.captured) {
    rt_->replay();
  } else {
    for (auto i : plan_.order) plan_.stages[i].run(rt_->ops());
  }
  ++steps_;
  if (spec_.report_every > 0 && steps_ % spec_.report_every == 0) reports_.request(*rt_, reg_, steps_);
}

void Engine::step_uncaptured() {
  if (replay_) replay_->prime();
  for (auto i : plan_.order) plan_.stages[i].run(rt_->ops());
  ++steps_;
}

void Engine::forward_backward() {
  for (auto i : plan_.order)
    if (!plan_.stages[i].update) plan_.stages[i].run(rt_->ops());
}

std::optional<StepReport> Engine::latest_report() { return reports_.latest(*rt_, update_->fractions()); }

StepReport Engine::read_report() { return reports_.read(*rt_, reg_, update_->fractions(), steps_, bufs_.step); }

}  // namespace dqn
