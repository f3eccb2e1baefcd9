/** @file checkpoint.hpp
 *  @brief Checkpoint files in a run directory: `checkpoints/step-<clock>.safetensors`, each sealed
 *  with a hash of its contents and of the run's pipeline.yaml, written atomically (temporary file,
 *  fsync, rename, fsync of the folder), the newest K kept; on resume the newest one that reads
 *  back whole is taken and every one passed over is named with the reason.
 */
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/safetensors.hpp"

namespace dqn::checkpoint {

/// The folder inside a run directory.
inline constexpr const char* kFolder = "checkpoints";

/// A 64-bit hash of bytes (not cryptographic: it detects torn and damaged files).
std::uint64_t hash_bytes(const void* data, std::size_t n, std::uint64_t seed = 0);
/// 16 hex digits.
std::string hex(std::uint64_t v);

/// run_dir/checkpoints/step-<clock, 12 digits>.safetensors
std::string path_for(const std::string& run_dir, std::int64_t clock);

/// Seals f (format, clock, the pipeline text's hash, the content hash) and writes it atomically;
/// then removes all but the newest `keep` checkpoints. Returns the path written. Throws st::Error
/// naming the path when it cannot be written (an older checkpoint is then untouched).
std::string write(const std::string& run_dir, std::int64_t clock, const std::string& pipeline_text, st::File f,
                  int keep);

/// The newest checkpoint of run_dir that reads back whole, with the same pipeline text.
struct Found {
  st::File file;
  std::string path;
  std::int64_t clock = 0;
};
struct Search {
  std::optional<Found> found;
  /// One line per file passed over: "<path>: <why>" (torn, damaged, another pipeline, a
  /// temporary left by an interrupted write — those are removed).
  std::vector<std::string> skipped;
};
Search newest(const std::string& run_dir, const std::string& pipeline_text);

}  // namespace dqn::checkpoint
