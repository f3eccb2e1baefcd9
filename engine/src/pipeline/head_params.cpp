/** @file head_params.cpp
 *  @brief Head params checked against their plugin's schema and resolved with its defaults, and the
 *  gradient budget each head ends up with.
 */
#include "pipeline/head_params.hpp"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <stdexcept>
#include <vector>

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

const ParamSchema* find_schema(const PluginDescriptor& d, const std::string& key) {
  for (std::uint32_t i = 0; i < d.schema_len; ++i)
    if (d.schema[i].key && key == d.schema[i].key) return &d.schema[i];
  return nullptr;
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

std::vector<ParamValue> resolve_head_params(const HeadSpec& h, const PluginDescriptor& d,
                                            std::vector<std::string>& storage) {
  std::vector<PipelineError> errs;
  const std::string path = "heads." + h.name;
  auto loc_of = [&](const std::string& key) {
    auto it = h.param_locs.find(key);
    return it != h.param_locs.end() ? it->second : h.loc;
  };
  for (const auto& [key, value] : h.params)
    if (!find_schema(d, key)) {
      std::vector<std::string> keys;
      for (std::uint32_t i = 0; i < d.schema_len; ++i) keys.push_back(d.schema[i].key);
      std::string why = "unknown key for plugin '" + std::string(d.name ? d.name : "?") + "'";
      std::string best = closest_match(key, keys);
      if (!best.empty()) why += ", did you mean '" + best + "'?";
      errs.emplace_back(loc_of(key), join_path(path, key), param_text(value), why,
                        keys.empty() ? "this plugin takes no params" : "params: " + join(keys));
    }

  storage.clear();
  storage.reserve(d.schema_len);  // no reallocation below: the c_str() pointers stay valid
  std::vector<ParamValue> out;
  out.reserve(d.schema_len);
  for (std::uint32_t i = 0; i < d.schema_len; ++i) {
    const ParamSchema& s = d.schema[i];
    std::string p = join_path(path, s.key);
    std::optional<HeadParam> given;
    if (auto it = h.params.find(s.key); it != h.params.end()) given = it->second;
    HeadParam v;
    if (given) {
      v = *given;
    } else if (auto def = parse_default(s)) {
      v = *def;
    } else {
      errs.emplace_back(h.loc, p, s.default_value ? s.default_value : "",
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
