// gpu.ops: the GEMM op against its CPU twin on every layout, precision and kernel family.
#include <doctest/doctest.h>

#include "gpu_ops_util.hpp"

using namespace dqn;
using namespace gpu_ops;

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

