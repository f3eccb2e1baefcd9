/** @file env_base.hpp
 *  @brief A base for environments written in C++: it keeps the task's spec and options, turns
 *  exceptions into the status codes and messages the plugin boundary carries, gives each copy a
 *  seeded random stream, reads and writes saved state as typed vectors, and DQN_ENV_PLUGIN writes
 *  the descriptor. An environment derived from it is its dynamics:
 *
 *    class Pendulum final : public dqn::EnvBase {
 *     public:
 *      explicit Pendulum(const dqn::EnvCreateInfo& info) : EnvBase(info) {
 *        set_spec(3, {dqn::EnvBranch{11, 1, -2.0, 2.0, "torque"}}, 200);
 *        ...allocate num_envs() copies, then reset_copies(info.seed, 0, num_envs(), nullptr)
 *      }
 *      void reset_copies(std::uint64_t seed, int begin, int end, float* obs) override;
 *      void step_copies(int begin, int end, const dqn::EnvStep& io) override;
 *      void save(dqn::StateOut& out) const override;
 *      void load(const dqn::StateIn& in) override;
 *    };
 *    const dqn::EnvDescriptor kTasks[] = {DQN_ENV_TASK(Pendulum, "pendulum", "swing up", kSchema)};
 *    DQN_ENV_PLUGIN("pendulum", "0.1.0", "classic control", kTasks)
 */
#pragma once

#include <cstdint>
#include <cstdio>
#include <exception>
#include <iterator>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "dqn/env.hpp"
#include "dqn/param_values.hpp"
#include "dqn/plugin.hpp"

namespace dqn {

/// Per-copy random streams: splitmix64, one 64-bit state per copy.
namespace env_rng {
inline constexpr std::uint64_t kGolden = 0x9E3779B97F4A7C15ull;
inline std::uint64_t mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
/// Copy `copy`'s stream for `seed`: distinct and well mixed, so seeds s and s+1 share no copy's stream.
inline std::uint64_t seed_copy(std::uint64_t seed, std::int64_t copy) {
  return mix(mix(seed) ^ mix(kGolden * static_cast<std::uint64_t>(copy + 1)));
}
inline std::uint64_t next(std::uint64_t& state) {
  state += kGolden;
  return mix(state);
}
/// Uniform in [lo, hi) from the top 53 bits.
inline double uniform(std::uint64_t& state, double lo, double hi) {
  const double u = static_cast<double>(next(state) >> 11) * 0x1.0p-53;
  return lo + (hi - lo) * u;
}
}  // namespace env_rng

template <class T>
constexpr StateType state_type() {
  if constexpr (std::is_same_v<T, double>) return StateType::f64;
  else if constexpr (std::is_same_v<T, float>) return StateType::f32;
  else if constexpr (std::is_same_v<T, std::int32_t>) return StateType::i32;
  else if constexpr (std::is_same_v<T, std::int64_t>) return StateType::i64;
  else if constexpr (std::is_same_v<T, std::uint8_t>) return StateType::u8;
  else {
    static_assert(std::is_same_v<T, std::uint64_t>, "saved state is f64, f32, i32, i64, u8 or u64");
    return StateType::u64;
  }
}

/// Thrown by StateOut/StateIn when the engine refused a tensor (its reason is kept by the engine).
struct StateRefused {
  int rc;
};

/// Saving: named tensors of a type and shape.
class StateOut {
 public:
  explicit StateOut(StateWriter& w) : w_(w) {}
  template <class T>
  void put(const std::string& name, const std::vector<T>& v, std::vector<std::int64_t> shape = {}) {
    if (shape.empty()) shape = {static_cast<std::int64_t>(v.size())};
    const int rc = w_.put(name.c_str(), state_type<T>(), shape.data(), static_cast<std::int32_t>(shape.size()), v.data());
    if (rc != 0) throw StateRefused{rc};
  }

 private:
  StateWriter& w_;
};

/// Loading: each tensor read whole, of exactly the type and shape asked for.
class StateIn {
 public:
  explicit StateIn(const StateReader& r) : r_(r) {}
  template <class T>
  std::vector<T> get(const std::string& name, std::vector<std::int64_t> shape) const {
    std::int64_t n = 1;
    for (std::int64_t d : shape) n *= d;
    std::vector<T> v(static_cast<std::size_t>(n));
    const int rc = r_.get(name.c_str(), state_type<T>(), shape.data(), static_cast<std::int32_t>(shape.size()), v.data());
    if (rc != 0) throw StateRefused{rc};
    return v;
  }
  /// Refuses what was read (a value out of range): the message names the tensor and element.
  [[noreturn]] void refuse(const std::string& message) const { throw StateRefused{r_.fail(message.c_str())}; }
  const char* source() const noexcept { return r_.source(); }

 private:
  const StateReader& r_;
};

class EnvBase : public Env {
 public:
  explicit EnvBase(const EnvCreateInfo& info)
      : task_(info.task ? info.task : "env"), n_(info.num_envs), options_(task_, info.params, info.n_params) {
    if (n_ < 1) throw std::invalid_argument(task_ + ": num_envs must be at least 1, got " + std::to_string(n_));
  }

  // --- the environment's work (throw std::exception on a problem: the base reports it) ---
  /// Seeds copies [begin, end) from (seed, copy index) (env_rng::seed_copy) and starts their
  /// episodes; writes their rows of obs unless it is null.
  virtual void reset_copies(std::uint64_t seed, int begin, int end, float* obs) = 0;
  /// Steps copies [begin, end) (Env::step: may run on several threads over disjoint ranges).
  virtual void step_copies(int begin, int end, const EnvStep& io) = 0;
  virtual void save(StateOut& out) const = 0;
  /// Reads everything and checks it before changing anything.
  virtual void load(const StateIn& in) = 0;

  // --- Env, final ---
  const EnvSpec& spec() const noexcept final { return spec_; }
  std::int32_t num_envs() const noexcept final { return n_; }
  int reset(std::uint64_t seed, std::int32_t begin, std::int32_t end, float* obs, char* err,
            std::uint32_t errlen) noexcept final {
    return guard(err, errlen, [&] { reset_copies(seed, begin, end, obs); });
  }
  int step(std::int32_t begin, std::int32_t end, const EnvStep& io, char* err, std::uint32_t errlen) noexcept final {
    return guard(err, errlen, [&] { step_copies(begin, end, io); });
  }
  int save_state(StateWriter& w) const noexcept final {
    try {
      StateOut out(w);
      save(out);
      return 0;
    } catch (const StateRefused& r) {
      return r.rc;
    } catch (const std::exception& e) {
      return w.fail((task_ + ": " + e.what()).c_str());
    } catch (...) {
      return w.fail((task_ + ": unknown exception").c_str());
    }
  }
  int load_state(const StateReader& r) noexcept final {
    try {
      load(StateIn(r));
      return 0;
    } catch (const StateRefused& x) {
      return x.rc;
    } catch (const std::exception& e) {
      return r.fail((task_ + ": " + e.what()).c_str());
    } catch (...) {
      return r.fail((task_ + ": unknown exception").c_str());
    }
  }

 protected:
  const std::string& task() const noexcept { return task_; }
  const ParamValues& options() const noexcept { return options_; }
  /// The spec: observation size, one EnvBranch per action dimension (names are copied), the
  /// truncation limit, and whether step() reports successes.
  void set_spec(int obs_dim, std::vector<EnvBranch> branches, int max_episode_steps, bool reports_success = false) {
    names_.clear();
    for (const EnvBranch& b : branches) names_.push_back(b.name ? b.name : "");
    branches_ = std::move(branches);
    for (std::size_t i = 0; i < branches_.size(); ++i) branches_[i].name = names_[i].c_str();
    spec_ = EnvSpec{task_.c_str(), obs_dim, static_cast<std::int32_t>(branches_.size()), branches_.data(),
                    max_episode_steps, reports_success ? 1 : 0};
  }
  /// The control bin k of branch d means (continuous branches).
  double control(int d, std::int32_t k) const {
    const EnvBranch& b = branches_[static_cast<std::size_t>(d)];
    return b.bins > 1 ? b.lo + (b.hi - b.lo) * static_cast<double>(k) / static_cast<double>(b.bins - 1)
                      : 0.5 * (b.lo + b.hi);
  }

 private:
  template <class F>
  static int guard(char* err, std::uint32_t errlen, F&& f) noexcept {
    try {
      f();
      return 0;
    } catch (const std::exception& e) {
      if (err && errlen) std::snprintf(err, errlen, "%s", e.what());
    } catch (...) {
      if (err && errlen) std::snprintf(err, errlen, "unknown exception");
    }
    return 1;
  }

  std::string task_;
  std::int32_t n_;
  ParamValues options_;
  std::vector<std::string> names_;
  std::vector<EnvBranch> branches_;
  EnvSpec spec_{};
};

/// create() of a task whose environment is E: new E(*info), an exception's message into err.
template <class E>
Env* create_env(const EnvCreateInfo* info, char* err, std::uint32_t errlen) noexcept {
  try {
    return new E(*info);
  } catch (const std::exception& e) {
    std::snprintf(err, errlen, "%s", e.what());
  } catch (...) {
    std::snprintf(err, errlen, "unknown exception");
  }
  return nullptr;
}

template <class E>
void destroy_env(Env* e) noexcept {
  delete e;
}

}  // namespace dqn

/// One task of an environment plugin: environment class E (derived from dqn::EnvBase, constructed
/// from an EnvCreateInfo; a constructor that throws refuses the options with its message), the
/// task's name, a description and its options' schema (an array of dqn::ParamSchema).
#define DQN_ENV_TASK(E, task_name, description_text, schema_array)                                            \
  ::dqn::EnvDescriptor {                                                                                     \
    task_name, description_text, static_cast<std::uint32_t>(std::size(schema_array)), schema_array,          \
        &::dqn::create_env<E>, &::dqn::destroy_env<E>                                                        \
  }
#define DQN_ENV_TASK_NO_OPTIONS(E, task_name, description_text) \
  ::dqn::EnvDescriptor { task_name, description_text, 0, nullptr, &::dqn::create_env<E>, &::dqn::destroy_env<E> }

/// The descriptor and its export for an environment library: plugin name, version text,
/// description and its tasks (an array of dqn::EnvDescriptor). Once per plugin, at namespace scope.
#define DQN_ENV_PLUGIN(plugin_name, version_text, description_text, tasks_array)                                 \
  namespace {                                                                                                 \
  const ::dqn::PluginDescriptor dqn_env_descriptor_{::dqn::kAbiMajor,                                         \
                                                    ::dqn::kAbiMinor,                                         \
                                                    sizeof(::dqn::PluginDescriptor),                          \
                                                    ::dqn::PluginKind::environment,                           \
                                                    plugin_name,                                              \
                                                    version_text,                                             \
                                                    description_text,                                         \
                                                    0.0,                                                      \
                                                    0,                                                        \
                                                    0,                                                        \
                                                    nullptr,                                                  \
                                                    nullptr,                                                  \
                                                    nullptr,                                                  \
                                                    static_cast<std::uint32_t>(std::size(tasks_array)),       \
                                                    tasks_array,                                              \
                                                    nullptr};                                                 \
  }                                                                                                           \
  DQN_PLUGIN_EXPORT(dqn_env_descriptor_)
