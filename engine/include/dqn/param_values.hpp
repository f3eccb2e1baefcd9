/** @file param_values.hpp
 *  @brief The configuration values a plugin's create() is handed (every key of its schema,
 *  defaults filled in), kept and read by key and type: what HeadBase and EnvBase read options with.
 */
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>

#include "dqn/plugin.hpp"

namespace dqn {

class ParamValues {
 public:
  /// `owner` names the head or task in messages.
  ParamValues(std::string owner, const ParamValue* params, std::uint32_t n) : owner_(std::move(owner)) {
    for (std::uint32_t i = 0; i < n; ++i) {
      const ParamValue& v = params[i];
      if (v.key) values_[v.key] = Value{v.type, v.i, v.d, v.s ? v.s : ""};
    }
  }

  double number(const char* key) const {
    const Value& v = value(key);
    if (v.type == ParamType::integer) return static_cast<double>(v.i);
    if (v.type != ParamType::number) throw wrong_type(key, "a number");
    return v.d;
  }
  std::int64_t integer(const char* key) const {
    const Value& v = value(key);
    if (v.type != ParamType::integer) throw wrong_type(key, "an integer");
    return v.i;
  }
  bool flag(const char* key) const {
    const Value& v = value(key);
    if (v.type != ParamType::boolean) throw wrong_type(key, "a boolean");
    return v.i != 0;
  }
  const std::string& text(const char* key) const {
    const Value& v = value(key);
    if (v.type != ParamType::string) throw wrong_type(key, "a string");
    return v.s;
  }

 private:
  struct Value {
    ParamType type = ParamType::number;
    std::int64_t i = 0;
    double d = 0.0;
    std::string s;
  };
  const Value& value(const char* key) const {
    const auto it = values_.find(key);
    if (it == values_.end()) throw std::invalid_argument(owner_ + ": no configuration value '" + std::string(key) + "'");
    return it->second;
  }
  std::invalid_argument wrong_type(const char* key, const char* want) const {
    return std::invalid_argument(owner_ + ": configuration value '" + std::string(key) + "' is not " + want);
  }

  std::string owner_;
  std::map<std::string, Value> values_;
};

}  // namespace dqn
