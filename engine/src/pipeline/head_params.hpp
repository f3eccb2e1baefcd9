/** @file head_params.hpp
 *  @brief A head's plugin params against the plugin's ParamSchema table: its keys, types, bounds and
 *  defaults (the text forms the validator, to_yaml and the reference share).
 */
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "pipeline/spec.hpp"
#include "dqn/plugin.hpp"
#include "pipeline/schema.hpp"

namespace dqn::dsl {

const char* type_name(ParamType t);
std::string a_type(ParamType t);  ///< "an integer", "a number", ...
const ParamSchema* find_schema(const PluginDescriptor& d, const std::string& key);
const ParamSchema* find_schema(const ParamSchema* schema, std::uint32_t n, const std::string& key);
NumberRange schema_range(const ParamSchema& s);
/// The param as YAML reads back (strings unquoted: callers quote where YAML needs it).
std::string param_text(const HeadParam& p);
/// A schema default ("32", "0.2", "true", "\"linear\"") read as its type; nullopt when it does
/// not parse (a bug in the plugin) or there is none (a required param).
std::optional<HeadParam> parse_default(const ParamSchema& s);

}  // namespace dqn::dsl
