/** @file tb_events.hpp
 *  @brief TensorBoard's event files, written by the engine: the TFRecord framing (length, masked
 *  CRC-32C of the length, an `Event` protobuf, masked CRC-32C of it) around the few fields of
 *  `Event` (wall_time, step, file_version, summary) and `Summary.Value` (tag, simple_value) that
 *  scalars need, encoded by hand (tensorflow/core/util/event.proto, summary.proto).
 */
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace dqn::tb {

/// CRC-32C (Castagnoli) of `n` bytes, and the masked form the record framing stores.
std::uint32_t crc32c(const void* data, std::size_t n);
std::uint32_t masked_crc32c(const void* data, std::size_t n);

/// One Event record's bytes (framing included): a Summary of simple values at `step`.
std::string scalars_record(double wall_time, std::int64_t step,
                           const std::vector<std::pair<std::string, float>>& values);
/// The first record of a file: file_version "brain.Event:2".
std::string version_record(double wall_time);

/// A run's event file: "events.out.tfevents.<unix seconds>.<host>.dqn" in the run directory, one
/// record per metrics line, flushed as it is written.
class EventFile {
 public:
  /// A new file in run_dir (its version record written), or — `name` given — that file of
  /// run_dir cut back to `bytes` and appended to (a resumed run). Throws std::runtime_error
  /// naming the file when it cannot be opened or cut.
  void open(const std::string& run_dir, const std::string& name = "", std::int64_t bytes = 0);
  bool is_open() const { return out_.is_open(); }
  void close() { out_.close(); }
  /// The file's name (in the run directory) and its size so far: what a checkpoint keeps.
  const std::string& name() const { return name_; }
  std::int64_t bytes() { return out_.is_open() ? std::int64_t(out_.tellp()) : 0; }
  /// Appends a record of `values` at `step` and flushes; std::runtime_error when it cannot.
  void scalars(std::int64_t step, const std::vector<std::pair<std::string, float>>& values);

 private:
  std::string path_, name_;
  std::ofstream out_;
};

}  // namespace dqn::tb
