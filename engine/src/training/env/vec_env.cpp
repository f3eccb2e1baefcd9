/** @file vec_env.cpp
 *  @brief VecEnv (an environment's copies over a thread pool, checked in and out, saved through
 *  the SDK's state interfaces), the program's own environments, and make_env.
 */
#include "training/env/vec_env.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <utility>

#include "core/plugin_loader.hpp"

namespace dqn {
namespace {

constexpr std::uint32_t kErrLen = 1024;

st::DType st_type(StateType t) {
  switch (t) {
    case StateType::f64: return st::DType::F64;
    case StateType::f32: return st::DType::F32;
    case StateType::i32: return st::DType::I32;
    case StateType::i64: return st::DType::I64;
    case StateType::u8: return st::DType::U8;
    case StateType::u64: return st::DType::U8;  // 8 bytes per element, a trailing dimension of 8
  }
  throw std::invalid_argument("unknown state type " + std::to_string(int(t)));
}

std::vector<std::int64_t> st_shape(StateType t, const std::int64_t* shape, std::int32_t rank) {
  std::vector<std::int64_t> s(shape, shape + std::max(0, rank));
  if (t == StateType::u64) s.push_back(8);
  return s;
}

/// An environment's state into a checkpoint, under the VecEnv's prefix.
class FileStateWriter final : public StateWriter {
 public:
  FileStateWriter(st::File& f, std::string prefix) : f_(f), prefix_(std::move(prefix)) {}
  int put(const char* name, StateType type, const std::int64_t* shape, std::int32_t rank,
          const void* data) noexcept override {
    try {
      f_.put_raw(prefix_ + (name ? name : ""), st_type(type), st_shape(type, shape, rank), data);
      return 0;
    } catch (const std::exception& e) {
      return fail(e.what());
    }
  }
  int fail(const char* message) noexcept override {
    if (error.empty()) error = message ? message : "failed";
    return 1;
  }
  std::string error;

 private:
  st::File& f_;
  std::string prefix_;
};

class FileStateReader final : public StateReader {
 public:
  FileStateReader(const st::File& f, std::string prefix) : f_(f), prefix_(std::move(prefix)) {}
  int get(const char* name, StateType type, const std::int64_t* shape, std::int32_t rank,
          void* data) const noexcept override {
    try {
      f_.get_raw(prefix_ + (name ? name : ""), st_type(type), st_shape(type, shape, rank), data);
      return 0;
    } catch (const std::exception& e) {
      return fail(e.what());
    }
  }
  int fail(const char* message) const noexcept override {
    if (error.empty()) error = message ? message : "failed";
    return 1;
  }
  const char* source() const noexcept override { return f_.path.c_str(); }
  mutable std::string error;

 private:
  const st::File& f_;
  std::string prefix_;
};

struct ProgramEnvs {
  std::mutex mutex;
  std::map<std::string, EnvFactory> factories;  // ordered: program_env_names() comes out sorted
};

ProgramEnvs& program_envs() {
  static ProgramEnvs r;
  return r;
}

const PluginLoader& default_loader() {
  static const PluginLoader loader(PluginLoader::search_path_from(""));
  return loader;
}

/// The finite check of one step's outputs: the first bad value, named.
void check_finite(const std::string& label, const char* what, const float* v, int width, int n) {
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < width; ++j) {
      const float x = v[std::size_t(i) * std::size_t(width) + std::size_t(j)];
      if (!std::isfinite(x))
        throw std::runtime_error("environment " + label + ": copy " + std::to_string(i) + " handed out " + what +
                                 (width > 1 ? "[" + std::to_string(j) + "]" : std::string()) + " = " +
                                 std::to_string(x) + " (an environment must end an unstable episode, never pass "
                                 "a non-finite value on)");
    }
}

}  // namespace

VecEnv::VecEnv(Env* env, void (*destroy)(Env*), std::shared_ptr<const void> keep, std::string label, int threads)
    : env_(env), destroy_(destroy), keep_(std::move(keep)), label_(std::move(label)),
      n_(env ? env->num_envs() : 0),
      pool_(std::make_unique<EnvPool>(threads > 0 ? threads : 1, n_)),
      auto_max_(threads > 0 ? 0 : auto_threads(1.0, n_)) {
  if (!env_) throw std::invalid_argument("environment " + label_ + ": no environment given");
  const EnvSpec& s = env_->spec();
  auto refuse = [&](const std::string& why) {
    destroy_(env_);
    env_ = nullptr;
    throw std::invalid_argument("environment " + label_ + ": " + why);
  };
  if (n_ < 1) refuse("it has " + std::to_string(n_) + " copies");
  if (s.obs_dim < 1) refuse("its observation has " + std::to_string(s.obs_dim) + " features");
  if (s.n_branches < 1 || !s.branches) refuse("it has no action branch");
  for (int b = 0; b < s.n_branches; ++b)
    if (s.branches[b].bins < 1) refuse("branch " + std::to_string(b) + " has " + std::to_string(s.branches[b].bins) + " bins");
  success_.assign(std::size_t(n_), 0);
  unstable_.assign(std::size_t(n_), 0);
}

VecEnv::~VecEnv() {
  if (env_) destroy_(env_);
}

std::vector<int> VecEnv::branch_actions() const {
  std::vector<int> out;
  for (int b = 0; b < branches(); ++b) out.push_back(spec().branches[b].bins);
  return out;
}

void VecEnv::run_ranges(const char* what, const std::function<int(int, int, char*)>& call) {
  const auto t = static_cast<std::size_t>(threads());
  std::vector<std::string> errors(t);
  std::vector<int> status(t, 0);
  std::vector<std::pair<int, int>> ranges(t);
  pool_->run([&](int r, int begin, int end) {
    char err[kErrLen] = {0};
    const auto k = static_cast<std::size_t>(r);
    ranges[k] = {begin, end};
    try {
      status[k] = call(begin, end, err);
    } catch (...) {  // an Env must not throw across the boundary
      status[k] = 1;
      std::snprintf(err, kErrLen, "it threw");
    }
    errors[k] = std::string(err, ::strnlen(err, kErrLen));
  });
  for (std::size_t k = 0; k < t; ++k)
    if (status[k] != 0)
      throw std::runtime_error("environment " + label_ + ": " + what + " of copies [" + std::to_string(ranges[k].first) +
                               ", " + std::to_string(ranges[k].second) + ") failed: " +
                               (errors[k].empty() ? "no reason given" : errors[k]));
}

void VecEnv::reset(std::uint64_t seed, float* obs) {
  run_ranges("reset", [&](int begin, int end, char* err) { return env_->reset(seed, begin, end, obs, err, kErrLen); });
  if (obs) check_finite(label_, "an observation", obs, obs_dim(), n_);
}

void VecEnv::step(const std::int32_t* actions, float* next_obs, float* rewards, std::uint8_t* terminated,
                  std::uint8_t* truncated, float* final_obs) {
  const int D = branches();
  const EnvSpec& s = spec();
  for (int i = 0; i < n_; ++i)  // before any copy moves
    for (int d = 0; d < D; ++d) {
      const std::int32_t a = actions[std::size_t(i) * std::size_t(D) + std::size_t(d)];
      if (a < 0 || a >= s.branches[d].bins)
        throw std::invalid_argument("environment " + label_ + ": action " + std::to_string(a) + " for copy " +
                                    std::to_string(i) + ", branch " + std::to_string(d) + " is out of range (0 to " +
                                    std::to_string(s.branches[d].bins - 1) + ")");
    }
  std::fill(success_.begin(), success_.end(), 0);
  std::fill(unstable_.begin(), unstable_.end(), 0);
  const EnvStep io{actions, next_obs, rewards, terminated, truncated, final_obs, success_.data(), unstable_.data()};
  const bool timing = auto_max_ > 1 && probed_ <= kAutoProbeSteps;
  const auto t0 = timing ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
  run_ranges("step", [&](int begin, int end, char* err) { return env_->step(begin, end, io, err, kErrLen); });
  if (timing && probed_++ > 0) {  // (the first step warms caches up: not counted)
    probe_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (probed_ > kAutoProbeSteps) {
      const int t = std::min(auto_max_, auto_threads(probe_s_ / kAutoProbeSteps, n_));
      if (t > 1) pool_ = std::make_unique<EnvPool>(t, n_);
    }
  }
  check_finite(label_, "a reward", rewards, 1, n_);
  check_finite(label_, "an observation", next_obs, obs_dim(), n_);
  check_finite(label_, "a final observation", final_obs, obs_dim(), n_);
  for (int i = 0; i < n_; ++i)
    if (unstable_[std::size_t(i)]) {
      ++unstable_total_;
      if (!terminated[i]) truncated[i] = 1;  // an unstable episode ends
    }
}

void VecEnv::save_state(st::File& f, const std::string& prefix) const {
  FileStateWriter w(f, prefix);
  if (env_->save_state(w) != 0)
    throw std::runtime_error("environment " + label_ + ": saving its state failed: " +
                             (w.error.empty() ? "no reason given" : w.error));
  f.put_raw(prefix + "engine.unstable_episodes", st::DType::I64, {1}, &unstable_total_);
}

void VecEnv::load_state(const st::File& f, const std::string& prefix) {
  std::int64_t unstable = 0;
  f.get_raw(prefix + "engine.unstable_episodes", st::DType::I64, {1}, &unstable);
  if (unstable < 0)
    throw std::invalid_argument("environment state in '" + f.path + "': tensor '" + prefix +
                                "engine.unstable_episodes' is " + std::to_string(unstable) + " (a count)");
  FileStateReader r(f, prefix);
  if (env_->load_state(r) != 0)
    throw std::invalid_argument("environment " + label_ + ": its state in '" + f.path + "' does not fit: " +
                                (r.error.empty() ? "no reason given" : r.error));
  unstable_total_ = unstable;
}

void register_env(const std::string& task, EnvFactory factory) {
  if (task.empty()) throw std::invalid_argument("register_env: empty environment name");
  if (!factory) throw std::invalid_argument("register_env: empty factory for '" + task + "'");
  ProgramEnvs& r = program_envs();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (!r.factories.emplace(task, std::move(factory)).second)
    throw std::invalid_argument("register_env: environment '" + task + "' is already registered");
}

std::vector<std::string> program_env_names() {
  ProgramEnvs& r = program_envs();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> names;
  for (const auto& [name, _] : r.factories) names.push_back(name);
  return names;
}

std::string env_label(const EnvChoice& env) { return env.plugin.empty() ? env.task : env.plugin + ":" + env.task; }

int env_threads(int configured, int num_envs) { return configured < 1 ? 0 : std::max(1, std::min(configured, num_envs)); }

int auto_threads(double step_seconds, int num_envs) {
  const int cores = std::max(1, int(std::thread::hardware_concurrency()) - 1);
  const int by_work = int(step_seconds / kAutoThreadWork);
  return std::max(1, std::min({by_work, cores, num_envs}));
}

std::unique_ptr<VecEnv> make_env(const EnvChoice& env, int num_envs, std::uint64_t seed, int threads,
                                 const PluginLoader* plugins) {
  const PluginLoader& loader = plugins ? *plugins : default_loader();
  if (num_envs < 1)
    throw std::invalid_argument("environment " + env_label(env) + ": num_envs must be at least 1, got " +
                                std::to_string(num_envs));
  const FoundEnv found = find_env(env, loader, program_env_names());
  const std::string label = found.plugin.empty() ? found.task : found.plugin + ":" + found.task;
  const int t = env_threads(threads, num_envs);
  if (!found.task_desc) {  // the program's own
    if (!env.options.empty())
      throw std::invalid_argument("environment " + label + ": the program's own environment takes no options");
    EnvFactory factory;
    {
      ProgramEnvs& r = program_envs();
      std::lock_guard<std::mutex> lock(r.mutex);
      factory = r.factories.at(found.task);
    }
    const EnvCreateInfo info{found.task.c_str(), num_envs, seed, nullptr, 0};
    std::unique_ptr<Env> made = factory(info);
    if (!made) throw std::logic_error("environment " + label + ": its factory returned no environment");
    return std::make_unique<VecEnv>(made.release(), [](Env* e) { delete e; }, nullptr, label, t);
  }
  std::vector<std::string> storage;
  EnvChoice resolved = env;
  resolved.plugin = found.plugin;
  resolved.task = found.task;
  std::vector<ParamValue> values;
  try {
    values = resolve_env_options(resolved, *found.task_desc, storage);
  } catch (const PipelineErrors& e) {
    throw std::invalid_argument("environment " + label + ": " + e.what());
  }
  const EnvCreateInfo info{found.task_desc->task, num_envs, seed, values.data(), std::uint32_t(values.size())};
  char err[kErrLen] = {0};
  Env* made = nullptr;
  try {  // create() must not throw across the boundary; one that does is reported, not fatal
    made = found.task_desc->create(&info, err, kErrLen);
  } catch (...) {
    throw std::runtime_error("environment " + label + ": its create() threw");
  }
  if (!made) {
    const std::string why(err, ::strnlen(err, kErrLen));
    throw std::invalid_argument("environment " + label + " could not be made: " + (why.empty() ? "no reason given" : why));
  }
  const LoadedPlugin* lib = loader.get(found.plugin);
  std::shared_ptr<const void> keep = lib ? std::shared_ptr<const void>(lib->library) : nullptr;
  return std::make_unique<VecEnv>(made, found.task_desc->destroy, std::move(keep), label, t);
}

EnvChoice env_choice(const std::string& name) {
  EnvChoice e;
  const std::size_t colon = name.find(':');
  e.plugin = colon == std::string::npos ? std::string() : name.substr(0, colon);
  e.task = colon == std::string::npos ? name : name.substr(colon + 1);
  return e;
}

std::unique_ptr<VecEnv> make_env(const std::string& task, int num_envs, std::uint64_t seed, int threads,
                                 const PluginLoader* plugins) {
  return make_env(env_choice(task), num_envs, seed, threads, plugins);
}

std::function<EnvProbe(const EnvChoice&)> environment_shapes(const PluginLoader* plugins) {
  return [plugins](const EnvChoice& env) {
    EnvProbe p;
    const PluginLoader& loader = plugins ? *plugins : default_loader();
    try {
      find_env(env, loader, program_env_names());
    } catch (const std::invalid_argument&) {
      return p;
    }
    p.found = true;
    try {
      const std::unique_ptr<VecEnv> made = make_env(env, 1, 0, 1, &loader);
      p.shape = EnvShape{made->obs_dim(), made->branch_actions()};
    } catch (const std::exception& e) {
      // The environment's own reason (the validator names the environment itself).
      const std::string why = e.what(), made = " could not be made: ";
      const std::size_t at = why.find(made);
      p.error = at == std::string::npos ? why : why.substr(at + made.size());
    }
    return p;
  };
}

}  // namespace dqn
