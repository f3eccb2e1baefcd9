/** @file pipeline_parse.cpp
 *  @brief The pipeline DSL. YAML is read into a small tree that remembers positions, overrides
 *  are applied to that tree, and one validation pass turns it into a PipelineSpec, collecting
 *  every error it can (with file:line:column, key path, value and why) before throwing.
 */
#include "pipeline/parse.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <tuple>
#include <utility>

#include "training/env/env.hpp"

namespace dqn {
namespace {

constexpr int kMaxDepth = 32;  // deeper than any pipeline; also stops recursive aliases (&a [*a])
constexpr double kInf = std::numeric_limits<double>::infinity();

// ---------------------------------------------------------------------------------------------
// The tree: yaml-cpp's nodes lose duplicate keys on lookup and cannot say where an override came
// from, so the YAML is copied into this before anything else looks at it.

struct Entry;

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

std::string join_path(const std::string& path, const std::string& key) {
  return path.empty() ? key : path + "." + key;
}
std::string index_path(const std::string& path, std::size_t i) {
  return path + "[" + std::to_string(i) + "]";
}

/// A compact flow rendering for messages.
std::string render(const Node& n, std::size_t limit = 60) {
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
             Node& out, std::vector<PipelineError>& errs) {
  out.loc = origin.at(y.Mark());
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
        if (!convert(item, origin, depth + 1, index_path(path, i++), out.items.back(), errs))
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
        if (!convert(v, origin, depth + 1, join_path(path, e.key), e.value, errs))
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

/// yaml-cpp accepts `{a: 1, a: 2}` and lookups see only one; every map is checked here.
void find_duplicates(const Node& n, const std::string& path, std::vector<PipelineError>& errs) {
  if (n.kind == Node::Kind::seq) {
    for (std::size_t i = 0; i < n.items.size(); ++i)
      find_duplicates(n.items[i], index_path(path, i), errs);
  } else if (n.kind == Node::Kind::map) {
    for (std::size_t i = 0; i < n.entries.size(); ++i) {
      const Entry& e = n.entries[i];
      for (std::size_t j = 0; j < i; ++j) {
        if (n.entries[j].key != e.key) continue;
        errs.emplace_back(e.key_loc, join_path(path, e.key), render(e.value),
                          "duplicate key '" + e.key + "' (first given at " +
                              n.entries[j].key_loc.str() + ")",
                          "a YAML map keeps one value per key; remove one of them");
        break;
      }
      find_duplicates(e.value, join_path(path, e.key), errs);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Scalars, strictly: integers are decimal, numbers are integers or decimals, booleans true/false.

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

enum class IntParse { ok, not_int, overflow };

IntParse parse_int(const std::string& s, std::int64_t& out) {
  std::string t = s;
  if (!t.empty() && t[0] == '+') t.erase(0, 1);
  if (t.empty()) return IntParse::not_int;
  std::size_t digits_from = t[0] == '-' ? 1 : 0;
  if (digits_from == t.size()) return IntParse::not_int;
  for (std::size_t i = digits_from; i < t.size(); ++i)
    if (!std::isdigit(static_cast<unsigned char>(t[i]))) return IntParse::not_int;
  auto r = std::from_chars(t.data(), t.data() + t.size(), out);
  if (r.ec == std::errc::result_out_of_range) return IntParse::overflow;
  return r.ec == std::errc() && r.ptr == t.data() + t.size() ? IntParse::ok : IntParse::not_int;
}

std::optional<double> parse_number(const std::string& s) {
  std::string t = lower(s);
  if (t == ".inf" || t == "+.inf") return kInf;
  if (t == "-.inf") return -kInf;
  if (t == ".nan") return std::numeric_limits<double>::quiet_NaN();
  if (!t.empty() && t[0] == '+') t.erase(0, 1);
  if (t.empty()) return std::nullopt;
  // from_chars also takes "inf"/"nan" spelled out; YAML does not.
  for (char c : t)
    if (!(std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == 'e' || c == '-' ||
          c == '+'))
      return std::nullopt;
  double v = 0;
  auto r = std::from_chars(t.data(), t.data() + t.size(), v);
  if (r.ec != std::errc() || r.ptr != t.data() + t.size()) return std::nullopt;
  return v;
}

/// Strict: `true` and `false` only, so no spelling means something different to another reader.
std::optional<bool> parse_bool(const std::string& s) {
  if (s == "true") return true;
  if (s == "false") return false;
  return std::nullopt;
}

bool yaml11_bool_word(const std::string& s) {
  static const char* words[] = {"yes", "no", "on", "off", "y", "n", "true", "false"};
  std::string l = lower(s);
  return std::any_of(std::begin(words), std::end(words), [&](const char* w) { return l == w; });
}

/// Shortest text that reads back to the same double, always recognisably a float.
std::string format_double(double v) {
  if (std::isnan(v)) return ".nan";
  if (std::isinf(v)) return v > 0 ? ".inf" : "-.inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

/// For messages: short and readable (1.1, not 1.1000000000000001).
std::string fmt(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

std::string join(const std::vector<std::string>& v, const char* sep = ", ") {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

bool is_identifier(const std::string& s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
  });
}

/// A closed or open interval, as the message says it.
struct Range {
  double lo = -kInf, hi = kInf;
  bool lo_open = false, hi_open = false;
  bool contains(double v) const {
    return (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
  }
  std::string text() const {
    if (std::isinf(hi)) return std::string(lo_open ? "> " : ">= ") + fmt(lo);
    if (std::isinf(lo)) return std::string(hi_open ? "< " : "<= ") + fmt(hi);
    return std::string(lo_open ? "in (" : "in [") + fmt(lo) + ", " + fmt(hi) + (hi_open ? ")" : "]");
  }
};
Range at_least(double lo) { return Range{lo, kInf, false, false}; }
Range above(double lo) { return Range{lo, kInf, true, false}; }
Range closed(double lo, double hi) { return Range{lo, hi, false, false}; }

Range schema_range(const ParamSchema& s) {
  Range r;
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

/// A schema default ("32", "0.2", "true", "\"linear\"") read as its type; nullopt when it does
/// not parse (a bug in the plugin).
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

const std::vector<std::string> kHeadKeys = {"plugin", "name", "role", "budget", "enabled"};

// ---------------------------------------------------------------------------------------------
// Validation: one pass over the tree, every error recorded, defaults kept where a value is bad.

using Fields = std::map<std::string, const Entry*>;

class Validator {
 public:
  Validator(const PluginCatalog* catalog, std::string source)
      : catalog_(catalog), source_(std::move(source)) {}

  std::vector<PipelineError> errors;

  void fail(const SourceLoc& loc, const std::string& key, const std::string& value,
            std::string why, std::string hint = {}) {
    errors.emplace_back(loc, key, value, std::move(why), std::move(hint));
  }
  void fail(const Node& n, const std::string& key, std::string why, std::string hint = {}) {
    fail(n.loc, key, render(n), std::move(why), std::move(hint));
  }

  /// The map's entries by key (first occurrence). Keys outside `keys` are errors, or collected
  /// into `extras` when given (a head's params).
  Fields fields(const Node& n, const std::string& path, const std::vector<std::string>& keys,
                std::vector<const Entry*>* extras = nullptr) {
    Fields f;
    if (n.kind != Node::Kind::map) {
      fail(n, path, std::string("expected a map") + got(n), "keys here: " + join(keys));
      return f;
    }
    for (const auto& e : n.entries) {
      if (std::find(keys.begin(), keys.end(), e.key) != keys.end()) {
        f.emplace(e.key, &e);  // emplace keeps the first of duplicates (reported elsewhere)
      } else if (extras) {
        bool seen = std::any_of(extras->begin(), extras->end(),
                                [&](const Entry* x) { return x->key == e.key; });
        if (!seen) extras->push_back(&e);
      } else {
        unknown_key(e, path, keys);
      }
    }
    return f;
  }

  void unknown_key(const Entry& e, const std::string& path, const std::vector<std::string>& keys,
                   const std::string& context = {}) {
    std::string why = "unknown key" + context;
    std::string best = closest_match(e.key, keys);
    if (!best.empty()) why += ", did you mean '" + best + "'?";
    fail(e.key_loc, join_path(path, e.key), render(e.value), why,
         "valid keys " + (path.empty() ? std::string("at the top level") : "in '" + path + "'") +
             ": " + join(keys));
  }

  static std::string got(const Node& n) {
    switch (n.kind) {
      case Node::Kind::null: return ", got nothing";
      case Node::Kind::seq: return ", got a list";
      case Node::Kind::map: return ", got a map";
      case Node::Kind::scalar: return n.quoted ? ", got a quoted string" : "";
    }
    return "";
  }

  // Typed readers on one node; nullopt after recording the error.
  std::optional<std::int64_t> as_int(const Node& v, const std::string& path) {
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

  std::optional<double> as_number(const Node& v, const std::string& path) {
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

  std::optional<bool> as_bool(const Node& v, const std::string& path) {
    if (v.kind == Node::Kind::scalar && !v.quoted)
      if (auto b = parse_bool(v.text)) return b;
    std::string hint = v.quoted ? "remove the quotes" : "";
    if (v.kind == Node::Kind::scalar && !v.quoted && yaml11_bool_word(v.text))
      hint = "'" + v.text + "' is ambiguous (YAML readers differ on it): write true or false";
    fail(v, path, "expected true or false" + got(v), hint);
    return std::nullopt;
  }

  std::optional<std::string> as_string(const Node& v, const std::string& path) {
    if (v.kind == Node::Kind::scalar) return v.text;
    fail(v, path, "expected a string" + got(v));
    return std::nullopt;
  }

  // Field readers: absent keys keep `out` (the default) and return nullptr; else the node.
  /// hi < 0: no upper bound but T's own.
  template <class T>
  const Node* read_int(const Fields& f, const std::string& key, const std::string& path, T& out,
                       std::int64_t lo, std::int64_t hi = -1) {
    const Node* v = find(f, key);
    if (!v) return nullptr;
    const bool unbounded = hi < 0;
    if (unbounded)
      hi = static_cast<std::int64_t>(std::min<std::uint64_t>(
          static_cast<std::uint64_t>(std::numeric_limits<T>::max()),
          static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())));
    std::string p = join_path(path, key);
    if (auto i = as_int(*v, p)) {
      if (*i < lo || *i > hi) {
        std::string range =
            !unbounded ? "in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]"
            : *i < lo  ? ">= " + std::to_string(lo)
                       : "<= " + std::to_string(hi);
        fail(*v, p, "must be " + range);
      } else {
        out = static_cast<T>(*i);
      }
    }
    return v;
  }

  const Node* read_number(const Fields& f, const std::string& key, const std::string& path,
                          double& out, const Range& r) {
    const Node* v = find(f, key);
    if (!v) return nullptr;
    std::string p = join_path(path, key);
    if (auto d = as_number(*v, p)) {
      if (!r.contains(*d))
        fail(*v, p, "must be " + r.text());
      else
        out = *d;
    }
    return v;
  }

  const Node* read_bool(const Fields& f, const std::string& key, const std::string& path,
                        bool& out) {
    const Node* v = find(f, key);
    if (!v) return nullptr;
    if (auto b = as_bool(*v, join_path(path, key))) out = *b;
    return v;
  }

  const Node* read_string(const Fields& f, const std::string& key, const std::string& path,
                          std::string& out) {
    const Node* v = find(f, key);
    if (!v) return nullptr;
    if (auto s = as_string(*v, join_path(path, key))) out = *s;
    return v;
  }

  /// One of `choices`; returns its index, -1 when absent or bad.
  int read_choice(const Fields& f, const std::string& key, const std::string& path,
                  const std::vector<std::string>& choices) {
    std::string s;
    const Node* v = find(f, key);
    if (!v || !read_string(f, key, path, s)) return -1;
    if (v->kind != Node::Kind::scalar) return -1;
    for (std::size_t i = 0; i < choices.size(); ++i)
      if (s == choices[i]) return static_cast<int>(i);
    std::string why = "expected one of " + join(choices);
    std::string best = closest_match(s, choices);
    if (!best.empty()) why += ", did you mean '" + best + "'?";
    fail(*v, join_path(path, key), why);
    return -1;
  }

  static const Node* find(const Fields& f, const std::string& key) {
    auto it = f.find(key);
    return it == f.end() ? nullptr : &it->second->value;
  }

  PipelineSpec run(const Node& root);

 private:
  struct HeadWork {
    const PluginDescriptor* desc = nullptr;
    bool role_given = false;
  };

  void read_network(const Node& n, NetworkSpec& net);
  void read_heads(const Node& n, PipelineSpec& spec, std::vector<HeadWork>& work);
  void read_head_params(const std::vector<const Entry*>& extras, const std::string& path,
                        HeadSpec& h, const PluginDescriptor* d);
  void check_heads(const Node& heads_node, PipelineSpec& spec, std::vector<HeadWork>& work);
  void read_training(const Node& n, TrainingSpec& t);

  const PluginCatalog* catalog_;
  std::string source_;
};

void Validator::read_network(const Node& n, NetworkSpec& net) {
  const std::string p = "network";
  Fields f = fields(n, p, {"state", "trunk", "head_hidden", "branches", "actions", "atoms",
                           "v_min", "v_max"});
  read_int(f, "state", p, net.state, 1);
  if (const Node* t = find(f, "trunk")) {
    if (t->kind != Node::Kind::seq) {
      fail(*t, "network.trunk", "expected a list of layer widths" + got(*t), "e.g. [256, 256]");
    } else if (t->items.empty() || t->items.size() > static_cast<std::size_t>(kMaxTrunkLayers)) {
      fail(*t, "network.trunk",
           "needs 1 to " + std::to_string(kMaxTrunkLayers) + " layers, got " +
               std::to_string(t->items.size()));
    } else {
      std::vector<int> widths;
      bool ok = true;
      for (std::size_t i = 0; i < t->items.size(); ++i) {
        std::string ip = index_path("network.trunk", i);
        auto w = as_int(t->items[i], ip);
        if (w && (*w < 1 || *w > std::numeric_limits<int>::max())) {
          fail(t->items[i], ip, "must be >= 1");
          w.reset();
        }
        ok = ok && w.has_value();
        if (w) widths.push_back(static_cast<int>(*w));
      }
      if (ok) net.trunk = widths;
    }
  }
  read_int(f, "head_hidden", p, net.head_hidden, 1);
  read_int(f, "branches", p, net.branches, 1);
  read_int(f, "actions", p, net.actions, 1);
  read_int(f, "atoms", p, net.atoms, 2);
  const Node* vmin = read_number(f, "v_min", p, net.v_min, Range{});
  const Node* vmax = read_number(f, "v_max", p, net.v_max, Range{});
  if (!(net.v_min < net.v_max)) {
    const Node* at = vmax ? vmax : vmin;
    SourceLoc loc = at ? at->loc : n.loc;
    fail(loc, at == vmin ? "network.v_min" : "network.v_max",
         at ? render(*at) : "",
         "v_min (" + fmt(net.v_min) + ") must be below v_max (" + fmt(net.v_max) + ")");
  }
}

void Validator::read_head_params(const std::vector<const Entry*>& extras, const std::string& path,
                                 HeadSpec& h, const PluginDescriptor* d) {
  std::vector<std::string> valid = kHeadKeys;
  if (d)
    for (std::uint32_t i = 0; i < d->schema_len; ++i) valid.push_back(d->schema[i].key);

  for (const Entry* e : extras) {
    std::string p = join_path(path, e->key);
    const Node& v = e->value;
    if (!d) {  // no catalog: keep what is written, typed as YAML would read it
      if (v.kind != Node::Kind::scalar) {
        fail(v, p, "a head param is one value (a number, true/false or a string)" + got(v));
        continue;
      }
      HeadParam hp;
      std::int64_t i = 0;
      if (v.quoted)
        hp = v.text;
      else if (auto b = parse_bool(v.text))
        hp = *b;
      else if (parse_int(v.text, i) == IntParse::ok)
        hp = i;
      else if (auto num = parse_number(v.text); num && std::isfinite(*num))
        hp = *num;
      else
        hp = v.text;
      h.params[e->key] = hp;
      h.param_locs[e->key] = v.loc;
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
        if (auto x = as_number(v, p)) {
          if (!schema_range(*s).contains(*x))
            fail(v, p, "must be " + schema_range(*s).text());
          else
            hp = *x;
        }
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
  for (std::uint32_t i = 0; i < d->schema_len; ++i) {
    const ParamSchema& s = d->schema[i];
    if (!s.key) continue;
    if (std::find(kHeadKeys.begin(), kHeadKeys.end(), s.key) != kHeadKeys.end()) {
      fail(h.plugin_loc, path + ".plugin", h.plugin,
           "plugin '" + h.plugin + "' declares a param '" + s.key +
               "', which is a head key of the pipeline (a bug in the plugin)");
      continue;
    }
    if (!s.default_value) {
      if (!h.params.count(s.key))
        fail(h.loc, join_path(path, s.key), "",
             std::string("missing: plugin '") + h.plugin + "' needs '" + s.key + "' (" +
                 type_name(s.type) + (s.doc ? std::string(", ") + s.doc : "") + ")");
      continue;
    }
    if (!parse_default(s))
      fail(h.plugin_loc, path + ".plugin", h.plugin,
           std::string("plugin '") + h.plugin + "' gives '" + s.key + "' the default '" +
               s.default_value + "', which is not " + a_type(s.type) +
               " (a bug in the plugin)");
  }
}

void Validator::read_heads(const Node& n, PipelineSpec& spec, std::vector<HeadWork>& work) {
  if (n.kind != Node::Kind::seq) {
    fail(n, "heads", "expected a list of heads" + got(n),
         "e.g. heads: [{plugin: c51, role: primary}]");
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
      fail(item, p, "a head is a map with at least 'plugin'" + got(item),
           "e.g. {plugin: c51, role: primary}");
      continue;
    }
    std::vector<const Entry*> extras;
    Fields f = fields(item, p, kHeadKeys, &extras);
    HeadSpec h;
    HeadWork w;
    h.loc = item.loc;
    if (const Node* pl = read_string(f, "plugin", p, h.plugin)) {
      h.plugin_loc = pl->loc;
      if (pl->kind == Node::Kind::scalar && h.plugin.empty())
        fail(*pl, p + ".plugin", "the plugin name is empty");
    } else {
      std::string hint = "e.g. plugin: c51";
      if (catalog_) hint = "plugins found: " + join(catalog_->names());
      fail(item.loc, p + ".plugin", "", "missing: every head names its plugin", hint);
    }
    if (const Node* nm = read_string(f, "name", p, h.name)) {
      h.name_loc = nm->loc;
      if (nm->kind == Node::Kind::scalar && !is_identifier(h.name)) {
        fail(*nm, p + ".name",
             "a head name is a letter or '_' followed by letters, digits, '_' or '-'",
             "it names buffers and overrides (heads.<name>.budget=...)");
      }
    }
    int role = read_choice(f, "role", p, {"primary", "auxiliary"});
    if (const Node* r = find(f, "role")) {
      h.role_loc = r->loc;
      w.role_given = true;
    }
    if (role >= 0) h.role = role == 0 ? Role::primary : Role::auxiliary;
    if (const Node* b = read_number(f, "budget", p, h.budget, Range{0, 1, true, true}))
      h.budget_loc = b->loc;
    if (const Node* en = read_bool(f, "enabled", p, h.enabled)) h.enabled_loc = en->loc;

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
             (names.empty() ? std::string("no plugins were found")
                            : "plugins found: " + join(names)) +
                 " (search path: " + catalog_->search_path() + ")");
      }
    }
    if (plugin_known) read_head_params(extras, p, h, w.desc);
    if (h.name.empty()) {
      h.name = h.plugin;
      if (!h.plugin.empty() && !is_identifier(h.name))
        fail(h.plugin_loc, p + ".plugin", h.plugin,
             "the plugin name is not usable as the head's name",
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

void Validator::read_training(const Node& n, TrainingSpec& t) {
  const std::string p = "training";
  Fields f = fields(n, p, {"env", "num_envs", "total_steps", "learning_starts", "train_every",
                           "gradient_steps", "epsilon", "replay", "eval", "stop_at_return",
                           "out_dir"});
  if (const Node* e = read_string(f, "env", p, t.env); e && e->kind == Node::Kind::scalar) {
    const std::vector<std::string> known = env_names();
    if (t.env.empty()) {
      fail(*e, "training.env", "the environment name is empty", "environments: " + join(known));
    } else if (std::find(known.begin(), known.end(), t.env) == known.end()) {
      std::string why = "unknown environment";
      std::string best = closest_match(t.env, known);
      if (!best.empty()) why += ", did you mean '" + best + "'?";
      fail(*e, "training.env", why, "environments: " + join(known));
    }
  }
  read_int(f, "num_envs", p, t.num_envs, 1);
  read_int(f, "total_steps", p, t.total_steps, 1);
  read_int(f, "learning_starts", p, t.learning_starts, 0);
  read_int(f, "train_every", p, t.train_every, 1);
  read_int(f, "gradient_steps", p, t.gradient_steps, 1);
  if (const Node* e = find(f, "epsilon")) {
    const std::string ep = "training.epsilon";
    Fields g = fields(*e, ep, {"start", "end", "decay_steps"});
    read_number(g, "start", ep, t.epsilon.start, closed(0, 1));
    read_number(g, "end", ep, t.epsilon.end, closed(0, 1));
    read_int(g, "decay_steps", ep, t.epsilon.decay_steps, 1);
  }
  if (const Node* r = find(f, "replay")) {
    const std::string rp = "training.replay";
    Fields g = fields(*r, rp, {"capacity", "prioritized", "alpha", "beta_start", "beta_end",
                               "priority_eps"});
    read_int(g, "capacity", rp, t.replay.capacity, 1);
    read_bool(g, "prioritized", rp, t.replay.prioritized);
    read_number(g, "alpha", rp, t.replay.alpha, at_least(0));
    read_number(g, "beta_start", rp, t.replay.beta_start, closed(0, 1));
    read_number(g, "beta_end", rp, t.replay.beta_end, closed(0, 1));
    read_number(g, "priority_eps", rp, t.replay.priority_eps, above(0));
  }
  if (const Node* e = find(f, "eval")) {
    const std::string vp = "training.eval";
    Fields g = fields(*e, vp, {"every", "episodes"});
    read_int(g, "every", vp, t.eval.every, 1);
    read_int(g, "episodes", vp, t.eval.episodes, 1);
  }
  read_number(f, "stop_at_return", p, t.stop_at_return, Range{});
  read_string(f, "out_dir", p, t.out_dir);
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
  Fields f = fields(*top, "", {"name", "seed", "backend", "precision", "network", "heads",
                               "max_grad_norm", "optimizer", "spectral_norm", "target", "batch",
                               "gamma", "n_step", "report_every", "training"});
  if (const Node* nm = read_string(f, "name", "", spec.name);
      nm && nm->kind == Node::Kind::scalar &&
      (spec.name.empty() || spec.name.find('/') != std::string::npos))
    fail(*nm, "name", "a pipeline name is non-empty and has no '/'",
         "it names the run directory (runs/<name>-<time>)");
  read_int(f, "seed", "", spec.seed, 0);
  switch (read_choice(f, "backend", "", {"cpu", "cuda", "auto"})) {
    case 0: spec.backend = BackendKind::cpu; break;
    case 1: spec.backend = BackendKind::cuda; break;
    case 2: spec.backend = BackendKind::cpu; spec.backend_auto = true; break;
    default: break;
  }
  switch (read_choice(f, "precision", "", {"fp32", "tf32", "bf16"})) {
    case 0: spec.precision = Precision::fp32; break;
    case 1: spec.precision = Precision::tf32; break;
    case 2: spec.precision = Precision::bf16; break;
    default: break;
  }
  if (const Node* n = find(f, "network")) read_network(*n, spec.network);

  std::vector<HeadWork> work;
  if (const Node* h = find(f, "heads")) {
    read_heads(*h, spec, work);
    if (!spec.heads.empty() && spec.heads.size() == h->items.size()) check_heads(*h, spec, work);
  } else {
    fail(top->loc, "heads", "", "missing: a pipeline needs at least one head",
         "e.g. heads: [{plugin: c51, role: primary}]");
  }

  read_number(f, "max_grad_norm", "", spec.max_grad_norm, above(0));
  if (const Node* o = find(f, "optimizer")) {
    Fields g = fields(*o, "optimizer", {"adam"});
    if (const Node* a = find(g, "adam")) {
      const std::string ap = "optimizer.adam";
      Fields ad = fields(*a, ap, {"lr", "betas", "eps"});
      read_number(ad, "lr", ap, spec.adam.lr, above(0));
      read_number(ad, "eps", ap, spec.adam.eps, above(0));
      if (const Node* b = find(ad, "betas")) {
        if (b->kind != Node::Kind::seq || b->items.size() != 2) {
          fail(*b, ap + ".betas", "expected two numbers [beta1, beta2]" + got(*b),
               "e.g. betas: [0.9, 0.999]");
        } else {
          double* dst[2] = {&spec.adam.beta1, &spec.adam.beta2};
          for (std::size_t i = 0; i < 2; ++i) {
            std::string bp = index_path(ap + ".betas", i);
            if (auto x = as_number(b->items[i], bp)) {
              if (!Range{0, 1, false, true}.contains(*x))
                fail(b->items[i], bp, "must be in [0, 1)");
              else
                *dst[i] = *x;
            }
          }
        }
      }
    }
  }
  if (const Node* s = find(f, "spectral_norm")) {
    Fields g = fields(*s, "spectral_norm", {"enabled", "sigma_max"});
    read_bool(g, "enabled", "spectral_norm", spec.spectral_norm.enabled);
    read_number(g, "sigma_max", "spectral_norm", spec.spectral_norm.sigma_max, above(0));
  }
  if (const Node* t = find(f, "target")) {
    Fields g = fields(*t, "target", {"polyak", "period"});
    const Node* pol = find(g, "polyak");
    const Node* per = find(g, "period");
    if (pol && per) {
      // Both point into the same map's entries: the later one is the second written.
      const Entry* second = std::max(g.at("polyak"), g.at("period"));
      fail(second->key_loc, "target." + second->key, render(second->value),
           "give either 'polyak' (soft update every step) or 'period' (hard copy), not both");
    } else if (pol) {
      read_number(g, "polyak", "target", spec.target.polyak, Range{0, 1, true, false});
    } else if (per) {
      std::int64_t period = 0;
      if (read_int(g, "period", "target", period, 1) && period >= 1) spec.target.period = period;
    } else if (t->kind == Node::Kind::map) {
      fail(*t, "target", "needs 'polyak' (e.g. 0.005) or 'period' (e.g. 1000)");
    }
  }
  const Node* batch = read_int(f, "batch", "", spec.batch, 1);
  read_number(f, "gamma", "", spec.gamma, Range{0, 1, true, false});
  read_int(f, "n_step", "", spec.n_step, 1);
  read_int(f, "report_every", "", spec.report_every, 1);

  const Node* capacity = nullptr;
  if (const Node* t = find(f, "training")) {
    read_training(*t, spec.training);
    if (t->kind == Node::Kind::map)
      for (const auto& e : t->entries)
        if (e.key == "replay" && e.value.kind == Node::Kind::map) {
          for (const auto& r : e.value.entries)
            if (r.key == "capacity") {
              capacity = &r.value;
              break;
            }
          break;
        }
  }
  if (spec.training.replay.capacity < spec.batch) {
    const Node* at = capacity ? capacity : batch;
    fail(at ? at->loc : top->loc, "training.replay.capacity",
         std::to_string(spec.training.replay.capacity),
         "the replay holds " + std::to_string(spec.training.replay.capacity) +
             " transitions, fewer than one batch (" + std::to_string(spec.batch) + ")",
         "make training.replay.capacity at least the batch size");
  }
  return spec;
}

// ---------------------------------------------------------------------------------------------
// Overrides: key.path=value, applied to the tree.

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

std::string trim(const std::string& s) {
  std::size_t a = s.find_first_not_of(" \t");
  if (a == std::string::npos) return "";
  std::size_t b = s.find_last_not_of(" \t");
  return s.substr(a, b - a + 1);
}

const Node* map_get(const Node& n, const std::string& key) {
  if (n.kind != Node::Kind::map) return nullptr;
  for (const auto& e : n.entries)
    if (e.key == key) return &e.value;
  return nullptr;
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
    YAML::Node y = YAML::Load(value_text);
    if (!convert(y, Origin{loc.file, true}, 1, key, value, errs)) return;
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
    if (last)
      *next = value;
    else
      cur = next;
  }
}

// ---------------------------------------------------------------------------------------------

void sort_errors(std::vector<PipelineError>& errs) {
  std::stable_sort(errs.begin(), errs.end(), [](const PipelineError& a, const PipelineError& b) {
    auto rank = [](const PipelineError& e) {
      bool ov = e.where().file.rfind("<override", 0) == 0;
      return std::tuple<int, int, int>(ov ? 1 : 0, e.where().line, e.where().column);
    };
    return rank(a) < rank(b);
  });
}

// ---------------------------------------------------------------------------------------------
// Writing YAML back.

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\x%02x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

std::string yaml_key(const std::string& k) { return is_identifier(k) ? k : quote(k); }

std::string yaml_param(const HeadParam& p) {
  if (auto s = std::get_if<std::string>(&p)) return quote(*s);
  return param_text(p);
}

std::string write_yaml(const PipelineSpec& spec, const PluginCatalog* catalog) {
  std::ostringstream o;
  auto b = [](bool v) { return v ? "true" : "false"; };
  auto d = [](double v) { return format_double(v); };
  o << "# dqn-engine pipeline, fully resolved\n";
  o << "name: " << quote(spec.name) << "\n";
  o << "seed: " << spec.seed << "\n";
  o << "backend: " << (spec.backend_auto ? "auto" : to_string(spec.backend)) << "\n";
  o << "precision: " << to_string(spec.precision) << "\n";
  const NetworkSpec& n = spec.network;
  o << "network:\n";
  o << "  state: " << n.state << "\n";
  o << "  trunk: [";
  for (std::size_t i = 0; i < n.trunk.size(); ++i) o << (i ? ", " : "") << n.trunk[i];
  o << "]\n";
  o << "  head_hidden: " << n.head_hidden << "\n";
  o << "  branches: " << n.branches << "\n";
  o << "  actions: " << n.actions << "\n";
  o << "  atoms: " << n.atoms << "\n";
  o << "  v_min: " << d(n.v_min) << "\n";
  o << "  v_max: " << d(n.v_max) << "\n";
  o << "heads:\n";
  for (std::size_t i = 0; i < spec.heads.size(); ++i) {
    const HeadSpec& h = spec.heads[i];
    o << "  - plugin: " << quote(h.plugin) << "\n";
    o << "    name: " << quote(h.name) << "\n";
    o << "    role: " << to_string(h.role) << "\n";
    o << "    enabled: " << b(h.enabled) << "\n";
    if (h.role == Role::primary) {
      try {
        o << "    # budget: what the enabled auxiliaries leave ("
          << fmt(resolved_budget(spec, i)) << ")\n";
      } catch (const std::exception&) {
        o << "    # budget: what the enabled auxiliaries leave\n";
      }
    } else if (h.budget >= 0) {
      o << "    budget: " << d(h.budget) << "\n";
    } else {
      o << "    # budget: the plugin's default\n";
    }
    const PluginDescriptor* desc = catalog ? catalog->find(h.plugin) : nullptr;
    if (desc) {
      std::vector<std::string> storage;
      std::vector<ParamValue> vals = resolve_head_params(h, *desc, storage);
      for (std::uint32_t k = 0; k < desc->schema_len; ++k) {
        const ParamSchema& s = desc->schema[k];
        const ParamValue& v = vals[k];
        std::string text = s.type == ParamType::string ? quote(v.s) : std::string(v.s);
        o << "    " << yaml_key(s.key) << ": " << text;
        if (s.doc && *s.doc) o << "  # " << s.doc;
        o << "\n";
      }
    } else {
      for (const auto& [k, v] : h.params) o << "    " << yaml_key(k) << ": " << yaml_param(v) << "\n";
    }
  }
  o << "max_grad_norm: " << d(spec.max_grad_norm) << "\n";
  o << "optimizer:\n  adam:\n";
  o << "    lr: " << d(spec.adam.lr) << "\n";
  o << "    betas: [" << d(spec.adam.beta1) << ", " << d(spec.adam.beta2) << "]\n";
  o << "    eps: " << d(spec.adam.eps) << "\n";
  o << "spectral_norm:\n";
  o << "  enabled: " << b(spec.spectral_norm.enabled) << "\n";
  o << "  sigma_max: " << d(spec.spectral_norm.sigma_max) << "\n";
  o << "target:\n";
  if (spec.target.period > 0)
    o << "  period: " << spec.target.period << "\n";
  else
    o << "  polyak: " << d(spec.target.polyak) << "\n";
  o << "batch: " << spec.batch << "\n";
  o << "gamma: " << d(spec.gamma) << "\n";
  o << "n_step: " << spec.n_step << "\n";
  o << "report_every: " << spec.report_every << "\n";
  const TrainingSpec& t = spec.training;
  o << "training:\n";
  o << "  env: " << quote(t.env) << "\n";
  o << "  num_envs: " << t.num_envs << "\n";
  o << "  total_steps: " << t.total_steps << "\n";
  o << "  learning_starts: " << t.learning_starts << "\n";
  o << "  train_every: " << t.train_every << "\n";
  o << "  gradient_steps: " << t.gradient_steps << "\n";
  o << "  epsilon:\n";
  o << "    start: " << d(t.epsilon.start) << "\n";
  o << "    end: " << d(t.epsilon.end) << "\n";
  o << "    decay_steps: " << t.epsilon.decay_steps << "\n";
  o << "  replay:\n";
  o << "    capacity: " << t.replay.capacity << "\n";
  o << "    prioritized: " << b(t.replay.prioritized) << "\n";
  o << "    alpha: " << d(t.replay.alpha) << "\n";
  o << "    beta_start: " << d(t.replay.beta_start) << "\n";
  o << "    beta_end: " << d(t.replay.beta_end) << "\n";
  o << "    priority_eps: " << d(t.replay.priority_eps) << "\n";
  o << "  eval:\n";
  o << "    every: " << t.eval.every << "\n";
  o << "    episodes: " << t.eval.episodes << "\n";
  o << "  stop_at_return: " << d(t.stop_at_return) << "\n";
  o << "  out_dir: " << quote(t.out_dir) << "\n";
  return o.str();
}

}  // namespace

// ---------------------------------------------------------------------------------------------

std::size_t edit_distance(const std::string& a, const std::string& b) {
  // Optimal string alignment: Levenshtein plus adjacent transpositions ("bacth" → "batch" is 1).
  std::vector<std::vector<std::size_t>> dp(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) dp[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) dp[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i)
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      dp[i][j] = std::min({dp[i - 1][j] + 1, dp[i][j - 1] + 1, dp[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        dp[i][j] = std::min(dp[i][j], dp[i - 2][j - 2] + 1);
    }
  return dp[a.size()][b.size()];
}

std::string closest_match(const std::string& word, const std::vector<std::string>& candidates) {
  std::string w = lower(word);
  std::size_t limit = w.size() <= 3 ? 1 : w.size() <= 6 ? 2 : 3;
  std::string best;
  std::size_t best_d = limit + 1;
  for (const auto& c : candidates) {
    std::size_t dist = edit_distance(w, lower(c));
    if (dist < best_d) {
      best_d = dist;
      best = c;
    }
  }
  if (!best.empty()) return best;
  if (w.size() >= 3)  // a truncated key: "target_quant" → "target_quantiles"
    for (const auto& c : candidates)
      if (lower(c).rfind(w, 0) == 0) return c;
  return "";
}

PipelineSpec parse_pipeline(const std::string& yaml_text, const std::string& source_name,
                            const ParseOptions& opt) {
  std::vector<PipelineError> errs;
  Node root;
  try {
    std::vector<YAML::Node> docs = YAML::LoadAll(yaml_text);
    if (docs.size() > 1) {
      errs.emplace_back(Origin{source_name}.at(docs[1].Mark()), "", "",
                        "a pipeline file holds one YAML document; found a second (after '---')");
    }
    if (!docs.empty()) convert(docs[0], Origin{source_name}, 0, "", root, errs);
  } catch (const YAML::Exception& e) {
    std::string hint;
    if (e.msg.find("tab") != std::string::npos) hint = "indent with spaces, not tabs";
    errs.emplace_back(Origin{source_name}.at(e.mark), "", "", "YAML syntax error: " + e.msg,
                      hint);
    throw PipelineErrors(std::move(errs));
  }
  if (!errs.empty()) throw PipelineErrors(std::move(errs));
  root.loc = root.kind == Node::Kind::null ? SourceLoc{source_name, 1, 1} : root.loc;

  for (const auto& o : opt.overrides) apply_override(root, o, errs);
  find_duplicates(root, "", errs);

  Validator v(opt.plugins, source_name);
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

std::string to_yaml(const PipelineSpec& spec) { return write_yaml(spec, nullptr); }

std::string to_yaml(const PipelineSpec& spec, const PluginCatalog& plugins) {
  return write_yaml(spec, &plugins);
}

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
