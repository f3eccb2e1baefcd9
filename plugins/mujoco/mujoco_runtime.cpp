/** @file mujoco_runtime.cpp
 *  @brief MuJoCo's global handlers, model loading and where the shipped model lives.
 */
#include "mujoco_runtime.hpp"

#include <dlfcn.h>

#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "mujoco_paths.h"

namespace dqn_mujoco {
namespace {

// Guards the handler count and MuJoCo's compiler (it swaps mju_user_error/warning while it runs
// and keeps the last XML model in a global).
std::mutex& runtime_mutex() {
  static std::mutex m;
  return m;
}
int g_users = 0;
bool g_own_error = false, g_own_warning = false;

// Thrown through MuJoCo's C frames, as MuJoCo's own compiler does with its handler; every
// simulation call of the environments catches it.
void on_error(const char* message) { throw MujocoError(message ? message : "unknown MuJoCo error"); }

// MuJoCo prints a warning the first time it happens in an mjData; an unstable copy is reported
// through EnvStep::unstable, so after a few lines the rest is left out.
constexpr int kWarningsShown = 20;
std::atomic<int> g_warnings{0};
void on_warning(const char* message) {
  const int n = g_warnings.fetch_add(1);
  if (n < kWarningsShown)
    std::fprintf(stderr, "mujoco: MuJoCo warning: %s\n", message ? message : "");
  else if (n == kWarningsShown)
    std::fprintf(stderr, "mujoco: further MuJoCo warnings are not shown\n");
}

// MuJoCo's messages span lines ("XML parse error 3:\nError=..."): one line for ours.
std::string one_line(const char* message) {
  std::string out;
  for (const char* c = message; *c; ++c) {
    const bool space = *c == '\n' || *c == '\r' || *c == '\t' || *c == ' ';
    if (!space) out += *c;
    else if (!out.empty() && out.back() != ' ') out += ' ';
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

std::string real_path(const std::string& p) {
  char buf[PATH_MAX];
  return ::realpath(p.c_str(), buf) ? std::string(buf) : p;
}

}  // namespace

MujocoHandlers::MujocoHandlers() {
  std::lock_guard<std::mutex> lock(runtime_mutex());
  if (g_users++ == 0) {
    g_own_error = mju_user_error == nullptr;
    g_own_warning = mju_user_warning == nullptr;
    if (g_own_error) mju_user_error = on_error;
    if (g_own_warning) mju_user_warning = on_warning;
  }
}

MujocoHandlers::~MujocoHandlers() {
  std::lock_guard<std::mutex> lock(runtime_mutex());
  if (--g_users == 0) {
    if (g_own_error && mju_user_error == on_error) mju_user_error = nullptr;
    if (g_own_warning && mju_user_warning == on_warning) mju_user_warning = nullptr;
    g_own_error = g_own_warning = false;
  }
}

ModelPtr load_model(const std::string& owner, const std::string& path) {
  if (mj_version() != mjVERSION_HEADER)
    throw std::invalid_argument(owner + ": the MuJoCo library is version " + std::to_string(mj_version()) +
                                " but the plugin was built with the headers of version " +
                                std::to_string(mjVERSION_HEADER) + "; rebuild the plugin against the library it runs with");
  char error[1024] = "";
  mjModel* m = nullptr;
  {
    std::lock_guard<std::mutex> lock(runtime_mutex());
    m = mj_loadXML(path.c_str(), nullptr, error, sizeof error);
    mj_freeLastXML();
  }
  if (!m)
    throw std::invalid_argument(owner + ": cannot load the MuJoCo model '" + path + "' (option 'model'): " +
                                (error[0] ? one_line(error) : "MuJoCo gave no reason"));
  if (error[0])
    std::fprintf(stderr, "mujoco: %s: MuJoCo model '%s': %s\n", owner.c_str(), path.c_str(), one_line(error).c_str());
  return ModelPtr(m, [](const mjModel* p) { mj_deleteModel(const_cast<mjModel*>(p)); });
}

std::string shipped_reacher_model() {
  Dl_info info{};
  std::string lib_dir;
  if (::dladdr(reinterpret_cast<void*>(&shipped_reacher_model), &info) && info.dli_fname) {
    const std::string lib = real_path(info.dli_fname);
    lib_dir = lib.substr(0, lib.find_last_of('/'));
  }
  const bool build_tree = !lib_dir.empty() && lib_dir == real_path(DQN_MUJOCO_BUILD_DIR);
  return std::string(build_tree ? DQN_MUJOCO_SOURCE_DIR : DQN_MUJOCO_DATA_DIR) + "/reacher.xml";
}

}  // namespace dqn_mujoco
