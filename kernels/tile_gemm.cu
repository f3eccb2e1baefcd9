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
/// and the base 16-byte aligned); else 4-byte ones. The block's threads share the copy.
template <int ROWS, int COLS>
__device__ __forceinline__ void copy_tile(float* dst, int ld_s, const float* src, int ld, int r0, int c0, int row_end,
                                          int col_end, bool vec) {
  constexpr int NT = kThreads, kChunks = ROWS * COLS / 4, kPerThread = (kChunks + NT - 1) / NT;
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
/// tile WM × WN (four warps), S stages of kBK in flight in `smem`;
/// rows of A at or past m and columns of B at or past n read as zeros. Returns with no copy in
/// flight (the caller's own cp.async groups, committed before, included) and with the stage
/// buffers possibly still being read by other warps (a barrier must come before `smem` is written
/// again). TA/TB: A is stored [k, m] / B is stored [n, k] (the Gemm's ta/tb). LDM: the fragments
/// of A (not transposed) and B (transposed) by ldmatrix (the same values).
template <int BM, int BN, int WM, int WN, int S, bool TA, bool TB, bool LDM = false>
__device__ __forceinline__ void tile_mainloop(float (&acc)[WM / 16][WN / 8][4], float* smem, const float* A, int lda,
                                              const float* B, int ldb, int m0, int n0, int m, int n, int k,
                                              bool vec_a, bool vec_b) {
  static_assert((BM / WM) * (BN / WN) == kThreads / 32, "four warp tiles per block tile");
  static_assert(WM % 16 == 0 && WN % 8 == 0, "whole mma tiles per warp");
  using Shape = TileShape<BM, BN, TA, TB>;
  constexpr int MT = WM / 16, NT = WN / 8, LA = Shape::lda_s, LB = Shape::ldb_s;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;  // the warp's tile of C
  const int KT = (k + kBK - 1) / kBK;

  auto load_stage = [&](int kt, int slot) {
    float* As = smem + slot * Shape::stage_floats;
    float* Bs = As + Shape::a_floats;
    const int k0 = kt * kBK;
    if constexpr (TA) copy_tile<kBK, BM>(As, LA, A, lda, k0, m0, k, m, vec_a);
    else copy_tile<BM, kBK>(As, LA, A, lda, m0, k0, m, k, vec_a);
    if constexpr (TB) copy_tile<BN, kBK>(Bs, LB, B, ldb, n0, k0, n, k, vec_b);
    else copy_tile<kBK, BN>(Bs, LB, B, ldb, k0, n0, k, n, vec_b);
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
/// fragments by ldmatrix (TileGemm::ldmatrix; the same bits).
template <int BM, int BN, int WM, int WN, int S, bool TA, bool TB, bool LDM>
__global__ void __launch_bounds__(kThreads) tile_gemm_kernel(TileGemm g, bool vec_a, bool vec_b) {
  dev::pdl_entry();
  constexpr int MT = WM / 16, NT = WN / 8;
  extern __shared__ __align__(16) float tg_shared[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
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
  tile_mainloop<BM, BN, WM, WN, S, TA, TB, LDM>(acc, tg_shared, A, g.lda, B, g.ldb, m0, n0, m, n, g.k, vec_a, vec_b);

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

/// The tile shapes: block tile, warp tile (four warp tiles), stages in flight, name.
struct Config {
  int bm, bn, wm, wn, stages;
  const char* name;
};
constexpr Config kConfigs[kTileGemmConfigs] = {
    {16, 32, 16, 8, 8, "16x32"}, {32, 32, 16, 16, 8, "32x32"}, {64, 64, 32, 32, 6, "64x64"}};

/// The kernel of shape C on layout (TA, TB), with ldmatrix where LDM and the layout has a
/// k-contiguous operand (A not transposed or B transposed; else the same kernel without).
template <int C, bool TA, bool TB, bool LDM>
struct Kernel {
  static constexpr Config c = kConfigs[C];
  static constexpr int bytes = c.stages * TileShape<c.bm, c.bn, TA, TB>::stage_floats * 4;
  static constexpr auto fn =
      tile_gemm_kernel<c.bm, c.bn, c.wm, c.wn, c.stages, TA, TB, LDM && tile_gemm_ldmatrix_layout(TA, TB)>;
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
  launch(K::fn, grid, kThreads, K::bytes, s, g, aligned(g.a, g.lda, g.stride_a, g.stride2_a),
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
  for (cudaError_t e : {prepare_config<0>(), prepare_config<1>(), prepare_config<2>()})
    if (e != cudaSuccess) return e;
  return cudaSuccess;
}

cudaError_t tile_gemm(cudaStream_t s, const TileGemm& g, int config) {
  if (!tile_gemm_fits(g, config)) return cudaErrorInvalidValue;
  switch (config) {
    case 0: return launch_config<0>(s, g);
    case 1: return launch_config<1>(s, g);
    default: return launch_config<2>(s, g);
  }
}

}  // namespace dqn::cuda
