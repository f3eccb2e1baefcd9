/** @file mujoco_plugin.cpp
 *  @brief The mujoco environment library: its tasks, their options and the plugin descriptor.
 */
#include <limits>

#include "dqn/env_base.hpp"
#include "mujoco_humanoid.hpp"
#include "mujoco_paths.h"
#include "mujoco_reacher.hpp"

namespace {

using dqn::ParamSchema;
using dqn::ParamType;
using namespace dqn_mujoco;

constexpr double kInf = std::numeric_limits<double>::infinity();

const ParamSchema kHumanoidSchema[] = {
    {"model", ParamType::string, DQN_MUJOCO_MODEL_DIR "/humanoid/humanoid.xml",
     "the MJCF file: bodies torso, head, left_hand, left_foot, right_hand, right_foot; a free root joint", -kInf, kInf},
    {"bins", ParamType::integer, "5", "sub-actions per actuator, evenly over its ctrlrange", 2, 1001},
    {"episode_steps", ParamType::integer, "1000", "control steps before an episode is truncated", 1, 1e8},
    {"control_timestep", ParamType::number, "0.025", "seconds per control step, a whole number of physics steps", 0, 1e6},
};

const ParamSchema kReacherSchema[] = {
    {"model", ParamType::string, "",
     "the MJCF file (empty: reacher.xml shipped with the plugin): a site fingertip, hinge or slide joints", -kInf, kInf},
    {"bins", ParamType::integer, "5", "sub-actions per actuator, evenly over its ctrlrange", 2, 1001},
    {"episode_steps", ParamType::integer, "50", "control steps before an episode is truncated", 1, 1e8},
    {"control_timestep", ParamType::number, "0.05", "seconds per control step, a whole number of physics steps", 0, 1e6},
    {"tolerance", ParamType::number, "0.05", "the fingertip's distance to the target that ends the episode reached (m)", 0, 10},
    {"control_cost", ParamType::number, "0.01", "the weight of the squared controls subtracted from the reward", 0, 1e6},
    {"target_min", ParamType::number, "0.05", "the least distance of a target from the origin (m)", 0, 10},
    {"target_max", ParamType::number, "0.2", "the largest distance of a target from the origin (m)", 0, 10},
};

const dqn::EnvDescriptor kTasks[] = {
    DQN_ENV_TASK(HumanoidStand, "humanoid_stand", "the Control Suite's humanoid standing still", kHumanoidSchema),
    DQN_ENV_TASK(HumanoidWalk, "humanoid_walk", "the Control Suite's humanoid walking at 1 m/s", kHumanoidSchema),
    DQN_ENV_TASK(HumanoidRun, "humanoid_run", "the Control Suite's humanoid running at 10 m/s", kHumanoidSchema),
    DQN_ENV_TASK(Reacher, "reacher", "a planar two-link arm bringing its fingertip to a target", kReacherSchema),
};

}  // namespace

DQN_ENV_PLUGIN("mujoco", "0.1.0", "MuJoCo tasks: the Control Suite's humanoid and a planar reacher", kTasks)
