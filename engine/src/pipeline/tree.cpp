/** @file tree.cpp
 *  @brief YAML text into the position-keeping tree, duplicate keys found, overrides applied.
 */
#include "pipeline/tree.hpp"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <sstream>
#include <unordered_map>
#include <utility>
#include <vector>

#include "pipeline/parse.hpp"
#include "pipeline/text.hpp"

namespace dqn::dsl {
namespace {

constexpr int kMaxDepth = 32;  // deeper than any pipeline; also stops recursive aliases (&a [*a])
/// Values a document may expand to: far more than any pipeline holds, and it stops aliases that
/// repeat aliases (a few lines that expand exponentially) after a bounded amount of work.
constexpr std::size_t kMaxNodes = 100000;

/// Where nodes of one YAML text are: a file (positions from marks) or an override (one place).
struct Origin {
  std::string file;
  bool fixed = false;
  SourceLoc at(const YAML::Mark& m) const {
    if (fixed || m.is_null()) return SourceLoc{file, 0, 0};
    return SourceLoc{file, m.line + 1, m.column + 1};
  }
};

bool convert(const YAML::Node& y, const Origin& origin, int depth, const std::string& path,
             Node& out, std::vector<PipelineError>& errs, std::size_t& nodes) {
  out.loc = origin.at(y.Mark());
  if (++nodes > kMaxNodes) {
    errs.emplace_back(out.loc, path, "", "the document expands to more than " + std::to_string(kMaxNodes) +
                                             " values (aliases that repeat aliases?)",
                      "a pipeline holds a few hundred values; write them out or use fewer aliases");
    return false;
  }
  if (depth > kMaxDepth) {
    errs.emplace_back(out.loc, path, "", "nested deeper than " + std::to_string(kMaxDepth) +
                                             " levels (a recursive alias?)");
    return false;
  }
  switch (y.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null: out.kind = Node::Kind::null; return true;
    case YAML::NodeType::Scalar:
      out.kind = Node::Kind::scalar;
      out.text = y.Scalar();
      out.quoted = y.Tag() == "!" || y.Tag() == "tag:yaml.org,2002:str";
      return true;
    case YAML::NodeType::Sequence: {
      out.kind = Node::Kind::seq;
      std::size_t i = 0;
      for (const auto& item : y) {
        out.items.emplace_back();
        if (!convert(item, origin, depth + 1, index_path(path, i++), out.items.back(), errs, nodes))
          return false;
      }
      return true;
    }
    case YAML::NodeType::Map: {
      out.kind = Node::Kind::map;
      for (const auto& kv : y) {
        const YAML::Node k = kv.first;  // copies: the iterator hands out temporaries
        const YAML::Node v = kv.second;
        Entry e;
        e.key_loc = origin.at(k.Mark());
        if (!k.IsScalar()) {
          errs.emplace_back(e.key_loc, path, "", "map keys must be plain names");
          continue;
        }
        e.key = k.Scalar();
        if (!convert(v, origin, depth + 1, join_path(path, e.key), e.value, errs, nodes))
          return false;
        // `key:` with nothing after it: yaml-cpp marks the null at the next token; point at the key.
        if (e.value.kind == Node::Kind::null &&
            (e.value.loc.line != e.key_loc.line || e.value.loc.line == 0))
          e.value.loc = e.key_loc;
        out.entries.push_back(std::move(e));
      }
      return true;
    }
  }
  return true;
}

/// Where a quoted scalar opens that the text never closes (yaml-cpp takes a double-quoted one left
/// open at the end of the text as running to the end), or line 0. A quote opens a scalar only at a
/// value's start (after `: `, `- `, `[`, `{`, `,` or the indentation); comments and block scalars
/// (`|`, `>`) are skipped.
SourceLoc unclosed_quote(const std::string& text, const std::string& source) {
  int line = 1, col = 0, block_indent = -1, open_line = 0, open_col = 0;
  char quote = 0;        // the open quote, or 0
  bool at_start = true;  // the next non-blank character starts a value
  int indent = 0;
  bool line_begin = true;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    ++col;
    if (c == '\n') {
      ++line, col = 0, line_begin = true, indent = 0;
      if (!quote) at_start = true;
      continue;
    }
    if (line_begin && c == ' ') {
      ++indent;
      continue;
    }
    if (line_begin) {
      line_begin = false;
      if (block_indent >= 0 && indent > block_indent) {  // inside a block scalar: skip the line
        while (i + 1 < text.size() && text[i + 1] != '\n') ++i;
        continue;
      }
      block_indent = -1;
    }
    if (quote == '"') {
      if (c == '\\') ++i, ++col;
      else if (c == '"') quote = 0, at_start = false;
      continue;
    }
    if (quote == '\'') {
      if (c == '\'' && i + 1 < text.size() && text[i + 1] == '\'') ++i, ++col;
      else if (c == '\'') quote = 0, at_start = false;
      continue;
    }
    if (c == '#' && (i == 0 || text[i - 1] == ' ' || text[i - 1] == '\t')) {  // a comment
      while (i + 1 < text.size() && text[i + 1] != '\n') ++i;
      continue;
    }
    if (c == ' ' || c == '\t') continue;
    if ((c == '"' || c == '\'') && at_start) {
      quote = c, open_line = line, open_col = col;
      continue;
    }
    if ((c == '|' || c == '>') && at_start) block_indent = indent;
    at_start = c == ':' || c == '-' || c == '[' || c == '{' || c == ',' || c == '?';
  }
  return quote ? SourceLoc{source, open_line, open_col} : SourceLoc{source, 0, 0};
}

const Node* map_get(const Node& n, const std::string& key) {
  if (n.kind != Node::Kind::map) return nullptr;
  for (const auto& e : n.entries)
    if (e.key == key) return &e.value;
  return nullptr;
}

}  // namespace

std::string join_path(const std::string& path, const std::string& key) {
  return path.empty() ? key : path + "." + key;
}
std::string index_path(const std::string& path, std::size_t i) {
  return path + "[" + std::to_string(i) + "]";
}

std::string render(const Node& n, std::size_t limit) {
  std::string s;
  switch (n.kind) {
    case Node::Kind::null: break;
    case Node::Kind::scalar: s = n.text; break;
    case Node::Kind::seq:
      s = "[";
      for (std::size_t i = 0; i < n.items.size() && s.size() <= limit; ++i)
        s += (i ? ", " : "") + render(n.items[i], limit);
      s += "]";
      break;
    case Node::Kind::map:
      s = "{";
      for (std::size_t i = 0; i < n.entries.size() && s.size() <= limit; ++i)
        s += (i ? ", " : "") + n.entries[i].key + ": " + render(n.entries[i].value, limit);
      s += "}";
      break;
  }
  if (s.size() > limit) s = s.substr(0, limit - 3) + "...";
  return s;
}


namespace {

/// Where each document of a text starts, from yaml-cpp's event parser (no nodes built).
struct DocumentStarts : YAML::EventHandler {
  std::vector<YAML::Mark> starts;
  void OnDocumentStart(const YAML::Mark& m) override { starts.push_back(m); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

}  // namespace

Node read_document(const std::string& yaml_text, const std::string& source_name) {
  std::vector<PipelineError> errs;
  Node root;
  if (yaml_text.size() > kMaxPipelineBytes)
    throw PipelineErrors({PipelineError(SourceLoc{source_name, 0, 0}, "", "",
                                        "the text is " + std::to_string(yaml_text.size()) +
                                            " bytes; a pipeline is at most " + std::to_string(kMaxPipelineBytes),
                                        "a pipeline is a few KB of YAML: is this the right file?")});
  try {
    // The documents counted first, two at most: yaml-cpp (0.7, 0.8) reads a stray ',' as an empty
    // document that never ends, repeated without consuming the text (jbeder/yaml-cpp#1040), which
    // LoadAll would collect until memory runs out.
    std::istringstream in(yaml_text);
    YAML::Parser parser(in);
    DocumentStarts docs;
    while (docs.starts.size() < 2 && parser.HandleNextDocument(docs)) {
    }
    if (docs.starts.size() > 1 && docs.starts[1].pos == docs.starts[0].pos) {
      errs.emplace_back(Origin{source_name}.at(docs.starts[0]), "", "",
                        "YAML syntax error: the parser cannot read past this point (a ',' or another flow "
                        "indicator outside [ ] or { }?)",
                        "quote the value, or put the list in [ ]");
      throw PipelineErrors(std::move(errs));
    }
    if (docs.starts.size() > 1)
      errs.emplace_back(Origin{source_name}.at(docs.starts[1]), "", "",
                        "a pipeline file holds one YAML document; found a second (after '---')");
    std::size_t nodes = 0;
    if (!docs.starts.empty()) convert(YAML::Load(yaml_text), Origin{source_name}, 0, "", root, errs, nodes);
    if (const SourceLoc q = unclosed_quote(yaml_text, source_name); q.line > 0)
      errs.emplace_back(q, "", "", "YAML syntax error: a quoted value opens here and is never closed",
                        "close the quote");
  } catch (const YAML::Exception& e) {
    std::string hint;
    if (e.msg.find("tab") != std::string::npos) hint = "indent with spaces, not tabs";
    errs.emplace_back(Origin{source_name}.at(e.mark), "", "", "YAML syntax error: " + e.msg,
                      hint);
  }
  if (!errs.empty()) throw PipelineErrors(std::move(errs));
  root.loc = root.kind == Node::Kind::null ? SourceLoc{source_name, 1, 1} : root.loc;
  return root;
}

void find_duplicates(const Node& n, const std::string& path, std::vector<PipelineError>& errs) {
  if (n.kind == Node::Kind::seq) {
    for (std::size_t i = 0; i < n.items.size(); ++i)
      find_duplicates(n.items[i], index_path(path, i), errs);
  } else if (n.kind == Node::Kind::map) {
    std::unordered_map<std::string, std::size_t> first;  // each key's first entry
    for (std::size_t i = 0; i < n.entries.size(); ++i) {
      const Entry& e = n.entries[i];
      const auto [at, fresh] = first.emplace(e.key, i);
      if (!fresh)
        errs.emplace_back(e.key_loc, join_path(path, e.key), render(e.value),
                          "duplicate key '" + e.key + "' (first given at " + n.entries[at->second].key_loc.str() + ")",
                          "a YAML map keeps one value per key; remove one of them");
      find_duplicates(e.value, join_path(path, e.key), errs);
    }
  }
}

void apply_override(Node& root, const std::string& text, std::vector<PipelineError>& errs) {
  SourceLoc loc{"<override '" + text + "'>", 0, 0};
  std::size_t eq = text.find('=');
  std::string key = eq == std::string::npos ? trim(text) : trim(text.substr(0, eq));
  if (eq == std::string::npos || key.empty()) {
    errs.emplace_back(loc, key, "", "an override is key.path=value",
                      "e.g. batch=64, heads.iqn.budget=0.3, network.trunk=[64,64]");
    return;
  }
  std::string value_text = trim(text.substr(eq + 1));
  Node value;
  try {
    if (value_text.size() > kMaxOverrideBytes) {
      errs.emplace_back(SourceLoc{"<override '" + key + "=…'>", 0, 0}, key, "",
                        "the value is " + std::to_string(value_text.size()) + " bytes; an override value is at most " +
                            std::to_string(kMaxOverrideBytes));
      return;
    }
    YAML::Node y = YAML::Load(value_text);
    std::size_t nodes = 0;
    if (!convert(y, Origin{loc.file, true}, 1, key, value, errs, nodes)) return;
    value.loc = loc;
  } catch (const YAML::Exception& e) {
    errs.emplace_back(loc, key, value_text, "not a YAML value: " + e.msg,
                      "quote strings that contain YAML punctuation");
    return;
  }
  std::vector<std::string> segs = split(key, '.');
  for (const auto& s : segs)
    if (s.empty()) {
      errs.emplace_back(loc, key, value_text, "empty part in the key path");
      return;
    }

  if (root.kind == Node::Kind::null) root.kind = Node::Kind::map;
  Node* cur = &root;
  std::string shown;
  for (std::size_t s = 0; s < segs.size(); ++s) {
    const std::string& seg = segs[s];
    bool last = s + 1 == segs.size();
    if (cur->kind == Node::Kind::null) cur->kind = Node::Kind::map;  // `training:` left empty
    Node* next = nullptr;
    if (cur->kind == Node::Kind::map) {
      for (auto& e : cur->entries)
        if (e.key == seg) {
          next = &e.value;
          break;
        }
      if (!next) {
        Entry e;
        e.key = seg;
        e.key_loc = loc;
        e.value.loc = loc;
        cur->entries.push_back(std::move(e));
        next = &cur->entries.back().value;
      }
      shown = join_path(shown, seg);
    } else if (cur->kind == Node::Kind::seq) {
      std::int64_t idx = -1;
      if (parse_int(seg, idx) == IntParse::ok && seg[0] != '-' && seg[0] != '+') {
        auto n = static_cast<std::size_t>(idx);
        if (n > cur->items.size()) {
          errs.emplace_back(loc, key, value_text,
                            "index " + seg + " is past the end of '" + shown + "' (" +
                                std::to_string(cur->items.size()) + " elements)",
                            "use 0.." + std::to_string(cur->items.size()) +
                                " (the last appends a new element)");
          return;
        }
        if (n == cur->items.size()) {  // one past the end appends
          cur->items.emplace_back();
          cur->items.back().loc = loc;
        }
        next = &cur->items[n];
        shown = index_path(shown, n);
      } else {
        std::vector<std::string> names;
        for (std::size_t i = 0; i < cur->items.size() && !next; ++i) {
          const Node& item = cur->items[i];
          const Node* nm = map_get(item, "name");
          if (!nm) nm = map_get(item, "plugin");
          if (!nm || nm->kind != Node::Kind::scalar) continue;
          names.push_back(nm->text);
          if (nm->text == seg) {
            next = &cur->items[i];
            shown = index_path(shown, i);
          }
        }
        if (!next) {
          std::string why = "no element of '" + shown + "' is named '" + seg + "'";
          std::string best = closest_match(seg, names);
          if (!best.empty()) why += ", did you mean '" + best + "'?";
          errs.emplace_back(loc, key, value_text, why,
                            names.empty() ? "address elements by index (0, 1, ...)"
                                          : "elements: " + join(names) + "; or use an index");
          return;
        }
      }
    } else {
      errs.emplace_back(loc, key, value_text,
                        "'" + shown + "' is a single value (" + render(*cur) +
                            "), so it has no key '" + seg + "'");
      return;
    }
    if (!last) {
      cur = next;
      continue;
    }
    *next = value;
    for (const ExclusiveKeys& x : kExclusiveKeys) {  // the other key of the pair goes
      if (segs.size() != 2 || segs[0] != x.section || (seg != x.first && seg != x.second)) continue;
      const std::string other = seg == x.first ? x.second : x.first;
      std::erase_if(cur->entries, [&](const Entry& e) { return e.key == other; });
      break;
    }
    return;
  }
}

}  // namespace dqn::dsl
