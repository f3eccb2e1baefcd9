// A replay store on any runtime (CPU or CUDA) for the replay ops' tests: one arena holds the
// store, a staging block and a batch; rows go in and draws come out as host vectors.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "dqn/backend.hpp"
#include "core/replay_tree.h"
#include "core/runtime.hpp"

namespace dqn::test {

struct Draw {
  std::vector<std::int64_t> idx;
  std::vector<float> w, states2, rewards, dones, stats;
  std::vector<std::int32_t> actions;
};

class ReplayHarness {
 public:
  ReplayHarness(std::unique_ptr<Runtime> rt, std::int64_t capacity, int S, int D, bool prioritized, float alpha,
                float eps, int max_batch)
      : rt_(std::move(rt)), C_(capacity), S_(S), D_(D), Bmax_(max_batch) {
    const replay::Tree t = replay::tree_layout(capacity);
    const std::size_t C = std::size_t(capacity), s = std::size_t(S), d = std::size_t(D), B = std::size_t(max_batch);
    std::size_t at = 0;
    auto take = [&](std::size_t bytes) {
      const std::size_t off = at;
      at += (bytes + 255) / 256 * 256;
      return off;
    };
    const std::size_t o_states = take(C * s * 4), o_next = take(C * s * 4), o_act = take(C * d * 4),
                      o_rew = take(C * 4), o_done = take(C * 4), o_tree = take(std::size_t(t.nodes) * 8),
                      o_owner = take(C * 4), o_cur = take(kReplayCursor * 8), o_max = take(4),
                      o_sst = take(C * s * 4), o_snext = take(C * s * 4), o_sact = take(C * d * 4),
                      o_srew = take(C * 4), o_sdone = take(C * 4), o_b2 = take(2 * B * s * 4), o_bact = take(B * d * 4),
                      o_brew = take(B * 4), o_bdone = take(B * 4), o_bw = take(B * 4), o_bidx = take(B * 8),
                      o_stats = take(kReplayStats * 4), o_td = take(B * 4);
    base_ = static_cast<char*>(rt_->alloc_arena(at));
    EngineBackend& be = rt_->ops();
    std::vector<char> zero(at, 0);
    be.upload(base_, zero.data(), at);
    auto real = [&](std::size_t off) { return Real{base_ + off, 4}; };
    store_.states = real(o_states);
    store_.next_states = real(o_next);
    store_.actions = reinterpret_cast<std::int32_t*>(base_ + o_act);
    store_.rewards = real(o_rew);
    store_.dones = real(o_done);
    if (prioritized) {
      store_.tree = reinterpret_cast<std::int64_t*>(base_ + o_tree);
      store_.owner = reinterpret_cast<std::int32_t*>(base_ + o_owner);
    }
    store_.cursor = reinterpret_cast<std::int64_t*>(base_ + o_cur);
    store_.max_priority = reinterpret_cast<float*>(base_ + o_max);
    store_.capacity = capacity;
    store_.S = S;
    store_.D = D;
    store_.alpha = alpha;
    store_.priority_eps = eps;
    const float one = 1.0f;
    be.upload(store_.max_priority, &one, 4);
    in_.store = store_;
    in_.states = real(o_sst);
    in_.next_states = real(o_snext);
    in_.actions = reinterpret_cast<const std::int32_t*>(base_ + o_sact);
    in_.rewards = real(o_srew);
    in_.dones = real(o_sdone);
    sample_.store = store_;
    sample_.states2 = real(o_b2);
    sample_.actions = reinterpret_cast<std::int32_t*>(base_ + o_bact);
    sample_.rewards = real(o_brew);
    sample_.dones = real(o_bdone);
    sample_.is_weights = real(o_bw);
    sample_.indices = reinterpret_cast<std::int64_t*>(base_ + o_bidx);
    sample_.stats = real(o_stats);
    td_ = real(o_td);
  }

  Runtime& runtime() { return *rt_; }
  const ReplayStore& store() const { return store_; }

  /// n rows: row i has states {v_i, v_i + 0.5, …}, next states {v_i + 1, …}, action v_i mod 7 in
  /// every branch, reward v_i, done (v_i mod 2), for v_i = first + i.
  void insert_counting(std::int64_t first, std::int64_t n, std::int64_t env_step) {
    const auto rows = static_cast<std::size_t>(n);
    std::vector<float> st(rows * std::size_t(S_)), nx(st.size()), rw(rows), dn(rows);
    std::vector<std::int32_t> ac(rows * std::size_t(D_));
    for (std::int64_t i = 0; i < n; ++i) {
      const float v = float(first + i);
      for (int k = 0; k < S_; ++k) {
        st[std::size_t(i * S_ + k)] = v + 0.5f * float(k);
        nx[std::size_t(i * S_ + k)] = v + 1.0f + 0.5f * float(k);
      }
      for (int k = 0; k < D_; ++k) ac[std::size_t(i * D_ + k)] = std::int32_t((first + i) % 7);
      rw[std::size_t(i)] = v;
      dn[std::size_t(i)] = float((first + i) % 2);
    }
    insert(st, nx, ac, rw, dn, n, env_step);
  }

  void insert(const std::vector<float>& st, const std::vector<float>& nx, const std::vector<std::int32_t>& ac,
              const std::vector<float>& rw, const std::vector<float>& dn, std::int64_t n, std::int64_t env_step) {
    EngineBackend& be = rt_->ops();
    be.upload(in_.states.p, st.data(), std::size_t(n * S_) * 4);
    be.upload(in_.next_states.p, nx.data(), std::size_t(n * S_) * 4);
    be.upload(const_cast<std::int32_t*>(in_.actions), ac.data(), std::size_t(n * D_) * 4);
    be.upload(in_.rewards.p, rw.data(), std::size_t(n) * 4);
    be.upload(in_.dones.p, dn.data(), std::size_t(n) * 4);
    ReplayInsert a = in_;
    a.n = n;
    a.env_step = env_step;
    be.replay_insert(a);
    check("replay_insert");
  }

  Draw sample(int B, std::uint64_t seed, float beta_start = 0.4f, float beta_end = 1.0f, std::int64_t beta_steps = 1) {
    if (B > Bmax_) throw std::invalid_argument("harness: B above max_batch");
    EngineBackend& be = rt_->ops();
    ReplaySample a = sample_;
    a.B = B;
    a.seed = seed;
    a.beta_start = beta_start;
    a.beta_end = beta_end;
    a.beta_steps = beta_steps;
    be.replay_sample(a);
    check("replay_sample");
    Draw d;
    d.idx.resize(std::size_t(B));
    d.w.resize(std::size_t(B));
    d.states2.resize(std::size_t(2 * B * S_));
    d.rewards.resize(std::size_t(B));
    d.dones.resize(std::size_t(B));
    d.actions.resize(std::size_t(B * D_));
    d.stats.resize(kReplayStats);
    rt_->synchronize();
    be.download(d.idx.data(), a.indices, d.idx.size() * 8);
    be.download(d.w.data(), a.is_weights.p, d.w.size() * 4);
    be.download(d.states2.data(), a.states2.p, d.states2.size() * 4);
    be.download(d.rewards.data(), a.rewards.p, d.rewards.size() * 4);
    be.download(d.dones.data(), a.dones.p, d.dones.size() * 4);
    be.download(d.actions.data(), a.actions, d.actions.size() * 4);
    be.download(d.stats.data(), a.stats.p, d.stats.size() * 4);
    check("download");
    return d;
  }

  void priorities(const std::vector<std::int64_t>& idx, const std::vector<float>& td) {
    EngineBackend& be = rt_->ops();
    be.upload(sample_.indices, idx.data(), idx.size() * 8);
    be.upload(td_.p, td.data(), td.size() * 4);
    ReplayPriorities p;
    p.store = store_;
    p.indices = sample_.indices;
    p.td_error = td_;
    p.B = int(idx.size());
    be.replay_priorities(p);
    check("replay_priorities");
  }

  std::vector<replay::Node> nodes() {
    const replay::Tree t = replay::tree_layout(C_);
    std::vector<replay::Node> n(static_cast<std::size_t>(t.nodes));
    rt_->synchronize();
    if (store_.tree) rt_->ops().download(n.data(), store_.tree, n.size() * 8);
    return n;
  }
  std::vector<std::int64_t> cursor() {
    std::vector<std::int64_t> c(kReplayCursor);
    rt_->synchronize();
    rt_->ops().download(c.data(), store_.cursor, c.size() * 8);
    return c;
  }
  float max_priority() {
    float m = 0;
    rt_->synchronize();
    rt_->ops().download(&m, store_.max_priority, 4);
    return m;
  }

 private:
  void check(const char* what) {
    if (rt_->ops().status() != 0) throw std::runtime_error(std::string(what) + ": " + rt_->ops().message());
  }
  std::unique_ptr<Runtime> rt_;
  std::int64_t C_;
  int S_, D_, Bmax_;
  char* base_ = nullptr;
  ReplayStore store_;
  ReplayInsert in_;
  ReplaySample sample_;
  Real td_;
};

}  // namespace dqn::test
