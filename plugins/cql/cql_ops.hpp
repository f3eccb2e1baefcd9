/** @file cql_ops.hpp
 *  @brief The CQL penalty's own op (docs/step-math.md, "CQL penalty"): the penalty on the
 *  primary's expected Q-values with its gradient. It runs on whichever backend it is given: host
 *  loops on the CPU backends (in double, as the reference), kernels launched on the
 *  DeviceContext's stream on CUDA (cql_ops.cu). Part of the cql plugin; it uses the SDK only.
 */
#pragma once

#include <cstdint>

#include "dqn/backend.hpp"

namespace dqn {

/// CQL penalty on expected Q-values (docs/step-math.md, "CQL penalty"):
///   loss = α (1/B) Σ_b (1/D) Σ_d [logsumexp_a q[b,d,:] − q[b,d,a_bd]],  dq = ∂loss/∂q (overwritten).
/// Not importance-weighted.
struct CqlPenalty {
  Real loss;                              ///< out [1]
  Real dq;                                ///< out [B,D,A]
  Real q;                                 ///< in  [B,D,A]
  const std::int32_t* actions = nullptr;  ///< in  [B,D]
  int B = 0, D = 0, A = 0;
  float alpha = 1.0f;
  /// Device backends: B·D 8-byte words of scratch (cql_penalty_sums; a DType::i64 buffer).
  void* sums = nullptr;
};

void cql_penalty(Backend& be, const CqlPenalty& a) noexcept;

/// Scratch words (8 bytes each) of CqlPenalty::sums.
inline std::int64_t cql_penalty_sums(int B, int D) { return static_cast<std::int64_t>(B) * D; }

#if DQN_WITH_CUDA
// The device half (cql_ops.cu), called by the function above after checking the arguments.
void cql_penalty_cuda(Backend& be, const DeviceContext& ctx, const CqlPenalty& a) noexcept;
#endif

}  // namespace dqn
