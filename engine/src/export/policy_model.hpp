/** @file policy_model.hpp
 *  @brief The acting network of an engine as a graph of ONNX operators over its parameters: the
 *  trunk (observations → its last layer, Gemm and Relu), the primary head's part
 *  (PluginDescriptor::export_policy, dqn/policy_graph.hpp) up to Q [rows, D, A], and the argmax
 *  over actions. What `dqn export` writes, as ONNX or as safetensors with the graph in its manifest.
 */
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dqn/policy_graph.hpp"

namespace dqn {

class Engine;
class PluginLoader;

struct PolicyModel {
  struct Attr {
    std::string name;
    GraphAttr::Kind kind = GraphAttr::integer;
    std::int64_t i = 0;
    double f = 0;
    std::vector<std::int64_t> ints;
  };
  struct Node {
    std::string op;
    std::vector<std::string> inputs;
    std::string output;
    std::vector<Attr> attrs;
  };
  /// A parameter or a constant: float32 or int64 data, row-major.
  struct Tensor {
    std::string name;
    std::vector<std::int64_t> shape;
    bool is_i64 = false;
    std::vector<float> f32;
    std::vector<std::int64_t> i64;
  };
  int obs_size = 0, branches = 0, actions = 0;
  std::string input = "observations";  ///< float [rows, obs_size]
  std::string q;                       ///< float [rows, branches, actions]
  std::string greedy = "actions";      ///< int64 [rows, branches]: the argmax of q over actions
  std::vector<Tensor> tensors;
  std::vector<Node> nodes;
  /// The primary head ("head": its plugin and instance) and what its export added ("support"…).
  nlohmann::ordered_json manifest;
};

/// The engine's acting network as it stands (its current online parameters). Throws
/// std::invalid_argument naming the primary head when its plugin offers no export (or refuses).
PolicyModel build_policy_model(Engine& e, const PluginLoader& loader);

/// The graph as JSON (nodes with their attributes; tensors by name, shape and dtype, without their
/// data): what the safetensors export's manifest carries so that a reader can evaluate it.
nlohmann::ordered_json graph_json(const PolicyModel& m);

}  // namespace dqn
