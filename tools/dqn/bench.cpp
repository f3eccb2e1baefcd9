// dqn bench: implemented in its own issue.
#include <cstdio>

#include "commands.hpp"

namespace dqn::cli {
int cmd_bench(const BenchArgs&) {
  std::fprintf(stderr, "dqn bench: not implemented in this build yet\n");
  return 3;
}
}  // namespace dqn::cli
