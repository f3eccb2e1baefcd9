// libFuzzer: command-line overrides (one `key.path=value` a line) over the default pipeline.
#include <cstddef>
#include <cstdint>
#include <exception>
#include <sstream>
#include <string>

#include "fuzz_util.hpp"
#include "pipeline/parse.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  dqn::ParseOptions opt;
  opt.plugins = &dqn::fuzz::plugins();
  std::istringstream lines(std::string(reinterpret_cast<const char*>(data), size));
  for (std::string line; std::getline(lines, line);) opt.overrides.push_back(line);
  try {
    (void)dqn::parse_pipeline(dqn::fuzz::default_pipeline(), "default.yaml", opt);
  } catch (const std::exception&) {
  }
  return 0;
}
