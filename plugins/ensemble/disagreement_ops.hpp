/** @file disagreement_ops.hpp
 *  @brief The ensemble's own op: the members' disagreement (a metric). It runs on whichever
 *  backend it is given: host loops on the CPU backends (in double, as the reference), a kernel
 *  launched on the DeviceContext's stream on CUDA (disagreement_ops.cu). Part of the ensemble
 *  plugin; it uses the SDK only.
 */
#pragma once

#include "dqn/backend.hpp"

namespace dqn {

/// Ensemble disagreement: out[b] = (1/n) Σ_j std_k q[k,b,j] (population std over the K
/// members), q [K,B,n] (n = D·A for Q-values).
void ensemble_disagreement(Backend& be, Real out, Real q, int K, int B, int n) noexcept;

#if DQN_WITH_CUDA
// The device half (disagreement_ops.cu), called by the function above after checking the arguments.
void ensemble_disagreement_cuda(Backend& be, const DeviceContext& ctx, Real out, Real q, int K, int B, int n) noexcept;
#endif

}  // namespace dqn
