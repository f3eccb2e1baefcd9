/** @file tree.hpp
 *  @brief The pipeline's YAML as a small tree that remembers where each key and value was written
 *  (file:line:column, or the override it came from), and the `key.path=value` overrides applied to it.
 */
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "pipeline/spec.hpp"

namespace dqn::dsl {

// yaml-cpp's nodes lose duplicate keys on lookup and cannot say where an override came from, so
// the YAML is copied into this before anything else looks at it.

struct Entry;

/// Bounds on what is read: a pipeline's text and an override's value (a pipeline is a few KB).
inline constexpr std::size_t kMaxPipelineBytes = std::size_t(1) << 20;
inline constexpr std::size_t kMaxOverrideBytes = std::size_t(64) << 10;

struct Node {
  enum class Kind { null, scalar, seq, map };
  Kind kind = Kind::null;
  std::string text;     ///< scalar text
  bool quoted = false;  ///< written quoted (or tagged !!str): always a string
  std::vector<Node> items;
  std::vector<Entry> entries;  ///< in file order, duplicates kept
  SourceLoc loc;
};

struct Entry {
  std::string key;
  SourceLoc key_loc;
  Node value;
};

std::string join_path(const std::string& path, const std::string& key);
std::string index_path(const std::string& path, std::size_t i);

/// A compact flow rendering for messages.
std::string render(const Node& n, std::size_t limit = 60);

/// The one YAML document of `yaml_text` as a tree (a null root for an empty text, placed at 1:1).
/// Throws PipelineErrors for a text over kMaxPipelineBytes, a YAML syntax error, a second
/// document, nesting deeper than any pipeline (a recursive alias), or more values than any
/// pipeline holds (aliases that repeat aliases).
Node read_document(const std::string& yaml_text, const std::string& source_name);

/// yaml-cpp accepts `{a: 1, a: 2}` and lookups see only one; every map is checked here.
void find_duplicates(const Node& n, const std::string& path, std::vector<PipelineError>& errs);

/// Sections whose two keys exclude each other (a file giving both is refused); an override of
/// one clears the other: target's soft update every step (polyak) or hard copy (period).
struct ExclusiveKeys {
  const char* section;
  const char* first;
  const char* second;
};
inline constexpr ExclusiveKeys kExclusiveKeys[] = {{"target", "polyak", "period"}};

/// Applies one "key.path=value" to the tree (see ParseOptions::overrides); its nodes are placed
/// at "<override 'text'>". Setting one of kExclusiveKeys removes the other.
void apply_override(Node& root, const std::string& text, std::vector<PipelineError>& errs);

}  // namespace dqn::dsl
