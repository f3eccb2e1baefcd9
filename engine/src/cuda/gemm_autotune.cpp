/** @file gemm_autotune.cpp
 *  @brief Autotuning: each GEMM problem's candidates (cuBLASLt algorithms, tile_gemm shapes) timed
 *  once, outside capture, in small replayed graphs; the fastest kept, and shared with the process's
 *  other backends so that engines built alike run the same kernels.
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

std::mutex& tuned_mutex() {
  static std::mutex m;
  return m;
}
std::map<TuneKey, TunedAlgo>& tuned_algos() {
  static std::map<TuneKey, TunedAlgo> m;
  return m;
}
std::map<TuneKey, int>& tuned_tiles() {
  static std::map<TuneKey, int> m;
  return m;
}

int CudaBackend::forced_tile(const LtKey& tkey, const cuda::TileGemm& tg, const float* c) noexcept {
  int choice = kTileLt;
  const int ldm = ldm_candidate(0) ? 0 : kTileLdm;  // untimed: plain loads unless ldmatrix is forced
  if (tile_.config >= 0) {
    if (cuda::tile_gemm_fits(tg, tile_.config)) choice = tile_.config + ldm;
  } else {
    for (int cfg = 0; cfg < cuda::kTileGemmConfigs && choice < 0; ++cfg)
      if (cuda::tile_gemm_fits(tg, cfg)) choice = cfg + ldm;  // the first that fits
    float* d = choice >= 0 && autotune_ && !capturing_ ? tune_buffer(tile_extent(tg)) : nullptr;
    if (d && tune_events()) choice = fastest_tile(tg, c, d, INFINITY, choice);
  }
  remember_tile(tkey, choice);
  return choice;
}

int CudaBackend::timed_tile(const LtKey& tkey, const cuda::TileGemm& tg, const LtPlan& p, bool fused, const void* pa,
               const void* pb, const float* c, const void* bias, float alpha, float beta) noexcept {
  int choice = kTileLt;
  float* d = tune_buffer(tile_extent(tg));
  if (d && tune_events()) {
    float best = INFINITY;
    if (p.use_lt) {
      bool works = false;
      best = time_algo(p, p.algo, pa, pb, c, d, fused ? bias : nullptr, alpha, beta, works);
      if (status_ != 0) return kTileLt;
      if (!works) best = INFINITY;
      // Unfused, the cuBLASLt path also runs bias_act, which tile_gemm does not need: not
      // counted, so a tile shape must win on the GEMM alone. The mask's kernel is counted: it
      // runs after cuBLASLt on every path but tile_gemm's.
      if (tg.mask && std::isfinite(best)) {
        best += time_graph([&] {
          return cuda::relu_mask(stream_, d, tg.m, tg.n, tg.ldc, tg.mask, tg.ldmask, tg.mask_rows, tg.batch,
                                 tg.stride_c, tg.stride_mask) == cudaSuccess;
        });
        if (status_ != 0) return kTileLt;
      }
      // A batch2 call: the library runs one entry per launch, one after the other; tile_gemm
      // (timed below) all of them in one.
      best *= static_cast<float>(std::max(tg.batch2, 1));
    }
    choice = fastest_tile(tg, c, d, best, choice);
  }
  remember_tile(tkey, choice);
  return choice;
}

int CudaBackend::fastest_tile(const cuda::TileGemm& tg, const float* c, float* d, float best, int choice) noexcept {
  for (int cfg = 0; cfg < cuda::kTileGemmConfigs; ++cfg) {
    if (!cuda::tile_gemm_fits(tg, cfg)) continue;
    for (const int ldm : {0, kTileLdm}) {
      if (!ldm_candidate(ldm)) continue;
      // a layout without a k-contiguous operand runs the same kernel with ldmatrix: timed once
      if (ldm != 0 && ldm_candidate(0) && !cuda::tile_gemm_ldmatrix_layout(tg.ta, tg.tb)) continue;
      const float ms = time_tile(tg, cfg + ldm, c, d);
      if (status_ != 0) return kTileLt;
      if (ms < best * (1.0f - kTuneMargin)) {
        best = ms;
        choice = cfg + ldm;
      }
    }
  }
  return choice;
}

std::size_t CudaBackend::tile_extent(const cuda::TileGemm& tg) noexcept {
  const std::int64_t extent = (tg.batch > 1 ? (tg.batch - 1) * tg.stride_c : 0) +
                              (tg.batch2 > 1 ? (tg.batch2 - 1) * tg.stride2_c : 0) +
                              static_cast<std::int64_t>(tg.m - 1) * tg.ldc + tg.n;
  return static_cast<std::size_t>(extent) * 4;
}

float CudaBackend::time_tile(const cuda::TileGemm& tg, int choice, const float* c, float* d) noexcept {
  cuda::TileGemm t = tg;
  t.c_in = c;  // beta·C from the caller's C, D to the private buffer
  t.c = d;
  const bool works = launch_tile(t, choice) == cudaSuccess;  // also the warm-up
  if (!works) {
    cudaGetLastError();
    return INFINITY;
  }
  return time_graph([&] { return launch_tile(t, choice) == cudaSuccess; });
}

void CudaBackend::autotune(LtPlan& p, const LtKey& key, const void* a, const void* b, const float* c, const void* bias,
              float alpha, float beta) noexcept {
  p.decided = true;
  std::vector<LtAlgo> cands;
  cands.swap(p.candidates);
  if (cands.size() <= 1 || capturing_) return;
  const std::int64_t extent = (key.batch > 1 ? (key.batch - 1) * key.stride_c : 0) +
                              static_cast<std::int64_t>(key.n - 1) * key.ldc + key.m;
  float* d = tune_buffer(static_cast<std::size_t>(extent) * 4);
  if (!d || !tune_events()) return;
  int best = -1;
  float best_ms = 0.0f;
  bool any_works = false;
  for (std::size_t i = 0; i < cands.size(); ++i) {
    bool works = false;
    const float ms = time_algo(p, cands[i].algo, a, b, c, d, bias, alpha, beta, works);
    if (status_ != 0) return;  // a sticky error (recorded): leave it there
    if (!works) continue;
    if (!any_works) {
      any_works = true;
      best = static_cast<int>(i);
      best_ms = ms;
    } else if (ms < best_ms * (1.0f - kTuneMargin)) {
      best = static_cast<int>(i);
      best_ms = ms;
    }
  }
  if (!any_works) {
    p.use_lt = false;
    return;
  }
  p.algo = cands[static_cast<std::size_t>(best)].algo;
  try {
    std::lock_guard<std::mutex> lock(tuned_mutex());
    tuned_algos().emplace(TuneKey{device_, static_cast<int>(precision_), key}, TunedAlgo{p.compute, p.algo});
  } catch (...) {
    // not shared with later engines; this one keeps its choice
  }
}

float CudaBackend::time_algo(const LtPlan& p, const cublasLtMatmulAlgo_t& algo, const void* a, const void* b, const float* c,
                float* d, const void* bias, float alpha, float beta, bool& works) noexcept {
  works = lt_matmul(p, algo, a, b, c, d, bias, alpha, beta) == CUBLAS_STATUS_SUCCESS;  // also the warm-up
  if (!works) return INFINITY;
  return time_graph([&] { return lt_matmul(p, algo, a, b, c, d, bias, alpha, beta) == CUBLAS_STATUS_SUCCESS; });
}

template <class F>
float CudaBackend::time_graph(F&& enqueue) noexcept {
  constexpr const char* op = "gemm (autotune)";
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  float result = INFINITY;
  if (cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal) == cudaSuccess) {
    bool ok = true;
    for (int r = 0; r < kTuneReps && ok; ++r) ok = enqueue();
    const cudaError_t e = cudaStreamEndCapture(stream_, &graph);
    if (ok && e == cudaSuccess && graph && cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess &&
        cudaGraphLaunch(exec, stream_) == cudaSuccess) {
      bool timed = true;
      for (int s = 0; s < kTuneSamples && timed; ++s)
        timed = cudaEventRecord(tune_events_[2 * s], stream_) == cudaSuccess &&
                cudaGraphLaunch(exec, stream_) == cudaSuccess &&
                cudaEventRecord(tune_events_[2 * s + 1], stream_) == cudaSuccess;
      std::array<float, kTuneSamples> ms{};
      if (timed && DQN_CUDA_OK(op, cudaEventSynchronize(tune_events_[2 * kTuneSamples - 1]))) {
        for (int s = 0; s < kTuneSamples && timed; ++s)
          timed = cudaEventElapsedTime(&ms[static_cast<std::size_t>(s)], tune_events_[2 * s], tune_events_[2 * s + 1]) ==
                  cudaSuccess;
        if (timed) {
          std::sort(ms.begin(), ms.end());
          result = ms[kTuneSamples / 2];
        }
      }
    }
  }
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  cudaGetLastError();  // a failed capture or launch above is not the step's error
  // Whatever ran must be done before the next candidate (and before the step's work).
  DQN_CUDA_OK(op, cudaStreamSynchronize(stream_));
  return result;
}

float* CudaBackend::tune_buffer(std::size_t bytes) noexcept {
  if (bytes <= tune_bytes_) return static_cast<float*>(tune_d_);
  bytes = round_up(bytes, 256);
  if (tune_d_) {
    cudaFree(tune_d_);
    forget_device_bytes(tune_bytes_);
    tune_d_ = nullptr;
    tune_bytes_ = 0;
  }
  if (cudaMalloc(&tune_d_, bytes) != cudaSuccess) {
    cudaGetLastError();
    tune_d_ = nullptr;
    return nullptr;  // no tuning for this key, nothing failed
  }
  tune_bytes_ = bytes;
  note_device_bytes(bytes);
  return static_cast<float*>(tune_d_);
}

bool CudaBackend::tune_events() noexcept {
  if (tune_events_[0]) return true;
  for (auto& e : tune_events_) {
    if (cudaEventCreate(&e) != cudaSuccess) {
      cudaGetLastError();
      for (auto& x : tune_events_) {
        if (x) cudaEventDestroy(x);
        x = nullptr;
      }
      return false;
    }
  }
  return true;
}

}  // namespace dqn::cuda
