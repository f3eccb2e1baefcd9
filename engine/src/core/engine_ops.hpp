/** @file engine_ops.hpp
 *  @brief The ops only the engine calls, beside the plugins' op table (dqn/backend.hpp): the
 *  update (budgets, Adam, spectral norm, target), the device replay, and copies between host and
 *  backend memory. The CPU and CUDA backends implement both tables; the kernels read the argument
 *  structs as they are.
 */
#pragma once

#include <cstddef>
#include <cstdint>

#include "dqn/backend.hpp"

namespace dqn {

/// One matrix for the batched spectral norm: W [rows, cols] and its power-iteration vector u [rows].
struct SpectralMatrix {
  Real w;
  Real u;
  std::int32_t rows = 0, cols = 0;
};

/// Ranges per head in Budget::reach.
inline constexpr int kBudgetReach = 4;

/// Gradient budgets (docs/step-math.md, "Gradient budgets"). grads is [H,P]; for each head h:
/// norm_h = ‖g_h‖, clip_h = min(1, f_h·G/(norm_h+1e-6)); g = Σ c_h g_h. If any g_h is not
/// finite, *skip = 1 and *skipped += 1, else *skip = 0.
struct Budget {
  Real grads;           ///< in  [H,P]
  Real fractions;       ///< in  [H] (device memory, changeable between steps)
  Real norms;           ///< out [H]
  Real clips;           ///< out [H]
  Real g;               ///< out [P]
  Real losses;          ///< in  [H]; total loss Σ_h losses is written to *total_loss
  Real total_loss;      ///< out [1]
  std::int32_t* skip;   ///< out [1]
  std::int64_t* skipped;///< in/out [1]
  int H = 0;
  std::int64_t P = 0;
  float max_grad_norm = 10.0f;
  /// Optional: [H, kBudgetReach, 2] element ranges [lo, hi) of each head's gradient row
  /// that its stages write (empty ranges lo == hi); the rest of the row is 0, so a backend may
  /// read only these for the norms. In memory the backend reads (device memory for CUDA). Null:
  /// whole rows.
  const std::int64_t* reach = nullptr;
  std::int64_t reach_max = 0;  ///< with reach: the most elements one head's ranges hold (sizes launches)
};

/// Adam with state in device memory; does nothing when *skip != 0.
struct Adam {
  Real params, g, m, v;
  std::int64_t P = 0;
  std::int64_t* t;          ///< step counter, incremented here
  Real lr;                  ///< [1]
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  const std::int32_t* skip;
};

/// Target update after Adam: Polyak when period == 0, else hard copy when *t % period == 0.
struct TargetUpdate {
  Real target, params;
  std::int64_t P = 0;
  float tau = 0.005f;
  std::int64_t period = 0;
  const std::int64_t* t;
  const std::int32_t* skip;
};

/// Everything after the gradients, in docs/step-math.md's order ("Gradient budgets", then "Optimizer,
/// spectral norm, target"): exactly budget(budget); adam(adam); spectral_norm(sn_mats, sn_count,
/// …, budget.skip) when sn_count > 0; target_update(target). A backend may fuse it (the CUDA
/// backend does: partial sums, then thread-block clusters); the results are those of the four ops
/// (up to the summation order of a fused power iteration).
struct Update {
  Budget budget;
  Adam adam;                            ///< adam.g is budget.g; adam.skip is budget.skip
  const SpectralMatrix* sn_mats = nullptr;  ///< as spectral_norm's (device memory on CUDA)
  int sn_count = 0, sn_max_rows = 0, sn_max_cols = 0;
  float sigma_max = 2.0f;
  TargetUpdate target;                  ///< target.t is adam.t; target.skip is budget.skip
};

/// The device replay's memory (docs/step-math.md, "Drawing the batch"): a ring of `capacity` n-step transitions and, when
/// prioritised, a sum/min tree of fan-out 32 over the leaves p_i^α (core/replay_tree.h lays it
/// out). Everything lives where the backend computes, so sampling and priority updates are ops
/// of the step.
struct ReplayStore {
  Real states, next_states;       ///< [capacity, S]
  std::int32_t* actions = nullptr;///< [capacity, D]
  Real rewards, dones;            ///< [capacity]
  /// Prioritised: the tree's nodes, one 8-byte word each holding {float sum, float min} (min:
  /// the smallest positive leaf below, +inf where none), leaves first. Null: uniform replay.
  std::int64_t* tree = nullptr;
  std::int32_t* owner = nullptr;  ///< prioritised: [capacity] scratch of replay_priorities, 0 between calls
  /// [kReplayCursor]: next slot, size, env step, draws so far, transitions inserted, a block counter.
  std::int64_t* cursor = nullptr;
  float* max_priority = nullptr;  ///< [1] the largest p = |δ| + ε so far (1 at first): new transitions get it
  std::int64_t capacity = 0;
  int S = 0, D = 0;
  float alpha = 0.6f, priority_eps = 1e-6f;
};
inline constexpr int kReplayCursor = 8;
enum ReplayCursor : int { kCurNext = 0, kCurSize = 1, kCurEnvStep = 2, kCurDraws = 3, kCurInserted = 4, kCurBlocks = 5 };

/// Appends n rows (staging memory in the backend's space) at the ring's next slot, each at the
/// largest priority so far, and sets the env step (β's schedule reads it). Outside a step only.
struct ReplayInsert {
  ReplayStore store;
  Real states, next_states;       ///< [n, S]
  const std::int32_t* actions = nullptr;  ///< [n, D]
  Real rewards, dones;            ///< [n]
  std::int64_t n = 0;             ///< 0 < n <= capacity
  std::int64_t env_step = 0;
};

/// B transitions drawn with replacement, keyed by (seed, draw counter): uniform, or prioritised
/// (stratified: row b's prefix sum is (b + u_b)·total/B), with importance weights
/// w_b = (p_min/p_b)^β (the (size·P)^−β of Schaul et al. over its largest value), β going from
/// beta_start to beta_end linearly over beta_steps env steps. Gathers the rows into the step's
/// batch and advances the draw counter. Needs size >= 1.
struct ReplaySample {
  ReplayStore store;
  int B = 0;
  std::uint64_t seed = 0;
  Real states2;                   ///< out [2B, S]: states, then next states
  std::int32_t* actions = nullptr;///< out [B, D]
  Real rewards, dones, is_weights;///< out [B]
  std::int64_t* indices = nullptr;///< out [B] the slots drawn
  Real stats;                     ///< out [kReplayStats] (null: none)
  float beta_start = 0.4f, beta_end = 1.0f;
  std::int64_t beta_steps = 1;
};
/// ReplaySample::stats: size, β, the largest priority and the tree's total (p^α summed; size for uniform).
inline constexpr int kReplayStats = 4;

/// New priorities p = |δ_b| + ε of the rows just drawn (the leaf gets p^α); rows whose δ is not
/// finite keep theirs; of a slot drawn twice the last row counts. Raises the largest priority.
struct ReplayPriorities {
  ReplayStore store;
  const std::int64_t* indices = nullptr;  ///< [B]
  Real td_error;                  ///< [B]
  int B = 0;
};

/// The engine's own ops. Like the op table, every method is noexcept and a failure is recorded in
/// the backend's status() (Backend::status, Backend::message).
class EngineOps {
 public:
  virtual ~EngineOps() = default;

  // --- optimisation ---
  virtual void budget(const Budget& a) noexcept = 0;
  virtual void adam(const Adam& a) noexcept = 0;
  /// One power iteration on each matrix, then W ← W·min(1, σ_max/σ). Skipped when *skip.
  /// mats points to `count` descriptors in memory the backend can read from a kernel (for the
  /// CUDA backend: device memory, uploaded at init).
  virtual void spectral_norm(const SpectralMatrix* mats, int count, int max_rows, int max_cols,
                             float sigma_max, const std::int32_t* skip) noexcept = 0;
  virtual void target_update(const TargetUpdate& a) noexcept = 0;
  virtual void update(const Update& u) noexcept = 0;

  // --- memory (init and checkpoint I/O only, never inside a step) ---
  virtual void upload(void* dst, const void* src, std::size_t bytes) noexcept = 0;
  virtual void download(void* dst, const void* src, std::size_t bytes) noexcept = 0;
  /// The same for reals, converting from/to host f32 (the f64 reference widens and narrows).
  virtual void upload_reals(Real dst, const float* src, std::int64_t n) noexcept = 0;
  virtual void download_reals(float* dst, Real src, std::int64_t n) noexcept = 0;

  // --- the device replay (outside a step: insert; inside: sample, priorities) ---
  virtual void replay_insert(const ReplayInsert& a) noexcept = 0;
  virtual void replay_sample(const ReplaySample& a) noexcept = 0;
  virtual void replay_priorities(const ReplayPriorities& a) noexcept = 0;
};

/// A backend as the engine holds it: the plugins' op table and the engine's own ops, one object.
class EngineBackend : public Backend, public EngineOps {};

}  // namespace dqn
