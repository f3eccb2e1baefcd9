/** @file mujoco_env.hpp
 *  @brief What every MuJoCo task shares: one compiled model per environment object (read-only,
 *  shared by the copies), one mjData and one random stream per copy, a continuous branch of
 *  `bins` controls per actuator over its ctrlrange, control steps of whole physics substeps, the
 *  unstable-simulation check, and the whole per-copy state saved and loaded for exact resume.
 *  A task adds its initial state, observation, reward and success test.
 */
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <mujoco/mujoco.h>

#include "dqn/env_base.hpp"
#include "mujoco_runtime.hpp"

namespace dqn_mujoco {

/// The shortest text that reads back as x, for messages (0.025, not 0.025000000000000001).
std::string text(double x);

struct DataDeleter {
  void operator()(mjData* d) const noexcept { mj_deleteData(d); }
};

/// One copy of the task.
struct Copy {
  std::unique_ptr<mjData, DataDeleter> data;
  std::uint64_t rng = 0;       ///< its env_rng stream
  std::int64_t steps = 0;      ///< control steps into the episode
  std::vector<double> task;    ///< the task's own state (the reacher's target), saved with the rest
};

class MujocoEnv : public dqn::EnvBase {
 public:
  /// Reads the common options (model, bins, episode_steps, control_timestep) and loads the
  /// model; `model_if_empty` stands for an empty `model` option (empty: the option is required).
  MujocoEnv(const dqn::EnvCreateInfo& info, const std::string& model_if_empty);

  void reset_copies(std::uint64_t seed, int begin, int end, float* obs) final;
  void step_copies(int begin, int end, const dqn::EnvStep& io) final;
  void save(dqn::StateOut& out) const final;
  void load(const dqn::StateIn& in) final;

 protected:
  const mjModel* model() const noexcept { return model_.get(); }
  const std::string& model_path() const noexcept { return model_path_; }
  /// An id of the model by name (mjOBJ_BODY, mjOBJ_SITE, …); a missing name is an error naming the file.
  int find(int type, const char* kind, const char* name) const;
  /// std::invalid_argument "<task>: option '<key>' = <value>: <why>".
  std::invalid_argument bad_option(const std::string& key, const std::string& value, const std::string& why) const;
  /// The number option `key`, checked to lie in (lo, hi] (lo_open) or [lo, hi]; `what` says what it means.
  double number_option(const char* key, double lo, double hi, bool lo_open, const char* what) const;
  /// dm_control's randomize_limited_and_rotational_joints: limited hinges and slides uniform in
  /// their range, free hinges uniform in [-pi, pi), balls and free joints a random orientation.
  void randomize_joints(Copy& k) const;
  /// Ends construction: the spec, `task_dim` task values per copy, and every copy reset from `seed`.
  void finish(int obs_dim, int task_dim, bool reports_success, std::uint64_t seed);

 private:
  // --- the task ---
  /// Sets the initial state of a copy whose mjData was just reset (qpos0, zero velocity).
  virtual void randomize(Copy& k) = 0;
  /// Whether the state just computed (mj_forward) may start an episode; else it is drawn again
  /// (`attempt` counts the draws before this one).
  virtual bool valid_start(const Copy& k, int attempt) const = 0;
  virtual void observe(const Copy& k, double* obs) const = 0;
  virtual double reward(const Copy& k) const = 0;
  /// The reward of a step that ended unstable: the least a step can earn, so that a policy gains
  /// nothing by breaking the simulation.
  virtual double unstable_reward() const = 0;
  /// Whether the episode ends here, reached (terminated, success).
  virtual bool succeeded(const Copy& k) const = 0;

  /// Everything save() writes, for every copy.
  struct Snapshot {
    std::vector<double> time, qpos, qvel, act, ctrl, warmstart, task;
    std::vector<std::int64_t> steps;
    std::vector<std::uint64_t> rng;
  };
  Snapshot take() const;
  /// Puts a snapshot into the copies and recomputes what the next step reads; throws MujocoError.
  void apply(const Snapshot& s);
  void check_range(int begin, int end) const;
  /// A new episode for copy k: drawn until valid_start, at most kStartTries times.
  void start_episode(Copy& k, int copy);
  /// One control step of physics; false when the simulation became unstable or MuJoCo failed.
  bool advance(Copy& k, int copy);
  /// Writes an observation as float32; non-finite or huge values are replaced (false if any was).
  static bool write_obs(const std::vector<double>& obs, float* row);

  MujocoHandlers handlers_;  // first: MuJoCo errors are exceptions from here on
  std::string model_path_;
  ModelPtr model_;
  std::int32_t bins_ = 0;
  std::int64_t episode_steps_ = 0;
  int substeps_ = 1;
  bool step2_first_ = true;  // dm_control's legacy step (all integrators but RK4)
  int task_dim_ = 0;
  std::vector<dqn::EnvBranch> branches_;
  std::vector<std::string> actuator_names_;
  std::vector<Copy> copies_;
  mutable std::atomic<bool> error_reported_{false};
};

}  // namespace dqn_mujoco
