// Built when NCCL is not: one CUDA rank needs no collectives; more say how to get them.
#include <stdexcept>

#include "core/rank_group.hpp"

namespace dqn {

std::shared_ptr<RankGroup> make_nccl_group(std::vector<int> devices) {
  if (devices.size() == 1) return make_host_group(std::move(devices));
  throw std::runtime_error("devices: " + std::to_string(devices.size()) +
                           " GPUs need NCCL, and this dqn was built without it (reconfigure with -Dnccl=enabled "
                           "and, where nccl.h is not found, -Dnccl_root=DIR: a folder with include/nccl.h and "
                           "lib/libnccl.so*, such as a PyTorch install's site-packages/nvidia/nccl)");
}

}  // namespace dqn
