/** @file mujoco_runtime.hpp
 *  @brief MuJoCo's process-wide side, kept in one place: loading a model (serialised, since
 *  MuJoCo's compiler swaps the global error handlers while it runs), and error and warning
 *  handlers that turn an engine error into an exception instead of MuJoCo's exit(1) and send
 *  warnings to stderr instead of MUJOCO_LOG.TXT in the working directory.
 */
#pragma once

#include <memory>
#include <stdexcept>
#include <string>

#include <mujoco/mujoco.h>

namespace dqn_mujoco {

/// A MuJoCo engine error (mju_error: a stack overflow, say) raised inside one of our calls.
struct MujocoError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Installs the error and warning handlers while any environment lives, where nobody else set
/// theirs (a host's own handlers are left alone), and takes them out with the last one.
class MujocoHandlers {
 public:
  MujocoHandlers();
  ~MujocoHandlers();
  MujocoHandlers(const MujocoHandlers&) = delete;
  MujocoHandlers& operator=(const MujocoHandlers&) = delete;
};

using ModelPtr = std::shared_ptr<const mjModel>;

/// Loads and compiles an MJCF file. Throws std::invalid_argument with `owner`, the path and
/// MuJoCo's own message where the file is missing or malformed, or where the library's version
/// differs from the headers the plugin was built with.
ModelPtr load_model(const std::string& owner, const std::string& path);

/// The shipped reacher.xml: beside the source when the plugin runs from the build tree, else the
/// installed copy (<datadir>/dqn/mujoco).
std::string shipped_reacher_model();

}  // namespace dqn_mujoco
