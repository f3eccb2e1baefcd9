/** @file head_kernels.cu
 *  @brief The fused head kernels: the dueling distribution (combine, log-softmax, expected Q and
 *  the double-DQN argmax in one pass) and the C51 loss from the target head's outputs to the
 *  dueling gradients. Each reproduces, operation for operation, the unfused kernels it replaces
 *  (same roundings, same fixed summation orders), so it matches the CPU twin as closely as they did.
 */
#include <cmath>

#include "device_util.cuh"
#include "head_kernels.cuh"

namespace dqn::cuda {
namespace {

using dev::warp_max;
using dev::warp_sum;

double support_step(float v_min, float v_max, int Z) {
  return Z > 1 ? (static_cast<double>(v_max) - static_cast<double>(v_min)) / (Z - 1) : 0.0;
}

constexpr int kDistMaxWarps = 16;  // warps per block of the distribution kernel (one per action)

/// One block per (row, branch), one warp per action (actions beyond the warps loop). Shared:
/// the mean advantage of each atom [Z] and the actions' Q [A].
__global__ void dueling_dist_kernel(DuelingDist a, double dz) {
  extern __shared__ double dd_shared[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int D = a.D, A = a.A, Z = a.Z;
  double* mean = dd_shared;                 // [Z]
  float* qs = reinterpret_cast<float*>(dd_shared + Z);  // [A]
  const float* V = static_cast<const float*>(a.v.p);
  const float* ADV = static_cast<const float*>(a.adv.p);
  float* LP = static_cast<float*>(a.logp.p);
  float* Q = static_cast<float*>(a.q.p);
  const double v_min = a.v_min;
  const std::int64_t rd = blockIdx.x;
  const std::int64_t r = rd / D;
  const float* adv = ADV + rd * A * Z;
  const float* v = V + r * a.ldv;
  for (int i = threadIdx.x; i < Z; i += blockDim.x) {
    double s = 0.0;
    for (int act = 0; act < A; ++act) s += static_cast<double>(adv[act * Z + i]);
    mean[i] = s / A;
  }
  __syncthreads();
  for (int act = warp; act < A; act += nwarps) {
    const float* x = adv + act * Z;
    float* lp = LP + (rd * A + act) * Z;
    // logits rounded to float exactly as dueling_combine stores them
    float mx = -INFINITY;
    for (int i = lane; i < Z; i += 32)
      mx = fmaxf(mx, static_cast<float>(static_cast<double>(v[i]) + static_cast<double>(x[i]) - mean[i]));
    mx = warp_max(mx);
    double sum = 0.0;
    for (int i = lane; i < Z; i += 32) {
      const float xi = static_cast<float>(static_cast<double>(v[i]) + static_cast<double>(x[i]) - mean[i]);
      sum += exp(static_cast<double>(xi) - mx);
    }
    sum = warp_sum(sum);
    const double lse = static_cast<double>(mx) + log(sum);
    double qa = 0.0;
    for (int i = lane; i < Z; i += 32) {
      const float xi = static_cast<float>(static_cast<double>(v[i]) + static_cast<double>(x[i]) - mean[i]);
      const float l = static_cast<float>(static_cast<double>(xi) - lse);
      lp[i] = l;
      if (Q) qa += (v_min + i * dz) * exp(static_cast<double>(l));
    }
    if (Q) {
      qa = warp_sum(qa);
      if (lane == 0) {
        const float qf = static_cast<float>(qa);
        Q[rd * A + act] = qf;
        qs[act] = qf;
      }
    }
  }
  if (!a.a_star || r < a.star_from) return;
  __syncthreads();
  if (threadIdx.x == 0) {
    int best = 0;
    for (int act = 1; act < A; ++act)
      if (qs[act] > qs[best]) best = act;  // strict: ties keep the lowest index
    a.a_star[(r - a.star_from) * D + (rd - r * D)] = best;
  }
}

constexpr int kLossMaxWarps = 8;

/// One block per sample, one warp per branch (branches beyond the block's warps loop). Shared:
/// per warp the target probabilities p and projected support tz [Z] each; per branch the taken
/// action's gradient row g [D][Z] and the cross-entropy [D]. The last block reduces the weighted
/// per-sample losses (scratch) in a fixed order.
__global__ void c51_loss_kernel(C51Loss a, double dz, double* weighted, unsigned* counter) {
  extern __shared__ double cl_shared[];
  __shared__ double red[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int b = blockIdx.x, D = a.D, A = a.A, Z = a.Z;
  double* G = cl_shared;                                      // [D][Z]
  double* xent_d = G + static_cast<std::int64_t>(D) * Z;      // [D]
  double* p = xent_d + D + static_cast<std::int64_t>(warp) * 2 * Z;  // [Z] per warp
  double* tz = p + Z;                                         // [Z] per warp
  const float* TV = static_cast<const float*>(a.tv.p);
  const float* TADV = static_cast<const float*>(a.tadv.p);
  const float* LP = static_cast<const float*>(a.logp.p);
  float* M = static_cast<float*>(a.m.p);
  float* DADV = static_cast<float*>(a.dadv.p);
  const double v_min = a.v_min, v_max = a.v_max;
  const float wb = static_cast<const float*>(a.weights.p)[b];
  const double grad_scale = static_cast<double>(wb) / (static_cast<double>(a.B) * D);
  const double discount = static_cast<double>(a.gamma_n) * (1.0 - static_cast<double>(static_cast<const float*>(a.dones.p)[b]));
  const double reward = static_cast<const float*>(a.rewards.p)[b];
  for (int d = warp; d < D; d += nwarps) {
    const int bd = b * D + d;
    const int star = a.a_star[bd], taken = a.actions[bd];
    const bool star_ok = star >= 0 && star < A, taken_ok = taken >= 0 && taken < A;
    float* m = M + static_cast<std::int64_t>(bd) * Z;
    // 1. the target network's log-probabilities at a*, as dueling_combine + log_softmax
    if (star_ok) {
      const float* tadv = TADV + static_cast<std::int64_t>(bd) * A * Z;
      const float* tv = TV + static_cast<std::int64_t>(b) * a.ldtv;
      float mx = -INFINITY;
      for (int i = lane; i < Z; i += 32) {
        double s = 0.0;
        for (int act = 0; act < A; ++act) s += static_cast<double>(tadv[act * Z + i]);
        const double mean = s / A;
        const float x = static_cast<float>(static_cast<double>(tv[i]) + static_cast<double>(tadv[star * Z + i]) - mean);
        p[i] = x;  // the logit, for now
        mx = fmaxf(mx, x);
      }
      mx = warp_max(mx);
      double sum = 0.0;
      for (int i = lane; i < Z; i += 32) sum += exp(p[i] - mx);
      sum = warp_sum(sum);
      const double lse = static_cast<double>(mx) + log(sum);
      for (int i = lane; i < Z; i += 32) {
        const float l = static_cast<float>(p[i] - lse);
        p[i] = exp(static_cast<double>(l));
        tz[i] = fmin(fmax(reward + discount * (v_min + i * dz), v_min), v_max);
      }
    }
    __syncwarp();
    // 2. the dense projection m (as c51_project: each atom sums over j in order)
    for (int i = lane; i < Z; i += 32) {
      float mi = NAN;  // an index the host could not check: visible, never read out of bounds
      if (star_ok) {
        // tz is non-decreasing in j, so the j with a non-zero weight |tz_j − z_i| < Δz form one
        // run: find its start, sum it in order (the zero terms of the dense sum change nothing).
        const double zi = v_min + i * dz;
        int lo = 0, hi = Z;
        while (lo < hi) {
          const int mid = (lo + hi) >> 1;
          if (tz[mid] > zi - dz) hi = mid;
          else lo = mid + 1;
        }
        double acc = 0.0;
        for (int j = lo; j < Z && tz[j] < zi + dz; ++j) acc += fmin(fmax(1.0 - fabs(tz[j] - zi) / dz, 0.0), 1.0) * p[j];
        mi = static_cast<float>(acc);
      }
      m[i] = mi;
    }
    // 3. cross-entropy at the taken action and its gradient row (as c51_xent)
    double xent = NAN;
    if (taken_ok) {
      const float* lp = LP + (static_cast<std::int64_t>(bd) * A + taken) * Z;
      double x = 0.0, m_sum = 0.0;
      for (int i = lane; i < Z; i += 32) {
        x -= static_cast<double>(m[i]) * static_cast<double>(lp[i]);  // m[i]: this lane's own write
        m_sum += static_cast<double>(m[i]);
      }
      xent = warp_sum(x);
      m_sum = warp_sum(m_sum);
      for (int i = lane; i < Z; i += 32) {
        const double pi = exp(static_cast<double>(lp[i]));
        const float g = static_cast<float>(grad_scale * (pi * m_sum - static_cast<double>(m[i])));
        G[static_cast<std::int64_t>(d) * Z + i] = g;
      }
    } else {
      for (int i = lane; i < Z; i += 32) G[static_cast<std::int64_t>(d) * Z + i] = NAN;
    }
    if (lane == 0) xent_d[d] = xent;
    // 4. dueling backward of that dlogits (zero off the taken action): dadv = dl − mean_a dl
    float* dadv = DADV + static_cast<std::int64_t>(bd) * A * Z;
    for (int i = lane; i < Z; i += 32) {
      const double g = G[static_cast<std::int64_t>(d) * Z + i];
      const double mean = g / A;
      const float other = static_cast<float>(0.0 - mean), own = static_cast<float>(g - mean);
      for (int act = 0; act < A; ++act) dadv[act * Z + i] = taken_ok && act != taken ? other : own;
    }
    __syncwarp();  // p and tz are rewritten by the warp's next branch
  }
  __syncthreads();
  // dv[b,:] = Σ_d g[d,:] (branches in order); the sample's loss from the branches in order
  float* dv = static_cast<float*>(a.dv.p) + static_cast<std::int64_t>(b) * a.lddv;
  for (int i = threadIdx.x; i < Z; i += blockDim.x) {
    double total = 0.0;
    for (int d = 0; d < D; ++d) total += G[static_cast<std::int64_t>(d) * Z + i];
    dv[i] = static_cast<float>(total);
  }
  if (threadIdx.x == 0) {
    double sample = 0.0;
    for (int d = 0; d < D; ++d) sample += xent_d[d];
    sample /= D;
    if (a.loss_per_sample.p) static_cast<float*>(a.loss_per_sample.p)[b] = static_cast<float>(sample);
    weighted[b] = static_cast<double>(wb) * sample;
  }
  if (!dev::last_block(counter)) return;
  double acc = 0.0;
  for (int k = threadIdx.x; k < a.B; k += blockDim.x) acc += __ldcg(weighted + k);
  const double total = dev::block_sum(acc, red);
  if (threadIdx.x == 0) static_cast<float*>(a.loss.p)[0] = static_cast<float>(total / a.B);
}

constexpr int kColTile = 32, kRowThreads = 32, kRowUnroll = 4;

/// Grid (column tiles, heads). 32 row-threads each mask and sum a fixed stripe of rows of their
/// column (loads batched kRowUnroll at a time: dy and y never alias), then one thread adds the
/// stripes in order.
__global__ void __launch_bounds__(kColTile * kRowThreads)
    relu_bias_grad_kernel(float* __restrict__ dy, const float* __restrict__ y0, float* __restrict__ db, int rows,
                          int cols, int ld, std::int64_t stride_dy, std::int64_t stride_y, std::int64_t stride_db) {
  __shared__ double part[kRowThreads][kColTile + 1];
  const int c = blockIdx.x * kColTile + threadIdx.x, h = blockIdx.y;
  float* __restrict__ d = dy + h * stride_dy;
  const float* __restrict__ y = y0 ? y0 + h * stride_y : nullptr;
  double acc = 0.0;
  if (c < cols) {
    for (int r0 = threadIdx.y; r0 < rows; r0 += kRowThreads * kRowUnroll) {
      float g[kRowUnroll], m[kRowUnroll];
#pragma unroll
      for (int u = 0; u < kRowUnroll; ++u) {
        const int r = r0 + u * kRowThreads;
        const std::int64_t k = static_cast<std::int64_t>(r) * ld + c;
        g[u] = r < rows ? d[k] : 0.0f;
        m[u] = r < rows && y ? y[k] : 1.0f;
      }
#pragma unroll
      for (int u = 0; u < kRowUnroll; ++u) {
        const int r = r0 + u * kRowThreads;
        if (m[u] <= 0.0f) {
          g[u] = 0.0f;
          if (r < rows) d[static_cast<std::int64_t>(r) * ld + c] = 0.0f;
        }
        acc += static_cast<double>(g[u]);
      }
    }
  }
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    double s = 0.0;
    for (int k = 0; k < kRowThreads; ++k) s += part[k][threadIdx.x];
    db[h * stride_db + c] = static_cast<float>(s);
  }
}

std::size_t round_up(std::size_t x, std::size_t a) { return (x + a - 1) / a * a; }

int loss_warps(int D) { return D < kLossMaxWarps ? (D < 1 ? 1 : D) : kLossMaxWarps; }

}  // namespace

cudaError_t relu_bias_grad(cudaStream_t s, float* dy, const float* y, float* db, int rows, int cols, int ld,
                           int heads, std::int64_t stride_dy, std::int64_t stride_y, std::int64_t stride_db) {
  const dim3 grid((cols + kColTile - 1) / kColTile, heads), block(kColTile, kRowThreads);
  relu_bias_grad_kernel<<<grid, block, 0, s>>>(dy, y, db, rows, cols, ld, stride_dy, stride_y, stride_db);
  return cudaGetLastError();
}

std::size_t dueling_dist_shared_bytes(int Z, int A) {
  return static_cast<std::size_t>(Z) * sizeof(double) + round_up(static_cast<std::size_t>(A) * sizeof(float), 8);
}

cudaError_t dueling_dist(cudaStream_t s, const DuelingDist& a) {
  const std::int64_t blocks = static_cast<std::int64_t>(a.rows) * a.D;
  const int warps = a.A < kDistMaxWarps ? a.A : kDistMaxWarps;
  dueling_dist_kernel<<<static_cast<unsigned>(blocks), 32 * warps, dueling_dist_shared_bytes(a.Z, a.A), s>>>(
      a, support_step(a.v_min, a.v_max, a.Z));
  return cudaGetLastError();
}

std::size_t c51_loss_scratch_bytes(int B) { return round_up(static_cast<std::size_t>(B) * sizeof(double), 256); }

std::size_t c51_loss_shared_bytes(int D, int Z) {
  const std::size_t w = static_cast<std::size_t>(loss_warps(D));
  return (static_cast<std::size_t>(D) * Z + D + w * 2 * Z) * sizeof(double);
}

cudaError_t c51_loss(cudaStream_t s, const C51Loss& a, void* scratch, unsigned* counter) {
  const int warps = loss_warps(a.D);
  c51_loss_kernel<<<a.B, 32 * warps, c51_loss_shared_bytes(a.D, a.Z), s>>>(
      a, support_step(a.v_min, a.v_max, a.Z), static_cast<double*>(scratch), counter);
  return cudaGetLastError();
}

}  // namespace dqn::cuda
