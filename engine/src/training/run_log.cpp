/** @file run_log.cpp
 *  @brief metrics.jsonl's lines, the progress line and messages of a training run.
 */
#include "training/run_log.hpp"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace dqn {

namespace {

std::string fmt_duration(double s) {
  if (!(s >= 0) || !std::isfinite(s)) return "?";
  const long t = long(s + 0.5);
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%ld:%02ld", t / 60, t % 60);
  return buf;
}

}  // namespace

RunLog::RunLog(Progress progress, std::FILE* out, std::int64_t log_every, std::int64_t total_steps)
    : mode_(progress), out_(out), log_every_(log_every), total_steps_(total_steps) {}

void RunLog::start() {
  start_ = last_log_time_ = rate_mark_time_ = Clock::now();
  quiet_ = mode_ == Progress::none || !out_;
  tty_ = !quiet_ && (mode_ == Progress::tty || (mode_ == Progress::automatic && isatty(fileno(out_))));
}

void RunLog::resume(double wall_s, const Marks& marks) {
  last_log_steps_ = marks.last_log_steps;
  last_log_train_steps_ = marks.last_log_train_steps;
  last_plain_ = marks.last_plain;
  start_ = Clock::now() - std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(wall_s));
}

double RunLog::wall_s() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

void RunLog::open(const std::string& run_dir, bool append, const std::string& events_name,
                  std::int64_t events_bytes) {
  metrics_path_ = (std::filesystem::path(run_dir) / kMetricsFile).string();
  metrics_.open(metrics_path_, std::ios::binary | (append ? std::ios::app : std::ios::trunc));
  if (!metrics_) throw std::runtime_error("cannot open '" + metrics_path_ + "' for writing");
  events_.open(run_dir, append ? events_name : std::string(), events_bytes);
}

void RunLog::metrics_line(const MetricsValues& v) {
  using json = nlohmann::ordered_json;
  const double wall = wall_s();
  const double dt = std::chrono::duration<double>(Clock::now() - last_log_time_).count();
  if (dt > 0 && v.step > last_log_steps_) steps_per_s_ = double(v.step - last_log_steps_) / dt;
  if (dt > 0) train_steps_per_s_ = double(v.train_steps - last_log_train_steps_) / dt;
  last_log_time_ = Clock::now();
  last_log_steps_ = v.step;
  last_log_train_steps_ = v.train_steps;
  if (!metrics_.is_open()) return;  // another rank writes the run directory

  json j;
  j["step"] = v.step;
  j["train_steps"] = v.train_steps;
  if (v.ranks) {
    j["ranks"] = *v.ranks;
    j["env_steps_all_ranks"] = v.env_steps_all_ranks;
  }
  j["episodes"] = v.episodes;
  if (v.episode_return) {
    j["episode_return"] = *v.episode_return;
  } else {
    j["episode_return"] = nullptr;
  }
  if (v.eval) {
    j["eval_return"] = v.eval->mean;
    j["eval_min"] = v.eval->min;
    j["eval_max"] = v.eval->max;
    j["eval_episodes"] = v.eval->episodes;
    if (v.eval->success) j["eval_success"] = *v.eval->success;
    j["eval_seed"] = v.eval->seed;
  }
  if (v.epsilon) j["epsilon"] = *v.epsilon;
  if (v.beta) j["beta"] = *v.beta;
  for (const std::string& h : v.heads) {
    j["loss." + h] = nullptr;
    j["grad_norm." + h] = nullptr;
    j["clip." + h] = nullptr;
  }
  j["total_loss"] = nullptr;
  j["skipped_steps"] = 0;
  if (v.report) {
    for (const MetricsValues::HeadReport& h : v.report->heads) {
      j["loss." + h.head] = h.loss;
      j["grad_norm." + h.head] = h.grad_norm;
      j["clip." + h.head] = h.clip;
    }
    j["total_loss"] = v.report->total_loss;
    j["skipped_steps"] = v.report->skipped_steps;
  }
  j["replay_size"] = v.replay_size;
  if (v.unstable_episodes) j["unstable_episodes"] = *v.unstable_episodes;
  if (v.max_priority) j["max_priority"] = *v.max_priority;
  j["steps_per_s"] = steps_per_s_;
  j["train_steps_per_s"] = train_steps_per_s_;  // since the line before (the step's throughput in the loop)
  j["wall_s"] = wall;
  if (v.final_line) {
    j["final"] = true;
    if (v.interrupted) j["interrupted"] = true;
  }
  metrics_ << j.dump() << '\n';
  metrics_.flush();
  if (!metrics_) throw std::runtime_error("cannot write '" + metrics_path_ + "'");
  std::vector<std::pair<std::string, float>> scalars;
  for (const auto& [k, x] : j.items()) {
    if (!x.is_number() || k == "step" || k == "eval_seed") continue;
    std::string tag = k;
    if (const auto dot = tag.find('.'); dot != std::string::npos) tag[dot] = '/';  // loss.c51 → loss/c51
    scalars.emplace_back(std::move(tag), x.get<float>());
  }
  events_.scalars(v.step, scalars);
}

void RunLog::progress(const ProgressValues& v, bool force_plain, bool final_line) {
  if (quiet_) return;
  const Clock::time_point now = Clock::now();
  // On a terminal, redraw at most five times a second (and always for an evaluation or the end).
  if (tty_ && !force_plain && !final_line && now - last_draw_ < std::chrono::milliseconds(200)) return;
  last_draw_ = now;
  const double wall = wall_s();
  // Clock steps per second over the last second or more (the random-action warm-up is far faster
  // than training, so an average since the start would promise too early an end).
  const double since_mark = std::chrono::duration<double>(now - rate_mark_time_).count();
  if (since_mark >= 1.0 || progress_rate_ <= 0) {
    if (since_mark > 0 && v.clock > rate_mark_steps_) progress_rate_ = double(v.clock - rate_mark_steps_) / since_mark;
    rate_mark_time_ = now;
    rate_mark_steps_ = v.clock;
  }
  const double rate = progress_rate_ > 0 ? progress_rate_ : (wall > 0 ? double(v.clock) / wall : 0);
  char eval[64] = "-", ret[32] = "-", loss[32] = "-", eps[32] = "";
  if (v.last_eval) std::snprintf(eval, sizeof eval, "%.1f (best %.1f)", *v.last_eval, v.best_eval.value_or(*v.last_eval));
  if (v.episode_return) std::snprintf(ret, sizeof ret, "%.1f", *v.episode_return);
  if (v.loss) std::snprintf(loss, sizeof loss, "%.4g", *v.loss);
  if (!v.offline) std::snprintf(eps, sizeof eps, "  eps %.3f", v.epsilon);
  const std::string end =
      final_line ? "wall " + fmt_duration(wall)
                 : "ETA " + fmt_duration(rate > 0 ? double(total_steps_ - v.clock) / rate : -1) +
                       (v.stop_rule.empty() ? "" : " (sooner at " + std::string(v.stop_rule) + ")");
  char line[320];
  std::snprintf(line, sizeof line, "step %lld/%lld  return %s  loss %s  eval %s%s  %.0f steps/s  %s",
                static_cast<long long>(v.clock), static_cast<long long>(total_steps_), ret, loss, eval, eps, rate,
                end.c_str());
  if (tty_) {
    std::fprintf(out_, "\r\033[K%s%s", line, final_line ? "\n" : "");
    std::fflush(out_);
  } else if (force_plain || final_line || v.clock - last_plain_ >= 10 * log_every_) {
    std::fprintf(out_, "%s\n", line);
    std::fflush(out_);
    last_plain_ = v.clock;
  }
}

void RunLog::note(const std::string& text) const {
  if (!out_) return;
  std::fprintf(out_, "%s%s\n", tty_ ? "\r\033[K" : "", text.c_str());
  std::fflush(out_);
}

}  // namespace dqn
