/** @file runtime.hpp
 *  @brief What the engine needs of a backend beyond the op table: one arena allocation, graph
 *  capture and replay, and asynchronous report copies. CPU and CUDA each implement it.
 */
#pragma once

#include <cstddef>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/engine_ops.hpp"
#include "dqn/backend.hpp"
#include "pipeline/spec.hpp"

namespace dqn {

class Runtime {
 public:
  virtual ~Runtime() = default;
  /// The backend: the op table the stages run on, and the engine's own ops.
  virtual EngineBackend& ops() noexcept = 0;
  /// One allocation for the whole arena (called once, at freeze). Aligned to 256 bytes.
  virtual void* alloc_arena(std::size_t bytes) = 0;
  /// Dry run: while planning, ops record what scratch they need and do no work; plan_end()
  /// allocates it (once). The engine plans the whole step before the first run or capture.
  virtual void plan_begin() {}
  virtual void plan_end() {}
  /// Graph capture. CPU: no-op (stages run each step). CUDA: begin/end stream capture and
  /// instantiate; replay() launches the graph. Graph kStepGraph is the training step, kActGraph
  /// the act step (what graph_nodes and graph_node_info describe: the step's).
  static constexpr int kStepGraph = 0, kActGraph = 1, kGraphs = 2;
  virtual bool captures() const noexcept { return false; }
  virtual void begin_capture(int /*graph*/ = kStepGraph) {}
  virtual void end_capture() {}
  virtual void replay(int /*graph*/ = kStepGraph) {}
  /// While capturing, after a stage: why the capture can no longer succeed (a stage synchronised,
  /// allocated or copied to the host on the captured stream), or "" while it is sound.
  virtual std::string capture_fault() { return {}; }
  virtual std::int64_t graph_nodes() const noexcept { return 0; }
  /// One node of the captured graph, for tools that explain a replay (dqn-trace): the runtime's
  /// opaque node handle, the stage that enqueued it (its index in capture order, -1: none),
  /// whether it launches a kernel or is a memory copy, and the nodes it waits for (indices
  /// into the same list).
  struct GraphNode {
    const void* handle = nullptr;
    int stage = -1;
    bool kernel = false;
    bool copy = false;
    std::vector<int> deps;
    /// Per entry of deps: whether that edge is programmatic (the node may be placed before the
    /// one it waits for has ended; it waits in griddepcontrol.wait).
    std::vector<char> programmatic;
  };
  /// The captured graph's nodes in the graph's own order (empty: nothing captured, or no graphs).
  virtual std::vector<GraphNode> graph_node_info() const { return {}; }
  /// Lanes a captured step may spread its stages over (CUDA: streams forked from the capturing
  /// stream and joined back into it at end_capture). 1: everything runs in order.
  virtual int lanes() const noexcept { return 1; }
  /// While capturing, before the first stage: how many lanes this step's stages use (CUDA
  /// chooses its launch policy by it: CudaSpec::pdl).
  virtual void capture_width(int /*lanes*/) {}
  /// While capturing: the next stage's ops go to `lane`, after the stages listed in `after` (ids
  /// given to stage_done earlier). Outside capture (and on the CPU) a no-op.
  virtual void stage_begin(int /*lane*/, const std::vector<int>& /*after*/) {}
  /// While capturing: marks the end of stage `id` on its lane (what stage_begin waits for).
  virtual void stage_done(int /*id*/) {}
  /// Host memory the device can copy into asynchronously (pinned for CUDA).
  virtual void* alloc_host(std::size_t bytes) = 0;
  virtual void free_host(void* p) noexcept = 0;
  /// Enqueue an async copy device→host of `bytes` on the learner's lane, marked by slot `slot`'s
  /// event; ready(slot) asks without blocking whether that copy has landed.
  void copy_to_host_async(void* dst, const void* src, std::size_t bytes, int slot) {
    if (slot < 0 || slot >= kEventSlots)
      throw std::runtime_error("runtime: event slot " + std::to_string(slot) + " out of range [0, " +
                               std::to_string(kEventSlots) + ")");
    copy_on(dst, src, bytes, kLearnerLane);
    record_on(slot, kLearnerLane);
  }
  virtual bool ready(int slot) = 0;
  /// Blocks until what was queued before slot's last event has run (before the host memory of a
  /// copy is written again).
  virtual void wait(int slot) = 0;

  /// Lanes of work outside a captured step. The learner's is the stream the step, the replay's
  /// inserts and the reports go to; the actor's a second one, of higher priority, for the act step,
  /// its copies and the snapshot it reads: work there never waits for the learner's queue unless
  /// told to (wait_on). The CPU runs everything at once, in call order.
  static constexpr int kLearnerLane = 0, kActorLane = 1;
  /// Launches a captured graph on a lane (replay() launches on the learner's).
  virtual void replay_on(int graph, int lane) = 0;
  /// An asynchronous copy on a lane, either direction (host memory from alloc_host).
  virtual void copy_on(void* dst, const void* src, std::size_t bytes, int lane) = 0;
  /// Records slot's event on a lane (ready(slot) and wait(slot) ask about it).
  virtual void record_on(int slot, int lane) = 0;
  /// Makes a lane wait, on the device, for slot's last recorded event (the host does not wait).
  virtual void wait_on(int lane, int slot) = 0;
  /// Blocks until a lane's queue has run (the acting side's one wait per environment step).
  virtual void sync_lane(int lane) = 0;
  /// Event slots: 0 and 1 are the reports'; the engine numbers the others.
  static constexpr int kEventSlots = 320;
  /// Wait for all queued work (never inside a step: only before saving or reading results).
  virtual void synchronize() = 0;
  virtual std::string describe() const = 0;
  /// Times `work` (which enqueues steps or replays): device events where the runtime has them,
  /// else the host clock around a synchronised region. Microseconds.
  virtual double time_us(const std::function<void()>& work) {
    synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    work();
    synchronize();
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  }
  /// Bytes of device memory in use at peak (arena + library workspaces), where known.
  virtual std::size_t peak_bytes() const noexcept { return 0; }
  /// Opens (on) or closes the profiler's collection range, where the runtime has a profiler API
  /// (CUDA: cudaProfilerStart/Stop, which a profiler started with collection off, such as
  /// `ncu --profile-from-start off`, waits for); nothing elsewhere or with no profiler attached.
  virtual void profile_range(bool /*on*/) noexcept {}
};

std::unique_ptr<Runtime> make_cpu_runtime(bool f64);
/// Null when the engine was built without CUDA; throws when no usable GPU is present.
/// The CUDA runtime for `cuda` (the pipeline's `cuda:` section) on `device`.
std::unique_ptr<Runtime> make_cuda_runtime(const CudaSpec& cuda, Precision precision, int device);
/// True when the CUDA backend is built and a device is present.
bool cuda_available() noexcept;
/// GPUs present (0 without the CUDA backend or a driver).
int cuda_device_count() noexcept;

}  // namespace dqn
