/** @file engine_gpu_util.hpp
 *  @brief What the whole-step gpu tests share (gpu.step: step_gpu_test.cpp, plugin_gpu_test.cpp):
 *  the plugins (the build's, then the test fixtures when meson test names them), parsing a
 *  pipeline with them, and the relative difference ‖a − b‖ / ‖b‖ the tolerances are stated in.
 */
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/plugin_loader.hpp"
#include "pipeline/parse.hpp"

namespace engine_gpu {

/// The build's plugins, then the fixtures (capture_probe, the QR-DQN example built in the tree).
inline const dqn::PluginLoader& loader() {
  static dqn::PluginLoader l([] {
    auto dirs = dqn::PluginLoader::search_path_from("");
    if (const char* f = std::getenv("DQN_TEST_FIXTURES")) dirs.push_back(f);
    return dirs;
  }());
  return l;
}

inline dqn::PipelineSpec parse(const std::string& text) {
  dqn::ParseOptions o;
  o.plugins = &loader();
  return dqn::parse_pipeline(text, "gpu-test.yaml", o);
}

/// ‖a − b‖ / ‖b‖ (huge when the sizes differ).
inline double rel(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return 1e300;
  double d = 0, r = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    d += (a[i] - b[i]) * (a[i] - b[i]);
    r += b[i] * b[i];
  }
  return std::sqrt(d / std::max(r, 1e-300));
}

}  // namespace engine_gpu
