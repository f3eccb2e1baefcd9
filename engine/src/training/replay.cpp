/** @file replay.cpp
 *  @brief Sum tree, n-step transition assembly and uniform/prioritized sampling.
 */
#include "training/replay.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

namespace dqn {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

}  // namespace

// ---------------------------------------------------------------- SumTree

SumTree::SumTree(std::int64_t capacity) : capacity_(capacity) {
  if (capacity < 1)
    throw std::invalid_argument("SumTree: capacity must be at least 1, got " +
                                std::to_string(capacity));
  leaves_ = 1;
  while (leaves_ < capacity) leaves_ *= 2;
  sum_.assign(static_cast<std::size_t>(2 * leaves_), 0.0);
  min_.assign(static_cast<std::size_t>(2 * leaves_), kInf);
}

void SumTree::set(std::int64_t i, double p) {
  if (i < 0 || i >= capacity_)
    throw std::out_of_range("SumTree::set: index " + std::to_string(i) + " outside [0, " +
                            std::to_string(capacity_) + ")");
  if (!(p >= 0.0) || !std::isfinite(p))
    throw std::invalid_argument("SumTree::set: priority must be finite and >= 0, got " + num(p));
  auto node = static_cast<std::size_t>(leaves_ + i);
  sum_[node] = p;
  min_[node] = p > 0.0 ? p : kInf;
  for (node /= 2; node >= 1; node /= 2) {
    // Parents are recomputed from their children, so sums never drift over many updates.
    sum_[node] = sum_[2 * node] + sum_[2 * node + 1];
    min_[node] = std::min(min_[2 * node], min_[2 * node + 1]);
  }
}

double SumTree::p(std::int64_t i) const {
  if (i < 0 || i >= capacity_)
    throw std::out_of_range("SumTree::p: index " + std::to_string(i) + " outside [0, " +
                            std::to_string(capacity_) + ")");
  return sum_[static_cast<std::size_t>(leaves_ + i)];
}

std::int64_t SumTree::find(double prefix) const {
  if (!(total() > 0.0)) throw std::logic_error("SumTree::find: every priority is 0");
  if (std::isnan(prefix)) throw std::invalid_argument("SumTree::find: prefix is NaN");
  prefix = std::max(prefix, 0.0);
  std::size_t node = 1;
  const auto first_leaf = static_cast<std::size_t>(leaves_);
  while (node < first_leaf) {
    const std::size_t left = 2 * node;
    // Go right only when the prefix is past the left sum and there is mass on the right; a
    // prefix at or over the total (rounding) thus ends on the last positive leaf.
    if (prefix >= sum_[left] && sum_[left + 1] > 0.0) {
      prefix -= sum_[left];
      node = left + 1;
    } else {
      node = left;
    }
  }
  return static_cast<std::int64_t>(node - first_leaf);
}

// ---------------------------------------------------------------- ReplayBuffer

ReplayBuffer::ReplayBuffer(std::int64_t capacity, int obs_dim, int branches, int n_step,
                           double gamma, int num_envs, bool prioritized, double alpha,
                           double priority_eps)
    : capacity_(capacity),
      obs_dim_(obs_dim),
      branches_(branches),
      n_step_(n_step),
      gamma_(gamma),
      num_envs_(num_envs),
      prioritized_(prioritized),
      alpha_(alpha),
      priority_eps_(priority_eps),
      tree_(prioritized && capacity >= 1 ? capacity : 1) {
  auto need = [](bool ok, const std::string& msg) {
    if (!ok) throw std::invalid_argument("replay buffer: " + msg);
  };
  need(capacity >= 1, "capacity must be at least 1, got " + std::to_string(capacity));
  need(obs_dim >= 1, "obs_dim must be at least 1, got " + std::to_string(obs_dim));
  need(branches >= 1, "branches must be at least 1, got " + std::to_string(branches));
  need(n_step >= 1, "n_step must be at least 1, got " + std::to_string(n_step));
  need(gamma >= 0.0 && gamma <= 1.0, "gamma must be in [0, 1], got " + num(gamma));
  need(num_envs >= 1, "num_envs must be at least 1, got " + std::to_string(num_envs));
  if (prioritized) {
    need(alpha >= 0.0 && std::isfinite(alpha), "alpha must be >= 0, got " + num(alpha));
    need(priority_eps > 0.0 && std::isfinite(priority_eps),
         "priority_eps must be > 0 (a zero priority is never sampled again), got " +
             num(priority_eps));
  }
  const auto cap = static_cast<std::size_t>(capacity);
  const auto S = static_cast<std::size_t>(obs_dim), D = static_cast<std::size_t>(branches);
  const auto N = static_cast<std::size_t>(num_envs), n = static_cast<std::size_t>(n_step);
  states_.assign(cap * S, 0.0f);
  next_states_.assign(cap * S, 0.0f);
  actions_.assign(cap * D, 0);
  rewards_.assign(cap, 0.0f);
  dones_.assign(cap, 0.0f);
  priorities_.assign(cap, 0.0);
  pend_obs_.assign(N * n * S, 0.0f);
  pend_act_.assign(N * n * D, 0);
  pend_rew_.assign(N * n, 0.0f);
  pend_head_.assign(N, 0);
  pend_count_.assign(N, 0);
}

void ReplayBuffer::store(const float* state, const std::int32_t* action, float reward,
                         const float* next_state, bool done) {
  const auto slot = static_cast<std::size_t>(next_);
  const auto S = static_cast<std::size_t>(obs_dim_), D = static_cast<std::size_t>(branches_);
  std::memcpy(&states_[slot * S], state, S * sizeof(float));
  std::memcpy(&next_states_[slot * S], next_state, S * sizeof(float));
  std::memcpy(&actions_[slot * D], action, D * sizeof(std::int32_t));
  rewards_[slot] = reward;
  dones_[slot] = done ? 1.0f : 0.0f;
  priorities_[slot] = max_priority_;
  if (prioritized_) tree_.set(next_, std::pow(max_priority_, alpha_));
  next_ = (next_ + 1) % capacity_;
  size_ = std::min(size_ + 1, capacity_);
}

void ReplayBuffer::emit(int e, int k, int count, const float* next_state, bool done) {
  const auto n = static_cast<std::size_t>(n_step_);
  const auto S = static_cast<std::size_t>(obs_dim_), D = static_cast<std::size_t>(branches_);
  const auto base = static_cast<std::size_t>(e) * n;
  const auto head = static_cast<std::size_t>(pend_head_[static_cast<std::size_t>(e)]);
  double ret = 0.0, discount = 1.0;
  for (int j = k; j < count; ++j) {
    ret += discount * pend_rew_[base + (head + static_cast<std::size_t>(j)) % n];
    discount *= gamma_;
  }
  const std::size_t pos = base + (head + static_cast<std::size_t>(k)) % n;
  store(&pend_obs_[pos * S], &pend_act_[pos * D], static_cast<float>(ret), next_state, done);
}

void ReplayBuffer::add(const float* obs, const std::int32_t* actions, const float* rewards,
                       const float* next_obs_or_final, const std::uint8_t* terminated,
                       const std::uint8_t* truncated) {
  const auto n = static_cast<std::size_t>(n_step_);
  const auto S = static_cast<std::size_t>(obs_dim_), D = static_cast<std::size_t>(branches_);
  for (int e = 0; e < num_envs_; ++e) {
    const auto ue = static_cast<std::size_t>(e);
    int& head = pend_head_[ue];
    int& count = pend_count_[ue];
    const std::size_t pos = ue * n + (static_cast<std::size_t>(head + count)) % n;
    std::memcpy(&pend_obs_[pos * S], obs + ue * S, S * sizeof(float));
    std::memcpy(&pend_act_[pos * D], actions + ue * D, D * sizeof(std::int32_t));
    pend_rew_[pos] = rewards[ue];
    ++count;
    const float* next = next_obs_or_final + ue * S;
    if (terminated[ue] || truncated[ue]) {
      // Termination wins when both are set: the episode really ended, nothing to bootstrap.
      const bool done = terminated[ue] != 0;
      for (int k = 0; k < count; ++k) emit(e, k, count, next, done);
      head = 0;
      count = 0;
    } else if (count == n_step_) {
      emit(e, 0, count, next, false);
      head = (head + 1) % n_step_;
      --count;
    }
  }
}

void ReplayBuffer::sample(int B, double beta, std::mt19937_64& rng, Batch& out) const {
  if (size_ == 0) throw std::logic_error("replay buffer: sample() from an empty buffer");
  if (B < 1) throw std::invalid_argument("replay buffer: batch must be at least 1, got " +
                                         std::to_string(B));
  if (!(beta >= 0.0) || !std::isfinite(beta))
    throw std::invalid_argument("replay buffer: beta must be >= 0, got " + num(beta));
  const auto b_count = static_cast<std::size_t>(B);
  const auto S = static_cast<std::size_t>(obs_dim_), D = static_cast<std::size_t>(branches_);
  out.states.resize(b_count * S);
  out.next_states.resize(b_count * S);
  out.actions.resize(b_count * D);
  out.rewards.resize(b_count);
  out.dones.resize(b_count);
  out.is_weights.resize(b_count);
  out.indices.resize(b_count);

  if (prioritized_) {
    std::uniform_real_distribution<double> u01(0.0, 1.0);
    const double total = tree_.total();
    const double segment = total / static_cast<double>(B);
    const double n = static_cast<double>(size_);
    const double max_w = std::pow(n * tree_.min_positive() / total, -beta);
    for (std::size_t b = 0; b < b_count; ++b) {
      const std::int64_t idx = tree_.find((static_cast<double>(b) + u01(rng)) * segment);
      const double prob = tree_.p(idx) / total;
      out.indices[b] = idx;
      out.is_weights[b] = static_cast<float>(std::pow(n * prob, -beta) / max_w);
    }
  } else {
    std::uniform_int_distribution<std::int64_t> pick(0, size_ - 1);
    for (std::size_t b = 0; b < b_count; ++b) {
      out.indices[b] = pick(rng);
      out.is_weights[b] = 1.0f;
    }
  }

  for (std::size_t b = 0; b < b_count; ++b) {
    const auto slot = static_cast<std::size_t>(out.indices[b]);
    std::memcpy(&out.states[b * S], &states_[slot * S], S * sizeof(float));
    std::memcpy(&out.next_states[b * S], &next_states_[slot * S], S * sizeof(float));
    std::memcpy(&out.actions[b * D], &actions_[slot * D], D * sizeof(std::int32_t));
    out.rewards[b] = rewards_[slot];
    out.dones[b] = dones_[slot];
  }
}

void ReplayBuffer::update_priorities(const std::int64_t* indices, const float* td_errors, int B) {
  if (!prioritized_) return;
  // Check everything first so a bad entry leaves the tree as it was.
  for (int b = 0; b < B; ++b) {
    check_slot(indices[b], "update_priorities");
    if (!std::isfinite(td_errors[b]))
      throw std::invalid_argument("replay buffer: update_priorities: td error " +
                                  num(td_errors[b]) + " at batch row " + std::to_string(b) +
                                  " (slot " + std::to_string(indices[b]) + ") is not finite");
  }
  for (int b = 0; b < B; ++b) {
    const double p = std::fabs(static_cast<double>(td_errors[b])) + priority_eps_;
    const auto slot = indices[b];
    priorities_[static_cast<std::size_t>(slot)] = p;
    tree_.set(slot, std::pow(p, alpha_));
    max_priority_ = std::max(max_priority_, p);
  }
}

void ReplayBuffer::check_slot(std::int64_t i, const char* what) const {
  if (i < 0 || i >= size_)
    throw std::out_of_range(std::string("replay buffer: ") + what + ": slot " +
                            std::to_string(i) + " outside [0, " + std::to_string(size_) + ")");
}

const float* ReplayBuffer::state_at(std::int64_t i) const {
  check_slot(i, "state_at");
  return &states_[static_cast<std::size_t>(i) * static_cast<std::size_t>(obs_dim_)];
}
const float* ReplayBuffer::next_state_at(std::int64_t i) const {
  check_slot(i, "next_state_at");
  return &next_states_[static_cast<std::size_t>(i) * static_cast<std::size_t>(obs_dim_)];
}
const std::int32_t* ReplayBuffer::action_at(std::int64_t i) const {
  check_slot(i, "action_at");
  return &actions_[static_cast<std::size_t>(i) * static_cast<std::size_t>(branches_)];
}
float ReplayBuffer::reward_at(std::int64_t i) const {
  check_slot(i, "reward_at");
  return rewards_[static_cast<std::size_t>(i)];
}
float ReplayBuffer::done_at(std::int64_t i) const {
  check_slot(i, "done_at");
  return dones_[static_cast<std::size_t>(i)];
}
double ReplayBuffer::priority_at(std::int64_t i) const {
  check_slot(i, "priority_at");
  return prioritized_ ? priorities_[static_cast<std::size_t>(i)] : 1.0;
}

}  // namespace dqn
