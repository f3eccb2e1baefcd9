// The built step in words (`dqn step --explain`): the heads and their budgets, the stages in
// order with what each waits for, the registry's layout, how the capture laid the stages out.
#include <algorithm>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/engine_access.hpp"

namespace dqn {

std::vector<std::pair<std::string, std::vector<std::string>>> stage_waits(const Engine& e) {
  const StepPlan& p = e.plan();
  const auto deps = dependencies(p.stages, p.order, e.registry());
  std::vector<std::pair<std::string, std::vector<std::string>>> out;
  for (std::size_t k = 0; k < p.order.size(); ++k) {
    std::vector<std::string> names;
    for (auto j : deps[k]) names.push_back(p.stages[p.order[j]].name);
    out.emplace_back(p.stages[p.order[k]].name, std::move(names));
  }
  return out;
}

int lanes_used(const Engine& e) { return std::max(1, e.plan().lanes.used); }

std::string explain(Engine& e) {
  const PipelineSpec& spec = e.spec();
  const StepPlan& p = e.plan();
  Runtime& rt = e.runtime();
  std::ostringstream os;
  os << "pipeline '" << spec.name << "' on " << rt.describe() << "\n";
  if (e.backend() != BackendKind::cuda)  // (a CUDA runtime's describe() says how it applies them)
    os << "cuda: autotune " << (spec.cuda.autotune ? "true" : "false") << ", gemm " << to_string(spec.cuda.gemm)
       << ", tile_loads " << to_string(spec.cuda.tile_loads) << ", update_cluster "
       << update_cluster_text(spec.cuda.update_cluster) << ", pdl " << to_string(spec.cuda.pdl)
       << " (not used by the cpu backend)\n";
  os << "heads:";
  std::size_t h = 0;
  for (const HeadSpec& hs : spec.heads)
    if (hs.enabled) {
      os << "  " << e.head_names()[h] << " (" << hs.plugin << ", budget " << e.update().fractions()[h] << ")";
      ++h;
    }
  const auto deps = dependencies(p.stages, p.order, e.registry());
  os << "\nstages in order (" << p.order.size() << "):\n" << dqn::explain(p.stages, p.order, &deps);
  os << "registry:\n" << e.registry().layout_text();
  if (p.captured) {
    os << "captured: 1 graph, " << rt.graph_nodes() << " nodes over " << lanes_used(e) << " lane(s), "
       << p.lanes.false_deps << " stage(s) queued behind one they do not need:";
    for (std::size_t k = 0; k < p.order.size() && k < p.lanes.lane.size(); ++k)
      os << (k ? ", " : " ") << p.stages[p.order[k]].name << "@" << p.lanes.lane[k];
    os << "\n";
  }
  return os.str();
}

}  // namespace dqn
