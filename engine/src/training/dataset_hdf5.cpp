/** @file dataset_hdf5.cpp
 *  @brief Minari datasets through libhdf5: each group episode_<k> (in k order) with observations
 *  [T+1, S], actions [T] or [T, D], rewards [T], terminations [T] and truncations [T]. Built where
 *  Meson finds libhdf5 (DQN_HAVE_HDF5); elsewhere reading one says so.
 */
#include "training/dataset.hpp"

#include "dqn_config.h"

#if DQN_HAVE_HDF5
#include <hdf5.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>
#endif

namespace dqn {

#if DQN_HAVE_HDF5
namespace {

/// Closes an HDF5 handle on scope exit.
struct Handle {
  hid_t id;
  herr_t (*close)(hid_t);
  ~Handle() {
    if (id >= 0) close(id);
  }
};

struct Reader {
  std::string path;
  [[noreturn]] void fail(const std::string& where, const std::string& why) const {
    throw DatasetError("dataset '" + path + "' (HDF5): " + where + ": " + why);
  }

  /// A dataset's dimensions and its elements as doubles (any integer, float, bool or enum type).
  std::vector<double> read(hid_t group, const std::string& gname, const char* name, std::vector<hsize_t>& dims) const {
    const std::string where = "'" + gname + "/" + name + "'";
    if (H5Lexists(group, name, H5P_DEFAULT) <= 0) fail(where, "missing (a Minari episode has observations, actions, rewards, terminations, truncations)");
    Handle ds{H5Dopen2(group, name, H5P_DEFAULT), H5Dclose};
    if (ds.id < 0) fail(where, "not a dataset");
    Handle space{H5Dget_space(ds.id), H5Sclose};
    const int rank = H5Sget_simple_extent_ndims(space.id);
    if (rank < 1 || rank > 2) fail(where, "has " + std::to_string(rank) + " dimensions, expected 1 or 2 (nested observation spaces are not read)");
    dims.assign(std::size_t(rank), 0);
    H5Sget_simple_extent_dims(space.id, dims.data(), nullptr);
    // The header's shape checked against what the file holds before anything is allocated from
    // it: no overflow, at most 2^31 elements (the engine's largest buffer), and no more bytes than
    // 256 times the dataset's stored bytes (compression rarely reaches that).
    std::size_t n = 1;
    std::string shape;
    for (hsize_t d : dims) {
      shape += (shape.empty() ? "" : ", ") + std::to_string(d);
      if (d != 0 && n > (std::size_t(1) << 31) / std::size_t(d)) fail(where, "has shape [" + shape + ", …]: more than 2^31 elements");
      n *= std::size_t(d);
    }
    const hsize_t stored = H5Dget_storage_size(ds.id);
    if (n * 8 > std::size_t(stored) * 256 + (std::size_t(1) << 20))
      fail(where, "has shape [" + shape + "] (" + std::to_string(n) + " elements) but only " + std::to_string(stored) +
                      " bytes stored in the file: a damaged header");
    Handle ftype{H5Dget_type(ds.id), H5Tclose};
    H5T_class_t cls = H5Tget_class(ftype.id);
    hid_t base = ftype.id;
    Handle super{-1, H5Tclose};
    if (cls == H5T_ENUM) {  // h5py's bool: an enum over int8
      super.id = H5Tget_super(ftype.id);
      base = super.id;
      cls = H5Tget_class(base);
    }
    std::vector<double> out(n);
    if (cls == H5T_FLOAT) {
      if (H5Dread(ds.id, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) < 0) fail(where, "cannot be read");
    } else if (cls == H5T_INTEGER) {
      const std::size_t size = H5Tget_size(base);
      const bool is_signed = H5Tget_sign(base) == H5T_SGN_2;
      std::vector<unsigned char> raw(n * size);
      Handle mem{H5Tget_native_type(ftype.id, H5T_DIR_ASCEND), H5Tclose};
      if (H5Dread(ds.id, mem.id, H5S_ALL, H5S_ALL, H5P_DEFAULT, raw.data()) < 0) fail(where, "cannot be read");
      for (std::size_t i = 0; i < n; ++i) {
        std::int64_t v = 0;
        std::uint64_t u = 0;
        std::memcpy(&u, raw.data() + i * size, std::min<std::size_t>(size, 8));
        if (is_signed && size < 8 && (u >> (size * 8 - 1)) & 1u) u |= ~std::uint64_t(0) << (size * 8);
        std::memcpy(&v, &u, 8);
        out[i] = is_signed ? double(v) : double(u);
      }
    } else {
      fail(where, "has a type that is neither numbers nor flags");
    }
    return out;
  }
};

}  // namespace

bool hdf5_available() { return true; }

Dataset read_minari_hdf5(const std::string& path) {
  Reader r{path};
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // errors come back as codes, said here with the path
  Handle file{H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose};
  if (file.id < 0) throw DatasetError("dataset '" + path + "': cannot open it as an HDF5 file");
  // The episode groups, in the order of their numbers.
  std::vector<std::pair<long, std::string>> groups;
  H5G_info_t info{};
  if (H5Gget_info(file.id, &info) < 0) r.fail("/", "cannot list the file's groups");
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    char name[256] = {};
    if (H5Lget_name_by_idx(file.id, ".", H5_INDEX_NAME, H5_ITER_INC, i, name, sizeof name, H5P_DEFAULT) < 0) continue;
    const std::string s = name;
    if (s.rfind("episode_", 0) != 0) continue;
    char* end = nullptr;
    const long k = std::strtol(s.c_str() + 8, &end, 10);
    if (end && *end == '\0') groups.emplace_back(k, s);
  }
  if (groups.empty()) r.fail("/", "no group named episode_<k> (not a Minari dataset)");
  std::sort(groups.begin(), groups.end());
  Dataset d;
  d.path = path;
  d.metadata["source"] = "minari hdf5";
  for (const auto& [k, gname] : groups) {
    Handle g{H5Gopen2(file.id, gname.c_str(), H5P_DEFAULT), H5Gclose};
    if (g.id < 0) r.fail(gname, "not a group");
    std::vector<hsize_t> od, ad, rd, td, ud;
    const std::vector<double> obs = r.read(g.id, gname, "observations", od), act = r.read(g.id, gname, "actions", ad),
                              rew = r.read(g.id, gname, "rewards", rd), term = r.read(g.id, gname, "terminations", td),
                              trunc = r.read(g.id, gname, "truncations", ud);
    if (rd[0] < 1) r.fail(gname, "an empty episode (rewards has no steps)");
    const std::size_t T = std::size_t(rd[0]), S = od.size() == 2 ? std::size_t(od[1]) : 1,
                      D = ad.size() == 2 ? std::size_t(ad[1]) : 1;
    if (od[0] != T + 1)
      r.fail(gname + "/observations", "has " + std::to_string(od[0]) + " rows, expected " + std::to_string(T + 1) +
                                          " (one more than the episode's " + std::to_string(T) + " steps)");
    if (ad[0] != T) r.fail(gname + "/actions", "has " + std::to_string(ad[0]) + " rows, expected " + std::to_string(T));
    if (td[0] != T || ud[0] != T) r.fail(gname, "terminations and truncations must have one entry per step (" + std::to_string(T) + ")");
    if (d.S == 0) d.S = int(S), d.D = int(D);
    if (std::size_t(d.S) != S || std::size_t(d.D) != D)
      r.fail(gname, "observations or actions are shaped unlike the first episode's");
    for (std::size_t t = 0; t < T; ++t) {
      for (std::size_t j = 0; j < S; ++j) {
        d.states.push_back(float(obs[t * S + j]));
        d.next_states.push_back(float(obs[(t + 1) * S + j]));
      }
      for (std::size_t j = 0; j < D; ++j) {
        const double a = act[t * D + j];
        if (a != std::floor(a))
          r.fail(gname + "/actions", "element [" + std::to_string(t) + "] is " + std::to_string(a) + ", not a whole number (discrete actions only)");
        d.actions.push_back(std::int32_t(a));
      }
      if (trunc[t] != 0.0 && t + 1 != T)
        r.fail(gname + "/truncations", "element [" + std::to_string(t) + "] is set before the episode's last step");
      d.rewards.push_back(float(rew[t]));
      d.dones.push_back(term[t] != 0.0 ? 1.0f : 0.0f);
    }
    d.episode_ends.push_back(d.steps() - 1);
  }
  return d;
}
#else
bool hdf5_available() { return false; }

Dataset read_minari_hdf5(const std::string& path) {
  throw DatasetError("dataset '" + path + "': this build has no libhdf5 (install libhdf5-dev and reconfigure), so it "
                     "reads Minari's HDF5 datasets only as safetensors (dqn collect writes that layout)");
}
#endif

}  // namespace dqn
