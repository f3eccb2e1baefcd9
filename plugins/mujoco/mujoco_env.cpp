/** @file mujoco_env.cpp
 *  @brief The MuJoCo tasks' common part: options, model, copies, control steps, instability,
 *  saved state.
 */
#include "mujoco_env.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numbers>
#include <stdexcept>

namespace dqn_mujoco {
namespace {

constexpr int kStartTries = 10000;  // dm_control draws forever; a model that never fits is an error
constexpr std::int64_t kMaxBins = 1001;
constexpr std::int64_t kMaxEpisodeSteps = 100'000'000;
// The warnings MuJoCo raises (and then resets the mjData) when qpos, qvel or qacc go bad.
constexpr int kUnstableWarnings[] = {mjWARN_BADQPOS, mjWARN_BADQVEL, mjWARN_BADQACC};

bool warned(const mjData* d) {
  for (int w : kUnstableWarnings)
    if (d->warning[w].number > 0) return true;
  return false;
}

// mju_isBad: NaN, or beyond MuJoCo's largest sane value (mjMAXVAL, 1e10).
bool all_sane(const mjtNum* x, int n) {
  for (int i = 0; i < n; ++i)
    if (mju_isBad(x[i])) return false;
  return true;
}

// A standard normal draw (Box-Muller) from the copy's stream.
double normal(std::uint64_t& rng) {
  const double u1 = 1.0 - dqn::env_rng::uniform(rng, 0.0, 1.0);  // (0, 1]
  const double u2 = dqn::env_rng::uniform(rng, 0.0, 1.0);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

// Scales to unit length; a zero vector (which the draws all but never give) becomes (1, 0, ...).
void normalise(double* q, int n) {
  double s = 0.0;
  for (int i = 0; i < n; ++i) s += q[i] * q[i];
  s = std::sqrt(s);
  if (!(s > 0.0)) {
    q[0] = 1.0;
    for (int i = 1; i < n; ++i) q[i] = 0.0;
    return;
  }
  for (int i = 0; i < n; ++i) q[i] /= s;
}

}  // namespace

std::string text(double x) {
  char buf[32];
  for (int digits = 6; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, x);
    if (std::strtod(buf, nullptr) == x) break;
  }
  return buf;
}

MujocoEnv::MujocoEnv(const dqn::EnvCreateInfo& info, const std::string& model_if_empty) : EnvBase(info) {
  model_path_ = options().text("model");
  if (model_path_.empty()) model_path_ = model_if_empty;
  if (model_path_.empty()) throw bad_option("model", "\"\"", "the path of an MJCF file is needed");
  const std::int64_t bins = options().integer("bins");
  if (bins < 2 || bins > kMaxBins)
    throw bad_option("bins", std::to_string(bins),
                     "sub-actions per actuator must be from 2 to " + std::to_string(kMaxBins) +
                         " (the ends of the actuator's ctrlrange and the controls evenly between)");
  bins_ = static_cast<std::int32_t>(bins);
  episode_steps_ = options().integer("episode_steps");
  if (episode_steps_ < 1 || episode_steps_ > kMaxEpisodeSteps)
    throw bad_option("episode_steps", std::to_string(episode_steps_),
                     "the control steps before an episode is truncated must be from 1 to " + std::to_string(kMaxEpisodeSteps));
  const double control_dt = number_option("control_timestep", 0.0, 1e6, true, "seconds of simulated time per control step");

  model_ = load_model(task(), model_path_);
  const mjModel* m = model_.get();
  const std::string where = "the MuJoCo model '" + model_path_ + "'";
  const double ratio = control_dt / m->opt.timestep;
  substeps_ = static_cast<int>(std::llround(ratio));
  if (substeps_ < 1 || std::fabs(ratio - substeps_) > 1e-9 * ratio || ratio > 1e6)
    throw bad_option("control_timestep", text(control_dt),
                     "it must be a whole number of the physics timestep " + text(m->opt.timestep) + " of " + where);
  step2_first_ = m->opt.integrator != mjINT_RK4;
  if (m->nv < 1) throw std::invalid_argument(task() + ": " + where + " has no degrees of freedom");
  if (m->nu < 1) throw std::invalid_argument(task() + ": " + where + " has no actuators to act through");
  for (int i = 0; i < m->nu; ++i) {
    const char* name = mj_id2name(m, mjOBJ_ACTUATOR, i);
    actuator_names_.push_back(name && *name ? name : "actuator " + std::to_string(i));
  }
  for (int i = 0; i < m->nu; ++i) {
    const double lo = m->actuator_ctrlrange[2 * i], hi = m->actuator_ctrlrange[2 * i + 1];
    if (!m->actuator_ctrllimited[i] || !(lo < hi))
      throw std::invalid_argument(task() + ": actuator '" + actuator_names_[i] + "' of " + where +
                                  " has no control range; give it ctrllimited=\"true\" and ctrlrange=\"lo hi\" "
                                  "with lo < hi (the bins divide that range)");
    branches_.push_back(dqn::EnvBranch{bins_, 1, lo, hi, actuator_names_[i].c_str()});
  }
  copies_.resize(static_cast<std::size_t>(num_envs()));
  try {
    for (Copy& k : copies_) {
      k.data.reset(mj_makeData(m));
      if (!k.data) throw MujocoError("mj_makeData returned nothing");
    }
  } catch (const MujocoError& e) {
    throw std::runtime_error(task() + ": cannot allocate " + std::to_string(num_envs()) + " copies of " + where +
                             ": " + e.what());
  }
}

int MujocoEnv::find(int type, const char* kind, const char* name) const {
  const int id = mj_name2id(model_.get(), type, name);
  if (id < 0)
    throw std::invalid_argument(task() + ": the MuJoCo model '" + model_path_ + "' has no " + kind + " named '" +
                                name + "', which the task reads (option 'model')");
  return id;
}

std::invalid_argument MujocoEnv::bad_option(const std::string& key, const std::string& value,
                                            const std::string& why) const {
  return std::invalid_argument(task() + ": option '" + key + "' = " + value + ": " + why);
}

double MujocoEnv::number_option(const char* key, double lo, double hi, bool lo_open, const char* what) const {
  const double v = options().number(key);
  const bool ok = std::isfinite(v) && (lo_open ? v > lo : v >= lo) && v <= hi;
  if (!ok)
    throw bad_option(key, text(v), std::string(what) + " must be " + (lo_open ? "above " : "at least ") + text(lo) +
                                       " and at most " + text(hi));
  return v;
}

void MujocoEnv::randomize_joints(Copy& k) const {
  const mjModel* m = model_.get();
  mjData* d = k.data.get();
  constexpr double pi = std::numbers::pi;
  for (int j = 0; j < m->njnt; ++j) {
    double* q = d->qpos + m->jnt_qposadr[j];
    const double lo = m->jnt_range[2 * j], hi = m->jnt_range[2 * j + 1];
    const bool limited = m->jnt_limited[j] != 0;
    switch (m->jnt_type[j]) {
      case mjJNT_HINGE:
      case mjJNT_SLIDE:
        if (limited) q[0] = dqn::env_rng::uniform(k.rng, lo, hi);
        else if (m->jnt_type[j] == mjJNT_HINGE) q[0] = dqn::env_rng::uniform(k.rng, -pi, pi);
        break;
      case mjJNT_BALL:
        if (limited) {  // a random axis, an angle up to the limit
          double axis[3] = {normal(k.rng), normal(k.rng), normal(k.rng)};
          normalise(axis, 3);
          mju_axisAngle2Quat(q, axis, dqn::env_rng::uniform(k.rng, 0.0, 1.0) * hi);
        } else {
          for (int i = 0; i < 4; ++i) q[i] = normal(k.rng);
          normalise(q, 4);
        }
        break;
      case mjJNT_FREE:  // the position stays; the orientation from four uniforms in [0, 1), as dm_control does
        for (int i = 3; i < 7; ++i) q[i] = dqn::env_rng::uniform(k.rng, 0.0, 1.0);
        normalise(q + 3, 4);
        break;
      default:
        break;
    }
  }
}

void MujocoEnv::finish(int obs_dim, int task_dim, bool reports_success, std::uint64_t seed) {
  set_spec(obs_dim, branches_, static_cast<int>(episode_steps_), reports_success);
  task_dim_ = task_dim;
  for (Copy& k : copies_) k.task.assign(static_cast<std::size_t>(task_dim), 0.0);
  reset_copies(seed, 0, num_envs(), nullptr);
}

void MujocoEnv::check_range(int begin, int end) const {
  if (begin < 0 || end > num_envs() || begin > end)
    throw std::out_of_range(task() + ": copies [" + std::to_string(begin) + ", " + std::to_string(end) +
                            ") are not within the " + std::to_string(num_envs()) + " copies");
}

void MujocoEnv::start_episode(Copy& k, int copy) {
  const mjModel* m = model_.get();
  mjData* d = k.data.get();
  for (int t = 0; t < kStartTries; ++t) {
    mj_resetData(m, d);
    randomize(k);
    try {
      mj_forward(m, d);
      mj_subtreeVel(m, d);
    } catch (const MujocoError& e) {
      throw std::runtime_error(task() + ": MuJoCo failed on the initial state of copy " + std::to_string(copy) +
                               " of '" + model_path_ + "': " + e.what());
    }
    if (valid_start(k, t)) {
      k.steps = 0;
      return;
    }
  }
  throw std::runtime_error(task() + ": no valid initial state of '" + model_path_ + "' for copy " +
                           std::to_string(copy) + " in " + std::to_string(kStartTries) +
                           " draws (the humanoid's must have no contacts)");
}

bool MujocoEnv::advance(Copy& k, int copy) {
  const mjModel* m = model_.get();
  mjData* d = k.data.get();
  // Cleared each step, so that a count above zero is this step's (MuJoCo's reset clears them too).
  for (int w : kUnstableWarnings) d->warning[w].number = 0;
  try {
    for (int i = 0; i < substeps_; ++i) {
      // dm_control's legacy step: the state is already through mj_step1 (positions and velocities),
      // so the first substep finishes with mj_step2 and the last one ends with mj_step1 below.
      if (step2_first_ && i == 0) mj_step2(m, d);
      else mj_step(m, d);
      if (warned(d)) return false;
    }
    mj_step1(m, d);
    mj_subtreeVel(m, d);
  } catch (const MujocoError& e) {
    if (!error_reported_.exchange(true))
      std::fprintf(stderr, "mujoco: %s: MuJoCo error in copy %d of '%s': %s (the episode ends as unstable; not shown again)\n",
                   task().c_str(), copy, model_path_.c_str(), e.what());
    return false;
  }
  return !warned(d) && all_sane(d->qpos, m->nq) && all_sane(d->qvel, m->nv) && all_sane(d->qacc, m->nv) &&
         all_sane(d->act, m->na);
}

bool MujocoEnv::write_obs(const std::vector<double>& obs, float* row) {
  bool ok = true;
  for (std::size_t i = 0; i < obs.size(); ++i) {
    double x = obs[i];
    if (std::isnan(x)) {
      x = 0.0;
      ok = false;
    } else if (std::fabs(x) > mjMAXVAL) {
      x = std::clamp(x, -mjMAXVAL, mjMAXVAL);
      ok = false;
    }
    row[i] = static_cast<float>(x);
  }
  return ok;
}

void MujocoEnv::reset_copies(std::uint64_t seed, int begin, int end, float* obs) {
  check_range(begin, end);
  std::vector<double> o(static_cast<std::size_t>(spec().obs_dim));
  for (int c = begin; c < end; ++c) {
    Copy& k = copies_[static_cast<std::size_t>(c)];
    k.rng = dqn::env_rng::seed_copy(seed, c);
    start_episode(k, c);
    if (obs) {
      observe(k, o.data());
      write_obs(o, obs + static_cast<std::size_t>(c) * o.size());
    }
  }
}

void MujocoEnv::step_copies(int begin, int end, const dqn::EnvStep& io) {
  check_range(begin, end);
  const std::size_t S = static_cast<std::size_t>(spec().obs_dim), D = branches_.size();
  std::vector<double> o(S);
  for (int c = begin; c < end; ++c) {
    Copy& k = copies_[static_cast<std::size_t>(c)];
    mjData* d = k.data.get();
    const std::int32_t* a = io.actions + static_cast<std::size_t>(c) * D;
    for (std::size_t j = 0; j < D; ++j) d->ctrl[j] = control(static_cast<int>(j), a[j]);
    bool stable = advance(k, c);
    ++k.steps;
    observe(k, o.data());
    float* next = io.next_obs + static_cast<std::size_t>(c) * S;
    stable = write_obs(o, next) && stable;
    double r = stable ? reward(k) : unstable_reward();
    if (!std::isfinite(r)) {
      stable = false;
      r = unstable_reward();
    }
    const bool success = stable && succeeded(k);
    const bool truncated = !success && (!stable || k.steps >= episode_steps_);
    io.rewards[c] = static_cast<float>(r);
    io.terminated[c] = success ? 1 : 0;
    io.truncated[c] = truncated ? 1 : 0;
    if (io.success) io.success[c] = success ? 1 : 0;
    if (io.unstable) io.unstable[c] = stable ? 0 : 1;
    if (io.final_obs) std::copy(next, next + S, io.final_obs + static_cast<std::size_t>(c) * S);
    if (success || truncated) {
      start_episode(k, c);
      observe(k, o.data());
      write_obs(o, next);
    }
  }
}

MujocoEnv::Snapshot MujocoEnv::take() const {
  const mjModel* m = model_.get();
  Snapshot s;
  auto add = [](std::vector<double>& to, const mjtNum* from, int n) { to.insert(to.end(), from, from + n); };
  for (const Copy& k : copies_) {
    const mjData* d = k.data.get();
    s.time.push_back(d->time);
    add(s.qpos, d->qpos, m->nq);
    add(s.qvel, d->qvel, m->nv);
    add(s.act, d->act, m->na);
    add(s.ctrl, d->ctrl, m->nu);
    add(s.warmstart, d->qacc_warmstart, m->nv);
    s.task.insert(s.task.end(), k.task.begin(), k.task.end());
    s.steps.push_back(k.steps);
    s.rng.push_back(k.rng);
  }
  return s;
}

void MujocoEnv::apply(const Snapshot& s) {
  const mjModel* m = model_.get();
  for (std::size_t c = 0; c < copies_.size(); ++c) {
    Copy& k = copies_[c];
    mjData* d = k.data.get();
    auto put = [c](mjtNum* to, const std::vector<double>& from, int n) {
      std::copy_n(from.begin() + static_cast<std::ptrdiff_t>(c) * n, n, to);
    };
    d->time = s.time[c];
    put(d->qpos, s.qpos, m->nq);
    put(d->qvel, s.qvel, m->nv);
    put(d->act, s.act, m->na);
    put(d->ctrl, s.ctrl, m->nu);
    put(d->qacc_warmstart, s.warmstart, m->nv);
    put(k.task.data(), s.task, task_dim_);
    k.steps = s.steps[c];
    k.rng = s.rng[c];
    for (int w = 0; w < mjNWARNING; ++w) d->warning[w].number = 0;
    // What a control step leaves computed (mj_step1), from the state alone.
    mj_step1(m, d);
    mj_subtreeVel(m, d);
  }
}

void MujocoEnv::save(dqn::StateOut& out) const {
  const mjModel* m = model_.get();
  const std::int64_t N = num_envs();
  const Snapshot s = take();
  out.put("time", s.time, {N});
  out.put("qpos", s.qpos, {N, m->nq});
  out.put("qvel", s.qvel, {N, m->nv});
  if (m->na > 0) out.put("act", s.act, {N, m->na});
  out.put("ctrl", s.ctrl, {N, m->nu});
  out.put("qacc_warmstart", s.warmstart, {N, m->nv});
  if (task_dim_ > 0) out.put("task", s.task, {N, task_dim_});
  out.put("steps", s.steps, {N});
  out.put("rng", s.rng, {N});
}

void MujocoEnv::load(const dqn::StateIn& in) {
  const mjModel* m = model_.get();
  const std::int64_t N = num_envs();
  Snapshot s;
  s.time = in.get<double>("time", {N});
  s.qpos = in.get<double>("qpos", {N, m->nq});
  s.qvel = in.get<double>("qvel", {N, m->nv});
  if (m->na > 0) s.act = in.get<double>("act", {N, m->na});
  s.ctrl = in.get<double>("ctrl", {N, m->nu});
  s.warmstart = in.get<double>("qacc_warmstart", {N, m->nv});
  if (task_dim_ > 0) s.task = in.get<double>("task", {N, task_dim_});
  s.steps = in.get<std::int64_t>("steps", {N});
  s.rng = in.get<std::uint64_t>("rng", {N});
  // What MuJoCo would reset a copy for (mju_isBad) is refused, rather than loaded and lost.
  auto check_sane = [&](const char* name, const std::vector<double>& v, std::size_t width) {
    for (std::size_t i = 0; i < v.size(); ++i)
      if (mju_isBad(v[i]))
        in.refuse(task() + ": " + name + "[" + std::to_string(i / width) + ", " + std::to_string(i % width) +
                  "] in " + in.source() + " is " + text(v[i]) + ", not a number MuJoCo takes (finite, within ±1e10)");
  };
  check_sane("time", s.time, 1);
  check_sane("qpos", s.qpos, static_cast<std::size_t>(m->nq));
  check_sane("qvel", s.qvel, static_cast<std::size_t>(m->nv));
  if (m->na > 0) check_sane("act", s.act, static_cast<std::size_t>(m->na));
  check_sane("ctrl", s.ctrl, static_cast<std::size_t>(m->nu));
  check_sane("qacc_warmstart", s.warmstart, static_cast<std::size_t>(m->nv));
  if (task_dim_ > 0) check_sane("task", s.task, static_cast<std::size_t>(task_dim_));
  for (std::size_t c = 0; c < s.steps.size(); ++c)
    if (s.steps[c] < 0 || s.steps[c] >= episode_steps_)
      in.refuse(task() + ": steps[" + std::to_string(c) + "] in " + in.source() + " is " + std::to_string(s.steps[c]) +
                ", not a step of an episode of " + std::to_string(episode_steps_) + " (option 'episode_steps')");
  const Snapshot before = take();
  try {
    apply(s);
  } catch (const MujocoError& e) {
    try {
      apply(before);  // the state the copies had, which MuJoCo computed before
    } catch (const MujocoError&) {
    }
    in.refuse(task() + ": MuJoCo failed on the state in " + in.source() + ": " + e.what());
  }
}

}  // namespace dqn_mujoco
