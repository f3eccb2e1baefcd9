/** @file run_log.hpp
 *  @brief A training run's log: metrics.jsonl, one JSON line per log point composed from the values
 *  the loop hands over, the same numbers in a TensorBoard event file beside it, and the terminal: a progress line (redrawn in place on a terminal, plain
 *  lines elsewhere) and messages.
 */
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "training/evaluation.hpp"
#include "training/tb_events.hpp"

namespace dqn {

/// One metrics line's values, as the loop has them. An absent optional is a key the line leaves
/// out, except where said.
struct MetricsValues {
  std::int64_t step = 0;  ///< the run's clock: environment steps, or training steps offline
  std::int64_t train_steps = 0;
  /// Several devices: how many ranks, and the environment steps of every rank.
  std::optional<int> ranks;
  std::int64_t env_steps_all_ranks = 0;
  std::int64_t episodes = 0;
  /// The recent episodes' mean return (null before an episode has ended).
  std::optional<double> episode_return;
  std::optional<EvalResult> eval;  ///< the evaluation this line reports, if one ran
  std::optional<double> epsilon, beta;
  /// Every head of the engine: its loss, gradient norm and clip are null until a report lands.
  std::vector<std::string> heads;
  struct HeadReport {
    std::string head;
    double loss = 0, grad_norm = 0, clip = 0;
  };
  /// The newest step report that has landed, if one has.
  struct Report {
    std::vector<HeadReport> heads;
    double total_loss = 0;
    std::int64_t skipped_steps = 0;
  };
  std::optional<Report> report;
  std::int64_t replay_size = 0;
  std::optional<double> max_priority;
  /// Training episodes an unstable simulation ended, so far (online runs).
  std::optional<std::int64_t> unstable_episodes;
  bool final_line = false;
  bool interrupted = false;  ///< on the final line: a stop request ended the run
};

/// What the progress line shows besides the log's own rate and times.
struct ProgressValues {
  std::int64_t clock = 0;
  std::optional<double> last_eval, best_eval;
  double epsilon = 0;
  bool offline = false;                 ///< no ε (and the clock counts training steps)
  std::optional<double> episode_return;  ///< the recent training episodes' mean return
  std::optional<double> loss;            ///< the newest report's total loss
  /// The stopping rule besides the clock's end ("" : none), as the ETA names it: "eval ≥ 475"
  /// (text that outlives the call: the trainer words it once).
  std::string_view stop_rule;
};

class RunLog {
 public:
  enum class Progress { automatic, tty, plain, none };
  static constexpr const char* kMetricsFile = "metrics.jsonl";

  /// The clock and training steps at the last metrics line (its throughput counts from there) and
  /// the clock at the last plain progress line: what a checkpoint keeps of the log.
  struct Marks {
    std::int64_t last_log_steps = 0, last_log_train_steps = 0, last_plain = 0;
  };

  /// `out`: where the progress line and messages go (null: nowhere). automatic: one line redrawn
  /// in place when `out` is a terminal, else plain lines every 10 × log_every clock steps.
  /// `total_steps`: the clock's end, for the progress line's ETA.
  RunLog(Progress progress, std::FILE* out, std::int64_t log_every, std::int64_t total_steps);

  /// The run starts now: its clocks, and whether the progress line is redrawn in place.
  void start();
  /// A resumed run: the wall time it had taken and the marks its checkpoint kept.
  void resume(double wall_s, const Marks& marks);
  Marks marks() const { return {last_log_steps_, last_log_train_steps_, last_plain_}; }
  /// Seconds since start(), including a resumed run's earlier time.
  double wall_s() const;

  /// Opens <run_dir>/metrics.jsonl: a new one (truncated), or one to append to (a resumed run's);
  /// and the event file: a new one, or (resumed, `events_name` given) the run's own cut back to
  /// `events_bytes`. Throws std::runtime_error naming the file when one cannot be opened.
  void open(const std::string& run_dir, bool append, const std::string& events_name = "",
            std::int64_t events_bytes = 0);
  /// Bytes in metrics.jsonl so far (where a checkpoint's resume cuts it back to), and the event
  /// file's name and size.
  std::int64_t metrics_bytes() { return std::int64_t(metrics_.tellp()); }
  const std::string& events_name() const { return events_.name(); }
  std::int64_t events_bytes() { return events_.bytes(); }
  void close() {
    metrics_.close();
    events_.close();
  }

  /// Takes the throughput since the last line and, with metrics.jsonl open, appends the line and
  /// flushes it, and a record of its numbers to the event file (every number but `step`, which is
  /// the record's step, and `eval_seed`, an identifier: "loss.c51" as the tag "loss/c51"). Throws
  /// std::runtime_error naming the file when one cannot be written.
  void metrics_line(const MetricsValues& v);
  /// The progress line: the clock, the recent return, the latest loss, the evaluation, ε, the
  /// rate and the ETA at the clock's end (which an evaluation meeting the stopping rule makes
  /// sooner, as the line says). On a terminal redrawn at most five times a second (always when
  /// force_plain or final_line); elsewhere a line every 10 × log_every clock steps, on force_plain
  /// and at the end. final_line shows the wall time instead of the ETA.
  void progress(const ProgressValues& v, bool force_plain, bool final_line);
  /// A message on a line of its own (over the progress line on a terminal).
  void note(const std::string& text) const;

 private:
  using Clock = std::chrono::steady_clock;

  Progress mode_;
  std::FILE* out_;
  std::int64_t log_every_, total_steps_;
  std::string metrics_path_;
  std::ofstream metrics_;
  tb::EventFile events_;
  bool tty_ = false, quiet_ = false;
  Clock::time_point start_, last_log_time_, last_draw_{}, rate_mark_time_;
  std::int64_t last_log_steps_ = 0, last_log_train_steps_ = 0;
  double steps_per_s_ = 0, train_steps_per_s_ = 0;
  std::int64_t rate_mark_steps_ = 0;
  double progress_rate_ = 0;
  std::int64_t last_plain_ = 0;
};

}  // namespace dqn
