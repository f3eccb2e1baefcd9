/** @file gpu_ops_util.hpp
 *  @brief What the gpu.ops test files share: tolerances, random inputs, comparisons against the
 *  CPU twin, and a CUDA runtime with a bump-allocated arena (Gpu).
 */
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <deque>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu/cpu_backend.hpp"
#include "core/runtime.hpp"
#include "cuda/cuda_lab.hpp"

namespace gpu_ops {
using namespace dqn;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Tolerances, ‖gpu − cpu‖ / ‖cpu‖. Both sides accumulate in double and round once, so
// elementwise ops and reductions land at float rounding (~1e-7); GEMMs by precision:
// fp32 (no TF32), tf32 (10-bit mantissa operands), bf16 (8-bit mantissa operands).
constexpr double kElementwise = 1e-6;
constexpr double kReduction = 1e-6;
/// The distribution kernels' float arithmetic (tf32/bf16 backends) against the CPU's double:
/// float rounds at 6e-8, and the projection divides support differences by Δz (|z|/Δz = 25 at
/// 51 atoms on [-10, 10]), so a few 1e-6 relative; 2e-5 leaves a margin.
constexpr double kFloatMath = 2e-5;
constexpr double kFp32Gemm = 1e-5;
constexpr double kTf32Gemm = 2e-3;
constexpr double kBf16Gemm = 2e-2;

inline std::vector<float> random_vec(std::size_t n, float lo, float hi, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

inline std::vector<std::int32_t> random_ints(std::size_t n, int lo, int hi, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> dist(lo, hi);
  std::vector<std::int32_t> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

inline Real host(std::vector<float>& v) { return {v.data(), 4}; }

/// ‖got − ref‖/‖ref‖ ≤ tol, and every element non-finite in one is non-finite the same way in
/// the other (so a NaN-poisoned element that was never written fails, and so does a stray NaN).
inline void expect_close(const std::vector<float>& got, const std::vector<float>& ref, double tol, const std::string& what) {
  REQUIRE_MESSAGE(got.size() == ref.size(), what);
  double num = 0.0, den = 0.0;
  std::size_t mismatched = 0, first = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const float r = ref[i], g = got[i];
    if (!std::isfinite(r) || !std::isfinite(g)) {
      const bool same = std::isnan(r) ? std::isnan(g) : (std::isinf(r) && std::isinf(g) && (r > 0) == (g > 0));
      if (!same && mismatched++ == 0) first = i;
      continue;
    }
    const double d = static_cast<double>(g) - r;
    num += d * d;
    den += static_cast<double>(r) * r;
  }
  const double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  CHECK_MESSAGE(mismatched == 0, what << ": " << mismatched << " elements finite on one side only, first at " << first
                                      << " (gpu " << got[first] << ", cpu " << ref[first] << ")");
  CHECK_MESSAGE(rel <= tol, what << ": relative error " << rel << " > " << tol);
}

template <class T>
void expect_same_bits(const std::vector<T>& a, const std::vector<T>& b, const std::string& what) {
  REQUIRE_MESSAGE(a.size() == b.size(), what);
  std::size_t first = a.size();
  for (std::size_t i = 0; i < a.size() && first == a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) first = i;
  CHECK_MESSAGE(first == a.size(), what << ": differs first at element " << first << " of " << a.size());
}

/// The GEMM paths each layout runs through: fp32, tf32 on cuBLASLt only, tf32 on each tile shape
/// of the tile_gemm kernel (the pipeline's cuda.gemm, CudaSpec::gemm), bf16.
struct GemmPath {
  Precision p;
  const char* name;
  double tol;
  CudaSpec::Gemm gemm;
};
constexpr GemmPath kGemmPaths[] = {{Precision::fp32, "fp32", kFp32Gemm, CudaSpec::Gemm::automatic},
                                   {Precision::tf32, "tf32", kTf32Gemm, CudaSpec::Gemm::cublaslt},
                                   {Precision::tf32, "tf32 tile 16x32", kTf32Gemm, CudaSpec::Gemm::tile16x32},
                                   {Precision::tf32, "tf32 tile 32x32", kTf32Gemm, CudaSpec::Gemm::tile32x32},
                                   {Precision::tf32, "tf32 tile 64x64", kTf32Gemm, CudaSpec::Gemm::tile64x64},
                                   {Precision::bf16, "bf16", kBf16Gemm, CudaSpec::Gemm::automatic}};
/// The CUDA backend's choices with one GEMM kernel family (and tile_gemm's fragment loads).
inline CudaSpec with_gemm(CudaSpec::Gemm g, CudaSpec::TileLoads loads = CudaSpec::TileLoads::automatic) {
  CudaSpec s;
  s.gemm = g;
  s.tile_loads = loads;
  return s;
}

/// The three precisions with their GEMM tolerance (the ops whose tf32 path has a kernel of its own
/// and whose other precisions fall back to separate GEMMs).
struct PrecisionCase {
  Precision p;
  const char* name;
  double tol;
};
constexpr PrecisionCase kPrecisions[] = {
    {Precision::tf32, "tf32", kTf32Gemm}, {Precision::fp32, "fp32", kFp32Gemm}, {Precision::bf16, "bf16", kBf16Gemm}};

/// A CUDA runtime for one test (the pipeline's cuda: choices `spec`), with one arena
/// bump-allocated into the test's buffers.
class Gpu {
 public:
  explicit Gpu(Precision p = Precision::fp32, const CudaSpec& spec = {}, std::size_t arena_bytes = std::size_t{64} << 20)
      : rt_(make_cuda_runtime(spec, p, 0)), ops(rt_->ops()) {
    base_ = static_cast<char*>(rt_->alloc_arena(arena_bytes));
    cap_ = arena_bytes;
  }
  Runtime& rt() { return *rt_; }

  void* raw(std::size_t bytes) {
    const std::size_t off = (used_ + 255) / 256 * 256;
    REQUIRE(off + bytes <= cap_);
    used_ = off + bytes;
    return base_ + off;
  }
  Real reals(std::int64_t n) { return {raw(static_cast<std::size_t>(n) * 4), 4}; }
  Real put(const std::vector<float>& h) {
    Real r = reals(static_cast<std::int64_t>(h.size()));
    set(r, h);
    return r;
  }
  template <class T>
  T* put_typed(const std::vector<T>& h) {
    T* p = static_cast<T*>(raw(h.size() * sizeof(T)));
    ops.upload(p, h.data(), h.size() * sizeof(T));
    return p;
  }
  void set(Real r, const std::vector<float>& h) { ops.upload_reals(r, h.data(), static_cast<std::int64_t>(h.size())); }
  template <class T>
  void set_typed(T* p, const std::vector<T>& h) { ops.upload(p, h.data(), h.size() * sizeof(T)); }
  std::vector<float> get(Real r, std::int64_t n) {
    std::vector<float> h(static_cast<std::size_t>(n));
    ops.download_reals(h.data(), r, n);
    return h;
  }
  template <class T>
  std::vector<T> get_typed(const T* p, std::size_t n) {
    std::vector<T> h(n);
    ops.download(h.data(), p, n * sizeof(T));
    return h;
  }
  Real poisoned(std::int64_t n) { return put(std::vector<float>(static_cast<std::size_t>(n), kNaN)); }
  void poison(Real r, std::int64_t n) { set(r, std::vector<float>(static_cast<std::size_t>(n), kNaN)); }
  void ok() {
    rt_->synchronize();
    REQUIRE_MESSAGE(ops.status() == 0, ops.message());
  }

 private:
  std::unique_ptr<Runtime> rt_;

 public:
  EngineBackend& ops;

 private:
  char* base_ = nullptr;
  std::size_t cap_ = 0, used_ = 0;
};

/// One buffer of n reals on each of two runtimes, for expect_same_reals.
struct RealPair {
  const char* name;
  Real a, b;
  std::int64_t n;
};

/// Every pair's a on ga and b on gb equal bit for bit ("what: name" in a failure).
inline void expect_same_reals(Gpu& ga, Gpu& gb, const std::string& what, const std::vector<RealPair>& pairs) {
  for (const RealPair& p : pairs) expect_same_bits(ga.get(p.a, p.n), gb.get(p.b, p.n), what + ": " + p.name);
}

struct Cpu {
  std::unique_ptr<EngineBackend> ops = make_cpu_backend(false);
  void ok() { REQUIRE_MESSAGE(ops->status() == 0, ops->message()); }
};

/// Host log-probabilities: log_softmax of random logits, rows × n (from the CPU twin).
inline std::vector<float> random_logp(int rows, int n, std::uint32_t seed) {
  auto x = random_vec(static_cast<std::size_t>(rows) * n, -4.0f, 4.0f, seed);
  std::vector<float> lp(x.size());
  Cpu cpu;
  cpu.ops->log_softmax(host(lp), host(x), rows, n);
  cpu.ok();
  return lp;
}

}  // namespace gpu_ops
