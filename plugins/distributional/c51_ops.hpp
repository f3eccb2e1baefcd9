/** @file c51_ops.hpp
 *  @brief The C51 loss's own ops (docs/step-math.md, "C51 loss"): the dense projection of the
 *  target distribution, the cross-entropy at the taken actions with its gradient, and the two
 *  fused with the target's log-probabilities and the dueling backward. Each runs on whichever
 *  backend it is given: host loops on the CPU backends (in double, as the reference), kernels
 *  launched on the DeviceContext's stream on CUDA (c51_ops.cu). A static library shared by the
 *  c51 and ensemble plugins; it uses the SDK only.
 */
#pragma once

#include <cstddef>
#include <cstdint>

#include "dqn/backend.hpp"

namespace dqn {

/// The buffer the c51 primary writes for distributional auxiliaries: m, the projected target
/// distribution [B,D,Z] at the taken actions' targets (the ensemble's members learn against it).
inline constexpr const char* kC51TargetM = "target/m";

/// Arguments of the dense projection: m[b,d,:] from the target network's log-probabilities at a*.
struct C51Project {
  Real m;                      ///< out [B,D,Z]
  Real target_logp;            ///< in  [B,D,A,Z] (target network at s')
  const std::int32_t* a_star;  ///< in  [B,D]
  Real rewards, dones;         ///< in  [B]
  int B = 0, D = 0, A = 0, Z = 0;
  float gamma_n = 0.99f, v_min = -10.0f, v_max = 10.0f;
};

/// Cross-entropy of online log-probabilities at the taken actions against m, with its gradient.
struct C51Xent {
  Real loss_per_sample;        ///< out [members·B]  (1/D) Σ_d −Σ_i m log p (may be null)
  Real loss;                   ///< out [1]  (1/B) Σ_b w_b L(b) * scale (added when accumulate; may be null)
  Real dlogits;                ///< out [B,D,A,Z], overwritten: d(loss)/d(logits)
  Real logp;                   ///< in  [B,D,A,Z] online log-softmax at states
  const std::int32_t* actions; ///< in  [B,D]
  Real m;                      ///< in  [B,D,Z]
  Real weights;                ///< in  [B] importance weights
  int B = 0, D = 0, A = 0, Z = 0;
  float scale = 1.0f;          ///< multiplies loss and gradient (1/K for the ensemble's members)
  bool accumulate = false;     ///< loss += instead of loss =
  /// Several heads against the same m, actions and weights: member k's logp, dlogits and
  /// loss_per_sample are member 0's + k·(their size); the same as `members` calls in order, the
  /// first with `accumulate`, the others accumulating.
  int members = 1;
  /// Optional (dv null: not computed): the dueling backward of dlogits straight into dv
  /// [B, lddv] and dadv [B, D, lddadv] as dueling_backward(dv, lddv, dadv, lddadv, dlogits, B, D,
  /// A, Z) after the call would give them (dadv's padding zeroed); member k's dv and dadv are
  /// member 0's + k·B rows. With dv set, dlogits is the op's scratch: its contents after the call
  /// are unspecified.
  Real dv;
  Real dadv;
  int lddv = 0, lddadv = 0;
  /// Device backends: members·B 8-byte words of scratch (c51_xent_sums; a DType::i64 buffer).
  void* sums = nullptr;
};

/// The loss fused from the target head's outputs to the dueling gradients: the target network's
/// log-probabilities at a* (dueling combine + log-softmax of tv/tadv), the projection m (as
/// c51_project), the cross-entropy at the taken actions with the per-sample loss and the weighted
/// mean (as c51_xent, scale 1), and the dueling backward of its dlogits (as dueling_backward)
/// straight into dv/dadv. work_logp and work_dlogits [B,D,A,Z] are host workspace (the CPU twin
/// composes the unfused ops through them; the kernels do not touch them).
struct C51Loss {
  Real m;                         ///< out [B,D,Z]
  Real loss_per_sample;           ///< out [B] (may be null)
  /// out [1] (null: not computed: the head takes it from loss_per_sample and the weights by
  /// weighted_mean, in a stage of its own, and the loss's kernels end without the batch's sum)
  Real loss;
  Real dv;                        ///< out [B, lddv]
  int lddv = 0;
  Real dadv;                      ///< out [B,D,lddadv] (A·Z of each (sample, branch), then zero padding)
  Real logp;                      ///< in  [B,D,A,Z] online log-probabilities at states
  const std::int32_t* actions = nullptr;  ///< in [B,D]
  Real weights;                   ///< in  [B] importance weights
  Real tv;                        ///< in  [B, ldtv] target head's value stream at next_states
  int ldtv = 0;
  Real tadv;                      ///< in  [B,D,ldtadv] target head's advantages at next_states
  const std::int32_t* a_star = nullptr;   ///< in [B,D]
  Real rewards, dones;            ///< in  [B]
  Real work_logp, work_dlogits;   ///< host workspace [B,D,A,Z] each
  int B = 0, D = 0, A = 0, Z = 0;
  float gamma_n = 0.99f, v_min = -10.0f, v_max = 10.0f;
  int ldtadv = 0, lddadv = 0;     ///< (sample, branch) strides of tadv and dadv; 0: A·Z
  /// Device backends, with loss set: B 8-byte words of scratch (a DType::i64 buffer) and a counter
  /// word that is 0 (a DType::i32 buffer of 1: the registry starts it at 0, the kernel leaves it 0).
  void* sums = nullptr;
  std::int32_t* counter = nullptr;
};

void c51_project(Backend& be, const C51Project& a) noexcept;
void c51_xent(Backend& be, const C51Xent& a) noexcept;
void c51_loss(Backend& be, const C51Loss& a) noexcept;

/// Scratch words (8 bytes each) of C51Xent::sums and C51Loss::sums.
inline std::int64_t c51_xent_sums(int B, int members) { return static_cast<std::int64_t>(B) * members; }
inline std::int64_t c51_loss_sums(int B) { return B; }

#if DQN_WITH_CUDA
// The device halves (c51_ops.cu), called by the functions above after checking the arguments.
void c51_project_cuda(Backend& be, const DeviceContext& ctx, const C51Project& a) noexcept;
void c51_xent_cuda(Backend& be, const DeviceContext& ctx, const C51Xent& a) noexcept;
void c51_loss_cuda(Backend& be, const DeviceContext& ctx, const C51Loss& a) noexcept;
#endif

}  // namespace dqn
