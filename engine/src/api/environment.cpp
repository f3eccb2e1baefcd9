/** @file environment.cpp
 *  @brief dqn::Environment (dqn/environment.hpp): a VecEnv made from a task name and options.
 */
#include "dqn/environment.hpp"

#include <stdexcept>

#include "core/plugin_loader.hpp"
#include "pipeline/spec.hpp"
#include "pipeline/text.hpp"
#include "training/env/vec_env.hpp"

namespace dqn {

struct Environment::Impl {
  explicit Impl(const std::string& plugin_path) : loader(PluginLoader::search_path_from(plugin_path)) {}
  PluginLoader loader;
  std::unique_ptr<VecEnv> env;
};

namespace {

/// "key=value" as the pipeline's YAML would read the value: a boolean, an integer, a number or text.
std::pair<std::string, HeadParam> option(const std::string& kv) {
  const std::size_t eq = kv.find('=');
  if (eq == std::string::npos || eq == 0)
    throw std::invalid_argument("environment option '" + kv + "': expected key=value");
  const std::string key = kv.substr(0, eq), value = kv.substr(eq + 1);
  std::int64_t i = 0;
  if (std::optional<bool> b = dsl::parse_bool(value)) return {key, HeadParam{*b}};
  if (dsl::parse_int(value, i) == dsl::IntParse::ok) return {key, HeadParam{i}};
  if (std::optional<double> d = dsl::parse_number(value)) return {key, HeadParam{*d}};
  return {key, HeadParam{value}};
}

}  // namespace

Environment::Environment(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Environment::Environment(Environment&&) noexcept = default;
Environment& Environment::operator=(Environment&&) noexcept = default;
Environment::~Environment() = default;

Environment Environment::make(const std::string& task, int copies, std::uint64_t seed,
                              const std::vector<std::string>& options, const std::string& plugin_path, int threads) {
  auto impl = std::make_unique<Impl>(plugin_path);
  if (threads < 0) throw std::invalid_argument("environment threads must not be negative, not " + std::to_string(threads));
  EnvChoice c = env_choice(task);
  if (c.plugin.empty() && !options.empty())
    throw std::invalid_argument("environment '" + task + "': options need the plugin named (plugin:task)");
  for (const std::string& kv : options) c.options.insert(option(kv));
  impl->env = make_env(c, copies, seed, threads, &impl->loader);
  return Environment(std::move(impl));
}

int Environment::copies() const { return impl_->env->num_envs(); }
int Environment::observation_size() const { return impl_->env->obs_dim(); }
int Environment::branches() const { return impl_->env->branches(); }
std::vector<int> Environment::actions_per_branch() const { return impl_->env->branch_actions(); }
std::vector<std::optional<std::pair<double, double>>> Environment::control_ranges() const {
  const EnvSpec& s = impl_->env->spec();
  std::vector<std::optional<std::pair<double, double>>> r(std::size_t(s.n_branches));
  for (int d = 0; d < s.n_branches; ++d)
    if (s.branches[d].continuous) r[std::size_t(d)] = std::make_pair(s.branches[d].lo, s.branches[d].hi);
  return r;
}
const std::string& Environment::label() const { return impl_->env->label(); }
int Environment::max_episode_steps() const { return impl_->env->spec().max_episode_steps; }
bool Environment::reports_success() const { return impl_->env->spec().reports_success != 0; }

void Environment::reset(std::uint64_t seed, float* observations) { impl_->env->reset(seed, observations); }

void Environment::step(const std::int32_t* actions, float* next_observations, float* rewards,
                       std::uint8_t* terminated, std::uint8_t* truncated, float* final_observations) {
  impl_->env->step(actions, next_observations, rewards, terminated, truncated, final_observations);
}

const std::uint8_t* Environment::success() const { return impl_->env->success().data(); }

}  // namespace dqn
