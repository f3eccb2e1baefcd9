/** @file kernel_common.cuh
 *  @brief What the kernel files share (private to kernels/): the block size, grid sizing, the
 *  index type of a grid-stride loop.
 */
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "device_util.cuh"

namespace dqn::cuda {
namespace {

constexpr int kThreads = 256;

inline unsigned blocks_for(std::int64_t n, int threads = kThreads) { return ::dqn::dev::blocks_for(n, threads); }
using ::dqn::dev::with_index_type;

using dev::aligned16;
using dev::block_sum;
using dev::grid_start;
using dev::grid_step;
using dev::launch;
using dev::warp_max;
using dev::warp_sum;

inline std::size_t round_up(std::size_t x, std::size_t a) { return (x + a - 1) / a * a; }

}  // namespace

}  // namespace dqn::cuda
