/** @file env_choice.cpp
 *  @brief training.env's plugin and task found in the plugin catalog (find_env).
 */
#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "pipeline/parse.hpp"
#include "pipeline/text.hpp"

namespace dqn {
namespace {

using dsl::join;

bool is_env_plugin(const PluginDescriptor* d) {
  return d && d->kind == PluginKind::environment && d->struct_size >= kDescriptorSizeMinor1 && d->env_count > 0 &&
         d->envs;
}

std::vector<std::string> task_names(const PluginDescriptor& d) {
  std::vector<std::string> out;
  for (std::uint32_t i = 0; i < d.env_count; ++i) out.emplace_back(d.envs[i].task ? d.envs[i].task : "");
  return out;
}

const EnvDescriptor* find_task(const PluginDescriptor& d, const std::string& task) {
  for (std::uint32_t i = 0; i < d.env_count; ++i)
    if (d.envs[i].task && task == d.envs[i].task) return &d.envs[i];
  return nullptr;
}

/// "cartpole (CartPole-v1), mujoco (humanoid_stand, humanoid_walk, reacher)", and every name
/// that could be meant.
std::string known_envs(const PluginCatalog& catalog, const std::vector<std::string>& program_envs,
                       std::vector<std::string>& names) {
  std::vector<std::string> parts;
  for (const auto& t : program_envs) {
    parts.push_back(t + " (this program's)");
    names.push_back(t);
  }
  for (const auto& n : catalog.names()) {
    const PluginDescriptor* d = catalog.find(n);
    if (!is_env_plugin(d)) continue;
    const std::vector<std::string> tasks = task_names(*d);
    parts.push_back(n + " (" + join(tasks) + ")");
    names.push_back(n);
    names.insert(names.end(), tasks.begin(), tasks.end());
  }
  return parts.empty() ? std::string("none found (search path: ") + catalog.search_path() + ")" : join(parts);
}

[[noreturn]] void unknown(const std::string& what, const std::string& name, const PluginCatalog& catalog,
                          const std::vector<std::string>& program_envs) {
  std::vector<std::string> names;
  const std::string known = known_envs(catalog, program_envs, names);
  std::string why = "unknown " + what + " '" + name + "'";
  const std::string best = closest_match(name, names);
  if (!best.empty()) why += ", did you mean '" + best + "'?";
  throw std::invalid_argument(why + " (environments: " + known + ")");
}

}  // namespace

FoundEnv find_env(const EnvChoice& env, const PluginCatalog& catalog, const std::vector<std::string>& program_envs) {
  FoundEnv f;
  if (env.plugin.empty()) {
    if (env.task.empty()) throw std::invalid_argument("no environment named (give a plugin, a task or both)");
    if (std::find(program_envs.begin(), program_envs.end(), env.task) != program_envs.end()) {
      f.task = env.task;
      return f;
    }
    const PluginDescriptor* named = catalog.find(env.task);
    if (named && !is_env_plugin(named)) {
      std::vector<std::string> names;
      throw std::invalid_argument("plugin '" + env.task + "' is a loss head, not an environment (environments: " +
                                  known_envs(catalog, program_envs, names) + ")");
    }
    if (const PluginDescriptor* d = named; is_env_plugin(d)) {
      f.plugin = env.task;
      f.desc = d;
      f.task_desc = &d->envs[0];
      f.task = d->envs[0].task;
      return f;
    }
    for (const auto& n : catalog.names()) {
      const PluginDescriptor* d = catalog.find(n);
      if (!is_env_plugin(d)) continue;
      if (const EnvDescriptor* t = find_task(*d, env.task)) {
        f.plugin = d->name;
        f.desc = d;
        f.task_desc = t;
        f.task = env.task;
        return f;
      }
    }
    unknown("environment", env.task, catalog, program_envs);
  }
  const PluginDescriptor* d = catalog.find(env.plugin);
  if (!d) unknown("environment plugin", env.plugin, catalog, program_envs);
  if (!is_env_plugin(d)) {
    std::vector<std::string> names;
    throw std::invalid_argument("plugin '" + env.plugin + "' is a loss head, not an environment plugin (environments: " +
                                known_envs(catalog, program_envs, names) + ")");
  }
  f.plugin = env.plugin;
  f.desc = d;
  if (env.task.empty()) {
    f.task_desc = &d->envs[0];
  } else if (!(f.task_desc = find_task(*d, env.task))) {
    const std::vector<std::string> tasks = task_names(*d);
    std::string why = "plugin '" + env.plugin + "' has no task '" + env.task + "'";
    const std::string best = closest_match(env.task, tasks);
    if (!best.empty()) why += ", did you mean '" + best + "'?";
    throw std::invalid_argument(why + " (its tasks: " + join(tasks) + ")");
  }
  f.task = f.task_desc->task;
  return f;
}

}  // namespace dqn
