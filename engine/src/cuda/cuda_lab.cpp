/** @file cuda_lab.cpp
 *  @brief The CUDA runtime's facts for tests and measurement tools (lab.hpp).
 */
#include "cuda/cuda_lab.hpp"

#include <cuda_runtime.h>

#include <atomic>
#include <stdexcept>

#include "cuda/graph_runtime.hpp"

namespace dqn::cuda::lab {
namespace {

std::atomic<bool> g_update_clock{false};

const CudaRuntime& cuda_runtime(const Runtime& rt) {
  const auto* c = dynamic_cast<const CudaRuntime*>(&rt);
  if (!c) throw std::invalid_argument("not a CUDA runtime: " + rt.describe());
  return *c;
}

}  // namespace

UpdateInfo update_info(const Runtime& rt) {
  const CudaBackend& be = cuda_runtime(rt).backend();
  return UpdateInfo{be.update_cluster(), be.update_choices()};
}

bool cluster_launch_available() noexcept {
  int count = 0, ok = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0 ||
      cudaDeviceGetAttribute(&ok, cudaDevAttrClusterLaunch, 0) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return ok != 0;
}

bool record_update_clock(bool on) noexcept {
  if (!DQN_LAB) return false;
  g_update_clock = on;
  return true;
}
bool update_clock_wanted() noexcept { return g_update_clock; }

UpdateClock update_clock(const Runtime& rt) { return cuda_runtime(rt).backend().update_clock(); }

}  // namespace dqn::cuda::lab
