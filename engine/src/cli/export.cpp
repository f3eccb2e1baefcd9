// dqn export: a trained policy's acting network alone, as ONNX or safetensors with its manifest;
// built on dqn::Agent. Never over an existing file unless asked.
#include <cstdio>
#include <exception>
#include <filesystem>

#include "commands.hpp"
#include "dqn/agent.hpp"

namespace dqn::cli {

int cmd_export(const ExportArgs& a) {
  std::error_code ec;
  if (std::filesystem::exists(a.out, ec) && !a.force) {
    std::fprintf(stderr, "dqn export: %s exists; nothing was written (--force replaces it)\n", a.out.c_str());
    return 1;
  }
  try {
    Agent agent = policy_agent(a.common, a.source, a.pipeline, a.best, "cpu");  // exporting needs no GPU
    agent.export_policy(a.out, a.format);
    std::vector<int> bins = agent.actions_per_branch();
    std::printf("policy: %s (%s): observations [rows, %d] → q [rows, %d, %d], actions [rows, %d]\n", a.out.c_str(),
                a.format.c_str(), agent.observation_size(), agent.branches(), bins.empty() ? 0 : bins[0],
                agent.branches());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dqn export: %s\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace dqn::cli
