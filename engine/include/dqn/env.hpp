/** @file env.hpp
 *  @brief What an environment plugin implements: N copies of a task stepping together (same-step
 *  auto-reset with the final observation, terminated apart from truncated), a spec that says each
 *  action branch's bins and, for continuous control, the control each bin means, and its whole
 *  state saved and loaded for exact resume. One plugin library may offer several tasks
 *  (PluginDescriptor::envs). Nothing here may throw across the plugin boundary; dqn/env_base.hpp
 *  wraps all of it for an environment written in plain C++.
 */
#pragma once

#include <cstdint>

#include "dqn/plugin.hpp"

namespace dqn {

/// One action dimension (a branch of the network). A continuous branch maps bin k of `bins` to the
/// control lo + k (hi − lo) / (bins − 1); a discrete one has `bins` choices with no order.
struct EnvBranch {
  std::int32_t bins;        ///< sub-actions: the network's actions per branch
  std::int32_t continuous;  ///< 1: bins are evenly spaced controls in [lo, hi]
  double lo, hi;            ///< the control range (continuous branches)
  const char* name;         ///< what it moves ("shoulder"); may be null
};

/// What a task offers the network; the pointers stay valid while the environment lives.
struct EnvSpec {
  const char* name;                 ///< the task ("CartPole-v1", "humanoid_stand")
  std::int32_t obs_dim;             ///< observation features (float32)
  std::int32_t n_branches;          ///< action dimensions
  const EnvBranch* branches;        ///< [n_branches]
  std::int32_t max_episode_steps;   ///< truncation limit (0: none)
  std::int32_t reports_success;     ///< 1: step() sets EnvStep::success where an episode ends well
};

/// One step's arrays, each the whole [N, …] row-major array of every copy (none of them null; the
/// engine zeroes success and unstable before the call); a call for copies [begin, end) reads and
/// writes only those rows.
struct EnvStep {
  const std::int32_t* actions;  ///< [N, n_branches]: a bin per branch, already checked in range
  float* next_obs;              ///< [N, obs_dim]: the next observation (a new episode's first where one ended)
  float* rewards;               ///< [N]
  std::uint8_t* terminated;     ///< [N]: 1 where the episode reached a terminal state
  std::uint8_t* truncated;      ///< [N]: 1 where it was cut off (time limit, unstable simulation)
  float* final_obs;             ///< [N, obs_dim]: the observation that ended the episode, else = next_obs
  std::uint8_t* success;        ///< [N]: 1 where an episode ended that the task counts a success
  std::uint8_t* unstable;       ///< [N]: 1 where the simulation became unstable (the episode is truncated)
};

/// Element types of saved state.
enum class StateType : std::int32_t { f64 = 0, f32 = 1, i32 = 2, i64 = 3, u8 = 4, u64 = 5 };

/// Where an environment saves its state: named tensors (the engine adds its own prefix to each
/// name). Returns 0, or non-zero with the reason recorded by the engine.
class StateWriter {
 public:
  virtual int put(const char* name, StateType type, const std::int64_t* shape, std::int32_t rank,
                  const void* data) noexcept = 0;
  virtual int fail(const char* message) noexcept = 0;
};

/// Where an environment reads its state back. get() fills `data` when the tensor exists with
/// exactly this type and shape, else returns non-zero and records which tensor and why.
class StateReader {
 public:
  virtual int get(const char* name, StateType type, const std::int64_t* shape, std::int32_t rank,
                  void* data) const noexcept = 0;
  /// Records a problem with what was read (a value out of range): name the tensor and element.
  virtual int fail(const char* message) const noexcept = 0;
  /// The file being read, for messages.
  virtual const char* source() const noexcept = 0;
};

/// N copies of one task. Copies are independent: the engine may call reset and step on disjoint
/// ranges [begin, end) from several threads at once, and a copy's results may depend only on its
/// own state and its index (never on how the copies are split), so any split gives the same numbers.
/// Calls return 0, or non-zero after writing the reason (NUL-terminated, at most errlen bytes) to err.
class Env {
 public:
  virtual ~Env() = default;
  virtual const EnvSpec& spec() const noexcept = 0;
  virtual std::int32_t num_envs() const noexcept = 0;
  /// Seeds copies [begin, end) from (seed, copy index) and starts new episodes; writes their rows
  /// of obs [N, obs_dim].
  virtual int reset(std::uint64_t seed, std::int32_t begin, std::int32_t end, float* obs, char* err,
                    std::uint32_t errlen) noexcept = 0;
  /// Steps copies [begin, end); a copy whose episode ends starts a new one in the same call.
  virtual int step(std::int32_t begin, std::int32_t end, const EnvStep& io, char* err,
                   std::uint32_t errlen) noexcept = 0;
  /// Every copy's whole state (dynamics, step counts, random generators), so that after
  /// load_state the copies step on exactly as they would have (a tensor may have a zero-sized
  /// dimension). load_state changes nothing when it fails.
  virtual int save_state(StateWriter& w) const noexcept = 0;
  virtual int load_state(const StateReader& r) noexcept = 0;
};

struct EnvCreateInfo {
  const char* task;           ///< one of the plugin's tasks (EnvDescriptor::task)
  std::int32_t num_envs;      ///< N >= 1
  std::uint64_t seed;         ///< as a later reset(seed, 0, N, …)
  const ParamValue* params;   ///< every key of the task's schema, defaults filled in
  std::uint32_t n_params;
};

/// One task a plugin offers.
struct EnvDescriptor {
  const char* task;
  const char* description;
  std::uint32_t schema_len;
  const ParamSchema* schema;
  /// Returns new copies or null; on failure writes a message into err (errlen bytes).
  Env* (*create)(const EnvCreateInfo* info, char* err, std::uint32_t errlen);
  void (*destroy)(Env* env);
};

}  // namespace dqn
