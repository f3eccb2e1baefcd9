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
/// and the base 16-byte aligned); else 4-byte ones.
template <int ROWS, int COLS>
__device__ __forceinline__ void copy_tile(float* dst, int ld_s, const float* src, int ld, int r0, int c0, int row_end,
                                          int col_end, bool vec) {
  constexpr int kChunks = ROWS * COLS / 4, kPerThread = kChunks / kThreads;
  static_assert(kChunks % kThreads == 0, "whole chunks per thread");
#pragma unroll
  for (int q = 0; q < kPerThread; ++q) {
    const int c = threadIdx.x + q * kThreads;
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

/// Block tile BM × BN, warp tile WM × WN (four warps), S stages of kBK along k. TA/TB: A is
/// stored [k, m] / B is stored [n, k] (the Gemm's ta/tb).
template <int BM, int BN, int WM, int WN, int S, bool TA, bool TB>
__global__ void __launch_bounds__(kThreads) tile_gemm_kernel(TileGemm g, bool vec_a, bool vec_b) {
  dev::pdl_entry();
  static_assert((BM / WM) * (BN / WN) == kThreads / 32, "four warps per block");
  static_assert(WM % 16 == 0 && WN % 8 == 0, "whole mma tiles per warp");
  using Shape = TileShape<BM, BN, TA, TB>;
  constexpr int MT = WM / 16, NT = WN / 8, LA = Shape::lda_s, LB = Shape::ldb_s;
  extern __shared__ __align__(16) float tg_shared[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
  const int z = static_cast<int>(blockIdx.z) / g.batch2, z2 = static_cast<int>(blockIdx.z) - z * g.batch2;
  const float* A = g.a + z * g.stride_a + z2 * g.stride2_a;
  const float* B = g.b + z * g.stride_b + z2 * g.stride2_b;
  const int m = g.m, n = g.n, k = g.k;
  const int KT = (k + kBK - 1) / kBK;

  auto load_stage = [&](int kt, int slot) {
    float* As = tg_shared + slot * Shape::stage_floats;
    float* Bs = As + Shape::a_floats;
    const int k0 = kt * kBK;
    if constexpr (TA) copy_tile<kBK, BM>(As, LA, A, g.lda, k0, m0, k, m, vec_a);
    else copy_tile<BM, kBK>(As, LA, A, g.lda, m0, k0, m, k, vec_a);
    if constexpr (TB) copy_tile<BN, kBK>(Bs, LB, B, g.ldb, n0, k0, n, k, vec_b);
    else copy_tile<kBK, BN>(Bs, LB, B, g.ldb, k0, n0, k, n, vec_b);
  };

  float acc[MT][NT][4] = {};
  const int wm = warp / (BN / WN), wn = warp % (BN / WN);
  const int gq = lane >> 2, tq = lane & 3;  // the mma fragment's group and thread-in-group

  for (int s = 0; s < S - 1; ++s) {
    if (s < KT) load_stage(s, s);
    cp_async_commit();  // empty groups keep the count uniform
  }
  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<S - 2>();
    __syncthreads();  // stage kt is visible to all; every warp is done with the slot reloaded below
    if (kt + S - 1 < KT) load_stage(kt + S - 1, (kt + S - 1) % S);
    cp_async_commit();
    const float* As = tg_shared + (kt % S) * Shape::stage_floats;
    const float* Bs = As + Shape::a_floats;
#pragma unroll
    for (int k8 = 0; k8 < kBK; k8 += 8) {
      std::uint32_t af[MT][4], bf[NT][2];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const int r = wm * WM + mt * 16 + gq;
        if constexpr (TA) {
          const float* p = As + (k8 + tq) * LA + r;
          af[mt][0] = to_tf32(p[0]);
          af[mt][1] = to_tf32(p[8]);
          af[mt][2] = to_tf32(p[4 * LA]);
          af[mt][3] = to_tf32(p[4 * LA + 8]);
        } else {
          const float* p = As + r * LA + k8 + tq;
          af[mt][0] = to_tf32(p[0]);
          af[mt][1] = to_tf32(p[8 * LA]);
          af[mt][2] = to_tf32(p[4]);
          af[mt][3] = to_tf32(p[8 * LA + 4]);
        }
      }
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
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) mma_tf32(acc[mt][nt], af[mt], bf[nt]);
    }
  }
  cp_async_wait<0>();  // no copy may still target shared memory when the block exits

  // Epilogue: C = act(alpha·AB + beta·C + bias), C read only when beta != 0 (as bias_act after
  // the GEMM: the bias is added to the rounded alpha·AB + beta·C).
  float* C = g.c + z * g.stride_c + z2 * g.stride2_c;
  const float* Cin = g.c_in + z * g.stride_c + z2 * g.stride2_c;
  const float* bias = g.bias ? g.bias + z * g.stride_bias + z2 * g.stride2_bias : nullptr;
  const float* mask = g.mask ? g.mask + z * g.stride_mask + z2 * g.stride2_mask : nullptr;  // then the ReLU backward
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // the fragment's rows gq and gq + 8
      const int r = m0 + wm * WM + mt * 16 + gq + h * 8;
      if (r >= m) continue;
      // the mask's row: one modulo per row, not per element
      const float* mrow = mask ? mask + static_cast<std::int64_t>(r % g.mask_rows) * g.ldmask : nullptr;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int q = 2 * h + e;
          const int c = n0 + wn * WN + nt * 8 + 2 * tq + e;
          if (c >= n) continue;
          const std::int64_t at = static_cast<std::int64_t>(r) * g.ldc + c;
          float v = g.alpha * acc[mt][nt][q];
          if (g.beta != 0.0f) v += g.beta * Cin[at];
          if (bias) v += bias[c];
          if (g.relu) v = v > 0.0f ? v : 0.0f;
          if (mrow && mrow[c] <= 0.0f) v = 0.0f;
          C[at] = v;
        }
    }
}

/// The tile shapes: block tile, warp tile (four warps), stages in flight, name.
struct Config {
  int bm, bn, wm, wn, stages;
  const char* name;
};
constexpr Config kConfigs[kTileGemmConfigs] = {
    {16, 32, 16, 8, 8, "16x32"}, {32, 32, 16, 16, 8, "32x32"}, {64, 64, 32, 32, 6, "64x64"}};

template <int C, bool TA, bool TB>
struct Kernel {
  static constexpr Config c = kConfigs[C];
  static constexpr int bytes = c.stages * TileShape<c.bm, c.bn, TA, TB>::stage_floats * 4;
  static constexpr auto fn = tile_gemm_kernel<c.bm, c.bn, c.wm, c.wn, c.stages, TA, TB>;
};

template <int C, bool TA, bool TB>
cudaError_t prepare_one() {
  return cudaFuncSetAttribute(Kernel<C, TA, TB>::fn, cudaFuncAttributeMaxDynamicSharedMemorySize, Kernel<C, TA, TB>::bytes);
}
template <int C>
cudaError_t prepare_config() {
  for (cudaError_t e : {prepare_one<C, false, false>(), prepare_one<C, false, true>(), prepare_one<C, true, false>(),
                        prepare_one<C, true, true>()})
    if (e != cudaSuccess) return e;
  return cudaSuccess;
}

template <int C, bool TA, bool TB>
cudaError_t launch_one(cudaStream_t s, const TileGemm& g) {
  const dim3 grid((g.m + kConfigs[C].bm - 1) / kConfigs[C].bm, (g.n + kConfigs[C].bn - 1) / kConfigs[C].bn,
                  g.batch * g.batch2);
  // 16-byte copies where the operand's rows (and batch entries) start on 16-byte boundaries
  const auto aligned = [](const float* p, int ld, std::int64_t stride, std::int64_t stride2) {
    return dev::aligned16(p) && ld % 4 == 0 && stride % 4 == 0 && stride2 % 4 == 0;
  };
  launch(Kernel<C, TA, TB>::fn, grid, kThreads, Kernel<C, TA, TB>::bytes, s, g,
         aligned(g.a, g.lda, g.stride_a, g.stride2_a), aligned(g.b, g.ldb, g.stride_b, g.stride2_b));
  return cudaGetLastError();
}
template <int C>
cudaError_t launch_config(cudaStream_t s, const TileGemm& g) {
  if (g.ta) return g.tb ? launch_one<C, true, true>(s, g) : launch_one<C, true, false>(s, g);
  return g.tb ? launch_one<C, false, true>(s, g) : launch_one<C, false, false>(s, g);
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
