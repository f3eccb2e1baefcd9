/** @file text.cpp
 *  @brief The DSL's scalars read and written, and the edit distance behind every "did you mean".
 */
#include "pipeline/text.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "pipeline/parse.hpp"

namespace dqn {
namespace dsl {

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

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

std::string format_double(double v) {
  if (std::isnan(v)) return ".nan";
  if (std::isinf(v)) return v > 0 ? ".inf" : "-.inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

std::string fmt(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

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

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

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

bool is_identifier(const std::string& s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
  });
}

}  // namespace dsl

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
  std::string w = dsl::lower(word);
  std::size_t limit = w.size() <= 3 ? 1 : w.size() <= 6 ? 2 : 3;
  std::string best;
  std::size_t best_d = limit + 1;
  for (const auto& c : candidates) {
    std::size_t dist = edit_distance(w, dsl::lower(c));
    if (dist < best_d) {
      best_d = dist;
      best = c;
    }
  }
  if (!best.empty()) return best;
  if (w.size() >= 3)  // a truncated key: "target_quant" → "target_quantiles"
    for (const auto& c : candidates)
      if (dsl::lower(c).rfind(w, 0) == 0) return c;
  return "";
}

}  // namespace dqn
