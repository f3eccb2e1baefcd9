/** @file graph_runtime.cpp
 *  @brief The CUDA runtime's capture, replay, graph introspection and report copies, and the
 *  factory the engine calls (make_cuda_runtime).
 */
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/graph_runtime.hpp"

namespace dqn::cuda {

CudaRuntime::CudaRuntime(const CudaSpec& spec, Precision precision, int device) : backend_(spec, precision, device), device_(device) {
  try {
    events_.reserve(kEventSlots);
    for (int i = 0; i < kEventSlots; ++i) {
      cudaEvent_t e = nullptr;
      DQN_CUDA_THROW(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      events_.push_back(e);
    }
    DQN_CUDA_THROW(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
    int least = 0, greatest = 0;
    DQN_CUDA_THROW(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    DQN_CUDA_THROW(cudaStreamCreateWithPriority(&actor_, cudaStreamNonBlocking, greatest));
  } catch (...) {
    release();
    throw;
  }
}

void* CudaRuntime::alloc_arena(std::size_t bytes) {
  if (arena_) throw std::runtime_error("cuda: alloc_arena called twice (the arena is allocated once, at freeze)");
  bytes = std::max<std::size_t>(round_up(bytes, 256), 256);
  DQN_CUDA_THROW(cudaMalloc(&arena_, bytes));  // cudaMalloc aligns to at least 256 bytes
  // Zeroed once, so every byte of it is defined before the first step (as the CPU runtime's).
  DQN_CUDA_THROW(cudaMemset(arena_, 0, bytes));
  DQN_CUDA_THROW(cudaDeviceSynchronize());
  arena_bytes_ = bytes;
  backend_.note_device_bytes(bytes);
  return arena_;
}

void CudaRuntime::plan_begin() {
  if (capturing_) throw std::runtime_error("cuda: plan_begin during graph capture");
  backend_.begin_plan();
}

void CudaRuntime::plan_end() {
  if (!backend_.planning()) throw std::runtime_error("cuda: plan_end without plan_begin");
  const std::size_t need = backend_.end_plan();
  if (need > backend_.scratch_bytes() && (exec_[0] || exec_[1]))
    throw std::runtime_error("cuda: plan_end needs " + std::to_string(need) +
                             " bytes of scratch, but a captured graph already uses the current " +
                             std::to_string(backend_.scratch_bytes()) + ": plan before capturing");
  backend_.grow_scratch(need);
}

void CudaRuntime::begin_capture(int graph) {
  if (graph < 0 || graph >= kGraphs) throw std::runtime_error("cuda: begin_capture of graph " + std::to_string(graph));
  if (backend_.planning()) throw std::runtime_error("cuda: begin_capture while planning (call plan_end first)");
  if (capturing_) throw std::runtime_error("cuda: begin_capture while already capturing");
  backend_.set_lane(0);
  DQN_CUDA_THROW(cudaStreamBeginCapture(backend_.stream(), cudaStreamCaptureModeThreadLocal));
  capturing_ = true;
  capture_graph_ = graph;
  backend_.set_capturing(true);
  // The other lanes join the capture by waiting on this event (on their first stage).
  DQN_CUDA_THROW(cudaEventRecord(fork_, backend_.stream()));
  for (auto& j : joined_) j = false;
  joined_[0] = true;
  for (auto& l : lane_last_) l = -1;
  if (graph == kStepGraph) node_stage_.clear();  // (graph_node_info describes the step's graph)
}

void CudaRuntime::capture_width(int lanes) {
  if (!capturing_) return;
  backend_.set_wide(lanes > kNarrowLanes);
}

void CudaRuntime::stage_begin(int lane, const std::vector<int>& after) {
  if (!capturing_) return;
  backend_.set_lane(lane);
  cudaStream_t st = backend_.stream();
  if (!joined_[lane]) {
    DQN_CUDA_THROW(cudaStreamWaitEvent(st, fork_, 0));
    joined_[lane] = true;
  }
  for (int id : after) {
    if (id < 0 || id >= int(stage_events_.size()) || !stage_events_[std::size_t(id)])
      throw std::runtime_error("cuda: stage_begin waits on stage " + std::to_string(id) + ", which was not marked done");
    DQN_CUDA_THROW(cudaStreamWaitEvent(st, stage_events_[std::size_t(id)], 0));
  }
}

void CudaRuntime::stage_done(int id) {
  if (!capturing_) return;
  if (id < 0) throw std::runtime_error("cuda: stage_done with a negative id");
  if (std::size_t(id) >= stage_events_.size()) stage_events_.resize(std::size_t(id) + 1, nullptr);
  cudaEvent_t& e = stage_events_[std::size_t(id)];
  if (!e) DQN_CUDA_THROW(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  DQN_CUDA_THROW(cudaEventRecord(e, backend_.stream()));
  lane_last_[backend_.lane()] = id;
  if (capture_graph_ == kStepGraph) note_stage_nodes(id);
}

void CudaRuntime::end_capture() {
  if (!capturing_) throw std::runtime_error("cuda: end_capture without begin_capture");
  // Join: lane 0 waits for the last stage of every other lane that took part.
  backend_.set_lane(0);
  for (int l = 1; l < kMaxLanes; ++l)
    if (joined_[l] && lane_last_[l] >= 0)
      DQN_CUDA_THROW(cudaStreamWaitEvent(backend_.stream(), stage_events_[std::size_t(lane_last_[l])], 0));
  capturing_ = false;
  backend_.set_capturing(false);
  backend_.set_wide(false);
  cudaGraph_t graph = nullptr;
  const cudaError_t e = cudaStreamEndCapture(backend_.stream(), &graph);
  if (e != cudaSuccess) {
    cudaGetLastError();
    std::string text = "cuda: capture failed: " + cuda_text(e, "cudaStreamEndCapture(stream, &graph)", __FILE__,
                                                            __LINE__, device_);
    if (backend_.status() != 0) text += "; first op error: " + std::string(backend_.message());
    throw std::runtime_error(text);
  }
  if (backend_.status() != 0) {
    cudaGraphDestroy(graph);
    throw std::runtime_error(std::string("cuda: an op failed during capture, graph discarded: ") + backend_.message());
  }
  prioritize(graph);
  cudaGraphExec_t& exec = exec_[capture_graph_];
  cudaGraph_t& kept = graph_[capture_graph_];
  // Re-capture cheaply: update the instantiated graph in place when the topology allows.
  if (exec) {
    cudaGraphExecUpdateResultInfo info{};
    if (cudaGraphExecUpdate(exec, graph, &info) == cudaSuccess) {
      if (kept) cudaGraphDestroy(kept);
      kept = graph;
      return;
    }
    cudaGetLastError();
    cudaGraphExecDestroy(exec);
    exec = nullptr;
  }
  if (const cudaError_t ie = cudaGraphInstantiate(&exec, graph, cudaGraphInstantiateFlagUseNodePriority);
      ie != cudaSuccess) {
    cudaGraphDestroy(graph);
    exec = nullptr;
    throw_cuda(ie, "cudaGraphInstantiate(&exec, graph, UseNodePriority)", __FILE__, __LINE__, device_);
  }
  if (kept) cudaGraphDestroy(kept);
  kept = graph;
  DQN_CUDA_THROW(cudaGraphUpload(exec, backend_.stream()));
}

std::string CudaRuntime::capture_fault() {
  if (!capturing_) return {};
  cudaStreamCaptureStatus status{};
  const cudaError_t e = cudaStreamIsCapturing(backend_.stream(), &status);
  const cudaError_t last = cudaGetLastError();  // what the offending call returned, if it was kept
  if (e != cudaSuccess) return cudaGetErrorString(e);
  if (status == cudaStreamCaptureStatusInvalidated)
    return std::string("the capture was invalidated") +
           (last != cudaSuccess ? std::string(" (") + cudaGetErrorName(last) + ": " + cudaGetErrorString(last) + ")" : "");
  if (status == cudaStreamCaptureStatusNone) return "the stage's stream is no longer capturing";
  return {};
}

void CudaRuntime::replay(int graph) {
  if (graph < 0 || graph >= kGraphs || !exec_[graph])
    throw std::runtime_error("cuda: replay of graph " + std::to_string(graph) + " before it was captured");
  DQN_CUDA_THROW(cudaGraphLaunch(exec_[graph], backend_.stream()));
}

std::int64_t CudaRuntime::graph_nodes() const noexcept {
  if (!graph_[0]) return 0;
  std::size_t n = 0;
  if (cudaGraphGetNodes(graph_[0], nullptr, &n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return static_cast<std::int64_t>(n);
}

std::vector<Runtime::GraphNode> CudaRuntime::graph_node_info() const {
  std::vector<GraphNode> out;
  std::vector<cudaGraphNode_t> nodes;
  std::vector<std::vector<int>> deps;
  std::vector<std::vector<char>> programmatic;
  if (!graph_[0] || !graph_edges(graph_[0], nodes, deps, &programmatic)) return out;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    GraphNode g;
    g.handle = nodes[i];
    const auto st = node_stage_.find(nodes[i]);
    g.stage = st == node_stage_.end() ? -1 : st->second;
    const cudaGraphNodeType type = node_type(nodes[i]);
    g.kernel = type == cudaGraphNodeTypeKernel;
    g.copy = type == cudaGraphNodeTypeMemcpy;
    g.deps = std::move(deps[i]);
    g.programmatic = std::move(programmatic[i]);
    out.push_back(std::move(g));
  }
  return out;
}

void* CudaRuntime::alloc_host(std::size_t bytes) {
  void* p = nullptr;
  DQN_CUDA_THROW(cudaMallocHost(&p, std::max<std::size_t>(bytes, 1)));
  return p;
}

namespace {
void check_slot(int slot) {
  if (slot < 0 || slot >= Runtime::kEventSlots)
    throw std::runtime_error("cuda: event slot " + std::to_string(slot) + " out of range [0, " +
                             std::to_string(Runtime::kEventSlots) + ")");
}
}  // namespace

void CudaRuntime::wait(int slot) {
  check_slot(slot);
  DQN_CUDA_THROW(cudaEventSynchronize(events_[static_cast<std::size_t>(slot)]));
}

cudaStream_t CudaRuntime::lane_stream(int lane) const {
  if (lane == kLearnerLane) return backend_.stream();
  if (lane == kActorLane) return actor_;
  throw std::runtime_error("cuda: no lane " + std::to_string(lane));
}

void CudaRuntime::replay_on(int graph, int lane) {
  if (graph < 0 || graph >= kGraphs || !exec_[graph])
    throw std::runtime_error("cuda: replay of graph " + std::to_string(graph) + " before it was captured");
  DQN_CUDA_THROW(cudaGraphLaunch(exec_[graph], lane_stream(lane)));
}

void CudaRuntime::copy_on(void* dst, const void* src, std::size_t bytes, int lane) {
  if (bytes == 0) return;
  DQN_CUDA_THROW(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, lane_stream(lane)));
}

void CudaRuntime::record_on(int slot, int lane) {
  check_slot(slot);
  DQN_CUDA_THROW(cudaEventRecord(events_[static_cast<std::size_t>(slot)], lane_stream(lane)));
}

void CudaRuntime::wait_on(int lane, int slot) {
  check_slot(slot);
  DQN_CUDA_THROW(cudaStreamWaitEvent(lane_stream(lane), events_[static_cast<std::size_t>(slot)], 0));
}

void CudaRuntime::sync_lane(int lane) { DQN_CUDA_THROW(cudaStreamSynchronize(lane_stream(lane))); }

bool CudaRuntime::ready(int slot) {
  check_slot(slot);
  const cudaError_t e = cudaEventQuery(events_[static_cast<std::size_t>(slot)]);
  if (e == cudaSuccess) return true;
  if (e == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  throw_cuda(e, "cudaEventQuery(events[slot])", __FILE__, __LINE__, device_);
  return false;
}

double CudaRuntime::time_us(const std::function<void()>& work) {
  cudaEvent_t start = nullptr, stop = nullptr;
  DQN_CUDA_THROW(cudaEventCreate(&start));
  DQN_CUDA_THROW(cudaEventCreate(&stop));
  DQN_CUDA_THROW(cudaStreamSynchronize(backend_.stream()));
  DQN_CUDA_THROW(cudaEventRecord(start, backend_.stream()));
  work();
  DQN_CUDA_THROW(cudaEventRecord(stop, backend_.stream()));
  DQN_CUDA_THROW(cudaEventSynchronize(stop));
  float ms = 0;
  DQN_CUDA_THROW(cudaEventElapsedTime(&ms, start, stop));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return double(ms) * 1000.0;
}

std::string CudaRuntime::describe() const {
  const cudaDeviceProp& p = backend_.props();
  char buf[640];
  std::snprintf(buf, sizeof buf,
                "cuda device %d: %s (sm_%d%d, %d SMs, %.1f GiB), precision %s, cuBLASLt workspace %zu MiB, "
                "scratch %zu KiB, arena %zu KiB at %p (workspace at %p, scratch at %p), update %s",
                device_, p.name, p.major, p.minor, p.multiProcessorCount,
                static_cast<double>(p.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0), precision_name(backend_.precision()),
                kWorkspaceBytes >> 20, backend_.scratch_bytes() >> 10, arena_bytes_ >> 10, arena_,
                backend_.workspace_base(), backend_.scratch_base(), backend_.update_path().c_str());
  return std::string(buf) + "; " + backend_.options_text();
}

void CudaRuntime::release() noexcept {
  if (capturing_) {
    try {
      backend_.set_lane(0);  // the capture began on lane 0's stream
    } catch (...) {
    }
    cudaGraph_t g = nullptr;
    if (cudaStreamEndCapture(backend_.stream(), &g) == cudaSuccess && g) cudaGraphDestroy(g);
    cudaGetLastError();
    capturing_ = false;
    backend_.set_wide(false);
  }
  cudaStreamSynchronize(backend_.stream());
  if (actor_) cudaStreamSynchronize(actor_), cudaStreamDestroy(actor_), actor_ = nullptr;
  for (auto& x : exec_)
    if (x) cudaGraphExecDestroy(x), x = nullptr;
  for (auto& g : graph_)
    if (g) cudaGraphDestroy(g), g = nullptr;
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
  for (cudaEvent_t e : stage_events_)
    if (e) cudaEventDestroy(e);
  stage_events_.clear();
  if (fork_) cudaEventDestroy(fork_);
  fork_ = nullptr;
  if (arena_) cudaFree(arena_);
  events_.clear();
  arena_ = nullptr;
}

void CudaRuntime::prioritize(cudaGraph_t graph) noexcept {
  std::vector<cudaGraphNode_t> nodes;
  std::vector<std::vector<int>> deps;
  int least = 0, greatest = 0;
  if (!graph_edges(graph, nodes, deps) || cudaDeviceGetStreamPriorityRange(&least, &greatest) != cudaSuccess) {
    cudaGetLastError();
    return;
  }
  const std::size_t n = nodes.size();
  std::vector<std::vector<std::size_t>> succ(n);
  std::vector<int> indeg(n, 0), kernel(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    kernel[i] = node_type(nodes[i]) == cudaGraphNodeTypeKernel;
    for (int d : deps[i]) {
      succ[std::size_t(d)].push_back(i);
      ++indeg[i];
    }
  }
  // a topological order (Kahn), then the ranks from the sinks back
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < n; ++i)
    if (indeg[i] == 0) order.push_back(i);
  for (std::size_t q = 0; q < order.size(); ++q)
    for (std::size_t j : succ[order[q]])
      if (--indeg[j] == 0) order.push_back(j);
  std::vector<int> rank(n, 0);
  int top = 1;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    int r = 0;
    for (std::size_t j : succ[*it]) r = std::max(r, rank[j]);
    rank[*it] = r + kernel[*it];
    top = std::max(top, rank[*it]);
  }
  const int levels = least - greatest;  // e.g. 0 (least) … −5 (greatest): 6 levels
  for (std::size_t i = 0; i < n; ++i) {
    if (!kernel[i]) continue;
    cudaLaunchAttributeValue v{};
    v.priority = least - static_cast<int>(std::lround(static_cast<double>(levels) * rank[i] / top));
    if (cudaGraphKernelNodeSetAttribute(nodes[i], cudaLaunchAttributePriority, &v) != cudaSuccess) cudaGetLastError();
  }
}

bool CudaRuntime::graph_edges(cudaGraph_t g, std::vector<cudaGraphNode_t>& nodes, std::vector<std::vector<int>>& deps,
                        std::vector<std::vector<char>>* programmatic) {
  if (!graph_node_list(g, nodes)) return false;
  std::map<cudaGraphNode_t, int> index;
  for (std::size_t i = 0; i < nodes.size(); ++i) index[nodes[i]] = int(i);
  deps.assign(nodes.size(), {});
  if (programmatic) programmatic->assign(nodes.size(), {});
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    std::size_t nd = 0;
    if (cudaGraphNodeGetDependencies(nodes[i], nullptr, nullptr, &nd) != cudaSuccess) return clear_false();
    std::vector<cudaGraphNode_t> on(nd);
    std::vector<cudaGraphEdgeData> edges(nd);
    if (nd > 0 && cudaGraphNodeGetDependencies(nodes[i], on.data(), edges.data(), &nd) != cudaSuccess)
      return clear_false();
    for (std::size_t k = 0; k < nd; ++k)
      if (const auto it = index.find(on[k]); it != index.end()) {
        deps[i].push_back(it->second);
        if (programmatic) (*programmatic)[i].push_back(edges[k].type == cudaGraphDependencyTypeProgrammatic);
      }
  }
  return true;
}

bool CudaRuntime::clear_false() noexcept {
  cudaGetLastError();
  return false;
}

cudaGraphNodeType CudaRuntime::node_type(cudaGraphNode_t n) noexcept {
  cudaGraphNodeType t{};
  if (cudaGraphNodeGetType(n, &t) != cudaSuccess) {
    cudaGetLastError();
    return cudaGraphNodeTypeEmpty;
  }
  return t;
}

bool CudaRuntime::graph_node_list(cudaGraph_t g, std::vector<cudaGraphNode_t>& nodes) {
  std::size_t n = 0;
  if (cudaGraphGetNodes(g, nullptr, &n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  nodes.resize(n);
  if (n > 0 && cudaGraphGetNodes(g, nodes.data(), &n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  nodes.resize(n);
  return true;
}

void CudaRuntime::note_stage_nodes(int id) {
  cudaStreamCaptureStatus status{};
  cudaGraph_t g = nullptr;
  std::vector<cudaGraphNode_t> nodes;
  if (cudaStreamGetCaptureInfo(backend_.stream(), &status, nullptr, &g) != cudaSuccess || !g ||
      !graph_node_list(g, nodes)) {
    cudaGetLastError();
    return;
  }
  for (cudaGraphNode_t n : nodes) node_stage_.emplace(n, id);
}

}  // namespace dqn::cuda

namespace dqn {

std::unique_ptr<Runtime> make_cuda_runtime(const CudaSpec& cuda, Precision precision, int device) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    cudaGetLastError();
    throw std::runtime_error(std::string("cuda: no usable CUDA device (cudaGetDeviceCount: ") +
                             (e != cudaSuccess ? cudaGetErrorString(e) : "0 devices") + ")");
  }
  if (device < 0 || device >= count)
    throw std::runtime_error("cuda: device " + std::to_string(device) + " does not exist (" + std::to_string(count) +
                             " present)");
  return std::make_unique<cuda::CudaRuntime>(cuda, precision, device);
}

int cuda_device_count() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

bool cuda_available() noexcept { return cuda_device_count() > 0; }

}  // namespace dqn
