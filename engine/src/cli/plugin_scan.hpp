/** @file plugin_scan.hpp
 *  @brief `dqn plugins`' scan: each library loaded and described in a child process of its own, so
 *  that one which crashes, hangs or exits while being loaded takes only its child down.
 */
#pragma once

#include <string>
#include <vector>

namespace dqn::cli {

struct ScannedPlugin {
  std::string path;
  std::string name;     ///< the descriptor's name ("" when it could not be loaded)
  std::string text;     ///< describe_plugin's text
  std::string problem;  ///< why it cannot be used ("" when it can)
};

/// Each file in its own child (fork), one after another, each given timeout_s to finish.
std::vector<ScannedPlugin> scan_plugins(const std::vector<std::string>& files, int timeout_s = 10);

}  // namespace dqn::cli
