// Built when the CUDA backend is not: the engine still links, and asking for cuda says why not.
#include <stdexcept>

#include "core/runtime.hpp"

namespace dqn {

std::unique_ptr<Runtime> make_cuda_runtime(const CudaSpec&, Precision, int) {
  throw std::runtime_error("this dqn was built without the CUDA backend (reconfigure with -Dcuda=enabled on a machine with nvcc)");
}

bool cuda_available() noexcept { return false; }
int cuda_device_count() noexcept { return 0; }

}  // namespace dqn
