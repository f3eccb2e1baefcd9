/** @file schema.hpp
 *  @brief Every pipeline key in one table: its path, type, default (read off a default PipelineSpec),
 *  range or choices, meaning, and the PipelineSpec field it reads and writes. The validator reads
 *  values through it, to_yaml writes from it and pipeline_reference renders it (`dqn doc pipeline`);
 *  rules between keys (v_min < v_max, budgets, polyak or period, ...) stay in the validator.
 */
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <variant>
#include <vector>

#include "pipeline/spec.hpp"
#include "pipeline/parse.hpp"

namespace dqn {

/// A number's bounds, each closed or open; an infinite bound is none.
struct NumberRange {
  double lo = -std::numeric_limits<double>::infinity();
  double hi = std::numeric_limits<double>::infinity();
  bool lo_open = false, hi_open = false;
  bool contains(double v) const;
  bool unbounded() const;
  std::string text() const;  ///< "in (0, 1]", "> 0", ">= 0", "<= 1" (unbounded: "")
};

/// An integer's bounds, both closed.
struct IntegerRange {
  std::int64_t lo = 0, hi = 0;
  /// hi is only the limit of the field's C++ type: the doc says ">= lo", a message says whichever
  /// end the value is past.
  bool hi_is_type_limit = true;
  bool contains(std::int64_t v) const { return v >= lo && v <= hi; }
  std::string text() const;                ///< "in [1, 8]" or ">= 1"
  std::string text(std::int64_t v) const;  ///< why v is outside: "in [1, 8]", ">= 1", "<= 2147483647"
};

/// A key's value between the YAML text and the PipelineSpec field (choices are their text).
using KeyValue =
    std::variant<bool, std::int64_t, double, std::string, std::vector<std::int64_t>, std::array<double, 2>>;

struct PipelineKey {
  enum class Type { section, heads, env, boolean, integer, number, string, choice, integer_list, number_pair };
  std::string path;  ///< "training.replay.capacity"
  Type type = Type::section;
  std::string meaning;  ///< one line, for the reference
  IntegerRange integers;                     ///< integer; integer_list: each element
  NumberRange numbers;                       ///< number; number_pair: each element
  std::vector<std::string> choices;          ///< choice, in the order messages list them
  std::size_t min_items = 0, max_items = 0;  ///< integer_list
  std::string items;    ///< integer_list: its elements, plural, for "needs 1 to 8 layers"
  std::string shape;    ///< integer_list, number_pair: the form messages expect ("a list of layer widths")
  std::string example;  ///< integer_list, number_pair: the hint after a wrong form ("[256, 256]")
  std::string default_note;  ///< the default, where it is not one value of a default spec (head keys)
  /// integer_list: a word accepted instead of a list, read as the empty list ("all" for devices)
  std::string word;
  bool unique = false;  ///< integer_list: no element twice
  std::function<KeyValue(const PipelineSpec&)> get;  ///< null for sections, heads, env and head keys
  std::function<void(PipelineSpec&, const KeyValue&)> set;
  /// Null: always written. Else to_yaml leaves the key out where this is false (target.polyak and
  /// target.period exclude each other).
  std::function<bool(const PipelineSpec&)> written;

  std::string name() const;    ///< the path's last part
  std::string parent() const;  ///< the enclosing section's path; "" at the top level
};

/// Every key of a pipeline, sections first among their keys, in the order to_yaml writes them.
const std::vector<PipelineKey>& pipeline_keys();
/// The keys of one head besides its plugin's params (their paths are the bare names).
const std::vector<PipelineKey>& head_keys();
const PipelineKey& head_key(const std::string& name);  ///< throws std::logic_error when not one

/// The keys directly inside `section` ("" for the top level), in table order.
std::vector<const PipelineKey*> child_keys(const std::string& section);
std::vector<std::string> child_names(const std::string& section);
std::vector<std::string> head_key_names();

const char* type_name(PipelineKey::Type t);  ///< "integer", "list of integers", ...
/// The value as to_yaml writes it (strings quoted, choices bare, numbers exact).
std::string value_text(const PipelineKey& k, const KeyValue& v);
/// The value of a default-constructed PipelineSpec, as to_yaml writes it, or the key's note.
std::string default_text(const PipelineKey& k);
/// The accepted values in words: "in (0, 1]", "`cpu`, `cuda`, `auto`", "1 to 8 layers, each >= 1".
std::string range_text(const PipelineKey& k);

/// The pipeline reference (docs/pipeline.md without its introduction): every key of the table by
/// section, the head keys, and each catalog plugin's params (plugins sorted by name), as Markdown.
std::string pipeline_reference(const PluginCatalog& plugins);

}  // namespace dqn
