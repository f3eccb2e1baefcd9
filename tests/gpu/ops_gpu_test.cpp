// The CUDA op table against its CPU twin: every op on random inputs of awkward sizes, outputs
// poisoned with NaN first, the skip paths, bit-identical reruns, and graph replay == direct run.
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
#include "dqn/runtime.hpp"
#include "lab.hpp"

using namespace dqn;

namespace {

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

std::vector<float> random_vec(std::size_t n, float lo, float hi, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

std::vector<std::int32_t> random_ints(std::size_t n, int lo, int hi, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> dist(lo, hi);
  std::vector<std::int32_t> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

Real host(std::vector<float>& v) { return {v.data(), 4}; }

/// ‖got − ref‖/‖ref‖ ≤ tol, and every element non-finite in one is non-finite the same way in
/// the other (so a NaN-poisoned element that was never written fails, and so does a stray NaN).
void expect_close(const std::vector<float>& got, const std::vector<float>& ref, double tol, const std::string& what) {
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
CudaSpec with_gemm(CudaSpec::Gemm g, CudaSpec::TileLoads loads = CudaSpec::TileLoads::automatic) {
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
  Backend& ops;

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
void expect_same_reals(Gpu& ga, Gpu& gb, const std::string& what, const std::vector<RealPair>& pairs) {
  for (const RealPair& p : pairs) expect_same_bits(ga.get(p.a, p.n), gb.get(p.b, p.n), what + ": " + p.name);
}

struct Cpu {
  std::unique_ptr<Backend> ops = make_cpu_backend(false);
  void ok() { REQUIRE_MESSAGE(ops->status() == 0, ops->message()); }
};

/// Host log-probabilities: log_softmax of random logits, rows × n (from the CPU twin).
std::vector<float> random_logp(int rows, int n, std::uint32_t seed) {
  auto x = random_vec(static_cast<std::size_t>(rows) * n, -4.0f, 4.0f, seed);
  std::vector<float> lp(x.size());
  Cpu cpu;
  cpu.ops->log_softmax(host(lp), host(x), rows, n);
  cpu.ok();
  return lp;
}

}  // namespace

// --- dense layers -----------------------------------------------------------------------------

TEST_CASE("gpu.ops.gemm: every layout, precision and tile shape against the CPU") {
  struct Case {
    const char* why;
    bool ta, tb;
    int m, n, k, pad_a, pad_b, pad_c;
    float alpha, beta;
    int batch;
    bool share_b;
  };
  const Case cases[] = {
      {"plain", false, false, 37, 53, 29, 0, 0, 0, 1.0f, 0.0f, 1, false},
      {"A transposed", true, false, 37, 53, 29, 0, 0, 0, 1.0f, 0.0f, 1, false},
      {"B transposed (the weight layout)", false, true, 37, 53, 29, 0, 0, 0, 1.0f, 0.0f, 1, false},
      {"both transposed", true, true, 37, 53, 29, 0, 0, 0, 1.0f, 0.0f, 1, false},
      {"padded rows, alpha and beta", false, true, 37, 53, 29, 3, 5, 7, 0.7f, 0.5f, 1, false},
      {"strided batch with gaps", true, false, 19, 23, 31, 2, 1, 3, 1.0f, 0.0f, 3, false},
      {"strided batch sharing B (stride 0)", false, true, 19, 23, 31, 0, 0, 0, 1.0f, 0.25f, 3, true},
      {"deep k", false, true, 65, 129, 300, 0, 0, 0, 1.0f, 0.0f, 1, false},
      {"one row", false, true, 1, 53, 29, 0, 0, 0, 1.0f, 0.0f, 1, false},
      {"k = 0 only scales C", false, false, 37, 53, 0, 0, 0, 0, 1.0f, 0.5f, 1, false},
      // tall k, few output tiles: split into slices of k and summed (fp32/tf32)
      {"tall k, the weight-gradient layout (split)", true, false, 37, 53, 5000, 0, 0, 0, 1.0f, 0.0f, 1, false},
      {"tall k with a remainder slice, padded, alpha (split)", false, true, 19, 130, 3001, 2, 3, 1, 0.5f, 0.0f, 1, false},
      {"tall k with beta (not split)", true, false, 37, 53, 5000, 0, 0, 0, 1.0f, 0.5f, 1, false},
  };

  std::uint32_t seed = 100;
  for (const GemmPath& prec : kGemmPaths) {
    Gpu gpu(prec.p, with_gemm(prec.gemm));
    Cpu cpu;
    double worst = 0.0;
    for (const Case& c : cases) {
      const std::string what = std::string(prec.name) + " gemm, " + c.why;
      INFO(what);
      const int a_rows = c.ta ? c.k : c.m, a_cols = c.ta ? c.m : c.k;
      const int b_rows = c.tb ? c.n : c.k, b_cols = c.tb ? c.k : c.n;
      const int lda = std::max(1, a_cols + c.pad_a), ldb = std::max(1, b_cols + c.pad_b), ldc = c.n + c.pad_c;
      const std::int64_t sa = c.batch > 1 ? static_cast<std::int64_t>(a_rows) * lda + 5 : 0;
      const std::int64_t sb = c.batch > 1 && !c.share_b ? static_cast<std::int64_t>(b_rows) * ldb + 7 : 0;
      const std::int64_t sc = c.batch > 1 ? static_cast<std::int64_t>(c.m) * ldc + 3 : 0;
      const std::size_t na = static_cast<std::size_t>(sa * (c.batch - 1) + static_cast<std::int64_t>(a_rows) * lda) + 1;
      const std::size_t nb = static_cast<std::size_t>(sb * (c.batch - 1) + static_cast<std::int64_t>(b_rows) * ldb) + 1;
      const std::size_t nc = static_cast<std::size_t>(sc * (c.batch - 1) + static_cast<std::int64_t>(c.m) * ldc);
      auto A = random_vec(na, -1, 1, seed++), B = random_vec(nb, -1, 1, seed++);
      // beta == 0: C is poison (must be overwritten, never read); else random data to blend.
      auto C0 = c.beta != 0.0f ? random_vec(nc, -1, 1, seed++) : std::vector<float>(nc, kNaN);
      Gemm g;
      g.ta = c.ta;
      g.tb = c.tb;
      g.m = c.m;
      g.n = c.n;
      g.k = c.k;
      g.alpha = c.alpha;
      g.beta = c.beta;
      g.lda = lda;
      g.ldb = ldb;
      g.ldc = ldc;
      g.batch = c.batch;
      g.stride_a = sa;
      g.stride_b = sb;
      g.stride_c = sc;
      Gemm gd = g;
      gd.a = gpu.put(A);
      gd.b = gpu.put(B);
      gd.c = gpu.put(C0);
      gpu.ops.gemm(gd);
      gpu.ok();
      auto Cc = C0;
      Gemm gc = g;
      gc.a = host(A);
      gc.b = host(B);
      gc.c = host(Cc);
      cpu.ops->gemm(gc);
      cpu.ok();
      const auto got = gpu.get(gd.c, static_cast<std::int64_t>(nc));
      expect_close(got, Cc, prec.tol, what);
      double num = 0, den = 0;
      for (std::size_t i = 0; i < nc; ++i)
        if (std::isfinite(Cc[i])) {
          num += (static_cast<double>(got[i]) - Cc[i]) * (static_cast<double>(got[i]) - Cc[i]);
          den += static_cast<double>(Cc[i]) * Cc[i];
        }
      worst = std::max(worst, std::sqrt(num / den));
    }
    MESSAGE(std::string(prec.name) << " gemm: worst relative error over the cases " << worst << " (tolerance " << prec.tol << ")");
  }
}

TEST_CASE("gpu.ops.gemm_mask: the ReLU backward in the GEMM (tile_gemm's epilogue, else after it) against the CPU") {
  struct Case {
    const char* why;
    bool ta;
    int m, n, k, batch, mask_rows;
    float beta;
    bool bias_relu;
  };
  const Case cases[] = {
      {"d(input) layout, one mask row per row", false, 37, 53, 29, 1, 0, 0.0f, false},
      {"heads stacked: the mask repeats every 13 rows", false, 39, 53, 29, 1, 13, 0.0f, false},
      {"batched, a mask per entry (the head's branches)", false, 19, 23, 31, 3, 0, 0.0f, false},
      {"after bias and ReLU, with beta", false, 37, 53, 29, 1, 0, 0.5f, true},
      {"tall k (split, the mask after the slices' sum)", true, 37, 53, 5000, 1, 0, 0.0f, false},
      {"k = 0: the mask on beta·C", false, 37, 53, 0, 1, 0, 0.5f, false},
  };
  // Each path with tile_gemm's k-contiguous fragments by plain loads and by ldmatrix
  // (cuda.tile_loads; automatic, autotuning picks either per problem): the same bits both ways.
  std::map<std::string, std::vector<float>> plain;
  for (const GemmPath& prec : kGemmPaths)
  for (const auto loads : {CudaSpec::TileLoads::plain, CudaSpec::TileLoads::ldmatrix}) {
    const bool ldm = loads == CudaSpec::TileLoads::ldmatrix;
    Gpu gpu(prec.p, with_gemm(prec.gemm, loads));
    Cpu cpu;
    std::uint32_t seed = 700;  // the same operands on every path
    for (const Case& c : cases) {
      const std::string what = std::string(prec.name) + " gemm mask, " + c.why;
      CAPTURE(what);
      const int lda = (c.ta ? c.m : c.k) + 1, ldb = c.k + 2, ldc = c.n + 3, ldmask = c.n + 5;
      const int a_rows = c.ta ? c.k : c.m, mrows = c.mask_rows > 0 ? c.mask_rows : c.m;
      const std::int64_t sa = c.batch > 1 ? std::int64_t(a_rows) * lda + 5 : 0;
      const std::int64_t sb = c.batch > 1 ? std::int64_t(c.n) * ldb + 7 : 0;
      const std::int64_t sc = c.batch > 1 ? std::int64_t(c.m) * ldc + 3 : 0;
      const std::int64_t sm = c.batch > 1 ? std::int64_t(mrows) * ldmask + 9 : 0;
      auto A = random_vec(static_cast<std::size_t>(sa * (c.batch - 1) + std::int64_t(a_rows) * lda + 1), -1, 1, seed++);
      auto B = random_vec(static_cast<std::size_t>(sb * (c.batch - 1) + std::int64_t(c.n) * ldb + 1), -1, 1, seed++);
      const std::size_t nc = static_cast<std::size_t>(sc * (c.batch - 1) + std::int64_t(c.m) * ldc);
      auto C0 = c.beta != 0.0f ? random_vec(nc, -1, 1, seed++) : std::vector<float>(nc, kNaN);
      auto M = random_vec(static_cast<std::size_t>(sm * (c.batch - 1) + std::int64_t(mrows) * ldmask), -1, 1, seed++);
      for (std::size_t i = 0; i < M.size(); i += 5) M[i] = 0.0f;  // zeros mask too
      auto bias = random_vec(static_cast<std::size_t>(c.n), -1, 1, seed++);
      Gemm g;
      g.ta = c.ta; g.tb = true; g.m = c.m; g.n = c.n; g.k = c.k; g.beta = c.beta;
      g.lda = lda; g.ldb = ldb; g.ldc = ldc; g.batch = c.batch; g.stride_a = sa; g.stride_b = sb; g.stride_c = sc;
      g.ldmask = ldmask; g.mask_rows = c.mask_rows; g.stride_mask = sm;
      if (c.bias_relu) g.act = Act::relu;
      Gemm gd = g, gc = g;
      gd.a = gpu.put(A); gd.b = gpu.put(B); gd.c = gpu.put(C0); gd.mask = gpu.put(M);
      if (c.bias_relu) gd.bias = gpu.put(bias);
      gpu.ops.gemm(gd);
      gpu.ok();
      auto Cc = C0;
      gc.a = host(A); gc.b = host(B); gc.c = host(Cc); gc.mask = host(M);
      if (c.bias_relu) gc.bias = host(bias);
      cpu.ops->gemm(gc);
      cpu.ok();
      const auto got = gpu.get(gd.c, static_cast<std::int64_t>(nc));
      expect_close(got, Cc, prec.tol, what);
      if (ldm) expect_same_bits(got, plain.at(what), what + " (ldmatrix)");
      else plain[what] = got;
      std::size_t zeros = 0;  // the mask did something: exact zeros where it is <= 0
      for (int b = 0; b < c.batch; ++b)
        for (int r = 0; r < c.m; ++r)
          for (int j = 0; j < c.n; ++j)
            if (M[static_cast<std::size_t>(b * sm + std::int64_t(r % mrows) * ldmask + j)] <= 0.0f) {
              CHECK(got[static_cast<std::size_t>(b * sc + std::int64_t(r) * ldc + j)] == 0.0f);
              ++zeros;
            }
      CHECK(zeros > 0);
    }
  }
  // a mask narrower than n is refused, with the reason
  Gpu gpu;
  Gemm bad;
  bad.m = 4; bad.n = 8; bad.k = 2; bad.lda = 2; bad.ldb = 8; bad.ldc = 8; bad.ldmask = 7;
  bad.a = gpu.put(std::vector<float>(8, 1.0f)); bad.b = gpu.put(std::vector<float>(16, 1.0f));
  bad.c = gpu.put(std::vector<float>(32, 0.0f)); bad.mask = gpu.put(std::vector<float>(32, 1.0f));
  gpu.ops.gemm(bad);
  CHECK(gpu.ops.status() != 0);
  CHECK(std::string(gpu.ops.message()).find("mask needs ldmask >= n") != std::string::npos);
}

TEST_CASE("gpu.ops.gemm_batch2: a second batch dimension (one tile_gemm launch, else a call per entry) against the CPU") {
  struct Case {
    const char* why;
    bool ta, tb, bias_relu, mask;
    int m, n, k;
  };
  // the ensemble's branch layers: forward (bias, ReLU off), backward input (masked), weight gradient
  const Case cases[] = {
      {"forward layout, bias", false, true, true, false, 37, 53, 29},
      {"d(input) layout, masked", false, false, false, true, 19, 23, 31},
      {"weight-gradient layout", true, false, false, false, 29, 17, 45},
  };
  const int batch = 2, batch2 = 3;
  for (const GemmPath& prec : kGemmPaths) {
    Gpu gpu(prec.p, with_gemm(prec.gemm));
    Cpu cpu;
    std::uint32_t seed = 900;
    for (const Case& c : cases) {
      const std::string what = std::string(prec.name) + " gemm batch2, " + c.why;
      CAPTURE(what);
      const int a_rows = c.ta ? c.k : c.m, a_cols = c.ta ? c.m : c.k;
      const int b_rows = c.tb ? c.n : c.k, b_cols = c.tb ? c.k : c.n;
      Gemm g;
      g.ta = c.ta; g.tb = c.tb; g.m = c.m; g.n = c.n; g.k = c.k;
      // entries of the second dimension side by side in a row (as the branches' columns are),
      // the first dimension's entries one after the other
      g.lda = a_cols * batch2 + 4; g.ldb = b_cols * batch2 + 8; g.ldc = c.n * batch2 + 4; g.ldmask = g.ldc;
      g.batch = batch; g.batch2 = batch2;
      g.stride2_a = a_cols; g.stride2_b = b_cols; g.stride2_c = c.n; g.stride2_bias = c.n; g.stride2_mask = c.n;
      g.stride_a = std::int64_t(a_rows) * g.lda; g.stride_b = std::int64_t(b_rows) * g.ldb;
      g.stride_c = std::int64_t(c.m) * g.ldc; g.stride_bias = std::int64_t(c.n) * batch2; g.stride_mask = g.stride_c;
      auto A = random_vec(static_cast<std::size_t>(g.stride_a * batch), -1, 1, seed++);
      auto B = random_vec(static_cast<std::size_t>(g.stride_b * batch), -1, 1, seed++);
      const std::size_t nc = static_cast<std::size_t>(g.stride_c * batch);
      auto C0 = random_vec(nc, -1, 1, seed++);  // outside the entries' columns: must stay as it was
      auto bias = random_vec(static_cast<std::size_t>(g.stride_bias * batch), -1, 1, seed++);
      auto M = random_vec(nc, -1, 1, seed++);
      if (c.bias_relu) g.act = Act::relu;
      Gemm gd = g, gc = g;
      gd.a = gpu.put(A); gd.b = gpu.put(B); gd.c = gpu.put(C0);
      if (c.bias_relu) gd.bias = gpu.put(bias);
      if (c.mask) gd.mask = gpu.put(M);
      gpu.ops.gemm(gd);
      gpu.ok();
      auto Cc = C0;
      gc.a = host(A); gc.b = host(B); gc.c = host(Cc);
      if (c.bias_relu) gc.bias = host(bias);
      if (c.mask) gc.mask = host(M);
      cpu.ops->gemm(gc);
      cpu.ok();
      const auto got = gpu.get(gd.c, static_cast<std::int64_t>(nc));
      expect_close(got, Cc, prec.tol, what);
      std::size_t untouched = 0, pad = 0;  // the padding columns of each row: never written
      for (std::size_t i = 0; i < nc; ++i)
        if (static_cast<int>(i % static_cast<std::size_t>(g.ldc)) >= c.n * batch2) {
          ++pad;
          untouched += got[i] == C0[i];
        }
      CHECK(untouched == pad);
    }
  }
  Gpu gpu;
  Gemm bad;
  bad.m = 4; bad.n = 8; bad.k = 2; bad.lda = 2; bad.ldb = 8; bad.ldc = 8; bad.batch2 = -1;
  bad.a = gpu.put(std::vector<float>(8, 1.0f)); bad.b = gpu.put(std::vector<float>(16, 1.0f));
  bad.c = gpu.put(std::vector<float>(32, 0.0f));
  gpu.ops.gemm(bad);
  CHECK(gpu.ops.status() != 0);
  CHECK(std::string(gpu.ops.message()).find("batch2 must be at least 1") != std::string::npos);
}

TEST_CASE("gpu.ops.gemm_sum_batch: the entries' products summed into one C, against the CPU") {
  // the ensemble's ∂L/∂h2 = Σ_k dhidden_k W1_k (B 37 rows, 4 members, k 29 each, a broadcast operand too)
  const int m = 37, n = 53, k = 29, batch = 4;
  for (const GemmPath& prec : kGemmPaths) {
    for (const bool broadcast_b : {false, true}) {
      Gpu gpu(prec.p, with_gemm(prec.gemm));
      Cpu cpu;
      const std::string what = std::string(prec.name) + " gemm sum_batch" + (broadcast_b ? ", B broadcast" : "");
      CAPTURE(what);
      Gemm g;
      g.m = m; g.n = n; g.k = k; g.lda = k + 3; g.ldb = n + 1; g.ldc = n + 2;
      g.batch = batch; g.sum_batch = 1;
      g.stride_a = std::int64_t(m) * g.lda + 5; g.stride_b = broadcast_b ? 0 : std::int64_t(k) * g.ldb + 7;
      g.stride_c = 12345;  // unused
      auto A = random_vec(static_cast<std::size_t>(g.stride_a * batch), -1, 1, 950);
      auto B = random_vec(static_cast<std::size_t>(std::int64_t(k) * g.ldb + g.stride_b * (batch - 1)), -1, 1, 951);
      const std::size_t nc = static_cast<std::size_t>(m) * g.ldc;
      std::vector<float> C0(nc, kNaN);
      Gemm gd = g, gc = g;
      gd.a = gpu.put(A); gd.b = gpu.put(B); gd.c = gpu.put(C0);
      gpu.ops.gemm(gd);
      gpu.ok();
      auto Cc = C0;
      gc.a = host(A); gc.b = host(B); gc.c = host(Cc);
      cpu.ops->gemm(gc);
      cpu.ok();
      expect_close(gpu.get(gd.c, static_cast<std::int64_t>(nc)), Cc, prec.tol, what);
      if (broadcast_b) continue;
      // no entries: C = 0 on both (the empty sum), the padding poisoned; A and B not read
      Gemm zd = g, zc = g;
      zd.batch = zc.batch = 0;
      zd.c = gpu.put(C0);
      gpu.ops.gemm(zd);
      gpu.ok();
      auto Zc = C0;
      zc.c = host(Zc);
      cpu.ops->gemm(zc);
      cpu.ok();
      expect_close(gpu.get(zd.c, static_cast<std::int64_t>(nc)), Zc, prec.tol, what + ", no entries");
      CHECK(Zc[0] == 0.0f);
    }
  }
  Gpu gpu;
  Gemm bad;
  bad.m = 4; bad.n = 8; bad.k = 2; bad.lda = 2; bad.ldb = 8; bad.ldc = 8; bad.sum_batch = 1; bad.act = Act::relu;
  bad.a = gpu.put(std::vector<float>(8, 1.0f)); bad.b = gpu.put(std::vector<float>(16, 1.0f));
  bad.c = gpu.put(std::vector<float>(32, 0.0f));
  gpu.ops.gemm(bad);
  CHECK(gpu.ops.status() != 0);
  CHECK(std::string(gpu.ops.message()).find("sum_batch needs beta 0") != std::string::npos);
}

TEST_CASE("gpu.ops.gemm_epilogue: fused bias/ReLU (and its fallbacks) against the CPU; planning writes nothing") {
  struct Case {
    const char* why;
    int m, n, k, batch;
    float beta;
    bool bias, relu;
    bool side_by_side;     // bdq's branch layout: entries side by side in C's rows, biases contiguous
    int bias_offset;       // elements past a 256-aligned address (1: a 4-byte-aligned bias)
    std::int64_t stride_bias;
  };
  const Case cases[] = {
      {"bias + relu (a dense layer)", 37, 53, 29, 1, 0.0f, true, true, false, 0, 0},
      {"bias only", 37, 53, 29, 1, 0.0f, true, false, false, 0, 0},
      {"relu only", 37, 53, 29, 1, 0.0f, false, true, false, 0, 0},
      {"4-byte-aligned bias", 37, 51, 29, 1, 0.0f, true, true, false, 1, 0},
      {"batched, branches side by side", 19, 153, 31, 4, 0.0f, true, false, true, 1, 153},
      {"batched, members apart, odd bias stride", 19, 23, 31, 3, 0.0f, true, true, false, 0, 29},
      {"batched, one bias for all", 19, 23, 31, 3, 0.0f, true, true, false, 0, 0},
      {"beta != 0 (runs unfused)", 37, 53, 29, 1, 0.5f, true, true, false, 0, 0},
      {"k = 0", 37, 53, 0, 1, 0.5f, true, true, false, 0, 0},
  };
  std::uint32_t seed = 900;
  for (const GemmPath& prec : kGemmPaths) {
    Gpu gpu(prec.p, with_gemm(prec.gemm));
    Cpu cpu;
    for (const Case& c : cases) {
      const std::string what = std::string(prec.name) + " gemm epilogue, " + c.why;
      INFO(what);
      Gemm g;
      g.tb = true;  // the weight layout: y = x Wᵀ
      g.m = c.m;
      g.n = c.n;
      g.k = c.k;
      g.beta = c.beta;
      g.lda = std::max(1, c.k);
      g.ldb = std::max(1, c.k);
      g.batch = c.batch;
      g.act = c.relu ? Act::relu : Act::none;
      std::int64_t nc = 0;
      if (c.side_by_side) {
        g.ldc = c.batch * c.n;
        g.stride_c = c.n;
        g.stride_a = c.k;
        g.lda = c.batch * c.k;
        nc = static_cast<std::int64_t>(c.m) * g.ldc;
      } else {
        g.ldc = c.n + 2;
        g.stride_c = c.batch > 1 ? static_cast<std::int64_t>(c.m) * g.ldc + 3 : 0;
        g.stride_a = c.batch > 1 ? static_cast<std::int64_t>(c.m) * g.lda : 0;
        nc = g.stride_c * (c.batch - 1) + static_cast<std::int64_t>(c.m) * g.ldc;
      }
      g.stride_b = c.batch > 1 ? static_cast<std::int64_t>(c.n) * g.ldb : 0;
      g.stride_bias = c.stride_bias;
      const std::size_t na = static_cast<std::size_t>(c.side_by_side ? std::int64_t(c.m) * g.lda
                                                                     : g.stride_a * (c.batch - 1) + std::int64_t(c.m) * g.lda);
      const std::size_t nb = static_cast<std::size_t>(g.stride_b * (c.batch - 1) + std::int64_t(c.n) * g.ldb);
      const std::size_t nbias = static_cast<std::size_t>(c.stride_bias * (c.batch - 1) + c.n + c.bias_offset);
      auto A = random_vec(na, -1, 1, seed++), B = random_vec(nb, -1, 1, seed++);
      auto bias = random_vec(nbias, -0.5f, 0.5f, seed++);
      auto C0 = c.beta != 0.0f ? random_vec(static_cast<std::size_t>(nc), -1, 1, seed++)
                               : std::vector<float>(static_cast<std::size_t>(nc), kNaN);
      Gemm gd = g;
      gd.a = gpu.put(A);
      gd.b = gpu.put(B);
      gd.c = gpu.put(C0);
      if (c.bias) gd.bias = gpu.put(bias) + c.bias_offset;
      // Planning (autotuning included) leaves C as it was.
      gpu.rt().plan_begin();
      gpu.ops.gemm(gd);
      gpu.rt().plan_end();
      gpu.ok();
      expect_same_bits(gpu.get(gd.c, nc), C0, what + " (after planning)");
      gpu.ops.gemm(gd);
      gpu.ok();
      const auto first = gpu.get(gd.c, nc);
      auto Cc = C0;
      Gemm gc = g;
      gc.a = host(A);
      gc.b = host(B);
      gc.c = host(Cc);
      if (c.bias) gc.bias = host(bias) + c.bias_offset;
      cpu.ops->gemm(gc);
      cpu.ok();
      expect_close(first, Cc, prec.tol, what);
      // The algorithm is fixed from the first run on: a rerun is bit-identical.
      gpu.set(gd.c, C0);
      gpu.ops.gemm(gd);
      gpu.ok();
      expect_same_bits(gpu.get(gd.c, nc), first, what + " (rerun)");
    }
  }
}

TEST_CASE("gpu.ops.tile_gemm: each tile shape, layout and copy width; ragged edges, a k longer than the pipeline") {
  // Small enough for racecheck and memcheck: every shape of tile_gemm on the four layouts, with
  // operands 16-byte aligned (16-byte copies) and not (4-byte copies), m, n and k off every tile
  // edge, k over ten 32-wide stages (more than the eight in flight), and the epilogue's
  // alpha, beta·C, bias and ReLU. The rerun is bit-identical.
  // Each shape with plain loads and with ldmatrix (cuda.tile_loads: the fragments of A,
  // untransposed, and B, transposed, by ldmatrix: in both layouts' k loops, two of the four
  // layouts' A and B each): the same bits both ways.
  const struct {
    const char* name;
    CudaSpec::Gemm gemm;
  } shapes[] = {{"16x32", CudaSpec::Gemm::tile16x32}, {"32x32", CudaSpec::Gemm::tile32x32},
                {"64x64", CudaSpec::Gemm::tile64x64}};
  std::map<std::string, std::vector<float>> plain;
  for (const auto& sh : shapes)
  for (const auto loads : {CudaSpec::TileLoads::plain, CudaSpec::TileLoads::ldmatrix}) {
    const char* shape = sh.name;
    const bool ldm = loads == CudaSpec::TileLoads::ldmatrix;
    std::uint32_t seed = 4000 + 100 * static_cast<std::uint32_t>(shape[0] - '0');  // the same operands both ways
    Gpu gpu(Precision::tf32, with_gemm(sh.gemm, loads));
    Cpu cpu;
    for (int layout = 0; layout < 4; ++layout)
      for (const bool aligned : {true, false}) {
        const bool ta = layout & 1, tb = layout & 2;
        const std::string what = std::string(shape) + (ta ? " A transposed" : "") + (tb ? " B transposed" : "") +
                                 (aligned ? ", 16-byte copies" : ", 4-byte copies");
        INFO(what);
        const int m = 37, n = 70, k = 303;
        Gemm g;
        g.ta = ta;
        g.tb = tb;
        g.m = m;
        g.n = n;
        g.k = k;
        g.alpha = 0.75f;
        g.beta = aligned ? 0.5f : 0.0f;
        const int a_rows = ta ? k : m, a_cols = ta ? m : k, b_rows = tb ? n : k, b_cols = tb ? k : n;
        // aligned: row strides rounded up to a multiple of 4; else odd ones
        g.lda = aligned ? (a_cols + 3) / 4 * 4 : a_cols | 1;
        g.ldb = aligned ? (b_cols + 3) / 4 * 4 : b_cols | 1;
        g.ldc = n + 2;
        g.act = layout % 2 ? Act::relu : Act::none;
        auto A = random_vec(static_cast<std::size_t>(a_rows) * g.lda, -1, 1, seed++);
        auto B = random_vec(static_cast<std::size_t>(b_rows) * g.ldb, -1, 1, seed++);
        auto bias = random_vec(static_cast<std::size_t>(n), -0.5f, 0.5f, seed++);
        const std::size_t nc = static_cast<std::size_t>(m) * g.ldc;
        auto C0 = g.beta != 0.0f ? random_vec(nc, -1, 1, seed++) : std::vector<float>(nc, kNaN);
        Gemm gd = g;
        gd.a = gpu.put(A);
        gd.b = gpu.put(B);
        gd.c = gpu.put(C0);
        gd.bias = gpu.put(bias);
        gpu.ops.gemm(gd);
        gpu.ok();
        const auto first = gpu.get(gd.c, static_cast<std::int64_t>(nc));
        auto Cc = C0;
        Gemm gc = g;
        gc.a = host(A);
        gc.b = host(B);
        gc.c = host(Cc);
        gc.bias = host(bias);
        cpu.ops->gemm(gc);
        cpu.ok();
        expect_close(first, Cc, kTf32Gemm, what);
        if (ldm) expect_same_bits(first, plain.at(what), what + " (ldmatrix)");
        else plain[what] = first;
        gpu.set(gd.c, C0);
        gpu.ops.gemm(gd);
        gpu.ok();
        expect_same_bits(gpu.get(gd.c, static_cast<std::int64_t>(nc)), first, what + " (rerun)");
      }
  }
}

TEST_CASE("gpu.ops.bias_act: bias + activation on a padded matrix") {
  const int rows = 37, cols = 53, ldy = 60;
  for (const Act act : {Act::none, Act::relu}) {
    for (const bool with_bias : {true, false}) {
      INFO("relu " << (act == Act::relu) << ", bias " << with_bias);
      Gpu gpu;
      Cpu cpu;
      auto y = random_vec(static_cast<std::size_t>(rows) * ldy, -1, 1, 1);
      auto b = random_vec(cols, -0.5f, 0.5f, 2);
      Real yd = gpu.put(y), bd = with_bias ? gpu.put(b) : Real{};
      gpu.ops.bias_act(yd, bd, rows, cols, ldy, act);
      gpu.ok();
      cpu.ops->bias_act(host(y), with_bias ? host(b) : Real{}, rows, cols, ldy, act);
      cpu.ok();
      expect_close(gpu.get(yd, rows * ldy), y, kElementwise, "bias_act (padding must stay as it was)");
    }
  }
}

TEST_CASE("gpu.ops.relu_backward: masks where y <= 0, zeros included") {
  // 53 of 59: the scalar kernel; 52 of 56 (multiples of 4, aligned rows): the four-column one
  struct Shape { int cols, ld; };
  for (const Shape sh : {Shape{53, 59}, Shape{52, 56}}) {
    CAPTURE(sh.cols);
    const int rows = 37, cols = sh.cols, ld = sh.ld;
    Gpu gpu;
    Cpu cpu;
    auto y = random_vec(static_cast<std::size_t>(rows) * ld, -1, 1, 3);
    for (std::size_t i = 0; i < y.size(); i += 4) y[i] = 0.0f;
    auto dy = random_vec(y.size(), -1, 1, 4);
    Real dyd = gpu.put(dy), yd = gpu.put(y);
    gpu.ops.relu_backward(dyd, yd, rows, cols, ld);
    gpu.ok();
    cpu.ops->relu_backward(host(dy), host(y), rows, cols, ld);
    cpu.ok();
    expect_same_bits(gpu.get(dyd, rows * ld), dy, "relu_backward (a mask is exact; padding untouched)");
  }
}

TEST_CASE("gpu.ops.cosine_embedding and hadamard (IQN) against the CPU") {
  Gpu gpu;
  Cpu cpu;
  {  // cos(π i τ): the GPU reduces i·τ mod 2 exactly and takes a float cospi
    const int rows = 333, E = 64;
    auto tau = random_vec(rows, 0, 1, 7);
    tau[0] = 0.0f;
    tau[1] = 0.99999994f;
    std::vector<float> out(static_cast<std::size_t>(rows) * E);
    Real od = gpu.put(out), td = gpu.put(tau);
    gpu.ops.cosine_embedding(od, td, rows, E);
    gpu.ok();
    cpu.ops->cosine_embedding(host(out), host(tau), rows, E);
    cpu.ok();
    const auto g = gpu.get(od, rows * E);
    double worst = 0.0;
    for (std::size_t i = 0; i < g.size(); ++i) worst = std::max(worst, std::fabs(double(g[i]) - double(out[i])));
    CHECK(worst < 1e-6);  // absolute: every value lies in [-1, 1]
  }
  for (const int H : {64, 61}) {  // 64: the four-column kernel; 61: the scalar one
    CAPTURE(H);
    const int B = 7, N = 5;
    auto h2 = random_vec(static_cast<std::size_t>(B) * H, -1, 1, 8);
    auto phi = random_vec(static_cast<std::size_t>(B) * N * H, -1, 1, 9);
    std::vector<float> x(phi.size());
    Real xd = gpu.put(x), hd = gpu.put(h2), pd = gpu.put(phi);
    gpu.ops.hadamard(xd, hd, pd, B, N, H);
    gpu.ok();
    cpu.ops->hadamard(host(x), host(h2), host(phi), B, N, H);
    cpu.ok();
    expect_same_bits(gpu.get(xd, static_cast<std::int64_t>(x.size())), x, "hadamard (one product each)");
  }
}

TEST_CASE("gpu.ops.bias_grad: deterministic column sums, beta 0 overwrites") {
  const int rows = 301, cols = 53, ldy = 60;
  for (const float beta : {0.0f, 0.5f}) {
    INFO("beta " << beta);
    Gpu gpu;
    Cpu cpu;
    auto dy = random_vec(static_cast<std::size_t>(rows) * ldy, -1, 1, 5);
    auto db = beta == 0.0f ? std::vector<float>(cols, kNaN) : random_vec(cols, -1, 1, 6);
    Real dyd = gpu.put(dy), dbd = gpu.put(db);
    gpu.ops.bias_grad(dbd, dyd, rows, cols, ldy, beta);
    gpu.ok();
    cpu.ops->bias_grad(host(db), host(dy), rows, cols, ldy, beta);
    cpu.ok();
    expect_close(gpu.get(dbd, cols), db, kReduction, "bias_grad");
  }
}

// --- distributional head ----------------------------------------------------------------------

TEST_CASE("gpu.ops.dueling_combine and dueling_backward, separate and in place") {
  const int rows = 37, D = 3, A = 5, Z = 51, ldv = 60;
  const std::size_t n = static_cast<std::size_t>(rows) * D * A * Z;
  for (const bool in_place : {false, true}) {
    INFO("in place " << in_place);
    Gpu gpu;
    Cpu cpu;
    auto v = random_vec(static_cast<std::size_t>(rows) * ldv, -1, 1, 7);
    auto adv = random_vec(n, -1, 1, 8);
    Real vd = gpu.put(v), advd = gpu.put(adv);
    Real ld = in_place ? advd : gpu.poisoned(static_cast<std::int64_t>(n));
    gpu.ops.dueling_combine(ld, vd, ldv, advd, rows, D, A, Z);
    gpu.ok();
    std::vector<float> logits_c = in_place ? adv : std::vector<float>(n, kNaN);
    auto adv_c = adv;
    cpu.ops->dueling_combine(host(logits_c), host(v), ldv, in_place ? host(logits_c) : host(adv_c), rows, D, A, Z);
    cpu.ok();
    expect_close(gpu.get(ld, static_cast<std::int64_t>(n)), logits_c, kElementwise, "dueling_combine");

    auto dl = random_vec(n, -1, 1, 9);
    // Compact dadv (separate or in place), then (not in place) a padded one whose (row, branch)
    // blocks lie A·Z + 3 apart: the padding set to zero on both sides.
    for (const int ldd : in_place ? std::vector<int>{0} : std::vector<int>{0, A * Z + 3}) {
      INFO("lddadv " << ldd);
      const std::size_t nd = ldd ? static_cast<std::size_t>(rows) * D * ldd : n;
      std::vector<float> dv(static_cast<std::size_t>(rows) * ldv, kNaN);  // padding stays poisoned on both sides
      Real dld = gpu.put(dl), dvd = gpu.put(dv);
      Real dad = in_place ? dld : gpu.poisoned(static_cast<std::int64_t>(nd));
      gpu.ops.dueling_backward(dvd, ldv, dad, ldd, dld, rows, D, A, Z);
      gpu.ok();
      std::vector<float> dadv_c = in_place ? dl : std::vector<float>(nd, kNaN);
      auto dl_c = dl;
      cpu.ops->dueling_backward(host(dv), ldv, host(dadv_c), ldd, in_place ? host(dadv_c) : host(dl_c), rows, D, A, Z);
      cpu.ok();
      expect_close(gpu.get(dvd, rows * ldv), dv, kReduction, "dueling_backward dv");
      const auto got = gpu.get(dad, static_cast<std::int64_t>(nd));
      expect_close(got, dadv_c, kElementwise, "dueling_backward dadv");
      if (ldd > A * Z) {
        std::size_t zeros = 0;
        for (std::size_t i = 0; i < nd; ++i) zeros += static_cast<int>(i % static_cast<std::size_t>(ldd)) >= A * Z && got[i] == 0.0f;
        CHECK(zeros == static_cast<std::size_t>(rows) * D * (ldd - A * Z));
      }
    }
  }
}

TEST_CASE("gpu.ops.log_softmax: rows shorter than, near and longer than a warp") {
  const struct {
    int rows, n;
  } shapes[] = {{555, 51}, {37, 200}, {9, 7}, {3, 1}};
  for (const auto& s : shapes) {
    INFO("rows " << s.rows << ", n " << s.n);
    Gpu gpu;
    Cpu cpu;
    auto x = random_vec(static_cast<std::size_t>(s.rows) * s.n, -20, 20, 10);
    std::vector<float> lp(x.size(), kNaN);
    Real xd = gpu.put(x), lpd = gpu.poisoned(static_cast<std::int64_t>(x.size()));
    gpu.ops.log_softmax(lpd, xd, s.rows, s.n);
    gpu.ok();
    cpu.ops->log_softmax(host(lp), host(x), s.rows, s.n);
    cpu.ok();
    expect_close(gpu.get(lpd, static_cast<std::int64_t>(x.size())), lp, kElementwise, "log_softmax");
  }
}

TEST_CASE("gpu.ops.expected_q and argmax (ties keep the lowest index)") {
  const int rows = 37 * 15, Z = 51;
  Gpu gpu;
  Cpu cpu;
  auto lp = random_logp(rows, Z, 11);
  std::vector<float> q(rows, kNaN);
  Real lpd = gpu.put(lp), qd = gpu.poisoned(rows);
  gpu.ops.expected_q(qd, lpd, rows, Z, -10.0f, 10.0f);
  gpu.ok();
  cpu.ops->expected_q(host(q), host(lp), rows, Z, -10.0f, 10.0f);
  cpu.ok();
  expect_close(gpu.get(qd, rows), q, kReduction, "expected_q");

  const int arows = 111, n = 5;
  auto levels = random_ints(static_cast<std::size_t>(arows) * n, 0, 2, 12);  // three levels: many ties
  std::vector<float> qa(levels.size());
  for (std::size_t i = 0; i < qa.size(); ++i) qa[i] = 0.5f * levels[i] - 0.25f;
  std::vector<std::int32_t> idx_c(arows, -1), poison(arows, -1);
  Real qad = gpu.put(qa);
  auto* idx_d = gpu.put_typed(poison);
  gpu.ops.argmax(idx_d, qad, arows, n);
  gpu.ok();
  cpu.ops->argmax(idx_c.data(), host(qa), arows, n);
  cpu.ok();
  expect_same_bits(gpu.get_typed(idx_d, arows), idx_c, "argmax");
}

TEST_CASE("gpu.ops.c51_project: dense projection with clamped support and terminal states") {
  const int B = 37, D = 3, A = 5, Z = 51;
  Gpu gpu;
  Cpu cpu;
  auto tlp = random_logp(B * D * A, Z, 13);
  auto a_star = random_ints(static_cast<std::size_t>(B) * D, 0, A - 1, 14);
  auto rewards = random_vec(B, -3, 3, 15);
  rewards[0] = 30.0f;  // beyond v_max: all mass at the top atom
  rewards[1] = -30.0f;
  auto dones = random_vec(B, 0, 1, 16);
  for (float& d : dones) d = d < 0.3f ? 1.0f : 0.0f;
  C51Project p;
  p.B = B;
  p.D = D;
  p.A = A;
  p.Z = Z;
  p.gamma_n = 0.99f;
  C51Project pd = p, pc = p;
  std::vector<float> m(static_cast<std::size_t>(B) * D * Z, kNaN);
  pd.m = gpu.poisoned(static_cast<std::int64_t>(m.size()));
  pd.target_logp = gpu.put(tlp);
  pd.a_star = gpu.put_typed(a_star);
  pd.rewards = gpu.put(rewards);
  pd.dones = gpu.put(dones);
  gpu.ops.c51_project(pd);
  gpu.ok();
  pc.m = host(m);
  pc.target_logp = host(tlp);
  pc.a_star = a_star.data();
  pc.rewards = host(rewards);
  pc.dones = host(dones);
  cpu.ops->c51_project(pc);
  cpu.ok();
  expect_close(gpu.get(pd.m, static_cast<std::int64_t>(m.size())), m, kReduction, "c51_project");
}

TEST_CASE("gpu.ops.c51_xent: per-sample loss, weighted mean, gradient; = and +=") {
  const int B = 37, D = 3, A = 5, Z = 51;
  const std::size_t n = static_cast<std::size_t>(B) * D * A * Z;
  auto lp = random_logp(B * D * A, Z, 17);
  auto mlog = random_logp(B * D, Z, 18);
  std::vector<float> m(mlog.size());
  for (std::size_t i = 0; i < m.size(); ++i) m[i] = std::exp(mlog[i]);
  auto actions = random_ints(static_cast<std::size_t>(B) * D, 0, A - 1, 19);
  auto w = random_vec(B, 0.5f, 1.5f, 20);
  for (const bool accumulate : {false, true}) {
    for (const bool per_sample : {true, false}) {
      INFO("accumulate " << accumulate << ", per-sample output " << per_sample);
      Gpu gpu;
      Cpu cpu;
      C51Xent x;
      x.B = B;
      x.D = D;
      x.A = A;
      x.Z = Z;
      x.scale = 0.25f;
      x.accumulate = accumulate;
      const std::vector<float> loss0{accumulate ? 1.5f : kNaN};
      C51Xent xd = x, xc = x;
      xd.loss_per_sample = per_sample ? gpu.poisoned(B) : Real{};
      xd.loss = gpu.put(loss0);
      xd.dlogits = gpu.poisoned(static_cast<std::int64_t>(n));
      xd.logp = gpu.put(lp);
      xd.actions = gpu.put_typed(actions);
      xd.m = gpu.put(m);
      xd.weights = gpu.put(w);
      gpu.ops.c51_xent(xd);
      gpu.ok();
      std::vector<float> lps(B, kNaN), loss = loss0, dl(n, kNaN);
      xc.loss_per_sample = per_sample ? host(lps) : Real{};
      xc.loss = host(loss);
      xc.dlogits = host(dl);
      xc.logp = host(lp);
      xc.actions = actions.data();
      xc.m = host(m);
      xc.weights = host(w);
      cpu.ops->c51_xent(xc);
      cpu.ok();
      expect_close(gpu.get(xd.loss, 1), loss, kReduction, "c51_xent loss");
      expect_close(gpu.get(xd.dlogits, static_cast<std::int64_t>(n)), dl, kElementwise, "c51_xent dlogits");
      if (per_sample) expect_close(gpu.get(xd.loss_per_sample, B), lps, kReduction, "c51_xent loss_per_sample");
    }
  }
}

TEST_CASE("gpu.ops.c51_xent.dueling: the fused dueling backward (dv, padded dadv) over members, against the CPU") {
  // the ensemble's loss: K members against one m, dv [K·B, ldv] and dadv [K·B, D, ldd]
  const int B = 37, D = 3, A = 5, Z = 51, K = 3, ldv = Z + 1, ldd = A * Z + 1;
  const std::size_t n = static_cast<std::size_t>(K) * B * D * A * Z;
  auto lp = random_logp(K * B * D * A, Z, 27);
  auto mlog = random_logp(B * D, Z, 28);
  std::vector<float> m(mlog.size());
  for (std::size_t i = 0; i < m.size(); ++i) m[i] = std::exp(mlog[i]);
  auto actions = random_ints(static_cast<std::size_t>(B) * D, 0, A - 1, 29);
  auto w = random_vec(B, 0.5f, 1.5f, 30);
  Gpu gpu;
  Cpu cpu;
  C51Xent x;
  x.B = B; x.D = D; x.A = A; x.Z = Z; x.scale = 1.0f / K; x.members = K; x.lddv = ldv; x.lddadv = ldd;
  const std::size_t nv = static_cast<std::size_t>(K) * B * ldv, na = static_cast<std::size_t>(K) * B * D * ldd;
  C51Xent xd = x, xc = x;
  xd.loss = gpu.put(std::vector<float>{kNaN});
  xd.dlogits = gpu.poisoned(static_cast<std::int64_t>(n));
  xd.logp = gpu.put(lp); xd.actions = gpu.put_typed(actions); xd.m = gpu.put(m); xd.weights = gpu.put(w);
  xd.dv = gpu.poisoned(static_cast<std::int64_t>(nv)); xd.dadv = gpu.poisoned(static_cast<std::int64_t>(na));
  gpu.ops.c51_xent(xd);
  gpu.ok();
  std::vector<float> loss{kNaN}, dl(n, kNaN), dv(nv, kNaN), dadv(na, kNaN);
  xc.loss = host(loss); xc.dlogits = host(dl); xc.logp = host(lp); xc.actions = actions.data(); xc.m = host(m);
  xc.weights = host(w); xc.dv = host(dv); xc.dadv = host(dadv);
  cpu.ops->c51_xent(xc);
  cpu.ok();
  expect_close(gpu.get(xd.loss, 1), loss, kReduction, "c51_xent loss");
  expect_close(gpu.get(xd.dlogits, static_cast<std::int64_t>(n)), dl, kElementwise, "c51_xent dlogits");
  // dv's padding column stays poisoned on both sides (NaN = NaN in expect_close); dadv's is zero
  expect_close(gpu.get(xd.dv, static_cast<std::int64_t>(nv)), dv, kReduction, "c51_xent dv");
  const auto got = gpu.get(xd.dadv, static_cast<std::int64_t>(na));
  expect_close(got, dadv, kElementwise, "c51_xent dadv");
  std::size_t zeros = 0;
  for (std::size_t i = 0; i < na; ++i) zeros += i % ldd >= static_cast<std::size_t>(A * Z) && got[i] == 0.0f;
  CHECK(zeros == static_cast<std::size_t>(K) * B * D * (ldd - A * Z));

  // An action out of range (the CPU refuses it with an error): that branch's rows are NaN in every
  // member, its padding zero like every other row's, and the other branches are as before.
  auto bad_actions = actions;
  const int bad = 5 * D + 1;  // sample 5, branch 1
  bad_actions[static_cast<std::size_t>(bad)] = A;
  xd.actions = gpu.put_typed(bad_actions);
  xd.dadv = gpu.poisoned(static_cast<std::int64_t>(na));
  gpu.ops.c51_xent(xd);
  gpu.ok();
  const auto poisoned = gpu.get(xd.dadv, static_cast<std::int64_t>(na));
  std::size_t nan_rows = 0, pad_zeros = 0, same = 0;
  for (std::size_t i = 0; i < na; ++i) {
    const std::size_t row = i / ldd, col = i % ldd, bd = row % (static_cast<std::size_t>(B) * D);
    if (col >= static_cast<std::size_t>(A * Z)) pad_zeros += poisoned[i] == 0.0f;
    else if (bd == static_cast<std::size_t>(bad)) nan_rows += std::isnan(poisoned[i]);
    else same += poisoned[i] == got[i];
  }
  CHECK(pad_zeros == static_cast<std::size_t>(K) * B * D * (ldd - A * Z));
  CHECK(nan_rows == static_cast<std::size_t>(K) * A * Z);
  CHECK(same == static_cast<std::size_t>(K) * (B * D - 1) * A * Z);
}

// --- optimisation -----------------------------------------------------------------------------

namespace {

/// Device and host copies of one budget problem (H heads over P parameters).
struct BudgetCase {
  static constexpr int H = 3;
  static constexpr std::int64_t P = 10007;
  std::vector<float> grads, fractions{0.7f, 0.2f, 0.1f}, losses{1.25f, 0.5f, -0.125f};
  explicit BudgetCase(float bad_value = 0.0f, bool bad = false) {
    grads = random_vec(static_cast<std::size_t>(H * P), -1, 1, 21);
    for (std::int64_t i = 0; i < P; ++i) {
      grads[static_cast<std::size_t>(P + i)] *= 1e-3f;  // head 1: small norm, clip 1
      grads[static_cast<std::size_t>(2 * P + i)] = 0.0f;  // head 2: norm 0, clip 1
    }
    if (bad) grads[static_cast<std::size_t>(P + 1234)] = bad_value;
  }
};

}  // namespace

TEST_CASE("gpu.ops.dueling_dist: combine + log-softmax + Q + argmax in one pass, against the unfused CPU ops") {
  const struct {
    int rows, D, A, Z, star_from;
    bool q;
  } shapes[] = {{2 * 37, 3, 5, 51, 37, true}, {19, 2, 7, 101, 0, true}, {13, 4, 3, 9, 13, true}, {11, 3, 5, 33, 0, false},
                {17, 2, 8, 64, 5, true}, {9, 1, 9, 20, 0, true}, {6, 2, 1, 1, 0, true}};
  // While Z <= 64 and A <= 8 (the first, third, fourth, fifth and last shapes) a warp kernel: a
  // warp per action where rows·D <= 2048 (all of these; gpu.ops.dueling_dist.warps checks the
  // warp per (row, branch) beyond, bit for bit), a block per (row, branch) beyond (the second:
  // Z 101; the sixth: A 9).
  // fp32: the kernel's double arithmetic, as the CPU's; tf32: its float arithmetic (kFloatMath).
  // pad: adv's (row, branch) blocks A·Z + pad apart (0: compact, ldadv unset).
  for (const int pad : {0, 5})
  for (const Precision prec : {Precision::fp32, Precision::tf32})
  for (const auto& sh : shapes) {
    INFO("rows " << sh.rows << " D " << sh.D << " A " << sh.A << " Z " << sh.Z << " star_from " << sh.star_from
                 << (prec == Precision::fp32 ? " (double math)" : " (float math)") << " adv padding " << pad);
    const double tol_e = prec == Precision::fp32 ? kElementwise : kFloatMath;
    const double tol_r = prec == Precision::fp32 ? kReduction : kFloatMath;
    Gpu gpu(prec);
    Cpu cpu;
    const int ldv = sh.Z + 3;
    const std::size_t n = static_cast<std::size_t>(sh.rows) * sh.D * sh.A * sh.Z;
    const std::size_t nq = static_cast<std::size_t>(sh.rows) * sh.D * sh.A;
    const std::size_t ns = static_cast<std::size_t>(sh.rows - sh.star_from) * sh.D;
    auto v = random_vec(static_cast<std::size_t>(sh.rows) * ldv, -2, 2, 31);
    const int ldadv = pad ? sh.A * sh.Z + pad : 0;
    auto adv = random_vec(pad ? static_cast<std::size_t>(sh.rows) * sh.D * ldadv : n, -3, 3, 32);
    DuelingDist a;
    a.ldv = ldv; a.rows = sh.rows; a.D = sh.D; a.A = sh.A; a.Z = sh.Z; a.star_from = sh.q ? sh.star_from : 0;
    a.ldadv = ldadv;
    a.v_min = -10.0f; a.v_max = 10.0f;
    DuelingDist ad = a, ac = a;
    std::vector<std::int32_t> poison(ns, -1), star_c(ns, -1);
    std::vector<float> lp(n, kNaN), q(nq, kNaN);
    ad.logp = gpu.poisoned(static_cast<std::int64_t>(n));
    ad.q = sh.q ? gpu.poisoned(static_cast<std::int64_t>(nq)) : Real{};
    ad.v = gpu.put(v);
    ad.adv = gpu.put(adv);
    ad.a_star = sh.q ? gpu.put_typed(poison) : nullptr;
    gpu.ops.dueling_dist(ad);
    gpu.ok();
    ac.logp = host(lp);
    ac.q = sh.q ? host(q) : Real{};
    ac.v = host(v);
    ac.adv = host(adv);
    ac.a_star = sh.q ? star_c.data() : nullptr;
    cpu.ops->dueling_dist(ac);
    cpu.ok();
    expect_close(gpu.get(ad.logp, static_cast<std::int64_t>(n)), lp, tol_e, "dueling_dist logp");
    if (sh.q) {
      expect_close(gpu.get(ad.q, static_cast<std::int64_t>(nq)), q, tol_r, "dueling_dist q");
      expect_same_bits(gpu.get_typed(ad.a_star, ns), star_c, "dueling_dist a_star");
    }
  }
}

TEST_CASE("gpu.ops.dueling_dist.warps: a warp per action and a warp per (row, branch) give the same bits") {
  // 1,400 rows × 3 branches (4,200 pairs, over the 2,048 of a warp per action) run a warp per
  // (row, branch) in one call, and a warp per action in calls of 400 rows (1,200 pairs): the same
  // arithmetic in the same order, so the same bits; both against the CPU.
  constexpr int kRows = 1400, kChunk = 400, D = 3, A = 5, Z = 51;
  for (const Precision prec : {Precision::fp32, Precision::tf32}) {
    INFO((prec == Precision::fp32 ? "double math" : "float math"));
    Gpu gpu(prec);
    Cpu cpu;
    const int ldv = Z + 1;
    const std::size_t n = std::size_t{kRows} * D * A * Z, nq = std::size_t{kRows} * D * A, ns = std::size_t{kRows} * D;
    auto v = random_vec(std::size_t{kRows} * ldv, -2, 2, 61);
    auto adv = random_vec(n, -3, 3, 62);
    DuelingDist a;
    a.ldv = ldv; a.D = D; a.A = A; a.Z = Z; a.v_min = -10.0f; a.v_max = 10.0f;
    const Real v_d = gpu.put(v), adv_d = gpu.put(adv);
    DuelingDist whole = a;
    whole.rows = kRows;
    whole.v = v_d; whole.adv = adv_d;
    whole.logp = gpu.poisoned(static_cast<std::int64_t>(n));
    whole.q = gpu.poisoned(static_cast<std::int64_t>(nq));
    whole.a_star = gpu.put_typed(std::vector<std::int32_t>(ns, -1));
    gpu.ops.dueling_dist(whole);
    DuelingDist part = a;
    part.logp = gpu.poisoned(static_cast<std::int64_t>(n));
    part.q = gpu.poisoned(static_cast<std::int64_t>(nq));
    std::int32_t* star = gpu.put_typed(std::vector<std::int32_t>(ns, -1));
    for (int r0 = 0; r0 < kRows; r0 += kChunk) {
      DuelingDist c = part;
      c.rows = kChunk;
      c.v = v_d + std::int64_t{r0} * ldv;
      c.adv = adv_d + std::int64_t{r0} * D * A * Z;
      c.logp = part.logp + std::int64_t{r0} * D * A * Z;
      c.q = part.q + std::int64_t{r0} * D * A;
      c.a_star = star + std::int64_t{r0} * D;
      gpu.ops.dueling_dist(c);
    }
    gpu.ok();
    expect_same_bits(gpu.get(part.logp, static_cast<std::int64_t>(n)), gpu.get(whole.logp, static_cast<std::int64_t>(n)),
                     "logp");
    expect_same_bits(gpu.get(part.q, static_cast<std::int64_t>(nq)), gpu.get(whole.q, static_cast<std::int64_t>(nq)), "q");
    expect_same_bits(gpu.get_typed(star, ns), gpu.get_typed(whole.a_star, ns), "a_star");
    std::vector<float> lp(n), q(nq);
    std::vector<std::int32_t> star_c(ns, -1);
    DuelingDist ac = a;
    ac.rows = kRows;
    ac.v = host(v); ac.adv = host(adv); ac.logp = host(lp); ac.q = host(q); ac.a_star = star_c.data();
    cpu.ops->dueling_dist(ac);
    cpu.ok();
    expect_close(gpu.get(whole.logp, static_cast<std::int64_t>(n)), lp, prec == Precision::fp32 ? kElementwise : kFloatMath,
                 "logp against the CPU");
    expect_same_bits(gpu.get_typed(whole.a_star, ns), star_c, "a_star against the CPU");
  }
}

TEST_CASE("gpu.ops.head_forward: the GEMMs side by side and dueling_dist against the CPU's composition") {
  // tf32 keeps 10 mantissa bits of every GEMM operand: ≈5e-4 relative per product, so the
  // outputs get 5e-3 (norm-wise); a* is checked against the CPU's Q with the same allowance.
  constexpr double kTf32 = 5e-3;
  // x_pad: x's rows H2 + x_pad apart (0: unpadded, as the step's h2).
  const struct {
    int rows, H2, Hh, D, A, Z, star_from;
    bool dist;
    int x_pad;
  } shapes[] = {{74, 256, 128, 3, 5, 51, 37, true, 5}, {37, 72, 40, 2, 3, 11, 20, true, 5},
                {5, 13, 9, 1, 2, 3, 0, true, 5},       {21, 30, 17, 4, 3, 7, 0, false, 5},
                {83, 256, 128, 3, 5, 51, 0, false, 5}, {19, 40, 24, 3, 8, 64, 3, true, 5},
                {70, 256, 128, 3, 5, 51, 35, true, 0}};
  // pad: adv's (row, branch) blocks A·Z + pad apart (as bdq's ldaz: 255 → 256); 0: compact.
  for (const int pad : {0, 1})
  for (const auto& sh : shapes) {
    INFO("rows " << sh.rows << " H2 " << sh.H2 << " Hh " << sh.Hh << " D " << sh.D << " A " << sh.A << " Z " << sh.Z
                 << " adv padding " << pad);
    Gpu gpu(Precision::tf32);
    Cpu cpu;
    const int rows = sh.rows, H2 = sh.H2, Hh = sh.Hh, D = sh.D, A = sh.A, Z = sh.Z, hc = (1 + D) * Hh, az = A * Z;
    const int ldx = H2 + sh.x_pad, ldv = Z + 2, lda = az + pad;
    const std::size_t n_out = static_cast<std::size_t>(rows) * D * az, nq = static_cast<std::size_t>(rows) * D * A;
    const std::size_t n_adv = static_cast<std::size_t>(rows) * D * lda;
    const std::size_t ns = static_cast<std::size_t>(rows - sh.star_from) * D;
    const float s1 = 1.0f / std::sqrt(static_cast<float>(H2)), s2 = 1.0f / std::sqrt(static_cast<float>(Hh));
    auto x = random_vec(static_cast<std::size_t>(rows) * ldx, -1.5f, 1.5f, 61);
    auto w1 = random_vec(static_cast<std::size_t>(hc) * H2, -s1, s1, 62);
    auto b1 = random_vec(static_cast<std::size_t>(hc), -0.2f, 0.2f, 63);
    auto wv2 = random_vec(static_cast<std::size_t>(Z) * Hh, -s2, s2, 64);
    auto bv2 = random_vec(static_cast<std::size_t>(Z), -0.2f, 0.2f, 65);
    auto wb2 = random_vec(static_cast<std::size_t>(D) * az * Hh, -s2, s2, 66);
    auto bb2 = random_vec(static_cast<std::size_t>(D) * az, -0.2f, 0.2f, 67);
    HeadForward a;
    a.ldx = ldx; a.ldv = ldv; a.rows = rows; a.H2 = H2; a.Hh = Hh; a.D = D; a.A = A; a.Z = Z;
    a.star_from = sh.star_from; a.v_min = -10.0f; a.v_max = 10.0f; a.ldadv = pad ? lda : 0;
    HeadForward ag = a, ac = a;
    // one poisoned row beyond `rows` in every output: nothing may be written there
    ag.x = gpu.put(x); ag.w1 = gpu.put(w1); ag.b1 = gpu.put(b1); ag.wv2 = gpu.put(wv2); ag.bv2 = gpu.put(bv2);
    ag.wb2 = gpu.put(wb2); ag.bb2 = gpu.put(bb2);
    ag.hidden = gpu.poisoned(static_cast<std::int64_t>(rows + 1) * hc);
    ag.v = gpu.poisoned(static_cast<std::int64_t>(rows + 1) * ldv);
    ag.adv = gpu.poisoned(static_cast<std::int64_t>(rows + 1) * D * lda);
    std::vector<std::int32_t> poison(ns + D, -1);
    if (sh.dist) {
      ag.logp = gpu.poisoned(static_cast<std::int64_t>(n_out + static_cast<std::size_t>(D) * az));
      ag.q = gpu.poisoned(static_cast<std::int64_t>(nq + static_cast<std::size_t>(D) * A));
      ag.a_star = gpu.put_typed(poison);
    }
    for (int rep = 0; rep < 2; ++rep) gpu.ops.head_forward(ag);  // reruns give the same
    gpu.ok();
    std::vector<float> hid(static_cast<std::size_t>(rows) * hc, kNaN), v(static_cast<std::size_t>(rows) * ldv, kNaN),
        adv(n_adv, kNaN), lp(n_out, kNaN), q(nq, kNaN);
    std::vector<std::int32_t> star_c(ns, -1);
    ac.x = host(x); ac.w1 = host(w1); ac.b1 = host(b1); ac.wv2 = host(wv2); ac.bv2 = host(bv2); ac.wb2 = host(wb2);
    ac.bb2 = host(bb2); ac.hidden = host(hid); ac.v = host(v); ac.adv = host(adv);
    if (sh.dist) {
      ac.logp = host(lp);
      ac.q = host(q);
      ac.a_star = star_c.data();
    }
    cpu.ops->head_forward(ac);
    cpu.ok();
    auto hid_g = gpu.get(ag.hidden, static_cast<std::int64_t>(rows + 1) * hc);
    auto v_g = gpu.get(ag.v, static_cast<std::int64_t>(rows + 1) * ldv);
    auto adv_g = gpu.get(ag.adv, static_cast<std::int64_t>(rows + 1) * D * lda);
    auto all_nan = [](const std::vector<float>& h, std::size_t from, std::size_t to) {
      for (std::size_t i = from; i < to; ++i)
        if (!std::isnan(h[i])) return false;
      return true;
    };
    CHECK_MESSAGE(all_nan(hid_g, hid.size(), hid_g.size()), "hidden written beyond rows");
    CHECK_MESSAGE(all_nan(adv_g, n_adv, adv_g.size()), "adv written beyond rows");
    CHECK_MESSAGE(all_nan(v_g, v.size(), v_g.size()), "v written beyond rows");
    bool pad_kept = true;  // v's columns beyond Z keep what they held
    for (int r = 0; r < rows; ++r)
      for (int c = Z; c < ldv; ++c) pad_kept = pad_kept && std::isnan(v_g[static_cast<std::size_t>(r) * ldv + c]);
    CHECK_MESSAGE(pad_kept, "v's padding columns written");
    hid_g.resize(hid.size());
    adv_g.resize(n_adv);  // adv's padding: NaN on both sides (compared as equal)
    v_g.resize(v.size());
    for (std::size_t i = 0; i < v.size(); ++i)
      if (static_cast<int>(i % static_cast<std::size_t>(ldv)) >= Z) v_g[i] = v[i] = 0.0f;
    expect_close(hid_g, hid, kTf32, "head_forward hidden");
    expect_close(v_g, v, kTf32, "head_forward v");
    expect_close(adv_g, adv, kTf32, "head_forward adv");
    if (!sh.dist) continue;
    auto lp_g = gpu.get(ag.logp, static_cast<std::int64_t>(n_out + static_cast<std::size_t>(D) * az));
    auto q_g = gpu.get(ag.q, static_cast<std::int64_t>(nq + static_cast<std::size_t>(D) * A));
    auto star_g = gpu.get_typed(ag.a_star, ns + static_cast<std::size_t>(D));
    CHECK_MESSAGE(all_nan(lp_g, n_out, lp_g.size()), "logp written beyond rows");
    CHECK_MESSAGE(all_nan(q_g, nq, q_g.size()), "q written beyond rows");
    bool star_tail = true;
    for (std::size_t i = ns; i < star_g.size(); ++i) star_tail = star_tail && star_g[i] == -1;
    CHECK_MESSAGE(star_tail, "a* written beyond its rows");
    lp_g.resize(n_out);
    q_g.resize(nq);
    expect_close(lp_g, lp, kTf32, "head_forward logp");
    expect_close(q_g, q, kTf32, "head_forward q");
    int bad = 0;  // the GPU's a* must be a best action by the CPU's Q, up to the tf32 allowance
    for (std::size_t i = 0; i < ns; ++i) {
      const std::size_t r = static_cast<std::size_t>(sh.star_from) + i / static_cast<std::size_t>(D),
                        d = i % static_cast<std::size_t>(D);
      const float* qr = q.data() + (r * static_cast<std::size_t>(D) + d) * static_cast<std::size_t>(A);
      const int g = star_g[i];
      if (g < 0 || g >= A) {
        ++bad;
        continue;
      }
      const float best = qr[star_c[i]];
      if (qr[g] < best - 1e-2f * (1.0f + std::fabs(best))) ++bad;
    }
    CHECK_MESSAGE(bad == 0, bad << " of " << ns << " a* are not a best action");
  }
}

TEST_CASE("gpu.ops.head_backward_inputs: the masked GEMMs side by side against the CPU's composition") {
  constexpr double kTf32 = 5e-3;  // as head_forward: tf32 operands
  const struct {
    int rows, Hh, D, A, Z;
  } shapes[] = {{256, 128, 3, 5, 51}, {37, 40, 2, 3, 11}, {5, 9, 1, 2, 3}};
  for (const int pad : {0, 1})  // dadv's (row, branch) blocks A·Z + pad apart; 0: compact
  for (const auto& sh : shapes) {
    INFO("rows " << sh.rows << " Hh " << sh.Hh << " D " << sh.D << " A " << sh.A << " Z " << sh.Z << " dadv padding " << pad);
    Gpu gpu(Precision::tf32);
    Cpu cpu;
    const int rows = sh.rows, Hh = sh.Hh, D = sh.D, A = sh.A, Z = sh.Z, hc = (1 + D) * Hh, az = A * Z, lddv = Z + 3;
    auto dv = random_vec(static_cast<std::size_t>(rows) * lddv, -1, 1, 71);
    auto dadv = random_vec(static_cast<std::size_t>(rows) * D * (az + pad), -1, 1, 72);
    auto wv2 = random_vec(static_cast<std::size_t>(Z) * Hh, -0.3f, 0.3f, 73);
    auto wb2 = random_vec(static_cast<std::size_t>(D) * az * Hh, -0.3f, 0.3f, 74);
    auto hidden = random_vec(static_cast<std::size_t>(rows) * hc, -1, 1, 75);
    for (std::size_t i = 0; i < hidden.size(); i += 7) hidden[i] = 0.0f;  // exact zeros mask too
    HeadBackward a;
    a.lddv = lddv; a.rows = rows; a.Hh = Hh; a.D = D; a.A = A; a.Z = Z; a.lddadv = pad ? az + pad : 0;
    HeadBackward ag = a, ac = a;
    ag.dv = gpu.put(dv); ag.dadv = gpu.put(dadv); ag.wv2 = gpu.put(wv2); ag.wb2 = gpu.put(wb2);
    ag.hidden = gpu.put(hidden);
    ag.dhidden = gpu.poisoned(static_cast<std::int64_t>(rows + 1) * hc);  // one row beyond: untouched
    for (int rep = 0; rep < 2; ++rep) gpu.ops.head_backward_inputs(ag);
    gpu.ok();
    std::vector<float> dh(static_cast<std::size_t>(rows) * hc, kNaN);
    ac.dv = host(dv); ac.dadv = host(dadv); ac.wv2 = host(wv2); ac.wb2 = host(wb2); ac.hidden = host(hidden);
    ac.dhidden = host(dh);
    cpu.ops->head_backward_inputs(ac);
    cpu.ok();
    auto got = gpu.get(ag.dhidden, static_cast<std::int64_t>(rows + 1) * hc);
    bool tail = true;
    for (std::size_t i = dh.size(); i < got.size(); ++i) tail = tail && std::isnan(got[i]);
    CHECK_MESSAGE(tail, "dhidden written beyond rows");
    got.resize(dh.size());
    std::size_t mask_bad = 0;
    for (std::size_t i = 0; i < dh.size(); ++i)
      if (hidden[i] <= 0.0f && !(got[i] == 0.0f && dh[i] == 0.0f)) ++mask_bad;
    CHECK_MESSAGE(mask_bad == 0, mask_bad << " masked elements are not 0");
    expect_close(got, dh, kTf32, "head_backward_inputs dhidden");
  }
}

TEST_CASE("gpu.ops.c51_loss: fused target distribution, projection, cross-entropy and dueling backward") {
  const struct {
    int B, D, A, Z;
  } shapes[] = {{37, 3, 5, 51}, {5, 11, 4, 21}, {64, 1, 2, 101}, {9, 40, 3, 13}, {7, 2, 3, 300},
                {21, 2, 8, 64}, {6, 16, 3, 17}, {6, 17, 3, 17}, {4, 3, 9, 10}};
  // A warp per (sample, branch) while Z <= 64, A <= 8 and D <= 16 (shapes 1, 2, 6, 7); the block
  // kernel beyond (Z 101 or 300, D 40 or 17, A 9).
  // fp32: double arithmetic; tf32: float (kFloatMath). The last two shapes take several rounds
  // of branches per block, and several atoms per thread. pad: tadv's and dadv's (sample, branch)
  // blocks A·Z + pad apart (0: compact); dadv's padding must stay poisoned. Two warps a (sample,
  // branch) where the warp kernel runs and D <= 8 (shapes 1 and 6), one for larger D (2 and 7).
  for (const int pad : {0, 3})
  for (const Precision prec : {Precision::fp32, Precision::tf32})
  for (const auto& sh : shapes) {
    INFO("B " << sh.B << " D " << sh.D << " A " << sh.A << " Z " << sh.Z
              << (prec == Precision::fp32 ? " (double math)" : " (float math)") << " adv padding " << pad);
    const double tol = prec == Precision::fp32 ? kReduction : kFloatMath;
    Gpu gpu(prec);
    Cpu cpu;
    const int B = sh.B, D = sh.D, A = sh.A, Z = sh.Z, ld = Z + 2;
    const std::size_t n = static_cast<std::size_t>(B) * D * A * Z;
    const int ldadv = pad ? A * Z + pad : 0;
    const std::size_t na = pad ? static_cast<std::size_t>(B) * D * ldadv : n;  // tadv and dadv
    auto lp = random_logp(B * D * A, Z, 41);
    auto tv = random_vec(static_cast<std::size_t>(B) * ld, -2, 2, 42);
    auto tadv = random_vec(na, -3, 3, 43);
    auto actions = random_ints(static_cast<std::size_t>(B) * D, 0, A - 1, 44);
    auto a_star = random_ints(static_cast<std::size_t>(B) * D, 0, A - 1, 45);
    auto rewards = random_vec(B, -3, 3, 46);
    rewards[0] = 40.0f;  // beyond v_max: all mass at the top atom
    auto dones = random_vec(B, 0, 1, 47);
    for (float& d : dones) d = d < 0.3f ? 1.0f : 0.0f;
    auto w = random_vec(B, 0.5f, 1.5f, 48);
    C51Loss a;
    a.lddv = ld; a.ldtv = ld; a.B = B; a.D = D; a.A = A; a.Z = Z; a.gamma_n = 0.97f; a.v_min = -10.0f; a.v_max = 10.0f;
    a.ldtadv = ldadv; a.lddadv = ldadv;
    C51Loss ad = a, ac = a;
    ad.m = gpu.poisoned(static_cast<std::int64_t>(B) * D * Z);
    ad.loss_per_sample = gpu.poisoned(B);
    ad.loss = gpu.poisoned(1);
    ad.dv = gpu.put(std::vector<float>(static_cast<std::size_t>(B) * ld, kNaN));  // padding stays poisoned
    ad.dadv = gpu.poisoned(static_cast<std::int64_t>(na));
    ad.logp = gpu.put(lp);
    ad.actions = gpu.put_typed(actions);
    ad.weights = gpu.put(w);
    ad.tv = gpu.put(tv);
    ad.tadv = gpu.put(tadv);
    ad.a_star = gpu.put_typed(a_star);
    ad.rewards = gpu.put(rewards);
    ad.dones = gpu.put(dones);
    ad.work_logp = gpu.poisoned(static_cast<std::int64_t>(n));
    ad.work_dlogits = gpu.poisoned(static_cast<std::int64_t>(n));
    for (int rep = 0; rep < 3; ++rep) {  // the last-block counter must be back at 0 for the next launch
      gpu.ops.c51_loss(ad);
      gpu.ok();
    }
    std::vector<float> m(static_cast<std::size_t>(B) * D * Z, kNaN), lps(B, kNaN), loss(1, kNaN),
        dv(static_cast<std::size_t>(B) * ld, kNaN), dadv(na, kNaN), wl(n, kNaN), wd(n, kNaN);
    ac.m = host(m); ac.loss_per_sample = host(lps); ac.loss = host(loss); ac.dv = host(dv); ac.dadv = host(dadv);
    ac.logp = host(lp); ac.actions = actions.data(); ac.weights = host(w); ac.tv = host(tv); ac.tadv = host(tadv);
    ac.a_star = a_star.data(); ac.rewards = host(rewards); ac.dones = host(dones); ac.work_logp = host(wl);
    ac.work_dlogits = host(wd);
    cpu.ops->c51_loss(ac);
    cpu.ok();
    expect_close(gpu.get(ad.m, static_cast<std::int64_t>(m.size())), m, tol, "c51_loss m");
    expect_close(gpu.get(ad.loss_per_sample, B), lps, tol, "c51_loss per sample");
    expect_close(gpu.get(ad.loss, 1), loss, tol, "c51_loss loss");
    expect_close(gpu.get(ad.dv, static_cast<std::int64_t>(dv.size())), dv, tol, "c51_loss dv");
    expect_close(gpu.get(ad.dadv, static_cast<std::int64_t>(na)), dadv, tol, "c51_loss dadv");
    // the same bits in two results of the op (k elements from the device)
    const std::int64_t nm = static_cast<std::int64_t>(m.size()), ndv = static_cast<std::int64_t>(dv.size()),
                       nadv = static_cast<std::int64_t>(na);
    auto same = [&](const Real& x, const Real& y, std::int64_t k, const std::string& what) {
      expect_same_bits(gpu.get(x, k), gpu.get(y, k), what);
    };
    // without the loss (C51Loss::loss null: no last block sums the batch) the same bits
    // everywhere else; the loss then by weighted_mean from the per-sample losses and the weights,
    // as the CPU twin's, and close to the fused one (which weights each sample before rounding it)
    C51Loss an = ad;
    an.loss = Real{};
    an.m = gpu.poisoned(static_cast<std::int64_t>(B) * D * Z);
    an.loss_per_sample = gpu.poisoned(B);
    an.dv = gpu.put(std::vector<float>(static_cast<std::size_t>(B) * ld, kNaN));
    an.dadv = gpu.poisoned(nadv);
    gpu.ops.c51_loss(an);
    gpu.ok();
    same(an.m, ad.m, nm, "c51_loss without loss: m");
    same(an.loss_per_sample, ad.loss_per_sample, B, "c51_loss without loss: per sample");
    same(an.dv, ad.dv, ndv, "c51_loss without loss: dv");
    same(an.dadv, ad.dadv, nadv, "c51_loss without loss: dadv");
    const Real mean = gpu.poisoned(1);
    gpu.ops.weighted_mean(mean, an.loss_per_sample, ad.weights, B);
    gpu.ok();
    std::vector<float> mean_cpu(1, kNaN);
    cpu.ops->weighted_mean(host(mean_cpu), host(lps), host(w), B);
    cpu.ok();
    expect_close(gpu.get(mean, 1), mean_cpu, tol, "weighted_mean of the per-sample losses against the CPU's");
    expect_close(gpu.get(mean, 1), gpu.get(ad.loss, 1), kReduction, "weighted_mean against the fused loss");
    // and the fused loss again after it (its last-block counter untouched by the launch without)
    const Real again = gpu.poisoned(1);
    C51Loss aa = ad;
    aa.loss = again;
    gpu.ops.c51_loss(aa);
    gpu.ok();
    same(again, ad.loss, 1, "c51_loss after one without loss: loss");
  }
}

TEST_CASE("gpu.ops.weighted_mean: (1/n) Σ w·x against the CPU twin, awkward sizes") {
  Gpu gpu;
  Cpu cpu;
  for (const int n : {0, 1, 37, 256, 1000, 5003}) {
    INFO("n " << n);
    const auto x = random_vec(static_cast<std::size_t>(n), -4, 9, 61);
    const auto w = random_vec(static_cast<std::size_t>(n), 0.1f, 2, 62);
    const Real out = gpu.poisoned(1);
    const Real xd = n > 0 ? gpu.put(x) : Real{}, wd = n > 0 ? gpu.put(w) : Real{};
    gpu.ops.weighted_mean(out, xd, wd, n);
    gpu.ok();
    std::vector<float> ref(1, kNaN);
    auto xc = x, wc = w;
    cpu.ops->weighted_mean(host(ref), n > 0 ? host(xc) : Real{}, n > 0 ? host(wc) : Real{}, n);
    cpu.ok();
    double exact = 0.0;
    for (std::size_t i = 0; i < x.size(); ++i) exact += static_cast<double>(w[i]) * x[i];
    exact = n > 0 ? exact / n : 0.0;
    CHECK(ref[0] == doctest::Approx(exact).epsilon(1e-6));
    expect_close(gpu.get(out, 1), ref, kReduction, "weighted_mean");
    if (n == 0) CHECK(gpu.get(out, 1)[0] == 0.0f);
  }
  // a negative size is refused, with the op's name and the reason
  Gpu bad;
  bad.ops.weighted_mean(bad.poisoned(1), Real{}, Real{}, -1);
  CHECK(bad.ops.status() != 0);
  CHECK(std::string(bad.ops.message()).find("weighted_mean: negative size") != std::string::npos);
}

TEST_CASE("gpu.ops.relu_bias_grad: masks and column sums for several heads sharing the activation") {
  const int rows = 37, cols = 75, ld = 80, heads = 3;
  const std::int64_t stride_dy = std::int64_t(rows) * ld + 16, stride_db = 97;
  Gpu gpu;
  Cpu cpu;
  auto y = random_vec(static_cast<std::size_t>(rows) * ld, -1, 1, 51);
  for (std::size_t i = 0; i < y.size(); i += 7) y[i] = 0.0f;  // zeros mask too
  auto dy = random_vec(static_cast<std::size_t>(stride_dy) * heads, -1, 1, 52);
  std::vector<float> db(static_cast<std::size_t>(stride_db) * heads, kNaN);
  Real dyd = gpu.put(dy), yd = gpu.put(y), dbd = gpu.put(db);
  gpu.ops.relu_bias_grad(dyd, yd, dbd, rows, cols, ld, heads, stride_dy, 0, stride_db);
  gpu.ok();
  cpu.ops->relu_bias_grad(host(dy), host(y), host(db), rows, cols, ld, heads, stride_dy, 0, stride_db);
  cpu.ok();
  expect_close(gpu.get(dyd, static_cast<std::int64_t>(dy.size())), dy, 0.0, "relu_bias_grad dy");
  expect_close(gpu.get(dbd, static_cast<std::int64_t>(db.size())), db, kReduction, "relu_bias_grad db");
  // per-head activations (ensemble members), and no mask at all (a plain bias gradient per head)
  auto y3 = random_vec(static_cast<std::size_t>(stride_dy) * heads, -1, 1, 53);
  auto dy2 = random_vec(dy.size(), -1, 1, 54), dy3 = dy2;
  Real dy2d = gpu.put(dy2), y3d = gpu.put(y3);
  gpu.ops.relu_bias_grad(dy2d, y3d, dbd, rows, cols, ld, heads, stride_dy, stride_dy, stride_db);
  gpu.ok();
  cpu.ops->relu_bias_grad(host(dy2), host(y3), host(db), rows, cols, ld, heads, stride_dy, stride_dy, stride_db);
  expect_close(gpu.get(dy2d, static_cast<std::int64_t>(dy2.size())), dy2, 0.0, "relu_bias_grad per-head y");
  expect_close(gpu.get(dbd, static_cast<std::int64_t>(db.size())), db, kReduction, "relu_bias_grad per-head db");
  Real dy3d = gpu.put(dy3);
  gpu.ops.relu_bias_grad(dy3d, Real{}, dbd, rows, cols, ld, heads, stride_dy, 0, stride_db);
  gpu.ok();
  cpu.ops->relu_bias_grad(host(dy3), Real{}, host(db), rows, cols, ld, heads, stride_dy, 0, stride_db);
  cpu.ok();
  expect_close(gpu.get(dbd, static_cast<std::int64_t>(db.size())), db, kReduction, "relu_bias_grad no mask");
  // no db: the masks alone (the trunk backward's critical path), four columns at a time where
  // the shape allows and one at a time where it does not; db must stay as it was
  const std::vector<float> db_before = gpu.get(dbd, static_cast<std::int64_t>(db.size()));
  const struct {
    int rows, cols, ld;
    std::int64_t stride;
  } masks[] = {{37, 64, 68, 37 * 68 + 4}, {37, 64, 68, 37 * 68 + 1}, {rows, cols, ld, stride_dy}, {300, 12, 12, 3600}};
  for (const auto& m : masks) {
    INFO("mask only: rows " << m.rows << " cols " << m.cols << " ld " << m.ld << " head stride " << m.stride);
    auto ym = random_vec(static_cast<std::size_t>(m.stride) * heads, -1, 1, 55);
    auto dym = random_vec(ym.size(), -1, 1, 56);
    Real dymd = gpu.put(dym), ymd = gpu.put(ym);
    gpu.ops.relu_bias_grad(dymd, ymd, Real{}, m.rows, m.cols, m.ld, heads, m.stride, m.stride, 0);
    gpu.ok();
    cpu.ops->relu_bias_grad(host(dym), host(ym), Real{}, m.rows, m.cols, m.ld, heads, m.stride, m.stride, 0);
    cpu.ok();
    expect_close(gpu.get(dymd, static_cast<std::int64_t>(dym.size())), dym, 0.0, "relu_bias_grad mask only");
  }
  expect_same_bits(gpu.get(dbd, static_cast<std::int64_t>(db.size())), db_before, "db untouched by mask-only calls");
}

TEST_CASE("gpu.ops.budget: norms, clips, combined gradient, total loss; NaN/Inf skip") {
  const struct {
    const char* why;
    bool bad;
    float value;
  } cases[] = {{"all finite", false, 0.0f}, {"NaN in head 1", true, kNaN},
               {"Inf in head 1", true, std::numeric_limits<float>::infinity()}};
  for (const auto& c : cases) {
    INFO(c.why);
    Gpu gpu;
    Cpu cpu;
    BudgetCase bc(c.value, c.bad);
    const int H = BudgetCase::H;
    const std::int64_t P = BudgetCase::P;
    Budget b;
    b.H = H;
    b.P = P;
    b.max_grad_norm = 10.0f;
    Budget bd = b, bh = b;
    bd.grads = gpu.put(bc.grads);
    bd.fractions = gpu.put(bc.fractions);
    bd.losses = gpu.put(bc.losses);
    bd.norms = gpu.poisoned(H);
    bd.clips = gpu.poisoned(H);
    bd.g = gpu.poisoned(P);
    bd.total_loss = gpu.poisoned(1);
    bd.skip = gpu.put_typed(std::vector<std::int32_t>{-7});
    bd.skipped = gpu.put_typed(std::vector<std::int64_t>{5});
    gpu.ops.budget(bd);
    gpu.ok();
    std::vector<float> norms(H, kNaN), clips(H, kNaN), g(static_cast<std::size_t>(P), kNaN), total{kNaN};
    std::int32_t skip = -7;
    std::int64_t skipped = 5;
    bh.grads = host(bc.grads);
    bh.fractions = host(bc.fractions);
    bh.losses = host(bc.losses);
    bh.norms = host(norms);
    bh.clips = host(clips);
    bh.g = host(g);
    bh.total_loss = host(total);
    bh.skip = &skip;
    bh.skipped = &skipped;
    cpu.ops->budget(bh);
    cpu.ok();
    expect_close(gpu.get(bd.norms, H), norms, kReduction, "budget norms");
    expect_close(gpu.get(bd.clips, H), clips, kReduction, "budget clips");
    expect_close(gpu.get(bd.g, P), g, kReduction, "budget g");
    expect_close(gpu.get(bd.total_loss, 1), total, kReduction, "budget total loss");
    CHECK(gpu.get_typed(bd.skip, 1)[0] == (c.bad ? 1 : 0));
    CHECK(gpu.get_typed(bd.skipped, 1)[0] == (c.bad ? 6 : 5));
    CHECK(skip == (c.bad ? 1 : 0));
    if (!c.bad) CHECK(clips[0] < 1.0f);  // the case really clips head 0
  }
}

TEST_CASE("gpu.ops.adam: t and lr from device memory; skip leaves everything bit-identical") {
  const std::int64_t P = 10007;
  auto params = random_vec(P, -1, 1, 22), g = random_vec(P, -0.1f, 0.1f, 23), m = random_vec(P, -0.01f, 0.01f, 24);
  auto v = random_vec(P, 0, 1e-2f, 25);
  for (float& x : v) x *= x;
  const std::vector<float> lr{1e-3f};
  for (const int skip : {0, 1}) {
    INFO("skip " << skip);
    Gpu gpu;
    Cpu cpu;
    Adam a;
    a.P = P;
    Adam ad = a, ac = a;
    ad.params = gpu.put(params);
    ad.g = gpu.put(g);
    ad.m = gpu.put(m);
    ad.v = gpu.put(v);
    ad.lr = gpu.put(lr);
    ad.t = gpu.put_typed(std::vector<std::int64_t>{5});
    ad.skip = gpu.put_typed(std::vector<std::int32_t>{skip});
    gpu.ops.adam(ad);
    gpu.ok();
    auto pc = params, mc = m, vc = v, lrc = lr;
    std::int64_t t = 5;
    const std::int32_t skip_c = skip;
    ac.params = host(pc);
    ac.g = host(g);
    ac.m = host(mc);
    ac.v = host(vc);
    ac.lr = host(lrc);
    ac.t = &t;
    ac.skip = &skip_c;
    cpu.ops->adam(ac);
    cpu.ok();
    const auto pg = gpu.get(ad.params, P), mg = gpu.get(ad.m, P), vg = gpu.get(ad.v, P);
    const auto tg = gpu.get_typed(ad.t, 1)[0];
    CHECK(tg == t);
    CHECK(tg == (skip ? 5 : 6));
    if (skip) {
      expect_same_bits(pg, params, "adam skipped: params");
      expect_same_bits(mg, m, "adam skipped: m");
      expect_same_bits(vg, v, "adam skipped: v");
    } else {
      expect_close(pg, pc, kElementwise, "adam params");
      expect_close(mg, mc, kElementwise, "adam m");
      expect_close(vg, vc, kElementwise, "adam v");
    }
  }
}

namespace {

/// Three matrices: one with σ far above σ_max (scaled), one below (untouched), one tiny.
struct SpectralCase {
  struct M {
    int rows, cols;
    float gain;
  };
  std::vector<M> shapes{{37, 53, 1.0f}, {51, 128, 0.05f}, {7, 5, 1.0f}};
  std::vector<std::vector<float>> w, u;
  SpectralCase() {
    std::uint32_t seed = 30;
    for (const M& s : shapes) {
      auto wm = random_vec(static_cast<std::size_t>(s.rows) * s.cols, -1, 1, seed++);
      for (float& x : wm) x *= s.gain;
      auto um = random_vec(s.rows, -1, 1, seed++);
      double n = 0;
      for (float x : um) n += static_cast<double>(x) * x;
      for (float& x : um) x = static_cast<float>(x / std::sqrt(n));
      w.push_back(wm);
      u.push_back(um);
    }
  }
};

}  // namespace

TEST_CASE("gpu.ops.spectral_norm: one launch for all matrices; skip leaves W and u unchanged") {
  const int max_rows = 51, max_cols = 128;
  for (const int skip : {0, 1}) {
    INFO("skip " << skip);
    Gpu gpu;
    Cpu cpu;
    SpectralCase sc;
    std::vector<SpectralMatrix> dev, hst;
    std::vector<Real> wd, ud;
    for (std::size_t k = 0; k < sc.shapes.size(); ++k) {
      wd.push_back(gpu.put(sc.w[k]));
      ud.push_back(gpu.put(sc.u[k]));
      dev.push_back({wd.back(), ud.back(), sc.shapes[k].rows, sc.shapes[k].cols});
    }
    auto wc = sc.w, uc = sc.u;
    for (std::size_t k = 0; k < sc.shapes.size(); ++k)
      hst.push_back({host(wc[k]), host(uc[k]), sc.shapes[k].rows, sc.shapes[k].cols});
    auto* table = gpu.put_typed(dev);
    auto* skip_d = gpu.put_typed(std::vector<std::int32_t>{skip});
    const std::int32_t skip_c = skip;
    for (int iter = 0; iter < 2; ++iter) {  // two steps: the second starts from the updated u
      gpu.ops.spectral_norm(table, static_cast<int>(dev.size()), max_rows, max_cols, 2.0f, skip_d);
      cpu.ops->spectral_norm(hst.data(), static_cast<int>(hst.size()), max_rows, max_cols, 2.0f, &skip_c);
    }
    gpu.ok();
    cpu.ok();
    for (std::size_t k = 0; k < sc.shapes.size(); ++k) {
      const std::int64_t n = static_cast<std::int64_t>(sc.w[k].size());
      const auto wg = gpu.get(wd[k], n), ug = gpu.get(ud[k], sc.shapes[k].rows);
      if (skip) {
        expect_same_bits(wg, sc.w[k], "spectral skipped: W " + std::to_string(k));
        expect_same_bits(ug, sc.u[k], "spectral skipped: u " + std::to_string(k));
      } else {
        expect_close(wg, wc[k], kReduction, "spectral W " + std::to_string(k));
        expect_close(ug, uc[k], kReduction, "spectral u " + std::to_string(k));
      }
    }
    if (!skip) {
      CHECK(wc[0][0] != sc.w[0][0]);  // the first matrix really was scaled
      CHECK(wc[1] == sc.w[1]);        // the second was not
    }
  }
}

TEST_CASE("gpu.ops.target_update: Polyak, hard copy on the period, no copy off it, skip") {
  const std::int64_t P = 10007;
  const auto params = random_vec(P, -1, 1, 40), target0 = random_vec(P, -1, 1, 41);
  const struct {
    const char* why;
    std::int64_t period, t;
    int skip;
  } cases[] = {{"polyak", 0, 3, 0}, {"hard, t on the period", 4, 8, 0}, {"hard, t off the period", 4, 9, 0},
               {"polyak, skipped", 0, 3, 1}, {"hard, on the period, skipped", 4, 8, 1}};
  for (const auto& c : cases) {
    INFO(c.why);
    Gpu gpu;
    Cpu cpu;
    TargetUpdate tu;
    tu.P = P;
    tu.tau = 0.005f;
    tu.period = c.period;
    TargetUpdate td = tu, tc = tu;
    td.target = gpu.put(target0);
    td.params = gpu.put(params);
    td.t = gpu.put_typed(std::vector<std::int64_t>{c.t});
    td.skip = gpu.put_typed(std::vector<std::int32_t>{c.skip});
    gpu.ops.target_update(td);
    gpu.ok();
    auto tgt = target0, src = params;
    const std::int64_t t = c.t;
    const std::int32_t skip = c.skip;
    tc.target = host(tgt);
    tc.params = host(src);
    tc.t = &t;
    tc.skip = &skip;
    cpu.ops->target_update(tc);
    cpu.ok();
    const auto got = gpu.get(td.target, P);
    if (c.skip || c.period > 0) {
      expect_same_bits(got, tgt, "target update (copy or untouched: exact)");
    } else {
      expect_close(got, tgt, kElementwise, "polyak target");
    }
    if (c.skip) expect_same_bits(got, target0, "skipped target update");
  }
}

// --- elementwise and memory -------------------------------------------------------------------

TEST_CASE("gpu.ops.uniform: the same Philox numbers as the CPU, keyed by the device step") {
  const std::int64_t n = 1001;
  Gpu gpu;
  Cpu cpu;
  const std::int64_t step = 42;
  auto* step_d = gpu.put_typed(std::vector<std::int64_t>{step});
  Uniform u;
  u.n = n;
  u.seed = 0x1234567890ABCDEFull;
  u.stream = 3;
  for (const bool with_step : {true, false}) {
    INFO("step pointer " << with_step);
    Uniform ud = u, uc = u;
    ud.out = gpu.poisoned(n);
    ud.step = with_step ? step_d : nullptr;
    gpu.ops.uniform(ud);
    gpu.ok();
    std::vector<float> ref(static_cast<std::size_t>(n), kNaN);
    uc.out = host(ref);
    uc.step = with_step ? &step : nullptr;
    cpu.ops->uniform(uc);
    cpu.ok();
    const auto got = gpu.get(ud.out, n);
    expect_same_bits(got, ref, "uniform");
    for (float x : got) REQUIRE((x > 0.0f && x < 1.0f));
  }
}

TEST_CASE("gpu.ops.fill, copy, axpy, and the host transfers") {
  const std::int64_t n = 1001;
  Gpu gpu;
  Cpu cpu;
  auto x = random_vec(n, -1, 1, 50), y = random_vec(n, -1, 1, 51);
  Real xd = gpu.put(x), yd = gpu.put(y), fd = gpu.poisoned(n), cd = gpu.poisoned(n);
  gpu.ops.fill(fd, 0.25f, n);
  gpu.ops.copy(cd, xd, n);
  gpu.ops.axpy(yd, xd, -0.3f, n);
  gpu.ok();
  CHECK(gpu.get(fd, n) == std::vector<float>(static_cast<std::size_t>(n), 0.25f));
  expect_same_bits(gpu.get(cd, n), x, "copy");
  auto yc = y;
  cpu.ops->axpy(host(yc), host(x), -0.3f, n);
  cpu.ok();
  expect_close(gpu.get(yd, n), yc, kElementwise, "axpy");

  // Raw bytes round trip (upload/download) of an odd size.
  std::vector<unsigned char> bytes(777), back(777, 0);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>(i * 37 + 11);
  void* raw = gpu.raw(bytes.size());
  gpu.ops.upload(raw, bytes.data(), bytes.size());
  gpu.ops.download(back.data(), raw, back.size());
  gpu.ok();
  CHECK(back == bytes);
}

// --- errors, plan mode ------------------------------------------------------------------------

TEST_CASE("gpu.ops.errors: first error wins; runtime misuse throws") {
  Gpu gpu;
  CHECK(gpu.ops.status() == 0);
  Real wide = gpu.reals(8);
  wide.esize = 8;
  gpu.ops.fill(wide, 1.0f, 4);
  CHECK(gpu.ops.status() != 0);
  const std::string first = gpu.ops.message();
  CHECK(first.find("element size") != std::string::npos);
  gpu.ops.fill(gpu.reals(4), 1.0f, -1);
  CHECK(std::string(gpu.ops.message()) == first);

  CHECK_THROWS_AS(gpu.rt().alloc_arena(1024), std::runtime_error);  // the arena is allocated once
  CHECK_THROWS_AS(gpu.rt().replay(), std::runtime_error);           // nothing captured yet
  CHECK_THROWS_AS(gpu.rt().plan_end(), std::runtime_error);         // no plan begun
  CHECK_THROWS_AS(make_cuda_runtime(CudaSpec{}, Precision::fp32, 4096), std::runtime_error);
  CHECK(gpu.rt().captures());
  CHECK(gpu.rt().describe().find("cuda device 0") != std::string::npos);
  CHECK(gpu.rt().peak_bytes() >= (std::size_t{64} << 20));
}

TEST_CASE("gpu.ops.plan: scratch beyond the reserve needs a plan; planning does no work") {
  // A bf16 GEMM whose operand copies (~9.8 MB) exceed the scratch reserved at creation (8 MiB).
  const int m = 16384, n = 3, k = 300;
  auto A = random_vec(static_cast<std::size_t>(m) * k, -1, 1, 60), B = random_vec(static_cast<std::size_t>(n) * k, -1, 1, 61);
  Gemm g;
  g.tb = true;
  g.m = m;
  g.n = n;
  g.k = k;
  g.lda = k;
  g.ldb = k;
  g.ldc = n;
  {
    Gpu gpu(Precision::bf16);
    Gemm gd = g;
    gd.a = gpu.put(A);
    gd.b = gpu.put(B);
    gd.c = gpu.poisoned(static_cast<std::int64_t>(m) * n);
    gpu.ops.gemm(gd);
    gpu.rt().synchronize();
    CHECK(gpu.ops.status() != 0);
    CHECK(std::string(gpu.ops.message()).find("plan") != std::string::npos);
  }
  Gpu gpu(Precision::bf16);
  Gemm gd = g;
  gd.a = gpu.put(A);
  gd.b = gpu.put(B);
  gd.c = gpu.poisoned(static_cast<std::int64_t>(m) * n);
  gpu.rt().plan_begin();
  gpu.ops.gemm(gd);
  gpu.rt().plan_end();
  gpu.ok();
  for (float x : gpu.get(gd.c, static_cast<std::int64_t>(m) * n)) REQUIRE(std::isnan(x));  // planning ran nothing
  gpu.ops.gemm(gd);
  gpu.ok();
  std::vector<float> C(static_cast<std::size_t>(m) * n, kNaN);
  Cpu cpu;
  Gemm gc = g;
  gc.a = host(A);
  gc.b = host(B);
  gc.c = host(C);
  cpu.ops->gemm(gc);
  cpu.ok();
  expect_close(gpu.get(gd.c, static_cast<std::int64_t>(m) * n), C, kBf16Gemm, "planned bf16 gemm");
}

// --- skip chain, determinism, capture ---------------------------------------------------------

TEST_CASE("gpu.ops.skip_chain: budget → adam → spectral norm → target, finite and with a NaN head") {
  for (const bool bad : {false, true}) {
    INFO("NaN head " << bad);
    Gpu gpu;
    Cpu cpu;
    BudgetCase bc(kNaN, bad);
    const int H = BudgetCase::H;
    const std::int64_t P = BudgetCase::P;
    // Parameters: the first 37·53 of them also form the spectrally normed matrix.
    const int rows = 37, cols = 53;
    auto params = random_vec(P, -1, 1, 70), m = random_vec(P, -0.01f, 0.01f, 71), v = random_vec(P, 0, 1e-4f, 72);
    auto target = random_vec(P, -1, 1, 73), u = random_vec(rows, -0.2f, 0.2f, 74);
    const std::vector<float> lr{1e-3f};
    struct Side {
      Budget b;
      Adam a;
      TargetUpdate t;
      SpectralMatrix s;
    };
    auto build = [&](Side& sd, auto&& real, std::int32_t* skip, std::int64_t* skipped, std::int64_t* t) {
      sd.b.H = H;
      sd.b.P = P;
      sd.b.grads = real(bc.grads);
      sd.b.fractions = real(bc.fractions);
      sd.b.losses = real(bc.losses);
      sd.b.norms = real(std::vector<float>(H, kNaN));
      sd.b.clips = real(std::vector<float>(H, kNaN));
      sd.b.g = real(std::vector<float>(static_cast<std::size_t>(P), kNaN));
      sd.b.total_loss = real(std::vector<float>{kNaN});
      sd.b.skip = skip;
      sd.b.skipped = skipped;
      sd.a.P = P;
      sd.a.params = real(params);
      sd.a.g = sd.b.g;
      sd.a.m = real(m);
      sd.a.v = real(v);
      sd.a.lr = real(lr);
      sd.a.t = t;
      sd.a.skip = skip;
      sd.s = {sd.a.params, real(u), rows, cols};
      sd.t.P = P;
      sd.t.target = real(target);
      sd.t.params = sd.a.params;
      sd.t.t = t;
      sd.t.skip = skip;
    };
    Side dg, hc;
    std::int32_t* skip_d = gpu.put_typed(std::vector<std::int32_t>{-1});
    std::int64_t* skipped_d = gpu.put_typed(std::vector<std::int64_t>{2});
    std::int64_t* t_d = gpu.put_typed(std::vector<std::int64_t>{10});
    build(dg, [&](const std::vector<float>& h) { return gpu.put(h); }, skip_d, skipped_d, t_d);
    std::deque<std::vector<float>> store;  // host buffers; a deque never moves its elements
    std::int32_t skip_h = -1;
    std::int64_t skipped_h = 2, t_h = 10;
    build(hc, [&](const std::vector<float>& h) { store.push_back(h); return host(store.back()); }, &skip_h, &skipped_h, &t_h);
    auto* table = gpu.put_typed(std::vector<SpectralMatrix>{dg.s});

    gpu.ops.budget(dg.b);
    gpu.ops.adam(dg.a);
    gpu.ops.spectral_norm(table, 1, rows, cols, 2.0f, skip_d);
    gpu.ops.target_update(dg.t);
    gpu.ok();
    cpu.ops->budget(hc.b);
    cpu.ops->adam(hc.a);
    cpu.ops->spectral_norm(&hc.s, 1, rows, cols, 2.0f, &skip_h);
    cpu.ops->target_update(hc.t);
    cpu.ok();

    const auto pg = gpu.get(dg.a.params, P), mg = gpu.get(dg.a.m, P), vg = gpu.get(dg.a.v, P);
    const auto tg = gpu.get(dg.t.target, P), ug = gpu.get(dg.s.u, rows);
    CHECK(gpu.get_typed(skip_d, 1)[0] == (bad ? 1 : 0));
    CHECK(gpu.get_typed(skipped_d, 1)[0] == (bad ? 3 : 2));
    CHECK(gpu.get_typed(t_d, 1)[0] == (bad ? 10 : 11));
    CHECK(t_h == (bad ? 10 : 11));
    if (bad) {
      expect_same_bits(pg, params, "skipped: params");
      expect_same_bits(mg, m, "skipped: m");
      expect_same_bits(vg, v, "skipped: v");
      expect_same_bits(tg, target, "skipped: target");
      expect_same_bits(ug, u, "skipped: u");
    } else {
      auto hv = [](const Real& r, std::int64_t n) {
        return std::vector<float>(r.as<float>(), r.as<float>() + n);
      };
      expect_close(pg, hv(hc.a.params, P), kElementwise, "chain params");
      expect_close(mg, hv(hc.a.m, P), kElementwise, "chain m");
      expect_close(vg, hv(hc.a.v, P), kElementwise, "chain v");
      expect_close(tg, hv(hc.t.target, P), kElementwise, "chain target");
      expect_close(ug, hv(hc.s.u, rows), kReduction, "chain u");
    }
  }
}

/// The state an update reads and writes, on the host: an Update's buffers are made from these by
/// update_args.
struct UpdateState {
  int H = 0;
  std::int64_t P = 0;
  std::vector<float> grads, fractions, losses, params, m, v, lr, target;
  std::int64_t period = 0;
};

/// The state two updates write, a's and b's buffer side by side (for expect_same_reals): params,
/// m, v, target, g and the norms.
std::vector<RealPair> update_pairs(const Update& a, const Update& b) {
  const std::int64_t P = a.budget.P;
  return {{"params", a.adam.params, b.adam.params, P},       {"m", a.adam.m, b.adam.m, P},
          {"v", a.adam.v, b.adam.v, P},                      {"target", a.target.target, b.target.target, P},
          {"g", a.budget.g, b.budget.g, P},                  {"norms", a.budget.norms, b.budget.norms, a.budget.H}};
}

/// An Update (no normed matrices yet) over `st`, every buffer made by real(host vector); the outputs
/// (norms, clips, g, total loss) NaN-poisoned; skip, skipped and t given.
template <class MakeReal>
Update update_args(const UpdateState& st, MakeReal&& real, std::int32_t* skip, std::int64_t* skipped,
                   std::int64_t* t) {
  Update up;
  Budget& b = up.budget;
  b.H = st.H;
  b.P = st.P;
  b.grads = real(st.grads);
  b.fractions = real(st.fractions);
  b.losses = real(st.losses);
  b.norms = real(std::vector<float>(static_cast<std::size_t>(st.H), kNaN));
  b.clips = real(std::vector<float>(static_cast<std::size_t>(st.H), kNaN));
  b.g = real(std::vector<float>(static_cast<std::size_t>(st.P), kNaN));
  b.total_loss = real(std::vector<float>{kNaN});
  b.skip = skip;
  b.skipped = skipped;
  Adam& a = up.adam;
  a.P = st.P;
  a.params = real(st.params);
  a.g = b.g;
  a.m = real(st.m);
  a.v = real(st.v);
  a.lr = real(st.lr);
  a.t = t;
  a.skip = skip;
  up.sigma_max = 2.0f;
  TargetUpdate& tu = up.target;
  tu.P = st.P;
  tu.target = real(st.target);
  tu.params = a.params;
  tu.tau = 0.005f;
  tu.period = st.period;
  tu.t = t;
  tu.skip = skip;
  return up;
}

TEST_CASE("gpu.ops.update: the cluster update equals budget → adam → spectral norm → target, bit for bit") {
  // The cluster update (two launches where the device runs clusters) against the
  // four separate CUDA ops on a copy of the same state (the same kernels' arithmetic: equal
  // bits) and against the CPU twin (float rounding). Cases: finite and a NaN head; Polyak, a hard
  // copy on and off the period; normed matrices inside params (the target update of their rows
  // fused into the spectral-norm pass), one outside params (the target update after everything),
  // none.
  struct Case {
    const char* why;
    bool bad;
    std::int64_t period, t0;
    int layout;  // 0: two matrices inside params, 1: one inside and one outside, 2: none
  };
  const Case cases[] = {
      {"polyak, two normed matrices in params", false, 0, 10, 0},
      {"hard copy on the period", false, 4, 11, 0},
      {"hard copy off the period", false, 4, 12, 0},
      {"a normed matrix outside params", false, 0, 10, 1},
      {"no spectral norm", false, 0, 10, 2},
      {"a NaN head skips everything", true, 0, 10, 0},
      {"a NaN head, hard copy on the period", true, 4, 11, 1},
  };
  // With a normed matrix outside params the cluster update runs the separate ops. The cluster
  // update's power iteration adds its double sums in another order: its normed matrices, their u
  // and their target rows may differ from the separate ops' in the last bit of a float
  // (kSumOrder), everything else is equal bit for bit.
  constexpr double kSumOrder = 1e-7;
  for (const Case& c : cases) {
    INFO(c.why);
    Gpu gpu;
    Cpu cpu;
    REQUIRE_MESSAGE(cuda::lab::update_info(gpu.rt()).cluster_size > 0,
                    "no cluster update on this device: only the separate kernels would be compared");
    BudgetCase bc(kNaN, c.bad);
    const int H = BudgetCase::H;
    const std::int64_t P = BudgetCase::P;
    // Matrix 0: params[100 .. 100+37·53), matrix 1: params[3000 .. 3000+61·41) (layout 0) or its
    // own buffer (layout 1).
    const int r0 = 37, c0 = 53, r1 = 61, c1 = 41;
    const std::int64_t off0 = 100, off1 = 3000;
    auto params = random_vec(P, -1, 1, 70), m = random_vec(P, -0.01f, 0.01f, 71), v = random_vec(P, 0, 1e-4f, 72);
    auto target = random_vec(P, -1, 1, 73), u0 = random_vec(r0, -0.2f, 0.2f, 74), u1 = random_vec(r1, -0.2f, 0.2f, 75);
    auto outside = random_vec(static_cast<std::size_t>(r1) * c1, -1, 1, 76);
    const std::vector<float> lr{1e-3f};
    const int nsn = c.layout == 2 ? 0 : 2;
    struct Side {
      Update up;
      std::vector<SpectralMatrix> mats;
      Real u0, u1, outside;
    };
    const UpdateState st{H, P, bc.grads, bc.fractions, bc.losses, params, m, v, lr, target, c.period};
    auto build = [&](Side& sd, auto&& real, std::int32_t* skip, std::int64_t* skipped, std::int64_t* t) {
      sd.up = update_args(st, real, skip, skipped, t);
      sd.u0 = real(u0);
      sd.u1 = real(u1);
      sd.outside = real(outside);
      if (nsn > 0) {
        sd.mats.push_back({sd.up.adam.params + off0, sd.u0, r0, c0});
        sd.mats.push_back({c.layout == 1 ? sd.outside : sd.up.adam.params + off1, sd.u1, r1, c1});
      }
      sd.up.sn_count = nsn;
      sd.up.sn_max_rows = std::max(r0, r1);
      sd.up.sn_max_cols = std::max(c0, c1);
    };
    // cluster update (gpu f), separate ops (gpu s), cpu
    Side f, sp, hc;
    auto on_gpu = [&](const std::vector<float>& h) { return gpu.put(h); };
    std::int32_t* skip_f = gpu.put_typed(std::vector<std::int32_t>{-1});
    std::int32_t* skip_s = gpu.put_typed(std::vector<std::int32_t>{-1});
    std::int64_t* skipped_f = gpu.put_typed(std::vector<std::int64_t>{2});
    std::int64_t* skipped_s = gpu.put_typed(std::vector<std::int64_t>{2});
    std::int64_t* t_f = gpu.put_typed(std::vector<std::int64_t>{c.t0});
    std::int64_t* t_s = gpu.put_typed(std::vector<std::int64_t>{c.t0});
    build(f, on_gpu, skip_f, skipped_f, t_f);
    build(sp, on_gpu, skip_s, skipped_s, t_s);
    std::deque<std::vector<float>> store;  // host buffers; a deque never moves its elements
    std::int32_t skip_h = -1;
    std::int64_t skipped_h = 2, t_h = c.t0;
    build(hc, [&](const std::vector<float>& h) { store.push_back(h); return host(store.back()); }, &skip_h, &skipped_h,
          &t_h);
    f.up.sn_mats = nsn ? gpu.put_typed(f.mats) : nullptr;
    sp.up.sn_mats = nsn ? gpu.put_typed(sp.mats) : nullptr;
    hc.up.sn_mats = nsn ? hc.mats.data() : nullptr;

    gpu.ops.update(f.up);
    gpu.ops.budget(sp.up.budget);
    gpu.ops.adam(sp.up.adam);
    if (nsn) gpu.ops.spectral_norm(sp.up.sn_mats, nsn, sp.up.sn_max_rows, sp.up.sn_max_cols, 2.0f, skip_s);
    gpu.ops.target_update(sp.up.target);
    gpu.ok();
    // Where the grid is resident at once (these 48 blocks) every area of shared memory is used:
    // second tiles staged, the normed rows kept, the sums pushed to every block; and on a backend
    // of its own, twice on the same state, the same bits as the first
    const cuda::lab::UpdateInfo info = cuda::lab::update_info(gpu.rt());
    if (c.layout == 0) {
      CHECK(info.last.pushed);
      CHECK(info.last.staged);
      CHECK(info.last.kept);
      CHECK_FALSE(info.last.wide());  // (these matrices hold one tile a block: nothing to split)
    }
    {
      Gpu gq;
      for (int round = 0; round < 2; ++round) {
        INFO("again, launch " << round + 1);
        Side q;
        std::int32_t* skip_q = gq.put_typed(std::vector<std::int32_t>{-1});
        std::int64_t* skipped_q = gq.put_typed(std::vector<std::int64_t>{2});
        std::int64_t* t_q = gq.put_typed(std::vector<std::int64_t>{c.t0});
        build(q, [&](const std::vector<float>& h) { return gq.put(h); }, skip_q, skipped_q, t_q);
        q.up.sn_mats = nsn ? gq.put_typed(q.mats) : nullptr;
        gq.ops.update(q.up);
        gq.ok();
        auto pairs = update_pairs(q.up, f.up);
        pairs.insert(pairs.end(), {{"clips", q.up.budget.clips, f.up.budget.clips, H},
                                   {"total loss", q.up.budget.total_loss, f.up.budget.total_loss, 1},
                                   {"u0", q.u0, f.u0, r0},
                                   {"u1", q.u1, f.u1, r1},
                                   {"outside matrix", q.outside, f.outside, static_cast<std::int64_t>(r1) * c1}});
        expect_same_reals(gq, gpu, "again vs first", pairs);
        CHECK(gq.get_typed(skip_q, 1)[0] == gpu.get_typed(skip_f, 1)[0]);
        CHECK(gq.get_typed(skipped_q, 1)[0] == gpu.get_typed(skipped_f, 1)[0]);
        CHECK(gq.get_typed(t_q, 1)[0] == gpu.get_typed(t_f, 1)[0]);
      }
    }
    cpu.ops->update(hc.up);
    cpu.ok();    cpu.ops->update(hc.up);
    cpu.ok();

    auto hv = [](const Real& r, std::int64_t n) { return std::vector<float>(r.as<float>(), r.as<float>() + n); };
    const struct {
      const char* name;
      Real fr, sr, hr;
      std::int64_t n;
    } outs[] = {
        {"params", f.up.adam.params, sp.up.adam.params, hc.up.adam.params, P},
        {"m", f.up.adam.m, sp.up.adam.m, hc.up.adam.m, P},
        {"v", f.up.adam.v, sp.up.adam.v, hc.up.adam.v, P},
        {"target", f.up.target.target, sp.up.target.target, hc.up.target.target, P},
        {"g", f.up.budget.g, sp.up.budget.g, hc.up.budget.g, P},
        {"norms", f.up.budget.norms, sp.up.budget.norms, hc.up.budget.norms, H},
        {"clips", f.up.budget.clips, sp.up.budget.clips, hc.up.budget.clips, H},
        {"total loss", f.up.budget.total_loss, sp.up.budget.total_loss, hc.up.budget.total_loss, 1},
        {"u0", f.u0, sp.u0, hc.u0, r0},
        {"u1", f.u1, sp.u1, hc.u1, r1},
        {"outside matrix", f.outside, sp.outside, hc.outside, static_cast<std::int64_t>(r1) * c1},
    };
    for (const auto& o : outs) {
      const auto got = gpu.get(o.fr, o.n);
      const std::string name = o.name;
      const bool sum_order = c.layout == 0 && !c.bad &&
                             (name == "params" || name == "target" || name == "u0" || name == "u1");
      if (sum_order) expect_close(got, gpu.get(o.sr, o.n), kSumOrder, "cluster vs separate: " + name);
      else expect_same_bits(got, gpu.get(o.sr, o.n), std::string("cluster vs separate: ") + o.name);
      if (c.bad && std::string(o.name) != "norms" && std::string(o.name) != "clips" && std::string(o.name) != "g" &&
          std::string(o.name) != "total loss")
        continue;  // unchanged state is checked bit for bit below
      expect_close(got, hv(o.hr, o.n), kReduction, std::string("cluster vs cpu: ") + o.name);
    }
    CHECK(gpu.get_typed(skip_f, 1)[0] == (c.bad ? 1 : 0));
    CHECK(gpu.get_typed(skipped_f, 1)[0] == (c.bad ? 3 : 2));
    CHECK(gpu.get_typed(t_f, 1)[0] == (c.bad ? c.t0 : c.t0 + 1));
    CHECK(t_h == (c.bad ? c.t0 : c.t0 + 1));
    if (c.bad) {
      expect_same_bits(gpu.get(f.up.adam.params, P), params, "skipped: params");
      expect_same_bits(gpu.get(f.up.adam.m, P), m, "skipped: m");
      expect_same_bits(gpu.get(f.up.target.target, P), target, "skipped: target");
      expect_same_bits(gpu.get(f.u0, r0), u0, "skipped: u0");
    } else {
      // the step did something: params moved and (Polyak or a copy on the period) so did the target
      CHECK(gpu.get(f.up.adam.params, P) != params);
      const bool moved = gpu.get(f.up.target.target, P) != target;
      CHECK(moved == (c.period == 0 || (c.t0 + 1) % c.period == 0));
    }
  }
}

TEST_CASE("gpu.ops.update.shapes: the cluster update on the step's and awkward matrix shapes against the separate ops and the CPU") {
  // Normed matrices of the step's shapes and awkward ones inside one params. A block takes
  // ceil(rows / cluster size) rows of its matrix (at 16 blocks a cluster: 19 of 300 × 256, 16 of
  // 256 × 256, 13 of 200 × 250, 8 of 128 × 256, 3 of 37 × 53), so its share is three tiles of
  // 2,048 elements (300 × 256), two (256 × 256, 200 × 250), one (128 × 256, 255 × 128) or a part
  // of one (256 × 64, 51 × 128, 37 × 53, 1 × 9), and some blocks hold no row (37 × 53 fills 13 of
  // 16, 1 × 9 one). One is scaled down so that σ < σ_max (not
  // rescaled); the others are rescaled. Two heads, the second clipped. The cluster's power
  // iteration sums in another order: params, target and u within kSumOrder of the separate ops;
  // m, v, g, norms and clips equal bit for bit.
  struct Mat {
    int rows, cols;
    float scale;
  };
  const Mat mats[] = {{256, 256, 1.0f}, {200, 250, 1.0f}, {128, 256, 1.0f}, {255, 128, 1.0f}, {256, 64, 1.0f},
                      {37, 53, 1.0f},   {1, 9, 1.0f},     {300, 256, 1.0f}, {51, 128, 0.01f}};
  constexpr int H = 2;
  constexpr double kSumOrder = 1e-7;
  std::vector<std::int64_t> offs;
  std::int64_t P = 77;  // a gap before the first matrix, and between all of them
  for (const Mat& m : mats) {
    offs.push_back(P);
    P += static_cast<std::int64_t>(m.rows) * m.cols + 131;
  }
  int max_rows = 0, max_cols = 0;
  for (const Mat& m : mats) {
    max_rows = std::max(max_rows, m.rows);
    max_cols = std::max(max_cols, m.cols);
  }
  const int nsn = static_cast<int>(std::size(mats));
  auto params = random_vec(static_cast<std::size_t>(P), -1, 1, 80);
  for (int k = 0; k < nsn; ++k)
    for (std::int64_t i = 0; i < static_cast<std::int64_t>(mats[k].rows) * mats[k].cols; ++i)
      params[static_cast<std::size_t>(offs[static_cast<std::size_t>(k)] + i)] *= mats[k].scale;
  const auto m0 = random_vec(static_cast<std::size_t>(P), -0.01f, 0.01f, 81);
  const auto v0 = random_vec(static_cast<std::size_t>(P), 0, 1e-4f, 82);
  const auto target0 = random_vec(static_cast<std::size_t>(P), -1, 1, 83);
  auto grads = random_vec(static_cast<std::size_t>(H * P), -1, 1, 84);
  for (std::int64_t i = 0; i < P; ++i) grads[static_cast<std::size_t>(P + i)] *= 1e-3f;  // head 1: clip 1
  const std::vector<float> fractions{0.8f, 0.2f}, losses{1.5f, 0.25f}, lr{1e-3f};
  std::vector<std::vector<float>> us;
  for (int k = 0; k < nsn; ++k) us.push_back(random_vec(static_cast<std::size_t>(mats[k].rows), -0.2f, 0.2f, 90 + k));

  struct Case {
    const char* why;
    bool bad;
    std::int64_t period, t0;
  };
  const Case cases[] = {{"polyak", false, 0, 10}, {"hard copy on the period", false, 4, 11},
                        {"hard copy off the period", false, 4, 12}, {"a NaN head skips everything", true, 0, 10}};
  for (const Case& c : cases) {
    INFO(c.why);
    auto g = grads;
    if (c.bad) g[static_cast<std::size_t>(P + 4321)] = kNaN;
    // Side: one update's state on one backend (cl: the cluster update, sep: the four separate
    // ops, cpu: the CPU twin)
    struct Side {
      Update up;
      std::vector<SpectralMatrix> mats;
      std::vector<Real> u;
      std::int32_t* skip;
      std::int64_t *skipped, *t;
    };
    const UpdateState st{H, P, g, fractions, losses, params, m0, v0, lr, target0, c.period};
    auto build = [&](Side& sd, auto&& real, auto&& i32, auto&& i64) {
      sd.skip = i32(std::vector<std::int32_t>{-1});
      sd.skipped = i64(std::vector<std::int64_t>{2});
      sd.t = i64(std::vector<std::int64_t>{c.t0});
      sd.up = update_args(st, real, sd.skip, sd.skipped, sd.t);
      for (int k = 0; k < nsn; ++k) {
        sd.u.push_back(real(us[static_cast<std::size_t>(k)]));
        sd.mats.push_back(
            {sd.up.adam.params + offs[static_cast<std::size_t>(k)], sd.u.back(), mats[k].rows, mats[k].cols});
      }
      sd.up.sn_count = nsn;
      sd.up.sn_max_rows = max_rows;
      sd.up.sn_max_cols = max_cols;
    };
    auto on = [&](Gpu& gpu, Side& sd) {
      build(sd, [&](const std::vector<float>& h) { return gpu.put(h); },
            [&](const std::vector<std::int32_t>& h) { return gpu.put_typed(h); },
            [&](const std::vector<std::int64_t>& h) { return gpu.put_typed(h); });
      sd.up.sn_mats = gpu.put_typed(sd.mats);
    };
    Side cl, sep, hc;
    Gpu gr;
    REQUIRE_MESSAGE(cuda::lab::update_info(gr.rt()).cluster_size > 0, "no cluster update on this device");
    on(gr, cl);
    on(gr, sep);
    std::deque<std::vector<float>> store;  // host buffers; a deque never moves its elements
    std::deque<std::vector<std::int32_t>> store32;
    std::deque<std::vector<std::int64_t>> store64;
    build(hc, [&](const std::vector<float>& h) { store.push_back(h); return host(store.back()); },
          [&](const std::vector<std::int32_t>& h) { store32.push_back(h); return store32.back().data(); },
          [&](const std::vector<std::int64_t>& h) { store64.push_back(h); return store64.back().data(); });
    hc.up.sn_mats = hc.mats.data();

    gr.ops.update(cl.up);
    gr.ops.budget(sep.up.budget);
    gr.ops.adam(sep.up.adam);
    gr.ops.spectral_norm(sep.up.sn_mats, nsn, max_rows, max_cols, 2.0f, sep.skip);
    gr.ops.target_update(sep.up.target);
    gr.ok();
    // Where the grid fits (these 160 blocks): Wᵀu summed in shares of ceil(cols / 16) columns (1
    // of the 1 × 9 matrix's, 4 of 37 × 53, 16 of 250 and 256, so some blocks own none); the second
    // tile of the 256 × 256, 200 × 250 and 300 × 256 blocks in shared memory, the third loaded as
    // before, Wᵀu from registers for the three of 256 columns; every normed block's rows of the
    // new θ in shared memory, read back from there by Wᵀu for the columns of the other six, by W v
    // and the scaling, and the old target of the two- and three-tile blocks copied there before
    // the wait; the push slots do not fit beside them here (117 KiB a block); no wide launch
    // (the whole update is not resident with it)
    {
      const cuda::lab::UpdateInfo info = cuda::lab::update_info(gr.rt());
      CHECK(info.last.staged);
      CHECK(info.last.gathered);
      CHECK(info.last.kept);
      CHECK_FALSE(info.last.pushed);
    }
    // At 8 blocks a cluster (cuda.update_cluster: 8) the cluster's sums add other partial sums:
    // within kSumOrder of the separate ops below, m, v, g and the norms equal bit for bit
    CudaSpec eight;
    eight.update_cluster = 8;
    Gpu g8(Precision::fp32, eight);
    Side c8;
    on(g8, c8);
    g8.ops.update(c8.up);
    g8.ok();
    CHECK(cuda::lab::update_info(g8.rt()).cluster_size == 8);
    Cpu cpu;
    cpu.ops->update(hc.up);
    cpu.ok();

    auto hv = [](const Real& r, std::int64_t n) { return std::vector<float>(r.as<float>(), r.as<float>() + n); };
    struct Out {
      std::string name;
      Real cl, s, h;
      std::int64_t n;
      bool summed;  // from the power iteration (sums in another order)
    };
    std::vector<Out> outs = {
        {"params", cl.up.adam.params, sep.up.adam.params, hc.up.adam.params, P, true},
        {"target", cl.up.target.target, sep.up.target.target, hc.up.target.target, P, true},
        {"m", cl.up.adam.m, sep.up.adam.m, hc.up.adam.m, P, false},
        {"v", cl.up.adam.v, sep.up.adam.v, hc.up.adam.v, P, false},
        {"g", cl.up.budget.g, sep.up.budget.g, hc.up.budget.g, P, false},
        {"norms", cl.up.budget.norms, sep.up.budget.norms, hc.up.budget.norms, H, false},
        {"clips", cl.up.budget.clips, sep.up.budget.clips, hc.up.budget.clips, H, false},
    };
    for (int k = 0; k < nsn; ++k)
      outs.push_back({"u of matrix " + std::to_string(k) + " (" + std::to_string(mats[k].rows) + " x " +
                          std::to_string(mats[k].cols) + ")",
                      cl.u[static_cast<std::size_t>(k)],
                      sep.u[static_cast<std::size_t>(k)], hc.u[static_cast<std::size_t>(k)], mats[k].rows, true});
    std::vector<Real> at8 = {c8.up.adam.params, c8.up.target.target, c8.up.adam.m, c8.up.adam.v, c8.up.budget.g,
                             c8.up.budget.norms, c8.up.budget.clips};
    for (int k = 0; k < nsn; ++k) at8.push_back(c8.u[static_cast<std::size_t>(k)]);
    for (std::size_t i = 0; i < outs.size(); ++i) {
      const Out& o = outs[i];
      const auto got = gr.get(o.cl, o.n);
      const auto sep_got = gr.get(o.s, o.n);
      if (o.summed && !c.bad) {
        expect_close(got, sep_got, kSumOrder, "cluster vs separate: " + o.name);
        expect_close(g8.get(at8[i], o.n), sep_got, kSumOrder, "cluster of 8 vs separate: " + o.name);
      } else {
        expect_same_bits(got, sep_got, "cluster vs separate: " + o.name);
        expect_same_bits(g8.get(at8[i], o.n), sep_got, "cluster of 8 vs separate: " + o.name);
      }
      if (!c.bad || o.name == "norms" || o.name == "clips" || o.name == "g")
        expect_close(got, hv(o.h, o.n), kReduction, "cluster vs cpu: " + o.name);
    }
    // each matrix's elements moved (or, skipped, stayed) and the scaled-down one was not rescaled
    const auto p_after = gr.get(cl.up.adam.params, P);
    for (int k = 0; k < nsn; ++k) {
      const auto at = static_cast<std::size_t>(offs[static_cast<std::size_t>(k)]);
      const std::size_t n = static_cast<std::size_t>(mats[k].rows) * static_cast<std::size_t>(mats[k].cols);
      const std::vector<float> before(params.begin() + static_cast<std::ptrdiff_t>(at),
                                      params.begin() + static_cast<std::ptrdiff_t>(at + n));
      const std::vector<float> after(p_after.begin() + static_cast<std::ptrdiff_t>(at),
                                     p_after.begin() + static_cast<std::ptrdiff_t>(at + n));
      if (c.bad) expect_same_bits(after, before, "skipped: matrix " + std::to_string(k));
      else CHECK_MESSAGE(after != before, "matrix " << k << " unchanged");
    }
    CHECK(gr.get_typed(cl.skip, 1)[0] == (c.bad ? 1 : 0));
    CHECK(gr.get_typed(cl.skipped, 1)[0] == (c.bad ? 3 : 2));
    CHECK(gr.get_typed(cl.t, 1)[0] == (c.bad ? c.t0 : c.t0 + 1));
  }
}

namespace {

/// A miniature C51 step (forward, projection, loss, one weight gradient, budget, Adam, spectral
/// norm, Polyak target, τ draw) on one runtime, for determinism and capture tests.
struct MiniStep {
  static constexpr int B = 37, S = 29, Hd = 53, D = 3, A = 5, Z = 51, DAZ = D * A * Z;
  static constexpr std::int64_t P2 = static_cast<std::int64_t>(DAZ) * Hd;
  Gpu& gpu;
  // inputs (constant) and state (changes every step)
  Real x, b1, rewards, dones, weights, lr, fractions;
  std::int32_t* actions;
  Real W1, u1, W2, m2, v2, W2t;
  std::int64_t *t, *skipped;
  // derived
  Real y1, logits, logp, q, mdist, loss, td, dlogits, dW2, norms, clips, g, total, taus;
  std::int32_t *a_star, *skip;
  SpectralMatrix* table;
  // initial state, for resets
  std::vector<float> W1_0, u1_0, W2_0, W2t_0;

  explicit MiniStep(Gpu& g_) : gpu(g_) {
    x = gpu.put(random_vec(static_cast<std::size_t>(B) * S, -1, 1, 80));
    b1 = gpu.put(random_vec(Hd, -0.1f, 0.1f, 81));
    rewards = gpu.put(random_vec(B, -2, 2, 82));
    auto dn = random_vec(B, 0, 1, 83);
    for (float& d : dn) d = d < 0.2f ? 1.0f : 0.0f;
    dones = gpu.put(dn);
    weights = gpu.put(random_vec(B, 0.5f, 1.5f, 84));
    lr = gpu.put(std::vector<float>{1e-3f});
    fractions = gpu.put(std::vector<float>{1.0f});
    actions = gpu.put_typed(random_ints(static_cast<std::size_t>(B) * D, 0, A - 1, 85));
    W1_0 = random_vec(static_cast<std::size_t>(Hd) * S, -0.6f, 0.6f, 86);
    u1_0 = random_vec(Hd, -0.2f, 0.2f, 87);
    W2_0 = random_vec(static_cast<std::size_t>(P2), -0.3f, 0.3f, 88);
    W2t_0 = random_vec(static_cast<std::size_t>(P2), -0.3f, 0.3f, 89);
    W1 = gpu.put(W1_0);
    u1 = gpu.put(u1_0);
    W2 = gpu.put(W2_0);
    W2t = gpu.put(W2t_0);
    m2 = gpu.reals(P2);
    v2 = gpu.reals(P2);
    t = gpu.put_typed(std::vector<std::int64_t>{0});
    skipped = gpu.put_typed(std::vector<std::int64_t>{0});
    y1 = gpu.reals(static_cast<std::int64_t>(B) * Hd);
    logits = gpu.reals(static_cast<std::int64_t>(B) * DAZ);
    logp = gpu.reals(static_cast<std::int64_t>(B) * DAZ);
    q = gpu.reals(static_cast<std::int64_t>(B) * D * A);
    mdist = gpu.reals(static_cast<std::int64_t>(B) * D * Z);
    loss = gpu.reals(1);
    td = gpu.reals(B);
    dlogits = gpu.reals(static_cast<std::int64_t>(B) * DAZ);
    dW2 = gpu.reals(P2);
    norms = gpu.reals(1);
    clips = gpu.reals(1);
    g = gpu.reals(P2);
    total = gpu.reals(1);
    taus = gpu.reals(static_cast<std::int64_t>(B) * 4);
    a_star = static_cast<std::int32_t*>(gpu.raw(static_cast<std::size_t>(B) * D * 4));
    skip = static_cast<std::int32_t*>(gpu.raw(4));
    table = gpu.put_typed(std::vector<SpectralMatrix>{{W1, u1, Hd, S}});
  }

  /// State back to the start, every derived buffer poisoned.
  void reset() {
    gpu.set(W1, W1_0);
    gpu.set(u1, u1_0);
    gpu.set(W2, W2_0);
    gpu.set(W2t, W2t_0);
    gpu.set(m2, std::vector<float>(static_cast<std::size_t>(P2), 0.0f));
    gpu.set(v2, std::vector<float>(static_cast<std::size_t>(P2), 0.0f));
    gpu.set_typed(t, std::vector<std::int64_t>{0});
    gpu.set_typed(skipped, std::vector<std::int64_t>{0});
    for (auto [r, n] : derived()) gpu.poison(r, n);
    gpu.set_typed(a_star, std::vector<std::int32_t>(static_cast<std::size_t>(B) * D, -1));
    gpu.set_typed(skip, std::vector<std::int32_t>{-1});
    gpu.ok();
  }

  std::vector<std::pair<Real, std::int64_t>> derived() const {
    return {{y1, B * Hd}, {logits, B * DAZ}, {logp, B * DAZ}, {q, B * D * A}, {mdist, B * D * Z}, {loss, 1},
            {td, B}, {dlogits, B * DAZ}, {dW2, P2}, {norms, 1}, {clips, 1}, {g, P2}, {total, 1}, {taus, B * 4}};
  }

  void enqueue() {
    Backend& ops = gpu.ops;
    Gemm g1;  // y1 = relu(x W1ᵀ + b1)
    g1.tb = true;
    g1.m = B;
    g1.n = Hd;
    g1.k = S;
    g1.a = x;
    g1.lda = S;
    g1.b = W1;
    g1.ldb = S;
    g1.c = y1;
    g1.ldc = Hd;
    ops.gemm(g1);
    ops.bias_act(y1, b1, B, Hd, Hd, Act::relu);
    Gemm g2 = g1;  // logits = y1 W2ᵀ
    g2.n = DAZ;
    g2.k = Hd;
    g2.a = y1;
    g2.lda = Hd;
    g2.b = W2;
    g2.ldb = Hd;
    g2.c = logits;
    g2.ldc = DAZ;
    ops.gemm(g2);
    ops.log_softmax(logp, logits, B * D * A, Z);
    ops.expected_q(q, logp, B * D * A, Z, -10.0f, 10.0f);
    ops.argmax(a_star, q, B * D, A);
    C51Project pr;
    pr.m = mdist;
    pr.target_logp = logp;
    pr.a_star = a_star;
    pr.rewards = rewards;
    pr.dones = dones;
    pr.B = B;
    pr.D = D;
    pr.A = A;
    pr.Z = Z;
    ops.c51_project(pr);
    C51Xent xe;
    xe.loss_per_sample = td;
    xe.loss = loss;
    xe.dlogits = dlogits;
    xe.logp = logp;
    xe.actions = actions;
    xe.m = mdist;
    xe.weights = weights;
    xe.B = B;
    xe.D = D;
    xe.A = A;
    xe.Z = Z;
    ops.c51_xent(xe);
    Gemm g3;  // dW2 = dlogitsᵀ y1
    g3.ta = true;
    g3.m = DAZ;
    g3.n = Hd;
    g3.k = B;
    g3.a = dlogits;
    g3.lda = DAZ;
    g3.b = y1;
    g3.ldb = Hd;
    g3.c = dW2;
    g3.ldc = Hd;
    ops.gemm(g3);
    Budget bu;
    bu.grads = dW2;
    bu.fractions = fractions;
    bu.norms = norms;
    bu.clips = clips;
    bu.g = g;
    bu.losses = loss;
    bu.total_loss = total;
    bu.skip = skip;
    bu.skipped = skipped;
    bu.H = 1;
    bu.P = P2;
    ops.budget(bu);
    Adam ad;
    ad.params = W2;
    ad.g = g;
    ad.m = m2;
    ad.v = v2;
    ad.P = P2;
    ad.t = t;
    ad.lr = lr;
    ad.skip = skip;
    ops.adam(ad);
    ops.spectral_norm(table, 1, Hd, S, 2.0f, skip);
    TargetUpdate tu;
    tu.target = W2t;
    tu.params = W2;
    tu.P = P2;
    tu.t = t;
    tu.skip = skip;
    ops.target_update(tu);
    Uniform un;
    un.out = taus;
    un.n = B * 4;
    un.seed = 7;
    un.stream = 1;
    un.step = t;
    ops.uniform(un);
  }

  struct Snapshot {
    std::vector<std::vector<float>> reals;
    std::vector<std::int32_t> a_star;
    std::int64_t t = -1, skipped = -1;
  };
  Snapshot snapshot() {
    gpu.ok();
    Snapshot s;
    const std::pair<Real, std::int64_t> state[] = {{W1, Hd * S}, {u1, Hd}, {W2, P2}, {m2, P2}, {v2, P2}, {W2t, P2}};
    for (auto [r, n] : state) s.reals.push_back(gpu.get(r, n));
    for (auto [r, n] : derived()) s.reals.push_back(gpu.get(r, n));
    s.a_star = gpu.get_typed(a_star, static_cast<std::size_t>(B) * D);
    s.t = gpu.get_typed(t, 1)[0];
    s.skipped = gpu.get_typed(skipped, 1)[0];
    return s;
  }
};

void expect_same(const MiniStep::Snapshot& a, const MiniStep::Snapshot& b, const std::string& what) {
  REQUIRE(a.reals.size() == b.reals.size());
  for (std::size_t i = 0; i < a.reals.size(); ++i) expect_same_bits(a.reals[i], b.reals[i], what + ", buffer " + std::to_string(i));
  expect_same_bits(a.a_star, b.a_star, what + ", a_star");
  CHECK(a.t == b.t);
  CHECK(a.skipped == b.skipped);
}

}  // namespace

TEST_CASE("gpu.ops.capture: plan, direct runs, reruns and graph replays agree bit for bit") {
  Gpu gpu(Precision::tf32);
  MiniStep st(gpu);
  constexpr int kSteps = 3;

  st.reset();
  gpu.rt().plan_begin();
  st.enqueue();
  gpu.rt().plan_end();
  gpu.ok();
  for (float x : gpu.get(st.loss, 1)) CHECK(std::isnan(x));  // planning launched nothing
  CHECK(gpu.get_typed(st.t, 1)[0] == 0);

  for (int i = 0; i < kSteps; ++i) st.enqueue();
  const auto direct = st.snapshot();
  CHECK(direct.t == kSteps);
  CHECK(direct.skipped == 0);
  for (const auto& buf : direct.reals)
    for (float x : buf) REQUIRE(std::isfinite(x));
  CHECK(direct.reals[2] != st.W2_0);  // Adam moved the weights

  st.reset();
  for (int i = 0; i < kSteps; ++i) st.enqueue();
  expect_same(st.snapshot(), direct, "second direct run");

  st.reset();
  gpu.rt().begin_capture();
  st.enqueue();
  gpu.rt().end_capture();
  gpu.ok();
  CHECK(gpu.get_typed(st.t, 1)[0] == 0);  // capturing ran nothing
  const std::int64_t nodes = gpu.rt().graph_nodes();
  MESSAGE("mini step graph: " << nodes << " nodes");
  CHECK(nodes >= 16);
  for (int i = 0; i < kSteps; ++i) gpu.rt().replay();
  expect_same(st.snapshot(), direct, "graph replays");

  // A second capture of the same stages updates the instantiated graph in place.
  st.reset();
  gpu.rt().begin_capture();
  st.enqueue();
  gpu.rt().end_capture();
  for (int i = 0; i < kSteps; ++i) gpu.rt().replay();
  expect_same(st.snapshot(), direct, "replays after re-capture");

  // Reports: an async copy into pinned memory, observed through the slot's event.
  auto* pinned = static_cast<float*>(gpu.rt().alloc_host(sizeof(float)));
  *pinned = kNaN;
  gpu.rt().replay();
  gpu.rt().copy_to_host_async(pinned, st.loss.p, sizeof(float), 3);
  gpu.rt().synchronize();
  CHECK(gpu.rt().ready(3));
  const float loss = gpu.get(st.loss, 1)[0];
  CHECK(std::memcmp(pinned, &loss, sizeof loss) == 0);
  CHECK(gpu.get_typed(st.t, 1)[0] == kSteps + 1);
  gpu.rt().free_host(pinned);
  CHECK_THROWS_AS(gpu.rt().copy_to_host_async(pinned, st.loss.p, 4, 1 << 20), std::runtime_error);
}

TEST_CASE("gpu.ops.capture: an op error during capture discards the graph and says why") {
  Gpu gpu;
  Real a = gpu.reals(16);
  gpu.rt().begin_capture();
  gpu.ops.fill(a, 1.0f, 16);
  Real wide = a;
  wide.esize = 8;
  gpu.ops.fill(wide, 1.0f, 16);
  std::string why;
  try {
    gpu.rt().end_capture();
  } catch (const std::runtime_error& e) {
    why = e.what();
  }
  CHECK_MESSAGE(why.find("element size") != std::string::npos, "end_capture said: '" << why << "'");
  CHECK_THROWS_AS(gpu.rt().replay(), std::runtime_error);
}
