/** @file cpu_backend.cpp
 *  @brief The CPU reference op table: plain loops, accumulation in double, deterministic. Every
 *  other backend is validated against this one, so it favours being obviously right over fast.
 */
#include "cpu/cpu_backend.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cpu/cpu_replay.hpp"
#include "core/philox.h"

namespace dqn {
namespace {

template <class T>
class CpuBackend final : public EngineBackend {
 public:
  const char* name() const noexcept override { return sizeof(T) == 8 ? "cpu-f64" : "cpu"; }
  std::uint32_t real_size() const noexcept override { return sizeof(T); }
  bool is_device() const noexcept override { return false; }
  const DeviceContext* device() const noexcept override { return nullptr; }
  /// Keeps the first failure only: later ones are usually its consequences.
  void fail(const char* op, const char* why) noexcept override {
    if (status_ != 0) return;
    status_ = 1;
    std::snprintf(message_, sizeof message_, "%s %s: %s", name(), op, why);
  }

  // --- dense layers -------------------------------------------------------------------------

  void gemm(const Gemm& g) noexcept override {
    if (g.batch2 != 1) {  // entry j of the second dimension: a one-dimensional call at its offsets
      if (g.batch2 < 1) return fail("gemm", "batch2 must be at least 1");
      if (g.sum_batch) return fail("gemm", "sum_batch needs batch2 1");
      for (int j = 0; j < g.batch2 && status_ == 0; ++j) gemm(batch2_entry(g, j));
      return;
    }
    if (g.m < 0 || g.n < 0 || g.k < 0 || g.batch < 0) return fail("gemm", "negative size");
    if (g.sum_batch && (g.beta != 0.0f || g.bias || g.act != Act::none || g.mask))
      return fail("gemm", "sum_batch needs beta 0 and no bias, activation or mask");
    if (g.m == 0 || g.n == 0 || (g.batch == 0 && !g.sum_batch)) return;
    const int a_cols = g.ta ? g.m : g.k, b_cols = g.tb ? g.k : g.n;
    if (g.k > 0 && g.batch > 0 && (g.lda < std::max(1, a_cols) || g.ldb < std::max(1, b_cols)))
      return fail("gemm", "lda/ldb smaller than the row length of A/B");
    if (g.ldc < g.n) return fail("gemm", "ldc smaller than n");
    if (!real_ok(g.c, "gemm", "c")) return;
    if (g.k > 0 && g.batch > 0 && (!real_ok(g.a, "gemm", "a") || !real_ok(g.b, "gemm", "b"))) return;
    if (g.bias && !real_ok(g.bias, "gemm", "bias")) return;
    if (g.act != Act::none && g.act != Act::relu) return fail("gemm", "unknown activation");
    if (g.mask && (!real_ok(g.mask, "gemm", "mask") || g.ldmask < g.n || g.mask_rows < 0))
      return fail("gemm", "mask needs ldmask >= n and mask_rows >= 0");
    const bool epilogue = g.bias || g.act != Act::none;
    const double alpha = g.alpha, beta = g.beta;
    const int mask_rows = g.mask_rows > 0 ? g.mask_rows : g.m;
    if (g.sum_batch) {  // one C: every entry's products in one sum, rounded once (no entries: 0)
      T* C = g.c.as<T>();
      for (int i = 0; i < g.m; ++i)
        for (int j = 0; j < g.n; ++j) {
          double acc = 0.0;
          for (int bi = 0; bi < g.batch && g.k > 0; ++bi) {
            const T* A = g.a.as<T>() + bi * g.stride_a;
            const T* B = g.b.as<T>() + bi * g.stride_b;
            for (int p = 0; p < g.k; ++p) {
              const double a = g.ta ? A[idx(p, g.lda, i)] : A[idx(i, g.lda, p)];
              const double b = g.tb ? B[idx(j, g.ldb, p)] : B[idx(p, g.ldb, j)];
              acc += a * b;
            }
          }
          C[idx(i, g.ldc, j)] = static_cast<T>(alpha * acc);
        }
      return;
    }
    // Each C[i][j] is the same double sum as the textbook loop, its products added in the order
    // p = 0, 1, …, k−1, so the result is bit-identical to it; B is first copied to doubles in
    // [p][j] order so that the sum runs over a whole row of C at once, reading memory in order.
    if (!gemm_scratch(g.k, g.n)) return;
    double* const Bd = bd_.data();
    double* const acc = acc_.data();
    for (int bi = 0; bi < g.batch; ++bi) {
      const T* A = g.k > 0 ? g.a.as<T>() + bi * g.stride_a : nullptr;
      const T* B = g.k > 0 ? g.b.as<T>() + bi * g.stride_b : nullptr;
      T* C = g.c.as<T>() + bi * g.stride_c;
      const T* bias = g.bias ? g.bias.as<T>() + bi * g.stride_bias : nullptr;
      for (int p = 0; p < g.k; ++p)
        for (int j = 0; j < g.n; ++j)
          Bd[static_cast<std::size_t>(p) * g.n + j] =
              static_cast<double>(g.tb ? B[idx(j, g.ldb, p)] : B[idx(p, g.ldb, j)]);
      for (int i = 0; i < g.m; ++i) {
        row_product(A, g.ta, g.lda, i, g.k, Bd, g.n, acc);
        for (int j = 0; j < g.n; ++j) {
          T& c = C[idx(i, g.ldc, j)];
          // beta == 0 overwrites: C may hold uninitialised memory (NaN garbage).
          c = static_cast<T>(beta == 0.0 ? alpha * acc[j] : alpha * acc[j] + beta * static_cast<double>(c));
          if (epilogue) {  // exactly bias_act on the stored product: bit-identical to gemm + bias_act
            double x = static_cast<double>(c) + (bias ? static_cast<double>(bias[j]) : 0.0);
            if (g.act == Act::relu) x = x > 0.0 ? x : 0.0;
            c = static_cast<T>(x);
          }
          // as relu_backward on the stored result
          if (g.mask && g.mask.as<T>()[bi * g.stride_mask + idx(i % mask_rows, g.ldmask, j)] <= T(0)) c = T(0);
        }
      }
    }
  }

  /// acc[j] = Σ_p A(i, p)·Bd[p][j] for j < n, each sum in the order p = 0 … k−1 (A transposed
  /// when ta).
  static void row_product(const T* A, bool ta, int lda, int i, int k, const double* __restrict Bd, int n,
                          double* __restrict acc) noexcept {
    auto a_at = [&](int p) { return static_cast<double>(ta ? A[idx(p, lda, i)] : A[idx(i, lda, p)]); };
    for (int j = 0; j < n; ++j) acc[j] = 0.0;
    int p = 0;
    for (; p + 4 <= k; p += 4) {  // four products a row at a time: acc stays in a register
      const double a0 = a_at(p), a1 = a_at(p + 1), a2 = a_at(p + 2), a3 = a_at(p + 3);
      const double* __restrict b0 = Bd + static_cast<std::size_t>(p) * n;
      const double* __restrict b1 = b0 + n;
      const double* __restrict b2 = b1 + n;
      const double* __restrict b3 = b2 + n;
      int j = 0;
      for (; j + 2 <= n; j += 2)  // two columns at once: lane by lane the same operations
        store2(acc + j, (((load2(acc + j) + a0 * load2(b0 + j)) + a1 * load2(b1 + j)) + a2 * load2(b2 + j)) +
                            a3 * load2(b3 + j));
      for (; j < n; ++j) acc[j] = (((acc[j] + a0 * b0[j]) + a1 * b1[j]) + a2 * b2[j]) + a3 * b3[j];
    }
    for (; p < k; ++p) {
      const double a = a_at(p);
      const double* __restrict b = Bd + static_cast<std::size_t>(p) * n;
      for (int j = 0; j < n; ++j) acc[j] += a * b[j];
    }
  }

  using V2 = double __attribute__((vector_size(16)));  // one SSE2 register
  static V2 load2(const double* p) noexcept {
    V2 v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  static void store2(double* p, V2 v) noexcept { std::memcpy(p, &v, sizeof v); }

  /// The GEMM's scratch (B as doubles, one row of sums): grows to the largest call and stays.
  bool gemm_scratch(int k, int n) noexcept {
    const std::size_t need = static_cast<std::size_t>(std::max(k, 1)) * static_cast<std::size_t>(n);
    try {
      if (bd_.size() < need) bd_.resize(need);
      if (acc_.size() < static_cast<std::size_t>(n)) acc_.resize(static_cast<std::size_t>(n));
    } catch (const std::bad_alloc&) {
      fail("gemm", "out of memory for scratch");
      return false;
    }
    return true;
  }

  void bias_act(Real y, Real bias, int rows, int cols, int ldy, Act act) noexcept override {
    if (!matrix_ok("bias_act", rows, cols, ldy) || rows == 0 || cols == 0) return;
    if (!real_ok(y, "bias_act", "y")) return;
    // A null bias means activation only.
    if (bias && !real_ok(bias, "bias_act", "bias")) return;
    if (act != Act::none && act != Act::relu) return fail("bias_act", "unknown activation");
    T* Y = y.as<T>();
    const T* b = bias ? bias.as<T>() : nullptr;
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < cols; ++c) {
        T& v = Y[idx(r, ldy, c)];
        double x = static_cast<double>(v) + (b ? static_cast<double>(b[c]) : 0.0);
        if (act == Act::relu) x = x > 0.0 ? x : 0.0;
        v = static_cast<T>(x);
      }
    }
  }

  void relu_backward(Real dy, Real y, int rows, int cols, int ld) noexcept override {
    if (!matrix_ok("relu_backward", rows, cols, ld) || rows == 0 || cols == 0) return;
    if (!real_ok(dy, "relu_backward", "dy") || !real_ok(y, "relu_backward", "y")) return;
    T* D = dy.as<T>();
    const T* Y = y.as<T>();
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c)
        if (Y[idx(r, ld, c)] <= T(0)) D[idx(r, ld, c)] = T(0);
  }

  void bias_grad(Real db, Real dy, int rows, int cols, int ldy, float beta) noexcept override {
    if (!matrix_ok("bias_grad", rows, cols, ldy) || cols == 0) return;
    if (!real_ok(db, "bias_grad", "db")) return;
    if (rows > 0 && !real_ok(dy, "bias_grad", "dy")) return;
    T* B = db.as<T>();
    const T* D = rows > 0 ? dy.as<T>() : nullptr;
    for (int c = 0; c < cols; ++c) {
      double acc = 0.0;
      for (int r = 0; r < rows; ++r) acc += static_cast<double>(D[idx(r, ldy, c)]);
      // As in gemm, beta == 0 overwrites whatever db held.
      B[c] = static_cast<T>(beta == 0.0f ? acc : static_cast<double>(beta) * B[c] + acc);
    }
  }

  // --- distributional head ------------------------------------------------------------------

  void dueling_combine(Real logits, Real v, int ldv, Real adv, int rows, int D, int A,
                       int Z) noexcept override {
    combine(logits, v, ldv, adv, A * Z, rows, D, A, Z);
  }

  /// dueling_combine from advantages whose (row, branch) blocks lie ldadv apart (logits compact).
  void combine(Real logits, Real v, int ldv, Real adv, int ldadv, int rows, int D, int A, int Z) noexcept {
    if (rows < 0 || D < 0 || A < 0 || Z < 0) return fail("dueling_combine", "negative size");
    if (rows == 0 || D == 0 || A == 0 || Z == 0) return;
    if (ldv < Z) return fail("dueling_combine", "ldv smaller than Z");
    if (ldadv < A * Z) return fail("dueling_combine", "ldadv smaller than A·Z");
    if (!real_ok(logits, "dueling_combine", "logits") || !real_ok(v, "dueling_combine", "v") ||
        !real_ok(adv, "dueling_combine", "adv"))
      return;
    T* L = logits.as<T>();
    const T* V = v.as<T>();
    const T* Adv = adv.as<T>();
    // Per (b, d, atom): the mean is read before that atom is written, so logits may alias adv
    // (when compact).
    for (int b = 0; b < rows; ++b) {
      for (int d = 0; d < D; ++d) {
        const std::int64_t bd = static_cast<std::int64_t>(b) * D + d, base = bd * A * Z, abase = bd * ldadv;
        for (int i = 0; i < Z; ++i) {
          double mean = 0.0;
          for (int a = 0; a < A; ++a) mean += static_cast<double>(Adv[abase + a * Z + i]);
          mean /= A;
          const double vi = V[idx(b, ldv, i)];
          for (int a = 0; a < A; ++a)
            L[base + a * Z + i] = static_cast<T>(vi + static_cast<double>(Adv[abase + a * Z + i]) - mean);
        }
      }
    }
  }

  void dueling_backward(Real dv, int lddv, Real dadv, int lddadv, Real dlogits, int rows, int D, int A,
                        int Z) noexcept override {
    if (rows < 0 || D < 0 || A < 0 || Z < 0) return fail("dueling_backward", "negative size");
    if (rows == 0 || Z == 0) return;
    if (lddv < Z) return fail("dueling_backward", "lddv smaller than Z");
    const int ldd = ld_or(lddadv, A * Z);
    if (ldd < A * Z) return fail("dueling_backward", "lddadv smaller than A·Z");
    if (!real_ok(dv, "dueling_backward", "dv")) return;
    if (D > 0 && A > 0 &&
        (!real_ok(dadv, "dueling_backward", "dadv") || !real_ok(dlogits, "dueling_backward", "dlogits")))
      return;
    T* DV = dv.as<T>();
    T* DA = D > 0 && A > 0 ? dadv.as<T>() : nullptr;
    const T* DL = D > 0 && A > 0 ? dlogits.as<T>() : nullptr;
    // Every atom's sums are taken before that atom is written, so dadv may alias dlogits (when
    // compact).
    for (int b = 0; b < rows; ++b) {
      const std::int64_t row = static_cast<std::int64_t>(b) * D * A * Z;
      for (int i = 0; i < Z; ++i) {
        double total = 0.0;
        for (int d = 0; d < D; ++d)
          for (int a = 0; a < A; ++a) total += static_cast<double>(DL[row + (d * A + a) * Z + i]);
        DV[idx(b, lddv, i)] = static_cast<T>(total);
        for (int d = 0; d < D; ++d) {
          double mean = 0.0;
          for (int a = 0; a < A; ++a) mean += static_cast<double>(DL[row + (d * A + a) * Z + i]);
          mean /= A;
          const std::int64_t drow = (static_cast<std::int64_t>(b) * D + d) * ldd;
          for (int a = 0; a < A; ++a) {
            const std::int64_t k = row + (d * A + a) * Z + i;
            DA[drow + a * Z + i] = static_cast<T>(static_cast<double>(DL[k]) - mean);
          }
        }
      }
      for (int d = 0; d < D && DA; ++d)  // the padding after each block: zero
        for (int q = A * Z; q < ldd; ++q) DA[(static_cast<std::int64_t>(b) * D + d) * ldd + q] = T(0);
    }
  }

  void log_softmax(Real logp, Real x, int rows, int n) noexcept override {
    if (rows < 0 || n < 0) return fail("log_softmax", "negative size");
    if (rows == 0 || n == 0) return;
    if (!real_ok(logp, "log_softmax", "logp") || !real_ok(x, "log_softmax", "x")) return;
    T* out = logp.as<T>();
    const T* in = x.as<T>();
    for (int r = 0; r < rows; ++r) {
      const T* xr = in + static_cast<std::int64_t>(r) * n;
      T* yr = out + static_cast<std::int64_t>(r) * n;
      double mx = xr[0];
      for (int i = 1; i < n; ++i) mx = std::max(mx, static_cast<double>(xr[i]));
      double sum = 0.0;
      for (int i = 0; i < n; ++i) sum += std::exp(static_cast<double>(xr[i]) - mx);
      const double lse = mx + std::log(sum);
      for (int i = 0; i < n; ++i) yr[i] = static_cast<T>(static_cast<double>(xr[i]) - lse);
    }
  }

  void expected_q(Real q, Real logp, int rows, int Z, float v_min, float v_max) noexcept override {
    if (rows < 0 || Z < 0) return fail("expected_q", "negative size");
    if (rows == 0) return;
    if (!real_ok(q, "expected_q", "q") || (Z > 0 && !real_ok(logp, "expected_q", "logp"))) return;
    const double dz = support_step(v_min, v_max, Z);
    T* Q = q.as<T>();
    const T* LP = Z > 0 ? logp.as<T>() : nullptr;
    for (int r = 0; r < rows; ++r) {
      double acc = 0.0;
      for (int i = 0; i < Z; ++i)
        acc += (v_min + i * dz) * std::exp(static_cast<double>(LP[static_cast<std::int64_t>(r) * Z + i]));
      Q[r] = static_cast<T>(acc);
    }
  }

  void argmax(std::int32_t* idx_out, Real q, int rows, int n) noexcept override {
    if (rows < 0 || n <= 0) return fail("argmax", "rows < 0 or n <= 0");
    if (rows == 0) return;
    if (!idx_out) return fail("argmax", "null idx");
    if (!real_ok(q, "argmax", "q")) return;
    const T* Q = q.as<T>();
    for (int r = 0; r < rows; ++r) {
      const T* row = Q + static_cast<std::int64_t>(r) * n;
      int best = 0;
      for (int a = 1; a < n; ++a)
        if (row[a] > row[best]) best = a;  // strict: ties keep the lowest index
      idx_out[r] = best;
    }
  }

  // --- optimisation -------------------------------------------------------------------------

  void budget(const Budget& a) noexcept override {
    if (a.H < 0 || a.P < 0) return fail("budget", "negative size");
    if (!a.skip || !a.skipped) return fail("budget", "null skip/skipped");
    if (a.H > 0 && (!real_ok(a.fractions, "budget", "fractions") || !real_ok(a.norms, "budget", "norms") ||
                    !real_ok(a.clips, "budget", "clips") || !real_ok(a.losses, "budget", "losses")))
      return;
    if (a.H > 0 && a.P > 0 && !real_ok(a.grads, "budget", "grads")) return;
    if (a.P > 0 && !real_ok(a.g, "budget", "g")) return;
    if (!real_ok(a.total_loss, "budget", "total_loss")) return;

    const T* grads = a.grads.as<T>();
    const T* F = a.fractions.as<T>();
    const T* losses = a.losses.as<T>();
    T* norms = a.norms.as<T>();
    T* clips = a.clips.as<T>();
    T* g = a.g.as<T>();
    bool finite = true;
    double total_loss = 0.0;
    for (int h = 0; h < a.H; ++h) {
      const T* gh = grads + h * a.P;
      double sq = 0.0;
      for (std::int64_t i = 0; i < a.P; ++i) {
        const double x = gh[i];
        if (!std::isfinite(x)) finite = false;
        sq += x * x;
      }
      const double norm = std::sqrt(sq);
      // A head whose norm is not finite contributes nothing (and the step is skipped anyway
      // when its elements are not finite).
      const double clip = std::isfinite(norm)
                              ? std::min(1.0, static_cast<double>(F[h]) * a.max_grad_norm / (norm + 1e-6))
                              : 0.0;
      norms[h] = static_cast<T>(norm);
      clips[h] = static_cast<T>(clip);
      total_loss += static_cast<double>(losses[h]);
    }
    a.total_loss.as<T>()[0] = static_cast<T>(total_loss);
    for (std::int64_t i = 0; i < a.P; ++i) {
      double acc = 0.0;
      if (finite)
        for (int h = 0; h < a.H; ++h) acc += static_cast<double>(clips[h]) * static_cast<double>(grads[h * a.P + i]);
      g[i] = static_cast<T>(acc);
    }
    *a.skip = finite ? 0 : 1;
    if (!finite) ++*a.skipped;
  }

  void adam(const Adam& a) noexcept override {
    if (a.P < 0) return fail("adam", "negative size");
    if (!a.skip || !a.t) return fail("adam", "null skip/t");
    if (*a.skip) return;
    if (!real_ok(a.lr, "adam", "lr")) return;
    if (a.P > 0 && (!real_ok(a.params, "adam", "params") || !real_ok(a.g, "adam", "g") ||
                    !real_ok(a.m, "adam", "m") || !real_ok(a.v, "adam", "v")))
      return;
    const std::int64_t t = ++*a.t;
    const double b1 = a.beta1, b2 = a.beta2, eps = a.eps;
    const double lr = static_cast<double>(a.lr.as<T>()[0]);
    const double bc1 = 1.0 - std::pow(b1, static_cast<double>(t));
    const double bc2 = 1.0 - std::pow(b2, static_cast<double>(t));
    T* theta = a.params.as<T>();
    const T* g = a.g.as<T>();
    T* m = a.m.as<T>();
    T* v = a.v.as<T>();
    for (std::int64_t i = 0; i < a.P; ++i) {
      const double gi = g[i];
      const double mi = b1 * static_cast<double>(m[i]) + (1.0 - b1) * gi;
      const double vi = b2 * static_cast<double>(v[i]) + (1.0 - b2) * gi * gi;
      m[i] = static_cast<T>(mi);
      v[i] = static_cast<T>(vi);
      theta[i] = static_cast<T>(static_cast<double>(theta[i]) - lr * (mi / bc1) / (std::sqrt(vi / bc2) + eps));
    }
  }

  void spectral_norm(const SpectralMatrix* mats, int count, int /*max_rows*/, int /*max_cols*/,
                     float sigma_max, const std::int32_t* skip) noexcept override {
    if (count < 0) return fail("spectral_norm", "negative count");
    if (!skip) return fail("spectral_norm", "null skip");
    if (*skip || count == 0) return;
    if (!mats) return fail("spectral_norm", "null mats");
    for (int k = 0; k < count; ++k) {
      const SpectralMatrix& s = mats[k];
      if (s.rows < 0 || s.cols < 0) return fail("spectral_norm", "negative matrix size");
      if (s.rows == 0 || s.cols == 0) continue;
      if (!real_ok(s.w, "spectral_norm", "w") || !real_ok(s.u, "spectral_norm", "u")) return;
      if (!reserve(s.rows, s.cols)) return;
      T* W = s.w.as<T>();
      T* u = s.u.as<T>();
      // v = normalize(Wᵀu)
      double vnorm_sq = 0.0;
      for (int c = 0; c < s.cols; ++c) {
        double acc = 0.0;
        for (int r = 0; r < s.rows; ++r) acc += static_cast<double>(W[idx(r, s.cols, c)]) * static_cast<double>(u[r]);
        vbuf_[c] = acc;
        vnorm_sq += acc * acc;
      }
      const double vnorm = std::max(std::sqrt(vnorm_sq), 1e-12);
      for (int c = 0; c < s.cols; ++c) vbuf_[c] /= vnorm;
      // x = W v, σ = ‖x‖, u ← x/σ
      double sigma_sq = 0.0;
      for (int r = 0; r < s.rows; ++r) {
        double acc = 0.0;
        for (int c = 0; c < s.cols; ++c) acc += static_cast<double>(W[idx(r, s.cols, c)]) * vbuf_[c];
        xbuf_[r] = acc;
        sigma_sq += acc * acc;
      }
      const double sigma = std::sqrt(sigma_sq);
      const double unorm = std::max(sigma, 1e-12);
      for (int r = 0; r < s.rows; ++r) u[r] = static_cast<T>(xbuf_[r] / unorm);
      if (sigma > static_cast<double>(sigma_max)) {
        const double factor = static_cast<double>(sigma_max) / sigma;
        for (std::int64_t i = 0; i < static_cast<std::int64_t>(s.rows) * s.cols; ++i)
          W[i] = static_cast<T>(static_cast<double>(W[i]) * factor);
      }
    }
  }

  void target_update(const TargetUpdate& a) noexcept override {
    if (a.P < 0 || a.period < 0) return fail("target_update", "negative size or period");
    if (!a.skip) return fail("target_update", "null skip");
    if (*a.skip || a.P == 0) return;
    if (!real_ok(a.target, "target_update", "target") || !real_ok(a.params, "target_update", "params")) return;
    T* tgt = a.target.as<T>();
    const T* src = a.params.as<T>();
    if (a.period == 0) {
      const double tau = a.tau;
      for (std::int64_t i = 0; i < a.P; ++i) {
        const double old = tgt[i];
        tgt[i] = static_cast<T>(old + tau * (static_cast<double>(src[i]) - old));
      }
      return;
    }
    if (!a.t) return fail("target_update", "null t with a hard-copy period");
    if (*a.t % a.period == 0) std::memmove(tgt, src, static_cast<std::size_t>(a.P) * sizeof(T));
  }

  // --- elementwise and memory ---------------------------------------------------------------

  void fill(Real x, float value, std::int64_t n) noexcept override {
    if (n < 0) return fail("fill", "negative size");
    if (n == 0 || !real_ok(x, "fill", "x")) return;
    std::fill_n(x.as<T>(), n, static_cast<T>(value));
  }

  void copy(Real dst, Real src, std::int64_t n) noexcept override {
    if (n < 0) return fail("copy", "negative size");
    if (n == 0 || !real_ok(dst, "copy", "dst") || !real_ok(src, "copy", "src")) return;
    std::memmove(dst.p, src.p, static_cast<std::size_t>(n) * sizeof(T));
  }

  void axpy(Real y, Real x, float alpha, std::int64_t n) noexcept override {
    if (n < 0) return fail("axpy", "negative size");
    if (n == 0 || !real_ok(y, "axpy", "y") || !real_ok(x, "axpy", "x")) return;
    T* Y = y.as<T>();
    const T* X = x.as<T>();
    for (std::int64_t i = 0; i < n; ++i)
      Y[i] = static_cast<T>(static_cast<double>(alpha) * static_cast<double>(X[i]) + static_cast<double>(Y[i]));
  }

  void weighted_mean(Real out, Real x, Real w, std::int64_t n) noexcept override {
    constexpr const char* op = "weighted_mean";
    if (n < 0) return fail(op, "negative size");
    if (!real_ok(out, op, "out") || (n > 0 && (!real_ok(x, op, "x") || !real_ok(w, op, "w")))) return;
    const T* X = n > 0 ? x.as<T>() : nullptr;
    const T* W = n > 0 ? w.as<T>() : nullptr;
    double total = 0.0;
    for (std::int64_t i = 0; i < n; ++i) total += static_cast<double>(W[i]) * static_cast<double>(X[i]);
    out.as<T>()[0] = static_cast<T>(n > 0 ? total / static_cast<double>(n) : 0.0);
  }

  void uniform(const Uniform& a) noexcept override { uniform_from(a, 0); }
  void uniform_from(const Uniform& a, std::int64_t first) noexcept override {
    if (a.n < 0) return fail("uniform", "negative size");
    if (first < 0) return fail("uniform", "negative first value");
    if (a.n == 0 || !real_ok(a.out, "uniform", "out")) return;
    const std::uint64_t step = a.step ? static_cast<std::uint64_t>(*a.step) : 0;
    T* out = a.out.as<T>();
    for (std::int64_t i = 0; i < a.n; ++i)
      out[i] = static_cast<T>(philox::uniform(a.seed, step, a.stream, static_cast<std::uint64_t>(first + i)));
  }

  // --- the device replay (here: host memory) -----------------------------------------------

  void replay_insert(const ReplayInsert& a) noexcept override {
    if (const char* why = cpu_replay::insert<T>(a)) fail("replay_insert", why);
  }
  void replay_sample(const ReplaySample& a) noexcept override {
    if (const char* why = cpu_replay::sample<T>(a)) fail("replay_sample", why);
  }
  void replay_priorities(const ReplayPriorities& a) noexcept override {
    if (const char* why = cpu_replay::priorities<T>(a)) fail("replay_priorities", why);
  }

  void upload(void* dst, const void* src, std::size_t bytes) noexcept override {
    if (bytes == 0) return;
    if (!dst || !src) return fail("upload", "null pointer");
    std::memcpy(dst, src, bytes);
  }

  void download(void* dst, const void* src, std::size_t bytes) noexcept override {
    if (bytes == 0) return;
    if (!dst || !src) return fail("download", "null pointer");
    std::memcpy(dst, src, bytes);
  }

  void upload_reals(Real dst, const float* src, std::int64_t n) noexcept override {
    if (n < 0) return fail("upload_reals", "negative size");
    if (n == 0 || !real_ok(dst, "upload_reals", "dst")) return;
    if (!src) return fail("upload_reals", "null src");
    T* out = dst.as<T>();
    for (std::int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(src[i]);
  }

  void download_reals(float* dst, Real src, std::int64_t n) noexcept override {
    if (n < 0) return fail("download_reals", "negative size");
    if (n == 0 || !real_ok(src, "download_reals", "src")) return;
    if (!dst) return fail("download_reals", "null dst");
    const T* in = src.as<T>();
    for (std::int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(in[i]);
  }

  int status() const noexcept override { return status_; }
  const char* message() const noexcept override { return message_; }

  void expected_q_backward(Real dlogits, Real dq, Real logp, int rows, int Z, float v_min,
                           float v_max) noexcept override {
    if (rows < 0 || Z < 0) return fail("expected_q_backward", "negative size");
    if (rows == 0 || Z == 0) return;
    if (!real_ok(dlogits, "expected_q_backward", "dlogits") || !real_ok(dq, "expected_q_backward", "dq") ||
        !real_ok(logp, "expected_q_backward", "logp"))
      return;
    const double dz = support_step(v_min, v_max, Z);
    T* DL = dlogits.as<T>();
    const T* G = dq.as<T>();
    const T* LP = logp.as<T>();
    for (int r = 0; r < rows; ++r) {
      const std::int64_t base = static_cast<std::int64_t>(r) * Z;
      double q = 0.0;
      for (int i = 0; i < Z; ++i) q += (v_min + i * dz) * std::exp(static_cast<double>(LP[base + i]));
      const double g = G[r];
      for (int i = 0; i < Z; ++i)
        DL[base + i] = static_cast<T>(g * std::exp(static_cast<double>(LP[base + i])) * ((v_min + i * dz) - q));
    }
  }

  // The fused ops are the unfused ones in sequence: the reference they are checked against.
  void dueling_dist(const DuelingDist& a) noexcept override {
    constexpr const char* op = "dueling_dist";
    if (a.rows < 0 || a.D < 0 || a.A <= 0 || a.Z <= 0) return fail(op, "need rows, D >= 0, A, Z >= 1");
    if (a.star_from < 0 || a.star_from > a.rows) return fail(op, "star_from outside [0, rows]");
    if (a.a_star && !a.q) return fail(op, "a_star needs q");
    if (a.rows == 0 || a.D == 0) return;
    const int n = a.rows * a.D * a.A;
    combine(a.logp, a.v, a.ldv, a.adv, ld_or(a.ldadv, a.A * a.Z), a.rows, a.D, a.A, a.Z);
    log_softmax(a.logp, a.logp, n, a.Z);
    if (a.q) expected_q(a.q, a.logp, n, a.Z, a.v_min, a.v_max);
    if (a.a_star && a.rows > a.star_from)
      argmax(a.a_star, a.q + std::int64_t(a.star_from) * a.D * a.A, (a.rows - a.star_from) * a.D, a.A);
  }

  void relu_bias_grad(Real dy, Real y, Real db, int rows, int cols, int ld, int heads, std::int64_t stride_dy,
                      std::int64_t stride_y, std::int64_t stride_db) noexcept override {
    if (heads < 0) return fail("relu_bias_grad", "negative heads");
    for (int h = 0; h < heads; ++h) {
      if (y) relu_backward(dy + h * stride_dy, y + h * stride_y, rows, cols, ld);
      if (db) bias_grad(db + h * stride_db, dy + h * stride_dy, rows, cols, ld, 0.0f);
    }
  }

  void update(const Update& u) noexcept override {
    budget(u.budget);
    adam(u.adam);
    if (u.sn_count > 0) spectral_norm(u.sn_mats, u.sn_count, u.sn_max_rows, u.sn_max_cols, u.sigma_max, u.budget.skip);
    target_update(u.target);
  }

 private:
  static std::int64_t idx(std::int64_t row, std::int64_t ld, std::int64_t col) noexcept { return row * ld + col; }


  bool real_ok(const Real& r, const char* op, const char* what) noexcept {
    if (!r.p) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "null pointer '%s'", what);
      fail(op, buf);
      return false;
    }
    if (r.esize != sizeof(T)) {
      char buf[128];
      std::snprintf(buf, sizeof buf, "'%s' has element size %u, this backend stores %zu-byte reals", what,
                    r.esize, sizeof(T));
      fail(op, buf);
      return false;
    }
    return true;
  }

  bool matrix_ok(const char* op, int rows, int cols, int ld) noexcept {
    if (rows < 0 || cols < 0) {
      fail(op, "negative size");
      return false;
    }
    if (rows > 0 && ld < cols) {
      fail(op, "row stride smaller than the number of columns");
      return false;
    }
    return true;
  }

  /// Spectral-norm scratch: grows to the largest matrix seen and stays (no allocation per step).
  bool reserve(int rows, int cols) noexcept {
    try {
      if (vbuf_.size() < static_cast<std::size_t>(cols)) vbuf_.resize(static_cast<std::size_t>(cols));
      if (xbuf_.size() < static_cast<std::size_t>(rows)) xbuf_.resize(static_cast<std::size_t>(rows));
    } catch (...) {
      fail("spectral_norm", "out of memory for scratch vectors");
      return false;
    }
    return true;
  }

  int status_ = 0;
  char message_[256] = {};
  std::vector<double> vbuf_, xbuf_;
  std::vector<double> bd_, acc_;  // gemm_scratch
};

}  // namespace

std::unique_ptr<EngineBackend> make_cpu_backend(bool f64) {
  if (f64) return std::make_unique<CpuBackend<double>>();
  return std::make_unique<CpuBackend<float>>();
}

}  // namespace dqn
