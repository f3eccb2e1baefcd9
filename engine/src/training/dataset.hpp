/** @file dataset.hpp
 *  @brief Offline datasets (training.dataset): transitions by episode, read from a safetensors
 *  file or a Minari dataset's HDF5, checked before anything is trained or written, assembled into
 *  n-step transitions for the engine's replay; and written by `dqn collect`.
 *
 *  The safetensors layout (one row per environment step, episodes one after another):
 *    states [N, S], next_states [N, S] (f32, f64, f16 or bf16), actions [N, D] or [N] when D = 1
 *    (i32 or i64), rewards [N], dones [N] (1: the episode terminated at that step; f32, u8 or
 *    bool), episode_ends [E] (i64: the index of each episode's last step, increasing, the last N − 1).
 */
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/safetensors.hpp"
#include "pipeline/spec.hpp"
#include "training/replay.hpp"

namespace dqn {

/// A bad dataset: what() names the file, the tensor (or HDF5 path), the first bad index and why.
class DatasetError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Dataset {
  std::string path;
  int S = 0, D = 0;
  std::vector<float> states, next_states, rewards, dones;  ///< per step
  std::vector<std::int32_t> actions;                       ///< [N, D]
  std::vector<std::int64_t> episode_ends;                  ///< each episode's last step
  std::map<std::string, std::string> metadata;

  std::int64_t steps() const { return std::int64_t(rewards.size()); }
  std::int64_t episodes() const { return std::int64_t(episode_ends.size()); }
  /// The mean undiscounted return of its episodes (the behaviour policy's, where every episode is
  /// whole: `dqn collect` records it in the metadata as behaviour_return before adding the
  /// episodes its last step cut short).
  double mean_return() const;
  /// Checks everything against the network (shapes, finite values, actions in range, dones 0/1
  /// and only at an episode's last step, non-empty increasing episodes); throws DatasetError.
  void check(const NetworkSpec& net) const;
};

/// Reads a dataset by its extension: .h5/.hdf5 (Minari; needs libhdf5) or else safetensors, and
/// checks it against the network. Throws DatasetError (and st::Error for an unreadable file).
Dataset read_dataset(const std::string& path, const NetworkSpec& net);
/// The same from a safetensors file already read (its path names it in errors).
Dataset dataset_from(const st::File& f, const NetworkSpec& net);
/// A Minari dataset's HDF5: groups episode_<k> with observations [T+1, S], actions [T] or [T, D],
/// rewards [T], terminations [T], truncations [T]. DatasetError when libhdf5 is not built in.
Dataset read_minari_hdf5(const std::string& path);
/// Whether read_minari_hdf5 can read (the build found libhdf5).
bool hdf5_available();

/// Atomic (safetensors' write_file): an existing file at path is replaced only once the new one
/// is whole.
void write_dataset(const std::string& path, const Dataset& d);

/// Every episode as n-step transitions (NStepAssembler: the last step's done, else a truncation).
TransitionBatch assemble_transitions(const Dataset& d, int n_step, double gamma);

}  // namespace dqn
