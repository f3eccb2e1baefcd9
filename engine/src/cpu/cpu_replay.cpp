/** @file cpu_replay.cpp
 *  @brief The host replay's tree maintenance (the templated ops are in cpu_replay.hpp).
 */
#include "cpu/cpu_replay.hpp"

#include <algorithm>

namespace dqn::cpu_replay {

void update_ancestors(const ReplayStore& r, std::int64_t slot) {
  const replay::Tree t = replay::tree_layout(r.capacity);
  auto* nodes = reinterpret_cast<replay::Node*>(r.tree);
  std::int64_t node = slot;
  for (int l = 1; l < t.levels; ++l) {
    node >>= replay::kFanShift;
    const std::int64_t first = node * replay::kFan;
    const int count = int(std::min<std::int64_t>(replay::kFan, t.size[l - 1] - first));
    nodes[t.offset[l] + node] = replay::reduce_children(nodes + t.offset[l - 1] + first, count);
  }
}

replay::Node root(const ReplayStore& r) {
  const replay::Tree t = replay::tree_layout(r.capacity);
  return reinterpret_cast<const replay::Node*>(r.tree)[t.offset[t.levels - 1]];
}

}  // namespace dqn::cpu_replay
