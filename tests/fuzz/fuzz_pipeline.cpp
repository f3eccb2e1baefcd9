// libFuzzer: a pipeline file through the parser and the validator (bounds, aliases, quotes, every
// key's checks, the plugins' parameters). Refusing an input with an error is the right outcome;
// a crash, a sanitizer report, a hang or an exception that is not a std::exception is a finding.
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>

#include "fuzz_util.hpp"
#include "pipeline/parse.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  dqn::ParseOptions opt;
  opt.plugins = &dqn::fuzz::plugins();
  try {
    const dqn::PipelineSpec spec = dqn::parse_pipeline(text, "fuzz.yaml", opt);
    // What validates must write back out and read back in.
    (void)dqn::parse_pipeline(dqn::to_yaml(spec, dqn::fuzz::plugins()), "fuzz-resolved.yaml", opt);
  } catch (const std::exception&) {
  }
  return 0;
}
