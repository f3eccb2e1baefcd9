/** @file iqn_ops.hpp
 *  @brief The IQN head's own ops (docs/step-math.md, "IQN loss"): the cosine embedding of τ, the
 *  Hadamard product with the trunk output and its backward, and the quantile Huber loss with its
 *  gradient. Each runs on whichever backend it is given: host loops on the CPU backends (in
 *  double, as the reference), kernels launched on the DeviceContext's stream on CUDA
 *  (iqn_ops.cu). Part of the iqn plugin; it uses the SDK only.
 */
#pragma once

#include <cstdint>

#include "dqn/backend.hpp"

namespace dqn {

/// IQN quantile Huber loss (docs/step-math.md, "IQN loss") with its gradient w.r.t. the online quantiles:
///   θ_{d,i} = q[b,i,d,a_d], T_{d,j} = r + γⁿ(1 − done) q_target[b,j,d,a*_d], δ = T_j − θ_i,
///   L(b) = (1/D) Σ_d Σ_i (1/N') Σ_j |τ_i − 1{δ<0}| ρ_κ(δ)/κ,  loss = (1/B) Σ_b w_b L(b).
/// dq is overwritten (zero off the taken actions); nothing flows into the target.
struct QuantileHuber {
  Real loss;                              ///< out [1]
  Real loss_per_sample;                   ///< out [B] (may be null)
  Real dq;                                ///< out [B,N,ldq] (the first D·A of each (sample, quantile) row)
  Real q;                                 ///< in  [B,N,ldq] online quantile values at states
  Real q_target;                          ///< in  [B,N',ldq] target quantile values at next_states
  const std::int32_t* actions = nullptr;  ///< in  [B,D]
  const std::int32_t* a_star = nullptr;   ///< in  [B,D]
  Real tau;                               ///< in  [B,N]
  Real rewards, dones, weights;           ///< in  [B]
  int B = 0, N = 0, Nt = 0, D = 0, A = 0;
  float gamma_n = 0.99f, kappa = 1.0f;
  int ldq = 0;                            ///< row stride of q, q_target and dq; 0: D·A (compact)
  /// Device backends: B 8-byte words of scratch (quantile_huber_sums; a DType::i64 buffer).
  void* sums = nullptr;
};

/// IQN cosine embedding: out[r, i] = cos(π i tau[r]), i = 0..E−1, r < rows.
void cosine_embedding(Backend& be, Real out, Real tau, int rows, int E) noexcept;
/// x[b·N+n, h] = h2[b, h] · phi[b·N+n, h] (h2 [B,H] broadcast over the N samples of a row).
void hadamard(Backend& be, Real x, Real h2, Real phi, int B, int N, int H) noexcept;
/// Backward of hadamard: dphi = dx ⊙ h2 (may alias dx), dh2[b,h] = Σ_n dx[b·N+n,h]·phi[b·N+n,h]
/// (overwritten).
void hadamard_backward(Backend& be, Real dphi, Real dh2, Real dx, Real h2, Real phi, int B, int N, int H) noexcept;
void quantile_huber(Backend& be, const QuantileHuber& a) noexcept;

/// Scratch words (8 bytes each) of QuantileHuber::sums.
inline std::int64_t quantile_huber_sums(int B) { return B; }

#if DQN_WITH_CUDA
// The device halves (iqn_ops.cu), called by the functions above after checking the arguments.
void cosine_embedding_cuda(Backend& be, const DeviceContext& ctx, Real out, Real tau, int rows, int E) noexcept;
void hadamard_cuda(Backend& be, const DeviceContext& ctx, Real x, Real h2, Real phi, int B, int N, int H) noexcept;
void hadamard_backward_cuda(Backend& be, const DeviceContext& ctx, Real dphi, Real dh2, Real dx, Real h2, Real phi,
                            int B, int N, int H) noexcept;
void quantile_huber_cuda(Backend& be, const DeviceContext& ctx, const QuantileHuber& a) noexcept;
#endif

}  // namespace dqn
