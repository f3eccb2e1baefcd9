/** @file trainer_state.cpp
 *  @brief The trainer's run directory and saved state: a new run's directory (never over another
 *  run), checkpoints of everything the loop depends on, and a resumed run that continues from one.
 */
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "training/checkpoint.hpp"
#include "training/trainer.hpp"

namespace dqn {

namespace fs = std::filesystem;

namespace {

constexpr const char* kMetrics = RunLog::kMetricsFile;
constexpr const char* kPipeline = "pipeline.yaml";

void write_text_atomic(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << text;
    f.flush();
    if (!f) throw std::runtime_error("cannot write '" + tmp.string() + "'");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw std::runtime_error("cannot rename '" + tmp.string() + "' to '" + path.string() + "': " + ec.message());
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read '" + path.string() + "'");
  return std::string(std::istreambuf_iterator<char>(in), {});
}

/// The last non-empty line of a text.
std::string last_line(const std::string& text) {
  std::size_t end = text.find_last_not_of('\n');
  if (end == std::string::npos) return {};
  const std::size_t begin = text.rfind('\n', end);
  return text.substr(begin == std::string::npos ? 0 : begin + 1, end - (begin == std::string::npos ? 0 : begin + 1) + 1);
}

}  // namespace

std::optional<std::int64_t> finished_at(const std::string& metrics_text) {
  const std::string last = last_line(metrics_text);
  if (last.empty()) return std::nullopt;
  const nlohmann::json j = nlohmann::json::parse(last, nullptr, false);
  if (!j.is_object() || !j.value("final", false) || j.value("interrupted", false)) return std::nullopt;
  return j.value("step", std::int64_t(0));
}

void Trainer::open_new_run() {
  const TrainingSpec& t = spec_.training;
  const std::string dir = !opt_.run_dir.empty() ? opt_.run_dir
                         : !t.out_dir.empty()  ? t.out_dir
                                               : default_run_dir(opt_.runs_root, spec_.name);
  std::error_code ec;
  // A run never writes over another: a directory that holds anything is refused before a byte
  // is written (an empty one, or none, is fine).
  if (fs::exists(dir, ec) && !(fs::is_directory(dir, ec) && fs::is_empty(dir, ec))) {
    const bool is_dir = fs::is_directory(dir, ec);
    std::string what = is_dir ? "a directory that is not empty" : "a file";
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      what += " (it holds " + e.path().filename().string() + (fs::is_directory(e.path(), ec) ? "/" : "") + ", …)";
      break;
    }
    const bool a_run = is_dir && fs::exists(fs::path(dir) / kPipeline, ec);
    throw std::invalid_argument("the run directory '" + dir + "' is " + what +
                             ": a run never writes over another; " +
                             (a_run ? "to continue that run, `dqn train --resume " + dir + "`; to start another, " : "") +
                             "choose another --out (or training.out_dir), or remove it");
  }
  run_dir_ = dir;
  fs::create_directories(run_dir_, ec);
  if (ec) throw std::runtime_error("cannot create the run directory '" + run_dir_ + "': " + ec.message());
  write_text_atomic(fs::path(run_dir_) / kPipeline, pipeline_text_);
  log_.open(run_dir_, false);
}

void Trainer::open_resumed_run(const st::File& ck) {
  if (opt_.run_dir.empty()) throw std::invalid_argument("trainer: resuming needs the run directory (run_dir)");
  run_dir_ = opt_.run_dir;
  const fs::path dir(run_dir_);
  const std::string where = "cannot resume '" + run_dir_ + "': ";
  if (read_text(dir / kPipeline) != pipeline_text_)
    throw std::runtime_error(where + "its pipeline.yaml differs from the pipeline the run is resumed with");
  std::int64_t bytes = -1, events_bytes = 0;
  std::string events_file;  // (none in a checkpoint from before event files: a new one is started)
  try {
    const nlohmann::json t = nlohmann::json::parse(ck.metadata.at("trainer"));
    bytes = t.at("metrics_bytes").get<std::int64_t>();
    events_file = t.value("events_file", std::string());
    events_bytes = t.value("events_bytes", std::int64_t(0));
  } catch (const std::exception& e) {
    throw std::runtime_error(where + "checkpoint '" + ck.path + "': no metrics position (" + e.what() + ")");
  }
  const fs::path metrics_path = dir / kMetrics;
  const std::string text = fs::exists(metrics_path) ? read_text(metrics_path) : std::string();
  if (bytes < 0 || std::int64_t(text.size()) < bytes)
    throw std::runtime_error(where + kMetrics + " holds " + std::to_string(text.size()) +
                             " bytes but checkpoint '" + ck.path + "' was written after " + std::to_string(bytes) +
                             ": the metrics were cut or replaced since");
  if (finished_at(text))
    throw std::invalid_argument(where + "the run finished (the last line of " + kMetrics +
                                " is its final one, not an interrupted run's): there is nothing to resume");
  // The lines written after the checkpoint are what the resumed run writes again: kept aside.
  if (std::int64_t(text.size()) > bytes) {
    std::error_code ec;
    const std::string clock_text = ck.metadata.count("clock") ? ck.metadata.at("clock") : "?";
    fs::path aside = dir / ("metrics.after-step-" + clock_text + ".jsonl");
    for (int k = 2; fs::exists(aside, ec); ++k)
      aside = dir / ("metrics.after-step-" + clock_text + "-" + std::to_string(k) + ".jsonl");
    write_text_atomic(aside, text.substr(std::size_t(bytes)));
    fs::resize_file(metrics_path, std::uintmax_t(bytes), ec);
    if (ec) throw std::runtime_error(where + "cannot cut " + metrics_path.string() + " back: " + ec.message());
    log_.note("dqn train: the metrics lines written after the checkpoint are in " + aside.string());
  }
  if (events_file.find('/') != std::string::npos || (!events_file.empty() && events_file.rfind("events.out.tfevents.", 0) != 0))
    throw std::runtime_error(where + "checkpoint '" + ck.path + "' names the event file '" + events_file +
                             "', not one of the run directory's");
  log_.open(run_dir_, true, events_file, events_bytes);
}

namespace {
/// "rank.<r>/": where rank r's tensors and metadata are in a checkpoint over several devices.
std::string rank_prefix(int r) { return "rank." + std::to_string(r) + "/"; }
}  // namespace

void Trainer::save_checkpoint(TrainResult& res) {
  using json = nlohmann::json;
  checkpoint_time_ = std::chrono::steady_clock::now();  // (training.checkpoint_minutes counts from here)
  // This rank's state; over several devices every rank's goes into rank 0's file.
  struct Part {
    st::File file;
    std::string error;
  } mine;
  try {
    st::File& f = mine.file;
    engine_.checkpoint_to(f);
    const auto N = std::int64_t(N_), S = std::int64_t(S_);
    if (env_) {
      env_->save_state(f, "env/");
      nstep_.save_state(f, "nstep/");
      f.put_raw("trainer/obs", st::DType::F32, {N, S}, obs_.data());
      f.put_raw("trainer/episode_return", st::DType::F32, {N}, ep_return_.data());
    }
    f.put_raw("trainer/recent_returns", st::DType::F64, {std::int64_t(recent_returns_.size())}, recent_returns_.data());
    std::ostringstream rng;
    rng << act_rng_;
    json j;
    j["env_steps"] = env_steps_;
    j["train_steps"] = train_steps_;
    j["episodes"] = episodes_;
    j["refreshed_at"] = refreshed_at_;
    j["recent_next"] = recent_next_;
    j["last_eval"] = last_eval_ ? json(*last_eval_) : json(nullptr);
    j["best_eval"] = best_eval_ ? json(*best_eval_) : json(nullptr);
    j["best_eval_step"] = best_eval_step_;
    j["loop"] = {{"next_train_at", loop_.next_train_at},   {"next_eval_at", loop_.next_eval_at},
                 {"next_log_at", loop_.next_log_at},       {"next_checkpoint_at", loop_.next_checkpoint_at},
                 {"eval_round", loop_.eval_round},         {"last_eval_step", loop_.last_eval_step},
                 {"iteration_done", loop_.iteration_done}};
    j["act_rng"] = rng.str();
    j["wall_s"] = log_.wall_s();
    j["metrics_bytes"] = writer_ ? log_.metrics_bytes() : std::int64_t(0);
    j["events_file"] = writer_ ? log_.events_name() : std::string();
    j["events_bytes"] = writer_ ? log_.events_bytes() : std::int64_t(0);
    const RunLog::Marks marks = log_.marks();
    j["log"] = {marks.last_log_steps, marks.last_log_train_steps, marks.last_plain};
    f.metadata["trainer"] = j.dump();
  } catch (const std::exception& e) {
    mine.error = e.what();
  }
  auto write = [&](const std::vector<void*>& parts) {
    try {
      st::File& f = static_cast<Part*>(parts[0])->file;
      for (std::size_t r = 0; r < parts.size(); ++r)
        if (const std::string& why = static_cast<Part*>(parts[r])->error; !why.empty())
          throw std::runtime_error(parts.size() > 1 ? "rank " + std::to_string(r) + ": " + why : why);
      if (parts.size() > 1) {
        f.metadata[kRanksKey] = std::to_string(parts.size());
        for (std::size_t r = 1; r < parts.size(); ++r) {
          st::File& other = static_cast<Part*>(parts[r])->file;
          const std::string prefix = rank_prefix(int(r));
          for (auto& [name, t] : other.tensors) f.tensors[prefix + name] = std::move(t);
          for (auto& [key, value] : other.metadata) f.metadata[prefix + key] = value;
        }
      }
      res.checkpoint = checkpoint::write(run_dir_, clock(), pipeline_text_, std::move(f), spec_.training.checkpoint_keep);
      return true;
    } catch (const std::exception& e) {
      res.write_errors.push_back(e.what());
      log_.note(std::string("warning: no checkpoint at step ") + std::to_string(clock()) + ", the run goes on: " + e.what());
      return false;
    }
  };
  // Every rank learns whether it was written, so that all take the same path at the stop.
  if (multi_ ? opt_.ranks->host_gather(opt_.rank, &mine, write) : write({&mine})) checkpoint_clock_ = clock();
}

std::optional<st::File> Trainer::rank_part(const st::File& ck) const {
  const int ranks = multi_ ? opt_.ranks->ranks() : 1;
  int saved = 1;
  if (auto it = ck.metadata.find(kRanksKey); it != ck.metadata.end()) {
    try {
      saved = std::stoi(it->second);
    } catch (const std::exception&) {
      saved = -1;
    }
    if (saved < 2 || std::to_string(saved) != it->second)
      throw std::invalid_argument("checkpoint '" + ck.path + "': metadata '" + kRanksKey + "' = '" + it->second +
                                  "' is not a number of ranks (2 or more)");
  }
  if (saved != ranks)
    throw std::invalid_argument("checkpoint '" + ck.path + "' holds the state of " + std::to_string(saved) +
                                (saved == 1 ? " rank" : " ranks") + " (devices) but this run has " +
                                std::to_string(ranks) + ": resume it on as many devices");
  // Rank 0's state is under the file's own names (restoring reads those and nothing else).
  if (!multi_ || opt_.rank == 0) return std::nullopt;
  const std::string prefix = rank_prefix(opt_.rank);
  st::File part;
  part.path = ck.path;
  // The file's own metadata (its seal), rank r's own entries (its trainer state) over it.
  for (const auto& [key, value] : ck.metadata)
    if (key.rfind(prefix, 0) == 0)
      part.metadata[key.substr(prefix.size())] = value;
    else
      part.metadata.emplace(key, value);
  for (const auto& [name, t] : ck.tensors)
    if (name.rfind(prefix, 0) == 0) part.tensors[name.substr(prefix.size())] = t;
  if (part.tensors.empty() || !ck.metadata.count(prefix + "trainer"))
    throw std::invalid_argument("checkpoint '" + ck.path + "': no state of rank " + std::to_string(opt_.rank) +
                                " (tensors and metadata '" + prefix + "…')");
  return part;
}

void Trainer::restore(const st::File& ck) {
  using json = nlohmann::json;
  const std::string where = "checkpoint '" + ck.path + "': ";
  json j;
  try {
    j = json::parse(ck.metadata.at("trainer"));
  } catch (const std::exception& e) {
    throw std::invalid_argument(where + "no trainer state (" + e.what() + ")");
  }
  auto need = [&](bool ok, const std::string& what) {
    if (!ok) throw std::invalid_argument(where + "trainer state: " + what);
  };
  Loop loop;
  std::int64_t env_steps = 0, train_steps = 0, episodes = 0, refreshed_at = 0, best_step = -1, log[3] = {0, 0, 0};
  std::size_t recent_next = 0;
  std::optional<double> last_eval, best_eval;
  double wall = 0;
  std::mt19937_64 rng;
  try {
    env_steps = j.at("env_steps").get<std::int64_t>();
    train_steps = j.at("train_steps").get<std::int64_t>();
    episodes = j.at("episodes").get<std::int64_t>();
    refreshed_at = j.at("refreshed_at").get<std::int64_t>();
    recent_next = j.at("recent_next").get<std::size_t>();
    if (!j.at("last_eval").is_null()) last_eval = j["last_eval"].get<double>();
    if (!j.at("best_eval").is_null()) best_eval = j["best_eval"].get<double>();
    best_step = j.at("best_eval_step").get<std::int64_t>();
    const json& l = j.at("loop");
    loop.next_train_at = l.at("next_train_at").get<std::int64_t>();
    loop.next_eval_at = l.at("next_eval_at").get<std::int64_t>();
    loop.next_log_at = l.at("next_log_at").get<std::int64_t>();
    loop.next_checkpoint_at = l.at("next_checkpoint_at").get<std::int64_t>();
    loop.eval_round = l.at("eval_round").get<std::int64_t>();
    loop.last_eval_step = l.at("last_eval_step").get<std::int64_t>();
    loop.iteration_done = l.at("iteration_done").get<bool>();
    wall = j.at("wall_s").get<double>();
    for (int k = 0; k < 3; ++k) log[k] = j.at("log").at(std::size_t(k)).get<std::int64_t>();
    std::istringstream in(j.at("act_rng").get<std::string>());
    in >> rng;
    need(!in.fail(), "the acting generator's state is unreadable");
  } catch (const json::exception& e) {
    throw std::invalid_argument(where + "trainer state unreadable: " + e.what());
  }
  need(env_steps >= 0 && train_steps >= 0 && episodes >= 0 && refreshed_at >= 0 && refreshed_at <= train_steps,
       "negative or inconsistent step counters");
  need(offline_ || env_steps % std::max(1, N_) == 0, "env_steps is not a whole number of vector steps");
  need(std::isfinite(wall) && wall >= 0, "wall_s is not a time");
  need(loop.eval_round >= 0 && loop.next_log_at > 0 && loop.next_eval_at > 0 && loop.next_checkpoint_at > 0,
       "the loop's next-at counters are not positive");
  const st::Tensor& rr = ck.get("trainer/recent_returns");
  need(rr.shape.size() == 1 && rr.shape[0] <= kReturnWindow && recent_next < std::size_t(kReturnWindow),
       "the recent returns do not fit the window of " + std::to_string(kReturnWindow));
  std::vector<double> recent(std::size_t(rr.shape[0]));
  ck.get_raw("trainer/recent_returns", st::DType::F64, rr.shape, recent.data());
  std::vector<float> obs(obs_.size()), ep_return(ep_return_.size());
  if (env_) {
    ck.get_raw("trainer/obs", st::DType::F32, {std::int64_t(N_), std::int64_t(S_)}, obs.data());
    ck.get_raw("trainer/episode_return", st::DType::F32, {std::int64_t(N_)}, ep_return.data());
    for (float x : obs) need(std::isfinite(x), "a non-finite observation");
    nstep_.load_state(ck, "nstep/");
    env_->load_state(ck, "env/");
  }
  engine_.restore_checkpoint(ck);

  env_steps_ = env_steps;
  train_steps_ = train_steps;
  episodes_ = episodes;
  refreshed_at_ = refreshed_at;
  recent_returns_ = std::move(recent);
  recent_next_ = recent_next;
  last_eval_ = last_eval;
  best_eval_ = best_eval;
  best_eval_step_ = best_step;
  loop_ = loop;
  act_rng_ = rng;
  obs_ = std::move(obs);
  ep_return_ = std::move(ep_return);
  log_.resume(wall, RunLog::Marks{log[0], log[1], log[2]});
  checkpoint_clock_ = clock();
}

}  // namespace dqn
