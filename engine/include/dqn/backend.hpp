/** @file backend.hpp
 *  @brief The op table every head and the engine are written against: one implementation per
 *  backend (CPU reference in f32 or f64, CUDA). Ops take pre-resolved pointers and never allocate,
 *  so a sequence of op calls on the CUDA backend can be captured into one graph as it is.
 */
#pragma once

#include <cstddef>
#include <cstdint>

/// Marks the few helpers here that the CUDA kernels call too.
#if defined(__CUDACC__)
#define DQN_HOST_DEVICE __host__ __device__
#else
#define DQN_HOST_DEVICE
#endif

namespace dqn {

/// A pointer to real numbers whose element size is the backend's (4 for f32, 8 for the f64
/// reference used by gradient checks). Heads do all pointer arithmetic through it so the same
/// head code runs on every backend.
struct Real {
  void* p = nullptr;
  std::uint32_t esize = 4;

  DQN_HOST_DEVICE Real operator+(std::ptrdiff_t n) const noexcept {
    return {static_cast<char*>(p) + n * static_cast<std::ptrdiff_t>(esize), esize};
  }
  template <class T>
  DQN_HOST_DEVICE T* as() const noexcept { return static_cast<T*>(p); }
  DQN_HOST_DEVICE explicit operator bool() const noexcept { return p != nullptr; }
};

enum class Act : std::int32_t { none = 0, relu = 1 };

/// Row-major, optionally strided-batched GEMM with a fused bias/activation epilogue:
///   C_i[m,n] = act(alpha * op(A_i) op(B_i) + beta * C_i + bias_i[n]),   i = 0..batch-1
/// op(X) = X or Xᵀ; A is [m,k] (or [k,m] when ta), B is [k,n] (or [n,k] when tb);
/// ld* are row strides in elements; stride_* step from one batch entry to the next.
/// bias_i = bias + i·stride_bias has n entries, broadcast over the m rows (null: no bias); the
/// epilogue is exactly gemm followed by bias_act(C_i, bias_i, m, n, ldc, act).
struct Gemm {
  bool ta = false, tb = false;
  int m = 0, n = 0, k = 0;
  float alpha = 1.0f;
  Real a;
  int lda = 0;
  Real b;
  int ldb = 0;
  float beta = 0.0f;
  Real c;
  int ldc = 0;
  int batch = 1;
  std::int64_t stride_a = 0, stride_b = 0, stride_c = 0;
  /// Weights-side operand hint: which of a/b is a parameter (for precision shadows). 0 none.
  std::int32_t weight_operand = 0;
  Real bias;                      ///< [n] per batch entry, or null: no bias
  std::int64_t stride_bias = 0;   ///< elements from one batch entry's bias to the next
  Act act = Act::none;            ///< applied after the bias
  /// ReLU backward of the result, last: C[r, c] = 0 where mask[(r mod mask_rows)·ldmask + c] <= 0
  /// (mask_rows 0: m); batch entry i reads mask + i·stride_mask. Null: no mask. The same numbers
  /// as the GEMM followed by relu_backward of C with that mask.
  Real mask;
  int ldmask = 0;
  int mask_rows = 0;
  std::int64_t stride_mask = 0;
  /// batch × batch2 products: entry (i, j) reads and writes each operand X (a, b, c, bias, mask)
  /// at X + i·stride_x + j·stride2_x. The same numbers as batch2 calls with batch entries each
  /// (the members × branches of several heads' output layers in one launch). 1: one dimension.
  int batch2 = 1;
  std::int64_t stride2_a = 0, stride2_b = 0, stride2_c = 0, stride2_bias = 0, stride2_mask = 0;
  /// Nonzero: the batch entries' products summed into one C, C = alpha·Σ_i op(A_i) op(B_i)
  /// (entries in order; stride_c unused), as one GEMM over the entries' k concatenated would
  /// give it (the sum of several members' input gradients). Needs beta 0, no bias,
  /// activation or mask, and batch2 1.
  std::int32_t sum_batch = 0;
};

/// Entry j of g's second batch dimension as a one-dimensional call (batch2 1, operands at their
/// stride2 offsets; null operands stay null).
inline Gemm batch2_entry(const Gemm& g, int j) noexcept {
  Gemm e = g;
  auto at = [j](Real x, std::int64_t stride) { return x ? x + static_cast<std::ptrdiff_t>(j * stride) : x; };
  e.a = at(g.a, g.stride2_a);
  e.b = at(g.b, g.stride2_b);
  e.c = at(g.c, g.stride2_c);
  e.bias = at(g.bias, g.stride2_bias);
  e.mask = at(g.mask, g.stride2_mask);
  e.batch2 = 1;
  e.stride2_a = e.stride2_b = e.stride2_c = e.stride2_bias = e.stride2_mask = 0;
  return e;
}

/// Counter-based uniform(0,1) numbers: out[i] = philox(seed, counter = *step, stream, i) (from
/// Backend::uniform_from(a, first): philox(…, first + i)).
struct Uniform {
  Real out;
  std::int64_t n = 0;
  std::uint64_t seed = 0;
  std::uint32_t stream = 0;  ///< separates independent draws within a step
  const std::int64_t* step;  ///< device step counter (null: 0)
};

/// Fused dueling distribution (docs/step-math.md, "Network", the head's output): for every row r < rows,
/// branch d and action a
///   logits = v[r,:] + adv[r,d,a,:] − mean_a' adv[r,d,a',:]   (rounded to a real, as dueling_combine),
///   logp[r,d,a,:] = log_softmax(logits) over the Z atoms,  q[r,d,a] = Σ_i z_i exp(logp_i),
/// and, where a_star is set, a_star[(r − star_from)·D + d] = argmax_a q[r,d,a] for rows r ≥
/// star_from (ties: lowest index). The same numbers as dueling_combine + log_softmax +
/// expected_q + argmax in one pass.
struct DuelingDist {
  Real logp;                      ///< out [rows,D,A,Z]
  Real q;                         ///< out [rows,D,A]; may be null when a_star is null
  Real v;                         ///< in  [rows, ldv] (the first Z columns)
  int ldv = 0;
  Real adv;                       ///< in  [rows,D,ldadv] (the first A·Z of each (row, branch))
  std::int32_t* a_star = nullptr; ///< out [rows − star_from, D]; may be null
  int star_from = 0;
  int rows = 0, D = 0, A = 0, Z = 0;
  float v_min = -10.0f, v_max = 10.0f;
  int ldadv = 0;                  ///< elements from one (row, branch) of adv to the next; 0: A·Z
};

/// A row or block stride of the ops' optional-stride fields (ldadv, lddadv and those of the heads' own ops): ld, or
/// `compact` when ld is 0. Both backends and the CUDA kernels read the fields through this, and
/// refuse a result below `compact`.
DQN_HOST_DEVICE constexpr int ld_or(int ld, int compact) { return ld != 0 ? ld : compact; }

/// Δz of the support z_i = v_min + i·Δz of Z atoms on [v_min, v_max] (0 for a single atom), in
/// double: the support expected_q and the distributional ops read.
DQN_HOST_DEVICE constexpr double support_step(float v_min, float v_max, int Z) {
  return Z > 1 ? (static_cast<double>(v_max) - static_cast<double>(v_min)) / (Z - 1) : 0.0;
}

/// The distributional dueling branching head's forward over `rows` rows (docs/step-math.md, "Network"):
///   hidden = relu(x · W1ᵀ + b1)                 [rows, (1+D)·Hh]  (value, then the D branches)
///   v      = hidden_v · Wv2ᵀ + bv2              [rows, ldv]       (the first Z columns)
///   adv_d  = hidden_d · Wb2_dᵀ + bb2_d          [rows, D, ldadv]  (the first A·Z of each)
/// then, when logp is set, dueling_dist of v and adv (logp, q, a*). The default implementation
/// is exactly those GEMMs and dueling_dist; a backend may fuse them or run them side by side.
struct HeadForward {
  Real x;                         ///< in  [rows, ldx] (the first H2 columns)
  int ldx = 0;
  Real w1, b1;                    ///< [(1+D)Hh, H2], [(1+D)Hh]
  Real wv2, bv2;                  ///< [Z, Hh], [Z]
  Real wb2, bb2;                  ///< D × [A·Z, Hh], [D·A·Z]
  Real hidden;                    ///< out [rows, (1+D)Hh]
  Real v;                         ///< out [rows, ldv]
  int ldv = 0;
  Real adv;                       ///< out [rows, D, ldadv]
  Real logp;                      ///< out [rows, D, A, Z]; null: stop after v and adv
  Real q;                         ///< out [rows, D, A]; may be null
  std::int32_t* a_star = nullptr; ///< out [rows − star_from, D]; may be null
  int star_from = 0;
  int rows = 0, H2 = 0, Hh = 0, D = 0, A = 0, Z = 0;
  float v_min = -10.0f, v_max = 10.0f;
  int ldadv = 0;                  ///< (row, branch) stride of adv; 0: A·Z
  /// Rows stored for wv2 and bv2, and for each branch's block of wb2 and bb2: at least Z
  /// and A·Z, the rows past those zero (kParamPadRows); 0: Z, A·Z. Where ldv and ldadv leave room,
  /// the output GEMMs write that many columns of v and adv (the last ones 0).
  int wv2_rows = 0, wb2_rows = 0;
};

/// The input side of that head's backward up to its hidden layers (docs/step-math.md, "Network", backward):
///   dhidden_v = (dv · Wv2) ⊙ [hidden_v > 0],   dhidden_d = (dadv_d · Wb2_d) ⊙ [hidden_d > 0]
/// into dhidden [rows, (1+D)Hh] (overwritten). The default implementation is two GEMMs and
/// relu_backward; a backend may fuse them or run them side by side.
struct HeadBackward {
  Real dv;                        ///< in  [rows, lddv] (the first Z columns)
  int lddv = 0;
  Real dadv;                      ///< in  [rows, D, lddadv]
  Real wv2, wb2;                  ///< [Z, Hh], D × [A·Z, Hh]
  Real hidden;                    ///< in  [rows, (1+D)Hh] post-ReLU (the mask)
  Real dhidden;                   ///< out [rows, (1+D)Hh]
  int rows = 0, Hh = 0, D = 0, A = 0, Z = 0;
  int lddadv = 0;                 ///< (row, branch) stride of dadv; 0: A·Z
  int wb2_rows = 0;               ///< rows stored per branch block of wb2 (>= A·Z; 0: A·Z)
};

/// What a head's own kernels need of a device backend (Backend::device()): the stream of the
/// stage being run (captured into the step's graph: enqueue work on it only, never synchronise,
/// allocate or copy to the host), the device, and the launch policy. dqn/device.cuh launches
/// through it.
struct DeviceContext {
  void* stream = nullptr;           ///< the cudaStream_t the stage's work goes to
  std::int32_t device = 0;          ///< CUDA device ordinal
  std::int32_t sm_count = 0;        ///< streaming multiprocessors
  std::int32_t cc_major = 0, cc_minor = 0;  ///< compute capability
  /// Programmatic dependent launch: a kernel with at most this many bytes of dynamic shared memory
  /// launches with programmatic stream serialization (and must begin with dqn::dev::pdl_entry());
  /// -1: none does.
  std::int64_t pdl_max_shared = -1;
  std::int32_t planning = 0;        ///< 1: a dry run (the engine sizing the step): launch nothing
  /// The pipeline's precision (0 fp32, 1 tf32, 2 bf16: Precision): reals are f32 in memory in
  /// all three; an fp32 pipeline's kernels may compute in double to match the CPU reference.
  std::int32_t precision = 0;
  std::int32_t max_shared_optin = 0;  ///< dynamic shared memory a block may opt in to, bytes
  std::int32_t reserved = 0;
};

/// The op table: the generic ops a head composes its stages from (dense layers, the
/// distributional dueling network's output, the softmax family, reductions, elementwise ops, RNG
/// and the update). Every method is noexcept; a backend that fails records the first error and
/// reports it through status(). A head's own computation (a loss no op here computes) runs in its
/// own code: on the host where device() is null, else as kernels it launches on device()->stream
/// (dqn/device.cuh); either may record a failure through fail().
class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const noexcept = 0;
  virtual std::uint32_t real_size() const noexcept = 0;  ///< bytes per real element
  virtual bool is_device() const noexcept = 0;
  /// Null on a host backend (reals are host memory, T = float or double by real_size()); on a
  /// device backend, where a head's kernels go and what it may know of the device.
  virtual const DeviceContext* device() const noexcept = 0;
  /// 0 when every op so far succeeded; otherwise the first failure, with message().
  virtual int status() const noexcept = 0;
  virtual const char* message() const noexcept = 0;
  /// Records a failure of `op` (the first one is kept): what a head's own code calls when its
  /// arguments are wrong or a launch fails.
  virtual void fail(const char* op, const char* why) noexcept = 0;

  // --- dense layers ---
  virtual void gemm(const Gemm& g) noexcept = 0;
  /// y[r, c] = act(y[r, c] + bias[c]) for r < rows, c < cols; ldy is y's row stride.
  virtual void bias_act(Real y, Real bias, int rows, int cols, int ldy, Act act) noexcept = 0;
  /// dy[i] = 0 where y[i] <= 0 (ReLU backward on the post-activation y); n elements, row layout
  /// given by rows/cols/ld for both.
  virtual void relu_backward(Real dy, Real y, int rows, int cols, int ld) noexcept = 0;
  /// db[c] = beta * db[c] + Σ_r dy[r, c]
  virtual void bias_grad(Real db, Real dy, int rows, int cols, int ldy, float beta) noexcept = 0;
  /// ReLU backward and bias gradient in one pass, for `heads` gradients (several heads' or
  /// members' layers of one shape): for h < heads, dy_h = dy + h·stride_dy, y_h = y + h·stride_y
  /// (stride_y 0: one activation for all): dy_h[r,c] = 0 where y_h[r,c] <= 0 (no masking when y
  /// is null), then db[h·stride_db + c] = Σ_r dy_h[r,c] (overwritten). The same numbers as
  /// relu_backward followed by bias_grad (beta 0) per h. With db null, the masks only.
  virtual void relu_bias_grad(Real dy, Real y, Real db, int rows, int cols, int ld, int heads,
                              std::int64_t stride_dy, std::int64_t stride_y, std::int64_t stride_db) noexcept = 0;

  // --- the distributional dueling network's output, the softmax family ---
  /// logits[b,d,a,:] = v[b,:] + adv[b,d,a,:] − mean_a' adv[b,d,a',:]; v has row stride ldv.
  virtual void dueling_combine(Real logits, Real v, int ldv, Real adv, int rows, int D, int A,
                               int Z) noexcept = 0;
  /// dv[b,:] = Σ_{d,a} dl[b,d,a,:]; dadv[b,d,a,:] = dl[b,d,a,:] − (1/A) Σ_a' dl[b,d,a',:].
  /// dlogits is compact [rows,D,A,Z]; dadv's (row, branch) stride is lddadv (0: A·Z; only then
  /// may dadv alias dlogits), and each block's padding [A·Z, lddadv) is set to zero (so column
  /// sums over whole blocks give the padding's bias gradients, zero).
  virtual void dueling_backward(Real dv, int lddv, Real dadv, int lddadv, Real dlogits, int rows, int D,
                                int A, int Z) noexcept = 0;
  /// logp[r,:] = log_softmax(x[r,:]) over n columns.
  virtual void log_softmax(Real logp, Real x, int rows, int n) noexcept = 0;
  /// q[r] = Σ_i z_i exp(logp[r,i]), z_i = v_min + i Δz
  virtual void expected_q(Real q, Real logp, int rows, int Z, float v_min, float v_max) noexcept = 0;
  /// Backward of expected_q: dlogits[r,i] = dq[r] · p_i (z_i − Q_r), p = exp(logp[r,:]),
  /// Q_r = Σ_i p_i z_i (overwrites dlogits; the gradient through the softmax to the logits).
  virtual void expected_q_backward(Real dlogits, Real dq, Real logp, int rows, int Z, float v_min,
                                   float v_max) noexcept = 0;
  /// idx[r] = argmax_a q[r,a] (ties: lowest index)
  virtual void argmax(std::int32_t* idx, Real q, int rows, int n) noexcept = 0;
  virtual void dueling_dist(const DuelingDist& a) noexcept = 0;
  /// Defaults to the composition below (the CPU reference); the CUDA backend runs its GEMMs side by side.
  virtual void head_forward(const HeadForward& a) noexcept { head_forward_composed(a); }
  /// Defaults to the composition below (the CPU reference); the CUDA backend runs its GEMMs side by side.
  virtual void head_backward_inputs(const HeadBackward& a) noexcept { head_backward_inputs_composed(a); }

  // --- reductions, elementwise, RNG ---
  /// out[0] = (1/n) Σ_i w[i]·x[i], summed in double in a fixed order (n = 0: 0). A head's loss
  /// from its per-sample losses and the importance weights.
  virtual void weighted_mean(Real out, Real x, Real w, std::int64_t n) noexcept = 0;
  virtual void fill(Real x, float value, std::int64_t n) noexcept = 0;
  virtual void copy(Real dst, Real src, std::int64_t n) noexcept = 0;
  /// y = alpha x + y
  virtual void axpy(Real y, Real x, float alpha, std::int64_t n) noexcept = 0;
  virtual void uniform(const Uniform& a) noexcept = 0;
  /// Values first … first + n − 1 of the draw `a` describes (uniform(a) is uniform_from(a, 0)):
  /// a rank's share of one draw over the global batch (BuildContext::batch_offset).
  virtual void uniform_from(const Uniform& a, std::int64_t first) noexcept = 0;


  /// head_forward as the ops it is made of: three GEMMs (bias and ReLU in their epilogues) and
  /// dueling_dist.
  void head_forward_composed(const HeadForward& a) noexcept {
    const HeadForwardOps o = head_forward_ops(a);
    gemm(o.hidden);
    gemm(o.value);
    gemm(o.adv);
    if (a.logp) dueling_dist(o.dist);
  }

  /// The ops of head_forward_composed: the hidden GEMM first; the value and advantage GEMMs read
  /// only its output (so they may run side by side); dueling_dist (when a.logp) reads both.
  struct HeadForwardOps {
    Gemm hidden, value, adv;
    DuelingDist dist;
  };
  static HeadForwardOps head_forward_ops(const HeadForward& a) noexcept {
    HeadForwardOps o;
    const int hc = (1 + a.D) * a.Hh, az = a.A * a.Z;
    Gemm& g = o.hidden;  // hidden = relu(x · W1ᵀ + b1)
    g.tb = true; g.m = a.rows; g.n = hc; g.k = a.H2;
    g.a = a.x; g.lda = a.ldx; g.b = a.w1; g.ldb = a.H2; g.c = a.hidden; g.ldc = hc; g.weight_operand = 2;
    g.bias = a.b1; g.act = Act::relu;
    const int ladv = ld_or(a.ldadv, a.A * a.Z);
    const int zr = ld_or(a.wv2_rows, a.Z), azr = ld_or(a.wb2_rows, az);
    Gemm& gv = o.value;  // v = hidden_v · Wv2ᵀ + bv2 (and the zero rows' columns where ldv has room)
    gv.tb = true; gv.m = a.rows; gv.n = a.ldv >= zr ? zr : a.Z; gv.k = a.Hh;
    gv.a = a.hidden; gv.lda = hc; gv.b = a.wv2; gv.ldb = a.Hh; gv.c = a.v; gv.ldc = a.ldv; gv.weight_operand = 2;
    gv.bias = a.bv2;
    Gemm& gb = o.adv;  // adv_d = hidden_d · Wb2_dᵀ + bb2_d, all branches in one batched GEMM
    gb.tb = true; gb.m = a.rows; gb.n = ladv >= azr ? azr : az; gb.k = a.Hh;
    gb.a = a.hidden + a.Hh; gb.lda = hc; gb.stride_a = a.Hh;
    gb.b = a.wb2; gb.ldb = a.Hh; gb.stride_b = std::int64_t(azr) * a.Hh;
    gb.c = a.adv; gb.ldc = a.D * ladv; gb.stride_c = ladv;
    gb.batch = a.D; gb.weight_operand = 2;
    gb.bias = a.bb2; gb.stride_bias = azr;  // the D branch biases follow each other, azr apart
    DuelingDist& dd = o.dist;
    dd.logp = a.logp; dd.q = a.q; dd.v = a.v; dd.ldv = a.ldv; dd.adv = a.adv; dd.ldadv = ladv;
    dd.a_star = a.a_star; dd.star_from = a.star_from;
    dd.rows = a.rows; dd.D = a.D; dd.A = a.A; dd.Z = a.Z; dd.v_min = a.v_min; dd.v_max = a.v_max;
    return o;
  }

  /// head_backward_inputs as the ops it is made of: two GEMMs, each masked by the hidden
  /// activations of its columns (relu_backward in the GEMM, Gemm::mask).
  void head_backward_inputs_composed(const HeadBackward& a) noexcept {
    const HeadBackwardOps o = head_backward_ops(a);
    gemm(o.value);
    gemm(o.branch);
  }

  /// The GEMMs of head_backward_inputs_composed: they write disjoint columns of dhidden (so they
  /// may run side by side), each with the ReLU mask of its columns.
  struct HeadBackwardOps {
    Gemm value, branch;
    int hc = 0;
  };
  static HeadBackwardOps head_backward_ops(const HeadBackward& a) noexcept {
    HeadBackwardOps o;
    const int hc = (1 + a.D) * a.Hh, az = a.A * a.Z;
    o.hc = hc;
    Gemm& gx = o.value;  // dhidden_v = dv · Wv2
    gx.m = a.rows; gx.n = a.Hh; gx.k = a.Z;
    gx.a = a.dv; gx.lda = a.lddv; gx.b = a.wv2; gx.ldb = a.Hh; gx.c = a.dhidden; gx.ldc = hc; gx.weight_operand = 2;
    gx.mask = a.hidden; gx.ldmask = hc;
    const int ldd = ld_or(a.lddadv, a.A * a.Z);
    Gemm& gbx = o.branch;  // dhidden_d = dadv_d · Wb2_d, batched over d
    gbx.m = a.rows; gbx.n = a.Hh; gbx.k = az;
    gbx.a = a.dadv; gbx.lda = a.D * ldd; gbx.stride_a = ldd;
    gbx.b = a.wb2; gbx.ldb = a.Hh; gbx.stride_b = std::int64_t(ld_or(a.wb2_rows, az)) * a.Hh;
    gbx.c = a.dhidden + a.Hh; gbx.ldc = hc; gbx.stride_c = a.Hh;
    gbx.batch = a.D; gbx.weight_operand = 2;
    gbx.mask = a.hidden + a.Hh; gbx.ldmask = hc; gbx.stride_mask = a.Hh;
    return o;
  }
};

}  // namespace dqn
