/** @file tile_gemm.cu
 *  @brief A tf32 tensor-core GEMM for the step's small shapes (a few hundred rows and columns),
 *  where a library GEMM spends its time in the latency of its k loop rather than in arithmetic.
 *  Each block owns one BM × BN tile of C and keeps up to S k-slices of its A and B panels in
 *  flight at once (cp.async into shared memory: for k ≤ S·32 the whole panels are requested
 *  before the first multiply), then runs mma.sync m16n8k8 with operands rounded to tf32 (round
 *  to nearest, as cuBLAS's TF32 mode) and f32 accumulation, and applies the Gemm's epilogue
 *  (alpha, beta·C, bias, ReLU, the ReLU-backward mask) in registers. Deterministic: a fixed
 *  summation order per element.
 */
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda_kernels.cuh"
#include "device_util.cuh"

namespace dqn::cuda {
namespace {

using dev::launch;

constexpr int kBK = 32;        // k per pipeline stage
constexpr int kThreads = 128;  // four warps

/// Shared-memory layout of one stage. Each operand keeps its global layout's contiguous dimension
/// contiguous (so it arrives in 16-byte copies): A [BM][kBK] or, transposed, [kBK][BM]; B [kBK][BN]
/// or, transposed, [BN][kBK]. Rows are padded (k-contiguous rows by 4, m/n-contiguous rows by 8)
/// so that the mma fragment loads hit 32 distinct banks.
template <int BM, int BN, bool TA, bool TB>
struct TileShape {
  static constexpr int lda_s = TA ? BM + 8 : kBK + 4;
  static constexpr int ldb_s = TB ? kBK + 4 : BN + 8;
  static constexpr int a_floats = TA ? kBK * lda_s : BM * lda_s;
  static constexpr int stage_floats = a_floats + (TB ? BN * ldb_s : kBK * ldb_s);
};

using dev::cp_async16;
using dev::cp_async4;
using dev::cp_async_commit;
using dev::cp_async_wait;
using dev::to_tf32;
__device__ __forceinline__ void mma_tf32(float (&d)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/// Copies one operand's tile of a stage: `rows` × `cols` in shared memory (row stride ld_s),
/// `cols` the contiguous dimension, from global rows r0.. (row stride ld) and columns c0..,
/// bounded by row_end and col_end (zero-filled beyond). vec: 16-byte copies (ld a multiple of 4
/// and the base 16-byte aligned); else 4-byte ones. NT: the block's threads, which share the copy.
template <int ROWS, int COLS, int NT = kThreads>
__device__ __forceinline__ void copy_tile(float* dst, int ld_s, const float* src, int ld, int r0, int c0, int row_end,
                                          int col_end, bool vec) {
  constexpr int kChunks = ROWS * COLS / 4, kPerThread = (kChunks + NT - 1) / NT;
  static_assert(kChunks % NT == 0 || kChunks < NT, "whole chunks per thread, or at most one");
#pragma unroll
  for (int q = 0; q < kPerThread; ++q) {
    const int c = threadIdx.x + q * NT;
    if (kChunks < NT && c >= kChunks) break;  // (more threads than chunks: the others copy)
    const int r = c / (COLS / 4), col = (c % (COLS / 4)) * 4;
    const int gr = r0 + r, gc = c0 + col;
    float* d = dst + r * ld_s + col;
    const float* p = src + static_cast<std::int64_t>(gr) * ld + gc;
    if (vec) {
      const int left = gr < row_end ? col_end - gc : 0;
      const int bytes = left >= 4 ? 16 : left > 0 ? 4 * left : 0;
      cp_async16(d, bytes > 0 ? p : src, bytes);
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const bool ok = gr < row_end && gc + e < col_end;
        cp_async4(d + e, ok ? p + e : src, ok);
      }
    }
  }
}

/// Copies rows [0, rows) × columns [0, 4·chunks) of a row-major matrix at src (row stride ld) into
/// shared memory at dst(r, col) (col a multiple of 4, whose 4 floats stay consecutive), reading
/// only rows < valid_rows and columns < valid_cols and zero-filling the rest; 16-byte copies where
/// vec (src and ld 16-byte aligned), else 4-byte ones. (copy_tile's, for runtime widths and
/// destinations of the caller's layout.)
template <class Dst>
__device__ __forceinline__ void copy_rows_async(Dst dst, const float* src, int ld, int rows, int chunks, int valid_rows,
                                                int valid_cols, bool vec) {
  for (int q = threadIdx.x; q < rows * chunks; q += kThreads) {
    const int r = q / chunks, col = (q - r * chunks) * 4;
    float* d = dst(r, col);
    const float* p = src + static_cast<std::int64_t>(r) * ld + col;
    if (vec) {
      const int left = r < valid_rows ? valid_cols - col : 0;
      const int bytes = left >= 4 ? 16 : left > 0 ? 4 * left : 0;
      cp_async16(d, bytes > 0 ? p : src, bytes);
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const bool ok = r < valid_rows && col + e < valid_cols;
        cp_async4(d + e, ok ? p + e : src, ok);
      }
    }
  }
}

/// ldmatrix (four 8 × 8 matrices of 16-bit elements, read as 8 rows of four 32-bit words each):
/// lane l gives the address of row l % 8 of matrix l / 8 (16 bytes, 16-byte aligned) and gets
/// word l % 4 of row l / 4 of each matrix in r[0..3]. For a tile stored with k contiguous, that
/// is an mma.m16n8k8 tf32 fragment: the same words as four separate shared loads, one
/// instruction. (x2: two matrices, addresses from lanes 0..15.)
__device__ __forceinline__ void ldsm_x4(std::uint32_t (&r)[4], const float* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(dev::smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x2(std::uint32_t (&r)[2], const float* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(dev::smem_addr(p)));
}
__device__ __forceinline__ std::uint32_t tf32_bits(std::uint32_t w) { return to_tf32(__uint_as_float(w)); }

/// The k loop of a BM × BN tile of C at (m0, n0): acc += op(A) op(B) over the whole k, warp
/// tile WM × WN (four warps; KS > 1: KS groups of four, group q taking the k8 steps q, q + KS, …
/// of each stage into its own acc, which the caller adds), S stages of kBK in flight in `smem`;
/// rows of A at or past m and columns of B at or past n read as zeros. Returns with no copy in
/// flight (the caller's own cp.async groups, committed before, included) and with the stage
/// buffers possibly still being read by other warps (a barrier must come before `smem` is written
/// again). TA/TB: A is stored [k, m] / B is stored [n, k] (the Gemm's ta/tb). LDM: the fragments
/// of A (not transposed) and B (transposed) by ldmatrix (the same values).
template <int BM, int BN, int WM, int WN, int S, bool TA, bool TB, bool LDM = false, int KS = 1>
__device__ __forceinline__ void tile_mainloop(float (&acc)[WM / 16][WN / 8][4], float* smem, const float* A, int lda,
                                              const float* B, int ldb, int m0, int n0, int m, int n, int k,
                                              bool vec_a, bool vec_b) {
  static_assert((BM / WM) * (BN / WN) == kThreads / 32, "four warp tiles per block tile");
  static_assert(WM % 16 == 0 && WN % 8 == 0, "whole mma tiles per warp");
  static_assert(KS == 1 || KS == 2 || KS == 4, "the k split divides a stage's four k8 steps");
  using Shape = TileShape<BM, BN, TA, TB>;
  constexpr int MT = WM / 16, NT = WN / 8, LA = Shape::lda_s, LB = Shape::ldb_s, NTH = kThreads * KS;
  // the warp's tile of C (KS > 1: the same four tiles in every k group) and its k group
  const int lane = threadIdx.x & 31, warp = KS > 1 ? (threadIdx.x >> 5) & 3 : threadIdx.x >> 5;
  [[maybe_unused]] const int kg = static_cast<int>(threadIdx.x) / kThreads;
  const int KT = (k + kBK - 1) / kBK;

  auto load_stage = [&](int kt, int slot) {
    float* As = smem + slot * Shape::stage_floats;
    float* Bs = As + Shape::a_floats;
    const int k0 = kt * kBK;
    if constexpr (TA) copy_tile<kBK, BM, NTH>(As, LA, A, lda, k0, m0, k, m, vec_a);
    else copy_tile<BM, kBK, NTH>(As, LA, A, lda, m0, k0, m, k, vec_a);
    if constexpr (TB) copy_tile<BN, kBK, NTH>(Bs, LB, B, ldb, n0, k0, n, k, vec_b);
    else copy_tile<kBK, BN, NTH>(Bs, LB, B, ldb, k0, n0, k, n, vec_b);
  };

  const int wm = warp / (BN / WN), wn = warp % (BN / WN);
  const int gq = lane >> 2, tq = lane & 3;  // the mma fragment's group and thread-in-group
  // LDM: the fragments of an operand stored with k contiguous (A not transposed, B transposed) by
  // ldmatrix. The lane's row address within a stage, for k8 = 0 and the warp's first mma tile:
  // A's matrices 0..3 are rows +0 / +8 at k +0, then rows +0 / +8 at k +4 (a0..a3); B's are the
  // n-tile's rows at k +0 and +4 (b0, b1), then the next n-tile's (x4: two n-tiles a load).
  constexpr bool kLdmA = LDM && !TA, kLdmB = LDM && TB;
  [[maybe_unused]] const int a_lane = (wm * WM + (lane & 7) + ((lane >> 3) & 1) * 8) * LA + (lane >> 4) * 4;
  [[maybe_unused]] const int b_lane =
      (wn * WN + ((lane >> 4) & (NT > 1 ? 1 : 0)) * 8 + (lane & 7)) * LB + ((lane >> 3) & 1) * 4;

  for (int s = 0; s < S - 1; ++s) {
    if (s < KT) load_stage(s, s);
    cp_async_commit();  // empty groups keep the count uniform
  }
  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<S - 2>();
    __syncthreads();  // stage kt is visible to all; every warp is done with the slot reloaded below
    if (kt + S - 1 < KT) load_stage(kt + S - 1, (kt + S - 1) % S);
    cp_async_commit();
    const float* As = smem + (kt % S) * Shape::stage_floats;
    const float* Bs = As + Shape::a_floats;
#pragma unroll
    for (int k8 = 0; k8 < kBK; k8 += 8) {
      if (KS > 1 && (k8 / 8) % KS != kg) continue;  // (warp-uniform) another k group's step
      std::uint32_t af[MT][4], bf[NT][2];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        if constexpr (kLdmA) {
          ldsm_x4(af[mt], As + a_lane + mt * 16 * LA + k8);
#pragma unroll
          for (int q = 0; q < 4; ++q) af[mt][q] = tf32_bits(af[mt][q]);
        } else if constexpr (TA) {
          const int r = wm * WM + mt * 16 + gq;
          const float* p = As + (k8 + tq) * LA + r;
          af[mt][0] = to_tf32(p[0]);
          af[mt][1] = to_tf32(p[8]);
          af[mt][2] = to_tf32(p[4 * LA]);
          af[mt][3] = to_tf32(p[4 * LA + 8]);
        } else {
          const int r = wm * WM + mt * 16 + gq;
          const float* p = As + r * LA + k8 + tq;
          af[mt][0] = to_tf32(p[0]);
          af[mt][1] = to_tf32(p[8 * LA]);
          af[mt][2] = to_tf32(p[4]);
          af[mt][3] = to_tf32(p[8 * LA + 4]);
        }
      }
      if constexpr (kLdmB) {
#pragma unroll
        for (int nt = 0; nt + 1 < NT; nt += 2) {
          std::uint32_t w[4];
          ldsm_x4(w, Bs + b_lane + nt * 8 * LB + k8);
          bf[nt][0] = tf32_bits(w[0]);
          bf[nt][1] = tf32_bits(w[1]);
          bf[nt + 1][0] = tf32_bits(w[2]);
          bf[nt + 1][1] = tf32_bits(w[3]);
        }
        if constexpr (NT % 2 != 0) {
          std::uint32_t w[2];
          ldsm_x2(w, Bs + b_lane + (NT - 1) * 8 * LB + k8);
          bf[NT - 1][0] = tf32_bits(w[0]);
          bf[NT - 1][1] = tf32_bits(w[1]);
        }
      } else {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const int c = wn * WN + nt * 8 + gq;
          if constexpr (TB) {
            const float* p = Bs + c * LB + k8 + tq;
            bf[nt][0] = to_tf32(p[0]);
            bf[nt][1] = to_tf32(p[4]);
          } else {
            const float* p = Bs + (k8 + tq) * LB + c;
            bf[nt][0] = to_tf32(p[0]);
            bf[nt][1] = to_tf32(p[4 * LB]);
          }
        }
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) mma_tf32(acc[mt][nt], af[mt], bf[nt]);
    }
  }
  cp_async_wait<0>();  // no copy may still target shared memory when the block moves on or exits
}

/// Block tile BM × BN, warp tile WM × WN (four warps), S stages of kBK along k. TA/TB: A is
/// stored [k, m] / B is stored [n, k] (the Gemm's ta/tb). LDM: the k-contiguous operands'
/// fragments by ldmatrix (TileGemm::ldmatrix; the same bits). KS > 1: KS groups of four warps,
/// group q taking the k8 steps q, q + KS, … of every stage into an accumulator of its own (a
/// KS-th of each warp's chain of multiplies); the groups' sums are added in group order through
/// shared memory and group 0 runs the epilogue. Deterministic; not the bits of KS = 1.
template <int BM, int BN, int WM, int WN, int S, bool TA, bool TB, bool LDM, int KS = 1>
__global__ void __launch_bounds__(kThreads * KS) tile_gemm_kernel(TileGemm g, bool vec_a, bool vec_b) {
  dev::pdl_entry();
  constexpr int MT = WM / 16, NT = WN / 8;
  extern __shared__ __align__(16) float tg_shared[];
  const int lane = threadIdx.x & 31, warp = KS > 1 ? (threadIdx.x >> 5) & 3 : threadIdx.x >> 5;
  [[maybe_unused]] const int kg = static_cast<int>(threadIdx.x) / kThreads;  // KS > 1: the k group
  const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
  const int z = static_cast<int>(blockIdx.z) / g.batch2, z2 = static_cast<int>(blockIdx.z) - z * g.batch2;
  const float* A = g.a + z * g.stride_a + z2 * g.stride2_a;
  const float* B = g.b + z * g.stride_b + z2 * g.stride2_b;
  const int m = g.m, n = g.n;
  float acc[MT][NT][4] = {};
  const int wm = warp / (BN / WN), wn = warp % (BN / WN);
  const int gq = lane >> 2, tq = lane & 3;
  float* C = g.c + z * g.stride_c + z2 * g.stride2_c;
  const float* Cin = g.c_in + z * g.stride_c + z2 * g.stride2_c;
  const float* bias = g.bias ? g.bias + z * g.stride_bias + z2 * g.stride2_bias : nullptr;
  const float* mask = g.mask ? g.mask + z * g.stride_mask + z2 * g.stride2_mask : nullptr;  // then the ReLU backward
  // The fragment's element (mt, h, nt, e): row r(mt, h) (rows gq and gq + 8), column c(nt, e).
  const auto row = [&](int mt, int h) { return m0 + wm * WM + mt * 16 + gq + h * 8; };
  const auto col = [&](int nt, int e) { return n0 + wn * WN + nt * 8 + 2 * tq + e; };
  tile_mainloop<BM, BN, WM, WN, S, TA, TB, LDM, KS>(acc, tg_shared, A, g.lda, B, g.ldb, m0, n0, m, n, g.k, vec_a,
                                                    vec_b);
  if constexpr (KS > 1) {
    // the groups' sums into group 0's accumulators, groups in order: group q > 0 stores its own
    // in the (finished) stage buffers, a lane's values side by side per warp tile
    constexpr int kAcc = MT * NT * 4;
    static_assert((KS - 1) * 4 * 32 * kAcc <= S * TileShape<BM, BN, TA, TB>::stage_floats, "room in the stages");
    __syncthreads();  // every warp is done reading the stages
    if (kg > 0) {
      float* red = tg_shared + ((kg - 1) * 4 + warp) * 32 * kAcc + lane;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int q = 0; q < 4; ++q) red[((mt * NT + nt) * 4 + q) * 32] = acc[mt][nt][q];
    }
    __syncthreads();
    if (kg > 0) return;  // (no barrier follows)
#pragma unroll
    for (int gq2 = 1; gq2 < KS; ++gq2) {
      const float* other = tg_shared + ((gq2 - 1) * 4 + warp) * 32 * kAcc + lane;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int q = 0; q < 4; ++q) acc[mt][nt][q] += other[((mt * NT + nt) * 4 + q) * 32];
    }
  }

  // Epilogue: C = act(alpha·AB + beta·C + bias), C read only when beta != 0 (as bias_act after
  // the GEMM: the bias is added to the rounded alpha·AB + beta·C).
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // the fragment's rows gq and gq + 8
      const int r = row(mt, h);
      if (r >= m) continue;
      // the mask's row: one modulo per row, not per element
      const float* mrow = mask ? mask + static_cast<std::int64_t>(r % g.mask_rows) * g.ldmask : nullptr;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int q = 2 * h + e;
          const int c = col(nt, e);
          if (c >= n) continue;
          const std::int64_t at = static_cast<std::int64_t>(r) * g.ldc + c;
          float v = g.alpha * acc[mt][nt][q];
          if (g.beta != 0.0f) v += g.beta * Cin[at];
          if (bias) v += bias[c];
          if (g.relu) v = v > 0.0f ? v : 0.0f;
          if (mask && mrow[c] <= 0.0f) v = 0.0f;
          C[at] = v;
        }
    }
}

// --- the GEMM that also gives the layer below's weight gradients (Gemm::wgrad_x) -------------

constexpr int kWgBM = 32, kWgBN = 32, kWgWM = 16, kWgWN = 16, kWgStages = 8;  // tile_gemm's 32x32
constexpr int kWgMaxX = 256;           // x columns the shared memory holds
constexpr int kWgMaxCluster = 8;       // a group's row-tile blocks per cluster (the portable size)
constexpr int kWgMaxTilesPerBlock = 4;  // beyond, the separate GEMMs (a block's tiles run in turn)
constexpr int kWgChunk = 64;           // x columns per pass of the second product
using WgShape = TileShape<kWgBM, kWgBN, false, false>;

/// x columns rounded up to whole mma tiles.
__host__ __device__ inline int wg_xp(int x_cols) { return (x_cols + 7) / 8 * 8; }
/// Dynamic shared memory: the k loop's stages, Xs [BM][xp + 8] (the tile's rows of x), Cs [BM][BN
/// + 8] (the masked tile of C), Ps [BN][xp + 4] (this block's Σ Cᵀx), dbs [BN] (doubles).
__host__ __device__ inline std::size_t wg_shared_bytes(int x_cols) {
  const int xp = wg_xp(x_cols);
  const std::size_t floats = std::size_t{kWgStages} * WgShape::stage_floats + std::size_t{kWgBM} * (xp + 8) +
                             std::size_t{kWgBM} * (kWgBN + 8) + std::size_t{kWgBN} * (xp + 4);
  return floats * 4 + std::size_t{kWgBN} * 8;
}
/// Blocks per cluster for groups of `rows` rows: a power of two (dividing BN) up to the row tiles.
int wg_cluster(int rows) {
  const int tiles = (rows + kWgBM - 1) / kWgBM;
  int c = 1;
  while (c * 2 <= tiles && c * 2 <= kWgMaxCluster) c *= 2;
  return c;
}

/// Grid (groups × cluster, column tiles of C); a cluster per (group, column tile), its block of
/// rank q taking the group's row tiles q, q + cluster, … For each: the tile of C = alpha·A·B (k
/// loop as tile_gemm, the tile's rows of x copied beside it), masked and stored; its masked
/// values into Cs; their column sums into dbs and Csᵀ·Xs into Ps (tf32 mma, f32 accumulation).
/// Then the cluster adds its blocks' Ps and dbs in rank order (in double), each block a slice of
/// the rows of dw and db.
__global__ void __launch_bounds__(kThreads) tile_gemm_wgrad_kernel(TileGemm g, TileWgrad w, bool vec_a, bool vec_b,
                                                                   bool vec_x) {
  dev::pdl_entry();
  namespace cg = cooperative_groups;
  constexpr int BM = kWgBM, BN = kWgBN, WM = kWgWM, WN = kWgWN, MT = WM / 16, NT = WN / 8, LC = BN + 8;
  extern __shared__ __align__(16) float tg_shared[];
  cg::cluster_group cluster = cg::this_cluster();
  const int cr = static_cast<int>(cluster.num_blocks()), rank = static_cast<int>(cluster.block_rank());
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gq = lane >> 2, tq = lane & 3;
  const int xp = wg_xp(w.x_cols), lx = xp + 8, lp = xp + 4;
  float* Xs = tg_shared + kWgStages * WgShape::stage_floats;
  float* Cs = Xs + BM * lx;
  float* Ps = Cs + BM * LC;
  double* dbs = reinterpret_cast<double*>(Ps + BN * lp);
  const int group = static_cast<int>(blockIdx.x) / cr, n0 = static_cast<int>(blockIdx.y) * BN;
  const int row_lo = group * w.rows, row_hi = row_lo + w.rows, tiles = (w.rows + BM - 1) / BM;
  for (int i = threadIdx.x; i < BN * lp; i += kThreads) Ps[i] = 0.0f;  // the k loop's first barrier orders these
  if (threadIdx.x < BN) dbs[threadIdx.x] = 0.0;
  const int wm = warp / (BN / WN), wn = warp % (BN / WN), pm = warp >> 1, pn = warp & 1;
  for (int t = rank; t < tiles; t += cr) {
    const int m0 = row_lo + t * BM, xr0 = t * BM, xrows = min(BM, w.rows - xr0);
    // the tile's rows of x (zeros past the group's rows and past x_cols), in flight with the k loop
    copy_rows_async([&](int r, int c) { return Xs + r * lx + c; }, w.x + static_cast<std::int64_t>(xr0) * w.ldx, w.ldx,
                    BM, xp / 4, xrows, w.x_cols, vec_x);
    cp_async_commit();
    float acc[MT][NT][4] = {};
    tile_mainloop<BM, BN, WM, WN, kWgStages, false, false>(acc, tg_shared, g.a, g.lda, g.b, g.ldb, m0, n0, row_hi, g.n,
                                                           g.k, vec_a, vec_b);
    // C (as tile_gemm's epilogue with beta 0, no bias: alpha, then the mask) and its tile in Cs
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int rl = wm * WM + mt * 16 + gq + h * 8, r = m0 + rl;
        const bool row_ok = r < row_hi;
        const float* mrow = g.mask && row_ok ? g.mask + static_cast<std::int64_t>(r % g.mask_rows) * g.ldmask : nullptr;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int cl = wn * WN + nt * 8 + 2 * tq + e, c = n0 + cl;
            float v = 0.0f;
            if (row_ok && c < g.n) {
              v = g.alpha * acc[mt][nt][2 * h + e];
              if (mrow && mrow[c] <= 0.0f) v = 0.0f;
              g.c[static_cast<std::int64_t>(r) * g.ldc + c] = v;
            }
            Cs[rl * LC + cl] = v;
          }
      }
    __syncthreads();  // Cs and Xs complete (each thread's copies were waited for in the k loop)
    if (w.db && threadIdx.x < BN) {
      double s = 0.0;
      for (int r = 0; r < BM; ++r) s += static_cast<double>(Cs[r * LC + threadIdx.x]);
      dbs[threadIdx.x] += s;
    }
    // Ps += Csᵀ · Xs: rows of P are C's columns, k the tile's rows; warps 2 × 2 over a chunk of
    // 64 columns of x (warp tile 16 × 32)
    for (int x0 = 0; x0 < xp; x0 += kWgChunk) {
      const int cbase = x0 + pn * 32;
      float pacc[4][4] = {};
#pragma unroll
      for (int k8 = 0; k8 < BM; k8 += 8) {
        std::uint32_t af[4];
        const float* pa = Cs + (k8 + tq) * LC + pm * 16 + gq;
        af[0] = to_tf32(pa[0]);
        af[1] = to_tf32(pa[8]);
        af[2] = to_tf32(pa[4 * LC]);
        af[3] = to_tf32(pa[4 * LC + 8]);
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          if (cbase + nt * 8 >= xp) break;  // the same in the whole warp
          const float* pb = Xs + (k8 + tq) * lx + cbase + nt * 8 + gq;
          const std::uint32_t bf[2] = {to_tf32(pb[0]), to_tf32(pb[4 * lx])};
          mma_tf32(pacc[nt], af, bf);
        }
      }
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        if (cbase + nt * 8 >= xp) break;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float* pr = Ps + (pm * 16 + gq + h * 8) * lp + cbase + nt * 8 + 2 * tq;
          pr[0] += pacc[nt][2 * h];
          pr[1] += pacc[nt][2 * h + 1];
        }
      }
    }
    __syncthreads();  // Xs, Cs and the stages are free for the next tile
  }
  cluster.sync();  // every block's Ps and dbs complete, and visible to the cluster
  const int rpq = BN / cr, r0 = rank * rpq;  // the rows of dw (columns of C) this block adds up
  float* dw = w.dw + static_cast<std::int64_t>(group) * w.stride_dw;
  for (int e = threadIdx.x; e < rpq * w.x_cols; e += kThreads) {
    const int rr = e / w.x_cols, r = r0 + rr, c = e - rr * w.x_cols;
    if (n0 + r >= g.n) continue;
    double s = 0.0;
    for (int q = 0; q < cr; ++q) s += static_cast<double>(cluster.map_shared_rank(Ps, q)[r * lp + c]);
    dw[static_cast<std::int64_t>(n0 + r) * w.lddw + c] = static_cast<float>(s);
  }
  if (w.db && threadIdx.x < rpq && n0 + r0 + static_cast<int>(threadIdx.x) < g.n) {
    double s = 0.0;
    for (int q = 0; q < cr; ++q) s += cluster.map_shared_rank(dbs, q)[r0 + threadIdx.x];
    w.db[static_cast<std::int64_t>(group) * w.stride_db + n0 + r0 + threadIdx.x] = static_cast<float>(s);
  }
  cluster.sync();  // no block leaves while another may still read its shared memory
}

// --- two layers in one launch (Gemm::chain_b) ------------------------------------------------

// Two variants by the first product's width n1: up to 256 columns (warp tiles 32 × 64) with two
// stages of 32 in flight (the whole k when it is the states' 64: a trunk's first layers), and up
// to 128 (warp tiles 32 × 32) with four (k = 256: a head's hidden layer, a stream at a time). The
// block's weight slice of the second layer is one more copy group in flight beside them.
constexpr int kChBM = 32, kChBN = 32;
template <int N1, int STAGES>
struct ChainCfg {
  static constexpr int n1 = N1, stages = STAGES, wn1 = N1 / 4, ld = N1 + 4;  // C1s rows: + 4 for the banks
  using Shape = TileShape<kChBM, N1, false, true>;
  static_assert(STAGES * Shape::stage_floats >= kChBM * ld, "C1s reuses the first product's stages");
  static constexpr std::size_t bytes = (std::size_t{STAGES} * Shape::stage_floats + std::size_t{kChBN} * N1) * sizeof(float);
};
using ChainWide = ChainCfg<256, 2>;    // 113 KiB: two blocks an SM
using ChainNarrow = ChainCfg<128, 4>;  // 106 KiB: two blocks an SM
/// B2s [BN][N1] unpadded (so that two blocks fit an SM), its columns swizzled instead: element
/// (r, k) at column k ^ ((r & 7) << 2), which keeps 4-float chunks whole and puts a fragment's 8
/// rows × 4 columns on 32 distinct banks.
__device__ __forceinline__ int ch_swz(int r, int k) { return k ^ ((r & 7) << 2); }

/// Grid (row tiles of 32, column tiles of 32 of C2, batch entries). The block's rows of B2 (k =
/// C's n columns) are copied first, in flight during the first product: its 32 rows of C, all n ≤
/// N1 columns (tile_mainloop, four warps side by side), with tile_gemm's epilogue (alpha, bias,
/// ReLU) into C1s (over the first product's stages, done with by then) and, from the blocks of the
/// first column tile, into C; then its tile of C2 from C1s and B2s (warps 2 × 2 of 16 × 16, k in
/// order) with bias2 and ReLU. Entry z reads and writes every operand at its stride's z-th step.
template <class Cfg>
__global__ void __launch_bounds__(kThreads) tile_gemm_chain_kernel(TileGemm g, TileChain c, bool vec_a, bool vec_b,
                                                                   bool vec_b2) {
  dev::pdl_entry();
  constexpr int BM = kChBM, N1 = Cfg::n1, WN1 = Cfg::wn1, BN = kChBN, LC = Cfg::ld;
  extern __shared__ __align__(16) float tg_shared[];
  float* C1s = tg_shared;                                                // [BM][LC], after the first product
  float* B2s = tg_shared + Cfg::stages * Cfg::Shape::stage_floats;       // [BN][N1], ch_swz columns
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gq = lane >> 2, tq = lane & 3;
  const int m0 = static_cast<int>(blockIdx.x) * BM, n0 = static_cast<int>(blockIdx.y) * BN, n1 = g.n;
  const std::int64_t z = blockIdx.z;
  const float* A = g.a + z * g.stride_a;
  const float* B = g.b + z * g.stride_b;
  const float* bias = g.bias ? g.bias + z * g.stride_bias : nullptr;
  float* C = g.c + z * g.stride_c;
  const float* B2 = c.b2 + z * c.stride_b2;
  const float* bias2 = c.bias2 ? c.bias2 + z * c.stride_bias2 : nullptr;
  float* C2 = c.c2 + z * c.stride_c2;
  // B2's rows n0.. (zeros past n2 and past n1), in flight with the first product; a 4-float chunk
  // stays whole under the swizzle (it moves bits 2..4 of the column)
  copy_rows_async([&](int r, int col) { return B2s + r * N1 + ch_swz(r, col); },
                  B2 + static_cast<std::int64_t>(n0) * c.ldb2, c.ldb2, BN, N1 / 4, c.n2 - n0, n1, vec_b2);
  cp_async_commit();
  // 1. the block's rows of C, every column (warp w: columns WN1·w ..)
  float acc[2][WN1 / 8][4] = {};
  tile_mainloop<BM, N1, 32, WN1, Cfg::stages, false, true>(acc, tg_shared, A, g.lda, B, g.ldb, m0, 0, g.m, n1, g.k,
                                                           vec_a, vec_b);
  __syncthreads();  // every warp is done with the stages C1s overwrites
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int rl = mt * 16 + gq + h * 8, r = m0 + rl;
#pragma unroll
      for (int nt = 0; nt < WN1 / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = warp * WN1 + nt * 8 + 2 * tq + e;
          float v = 0.0f;
          if (r < g.m && col < n1) {  // tile_gemm's epilogue with beta 0 and no mask
            v = g.alpha * acc[mt][nt][2 * h + e];
            if (bias) v += bias[col];
            if (g.relu) v = v > 0.0f ? v : 0.0f;
            if (blockIdx.y == 0) C[static_cast<std::int64_t>(r) * g.ldc + col] = v;
          }
          C1s[rl * LC + col] = v;
        }
    }
  __syncthreads();  // C1s complete; B2s landed (the k loop waited for every copy group)
  // 2. the block's tile of C2 = C1s · B2sᵀ over k = n1 in order
  const int wm = warp >> 1, wn = warp & 1, n1p = (n1 + 7) / 8 * 8;
  float acc2[2][4] = {};
  for (int k8 = 0; k8 < n1p; k8 += 8) {
    const float* pa = C1s + (wm * 16 + gq) * LC + k8 + tq;
    const std::uint32_t af[4] = {to_tf32(pa[0]), to_tf32(pa[8 * LC]), to_tf32(pa[4]), to_tf32(pa[8 * LC + 4])};
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const int r = wn * 16 + nt * 8 + gq;
      const float* pb = B2s + r * N1;
      const std::uint32_t bf[2] = {to_tf32(pb[ch_swz(r, k8 + tq)]), to_tf32(pb[ch_swz(r, k8 + tq + 4)])};
      mma_tf32(acc2[nt], af, bf);
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = m0 + wm * 16 + gq + h * 8;
    if (r >= g.m) continue;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = n0 + wn * 16 + nt * 8 + 2 * tq + e;
        if (col >= c.n2) continue;
        float v = acc2[nt][2 * h + e];
        if (bias2) v += bias2[col];
        if (c.relu2) v = v > 0.0f ? v : 0.0f;
        C2[static_cast<std::int64_t>(r) * c.ldc2 + col] = v;
      }
  }
}

/// The tile shapes: block tile, warp tile (four warp tiles), stages in flight, k groups (KS), name.
struct Config {
  int bm, bn, wm, wn, stages, ks;
  const char* name;
};
constexpr Config kConfigs[kTileGemmConfigs] = {{16, 32, 16, 8, 8, 1, "16x32"},
                                               {32, 32, 16, 16, 8, 1, "32x32"},
                                               {64, 64, 32, 32, 6, 1, "64x64"},
                                               {32, 32, 16, 16, 8, 2, "32x32k2"},
                                               {32, 32, 16, 16, 8, 4, "32x32k4"}};

/// The kernel of shape C on layout (TA, TB), with ldmatrix where LDM and the layout has a
/// k-contiguous operand (A not transposed or B transposed; else the same kernel without).
template <int C, bool TA, bool TB, bool LDM>
struct Kernel {
  static constexpr Config c = kConfigs[C];
  static constexpr int bytes = c.stages * TileShape<c.bm, c.bn, TA, TB>::stage_floats * 4;
  static constexpr auto fn =
      tile_gemm_kernel<c.bm, c.bn, c.wm, c.wn, c.stages, TA, TB, LDM && tile_gemm_ldmatrix_layout(TA, TB), c.ks>;
};

template <int C, bool TA, bool TB, bool LDM>
cudaError_t prepare_one() {
  using K = Kernel<C, TA, TB, LDM>;
  return cudaFuncSetAttribute(K::fn, cudaFuncAttributeMaxDynamicSharedMemorySize, K::bytes);
}
template <int C, bool LDM>
cudaError_t prepare_layouts() {
  for (cudaError_t e : {prepare_one<C, false, false, LDM>(), prepare_one<C, false, true, LDM>(),
                        prepare_one<C, true, false, LDM>(), prepare_one<C, true, true, LDM>()})
    if (e != cudaSuccess) return e;
  return cudaSuccess;
}
template <int C>
cudaError_t prepare_config() {
  // (with LDM, the layout without a k-contiguous operand is the same kernel: Kernel folds it)
  for (cudaError_t e : {prepare_layouts<C, false>(), prepare_layouts<C, true>()})
    if (e != cudaSuccess) return e;
  return cudaSuccess;
}

template <int C, bool TA, bool TB, bool LDM>
cudaError_t launch_one(cudaStream_t s, const TileGemm& g) {
  const dim3 grid((g.m + kConfigs[C].bm - 1) / kConfigs[C].bm, (g.n + kConfigs[C].bn - 1) / kConfigs[C].bn,
                  g.batch * g.batch2);
  // 16-byte copies where the operand's rows (and batch entries) start on 16-byte boundaries
  const auto aligned = [](const float* p, int ld, std::int64_t stride, std::int64_t stride2) {
    return dev::aligned16(p) && ld % 4 == 0 && stride % 4 == 0 && stride2 % 4 == 0;
  };
  using K = Kernel<C, TA, TB, LDM>;
  launch(K::fn, grid, kThreads * kConfigs[C].ks, K::bytes, s, g, aligned(g.a, g.lda, g.stride_a, g.stride2_a),
         aligned(g.b, g.ldb, g.stride_b, g.stride2_b));
  return cudaGetLastError();
}
template <int C, bool LDM>
cudaError_t launch_layout(cudaStream_t s, const TileGemm& g) {
  if (g.ta) return g.tb ? launch_one<C, true, true, LDM>(s, g) : launch_one<C, true, false, LDM>(s, g);
  return g.tb ? launch_one<C, false, true, LDM>(s, g) : launch_one<C, false, false, LDM>(s, g);
}
template <int C>
cudaError_t launch_config(cudaStream_t s, const TileGemm& g) {
  return g.ldmatrix ? launch_layout<C, true>(s, g) : launch_layout<C, false>(s, g);
}

}  // namespace

const char* tile_gemm_name(int config) {
  return config >= 0 && config < kTileGemmConfigs ? kConfigs[config].name : "?";
}

bool tile_gemm_fits(const TileGemm& g, int config) {
  if (config < 0 || config >= kTileGemmConfigs) return false;
  const long long ny = (g.n + kConfigs[config].bn - 1) / kConfigs[config].bn;
  return g.m > 0 && g.n > 0 && g.k > 0 && g.batch >= 1 && g.batch2 >= 1 &&
         static_cast<long long>(g.batch) * g.batch2 <= 65535 && ny <= 65535;
}

cudaError_t tile_gemm_prepare() {
  for (cudaError_t e :
       {prepare_config<0>(), prepare_config<1>(), prepare_config<2>(), prepare_config<3>(), prepare_config<4>()})
    if (e != cudaSuccess) return e;
  return cudaSuccess;
}

cudaError_t tile_gemm(cudaStream_t s, const TileGemm& g, int config) {
  if (!tile_gemm_fits(g, config)) return cudaErrorInvalidValue;
  switch (config) {
    case 0: return launch_config<0>(s, g);
    case 1: return launch_config<1>(s, g);
    case 2: return launch_config<2>(s, g);
    case 3: return launch_config<3>(s, g);
    default: return launch_config<4>(s, g);
  }
}

cudaError_t tile_gemm_wgrad_prepare() {
  int dev = 0, ok = 0;
  if (cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
  if (cudaError_t e = cudaDeviceGetAttribute(&ok, cudaDevAttrClusterLaunch, dev); e != cudaSuccess) return e;
  if (!ok) return cudaErrorNotSupported;
  return cudaFuncSetAttribute(tile_gemm_wgrad_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(wg_shared_bytes(kWgMaxX)));
}

bool tile_gemm_wgrad_fits(const TileGemm& g, const TileWgrad& w) {
  if (g.ta || g.tb || g.relu || g.bias || g.beta != 0.0f || g.batch != 1 || g.batch2 != 1) return false;
  if (g.m <= 0 || g.n <= 0 || g.k <= 0 || w.rows <= 0 || g.m % w.rows != 0 || !w.x || !w.dw) return false;
  if (w.x_cols <= 0 || w.x_cols > kWgMaxX || w.ldx < w.x_cols || w.lddw < w.x_cols) return false;
  const int tiles = (w.rows + kWgBM - 1) / kWgBM;
  const long long blocks_x = static_cast<long long>(g.m / w.rows) * wg_cluster(w.rows);
  return tiles <= kWgMaxTilesPerBlock * wg_cluster(w.rows) && blocks_x <= 0x7fffffffLL &&
         (g.n + kWgBN - 1) / kWgBN <= 65535;
}

cudaError_t tile_gemm_wgrad(cudaStream_t s, const TileGemm& g, const TileWgrad& w) {
  if (!tile_gemm_wgrad_fits(g, w)) return cudaErrorInvalidValue;
  const int cr = wg_cluster(w.rows);
  const std::size_t shared = wg_shared_bytes(w.x_cols);
  cudaLaunchAttribute attr[2]{};
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(cr);
  attr[0].val.clusterDim.y = attr[0].val.clusterDim.z = 1;
  attr[1] = dev::pdl_attribute();
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(g.m / w.rows * cr), static_cast<unsigned>((g.n + kWgBN - 1) / kWgBN), 1);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = shared;
  cfg.stream = s;
  cfg.attrs = attr;
  cfg.numAttrs = dev::pdl_for(shared) ? 2 : 1;
  const bool vec_a = dev::aligned16(g.a) && g.lda % 4 == 0, vec_b = dev::aligned16(g.b) && g.ldb % 4 == 0;
  const bool vec_x = dev::aligned16(w.x) && w.ldx % 4 == 0;
  dev::note_pdl_kernel(reinterpret_cast<const void*>(tile_gemm_wgrad_kernel));
  return cudaLaunchKernelEx(&cfg, tile_gemm_wgrad_kernel, g, w, vec_a, vec_b, vec_x);
}

cudaError_t tile_gemm_chain_prepare() {
  if (cudaError_t e = cudaFuncSetAttribute(tile_gemm_chain_kernel<ChainWide>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(ChainWide::bytes));
      e != cudaSuccess)
    return e;
  return cudaFuncSetAttribute(tile_gemm_chain_kernel<ChainNarrow>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(ChainNarrow::bytes));
}

bool tile_gemm_chain_fits(const TileGemm& g, const TileChain& c) {
  if (g.ta || !g.tb || g.mask || g.beta != 0.0f || g.batch < 1 || g.batch > 65535 || g.batch2 != 1) return false;
  if (g.m <= 0 || g.n <= 0 || g.n > ChainWide::n1 || g.k <= 0 || c.n2 <= 0 || !c.b2 || !c.c2) return false;
  return c.ldb2 >= g.n && c.ldc2 >= c.n2 && (c.n2 + kChBN - 1) / kChBN <= 65535;
}

cudaError_t tile_gemm_chain(cudaStream_t s, const TileGemm& g, const TileChain& c) {
  if (!tile_gemm_chain_fits(g, c)) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>((g.m + kChBM - 1) / kChBM), static_cast<unsigned>((c.n2 + kChBN - 1) / kChBN),
                  static_cast<unsigned>(g.batch));
  // 16-byte copies where the operand's rows (and batch entries) start on 16-byte boundaries
  const auto aligned = [](const float* p, int ld, std::int64_t stride) {
    return dev::aligned16(p) && ld % 4 == 0 && stride % 4 == 0;
  };
  const bool vec_a = aligned(g.a, g.lda, g.stride_a), vec_b = aligned(g.b, g.ldb, g.stride_b);
  const bool vec_b2 = aligned(c.b2, c.ldb2, c.stride_b2);
  if (g.n <= ChainNarrow::n1)
    launch(tile_gemm_chain_kernel<ChainNarrow>, grid, kThreads, ChainNarrow::bytes, s, g, c, vec_a, vec_b, vec_b2);
  else
    launch(tile_gemm_chain_kernel<ChainWide>, grid, kThreads, ChainWide::bytes, s, g, c, vec_a, vec_b, vec_b2);
  return cudaGetLastError();
}

}  // namespace dqn::cuda
