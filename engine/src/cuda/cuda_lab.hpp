/** @file cuda_lab.hpp
 *  @brief What the tests and the measurement tools (tools/lab/) read of the CUDA backend beyond
 *  the engine's runtime interface: how its fused update runs, and that update's phase stamps.
 *  The engine never calls any of it.
 */
#pragma once

#include <cstdint>
#include <vector>

#include "cuda_kernels.cuh"

namespace dqn {
class Runtime;
}

namespace dqn::cuda::lab {

/// How a CUDA runtime's update runs: the cluster update's blocks per cluster (0: its separate
/// kernels) and what its last launch did (the areas of shared memory it used, its wide launch).
struct UpdateInfo {
  int cluster_size = 0;
  UpdateChoices last;
};
/// Throws std::invalid_argument when rt is not a CUDA runtime.
UpdateInfo update_info(const Runtime& rt);
/// Whether device 0 launches thread-block clusters (what the cluster update needs); false without
/// a device. Safe to call before main (a test's skip decorator).
bool cluster_launch_available() noexcept;

/// From now on, the CUDA runtimes this process makes have their cluster update's blocks stamp
/// their phases into device memory (for dqn-trace --update-clock; every replay then writes them).
/// Only a lab build (meson -Dlab=true) has the stamps: elsewhere nothing changes and it returns
/// false.
bool record_update_clock(bool on) noexcept;
bool update_clock_wanted() noexcept;

/// Where a cluster update's time goes: per block of its last run, `slots` %globaltimer stamps
/// (ns) then as many clock64 stamps (cycles of its SM), in UpdateClockSlot order (placed, waited,
/// clips, Adam, Wᵀu, gather, v, W v, σ, scaled, exit; the blocks outside the normed matrices stamp
/// none from Wᵀu to scaled, and a stamp not reached in the last run holds an older run's, or 0).
/// group[b]: the normed matrix (its index in the update's table) block b updates, -1 for the
/// blocks of the other parameters (a split update's side launch stamps after the main launch's
/// blocks). Empty where nothing was recorded.
struct UpdateClock {
  int slots = 0, cluster_size = 0, normed = 0, clock_khz = 0;
  std::vector<std::uint64_t> stamps;
  std::vector<int> group;
};
/// The stamps of rt's last cluster update; read after a synchronize. Throws std::invalid_argument
/// when rt is not a CUDA runtime.
UpdateClock update_clock(const Runtime& rt);

}  // namespace dqn::cuda::lab
