// Host copies between steps, through the engine's layout: the batch in, the online parameters
// out, any buffer read as doubles or one element written (tests and tools; each synchronises).
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/engine_access.hpp"

namespace dqn {

void set_batch(Engine& e, const HostBatch& b) {
  b.check(e.spec(), "batch");
  Runtime& rt = e.runtime();
  rt.synchronize();
  EngineOps& io = rt.ops();
  const StepBuffers& sb = e.buffers();
  const std::int64_t n = std::int64_t(b.B) * b.S;
  io.upload_reals(sb.states2, b.states.data(), n);
  io.upload_reals(sb.states2 + n, b.next_states.data(), n);
  io.upload(sb.actions, b.actions.data(), b.actions.size() * 4);
  io.upload_reals(sb.rewards, b.rewards.data(), b.B);
  io.upload_reals(sb.dones, b.dones.data(), b.B);
  io.upload_reals(sb.is_weights, b.is_weights.data(), b.B);
  if (rt.ops().status()) throw std::runtime_error(std::string("set_batch: ") + rt.ops().message());
}

std::vector<float> online_params(Engine& e) {
  Runtime& rt = e.runtime();
  rt.synchronize();
  const std::int64_t P = e.registry().param_count();
  std::vector<float> out(static_cast<std::size_t>(P));
  rt.ops().download_reals(out.data(), e.buffers().params, P);
  return out;
}

std::vector<double> host_buffer(Engine& e, const std::string& name) {
  const Registry& reg = e.registry();
  const auto* b = reg.find(name);
  if (!b) throw std::invalid_argument("host_buffer: no buffer named '" + name + "'");
  Runtime& rt = e.runtime();
  rt.synchronize();
  std::vector<unsigned char> raw(b->bytes);
  rt.ops().download(raw.data(), reg.base() + b->offset_bytes, b->bytes);
  std::vector<double> out(std::size_t(b->numel()));
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (b->dtype == DType::i32) {
      std::int32_t v; std::memcpy(&v, raw.data() + i * 4, 4); out[i] = v;
    } else if (b->dtype == DType::i64) {
      std::int64_t v; std::memcpy(&v, raw.data() + i * 8, 8); out[i] = double(v);
    } else if (reg.real_size() == 8) {
      std::memcpy(&out[i], raw.data() + i * 8, 8);
    } else {
      float v; std::memcpy(&v, raw.data() + i * 4, 4); out[i] = v;
    }
  }
  return out;
}

void host_write(Engine& e, const std::string& name, std::int64_t index, double value) {
  const Registry& reg = e.registry();
  const auto* b = reg.find(name);
  if (!b) throw std::invalid_argument("host_write: no buffer named '" + name + "'");
  if (index < 0 || index >= b->numel()) throw std::out_of_range("host_write: index outside '" + name + "'");
  Runtime& rt = e.runtime();
  rt.synchronize();
  const std::size_t es = reg.element_size(b->dtype);
  unsigned char bytes[8];
  if (b->dtype == DType::i32) { std::int32_t v = std::int32_t(value); std::memcpy(bytes, &v, 4); }
  else if (b->dtype == DType::i64) { std::int64_t v = std::int64_t(value); std::memcpy(bytes, &v, 8); }
  else if (es == 8) std::memcpy(bytes, &value, 8);
  else { float v = float(value); std::memcpy(bytes, &v, 4); }
  rt.ops().upload(reg.base() + b->offset_bytes + std::size_t(index) * es, bytes, es);
}

}  // namespace dqn
