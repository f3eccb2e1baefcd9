/** @file checkpoint.cpp
 *  @brief Sealing, writing, pruning and finding checkpoint files (checkpoint.hpp).
 */
#include "training/checkpoint.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <regex>
#include <stdexcept>

namespace dqn::checkpoint {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "dqn-engine checkpoint";
constexpr const char* kVersion = "1";

std::uint64_t mix(std::uint64_t h, std::uint64_t w) {
  h ^= w + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  h *= 0xBF58476D1CE4E5B9ull;
  return h ^ (h >> 31);
}

/// Every tensor (name, dtype, shape, bytes) and every metadata entry but the hash itself.
std::uint64_t content_hash(const st::File& f) {
  std::uint64_t h = 0x243F6A8885A308D3ull;
  for (const auto& [k, v] : f.metadata) {
    if (k == "content_hash") continue;
    h = mix(h, hash_bytes(k.data(), k.size(), 1));
    h = mix(h, hash_bytes(v.data(), v.size(), 2));
  }
  for (const auto& [name, t] : f.tensors) {
    h = mix(h, hash_bytes(name.data(), name.size(), 3));
    h = mix(h, std::uint64_t(t.dtype));
    for (std::int64_t d : t.shape) h = mix(h, std::uint64_t(d));
    h = mix(h, hash_bytes(t.bytes.data(), t.bytes.size(), 4));
  }
  return h;
}

/// step-<digits>.safetensors → the clock; nullopt for any other name.
std::optional<std::int64_t> clock_of(const std::string& name) {
  static const std::regex re("step-([0-9]{1,18})\\.safetensors");
  std::smatch m;
  if (!std::regex_match(name, m, re)) return std::nullopt;
  return std::stoll(m[1].str());
}

/// The checkpoint files of a folder, newest first.
std::vector<std::pair<std::int64_t, fs::path>> listed(const fs::path& dir) {
  std::vector<std::pair<std::int64_t, fs::path>> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (auto c = clock_of(e.path().filename().string())) out.emplace_back(*c, e.path());
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

}  // namespace

std::uint64_t hash_bytes(const void* data, std::size_t n, std::uint64_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint64_t h = mix(0x13198A2E03707344ull, seed ^ n);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    std::uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 0x100000001B3ull;
    h ^= h >> 29;
  }
  std::uint64_t tail = 0;
  if (i < n) std::memcpy(&tail, p + i, n - i);
  return mix(h, tail);
}

std::string hex(std::uint64_t v) {
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string path_for(const std::string& run_dir, std::int64_t clock) {
  char name[48];
  std::snprintf(name, sizeof name, "step-%012lld.safetensors", static_cast<long long>(clock));
  return (fs::path(run_dir) / kFolder / name).string();
}

std::string write(const std::string& run_dir, std::int64_t clock, const std::string& pipeline_text, st::File f,
                  int keep) {
  const fs::path dir = fs::path(run_dir) / kFolder;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw st::Error(dir.string(), "cannot create the checkpoint folder: " + ec.message());
  f.metadata["format"] = kFormat;
  f.metadata["version"] = kVersion;
  f.metadata["clock"] = std::to_string(clock);
  f.metadata["pipeline_hash"] = hex(hash_bytes(pipeline_text.data(), pipeline_text.size()));
  f.metadata["content_hash"] = hex(content_hash(f));
  const std::string path = path_for(run_dir, clock);
  st::write_file(path, f);
  if (keep > 0) {
    const auto all = listed(dir);
    for (std::size_t i = std::size_t(keep); i < all.size(); ++i) fs::remove(all[i].second, ec);
  }
  return path;
}

Search newest(const std::string& run_dir, const std::string& pipeline_text) {
  Search s;
  const fs::path dir = fs::path(run_dir) / kFolder;
  std::error_code ec;
  // Temporaries of writes that never finished (st::write_file names them <path>.tmp.<pid>).
  std::vector<fs::path> partial;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().filename().string().find(".safetensors.tmp.") != std::string::npos) partial.push_back(e.path());
  std::sort(partial.begin(), partial.end());
  for (const fs::path& p : partial) {
    s.skipped.push_back(p.string() + ": an interrupted write (" + std::to_string(fs::file_size(p, ec)) +
                        " bytes, never completed); removed");
    fs::remove(p, ec);
  }
  const std::string want = hex(hash_bytes(pipeline_text.data(), pipeline_text.size()));
  for (const auto& [clock, path] : listed(dir)) {
    try {
      st::File f = st::read_file(path.string());
      auto meta = [&](const char* key) {
        auto it = f.metadata.find(key);
        return it == f.metadata.end() ? std::string() : it->second;
      };
      if (meta("format") != kFormat || meta("version") != kVersion)
        throw std::runtime_error("not a version " + std::string(kVersion) + " checkpoint (format '" + meta("format") +
                                 "', version '" + meta("version") + "')");
      if (meta("content_hash") != hex(content_hash(f)))
        throw std::runtime_error("damaged: its contents do not match the hash sealed into it");
      if (meta("clock") != std::to_string(clock))
        throw std::runtime_error("its name says step " + std::to_string(clock) + " but it holds step " + meta("clock"));
      if (meta("pipeline_hash") != want)
        throw std::runtime_error("written for another pipeline.yaml than the run directory holds now");
      s.found = Found{std::move(f), path.string(), clock};
      return s;
    } catch (const std::exception& e) {
      std::string why = e.what();
      // st::Error already names the file.
      const std::string lead = "safetensors file '" + path.string() + "': ";
      if (why.rfind(lead, 0) == 0) why = why.substr(lead.size());
      s.skipped.push_back(path.string() + ": " + why + "; skipped");
    }
  }
  return s;
}

}  // namespace dqn::checkpoint
