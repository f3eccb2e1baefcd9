/** @file policy_graph.hpp
 *  @brief The acting network as a graph, for `dqn export`: the engine writes the trunk (observations
 *  → its last layer) and the argmax, a primary head its part in between (the trunk's output → the
 *  Q-value of every branch and action), through PluginDescriptor::export_policy. Nodes are ONNX
 *  operators with ONNX's semantics (opset 17), so the graph is written to ONNX as it stands, and
 *  to safetensors as tensors with the graph in the manifest.
 */
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dqn {

/// An attribute of a node: an integer, a float or a list of integers.
struct GraphAttr {
  enum Kind : std::int32_t { integer = 0, number = 1, integers = 2 };
  const char* name;
  Kind kind;
  std::int64_t i;
  double f;
  const std::int64_t* ints;
  std::uint32_t n_ints;
};

/// Implemented by the engine; a head's export_policy calls it. Every call returns the name of the
/// value it defines (null on an error, with the reason given to fail()). A minor version appends
/// methods at the end.
class PolicyGraph {
 public:
  /// The trunk's output: float [rows, H] (H: the last trunk layer's width, NetworkDims::trunk).
  virtual const char* trunk_output() const noexcept = 0;
  /// The online value of parameter `name` (as the head declared it: "c51.value.0.weight" [out, in]).
  virtual const char* param(const char* name) noexcept = 0;
  /// A float constant of the given shape (row-major; copied during the call).
  virtual const char* constant(const char* name, const float* data, const std::int64_t* shape,
                               std::int32_t rank) noexcept = 0;
  /// An int64 constant (shapes for Reshape, axes).
  virtual const char* constant_i64(const char* name, const std::int64_t* data, const std::int64_t* shape,
                                   std::int32_t rank) noexcept = 0;
  /// A node: ONNX operator `op` over `inputs` (value names) defining `output`.
  virtual const char* node(const char* op, const char* const* inputs, std::uint32_t n_inputs, const char* output,
                           const GraphAttr* attrs, std::uint32_t n_attrs) noexcept = 0;
  /// Names the head's result: float [rows, D, A], the Q-value whose argmax over A acts.
  virtual int q_values(const char* value) noexcept = 0;
  /// A manifest entry: `json` is a JSON value ("[0.0, 0.4, …]", "{\"quantiles\": 32}").
  virtual int manifest(const char* key, const char* json) noexcept = 0;
  virtual int fail(const char* message) noexcept = 0;

 protected:
  ~PolicyGraph() = default;
};

/// The same calls from C++ containers (header-only: a plugin compiles them in).
struct GraphBuilder {
  PolicyGraph& g;
  std::string node(const std::string& op, const std::vector<std::string>& inputs, const std::string& output,
                   const std::vector<GraphAttr>& attrs = {}) const {
    std::vector<const char*> in;
    for (const auto& s : inputs) in.push_back(s.c_str());
    const char* r = g.node(op.c_str(), in.data(), std::uint32_t(in.size()), output.c_str(), attrs.data(),
                           std::uint32_t(attrs.size()));
    return r ? r : "";
  }
  std::string param(const std::string& name) const {
    const char* r = g.param(name.c_str());
    return r ? r : "";
  }
  std::string constant(const std::string& name, const std::vector<float>& data, const std::vector<std::int64_t>& shape) const {
    const char* r = g.constant(name.c_str(), data.data(), shape.data(), std::int32_t(shape.size()));
    return r ? r : "";
  }
  std::string constant_i64(const std::string& name, const std::vector<std::int64_t>& data,
                           const std::vector<std::int64_t>& shape) const {
    const char* r = g.constant_i64(name.c_str(), data.data(), shape.data(), std::int32_t(shape.size()));
    return r ? r : "";
  }
  /// y = x Wᵀ + b for parameter `layer` ("c51.value.0": its .weight [out, in] and .bias [out]).
  std::string dense(const std::string& x, const std::string& layer, const std::string& output) const {
    return node("Gemm", {x, param(layer + ".weight"), param(layer + ".bias")}, output, {attr("transB", 1)});
  }
  static GraphAttr attr(const char* name, std::int64_t v) { return GraphAttr{name, GraphAttr::integer, v, 0.0, nullptr, 0}; }
  static GraphAttr attr_f(const char* name, double v) { return GraphAttr{name, GraphAttr::number, 0, v, nullptr, 0}; }
  /// `v` must outlive the node() call that takes the attribute.
  static GraphAttr attr_ints(const char* name, const std::vector<std::int64_t>& v) {
    return GraphAttr{name, GraphAttr::integers, 0, 0.0, v.data(), std::uint32_t(v.size())};
  }
};

}  // namespace dqn
