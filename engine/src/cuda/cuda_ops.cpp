/** @file cuda_ops.cpp
 *  @brief The CUDA backend's set-up, lanes, scratch and error records, the context heads launch
 *  their own kernels through, and its element and distribution ops (each checks its arguments,
 *  then launches its kernel on the lane's stream).
 */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "head_kernels.cuh"
#include "cuda/cuda_ops.hpp"
#include "core/replay_tree.h"

namespace dqn::cuda {

CudaBackend::CudaBackend(const CudaSpec& spec, Precision precision, int device)
    : spec_(spec), precision_(precision), device_(device), tile_(tile_mode_of(spec.gemm)), autotune_(spec.autotune),
      tile_ldm_(ldm_mode_of(spec.tile_loads)) {
  try {
    DQN_CUDA_THROW(cudaSetDevice(device));
    DQN_CUDA_THROW(cudaGetDeviceProperties(&props_, device));
    // One stream per slot (lane 0 is the runtime's stream; the others join a capture forked from
    // it). Each slot has its own slice of the library workspace and of the scratch, so ops on
    // different lanes may run concurrently.
    for (auto& st : streams_) {
      DQN_CUDA_THROW(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
      cuda::set_stream_pdl(st, pdl_mode(spec_.pdl), false);
    }
    for (auto& e : side_events_) DQN_CUDA_THROW(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    stream_ = streams_[0];
    DQN_CUBLAS_THROW(cublasCreate(&blas_));
    DQN_CUBLAS_THROW(cublasLtCreate(&lt_));
    DQN_CUDA_THROW(cudaMalloc(&workspace_base_, kWorkspaceBytes * kSlots));
    // Zeroed once: some cuBLASLt kernels read words of the workspace they have not written
    // (initcheck), whose values they do not use; zero keeps those reads defined.
    DQN_CUDA_THROW(cudaMemset(workspace_base_, 0, kWorkspaceBytes * kSlots));
    workspace_ = workspace_base_;
    note_device_bytes(kWorkspaceBytes * kSlots);
    // cublasSetStream resets the workspace to cuBLAS's own pool: set the stream first.
    DQN_CUBLAS_THROW(cublasSetStream(blas_, stream_));
    DQN_CUBLAS_THROW(cublasSetWorkspace(blas_, workspace_, kWorkspaceBytes));
    DQN_CUBLAS_THROW(cublasSetMathMode(blas_, precision == Precision::fp32 ? CUBLAS_PEDANTIC_MATH : CUBLAS_DEFAULT_MATH));
    DQN_CUDA_THROW(cudaMalloc(&scratch_base_, kInitialScratchBytes * kSlots));
    DQN_CUDA_THROW(cudaMemset(scratch_base_, 0, kInitialScratchBytes * kSlots));
    scratch_ = scratch_base_;
    scratch_bytes_ = kInitialScratchBytes;
    note_device_bytes(kInitialScratchBytes * kSlots);
    // tile_gemm's shared memory beyond 48 KiB, granted once (tf32 only; without it, cuBLASLt).
    if (precision_ == Precision::tf32 && tile_.on && cuda::tile_gemm_prepare() != cudaSuccess) {
      cudaGetLastError();
      tile_ = TileMode{false, false, -1};
    }
    // the cluster update where the device launches such clusters (CudaSpec::update_cluster: the
    // size, or off: the update's separate kernels)
    if (spec_.update_cluster >= 0) update_cluster_ = cuda::update_cluster_size(spec_.update_cluster);
    // a measurement tool asked for the cluster update's phase stamps (a lab build's
    // lab::record_update_clock)
    if (DQN_LAB && update_cluster_ > 0 && lab::update_clock_wanted()) {
      DQN_CUDA_THROW(cudaMalloc(&clock_, kClockBytes));
      DQN_CUDA_THROW(cudaMemset(clock_, 0, kClockBytes));
      note_device_bytes(kClockBytes);
    }
    // The memsets above run on the legacy stream, which does not order work on the lanes
    // (non-blocking streams): done before any op can run on a lane.
    DQN_CUDA_THROW(cudaDeviceSynchronize());
  } catch (...) {
    release();
    throw;
  }
}

const DeviceContext* CudaBackend::device() const noexcept {
  DeviceContext& c = context_;
  c.stream = stream_;
  c.device = device_;
  c.sm_count = props_.multiProcessorCount;
  c.cc_major = props_.major;
  c.cc_minor = props_.minor;
  c.pdl_max_shared = cuda::pdl_shared_limit(stream_);
  c.planning = planning_ ? 1 : 0;
  c.precision = static_cast<std::int32_t>(precision_);
  c.max_shared_optin = static_cast<std::int32_t>(props_.sharedMemPerBlockOptin);
  return &c;
}

void CudaBackend::bias_act(Real y, Real bias, int rows, int cols, int ldy, Act act) noexcept {
  constexpr const char* op = "bias_act";
  if (!matrix_ok(op, rows, cols, ldy) || rows == 0 || cols == 0) return;
  if (!real_ok(y, op, "y")) return;
  if (bias && !real_ok(bias, op, "bias")) return;  // null bias: activation only
  if (act != Act::none && act != Act::relu) return fail(op, "unknown activation");
  if (planning_) return;
  DQN_CUDA_OK(op, cuda::bias_act(stream_, y.as<float>(), bias ? bias.as<const float>() : nullptr, rows, cols, ldy,
                                 act == Act::relu));
}

void CudaBackend::relu_backward(Real dy, Real y, int rows, int cols, int ld) noexcept {
  constexpr const char* op = "relu_backward";
  if (!matrix_ok(op, rows, cols, ld) || rows == 0 || cols == 0) return;
  if (!real_ok(dy, op, "dy") || !real_ok(y, op, "y")) return;
  if (planning_) return;
  DQN_CUDA_OK(op, cuda::relu_backward(stream_, dy.as<float>(), y.as<const float>(), rows, cols, ld));
}

void CudaBackend::bias_grad(Real db, Real dy, int rows, int cols, int ldy, float beta) noexcept {
  constexpr const char* op = "bias_grad";
  if (!matrix_ok(op, rows, cols, ldy) || cols == 0) return;
  if (!real_ok(db, op, "db")) return;
  if (rows > 0 && !real_ok(dy, op, "dy")) return;
  if (planning_) return;
  DQN_CUDA_OK(op, cuda::bias_grad(stream_, db.as<float>(), dy.as<const float>(), rows, cols, ldy, beta));
}

void CudaBackend::dueling_combine(Real logits, Real v, int ldv, Real adv, int rows, int D, int A, int Z) noexcept {
  constexpr const char* op = "dueling_combine";
  if (rows < 0 || D < 0 || A < 0 || Z < 0) return fail(op, "negative size");
  if (rows == 0 || D == 0 || A == 0 || Z == 0) return;
  if (ldv < Z) return fail(op, "ldv smaller than Z");
  if (!real_ok(logits, op, "logits") || !real_ok(v, op, "v") || !real_ok(adv, op, "adv")) return;
  if (planning_) return;
  DQN_CUDA_OK(op, cuda::dueling_combine(stream_, logits.as<float>(), v.as<const float>(), ldv, adv.as<const float>(),
                                        rows, D, A, Z));
}

void CudaBackend::dueling_backward(Real dv, int lddv, Real dadv, int lddadv, Real dlogits, int rows, int D, int A,
                      int Z) noexcept {
  constexpr const char* op = "dueling_backward";
  if (rows < 0 || D < 0 || A < 0 || Z < 0) return fail(op, "negative size");
  if (rows == 0 || Z == 0) return;
  if (lddv < Z) return fail(op, "lddv smaller than Z");
  const int ldd = ld_or(lddadv, A * Z);
  if (ldd < A * Z) return fail(op, "lddadv smaller than A·Z");
  if (!real_ok(dv, op, "dv")) return;
  const bool any = D > 0 && A > 0;
  if (any && (!real_ok(dadv, op, "dadv") || !real_ok(dlogits, op, "dlogits"))) return;
  if (planning_) return;
  DQN_CUDA_OK(op, cuda::dueling_backward(stream_, dv.as<float>(), lddv, any ? dadv.as<float>() : nullptr, ldd,
                                         any ? dlogits.as<const float>() : nullptr, rows, any ? D : 0, A, Z));
}

void CudaBackend::log_softmax(Real logp, Real x, int rows, int n) noexcept {
  constexpr const char* op = "log_softmax";
  if (rows < 0 || n < 0) return fail(op, "negative size");
  if (rows == 0 || n == 0) return;
  if (!real_ok(logp, op, "logp") || !real_ok(x, op, "x")) return;
  if (planning_) return;
  DQN_CUDA_OK(op, cuda::log_softmax(stream_, logp.as<float>(), x.as<const float>(), rows, n));
}

void CudaBackend::expected_q(Real q, Real logp, int rows, int Z, float v_min, float v_max) noexcept {
  constexpr const char* op = "expected_q";
  if (rows < 0 || Z < 0) return fail(op, "negative size");
  if (rows == 0) return;
  if (!real_ok(q, op, "q") || (Z > 0 && !real_ok(logp, op, "logp"))) return;
  if (planning_) return;
  DQN_CUDA_OK(op, cuda::expected_q(stream_, q.as<float>(), logp.as<const float>(), rows, Z, v_min, v_max));
}

void CudaBackend::argmax(std::int32_t* idx, Real q, int rows, int n) noexcept {
  constexpr const char* op = "argmax";
  if (rows < 0 || n <= 0) return fail(op, "rows < 0 or n <= 0");
  if (rows == 0) return;
  if (!idx) return fail(op, "null idx");
  if (!real_ok(q, op, "q")) return;
  if (planning_) return;
  DQN_CUDA_OK(op, cuda::argmax(stream_, idx, q.as<const float>(), rows, n));
}

void CudaBackend::fill(Real x, float value, std::int64_t n) noexcept {
  constexpr const char* op = "fill";
  if (n < 0) return fail(op, "negative size");
  if (n == 0 || !real_ok(x, op, "x") || planning_) return;
  DQN_CUDA_OK(op, cuda::fill(stream_, x.as<float>(), value, n));
}

void CudaBackend::copy(Real dst, Real src, std::int64_t n) noexcept {
  constexpr const char* op = "copy";
  if (n < 0) return fail(op, "negative size");
  if (n == 0 || !real_ok(dst, op, "dst") || !real_ok(src, op, "src")) return;
  if (dst.p == src.p) return;
  const auto d = reinterpret_cast<std::uintptr_t>(dst.p), s = reinterpret_cast<std::uintptr_t>(src.p);
  const auto bytes = static_cast<std::uintptr_t>(n) * 4;
  if (d < s + bytes && s < d + bytes) return fail(op, "overlapping ranges are not supported on the device");
  if (planning_) return;
  DQN_CUDA_OK(op, cudaMemcpyAsync(dst.p, src.p, bytes, cudaMemcpyDeviceToDevice, stream_));
}

void CudaBackend::axpy(Real y, Real x, float alpha, std::int64_t n) noexcept {
  constexpr const char* op = "axpy";
  if (n < 0) return fail(op, "negative size");
  if (n == 0 || !real_ok(y, op, "y") || !real_ok(x, op, "x") || planning_) return;
  DQN_CUDA_OK(op, cuda::axpy(stream_, y.as<float>(), x.as<const float>(), alpha, n));
}

void CudaBackend::weighted_mean(Real out, Real x, Real w, std::int64_t n) noexcept {
  constexpr const char* op = "weighted_mean";
  if (n < 0) return fail(op, "negative size");
  if (!real_ok(out, op, "out") || (n > 0 && (!real_ok(x, op, "x") || !real_ok(w, op, "w"))) || planning_) return;
  DQN_CUDA_OK(op, cuda::weighted_mean(stream_, out.as<float>(), n > 0 ? x.as<const float>() : nullptr,
                                      n > 0 ? w.as<const float>() : nullptr, n));
}

void CudaBackend::uniform(const Uniform& a) noexcept { uniform_from(a, 0); }

void CudaBackend::uniform_from(const Uniform& a, std::int64_t first) noexcept {
  constexpr const char* op = "uniform";
  if (a.n < 0) return fail(op, "negative size");
  if (first < 0) return fail(op, "negative first value");
  if (a.n == 0 || !real_ok(a.out, op, "out") || planning_) return;
  DQN_CUDA_OK(op, cuda::uniform(stream_, a, first));
}

namespace {
const char* replay_store_error(const ReplayStore& r) {
  if (const char* why = replay::store_error(r)) return why;
  return r.states.esize != 4 ? "the CUDA backend's reals are f32" : nullptr;
}
}  // namespace

void CudaBackend::replay_insert(const ReplayInsert& a) noexcept {
  constexpr const char* op = "replay_insert";
  if (const char* why = replay_store_error(a.store)) return fail(op, why);
  if (a.n < 1 || a.n > a.store.capacity) return fail(op, "n must be in 1..capacity");
  if (!a.states || !a.next_states || !a.actions || !a.rewards || !a.dones) return fail(op, "null staging pointer");
  if (planning_) return;
  DQN_CUDA_OK(op, cuda::replay_insert(stream_, a));
}

void CudaBackend::replay_sample(const ReplaySample& a) noexcept {
  constexpr const char* op = "replay_sample";
  if (const char* why = replay_store_error(a.store)) return fail(op, why);
  if (a.B < 1) return fail(op, "B must be at least 1");
  if (!a.states2 || !a.actions || !a.rewards || !a.dones || !a.is_weights || !a.indices)
    return fail(op, "null batch pointer");
  if (planning_) return;
  DQN_CUDA_OK(op, cuda::replay_sample(stream_, a));
}

void CudaBackend::replay_priorities(const ReplayPriorities& a) noexcept {
  constexpr const char* op = "replay_priorities";
  if (const char* why = replay_store_error(a.store)) return fail(op, why);
  if (!a.store.tree) return fail(op, "the replay is not prioritised");
  if (a.B < 1 || !a.indices || !a.td_error) return fail(op, "B must be at least 1, with indices and td_error");
  if (planning_) return;
  DQN_CUDA_OK(op, cuda::replay_priorities(stream_, a));
}

void CudaBackend::upload_reals(Real dst, const float* src, std::int64_t n) noexcept {
  constexpr const char* op = "upload_reals";
  if (n < 0) return fail(op, "negative size");
  if (n == 0 || !real_ok(dst, op, "dst")) return;
  if (!src) return fail(op, "null src");
  transfer(op, dst.p, src, static_cast<std::size_t>(n) * 4);
}

void CudaBackend::download_reals(float* dst, Real src, std::int64_t n) noexcept {
  constexpr const char* op = "download_reals";
  if (n < 0) return fail(op, "negative size");
  if (n == 0 || !real_ok(src, op, "src")) return;
  if (!dst) return fail(op, "null dst");
  transfer(op, dst, src.p, static_cast<std::size_t>(n) * 4);
}

void CudaBackend::expected_q_backward(Real dlogits, Real dq, Real logp, int rows, int Z, float v_min,
                         float v_max) noexcept {
  constexpr const char* op = "expected_q_backward";
  if (rows < 0 || Z < 0) return fail(op, "negative size");
  if (rows == 0 || Z == 0) return;
  if (!real_ok(dlogits, op, "dlogits") || !real_ok(dq, op, "dq") || !real_ok(logp, op, "logp")) return;
  if (planning_) return;
  DQN_CUDA_OK(op, cuda::expected_q_backward(stream_, dlogits.as<float>(), dq.as<const float>(),
                                            logp.as<const float>(), rows, Z, v_min, v_max));
}

void CudaBackend::dueling_dist(const DuelingDist& a) noexcept {
  constexpr const char* op = "dueling_dist";
  if (a.rows < 0 || a.D < 0 || a.A <= 0 || a.Z <= 0) return fail(op, "need rows, D >= 0, A, Z >= 1");
  if (a.star_from < 0 || a.star_from > a.rows) return fail(op, "star_from outside [0, rows]");
  if (a.a_star && !a.q) return fail(op, "a_star needs q");
  if (a.rows == 0 || a.D == 0) return;
  if (a.ldv < a.Z) return fail(op, "ldv smaller than Z");
  if (ld_or(a.ldadv, a.A * a.Z) < a.A * a.Z) return fail(op, "ldadv smaller than A·Z");
  if (!real_ok(a.logp, op, "logp") || !real_ok(a.v, op, "v") || !real_ok(a.adv, op, "adv")) return;
  if (a.q && !real_ok(a.q, op, "q")) return;
  if (cuda::dueling_dist_shared_bytes(a.Z) > 48 * 1024) return fail(op, "Z too large for shared memory (over 6,128 atoms)");
  if (std::int64_t(a.rows) * a.D > 0x7fffffff) return fail(op, "rows·D too large");
  if (planning_) return;
  DQN_CUDA_OK(op, cuda::dueling_dist(stream_, a, double_math()));
}

void CudaBackend::head_forward(const HeadForward& a) noexcept {
  if ((a.wv2_rows != 0 && a.wv2_rows < a.Z) || (a.wb2_rows != 0 && a.wb2_rows < a.A * a.Z))
    return fail("head_forward", "wv2_rows/wb2_rows smaller than Z/A·Z");
  const HeadForwardOps o = head_forward_ops(a);
  gemm(o.hidden);
  if (!beside("head_forward", o.value, o.adv)) return;
  if (a.logp) dueling_dist(o.dist);
}

void CudaBackend::head_backward_inputs(const HeadBackward& a) noexcept {
  if (a.wb2_rows != 0 && a.wb2_rows < a.A * a.Z) return fail("head_backward_inputs", "wb2_rows smaller than A·Z");
  const HeadBackwardOps o = head_backward_ops(a);  // each GEMM masked by its hidden columns
  beside("head_backward_inputs", o.value, o.branch);
}

bool CudaBackend::beside(const char* op, const Gemm& side, const Gemm& main) noexcept {
  const int lane = lane_;
  const bool events = !planning_;  // while planning, nothing is launched
  bool ok = status_ == 0 && (!events || DQN_CUDA_OK(op, cudaEventRecord(side_events_[0], stream_)));
  if (ok && switch_slot(op, kMaxLanes + lane)) {
    if (events) ok = DQN_CUDA_OK(op, cudaStreamWaitEvent(stream_, side_events_[0], 0));
    if (ok) gemm(side);
    if (ok && events) ok = DQN_CUDA_OK(op, cudaEventRecord(side_events_[1], stream_));
    ok = switch_slot(op, lane) && ok;
  }
  if (!ok) return false;
  gemm(main);
  return !events || DQN_CUDA_OK(op, cudaStreamWaitEvent(stream_, side_events_[1], 0));
}

bool CudaBackend::switch_slot(const char* op, int slot) noexcept {
  try {
    use_slot(slot);
    return true;
  } catch (const std::exception& e) {
    record(1, op, e.what());
    return false;
  }
}

void CudaBackend::relu_bias_grad(Real dy, Real y, Real db, int rows, int cols, int ld, int heads, std::int64_t stride_dy,
                    std::int64_t stride_y, std::int64_t stride_db) noexcept {
  constexpr const char* op = "relu_bias_grad";
  if (!matrix_ok(op, rows, cols, ld) || cols == 0 || heads == 0) return;
  if (heads < 0 || heads > 65535) return fail(op, "heads outside [0, 65535]");
  if (!db && !y) return;  // neither masks nor sums
  if (db && !real_ok(db, op, "db")) return;
  if (rows > 0 && !real_ok(dy, op, "dy")) return;
  if (rows > 0 && y && !real_ok(y, op, "y")) return;
  if (!db && rows == 0) return;
  if (planning_) return;
  DQN_CUDA_OK(op, cuda::relu_bias_grad(stream_, rows > 0 ? dy.as<float>() : nullptr,
                                       rows > 0 && y ? y.as<const float>() : nullptr,
                                       db ? db.as<float>() : nullptr, rows, cols, ld, heads, stride_dy, stride_y,
                                       stride_db));
}

void CudaBackend::note_device_bytes(std::size_t bytes) noexcept {
  device_bytes_ += bytes;
  peak_bytes_ = std::max(peak_bytes_, device_bytes_);
}

void CudaBackend::begin_plan() noexcept {
  planning_ = true;
  plan_need_ = 0;
}

std::size_t CudaBackend::end_plan() noexcept {
  planning_ = false;
  return plan_need_;
}

void CudaBackend::grow_scratch(std::size_t bytes) {
  if (bytes <= scratch_bytes_) return;
  bytes = round_up(bytes, 256);
  DQN_CUDA_THROW(cudaDeviceSynchronize());
  DQN_CUDA_THROW(cudaFree(scratch_base_));
  forget_device_bytes(scratch_bytes_ * kSlots);
  scratch_ = scratch_base_ = nullptr;
  scratch_bytes_ = 0;
  DQN_CUDA_THROW(cudaMalloc(&scratch_base_, bytes * kSlots));
  DQN_CUDA_THROW(cudaMemset(scratch_base_, 0, bytes * kSlots));
  DQN_CUDA_THROW(cudaDeviceSynchronize());  // (the legacy stream's memset before the lanes' work)
  scratch_bytes_ = bytes;
  scratch_ = static_cast<char*>(scratch_base_) + static_cast<std::size_t>(lane_) * scratch_bytes_;
  note_device_bytes(bytes * kSlots);
}

void CudaBackend::set_lane(int lane) {
  if (lane < 0 || lane >= kMaxLanes)
    throw std::runtime_error("cuda: lane " + std::to_string(lane) + " outside [0, " + std::to_string(kMaxLanes) + ")");
  use_slot(lane);
}

void CudaBackend::use_slot(int lane) {
  if (lane == lane_) return;
  lane_ = lane;
  stream_ = streams_[lane];
  workspace_ = static_cast<char*>(workspace_base_) + static_cast<std::size_t>(lane) * kWorkspaceBytes;
  scratch_ = static_cast<char*>(scratch_base_) + static_cast<std::size_t>(lane) * scratch_bytes_;
  // cublasSetStream resets the workspace to cuBLAS's own pool: set the stream first.
  DQN_CUBLAS_THROW(cublasSetStream(blas_, stream_));
  DQN_CUBLAS_THROW(cublasSetWorkspace(blas_, workspace_, kWorkspaceBytes));
}

void CudaBackend::record(int code, const char* op, const std::string& why) noexcept {
  if (status_ != 0) return;  // the first failure wins: later ones are usually its consequences
  status_ = code;
  std::snprintf(message_, sizeof message_, "cuda %s: %s", op, why.c_str());
}

bool CudaBackend::cuda_ok(const char* op, cudaError_t e, const char* stmt, const char* file, int line) noexcept {
  if (e == cudaSuccess) return true;
  try {
    record(static_cast<int>(e), op, cuda_text(e, stmt, file, line, device_));
  } catch (...) {
    record(static_cast<int>(e), op, "CUDA error (out of memory formatting the message)");
  }
  return false;
}

bool CudaBackend::cublas_ok(const char* op, cublasStatus_t s, const char* stmt, const char* file, int line) noexcept {
  if (s == CUBLAS_STATUS_SUCCESS) return true;
  try {
    record(static_cast<int>(s), op, cublas_text(s, stmt, file, line, device_));
  } catch (...) {
    record(static_cast<int>(s), op, "cuBLAS error (out of memory formatting the message)");
  }
  return false;
}

bool CudaBackend::real_ok(const Real& r, const char* op, const char* what) noexcept {
  char buf[128];
  if (!r.p) {
    std::snprintf(buf, sizeof buf, "null pointer '%s'", what);
    fail(op, buf);
    return false;
  }
  if (r.esize != 4) {
    std::snprintf(buf, sizeof buf, "'%s' has element size %u, this backend stores 4-byte reals", what, r.esize);
    fail(op, buf);
    return false;
  }
  return true;
}

bool CudaBackend::matrix_ok(const char* op, int rows, int cols, int ld) noexcept {
  if (rows < 0 || cols < 0) {
    fail(op, "negative size");
    return false;
  }
  if (rows > 0 && ld < cols) {
    fail(op, "row stride smaller than the number of columns");
    return false;
  }
  return true;
}

void* CudaBackend::scratch(const char* op, std::size_t bytes) noexcept {
  if (planning_) {
    plan_need_ = std::max(plan_need_, bytes);
    return nullptr;
  }
  if (bytes > scratch_bytes_) {
    char buf[200];
    std::snprintf(buf, sizeof buf,
                  "needs %zu bytes of scratch, %zu reserved: plan the step first (plan_begin, the ops, plan_end)",
                  bytes, scratch_bytes_);
    fail(op, buf);
    return nullptr;
  }
  return scratch_;
}

void CudaBackend::transfer(const char* op, void* dst, const void* src, std::size_t bytes) noexcept {
  if (bytes == 0) return;
  if (!dst || !src) return fail(op, "null pointer");
  if (capturing_) return fail(op, "host transfers are not allowed while capturing a graph");
  if (!DQN_CUDA_OK(op, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_))) return;
  DQN_CUDA_OK(op, cudaStreamSynchronize(stream_));
}

void CudaBackend::release() noexcept {
  for (auto& [key, plan] : plans_) plan.release();
  plans_.clear();
  for (auto st : streams_)
    if (st) cudaStreamSynchronize(st);
  for (auto& e : tune_events_) {
    if (e) cudaEventDestroy(e);
    e = nullptr;
  }
  if (tune_d_) cudaFree(tune_d_);
  tune_d_ = nullptr;
  tune_bytes_ = 0;
  if (scratch_base_) cudaFree(scratch_base_);
  if (clock_) cudaFree(clock_);
  clock_ = nullptr;
  if (workspace_base_) cudaFree(workspace_base_);
  if (lt_) cublasLtDestroy(lt_);
  if (blas_) cublasDestroy(blas_);
  for (auto& st : streams_) {
    if (!st) continue;
    cuda::forget_stream_pdl(st);
    cudaStreamDestroy(st);
    st = nullptr;
  }
  for (auto& e : side_events_) {
    if (e) cudaEventDestroy(e);
    e = nullptr;
  }
  scratch_ = workspace_ = scratch_base_ = workspace_base_ = nullptr;
  lt_ = nullptr;
  blas_ = nullptr;
  stream_ = nullptr;
}

std::string CudaBackend::options_text() const {
  const std::string cluster = update_cluster_text(spec_.update_cluster) +
                              (spec_.update_cluster == 0 ? " (" + (update_cluster_ > 0 ? std::to_string(update_cluster_)
                                                                                        : std::string("off")) + " here)"
                                                         : std::string());
  return std::string("cuda: autotune ") + (spec_.autotune ? "true" : "false") + ", gemm " + to_string(spec_.gemm) +
         ", tile_loads " + to_string(spec_.tile_loads) + ", update_cluster " + cluster + ", pdl " +
         to_string(spec_.pdl);
}

}  // namespace dqn::cuda
