// Offline datasets: the safetensors layout round trip, every kind of bad data refused with the
// tensor and the first bad index named, n-step assembly by episode, and Minari's HDF5 layout
// (written here through libhdf5 where the build has it).
#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "core/safetensors.hpp"
#include "dqn_config.h"
#include "training/dataset.hpp"

#if DQN_HAVE_HDF5
#include <hdf5.h>
#endif

using namespace dqn;
namespace fs = std::filesystem;

namespace {

NetworkSpec cartpole_net() {
  NetworkSpec n;
  n.state = 4;
  n.branches = 1;
  n.actions = 2;
  return n;
}

/// Two episodes over 10 steps: 0..3 terminates, 4..9 is cut short (no done). Step t's state is
/// {t, t+0.1, t+0.2, t+0.3}, its next state t+1's, reward 1, action t % 2.
Dataset small() {
  Dataset d;
  d.path = "small";
  d.S = 4;
  d.D = 1;
  for (int t = 0; t < 10; ++t) {
    for (int j = 0; j < 4; ++j) {
      d.states.push_back(float(t) + 0.1f * float(j));
      d.next_states.push_back(float(t + 1) + 0.1f * float(j));
    }
    d.actions.push_back(t % 2);
    d.rewards.push_back(1.0f);
    d.dones.push_back(t == 3 ? 1.0f : 0.0f);
  }
  d.episode_ends = {3, 9};
  return d;
}

std::string temp_path(const std::string& name) {
  return (fs::temp_directory_path() / ("dqn-dataset-test-" + std::to_string(getpid()) + "-" + name)).string();
}

/// What reading `d` (written as safetensors, or the file `edit` leaves) says; "" when accepted.
std::string read_error(const std::function<void(st::File&)>& edit) {
  const std::string path = temp_path("case.safetensors");
  const Dataset d = small();
  st::File f;
  f.put_f32("states", {10, 4}, d.states.data());
  f.put_f32("next_states", {10, 4}, d.next_states.data());
  f.put_i32("actions", {10, 1}, d.actions.data());
  f.put_f32("rewards", {10}, d.rewards.data());
  f.put_f32("dones", {10}, d.dones.data());
  f.put_i64("episode_ends", {2}, d.episode_ends.data());
  edit(f);
  st::write_file(path, f);
  std::string what;
  try {
    read_dataset(path, cartpole_net());
  } catch (const std::exception& e) {
    what = e.what();
  }
  fs::remove(path);
  return what;
}

void set_f32(st::File& f, const std::string& name, std::size_t i, float v) {
  std::memcpy(f.tensors.at(name).bytes.data() + i * 4, &v, 4);
}

}  // namespace

TEST_CASE("dataset.round_trip_and_behaviour_return") {
  const std::string path = temp_path("rt.safetensors");
  Dataset d = small();
  d.metadata["behaviour_return"] = "5";
  write_dataset(path, d);
  const Dataset r = read_dataset(path, cartpole_net());
  fs::remove(path);
  CHECK(r.states == d.states);
  CHECK(r.next_states == d.next_states);
  CHECK(r.actions == d.actions);
  CHECK(r.rewards == d.rewards);
  CHECK(r.dones == d.dones);
  CHECK(r.episode_ends == d.episode_ends);
  CHECK(r.metadata.at("behaviour_return") == "5");
  CHECK(r.metadata.at("format") == "dqn-engine dataset");
  CHECK(r.mean_return() == doctest::Approx(5.0));  // (4 + 6) / 2
}

TEST_CASE("dataset.bad_data_names_the_tensor_and_index") {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  // [edit, what the error must say, why]
  struct Case {
    std::function<void(st::File&)> edit;
    const char* says;
    const char* why;
  };
  const std::vector<Case> cases = {
      {[&](st::File& f) { set_f32(f, "states", 3 * 4 + 1, nan); }, "tensor 'states': element [3, 1] is nan", "NaN state"},
      {[&](st::File& f) { set_f32(f, "next_states", 9 * 4 + 3, inf); }, "tensor 'next_states': element [9, 3] is inf",
       "infinite next state"},
      {[&](st::File& f) { set_f32(f, "rewards", 5, nan); }, "tensor 'rewards': element [5] is nan", "NaN reward"},
      {[&](st::File& f) {
         const std::int32_t a = 7;
         std::memcpy(f.tensors.at("actions").bytes.data() + 2 * 4, &a, 4);
       },
       "tensor 'actions': element [2, 0] is 7, outside 0..1", "action out of range"},
      {[&](st::File& f) { set_f32(f, "dones", 6, 0.5f); }, "tensor 'dones': element [6] is 0.5 (must be 0 or 1)",
       "a done that is not a flag"},
      {[&](st::File& f) { set_f32(f, "dones", 1, 1.0f); }, "element [1] is 1 but step 1 is not the last of its episode",
       "termination inside an episode"},
      {[&](st::File& f) {
         const std::int64_t e[] = {3, 3, 9};
         f.put_i64("episode_ends", {3}, e);
       },
       "tensor 'episode_ends': element [1] is 3, not after element [0] = 3: episode 1 would be empty", "empty episode"},
      {[&](st::File& f) {
         const std::int64_t e[] = {3, 8};
         f.put_i64("episode_ends", {2}, e);
       },
       "the last episode ends at step 8 but the steps go on to 9", "steps after the last episode"},
      {[&](st::File& f) {
         const std::int64_t e[] = {3, 12};
         f.put_i64("episode_ends", {2}, e);
       },
       "element [1] is 12, past the last step 9", "an episode past the end"},
      {[&](st::File& f) {
         std::vector<float> s(50, 0.0f);
         f.put_f32("states", {10, 5}, s.data());
         f.put_f32("next_states", {10, 5}, s.data());
       },
       "tensor 'states' has 5 features per step but network.state is 4", "another environment's states"},
      {[&](st::File& f) {
         std::vector<float> s(40, 0.0f);
         f.put_f32("states", {40}, s.data());
       },
       "tensor 'states' has shape [40], expected [steps, 4]", "states not a matrix"},
      {[&](st::File& f) {
         std::vector<float> s(36, 0.0f);
         f.put_f32("next_states", {9, 4}, s.data());
       },
       "'next_states' has shape [9,4], expected [10,4]", "fewer next states"},
      {[&](st::File& f) {
         std::vector<float> r(9, 0.0f);
         f.put_f32("rewards", {9}, r.data());
       },
       "'rewards' has shape [9], expected [10]", "fewer rewards"},
      {[&](st::File& f) { f.tensors.erase("episode_ends"); }, "episode_ends", "episode boundaries missing"},
      {[&](st::File& f) {
         std::vector<float> s;
         f.put_f32("states", {0, 4}, s.data());
         f.put_f32("next_states", {0, 4}, s.data());
         f.put_f32("rewards", {0}, s.data());
         f.put_f32("dones", {0}, s.data());
         std::vector<std::int32_t> a;
         f.put_i32("actions", {0, 1}, a.data());
         std::vector<std::int64_t> e;
         f.put_i64("episode_ends", {0}, e.data());
       },
       "it holds no steps", "no data"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.why);
    const std::string what = read_error(c.edit);
    CHECK_MESSAGE(what.find(c.says) != std::string::npos, what);
  }
  // Flags as u8 and actions as i64 [N] read as well.
  CHECK(read_error([](st::File& f) {
          st::Tensor t;
          t.dtype = st::DType::U8;
          t.shape = {10};
          t.bytes = {0, 0, 0, 1, 0, 0, 0, 0, 0, 0};
          f.put("dones", t);
          std::vector<std::int64_t> a(10, 1);
          f.put_i64("actions", {10}, a.data());
        }) == "");
}

TEST_CASE("dataset.truncated_file_is_refused_whole") {
  const std::string path = temp_path("cut.safetensors");
  write_dataset(path, small());
  const auto size = fs::file_size(path);
  fs::resize_file(path, size - 16);  // an interrupted copy
  std::string what;
  try {
    read_dataset(path, cartpole_net());
  } catch (const std::exception& e) {
    what = e.what();
  }
  fs::remove(path);
  CHECK(what.find(path) != std::string::npos);
  CHECK(what.find("truncated") != std::string::npos);
}

TEST_CASE("dataset.n_step_assembly_by_episode") {
  // n = 3, γ = 0.5: episode 0 (4 steps, terminated) gives 4 transitions, episode 1 (6 steps, cut
  // short) 6; no transition reaches across the boundary.
  const TransitionBatch t = assemble_transitions(small(), 3, 0.5);
  REQUIRE(t.size() == 10);
  CHECK(t.rewards[0] == doctest::Approx(1.75));   // 1 + 0.5 + 0.25
  CHECK(t.next_states[0] == 3.0f);                // s_3
  CHECK(t.dones[0] == 0.0f);
  CHECK(t.states[1 * 4] == 1.0f);
  CHECK(t.dones[1] == 1.0f);                      // ends at the termination: no bootstrap
  CHECK(t.rewards[1] == doctest::Approx(1.75));   // steps 1, 2, 3
  CHECK(t.rewards[3] == doctest::Approx(1.0));    // the terminal step alone
  CHECK(t.states[4 * 4] == 4.0f);                 // episode 1 starts fresh
  CHECK(t.dones[9] == 0.0f);                      // cut short: bootstraps from the last next state
  CHECK(t.next_states[9 * 4] == 10.0f);
}

#if DQN_HAVE_HDF5
namespace {
void h5_write(hid_t g, const char* name, hid_t type, std::vector<hsize_t> dims, const void* data) {
  const hid_t space = H5Screate_simple(int(dims.size()), dims.data(), nullptr);
  const hid_t ds = H5Dcreate2(g, name, type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Dwrite(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data);
  H5Dclose(ds);
  H5Sclose(space);
}

/// small() in Minari's layout, episode_0 and episode_1, bools as h5py writes them (an enum over
/// int8); bad_rows: episode_1's observations one row short.
void write_minari(const std::string& path, bool bad_rows) {
  const Dataset d = small();
  const hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  const hid_t boolean = H5Tenum_create(H5T_NATIVE_INT8);
  std::int8_t no = 0, yes = 1;
  H5Tenum_insert(boolean, "FALSE", &no);
  H5Tenum_insert(boolean, "TRUE", &yes);
  std::int64_t first = 0;
  for (std::size_t e = 0; e < d.episode_ends.size(); ++e) {
    const std::int64_t end = d.episode_ends[e], T = end - first + 1;
    const hid_t g = H5Gcreate2(f, ("episode_" + std::to_string(e)).c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    std::vector<double> obs;
    for (std::int64_t t = first; t <= end; ++t)
      for (int j = 0; j < 4; ++j) obs.push_back(d.states[std::size_t(t * 4 + j)]);
    for (int j = 0; j < 4; ++j) obs.push_back(d.next_states[std::size_t(end * 4 + j)]);
    const hsize_t rows = hsize_t(T + 1) - (bad_rows && e == 1 ? 1 : 0);
    h5_write(g, "observations", H5T_NATIVE_DOUBLE, {rows, 4}, obs.data());
    std::vector<std::int64_t> act(d.actions.begin() + first, d.actions.begin() + end + 1);
    h5_write(g, "actions", H5T_NATIVE_INT64, {hsize_t(T)}, act.data());
    std::vector<float> rew(d.rewards.begin() + first, d.rewards.begin() + end + 1);
    h5_write(g, "rewards", H5T_NATIVE_FLOAT, {hsize_t(T)}, rew.data());
    std::vector<std::int8_t> term, trunc;
    for (std::int64_t t = first; t <= end; ++t) {
      term.push_back(d.dones[std::size_t(t)] != 0.0f ? 1 : 0);
      trunc.push_back(t == end && d.dones[std::size_t(t)] == 0.0f ? 1 : 0);
    }
    h5_write(g, "terminations", boolean, {hsize_t(T)}, term.data());
    h5_write(g, "truncations", boolean, {hsize_t(T)}, trunc.data());
    H5Gclose(g);
    first = end + 1;
  }
  H5Tclose(boolean);
  H5Fclose(f);
}
}  // namespace

TEST_CASE("dataset.minari_hdf5") {
  REQUIRE(hdf5_available());
  const std::string path = temp_path("minari.hdf5");
  write_minari(path, false);
  const Dataset r = read_dataset(path, cartpole_net());
  const Dataset d = small();
  CHECK(r.states == d.states);
  CHECK(r.next_states == d.next_states);
  CHECK(r.actions == d.actions);
  CHECK(r.rewards == d.rewards);
  CHECK(r.dones == d.dones);
  CHECK(r.episode_ends == d.episode_ends);
  write_minari(path, true);
  std::string what;
  try {
    read_dataset(path, cartpole_net());
  } catch (const DatasetError& e) {
    what = e.what();
  }
  fs::remove(path);
  CHECK(what.find("episode_1/observations") != std::string::npos);
  CHECK(what.find("has 6 rows, expected 7") != std::string::npos);
}
#else
TEST_CASE("dataset.minari_hdf5: built without libhdf5, reading one says so") {
  CHECK_THROWS_WITH(read_dataset("x.hdf5", cartpole_net()), doctest::Contains("no libhdf5"));
}
#endif
