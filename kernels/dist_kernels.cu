/** @file dist_kernels.cu
 *  @brief The distributional head's unfused ops: dueling combine and backward, log-softmax, the
 *  expected Q and its argmax, the dense C51 projection and the cross-entropy with its gradient.
 */
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cuda_kernels.cuh"
#include "kernel_common.cuh"

namespace dqn::cuda {
namespace {

// --- distributional head --------------------------------------------------------------------

/// One thread per (b, d, atom): the mean over actions is read before any of them is written, so
/// logits may alias adv.
__global__ void dueling_combine_kernel(float* logits, const float* v, int ldv, const float* adv, int rows,
                                       int D, int A, int Z) {
  dev::pdl_entry();
  const std::int64_t n = static_cast<std::int64_t>(rows) * D * Z;
  for (std::int64_t k = grid_start(); k < n; k += grid_step()) {
    const std::int64_t b = k / (static_cast<std::int64_t>(D) * Z);
    const int rem = static_cast<int>(k - b * D * Z), d = rem / Z, i = rem - d * Z;
    const std::int64_t base = (b * D + d) * A * Z + i;
    double mean = 0.0;
    for (int a = 0; a < A; ++a) mean += static_cast<double>(adv[base + a * Z]);
    mean /= A;
    const double vi = v[b * ldv + i];
    for (int a = 0; a < A; ++a)
      logits[base + a * Z] = static_cast<float>(vi + static_cast<double>(adv[base + a * Z]) - mean);
  }
}

/// One thread per (b, atom), same summation order as the CPU twin; each branch's entries are
/// all read before they are written, so dadv may alias dlogits (when compact: lddadv == A·Z).
__global__ void dueling_backward_kernel(float* dv, int lddv, float* dadv, int lddadv, const float* dl, int rows,
                                        int D, int A, int Z) {
  dev::pdl_entry();
  const std::int64_t n = static_cast<std::int64_t>(rows) * Z;
  for (std::int64_t k = grid_start(); k < n; k += grid_step()) {
    const std::int64_t b = k / Z;
    const int i = static_cast<int>(k - b * Z);
    const std::int64_t row = b * D * A * Z + i;
    double total = 0.0;
    for (int d = 0; d < D; ++d)
      for (int a = 0; a < A; ++a) total += static_cast<double>(dl[row + (d * A + a) * Z]);
    dv[b * lddv + i] = static_cast<float>(total);
    for (int d = 0; d < D; ++d) {
      double mean = 0.0;
      for (int a = 0; a < A; ++a) mean += static_cast<double>(dl[row + (d * A + a) * Z]);
      mean /= A;
      const std::int64_t drow = (b * D + d) * lddadv + i;
      for (int a = 0; a < A; ++a) {
        const std::int64_t j = row + (d * A + a) * Z;
        dadv[drow + a * Z] = static_cast<float>(static_cast<double>(dl[j]) - mean);
      }
      for (int q = A * Z + i; q < lddadv; q += Z) dadv[drow - i + q] = 0.0f;  // the block's padding
    }
  }
}

/// One warp per row.
__global__ void log_softmax_kernel(float* logp, const float* x, int rows, int n) {
  dev::pdl_entry();
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * (blockDim.x >> 5);
  const int lane = threadIdx.x & 31;
  for (std::int64_t r = grid_start() >> 5; r < rows; r += warps) {
    const float* xr = x + r * n;
    float* yr = logp + r * n;
    float mx = -INFINITY;
    for (int i = lane; i < n; i += 32) mx = fmaxf(mx, xr[i]);
    mx = warp_max(mx);
    // A row of NaN: fmaxf skips NaN, the CPU's std::max keeps the first element; both end NaN below.
    double sum = 0.0;
    for (int i = lane; i < n; i += 32) sum += exp(static_cast<double>(xr[i]) - mx);
    sum = warp_sum(sum);
    const double lse = static_cast<double>(mx) + log(sum);
    for (int i = lane; i < n; i += 32) yr[i] = static_cast<float>(static_cast<double>(xr[i]) - lse);
  }
}

/// One warp per row: q = Σ z_i exp(logp_i).
__global__ void expected_q_kernel(float* q, const float* logp, int rows, int Z, float v_min, double dz) {
  dev::pdl_entry();
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * (blockDim.x >> 5);
  const int lane = threadIdx.x & 31;
  for (std::int64_t r = grid_start() >> 5; r < rows; r += warps) {
    double acc = 0.0;
    for (int i = lane; i < Z; i += 32)
      acc += (static_cast<double>(v_min) + i * dz) * exp(static_cast<double>(logp[r * Z + i]));
    acc = warp_sum(acc);
    if (lane == 0) q[r] = static_cast<float>(acc);
  }
}

__global__ void argmax_kernel(std::int32_t* idx, const float* q, int rows, int n) {
  dev::pdl_entry();
  for (std::int64_t r = grid_start(); r < rows; r += grid_step()) {
    const float* row = q + r * n;
    int best = 0;
    for (int a = 1; a < n; ++a)
      if (row[a] > row[best]) best = a;  // strict: ties keep the lowest index
    idx[r] = best;
  }
}

/// One block per (b, d): the target probabilities and projected support go to shared memory,
/// then each thread owns atoms i and sums over j in order (the dense, atomic-free projection).
__global__ void c51_project_kernel(float* m, const float* target_logp, const std::int32_t* a_star,
                                   const float* rewards, const float* dones, int D, int A, int Z,
                                   float gamma_n, float v_min_f, float v_max_f, double dz) {
  dev::pdl_entry();
  extern __shared__ double shp[];
  double* p = shp;       // [Z]
  double* tz = shp + Z;  // [Z]
  const int bd = blockIdx.x, b = bd / D;
  const int act = a_star[bd];
  float* mo = m + static_cast<std::int64_t>(bd) * Z;
  if (act < 0 || act >= A) {  // an index the host could not check: make it visible, never read OOB
    for (int i = threadIdx.x; i < Z; i += blockDim.x) mo[i] = NAN;
    return;
  }
  const double v_min = v_min_f, v_max = v_max_f;
  const double discount = static_cast<double>(gamma_n) * (1.0 - static_cast<double>(dones[b]));
  const double r = rewards[b];
  const float* lp = target_logp + (static_cast<std::int64_t>(bd) * A + act) * Z;
  for (int j = threadIdx.x; j < Z; j += blockDim.x) {
    p[j] = exp(static_cast<double>(lp[j]));
    tz[j] = fmin(fmax(r + discount * (v_min + j * dz), v_min), v_max);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < Z; i += blockDim.x) {
    const double zi = v_min + i * dz;
    double acc = 0.0;
    for (int j = 0; j < Z; ++j) {
      const double w = fmin(fmax(1.0 - fabs(tz[j] - zi) / dz, 0.0), 1.0);
      acc += w * p[j];
    }
    mo[i] = static_cast<float>(acc);
  }
}

/// One block per sample, one warp per branch: per-branch cross-entropy (warp sums), the
/// gradient of every (action, atom) of the branch, then the sample's loss from the branches in
/// order. The weighted per-sample loss goes to scratch for the fixed-order mean in
/// weighted_means_kernel after.
__global__ void c51_xent_kernel(C51Xent a, double* weighted) {
  dev::pdl_entry();
  extern __shared__ double xent_d[];  // [D], then with dv the taken actions' rows g [D][Z] (float)
  float* g_rows = reinterpret_cast<float*>(xent_d + a.D);
  // block = member · B + sample: member k's logp and dlogits are member 0's + k·B·D·A·Z
  const int member = blockIdx.x / a.B, b = blockIdx.x - member * a.B;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int Z = a.Z, A = a.A, D = a.D;
  const std::int64_t moff = static_cast<std::int64_t>(member) * a.B * D * A * Z;
  const float* LP = static_cast<const float*>(a.logp.p) + moff;
  const float* M = static_cast<const float*>(a.m.p);
  float* DL = static_cast<float*>(a.dlogits.p) + moff;
  const float wb = static_cast<const float*>(a.weights.p)[b];
  const double grad_scale = static_cast<double>(a.scale) * wb / (static_cast<double>(a.B) * D);
  for (int d = warp; d < D; d += nwarps) {
    const int bd = b * D + d;
    const int taken = a.actions[bd];
    const std::int64_t rows0 = static_cast<std::int64_t>(bd) * A * Z;
    // with dv: this (sample, branch)'s block of dadv, member k's at + k·B rows
    const int ldd = a.lddadv != 0 ? a.lddadv : A * Z;
    float* dadv = a.dv.p ? static_cast<float*>(a.dadv.p) +
                               (static_cast<std::int64_t>(member) * a.B * D + bd) * ldd
                         : nullptr;
    if (taken < 0 || taken >= A) {  // out of range: poison this branch instead of reading OOB
      for (int k = lane; k < A * Z; k += 32) DL[rows0 + k] = NAN;
      if (dadv) {
        for (int k = lane; k < A * Z; k += 32) dadv[k] = NAN;
        for (int q = A * Z + lane; q < ldd; q += 32) dadv[q] = 0.0f;  // the padding, as on every row
        for (int i = lane; i < Z; i += 32) g_rows[d * Z + i] = NAN;
      }
      if (lane == 0) xent_d[d] = NAN;
      continue;
    }
    const float* m = M + static_cast<std::int64_t>(bd) * Z;
    const float* lp_taken = LP + rows0 + static_cast<std::int64_t>(taken) * Z;
    double xent = 0.0, m_sum = 0.0;
    for (int i = lane; i < Z; i += 32) {
      xent -= static_cast<double>(m[i]) * static_cast<double>(lp_taken[i]);
      m_sum += static_cast<double>(m[i]);
    }
    xent = warp_sum(xent);  // also orders every lane's reads of logp before the writes below
    m_sum = warp_sum(m_sum);
    for (int act = 0; act < A; ++act) {
      const std::int64_t row = rows0 + static_cast<std::int64_t>(act) * Z;
      for (int i = lane; i < Z; i += 32) {
        if (act != taken) {
          DL[row + i] = 0.0f;
        } else {
          const double p = exp(static_cast<double>(LP[row + i]));
          const float g = static_cast<float>(grad_scale * (p * m_sum - static_cast<double>(m[i])));
          DL[row + i] = g;
          if (dadv) {  // dueling_backward's arithmetic on a row that is g at `taken`, 0 elsewhere
            g_rows[d * Z + i] = g;
            const double mean = static_cast<double>(g) / A;
            const float other = static_cast<float>(0.0 - mean), own = static_cast<float>(static_cast<double>(g) - mean);
            for (int b2 = 0; b2 < A; ++b2) dadv[b2 * Z + i] = b2 == taken ? own : other;
          }
        }
      }
    }
    if (dadv)
      for (int q = A * Z + lane; q < ldd; q += 32) dadv[q] = 0.0f;  // the padding
    if (lane == 0) xent_d[d] = xent;
  }
  __syncthreads();
  if (a.dv.p) {  // dv[b, :] = Σ_d g_d (branches in order, as dueling_backward's Σ_{d,a})
    float* dv = static_cast<float*>(a.dv.p) + (static_cast<std::int64_t>(member) * a.B + b) * a.lddv;
    for (int i = threadIdx.x; i < Z; i += blockDim.x) {
      double total = 0.0;
      for (int d = 0; d < D; ++d) total += static_cast<double>(g_rows[d * Z + i]);
      dv[i] = static_cast<float>(total);
    }
  }
  if (threadIdx.x == 0) {
    double sample = 0.0;
    for (int d = 0; d < D; ++d) sample += xent_d[d];
    sample /= D;
    if (a.loss_per_sample.p) static_cast<float*>(a.loss_per_sample.p)[blockIdx.x] = static_cast<float>(sample);
    weighted[blockIdx.x] = static_cast<double>(wb) * sample;
  }
}

/// One block: weighted_mean (the same roundings as one call per member).
__global__ void weighted_means_kernel(float* loss, const double* weighted, int B, float scale, bool accumulate,
                                       int members) {
  dev::pdl_entry();
  __shared__ double sh[32];
  weighted_mean(loss, weighted, B, scale, accumulate, members, sh);
}

}  // namespace

cudaError_t dueling_combine(cudaStream_t s, float* logits, const float* v, int ldv, const float* adv, int rows,
                            int D, int A, int Z) {
  launch(dueling_combine_kernel, blocks_for(static_cast<std::int64_t>(rows) * D * Z), kThreads, 0, s,
         logits, v, ldv, adv, rows, D, A, Z);
  return cudaGetLastError();
}

cudaError_t dueling_backward(cudaStream_t s, float* dv, int lddv, float* dadv, int lddadv, const float* dlogits,
                             int rows, int D, int A, int Z) {
  launch(dueling_backward_kernel, blocks_for(static_cast<std::int64_t>(rows) * Z), kThreads, 0, s,
         dv, lddv, dadv, lddadv, dlogits, rows, D, A, Z);
  return cudaGetLastError();
}

cudaError_t log_softmax(cudaStream_t s, float* logp, const float* x, int rows, int n) {
  launch(log_softmax_kernel, blocks_for(static_cast<std::int64_t>(rows) * 32), kThreads, 0, s, logp, x, rows, n);
  return cudaGetLastError();
}

cudaError_t expected_q(cudaStream_t s, float* q, const float* logp, int rows, int Z, float v_min, float v_max) {
  launch(expected_q_kernel, blocks_for(static_cast<std::int64_t>(rows) * 32), kThreads, 0, s,
         q, logp, rows, Z, v_min, support_step(v_min, v_max, Z));
  return cudaGetLastError();
}

cudaError_t argmax(cudaStream_t s, std::int32_t* idx, const float* q, int rows, int n) {
  launch(argmax_kernel, blocks_for(rows), kThreads, 0, s, idx, q, rows, n);
  return cudaGetLastError();
}

cudaError_t c51_project(cudaStream_t s, const C51Project& a) {
  const int threads = std::min(256, (a.Z + 31) / 32 * 32);
  const std::size_t shmem = 2 * static_cast<std::size_t>(a.Z) * sizeof(double);
  launch(c51_project_kernel, a.B * a.D, threads, shmem, s,
         a.m.as<float>(), a.target_logp.as<const float>(), a.a_star, a.rewards.as<const float>(),
         a.dones.as<const float>(), a.D, a.A, a.Z, a.gamma_n, a.v_min, a.v_max, support_step(a.v_min, a.v_max, a.Z));
  return cudaGetLastError();
}

std::size_t c51_xent_scratch_bytes(int B) { return round_up(static_cast<std::size_t>(B) * sizeof(double), 256); }

cudaError_t c51_xent(cudaStream_t s, const C51Xent& a, void* scratch) {
  auto* weighted = static_cast<double*>(scratch);
  const int warps = std::min(a.D, 8);
  const std::size_t shared = static_cast<std::size_t>(a.D) * sizeof(double) +
                             (a.dv ? static_cast<std::size_t>(a.D) * a.Z * sizeof(float) : 0);
  launch(c51_xent_kernel, a.B * a.members, 32 * warps, shared, s, a, weighted);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  if (a.loss)
    return weighted_means(s, a.loss.as<float>(), weighted, a.B, a.scale, a.accumulate, a.members);
  return cudaGetLastError();
}

cudaError_t weighted_means(cudaStream_t s, float* loss, const double* weighted, int B, float scale, bool accumulate,
                           int members) {
  launch(weighted_means_kernel, 1, kThreads, 0, s, loss, weighted, B, scale, accumulate, members);
  return cudaGetLastError();
}

}  // namespace dqn::cuda
