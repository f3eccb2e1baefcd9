/** @file policy_files.hpp
 *  @brief `dqn export`'s files: the acting network (PolicyModel) as ONNX, or as safetensors whose
 *  metadata holds the manifest ("dqn.policy": sizes, the head's support or quantiles, the
 *  controls the bins stand for, the pipeline's hash, and the graph to evaluate it by).
 */
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace dqn {

struct PolicyModel;

/// The manifest: format and version, the network's sizes, what the head added (support, …),
/// `controls` (per branch [lo, hi] or null, from the environment; null when there is none),
/// the pipeline's name and hash, and the graph.
nlohmann::ordered_json policy_manifest(const PolicyModel& m, const std::string& pipeline_name,
                                       const std::string& pipeline_yaml, const nlohmann::ordered_json& controls);

/// Writes the model to `path` ("safetensors" or "onnx"), atomically. Throws std::invalid_argument
/// for another format, st::Error naming the path when it cannot be written.
void write_policy(const PolicyModel& m, const nlohmann::ordered_json& manifest, const std::string& format,
                  const std::string& path);

}  // namespace dqn
