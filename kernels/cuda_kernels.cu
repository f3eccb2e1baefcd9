/** @file cuda_kernels.cu
 *  @brief The small fused kernels of the CUDA op table. Each mirrors its CPU twin in
 *  engine/src/cpu_backend.cpp (same formulas, accumulation in double) and is deterministic: every
 *  reduction has a fixed shape and order. The only atomic is Adam's arrival counter on its step
 *  counter (adam_kernel), which decides nothing but which block writes t+1.
 */
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "cuda_kernels.cuh"
#include "device_util.cuh"
#include "dqn/philox.h"

namespace dqn::cuda {
namespace {

constexpr int kThreads = 256;

unsigned blocks_for(std::int64_t n, int threads = kThreads) {
  const std::int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::clamp<std::int64_t>(b, 1, std::int64_t{1} << 20));
}

/// Calls body(I{}) with I = std::uint32_t when every index of an n-element grid-stride loop
/// (plus one grid's stride) fits 32 bits, else with I = std::int64_t.
template <class F>
void with_index_type(std::int64_t n, F&& body) {
  if (n >= 0 && n < (std::int64_t{1} << 31))
    body(std::uint32_t{});
  else
    body(std::int64_t{});
}

using dev::aligned16;
using dev::block_sum;
using dev::grid_start;
using dev::grid_step;
using dev::launch;
using dev::warp_max;
using dev::warp_sum;

// --- dense layers ---------------------------------------------------------------------------

// Elementwise kernels index with I = std::uint32_t when every index fits (the usual case: 32-bit
// division is several times cheaper than 64-bit), std::int64_t otherwise.
template <class I>
__global__ void bias_act_kernel(float* y, const float* bias, int rows, int cols, int ldy, bool relu) {
  dev::pdl_entry();
  const I n = static_cast<I>(rows) * static_cast<I>(cols);
  for (I i = static_cast<I>(grid_start()); i < n; i += static_cast<I>(grid_step())) {
    const I r = i / static_cast<I>(cols), c = i - r * static_cast<I>(cols);
    float* p = y + static_cast<std::int64_t>(r) * ldy + c;
    float x = *p + (bias ? bias[c] : 0.0f);
    if (relu) x = x > 0.0f ? x : 0.0f;
    *p = x;
  }
}

template <class I>
__global__ void relu_backward_kernel(float* dy, const float* y, int rows, int cols, int ld) {
  dev::pdl_entry();
  const I n = static_cast<I>(rows) * static_cast<I>(cols);
  for (I i = static_cast<I>(grid_start()); i < n; i += static_cast<I>(grid_step())) {
    const I r = i / static_cast<I>(cols);
    const std::int64_t k = static_cast<std::int64_t>(r) * ld + (i - r * static_cast<I>(cols));
    if (y[k] <= 0.0f) dy[k] = 0.0f;
  }
}

/// relu_mask (Gemm::mask after a GEMM; relu_bias_grad without db): grid.y the batch entries, four
/// columns at a time when V4 (cols, ldc, ldmask and the strides multiples of 4, c and mask 16-byte
/// aligned). The same masked elements; the others are stored back unchanged.
template <bool V4>
__global__ void relu_mask_kernel(float* c, int rows, int cols, int ldc, const float* mask, int ldmask, int mask_rows,
                                 std::int64_t stride_c, std::int64_t stride_mask) {
  dev::pdl_entry();
  c += blockIdx.y * stride_c;
  mask += blockIdx.y * stride_mask;
  const std::int64_t w = V4 ? cols / 4 : cols, n = static_cast<std::int64_t>(rows) * w;
  for (std::int64_t i = grid_start(); i < n; i += grid_step()) {
    const std::int64_t r = i / w, j = (i - r * w) * (V4 ? 4 : 1);
    float* cr = c + r * ldc + j;
    const float* mr = mask + (r % mask_rows) * ldmask + j;
    if constexpr (V4) {
      dev::relu_mask4(cr, mr);
    } else {
      if (*mr <= 0.0f) *cr = 0.0f;
    }
  }
}

/// relu_backward four columns at a time (cols and ld multiples of 4, dy and y 16-byte aligned):
/// the same masked elements; the others are stored back unchanged.
template <class I>
__global__ void relu_backward4_kernel(float* dy, const float* y, int rows, int cols, int ld) {
  dev::pdl_entry();
  const I c4 = static_cast<I>(cols) / 4, n = static_cast<I>(rows) * c4;
  for (I i = static_cast<I>(grid_start()); i < n; i += static_cast<I>(grid_step())) {
    const I r = i / c4;
    const std::int64_t k = static_cast<std::int64_t>(r) * ld + 4 * static_cast<std::int64_t>(i - r * c4);
    dev::relu_mask4(dy + k, y + k);
  }
}

constexpr int kColTile = 32, kRowThreads = 16;

/// One block per 32 columns; 16 row-threads each sum a fixed stripe of rows, then one thread
/// adds the 16 stripes in order.
__global__ void bias_grad_kernel(float* db, const float* dy, int rows, int cols, int ldy, float beta) {
  dev::pdl_entry();
  __shared__ double part[kRowThreads][kColTile + 1];
  const int c = blockIdx.x * kColTile + threadIdx.x;
  double acc = 0.0;
  if (c < cols)
    for (int r = threadIdx.y; r < rows; r += kRowThreads)
      acc += static_cast<double>(dy[static_cast<std::int64_t>(r) * ldy + c]);
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    double s = 0.0;
    for (int k = 0; k < kRowThreads; ++k) s += part[k][threadIdx.x];
    db[c] = static_cast<float>(beta == 0.0f ? s : static_cast<double>(beta) * db[c] + s);
  }
}

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

/// For each member k in order, loss (=, or += when accumulating or after the first member) scale ·
/// (1/B) Σ_b weighted[k·B + b], summed in a fixed order for a given block size (every thread of
/// the block calls it; `sh` holds 32 doubles): what c51_xent_reduce_kernel runs, and the last block
/// of the kernels that fill `weighted` where they do it themselves (c51_xent, quantile_huber with a
/// counter).
__device__ void weighted_mean(float* loss, const double* weighted, int B, float scale, bool accumulate, int members,
                              double* sh) {
  for (int k = 0; k < members; ++k) {
    double acc = 0.0;
    for (int b = threadIdx.x; b < B; b += blockDim.x) acc += __ldcg(weighted + static_cast<std::int64_t>(k) * B + b);
    const double total = block_sum(acc, sh);
    if (threadIdx.x == 0) {
      const double l = static_cast<double>(scale) * total / B;
      *loss = static_cast<float>(accumulate || k > 0 ? static_cast<double>(*loss) + l : l);
    }
    __syncthreads();
  }
}

/// One block per sample, one warp per branch: per-branch cross-entropy (warp sums), the
/// gradient of every (action, atom) of the branch, then the sample's loss from the branches in
/// order. The weighted per-sample loss goes to scratch for the fixed-order mean in
/// c51_xent_reduce_kernel after.
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
__global__ void c51_xent_reduce_kernel(float* loss, const double* weighted, int B, float scale, bool accumulate,
                                       int members) {
  dev::pdl_entry();
  __shared__ double sh[32];
  weighted_mean(loss, weighted, B, scale, accumulate, members, sh);
}

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

// --- budgets --------------------------------------------------------------------------------

constexpr int kBudgetPer = 8;                                                // elements per thread per tile
constexpr std::int64_t kBudgetTile = std::int64_t{kThreads} * kBudgetPer;   // elements per block per tile
constexpr std::int64_t kBudgetMaxChunks = 512;                               // partial sums per head, at most

/// Elements per partial-sum chunk (whole tiles, at most kBudgetMaxChunks chunks per head). A
/// function of P only, so the reduction's shape, and its rounding, is the same on every device.
std::int64_t budget_chunk(std::int64_t P) {
  const std::int64_t tiles = std::max<std::int64_t>(1, (P + kBudgetTile - 1) / kBudgetTile);
  return kBudgetTile * ((tiles + kBudgetMaxChunks - 1) / kBudgetMaxChunks);
}
int budget_chunks(std::int64_t P) {
  const std::int64_t c = budget_chunk(P);
  return static_cast<int>(std::max<std::int64_t>(1, (P + c - 1) / c));
}

/// The partial sums' shape: chunks of whole tiles over the longest row the norms read (P, or the
/// most elements one head reaches), at most kBudgetMaxChunks of them.
struct BudgetShape {
  std::int64_t chunk;
  int nchunks;
};
BudgetShape budget_shape(const Budget& b) {
  const std::int64_t len = b.reach ? std::max<std::int64_t>(b.reach_max, 1) : b.P;
  return BudgetShape{budget_chunk(len), budget_chunks(len)};
}

/// Head h's range q in Budget::reach: {lo, hi}.
__device__ __forceinline__ const std::int64_t* reach_range(const std::int64_t* reach, int h, int q) {
  return reach + (static_cast<std::int64_t>(h) * kBudgetReach + q) * 2;
}

/// Pass 1's work for head h, chunk j of nchunks (block-uniform): Σ g² over the chunk, in double.
/// With reach, the chunks run over the concatenation of the head's ranges (see Budget::reach).
/// A non-finite element makes the partial non-finite, and a finite one never does (the squares of
/// finite floats cannot overflow a double sum), so the partials also carry the per-head
/// non-finite flag.
__device__ void budget_partial_item(const float* __restrict__ grads, std::int64_t P, std::int64_t chunk,
                                    const std::int64_t* __restrict__ reach, int h, int j, int nchunks,
                                    double* __restrict__ partial, double* sh) {
  const float* gh = grads + static_cast<std::int64_t>(h) * P;
  const std::int64_t begin = static_cast<std::int64_t>(j) * chunk, end = begin + chunk;
  double acc = 0.0;
  auto span = [&](std::int64_t lo, std::int64_t hi) {  // elements [lo, hi) of the row
    for (std::int64_t s = lo; s < hi; s += kBudgetTile) {
      float x[kBudgetPer];  // all loads of the tile first, then the (ordered) sum
#pragma unroll
      for (int k = 0; k < kBudgetPer; ++k) {
        const std::int64_t i = s + k * kThreads + threadIdx.x;
        x[k] = i < hi ? gh[i] : 0.0f;
      }
#pragma unroll
      for (int k = 0; k < kBudgetPer; ++k) acc += static_cast<double>(x[k]) * static_cast<double>(x[k]);
    }
  };
  if (!reach) {
    span(begin, end < P ? end : P);
  } else {
    std::int64_t at = 0;  // where range q starts in the concatenation
    for (int q = 0; q < kBudgetReach; ++q) {
      const std::int64_t* r = reach_range(reach, h, q);
      const std::int64_t lo = r[0], len = r[1] - r[0];
      const std::int64_t a = begin > at ? begin : at, b = end < at + len ? end : at + len;
      if (a < b) span(lo + (a - at), lo + (b - at));
      at += len;
    }
  }
  const double total = block_sum(acc, sh);
  if (threadIdx.x == 0) partial[static_cast<std::int64_t>(h) * nchunks + j] = total;
}


/// Adam's arrival counter lives in the upper bits of *t (below them, t itself).
constexpr int kTicketShift = 40;
constexpr unsigned long long kTicket = 1ull << kTicketShift;

/// Adam's bias correction 1 − β^t for the step's new t (every GPU path computes it this way).
__device__ __forceinline__ double bias_correction(double beta, double t) { return 1.0 - pow(beta, t); }

/// Pass 1, grid (chunks, H): partial[h][j] = Σ g² over chunk j of head h, in double. A non-finite
/// element makes the partial non-finite, and a finite one never does (the squares of finite floats
/// cannot overflow a double sum), so the partials also carry the per-head non-finite flag. With
/// step (the cluster update), block (0, 0) also stores the step's new t and Adam's bias
/// corrections there, step[0..2] = {1 − β1^t, 1 − β2^t, t}, so that the next launch starts with them.
__global__ void __launch_bounds__(kThreads) budget_partial_kernel(const float* __restrict__ grads, std::int64_t P,
                                                                  std::int64_t chunk, const std::int64_t* reach,
                                                                  double* __restrict__ partial,
                                                                  const std::int64_t* t = nullptr, double b1 = 0.0,
                                                                  double b2 = 0.0, double* step = nullptr) {
  dev::pdl_entry();
  __shared__ double sh[32];
  if (step && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x < 3) {
    const double t1 = static_cast<double>(static_cast<std::int64_t>(*t & static_cast<std::int64_t>(kTicket - 1)) + 1);
    step[threadIdx.x] = threadIdx.x == 2 ? t1 : bias_correction(threadIdx.x == 0 ? b1 : b2, t1);
  }
  budget_partial_item(grads, P, chunk, reach, blockIdx.y, blockIdx.x, gridDim.x, partial, sh);
}

/// Every block: the norms and clip factors of the H heads from the partial sums (a warp per head,
/// the same fixed order in every block, so all blocks agree) into clip_sh [H]; returns whether
/// every head is finite (the same in every thread). The writer block also stores norms, clips,
/// the total loss, skip and skipped.
__device__ bool budget_clips(const Budget& a, const double* __restrict__ partial, int nchunks, float* clip_sh,
                             bool writer) {
  const int H = a.H;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  int ok = 1;
  for (int h = warp; h < H; h += nwarps) {
    // every load of the lane at once, then the sum in the same order as a loop would take them
    // (a loop waited for each load in turn: up to 16 trips to L2 in a row before the first clip)
    constexpr int kPer = (kBudgetMaxChunks + 31) / 32;
    const double* ph = partial + static_cast<std::int64_t>(h) * nchunks;
    double x[kPer];
#pragma unroll
    for (int q = 0; q < kPer; ++q) x[q] = lane + 32 * q < nchunks ? ph[lane + 32 * q] : 0.0;
    double sq = 0.0;  // + 0.0 past nchunks changes nothing (the sum starts at +0 and stays >= 0)
#pragma unroll
    for (int q = 0; q < kPer; ++q) sq += x[q];
    const double norm = sqrt(warp_sum(sq));
    // A head whose norm is not finite contributes nothing (the step is skipped anyway).
    const bool finite = isfinite(norm);
    const double clip =
        finite ? fmin(1.0, static_cast<double>(static_cast<const float*>(a.fractions.p)[h]) *
                               static_cast<double>(a.max_grad_norm) / (norm + 1e-6))
               : 0.0;
    if (!finite) ok = 0;
    if (lane == 0) {
      clip_sh[h] = static_cast<float>(clip);
      if (writer) {
        static_cast<float*>(a.norms.p)[h] = static_cast<float>(norm);
        static_cast<float*>(a.clips.p)[h] = static_cast<float>(clip);
      }
    }
  }
  const bool all_finite = __syncthreads_and(ok) != 0;  // also publishes clip_sh
  if (writer && threadIdx.x == 0) {
    const float* losses = static_cast<const float*>(a.losses.p);
    double total_loss = 0.0;
    for (int h = 0; h < H; ++h) total_loss += static_cast<double>(losses[h]);
    static_cast<float*>(a.total_loss.p)[0] = static_cast<float>(total_loss);
    *a.skip = all_finite ? 0 : 1;
    if (!all_finite) ++*a.skipped;
  }
  return all_finite;
}

/// Whether head h's reach (Budget::reach; null: everything) meets elements [s, e).
__device__ __forceinline__ bool reach_meets(const std::int64_t* reach, int h, std::int64_t s, std::int64_t e) {
  if (!reach) return true;
  for (int q = 0; q < kBudgetReach; ++q) {
    const std::int64_t* r = reach_range(reach, h, q);
    if (r[0] < e && s < r[1]) return true;
  }
  return false;
}

/// acc[k] = Σ_h clip_h g_h[i] (double, heads in order) for the tile's elements
/// i = s + k·kThreads + threadIdx.x; all zero when some head is not finite. A head whose reach
/// misses the tile is skipped: its elements there are 0, and adding a zero term to a sum that
/// starts at +0 never changes it, so the result is the same to the bit.
template <int PER = kBudgetPer>
__device__ __forceinline__ void combine_tile(double (&acc)[PER], const float* __restrict__ grads, int H,
                                             std::int64_t P, std::int64_t s, const float* clip_sh, bool finite,
                                             const std::int64_t* reach) {
#pragma unroll
  for (int k = 0; k < PER; ++k) acc[k] = 0.0;
  if (!finite) return;
#pragma unroll 4
  for (int h = 0; h < H; ++h) {
    if (!reach_meets(reach, h, s, s + static_cast<std::int64_t>(PER) * kThreads)) continue;
    const double c = clip_sh[h];
    const float* gh = grads + static_cast<std::int64_t>(h) * P;
#pragma unroll
    for (int k = 0; k < PER; ++k) {
      const std::int64_t i = s + k * kThreads + threadIdx.x;
      if (i < P) acc[k] += c * static_cast<double>(gh[i]);
    }
  }
}

/// Pass 2, grid-stride over tiles of P. Every block first sums the partials (a warp per head, the
/// same fixed order in every block, so all blocks agree) into norm_h, clip_h and the skip decision;
/// block 0 writes norms, clips, total loss, skip and skipped; then every block writes its tiles of
/// g = Σ_h clip_h g_h (clip as stored, in head order; zero when some head is not finite).
/// Dynamic shared memory: H floats, rounded up to 4 (see budget()).
__global__ void __launch_bounds__(kThreads) budget_combine_kernel(Budget a, const double* __restrict__ partial,
                                                                  int nchunks) {
  dev::pdl_entry();
  extern __shared__ float clip_sh[];
  const bool all_finite = budget_clips(a, partial, nchunks, clip_sh, blockIdx.x == 0);
  const int H = a.H;
  const std::int64_t P = a.P;
  const float* grads = static_cast<const float*>(a.grads.p);
  float* g = static_cast<float*>(a.g.p);
  for (std::int64_t s = static_cast<std::int64_t>(blockIdx.x) * kBudgetTile; s < P;
       s += static_cast<std::int64_t>(gridDim.x) * kBudgetTile) {
    double acc[kBudgetPer];
    combine_tile(acc, grads, H, P, s, clip_sh, all_finite, a.reach);
#pragma unroll
    for (int k = 0; k < kBudgetPer; ++k) {
      const std::int64_t i = s + k * kThreads + threadIdx.x;
      if (i < P) g[i] = static_cast<float>(acc[k]);
    }
  }
}

// --- optimiser, spectral norm, target -------------------------------------------------------

constexpr int kElemPer = 4;  // elements per thread per round of the elementwise optimiser kernels
/// The first warp of every block of a one-launch Adam step (see adam_kernel): thread 0 takes the
/// block's ticket from *t; the last block to arrive stores t+1. Lanes 0 and 1 store the bias
/// corrections 1 − β1^(t+1) and 1 − β2^(t+1) into bc[0] and bc[1]. Returns t+1 (in every lane).
__device__ __forceinline__ long long adam_ticket(std::int64_t* t, double b1, double b2, double* bc) {
  unsigned long long old = 0;
  if (threadIdx.x == 0) old = atomicAdd(reinterpret_cast<unsigned long long*>(t), kTicket);
  old = __shfl_sync(0xffffffffu, old, 0);
  const unsigned long long t_old = old & (kTicket - 1);
  if (threadIdx.x == 0 && (old >> kTicketShift) == gridDim.x - 1u)
    atomicExch(reinterpret_cast<unsigned long long*>(t), t_old + 1);
  const double t1 = static_cast<double>(static_cast<std::int64_t>(t_old) + 1);
  if (threadIdx.x < 2) bc[threadIdx.x] = bias_correction(threadIdx.x == 0 ? b1 : b2, t1);  // both in one pass
  return static_cast<long long>(t_old) + 1;
}

/// Blocks for an elementwise kernel doing kElemPer elements per thread and round: enough for n,
/// at most max_blocks (about one wave); the kernels stride over the rest.
unsigned wave_blocks(std::int64_t n, int max_blocks) {
  const std::int64_t per_block = std::int64_t{kThreads} * kElemPer;
  return static_cast<unsigned>(
      std::clamp<std::int64_t>((n + per_block - 1) / per_block, 1, std::max(max_blocks, 1)));
}

/// Adam's constants for one step, rounded to float once: β1, 1 − β1, β2, 1 − β2, lr / (1 − β1^t),
/// 1 / (1 − β2^t) and ε (bc1 = 1 − β1^t, bc2 = 1 − β2^t for the step's new t, in double).
struct AdamCoef {
  float b1, c1, b2, c2, step, inv_bc2, eps;
};
__device__ __forceinline__ AdamCoef adam_coef(double b1, double b2, double eps, double lr, double bc1, double bc2) {
  return AdamCoef{static_cast<float>(b1),       static_cast<float>(1.0 - b1), static_cast<float>(b2),
                  static_cast<float>(1.0 - b2), static_cast<float>(lr / bc1), static_cast<float>(1.0 / bc2),
                  static_cast<float>(eps)};
}

/// One element's Adam update, in float arithmetic (the CPU twin computes in double; the two
/// differ by float rounding, about 1e-7 relative): m and v in place; returns the new θ. Each
/// operation is rounded explicitly, so every kernel that uses it computes the same bits. A double
/// chain here (two divisions and a square root per element) set the length of the update kernels.
/// The square root and the division are IEEE's (__fsqrt_rn, __fdiv_rn), whose fast paths do not
/// take a zero: a zero operand goes through a slow-path subroutine, a call per lane, and the
/// warp waits for it. Parameters whose gradient has been zero so far (dead units, padding rows)
/// have v = m = 0; the nineteenth session's profile had a third of the update's warps in those
/// calls for every element. So a zero gets its result by select: sqrt(±0) = ±0, and ±0 / d = ±0
/// for d > 0 (d = sqrt(v̂) + ε, +inf included), the values the IEEE operations give; the
/// operations themselves get 1 there, so that they stay on their fast paths. The same bits.
__device__ __forceinline__ float adam_element(float g, float& m, float& v, float theta, const AdamCoef& c) {
  const float mi = __fmaf_rn(c.b1, m, __fmul_rn(c.c1, g));
  const float vi = __fmaf_rn(c.b2, v, __fmul_rn(__fmul_rn(c.c2, g), g));
  m = mi;
  v = vi;
  const float vh = __fmul_rn(vi, c.inv_bc2);
  const bool v_zero = vh == 0.0f;
  const float den = __fadd_rn(v_zero ? vh : __fsqrt_rn(v_zero ? 1.0f : vh), c.eps);
  const float num = __fmul_rn(c.step, mi);
  const bool n_zero = num == 0.0f && den > 0.0f;
  return __fsub_rn(theta, n_zero ? num : __fdiv_rn(n_zero ? 1.0f : num, den));
}

/// The Polyak step of one target element: old + τ (src − old), in float (one rounding each).
__device__ __forceinline__ float polyak(double tau, float old, float src) {
  return __fmaf_rn(static_cast<float>(tau), __fsub_rn(src, old), old);
}

/// Adam, one launch (about one wave, grid-stride). The step counter: thread 0 of every block adds
/// kTicket to *t with one atomic, which returns the old t in the low 40 bits (the other blocks'
/// tickets only touch the bits above) and the block's arrival rank in the bits above; the last
/// block to arrive, when every block has read t, stores t+1 and so clears the tickets. Every
/// element uses t+1 from the old t, *t ends at t+1 and nothing needs zeroing between replays
/// (needs 0 <= t < 2^40 and fewer than 2^23 blocks). Skipped: no block touches anything.
__global__ void __launch_bounds__(kThreads) adam_kernel(float* theta, const float* g, float* m, float* v,
                                                        std::int64_t P, std::int64_t* t, const float* lr_p,
                                                        double b1, double b2, double eps,
                                                        const std::int32_t* skip) {
  dev::pdl_entry();
  __shared__ double bc[2];
  if (*skip) return;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * (kThreads * kElemPer) + threadIdx.x;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * (kThreads * kElemPer);
  float gr[kElemPer], mr[kElemPer], vr[kElemPer], pr[kElemPer];
  auto load = [&](std::int64_t base) {
#pragma unroll
    for (int k = 0; k < kElemPer; ++k) {
      const std::int64_t i = base + k * kThreads;
      if (i < P) {
        gr[k] = g[i];
        mr[k] = m[i];
        vr[k] = v[i];
        pr[k] = theta[i];
      }
    }
  };
  load(first);  // the first round's operands are in flight while the step is read
  const double lr = *lr_p;
  if (threadIdx.x < 32) adam_ticket(t, b1, b2, bc);
  __syncthreads();
  const AdamCoef c = adam_coef(b1, b2, eps, lr, bc[0], bc[1]);
  for (std::int64_t base = first; base < P; base += stride) {
    if (base != first) load(base);
#pragma unroll
    for (int k = 0; k < kElemPer; ++k) {
      const std::int64_t i = base + k * kThreads;
      if (i < P) {
        theta[i] = adam_element(gr[k], mr[k], vr[k], pr[k], c);
        m[i] = mr[k];
        v[i] = vr[k];
      }
    }
  }
}

constexpr int kSnCols = 32;        // columns per block of spectral-norm pass 1 (a lane each)
constexpr int kSnStage = 256;      // rows of that block's column slab kept in shared memory
constexpr int kSnRowElems = 4096;  // about this many elements of W per block of pass 2

int sn_col_chunks(int max_cols) { return (max_cols + kSnCols - 1) / kSnCols; }
int sn_rows_per_block(int max_cols) { return std::clamp(kSnRowElems / std::max(max_cols, 1), 1, kThreads); }

/// Spectral norm pass 1, grid (column chunks, matrices): for the block's 32 columns c,
/// w_c = (Wᵀu)_c (v before normalising), vsq = Σ_c w_c² of the chunk, and the chunk's share of
/// W v for every row, xp[r] = Σ_{c in chunk} W[r,c] w_c (‖v‖ divides it in pass 2). Scratch:
/// vsq [matrices][chunks], xp [matrices][chunks][max_rows], doubles.
struct SnColsShared {  ///< the shared memory of one block of pass 1
  float slab[kSnStage][kSnCols + 1];  // +1: a thread per row reads without bank conflicts
  double red[kThreads / 32][kSnCols];
  double wsh[kSnCols];
};

/// Pass 1's work for matrix mi, column chunk j of ncc (block-uniform; blockDim.x == kThreads).
__device__ void sn_cols_item(const SpectralMatrix* mats, int mi, int j, int ncc, int max_rows, int max_cols,
                             double* vsq, double* xp, SnColsShared& sm) {
  auto& slab = sm.slab;
  auto& red = sm.red;
  auto& wsh = sm.wsh;
  constexpr int nwarps = kThreads / 32;
  const SpectralMatrix s = mats[mi];
  const int rows = s.rows, cols = s.cols;
  if (rows <= 0 || cols <= 0 || rows > max_rows || cols > max_cols) return;  // pass 2 handles bad bounds
  const int c0 = j * kSnCols;
  if (c0 >= cols) return;
  const int nc = min(kSnCols, cols - c0);
  const float* W = static_cast<const float*>(s.w.p);
  const float* u = static_cast<const float*>(s.u.p);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const bool valid = lane < nc;
  // Wᵀu: a lane per column, a warp per row (coalesced along the row), rows in warp-strided order.
  double acc = 0.0;
#pragma unroll 8
  for (int r = warp; r < rows; r += nwarps) {
    const float w = valid ? W[static_cast<std::int64_t>(r) * cols + c0 + lane] : 0.0f;
    if (r < kSnStage) slab[r][lane] = w;
    acc += static_cast<double>(w) * static_cast<double>(u[r]);
  }
  red[warp][lane] = acc;
  __syncthreads();
  if (warp == 0) {
    double wc = 0.0;
    for (int k = 0; k < nwarps; ++k) wc += red[k][lane];
    if (!valid) wc = 0.0;
    wsh[lane] = wc;
    const double q = warp_sum(wc * wc);
    if (lane == 0) vsq[static_cast<std::int64_t>(mi) * ncc + j] = q;
  }
  __syncthreads();
  // The chunk's share of W w: a thread per row, columns in order.
  double* xpm = xp + (static_cast<std::int64_t>(mi) * ncc + j) * max_rows;
  for (int r = threadIdx.x; r < rows; r += kThreads) {
    double x = 0.0;
    if (r < kSnStage) {
      for (int k = 0; k < nc; ++k) x += static_cast<double>(slab[r][k]) * wsh[k];
    } else {
      const float* wr = W + static_cast<std::int64_t>(r) * cols + c0;
      for (int k = 0; k < nc; ++k) x += static_cast<double>(wr[k]) * wsh[k];
    }
    xpm[r] = x;
  }
  __syncthreads();  // the shared slab is reused by the block's next item
}

__global__ void __launch_bounds__(kThreads) sn_cols_kernel(const SpectralMatrix* mats, int max_rows, int max_cols,
                                                           const std::int32_t* skip, double* vsq, double* xp) {
  dev::pdl_entry();
  if (*skip) return;
  __shared__ SnColsShared sm;
  sn_cols_item(mats, blockIdx.y, blockIdx.x, gridDim.x, max_rows, max_cols, vsq, xp, sm);
}

/// Spectral norm pass 2, grid (row blocks, matrices): every block of a matrix computes
/// ‖v‖ = max(√Σ vsq, 1e-12), x_r = (Σ_chunks xp[r]) / ‖v‖ for all rows and σ = ‖x‖ (the same
/// fixed order in every block, so all agree), then writes u ← x/max(σ, 1e-12) for its rows and,
/// when σ > σ_max, scales its rows of W by σ_max/σ. max(·, 1e-12) as the CPU's std::max (NaN stays).
/// Pass 2's work for matrix mi, row block rb (block-uniform).
__device__ void sn_rows_item(const SpectralMatrix* mats, int mi, int rb, int max_rows, int max_cols,
                             int rows_per_block, int ncc, float sigma_max, const double* vsq, const double* xp,
                             double* sh) {
  const SpectralMatrix s = mats[mi];
  const int rows = s.rows, cols = s.cols;
  if (rows <= 0 || cols <= 0) return;
  float* u = static_cast<float*>(s.u.p);
  if (rows > max_rows || cols > max_cols) {  // the host's bounds were wrong: poison u, write nothing else
    if (rb == 0)
      for (int r = threadIdx.x; r < rows; r += kThreads) u[r] = NAN;
    return;
  }
  const int r0 = rb * rows_per_block;
  if (r0 >= rows) return;
  const int r1 = min(rows, r0 + rows_per_block);
  const int nc = (cols + kSnCols - 1) / kSnCols;
  const double* vq = vsq + static_cast<std::int64_t>(mi) * ncc;
  const double* xm = xp + static_cast<std::int64_t>(mi) * ncc * max_rows;
  double vs = 0.0;
  for (int j = 0; j < nc; ++j) vs += vq[j];
  const double vn = sqrt(vs);
  const double vnorm = vn < 1e-12 ? 1e-12 : vn;
  auto x_of = [&](int r) {
    double x = 0.0;
    for (int j = 0; j < nc; ++j) x += xm[static_cast<std::int64_t>(j) * max_rows + r];
    return x / vnorm;
  };
  double xsq = 0.0;
  for (int r = threadIdx.x; r < rows; r += kThreads) {
    const double x = x_of(r);
    xsq += x * x;
  }
  const double sigma = sqrt(block_sum(xsq, sh));
  const double unorm = sigma < 1e-12 ? 1e-12 : sigma;
  for (int r = r0 + threadIdx.x; r < r1; r += kThreads) u[r] = static_cast<float>(x_of(r) / unorm);
  float* W = static_cast<float*>(s.w.p);
  const std::int64_t end = static_cast<std::int64_t>(r1) * cols;
  if (sigma > static_cast<double>(sigma_max)) {
    const double factor = static_cast<double>(sigma_max) / sigma;
#pragma unroll 4
    for (std::int64_t i = static_cast<std::int64_t>(r0) * cols + threadIdx.x; i < end; i += kThreads)
      W[i] = static_cast<float>(static_cast<double>(W[i]) * factor);
  }
}

/// Pass 2 as one launch.
__global__ void __launch_bounds__(kThreads) sn_rows_kernel(const SpectralMatrix* mats, int max_rows, int max_cols,
                                                           int rows_per_block, int ncc, float sigma_max,
                                                           const std::int32_t* skip, const double* vsq,
                                                           const double* xp) {
  dev::pdl_entry();
  if (*skip) return;
  __shared__ double sh[32];
  sn_rows_item(mats, blockIdx.y, blockIdx.x, max_rows, max_cols, rows_per_block, ncc, sigma_max, vsq, xp, sh);
}

/// The spectral norm's scratch (laid out as spectral_norm_scratch_bytes counts it) and grids.
struct SnPlan {
  int ncc = 0, rpb = 1, nrb = 0;  ///< column chunks, rows per row block, row blocks
  double* vsq = nullptr;           ///< [count][ncc]
  double* xp = nullptr;            ///< [count][ncc][max_rows]
};

std::size_t round_up(std::size_t x, std::size_t a) { return (x + a - 1) / a * a; }

SnPlan sn_plan(void* scratch, int count, int max_rows, int max_cols) {
  SnPlan p;
  p.ncc = sn_col_chunks(max_cols);
  p.rpb = sn_rows_per_block(max_cols);
  p.nrb = (max_rows + p.rpb - 1) / p.rpb;
  const std::size_t cells = static_cast<std::size_t>(count) * static_cast<std::size_t>(p.ncc);
  p.vsq = static_cast<double*>(scratch);
  p.xp = reinterpret_cast<double*>(static_cast<char*>(scratch) + round_up(cells * sizeof(double), 256));
  return p;
}

/// Polyak (period 0) or, when *t % period == 0, a hard copy; one wave, grid-stride.
__global__ void __launch_bounds__(kThreads) target_update_kernel(float* tgt, const float* src, std::int64_t P,
                                                                 double tau, std::int64_t period,
                                                                 const std::int64_t* t, const std::int32_t* skip) {
  dev::pdl_entry();
  if (*skip) return;
  if (period != 0 && *t % period != 0) return;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * (kThreads * kElemPer);
  for (std::int64_t base = static_cast<std::int64_t>(blockIdx.x) * (kThreads * kElemPer) + threadIdx.x; base < P;
       base += stride) {
    float sr[kElemPer], tr[kElemPer];
#pragma unroll
    for (int k = 0; k < kElemPer; ++k) {
      const std::int64_t i = base + k * kThreads;
      if (i < P) {
        sr[k] = src[i];
        if (period == 0) tr[k] = tgt[i];
      }
    }
#pragma unroll
    for (int k = 0; k < kElemPer; ++k) {
      const std::int64_t i = base + k * kThreads;
      if (i < P) {
        tgt[i] = period == 0 ? polyak(tau, tr[k], sr[k]) : sr[k];
      }
    }
  }
}

constexpr int kUpdateMaxHeads = 64;  // clip factors kept in static shared memory
constexpr int kUpdateMaxSn = 64;     // spectrally normed matrices a cluster update takes

// --- the cluster update: the budget's partial sums, then one launch of thread-block clusters --

/// The target update of one element after the step's last write of params (Polyak when
/// period == 0, else a copy; the caller decides whether a hard copy happens at all).
struct TargetRule {
  float* tgt = nullptr;  ///< null: no target update here
  double tau = 0.0;
  bool copy = false;
};

/// What every element of the cluster update needs (the step's constants, read once per block).
struct ClusterStep {
  const float* __restrict__ grads;
  float *g, *mom, *var, *theta;
  const float* clip_sh;
  std::int64_t P;
  int H;
  AdamCoef adam;  ///< set once the step is known finite
  bool finite;
  TargetRule rule;  ///< tgt null: no target update
  const std::int64_t* reach;  ///< Budget::reach (null: every head reaches everything)
  /// One head (H = 1): g = c·g₀ + 0 in float, the bits of the double sum
  /// 0.0 + c·g₀ rounded to float (a product of two floats is exact in double, so both round it
  /// once; + 0 turns −0 into +0 as the double sum does), without its conversions.
  bool one = false;
};

/// ClusterStep::one's g of an element: c·g₀ + 0 in float.
__device__ __forceinline__ float one_head_g(float c, float g0) { return __fadd_rn(__fmul_rn(c, g0), 0.0f); }

/// The cluster update kernel's variants (its template's V): the two launches of a split update
/// (see update_cluster): the main launch (kUpdateSplit), whose clusters take the normed matrices
/// ClusterPlan::sn_of names, and the side launch (kUpdateWide), in blocks of twice the threads,
/// for the matrices whose share of rows passes one tile of a kThreads block (the C51 step's
/// 256 × 256 trunk.1: two tiles). 0: the one launch of an unsplit update.
constexpr int kUpdateSplit = 1, kUpdateWide = 2;
/// The threads of a block of the cluster update's variant v.
constexpr int update_threads(int v) { return (v & kUpdateWide) != 0 ? 2 * kThreads : kThreads; }

constexpr int kClusterPer = 8;        // elements per thread and tile: a tile is one round of loads
constexpr int kClusterEarlyHeads = 2;  // heads whose gradients a tile loads before the clip factors
/// A tile of a block of NT threads (the wide launch's blocks have twice kThreads).
template <int NT>
constexpr std::int64_t kTileOf = std::int64_t{NT} * kClusterPer;
constexpr std::int64_t kClusterTile = kTileOf<kThreads>;

/// One tile's operands in registers: m, v, θ, the target (Polyak) and the first heads' gradients.
struct ClusterTile {
  float m[kClusterPer], v[kClusterPer], th[kClusterPer], tg[kClusterPer];
  float gr[kClusterEarlyHeads][kClusterPer];
};

/// Loads the optimizer's state of the tile's elements i = s + k·NT + threadIdx.x < hi: m, v,
/// θ and, with polyak, the target. Only this kernel writes them (a step's earlier kernels read θ,
/// none writes it), so the loads may run before the kernel's griddepcontrol.wait.
template <int NT = kThreads>
__device__ __forceinline__ void cluster_load_state(const ClusterStep& x, std::int64_t s, std::int64_t hi, bool polyak,
                                                   ClusterTile& r) {
#pragma unroll
  for (int k = 0; k < kClusterPer; ++k) {
    const std::int64_t i = s + k * NT + threadIdx.x;
    r.m[k] = r.v[k] = r.th[k] = r.tg[k] = 0.0f;
    if (i < hi) {
      r.m[k] = x.mom[i];
      r.v[k] = x.var[i];
      r.th[k] = x.theta[i];
      if (polyak) r.tg[k] = x.rule.tgt[i];
    }
  }
}

/// Loads the first heads' gradients of the same elements (written by the kernels before this one:
/// after the wait).
template <int NT = kThreads>
__device__ __forceinline__ void cluster_load_grads(const ClusterStep& x, std::int64_t s, std::int64_t hi,
                                                   ClusterTile& r) {
  // A head whose reach misses the tile has zeros there: not loaded, its term adds +0 (combine_tile).
  bool meets[kClusterEarlyHeads];
#pragma unroll
  for (int h = 0; h < kClusterEarlyHeads; ++h) meets[h] = h < x.H && reach_meets(x.reach, h, s, hi);
#pragma unroll
  for (int k = 0; k < kClusterPer; ++k) {
    const std::int64_t i = s + k * NT + threadIdx.x;
#pragma unroll
    for (int h = 0; h < kClusterEarlyHeads; ++h)
      r.gr[h][k] = meets[h] && i < hi ? x.grads[static_cast<std::int64_t>(h) * x.P + i] : 0.0f;
  }
}

/// Loads the tile's elements i = s + k·NT + threadIdx.x < hi (nothing here depends on the
/// clip factors or the skip decision, so it can run before them).
template <int NT = kThreads>
__device__ __forceinline__ void cluster_load(const ClusterStep& x, std::int64_t s, std::int64_t hi, bool polyak,
                                             ClusterTile& r) {
  cluster_load_state<NT>(x, s, hi, polyak, r);
  cluster_load_grads<NT>(x, s, hi, r);
}

/// acc[k] = Σ_h c_h g_h at the tile's k-th element (double, heads in order, as combine_tile): the
/// first heads' gradients from r.gr, the others' loaded here at index at(k) where ok(k); [lo, hi)
/// holds the tile's elements (for the heads' reach). All zero when some head is not finite.
template <class Ok, class At>
__device__ __forceinline__ void cluster_combine(const ClusterStep& x, std::int64_t lo, std::int64_t hi,
                                                const ClusterTile& r, Ok ok, At at, double (&acc)[kClusterPer]) {
#pragma unroll
  for (int k = 0; k < kClusterPer; ++k) acc[k] = 0.0;
  if (!x.finite) return;
#pragma unroll
  for (int h = 0; h < kClusterEarlyHeads; ++h) {
    if (h >= x.H) break;
    const double c = x.clip_sh[h];
#pragma unroll
    for (int k = 0; k < kClusterPer; ++k) acc[k] += c * static_cast<double>(r.gr[h][k]);
  }
  for (int h = kClusterEarlyHeads; h < x.H; ++h) {
    if (!reach_meets(x.reach, h, lo, hi)) continue;  // zeros there (see combine_tile)
    const double c = x.clip_sh[h];
    const float* gh = x.grads + static_cast<std::int64_t>(h) * x.P;
#pragma unroll
    for (int k = 0; k < kClusterPer; ++k)
      if (ok(k)) acc[k] += c * static_cast<double>(gh[at(k)]);
  }
}

/// The loaded tile: g = Σ_h c_h g_h (double, heads in order, as combine_tile), Adam (adam_element)
/// and, with target, the target update (a copy, or Polyak from r.tg). store_theta false: the new θ
/// only in r.th (a caller that stores it later).
template <int NT = kThreads>
__device__ __forceinline__ void cluster_store(const ClusterStep& x, std::int64_t s, std::int64_t hi, bool target,
                                              ClusterTile& r, bool store_theta = true) {
  double acc[kClusterPer];
  const auto at = [&](int k) { return s + k * NT + threadIdx.x; };
  if (!x.one) cluster_combine(x, s, hi, r, [&](int k) { return at(k) < hi; }, at, acc);
#pragma unroll
  for (int k = 0; k < kClusterPer; ++k) {
    const std::int64_t i = s + k * NT + threadIdx.x;
    if (i >= hi) continue;
    const float gf = !x.one      ? static_cast<float>(acc[k])
                     : x.finite ? one_head_g(x.clip_sh[0], r.gr[0][k])
                                : 0.0f;
    x.g[i] = gf;
    if (!x.finite) continue;
    const float th = adam_element(gf, r.m[k], r.v[k], r.th[k], x.adam);
    x.mom[i] = r.m[k];
    x.var[i] = r.v[k];
    if (store_theta) x.theta[i] = th;
    r.th[k] = th;  // the new θ, for a caller that keeps the tile (the cluster update's early path)
    if (target) x.rule.tgt[i] = x.rule.copy ? th : polyak(x.rule.tau, r.tg[k], th);
  }
}

/// Cluster k < nsn owns normed matrix k (its rows split evenly over the cluster's blocks); the
/// clusters after them update the elements outside every normed matrix, tile by tile.
constexpr int kClusterMaxSegs = kUpdateMaxSn + 1;
struct ClusterPlan {
  int nsn = 0;   ///< normed matrices (one cluster each)
  int nseg = 0;  ///< ranges of params outside every normed matrix
  int rpc = 1;   ///< the most rows a block of a normed matrix holds (max_rows / cluster size, up)
  int max_cols = 1;
  const double* step = nullptr;  ///< {1 − β1^t, 1 − β2^t, t} from budget_partial_kernel
  std::uint64_t* clock = nullptr;  ///< update_cluster's clock (null: off)
  int clock_blocks = 0;
  /// A normed block's second tile of m, v and θ copied into shared memory before the wait and its
  /// first heads' gradients after it (cp.async), read from there by its Adam; and where a row of
  /// a normed matrix is one row of a tile (cols == kThreads), each thread's Σ of W[r, c] u[r] over
  /// the block's rows (Wᵀu) from the new θ in its registers.
  bool stage = false;
  int stage_at = 0;  ///< where the staging area starts in the dynamic shared memory (doubles)
  /// The cluster's Wᵀu sums split over its blocks (each adds its share of the
  /// columns over the ranks, then every block reads the shares from their owners: one remote load
  /// a column where it made CS) and σ's rank sum by one warp. The same sums, so the same bits.
  bool gather = false;
  /// With stage: a normed block's rows of the new θ kept in shared memory from
  /// Adam on (written beside the stores to params), read back by Wᵀu (where it is not summed from
  /// registers), W v and the scaling and target update instead of params; and, for Polyak, the old
  /// target of a block of more than one tile copied into shared memory before the wait. The same
  /// values in the same order: the same bits.
  bool keepw = false;
  /// Each block stores its Wᵀu sums and its Σ x² into every block of the cluster
  /// (a slot per rank in each) instead of the blocks reading them from each other, so that every
  /// block adds the slots in rank order from its own shared memory: no remote load, one cluster
  /// barrier fewer than gathering and none before leaving (the last remote access is a store
  /// before the last barrier). The same sums in the same order: the same bits.
  bool push = false;
  int push_at = 0;  ///< where the slots start in the dynamic shared memory (doubles)
  std::int64_t seg_lo[kClusterMaxSegs] = {}, seg_hi[kClusterMaxSegs] = {};
  std::int64_t seg_tile0[kClusterMaxSegs + 1] = {};  ///< first tile of each range; [nseg]: all tiles
  /// A split update's launches (kUpdateSplit, kUpdateWide): cluster k's matrix in Update::sn_mats.
  unsigned char sn_of[kUpdateMaxSn] = {};
};

/// Dynamic shared memory of the cluster update (doubles): Σ over the block's rows of W[r, c] u[r]
/// [max_cols] (read by the whole cluster), v [max_cols], x = W v of the block's rows [rpc], Σ x²
/// of them [1].
constexpr std::size_t kClusterMaxShared = 40 * 1024;  // with the static shared memory, under the default 48 KiB
std::size_t cluster_update_shared(int max_cols, int rpc) {
  return (2 * static_cast<std::size_t>(max_cols) + static_cast<std::size_t>(rpc) + 2) * sizeof(double);
}
/// The push slots after it (ClusterPlan::push): Wᵀu sums [cs][max_cols] and Σ x² [cs].
std::size_t cluster_push_shared(int cs, int max_cols) {
  return static_cast<std::size_t>(cs) * (static_cast<std::size_t>(max_cols) + 1) * sizeof(double);
}
/// The staging area after those (ClusterPlan::stage): u of the block's rows [rpc], rounded up to
/// 16 bytes, then m, v, θ and the first heads' gradients of a tile [kClusterStaged][kClusterTile].
constexpr int kClusterStaged = 3 + kClusterEarlyHeads;
__host__ __device__ inline std::size_t cluster_stage_u(int rpc) {  // floats
  return (static_cast<std::size_t>(rpc) + 3) / 4 * 4;
}
std::size_t cluster_stage_shared(int rpc) {
  return (cluster_stage_u(rpc) + static_cast<std::size_t>(kClusterStaged) * kClusterTile) * sizeof(float);
}
/// The kept rows after that (ClusterPlan::keepw): the new θ of a block's rows [rpc · max_cols],
/// rounded up to 16 bytes, then their old target as many.
__host__ __device__ inline std::size_t cluster_keep_rows(int rpc, int max_cols) {  // floats
  return (static_cast<std::size_t>(rpc) * static_cast<std::size_t>(max_cols) + 3) / 4 * 4;
}
std::size_t cluster_keep_shared(int rpc, int max_cols) { return 2 * cluster_keep_rows(rpc, max_cols) * sizeof(float); }
/// The most dynamic shared memory a launch of these bounds takes: every area above (cs blocks a
/// cluster; without the push slots where they do not fit, the launch takes less).
std::size_t cluster_most_shared(int cs, int max_cols, int rpc) {
  return cluster_update_shared(max_cols, rpc) + cluster_push_shared(cs, max_cols) + cluster_stage_shared(rpc) +
         cluster_keep_shared(rpc, max_cols);
}
/// The most the kept rows may take (the C51 step's 16 rows of 256 columns take 32 KiB).
constexpr std::size_t kClusterMaxKeep = 64 * 1024;
/// The most dynamic shared memory the cluster update asks for (its function attribute).
constexpr std::size_t kClusterMaxPush = 40 * 1024;  // the slots' most (16 ranks of 256 columns: 32.1 KiB)
constexpr std::size_t kClusterMaxDynamic = kClusterMaxShared + 48 * 1024 + kClusterMaxKeep + kClusterMaxPush;

/// Copies (cp.async, one group) m, v and θ of the tile's elements i = s + k·NT + threadIdx.x
/// < hi into st[0..2][k·NT + threadIdx.x] (zeros past hi), each thread its own elements.
/// Only this kernel writes them: the copies may start before the kernel's griddepcontrol.wait.
template <int NT = kThreads>
__device__ __forceinline__ void cluster_stage_state(const ClusterStep& x, std::int64_t s, std::int64_t hi, float* st) {
#pragma unroll
  for (int k = 0; k < kClusterPer; ++k) {
    const std::int64_t i = s + k * NT + threadIdx.x;
    const bool ok = i < hi;
    const int at = k * NT + threadIdx.x;
    dev::cp_async4(st + at, ok ? x.mom + i : x.mom, ok);
    dev::cp_async4(st + kTileOf<NT> + at, ok ? x.var + i : x.var, ok);
    dev::cp_async4(st + 2 * kTileOf<NT> + at, ok ? x.theta + i : x.theta, ok);
  }
  dev::cp_async_commit();
}

/// The same tile's first heads' gradients into st[3..] (one more group; after the wait): zeros
/// where cluster_load_grads has them (a head past H or whose reach misses the tile, i ≥ hi).
template <int NT = kThreads>
__device__ __forceinline__ void cluster_stage_grads(const ClusterStep& x, std::int64_t s, std::int64_t hi, float* st) {
#pragma unroll
  for (int h = 0; h < kClusterEarlyHeads; ++h) {
    const bool meets = h < x.H && reach_meets(x.reach, h, s, hi);
#pragma unroll
    for (int k = 0; k < kClusterPer; ++k) {
      const std::int64_t i = s + k * NT + threadIdx.x;
      const bool ok = meets && i < hi;
      dev::cp_async4(st + (3 + h) * kTileOf<NT> + k * NT + threadIdx.x,
                     ok ? x.grads + static_cast<std::int64_t>(h) * x.P + i : x.grads, ok);
    }
  }
  dev::cp_async_commit();
}

/// The staged tile into r, as cluster_load(x, s, hi, false, r) would load it (each thread reads
/// back what its own copies wrote, after waiting for them).
template <int NT = kThreads>
__device__ __forceinline__ void cluster_unstage(const float* st, ClusterTile& r) {
  dev::cp_async_wait<0>();
#pragma unroll
  for (int k = 0; k < kClusterPer; ++k) {
    const int at = k * NT + threadIdx.x;
    r.m[k] = st[at];
    r.v[k] = st[kTileOf<NT> + at];
    r.th[k] = st[2 * kTileOf<NT> + at];
    r.tg[k] = 0.0f;
#pragma unroll
    for (int h = 0; h < kClusterEarlyHeads; ++h) r.gr[h][k] = st[(3 + h) * kTileOf<NT> + at];
  }
}

/// Thread 0 stamps slot `slot` of its block (UpdateClockSlot): %globaltimer, and clock64 in the
/// slot kUpdateClockSlots further on. Nothing when the plan has no clock.
__device__ __forceinline__ void clock_stamp(const ClusterPlan& pl, int slot) {
  if (!pl.clock || threadIdx.x != 0 || static_cast<int>(blockIdx.x) >= pl.clock_blocks) return;
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  std::uint64_t* b = pl.clock + static_cast<std::int64_t>(blockIdx.x) * 2 * kUpdateClockSlots;
  b[slot] = t;
  b[kUpdateClockSlots + slot] = static_cast<std::uint64_t>(clock64());
}

/// Σ over the cluster's blocks, in rank order, of element i of the shared array p (each block's own
/// copy, through distributed shared memory): every block gets the same sum.
template <int CS>
__device__ __forceinline__ double rank_sum(const cooperative_groups::cluster_group& cluster, double* p, int i) {
  double q[CS];
#pragma unroll
  for (int k = 0; k < CS; ++k) q[k] = cluster.map_shared_rank(p, k)[i];
  double sum = 0.0;
#pragma unroll
  for (int k = 0; k < CS; ++k) sum += q[k];
  return sum;
}

/// The update after budget_partial_kernel (with step), in clusters of CS blocks. Every block: the clip
/// factors and the skip decision (budget_clips), t and the bias corrections from the first launch
/// (block 0 stores t); each block's first tile is loaded before that. A normed matrix's cluster
/// updates its elements (g, Adam), then runs the power iteration over distributed shared memory:
/// each block sums Wᵀu over its rows, every block adds the blocks' sums in rank order (all get the
/// same v = Wᵀu/‖Wᵀu‖), computes x = W v for its rows and Σ x² of them; σ adds those in rank order;
/// each block writes u ← x/σ for its rows and scales them by σ_max/σ when σ > σ_max, then their
/// target update. The other clusters do g, Adam and the target update outside the normed
/// matrices. Needs the normed matrices disjoint ranges inside params within the bounds (the caller
/// checks). Skipped: g = 0, nothing else changes.
/// V: 0, or a split update's launch: kUpdateSplit (the main launch): cluster k
/// takes normed matrix pl.sn_of[k];
/// kUpdateWide (its side launch): the same, in blocks of update_threads(V) = 2·kThreads threads
/// (a tile of 2·kClusterTile elements), and none of them the writer block. Each element's
/// operations and each sum's order are those of the default launch: the same bits.
template <int CS, int V>
__global__ void __launch_bounds__(update_threads(V), (V & kUpdateWide) ? 1 : 2)
    update_cluster_kernel(Update u, const double* __restrict__ partial, int nchunks, ClusterPlan pl) {
  constexpr bool Wide = (V & kUpdateWide) != 0, Mapped = (V & (kUpdateSplit | kUpdateWide)) != 0;
  constexpr int NT = update_threads(V);
  constexpr std::int64_t kTile = kTileOf<NT>;
  clock_stamp(pl, kClockPlaced);  // (the clock is no buffer of the kernels this one waits for)
  namespace cg = cooperative_groups;
  extern __shared__ double cu_shared[];
  __shared__ float clip_sh[kUpdateMaxHeads + 4];  // + 4: see budget()
  __shared__ double sh[32];
  const Budget& b = u.budget;
  float* theta = static_cast<float*>(u.adam.params.p);
  const TargetUpdate& tu = u.target;
  ClusterStep x{static_cast<const float*>(b.grads.p),
                static_cast<float*>(b.g.p),
                static_cast<float*>(u.adam.m.p),
                static_cast<float*>(u.adam.v.p),
                theta,
                clip_sh,
                b.P,
                b.H,
                AdamCoef{},
                false,
                TargetRule{static_cast<float*>(tu.target.p), static_cast<double>(tu.tau), tu.period != 0},
                b.reach,
                b.H == 1};
  const bool every = tu.period == 0;  // Polyak: the target's old values are needed (every step)
  // This block's elements: a normed matrix's rows, or tiles of the ranges outside them.
  const int cid = static_cast<int>(blockIdx.x) / CS;
  const bool normed = cid < pl.nsn;
  const int rank = static_cast<int>(blockIdx.x) % CS;
  int rows = 0, cols = 0, r0 = 0, r1 = 0;
  std::int64_t lo = 0, hi = 0;
  SpectralMatrix sm{};
  const int first = pl.nsn * CS, nblocks = static_cast<int>(gridDim.x) - first;
  const std::int64_t tiles = pl.seg_tile0[pl.nseg];
  int q = 0;
  std::int64_t tile = static_cast<int>(blockIdx.x) - first;
  std::int64_t off = 0;  // a normed matrix's W[0, 0] in params
  if (normed) {
    sm = u.sn_mats[Mapped ? pl.sn_of[cid] : cid];
    rows = max(sm.rows, 0);
    cols = max(sm.cols, 0);
    // this matrix's rows evenly over its cluster (at most pl.rpc, the tallest matrix's share): a
    // 128-row matrix gives each block half the rows a 256-row one does, not two tiles to half of them
    const int share = (rows + CS - 1) / CS;
    r0 = min(rows, rank * share);
    r1 = min(rows, r0 + share);
    off = static_cast<float*>(sm.w.p) - theta;
    lo = off + static_cast<std::int64_t>(r0) * cols;
    hi = off + static_cast<std::int64_t>(r1) * cols;
  } else if (tile < tiles) {
    while (pl.seg_tile0[q + 1] <= tile) ++q;
    lo = pl.seg_lo[q] + (tile - pl.seg_tile0[q]) * kTile;
    hi = pl.seg_hi[q];
  }
  ClusterTile reg;  // in flight during the clips
  // The first tile's m, v, θ and target are loaded before griddepcontrol.wait, so that they load
  // while the partial sums (the kernel this one waits for) finish; only this kernel writes them.
  // A normed block of one tile keeps it in registers from Adam to the scaling and target update
  // after the power iteration (its old target loaded here too, for Polyak).
  const bool keep = normed && hi - lo <= kTile;
  // pl.stage: a normed block's second tile staged in shared memory, its copies started here; and
  // where a matrix row is a tile row, Wᵀu's share summed from registers during Adam (u of the
  // block's rows into shared memory first: only this kernel writes u)
  const bool staged = !Wide && pl.stage && normed && hi - lo > kTile;  // (Wide: no staging area)
  const bool colreg = pl.stage && normed && cols == NT;
  // pl.keepw (with stage): the block's rows of the new θ in wsh from Adam on; a block that does not
  // keep its one tile in registers copies its rows' old target into tsh now (Polyak; each thread
  // its own elements, as the tail reads them)
  const bool kept = pl.keepw && pl.stage && normed;
  const bool tstaged = kept && every && !keep;
  float* ush = reinterpret_cast<float*>(cu_shared + pl.stage_at);
  float* stg = ush + cluster_stage_u(pl.rpc);
  float* wsh = stg + (Wide ? 0 : kClusterStaged * kTile);
  float* tsh = wsh + cluster_keep_rows(pl.rpc, pl.max_cols);
  float* uv = normed ? static_cast<float*>(sm.u.p) : nullptr;
  cluster_load_state<NT>(x, lo, min(hi, lo + kTile), every && (!normed || keep), reg);
  if (staged) cluster_stage_state<NT>(x, lo + kTile, min(hi, lo + 2 * kTile), stg);
  if (tstaged) {
    for (std::int64_t i = lo + threadIdx.x; i < hi; i += NT) dev::cp_async4(tsh + (i - lo), x.rule.tgt + i, true);
    dev::cp_async_commit();
  }
  if (colreg || kept)
    for (int r = r0 + static_cast<int>(threadIdx.x); r < r1; r += NT) ush[r - r0] = uv[r];
  // push: an arrival now, awaited before the first store into another block's shared memory (every
  // block of the cluster has started by then)
  const bool push = pl.push && normed;
  double* pw = cu_shared + pl.push_at;  // [CS][max_cols]: the ranks' Wᵀu sums
  double* px = pw + static_cast<std::int64_t>(CS) * pl.max_cols;  // [CS]: their Σ x²
  if (push) asm volatile("barrier.cluster.arrive.relaxed;\n" ::: "memory");
  dev::pdl_entry();
  clock_stamp(pl, kClockWaited);
  const double bc1 = pl.step[0], bc2 = pl.step[1];
  const auto t_new = static_cast<long long>(pl.step[2]);
  cluster_load_grads<NT>(x, lo, min(hi, lo + kTile), reg);
  if (staged) cluster_stage_grads<NT>(x, lo + kTile, min(hi, lo + 2 * kTile), stg);
  // (budget_clips' barriers publish ush)
  const bool writer = !Wide && blockIdx.x == 0;  // (the main launch's block 0 stores the step's reports)
  const bool finite = budget_clips(b, partial, nchunks, clip_sh, writer);
  clock_stamp(pl, kClockClips);
  if (finite && writer && threadIdx.x == 0) *u.adam.t = t_new;
  x.finite = finite;
  if (finite)
    x.adam = adam_coef(u.adam.beta1, u.adam.beta2, u.adam.eps, *static_cast<const float*>(u.adam.lr.p), bc1, bc2);
  const bool target_on = finite && (tu.period == 0 || t_new % tu.period == 0);
  if (!normed) {
    if (tile >= tiles) {
      clock_stamp(pl, kClockAdam);
      clock_stamp(pl, kClockExit);
      return;
    }
    // the block's tiles (the first loaded already)
    std::int64_t s = lo, e = min(hi, lo + kTile);
    cluster_store<NT>(x, s, e, target_on, reg);
    for (;;) {
      tile += nblocks;
      if (tile >= tiles) break;
      while (pl.seg_tile0[q + 1] <= tile) ++q;
      s = pl.seg_lo[q] + (tile - pl.seg_tile0[q]) * kTile;
      e = min(pl.seg_hi[q], s + kTile);
      cluster_load<NT>(x, s, e, every && target_on, reg);
      cluster_store<NT>(x, s, e, target_on, reg);
    }
    clock_stamp(pl, kClockAdam);
    clock_stamp(pl, kClockExit);
    return;
  }
  cg::cluster_group cluster = cg::this_cluster();
  float* W = static_cast<float*>(sm.w.p);
  // colreg: Σ over the block's rows of W[r, c] u[r] for c = threadIdx.x, from each tile's new θ
  // (rows in order, as the loop below adds them: the same sum)
  double wtu = 0.0;
  const auto wtu_tile = [&](std::int64_t s) {
    if (!colreg) return;
    const int rb = static_cast<int>((s - lo) / NT);  // the tile's first row, from r0
#pragma unroll
    for (int k = 0; k < kClusterPer; ++k)
      if (s + k * NT + threadIdx.x < hi)
        wtu += static_cast<double>(reg.th[k]) * static_cast<double>(ush[rb + k]);
  };
  // kept: the tile's new θ into wsh (each thread its own elements; read after a barrier)
  const auto keep_tile = [&](std::int64_t s) {
    if (!kept) return;
#pragma unroll
    for (int k = 0; k < kClusterPer; ++k) {
      const std::int64_t i = s + k * NT + threadIdx.x;
      if (i < hi) wsh[i - lo] = reg.th[k];
    }
  };
  // the block's rows: g and Adam (their target update follows the spectral norm; with the kept
  // rows, their θ too: stored once, after the power iteration, scaled or not). Only with the kept
  // rows: the power iteration reads W v (and, where not summed from registers, Wᵀu) from them,
  // and from params otherwise, which must then hold the new θ — a block keeping its one tile in
  // registers without them (the four heads' grid, in waves, keeps no rows) stores θ beside Adam
  const bool defer = kept;
  // a tile (the first loaded already, the second staged where staged)
  const auto tile_step = [&](std::int64_t s, bool first) {
    if (!first) {
      if (staged && s == lo + kTile)
        cluster_unstage<NT>(stg, reg);
      else
        cluster_load<NT>(x, s, min(hi, s + kTile), false, reg);
    }
    cluster_store<NT>(x, s, min(hi, s + kTile), false, reg, !defer);
    wtu_tile(s);
    keep_tile(s);
  };
  tile_step(lo, true);
  for (std::int64_t s = lo + kTile; s < hi; s += kTile) tile_step(s, false);
  clock_stamp(pl, kClockAdam);
  if (!finite || rows == 0 || cols == 0) {  // the same in every block of the cluster
    if (tstaged) dev::cp_async_wait<0>();  // (no copy outlives the block)
    if (push) asm volatile("barrier.cluster.wait;\n" ::: "memory");  // (its arrival's phase closed)
    clock_stamp(pl, kClockExit);
    return;
  }
  double* part = cu_shared;          // [max_cols]: Σ over this block's rows of W[r, c] u[r]
  double* vv = part + pl.max_cols;   // [max_cols]: v
  double* xr = vv + pl.max_cols;     // [rpc]
  double* xsq = xr + pl.rpc;         // [1]
  // push: the column's sum into slot `rank` of every block's pw
  const auto push_col = [&](int c, double w) {
#pragma unroll
    for (int k = 0; k < CS; ++k) cluster.map_shared_rank(pw, k)[rank * pl.max_cols + c] = w;
  };
  if (push) asm volatile("barrier.cluster.wait;\n" ::: "memory");
  if (colreg) {
    if (push)
      push_col(static_cast<int>(threadIdx.x), wtu);
    else
      part[threadIdx.x] = wtu;  // (the cluster barrier below also orders this block's writes of W)
  } else {
    __syncthreads();  // this block's rows of W are written (and kept)
    for (int c = threadIdx.x; c < cols; c += NT) {
      double acc = 0.0;
      if (kept) {  // the same floats from shared memory, added in the same order
#pragma unroll 8
        for (int r = 0; r < r1 - r0; ++r)
          acc += static_cast<double>(wsh[static_cast<std::int64_t>(r) * cols + c]) * static_cast<double>(ush[r]);
      } else {
#pragma unroll 8
        for (int r = r0; r < r1; ++r)
          acc += static_cast<double>(W[static_cast<std::int64_t>(r) * cols + c]) * static_cast<double>(uv[r]);
      }
      if (push)
        push_col(c, acc);
      else
        part[c] = acc;
    }
  }
  cluster.sync();
  clock_stamp(pl, kClockWtu);
  // Wᵀu: the blocks' sums in rank order, the same in every block
  double vsq = 0.0;
  double* v = vv;  // v = Wᵀu / ‖Wᵀu‖ (in part with pl.gather)
  if (push) {  // the ranks' sums from this block's slots, in rank order (as rank_sum adds them)
    for (int c = threadIdx.x; c < cols; c += NT) {
      double w = 0.0;
#pragma unroll
      for (int k = 0; k < CS; ++k) w += pw[k * pl.max_cols + c];
      vv[c] = w;
      vsq += w * w;
    }
  } else if (pl.gather) {
    // each block sums its share of the columns over the ranks (in rank order) into its vv, then
    // every block reads the shares from their owners into its part (whose sums every block has
    // read before the barrier): the same sums, 1 remote load a column instead of CS
    const int per = (cols + CS - 1) / CS, c0 = rank * per, c1 = min(cols, c0 + per);
    for (int c = c0 + static_cast<int>(threadIdx.x); c < c1; c += NT)
      vv[c] = rank_sum<CS>(cluster, part, c);
    cluster.sync();
    for (int c = threadIdx.x; c < cols; c += NT) {
      const int owner = c / per;
      const double w = owner == rank ? vv[c] : cluster.map_shared_rank(vv, owner)[c];
      part[c] = w;
      vsq += w * w;
    }
    v = part;
  } else {
    for (int c = threadIdx.x; c < cols; c += NT) {
      const double w = rank_sum<CS>(cluster, part, c);
      vv[c] = w;
      vsq += w * w;
    }
  }
  clock_stamp(pl, kClockGather);  // (thread 0's share of the gather)
  const double vn = sqrt(block_sum(vsq, sh));  // its barriers also publish v
  const double vnorm = vn < 1e-12 ? 1e-12 : vn;
  for (int c = threadIdx.x; c < cols; c += NT) v[c] /= vnorm;
  __syncthreads();
  clock_stamp(pl, kClockV);
  // x = W v for this block's rows: a warp per row, lanes along the row
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int r = r0 + warp; r < r1; r += NT / 32) {
    double xs = 0.0;
    const float* wr = kept ? wsh + static_cast<std::int64_t>(r - r0) * cols : W + static_cast<std::int64_t>(r) * cols;
#pragma unroll 8
    for (int c = lane; c < cols; c += 32) xs += static_cast<double>(wr[c]) * v[c];
    xs = warp_sum(xs);
    if (lane == 0) xr[r - r0] = xs;
  }
  __syncthreads();
  clock_stamp(pl, kClockWv);
  if (warp == 0) {
    double sq = 0.0;
    for (int r = lane; r < r1 - r0; r += 32) sq += xr[r] * xr[r];
    sq = warp_sum(sq);
    if (push) {  // lane 0's sum (the lanes' may differ in the last bit) into slot `rank` of each block
      const double s0 = __shfl_sync(0xffffffffu, sq, 0);
      if (lane < CS) *cluster.map_shared_rank(px + rank, lane) = s0;
    } else if (lane == 0) {
      *xsq = sq;
    }
  }
  cluster.sync();
  clock_stamp(pl, kClockSigma);
  double sigma2;
  if (push) {
    sigma2 = 0.0;
#pragma unroll
    for (int k = 0; k < CS; ++k) sigma2 += px[k];
  } else if (pl.gather) {  // the ranks' Σ x² by one warp, added in rank order as rank_sum does
    if (warp == 0) {
      const double q = lane < CS ? *cluster.map_shared_rank(xsq, lane) : 0.0;
      double sum = 0.0;
#pragma unroll
      for (int k = 0; k < CS; ++k) sum += __shfl_sync(0xffffffffu, q, k);
      if (lane == 0) sh[0] = sum;
    }
    __syncthreads();
    sigma2 = sh[0];
  } else {
    sigma2 = rank_sum<CS>(cluster, xsq, 0);
  }
  const double sigma = sqrt(sigma2);
  const double unorm = sigma < 1e-12 ? 1e-12 : sigma;
  for (int r = r0 + threadIdx.x; r < r1; r += NT) uv[r] = static_cast<float>(xr[r - r0] / unorm);
  // the block's rows: scaled when σ > σ_max, then their target update (loads first, per tile)
  const bool scale = sigma > static_cast<double>(u.sigma_max);
  const double factor = scale ? static_cast<double>(u.sigma_max) / sigma : 1.0;
  if (scale || target_on || defer) {
    const bool polyak_on = target_on && !x.rule.copy;
    if (tstaged) dev::cp_async_wait<0>();  // this thread's copies of its elements' target
    for (std::int64_t s = lo; s < hi; s += kTile) {
      float wr[kClusterPer], tr[kClusterPer];
#pragma unroll
      for (int k = 0; k < kClusterPer; ++k) {
        const std::int64_t i = s + k * NT + threadIdx.x;
        wr[k] = tr[k] = 0.0f;
        if (i >= hi) continue;
        if (keep) {  // the new θ and the old target, kept since Adam (the same values as in memory)
          wr[k] = reg.th[k];
          tr[k] = reg.tg[k];
        } else if (kept) {  // the same, from shared memory
          wr[k] = wsh[i - lo];
          if (polyak_on) tr[k] = tsh[i - lo];
        } else {
          wr[k] = theta[i];
          if (polyak_on) tr[k] = x.rule.tgt[i];
        }
      }
#pragma unroll
      for (int k = 0; k < kClusterPer; ++k) {
        const std::int64_t i = s + k * NT + threadIdx.x;
        if (i >= hi) continue;
        float w = wr[k];
        if (scale) w = static_cast<float>(static_cast<double>(w) * factor);
        if (scale || defer) theta[i] = w;
        if (target_on) x.rule.tgt[i] = x.rule.copy ? w : polyak(x.rule.tau, tr[k], w);
      }
    }
  }
  clock_stamp(pl, kClockScaled);
  // no block leaves while another may still read its shared memory (push: none reads another's)
  if (!push) cluster.sync();
  clock_stamp(pl, kClockExit);
}

// --- split-k sums ---------------------------------------------------------------------------

/// C[r, c] = Σ_s part[s][r][c] over the slices in order (in double), part compact [S, m, n].
template <class I>
__global__ void sum_slices_kernel(float* c, int m, int n, int ldc, const float* part, int S) {
  dev::pdl_entry();
  const I mn = static_cast<I>(m) * static_cast<I>(n);
  for (I i = static_cast<I>(grid_start()); i < mn; i += static_cast<I>(grid_step())) {
    double acc = 0.0;
    for (int sl = 0; sl < S; ++sl) acc += static_cast<double>(part[static_cast<std::int64_t>(sl) * mn + i]);
    const I r = i / static_cast<I>(n);
    c[static_cast<std::int64_t>(r) * ldc + (i - r * static_cast<I>(n))] = static_cast<float>(acc);
  }
}

// --- elementwise ----------------------------------------------------------------------------

/// out[0] = (1/n) Σ w[i]·x[i]: each thread its strided share in double, then the block's sum
/// (one block: a fixed order).
__global__ void weighted_mean_kernel(float* out, const float* x, const float* w, std::int64_t n) {
  dev::pdl_entry();
  __shared__ double sh[32];
  double acc = 0.0;
  for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x)
    acc += static_cast<double>(w[i]) * static_cast<double>(x[i]);
  const double total = dev::block_sum(acc, sh);
  if (threadIdx.x == 0) out[0] = static_cast<float>(n > 0 ? total / static_cast<double>(n) : 0.0);
}

__global__ void fill_kernel(float* x, float value, std::int64_t n) {
  dev::pdl_entry();
  for (std::int64_t i = grid_start(); i < n; i += grid_step()) x[i] = value;
}

__global__ void axpy_kernel(float* y, const float* x, float alpha, std::int64_t n) {
  dev::pdl_entry();
  for (std::int64_t i = grid_start(); i < n; i += grid_step())
    y[i] = static_cast<float>(static_cast<double>(alpha) * static_cast<double>(x[i]) + static_cast<double>(y[i]));
}

__global__ void uniform_kernel(float* out, std::int64_t n, std::uint64_t seed, std::uint32_t stream,
                               const std::int64_t* step_p) {
  dev::pdl_entry();
  const std::uint64_t step = step_p ? static_cast<std::uint64_t>(*step_p) : 0;
  for (std::int64_t i = grid_start(); i < n; i += grid_step())
    out[i] = philox::uniform(seed, step, stream, static_cast<std::uint64_t>(i));
}

__global__ void to_bf16_kernel(__nv_bfloat16* dst, const float* src, int rows, int cols, std::int64_t ld,
                               std::int64_t stride, int batch) {
  dev::pdl_entry();
  const std::int64_t per = static_cast<std::int64_t>(rows) * cols, n = per * batch;
  for (std::int64_t k = grid_start(); k < n; k += grid_step()) {
    const std::int64_t b = k / per, rc = k - b * per, r = rc / cols, c = rc - r * cols;
    dst[k] = __float2bfloat16_rn(src[b * stride + r * ld + c]);
  }
}

__global__ void scale_matrix_kernel(float* c, int rows, int cols, std::int64_t ld, std::int64_t stride, int batch,
                                    float beta) {
  dev::pdl_entry();
  const std::int64_t per = static_cast<std::int64_t>(rows) * cols, n = per * batch;
  for (std::int64_t k = grid_start(); k < n; k += grid_step()) {
    const std::int64_t b = k / per, rc = k - b * per, r = rc / cols, col = rc - r * cols;
    float& x = c[b * stride + r * ld + col];
    x = beta == 0.0f ? 0.0f : beta * x;
  }
}

double support_step(float v_min, float v_max, int Z) {
  return Z > 1 ? (static_cast<double>(v_max) - static_cast<double>(v_min)) / (Z - 1) : 0.0;
}

}  // namespace

namespace {
/// Each stream's launch policy (set_stream_pdl); a stream not listed launches with the default.
struct StreamPdl {
  CudaSpec::Pdl mode = CudaSpec::Pdl::automatic;
  bool wide = false;
};
std::mutex& stream_pdl_mutex() {
  static std::mutex m;
  return m;
}
std::unordered_map<cudaStream_t, StreamPdl>& stream_pdl() {
  static std::unordered_map<cudaStream_t, StreamPdl> m;
  return m;
}
}  // namespace

void set_stream_pdl(cudaStream_t s, CudaSpec::Pdl mode, bool wide) noexcept {
  try {
    std::lock_guard<std::mutex> lock(stream_pdl_mutex());
    stream_pdl()[s] = StreamPdl{mode, wide};
  } catch (...) {
    // out of memory: the stream keeps the default policy (the same results, other timing)
  }
}

void forget_stream_pdl(cudaStream_t s) noexcept {
  std::lock_guard<std::mutex> lock(stream_pdl_mutex());
  stream_pdl().erase(s);
}

bool pdl_for(std::size_t shared, cudaStream_t s) noexcept {
  constexpr std::size_t kSmall = std::size_t{16} << 10;
  StreamPdl p;
  {
    std::lock_guard<std::mutex> lock(stream_pdl_mutex());
    if (const auto it = stream_pdl().find(s); it != stream_pdl().end()) p = it->second;
  }
  switch (p.mode) {
    case CudaSpec::Pdl::off: return false;
    case CudaSpec::Pdl::all: return true;
    case CudaSpec::Pdl::small: return shared <= kSmall;
    case CudaSpec::Pdl::automatic: return !p.wide || shared <= kSmall;
  }
  return true;
}

cudaError_t bias_act(cudaStream_t s, float* y, const float* bias, int rows, int cols, int ldy, bool relu) {
  const std::int64_t n = static_cast<std::int64_t>(rows) * cols;
  with_index_type(n, [&](auto i) {
    launch(bias_act_kernel<decltype(i)>, blocks_for(n), kThreads, 0, s, y, bias, rows, cols, ldy, relu);
  });
  return cudaGetLastError();
}

cudaError_t relu_backward(cudaStream_t s, float* dy, const float* y, int rows, int cols, int ld) {
  const std::int64_t n = static_cast<std::int64_t>(rows) * cols;
  if (cols % 4 == 0 && ld % 4 == 0 && aligned16(dy) && aligned16(y)) {
    with_index_type(n, [&](auto i) {
      launch(relu_backward4_kernel<decltype(i)>, blocks_for(n / 4), kThreads, 0, s, dy, y, rows, cols, ld);
    });
    return cudaGetLastError();
  }
  with_index_type(n, [&](auto i) {
    launch(relu_backward_kernel<decltype(i)>, blocks_for(n), kThreads, 0, s, dy, y, rows, cols, ld);
  });
  return cudaGetLastError();
}

cudaError_t relu_mask(cudaStream_t s, float* c, int rows, int cols, int ldc, const float* mask, int ldmask,
                      int mask_rows, int batch, std::int64_t stride_c, std::int64_t stride_mask) {
  if (rows <= 0 || cols <= 0 || batch <= 0) return cudaSuccess;
  const int period = mask_rows > 0 ? mask_rows : rows;
  const bool v4 = cols % 4 == 0 && ldc % 4 == 0 && ldmask % 4 == 0 && stride_c % 4 == 0 && stride_mask % 4 == 0 &&
                  aligned16(c) && aligned16(mask);
  const dim3 grid(blocks_for(static_cast<std::int64_t>(rows) * (v4 ? cols / 4 : cols)), static_cast<unsigned>(batch));
  if (v4)
    launch(relu_mask_kernel<true>, grid, kThreads, 0, s, c, rows, cols, ldc, mask, ldmask, period, stride_c, stride_mask);
  else
    launch(relu_mask_kernel<false>, grid, kThreads, 0, s, c, rows, cols, ldc, mask, ldmask, period, stride_c,
           stride_mask);
  return cudaGetLastError();
}

cudaError_t bias_grad(cudaStream_t s, float* db, const float* dy, int rows, int cols, int ldy, float beta) {
  const dim3 block(kColTile, kRowThreads);
  launch(bias_grad_kernel, (cols + kColTile - 1) / kColTile, block, 0, s, db, dy, rows, cols, ldy, beta);
  return cudaGetLastError();
}

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
    launch(c51_xent_reduce_kernel, 1, kThreads, 0, s, a.loss.as<float>(), weighted, a.B, a.scale, a.accumulate,
           a.members);
  return cudaGetLastError();
}

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
  launch(c51_xent_reduce_kernel, 1, kThreads, 0, s, a.loss.as<float>(), weighted, a.B, 1.0f, false, 1);
  return cudaGetLastError();
}

std::size_t budget_scratch_bytes(int H) {  // the partial sums: at most kBudgetMaxChunks per head
  return round_up(static_cast<std::size_t>(H) * static_cast<std::size_t>(kBudgetMaxChunks) * sizeof(double), 256);
}

/// Launches the budget's pass 1 (budget_partial_kernel over chunks × heads; with adam and step,
/// also the cluster update's step constants) and gives the chunk count the next pass reads.
cudaError_t budget_partials(cudaStream_t s, const Budget& b, double* partial, int& nchunks,
                            const Adam* adam = nullptr, double* step = nullptr) {
  const BudgetShape bs = budget_shape(b);
  nchunks = bs.nchunks;
  launch(budget_partial_kernel, dim3(nchunks, b.H), kThreads, 0, s,
         b.grads.as<const float>(), b.P, bs.chunk, b.reach, partial, adam ? adam->t : nullptr, adam ? adam->beta1 : 0.0,
         adam ? adam->beta2 : 0.0, step);
  return cudaGetLastError();
}

cudaError_t budget(cudaStream_t s, const Budget& a, void* scratch, int max_blocks) {
  int nchunks = budget_shape(a).nchunks;
  auto* partial = static_cast<double*>(scratch);
  if (a.H > 0)
    if (cudaError_t e = budget_partials(s, a, partial, nchunks); e != cudaSuccess) return e;
  const std::int64_t tiles = (a.P + kBudgetTile - 1) / kBudgetTile;
  const auto grid = static_cast<unsigned>(std::clamp<std::int64_t>(tiles, 1, std::max(max_blocks, 1)));
  // Rounded up to 4 floats: the unrolled head loop may load clips in groups (shared loads never
  // fault, so the compiler speculates them), which must stay inside the allocation.
  const std::size_t shmem = static_cast<std::size_t>((std::max(a.H, 1) + 3) / 4 * 4) * sizeof(float);
  launch(budget_combine_kernel, grid, kThreads, shmem, s, a, partial, nchunks);
  return cudaGetLastError();
}

cudaError_t adam(cudaStream_t s, const Adam& a, int max_blocks) {
  // Launched for P == 0 too: it still advances t.
  launch(adam_kernel, wave_blocks(a.P, max_blocks), kThreads, 0, s, a.params.as<float>(), a.g.as<const float>(),
         a.m.as<float>(), a.v.as<float>(), a.P, a.t,
         a.lr.as<const float>(), a.beta1, a.beta2, a.eps,
         a.skip);
  return cudaGetLastError();
}

std::size_t spectral_norm_scratch_bytes(int count, int max_rows, int max_cols) {
  const std::size_t cells = static_cast<std::size_t>(count) * static_cast<std::size_t>(sn_col_chunks(max_cols));
  return round_up(cells * sizeof(double), 256) + round_up(cells * static_cast<std::size_t>(max_rows) * sizeof(double), 256);
}

cudaError_t spectral_norm(cudaStream_t s, const SpectralMatrix* mats, int count, int max_rows, int max_cols,
                          float sigma_max, const std::int32_t* skip, void* scratch) {
  const SnPlan p = sn_plan(scratch, count, max_rows, max_cols);
  launch(sn_cols_kernel, dim3(p.ncc, count), kThreads, 0, s, mats, max_rows, max_cols, skip, p.vsq, p.xp);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  launch(sn_rows_kernel, dim3(p.nrb, count), kThreads, 0, s, mats, max_rows, max_cols, p.rpb, p.ncc, sigma_max, skip,
         p.vsq, p.xp);
  return cudaGetLastError();
}

cudaError_t target_update(cudaStream_t s, const TargetUpdate& a, int max_blocks) {
  launch(target_update_kernel, wave_blocks(a.P, max_blocks), kThreads, 0, s, a.target.as<float>(),
         a.params.as<const float>(), a.P, a.tau,
         a.period, a.t, a.skip);
  return cudaGetLastError();
}

std::size_t update_scratch_bytes(int H) {
  return budget_scratch_bytes(H) + 256;  // + 256: the step's constants after the partial sums
}

int update_max_heads() { return kUpdateMaxHeads; }
int update_max_matrices() { return kUpdateMaxSn; }

/// The launch of `blocks` blocks of `threads` (kThreads unless given) in clusters of cs (attr:
/// storage for the attributes the configuration points to; with pdl, also programmatic stream
/// serialization where enabled).
cudaLaunchConfig_t cluster_config(int cs, unsigned blocks, std::size_t shared, cudaStream_t s,
                                  cudaLaunchAttribute (&attr)[2], bool pdl = false, int threads = kThreads) {
  attr[0] = cudaLaunchAttribute{};
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(cs);
  attr[0].val.clusterDim.y = attr[0].val.clusterDim.z = 1;
  attr[1] = dev::pdl_attribute();
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(blocks);
  cfg.blockDim = dim3(static_cast<unsigned>(threads));
  cfg.dynamicSmemBytes = shared;
  cfg.stream = s;
  cfg.attrs = attr;
  cfg.numAttrs = pdl && pdl_for(shared, s) ? 2 : 1;
  return cfg;
}

/// The cluster update's instantiation for cs (16, else 8) blocks a cluster and variant v (0, or at
/// 16 kUpdateSplit or kUpdateWide, a split update's two launches: it runs at 16 blocks a cluster
/// only).
using UpdateKernel = void (*)(Update, const double*, int, ClusterPlan);
/// The variants instantiated at cs = 16: every v below it (kUpdateSplit and kUpdateWide never
/// together), and at 8 those below kUpdateSplit.
constexpr int kUpdateKernels16 = kUpdateSplit | kUpdateWide, kUpdateKernels8 = kUpdateSplit;
template <int CS, int... Vs>
UpdateKernel update_kernel_of(int v, std::integer_sequence<int, Vs...>) {
  UpdateKernel k = update_cluster_kernel<CS, 0>;
  ((v == Vs ? (k = update_cluster_kernel<CS, Vs>, 0) : 0), ...);
  return k;
}
UpdateKernel update_kernel(int cs, int v) {
  return cs == 16 ? update_kernel_of<16>(v, std::make_integer_sequence<int, kUpdateKernels16>{})
                  : update_kernel_of<8>(v, std::make_integer_sequence<int, kUpdateKernels8>{});
}

/// How many clusters of cs blocks of the cluster update the device holds at once with `shared`
/// bytes of dynamic shared memory a block (0 where it cannot say).
int active_clusters(int cs, unsigned blocks, std::size_t shared, int v = 0) {
  cudaLaunchAttribute attr[2]{};
  const cudaLaunchConfig_t cfg = cluster_config(cs, blocks, shared, nullptr, attr, false, update_threads(v));
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, update_kernel(cs, v), &cfg) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return clusters;
}

int update_cluster_size(int want) {
  int dev = 0, ok = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&ok, cudaDevAttrClusterLaunch, dev) != cudaSuccess ||
      !ok) {
    cudaGetLastError();
    return 0;
  }
  // 16 blocks per cluster where the device schedules them (a non-portable size), else 8.
  for (int v = 0; v < kUpdateKernels16; ++v)
    cudaFuncSetAttribute(update_kernel(16, v), cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  cudaGetLastError();
  // room for the staging area, the kept rows and the push slots past the default 48 KiB
  for (int cv = 0; cv < kUpdateKernels16 + kUpdateKernels8; ++cv) {
    const UpdateKernel k = cv < kUpdateKernels16 ? update_kernel(16, cv) : update_kernel(8, cv - kUpdateKernels16);
    cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kClusterMaxDynamic));
    // the most shared memory an SM gives (the kept rows and push slots: two blocks of 111 KiB);
    // the update streams its operands once, so the smaller L1 costs it nothing
    cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
  }
  cudaGetLastError();
  for (int cs : {16, 8}) {
    if (want != 0 && cs != want) continue;
    // one cluster, with the shared memory of a typical large case (33 KiB)
    if (active_clusters(cs, static_cast<unsigned>(cs), cluster_update_shared(2048, 64)) > 0) return cs;
  }
  return 0;
}

bool update_cluster_fits(int cs, int max_rows, int max_cols) {
  if (cs < 1 || max_rows < 0 || max_cols < 0) return false;
  return cluster_update_shared(max_cols, (max_rows + cs - 1) / cs) <= kClusterMaxShared;
}

namespace {
/// A split update's side launch (kUpdateWide) as planned: its plan, grid and dynamic shared memory.
struct ClusterLaunch {
  ClusterPlan pl;
  unsigned blocks = 0;
  std::size_t shared = 0;
};

/// The normed matrices `idx` (indices into Update::sn_mats) in pl, one cluster each in that order
/// (pl.sn_of names them: read by a split update's launches, the identity otherwise), and the rows
/// and columns their blocks' shared memory is sized for.
void plan_normed(ClusterPlan& pl, const std::vector<SnRange>& mats, const std::vector<int>& idx, int cs) {
  pl.nsn = static_cast<int>(idx.size());
  int rows = 0, cols = 0;
  for (std::size_t k = 0; k < idx.size(); ++k) {
    const SnRange& m = mats[static_cast<std::size_t>(idx[k])];
    pl.sn_of[k] = static_cast<unsigned char>(idx[k]);
    if (m.rows <= 0 || m.hi <= m.lo) continue;
    rows = std::max(rows, m.rows);
    cols = std::max(cols, static_cast<int>((m.hi - m.lo) / m.rows));
  }
  pl.max_cols = std::max(cols, 1);
  pl.rpc = std::max((rows + cs - 1) / cs, 1);
}
}  // namespace

cudaError_t update_cluster(cudaStream_t s, const Update& u, void* scratch, int cs, const std::vector<SnRange>& mats,
                           int max_blocks, std::uint64_t* clock, int clock_blocks, int* launched,
                           UpdateChoices* choices, const UpdateSide* side) {
  const Budget& b = u.budget;
  if ((cs != 8 && cs != 16) || u.sn_count > kUpdateMaxSn || !update_cluster_fits(cs, u.sn_max_rows, u.sn_max_cols) ||
      static_cast<int>(mats.size()) != u.sn_count)
    return cudaErrorInvalidValue;
  ClusterPlan pl;  // the main launch's (unsplit: every matrix, in table order)
  // The ranges of params outside every normed matrix, and their tiles.
  std::vector<std::pair<std::int64_t, std::int64_t>> normed;
  for (const SnRange& r : mats)
    if (r.hi > r.lo) normed.emplace_back(r.lo, r.hi);
  std::sort(normed.begin(), normed.end());
  std::int64_t at = 0;
  auto add = [&](std::int64_t lo, std::int64_t hi) {
    if (hi <= lo) return;
    pl.seg_lo[pl.nseg] = lo;
    pl.seg_hi[pl.nseg] = hi;
    pl.seg_tile0[pl.nseg + 1] = pl.seg_tile0[pl.nseg] + (hi - lo + kClusterTile - 1) / kClusterTile;
    ++pl.nseg;
  };
  for (const auto& r : normed) {
    add(at, r.first);
    at = std::max(at, r.second);
  }
  add(at, b.P);
  const std::int64_t tiles = pl.seg_tile0[pl.nseg];
  const std::int64_t plain = std::min<std::int64_t>(tiles, std::max(max_blocks, cs));
  const std::int64_t plain_blocks = (plain + cs - 1) / cs * cs;
  // wide: the matrices whose share of rows passes one tile of a kThreads block go to the side
  // launch (at 16 blocks a cluster, with a side stream); the others stay in the main one. Only
  // where the whole update is resident at once with the most shared memory the main launch may
  // take, a side launch's block counted as two of the main launch's (it takes an SM): the C51
  // step (on an H200 1.4 µs faster with it), not the four heads' update in waves (7 µs slower)
  std::vector<int> main_idx, wide_idx;
  for (int k = 0; k < u.sn_count; ++k) {
    const SnRange& m = mats[static_cast<std::size_t>(k)];
    const bool wide = side && side->stream && cs == 16 && m.rows > 0 && m.hi > m.lo &&
                      static_cast<std::int64_t>((m.rows + cs - 1) / cs) * ((m.hi - m.lo) / m.rows) > kClusterTile;
    (wide ? wide_idx : main_idx).push_back(k);
  }
  if (!wide_idx.empty()) {
    const int mc = std::max(u.sn_max_cols, 1), rpc = std::max((u.sn_max_rows + cs - 1) / cs, 1);
    const std::size_t most = cluster_most_shared(cs, mc, rpc);
    const std::int64_t need =
        static_cast<std::int64_t>(u.sn_count + static_cast<int>(wide_idx.size())) * cs + plain_blocks;
    if (static_cast<std::int64_t>(active_clusters(cs, static_cast<unsigned>(need), most)) * cs < need) {
      main_idx.clear();
      for (int k = 0; k < u.sn_count; ++k) main_idx.push_back(k);
      wide_idx.clear();
    }
  }
  const bool split = !wide_idx.empty();
  plan_normed(pl, mats, main_idx, cs);
  const int variant = split ? kUpdateSplit : 0;
  const auto blocks = static_cast<unsigned>(static_cast<std::int64_t>(pl.nsn) * cs + plain_blocks);
  // Each area of shared memory where the grid stays resident at once with it (the C51 step: 176
  // blocks; measured 1.2 µs faster there with staging and gathering, on an H100), not where its
  // plain blocks run in waves (the four heads' 690 blocks: 1-2 µs slower with them). A split
  // update decides by its main launch.
  std::size_t base = cluster_update_shared(pl.max_cols, pl.rpc);
  // the push slots, where they take at most kClusterMaxPush and the grid stays resident with them
  // and the staging area (and, fit, the kept rows): decided below, laid out here
  const std::size_t push_bytes = cluster_push_shared(cs, pl.max_cols);
  pl.push_at = static_cast<int>(base / sizeof(double));
  const auto fits = [&](std::size_t shared) {
    return static_cast<std::int64_t>(active_clusters(cs, blocks, shared, variant)) * cs >= blocks;
  };
  // an area's choice: where the grid stays resident with `shared` bytes a block
  const auto wants = [&](std::size_t shared) { return blocks > 0 && fits(shared); };
  const std::size_t stage_bytes = cluster_stage_shared(pl.rpc), keep_bytes = cluster_keep_shared(pl.rpc, pl.max_cols);
  const bool pushed = push_bytes <= kClusterMaxPush && wants(cluster_most_shared(cs, pl.max_cols, pl.rpc));
  if (pushed) base += push_bytes;
  pl.stage_at = static_cast<int>(base / sizeof(double));
  const bool staged = wants(base + stage_bytes);
  std::size_t shared = base + (staged ? stage_bytes : 0);
  // the kept rows: with the staging area, where they take at most kClusterMaxKeep and the grid
  // stays resident with them
  const bool kept = staged && keep_bytes <= kClusterMaxKeep && wants(shared + keep_bytes);
  if (kept) shared += keep_bytes;
  const bool gathered = !pushed && wants(shared);
  pl.push = pushed;
  pl.stage = staged;
  pl.gather = gathered;
  pl.keepw = kept;
  auto* partial = static_cast<double*>(scratch);
  auto* step = reinterpret_cast<double*>(static_cast<char*>(scratch) + budget_scratch_bytes(b.H));
  pl.step = step;
  pl.clock = clock;
  pl.clock_blocks = clock ? clock_blocks : 0;
  // The side launch: the main launch's choices, its shared memory laid out for its own matrices
  // (u of a block's rows where the staging area would be: a wide block holds no second tile)
  ClusterLaunch wl;
  if (split) {
    ClusterPlan& w = wl.pl;
    w = pl;
    w.nseg = 0;
    w.seg_tile0[0] = 0;
    plan_normed(w, mats, wide_idx, cs);
    std::size_t wb = cluster_update_shared(w.max_cols, w.rpc);
    w.push_at = static_cast<int>(wb / sizeof(double));
    const std::size_t wpush = cluster_push_shared(cs, w.max_cols);
    w.push = pushed && wpush <= kClusterMaxPush;
    w.gather = gathered || (pushed && !w.push);
    if (w.push) wb += wpush;
    w.stage_at = static_cast<int>(wb / sizeof(double));
    if (staged) wb += cluster_stage_u(w.rpc) * sizeof(float);
    const std::size_t wkeep = cluster_keep_shared(w.rpc, w.max_cols);
    w.keepw = kept && wkeep <= kClusterMaxKeep;
    if (w.keepw) wb += wkeep;
    wl.shared = wb;
    wl.blocks = static_cast<unsigned>(w.nsn * cs);
    // the stamps after the main launch's blocks
    const int left = clock ? clock_blocks - static_cast<int>(blocks) : 0;
    w.clock = left > 0 ? clock + static_cast<std::int64_t>(blocks) * 2 * kUpdateClockSlots : nullptr;
    w.clock_blocks = std::max(left, 0);
  }
  int nchunks = 0;
  if (cudaError_t e = budget_partials(s, b, partial, nchunks, &u.adam, step); e != cudaSuccess) return e;
  if (launched) *launched = static_cast<int>(blocks + wl.blocks);
  if (choices) {
    *choices = {staged, gathered, kept, pushed, b.H == 1, {}, pl.nsn, static_cast<int>(blocks)};
    for (int k = 0; k < pl.nsn; ++k) choices->clusters.push_back(pl.sn_of[k]);
    for (int k : wide_idx) choices->clusters.push_back(k);
  }
  if (split) {
    // forked after the partial sums (the event holds the stream's work so far), launched first,
    // joined back after the main launch
    const UpdateKernel wk = update_kernel(cs, kUpdateWide);
    cudaLaunchAttribute wattr[2]{};
    const cudaLaunchConfig_t wcfg =
        cluster_config(cs, wl.blocks, wl.shared, side->stream, wattr, true, update_threads(kUpdateWide));
    if (cudaError_t e = cudaEventRecord(side->fork, s); e != cudaSuccess) return e;
    if (cudaError_t e = cudaStreamWaitEvent(side->stream, side->fork, 0); e != cudaSuccess) return e;
    if (cudaError_t e = cudaLaunchKernelEx(&wcfg, wk, u, static_cast<const double*>(partial), nchunks, wl.pl);
        e != cudaSuccess)
      return e;
    if (cudaError_t e = cudaEventRecord(side->join, side->stream); e != cudaSuccess) return e;
  }
  if (blocks > 0) {
    const UpdateKernel kernel = update_kernel(cs, variant);
    cudaLaunchAttribute attr[2]{};
    const cudaLaunchConfig_t cfg = cluster_config(cs, blocks, shared, s, attr, true);
    if (cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, u, static_cast<const double*>(partial), nchunks, pl);
        e != cudaSuccess)
      return e;
  }
  return split ? cudaStreamWaitEvent(s, side->join, 0) : cudaSuccess;
}

cudaError_t sum_slices(cudaStream_t s, float* c, int m, int n, int ldc, const float* part, int slices) {
  const std::int64_t mn = static_cast<std::int64_t>(m) * n;
  with_index_type(mn, [&](auto i) {
    launch(sum_slices_kernel<decltype(i)>, blocks_for(mn), kThreads, 0, s, c, m, n, ldc, part, slices);
  });
  return cudaGetLastError();
}

cudaError_t fill(cudaStream_t s, float* x, float value, std::int64_t n) {
  launch(fill_kernel, blocks_for(n), kThreads, 0, s, x, value, n);
  return cudaGetLastError();
}

cudaError_t weighted_mean(cudaStream_t s, float* out, const float* x, const float* w, std::int64_t n) {
  // without programmatic serialization: a loss's mean is off the step's path, and its block,
  // placed early, would wait on an SM beside the loss (b35f56d measured the loss start later so)
  weighted_mean_kernel<<<1, kThreads, 0, s>>>(out, x, w, n);
  return cudaGetLastError();
}

cudaError_t axpy(cudaStream_t s, float* y, const float* x, float alpha, std::int64_t n) {
  launch(axpy_kernel, blocks_for(n), kThreads, 0, s, y, x, alpha, n);
  return cudaGetLastError();
}

cudaError_t uniform(cudaStream_t s, const Uniform& a) {
  launch(uniform_kernel, blocks_for(a.n), kThreads, 0, s, a.out.as<float>(), a.n, a.seed, a.stream, a.step);
  return cudaGetLastError();
}

cudaError_t to_bf16(cudaStream_t s, void* dst, const float* src, int rows, int cols, std::int64_t ld,
                    std::int64_t stride, int batch) {
  launch(to_bf16_kernel, blocks_for(static_cast<std::int64_t>(rows) * cols * batch), kThreads, 0, s,
         static_cast<__nv_bfloat16*>(dst), src, rows, cols, ld, stride, batch);
  return cudaGetLastError();
}

cudaError_t scale_matrix(cudaStream_t s, float* c, int rows, int cols, std::int64_t ld, std::int64_t stride,
                         int batch, float beta) {
  launch(scale_matrix_kernel, blocks_for(static_cast<std::int64_t>(rows) * cols * batch), kThreads, 0, s,
         c, rows, cols, ld, stride, batch, beta);
  return cudaGetLastError();
}

}  // namespace dqn::cuda
