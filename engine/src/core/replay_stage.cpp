// The replay the step draws from (EngineOptions::replay): its buffers in the registry, the
// step's first stage (draw the batch, gather it, importance weights) and, prioritised, its last
// (new priorities from td_error), and the asynchronous path transitions come in by.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

#include "core/engine.hpp"
#include "core/replay_tree.h"

namespace dqn {

namespace {
constexpr const char* kStates = "replay/states";
constexpr const char* kNextStates = "replay/next_states";
constexpr const char* kActions = "replay/actions";
constexpr const char* kRewards = "replay/rewards";
constexpr const char* kDones = "replay/dones";
constexpr const char* kTree = "replay/tree";
constexpr const char* kOwner = "replay/owner";
constexpr const char* kCursor = "replay/cursor";
constexpr const char* kMaxPriority = "replay/max_priority";
constexpr const char* kIndices = "replay/indices";
constexpr const char* kStaging = "replay/staging";
constexpr const char* kStats = kReplayStatsBuffer;
constexpr std::int64_t kDefaultStagingRows = 4096;

std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}
}  // namespace

void Engine::declare_replay_buffers() {
  if (!opt_.replay) return;
  const EngineReplay& o = *opt_.replay;
  const ReplaySpec& r = o.spec;
  const std::string where = "replay: ";
  if (r.capacity < spec_.batch || r.capacity > replay::kMaxCapacity)
    throw std::invalid_argument(where + "capacity " + std::to_string(r.capacity) + " must be in " +
                                std::to_string(spec_.batch) + " (the batch) .. 2^31");
  if (r.prioritized) {
    if (!(r.alpha >= 0.0) || !std::isfinite(r.alpha))
      throw std::invalid_argument(where + "alpha must be >= 0, got " + num(r.alpha));
    if (!(r.priority_eps > 0.0) || !std::isfinite(r.priority_eps))
      throw std::invalid_argument(where + "priority_eps must be > 0 (a zero priority is never drawn again), got " +
                                  num(r.priority_eps));
    if (!(r.beta_start >= 0.0 && r.beta_end >= 0.0) || !std::isfinite(r.beta_start) || !std::isfinite(r.beta_end))
      throw std::invalid_argument(where + "beta_start and beta_end must be >= 0");
  }
  replay_.on = true;
  replay_.opt = o;
  replay_.prioritized = r.prioritized;
  replay_.rows = std::min<std::int64_t>(o.staging_rows > 0 ? o.staging_rows : kDefaultStagingRows, r.capacity);
  const std::int64_t C = r.capacity, S = net_.state, D = net_.branches, K = replay_.rows;
  const auto keep = BufferKind::optimizer;  // state that lives across steps (read before it is written)
  reg_.declare(kStates, DType::real, {C, S}, keep, "engine");
  reg_.declare(kNextStates, DType::real, {C, S}, keep, "engine");
  reg_.declare(kActions, DType::i32, {C, D}, keep, "engine");
  reg_.declare(kRewards, DType::real, {C}, keep, "engine");
  reg_.declare(kDones, DType::real, {C}, keep, "engine");
  reg_.declare(kCursor, DType::i64, {kReplayCursor}, keep, "engine");
  reg_.declare(kMaxPriority, DType::i32, {1}, keep, "engine");  // one float
  if (r.prioritized) {
    reg_.declare(kTree, DType::i64, {replay::tree_layout(C).nodes}, keep, "engine");
    reg_.declare(kOwner, DType::i32, {C}, keep, "engine");
  }
  reg_.declare(kIndices, DType::i64, {spec_.batch}, keep, "engine");  // drawn by one step, read by the next
  reg_.declare(kStats, DType::real, {kReplayStats}, BufferKind::report, "engine");
  // One staging block, laid out states, next states, rewards, dones (reals), actions (i32 last,
  // so the reals stay aligned for an f64 backend): what one add_transitions copies.
  const std::int64_t es = std::int64_t(reg_.element_size(DType::real));
  replay_.stage_bytes = std::size_t(K * (2 * S + 2) * es + K * D * 4);
  reg_.declare(kStaging, DType::i32, {std::int64_t(replay_.stage_bytes / 4)}, BufferKind::input, "engine");
}

void Engine::add_replay_stage_back() {
  if (!replay_.on) return;
  if (replay_.prioritized)
    stages_.push_back(Stage{"replay.priorities", "engine", {buf::td_error, kIndices, kTree, kOwner, kMaxPriority},
                            {kTree, kOwner, kMaxPriority}, [this](Backend&) {
                              ReplayPriorities p;
                              p.store = replay_.store;
                              p.indices = replay_.indices;
                              p.td_error = td_error_;
                              p.B = spec_.batch;
                              rt_->ops().replay_priorities(p);
                            }});
  // The next step's batch, drawn last: after the priorities this step set, and beside the update,
  // off the step's critical path (the first step's batch is drawn by prime_replay_batch).
  std::vector<std::string> reads{kStates, kNextStates, kActions, kRewards, kDones, kCursor, kMaxPriority};
  if (replay_.prioritized) reads.push_back(kTree);
  replay_.sample_stage = stages_.size();
  stages_.push_back(Stage{"replay.sample", "engine", reads,
                          {buf::states2, buf::actions, buf::rewards, buf::dones, buf::is_weights, kIndices, kStats,
                           kCursor},
                          [this](Backend&) {
                            ReplaySample s;
                            s.store = replay_.store;
                            s.B = spec_.batch;
                            s.seed = rank_seed();
                            s.states2 = states2_;
                            s.actions = actions_;
                            s.rewards = rewards_;
                            s.dones = dones_;
                            s.is_weights = weights_;
                            s.indices = replay_.indices;
                            s.stats = replay_.stats;
                            s.beta_start = float(replay_.opt.spec.beta_start);
                            s.beta_end = float(replay_.opt.spec.beta_end);
                            s.beta_steps = replay_.opt.beta_steps;
                            rt_->ops().replay_sample(s);
                          }});
}

void Engine::prime_replay_batch() {
  if (!replay_.on || replay_.primed) return;
  if (replay_.added == 0) throw std::logic_error("step: the replay is empty (add_transitions before the first step)");
  stages_[replay_.sample_stage].run(rt_->ops());  // on the learner's stream, after the inserts queued there
  replay_.primed = true;
}

ReplayStore Engine::replay_store() const {
  ReplayStore s;
  s.states = reg_.real(kStates);
  s.next_states = reg_.real(kNextStates);
  s.actions = reg_.i32(kActions);
  s.rewards = reg_.real(kRewards);
  s.dones = reg_.real(kDones);
  if (replay_.prioritized) {
    s.tree = reg_.i64(kTree);
    s.owner = reg_.i32(kOwner);
  }
  s.cursor = reg_.i64(kCursor);
  s.max_priority = reinterpret_cast<float*>(reg_.i32(kMaxPriority));
  s.capacity = replay_.opt.spec.capacity;
  s.S = net_.state;
  s.D = net_.branches;
  s.alpha = float(replay_.opt.spec.alpha);
  s.priority_eps = float(replay_.opt.spec.priority_eps);
  return s;
}

void Engine::bind_replay() {
  if (!replay_.on) return;
  replay_.store = replay_store();
  replay_.indices = reg_.i64(kIndices);
  replay_.stats = reg_.real(kStats);
  const std::int64_t K = replay_.rows, S = net_.state;
  const std::uint32_t es = reg_.real_size();
  char* base = reinterpret_cast<char*>(reg_.i32(kStaging));
  replay_.stage_dev = base;
  ReplayInsert& in = replay_.staged;
  in.store = replay_.store;
  in.states = Real{base, es};
  in.next_states = Real{base + K * S * es, es};
  in.rewards = Real{base + 2 * K * S * es, es};
  in.dones = Real{base + (2 * K * S + K) * es, es};
  in.actions = reinterpret_cast<const std::int32_t*>(base + (2 * K * S + 2 * K) * es);
  EngineBackend& be = rt_->ops();
  const float one = 1.0f;
  be.upload(replay_.store.max_priority, &one, sizeof one);
  // The ring of pinned blocks: as many as 64 MiB holds (2..kStagingSlotsMax), so that a loop
  // running ahead of the device finds its block's last copy done long before it comes round.
  const std::size_t slots = std::clamp<std::size_t>((std::size_t(64) << 20) / std::max<std::size_t>(replay_.stage_bytes, 1),
                                                    2, kStagingSlotsMax);
  for (std::size_t k = 0; k < slots; ++k) replay_.pinned.push_back(rt_->alloc_host(replay_.stage_bytes));
}

void Engine::free_replay_staging() noexcept {
  for (void*& p : replay_.pinned)
    if (p) rt_->free_host(p), p = nullptr;
}

void Engine::add_transitions(const Transitions& t, std::int64_t env_step) {
  if (!replay_.on) throw std::logic_error("add_transitions: this engine has no replay (EngineOptions::replay)");
  if (t.n < 1 || t.n > replay_.rows)
    throw std::invalid_argument("add_transitions: " + std::to_string(t.n) + " transitions, but a call takes 1.." +
                                std::to_string(replay_.rows) + " (the staging rows)");
  if (!t.states || !t.next_states || !t.actions || !t.rewards || !t.dones)
    throw std::invalid_argument("add_transitions: a null pointer");
  const auto slots = std::int64_t(replay_.pinned.size());
  const int slot = int(replay_.seq % slots);
  // Its last copy was issued a ring ago: done by now unless the loop runs that far ahead of the device.
  if (replay_.seq >= slots && !rt_->ready(kStagingSlot0 + slot)) rt_->wait(kStagingSlot0 + slot);
  char* host = static_cast<char*>(replay_.pinned[std::size_t(slot)]);
  const std::int64_t K = replay_.rows, S = net_.state, D = net_.branches, n = t.n;
  const std::uint32_t es = reg_.real_size();
  auto put_reals = [&](std::int64_t at, const float* src, std::int64_t count) {
    if (es == 4) {
      std::memcpy(host + at * 4, src, std::size_t(count) * 4);
    } else {
      for (std::int64_t i = 0; i < count; ++i) {
        const double v = src[i];
        std::memcpy(host + (at + i) * 8, &v, 8);
      }
    }
  };
  put_reals(0, t.states, n * S);
  put_reals(K * S, t.next_states, n * S);
  put_reals(2 * K * S, t.rewards, n);
  put_reals(2 * K * S + K, t.dones, n);
  std::memcpy(host + (2 * K * S + 2 * K) * es, t.actions, std::size_t(n * D) * 4);
  // On the learner's lane: the copy lands after the steps queued before it have read the replay,
  // the insert follows it there.
  rt_->copy_on(replay_.stage_dev, host, replay_.stage_bytes, Runtime::kLearnerLane);
  rt_->record_on(kStagingSlot0 + slot, Runtime::kLearnerLane);
  ReplayInsert in = replay_.staged;
  in.n = n;
  in.env_step = env_step;
  EngineBackend& be = rt_->ops();
  be.replay_insert(in);
  if (be.status() != 0) throw std::runtime_error(std::string("add_transitions: ") + be.message());
  ++replay_.seq;
  replay_.added += n;
}

ReplayState Engine::replay_state() {
  if (!replay_.on) throw std::logic_error("replay_state: this engine has no replay");
  rt_->synchronize();
  EngineBackend& be = rt_->ops();
  std::int64_t cur[kReplayCursor] = {};
  be.download(cur, replay_.store.cursor, sizeof cur);
  float top = 1.0f;
  be.download(&top, replay_.store.max_priority, sizeof top);
  ReplayState s;
  s.next = cur[kCurNext];
  s.size = cur[kCurSize];
  s.env_step = cur[kCurEnvStep];
  s.draws = cur[kCurDraws];
  s.inserted = cur[kCurInserted];
  s.max_priority = top;
  s.total_priority = double(s.size);
  if (replay_.prioritized) {
    const replay::Tree t = replay::tree_layout(replay_.opt.spec.capacity);
    replay::Node root{};
    be.download(&root, replay_.store.tree + t.offset[t.levels - 1], sizeof root);
    s.total_priority = root.sum;
  }
  if (be.status() != 0) throw std::runtime_error(std::string("replay_state: ") + be.message());
  return s;
}

std::vector<std::int64_t> Engine::drawn_slots() {
  if (!replay_.on) throw std::logic_error("drawn_slots: this engine has no replay");
  rt_->synchronize();
  std::vector<std::int64_t> out(std::size_t(spec_.batch));
  rt_->ops().download(out.data(), replay_.indices, out.size() * 8);
  return out;
}

}  // namespace dqn
