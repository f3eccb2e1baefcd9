/** @file qr_ops.hpp
 *  @brief The QR-DQN head's own ops (quantile regression DQN, Dabney et al. 2017, on the dueling
 *  branching network): the quantile values with their mean and greedy action, and the quantile
 *  Huber loss with its gradient. Each runs on whichever backend it is given: host loops on the
 *  CPU backends (accumulating in double, in a fixed order: the reference), kernels launched on
 *  the DeviceContext's stream on CUDA (qr_ops.cu, the same arithmetic). Uses the SDK only.
 *
 *  The network is bdq's with its Z "atoms" read as N quantiles. For a row r, branch d, action a
 *  and quantile i (i = 0..N−1):
 *
 *    θ[r,d,a,i] = v[r,i] + adv[r,d,a,i] − (1/A) Σ_a' adv[r,d,a',i]     (the dueling combination)
 *    Q[r,d,a]   = (1/N) Σ_i θ[r,d,a,i]                                 (the mean of the quantiles)
 *    a*[r,d]    = argmax_a Q[r,d,a]                                    (ties: the lowest index)
 *
 *  θ[r,d,a,i] estimates the quantile of the return at the midpoint τ̂_i = (2i+1)/(2N) of the i-th
 *  of N equal probability slices. The loss of a sample b (double DQN: a* from the online network,
 *  θ' the target network's quantiles at next_states, a the taken action):
 *
 *    T_j    = r_b + γⁿ (1 − done_b) θ'[b,d,a*_bd,j]                    (the target's N samples)
 *    δ_ij   = T_j − θ[b,d,a_bd,i]
 *    L_κ(δ) = ½δ²  if |δ| ≤ κ,   κ(|δ| − ½κ) otherwise                 (Huber)
 *    ρ_ij   = |τ̂_i − 1{δ_ij < 0}| · L_κ(δ_ij) / κ                      (the quantile Huber loss)
 *    L(b)   = (1/D) Σ_d Σ_i (1/N) Σ_j ρ_ij
 *    loss   = (1/B) Σ_b w_b L(b)                                       (w: importance weights)
 *
 *  and its gradient (the target is a constant: nothing flows into it), with ψ = L_κ' the clipped
 *  identity ψ(δ) = δ if |δ| ≤ κ, κ·sign(δ) otherwise:
 *
 *    ∂loss/∂θ[b,d,a,i] = w_b / (B·D·N·κ) · Σ_j −|τ̂_i − 1{δ_ij < 0}| ψ(δ_ij)   at a = a_bd,
 *                        0                                                  at every other a.
 *
 *  (ρ is differentiable everywhere: the weight jumps at δ = 0, where L_κ and ψ vanish.)
 */
#pragma once

#include <cstdint>

#include "dqn/backend.hpp"

namespace dqn::qr {

/// The quantile values, their means and the greedy actions of `rows` rows of the dueling
/// outputs: any of theta, q and a_star may be null (not computed).
struct QrValues {
  Real theta;                      ///< out [rows,D,A,N] (may be null)
  Real q;                          ///< out [rows,D,A] (may be null)
  std::int32_t* a_star = nullptr;  ///< out [rows − star_from, D]: argmax_a q of rows ≥ star_from (may be null)
  int star_from = 0;
  Real v;                          ///< in  [rows, ldv] (the first N columns)
  Real adv;                        ///< in  [rows, D, ldadv] (the first A·N of each (row, branch))
  int ldv = 0;                     ///< row stride of v (>= N)
  int ldadv = 0;                   ///< (row, branch) stride of adv; 0: A·N
  int rows = 0, D = 0, A = 0, N = 0;
};

/// The quantile Huber loss of B samples (see the file's comment) with its gradient.
struct QrLoss {
  Real dtheta;                            ///< out [B,D,A,N], overwritten (zero off the taken actions)
  Real loss_per_sample;                   ///< out [B] L(b) (the td_error the primary reports)
  Real theta;                             ///< in  [B,D,A,N] online quantiles at states
  Real theta_target;                      ///< in  [B,D,A,N] target quantiles at next_states
  const std::int32_t* actions = nullptr;  ///< in  [B,D] taken actions
  const std::int32_t* a_star = nullptr;   ///< in  [B,D] the online network's greedy actions at next_states
  Real rewards, dones, weights;           ///< in  [B]
  int B = 0, D = 0, A = 0, N = 0;
  float gamma_n = 0.99f, kappa = 1.0f;
};

/// Checks the arguments, then runs on be: the host twin where be.device() is null, else the
/// kernels on its stream.
void qr_values(Backend& be, const QrValues& a) noexcept;
/// The same; on the host an out-of-range action or a* is refused (be.fail), on the device it
/// turns that sample's gradient rows and loss into NaN (the indices live on the device).
void qr_loss(Backend& be, const QrLoss& a) noexcept;

#if DQN_WITH_CUDA
// The device halves (qr_ops.cu), called by the functions above after checking the arguments.
void qr_values_cuda(Backend& be, const DeviceContext& ctx, const QrValues& a) noexcept;
void qr_loss_cuda(Backend& be, const DeviceContext& ctx, const QrLoss& a) noexcept;
#endif

}  // namespace dqn::qr
