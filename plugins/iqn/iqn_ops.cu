/** @file iqn_ops.cu
 *  @brief The IQN ops' device half: the cosine embedding, the Hadamard product and its backward,
 *  and the quantile Huber loss with its batch mean. The loss reproduces the host twin's arithmetic
 *  (in double, fixed summation orders); the embedding and the product are float (see each
 *  kernel). Launched on the stage's stream through the SDK (dqn/device.cuh), never allocating:
 *  the loss's scratch comes from the head's registry buffer.
 */
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "dqn/device.cuh"
#include "iqn_ops.hpp"

namespace dqn {
namespace {

constexpr int kThreads = 256;

/// Whether p lies on a 16-byte boundary (float4 loads and stores).
bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

/// cos(π i τ) as cospi of i·τ reduced mod 2 in double (exact: τ has 24 significant bits, i < 2^13),
/// rounded to float in [0, 2): within 4e-7 of the double cosine the CPU computes, at a fraction of
/// the cost of a double cos.
template <class I>
__global__ void cosine_embedding_kernel(float* out, const float* tau, int rows, int E) {
  dev::pdl_entry();
  const I n = static_cast<I>(rows) * static_cast<I>(E);
  for (I k = static_cast<I>(dev::grid_start()); k < n; k += static_cast<I>(dev::grid_step())) {
    const I r = k / static_cast<I>(E);
    const int i = static_cast<int>(k - r * static_cast<I>(E));
    const double x = static_cast<double>(i) * static_cast<double>(tau[r]);
    out[k] = cospif(static_cast<float>(x - 2.0 * floor(0.5 * x)));
  }
}

/// hadamard four columns at a time (H a multiple of 4, the three pointers 16-byte aligned).
template <class I>
__global__ void hadamard4_kernel(float* x, const float* h2, const float* phi, int B, int N, int H) {
  dev::pdl_entry();
  const I n = static_cast<I>(B) * static_cast<I>(N) * static_cast<I>(H) / 4;
  for (I k4 = static_cast<I>(dev::grid_start()); k4 < n; k4 += static_cast<I>(dev::grid_step())) {
    const I k = 4 * k4, row = k / static_cast<I>(H);
    const I b = row / static_cast<I>(N);
    const I h = k - row * static_cast<I>(H);
    const float4 a = *reinterpret_cast<const float4*>(h2 + static_cast<std::int64_t>(b) * H + h);
    const float4 p = *reinterpret_cast<const float4*>(phi + static_cast<std::int64_t>(k));
    *reinterpret_cast<float4*>(x + static_cast<std::int64_t>(k)) = make_float4(a.x * p.x, a.y * p.y, a.z * p.z, a.w * p.w);
  }
}

template <class I>
__global__ void hadamard_kernel(float* x, const float* h2, const float* phi, int B, int N, int H) {
  dev::pdl_entry();
  const I n = static_cast<I>(B) * static_cast<I>(N) * static_cast<I>(H);
  for (I k = static_cast<I>(dev::grid_start()); k < n; k += static_cast<I>(dev::grid_step())) {
    const I row = k / static_cast<I>(H);
    const I b = row / static_cast<I>(N);
    const I h = k - row * static_cast<I>(H);
    x[k] = h2[static_cast<std::int64_t>(b) * H + h] * phi[k];
  }
}

/// One thread per (b, h): the N samples of that row in order.
__global__ void hadamard_backward_kernel(float* dphi, float* dh2, const float* dx, const float* h2, const float* phi,
                                         int B, int N, int H) {
  dev::pdl_entry();
  const std::int64_t n = static_cast<std::int64_t>(B) * H;
  for (std::int64_t k = dev::grid_start(); k < n; k += dev::grid_step()) {
    const std::int64_t b = k / H;
    const int h = static_cast<int>(k % H);
    const double hv = h2[k];
    double acc = 0.0;
    constexpr int kBatch = 8;  // loads of 8 samples in flight before their (ordered) use
    for (int s0 = 0; s0 < N; s0 += kBatch) {
      float gx[kBatch], px[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const std::int64_t at = (b * N + s0 + u) * H + h;
        gx[u] = s0 + u < N ? dx[at] : 0.0f;
        px[u] = s0 + u < N ? phi[at] : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        if (s0 + u >= N) break;
        const std::int64_t at = (b * N + s0 + u) * H + h;
        const double g = gx[u];
        acc += g * static_cast<double>(px[u]);
        dphi[at] = static_cast<float>(g * hv);
      }
    }
    dh2[k] = static_cast<float>(acc);
  }
}

/// One block per sample; threads over the (d, i) pairs, each summing over the N' targets in order;
/// the sample's loss from the pairs in order by thread 0, to scratch for the fixed-order mean in
/// batch_means_kernel after.
__global__ void quantile_huber_kernel(QuantileHuber a, double* weighted) {
  dev::pdl_entry();
  extern __shared__ double pair_loss[];  // [D·N]
  const int b = blockIdx.x, N = a.N, Nt = a.Nt, D = a.D, A = a.A;
  const std::int64_t ldq = ld_or(a.ldq, D * A);  // row stride of q, q_target, dq
  const double kappa = a.kappa;
  const float* Q = static_cast<const float*>(a.q.p);
  const float* QT = static_cast<const float*>(a.q_target.p);
  float* DQ = static_cast<float*>(a.dq.p);
  const float wb = static_cast<const float*>(a.weights.p)[b];
  const double discount =
      static_cast<double>(a.gamma_n) * (1.0 - static_cast<double>(static_cast<const float*>(a.dones.p)[b]));
  const double r = static_cast<const float*>(a.rewards.p)[b];
  const double gscale = static_cast<double>(wb) / (static_cast<double>(a.B) * D * Nt * kappa);
  for (int p = threadIdx.x; p < D * N; p += blockDim.x) {
    const int d = p / N, i = p % N;
    const int act = a.actions[b * D + d], best = a.a_star[b * D + d];
    const std::int64_t row = (static_cast<std::int64_t>(b) * N + i) * ldq + static_cast<std::int64_t>(d) * A;
    if (act < 0 || act >= A || best < 0 || best >= A) {  // poison instead of reading out of range
      for (int k = 0; k < A; ++k) DQ[row + k] = NAN;
      pair_loss[p] = NAN;
      continue;
    }
    const double theta = Q[row + act];
    const double tau = static_cast<const float*>(a.tau.p)[static_cast<std::int64_t>(b) * N + i];
    double l = 0.0, g = 0.0;
    for (int j = 0; j < Nt; ++j) {
      const double t = r + discount * static_cast<double>(QT[(static_cast<std::int64_t>(b) * Nt + j) * ldq + static_cast<std::int64_t>(d) * A + best]);
      const double delta = t - theta, ad = fabs(delta);
      const double w = fabs(tau - (delta < 0.0 ? 1.0 : 0.0));
      l += w * (ad <= kappa ? 0.5 * delta * delta : kappa * (ad - 0.5 * kappa));
      g -= w * (ad > kappa ? (delta > 0.0 ? kappa : -kappa) : delta);  // a NaN δ stays NaN
    }
    pair_loss[p] = l / (Nt * kappa);
    for (int k = 0; k < A; ++k) DQ[row + k] = static_cast<float>(k == act ? gscale * g : 0.0);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double sample = 0.0;
    for (int p = 0; p < D * N; ++p) sample += pair_loss[p];
    sample /= D;
    if (a.loss_per_sample.p) static_cast<float*>(a.loss_per_sample.p)[b] = static_cast<float>(sample);
    weighted[b] = static_cast<double>(wb) * sample;
  }
}

/// One block: the batch mean of the weighted per-sample losses (dev::batch_mean).
__global__ void batch_means_kernel(float* loss, const double* weighted, int B, float scale, bool accumulate,
                                   int members) {
  dev::pdl_entry();
  __shared__ double sh[32];
  dev::batch_mean(loss, weighted, B, scale, accumulate, members, sh);
}

std::size_t quantile_huber_shared_bytes(int D, int N) {
  return static_cast<std::size_t>(D) * static_cast<std::size_t>(N) * sizeof(double);
}

}  // namespace

void cosine_embedding_cuda(Backend& be, const DeviceContext& ctx, Real out, Real tau, int rows, int E) noexcept {
  const std::int64_t n = static_cast<std::int64_t>(rows) * E;
  cudaError_t e = cudaSuccess;
  dev::with_index_type(n, [&](auto i) {
    e = launch(ctx, cosine_embedding_kernel<decltype(i)>, dev::blocks_for(n, kThreads), kThreads, 0,
               out.as<float>(), tau.as<const float>(), rows, E);
  });
  launched(be, "cosine_embedding", e);
}

void hadamard_cuda(Backend& be, const DeviceContext& ctx, Real x, Real h2, Real phi, int B, int N, int H) noexcept {
  const std::int64_t n = static_cast<std::int64_t>(B) * N * H;
  float* xp = x.as<float>();
  const float* h2p = h2.as<const float>();
  const float* phip = phi.as<const float>();
  cudaError_t e = cudaSuccess;
  if (H % 4 == 0 && aligned16(xp) && aligned16(h2p) && aligned16(phip)) {
    dev::with_index_type(n, [&](auto i) {
      e = launch(ctx, hadamard4_kernel<decltype(i)>, dev::blocks_for(n / 4, kThreads), kThreads, 0, xp, h2p, phip, B,
                 N, H);
    });
  } else {
    dev::with_index_type(n, [&](auto i) {
      e = launch(ctx, hadamard_kernel<decltype(i)>, dev::blocks_for(n, kThreads), kThreads, 0, xp, h2p, phip, B, N,
                 H);
    });
  }
  launched(be, "hadamard", e);
}

void hadamard_backward_cuda(Backend& be, const DeviceContext& ctx, Real dphi, Real dh2, Real dx, Real h2, Real phi,
                            int B, int N, int H) noexcept {
  launched(be, "hadamard_backward",
           launch(ctx, hadamard_backward_kernel, dev::blocks_for(static_cast<std::int64_t>(B) * H, kThreads), kThreads,
                  0, dphi.as<float>(), dh2.as<float>(), dx.as<const float>(), h2.as<const float>(),
                  phi.as<const float>(), B, N, H));
}

void quantile_huber_cuda(Backend& be, const DeviceContext& ctx, const QuantileHuber& a) noexcept {
  constexpr const char* op = "quantile_huber";
  const std::size_t shmem = quantile_huber_shared_bytes(a.D, a.N);
  if (shmem > 48 * 1024) return be.fail(op, "D·N too large (over 6144 pairs)");
  auto* weighted = static_cast<double*>(a.sums);
  if (!launched(be, op, launch(ctx, quantile_huber_kernel, a.B, 128, shmem, a, weighted))) return;
  launched(be, op, launch(ctx, batch_means_kernel, 1, kThreads, 0, a.loss.as<float>(),
                          static_cast<const double*>(weighted), a.B, 1.0f, false, 1));
}

}  // namespace dqn
