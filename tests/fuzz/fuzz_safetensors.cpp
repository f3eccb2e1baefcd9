// libFuzzer: a safetensors image through the reader, then every tensor through the typed getters
// (conversions, shapes) as the weights and batch loaders use them.
#include <cstddef>
#include <cstdint>
#include <exception>
#include <vector>

#include "core/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::vector<std::uint8_t> image(data, data + size);
  try {
    const dqn::st::File f = dqn::st::parse(image, "fuzz.safetensors");
    for (const auto& name : f.names()) {
      try { (void)f.get_f32(name); } catch (const std::exception&) {}
      try { (void)f.get_i64(name); } catch (const std::exception&) {}
      try { (void)f.get_i32(name); } catch (const std::exception&) {}
      try { (void)f.get_scalar_i64(name); } catch (const std::exception&) {}
    }
    (void)dqn::st::serialize(f);  // what was read writes back
  } catch (const std::exception&) {
  }
  return 0;
}
