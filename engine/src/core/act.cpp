// The act step: the online trunk over the acting observations, the primary head's act stages
// (its forward, writing act/q), and the branch-wise argmax, as a graph of its own on CUDA, run on
// the actor's lane over a snapshot of the parameters that the learner refreshes on the device.
#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "core/engine.hpp"

namespace dqn {

namespace {
std::string act_layer(int i, int L) { return i == L - 1 ? std::string(buf::act_h2) : "act/a" + std::to_string(i); }
constexpr const char* kActNext = "act/params_next";  ///< [P] a refresh's copy, before the actor takes it up
}  // namespace

void Engine::declare_act_buffers() {
  const std::int64_t M = act_rows_, S = net_.state, D = net_.branches, A = net_.actions;
  const int L = net_.trunk_layers;
  reg_.declare(kActStates, DType::real, {M, S}, BufferKind::input, "engine");
  for (int i = 0; i < L; ++i) reg_.declare(act_layer(i, L), DType::real, {M, net_.trunk[i]}, BufferKind::activation, "engine");
  reg_.declare(buf::act_q, DType::real, {M, D, A}, BufferKind::activation, "engine");
  reg_.declare(kActActions, DType::i32, {M, D}, BufferKind::activation, "engine");
}

void Engine::declare_act_snapshot() {
  const std::int64_t P = reg_.param_count();
  reg_.declare(buf::act_params, DType::real, {P}, BufferKind::optimizer, "engine");
  reg_.declare(kActNext, DType::real, {P}, BufferKind::optimizer, "engine");
}

void Engine::add_act_stage_front() {
  const int L = net_.trunk_layers;
  std::vector<std::string> writes;
  for (int i = 0; i < L; ++i) writes.push_back(act_layer(i, L));
  act_stages_.push_back(Stage{"act.trunk", "engine", {kActStates, buf::act_params}, writes, [this, L](Backend& be) {
                                for (int i = 0; i < L; ++i) {
                                  Gemm g = trunk_->layer_gemm(i, false);
                                  g.m = act_rows_;
                                  g.a = i > 0 ? act_a_[std::size_t(i - 1)] : act_states_;
                                  g.b = act_w_[std::size_t(i)];
                                  g.bias = act_b_[std::size_t(i)];
                                  g.c = act_a_[std::size_t(i)];
                                  be.gemm(g);
                                }
                              }});
}

void Engine::add_act_stage_back() {
  bool primary_acts = false;
  for (const auto& s : act_stages_) primary_acts = primary_acts || s.owner == head_names_[primary_];
  if (!primary_acts)
    throw std::runtime_error("head '" + head_names_[primary_] + "' (" + heads_[primary_].plugin().path +
                             ") is the primary but declared no act stage: a primary writes act/q for acting "
                             "(BuildContext::act_stage; dqn/head.hpp, \"The primary's contract\")");
  act_stages_.push_back(Stage{"act.greedy", "engine", {buf::act_q}, {kActActions}, [this](Backend& be) {
                                be.argmax(act_actions_, act_q_, act_rows_ * net_.branches, net_.actions);
                              }});
}

void Engine::bind_act() {
  act_states_ = reg_.real(kActStates);
  act_q_ = reg_.real(buf::act_q);
  act_actions_ = reg_.i32(kActActions);
  act_params_ = reg_.real(buf::act_params);
  act_next_ = reg_.real(kActNext);
  for (int i = 0; i < net_.trunk_layers; ++i) {
    act_a_.push_back(reg_.real(act_layer(i, net_.trunk_layers)));
    const std::string p = "trunk." + std::to_string(i);
    act_w_.push_back(reg_.param_in(act_params_, p + ".weight"));
    act_b_.push_back(reg_.param_in(act_params_, p + ".bias"));
  }
  const std::size_t M = std::size_t(act_rows_), es = reg_.real_size();
  snap_.obs_host = rt_->alloc_host(M * std::size_t(net_.state) * es);
  snap_.out_bytes = M * std::size_t(net_.branches) * std::max<std::size_t>(std::size_t(net_.actions) * es, 4);
  snap_.out_host = rt_->alloc_host(snap_.out_bytes);
}

void Engine::free_act_staging() noexcept {
  for (void** p : {&snap_.obs_host, &snap_.out_host})
    if (*p) rt_->free_host(*p), *p = nullptr;
}

void Engine::capture_act() {
  rt_->begin_capture(Runtime::kActGraph);
  for (std::size_t k = 0; k < act_stages_.size(); ++k) {
    act_stages_[k].run(rt_->ops());
    check_capture(act_stages_[k]);
  }
  rt_->end_capture();
}

void Engine::snapshot_now() {
  rt_->copy_on(act_params_.p, params_.p, std::size_t(reg_.param_count()) * reg_.real_size(), Runtime::kLearnerLane);
  rt_->synchronize();
  snap_.pending = false;
}

void Engine::refresh_snapshot() {
  // act_next_ is free once the actor's last take-up has copied it (a wait on the device only); one
  // not taken up yet is overwritten by this newer one (the actor has not read it).
  if (snap_.adopted > 0) rt_->wait_on(Runtime::kLearnerLane, kEvTakenUp);
  rt_->copy_on(act_next_.p, params_.p, std::size_t(reg_.param_count()) * reg_.real_size(), Runtime::kLearnerLane);
  rt_->record_on(kEvRefreshed, Runtime::kLearnerLane);
  snap_.pending = true;
}

void Engine::run_act(const float* obs, int rows, bool fresh) {
  if (rows < 1 || rows > act_rows_)
    throw std::invalid_argument("act: rows must be in 1.." + std::to_string(act_rows_) + " (the act step's rows: "
                                "training.num_envs and training.eval.episodes), got " + std::to_string(rows));
  const std::size_t P = std::size_t(reg_.param_count()) * reg_.real_size();
  if (fresh) {
    // The snapshot from the parameters the learner's queue leaves, once the last act step is done
    // reading it; a refresh not yet taken up is older than this and is dropped.
    if (snap_.acted) rt_->wait_on(Runtime::kLearnerLane, kEvActed);
    rt_->copy_on(act_params_.p, params_.p, P, Runtime::kLearnerLane);
    rt_->record_on(kEvFresh, Runtime::kLearnerLane);
    rt_->wait_on(Runtime::kActorLane, kEvFresh);
    snap_.pending = false;
  } else if (snap_.pending && rt_->ready(kEvRefreshed)) {
    rt_->copy_on(act_params_.p, act_next_.p, P, Runtime::kActorLane);
    rt_->record_on(kEvTakenUp, Runtime::kActorLane);
    snap_.pending = false;
    ++snap_.adopted;
  }
  const std::size_t n = std::size_t(rows) * std::size_t(net_.state);
  if (reg_.real_size() == 4) {
    std::memcpy(snap_.obs_host, obs, n * 4);
  } else {
    auto* d = static_cast<double*>(snap_.obs_host);
    for (std::size_t i = 0; i < n; ++i) d[i] = obs[i];
  }
  rt_->copy_on(act_states_.p, snap_.obs_host, n * reg_.real_size(), Runtime::kActorLane);
  EngineBackend& be = rt_->ops();
  if (captured_) {
    rt_->replay_on(Runtime::kActGraph, Runtime::kActorLane);
  } else {
    for (auto& s : act_stages_) s.run(be);
  }
  if (be.status() != 0) throw std::runtime_error(std::string("act step: ") + be.message());
}

void Engine::finish_act(void* out, std::size_t bytes) {
  rt_->record_on(kEvActed, Runtime::kActorLane);
  snap_.acted = true;
  rt_->sync_lane(Runtime::kActorLane);  // the one wait of an environment step
  std::memcpy(out, snap_.out_host, bytes);
}

void Engine::act(const float* obs, int rows, std::int32_t* actions) {
  run_act(obs, rows, true);
  const std::size_t bytes = std::size_t(rows) * std::size_t(net_.branches) * sizeof(std::int32_t);
  rt_->copy_on(snap_.out_host, act_actions_, bytes, Runtime::kActorLane);
  finish_act(actions, bytes);
}

void Engine::act_snapshot(const float* obs, int rows, std::int32_t* actions) {
  run_act(obs, rows, false);
  const std::size_t bytes = std::size_t(rows) * std::size_t(net_.branches) * sizeof(std::int32_t);
  rt_->copy_on(snap_.out_host, act_actions_, bytes, Runtime::kActorLane);
  finish_act(actions, bytes);
}

std::vector<float> Engine::act_values(const float* obs, int rows) {
  run_act(obs, rows, true);
  const std::size_t n = std::size_t(rows) * std::size_t(net_.branches) * std::size_t(net_.actions);
  const std::size_t es = reg_.real_size();
  rt_->copy_on(snap_.out_host, act_q_.p, n * es, Runtime::kActorLane);
  std::vector<unsigned char> raw(n * es);
  finish_act(raw.data(), raw.size());
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
