/** @file test_util.hpp
 *  @brief What the C++ tests share: the source folder, the build tree's plugins, a temporary
 *  folder removed at the end.
 */
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "core/plugin_loader.hpp"
#include "dqn_config.h"

namespace dqn::test {

/// $DQN_SOURCE_DIR (set by meson test), else the folder the build was configured from.
inline std::string source_dir() {
  if (const char* d = std::getenv("DQN_SOURCE_DIR"); d && *d) return d;
  return DQN_SOURCE_DIR;
}

/// The plugins on $DQN_PLUGIN_PATH (the build tree's under meson test), loaded once.
inline const PluginLoader& loader() {
  static const PluginLoader l(PluginLoader::search_path_from(""));
  return l;
}

/// A fresh folder under the system's temporary folder, named for the process and `tag`, removed
/// with everything in it when the value goes.
struct TempDir {
  std::filesystem::path path;
  TempDir(const std::string& prefix, const std::string& tag) {
    path = std::filesystem::temp_directory_path() / (prefix + "-" + std::to_string(getpid()) + "-" + tag);
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

}  // namespace dqn::test
