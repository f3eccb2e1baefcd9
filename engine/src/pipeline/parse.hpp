/** @file parse.hpp
 *  @brief The pipeline DSL: YAML text → a validated dqn::PipelineSpec, before anything is
 *  allocated. Every error carries file:line:column, the full key path, the value and why.
 *  tree.cpp reads the YAML and applies overrides, validate.cpp checks it through the key table of
 *  schema.hpp, write.cpp writes it back, head_params.cpp resolves plugin params.
 */
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "pipeline/spec.hpp"
#include "dqn/env.hpp"
#include "dqn/plugin.hpp"

namespace dqn {

/// What plugins exist; implemented by the plugin loader (tests use a fake).
class PluginCatalog {
 public:
  virtual ~PluginCatalog() = default;
  virtual const PluginDescriptor* find(const std::string& name) const = 0;  ///< null if not found
  virtual std::vector<std::string> names() const = 0;  ///< every plugin found
  virtual std::string search_path() const = 0;         ///< human text, e.g. "/a:/b"
};

/// What an environment offers the network (ParseOptions::environments).
struct EnvShape {
  int obs_dim = 0;
  std::vector<int> branch_actions;  ///< actions per branch
};

/// One environment tried: its shape, or why it could not be made.
struct EnvProbe {
  bool found = false;  ///< false: no such plugin or task
  std::string error;   ///< the environment refused its options (its message); "" when made
  EnvShape shape;
};

struct ParseOptions {
  /// "key.path=value", applied to the YAML tree after the file and before validation. The value
  /// is a YAML scalar or flow node ("network.trunk=[64,64]"); list elements are addressed by
  /// index ("heads.1.budget=0.3", one past the end appends) or, in a list of maps, by the
  /// element's `name` or, lacking one, its `plugin` ("heads.iqn.budget=0.3").
  std::vector<std::string> overrides;
  /// Null: plugin names, head params, auxiliary default budgets and training.env's plugin, task
  /// and options are not checked or filled. A schema entry whose default_value is null is a
  /// required param.
  const PluginCatalog* plugins = nullptr;
  /// Set by what acts in an environment (dqn train, dqn collect): training.env made into one copy,
  /// and a network that does not fit it is an error at the network's keys, a refusal of its options
  /// an error at training.env. Null: not checked (a step workload, whose resolved file still lists
  /// the training defaults).
  std::function<EnvProbe(const EnvChoice&)> environments;
  /// Tasks the program registers itself (found by name before the plugins' tasks; no options).
  std::vector<std::string> program_envs;
};

/// Reads and validates `path`; throws PipelineErrors (every error found in one pass).
PipelineSpec load_pipeline(const std::string& path, const ParseOptions& opt = {});

/// As load_pipeline, from text; `source_name` is the file name errors show. spec.source is "".
PipelineSpec parse_pipeline(const std::string& yaml_text, const std::string& source_name,
                            const ParseOptions& opt = {});

/// The fully resolved pipeline, every key, re-parseable to an equal spec. Head params are the
/// ones written in the pipeline.
std::string to_yaml(const PipelineSpec& spec);

/// As to_yaml, and every head lists every key of its plugin's schema (defaults filled, each
/// documented in a comment). Heads whose plugin is not in the catalog keep their params.
std::string to_yaml(const PipelineSpec& spec, const PluginCatalog& plugins);

/// The head's params resolved against its plugin's schema (every schema key present, in schema
/// order, defaults filled); the strings point into `storage`, which is cleared and refilled, so
/// keep it alive and untouched while the values are used. `s` holds the value's text for every
/// type; booleans are in `i` (0/1), integers in `i` and `d`, numbers in `d`.
/// Throws PipelineErrors for a param the schema does not know, a value of the wrong type or out
/// of bounds, a missing required param, or a schema default that does not parse.
std::vector<ParamValue> resolve_head_params(const HeadSpec& h, const PluginDescriptor& d,
                                            std::vector<std::string>& storage);

/// training.env's options resolved against its task's schema, as resolve_head_params does for a
/// head (errors at training.env.<key>).
std::vector<ParamValue> resolve_env_options(const EnvChoice& env, const EnvDescriptor& task,
                                            std::vector<std::string>& storage);

/// training.env's plugin and task found in the catalog: a plugin's name finds its first task; a
/// task alone (no plugin) is looked for among `program_envs` (then plugin and task stay null),
/// then as a plugin's name, then among every environment plugin's tasks. Throws
/// std::invalid_argument with the reason and what there is (unknown plugin or task, did you mean,
/// a plugin that is not an environment plugin).
struct FoundEnv {
  std::string plugin;                        ///< the plugin's name ("" for the program's own task)
  std::string task;
  const PluginDescriptor* desc = nullptr;    ///< null for the program's own task
  const EnvDescriptor* task_desc = nullptr;
};
FoundEnv find_env(const EnvChoice& env, const PluginCatalog& catalog, const std::vector<std::string>& program_envs);

/// The fraction of the gradient budget head `head_index` takes: 0 when disabled; the primary gets
/// 1 − Σ enabled auxiliaries; an auxiliary its budget. Throws std::out_of_range for a bad index
/// and std::invalid_argument when an enabled auxiliary's budget was never resolved (parsed without
/// a catalog and no `budget:` written).
double resolved_budget(const PipelineSpec& spec, std::size_t head_index);

/// Edit distance (optimal string alignment) and the closest candidate within a small distance,
/// or "" when none is close. Used for every "did you mean".
std::size_t edit_distance(const std::string& a, const std::string& b);
std::string closest_match(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace dqn
