/** @file step_reports.hpp
 *  @brief What a step reports (docs/step-math.md, "What a step reports"): the report block in the
 *  arena, the two pinned host copies its asynchronous copies land in, and reading them on the host.
 */
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/registry.hpp"
#include "core/runtime.hpp"
#include "core/stage_provider.hpp"

namespace dqn {

/// The replay's statistics in the report block (ReplayStats), declared by the replay after it.
inline constexpr const char* kReplayStatsBuffer = "report/replay";

/// The replay as the last report saw it (StepReport::replay).
struct ReplayStats {
  std::int64_t size = 0;
  double beta = 0, max_priority = 1, total_priority = 0;
};

/// What a step reports, read on the host.
struct StepReport {
  std::vector<std::string> heads;
  std::vector<double> losses, grad_norms, clips, fractions;
  double total_loss = 0;
  std::vector<float> td_error;
  std::int64_t skipped_steps = 0;
  std::int64_t adam_step = 0;
  std::int64_t step_index = 0;  ///< host steps taken when this report was copied
  std::optional<ReplayStats> replay;  ///< with a replay: what the report's step drew from
};

class StepReports final : public StageProvider {
 public:
  /// The report block: every head's loss, gradient norm and clip factor, the total loss, td_error
  /// and the skipped-step count, one contiguous range (with the replay's statistics, declared
  /// after it), and the views loss/<head>.
  void declare_buffers(StepBuild& b) override;
  /// After freeze: the fields' offsets in the range (the replay's statistics where declared) and
  /// the pinned copies.
  void bind(StepBuild& b) override;
  void release(Runtime& rt) noexcept;

  /// Enqueues an asynchronous copy of the report into the next pinned copy (host step `step`).
  void request(Runtime& rt, const Registry& reg, std::int64_t step);
  /// The newest copy that has landed (never blocks), if any.
  std::optional<StepReport> latest(Runtime& rt, const std::vector<double>& fractions) const;
  /// Synchronises and reads the report as it is now, with Adam's step counter `t`.
  StepReport read(Runtime& rt, const Registry& reg, const std::vector<double>& fractions, std::int64_t step,
                  const std::int64_t* t) const;

  /// The copies as a checkpoint keeps them: requests so far, each copy's host step (-1: none)
  /// and bytes.
  std::int64_t requests() const { return seq_; }
  std::int64_t copy_step(int slot) const { return step_[std::size_t(slot)]; }
  std::size_t bytes() const { return bytes_; }
  const unsigned char* copy(int slot) const { return host_[std::size_t(slot)]; }
  void restore(std::int64_t requests, const std::array<std::int64_t, 2>& steps,
               const std::array<const unsigned char*, 2>& copies);

 private:
  StepReport parse(const unsigned char* bytes, const std::vector<double>& fractions) const;

  std::vector<std::string> heads_;
  int batch_ = 0;
  std::uint32_t real_size_ = 4;
  struct Layout {
    std::size_t losses = 0, norms = 0, clips = 0, total = 0, td = 0, skipped = 0, replay = 0;
    bool has_replay = false;
  } at_;
  std::size_t begin_ = 0, bytes_ = 0;
  std::array<unsigned char*, 2> host_{nullptr, nullptr};
  std::array<std::int64_t, 2> step_{-1, -1};
  std::int64_t seq_ = 0;
};

}  // namespace dqn
