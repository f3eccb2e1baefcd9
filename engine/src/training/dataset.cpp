/** @file dataset.cpp
 *  @brief Offline datasets in safetensors: reading with checks that name the tensor and the first
 *  bad index, writing, and n-step assembly (the HDF5 reader is dataset_hdf5.cpp).
 */
#include "training/dataset.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <sstream>

#include "core/safetensors.hpp"

namespace dqn {

namespace {

std::string at2(std::int64_t i, std::int64_t j) { return "[" + std::to_string(i) + ", " + std::to_string(j) + "]"; }

std::string fmt(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

bool ends_with(const std::string& s, const char* suffix) {
  const std::size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

/// A 0/1 flag tensor of any of f32/f64/f16/bf16, u8, i8, bool, i32, i64 as floats.
std::vector<float> flags(const st::File& f, const std::string& name) {
  const st::Tensor& t = f.get(name);
  if (t.dtype == st::DType::U8 || t.dtype == st::DType::BOOL || t.dtype == st::DType::I8) {
    std::vector<float> out(t.bytes.size());
    for (std::size_t i = 0; i < out.size(); ++i)
      out[i] = t.dtype == st::DType::I8 ? float(static_cast<std::int8_t>(t.bytes[i])) : float(t.bytes[i]);
    return out;
  }
  if (t.dtype == st::DType::I32 || t.dtype == st::DType::I64) {
    const std::vector<std::int64_t> v = f.get_i64(name);
    return std::vector<float>(v.begin(), v.end());
  }
  return f.get_f32(name);
}

}  // namespace

double Dataset::mean_return() const {
  double all = 0;
  std::int64_t first = 0;
  for (std::int64_t end : episode_ends) {
    for (std::int64_t t = first; t <= end; ++t) all += rewards[std::size_t(t)];
    first = end + 1;
  }
  return episode_ends.empty() ? 0.0 : all / double(episode_ends.size());
}

void Dataset::check(const NetworkSpec& net) const {
  const std::string where = "dataset '" + path + "': ";
  auto bad = [&](const std::string& m) { throw DatasetError(where + m); };
  const std::int64_t N = steps();
  if (N < 1) bad("it holds no steps");
  if (S != net.state)
    bad("tensor 'states' has " + std::to_string(S) + " features per step but network.state is " +
        std::to_string(net.state));
  if (D != net.branches)
    bad("tensor 'actions' has " + std::to_string(D) + " action branches per step but network.branches is " +
        std::to_string(net.branches));
  const auto n = std::size_t(N);
  if (states.size() != n * std::size_t(S) || next_states.size() != states.size() || dones.size() != n ||
      actions.size() != n * std::size_t(D))
    bad("its tensors hold different numbers of steps");
  for (const auto& [name, v] : {std::pair<const char*, const std::vector<float>*>{"states", &states},
                                {"next_states", &next_states}})
    for (std::size_t i = 0; i < v->size(); ++i)
      if (!std::isfinite((*v)[i]))
        bad("tensor '" + std::string(name) + "': element " + at2(std::int64_t(i / std::size_t(S)), std::int64_t(i % std::size_t(S))) +
            " is " + fmt((*v)[i]) + " (every value must be finite)");
  for (std::size_t i = 0; i < n; ++i) {
    if (!std::isfinite(rewards[i]))
      bad("tensor 'rewards': element [" + std::to_string(i) + "] is " + fmt(rewards[i]) + " (must be finite)");
    if (dones[i] != 0.0f && dones[i] != 1.0f)
      bad("tensor 'dones': element [" + std::to_string(i) + "] is " + fmt(dones[i]) + " (must be 0 or 1)");
  }
  for (std::size_t i = 0; i < actions.size(); ++i)
    if (actions[i] < 0 || actions[i] >= net.actions)
      bad("tensor 'actions': element " + at2(std::int64_t(i / std::size_t(D)), std::int64_t(i % std::size_t(D))) +
          " is " + std::to_string(actions[i]) + ", outside 0.." + std::to_string(net.actions - 1) +
          " (network.actions " + std::to_string(net.actions) + ")");
  if (episode_ends.empty()) bad("tensor 'episode_ends' is empty: every step belongs to an episode");
  std::int64_t prev = -1;
  for (std::size_t e = 0; e < episode_ends.size(); ++e) {
    const std::int64_t end = episode_ends[e];
    if (end <= prev)
      bad("tensor 'episode_ends': element [" + std::to_string(e) + "] is " + std::to_string(end) +
          (e == 0 ? std::string(", below 0") : ", not after element [" + std::to_string(e - 1) + "] = " + std::to_string(prev)) +
          ": episode " + std::to_string(e) + " would be empty");
    if (end >= N)
      bad("tensor 'episode_ends': element [" + std::to_string(e) + "] is " + std::to_string(end) +
          ", past the last step " + std::to_string(N - 1));
    for (std::int64_t t = prev + 1; t < end; ++t)
      if (dones[std::size_t(t)] != 0.0f)
        bad("tensor 'dones': element [" + std::to_string(t) + "] is 1 but step " + std::to_string(t) +
            " is not the last of its episode (episode " + std::to_string(e) + " ends at " + std::to_string(end) + ")");
    prev = end;
  }
  if (prev != N - 1)
    bad("tensor 'episode_ends': the last episode ends at step " + std::to_string(prev) + " but the steps go on to " +
        std::to_string(N - 1));
}

Dataset read_dataset(const std::string& path, const NetworkSpec& net) {
  if (ends_with(path, ".h5") || ends_with(path, ".hdf5")) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) throw DatasetError("dataset '" + path + "': cannot open it: " + std::strerror(errno));
    if (!S_ISREG(st.st_mode)) throw DatasetError("dataset '" + path + "': not a regular file");
    Dataset d = read_minari_hdf5(path);
    d.check(net);
    return d;
  }
  return dataset_from(st::read_file(path), net);
}

Dataset dataset_from(const st::File& f, const NetworkSpec& net) {
  Dataset d;
  const std::string& path = f.path;
  d.path = path;
  const st::Tensor& s = f.get("states");
  if (s.shape.size() != 2)
    throw DatasetError("dataset '" + path + "': tensor 'states' has shape " + st::shape_str(s.shape) +
                       ", expected [steps, " + std::to_string(net.state) + "]");
  const std::int64_t N = s.shape[0];
  d.S = int(s.shape[1]);
  d.states = f.get_f32("states");
  d.next_states = f.get_f32("next_states", s.shape);
  d.rewards = f.get_f32("rewards", {N});
  const st::Tensor& dn = f.get("dones");
  if (dn.shape != std::vector<std::int64_t>{N})
    throw DatasetError("dataset '" + path + "': tensor 'dones' has shape " + st::shape_str(dn.shape) + ", expected [" +
                       std::to_string(N) + "] (one per step of 'states')");
  d.dones = flags(f, "dones");
  const st::Tensor& a = f.get("actions");
  if (a.shape.size() == 1 && a.shape[0] == N) {
    d.D = 1;
  } else if (a.shape.size() == 2 && a.shape[0] == N) {
    d.D = int(a.shape[1]);
  } else {
    throw DatasetError("dataset '" + path + "': tensor 'actions' has shape " + st::shape_str(a.shape) + ", expected [" +
                       std::to_string(N) + ", " + std::to_string(net.branches) + "] (or [" + std::to_string(N) +
                       "] for one branch)");
  }
  d.actions = f.get_i32("actions");
  const st::Tensor& ee = f.get("episode_ends");
  if (ee.shape.size() != 1)
    throw DatasetError("dataset '" + path + "': tensor 'episode_ends' has shape " + st::shape_str(ee.shape) +
                       ", expected [episodes]");
  d.episode_ends = f.get_i64("episode_ends");
  d.metadata = f.metadata;
  d.check(net);
  return d;
}

void write_dataset(const std::string& path, const Dataset& d) {
  st::File f;
  const std::int64_t N = d.steps();
  f.put_f32("states", {N, d.S}, d.states.data());
  f.put_f32("next_states", {N, d.S}, d.next_states.data());
  f.put_i32("actions", {N, d.D}, d.actions.data());
  f.put_f32("rewards", {N}, d.rewards.data());
  f.put_f32("dones", {N}, d.dones.data());
  f.put_i64("episode_ends", {d.episodes()}, d.episode_ends.data());
  f.metadata = d.metadata;
  f.metadata["format"] = "dqn-engine dataset";
  st::write_file(path, f);
}

TransitionBatch assemble_transitions(const Dataset& d, int n_step, double gamma) {
  NStepAssembler a(d.S, d.D, n_step, gamma, 1);
  TransitionBatch out;
  out.S = d.S;
  out.D = d.D;
  std::int64_t first = 0;
  for (std::int64_t end : d.episode_ends) {
    for (std::int64_t t = first; t <= end; ++t) {
      const auto k = std::size_t(t);
      const std::uint8_t term = t == end && d.dones[k] != 0.0f ? 1 : 0, trunc = t == end && !term ? 1 : 0;
      a.add(&d.states[k * std::size_t(d.S)], &d.actions[k * std::size_t(d.D)], &d.rewards[k],
            &d.next_states[k * std::size_t(d.S)], &term, &trunc, out);
    }
    first = end + 1;
  }
  return out;
}

}  // namespace dqn
