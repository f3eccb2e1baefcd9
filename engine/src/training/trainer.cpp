/** @file trainer.cpp
 *  @brief The training loop: acting, replay, engine steps, evaluation, and the points where it
 *  writes metrics lines (through its RunLog) and checkpoints.
 */
#include "training/trainer.hpp"

#include <algorithm>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <limits>
#include <stdexcept>
#include <utility>

#include "pipeline/parse.hpp"
#include "core/safetensors.hpp"
#include "training/schedule.hpp"
#include "training/seeds.hpp"

namespace dqn {

namespace fs = std::filesystem;

void check_env_fits(const PipelineSpec& spec, const VecEnv& env) {
  const NetworkSpec& n = spec.network;
  const std::string where = "pipeline '" + spec.name + "': training.env " + env.label() + ": ";
  if (env.obs_dim() != n.state)
    throw std::invalid_argument(where + "observations have " + std::to_string(env.obs_dim()) +
                                " features but network.state is " + std::to_string(n.state) +
                                " (set network.state=" + std::to_string(env.obs_dim()) + ")");
  const std::vector<int> bins = env.branch_actions();
  if (int(bins.size()) != n.branches)
    throw std::invalid_argument(where + "the environment has " + std::to_string(bins.size()) +
                                " action branches but network.branches is " + std::to_string(n.branches));
  for (std::size_t d = 0; d < bins.size(); ++d)
    if (bins[d] != n.actions)
      throw std::invalid_argument(where + "branch " + std::to_string(d) + " has " + std::to_string(bins[d]) +
                                  " actions but network.actions is " + std::to_string(n.actions));
}

namespace {

/// The training environment, checked against the network before anything large is allocated.
std::unique_ptr<VecEnv> make_training_env(const PipelineSpec& spec, const PluginLoader* plugins) {
  std::unique_ptr<VecEnv> env =
      make_env(spec.training.env, spec.training.num_envs, spec.seed, spec.training.env_threads, plugins);
  check_env_fits(spec, *env);
  return env;
}

}  // namespace

double epsilon_at(const EpsilonSpec& e, std::int64_t env_step) {
  return linear_schedule(e.start, e.end, e.decay_steps, env_step);
}

double beta_at(const TrainingSpec& t, std::int64_t env_step) {
  return linear_schedule(t.replay.beta_start, t.replay.beta_end, t.total_steps, env_step);
}

EngineReplay training_replay(const PipelineSpec& spec) {
  EngineReplay r;
  r.spec = spec.training.replay;
  r.beta_steps = spec.training.total_steps;
  r.staging_rows = std::max(1, spec.training.num_envs) * std::max(1, spec.n_step);
  return r;
}

// ---------------------------------------------------------------------------------------------
// Trainer

Trainer::Trainer(Engine& engine, TrainerOptions opt)
    : engine_(engine),
      spec_(engine.spec()),
      opt_(std::move(opt)),
      multi_(opt_.ranks && opt_.ranks->ranks() > 1),
      writer_(!multi_ || opt_.rank == 0),
      offline_(opt_.offline != nullptr),
      env_(offline_ ? nullptr : make_training_env(spec_, opt_.plugins)),
      eval_env_(spec_.training.env.none() || spec_.training.eval.every == 0  // none, or evaluation off
                    ? nullptr
                    : make_env(spec_.training.env, spec_.training.eval.episodes, derive_seed(spec_.seed, kEvalStream),
                               spec_.training.env_threads, opt_.plugins)),
      nstep_(spec_.network.state, spec_.network.branches, spec_.n_step, spec_.gamma, spec_.training.num_envs),
      N_(spec_.training.num_envs),
      S_(spec_.network.state),
      D_(spec_.network.branches),
      act_rng_(derive_seed(engine.parallel().seed(), kActStream)),
      log_(opt_.progress, opt_.progress_out, opt_.log_every, spec_.training.total_steps) {
  if (!engine_.has_replay() || (!offline_ && engine_.replay().staging_rows() < nstep_.max_per_step()))
    throw std::invalid_argument("trainer: the engine needs the training replay (EngineOptions::replay = "
                                "training_replay(spec)): its step draws the batch from it");
  if (offline_ != !spec_.training.dataset.empty())
    throw std::invalid_argument("trainer: training.dataset is " +
                                (spec_.training.dataset.empty() ? std::string("not set") : "'" + spec_.training.dataset + "'") +
                                " but the options " + (offline_ ? "bring" : "bring no") + " offline transitions");
  if (eval_env_) check_env_fits(spec_, *eval_env_);
  if (env_) branch_actions_ = env_->branch_actions();
  if (opt_.log_every < 1) throw std::invalid_argument("trainer: log_every must be at least 1");
  // The stopping rules an evaluation applies (as run() does), worded once for the progress line.
  const TrainingSpec& t = spec_.training;
  char rule[64];
  if (eval_env_ && t.stop_at_return != 0.0) {
    std::snprintf(rule, sizeof rule, "eval ≥ %g", t.stop_at_return);
    stop_rule_ = rule;
  }
  if (eval_env_ && t.stop_at_success > 0.0) {
    std::snprintf(rule, sizeof rule, "eval success ≥ %g", t.stop_at_success);
    stop_rule_ += (stop_rule_.empty() ? "" : " or ") + std::string(rule);
  }
  const auto n = std::size_t(N_), s = std::size_t(S_);
  obs_.resize(n * s);
  next_obs_.resize(n * s);
  final_obs_.resize(n * s);
  rewards_.resize(n);
  ep_return_.assign(n, 0.0f);
  terminated_.resize(n);
  truncated_.resize(n);
  actions_.resize(n * std::size_t(D_));
}

std::int64_t Trainer::replay_size() const {
  return offline_ ? engine_.replay().added() : std::min(engine_.replay().added(), spec_.training.replay.capacity);
}

Trainer::~Trainer() = default;

std::string Trainer::default_run_dir(const std::string& runs_root, const std::string& name) {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
  const fs::path base = fs::path(runs_root) / (name + "-" + stamp);
  fs::path p = base;
  for (int k = 2; fs::exists(p); ++k) p = base.string() + "-" + std::to_string(k);
  return p.string();
}

void Trainer::act(bool random_only) {
  const double eps = epsilon();
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  bool any_greedy = false;
  for (int e = 0; e < N_; ++e) {
    const bool explore = random_only || coin(act_rng_) < eps;
    terminated_[std::size_t(e)] = explore ? 1 : 0;  // scratch: explore flag until env_->step
    any_greedy = any_greedy || !explore;
  }
  // From the acting snapshot: waits for the act step only, never for the learner's queue.
  if (any_greedy) engine_.actor().act_snapshot(obs_.data(), N_, actions_.data());
  for (int e = 0; e < N_; ++e) {
    if (!terminated_[std::size_t(e)]) continue;
    for (int d = 0; d < D_; ++d) {
      std::uniform_int_distribution<int> pick(0, branch_actions_[std::size_t(d)] - 1);
      actions_[std::size_t(e) * std::size_t(D_) + std::size_t(d)] = pick(act_rng_);
    }
  }
  env_->step(actions_.data(), next_obs_.data(), rewards_.data(), terminated_.data(), truncated_.data(),
             final_obs_.data());
  fresh_.clear();
  nstep_.add(obs_.data(), actions_.data(), rewards_.data(), final_obs_.data(), terminated_.data(), truncated_.data(),
             fresh_);
  // Into the engine's replay without waiting for the step (β's schedule reads the env step).
  if (fresh_.size() > 0) engine_.replay().add(fresh_.view(), env_steps_ + N_);
  for (int e = 0; e < N_; ++e) {
    const auto ue = std::size_t(e);
    ep_return_[ue] += rewards_[ue];
    if (terminated_[ue] || truncated_[ue]) {
      if (recent_returns_.size() < std::size_t(kReturnWindow))
        recent_returns_.push_back(ep_return_[ue]);
      else
        recent_returns_[recent_next_] = ep_return_[ue];
      recent_next_ = (recent_next_ + 1) % std::size_t(kReturnWindow);
      ++episodes_;
      ep_return_[ue] = 0.0f;
    }
  }
  obs_.swap(next_obs_);
  env_steps_ += N_;
}

void Trainer::train_once() {
  engine_.step();  // draws its batch from the replay and, prioritised, updates the priorities
  ++train_steps_;
}

EvalResult Trainer::evaluate(std::int64_t round) {
  EvalOptions o;
  o.seed = derive_seed(spec_.seed, kEvalStream, std::uint64_t(round));
  o.stop = [this] { return stop_requested(); };
  return evaluate_policy(engine_.actor(), *eval_env_, o);
}

void Trainer::save_weights(const std::string& file) {
  if (!writer_) return;
  st::File f = dqn::save_weights(engine_, false);
  f.metadata["env_steps"] = std::to_string(env_steps_);
  if (offline_) f.metadata["dataset"] = spec_.training.dataset;
  f.metadata["train_steps"] = std::to_string(train_steps_);
  if (last_eval_) f.metadata["eval_return"] = std::to_string(*last_eval_);
  st::write_file((fs::path(run_dir_) / file).string(), f);
}

void Trainer::save_weights_noted(const std::string& file, TrainResult& res) {
  try {
    save_weights(file);
  } catch (const std::exception& e) {
    res.write_errors.push_back(e.what());
    log_.note(std::string("warning: the run goes on without it: ") + e.what());
  }
}

void Trainer::write_metrics(const std::optional<EvalResult>& eval, bool final_line) {
  MetricsValues v;
  v.step = clock();
  v.train_steps = train_steps_;
  // Over several devices: every rank's environment steps, episodes and recent returns.
  double recent = 0;
  for (double x : recent_returns_) recent += x;
  const std::vector<double> all =
      multi_ ? opt_.ranks->host_sum(opt_.rank, {double(env_steps_), double(episodes_), recent, double(recent_returns_.size())})
             : std::vector<double>{double(env_steps_), double(episodes_), recent, double(recent_returns_.size())};
  if (multi_) {
    v.ranks = opt_.ranks->ranks();
    v.env_steps_all_ranks = std::int64_t(all[0]);
  }
  v.episodes = std::int64_t(all[1]);
  if (all[3] != 0) v.episode_return = all[2] / all[3];
  v.eval = eval;
  if (!offline_) v.epsilon = epsilon();
  if (spec_.training.replay.prioritized) v.beta = offline_ ? spec_.training.replay.beta_end : beta_at(spec_.training, env_steps_);
  // The newest report that has landed (copied every report_every steps, read a report late):
  // reading it never waits for the learner; before the first one lands the line has nulls.
  if (train_steps_ > 0 && final_line) {
    last_report_ = engine_.read_report();  // the run is over: the last step's own report
  } else if (train_steps_ > 0) {
    if (std::optional<StepReport> r = engine_.latest_report()) last_report_ = std::move(r);
  }
  v.heads = engine_.head_names();
  if (const std::optional<StepReport>& rep = last_report_) {
    v.report = MetricsValues::Report{};
    MetricsValues::Report& r = *v.report;
    for (std::size_t h = 0; h < rep->heads.size(); ++h)
      r.heads.push_back({rep->heads[h], rep->losses[h], rep->grad_norms[h], rep->clips[h]});
    r.total_loss = rep->total_loss;
    r.skipped_steps = rep->skipped_steps;
    if (rep->replay && spec_.training.replay.prioritized) v.max_priority = rep->replay->max_priority;
  }
  v.replay_size = replay_size();
  if (env_) v.unstable_episodes = env_->unstable_episodes();
  v.final_line = final_line;
  v.interrupted = final_line && stop_requested();
  log_.metrics_line(v);
  if (opt_.after_metrics_line) opt_.after_metrics_line(*this);
}

ProgressValues Trainer::progress_values() const {
  ProgressValues p;
  p.clock = clock();
  p.last_eval = last_eval_;
  p.best_eval = best_eval_;
  p.offline = offline_;
  p.epsilon = offline_ ? 0.0 : epsilon();
  if (!recent_returns_.empty()) {
    double sum = 0;
    for (double x : recent_returns_) sum += x;
    p.episode_return = sum / double(recent_returns_.size());
  }
  if (last_report_) p.loss = last_report_->total_loss;
  p.stop_rule = stop_rule_;
  return p;
}

TrainResult Trainer::run() {
  const TrainingSpec& t = spec_.training;
  log_.start();
  checkpoint_time_ = std::chrono::steady_clock::now();
  pipeline_text_ = opt_.pipeline_yaml.empty() ? to_yaml(spec_) : opt_.pipeline_yaml;
  TrainResult res;
  if (opt_.resume) {
    // Over several devices, this rank's part of the checkpoint (every rank's state is in it).
    const std::optional<st::File> part = rank_part(*opt_.resume);
    const st::File& ck = part ? *part : *opt_.resume;
    // Everything restored in memory, on every rank, before the run directory is touched: a
    // checkpoint that cannot be resumed leaves the directory as it was.
    restore(ck);
    if (multi_) opt_.ranks->host_sum(opt_.rank, {0.0});
    if (writer_) open_resumed_run(ck);
  } else {
    if (writer_) open_new_run();
    if (offline_) {
      // The whole dataset into the replay once, β at beta_end (its schedule counts environment steps).
      const TransitionBatch& d = *opt_.offline;
      const std::int64_t K = engine_.replay().staging_rows();
      for (std::int64_t first = 0; first < d.size(); first += K) {
        const std::int64_t n = std::min(K, d.size() - first);
        const auto S = std::size_t(S_), D = std::size_t(D_), f = std::size_t(first);
        engine_.replay().add(Transitions{n, d.states.data() + f * S, d.next_states.data() + f * S,
                                            d.actions.data() + f * D, d.rewards.data() + f, d.dones.data() + f},
                                t.total_steps);
      }
    } else {
      env_->reset(engine_.parallel().seed(), obs_.data());
    }
    loop_ = Loop{};
    loop_.next_train_at = std::max<std::int64_t>(t.learning_starts, t.train_every);
    loop_.next_eval_at = t.eval.every;
    loop_.next_log_at = opt_.log_every;
    loop_.next_checkpoint_at = t.checkpoint_every > 0 ? t.checkpoint_every : std::numeric_limits<std::int64_t>::max();
  }
  std::optional<EvalResult> pending;
  const std::int64_t B = spec_.batch;

  auto record_eval = [&](const EvalResult& ev) {
    last_eval_ = ev.mean;
    last_success_ = ev.success;
    loop_.last_eval_step = clock();
    save_weights_noted("weights.safetensors", res);
    if (!best_eval_ || ev.mean > *best_eval_) {
      best_eval_ = ev.mean;
      best_eval_step_ = clock();
      save_weights_noted("best.safetensors", res);
    }
    if (t.stop_at_return != 0.0 && ev.mean >= t.stop_at_return) res.solved = true;
    if (t.stop_at_success > 0.0 && ev.success && *ev.success >= t.stop_at_success) res.solved = true;
  };

  // A checkpoint taken while an evaluation was cut short resumes with that evaluation.
  bool finish_iteration = opt_.resume && !loop_.iteration_done;
  while (true) {
    if (!finish_iteration) {
      // Several devices: every rank stops at the same iteration (each rank's steps wait for the
      // others' in the all-reduce).
      const bool due = t.checkpoint_every > 0 && t.checkpoint_minutes > 0 &&
                       std::chrono::steady_clock::now() - checkpoint_time_ >=
                           std::chrono::duration<double>(60.0 * t.checkpoint_minutes);
      checkpoint_due_ = due;
      if (multi_) {
        const std::vector<double> agreed =
            opt_.ranks->host_sum(opt_.rank, {stop_.load() ? 1.0 : 0.0, due ? 1.0 : 0.0});
        agreed_stop_ = agreed[0] > 0;
        checkpoint_due_ = agreed[1] > 0;
      }
      if (clock() >= t.total_steps || stop_requested()) break;
      if (offline_) {
        train_once();
      } else if (act(env_steps_ < t.learning_starts); env_steps_ >= t.learning_starts && replay_size() >= B) {
        for (; loop_.next_train_at <= env_steps_; loop_.next_train_at += t.train_every)
          for (int g = 0; g < t.gradient_steps; ++g) train_once();
        // The acting snapshot follows the learner on the device (taken up once its copy has run).
        if (train_steps_ - refreshed_at_ >= t.act_refresh) {
          engine_.actor().refresh_snapshot();
          refreshed_at_ = train_steps_;
        }
      } else {
        loop_.next_train_at = std::max(loop_.next_train_at, env_steps_ + t.train_every);
      }
    }
    finish_iteration = false;
    std::optional<EvalResult> ev;
    if (eval_env_ && clock() >= loop_.next_eval_at) {
      const std::int64_t due = loop_.next_eval_at;
      while (loop_.next_eval_at <= clock()) loop_.next_eval_at += t.eval.every;
      EvalResult r = evaluate(loop_.eval_round++);
      if (!r.complete) {  // a stop cut it short: the stop's checkpoint leaves it to do
        loop_.next_eval_at = due;
        --loop_.eval_round;
        loop_.iteration_done = false;
        break;
      }
      record_eval(r);
      ev = r;
    }
    loop_.iteration_done = true;
    const bool log_now = clock() >= loop_.next_log_at;
    while (loop_.next_log_at <= clock()) loop_.next_log_at += opt_.log_every;
    const bool last = res.solved || clock() >= t.total_steps;
    if (ev && last) {  // the final line below carries this evaluation
      pending = ev;
      break;
    }
    if ((ev || log_now) && !last) write_metrics(ev, false);  // else the final line follows
    if (!last && (clock() >= loop_.next_checkpoint_at || checkpoint_due_)) {
      while (loop_.next_checkpoint_at <= clock()) loop_.next_checkpoint_at += t.checkpoint_every;
      save_checkpoint(res);
      checkpoint_due_ = false;
    }
    if (writer_) log_.progress(progress_values(), ev.has_value(), false);
  }
  // Stopped before the end: a checkpoint to resume from (unless this very state has one).
  if (stop_requested() && !res.solved && clock() < t.total_steps && t.checkpoint_every > 0 &&
      (checkpoint_clock_ != clock() || !loop_.iteration_done))
    save_checkpoint(res);

  // The end: a last evaluation unless one just ran or a stop was asked for, then the weights.
  std::optional<EvalResult> line_eval = pending;
  if (!line_eval && eval_env_ && loop_.last_eval_step != clock() && !stop_requested()) {
    EvalResult r = evaluate(loop_.eval_round++);
    if (r.complete) {
      record_eval(r);
      line_eval = r;
    }
  }
  // The final weights, and the final line even when they cannot be written.
  std::string weights_error;
  try {
    save_weights("weights.safetensors");
  } catch (const std::exception& e) {
    weights_error = e.what();
  }
  write_metrics(line_eval, true);
  if (writer_) log_.progress(progress_values(), true, true);
  log_.close();
  if (!weights_error.empty()) throw std::runtime_error("the final weights could not be written: " + weights_error);

  res.run_dir = run_dir_;
  res.env_steps = env_steps_;
  res.train_steps = train_steps_;
  res.episodes = episodes_;
  res.env_steps_all_ranks = env_steps_;
  if (multi_) {
    const auto all = opt_.ranks->host_sum(opt_.rank, {double(env_steps_), double(episodes_)});
    res.env_steps_all_ranks = std::int64_t(all[0]);
    res.episodes = std::int64_t(all[1]);
    res.ranks = opt_.ranks->ranks();
  }
  res.final_eval = loop_.last_eval_step == clock() ? last_eval_ : std::nullopt;
  res.final_success = loop_.last_eval_step == clock() ? last_success_ : std::nullopt;
  res.last_eval = last_eval_;
  res.last_eval_step = loop_.last_eval_step;
  res.best_eval = best_eval_;
  res.best_eval_step = best_eval_step_;
  res.interrupted = stop_requested();
  res.wall_s = log_.wall_s();
  if (train_steps_ > 0) res.skipped_steps = engine_.read_report().skipped_steps;
  return res;
}

}  // namespace dqn
