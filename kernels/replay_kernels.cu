/** @file replay_kernels.cu
 *  @brief The device replay: inserting staged transitions, drawing a batch inside the step (a
 *  warp per row: uniform, or down the fan-out-32 tree), and the priority update from td_error.
 *  Every addition on the tree follows dqn/replay_tree.h's host reference, so both backends draw
 *  the same slots.
 */
#include <cuda_runtime.h>

#include "cuda_kernels.cuh"
#include "core/replay_tree.h"
#include "kernel_common.cuh"

namespace dqn::cuda {
namespace {

using replay::Node;
using replay::Tree;
constexpr unsigned kFull = 0xffffffffu;
constexpr int kTreeThreads = 1024;  // the tree's maintenance: one block, a warp per node

__device__ __forceinline__ Node node_at(const std::int64_t* tree, std::int64_t i) {
  const float2 v = __ldcg(reinterpret_cast<const float2*>(tree) + i);
  return Node{v.x, v.y};
}
__device__ __forceinline__ void set_node(std::int64_t* tree, std::int64_t i, Node n) {
  reinterpret_cast<float2*>(tree)[i] = make_float2(n.sum, n.min);
}

/// Node `node` of level l (>= 1) from its children, by one warp (replay::reduce_children).
__device__ void reduce_node(std::int64_t* tree, const Tree& t, int l, std::int64_t node) {
  const int lane = threadIdx.x & 31;
  const std::int64_t child = node * replay::kFan + lane;
  Node v = child < t.size[l - 1] ? node_at(tree, t.offset[l - 1] + child) : Node{0.0f, replay::inf()};
  for (int off = 16; off > 0; off >>= 1) {
    const float s = __shfl_xor_sync(kFull, v.sum, off), m = __shfl_xor_sync(kFull, v.min, off);
    v.sum = __fadd_rn(v.sum, s);
    v.min = m < v.min ? m : v.min;
  }
  if (lane == 0) set_node(tree, t.offset[l] + node, v);
}

/// The same by a quad of lanes (q = 0..3 of four consecutive lanes, `mask` theirs), bit for bit:
/// lane q loads children q, q+4, …, q+28 and adds them as the warp's butterfly pairs them (i with
/// i+16, then i+8, then i+4), and the quad finishes with xor 2 and xor 1. Its eight loads are
/// independent, so a level costs one round trip to L2 for up to blockDim/4 nodes at once.
__device__ void reduce_node_quad(std::int64_t* tree, const Tree& t, int l, std::int64_t node, int q, unsigned mask) {
  const std::int64_t first = node * replay::kFan, present = t.size[l - 1] - first;
  const std::int64_t base = t.offset[l - 1] + first;
  Node c[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int i = q + 4 * j;
    c[j] = i < present ? node_at(tree, base + i) : Node{0.0f, replay::inf()};
  }
  float s16[4], m16[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    s16[j] = __fadd_rn(c[j].sum, c[j + 4].sum);
    m16[j] = c[j + 4].min < c[j].min ? c[j + 4].min : c[j].min;
  }
  const float s8a = __fadd_rn(s16[0], s16[2]), s8b = __fadd_rn(s16[1], s16[3]);
  const float m8a = fminf(m16[0], m16[2]), m8b = fminf(m16[1], m16[3]);
  Node v{__fadd_rn(s8a, s8b), fminf(m8a, m8b)};
  for (int off = 2; off > 0; off >>= 1) {
    const float s = __shfl_xor_sync(mask, v.sum, off), m = __shfl_xor_sync(mask, v.min, off);
    v.sum = __fadd_rn(v.sum, s);
    v.min = m < v.min ? m : v.min;
  }
  if (q == 0) set_node(tree, t.offset[l] + node, v);
}

/// Recomputes, level by level, the ancestors of the leaves in [lo, hi] and (when lo2 <= hi2) in
/// [lo2, hi2]: every node of those ranges at each level, one warp each.
__device__ void update_ranges(std::int64_t* tree, const Tree& t, std::int64_t lo, std::int64_t hi, std::int64_t lo2,
                              std::int64_t hi2) {
  const int warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int l = 1; l < t.levels; ++l) {
    const int sh = replay::kFanShift * l;
    const std::int64_t a0 = lo >> sh, a1 = hi >> sh, n1 = a1 - a0 + 1;
    const std::int64_t b0 = lo2 >> sh, b1 = hi2 >> sh, n2 = lo2 <= hi2 ? b1 - b0 + 1 : 0;
    for (std::int64_t k = warp; k < n1 + n2; k += warps) reduce_node(tree, t, l, k < n1 ? a0 + k : b0 + (k - n1));
    __syncthreads();
  }
}

// ---- insert: rows, then the tree and the cursor

template <class I>
__global__ void insert_rows_kernel(ReplayInsert a, I total) {
  dev::pdl_entry();
  const ReplayStore& r = a.store;
  const std::int64_t next = r.cursor[kCurNext];
  const float top = r.tree ? replay::leaf_value(*r.max_priority, r.alpha) : 0.0f;
  const I S = static_cast<I>(r.S), D = static_cast<I>(r.D), row = 2 * S + D + 2;
  for (I k = static_cast<I>(grid_start()); k < total; k += static_cast<I>(grid_step())) {
    const I i = k / row, c = k - i * row;
    const std::int64_t slot = (next + static_cast<std::int64_t>(i)) % r.capacity;
    if (c < S) {
      r.states.as<float>()[slot * r.S + c] = a.states.as<const float>()[i * S + c];
    } else if (c < 2 * S) {
      r.next_states.as<float>()[slot * r.S + (c - S)] = a.next_states.as<const float>()[i * S + (c - S)];
    } else if (c < 2 * S + D) {
      r.actions[slot * r.D + (c - 2 * S)] = a.actions[i * D + (c - 2 * S)];
    } else if (c == 2 * S + D) {
      r.rewards.as<float>()[slot] = a.rewards.as<const float>()[i];
    } else {
      r.dones.as<float>()[slot] = a.dones.as<const float>()[i];
      if (r.tree) set_node(r.tree, slot, replay::leaf(top));
    }
  }
}

__global__ void __launch_bounds__(kTreeThreads) insert_tree_kernel(ReplayInsert a) {
  dev::pdl_entry();
  const ReplayStore& r = a.store;
  std::int64_t* cur = r.cursor;
  const std::int64_t next = cur[kCurNext], end = next + a.n;
  if (r.tree) {
    const Tree t = replay::tree_layout(r.capacity);
    if (end <= r.capacity)
      update_ranges(r.tree, t, next, end - 1, 1, 0);
    else
      update_ranges(r.tree, t, next, r.capacity - 1, 0, end - r.capacity - 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    cur[kCurNext] = end % r.capacity;
    cur[kCurSize] = min(cur[kCurSize] + a.n, r.capacity);
    cur[kCurEnvStep] = a.env_step;
    cur[kCurInserted] += a.n;
  }
}

// ---- sample: a warp per row

constexpr int kSampleWarps = 8;

__global__ void __launch_bounds__(kSampleWarps * 32) sample_kernel(ReplaySample a) {
  dev::pdl_entry();
  const ReplayStore& r = a.store;
  const int lane = threadIdx.x & 31, b = blockIdx.x * kSampleWarps + (threadIdx.x >> 5);
  const std::int64_t size = __ldcg(r.cursor + kCurSize), draw = __ldcg(r.cursor + kCurDraws);
  const double beta = replay::beta_at(a.beta_start, a.beta_end, a.beta_steps, __ldcg(r.cursor + kCurEnvStep));
  const Tree t = replay::tree_layout(r.capacity);
  const Node top = r.tree ? node_at(r.tree, t.offset[t.levels - 1]) : Node{static_cast<float>(size), 1.0f};
  if (b < a.B) {
    std::int64_t slot = 0;
    float w = 1.0f;
    if (!r.tree) {
      slot = replay::uniform_slot(philox::bits(a.seed, static_cast<std::uint64_t>(draw), replay::kSampleStream,
                                               static_cast<std::uint64_t>(b)), size);
    } else {
      float point = replay::stratum_point(
          b, philox::uniform(a.seed, static_cast<std::uint64_t>(draw), replay::kSampleStream, static_cast<std::uint64_t>(b)),
          top.sum, a.B);
      std::int64_t node = 0;
      for (int l = t.levels - 1; l > 0; --l) {  // replay::pick_child, one child a lane
        const std::int64_t first = node * replay::kFan, child = first + lane;
        const bool real = child < t.size[l - 1];
        const float c = real ? node_at(r.tree, t.offset[l - 1] + child).sum : 0.0f;
        float s = c;
        for (int d = 1; d < 32; d <<= 1) {
          const float x = __shfl_up_sync(kFull, s, d);
          if (lane >= d) s = __fadd_rn(s, x);
        }
        int k = __popc(__ballot_sync(kFull, s <= point));
        if (k == 32) {
          const unsigned mass = __ballot_sync(kFull, real && c > 0.0f);
          k = mass ? 31 - __clz(static_cast<int>(mass)) : 0;
        }
        const float before = __shfl_sync(kFull, s, k > 0 ? k - 1 : 0);
        const float rest = __fsub_rn(point, k > 0 ? before : 0.0f);
        point = rest > 0.0f ? rest : 0.0f;
        node = first + k;
      }
      slot = node;
      w = replay::is_weight(node_at(r.tree, slot).sum, top.min, beta);
    }
    const std::int64_t S = r.S;
    const float* src = r.states.as<const float>() + slot * S;
    const float* nsrc = r.next_states.as<const float>() + slot * S;
    float* dst = a.states2.as<float>() + static_cast<std::int64_t>(b) * S;
    float* ndst = a.states2.as<float>() + (static_cast<std::int64_t>(a.B) + b) * S;
    for (std::int64_t c = lane; c < S; c += 32) {
      dst[c] = __ldcg(src + c);
      ndst[c] = __ldcg(nsrc + c);
    }
    for (int c = lane; c < r.D; c += 32) a.actions[static_cast<std::int64_t>(b) * r.D + c] = r.actions[slot * r.D + c];
    if (lane == 0) {
      a.rewards.as<float>()[b] = __ldcg(r.rewards.as<const float>() + slot);
      a.dones.as<float>()[b] = __ldcg(r.dones.as<const float>() + slot);
      a.is_weights.as<float>()[b] = w;
      a.indices[b] = slot;
    }
  }
  if (blockIdx.x == 0 && threadIdx.x == 0 && a.stats) {
    float* st = a.stats.as<float>();
    st[0] = static_cast<float>(size);
    st[1] = static_cast<float>(r.tree ? beta : 0.0);
    st[2] = r.tree ? *r.max_priority : 1.0f;
    st[3] = top.sum;
  }
  // Every block read the draw counter above; the last one to finish advances it.
  if (dev::last_block(reinterpret_cast<unsigned*>(r.cursor + kCurBlocks)) && threadIdx.x == 0)
    r.cursor[kCurDraws] = draw + 1;
}

// ---- priorities: one block

__global__ void __launch_bounds__(kTreeThreads) priorities_kernel(ReplayPriorities a) {
  dev::pdl_entry();
  const ReplayStore& r = a.store;
  __shared__ float top_sh[32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  const float* td = a.td_error.as<const float>();
  // Of a slot drawn twice, the last row with a finite δ writes it (the CPU's in-order loop).
  for (int b = threadIdx.x; b < a.B; b += blockDim.x)
    if (isfinite(td[b])) atomicMax(r.owner + a.indices[b], b + 1);
  __syncthreads();
  float top = 0.0f;
  for (int b = threadIdx.x; b < a.B; b += blockDim.x) {
    if (!isfinite(td[b])) continue;
    const float p = static_cast<float>(fabs(static_cast<double>(td[b])) + static_cast<double>(r.priority_eps));
    top = fmaxf(top, p);
    if (r.owner[a.indices[b]] == b + 1) set_node(r.tree, a.indices[b], replay::leaf(replay::leaf_value(p, r.alpha)));
  }
  top = dev::warp_max(top);
  if (lane == 0) top_sh[warp] = top;
  __syncthreads();
  for (int b = threadIdx.x; b < a.B; b += blockDim.x) r.owner[a.indices[b]] = 0;
  if (threadIdx.x == 0) {
    float m = *r.max_priority;
    for (int w = 0; w < warps; ++w) m = fmaxf(m, top_sh[w]);
    *r.max_priority = m;
  }
  // The ancestors, level by level, a quad of lanes a row; a row whose node the row before shares
  // skips it (the drawn slots come sorted from the stratified sample, so each node is recomputed
  // once).
  const Tree t = replay::tree_layout(r.capacity);
  const int q = threadIdx.x & 3, quads = blockDim.x >> 2;
  const unsigned mask = 0xfu << (lane & ~3);
  for (int l = 1; l < t.levels; ++l) {
    const int sh = replay::kFanShift * l;
    for (int k = threadIdx.x >> 2; k < a.B; k += quads) {
      const std::int64_t node = a.indices[k] >> sh;
      if (k > 0 && (a.indices[k - 1] >> sh) == node) continue;
      reduce_node_quad(r.tree, t, l, node, q, mask);
    }
    __syncthreads();
  }
}

}  // namespace

cudaError_t replay_insert(cudaStream_t s, const ReplayInsert& a) {
  const std::int64_t total = a.n * (2 * std::int64_t(a.store.S) + a.store.D + 2);
  cudaError_t e = cudaSuccess;
  with_index_type(total, [&](auto i) {
    using I = decltype(i);
    e = launch(insert_rows_kernel<I>, blocks_for(total), kThreads, 0, s, a, static_cast<I>(total));
  });
  if (e != cudaSuccess) return e;
  return launch(insert_tree_kernel, 1, kTreeThreads, 0, s, a);
}

cudaError_t replay_sample(cudaStream_t s, const ReplaySample& a) {
  return launch(sample_kernel, (a.B + kSampleWarps - 1) / kSampleWarps, kSampleWarps * 32, 0, s, a);
}

cudaError_t replay_priorities(cudaStream_t s, const ReplayPriorities& a) {
  return launch(priorities_kernel, 1, kTreeThreads, 0, s, a);
}

}  // namespace dqn::cuda
