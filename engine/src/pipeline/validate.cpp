/** @file validate.cpp
 *  @brief The validator: one pass over the tree that reads every key through the schema table, checks
 *  the rules between keys, heads and plugin params, and collects every error it finds (file:line:column,
 *  key path, value, why) before throwing. parse_pipeline and load_pipeline start here.
 */
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "pipeline/head_params.hpp"
#include "pipeline/parse.hpp"
#include "pipeline/schema.hpp"
#include "pipeline/text.hpp"
#include "pipeline/tree.hpp"

namespace dqn {
namespace {

using namespace dsl;
using Type = PipelineKey::Type;

using Fields = std::map<std::string, const Entry*>;

class Validator {
 public:
  Validator(const PluginCatalog* catalog, std::function<EnvProbe(const EnvChoice&)> environments,
            std::vector<std::string> program_envs, std::string source)
      : catalog_(catalog), environments_(std::move(environments)), program_envs_(std::move(program_envs)),
        source_(std::move(source)) {}

  std::vector<PipelineError> errors;

  PipelineSpec run(const Node& root);

 private:
  struct HeadWork {
    const PluginDescriptor* desc = nullptr;
    bool role_given = false;
  };

  void fail(const SourceLoc& loc, const std::string& key, const std::string& value, std::string why,
            std::string hint = {}) {
    errors.emplace_back(loc, key, value, std::move(why), std::move(hint));
  }
  void fail(const Node& n, const std::string& key, std::string why, std::string hint = {}) {
    fail(n.loc, key, render(n), std::move(why), std::move(hint));
  }

  Fields fields(const Node& n, const std::string& path, const std::vector<std::string>& keys,
                std::vector<const Entry*>* extras = nullptr);
  void unknown_key(const Entry& e, const std::string& path, const std::vector<std::string>& keys,
                   const std::string& context = {});
  static std::string got(const Node& n);
  static const Node* find(const Fields& f, const std::string& key);

  // Typed readers on one node; nullopt after recording the error.
  std::optional<std::int64_t> as_int(const Node& v, const std::string& path);
  std::optional<double> as_number(const Node& v, const std::string& path);
  std::optional<bool> as_bool(const Node& v, const std::string& path);
  std::optional<std::string> as_string(const Node& v, const std::string& path);
  std::optional<std::int64_t> as_int_in(const Node& v, const std::string& path, const IntegerRange& r);
  std::optional<double> as_number_in(const Node& v, const std::string& path, const NumberRange& r);

  /// The value of key `k` written at `v`, checked against the table's type and bounds or choices.
  std::optional<KeyValue> read_value(const PipelineKey& k, const Node& v, const std::string& path);
  std::optional<KeyValue> read_list(const PipelineKey& k, const Node& v, const std::string& path);
  /// Reads key `k` of `f` (a head's, or a section's) into `out`; absent keys keep `out` (the
  /// default). Returns the node when the key is written, valid or not.
  template <class T>
  const Node* read_key(const Fields& f, const PipelineKey& k, const std::string& path, T& out);

  // The schema walk: every key of a section read into the spec, with the rules between keys.
  void read_section(const std::string& section, const Node& n, PipelineSpec& spec);
  bool may_read_section(const std::string& section, const Node& n, const Fields& f);
  void check_key(const PipelineKey& k, const Node& v, const PipelineSpec& spec);
  void check_section(const std::string& section, const Node& n, const PipelineSpec& spec);

  void read_heads(const Node& n, PipelineSpec& spec, std::vector<HeadWork>& work);
  void read_head_params(const std::vector<const Entry*>& extras, const std::string& path, HeadSpec& h,
                        const PluginDescriptor* d);
  void check_heads(const Node& heads_node, PipelineSpec& spec, std::vector<HeadWork>& work);

  /// A param without a schema, typed as YAML reads it; nullopt (after the error) unless one value.
  std::optional<HeadParam> untyped_param(const Node& v, const std::string& path, const char* what);
  void read_env(const Node& v, PipelineSpec& spec);
  void check_environment(const PipelineSpec& spec);

  const PluginCatalog* catalog_;
  std::function<EnvProbe(const EnvChoice&)> environments_;
  std::vector<std::string> program_envs_;
  bool env_given_ = false;
  bool env_refused_ = false;  ///< training.env's own error was reported: nothing to probe
  std::string source_;
  SourceLoc top_loc_;
  /// The node of every key the pipeline gives, by path: where the rules between keys point.
  std::map<std::string, const Node*> given_;
};

// ---------------------------------------------------------------------------------------------
// Maps and typed values.

/// The map's entries by key (first occurrence). Keys outside `keys` are errors, or collected into
/// `extras` when given (a head's params).
Fields Validator::fields(const Node& n, const std::string& path, const std::vector<std::string>& keys,
                         std::vector<const Entry*>* extras) {
  Fields f;
  if (n.kind != Node::Kind::map) {
    fail(n, path, std::string("expected a map") + got(n), "keys here: " + join(keys));
    return f;
  }
  for (const auto& e : n.entries) {
    if (std::find(keys.begin(), keys.end(), e.key) != keys.end()) {
      f.emplace(e.key, &e);  // emplace keeps the first of duplicates (reported elsewhere)
    } else if (extras) {
      bool seen = std::any_of(extras->begin(), extras->end(), [&](const Entry* x) { return x->key == e.key; });
      if (!seen) extras->push_back(&e);
    } else {
      unknown_key(e, path, keys);
    }
  }
  return f;
}

void Validator::unknown_key(const Entry& e, const std::string& path, const std::vector<std::string>& keys,
                            const std::string& context) {
  std::string why = "unknown key" + context;
  std::string best = closest_match(e.key, keys);
  if (!best.empty()) why += ", did you mean '" + best + "'?";
  fail(e.key_loc, join_path(path, e.key), render(e.value), why,
       "valid keys " + (path.empty() ? std::string("at the top level") : "in '" + path + "'") + ": " +
           join(keys));
}

std::string Validator::got(const Node& n) {
  switch (n.kind) {
    case Node::Kind::null: return ", got nothing";
    case Node::Kind::seq: return ", got a list";
    case Node::Kind::map: return ", got a map";
    case Node::Kind::scalar: return n.quoted ? ", got a quoted string" : "";
  }
  return "";
}

const Node* Validator::find(const Fields& f, const std::string& key) {
  auto it = f.find(key);
  return it == f.end() ? nullptr : &it->second->value;
}

std::optional<std::int64_t> Validator::as_int(const Node& v, const std::string& path) {
  std::int64_t i = 0;
  if (v.kind == Node::Kind::scalar && !v.quoted) {
    IntParse r = parse_int(v.text, i);
    if (r == IntParse::ok) return i;
    if (r == IntParse::overflow) {
      fail(v, path, "integer out of range");
      return std::nullopt;
    }
    if (parse_number(v.text)) {
      fail(v, path, "expected an integer (a whole number)");
      return std::nullopt;
    }
  }
  fail(v, path, "expected an integer" + got(v), v.quoted ? "remove the quotes" : "");
  return std::nullopt;
}

std::optional<double> Validator::as_number(const Node& v, const std::string& path) {
  if (v.kind == Node::Kind::scalar && !v.quoted) {
    if (auto d = parse_number(v.text)) {
      if (std::isfinite(*d)) return d;
      fail(v, path, "expected a finite number");
      return std::nullopt;
    }
  }
  fail(v, path, "expected a number" + got(v), v.quoted ? "remove the quotes" : "");
  return std::nullopt;
}

std::optional<bool> Validator::as_bool(const Node& v, const std::string& path) {
  if (v.kind == Node::Kind::scalar && !v.quoted)
    if (auto b = parse_bool(v.text)) return b;
  std::string hint = v.quoted ? "remove the quotes" : "";
  if (v.kind == Node::Kind::scalar && !v.quoted && yaml11_bool_word(v.text))
    hint = "'" + v.text + "' is ambiguous (YAML readers differ on it): write true or false";
  fail(v, path, "expected true or false" + got(v), hint);
  return std::nullopt;
}

std::optional<std::string> Validator::as_string(const Node& v, const std::string& path) {
  if (v.kind == Node::Kind::scalar) return v.text;
  fail(v, path, "expected a string" + got(v));
  return std::nullopt;
}

std::optional<std::int64_t> Validator::as_int_in(const Node& v, const std::string& path, const IntegerRange& r) {
  auto i = as_int(v, path);
  if (i && !r.contains(*i)) {
    fail(v, path, "must be " + r.text(*i));
    return std::nullopt;
  }
  return i;
}

std::optional<double> Validator::as_number_in(const Node& v, const std::string& path, const NumberRange& r) {
  auto d = as_number(v, path);
  if (d && !r.contains(*d)) {
    fail(v, path, "must be " + r.text());
    return std::nullopt;
  }
  return d;
}

std::optional<KeyValue> Validator::read_value(const PipelineKey& k, const Node& v, const std::string& path) {
  switch (k.type) {
    case Type::boolean:
      if (auto b = as_bool(v, path)) return KeyValue{*b};
      return std::nullopt;
    case Type::integer:
      if (!k.word.empty() && v.kind == Node::Kind::scalar && !v.quoted && v.text == k.word)
        return KeyValue{std::int64_t{0}};  // (the one integer key with a word: eval.every's never)
      if (auto i = as_int_in(v, path, k.integers)) return KeyValue{*i};
      return std::nullopt;
    case Type::number:
      if (auto d = as_number_in(v, path, k.numbers)) return KeyValue{*d};
      return std::nullopt;
    case Type::string:
      if (auto s = as_string(v, path)) return KeyValue{*s};
      return std::nullopt;
    case Type::choice: {
      auto s = as_string(v, path);
      if (!s) return std::nullopt;
      if (std::find(k.choices.begin(), k.choices.end(), *s) != k.choices.end()) return KeyValue{*s};
      std::string why = "expected one of " + join(k.choices);
      std::string best = closest_match(*s, k.choices);
      if (!best.empty()) why += ", did you mean '" + best + "'?";
      fail(v, path, why);
      return std::nullopt;
    }
    case Type::integer_list:
    case Type::number_pair: return read_list(k, v, path);
    case Type::section:
    case Type::heads:
    case Type::env: break;
  }
  throw std::logic_error("read_value: '" + k.path + "' is not a single value");
}

/// A list is read whole or not at all: one bad element keeps the default.
std::optional<KeyValue> Validator::read_list(const PipelineKey& k, const Node& v, const std::string& path) {
  const bool pair = k.type == Type::number_pair;
  if (!k.word.empty() && v.kind == Node::Kind::scalar && !v.quoted && v.text == k.word)
    return KeyValue{std::vector<std::int64_t>{}};
  if (v.kind != Node::Kind::seq || (pair && v.items.size() != 2)) {
    fail(v, path, "expected " + k.shape + got(v), "e.g. " + k.example);
    return std::nullopt;
  }
  if (pair) {
    auto first = as_number_in(v.items[0], index_path(path, 0), k.numbers);
    auto second = as_number_in(v.items[1], index_path(path, 1), k.numbers);
    if (!first || !second) return std::nullopt;
    return KeyValue{std::array<double, 2>{*first, *second}};
  }
  if (v.items.size() < k.min_items || v.items.size() > k.max_items) {
    fail(v, path, "needs " + std::to_string(k.min_items) + " to " + std::to_string(k.max_items) + " " + k.items +
                      ", got " + std::to_string(v.items.size()));
    return std::nullopt;
  }
  std::vector<std::int64_t> values;
  for (std::size_t i = 0; i < v.items.size(); ++i)
    if (auto x = as_int_in(v.items[i], index_path(path, i), k.integers)) values.push_back(*x);
  if (values.size() != v.items.size()) return std::nullopt;
  if (k.unique)
    for (std::size_t i = 1; i < values.size(); ++i)
      for (std::size_t j = 0; j < i; ++j)
        if (values[i] == values[j]) {
          fail(v.items[i], index_path(path, i),
               std::to_string(values[i]) + " is listed twice (also at index " + std::to_string(j) + ")");
          return std::nullopt;
        }
  return KeyValue{values};
}

template <class T>
const Node* Validator::read_key(const Fields& f, const PipelineKey& k, const std::string& path, T& out) {
  const Node* v = find(f, k.name());
  if (!v) return nullptr;
  if (auto value = read_value(k, *v, join_path(path, k.name()))) out = std::get<T>(*value);
  return v;
}

// ---------------------------------------------------------------------------------------------
// The schema walk, and the rules between keys.

void Validator::read_section(const std::string& section, const Node& n, PipelineSpec& spec) {
  const Fields f = fields(n, section, child_names(section));
  if (!may_read_section(section, n, f)) return;
  for (const PipelineKey* k : child_keys(section)) {
    const Node* v = find(f, k->name());
    if (v) given_[k->path] = v;
    if (k->type == Type::heads) {
      if (!v) {
        fail(top_loc_, "heads", "", "missing: a pipeline needs at least one head",
             "e.g. heads: [{plugin: c51, role: primary}]");
        continue;
      }
      std::vector<HeadWork> work;
      read_heads(*v, spec, work);
      if (!spec.heads.empty() && spec.heads.size() == v->items.size()) check_heads(*v, spec, work);
    } else if (!v) {
      continue;
    } else if (k->type == Type::env) {
      read_env(*v, spec);
    } else if (k->type == Type::section) {
      read_section(k->path, *v, spec);
    } else if (auto value = read_value(*k, *v, k->path)) {
      k->set(spec, *value);
      check_key(*k, *v, spec);
    }
  }
  if (section == "training" && !env_given_ && !spec.training.dataset.empty())
    spec.training.env = EnvChoice{};  // offline, and no environment named: none
  check_section(section, n, spec);
}

/// Rules a section's keys must meet before any is read: kExclusiveKeys (target's polyak or
/// period), not both.
bool Validator::may_read_section(const std::string& section, const Node& n, const Fields& f) {
  if (section != kExclusiveKeys[0].section) return true;
  const ExclusiveKeys& x = kExclusiveKeys[0];
  const bool polyak = f.count(x.first) != 0, period = f.count(x.second) != 0;
  if (polyak && period) {
    // Both point into the same map's entries: the later one is the second written.
    const Entry* second = std::max(f.at(x.first), f.at(x.second));
    fail(second->key_loc, "target." + second->key, render(second->value),
         "give either 'polyak' (soft update every step) or 'period' (hard copy), not both",
         "on the command line, setting one clears the other");
    return false;
  }
  if (!polyak && !period && n.kind == Node::Kind::map) {
    fail(n, "target", "needs 'polyak' (e.g. 0.005) or 'period' (e.g. 1000)");
    return false;
  }
  return true;
}

/// Rules on one value beyond its type and bounds, once it is read.
void Validator::check_key(const PipelineKey& k, const Node& v, const PipelineSpec& spec) {
  if (k.path == "name" && (spec.name.empty() || spec.name.find('/') != std::string::npos)) {
    fail(v, "name", "a pipeline name is non-empty and has no '/'", "it names the run directory (runs/<name>-<time>)");
  }
}

/// Rules between a section's keys, once all of them are read ("" is the whole pipeline).
void Validator::check_section(const std::string& section, const Node& n, const PipelineSpec& spec) {
  auto at = [&](const std::string& path) {
    auto it = given_.find(path);
    return it == given_.end() ? nullptr : it->second;
  };
  if (section == "network" && !(spec.network.v_min < spec.network.v_max)) {
    const Node* vmin = at("network.v_min");
    const Node* vmax = at("network.v_max");
    const Node* blame = vmax ? vmax : vmin;
    fail(blame ? blame->loc : n.loc, blame == vmin ? "network.v_min" : "network.v_max", blame ? render(*blame) : "",
         "v_min (" + fmt(spec.network.v_min) + ") must be below v_max (" + fmt(spec.network.v_max) + ")");
  } else if (section.empty() && environments_) {
    check_environment(spec);
  }
  if (section.empty() && spec.training.eval.every == 0) {
    // No evaluation: a stopping rule that reads one could never end the run.
    for (const auto& [key, on] : {std::pair<std::string, bool>{"training.stop_at_return", spec.training.stop_at_return != 0},
                                  {"training.stop_at_success", spec.training.stop_at_success != 0}}) {
      if (!on) continue;
      const Node* blame = at(key);
      if (!blame) blame = at("training.eval.every");
      fail(blame ? blame->loc : top_loc_, key,
           fmt(key == "training.stop_at_return" ? spec.training.stop_at_return : spec.training.stop_at_success),
           "stops the run on an evaluation, but training.eval.every is 0 (never): there is none",
           "set " + key + "=0, or evaluate (training.eval.every > 0)");
    }
  }
  if (section.empty() && spec.training.replay.capacity < spec.batch) {
    const Node* blame = at("training.replay.capacity");
    if (!blame) blame = at("batch");
    const std::string capacity = std::to_string(spec.training.replay.capacity);
    fail(blame ? blame->loc : top_loc_, "training.replay.capacity", capacity,
         "the replay holds " + capacity + " transitions, fewer than one batch (" + std::to_string(spec.batch) + ")",
         "make training.replay.capacity at least the batch size");
  }
}

std::optional<HeadParam> Validator::untyped_param(const Node& v, const std::string& path, const char* what) {
  if (v.kind != Node::Kind::scalar) {
    fail(v, path, std::string("a ") + what + " is one value (a number, true/false or a string)" + got(v));
    return std::nullopt;
  }
  std::int64_t i = 0;
  if (v.quoted) return HeadParam{v.text};
  if (auto b = parse_bool(v.text)) return HeadParam{*b};
  if (parse_int(v.text, i) == IntParse::ok) return HeadParam{i};
  if (auto num = parse_number(v.text); num && std::isfinite(*num)) return HeadParam{*num};
  return HeadParam{v.text};
}

/// training.env: a name, or a map of plugin, task and the task's options; found, and its options
/// checked against the task's schema, where there is a catalog.
void Validator::read_env(const Node& v, PipelineSpec& spec) {
  env_given_ = true;
  EnvChoice e;
  e.loc = v.loc;
  SourceLoc name_loc = v.loc;
  std::string name_key = "training.env";
  if (v.kind == Node::Kind::scalar) {
    e.task = v.text;
  } else if (v.kind == Node::Kind::map) {
    std::vector<const Entry*> extras;
    const Fields f = fields(v, "training.env", {"plugin", "task"}, &extras);
    if (const Node* p = find(f, "plugin")) {
      if (auto str = as_string(*p, "training.env.plugin")) e.plugin = *str;
      name_loc = p->loc;
      name_key = "training.env.plugin";
    }
    if (const Node* t = find(f, "task")) {
      if (auto str = as_string(*t, "training.env.task")) e.task = *str;
      // The task is what is wrong unless the plugin is unknown.
      if (e.plugin.empty() || (catalog_ && catalog_->find(e.plugin))) {
        name_loc = t->loc;
        name_key = "training.env.task";
      }
    }
    if (e.none()) {
      fail(v, "training.env", "names no environment: give its 'plugin' (and 'task' where the plugin has several)",
           "e.g. training.env: {plugin: reacher, links: 6}");
      return;
    }
    for (const Entry* x : extras)
      if (auto hp = untyped_param(x->value, join_path("training.env", x->key), "task option")) {
        e.options[x->key] = *hp;
        e.option_locs[x->key] = x->value.loc;
      }
  } else {
    fail(v, "training.env", "expected an environment's name or a map {plugin: …, task: …, options…}" + got(v),
         "e.g. training.env: CartPole-v1");
    return;
  }
  if (catalog_ && !e.none()) {
    try {
      const FoundEnv found = find_env(e, *catalog_, program_envs_);
      e.plugin = found.plugin;
      e.task = found.task;
      if (found.task_desc) {
        std::vector<std::string> storage;
        resolve_env_options(e, *found.task_desc, storage);
      } else if (!e.options.empty()) {
        fail(e.option_locs.begin()->second, "training.env." + e.options.begin()->first,
             param_text(e.options.begin()->second), "the program's own environment '" + e.task + "' takes no options");
      }
    } catch (const PipelineErrors& errs) {
      env_refused_ = true;
      errors.insert(errors.end(), errs.errors().begin(), errs.errors().end());
    } catch (const std::invalid_argument& x) {
      env_refused_ = true;
      fail(name_loc, name_key, name_key == "training.env.plugin" ? e.plugin : e.task, x.what());
    }
  }
  spec.training.env = std::move(e);
}

/// A pipeline about to train checked against its environment: made into one copy with its options;
/// the network keys that do not fit it are errors.
void Validator::check_environment(const PipelineSpec& spec) {
  const EnvChoice& e = spec.training.env;
  auto at = [&](const std::string& path) -> SourceLoc {
    auto it = given_.find(path);
    if (it != given_.end()) return it->second->loc;
    auto sec = given_.lower_bound(path.substr(0, path.find('.') + 1));
    return sec != given_.end() ? sec->second->loc : top_loc_;
  };
  if (e.none()) {
    if (spec.training.dataset.empty())
      fail(at("training.env"), "training.env", "", "an online run needs an environment",
           "name one (training.env: CartPole-v1; `dqn plugins` lists them), or train offline from training.dataset");
    return;
  }
  if (env_refused_) return;
  const EnvProbe probe = environments_(e);
  if (!probe.found) return;  // (an unknown plugin or task is training.env's own error)
  const std::string where = "the environment " + (e.plugin.empty() ? e.task : e.plugin + ":" + e.task);
  if (!probe.error.empty()) {
    // Where the environment's message names an option the pipeline writes, the error points there.
    for (const auto& [key, loc] : e.option_locs)
      if (probe.error.find("option '" + key + "'") != std::string::npos) {
        fail(loc, "training.env." + key, param_text(e.options.at(key)), where + " refused its options: " + probe.error);
        return;
      }
    fail(at("training.env"), "training.env", "", where + " refused its options: " + probe.error);
    return;
  }
  const EnvShape* env = &probe.shape;
  const NetworkSpec& n = spec.network;
  if (env->obs_dim != n.state)
    fail(at("network.state"), "network.state", std::to_string(n.state),
         where + " has " + std::to_string(env->obs_dim) + " observation features",
         "set network.state: " + std::to_string(env->obs_dim));
  if (int(env->branch_actions.size()) != n.branches)
    fail(at("network.branches"), "network.branches", std::to_string(n.branches),
         where + " has " + std::to_string(env->branch_actions.size()) + " action branches",
         "set network.branches: " + std::to_string(env->branch_actions.size()));
  else
    for (std::size_t d = 0; d < env->branch_actions.size(); ++d)
      if (env->branch_actions[d] != n.actions) {
        fail(at("network.actions"), "network.actions", std::to_string(n.actions),
             where + "'s branch " + std::to_string(d) + " has " + std::to_string(env->branch_actions[d]) + " actions",
             "set network.actions: " + std::to_string(env->branch_actions[d]));
        break;
      }
}

PipelineSpec Validator::run(const Node& root) {
  PipelineSpec spec;
  Node empty;
  empty.kind = Node::Kind::map;
  empty.loc = SourceLoc{source_, 1, 1};
  const Node* top = &root;
  if (root.kind == Node::Kind::null) {
    top = &empty;
  } else if (root.kind != Node::Kind::map) {
    fail(root, "", "a pipeline is a map of keys (name, network, heads, ...)" + got(root));
    return spec;
  }
  top_loc_ = top->loc;
  read_section("", *top, spec);
  return spec;
}

// ---------------------------------------------------------------------------------------------
// Heads: their own keys from the head table, their params from their plugin's schema, and the
// rules between heads (names, one primary, budgets).

void Validator::read_head_params(const std::vector<const Entry*>& extras, const std::string& path, HeadSpec& h,
                                 const PluginDescriptor* d) {
  std::vector<std::string> valid = head_key_names();
  if (d)
    for (std::uint32_t i = 0; i < d->schema_len; ++i) valid.push_back(d->schema[i].key);

  for (const Entry* e : extras) {
    std::string p = join_path(path, e->key);
    const Node& v = e->value;
    if (!d) {  // no catalog: keep what is written, typed as YAML would read it
      if (auto hp = untyped_param(v, p, "head param")) {
        h.params[e->key] = *hp;
        h.param_locs[e->key] = v.loc;
      }
      continue;
    }
    const ParamSchema* s = find_schema(*d, e->key);
    if (!s) {
      unknown_key(*e, path, valid, " for plugin '" + h.plugin + "'");
      continue;
    }
    std::optional<HeadParam> hp;
    switch (s->type) {
      case ParamType::boolean:
        if (auto b = as_bool(v, p)) hp = *b;
        break;
      case ParamType::integer:
        if (auto i = as_int(v, p)) {
          if (!schema_range(*s).contains(static_cast<double>(*i)))
            fail(v, p, "must be " + schema_range(*s).text());
          else
            hp = *i;
        }
        break;
      case ParamType::number:
        if (auto x = as_number_in(v, p, schema_range(*s))) hp = *x;
        break;
      case ParamType::string:
        if (auto str = as_string(v, p)) hp = *str;
        break;
    }
    if (hp) {
      h.params[e->key] = *hp;
      h.param_locs[e->key] = v.loc;
    }
  }
  if (!d) return;
  const std::vector<std::string> head_names = head_key_names();
  for (std::uint32_t i = 0; i < d->schema_len; ++i) {
    const ParamSchema& s = d->schema[i];
    if (!s.key) continue;
    if (std::find(head_names.begin(), head_names.end(), s.key) != head_names.end()) {
      fail(h.plugin_loc, path + ".plugin", h.plugin,
           "plugin '" + h.plugin + "' declares a param '" + s.key +
               "', which is a head key of the pipeline (a bug in the plugin)");
      continue;
    }
    if (!s.default_value) {
      if (!h.params.count(s.key))
        fail(h.loc, join_path(path, s.key), "",
             std::string("missing: plugin '") + h.plugin + "' needs '" + s.key + "' (" + type_name(s.type) +
                 (s.doc ? std::string(", ") + s.doc : "") + ")");
      continue;
    }
    if (!parse_default(s))
      fail(h.plugin_loc, path + ".plugin", h.plugin,
           std::string("plugin '") + h.plugin + "' gives '" + s.key + "' the default '" + s.default_value +
               "', which is not " + a_type(s.type) + " (a bug in the plugin)");
  }
}

void Validator::read_heads(const Node& n, PipelineSpec& spec, std::vector<HeadWork>& work) {
  if (n.kind != Node::Kind::seq) {
    fail(n, "heads", "expected a list of heads" + got(n), "e.g. heads: [{plugin: c51, role: primary}]");
    return;
  }
  if (n.items.empty()) {
    fail(n, "heads", "needs at least one head", "e.g. heads: [{plugin: c51, role: primary}]");
    return;
  }
  for (std::size_t i = 0; i < n.items.size(); ++i) {
    const Node& item = n.items[i];
    std::string p = index_path("heads", i);
    if (item.kind != Node::Kind::map) {
      fail(item, p, "a head is a map with at least 'plugin'" + got(item), "e.g. {plugin: c51, role: primary}");
      continue;
    }
    std::vector<const Entry*> extras;
    Fields f = fields(item, p, head_key_names(), &extras);
    HeadSpec h;
    HeadWork w;
    h.loc = item.loc;
    if (const Node* pl = read_key(f, head_key("plugin"), p, h.plugin)) {
      h.plugin_loc = pl->loc;
      if (pl->kind == Node::Kind::scalar && h.plugin.empty()) fail(*pl, p + ".plugin", "the plugin name is empty");
    } else {
      std::string hint = "e.g. plugin: c51";
      if (catalog_) hint = "plugins found: " + join(catalog_->names());
      fail(item.loc, p + ".plugin", "", "missing: every head names its plugin", hint);
    }
    if (const Node* nm = read_key(f, head_key("name"), p, h.name)) {
      h.name_loc = nm->loc;
      if (nm->kind == Node::Kind::scalar && !is_identifier(h.name)) {
        fail(*nm, p + ".name", "a head name is a letter or '_' followed by letters, digits, '_' or '-'",
             "it names buffers and overrides (heads.<name>.budget=...)");
      }
    }
    std::string role;
    if (const Node* r = read_key(f, head_key("role"), p, role)) {
      h.role_loc = r->loc;
      w.role_given = true;
    }
    if (!role.empty()) h.role = role == to_string(Role::primary) ? Role::primary : Role::auxiliary;
    if (const Node* b = read_key(f, head_key("budget"), p, h.budget)) h.budget_loc = b->loc;
    if (const Node* en = read_key(f, head_key("enabled"), p, h.enabled)) h.enabled_loc = en->loc;

    bool plugin_known = true;
    if (catalog_ && !h.plugin.empty()) {
      w.desc = catalog_->find(h.plugin);
      if (!w.desc) {
        plugin_known = false;
        std::vector<std::string> names = catalog_->names();
        std::string why = "plugin '" + h.plugin + "' not found";
        std::string best = closest_match(h.plugin, names);
        if (!best.empty()) why += ", did you mean '" + best + "'?";
        fail(h.plugin_loc, p + ".plugin", h.plugin, why,
             (names.empty() ? std::string("no plugins were found") : "plugins found: " + join(names)) +
                 " (search path: " + catalog_->search_path() + ")");
      }
    }
    if (plugin_known) read_head_params(extras, p, h, w.desc);
    if (h.name.empty()) {
      h.name = h.plugin;
      if (!h.plugin.empty() && !is_identifier(h.name))
        fail(h.plugin_loc, p + ".plugin", h.plugin, "the plugin name is not usable as the head's name",
             "give the head a 'name:' (a letter or '_' followed by letters, digits, '_' or '-')");
    }
    spec.heads.push_back(std::move(h));
    work.push_back(w);
  }
}

void Validator::check_heads(const Node& heads_node, PipelineSpec& spec,
                            std::vector<HeadWork>& work) {
  // Duplicate instance names.
  for (std::size_t i = 0; i < spec.heads.size(); ++i) {
    const HeadSpec& h = spec.heads[i];
    for (std::size_t j = 0; j < i; ++j) {
      if (spec.heads[j].name != h.name || h.name.empty()) continue;
      bool given = h.name_loc.line > 0 || !h.name_loc.file.empty();
      fail(given ? h.name_loc : h.plugin_loc,
           index_path("heads", i) + (given ? ".name" : ".plugin"), given ? h.name : h.plugin,
           "head name '" + h.name + "' is already used by " + index_path("heads", j),
           "give this head its own 'name:' (e.g. name: " + h.name + "_2)");
      break;
    }
  }

  // Exactly one primary, enabled, able to be primary, without a budget of its own.
  std::size_t primary = spec.heads.size();
  for (std::size_t i = 0; i < spec.heads.size(); ++i) {
    HeadSpec& h = spec.heads[i];
    std::string p = index_path("heads", i);
    if (h.role != Role::primary) continue;
    if (primary != spec.heads.size()) {
      fail(h.role_loc, p + ".role", "primary",
           "a second primary head (the first is " + index_path("heads", primary) + " '" +
               spec.heads[primary].name + "'); exactly one head is primary",
           "make this one 'role: auxiliary'");
      continue;
    }
    primary = i;
    if (!h.enabled)
      fail(h.enabled_loc, p + ".enabled", "false", "the primary head cannot be disabled",
           "make another head primary, or enable this one");
    if (h.budget >= 0)
      fail(h.budget_loc, p + ".budget", fmt(h.budget),
           "the primary head takes what the auxiliaries leave; it has no budget of its own",
           "remove 'budget' here, or change the auxiliaries' budgets");
    if (work[i].desc && work[i].desc->can_be_primary == 0) {
      std::vector<std::string> capable;
      if (catalog_)
        for (const auto& nm : catalog_->names())
          if (const PluginDescriptor* d = catalog_->find(nm); d && d->can_be_primary) capable.push_back(nm);
      fail(h.role_loc, p + ".role", "primary",
           "plugin '" + h.plugin + "' cannot be the primary head (it does not produce a*, m and td_error)",
           capable.empty() ? std::string() : "plugins that can be primary: " + join(capable));
    }
  }
  if (primary == spec.heads.size() && !spec.heads.empty()) {
    std::string hint = "add 'role: primary' to one head";
    for (std::size_t i = 0; i < spec.heads.size(); ++i)
      if (work[i].desc && work[i].desc->can_be_primary) {
        hint += ", e.g. " + index_path("heads", i) + " '" + spec.heads[i].name + "'";
        break;
      }
    fail(heads_node, "heads", "no primary head: exactly one head must have 'role: primary'",
         hint);
  }

  // Auxiliary budgets: the plugin's default unless written; together they must leave the
  // primary something.
  double sum = 0;
  std::string parts;
  // The error points at the largest written budget (what the user most likely lowers), else at
  // the largest default.
  const std::size_t none = spec.heads.size();
  std::size_t blame_written = none, blame_default = none;
  for (std::size_t i = 0; i < spec.heads.size(); ++i) {
    HeadSpec& h = spec.heads[i];
    if (h.role != Role::auxiliary) continue;
    bool explicit_budget = h.budget >= 0;
    if (!explicit_budget && work[i].desc) {
      if (work[i].desc->default_budget > 0 && work[i].desc->default_budget < 1) {
        h.budget = work[i].desc->default_budget;
      } else if (primary < spec.heads.size()) {  // with no primary, that is the error to fix
        fail(work[i].role_given ? h.role_loc : h.loc,
             index_path("heads", i) + (work[i].role_given ? ".role" : ""),
             work[i].role_given ? "auxiliary" : "",
             "plugin '" + h.plugin + "' has no default budget (" +
                 fmt(work[i].desc->default_budget) + "), so as an auxiliary head it needs one",
             "add 'budget: 0.1' (a fraction in (0, 1)), or make it 'role: primary'");
      }
    }
    if (!h.enabled || h.budget < 0) continue;
    sum += h.budget;
    parts += (parts.empty() ? "" : ", ") + index_path("heads", i) + " '" + h.name + "' " +
             fmt(h.budget) + (explicit_budget ? "" : " (default)");
    std::size_t& blame = explicit_budget ? blame_written : blame_default;
    if (blame == none || h.budget > spec.heads[blame].budget) blame = i;
  }
  double left = 1.0 - sum;
  std::size_t blame = blame_written != none ? blame_written : blame_default;
  if (blame != none && left <= 1e-9) {
    const HeadSpec& b = spec.heads[blame];
    bool given = blame == blame_written;
    std::string prim = primary < spec.heads.size() ? "'" + spec.heads[primary].name + "' " : "";
    fail(given ? b.budget_loc : b.loc, index_path("heads", blame) + ".budget", fmt(b.budget),
         "auxiliary budgets sum to " + fmt(sum) + ", leaving the primary " + prim +
             fmt(std::abs(left) < 1e-12 ? 0.0 : left) + " (must be > 0)",
         "budgets: " + parts + "; lower them or disable a head with 'enabled: false'");
  }
}

void sort_errors(std::vector<PipelineError>& errs) {
  std::stable_sort(errs.begin(), errs.end(), [](const PipelineError& a, const PipelineError& b) {
    auto rank = [](const PipelineError& e) {
      bool ov = e.where().file.rfind("<override", 0) == 0;
      return std::tuple<int, int, int>(ov ? 1 : 0, e.where().line, e.where().column);
    };
    return rank(a) < rank(b);
  });
}

}  // namespace

PipelineSpec parse_pipeline(const std::string& yaml_text, const std::string& source_name,
                            const ParseOptions& opt) {
  std::vector<PipelineError> errs;
  Node root = read_document(yaml_text, source_name);
  for (const auto& o : opt.overrides) apply_override(root, o, errs);
  find_duplicates(root, "", errs);

  Validator v(opt.plugins, opt.environments, opt.program_envs, source_name);
  PipelineSpec spec = v.run(root);
  errs.insert(errs.end(), v.errors.begin(), v.errors.end());
  if (!errs.empty()) {
    sort_errors(errs);
    throw PipelineErrors(std::move(errs));
  }
  spec.source.clear();
  return spec;
}

PipelineSpec load_pipeline(const std::string& path, const ParseOptions& opt) {
  // A FIFO or a device would block or never end: only a regular file of a bounded size is read.
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    auto refuse = [&](const std::string& why, const std::string& hint) {
      throw PipelineErrors({PipelineError(SourceLoc{path, 0, 0}, "", "", why, hint)});
    };
    if (!S_ISREG(st.st_mode))
      refuse(std::string("not a regular file (") +
                 (S_ISFIFO(st.st_mode) ? "a FIFO" : S_ISDIR(st.st_mode) ? "a directory" : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device" : "a special file") +
                 "): a pipeline is read from a file",
             "write the pipeline to a file first");
    if (std::uint64_t(st.st_size) > dsl::kMaxPipelineBytes)
      refuse("the file is " + std::to_string(st.st_size) + " bytes; a pipeline is at most " +
                 std::to_string(dsl::kMaxPipelineBytes),
             "a pipeline is a few KB of YAML: is this the right file?");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw PipelineErrors({PipelineError(SourceLoc{path, 0, 0}, "", "",
                                        "cannot read the pipeline file",
                                        "check the path (relative paths start at the current directory)")});
  }
  std::ostringstream text;
  text << in.rdbuf();
  PipelineSpec spec = parse_pipeline(text.str(), path, opt);
  spec.source = path;
  return spec;
}

}  // namespace dqn
