/** @file optim_kernels.cu
 *  @brief The optimiser's ops as separate kernels: the budget's two passes, Adam, the batched
 *  spectral norm and the target update.
 */
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cuda_kernels.cuh"
#include "optim_common.cuh"

namespace dqn::cuda {
namespace {

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

}  // namespace

std::size_t budget_scratch_bytes(int H) {  // the partial sums: at most kBudgetMaxChunks per head
  return round_up(static_cast<std::size_t>(H) * static_cast<std::size_t>(kBudgetMaxChunks) * sizeof(double), 256);
}

// (budget_partial_kernel over chunks × heads)
cudaError_t budget_partials(cudaStream_t s, const Budget& b, double* partial, int& nchunks, const Adam* adam,
                            double* step) {
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

}  // namespace dqn::cuda
