/** @file aux_kernels.cu
 *  @brief The auxiliary heads' ops: the CQL penalty, the expected-Q backward, the ensemble's
 *  disagreement, IQN's cosine embedding, Hadamard product and quantile Huber loss.
 */
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cuda_kernels.cuh"
#include "kernel_common.cuh"

namespace dqn::cuda {
namespace {

// --- auxiliary heads ------------------------------------------------------------------------

/// One thread per (b, d): logsumexp over the A actions, the row's penalty to scratch, and dq.
__global__ void cql_penalty_kernel(CqlPenalty a, double* per_row) {
  dev::pdl_entry();
  const int rows = a.B * a.D, A = a.A;
  const float* Q = static_cast<const float*>(a.q.p);
  float* DQ = static_cast<float*>(a.dq.p);
  const double scale = static_cast<double>(a.alpha) / static_cast<double>(rows);
  for (std::int64_t bd = grid_start(); bd < rows; bd += grid_step()) {
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
  const double total = block_sum(acc, sh);
  if (threadIdx.x == 0) *loss = static_cast<float>(static_cast<double>(alpha) * total / rows);
}

/// One warp per row: Q = Σ z_i p_i (warp sum), then dlogits_i = dq · p_i (z_i − Q).
__global__ void expected_q_backward_kernel(float* dlogits, const float* dq, const float* logp, int rows, int Z,
                                           float v_min, double dz) {
  dev::pdl_entry();
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * (blockDim.x >> 5);
  const int lane = threadIdx.x & 31;
  for (std::int64_t r = grid_start() >> 5; r < rows; r += warps) {
    const float* lp = logp + r * Z;
    double q = 0.0;
    for (int i = lane; i < Z; i += 32) q += (static_cast<double>(v_min) + i * dz) * exp(static_cast<double>(lp[i]));
    q = warp_sum(q);
    const double g = dq[r];
    for (int i = lane; i < Z; i += 32)
      dlogits[r * Z + i] =
          static_cast<float>(g * exp(static_cast<double>(lp[i])) * ((static_cast<double>(v_min) + i * dz) - q));
  }
}

/// One warp per sample: each lane takes columns j, the K members in order, then a warp sum.
__global__ void ensemble_disagreement_kernel(float* out, const float* q, int K, int B, int n) {
  dev::pdl_entry();
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * (blockDim.x >> 5);
  const int lane = threadIdx.x & 31;
  const std::int64_t member = static_cast<std::int64_t>(B) * n;
  for (std::int64_t b = grid_start() >> 5; b < B; b += warps) {
    double acc = 0.0;
    for (int j = lane; j < n; j += 32) {
      const std::int64_t at = b * n + j;
      double mean = 0.0;
      for (int k = 0; k < K; ++k) mean += static_cast<double>(q[k * member + at]);
      mean /= K;
      double var = 0.0;
      for (int k = 0; k < K; ++k) {
        const double dev = static_cast<double>(q[k * member + at]) - mean;
        var += dev * dev;
      }
      acc += sqrt(var / K);
    }
    acc = warp_sum(acc);
    if (lane == 0) out[b] = static_cast<float>(acc / n);
  }
}

/// cos(π i τ) as cospi of i·τ reduced mod 2 in double (exact: τ has 24 significant bits, i < 2^13),
/// rounded to float in [0, 2): within 4e-7 of the double cosine the CPU computes, at a fraction of
/// the cost of a double cos.
template <class I>
__global__ void cosine_embedding_kernel(float* out, const float* tau, int rows, int E) {
  dev::pdl_entry();
  const I n = static_cast<I>(rows) * static_cast<I>(E);
  for (I k = static_cast<I>(grid_start()); k < n; k += static_cast<I>(grid_step())) {
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
  for (I k4 = static_cast<I>(grid_start()); k4 < n; k4 += static_cast<I>(grid_step())) {
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
  for (I k = static_cast<I>(grid_start()); k < n; k += static_cast<I>(grid_step())) {
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
  for (std::int64_t k = grid_start(); k < n; k += grid_step()) {
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
/// the sample's loss from the pairs in order by thread 0, to scratch for the fixed-order reduction.
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

}  // namespace

std::size_t cql_penalty_scratch_bytes(int B, int D) {
  return round_up(static_cast<std::size_t>(B) * static_cast<std::size_t>(D) * sizeof(double), 256);
}

cudaError_t cql_penalty(cudaStream_t s, const CqlPenalty& a, void* scratch) {
  auto* per_row = static_cast<double*>(scratch);
  const int rows = a.B * a.D;
  launch(cql_penalty_kernel, blocks_for(rows), kThreads, 0, s, a, per_row);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  launch(cql_reduce_kernel, 1, kThreads, 0, s, a.loss.as<float>(), per_row, rows, a.alpha);
  return cudaGetLastError();
}

cudaError_t expected_q_backward(cudaStream_t s, float* dlogits, const float* dq, const float* logp, int rows, int Z,
                                float v_min, float v_max) {
  launch(expected_q_backward_kernel, blocks_for(static_cast<std::int64_t>(rows) * 32), kThreads, 0, s,
         dlogits, dq, logp, rows, Z, v_min, support_step(v_min, v_max, Z));
  return cudaGetLastError();
}

cudaError_t ensemble_disagreement(cudaStream_t s, float* out, const float* q, int K, int B, int n) {
  launch(ensemble_disagreement_kernel, blocks_for(static_cast<std::int64_t>(B) * 32), kThreads, 0, s, out, q, K, B, n);
  return cudaGetLastError();
}

cudaError_t cosine_embedding(cudaStream_t s, float* out, const float* tau, int rows, int E) {
  const std::int64_t n = static_cast<std::int64_t>(rows) * E;
  with_index_type(n, [&](auto i) {
    launch(cosine_embedding_kernel<decltype(i)>, blocks_for(n), kThreads, 0, s, out, tau, rows, E);
  });
  return cudaGetLastError();
}

cudaError_t hadamard(cudaStream_t s, float* x, const float* h2, const float* phi, int B, int N, int H) {
  const std::int64_t n = static_cast<std::int64_t>(B) * N * H;
  if (H % 4 == 0 && aligned16(x) && aligned16(h2) && aligned16(phi)) {
    with_index_type(n, [&](auto i) {
      launch(hadamard4_kernel<decltype(i)>, blocks_for(n / 4), kThreads, 0, s, x, h2, phi, B, N, H);
    });
    return cudaGetLastError();
  }
  with_index_type(n, [&](auto i) {
    launch(hadamard_kernel<decltype(i)>, blocks_for(n), kThreads, 0, s, x, h2, phi, B, N, H);
  });
  return cudaGetLastError();
}

cudaError_t hadamard_backward(cudaStream_t s, float* dphi, float* dh2, const float* dx, const float* h2,
                              const float* phi, int B, int N, int H) {
  launch(hadamard_backward_kernel, blocks_for(static_cast<std::int64_t>(B) * H), kThreads, 0, s, dphi, dh2, dx, h2, phi,
         B, N, H);
  return cudaGetLastError();
}

std::size_t quantile_huber_scratch_bytes(int B) { return round_up(static_cast<std::size_t>(B) * sizeof(double), 256); }

std::size_t quantile_huber_shared_bytes(int D, int N) {
  return static_cast<std::size_t>(D) * static_cast<std::size_t>(N) * sizeof(double);
}

cudaError_t quantile_huber(cudaStream_t s, const QuantileHuber& a, void* scratch) {
  auto* weighted = static_cast<double*>(scratch);
  launch(quantile_huber_kernel, a.B, 128, quantile_huber_shared_bytes(a.D, a.N), s, a, weighted);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  return weighted_means(s, a.loss.as<float>(), weighted, a.B, 1.0f, false, 1);
}

}  // namespace dqn::cuda
