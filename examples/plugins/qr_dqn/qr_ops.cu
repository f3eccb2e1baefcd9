/** @file qr_ops.cu
 *  @brief The QR-DQN ops' device half (the math is in qr_ops.hpp). Reals are float in memory;
 *  every sum is taken in double in the host twin's order (qr_ops.cpp) and rounded where it rounds,
 *  so the results are the host's in any pipeline precision. Launched on the stage's stream through
 *  the SDK (dqn/device.cuh), never allocating: the only scratch is shared memory.
 */
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "dqn/device.cuh"
#include "qr_ops.hpp"

namespace dqn::qr {
namespace {

constexpr std::size_t kMaxShared = 48 * 1024;  // without opting in to more

/// Threads of a block whose threads stride over n items: n rounded up to whole warps, at most 256.
int threads_for(int n) {
  const int t = (n + 31) / 32 * 32;
  return t < 32 ? 32 : t > 256 ? 256 : t;
}

/// One block per (row, branch). First the threads stride over the quantiles i: the mean of the
/// advantages over the actions (in shared memory) and θ of every action. Then a thread per action
/// sums its θ over the quantiles in order (θ recomputed exactly as written: the same roundings, and
/// no need for theta to be stored) into Q; then thread 0 takes the argmax of the block's Q (strict
/// comparison: ties keep the lowest index). Shared: mean [N] (double), then Q [A] (float).
__global__ void qr_values_kernel(QrValues a) {
  dev::pdl_entry();
  extern __shared__ double values_shared[];
  double* mean = values_shared;
  float* qs = reinterpret_cast<float*>(values_shared + a.N);
  const int D = a.D, A = a.A, N = a.N;
  const std::int64_t rd = blockIdx.x, r = rd / D;
  const float* v = static_cast<const float*>(a.v.p) + r * a.ldv;
  const float* adv = static_cast<const float*>(a.adv.p) + rd * ld_or(a.ldadv, A * N);
  float* theta = static_cast<float*>(a.theta.p);
  for (int i = threadIdx.x; i < N; i += blockDim.x) {
    double m = 0.0;  // (1/A) Σ_a' adv[r,d,a',i]
    for (int k = 0; k < A; ++k) m += static_cast<double>(adv[k * N + i]);
    m /= A;
    mean[i] = m;
    if (theta)
      for (int act = 0; act < A; ++act)
        theta[(rd * A + act) * N + i] =
            static_cast<float>(static_cast<double>(v[i]) + static_cast<double>(adv[act * N + i]) - m);
  }
  const bool star = a.a_star && r >= a.star_from;  // the same for the whole block
  if (!a.q.p && !star) return;
  __syncthreads();
  for (int act = threadIdx.x; act < A; act += blockDim.x) {
    double sum = 0.0;  // Σ_i θ[r,d,act,i]
    for (int i = 0; i < N; ++i)
      sum += static_cast<double>(
          static_cast<float>(static_cast<double>(v[i]) + static_cast<double>(adv[act * N + i]) - mean[i]));
    const float q = static_cast<float>(sum / N);
    qs[act] = q;
    if (a.q.p) static_cast<float*>(a.q.p)[rd * A + act] = q;
  }
  if (!star) return;
  __syncthreads();
  if (threadIdx.x == 0) {
    int best = 0;
    for (int act = 1; act < A; ++act)
      if (qs[act] > qs[best]) best = act;
    a.a_star[(r - a.star_from) * D + rd % D] = best;
  }
}

/// One block per sample; the threads stride over its (d, i) pairs, each summing over the N
/// targets j in order and writing the gradient of quantile i at every action of branch d. The
/// sample's loss sums the pairs' losses (shared memory [D·N], double) in (d, i) order, as the host
/// does. An out-of-range action or a* turns the pair's gradients and the sample's loss into NaN
/// instead of reading out of bounds.
__global__ void qr_loss_kernel(QrLoss a) {
  dev::pdl_entry();
  extern __shared__ double pair_loss[];  // [D·N]
  const int b = blockIdx.x, D = a.D, A = a.A, N = a.N;
  const double kappa = a.kappa;
  const float* TH = static_cast<const float*>(a.theta.p);
  const float* TT = static_cast<const float*>(a.theta_target.p);
  float* DT = static_cast<float*>(a.dtheta.p);
  const float wb = static_cast<const float*>(a.weights.p)[b];
  const double discount =
      static_cast<double>(a.gamma_n) * (1.0 - static_cast<double>(static_cast<const float*>(a.dones.p)[b]));
  const double reward = static_cast<const float*>(a.rewards.p)[b];
  const double gscale = static_cast<double>(wb) / (static_cast<double>(a.B) * D * N * kappa);
  for (int p = threadIdx.x; p < D * N; p += blockDim.x) {
    const int d = p / N, i = p - d * N;
    const int taken = a.actions[b * D + d], best = a.a_star[b * D + d];
    const std::int64_t base = (static_cast<std::int64_t>(b) * D + d) * A * N;  // θ[b,d,0,0]
    if (taken < 0 || taken >= A || best < 0 || best >= A) {
      for (int k = 0; k < A; ++k) DT[base + static_cast<std::int64_t>(k) * N + i] = NAN;
      pair_loss[p] = NAN;
      continue;
    }
    const double tau = (2.0 * i + 1.0) / (2.0 * N);  // τ̂_i
    const double theta = TH[base + static_cast<std::int64_t>(taken) * N + i];
    const float* tt = TT + base + static_cast<std::int64_t>(best) * N;
    double l = 0.0, g = 0.0;  // Σ_j |τ̂ − 1{δ<0}| L_κ(δ), Σ_j −|τ̂ − 1{δ<0}| ψ(δ)
    for (int j = 0; j < N; ++j) {
      const double target = reward + discount * static_cast<double>(tt[j]);
      const double delta = target - theta, ad = fabs(delta);
      const double w = fabs(tau - (delta < 0.0 ? 1.0 : 0.0));
      l += w * (ad <= kappa ? 0.5 * delta * delta : kappa * (ad - 0.5 * kappa));
      g -= w * (ad > kappa ? (delta > 0.0 ? kappa : -kappa) : delta);  // a NaN δ stays NaN
    }
    pair_loss[p] = l / (N * kappa);
    for (int k = 0; k < A; ++k)
      DT[base + static_cast<std::int64_t>(k) * N + i] = static_cast<float>(k == taken ? gscale * g : 0.0);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double sample = 0.0;
    for (int p = 0; p < D * N; ++p) sample += pair_loss[p];
    static_cast<float*>(a.loss_per_sample.p)[b] = static_cast<float>(sample / D);
  }
}

}  // namespace

void qr_values_cuda(Backend& be, const DeviceContext& ctx, const QrValues& a) noexcept {
  constexpr const char* op = "qr_values";
  const std::size_t shmem = static_cast<std::size_t>(a.N) * sizeof(double) + static_cast<std::size_t>(a.A) * sizeof(float);
  if (shmem > kMaxShared) return be.fail(op, "N and A too large for shared memory");
  const std::int64_t blocks = static_cast<std::int64_t>(a.rows) * a.D;
  if (blocks > 0x7fffffff) return be.fail(op, "rows·D over 2^31 − 1 blocks");
  launched(be, op, launch(ctx, qr_values_kernel, static_cast<unsigned>(blocks), threads_for(a.N > a.A ? a.N : a.A),
                          shmem, a));
}

void qr_loss_cuda(Backend& be, const DeviceContext& ctx, const QrLoss& a) noexcept {
  constexpr const char* op = "qr_loss";
  const std::size_t shmem = static_cast<std::size_t>(a.D) * a.N * sizeof(double);
  if (shmem > kMaxShared) return be.fail(op, "D·N too large for shared memory (over 6144 pairs)");
  launched(be, op, launch(ctx, qr_loss_kernel, a.B, threads_for(a.D * a.N), shmem, a));
}

}  // namespace dqn::qr
