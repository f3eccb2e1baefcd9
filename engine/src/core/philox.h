/** @file philox.h
 *  @brief Philox4x32-10 counter-based generator, shared verbatim by the CPU reference and the
 *  CUDA kernels so both backends draw identical numbers for the same (seed, step, stream, index).
 */
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define DQN_HD __host__ __device__ __forceinline__
#else
#define DQN_HD inline
#endif

namespace dqn::philox {

struct U4 {
  std::uint32_t x, y, z, w;
};

DQN_HD std::uint32_t mulhilo(std::uint32_t a, std::uint32_t b, std::uint32_t* hi) {
  const std::uint64_t p = static_cast<std::uint64_t>(a) * b;
  *hi = static_cast<std::uint32_t>(p >> 32);
  return static_cast<std::uint32_t>(p);
}

/// Ten rounds of Philox4x32 on counter c with key (k0, k1).
DQN_HD U4 philox4x32_10(U4 c, std::uint32_t k0, std::uint32_t k1) {
  constexpr std::uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u;
  constexpr std::uint32_t W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
  for (int r = 0; r < 10; ++r) {
    std::uint32_t hi0, hi1;
    const std::uint32_t lo0 = mulhilo(M0, c.x, &hi0);
    const std::uint32_t lo1 = mulhilo(M1, c.z, &hi1);
    c = U4{hi1 ^ c.y ^ k0, lo1, hi0 ^ c.w ^ k1, lo0};
    k0 += W0;
    k1 += W1;
  }
  return c;
}

/// Maps 32 random bits into the open interval (0, 1): (x >> 8 + 0.5) / 2^24.
DQN_HD float to_unit(std::uint32_t x) {
  return (static_cast<float>(x >> 8) + 0.5f) * (1.0f / 16777216.0f);
}

/// The i-th 32 random bits of draw `stream` in step `step` for `seed`. Four consecutive i share
/// one Philox block.
DQN_HD std::uint32_t bits(std::uint64_t seed, std::uint64_t step, std::uint32_t stream, std::uint64_t i) {
  const std::uint64_t block = i >> 2;
  const U4 c{static_cast<std::uint32_t>(block), static_cast<std::uint32_t>(block >> 32),
             static_cast<std::uint32_t>(step), (static_cast<std::uint32_t>(step >> 32) & 0xFFFFu) |
                                                   (stream << 16)};
  const U4 r = philox4x32_10(c, static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32));
  const std::uint32_t lane = static_cast<std::uint32_t>(i & 3u);
  return lane == 0 ? r.x : lane == 1 ? r.y : lane == 2 ? r.z : r.w;
}

/// The i-th uniform number in (0, 1) of draw `stream` in step `step` for `seed`.
DQN_HD float uniform(std::uint64_t seed, std::uint64_t step, std::uint32_t stream, std::uint64_t i) {
  return to_unit(bits(seed, step, stream, i));
}

}  // namespace dqn::philox
