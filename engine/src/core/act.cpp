// The act step: the online trunk over the acting observations, the primary head's act stages
// (its forward, writing act/q), and the branch-wise argmax, as a graph of its own on CUDA.
#include <cstring>
#include <stdexcept>

#include "core/engine.hpp"

namespace dqn {

namespace {
std::string act_layer(int i, int L) { return i == L - 1 ? std::string(buf::act_h2) : "act/a" + std::to_string(i); }
}  // namespace

void Engine::declare_act_buffers() {
  const std::int64_t M = act_rows_, S = net_.state, D = net_.branches, A = net_.actions;
  const int L = net_.trunk_layers;
  reg_.declare(kActStates, DType::real, {M, S}, BufferKind::input, "engine");
  for (int i = 0; i < L; ++i) reg_.declare(act_layer(i, L), DType::real, {M, net_.trunk[i]}, BufferKind::activation, "engine");
  reg_.declare(buf::act_q, DType::real, {M, D, A}, BufferKind::activation, "engine");
  reg_.declare(kActActions, DType::i32, {M, D}, BufferKind::activation, "engine");
}

void Engine::add_act_stage_front() {
  const int L = net_.trunk_layers;
  std::vector<std::string> writes;
  for (int i = 0; i < L; ++i) writes.push_back(act_layer(i, L));
  act_stages_.push_back(Stage{"act.trunk", "engine", {kActStates, "params"}, writes, [this, L](Backend& be) {
                                for (int i = 0; i < L; ++i) {
                                  Gemm g = trunk_layer_gemm(i, false);
                                  g.m = act_rows_;
                                  g.a = i > 0 ? act_a_[std::size_t(i - 1)] : act_states_;
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
  for (int i = 0; i < net_.trunk_layers; ++i) act_a_.push_back(reg_.real(act_layer(i, net_.trunk_layers)));
}

void Engine::capture_act() {
  rt_->begin_capture(Runtime::kActGraph);
  for (std::size_t k = 0; k < act_stages_.size(); ++k) {
    act_stages_[k].run(rt_->ops());
    check_capture(act_stages_[k]);
  }
  rt_->end_capture();
}

void Engine::run_act(const float* obs, int rows) {
  if (rows < 1 || rows > act_rows_)
    throw std::invalid_argument("act: rows must be in 1.." + std::to_string(act_rows_) + " (the act step's rows: "
                                "training.num_envs and training.eval.episodes), got " + std::to_string(rows));
  Backend& be = rt_->ops();
  be.upload_reals(act_states_, obs, std::int64_t(rows) * net_.state);
  if (captured_) {
    rt_->replay(Runtime::kActGraph);
  } else {
    for (auto& s : act_stages_) s.run(be);
  }
  if (be.status() != 0) throw std::runtime_error(std::string("act step: ") + be.message());
}

void Engine::act(const float* obs, int rows, std::int32_t* actions) {
  run_act(obs, rows);
  Backend& be = rt_->ops();
  be.download(actions, act_actions_, std::size_t(rows) * std::size_t(net_.branches) * sizeof(std::int32_t));
  if (be.status() != 0) throw std::runtime_error(std::string("act step: ") + be.message());
}

std::vector<float> Engine::act_values(const float* obs, int rows) {
  run_act(obs, rows);
  Backend& be = rt_->ops();
  std::vector<float> q(std::size_t(rows) * std::size_t(net_.branches) * std::size_t(net_.actions));
  be.download_reals(q.data(), act_q_, std::int64_t(q.size()));
  if (be.status() != 0) throw std::runtime_error(std::string("act step: ") + be.message());
  return q;
}

}  // namespace dqn
