/** @file seeds.hpp
 *  @brief The independent random streams a run derives from its pipeline's seed: the acting
 *  ε-greedy draws, the training evaluations' episodes, and the evaluations run on their own
 *  (`dqn eval`, Agent::evaluate), each reproducible from the seed alone.
 */
#pragma once

#include <cstdint>

namespace dqn {

/// The streams: acting during training, the training evaluations' environment seeds, the default
/// seed of an evaluation run on its own, the ε draws of an ε-greedy evaluation.
inline constexpr std::uint64_t kActStream = 1, kEvalStream = 3, kEvalAloneStream = 4, kEvalEpsilonStream = 5;

inline std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// Element `index` of stream `stream` of `seed`.
inline std::uint64_t derive_seed(std::uint64_t seed, std::uint64_t stream, std::uint64_t index = 0) {
  return splitmix64(splitmix64(seed ^ (stream * 0xD1B54A32D192ED03ull)) + index);
}

}  // namespace dqn
