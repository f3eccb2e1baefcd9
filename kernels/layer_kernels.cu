/** @file layer_kernels.cu
 *  @brief The dense layers' kernels (bias and activation, the ReLU backward and its masks, bias
 *  gradients), split-k sums, the elementwise ops, and each stream's launch policy.
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <unordered_map>

#include "cuda_kernels.cuh"
#include "core/philox.h"
#include "kernel_common.cuh"

namespace dqn::cuda {
namespace {

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
                               const std::int64_t* step_p, std::int64_t first) {
  dev::pdl_entry();
  const std::uint64_t step = step_p ? static_cast<std::uint64_t>(*step_p) : 0;
  for (std::int64_t i = grid_start(); i < n; i += grid_step())
    out[i] = philox::uniform(seed, step, stream, static_cast<std::uint64_t>(first + i));
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

}  // namespace

namespace {
/// Each stream's launch policy (set_stream_pdl); a stream not listed launches with the default.
struct StreamPdl {
  PdlMode mode = PdlMode::automatic;
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

void set_stream_pdl(cudaStream_t s, PdlMode mode, bool wide) noexcept {
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

std::int64_t pdl_shared_limit(cudaStream_t s) noexcept {
  constexpr std::int64_t kSmall = std::int64_t{16} << 10, kAny = std::int64_t{1} << 40;
  StreamPdl p;
  {
    std::lock_guard<std::mutex> lock(stream_pdl_mutex());
    if (const auto it = stream_pdl().find(s); it != stream_pdl().end()) p = it->second;
  }
  switch (p.mode) {
    case PdlMode::off: return -1;
    case PdlMode::all: return kAny;
    case PdlMode::small: return kSmall;
    case PdlMode::automatic: return p.wide ? kSmall : kAny;
  }
  return kAny;
}

bool pdl_for(std::size_t shared, cudaStream_t s) noexcept {
  const std::int64_t limit = pdl_shared_limit(s);
  return limit >= 0 && static_cast<std::int64_t>(shared) <= limit;
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
  // placed early, would wait on an SM beside the loss (the loss then starts later)
  weighted_mean_kernel<<<1, kThreads, 0, s>>>(out, x, w, n);
  return cudaGetLastError();
}

cudaError_t axpy(cudaStream_t s, float* y, const float* x, float alpha, std::int64_t n) {
  launch(axpy_kernel, blocks_for(n), kThreads, 0, s, y, x, alpha, n);
  return cudaGetLastError();
}

cudaError_t uniform(cudaStream_t s, const Uniform& a, std::int64_t first) {
  launch(uniform_kernel, blocks_for(a.n), kThreads, 0, s, a.out.as<float>(), a.n, a.seed, a.stream, a.step, first);
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
