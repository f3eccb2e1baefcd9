/** @file replay_tree.h
 *  @brief The prioritised replay's tree of fan-out 32 and the arithmetic both backends share, so
 *  that the CPU reference and the CUDA kernels draw the same slots for the same seed: one warp
 *  reads a node's 32 children, a butterfly sums them, an inclusive scan picks the child.
 */
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/engine_ops.hpp"
#include "core/philox.h"

namespace dqn::replay {

inline constexpr int kFan = 32;        ///< children per node (a warp)
inline constexpr int kFanShift = 5;
inline constexpr int kMaxLevels = 8;   ///< 32^7 leaves: more than any capacity allowed
inline constexpr std::int64_t kMaxCapacity = std::int64_t(1) << 31;
inline constexpr std::uint32_t kSampleStream = 0x2A5u;  ///< philox stream of the replay's draws

/// Nodes level by level, leaves (level 0, one per slot) first; level l+1 has ceil(n_l / 32)
/// nodes, node i's children being nodes 32i..32i+31 of the level below (those past its end count
/// as 0); the last level is the root alone.
struct Tree {
  int levels = 0;
  std::int64_t size[kMaxLevels] = {};
  std::int64_t offset[kMaxLevels] = {};
  std::int64_t nodes = 0;
};

DQN_HD Tree tree_layout(std::int64_t capacity) {
  Tree t;
  std::int64_t n = capacity < 1 ? 1 : capacity, off = 0;
  for (;;) {
    t.size[t.levels] = n;
    t.offset[t.levels] = off;
    off += n;
    ++t.levels;
    if (n == 1 || t.levels == kMaxLevels) break;
    n = (n + kFan - 1) / kFan;
  }
  t.nodes = off;
  return t;
}

/// A node: the sum of the leaves below and the smallest positive one (+inf where none).
struct Node {
  float sum, min;
};
static_assert(sizeof(Node) == 8, "a node is one 8-byte word of ReplayStore::tree");

DQN_HD float inf() { return INFINITY; }
DQN_HD Node leaf(float v) { return Node{v, v > 0.0f ? v : inf()}; }

/// The leaf of priority p: p^α, in double and rounded once, so both backends store the same float.
DQN_HD float leaf_value(double p, double alpha) { return static_cast<float>(pow(p, alpha)); }
/// β at an env step: beta_start → beta_end linearly over beta_steps, then beta_end.
DQN_HD double beta_at(double beta_start, double beta_end, std::int64_t beta_steps, std::int64_t env_step) {
  const double f = beta_steps > 0 ? static_cast<double>(env_step) / static_cast<double>(beta_steps) : 1.0;
  return beta_start + (beta_end - beta_start) * (f < 0.0 ? 0.0 : f > 1.0 ? 1.0 : f);
}
/// The importance weight (size·P_i)^−β / max_j (size·P_j)^−β = (p_min / p_i)^β of leaves p.
DQN_HD float is_weight(float leaf_i, float leaf_min, double beta) {
  return static_cast<float>(pow(static_cast<double>(leaf_min) / static_cast<double>(leaf_i), beta));
}
/// A uniform slot in [0, size) from 32 random bits (multiply-shift).
DQN_HD std::int64_t uniform_slot(std::uint32_t bits, std::int64_t size) {
  return static_cast<std::int64_t>((static_cast<std::uint64_t>(bits) * static_cast<std::uint64_t>(size)) >> 32);
}
/// Row b's prefix sum in a stratified draw: (b + u)·(total / B), rounded as the kernels round.
DQN_HD float stratum_point(int b, float u, float total, int B) {
  const float seg = total / static_cast<float>(B);
  return (static_cast<float>(b) + u) * seg;
}

/// Null when a store's fields are usable, else why not (both backends check this; neither reads
/// the cursor to do it).
inline const char* store_error(const ReplayStore& r) {
  if (r.capacity < 1 || r.capacity > kMaxCapacity) return "capacity must be in 1..2^31";
  if (r.S < 1 || r.D < 1) return "S and D must be at least 1";
  if (!r.states || !r.next_states || !r.actions || !r.rewards || !r.dones || !r.cursor || !r.max_priority)
    return "null replay pointer";
  if (r.tree && !r.owner) return "a prioritised replay needs its owner scratch";
  return nullptr;
}

// ---- the host reference of the warp's work (the kernels do the same additions in the same order)

/// Sum and min of 32 children the way a warp's xor-butterfly adds them (lane j adds lane j^16's
/// value, then j^8's, …): children past `count` are 0.
inline Node reduce_children(const Node* c, int count) {
  float s[kFan], m[kFan], t[kFan], u[kFan];
  for (int j = 0; j < kFan; ++j) {
    s[j] = j < count ? c[j].sum : 0.0f;
    m[j] = j < count ? c[j].min : inf();
  }
  for (int off = kFan / 2; off > 0; off >>= 1) {
    for (int j = 0; j < kFan; ++j) {
      t[j] = s[j] + s[j ^ off];
      u[j] = m[j] < m[j ^ off] ? m[j] : m[j ^ off];
    }
    std::memcpy(s, t, sizeof s);
    std::memcpy(m, u, sizeof m);
  }
  return Node{s[0], m[0]};
}

/// The child a prefix `point` falls in, as the warp picks it: inclusive scan (lane j adds lane
/// j−d's value for d = 1, 2, 4, …), the first child whose scan exceeds the point, or the last
/// child with mass where rounding put the point past them all. *rest: the point within it.
inline int pick_child(const Node* c, int count, float point, float* rest) {
  float s[kFan];
  for (int j = 0; j < kFan; ++j) s[j] = j < count ? c[j].sum : 0.0f;
  for (int d = 1; d < kFan; d <<= 1)
    for (int j = kFan - 1; j >= d; --j) s[j] = s[j] + s[j - d];
  int k = 0;
  while (k < kFan && s[k] <= point) ++k;
  if (k == kFan) {
    k = 0;
    for (int j = 0; j < count; ++j)
      if (c[j].sum > 0.0f) k = j;
  }
  const float r = point - (k > 0 ? s[k - 1] : 0.0f);
  *rest = r > 0.0f ? r : 0.0f;
  return k;
}

}  // namespace dqn::replay
