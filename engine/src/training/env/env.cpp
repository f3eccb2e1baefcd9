/** @file env.cpp
 *  @brief The environment registry; built-ins are registered on first use (not by static
 *  initialisers, which a static library's linker may drop).
 */
#include "training/env/env.hpp"

#include <map>
#include <mutex>
#include <stdexcept>
#include <utility>

#include "training/env/cartpole.hpp"

namespace dqn {
namespace {

struct EnvFactories {
  EnvFactories() {
    factories.emplace(kCartPoleName, [](int num_envs, std::uint64_t seed) {
      return std::unique_ptr<VecEnv>(std::make_unique<CartPoleVecEnv>(num_envs, seed));
    });
  }
  std::mutex mutex;
  std::map<std::string, EnvFactory> factories;  // ordered: env_names() comes out sorted
};

EnvFactories& factories() {
  static EnvFactories r;
  return r;
}

std::string joined_names(const std::map<std::string, EnvFactory>& m) {
  std::string out;
  for (const auto& [name, _] : m) {
    if (!out.empty()) out += ", ";
    out += name;
  }
  return out;
}

}  // namespace

void register_env(const std::string& name, EnvFactory factory) {
  if (name.empty()) throw std::invalid_argument("register_env: empty environment name");
  if (!factory) throw std::invalid_argument("register_env: empty factory for '" + name + "'");
  EnvFactories& r = factories();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (!r.factories.emplace(name, std::move(factory)).second)
    throw std::invalid_argument("register_env: environment '" + name + "' is already registered");
}

std::unique_ptr<VecEnv> make_env(const std::string& name, int num_envs, std::uint64_t seed) {
  EnvFactory factory;
  {
    EnvFactories& r = factories();
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.factories.find(name);
    if (it == r.factories.end())
      throw std::invalid_argument("unknown environment '" + name + "' (known: " +
                                  joined_names(r.factories) + ")");
    factory = it->second;
  }
  if (num_envs < 1)
    throw std::invalid_argument("environment '" + name + "': num_envs must be at least 1, got " +
                                std::to_string(num_envs));
  auto env = factory(num_envs, seed);
  if (!env) throw std::logic_error("environment '" + name + "': its factory returned no environment");
  return env;
}

std::vector<std::string> env_names() {
  EnvFactories& r = factories();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> names;
  names.reserve(r.factories.size());
  for (const auto& [name, _] : r.factories) names.push_back(name);
  return names;
}

std::function<std::optional<EnvShape>(const std::string&)> environment_shapes() {
  return [](const std::string& name) -> std::optional<EnvShape> {
    {
      EnvFactories& r = factories();
      std::lock_guard<std::mutex> lock(r.mutex);
      if (!r.factories.count(name)) return std::nullopt;
    }
    const std::unique_ptr<VecEnv> env = make_env(name, 1, 0);
    return EnvShape{env->spec().obs_dim, env->spec().branch_actions};
  };
}

}  // namespace dqn
