// dqn train: implemented in its own issue.
#include <cstdio>

#include "commands.hpp"

namespace dqn::cli {
int cmd_train(const TrainArgs&) {
  std::fprintf(stderr, "dqn train: not implemented in this build yet\n");
  return 3;
}
}  // namespace dqn::cli
