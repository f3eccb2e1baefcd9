/** @file policy_files.cpp
 *  @brief The export's manifest and its two file formats.
 */
#include "export/policy_files.hpp"

#include <stdexcept>

#include "core/safetensors.hpp"
#include "export/onnx_writer.hpp"
#include "export/policy_model.hpp"

namespace dqn {

namespace {
/// FNV-1a, 64 bits, as 16 hex digits: names the pipeline text a policy came from.
std::string text_hash(const std::string& s) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}
}  // namespace

nlohmann::ordered_json policy_manifest(const PolicyModel& m, const std::string& pipeline_name,
                                       const std::string& pipeline_yaml, const nlohmann::ordered_json& controls) {
  nlohmann::ordered_json j;
  j["format"] = "dqn-engine policy";
  j["version"] = 1;
  j["observation_size"] = m.obs_size;
  j["branches"] = m.branches;
  j["actions_per_branch"] = std::vector<int>(std::size_t(m.branches), m.actions);
  for (const auto& [k, v] : m.manifest.items()) j[k] = v;
  j["controls"] = controls;
  j["pipeline"] = pipeline_name;
  j["pipeline_hash"] = "fnv1a64:" + text_hash(pipeline_yaml);
  j["graph"] = graph_json(m);
  return j;
}

void write_policy(const PolicyModel& m, const nlohmann::ordered_json& manifest, const std::string& format,
                  const std::string& path) {
  if (format == "safetensors") {
    st::File f;
    for (const PolicyModel::Tensor& t : m.tensors) {
      if (t.is_i64)
        f.put_i64(t.name, t.shape, t.i64.data());
      else
        f.put_f32(t.name, t.shape, t.f32.data());
    }
    f.metadata["dqn.policy"] = manifest.dump();
    st::write_file(path, f);
  } else if (format == "onnx") {
    st::write_bytes(path, onnx_bytes(m, manifest.dump()));
  } else {
    throw std::invalid_argument("export format '" + format + "': expected safetensors or onnx");
  }
}

}  // namespace dqn
