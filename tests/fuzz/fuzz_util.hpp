/** @file fuzz_util.hpp
 *  @brief What the fuzz targets share: the plugins (for the validator's head checks), the default
 *  pipeline's text, and the rule that an input may be refused only with a std::exception.
 */
#pragma once

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include "core/plugin_loader.hpp"
#include "dqn_config.h"

namespace dqn::fuzz {

/// The plugins on $DQN_PLUGIN_PATH (tools/fuzz.sh points it at the fuzz build's), loaded once.
inline const PluginLoader& plugins() {
  static const PluginLoader l(PluginLoader::search_path_from(""));
  return l;
}

/// pipelines/default.yaml from the source folder, read once.
inline const std::string& default_pipeline() {
  static const std::string text = [] {
    const char* d = std::getenv("DQN_SOURCE_DIR");
    std::ifstream in(std::string(d && *d ? d : DQN_SOURCE_DIR) + "/pipelines/default.yaml", std::ios::binary);
    if (!in) std::abort();  // the target cannot run without it
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  return text;
}

}  // namespace dqn::fuzz
