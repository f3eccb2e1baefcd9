/** @file head_params.cpp
 *  @brief Head params checked against their plugin's schema and resolved with its defaults, and the
 *  gradient budget each head ends up with.
 */
#include "pipeline/head_params.hpp"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <map>
#include <stdexcept>
#include <vector>

#include "dqn/env.hpp"
#include "pipeline/parse.hpp"
#include "pipeline/text.hpp"
#include "pipeline/tree.hpp"

namespace dqn {
namespace dsl {

NumberRange schema_range(const ParamSchema& s) {
  NumberRange r;
  if (!std::isnan(s.min)) r.lo = s.min;
  if (!std::isnan(s.max)) r.hi = s.max;
  return r;
}

const char* type_name(ParamType t) {
  switch (t) {
    case ParamType::boolean: return "boolean";
    case ParamType::integer: return "integer";
    case ParamType::number: return "number";
    case ParamType::string: return "string";
  }
  return "?";
}

std::string a_type(ParamType t) {
  return (t == ParamType::integer ? "an " : "a ") + std::string(type_name(t));
}

const ParamSchema* find_schema(const ParamSchema* schema, std::uint32_t n, const std::string& key) {
  for (std::uint32_t i = 0; i < n; ++i)
    if (schema[i].key && key == schema[i].key) return &schema[i];
  return nullptr;
}

const ParamSchema* find_schema(const PluginDescriptor& d, const std::string& key) {
  return find_schema(d.schema, d.schema_len, key);
}

std::string param_text(const HeadParam& p) {
  if (auto b = std::get_if<bool>(&p)) return *b ? "true" : "false";
  if (auto i = std::get_if<std::int64_t>(&p)) return std::to_string(*i);
  if (auto d = std::get_if<double>(&p)) return format_double(*d);
  return std::get<std::string>(p);
}

std::optional<HeadParam> parse_default(const ParamSchema& s) {
  if (!s.default_value) return std::nullopt;
  std::string t = s.default_value;
  switch (s.type) {
    case ParamType::boolean:
      if (auto b = parse_bool(t)) return HeadParam{*b};
      return std::nullopt;
    case ParamType::integer: {
      std::int64_t i = 0;
      if (parse_int(t, i) == IntParse::ok) return HeadParam{i};
      return std::nullopt;
    }
    case ParamType::number:
      if (auto d = parse_number(t); d && std::isfinite(*d)) return HeadParam{*d};
      return std::nullopt;
    case ParamType::string:
      try {
        YAML::Node y = YAML::Load(t);
        if (y.IsNull()) return HeadParam{std::string()};
        if (y.IsScalar()) return HeadParam{y.Scalar()};
      } catch (const YAML::Exception&) {
      }
      return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace dsl

using namespace dsl;

namespace {

/// Params as written (`params`, each at `locs` or `loc`) resolved against a schema; errors name
/// `path`.key and `owner` ("plugin 'iqn'", "task 'reacher'").
std::vector<ParamValue> resolve_params(const std::string& path, const std::string& owner,
                                       const std::map<std::string, HeadParam>& params,
                                       const std::map<std::string, SourceLoc>& locs, const SourceLoc& loc,
                                       const ParamSchema* schema, std::uint32_t schema_len,
                                       std::vector<std::string>& storage) {
  std::vector<PipelineError> errs;
  auto loc_of = [&](const std::string& key) {
    auto it = locs.find(key);
    return it != locs.end() ? it->second : loc;
  };
  for (const auto& [key, value] : params)
    if (!find_schema(schema, schema_len, key)) {
      std::vector<std::string> keys;
      for (std::uint32_t i = 0; i < schema_len; ++i) keys.push_back(schema[i].key);
      std::string why = "unknown key for " + owner;
      std::string best = closest_match(key, keys);
      if (!best.empty()) why += ", did you mean '" + best + "'?";
      errs.emplace_back(loc_of(key), join_path(path, key), param_text(value), why,
                        keys.empty() ? "this plugin takes no params" : "params: " + join(keys));
    }

  storage.clear();
  storage.reserve(schema_len);  // no reallocation below: the c_str() pointers stay valid
  std::vector<ParamValue> out;
  out.reserve(schema_len);
  for (std::uint32_t i = 0; i < schema_len; ++i) {
    const ParamSchema& s = schema[i];
    std::string p = join_path(path, s.key);
    std::optional<HeadParam> given;
    if (auto it = params.find(s.key); it != params.end()) given = it->second;
    HeadParam v;
    if (given) {
      v = *given;
    } else if (auto def = parse_default(s)) {
      v = *def;
    } else {
      errs.emplace_back(loc, p, s.default_value ? s.default_value : "",
                        s.default_value ? std::string("the plugin's default is not ") +
                                              a_type(s.type) + " (a bug in the plugin)"
                                        : std::string("missing: the plugin needs this param"));
      continue;
    }
    ParamValue pv{s.key, s.type, 0, 0.0, nullptr};
    std::string wrong;
    switch (s.type) {
      case ParamType::boolean:
        if (auto b = std::get_if<bool>(&v)) {
          pv.i = *b ? 1 : 0;
          pv.d = static_cast<double>(pv.i);
        } else {
          wrong = "expected true or false";
        }
        break;
      case ParamType::integer:
        if (auto x = std::get_if<std::int64_t>(&v)) {
          pv.i = *x;
          pv.d = static_cast<double>(*x);
        } else {
          wrong = "expected an integer";
        }
        break;
      case ParamType::number:
        if (auto x = std::get_if<double>(&v)) {
          pv.d = *x;
        } else if (auto y = std::get_if<std::int64_t>(&v)) {
          pv.d = static_cast<double>(*y);
          v = pv.d;
        } else {
          wrong = "expected a number";
        }
        break;
      case ParamType::string: v = param_text(v); break;  // 5 or true read without a schema
    }
    if (wrong.empty() && (s.type == ParamType::integer || s.type == ParamType::number) &&
        !schema_range(s).contains(pv.d))
      wrong = "must be " + schema_range(s).text();
    if (!wrong.empty()) {
      errs.emplace_back(loc_of(s.key), p, param_text(v), wrong);
      continue;
    }
    storage.push_back(param_text(v));
    pv.s = storage.back().c_str();
    out.push_back(pv);
  }
  if (!errs.empty()) throw PipelineErrors(std::move(errs));
  return out;
}

}  // namespace

std::vector<ParamValue> resolve_head_params(const HeadSpec& h, const PluginDescriptor& d,
                                            std::vector<std::string>& storage) {
  return resolve_params("heads." + h.name, "plugin '" + std::string(d.name ? d.name : "?") + "'", h.params,
                        h.param_locs, h.loc, d.schema, d.schema_len, storage);
}

std::vector<ParamValue> resolve_env_options(const EnvChoice& e, const EnvDescriptor& task,
                                            std::vector<std::string>& storage) {
  return resolve_params("training.env", "task '" + std::string(task.task ? task.task : "?") + "'", e.options,
                        e.option_locs, e.loc, task.schema, task.schema_len, storage);
}

double resolved_budget(const PipelineSpec& spec, std::size_t head_index) {
  if (head_index >= spec.heads.size())
    throw std::out_of_range("resolved_budget: head " + std::to_string(head_index) + " of " +
                            std::to_string(spec.heads.size()));
  const HeadSpec& h = spec.heads[head_index];
  if (!h.enabled) return 0.0;
  auto aux_budget = [](const HeadSpec& a) {
    if (a.budget < 0)
      throw std::invalid_argument("head '" + a.name +
                                  "' has no resolved budget: parse the pipeline with a plugin "
                                  "catalog to fill the plugin's default");
    return a.budget;
  };
  if (h.role == Role::auxiliary) return aux_budget(h);
  double sum = 0;
  for (const auto& a : spec.heads)
    if (a.enabled && a.role == Role::auxiliary) sum += aux_budget(a);
  return 1.0 - sum;
}

}  // namespace dqn
