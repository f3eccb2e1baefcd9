/** @file nccl_group.cpp
 *  @brief The CUDA ranks' collectives: one NCCL communicator per device in this process. The
 *  engine's reductions are enqueued on the capturing stage's stream, so they are nodes of the
 *  step's graph and a replay runs them with no host involvement.
 */
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>

#include "core/rank_group.hpp"

namespace dqn {
namespace {

void nccl_check(ncclResult_t r, const char* what, int rank) {
  if (r == ncclSuccess || r == ncclInProgress) return;
  throw std::runtime_error(std::string("NCCL: ") + what + " (rank " + std::to_string(rank) + "): " +
                           ncclGetErrorString(r) + (r == ncclSystemError || r == ncclRemoteError ? "; " : "") +
                           (r == ncclSystemError || r == ncclRemoteError ? ncclGetLastError(nullptr) : ""));
}

class NcclGroup final : public RankGroup {
 public:
  explicit NcclGroup(std::vector<int> devices) : RankGroup(std::move(devices)), comms_(std::size_t(ranks())) {
    // NVLink multicast (NVLS) stays off unless asked for: the engine's reductions are small, and
    // multicast memory held by a crashed process can keep the host's GPUs out of service.
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    nccl_check(ncclCommInitAll(comms_.data(), ranks(), this->devices().data()), "ncclCommInitAll", 0);
  }
  ~NcclGroup() override {
    std::lock_guard lock(m_);
    if (!aborted_)
      for (auto c : comms_)
        if (c) ncclCommDestroy(c);
  }

  void all_reduce_mean(int rank, const std::vector<Range>& ranges, std::size_t element_bytes, void* stream) override {
    const ncclDataType_t type = element_bytes == 8 ? ncclFloat64 : ncclFloat32;
    auto s = static_cast<cudaStream_t>(stream);
    nccl_check(ncclGroupStart(), "ncclGroupStart", rank);
    for (const auto& r : ranges)
      nccl_check(ncclAllReduce(r.data, r.data, std::size_t(r.count), type, ncclAvg, comms_[std::size_t(rank)], s),
                 "ncclAllReduce", rank);
    nccl_check(ncclGroupEnd(), "ncclGroupEnd", rank);
  }

  void broadcast(int rank, void* data, std::size_t bytes, void* stream) override {
    auto s = static_cast<cudaStream_t>(stream);
    nccl_check(ncclBroadcast(data, data, bytes, ncclUint8, 0, comms_[std::size_t(rank)], s), "ncclBroadcast", rank);
    if (cudaStreamSynchronize(s) != cudaSuccess) {
      const std::string e = cudaGetErrorString(cudaGetLastError());
      throw std::runtime_error("broadcast (rank " + std::to_string(rank) + "): " + e);
    }
  }

  // Aborting a communicator ends its pending operations, so ranks waiting for a failed one's part
  // of a reduction get an error instead of waiting forever.
  void abort_collectives(int, const std::string&) noexcept override {
    std::lock_guard lock(m_);
    if (aborted_) return;
    aborted_ = true;
    for (auto c : comms_)
      if (c) ncclCommAbort(c);
  }

  std::string describe() const override {
    int v = 0;
    ncclGetVersion(&v);
    return "NCCL " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
  }

 private:
  std::vector<ncclComm_t> comms_;
  std::mutex m_;
  bool aborted_ = false;
};

}  // namespace

std::shared_ptr<RankGroup> make_nccl_group(std::vector<int> devices) {
  if (devices.empty()) throw std::invalid_argument("a rank group needs at least one rank");
  return std::make_shared<NcclGroup>(std::move(devices));
}

}  // namespace dqn
