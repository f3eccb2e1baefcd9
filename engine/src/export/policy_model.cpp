/** @file policy_model.cpp
 *  @brief The acting network as a graph: the trunk's layers, the primary head's export through the
 *  PolicyGraph the engine implements here, the argmax; parameters from the engine's weights.
 */
#include "export/policy_model.hpp"

#include <set>
#include <stdexcept>

#include "core/engine.hpp"
#include "core/engine_access.hpp"
#include "core/plugin_loader.hpp"
#include "core/safetensors.hpp"
#include "pipeline/parse.hpp"

namespace dqn {

namespace {

/// The engine's side of a head's export: every call records into the model.
class Recorder final : public PolicyGraph {
 public:
  Recorder(PolicyModel& m, const st::File& weights) : m_(m), weights_(weights) { names_.insert(m_.input); }

  const char* trunk_output() const noexcept override { return trunk_out_.c_str(); }
  void set_trunk_output(std::string v) { trunk_out_ = std::move(v); }

  const char* param(const char* name) noexcept override {
    return guard([&]() -> const char* {
      const std::string n = name ? name : "";
      if (!params_.count(n)) {
        if (!weights_.has(n)) throw std::invalid_argument("no parameter '" + n + "' in the network");
        PolicyModel::Tensor t;
        t.name = n;
        t.shape = weights_.get(n).shape;
        t.f32 = weights_.get_f32(n);
        add_tensor(std::move(t));
        params_.insert(n);
      }
      return stable(n);
    });
  }

  const char* constant(const char* name, const float* data, const std::int64_t* shape, std::int32_t rank) noexcept override {
    return guard([&]() -> const char* {
      PolicyModel::Tensor t = shaped(name, shape, rank);
      t.f32.assign(data, data + count(t.shape));
      return add_tensor(std::move(t));
    });
  }

  const char* constant_i64(const char* name, const std::int64_t* data, const std::int64_t* shape,
                           std::int32_t rank) noexcept override {
    return guard([&]() -> const char* {
      PolicyModel::Tensor t = shaped(name, shape, rank);
      t.is_i64 = true;
      t.i64.assign(data, data + count(t.shape));
      return add_tensor(std::move(t));
    });
  }

  const char* node(const char* op, const char* const* inputs, std::uint32_t n_inputs, const char* output,
                   const GraphAttr* attrs, std::uint32_t n_attrs) noexcept override {
    return guard([&]() -> const char* {
      PolicyModel::Node n;
      n.op = op ? op : "";
      if (n.op.empty()) throw std::invalid_argument("a node without an operator");
      for (std::uint32_t i = 0; i < n_inputs; ++i) {
        const std::string in = inputs[i] ? inputs[i] : "";
        if (!names_.count(in)) throw std::invalid_argument(n.op + " node: input '" + in + "' is not defined before it");
        n.inputs.push_back(in);
      }
      n.output = fresh(output);
      for (std::uint32_t i = 0; i < n_attrs; ++i) {
        PolicyModel::Attr a;
        a.name = attrs[i].name ? attrs[i].name : "";
        a.kind = attrs[i].kind;
        a.i = attrs[i].i;
        a.f = attrs[i].f;
        if (attrs[i].kind == GraphAttr::integers) a.ints.assign(attrs[i].ints, attrs[i].ints + attrs[i].n_ints);
        n.attrs.push_back(std::move(a));
      }
      const std::string out = n.output;
      m_.nodes.push_back(std::move(n));
      names_.insert(out);
      return stable(out);
    });
  }

  int q_values(const char* value) noexcept override {
    const std::string v = value ? value : "";
    if (!names_.count(v)) return fail(("q_values: '" + v + "' is not a value of the graph").c_str());
    m_.q = v;
    return 0;
  }

  int manifest(const char* key, const char* json) noexcept override {
    try {
      m_.manifest[key ? key : ""] = nlohmann::ordered_json::parse(json ? json : "null");
      return 0;
    } catch (const std::exception& e) {
      return fail((std::string("manifest '") + (key ? key : "") + "': not JSON: " + e.what()).c_str());
    }
  }

  int fail(const char* message) noexcept override {
    if (error_.empty()) error_ = message ? message : "failed";
    return 1;
  }
  const std::string& error() const { return error_; }

 private:
  template <class F>
  const char* guard(F&& f) noexcept {
    try {
      return f();
    } catch (const std::exception& e) {
      fail(e.what());
    } catch (...) {
      fail("unknown exception");
    }
    return nullptr;
  }
  static std::int64_t count(const std::vector<std::int64_t>& shape) {
    std::int64_t n = 1;
    for (std::int64_t d : shape) {
      if (d < 0) throw std::invalid_argument("a constant's shape has a negative extent");
      n *= d;
    }
    return n;
  }
  PolicyModel::Tensor shaped(const char* name, const std::int64_t* shape, std::int32_t rank) {
    if (rank < 0 || rank > 8) throw std::invalid_argument("a constant's rank must be 0 to 8");
    PolicyModel::Tensor t;
    t.name = fresh(name);
    t.shape.assign(shape, shape + rank);
    return t;
  }
  const char* add_tensor(PolicyModel::Tensor t) {
    const std::string n = t.name;
    m_.tensors.push_back(std::move(t));
    names_.insert(n);
    return stable(n);
  }
  /// The name as the set keeps it: its characters stay where they are while the graph grows.
  const char* stable(const std::string& n) const { return names_.find(n)->c_str(); }
  /// `name`, or with a number appended where the graph has it already.
  std::string fresh(const char* name) const {
    const std::string base = name && *name ? name : "value";
    std::string n = base;
    for (int k = 2; names_.count(n); ++k) n = base + "_" + std::to_string(k);
    return n;
  }
  PolicyModel& m_;
  const st::File& weights_;
  std::string trunk_out_;
  std::set<std::string> names_, params_;
  std::string error_;
};

}  // namespace

PolicyModel build_policy_model(Engine& e, const PluginLoader& loader) {
  const PipelineSpec& spec = e.spec();
  const NetworkDims& net = e.dims();
  PolicyModel m;
  m.obs_size = net.state;
  m.branches = net.branches;
  m.actions = net.actions;
  const st::File weights = save_weights(e, false);
  Recorder rec(m, weights);
  const GraphBuilder g{rec};
  // The trunk: Gemm (x Wᵀ + b) and Relu for every layer.
  std::string x = m.input;
  for (int i = 0; i < net.trunk_layers; ++i) {
    const std::string o = "trunk/" + std::to_string(i);
    x = g.node("Relu", {g.dense(x, "trunk." + std::to_string(i), o)}, o + "/relu");
  }
  if (!rec.error().empty()) throw std::logic_error("the trunk's export: " + rec.error());
  rec.set_trunk_output(x);
  // The primary head's part.
  const HeadSpec& hs = spec.primary();
  const std::size_t index = std::size_t(&hs - spec.heads.data());
  const PluginDescriptor* d = loader.find(hs.plugin);
  if (!d) throw std::invalid_argument("the primary head's plugin '" + hs.plugin + "' is not found");
  const HeadInfo h(spec, index, *d, net);
  const std::string& instance = h.instance;
  const auto exporter = d->struct_size >= kDescriptorSizeMinor2 ? d->export_policy : nullptr;
  if (!exporter)
    throw std::invalid_argument("the primary head '" + instance + "' (plugin " + hs.plugin +
                                ") cannot be exported: its plugin offers no export_policy (dqn/policy_graph.hpp)");
  m.manifest["head"] = {{"plugin", hs.plugin}, {"instance", instance}};
  if (exporter(&h.info, &rec) != 0 || !rec.error().empty())
    throw std::invalid_argument("the primary head '" + instance + "' refused the export: " +
                                (rec.error().empty() ? std::string("(no reason given)") : rec.error()));
  if (m.q.empty())
    throw std::invalid_argument("the primary head '" + instance + "' exported no Q-values (PolicyGraph::q_values)");
  // The output's documented name (a head's own value called so is the output already), and the
  // argmax over actions.
  if (m.q != "q") m.q = g.node("Identity", {m.q}, "q");
  m.greedy = g.node("ArgMax", {m.q}, m.greedy, {GraphBuilder::attr("axis", 2), GraphBuilder::attr("keepdims", 0)});
  if (!rec.error().empty()) throw std::logic_error("the export's outputs: " + rec.error());
  return m;
}

nlohmann::ordered_json graph_json(const PolicyModel& m) {
  nlohmann::ordered_json g;
  g["input"] = {{"name", m.input}, {"shape", {"rows", m.obs_size}}, {"dtype", "float32"}};
  g["outputs"] = {{{"name", m.q}, {"shape", {"rows", m.branches, m.actions}}, {"dtype", "float32"}},
                  {{"name", m.greedy}, {"shape", {"rows", m.branches}}, {"dtype", "int64"}}};
  nlohmann::ordered_json tensors = nlohmann::ordered_json::array();
  for (const auto& t : m.tensors)
    tensors.push_back({{"name", t.name}, {"shape", t.shape}, {"dtype", t.is_i64 ? "int64" : "float32"}});
  g["tensors"] = tensors;
  nlohmann::ordered_json nodes = nlohmann::ordered_json::array();
  for (const auto& n : m.nodes) {
    nlohmann::ordered_json attrs = nlohmann::ordered_json::object();
    for (const auto& a : n.attrs) {
      if (a.kind == GraphAttr::integer) attrs[a.name] = a.i;
      else if (a.kind == GraphAttr::number) attrs[a.name] = a.f;
      else attrs[a.name] = a.ints;
    }
    nodes.push_back({{"op", n.op}, {"inputs", n.inputs}, {"output", n.output}, {"attributes", attrs}});
  }
  g["nodes"] = nodes;
  g["opset"] = 17;
  return g;
}

}  // namespace dqn
