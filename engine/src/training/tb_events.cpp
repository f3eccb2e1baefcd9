/** @file tb_events.cpp
 *  @brief TensorBoard event records: CRC-32C, the protobuf wire format of Event and Summary for
 *  scalars, and the run's event file.
 */
#include "training/tb_events.hpp"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <stdexcept>

namespace dqn::tb {

namespace {

constexpr std::array<std::uint32_t, 256> crc_table() {
  std::array<std::uint32_t, 256> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // reflected Castagnoli
    t[i] = c;
  }
  return t;
}
constexpr std::array<std::uint32_t, 256> kCrc = crc_table();

// --- the protobuf wire format, for the fields used ---
void varint(std::string& o, std::uint64_t v) {
  while (v >= 0x80) {
    o.push_back(char(std::uint8_t(v) | 0x80));
    v >>= 7;
  }
  o.push_back(char(v));
}
void key(std::string& o, int field, int wire) { varint(o, std::uint64_t(field) << 3 | std::uint64_t(wire)); }
template <class T>
void fixed(std::string& o, T v) {  // little-endian, as the wire format stores fixed64/fixed32
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  o.append(b, sizeof(T));
}
void bytes_field(std::string& o, int field, const std::string& v) {
  key(o, field, 2);
  varint(o, v.size());
  o += v;
}

/// Event { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
std::string event(double wall_time, std::int64_t step, const std::string* version, const std::string* summary) {
  std::string e;
  key(e, 1, 1);
  fixed(e, wall_time);
  if (step != 0) {
    key(e, 2, 0);
    varint(e, std::uint64_t(step));
  }
  if (version) bytes_field(e, 3, *version);
  if (summary) bytes_field(e, 5, *summary);
  return e;
}

/// The TFRecord framing: uint64 length, masked CRC of it, the data, masked CRC of the data.
std::string record(const std::string& data) {
  std::string r;
  fixed(r, std::uint64_t(data.size()));
  fixed(r, masked_crc32c(r.data(), 8));
  r += data;
  fixed(r, masked_crc32c(data.data(), data.size()));
  return r;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

std::uint32_t crc32c(const void* data, std::size_t n) {
  const auto* p = static_cast<const std::uint8_t*>(data);
  std::uint32_t c = 0xFFFFFFFFu;
  for (std::size_t i = 0; i < n; ++i) c = kCrc[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

std::uint32_t masked_crc32c(const void* data, std::size_t n) {
  const std::uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

std::string scalars_record(double wall_time, std::int64_t step,
                           const std::vector<std::pair<std::string, float>>& values) {
  std::string summary;
  for (const auto& [tag, v] : values) {
    std::string value;  // Summary.Value { string tag = 1; float simple_value = 2; }
    bytes_field(value, 1, tag);
    key(value, 2, 5);
    fixed(value, v);
    bytes_field(summary, 1, value);  // Summary { repeated Value value = 1; }
  }
  return record(event(wall_time, step, nullptr, &summary));
}

std::string version_record(double wall_time) {
  const std::string version = "brain.Event:2";
  return record(event(wall_time, 0, &version, nullptr));
}

void EventFile::open(const std::string& run_dir, const std::string& name, std::int64_t bytes) {
  namespace fs = std::filesystem;
  if (name.empty()) {
    char host[256] = "localhost";
    if (gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "localhost");
    const double t = now_s();
    name_ = "events.out.tfevents." + std::to_string(std::int64_t(t)) + "." + host + ".dqn";
    path_ = (fs::path(run_dir) / name_).string();
    out_.open(path_, std::ios::binary | std::ios::trunc);
    if (!out_) throw std::runtime_error("cannot open '" + path_ + "' for writing");
    out_ << version_record(t);
    out_.flush();
  } else {
    name_ = name;
    path_ = (fs::path(run_dir) / name_).string();
    std::error_code ec;
    if (!fs::exists(path_, ec) || std::int64_t(fs::file_size(path_, ec)) < bytes)
      throw std::runtime_error("'" + path_ + "' is missing or shorter than the checkpoint's " + std::to_string(bytes) +
                               " bytes: the event file was cut or replaced since");
    fs::resize_file(path_, std::uintmax_t(bytes), ec);
    if (ec) throw std::runtime_error("cannot cut '" + path_ + "' back: " + ec.message());
    out_.open(path_, std::ios::binary | std::ios::app);
    if (!out_) throw std::runtime_error("cannot open '" + path_ + "' for writing");
  }
}

void EventFile::scalars(std::int64_t step, const std::vector<std::pair<std::string, float>>& values) {
  if (!out_.is_open()) return;
  out_ << scalars_record(now_s(), step, values);
  out_.flush();
  if (!out_) throw std::runtime_error("cannot write '" + path_ + "'");
}

}  // namespace dqn::tb
