/** @file agent.cpp
 *  @brief dqn::Agent (dqn/agent.hpp): a pipeline, its plugins and one engine with a replay; the
 *  n-step assembly of observed transitions; evaluation on a fresh vectorised environment.
 */
#include "dqn/agent.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include "agent_impl.hpp"
#include "core/engine_access.hpp"
#include "core/rank_group.hpp"
#include "core/runtime.hpp"
#include "core/safetensors.hpp"
#include "export/policy_files.hpp"
#include "export/policy_model.hpp"
#include "pipeline/parse.hpp"
#include "training/dataset.hpp"
#include "training/evaluation.hpp"
#include "training/seeds.hpp"
#include "training/trainer.hpp"

namespace dqn {

namespace fs = std::filesystem;

namespace agent_detail {

std::unique_ptr<Agent::Impl> build(const AgentOptions& o, const ParseFn& parse, const std::string& source) {
  auto impl = std::make_unique<Agent::Impl>(o.plugin_path);
  ParseOptions po;
  po.overrides = o.overrides;
  if (!o.backend.empty()) {
    if (o.backend != "cpu" && o.backend != "cuda")
      throw std::invalid_argument("AgentOptions::backend '" + o.backend + "': expected cpu or cuda");
    po.overrides.push_back("backend=" + o.backend);
  }
  po.plugins = &impl->loader;
  po.environments = environment_shapes(&impl->loader);
  po.program_envs = program_env_names();
  try {
    impl->spec = parse(po);
  } catch (const PipelineErrors& e) {
    const std::size_t n = e.errors().size();
    throw std::invalid_argument(std::string(e.what()) + "\n" + source + ": " + std::to_string(n) + (n == 1 ? " error" : " errors"));
  }
  // The libraries the pipeline's plugins made the loader open, and could not use.
  impl->warnings = impl->loader.problems();
  impl->yaml = to_yaml(impl->spec, impl->loader);
  // Offline: the whole dataset read and checked before anything is built.
  if (!impl->spec.training.dataset.empty()) {
    const Dataset d = read_dataset(impl->spec.training.dataset, impl->spec.network);
    // what dqn collect recorded (none where no episode had ended); another file's: its episodes'
    if (d.metadata.count("behaviour_return"))
      impl->behaviour_return = std::stod(d.metadata.at("behaviour_return"));
    else if (!d.metadata.count("complete_episodes"))
      impl->behaviour_return = d.mean_return();
    impl->dataset_steps = d.steps();
    impl->dataset_episodes = d.episodes();
    impl->offline = assemble_transitions(d, impl->spec.n_step, impl->spec.gamma);
  }
  EngineOptions eo = training_engine_options(impl->spec, impl->offline ? &*impl->offline : nullptr);
  // Acting and learning need no other rank: the first of the pipeline's devices (run() builds
  // one engine per device where there are several).
  eo.device = rank_devices(impl->spec, resolve_backend(impl->spec, std::nullopt)).front();
  impl->engine = std::make_unique<Engine>(impl->spec, impl->loader, eo);
  init_weights(*impl->engine, impl->spec.seed);
  return impl;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::invalid_argument("cannot read '" + path + "'");
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace agent_detail

namespace {

using agent_detail::build;
using agent_detail::read_text;


void check_rows(const char* what, int rows, int max_rows) {
  if (rows < 1 || rows > max_rows)
    throw std::invalid_argument(std::string(what) + ": " + std::to_string(rows) +
                                " rows; the act step takes 1 to " + std::to_string(max_rows) +
                                " (the larger of training.num_envs and training.eval.episodes)");
}

void check_finite(const char* what, const char* name, const float* x, std::int64_t rows, int cols) {
  for (std::int64_t r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c)
      if (!std::isfinite(x[r * cols + c]))
        throw std::invalid_argument(std::string(what) + ": " + name + " row " + std::to_string(r) + ", feature " +
                                    std::to_string(c) + " is " + std::to_string(x[r * cols + c]) +
                                    " (observations must be finite)");
}

AgentReport to_report(const StepReport& r) {
  AgentReport a;
  a.step = r.step_index;
  a.total_loss = r.total_loss;
  a.heads = r.heads;
  a.losses = r.losses;
  a.grad_norms = r.grad_norms;
  a.clips = r.clips;
  a.skipped_steps = r.skipped_steps;
  return a;
}

}  // namespace

Agent::Agent(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Agent::Agent(Agent&&) noexcept = default;
Agent& Agent::operator=(Agent&&) noexcept = default;
Agent::~Agent() = default;

Agent Agent::from_file(const std::string& pipeline, const AgentOptions& options) {
  return Agent(build(options, [&](const ParseOptions& po) { return load_pipeline(pipeline, po); }, pipeline));
}

Agent Agent::from_text(const std::string& yaml, const AgentOptions& options, const std::string& name) {
  return Agent(build(options, [&](const ParseOptions& po) { return parse_pipeline(yaml, name, po); }, name));
}

Agent Agent::from_run(const std::string& source, const AgentOptions& options, const std::string& pipeline) {
  std::error_code ec;
  if (!fs::exists(source, ec)) throw std::invalid_argument("'" + source + "': no such run directory or weights file");
  const bool run_dir = fs::is_directory(source, ec);
  const std::string weights =
      run_dir ? (fs::path(source) / (options.best ? "best.safetensors" : "weights.safetensors")).string() : source;
  std::string pipeline_file = pipeline;
  if (pipeline_file.empty()) {
    if (!run_dir)
      throw std::invalid_argument("'" + source + "' is a weights file: name the pipeline it was trained with");
    pipeline_file = (fs::path(source) / "pipeline.yaml").string();
    if (!fs::is_regular_file(pipeline_file, ec))
      throw std::invalid_argument("'" + source + "' holds no pipeline.yaml: not a run directory of dqn train");
  }
  if (!fs::is_regular_file(weights, ec))
    throw std::invalid_argument("'" + weights + "': no such weights file" +
                                (run_dir ? std::string(" (the run wrote none yet?)") : std::string()));
  // The run's own file: its text exactly as the run resolved it, so overrides apply on top.
  const std::string text = read_text(pipeline_file);
  Agent a(build(options, [&](const ParseOptions& po) { return parse_pipeline(text, pipeline_file, po); }, pipeline_file));
  a.load(weights);
  return a;
}

int Agent::cuda_devices() noexcept { return cuda_device_count(); }

int Agent::observation_size() const { return impl_->spec.network.state; }
int Agent::branches() const { return impl_->spec.network.branches; }
std::vector<int> Agent::actions_per_branch() const {
  return std::vector<int>(std::size_t(impl_->spec.network.branches), impl_->spec.network.actions);
}
int Agent::max_rows() const { return impl_->engine->actor().rows(); }
const std::string& Agent::pipeline_yaml() const { return impl_->yaml; }
std::string Agent::backend() const { return to_string(impl_->engine->backend()); }
std::string Agent::describe() const { return impl_->engine->runtime().describe(); }
std::uint64_t Agent::seed() const { return impl_->spec.seed; }

AgentTraining Agent::training() const {
  const TrainingSpec& t = impl_->spec.training;
  AgentTraining a;
  a.env = t.env.none() ? std::string() : env_label(t.env);
  a.num_envs = t.num_envs;
  a.total_steps = t.total_steps;
  a.learning_starts = t.learning_starts;
  a.train_every = t.train_every;
  a.gradient_steps = t.gradient_steps;
  a.epsilon_start = t.epsilon.start;
  a.epsilon_end = t.epsilon.end;
  a.epsilon_decay_steps = t.epsilon.decay_steps;
  a.eval_every = t.eval.every;
  a.eval_episodes = t.eval.episodes;
  a.stop_at_return = t.stop_at_return;
  a.stop_at_success = t.stop_at_success;
  a.batch = impl_->spec.batch;
  return a;
}

double AgentTraining::epsilon(std::int64_t env_step) const {
  EpsilonSpec e;
  e.start = epsilon_start, e.end = epsilon_end, e.decay_steps = epsilon_decay_steps;
  return epsilon_at(e, env_step);
}

void Agent::act(const float* observations, int rows, std::int32_t* actions) {
  check_rows("act", rows, max_rows());
  check_finite("act", "observation", observations, rows, observation_size());
  impl_->engine->actor().act(observations, rows, actions);
}

void Agent::q_values(const float* observations, int rows, float* q) {
  check_rows("q_values", rows, max_rows());
  check_finite("q_values", "observation", observations, rows, observation_size());
  const std::vector<float> v = impl_->engine->actor().act_values(observations, rows);
  std::memcpy(q, v.data(), v.size() * sizeof(float));
}

void Agent::observe(const float* obs, const std::int32_t* actions, const float* rewards, const float* next_obs,
                    const std::uint8_t* terminated, const std::uint8_t* truncated, int copies) {
  Impl& m = *impl_;
  const int S = observation_size(), D = branches(), A = m.spec.network.actions;
  if (copies < 1) throw std::invalid_argument("observe: copies must be at least 1, not " + std::to_string(copies));
  if (m.nstep && copies != m.copies)
    throw std::invalid_argument("observe: " + std::to_string(copies) + " copies, but the first call had " +
                                std::to_string(m.copies) + " (each copy is one stream of n-step windows)");
  check_finite("observe", "observation", obs, copies, S);
  check_finite("observe", "next observation", next_obs, copies, S);
  check_finite("observe", "reward", rewards, copies, 1);
  for (int r = 0; r < copies; ++r)
    for (int d = 0; d < D; ++d) {
      const std::int32_t a = actions[std::int64_t(r) * D + d];
      if (a < 0 || a >= A)
        throw std::invalid_argument("observe: action row " + std::to_string(r) + ", branch " + std::to_string(d) +
                                    " is " + std::to_string(a) + ", not in [0, " + std::to_string(A) + ")");
    }
  if (!m.nstep) {
    m.nstep.emplace(S, D, m.spec.n_step, m.spec.gamma, copies);
    m.copies = copies;
  }
  m.fresh.clear();
  m.nstep->add(obs, actions, rewards, next_obs, terminated, truncated, m.fresh);
  m.observed += copies;
  // Into the replay in pieces the staging takes.
  const Transitions all = m.fresh.view();
  const std::int64_t chunk = m.engine->replay().staging_rows();
  for (std::int64_t at = 0; at < all.n; at += chunk) {
    Transitions t;
    t.n = std::min(chunk, all.n - at);
    t.states = all.states + at * S;
    t.next_states = all.next_states + at * S;
    t.actions = all.actions + at * D;
    t.rewards = all.rewards + at;
    t.dones = all.dones + at;
    m.engine->replay().add(t, m.observed);
  }
}

std::int64_t Agent::replay_size() const {
  return std::min(impl_->engine->replay().added(), impl_->spec.training.replay.capacity);
}

AgentReport Agent::train(std::int64_t steps) {
  if (steps < 0) throw std::invalid_argument("train: steps must not be negative, not " + std::to_string(steps));
  const std::int64_t have = replay_size();
  if (have < impl_->spec.batch)
    throw std::logic_error("train: the replay holds " + std::to_string(have) + " transitions, fewer than one batch (" +
                           std::to_string(impl_->spec.batch) + "): observe more first");
  for (std::int64_t i = 0; i < steps; ++i) impl_->engine->step();
  impl_->train_steps += steps;
  return to_report(impl_->engine->read_report());
}

std::int64_t Agent::train_steps() const { return impl_->train_steps; }

std::optional<AgentReport> Agent::latest_report() {
  if (std::optional<StepReport> r = impl_->engine->latest_report()) return to_report(*r);
  return std::nullopt;
}

AgentEval Agent::evaluate(int episodes, std::optional<std::uint64_t> seed, double epsilon, const std::string& env) {
  Impl& m = *impl_;
  if (episodes == 0) episodes = m.spec.training.eval.episodes;
  if (episodes < 1) throw std::invalid_argument("evaluate: episodes must be at least 1, not " + std::to_string(episodes));
  // As many copies as divide the episodes and the act step takes: every copy plays as many.
  int copies = std::min(episodes, max_rows());
  while (episodes % copies != 0) --copies;
  const std::uint64_t s = seed ? *seed : derive_seed(m.spec.seed, kEvalAloneStream);
  std::unique_ptr<VecEnv> venv;
  if (env.empty()) {
    if (m.spec.training.env.none())
      throw std::invalid_argument("evaluate: the pipeline names no environment (training.env): name one");
    venv = make_env(m.spec.training.env, copies, s, m.spec.training.env_threads, &m.loader);
  } else {
    venv = make_env(env, copies, s, m.spec.training.env_threads, &m.loader);
  }
  check_env_fits(m.spec, *venv);
  EvalOptions o;
  o.episodes_per_copy = episodes / copies;
  o.seed = s;
  o.epsilon = epsilon;
  const EvalResult r = evaluate_policy(m.engine->actor(), *venv, o);
  AgentEval a;
  a.env = venv->label();
  a.episodes = r.episodes;
  a.mean = r.mean, a.std = r.std, a.min = r.min, a.max = r.max;
  a.success = r.success;
  a.seed = r.seed;
  a.returns = r.returns;
  a.lengths = r.lengths;
  return a;
}

namespace {
EvalResult as_result(const AgentEval& e) {
  EvalResult r;
  r.mean = e.mean, r.std = e.std, r.min = e.min, r.max = e.max, r.episodes = e.episodes, r.success = e.success;
  r.seed = e.seed, r.returns = e.returns, r.lengths = e.lengths, r.complete = true;
  return r;
}
}  // namespace

std::string AgentEval::json() const { return eval_json(as_result(*this), env); }
std::string AgentEval::text() const { return eval_text(as_result(*this), env); }

void Agent::save(const std::string& path) {
  st::File f = save_weights(*impl_->engine, false);
  f.metadata["train_steps"] = std::to_string(impl_->train_steps);
  st::write_file(path, f);
}

void Agent::load(const std::string& path) {
  try {
    load_weights(*impl_->engine, st::read_file(path));
    impl_->weights_source = path;
  } catch (const st::Error& e) {
    throw std::invalid_argument(e.what());
  }
}

void Agent::export_policy(const std::string& path, const std::string& format) {
  Impl& m = *impl_;
  const PolicyModel model = build_policy_model(*m.engine, m.loader);
  // The controls each branch's bins stand for, from the environment (none offline).
  nlohmann::ordered_json controls = nullptr;
  if (!m.spec.training.env.none()) {
    const std::unique_ptr<VecEnv> env = make_env(m.spec.training.env, 1, 0, 1, &m.loader);
    controls = nlohmann::ordered_json::array();
    for (int d = 0; d < env->branches(); ++d) {
      const EnvBranch& b = env->spec().branches[d];
      controls.push_back(b.continuous ? nlohmann::ordered_json{b.lo, b.hi} : nlohmann::ordered_json(nullptr));
    }
  }
  try {
    write_policy(model, policy_manifest(model, m.spec.name, m.yaml, controls), format, path);
  } catch (const st::Error& e) {
    throw std::runtime_error(e.what());
  }
}

}  // namespace dqn
