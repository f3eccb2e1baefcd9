/** @file act_stages.cpp
 *  @brief The act step's buffers, stages, capture and runs (act_stages.hpp).
 */
#include "core/act_stages.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

namespace dqn {

namespace {
std::string act_layer(int i, int L) { return i == L - 1 ? std::string(buf::act_h2) : "act/a" + std::to_string(i); }
constexpr const char* kActStates = "act/states";       ///< [M,S] the acting observations
constexpr const char* kActActions = "act/actions";     ///< i32 [M,D] their greedy actions
constexpr const char* kActNext = "act/params_next";    ///< [P] a refresh's copy, before the actor takes it up
}  // namespace

void ActStages::declare_buffers(StepBuild& b) {
  net_ = b.net;
  rt_ = &b.rt;
  const std::int64_t M = rows_, S = net_.state, D = net_.branches, A = net_.actions;
  const int L = net_.trunk_layers;
  b.reg.declare(kActStates, DType::real, {M, S}, BufferKind::input, "engine");
  for (int i = 0; i < L; ++i) b.reg.declare(act_layer(i, L), DType::real, {M, net_.trunk[i]}, BufferKind::activation, "engine");
  b.reg.declare(buf::act_q, DType::real, {M, D, A}, BufferKind::activation, "engine");
  b.reg.declare(kActActions, DType::i32, {M, D}, BufferKind::activation, "engine");
}

void ActStages::add_front_stages(StepBuild&) {
  const int L = net_.trunk_layers;
  std::vector<std::string> writes;
  for (int i = 0; i < L; ++i) writes.push_back(act_layer(i, L));
  stages_.push_back(Stage{"act.trunk", "engine", {kActStates, buf::act_params}, writes, [this, L](Backend& be) {
                            for (int i = 0; i < L; ++i) {
                              Gemm g = trunk_.layer_gemm(i, false);
                              g.m = rows_;
                              g.a = i > 0 ? a_[std::size_t(i - 1)] : states_;
                              g.b = w_[std::size_t(i)];
                              g.bias = b_[std::size_t(i)];
                              g.c = a_[std::size_t(i)];
                              be.gemm(g);
                            }
                          }});
}

void ActStages::declare_after_heads(StepBuild& b) {
  const std::int64_t P = b.reg.param_count();
  b.reg.declare(buf::act_params, DType::real, {P}, BufferKind::optimizer, "engine");
  b.reg.declare(kActNext, DType::real, {P}, BufferKind::optimizer, "engine");
}

bool ActStages::has_stage_of(const std::string& owner) const {
  return std::any_of(stages_.begin(), stages_.end(), [&](const Stage& s) { return s.owner == owner; });
}

void ActStages::add_back_stages(StepBuild&) {
  stages_.push_back(Stage{"act.greedy", "engine", {buf::act_q}, {kActActions}, [this](Backend& be) {
                            be.argmax(actions_, q_, rows_ * net_.branches, net_.actions);
                          }});
}

void ActStages::bind(StepBuild& b) {
  const Registry& reg = b.reg;
  states_ = reg.real(kActStates);
  q_ = reg.real(buf::act_q);
  actions_ = reg.i32(kActActions);
  params_ = reg.real("params");
  snapshot_ = reg.real(buf::act_params);
  next_ = reg.real(kActNext);
  real_size_ = reg.real_size();
  param_bytes_ = std::size_t(reg.param_count()) * real_size_;
  for (int i = 0; i < net_.trunk_layers; ++i) {
    a_.push_back(reg.real(act_layer(i, net_.trunk_layers)));
    const std::string p = "trunk." + std::to_string(i);
    w_.push_back(reg.param_in(snapshot_, p + ".weight"));
    b_.push_back(reg.param_in(snapshot_, p + ".bias"));
  }
  const std::size_t M = std::size_t(rows_), es = real_size_;
  snap_.obs_host = rt_->alloc_host(M * std::size_t(net_.state) * es);
  snap_.out_bytes = M * std::size_t(net_.branches) * std::max<std::size_t>(std::size_t(net_.actions) * es, 4);
  snap_.out_host = rt_->alloc_host(snap_.out_bytes);
}

void ActStages::release() noexcept {
  if (!rt_) return;
  for (void** p : {&snap_.obs_host, &snap_.out_host})
    if (*p) rt_->free_host(*p), *p = nullptr;
}

void ActStages::capture(const std::function<void(const Stage&)>& check) {
  rt_->begin_capture(Runtime::kActGraph);
  for (auto& s : stages_) {
    s.run(rt_->ops());
    check(s);
  }
  rt_->end_capture();
  captured_ = true;
}

void ActStages::snapshot_now() {
  rt_->copy_on(snapshot_.p, params_.p, param_bytes_, Runtime::kLearnerLane);
  rt_->synchronize();
  snap_.pending = false;
}

void ActStages::restore_snapshot_state(const SnapshotState& s) {
  snap_.pending = s.pending;
  snap_.acted = s.acted;
  snap_.adopted = s.adopted;
}

void ActStages::refresh_snapshot() {
  // next_ is free once the actor's last take-up has copied it (a wait on the device only); one
  // not taken up yet is overwritten by this newer one (the actor has not read it).
  if (snap_.adopted > 0) rt_->wait_on(Runtime::kLearnerLane, kEvTakenUp);
  rt_->copy_on(next_.p, params_.p, param_bytes_, Runtime::kLearnerLane);
  rt_->record_on(kEvRefreshed, Runtime::kLearnerLane);
  snap_.pending = true;
}

void ActStages::run(const float* obs, int rows, bool fresh) {
  if (rows < 1 || rows > rows_)
    throw std::invalid_argument("act: rows must be in 1.." + std::to_string(rows_) + " (the act step's rows: "
                                "training.num_envs and training.eval.episodes), got " + std::to_string(rows));
  if (fresh) {
    // The snapshot from the parameters the learner's queue leaves, once the last act step is done
    // reading it; a refresh not yet taken up is older than this and is dropped.
    if (snap_.acted) rt_->wait_on(Runtime::kLearnerLane, kEvActed);
    rt_->copy_on(snapshot_.p, params_.p, param_bytes_, Runtime::kLearnerLane);
    rt_->record_on(kEvFresh, Runtime::kLearnerLane);
    rt_->wait_on(Runtime::kActorLane, kEvFresh);
    snap_.pending = false;
  } else if (snap_.pending && rt_->ready(kEvRefreshed)) {
    rt_->copy_on(snapshot_.p, next_.p, param_bytes_, Runtime::kActorLane);
    rt_->record_on(kEvTakenUp, Runtime::kActorLane);
    snap_.pending = false;
    ++snap_.adopted;
  }
  const std::size_t n = std::size_t(rows) * std::size_t(net_.state);
  if (real_size_ == 4) {
    std::memcpy(snap_.obs_host, obs, n * 4);
  } else {
    auto* d = static_cast<double*>(snap_.obs_host);
    for (std::size_t i = 0; i < n; ++i) d[i] = obs[i];
  }
  rt_->copy_on(states_.p, snap_.obs_host, n * real_size_, Runtime::kActorLane);
  EngineBackend& be = rt_->ops();
  if (captured_) {
    rt_->replay_on(Runtime::kActGraph, Runtime::kActorLane);
  } else {
    for (auto& s : stages_) s.run(be);
  }
  if (be.status() != 0) throw std::runtime_error(std::string("act step: ") + be.message());
}

void ActStages::finish(void* out, std::size_t bytes) {
  rt_->record_on(kEvActed, Runtime::kActorLane);
  snap_.acted = true;
  rt_->sync_lane(Runtime::kActorLane);  // the one wait of an environment step
  std::memcpy(out, snap_.out_host, bytes);
}

void ActStages::greedy(const float* obs, int rows, bool fresh, std::int32_t* actions) {
  run(obs, rows, fresh);
  const std::size_t bytes = std::size_t(rows) * std::size_t(net_.branches) * sizeof(std::int32_t);
  rt_->copy_on(snap_.out_host, actions_, bytes, Runtime::kActorLane);
  finish(actions, bytes);
}

std::vector<float> ActStages::act_values(const float* obs, int rows) {
  run(obs, rows, true);
  const std::size_t n = std::size_t(rows) * std::size_t(net_.branches) * std::size_t(net_.actions);
  const std::size_t es = real_size_;
  rt_->copy_on(snap_.out_host, q_.p, n * es, Runtime::kActorLane);
  std::vector<unsigned char> raw(n * es);
  finish(raw.data(), raw.size());
  std::vector<float> q(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (es == 4) {
      std::memcpy(&q[i], raw.data() + i * 4, 4);
    } else {
      double v;
      std::memcpy(&v, raw.data() + i * 8, 8);
      q[i] = float(v);
    }
  }
  return q;
}

}  // namespace dqn
