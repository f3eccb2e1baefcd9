/** @file reacher.cpp
 *  @brief The planar N-link reacher as an environment plugin: one action branch per joint (evenly
 *  spaced torques), a target within reach, a reward for closing the distance less a control cost,
 *  and success when the fingertip comes within a tolerance of the target. Plain C++ (arm.hpp).
 *
 *  Observation of a copy (obs_dim = 5·links + 6, float32; the arm's base is the origin, its reach 1):
 *    [0, 2·links)           cos q_j, sin q_j of each joint's angle relative to the link before
 *    [2·links, 3·links)     each joint's speed divided by its top speed (in [−1, 1])
 *    [3·links, 5·links)     each joint's position − the fingertip's (x, y): the lever it turns the tip by
 *    [5·links, +2)          fingertip x, y
 *    [5·links + 2, +2)      target x, y
 *    [5·links + 4, +2)      fingertip − target
 */
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numbers>
#include <stdexcept>
#include <limits>
#include <string>
#include <vector>

#include "arm.hpp"
#include "dqn/env_base.hpp"

namespace {

using namespace dqn;

/// A number for messages: as short as it can be written.
std::string text(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}

const ParamSchema kSchema[] = {
    {"links", ParamType::integer, "4", "joints, each an action branch; the links are 1/links long, so the arm reaches 1",
     1, reacher::kMaxLinks},
    {"bins", ParamType::integer, "5", "torques per joint, evenly spaced in [-1, 1]; odd, so the middle one is zero",
     3, 51},
    {"tolerance", ParamType::number, "0.1",
     "fingertip-to-target distance that counts as reached, in arm lengths (the arm's reach is 1)", 1e-3, 0.5},
    {"max_steps", ParamType::integer, "75", "steps before an episode is truncated (0.05 s each)", 1, 100000},
    {"distance_weight", ParamType::number, "4",
     "reward per unit the fingertip comes closer to the target (and penalty per unit it moves away)", 0, 1000},
    {"control_cost", ParamType::number, "0.01", "penalty per step: this times the sum over joints of torque squared",
     0, 1000},
    {"success_bonus", ParamType::number, "2", "reward on the step the fingertip comes within tolerance", 0, 1000},
    {"joint_actions", ParamType::boolean, "false",
     "one discrete branch over every combination of the joints' torques (bins^links actions, at most 65536) "
     "instead of one branch per joint: the flat action set a single-branch network must choose from",
     -std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity()},
};

class Reacher final : public EnvBase {
 public:
  explicit Reacher(const EnvCreateInfo& info) : EnvBase(info) {
    links_ = static_cast<int>(option_in("links", 1, reacher::kMaxLinks));
    bins_ = static_cast<int>(option_in("bins", 3, 51));
    if (bins_ % 2 == 0)
      throw std::invalid_argument(task() + ": option 'bins' must be odd (so that the middle bin is zero torque), got " +
                                  std::to_string(bins_));
    max_steps_ = static_cast<int>(option_in("max_steps", 1, 100000));
    tolerance_ = number_in("tolerance", 1e-3, 0.5);
    distance_weight_ = number_in("distance_weight", 0, 1000);
    control_cost_ = number_in("control_cost", 0, 1000);
    success_bonus_ = number_in("success_bonus", 0, 1000);

    joint_ = options().flag("joint_actions");
    std::vector<std::string> names;  // set_spec copies them
    std::vector<EnvBranch> branches;
    if (joint_) {
      std::int64_t combinations = 1;
      for (int j = 0; j < links_; ++j) combinations *= bins_;
      if (combinations > 65536)
        throw std::invalid_argument(task() + ": option 'joint_actions' with " + std::to_string(bins_) + " bins and " +
                                    std::to_string(links_) + " links makes " + std::to_string(combinations) +
                                    " actions, more than 65536");
      names.push_back("joints");
      branches.push_back(EnvBranch{static_cast<std::int32_t>(combinations), 0, 0.0, 0.0, names.back().c_str()});
    } else {
      for (int j = 0; j < links_; ++j) names.push_back("joint" + std::to_string(j));
      for (const std::string& name : names) branches.push_back(EnvBranch{bins_, 1, -1.0, 1.0, name.c_str()});
    }
    set_spec(obs_dim(), std::move(branches), max_steps_, true);

    const auto n = static_cast<std::size_t>(num_envs());
    q_.assign(n * links_, 0.0);
    w_.assign(n * links_, 0.0);
    target_.assign(n * 2, 0.0);
    steps_.assign(n, 0);
    rng_.assign(n, 0);
    reset_copies(info.seed, 0, num_envs(), nullptr);
  }

  void reset_copies(std::uint64_t seed, int begin, int end, float* obs) override {
    check_range(begin, end);
    for (int i = begin; i < end; ++i) {
      rng_[static_cast<std::size_t>(i)] = env_rng::seed_copy(seed, i);
      start_episode(i);
      if (obs) write_obs(i, obs + static_cast<std::size_t>(i) * obs_dim());
    }
  }

  void step_copies(int begin, int end, const EnvStep& io) override {
    check_range(begin, end);
    // Every action is checked before any copy moves, so a refused call changes nothing.
    for (int i = begin; i < end; ++i)
      for (int j = 0; j < links_; ++j) {
        const std::int32_t a = bin(io.actions, i, j);
        if (a < 0 || a >= bins_)
          throw std::out_of_range(task() + ": copy " + std::to_string(i) + ", joint" + std::to_string(j) + ": action " +
                                  std::to_string(a) + " is not a bin in [0, " + std::to_string(bins_) + ")");
      }
    const int dim = obs_dim();
    for (int i = begin; i < end; ++i) {
      const auto row = static_cast<std::size_t>(i);
      double* q = &q_[row * links_];
      double* w = &w_[row * links_];
      const double before = distance(i);
      double effort = 0.0;
      for (int j = 0; j < links_; ++j) {
        const double u = -1.0 + 2.0 * bin(io.actions, i, j) / (bins_ - 1);
        effort += u * u;
        reacher::step_joint(q[j], w[j], u);
      }
      ++steps_[row];
      const double after = distance(i);
      const bool reached = after <= tolerance_;
      const bool out_of_time = !reached && steps_[row] >= max_steps_;
      io.rewards[row] = static_cast<float>(distance_weight_ * (before - after) - control_cost_ * effort +
                                           (reached ? success_bonus_ : 0.0));
      io.terminated[row] = reached ? 1 : 0;
      io.truncated[row] = out_of_time ? 1 : 0;
      io.success[row] = reached ? 1 : 0;
      io.unstable[row] = 0;  // the damped joints keep every speed within kMaxSpeed
      float* next = io.next_obs + row * dim;
      write_obs(i, io.final_obs + row * dim);
      if (reached || out_of_time) {
        start_episode(i);
        write_obs(i, next);
      } else {
        std::copy_n(io.final_obs + row * dim, dim, next);
      }
    }
  }

  void save(StateOut& out) const override {
    const std::int64_t n = num_envs(), l = links_;
    out.put("angles", q_, {n, l});
    out.put("speeds", w_, {n, l});
    out.put("targets", target_, {n, 2});
    out.put("steps", steps_, {n});
    out.put("rng", rng_, {n});
  }

  void load(const StateIn& in) override {
    const std::int64_t n = num_envs(), l = links_;
    auto q = in.get<double>("angles", {n, l});
    auto w = in.get<double>("speeds", {n, l});
    auto target = in.get<double>("targets", {n, 2});
    auto steps = in.get<std::int32_t>("steps", {n});
    auto rng = in.get<std::uint64_t>("rng", {n});
    constexpr double pi = std::numbers::pi;
    check_each(in, "angles", q, l, [](double v) { return v >= -pi && v < pi; }, "a wrapped angle in [-pi, pi)");
    // the damped joints never exceed their top speed (slack for rounding)
    check_each(in, "speeds", w, l, [](double v) { return std::fabs(v) <= reacher::kMaxSpeed * (1 + 1e-9); },
               "a speed within the top speed, " + text(reacher::kMaxSpeed) + " rad/s");
    check_each(in, "targets", target, 2, [](double v) { return std::fabs(v) <= 1.0 + 1e-9; },
               "a coordinate within the arm's reach, [-1, 1]");
    for (std::int64_t i = 0; i < n; ++i)
      if (std::hypot(target[2 * i], target[2 * i + 1]) > 1.0 + 1e-9)
        refuse(in, "targets", "[" + std::to_string(i) + ", :]", "beyond the arm's reach of 1");
    for (std::int64_t i = 0; i < n; ++i)
      if (steps[i] < 0 || steps[i] >= max_steps_)
        refuse(in, "steps", "[" + std::to_string(i) + "]",
               std::to_string(steps[i]) + ", not in [0, max_steps = " + std::to_string(max_steps_) + ")");
    q_ = std::move(q);
    w_ = std::move(w);
    target_ = std::move(target);
    steps_ = std::move(steps);
    rng_ = std::move(rng);
  }

 private:
  /// Joint j's torque bin of copy i: its own branch, or its digit of the combination (base bins,
  /// joint 0 the lowest).
  std::int32_t bin(const std::int32_t* actions, int i, int j) const {
    if (!joint_) return actions[static_cast<std::size_t>(i) * links_ + j];
    std::int32_t a = actions[i];
    for (int k = 0; k < j; ++k) a /= bins_;
    return a % bins_;
  }
  int obs_dim() const { return 5 * links_ + 6; }

  std::int64_t option_in(const char* key, std::int64_t lo, std::int64_t hi) const {
    const std::int64_t v = options().integer(key);
    if (v < lo || v > hi)
      throw std::invalid_argument(task() + ": option '" + key + "' = " + std::to_string(v) + " is not in [" +
                                  std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return v;
  }
  double number_in(const char* key, double lo, double hi) const {
    const double v = options().number(key);
    if (!(v >= lo && v <= hi))  // refuses NaN too
      throw std::invalid_argument(task() + ": option '" + key + "' = " + text(v) + " is not in [" + text(lo) + ", " +
                                  text(hi) + "]");
    return v;
  }
  void check_range(int begin, int end) const {
    if (begin < 0 || end > num_envs() || begin > end)
      throw std::out_of_range(task() + ": copies [" + std::to_string(begin) + ", " + std::to_string(end) +
                              ") are not within [0, " + std::to_string(num_envs()) + ")");
  }

  /// Refuses saved state: which tensor, which element and why.
  [[noreturn]] void refuse(const StateIn& in, const char* tensor, const std::string& element,
                           const std::string& why) const {
    in.refuse(task() + " state in '" + in.source() + "': tensor '" + tensor + "' element " + element + " is " + why);
  }
  /// Refuses the first element of `v` (rows of `cols`) that is not finite or fails `ok`.
  template <class Ok>
  void check_each(const StateIn& in, const char* tensor, const std::vector<double>& v, std::int64_t cols, Ok ok,
                  const std::string& want) const {
    for (std::size_t k = 0; k < v.size(); ++k)
      if (!std::isfinite(v[k]) || !ok(v[k]))
        refuse(in, tensor, "[" + std::to_string(k / cols) + ", " + std::to_string(k % cols) + "]",
               text(v[k]) + ", not " + want);
  }

  double distance(int i) const {
    double x, y;
    reacher::fingertip(&q_[static_cast<std::size_t>(i) * links_], links_, x, y);
    return std::hypot(x - target_[2 * i], y - target_[2 * i + 1]);
  }

  /// A new episode for copy i from its stream: small random angles at rest, then a target drawn
  /// uniformly over the reachable disk (the circle of radius 1 for one link), drawn again while it
  /// lies within 2·tolerance of the fingertip.
  void start_episode(int i) {
    const auto row = static_cast<std::size_t>(i);
    std::uint64_t& s = rng_[row];
    for (int j = 0; j < links_; ++j) {
      q_[row * links_ + j] = env_rng::uniform(s, -reacher::kInitAngle, reacher::kInitAngle);
      w_[row * links_ + j] = 0.0;
    }
    steps_[row] = 0;
    double tip_x, tip_y;
    reacher::fingertip(&q_[row * links_], links_, tip_x, tip_y);
    for (int attempt = 0;; ++attempt) {
      const double r = links_ == 1 ? 1.0 : std::sqrt(env_rng::uniform(s, 0.0, 1.0));
      const double phi = env_rng::uniform(s, -std::numbers::pi, std::numbers::pi);
      target_[2 * row] = r * std::cos(phi);
      target_[2 * row + 1] = r * std::sin(phi);
      // at most 2·tolerance / π of the circle is near the tip, so this ends after a few draws
      if (std::hypot(target_[2 * row] - tip_x, target_[2 * row + 1] - tip_y) > 2 * tolerance_ || attempt >= 1000) break;
    }
  }

  void write_obs(int i, float* o) const {
    const auto row = static_cast<std::size_t>(i);
    const double* q = &q_[row * links_];
    const double* w = &w_[row * links_];
    for (int j = 0; j < links_; ++j) {
      o[2 * j] = static_cast<float>(std::cos(q[j]));
      o[2 * j + 1] = static_cast<float>(std::sin(q[j]));
      o[2 * links_ + j] = static_cast<float>(w[j] / reacher::kMaxSpeed);
    }
    double xy[2 * (reacher::kMaxLinks + 1)];
    reacher::joint_positions(q, links_, xy);
    const double x = xy[2 * links_], y = xy[2 * links_ + 1];
    for (int j = 0; j < links_; ++j) {
      o[3 * links_ + 2 * j] = static_cast<float>(xy[2 * j] - x);
      o[3 * links_ + 2 * j + 1] = static_cast<float>(xy[2 * j + 1] - y);
    }
    const double tx = target_[2 * row], ty = target_[2 * row + 1];
    float* tail = o + 5 * links_;
    tail[0] = static_cast<float>(x);
    tail[1] = static_cast<float>(y);
    tail[2] = static_cast<float>(tx);
    tail[3] = static_cast<float>(ty);
    tail[4] = static_cast<float>(x - tx);
    tail[5] = static_cast<float>(y - ty);
  }

  int links_ = 0, bins_ = 0, max_steps_ = 0;
  bool joint_ = false;  ///< one branch of bins^links combinations (joint_actions)
  double tolerance_ = 0, distance_weight_ = 0, control_cost_ = 0, success_bonus_ = 0;
  std::vector<double> q_, w_;         ///< [N, links]: joint angles (rad, relative) and speeds (rad/s)
  std::vector<double> target_;        ///< [N, 2]
  std::vector<std::int32_t> steps_;   ///< [N]: steps into the episode
  std::vector<std::uint64_t> rng_;    ///< [N]: each copy's stream (env_rng)
};

const EnvDescriptor kTasks[] = {
    DQN_ENV_TASK(Reacher, "reacher",
                 "planar N-link arm (links: options) reaching a random target; one branch of torques per joint",
                 kSchema)};

}  // namespace

DQN_ENV_PLUGIN("reacher", "0.1.0", "planar N-link reacher in plain C++ (BDQ's own task family)", kTasks)
