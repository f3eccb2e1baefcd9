// dqn csv: a run's metrics.jsonl as one CSV table (a column for every key any line has, in the
// order they first appear; empty where a line has none or null), for spreadsheets and plotting
// tools that read CSV.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.hpp"

namespace dqn::cli {

namespace {

std::string cell(const nlohmann::ordered_json& v) {
  if (v.is_null()) return "";
  if (v.is_string()) {  // (no key holds text today; quoted as CSV would need it)
    std::string s = "\"";
    for (char c : v.get<std::string>()) s += c == '"' ? std::string("\"\"") : std::string(1, c);
    return s + "\"";
  }
  return v.dump();  // numbers as JSON writes them (shortest round trip), true/false
}

}  // namespace

int cmd_csv(const CsvArgs& a) {
  namespace fs = std::filesystem;
  const fs::path metrics = fs::path(a.run) / "metrics.jsonl";
  std::ifstream in(metrics, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "dqn csv: %s: %s\n", a.run.c_str(),
                 fs::is_directory(a.run) ? "holds no metrics.jsonl: not a run directory of dqn train" : "no such directory");
    return 1;
  }
  const std::string out = a.out.empty() ? (fs::path(a.run) / "metrics.csv").string() : a.out;
  if (out != "-" && fs::exists(out) && !a.force) {
    std::fprintf(stderr, "dqn csv: %s exists; nothing was written (--force replaces it)\n", out.c_str());
    return 1;
  }
  std::vector<nlohmann::ordered_json> rows;
  std::vector<std::string> columns;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(line, nullptr, false);
    if (!j.is_object()) {
      std::fprintf(stderr, "dqn csv: %s:%d: not a JSON object (a line cut short?); nothing was written\n",
                   metrics.string().c_str(), n);
      return 1;
    }
    for (const auto& [k, v] : j.items())
      if (std::find(columns.begin(), columns.end(), k) == columns.end()) columns.push_back(k);
    rows.push_back(std::move(j));
  }
  std::string text;
  for (std::size_t c = 0; c < columns.size(); ++c) text += (c ? "," : "") + columns[c];
  text += '\n';
  for (const auto& r : rows) {
    for (std::size_t c = 0; c < columns.size(); ++c) {
      if (c) text += ',';
      if (r.contains(columns[c])) text += cell(r.at(columns[c]));
    }
    text += '\n';
  }
  if (out == "-") {
    std::fwrite(text.data(), 1, text.size(), stdout);
    return 0;
  }
  if (!write_text(out, text)) return 1;
  std::printf("%s: %zu rows, %zu columns\n", out.c_str(), rows.size(), columns.size());
  return 0;
}

}  // namespace dqn::cli
