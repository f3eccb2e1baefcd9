/** @file ops_util.hpp
 *  @brief What the numeric.ops test files share: a portable random generator, both CPU backends
 *  (f32 and f64), naive double references and central-difference gradient checks.
 */
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu/cpu_backend.hpp"
#include "core/philox.h"
#include "core/runtime.hpp"


namespace ops_util {


using dqn::Backend;
using dqn::EngineBackend;
using dqn::Real;
using Vd = std::vector<double>;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

/// splitmix64: the same numbers on every standard library (std distributions are not portable).
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : s_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform(double lo = -1.0, double hi = 1.0) {
    return lo + (hi - lo) * static_cast<double>(next() >> 11) * 0x1.0p-53;
  }
  int below(int n) { return static_cast<int>(next() % static_cast<std::uint64_t>(n)); }
  Vd vec(std::size_t n, double lo = -1.0, double hi = 1.0) {
    Vd v(n);
    for (double& x : v) x = uniform(lo, hi);
    return v;
  }

 private:
  std::uint64_t s_;
};

/// A real array in the layout one backend expects: float storage for esize 4, double for 8.
class Vec {
 public:
  Vec(std::uint32_t esize, std::size_t n, double value = 0.0) : esize_(esize) {
    if (esize == 8) d_.assign(n, value);
    else f_.assign(n, static_cast<float>(value));
  }
  Vec(std::uint32_t esize, const Vd& x) : Vec(esize, x.size()) {
    for (std::size_t i = 0; i < x.size(); ++i) set(i, x[i]);
  }
  Real r(std::ptrdiff_t offset = 0) { return Real{data(), esize_} + offset; }
  void* data() { return esize_ == 8 ? static_cast<void*>(d_.data()) : static_cast<void*>(f_.data()); }
  std::size_t size() const { return esize_ == 8 ? d_.size() : f_.size(); }
  double operator[](std::size_t i) const { return esize_ == 8 ? d_[i] : static_cast<double>(f_[i]); }
  void set(std::size_t i, double x) {
    if (esize_ == 8) d_[i] = x;
    else f_[i] = static_cast<float>(x);
  }
  Vd get() const {
    Vd v(size());
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = (*this)[i];
    return v;
  }
  /// The raw bytes, for bit-identity checks.
  std::vector<unsigned char> bytes() const {
    const std::size_t n = size() * esize_;
    std::vector<unsigned char> b(n);
    std::memcpy(b.data(), esize_ == 8 ? static_cast<const void*>(d_.data()) : static_cast<const void*>(f_.data()), n);
    return b;
  }

 private:
  std::uint32_t esize_;
  std::vector<float> f_;
  std::vector<double> d_;
};

/// max_i |got − want| / (|want_i| + rms(want)): relative, without blowing up at entries near 0.
inline double rel_err(const Vd& got, const Vd& want) {
  REQUIRE(got.size() == want.size());
  double ss = 0.0;
  for (double w : want) ss += w * w;
  const double rms = want.empty() ? 0.0 : std::sqrt(ss / static_cast<double>(want.size()));
  double worst = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double denom = std::abs(want[i]) + rms + 1e-300;
    const double e = std::abs(got[i] - want[i]) / denom;
    if (!(e <= worst)) worst = e;  // NaN wins
  }
  return worst;
}

constexpr double kFdEps = 1e-6;

/// Worst relative error of an analytic gradient against central differences of `loss` in every
/// element of x (x is perturbed in place and restored). Gradients below 1e-2 count absolutely.
template <class Loss>
double grad_err(Vec& x, const Vd& analytic, Loss&& loss) {
  REQUIRE(analytic.size() == x.size());
  double worst = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x.set(i, x0 + kFdEps);
    const double lp = loss();
    x.set(i, x0 - kFdEps);
    const double lm = loss();
    x.set(i, x0);
    const double fd = (lp - lm) / (2.0 * kFdEps);
    const double e = std::abs(analytic[i] - fd) / std::max({std::abs(analytic[i]), std::abs(fd), 1e-2});
    if (!(e <= worst)) worst = e;
  }
  return worst;
}

struct Backends {
  std::unique_ptr<EngineBackend> f64 = dqn::make_cpu_backend(true);
  std::unique_ptr<EngineBackend> f32 = dqn::make_cpu_backend(false);
};

// ---- naive references -------------------------------------------------------------------------

/// C = alpha op(A) op(B) + beta C per batch entry, building op(A) and op(B) explicitly first.
inline Vd naive_gemm(const dqn::Gemm& g, const Vd& A, const Vd& B, Vd C) {
  for (int bi = 0; bi < g.batch; ++bi) {
    Vd opA(static_cast<std::size_t>(g.m) * g.k), opB(static_cast<std::size_t>(g.k) * g.n);
    for (int i = 0; i < g.m; ++i)
      for (int p = 0; p < g.k; ++p)
        opA[i * g.k + p] = g.ta ? A[bi * g.stride_a + p * g.lda + i] : A[bi * g.stride_a + i * g.lda + p];
    for (int p = 0; p < g.k; ++p)
      for (int j = 0; j < g.n; ++j)
        opB[p * g.n + j] = g.tb ? B[bi * g.stride_b + j * g.ldb + p] : B[bi * g.stride_b + p * g.ldb + j];
    for (int i = 0; i < g.m; ++i)
      for (int j = 0; j < g.n; ++j) {
        double s = 0.0;
        for (int p = 0; p < g.k; ++p) s += opA[i * g.k + p] * opB[p * g.n + j];
        double& c = C[bi * g.stride_c + i * g.ldc + j];
        c = g.alpha * s + (g.beta == 0.0f ? 0.0 : g.beta * c);
      }
  }
  return C;
}

inline Vd naive_log_softmax(const Vd& x, int rows, int n) {
  Vd y(x.size());
  for (int r = 0; r < rows; ++r) {
    double s = 0.0;
    for (int i = 0; i < n; ++i) s += std::exp(x[r * n + i]);
    for (int i = 0; i < n; ++i) y[r * n + i] = x[r * n + i] - std::log(s);
  }
  return y;
}

/// The classic floor/ceil C51 projection (Bellemare et al.), an independent form of the dense one.
inline Vd naive_project(const Vd& tlogp, const std::vector<std::int32_t>& a_star, const Vd& r, const Vd& done,
                 int B, int D, int A, int Z, double gamma, double v_min, double v_max) {
  Vd m(static_cast<std::size_t>(B) * D * Z, 0.0);
  const double dz = (v_max - v_min) / (Z - 1);
  for (int b = 0; b < B; ++b)
    for (int d = 0; d < D; ++d) {
      const int a = a_star[b * D + d];
      for (int j = 0; j < Z; ++j) {
        const double p = std::exp(tlogp[((b * D + d) * A + a) * Z + j]);
        const double tz = std::min(v_max, std::max(v_min, r[b] + gamma * (1.0 - done[b]) * (v_min + j * dz)));
        const double pos = (tz - v_min) / dz;
        const int lo = static_cast<int>(std::floor(pos)), hi = static_cast<int>(std::ceil(pos));
        double* row = &m[(b * D + d) * Z];
        if (lo == hi) {
          row[lo] += p;
        } else {
          row[lo] += p * (hi - pos);
          row[hi] += p * (pos - lo);
        }
      }
    }
  return m;
}

// ---- dense layers -----------------------------------------------------------------------------

}  // namespace ops_util
