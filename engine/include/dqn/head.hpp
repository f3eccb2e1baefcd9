/** @file head.hpp
 *  @brief What a loss head sees of the engine: it declares parameters, buffers and stages while
 *  the step is built, gets every pointer once after the registry is frozen, and runs its stages
 *  through the backend's op table and its own code (host loops, or kernels it launches on the
 *  backend's DeviceContext: dqn/device.cuh). Nothing here may throw across the plugin boundary;
 *  dqn/head_base.hpp wraps all of it for a head written in plain C++.
 */
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "dqn/backend.hpp"
#include "dqn/plugin.hpp"

namespace dqn {

enum class DType : std::int32_t { real = 0, i32 = 1, i64 = 2 };

/// What a buffer is for; it decides ordering (state is read before it is written within a
/// step), checkpointing and reporting.
enum class BufferKind : std::int32_t {
  parameter = 0,  ///< online weights (declared through BuildContext::param)
  gradient = 1,
  optimizer = 2,  ///< Adam moments, step counter, spectral-norm vectors, lr: persistent state
  activation = 3,
  scratch = 4,
  input = 5,      ///< batch tensors filled from the replay side
  report = 6,     ///< copied to the host asynchronously
};

inline constexpr std::uint32_t kParamSpectralNorm = 1u;  ///< param flag: spectrally normed matrix
/// Param flag: the tensor starts on 16 bytes (a multiple of 4 elements in the flat parameter
/// buffers; the registry pads before it with elements that stay 0). Set it on the first tensor of
/// each contiguous group (a tensor without it follows the previous one directly), so that GEMMs
/// on the group get aligned kernels.
inline constexpr std::uint32_t kParamAlign = 2u;
/// Elements per alignment unit of kParamAlign.
inline constexpr std::int64_t kParamAlignElems = 4;
/// n rounded up to whole alignment units: the offset of an aligned tensor, and the padded row
/// strides of the heads' buffers (so those rows start 16-byte aligned too).
constexpr std::int64_t align_elems(std::int64_t n) { return (n + kParamAlignElems - 1) / kParamAlignElems * kParamAlignElems; }
/// Param flag: the tensor's rows (a vector's length) are stored rounded up to whole alignment
/// units, align_elems(rows); the rows past `rows` follow the tensor in the flat parameter buffers
/// and stay 0 (nothing writes them: a checkpoint holds the `rows` rows, and their gradient is 0).
/// For output layers whose width is not a multiple of 4 (Z = 51, A·Z = 255, D·A = 15): a GEMM
/// may then write align_elems(rows) output columns (the last ones 0) and get aligned kernels
/// instead of align1 or plain-fp32 ones.
inline constexpr std::uint32_t kParamPadRows = 4u;

/// A stage is one unit of work in the step; reads and writes are buffer names, and the state
/// pseudo-buffers "params", "target" (read before they are written in a step).
struct StageDesc {
  const char* name;       ///< unique, dotted: "c51.forward"
  std::int32_t tag;       ///< passed back to Head::run
  const char* const* reads;
  std::uint32_t n_reads;
  const char* const* writes;
  std::uint32_t n_writes;
};

/// Build-time interface. Each call returns 0 or a non-zero status with a message kept by the
/// engine (the head should return that status from declare()).
class BuildContext {
 public:
  virtual const NetworkDims& net() const noexcept = 0;
  virtual std::int32_t batch() const noexcept = 0;
  /// A parameter tensor `name` (docs/step-math.md's checkpoint name, e.g. "c51.value.0.weight"): rows×cols,
  /// cols = 0 for a bias vector. Parameters of one call sequence are laid out contiguously in
  /// declaration order (kParamAlign and kParamPadRows add zeros before or after a tensor), so
  /// consecutive same-shaped weights can be used as one matrix.
  virtual int param(const char* name, std::int32_t rows, std::int32_t cols, std::int32_t fan_in,
                    std::uint32_t flags) noexcept = 0;
  virtual int buffer(const char* name, DType dtype, const std::int64_t* shape, std::int32_t rank,
                     BufferKind kind) noexcept = 0;
  virtual int stage(const StageDesc& desc) noexcept = 0;
  /// Records a failure message (returned status is then non-zero).
  virtual int fail(const char* message) noexcept = 0;
  // --- appended in 20.1 (the act step); never reorder what is above ---
  /// Rows of the act step (M: the environments acting at once, or the evaluation episodes).
  virtual std::int32_t act_rows() const noexcept = 0;
  /// A stage of the act step rather than the training step (the primary's forward for acting:
  /// see "The primary's contract" below). Run with Head::run like any stage; reads and writes
  /// buffers like one. Only the primary's act stages run.
  virtual int act_stage(const StageDesc& desc) noexcept = 0;
  // --- appended in 20.3 (data parallel) ---
  /// The global batch row of this rank's first batch row: rank × batch() (0 on one GPU). A head
  /// whose draws are per batch row takes them from there on (Backend::uniform_from with first =
  /// batch_offset() × values per row), so that the ranks together draw what one GPU draws for
  /// the global batch.
  virtual std::int64_t batch_offset() const noexcept = 0;
};

/// Bind-time interface: resolved pointers, looked up once. Unknown names give null and record
/// an error that the engine reports with the head's name.
class Resolver {
 public:
  virtual Real real(const char* buffer) const noexcept = 0;
  virtual std::int32_t* i32(const char* buffer) const noexcept = 0;
  virtual std::int64_t* i64(const char* buffer) const noexcept = 0;
  virtual Real param(const char* name) const noexcept = 0;         ///< online θ
  virtual Real target(const char* name) const noexcept = 0;        ///< θ⁻
  virtual Real grad(const char* name) const noexcept = 0;          ///< this head's ∂L_h/∂θ
  // --- appended in 20.2 ---
  /// θ in the acting snapshot: what the primary's act stages read (the learner refreshes it on the
  /// device; acting never reads θ while a step writes it).
  virtual Real act_param(const char* name) const noexcept = 0;
};

class Head {
 public:
  virtual ~Head() = default;
  /// Declare parameters, buffers and stages.
  virtual int declare(BuildContext& ctx) noexcept = 0;
  /// Resolve every pointer the stages need.
  virtual int bind(const Resolver& r) noexcept = 0;
  /// Run the stage declared with `tag` (never allocates, never synchronises).
  virtual void run(std::int32_t tag, Backend& be) noexcept = 0;
  /// The last error message of declare/bind.
  virtual const char* error() const noexcept = 0;
};

/// Declares stage `name` from string lists, in the training step or (act) the act step; the
/// engine copies everything during the call, so the temporaries only live until it returns.
inline int declare_stage(BuildContext& ctx, const std::string& name, std::int32_t tag,
                         const std::vector<std::string>& reads, const std::vector<std::string>& writes,
                         bool act = false) {
  std::vector<const char*> r, w;
  for (const auto& s : reads) r.push_back(s.c_str());
  for (const auto& s : writes) w.push_back(s.c_str());
  const StageDesc desc{name.c_str(), tag, r.data(), std::uint32_t(r.size()), w.data(), std::uint32_t(w.size())};
  return act ? ctx.act_stage(desc) : ctx.stage(desc);
}

/// Buffers the engine provides to every head (rows of the 2B blocks: states first, next_states
/// after). B = batch, S = state, H2 = last trunk width, M = BuildContext::act_rows().
///
/// The primary's contract. The pipeline's primary head (its plugin says can_be_primary) writes,
/// every step:
///  - a_star: the online network's greedy action of every branch at next_states (double DQN),
///    the action auxiliaries bootstrap with;
///  - td_error: a non-negative per-sample error (prioritised replay's priorities);
///  - its loss and dtrunk, as every head;
/// and declares with BuildContext::act_stage one act stage or more, which read act_h2 (the trunk
/// at the acting observations, M rows) and the acting snapshot of its parameters (resolved with
/// Resolver::act_param; declared as reading buf::act_params), and write act_q: the Q-value of every
/// (row, branch, action) whose branch-wise argmax is the greedy action. The engine runs the trunk
/// before and the argmax after them (a captured graph of its own on CUDA), for acting and for
/// evaluation. What else it writes for the auxiliaries is its own buffers' (a distributional
/// primary's projected target, say), named in its documentation.
namespace buf {
inline constexpr const char* states2 = "batch/states2";        ///< [2B,S] states ‖ next_states
inline constexpr const char* actions = "batch/actions";        ///< i32 [B,D]
inline constexpr const char* rewards = "batch/rewards";        ///< [B]
inline constexpr const char* dones = "batch/dones";            ///< [B]
inline constexpr const char* is_weights = "batch/is_weights";  ///< [B]
inline constexpr const char* h2 = "trunk/h2";                  ///< [2B,H2] online trunk output
inline constexpr const char* target_h2 = "target/h2";          ///< [B,H2] target trunk at s'
inline constexpr const char* step = "opt/t";                   ///< i64 [1] Adam step (before this step's update)
// Written by the primary head:
inline constexpr const char* a_star = "target/a_star";         ///< i32 [B,D]
inline constexpr const char* td_error = "report/td_error";     ///< [B]
// The act step (appended in 20.1):
inline constexpr const char* act_h2 = "act/h2";                ///< [M,H2] online trunk at the acting observations
inline constexpr const char* act_q = "act/q";                  ///< [M,D,A] written by the primary's act stages
inline constexpr const char* act_params = "act/params";        ///< [P] the acting snapshot of θ (20.2)
// Per head (suffix the head's instance name): "loss/<h>" [1] and "dtrunk/<h>" [B,H2] (the head's
// ∂L/∂h2, unmasked: the engine applies the trunk's top ReLU to every head's at once).
}  // namespace buf

}  // namespace dqn
