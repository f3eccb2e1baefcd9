/** @file cuda_gemm.cpp
 *  @brief The CUDA backend's GEMM: the cuBLASLt plan of each problem (descriptors, heuristic, fused
 *  epilogue), tile_gemm where autotuning or the pipeline chose it, split-k for tall reductions.
 */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/cuda_ops.hpp"

namespace dqn::cuda {

void CudaBackend::gemm(const Gemm& g) noexcept {
  constexpr const char* op = "gemm";
  if (g.batch2 != 1) {
    if (g.batch2 < 1) return fail(op, "batch2 must be at least 1");
    if (g.sum_batch) return fail(op, "sum_batch needs batch2 1");
    // Entry 0 decides the path (gemm_body takes batch2_: tile_gemm's choice is timed with every
    // entry in its one launch, against the library's launch per entry); where that is
    // tile_gemm, its launch runs every entry, else each entry is a call of its own.
    batch2_ = &g;
    ran_batch2_ = false;
    gemm(batch2_entry(g, 0));
    batch2_ = nullptr;
    for (int j = 1; j < g.batch2 && !ran_batch2_ && status_ == 0; ++j) gemm(batch2_entry(g, j));
    return;
  }
  if (g.mask && (!real_ok(g.mask, op, "mask") || g.ldmask < g.n || g.mask_rows < 0))
    return fail(op, "mask needs ldmask >= n and mask_rows >= 0");
  masked_in_kernel_ = false;
  gemm_body(g);
  if (!g.mask || masked_in_kernel_ || status_ != 0 || planning_ || g.m == 0 || g.n == 0) return;
  const bool batched = g.batch > 1;
  DQN_CUDA_OK(op, cuda::relu_mask(stream_, g.c.as<float>(), g.m, g.n, g.ldc, g.mask.as<const float>(), g.ldmask,
                                  g.mask_rows, g.batch, batched ? g.stride_c : 0, batched ? g.stride_mask : 0));
}

void CudaBackend::gemm_body(const Gemm& g) noexcept {
  constexpr const char* op = "gemm";
  const Gemm* const g2 = batch2_;  // this call only, not the calls it makes (split-k's)
  batch2_ = nullptr;
  if (g.m < 0 || g.n < 0 || g.k < 0 || g.batch < 0) return fail(op, "negative size");
  if (g.m == 0 || g.n == 0 || (g.batch == 0 && !g.sum_batch)) return;
  const int a_rows = g.ta ? g.k : g.m, a_cols = g.ta ? g.m : g.k;
  const int b_rows = g.tb ? g.n : g.k, b_cols = g.tb ? g.k : g.n;
  if (g.k > 0 && g.batch > 0 && (g.lda < std::max(1, a_cols) || g.ldb < std::max(1, b_cols)))
    return fail(op, "lda/ldb smaller than the row length of A/B");
  if (g.ldc < g.n) return fail(op, "ldc smaller than n");
  if (!real_ok(g.c, op, "c")) return;
  if (g.k > 0 && g.batch > 0 && (!real_ok(g.a, op, "a") || !real_ok(g.b, op, "b"))) return;
  if (g.bias && !real_ok(g.bias, op, "bias")) return;
  if (g.act != Act::none && g.act != Act::relu) return fail(op, "unknown activation");
  const bool epilogue = g.bias || g.act != Act::none;
  if (g.sum_batch) return sum_batch(g);
  if (g.k == 0) {  // C = act(beta C + bias): no library call
    if (planning_) return;
    if (!DQN_CUDA_OK(op, cuda::scale_matrix(stream_, g.c.as<float>(), g.m, g.n, g.ldc, g.stride_c, g.batch, g.beta)))
      return;
    if (epilogue) separate_epilogue(g);
    return;
  }
  if (const int slices = split_slices(g); slices > 1) return split_k(g, slices);
  const bool batched = g.batch > 1;
  const bool bf16 = precision_ == Precision::bf16;
  // Row-major C = op(A) op(B) is column-major Cᵀ = op(B)ᵀ op(A)ᵀ: B is cuBLAS's first operand.
  LtKey key;
  key.op_a = g.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  key.op_b = g.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  key.m = g.n;
  key.n = g.m;
  key.k = g.k;
  key.ldc = g.ldc;
  key.batch = g.batch;
  key.stride_c = batched ? g.stride_c : 0;
  key.beta_zero = g.beta == 0.0f;
  key.align_c = alignment_of(g.c.p, batched ? g.stride_c * 4 : 0);
  // bf16: operands are converted into compact copies in scratch (a broadcast operand, stride 0, once).
  const int copies_a = batched && g.stride_a != 0 ? g.batch : 1;
  const int copies_b = batched && g.stride_b != 0 ? g.batch : 1;
  const std::size_t bytes_a = round_up(std::size_t{2} * copies_a * a_rows * a_cols, 256);
  const std::size_t bytes_b = round_up(std::size_t{2} * copies_b * b_rows * b_cols, 256);
  if (bf16) {
    key.ab_type = CUDA_R_16BF;
    key.lda = b_cols;
    key.ldb = a_cols;
    key.stride_a = batched && copies_b > 1 ? static_cast<std::int64_t>(b_rows) * b_cols : 0;
    key.stride_b = batched && copies_a > 1 ? static_cast<std::int64_t>(a_rows) * a_cols : 0;
    key.align_a = key.align_b = 256;  // scratch is 256-aligned, and so is each copy
  } else {
    key.ab_type = CUDA_R_32F;
    key.lda = g.ldb;
    key.ldb = g.lda;
    key.stride_a = batched ? g.stride_b : 0;
    key.stride_b = batched ? g.stride_a : 0;
    key.align_a = alignment_of(g.b.p, key.stride_a * 4);
    key.align_b = alignment_of(g.a.p, key.stride_b * 4);
  }
  // tile_gemm (tf32): decided once per problem (forced, or timed against cuBLASLt below).
  int* tile = nullptr;
  cuda::TileGemm tg;
  LtKey tkey = key;
  if (precision_ == Precision::tf32 && tile_.on) {
    tg = tile_args(g);
    tkey.epilogue = (g.bias ? 1 : 0) | (g.act == Act::relu ? 2 : 0) | (g.mask ? 4 : 0);
    tkey.stride_bias = g.bias && batched ? g.stride_bias : 0;
    if (g2) {  // entry 0 of a batch2 call: one launch for every entry
      tg.batch2 = tkey.batch2 = g2->batch2;
      tg.stride2_a = tkey.stride2_a = g2->stride2_a;
      tg.stride2_b = tkey.stride2_b = g2->stride2_b;
      tg.stride2_c = tkey.stride2_c = g2->stride2_c;
      tg.stride2_bias = tkey.stride2_bias = g.bias ? g2->stride2_bias : 0;
      tg.stride2_mask = g.mask ? g2->stride2_mask : 0;
    }
    if (!(tile = tile_slot(tkey))) return;
    if (*tile == kTileUndecided && tile_.forced) *tile = forced_tile(tkey, tg, g.c.as<const float>());
    if (status_ != 0) return;
    if (*tile >= 0) return tile_chosen(tg, *tile);
    if (*tile == kTileUndecided && (capturing_ || !autotune_)) *tile = kTileLt;
    if (*tile == kTileLt) tile = nullptr;  // cuBLASLt from here on
  }
  // The fused epilogue (beta == 0 only: then C = act(alpha·AB + bias) without any doubt about
  // where beta·C enters). Our n is cuBLAS's m, the rows of column-major D: the bias runs along
  // them and is broadcast over D's columns (our m rows), as cuBLASLt's bias epilogue does.
  LtKey fkey = key;
  LtPlan* plan = nullptr;
  bool fused = false;
  if (epilogue && g.beta == 0.0f) {
    const bool relu = g.act == Act::relu;
    fkey.epilogue = !g.bias ? CUBLASLT_EPILOGUE_RELU : relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS;
    if (g.bias) {
      fkey.stride_bias = batched ? g.stride_bias : 0;
      fkey.align_bias = alignment_of(g.bias.p, fkey.stride_bias * 4);
    }
    plan = plan_for(fkey, g.bias.p);
    if (!plan) return;
    fused = plan->use_lt;
  }
  if (!fused && !(plan = plan_for(key, nullptr))) return;
  const void* pa = g.b.p;  // cuBLAS's A (our B)
  const void* pb = g.a.p;  // cuBLAS's B (our A)
  // Autotune on the first run of a key outside capture (in the engine: while planning), with
  // these very operands; D goes to a private buffer, so nothing the caller sees is written.
  const bool tune = wants_tuning(plan);
  if (bf16) {
    const std::size_t need = bytes_a + bytes_b;
    void* s = nullptr;
    if (planning_) {
      plan_need_ = std::max(plan_need_, need);
      // Tuning needs the operand copies now; scratch grows only at plan_end: too small, and the
      // key keeps the heuristic's first algorithm (fixed at the capture or first real run).
      if (!tune || need > scratch_bytes_) return;
      s = scratch_;
    } else if (!(s = scratch(op, need))) {
      return;
    }
    void* a16 = s;                                  // our A in bf16
    void* b16 = static_cast<char*>(s) + bytes_a;    // our B in bf16
    if (!DQN_CUDA_OK(op, cuda::to_bf16(stream_, a16, g.a.as<const float>(), a_rows, a_cols, g.lda, g.stride_a, copies_a)))
      return;
    if (!DQN_CUDA_OK(op, cuda::to_bf16(stream_, b16, g.b.as<const float>(), b_rows, b_cols, g.ldb, g.stride_b, copies_b)))
      return;
    pa = b16;
    pb = a16;
  } else if (planning_ && !tune && !tile) {
    return;
  }
  const float alpha = g.alpha, beta = g.beta;
  float* c = g.c.as<float>();
  if (tune) {
    autotune(*plan, fused ? fkey : key, pa, pb, c, g.bias.p, alpha, beta);
    if (fused && !plan->use_lt) {  // no algorithm ran the fused epilogue after all: plain GEMM + bias_act
      fused = false;
      if (!(plan = plan_for(key, nullptr))) return;
      if (wants_tuning(plan)) autotune(*plan, key, pa, pb, c, nullptr, alpha, beta);
    }
  }
  if (tile) {  // undecided: the tile shapes against the cuBLASLt algorithm just chosen
    *tile = timed_tile(tkey, tg, *plan, fused, pa, pb, c, g.bias.p, alpha, beta);
    if (status_ != 0) return;
    if (*tile >= 0) return tile_chosen(tg, *tile);
  }
  if (planning_) return;
  plan->decided = true;  // from this run (or capture) on, the algorithm never changes
  plan->candidates.clear();
  if (fused) {
    const cublasStatus_t s = lt_matmul(*plan, plan->algo, pa, pb, c, c, g.bias.p, alpha, beta);
    if (s == CUBLAS_STATUS_SUCCESS) return;
    if (s != CUBLAS_STATUS_NOT_SUPPORTED) {
      cublas_ok(op, s, "cublasLtMatmul(lt, desc (fused bias/activation epilogue), ...)", __FILE__, __LINE__);
      return;
    }
    // Refused at launch, before anything was enqueued (also under capture): this key runs
    // unfused from now on.
    plan->use_lt = false;
    if (!(plan = plan_for(key, nullptr))) return;
    if (wants_tuning(plan)) autotune(*plan, key, pa, pb, c, nullptr, alpha, beta);
    plan->decided = true;
    plan->candidates.clear();
  }
  if (plan->use_lt) {
    if (!DQN_CUBLAS_OK(op, lt_matmul(*plan, plan->algo, pa, pb, c, c, nullptr, alpha, beta))) return;
  } else {
    const auto t = static_cast<cudaDataType_t>(key.ab_type);
    if (!DQN_CUBLAS_OK(op, cublasGemmStridedBatchedEx(
                          blas_, static_cast<cublasOperation_t>(key.op_a), static_cast<cublasOperation_t>(key.op_b),
                          key.m, key.n, key.k, &alpha, pa, t, static_cast<int>(key.lda), key.stride_a, pb, t,
                          static_cast<int>(key.ldb), key.stride_b, &beta, c, CUDA_R_32F, static_cast<int>(key.ldc),
                          key.stride_c, key.batch, plan->compute, CUBLAS_GEMM_DEFAULT)))
      return;
  }
  if (epilogue) separate_epilogue(g);
}

int CudaBackend::split_slices(const Gemm& g) const noexcept {
  if (in_split_ || precision_ == Precision::bf16 || g.batch != 1 || g.beta != 0.0f || g.bias ||
      g.act != Act::none || g.k < kSplitMinK)
    return 0;
  const int sms = std::max(props_.multiProcessorCount, 1);
  const long tiles = static_cast<long>((g.m + 63) / 64) * ((g.n + 63) / 64);
  if (tiles * 4 > sms) return 0;  // enough output tiles already
  const long by_k = g.k / kSplitMinSlice, by_tiles = std::max(2L, 2L * sms / std::max(tiles, 1L));
  return static_cast<int>(std::min({static_cast<long>(kSplitMaxSlices), by_k, by_tiles}));
}

void CudaBackend::sum_batch(const Gemm& g) noexcept {
  constexpr const char* op = "gemm";
  if (g.beta != 0.0f || g.bias || g.act != Act::none || g.mask)
    return fail(op, "sum_batch needs beta 0 and no bias, activation or mask");
  if (g.batch == 0) {  // the empty sum: C = 0
    if (!planning_)
      DQN_CUDA_OK(op, cuda::scale_matrix(stream_, g.c.as<float>(), g.m, g.n, g.ldc, 0, 1, 0.0f));
    return;
  }
  const std::int64_t mn = static_cast<std::int64_t>(g.m) * g.n;
  void* s = scratch(op, static_cast<std::size_t>(g.batch) * static_cast<std::size_t>(mn) * 4);
  if (!s && !planning_) return;
  auto* part = static_cast<float*>(planning_ ? scratch_ : s);
  Gemm sub = g;
  sub.sum_batch = 0;
  sub.c = Real{part, 4};
  sub.ldc = g.n;
  sub.stride_c = mn;
  gemm(sub);
  if (planning_ || status_ != 0) return;
  DQN_CUDA_OK(op, cuda::sum_slices(stream_, g.c.as<float>(), g.m, g.n, g.ldc, part, g.batch));
}

void CudaBackend::split_k(const Gemm& g, int slices) noexcept {
  constexpr const char* op = "gemm";
  // slices of a multiple of 4 along k: 16-byte aligned operands when k runs along a row
  const int ks = ((g.k + slices - 1) / slices + 3) / 4 * 4, full = g.k / ks, rem = g.k - full * ks;
  const int parts = full + (rem > 0 ? 1 : 0);
  const std::int64_t mn = static_cast<std::int64_t>(g.m) * g.n;
  const std::size_t bytes = static_cast<std::size_t>(parts) * static_cast<std::size_t>(mn) * 4;
  void* s = scratch(op, bytes);
  // While planning, the slices' GEMMs are still planned (and tuned) against the scratch's
  // address, which is where they will write.
  if (!s && !planning_) return;
  auto* part = static_cast<float*>(planning_ ? scratch_ : s);
  in_split_ = true;
  Gemm sub = g;  // slice i: k in [i·ks, (i+1)·ks); the mask (gemm()) after the sum
  sub.mask = Real{};
  sub.k = ks;
  sub.batch = full;
  sub.stride_a = g.ta ? static_cast<std::int64_t>(ks) * g.lda : ks;
  sub.stride_b = g.tb ? ks : static_cast<std::int64_t>(ks) * g.ldb;
  sub.c = Real{part, 4};
  sub.ldc = g.n;
  sub.stride_c = mn;
  gemm(sub);
  if (rem > 0) {
    const std::int64_t k0 = static_cast<std::int64_t>(full) * ks;
    Gemm last = g;
    last.mask = Real{};
    last.k = rem;
    last.a = g.a + (g.ta ? k0 * g.lda : k0);
    last.b = g.b + (g.tb ? k0 : k0 * g.ldb);
    last.c = Real{part + static_cast<std::int64_t>(full) * mn, 4};
    last.ldc = g.n;
    gemm(last);
  }
  in_split_ = false;
  if (planning_) return;
  DQN_CUDA_OK(op, cuda::sum_slices(stream_, g.c.as<float>(), g.m, g.n, g.ldc, part, parts));
}

LtPlan* CudaBackend::plan_for(const LtKey& key, const void* bias) noexcept {
  constexpr const char* op = "gemm";
  if (auto it = plans_.find(key); it != plans_.end()) return &it->second;
  std::vector<cublasComputeType_t> candidates;
  switch (precision_) {
    case Precision::fp32: candidates = {CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_COMPUTE_32F}; break;
    case Precision::tf32: candidates = {CUBLAS_COMPUTE_32F_FAST_TF32}; break;
    case Precision::bf16: candidates = {CUBLAS_COMPUTE_32F}; break;
  }
  const auto epilogue = static_cast<cublasLtEpilogue_t>(key.epilogue);
  const bool has_bias = epilogue == CUBLASLT_EPILOGUE_BIAS || epilogue == CUBLASLT_EPILOGUE_RELU_BIAS;
  LtPlan plan;
  plan.compute = candidates.front();
  plan.has_bias = has_bias;
  const auto ab = static_cast<cudaDataType_t>(key.ab_type);
  const auto op_a = static_cast<cublasOperation_t>(key.op_a), op_b = static_cast<cublasOperation_t>(key.op_b);
  for (const cublasComputeType_t compute : candidates) {
    LtPlan p;
    p.compute = compute;
    p.has_bias = has_bias;
    cublasLtMatmulPreference_t pref = nullptr;
    bool ok = DQN_CUBLAS_OK(op, cublasLtMatmulDescCreate(&p.desc, compute, CUDA_R_32F)) &&
              DQN_CUBLAS_OK(op, cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a)) &&
              DQN_CUBLAS_OK(op, cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b)) &&
              make_layout(&p.la, ab, op_a == CUBLAS_OP_N ? key.m : key.k, op_a == CUBLAS_OP_N ? key.k : key.m,
                          key.lda, key.batch, key.stride_a) &&
              make_layout(&p.lb, ab, op_b == CUBLAS_OP_N ? key.k : key.n, op_b == CUBLAS_OP_N ? key.n : key.k,
                          key.ldb, key.batch, key.stride_b) &&
              make_layout(&p.lc, CUDA_R_32F, key.m, key.n, key.ldc, key.batch, key.stride_c) &&
              DQN_CUBLAS_OK(op, cublasLtMatmulPreferenceCreate(&pref));
    if (ok && epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
      ok = DQN_CUBLAS_OK(op, cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
      if (ok && has_bias) {
        const std::int32_t bias_type = CUDA_R_32F;
        ok = DQN_CUBLAS_OK(op, cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type)) &&
             DQN_CUBLAS_OK(op, cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
        if (ok && key.batch > 1)
          ok = DQN_CUBLAS_OK(op, cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, &key.stride_bias, sizeof key.stride_bias));
      }
    }
    if (ok) {
      const std::uint64_t ws = kWorkspaceBytes;
      ok = DQN_CUBLAS_OK(op, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws)) &&
           DQN_CUBLAS_OK(op, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &key.align_a, sizeof key.align_a)) &&
           DQN_CUBLAS_OK(op, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &key.align_b, sizeof key.align_b)) &&
           DQN_CUBLAS_OK(op, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &key.align_c, sizeof key.align_c)) &&
           DQN_CUBLAS_OK(op, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &key.align_c, sizeof key.align_c));
    }
    if (ok) {
      std::array<cublasLtMatmulHeuristicResult_t, kMaxAlgos> results{};
      int found = 0;
      // "No algorithm" is not an error: it falls through to the next candidate or to cuBLAS
      // (for a fused key: to the plain GEMM and bias_act).
      const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(lt_, p.desc, p.la, p.lb, p.lc, p.lc, pref,
                                                              autotune_ ? kMaxAlgos : 1, results.data(), &found);
      if (s == CUBLAS_STATUS_SUCCESS) {
        try {
          for (int i = 0; i < std::min(found, kMaxAlgos); ++i)
            if (results[static_cast<std::size_t>(i)].state == CUBLAS_STATUS_SUCCESS)
              p.candidates.push_back(LtAlgo{results[static_cast<std::size_t>(i)].algo});
        } catch (...) {
          p.candidates.clear();  // out of memory: the heuristic's first below, if any
          if (found > 0 && results[0].state == CUBLAS_STATUS_SUCCESS) p.candidates.assign(1, LtAlgo{results[0].algo});
        }
      }
      if (!p.candidates.empty()) {
        p.use_lt = true;
        p.algo = p.candidates.front().algo;
      }
    }
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (!ok) {
      p.release();
      return nullptr;
    }
    if (p.use_lt) {
      plan = p;
      break;
    }
    p.release();
  }
  if (plan.use_lt && autotune_ && plan.candidates.size() > 1) {
    // Tuned before in this process (another engine, the same problem): take that choice.
    std::lock_guard<std::mutex> lock(tuned_mutex());
    const auto& tuned = tuned_algos();
    if (auto it = tuned.find(TuneKey{device_, static_cast<int>(precision_), key});
        it != tuned.end() && it->second.compute == plan.compute) {
      plan.algo = it->second.algo;
      plan.candidates.clear();
    }
  }
  if (!plan.use_lt || !autotune_ || plan.candidates.size() <= 1) {
    plan.decided = true;  // nothing to choose from
    plan.candidates.clear();
  }
  try {
    return &plans_.emplace(key, std::move(plan)).first->second;
  } catch (...) {
    plan.release();
    fail(op, "out of memory caching a GEMM plan");
    return nullptr;
  }
}

cublasStatus_t CudaBackend::lt_matmul(const LtPlan& p, const cublasLtMatmulAlgo_t& algo, const void* a, const void* b,
                         const float* c, float* d, const void* bias, float alpha, float beta) noexcept {
  if (p.has_bias) {
    const cublasStatus_t s = cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
  }
  return cublasLtMatmul(lt_, p.desc, &alpha, a, p.la, b, p.lb, &beta, c, p.lc, d, p.lc, &algo, workspace_,
                        kWorkspaceBytes, stream_);
}

cuda::TileGemm CudaBackend::tile_args(const Gemm& g) noexcept {
  cuda::TileGemm t;
  t.ta = g.ta;
  t.tb = g.tb;
  t.relu = g.act == Act::relu;
  t.m = g.m;
  t.n = g.n;
  t.k = g.k;
  t.lda = g.lda;
  t.ldb = g.ldb;
  t.ldc = g.ldc;
  t.batch = g.batch;
  t.alpha = g.alpha;
  t.beta = g.beta;
  t.a = g.a.as<const float>();
  t.b = g.b.as<const float>();
  t.c = g.c.as<float>();
  t.c_in = t.c;
  t.bias = g.bias ? g.bias.as<const float>() : nullptr;
  const bool batched = g.batch > 1;
  t.stride_a = batched ? g.stride_a : 0;
  t.stride_b = batched ? g.stride_b : 0;
  t.stride_c = batched ? g.stride_c : 0;
  t.stride_bias = batched && g.bias ? g.stride_bias : 0;
  t.mask = g.mask ? g.mask.as<const float>() : nullptr;
  t.ldmask = g.ldmask;
  t.mask_rows = g.mask_rows > 0 ? g.mask_rows : g.m;
  t.stride_mask = batched && g.mask ? g.stride_mask : 0;
  return t;
}

int* CudaBackend::tile_slot(const LtKey& tkey) noexcept {
  try {
    auto [it, fresh] = tiles_.try_emplace(tkey, kTileUndecided);
    if (fresh && !tile_.forced) {
      std::lock_guard<std::mutex> lock(tuned_mutex());
      const auto& shared = tuned_tiles();
      if (auto s = shared.find(tile_key(tkey)); s != shared.end())
        it->second = s->second;
    }
    return &it->second;
  } catch (...) {
    fail("gemm", "out of memory caching a GEMM plan");
    return nullptr;
  }
}

void CudaBackend::remember_tile(const LtKey& tkey, int choice) noexcept {
  if (tile_.forced) return;  // a forced choice is this backend's own
  try {
    std::lock_guard<std::mutex> lock(tuned_mutex());
    tuned_tiles().emplace(tile_key(tkey), choice);
  } catch (...) {
    // not shared with later engines; this one keeps its choice
  }
}

void CudaBackend::tile_chosen(const cuda::TileGemm& tg, int choice) noexcept {
  if (tg.batch2 > 1) ran_batch2_ = true;
  if (!planning_) run_tile(tg, choice);
}

cudaError_t CudaBackend::launch_tile(const cuda::TileGemm& tg, int choice) noexcept {
  cuda::TileGemm t = tg;
  t.ldmatrix = choice >= kTileLdm;
  return cuda::tile_gemm(stream_, t, choice % kTileLdm);
}

void CudaBackend::separate_epilogue(const Gemm& g) noexcept {
  constexpr const char* op = "gemm";
  const float* bias = g.bias ? g.bias.as<const float>() : nullptr;
  const bool relu = g.act == Act::relu;
  float* c = g.c.as<float>();
  const std::int64_t wide = static_cast<std::int64_t>(g.batch) * g.n;
  if (g.batch > 1 && g.stride_c == g.n && (!bias || g.stride_bias == g.n) && wide <= g.ldc) {
    DQN_CUDA_OK(op, cuda::bias_act(stream_, c, bias, g.m, static_cast<int>(wide), g.ldc, relu));
    return;
  }
  for (int i = 0; i < g.batch; ++i)
    if (!DQN_CUDA_OK(op, cuda::bias_act(stream_, c + i * g.stride_c, bias ? bias + i * g.stride_bias : nullptr, g.m,
                                        g.n, g.ldc, relu)))
      return;
}

bool CudaBackend::make_layout(cublasLtMatrixLayout_t* l, cudaDataType_t type, int rows, int cols, std::int64_t ld, int batch,
                 std::int64_t stride) noexcept {
  constexpr const char* op = "gemm";
  if (!DQN_CUBLAS_OK(op, cublasLtMatrixLayoutCreate(l, type, static_cast<std::uint64_t>(rows),
                                                     static_cast<std::uint64_t>(cols), ld)))
    return false;
  if (batch <= 1) return true;
  const std::int32_t count = batch;
  return DQN_CUBLAS_OK(op, cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count)) &&
         DQN_CUBLAS_OK(op, cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
}

}  // namespace dqn::cuda
