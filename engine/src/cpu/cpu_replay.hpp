/** @file cpu_replay.hpp
 *  @brief The replay ops on the host: the reference the CUDA kernels follow draw for draw
 *  (dqn/replay_tree.h holds the arithmetic both share). T is the backend's real (float or double).
 */
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "dqn/backend.hpp"
#include "core/replay_tree.h"

namespace dqn::cpu_replay {


/// Recomputes the ancestors of leaf `slot`, bottom up.
void update_ancestors(const ReplayStore& r, std::int64_t slot);
/// The tree's root (prioritised stores only).
replay::Node root(const ReplayStore& r);

/// Null on success, else why the op refused (nothing changed then).
template <class T>
const char* insert(const ReplayInsert& a) {
  const ReplayStore& r = a.store;
  if (const char* why = replay::store_error(r)) return why;
  if (a.n < 1 || a.n > r.capacity) return "n must be in 1..capacity";
  if (!a.states || !a.next_states || !a.actions || !a.rewards || !a.dones) return "null staging pointer";
  std::int64_t* cur = r.cursor;
  const std::int64_t next = cur[kCurNext];
  const float top = r.tree ? replay::leaf_value(*r.max_priority, r.alpha) : 0.0f;
  auto* nodes = reinterpret_cast<replay::Node*>(r.tree);
  const std::size_t S = std::size_t(r.S), D = std::size_t(r.D);
  for (std::int64_t i = 0; i < a.n; ++i) {
    const std::int64_t slot = (next + i) % r.capacity;
    const std::size_t s = std::size_t(slot), k = std::size_t(i);
    std::memcpy(r.states.as<T>() + s * S, a.states.as<const T>() + k * S, S * sizeof(T));
    std::memcpy(r.next_states.as<T>() + s * S, a.next_states.as<const T>() + k * S, S * sizeof(T));
    std::memcpy(r.actions + s * D, a.actions + k * D, D * sizeof(std::int32_t));
    r.rewards.as<T>()[s] = a.rewards.as<const T>()[k];
    r.dones.as<T>()[s] = a.dones.as<const T>()[k];
    if (nodes) nodes[s] = replay::leaf(top);
  }
  if (nodes)
    for (std::int64_t i = 0; i < a.n; ++i) update_ancestors(r, (next + i) % r.capacity);
  cur[kCurNext] = (next + a.n) % r.capacity;
  cur[kCurSize] = std::min(cur[kCurSize] + a.n, r.capacity);
  cur[kCurEnvStep] = a.env_step;
  cur[kCurInserted] += a.n;
  return nullptr;
}

template <class T>
const char* sample(const ReplaySample& a) {
  const ReplayStore& r = a.store;
  if (const char* why = replay::store_error(r)) return why;
  if (a.B < 1) return "B must be at least 1";
  if (!a.states2 || !a.actions || !a.rewards || !a.dones || !a.is_weights || !a.indices) return "null batch pointer";
  std::int64_t* cur = r.cursor;
  const std::int64_t size = cur[kCurSize], draw = cur[kCurDraws];
  if (size < 1) return "the replay is empty";
  const double beta = replay::beta_at(a.beta_start, a.beta_end, a.beta_steps, cur[kCurEnvStep]);
  const replay::Tree t = replay::tree_layout(r.capacity);
  const auto* nodes = reinterpret_cast<const replay::Node*>(r.tree);
  const replay::Node top = nodes ? nodes[t.offset[t.levels - 1]] : replay::Node{float(size), 1.0f};
  const std::size_t S = std::size_t(r.S), D = std::size_t(r.D), B = std::size_t(a.B);
  for (int b = 0; b < a.B; ++b) {
    std::int64_t slot;
    float w = 1.0f;
    if (!nodes) {
      slot = replay::uniform_slot(philox::bits(a.seed, std::uint64_t(draw), replay::kSampleStream, std::uint64_t(b)), size);
    } else {
      float point = replay::stratum_point(b, philox::uniform(a.seed, std::uint64_t(draw), replay::kSampleStream,
                                                             std::uint64_t(b)), top.sum, a.B);
      std::int64_t node = 0;
      for (int l = t.levels - 1; l > 0; --l) {
        const std::int64_t first = node * replay::kFan;
        const int count = int(std::min<std::int64_t>(replay::kFan, t.size[l - 1] - first));
        float rest = 0.0f;
        node = first + replay::pick_child(nodes + t.offset[l - 1] + first, count, point, &rest);
        point = rest;
      }
      slot = node;
      w = replay::is_weight(nodes[slot].sum, top.min, beta);
    }
    const std::size_t s = std::size_t(slot), k = std::size_t(b);
    a.indices[b] = slot;
    std::memcpy(a.states2.as<T>() + k * S, r.states.as<const T>() + s * S, S * sizeof(T));
    std::memcpy(a.states2.as<T>() + (B + k) * S, r.next_states.as<const T>() + s * S, S * sizeof(T));
    std::memcpy(a.actions + k * D, r.actions + s * D, D * sizeof(std::int32_t));
    a.rewards.as<T>()[k] = r.rewards.as<const T>()[s];
    a.dones.as<T>()[k] = r.dones.as<const T>()[s];
    a.is_weights.as<T>()[k] = static_cast<T>(w);
  }
  if (a.stats) {
    T* st = a.stats.as<T>();
    st[0] = static_cast<T>(size);
    st[1] = static_cast<T>(nodes ? beta : 0.0);
    st[2] = static_cast<T>(nodes ? *r.max_priority : 1.0f);
    st[3] = static_cast<T>(top.sum);
  }
  cur[kCurDraws] = draw + 1;
  return nullptr;
}

template <class T>
const char* priorities(const ReplayPriorities& a) {
  const ReplayStore& r = a.store;
  if (const char* why = replay::store_error(r)) return why;
  if (!r.tree) return "the replay is not prioritised";
  if (a.B < 1 || !a.indices || !a.td_error) return "B must be at least 1, with indices and td_error";
  const std::int64_t size = r.cursor[kCurSize];
  for (int b = 0; b < a.B; ++b)
    if (a.indices[b] < 0 || a.indices[b] >= size) return "an index is outside the replay";
  auto* nodes = reinterpret_cast<replay::Node*>(r.tree);
  float top = *r.max_priority;
  for (int b = 0; b < a.B; ++b) {  // in order: of a slot drawn twice, the last finite row counts
    const double td = static_cast<double>(a.td_error.as<const T>()[b]);
    if (!std::isfinite(td)) continue;
    const float p = static_cast<float>(std::fabs(td) + static_cast<double>(r.priority_eps));
    nodes[a.indices[b]] = replay::leaf(replay::leaf_value(p, r.alpha));
    top = std::max(top, p);
  }
  for (int b = 0; b < a.B; ++b) update_ancestors(r, a.indices[b]);
  *r.max_priority = top;
  return nullptr;
}

}  // namespace dqn::cpu_replay
