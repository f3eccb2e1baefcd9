/** @file text.hpp
 *  @brief The pipeline DSL's scalars: read strictly (decimal integers, plain numbers, true/false),
 *  written back exactly, and the short forms error messages use.
 */
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace dqn::dsl {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::string lower(std::string s);

enum class IntParse { ok, not_int, overflow };
/// Decimal digits with an optional sign; nothing else.
IntParse parse_int(const std::string& s, std::int64_t& out);
/// Integers, decimals, exponents and YAML's .inf/.nan spellings; not "inf" or hexadecimal.
std::optional<double> parse_number(const std::string& s);
/// Strict: `true` and `false` only, so no spelling means something different to another reader.
std::optional<bool> parse_bool(const std::string& s);
/// yes/no/on/off/y/n in any case: YAML 1.1 booleans, which readers disagree on.
bool yaml11_bool_word(const std::string& s);

/// Shortest text that reads back to the same double, always recognisably a float.
std::string format_double(double v);
/// For messages: short and readable (1.1, not 1.1000000000000001).
std::string fmt(double v);
/// A YAML double-quoted string: reads back to exactly `s`.
std::string quote(const std::string& s);

std::string join(const std::vector<std::string>& v, const char* sep = ", ");
std::vector<std::string> split(const std::string& s, char sep);
std::string trim(const std::string& s);
/// A letter or '_' followed by letters, digits, '_' or '-': a head name, a plain YAML key.
bool is_identifier(const std::string& s);

}  // namespace dqn::dsl
