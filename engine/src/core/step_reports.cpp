/** @file step_reports.cpp
 *  @brief The report block, its host copies and their parsing (step_reports.hpp).
 */
#include "core/step_reports.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace dqn {

void StepReports::declare_buffers(StepBuild& b) {
  Registry& reg = b.reg;
  const std::vector<std::string>& heads = b.heads;
  const int batch = b.spec.batch;
  heads_ = heads;
  batch_ = batch;
  const std::int64_t H = std::int64_t(heads.size());
  reg.declare("report/losses", DType::real, {H}, BufferKind::report, "engine");
  reg.declare("report/norms", DType::real, {H}, BufferKind::report, "engine");
  reg.declare("report/clips", DType::real, {H}, BufferKind::report, "engine");
  reg.declare("report/total_loss", DType::real, {1}, BufferKind::report, "engine");
  reg.declare(buf::td_error, DType::real, {batch}, BufferKind::report, "engine");
  reg.declare("report/skipped", DType::i64, {1}, BufferKind::report, "engine");
  for (std::size_t h = 0; h < heads.size(); ++h)
    reg.declare_view("loss/" + heads[h], "report/losses", std::int64_t(h), {1}, "engine");
}

void StepReports::bind(StepBuild& b) {
  const Registry& reg = b.reg;
  Runtime& rt = b.rt;
  const char* replay_stats = reg.has(kReplayStatsBuffer) ? kReplayStatsBuffer : nullptr;
  real_size_ = reg.real_size();
  const auto [rb, re] = reg.report_range();
  begin_ = rb;
  bytes_ = re - rb;
  at_.losses = reg.find("report/losses")->offset_bytes - rb;
  at_.norms = reg.find("report/norms")->offset_bytes - rb;
  at_.clips = reg.find("report/clips")->offset_bytes - rb;
  at_.total = reg.find("report/total_loss")->offset_bytes - rb;
  at_.td = reg.find(buf::td_error)->offset_bytes - rb;
  at_.skipped = reg.find("report/skipped")->offset_bytes - rb;
  at_.has_replay = replay_stats != nullptr;
  if (replay_stats) at_.replay = reg.find(replay_stats)->offset_bytes - rb;
  for (auto*& p : host_) {
    p = static_cast<unsigned char*>(rt.alloc_host(std::max<std::size_t>(bytes_, 8)));
    std::memset(p, 0, std::max<std::size_t>(bytes_, 8));
  }
}

void StepReports::release(Runtime& rt) noexcept {
  for (auto*& p : host_)
    if (p) rt.free_host(p), p = nullptr;
}

void StepReports::request(Runtime& rt, const Registry& reg, std::int64_t step) {
  const int slot = int(seq_ % 2);
  rt.copy_to_host_async(host_[std::size_t(slot)], reg.base() + begin_, bytes_, slot);
  step_[std::size_t(slot)] = step;
  ++seq_;
}

std::optional<StepReport> StepReports::latest(Runtime& rt, const std::vector<double>& fractions) const {
  // Newest first; ready() never blocks.
  for (int k = 0; k < 2; ++k) {
    const int slot = int((seq_ - 1 - k) % 2 + 2) % 2;
    if (seq_ - 1 - k < 0 || step_[std::size_t(slot)] < 0) continue;
    if (!rt.ready(slot)) continue;
    StepReport r = parse(host_[std::size_t(slot)], fractions);
    r.step_index = step_[std::size_t(slot)];
    r.adam_step = -1;
    return r;
  }
  return std::nullopt;
}

StepReport StepReports::read(Runtime& rt, const Registry& reg, const std::vector<double>& fractions,
                             std::int64_t step, const std::int64_t* t) const {
  rt.synchronize();
  std::vector<unsigned char> bytes(bytes_);
  rt.ops().download(bytes.data(), reg.base() + begin_, bytes_);
  StepReport r = parse(bytes.data(), fractions);
  r.step_index = step;
  rt.ops().download(&r.adam_step, t, 8);
  return r;
}

void StepReports::restore(std::int64_t requests, const std::array<std::int64_t, 2>& steps,
                          const std::array<const unsigned char*, 2>& copies) {
  for (std::size_t s = 0; s < 2; ++s) {
    step_[s] = steps[s];
    if (steps[s] >= 0) std::memcpy(host_[s], copies[s], bytes_);
  }
  seq_ = requests;
}

StepReport StepReports::parse(const unsigned char* bytes, const std::vector<double>& fractions) const {
  auto real_at = [&](std::size_t off, std::size_t i) -> double {
    if (real_size_ == 8) {
      double v;
      std::memcpy(&v, bytes + off + i * 8, 8);
      return v;
    }
    float v;
    std::memcpy(&v, bytes + off + i * 4, 4);
    return v;
  };
  StepReport r;
  r.heads = heads_;
  r.fractions = fractions;
  for (std::size_t h = 0; h < heads_.size(); ++h) {
    r.losses.push_back(real_at(at_.losses, h));
    r.grad_norms.push_back(real_at(at_.norms, h));
    r.clips.push_back(real_at(at_.clips, h));
  }
  r.total_loss = real_at(at_.total, 0);
  for (int b = 0; b < batch_; ++b) r.td_error.push_back(float(real_at(at_.td, std::size_t(b))));
  std::memcpy(&r.skipped_steps, bytes + at_.skipped, 8);
  if (at_.has_replay) {
    ReplayStats st;
    st.size = std::int64_t(real_at(at_.replay, 0));
    st.beta = real_at(at_.replay, 1);
    st.max_priority = real_at(at_.replay, 2);
    st.total_priority = real_at(at_.replay, 3);
    r.replay = st;
  }
  return r;
}

}  // namespace dqn
