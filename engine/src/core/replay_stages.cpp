// The replay the step draws from (EngineOptions::replay): its buffers in the registry, the
// step's last stages (new priorities from td_error when prioritised, the next step's batch drawn,
// gathered and weighted) and the asynchronous path transitions come in by.
#include "core/replay_stages.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

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

void ReplayStages::declare_buffers(StepBuild& b) {
  const ReplaySpec& r = opt_.spec;
  const std::string where = "replay: ";
  if (r.capacity < b.spec.batch || r.capacity > replay::kMaxCapacity)
    throw std::invalid_argument(where + "capacity " + std::to_string(r.capacity) + " must be in " +
                                std::to_string(b.spec.batch) + " (the batch) .. 2^31");
  if (r.prioritized) {
    if (!(r.alpha >= 0.0) || !std::isfinite(r.alpha))
      throw std::invalid_argument(where + "alpha must be >= 0, got " + num(r.alpha));
    if (!(r.priority_eps > 0.0) || !std::isfinite(r.priority_eps))
      throw std::invalid_argument(where + "priority_eps must be > 0 (a zero priority is never drawn again), got " +
                                  num(r.priority_eps));
    if (!(r.beta_start >= 0.0 && r.beta_end >= 0.0) || !std::isfinite(r.beta_start) || !std::isfinite(r.beta_end))
      throw std::invalid_argument(where + "beta_start and beta_end must be >= 0");
  }
  batch_ = b.spec.batch;
  S_ = b.net.state;
  D_ = b.net.branches;
  rows_ = std::min<std::int64_t>(opt_.staging_rows > 0 ? opt_.staging_rows : kDefaultStagingRows, r.capacity);
  const std::int64_t C = r.capacity, S = S_, D = D_, K = rows_;
  Registry& reg = b.reg;
  const auto keep = BufferKind::optimizer;  // state that lives across steps (read before it is written)
  reg.declare(kStates, DType::real, {C, S}, keep, "engine");
  reg.declare(kNextStates, DType::real, {C, S}, keep, "engine");
  reg.declare(kActions, DType::i32, {C, D}, keep, "engine");
  reg.declare(kRewards, DType::real, {C}, keep, "engine");
  reg.declare(kDones, DType::real, {C}, keep, "engine");
  reg.declare(kCursor, DType::i64, {kReplayCursor}, keep, "engine");
  reg.declare(kMaxPriority, DType::i32, {1}, keep, "engine");  // one float
  if (r.prioritized) {
    reg.declare(kTree, DType::i64, {replay::tree_layout(C).nodes}, keep, "engine");
    reg.declare(kOwner, DType::i32, {C}, keep, "engine");
  }
  reg.declare(kIndices, DType::i64, {batch_}, keep, "engine");  // drawn by one step, read by the next
  reg.declare(kStats, DType::real, {kReplayStats}, BufferKind::report, "engine");
  // One staging block, laid out states, next states, rewards, dones (reals), actions (i32 last,
  // so the reals stay aligned for an f64 backend): what one add copies.
  const std::int64_t es = std::int64_t(reg.element_size(DType::real));
  stage_bytes_ = std::size_t(K * (2 * S + 2) * es + K * D * 4);
  reg.declare(kStaging, DType::i32, {std::int64_t(stage_bytes_ / 4)}, BufferKind::input, "engine");
}

void ReplayStages::add_back_stages(StepBuild& b) {
  if (opt_.spec.prioritized)
    b.stages.push_back(Stage{"replay.priorities", "engine", {buf::td_error, kIndices, kTree, kOwner, kMaxPriority},
                             {kTree, kOwner, kMaxPriority},
                             [this](Backend&) { rt_->ops().replay_priorities(priorities_); }});
  // The next step's batch, drawn last: after the priorities this step set, and beside the update,
  // off the step's critical path (the first step's batch is drawn by prime).
  std::vector<std::string> reads{kStates, kNextStates, kActions, kRewards, kDones, kCursor, kMaxPriority};
  if (opt_.spec.prioritized) reads.push_back(kTree);
  b.stages.push_back(Stage{"replay.sample", "engine", reads,
                           {buf::states2, buf::actions, buf::rewards, buf::dones, buf::is_weights, kIndices, kStats,
                            kCursor},
                           [this](Backend&) { sample(rt_->ops()); }});
}

void ReplayStages::sample(EngineOps& ops) const { ops.replay_sample(draw_); }

void ReplayStages::prime() {
  if (primed_) return;
  if (added_ == 0) throw std::logic_error("step: the replay is empty (add transitions before the first step)");
  sample(rt_->ops());  // on the learner's stream, after the inserts queued there
  primed_ = true;
}

void ReplayStages::bind(StepBuild& b) {
  const Registry& reg = b.reg;
  rt_ = &b.rt;
  real_size_ = reg.real_size();
  const ReplaySpec& r = opt_.spec;
  ReplayStore& store = draw_.store;
  store.states = reg.real(kStates);
  store.next_states = reg.real(kNextStates);
  store.actions = reg.i32(kActions);
  store.rewards = reg.real(kRewards);
  store.dones = reg.real(kDones);
  if (r.prioritized) {
    store.tree = reg.i64(kTree);
    store.owner = reg.i32(kOwner);
  }
  store.cursor = reg.i64(kCursor);
  store.max_priority = reinterpret_cast<float*>(reg.i32(kMaxPriority));
  store.capacity = r.capacity;
  store.S = int(S_);
  store.D = int(D_);
  store.alpha = float(r.alpha);
  store.priority_eps = float(r.priority_eps);

  draw_.B = batch_;
  draw_.seed = seed_;
  draw_.states2 = reg.real(buf::states2);
  draw_.actions = reg.i32(buf::actions);
  draw_.rewards = reg.real(buf::rewards);
  draw_.dones = reg.real(buf::dones);
  draw_.is_weights = reg.real(buf::is_weights);
  draw_.indices = reg.i64(kIndices);
  draw_.stats = reg.real(kStats);
  draw_.beta_start = float(r.beta_start);
  draw_.beta_end = float(r.beta_end);
  draw_.beta_steps = opt_.beta_steps;
  if (r.prioritized) {
    priorities_.store = store;
    priorities_.indices = draw_.indices;
    priorities_.td_error = reg.real(buf::td_error);
    priorities_.B = batch_;
  }

  const std::int64_t K = rows_, S = S_;
  const std::uint32_t es = real_size_;
  char* base = reinterpret_cast<char*>(reg.i32(kStaging));
  stage_dev_ = base;
  ReplayInsert& in = staged_;
  in.store = store;
  in.states = Real{base, es};
  in.next_states = Real{base + K * S * es, es};
  in.rewards = Real{base + 2 * K * S * es, es};
  in.dones = Real{base + (2 * K * S + K) * es, es};
  in.actions = reinterpret_cast<const std::int32_t*>(base + (2 * K * S + 2 * K) * es);
  const float one = 1.0f;
  rt_->ops().upload(store.max_priority, &one, sizeof one);
  // The ring of pinned blocks: as many as 64 MiB holds (2..kStagingSlotsMax), so that a loop
  // running ahead of the device finds its block's last copy done long before it comes round.
  const std::size_t slots = std::clamp<std::size_t>((std::size_t(64) << 20) / std::max<std::size_t>(stage_bytes_, 1),
                                                    2, kStagingSlotsMax);
  for (std::size_t k = 0; k < slots; ++k) pinned_.push_back(rt_->alloc_host(stage_bytes_));
}

void ReplayStages::release() noexcept {
  if (!rt_) return;
  for (void*& p : pinned_)
    if (p) rt_->free_host(p), p = nullptr;
}

void ReplayStages::restore(const Counters& c) {
  seq_ = c.seq;
  added_ = c.added;
  primed_ = c.primed;
}

void ReplayStages::add(const Transitions& t, std::int64_t env_step) {
  if (t.n < 1 || t.n > rows_)
    throw std::invalid_argument("add_transitions: " + std::to_string(t.n) + " transitions, but a call takes 1.." +
                                std::to_string(rows_) + " (the staging rows)");
  if (!t.states || !t.next_states || !t.actions || !t.rewards || !t.dones)
    throw std::invalid_argument("add_transitions: a null pointer");
  const auto slots = std::int64_t(pinned_.size());
  const int slot = int(seq_ % slots);
  // Its last copy was issued a ring ago: done by now unless the loop runs that far ahead of the device.
  if (seq_ >= slots && !rt_->ready(kStagingSlot0 + slot)) rt_->wait(kStagingSlot0 + slot);
  char* host = static_cast<char*>(pinned_[std::size_t(slot)]);
  const std::int64_t K = rows_, S = S_, D = D_, n = t.n;
  const std::uint32_t es = real_size_;
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
  rt_->copy_on(stage_dev_, host, stage_bytes_, Runtime::kLearnerLane);
  rt_->record_on(kStagingSlot0 + slot, Runtime::kLearnerLane);
  ReplayInsert in = staged_;
  in.n = n;
  in.env_step = env_step;
  EngineBackend& be = rt_->ops();
  be.replay_insert(in);
  if (be.status() != 0) throw std::runtime_error(std::string("add_transitions: ") + be.message());
  ++seq_;
  added_ += n;
}

ReplayState ReplayStages::state() {
  rt_->synchronize();
  EngineBackend& be = rt_->ops();
  std::int64_t cur[kReplayCursor] = {};
  be.download(cur, draw_.store.cursor, sizeof cur);
  float top = 1.0f;
  be.download(&top, draw_.store.max_priority, sizeof top);
  ReplayState s;
  s.next = cur[kCurNext];
  s.size = cur[kCurSize];
  s.env_step = cur[kCurEnvStep];
  s.draws = cur[kCurDraws];
  s.inserted = cur[kCurInserted];
  s.max_priority = top;
  s.total_priority = double(s.size);
  if (opt_.spec.prioritized) {
    const replay::Tree t = replay::tree_layout(opt_.spec.capacity);
    replay::Node root{};
    be.download(&root, draw_.store.tree + t.offset[t.levels - 1], sizeof root);
    s.total_priority = root.sum;
  }
  if (be.status() != 0) throw std::runtime_error(std::string("replay_state: ") + be.message());
  return s;
}

std::vector<std::int64_t> ReplayStages::drawn_slots() {
  rt_->synchronize();
  std::vector<std::int64_t> out(static_cast<std::size_t>(batch_));
  rt_->ops().download(out.data(), draw_.indices, out.size() * 8);
  return out;
}

}  // namespace dqn
