/** @file graph_runtime.hpp
 *  @brief The CUDA runtime: the arena, planning, graph capture over the backend's lanes and
 *  replay, node priorities from the graph's critical paths, and pinned report copies.
 */
#pragma once

#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <map>
#include <string>
#include <vector>

#include "cuda/cuda_ops.hpp"
#include "core/runtime.hpp"

namespace dqn::cuda {


class CudaRuntime final : public Runtime {
 public:
  CudaRuntime(const CudaSpec& spec, Precision precision, int device);
  ~CudaRuntime() override { release(); }

  EngineBackend& ops() noexcept override { return backend_; }

  void* alloc_arena(std::size_t bytes) override;
  void plan_begin() override;
  void plan_end() override;
  bool captures() const noexcept override { return true; }

  void begin_capture(int graph = 0) override;
  int lanes() const noexcept override { return kMaxLanes; }

  /// More than kNarrowLanes lanes: a wide step (cuda::pdl_for). Set for this capture; end_capture
  /// clears it.
  static constexpr int kNarrowLanes = 8;
  void capture_width(int lanes) override;
  void stage_begin(int lane, const std::vector<int>& after) override;
  void stage_done(int id) override;
  void end_capture() override;
  void replay(int graph = 0) override;
  std::string capture_fault() override;
  std::int64_t graph_nodes() const noexcept override;
  std::vector<GraphNode> graph_node_info() const override;

  /// The backend (its update's structured facts: lab.hpp).
  const CudaBackend& backend() const noexcept { return backend_; }

  void* alloc_host(std::size_t bytes) override;
  void free_host(void* p) noexcept override {
    if (p && cudaFreeHost(p) != cudaSuccess) cudaGetLastError();
  }

  bool ready(int slot) override;
  void wait(int slot) override;
  void replay_on(int graph, int lane) override;
  void copy_on(void* dst, const void* src, std::size_t bytes, int lane) override;
  void record_on(int slot, int lane) override;
  void wait_on(int lane, int slot) override;
  void sync_lane(int lane) override;
  void synchronize() override {
    DQN_CUDA_THROW(cudaStreamSynchronize(backend_.stream()));
    if (actor_) DQN_CUDA_THROW(cudaStreamSynchronize(actor_));
  }

  // CUDA events on the runtime's stream around the enqueued work (timing events made here, once
  // per call: timing is never inside a step).
  double time_us(const std::function<void()>& work) override;
  std::string describe() const override;
  std::size_t peak_bytes() const noexcept override { return backend_.peak_device_bytes(); }

  void profile_range(bool on) noexcept override {
    if ((on ? cudaProfilerStart() : cudaProfilerStop()) != cudaSuccess) cudaGetLastError();  // no profiler: fine
  }

 private:
  void release() noexcept;

  /// Each kernel node's launch priority from the longest chain of kernels that still follows it
  /// in the graph (list scheduling's rank): where the step's lanes fill the GPU, the block
  /// scheduler then places the blocks of the chain that sets the step's length first. The graph
  /// is instantiated to honour node priorities. Results are the same either way (on the H200 all
  /// four heads measured 263.3 against 271.9 µs without priorities, C51 89.9 both).
  void prioritize(cudaGraph_t graph) noexcept;

  /// A graph's nodes (in the graph's order) and, per node, the indices of those it depends on
  /// (the query takes the edge data too: without it, it fails on programmatic edges). False on an
  /// error (cleared).
  static bool graph_edges(cudaGraph_t g, std::vector<cudaGraphNode_t>& nodes, std::vector<std::vector<int>>& deps,
                          std::vector<std::vector<char>>* programmatic = nullptr);
  static bool clear_false() noexcept;
  static cudaGraphNodeType node_type(cudaGraphNode_t n) noexcept;
  /// A graph's nodes (false on an error, which is cleared).
  static bool graph_node_list(cudaGraph_t g, std::vector<cudaGraphNode_t>& nodes);
  /// While capturing, at a stage's end: the capture graph's nodes not seen before belong to stage
  /// `id` (what graph_node_info reports; tools only, so a failure to ask is ignored).
  void note_stage_nodes(int id);
  CudaBackend backend_;
  int device_;
  void* arena_ = nullptr;
  std::size_t arena_bytes_ = 0;
  bool capturing_ = false;
  int capture_graph_ = 0;  ///< the graph being captured
  cudaGraph_t graph_[kGraphs] = {};
  cudaGraphExec_t exec_[kGraphs] = {};
  std::vector<cudaEvent_t> events_;  ///< kEventSlots
  cudaStream_t actor_ = nullptr;     ///< the acting lane (kActorLane), of the greatest priority
  cudaStream_t lane_stream(int lane) const;
  cudaEvent_t fork_ = nullptr;
  std::vector<cudaEvent_t> stage_events_;  ///< by stage id, made on first use (at capture)
  bool joined_[kMaxLanes] = {};
  int lane_last_[kMaxLanes] = {};
  std::map<cudaGraphNode_t, int> node_stage_;  ///< the capture's nodes by the stage that enqueued them
};

}  // namespace dqn::cuda
