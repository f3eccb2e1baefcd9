/** @file cql_ops.cu
 *  @brief The CQL penalty's device half: a thread per (sample, branch) for the logsumexp, the
 *  row's penalty and its gradient, then one block for the fixed-order sum. Each kernel reproduces
 *  the host twin's arithmetic (in double). Launched on the stage's stream through the SDK
 *  (dqn/device.cuh), never allocating: the scratch comes from the head's registry buffer.
 */
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "cql_ops.hpp"
#include "dqn/device.cuh"

namespace dqn {
namespace {

constexpr int kThreads = 256;

/// One thread per (b, d): logsumexp over the A actions, the row's penalty to scratch, and dq.
__global__ void cql_penalty_kernel(CqlPenalty a, double* per_row) {
  dev::pdl_entry();
  const int rows = a.B * a.D, A = a.A;
  const float* Q = static_cast<const float*>(a.q.p);
  float* DQ = static_cast<float*>(a.dq.p);
  const double scale = static_cast<double>(a.alpha) / static_cast<double>(rows);
  for (std::int64_t bd = dev::grid_start(); bd < rows; bd += dev::grid_step()) {
    const float* q = Q + bd * A;
    float* dq = DQ + bd * A;
    const int taken = a.actions[bd];
    if (taken < 0 || taken >= A) {  // out of range: poison the row instead of reading OOB
      for (int k = 0; k < A; ++k) dq[k] = NAN;
      per_row[bd] = NAN;
      continue;
    }
    double mx = q[0];
    for (int k = 1; k < A; ++k) mx = fmax(mx, static_cast<double>(q[k]));
    double sum = 0.0;
    for (int k = 0; k < A; ++k) sum += exp(static_cast<double>(q[k]) - mx);
    const double lse = mx + log(sum);
    per_row[bd] = lse - static_cast<double>(q[taken]);
    for (int k = 0; k < A; ++k) {
      const double soft = exp(static_cast<double>(q[k]) - lse);
      dq[k] = static_cast<float>(scale * (soft - (k == taken ? 1.0 : 0.0)));
    }
  }
}

/// One block: loss = α/(B·D) Σ per_row, fixed order.
__global__ void cql_reduce_kernel(float* loss, const double* per_row, int rows, float alpha) {
  dev::pdl_entry();
  __shared__ double sh[32];
  double acc = 0.0;
  for (int r = threadIdx.x; r < rows; r += blockDim.x) acc += per_row[r];
  const double total = dev::block_sum(acc, sh);
  if (threadIdx.x == 0) *loss = static_cast<float>(static_cast<double>(alpha) * total / rows);
}

}  // namespace

void cql_penalty_cuda(Backend& be, const DeviceContext& ctx, const CqlPenalty& a) noexcept {
  constexpr const char* op = "cql_penalty";
  auto* per_row = static_cast<double*>(a.sums);
  const int rows = a.B * a.D;
  if (!launched(be, op, launch(ctx, cql_penalty_kernel, dev::blocks_for(rows, kThreads), kThreads, 0, a, per_row)))
    return;
  launched(be, op, launch(ctx, cql_reduce_kernel, 1, kThreads, 0, a.loss.as<float>(),
                          static_cast<const double*>(per_row), rows, a.alpha));
}

}  // namespace dqn
