// libFuzzer: a dataset file (safetensors image) through the reader's checks for the default
// pipeline's network (4 features, 1 branch of 2 actions), then into 3-step transitions.
#include <cstddef>
#include <cstdint>
#include <exception>
#include <vector>

#include "core/safetensors.hpp"
#include "training/dataset.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  dqn::NetworkSpec net;
  net.state = 4;
  net.branches = 1;
  net.actions = 2;
  try {
    const dqn::st::File f = dqn::st::parse(std::vector<std::uint8_t>(data, data + size), "fuzz.safetensors");
    const dqn::Dataset d = dqn::dataset_from(f, net);
    (void)dqn::assemble_transitions(d, 3, 0.99);
  } catch (const std::exception&) {
  }
  return 0;
}
