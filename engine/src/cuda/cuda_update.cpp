/** @file cuda_update.cpp
 *  @brief The CUDA backend's optimiser ops: budgets, Adam, spectral norm, the target update, and the
 *  fused update as thread-block clusters where the device launches them.
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

#include "cuda/cuda_ops.hpp"

namespace dqn::cuda {

void CudaBackend::budget(const Budget& a) noexcept {
  constexpr const char* op = "budget";
  if (a.H < 0 || a.P < 0) return fail(op, "negative size");
  if (a.H > kMaxBudgetHeads) return fail(op, "more than 8192 heads");
  if (!a.skip || !a.skipped) return fail(op, "null skip/skipped");
  if (a.H > 0 && (!real_ok(a.fractions, op, "fractions") || !real_ok(a.norms, op, "norms") ||
                  !real_ok(a.clips, op, "clips") || !real_ok(a.losses, op, "losses")))
    return;
  if (a.H > 0 && a.P > 0 && !real_ok(a.grads, op, "grads")) return;
  if (a.P > 0 && !real_ok(a.g, op, "g")) return;
  if (!real_ok(a.total_loss, op, "total_loss")) return;
  void* s = scratch(op, cuda::budget_scratch_bytes(a.H));
  if (!s) return;
  DQN_CUDA_OK(op, cuda::budget(stream_, a, s, wave_blocks()));
}

void CudaBackend::adam(const Adam& a) noexcept {
  constexpr const char* op = "adam";
  if (a.P < 0) return fail(op, "negative size");
  if (!a.skip || !a.t) return fail(op, "null skip/t");
  if (!real_ok(a.lr, op, "lr")) return;
  if (a.P > 0 && (!real_ok(a.params, op, "params") || !real_ok(a.g, op, "g") || !real_ok(a.m, op, "m") ||
                  !real_ok(a.v, op, "v")))
    return;
  if (planning_) return;
  DQN_CUDA_OK(op, cuda::adam(stream_, a, wave_blocks()));
}

void CudaBackend::spectral_norm(const SpectralMatrix* mats, int count, int max_rows, int max_cols, float sigma_max,
                   const std::int32_t* skip) noexcept {
  constexpr const char* op = "spectral_norm";
  if (count < 0) return fail(op, "negative count");
  if (!skip) return fail(op, "null skip");
  if (count == 0) return;
  if (!mats) return fail(op, "null mats");
  if (max_rows <= 0 || max_cols <= 0) return fail(op, "max_rows and max_cols must be positive");
  if (count > 65535) return fail(op, "more than 65535 matrices");
  void* s = scratch(op, cuda::spectral_norm_scratch_bytes(count, max_rows, max_cols));
  if (!s) return;
  DQN_CUDA_OK(op, cuda::spectral_norm(stream_, mats, count, max_rows, max_cols, sigma_max, skip, s));
}

void CudaBackend::target_update(const TargetUpdate& a) noexcept {
  constexpr const char* op = "target_update";
  if (a.P < 0 || a.period < 0) return fail(op, "negative size or period");
  if (!a.skip) return fail(op, "null skip");
  if (a.P == 0) return;
  if (!real_ok(a.target, op, "target") || !real_ok(a.params, op, "params")) return;
  if (a.period > 0 && !a.t) return fail(op, "null t with a hard-copy period");
  if (planning_) return;
  DQN_CUDA_OK(op, cuda::target_update(stream_, a, wave_blocks()));
}

void CudaBackend::update(const Update& u) noexcept {
  constexpr const char* op = "update";
  const Budget& b = u.budget;
  const Adam& a = u.adam;
  const TargetUpdate& t = u.target;
  // The cluster update where the arguments have the engine's shape, the normed matrices are
  // disjoint ranges inside params and fit its shared memory; otherwise the four ops, each
  // checking its own arguments.
  const bool shaped = b.H >= 1 && b.H <= cuda::update_max_heads() && b.P > 0 && u.sn_count >= 0 &&
                      u.sn_count <= cuda::update_max_matrices() && a.P == b.P && t.P == b.P && a.g.p == b.g.p &&
                      a.skip == b.skip && t.skip == b.skip && t.t == a.t && t.params.p == a.params.p &&
                      t.period >= 0 && (u.sn_count == 0 || (u.sn_mats && u.sn_max_rows > 0 && u.sn_max_cols > 0));
  const bool cluster = shaped && update_cluster_ > 0 &&
                       cuda::update_cluster_fits(update_cluster_, u.sn_max_rows, u.sn_max_cols) && sn_tidy(u);
  if (!cluster) {
    budget(b);
    adam(a);
    if (u.sn_count > 0) spectral_norm(u.sn_mats, u.sn_count, u.sn_max_rows, u.sn_max_cols, u.sigma_max, b.skip);
    target_update(t);
    return;
  }
  if (!b.skip || !b.skipped || !a.t) return fail(op, "null skip/skipped/t");
  if (!real_ok(b.grads, op, "grads") || !real_ok(b.fractions, op, "fractions") || !real_ok(b.norms, op, "norms") ||
      !real_ok(b.clips, op, "clips") || !real_ok(b.losses, op, "losses") || !real_ok(b.g, op, "g") ||
      !real_ok(b.total_loss, op, "total_loss") || !real_ok(a.params, op, "params") || !real_ok(a.m, op, "m") ||
      !real_ok(a.v, op, "v") || !real_ok(a.lr, op, "lr") || !real_ok(t.target, op, "target"))
    return;
  void* s = scratch(op, cuda::update_scratch_bytes(b.H));
  if (!s) return;
  if (planning_) return;
  // a split update's side launch on the lane's side slot (its fork and join
  // are graph edges when captured)
  const cuda::UpdateSide side{streams_[kMaxLanes + lane_], side_events_[0], side_events_[1]};
  DQN_CUDA_OK(op, cuda::update_cluster(stream_, u, s, update_cluster_, sn_ranges(u), wave_blocks(), clock_,
                                       kClockBlocks, &clock_launch_.blocks, &update_choices_, &side));
  clock_launch_.cs = update_cluster_;
  clock_launch_.normed = u.sn_count;
}

bool CudaBackend::sn_tidy(const Update& u) noexcept {
  if (u.sn_count == 0) return true;
  if (const SnTable* known = sn_table(u)) return known->tidy;
  if (capturing_) return false;
  std::vector<SpectralMatrix> mats(static_cast<std::size_t>(u.sn_count));
  if (cudaMemcpyAsync(mats.data(), u.sn_mats, mats.size() * sizeof(SpectralMatrix), cudaMemcpyDeviceToHost,
                      stream_) != cudaSuccess ||
      cudaStreamSynchronize(stream_) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  const auto* params = static_cast<const float*>(u.adam.params.p);
  SnTable tab{sn_key(u), true, {}};
  for (const SpectralMatrix& m : mats) {
    cuda::SnRange r;
    if (m.rows > 0 && m.cols > 0) {
      r.lo = static_cast<const float*>(m.w.p) - params;
      r.hi = r.lo + std::int64_t(m.rows) * m.cols;
      r.rows = m.rows;
      if (r.lo < 0 || r.hi > u.adam.P || m.rows > u.sn_max_rows || m.cols > u.sn_max_cols) tab.tidy = false;
    }
    tab.ranges.push_back(r);
  }
  std::vector<std::pair<std::int64_t, std::int64_t>> sorted;
  for (const cuda::SnRange& r : tab.ranges) sorted.emplace_back(r.lo, r.hi);
  std::sort(sorted.begin(), sorted.end());
  for (std::size_t i = 1; i < sorted.size(); ++i)
    if (sorted[i].first < sorted[i - 1].second && sorted[i - 1].second > sorted[i - 1].first) tab.tidy = false;
  sn_tables_.push_back(std::move(tab));
  return sn_tables_.back().tidy;
}

const std::vector<cuda::SnRange>& CudaBackend::sn_ranges(const Update& u) const noexcept {
  static const std::vector<cuda::SnRange> none;
  const SnTable* known = sn_table(u);
  return known ? known->ranges : none;
}

std::string CudaBackend::update_path() const {
  if (update_cluster_ <= 0) return "as separate kernels";
  const cuda::UpdateChoices& c = update_choices_;
  std::string text = "cluster (" + std::to_string(update_cluster_) + " blocks a cluster; last launch:";
  const char* sep = " ";
  const auto add = [&](bool on, const char* what) {
    if (!on) return;
    text += sep;
    text += what;
    sep = ", ";
  };
  add(c.staged, "second tiles staged");
  add(c.gathered, "Wᵀu gathered by shares");
  add(c.kept, "normed rows kept in shared memory");
  add(c.pushed, "sums pushed to every block");
  add(c.one, "one head's g in float");
  if (c.wide()) {
    const int n = static_cast<int>(c.clusters.size()) - c.main_normed;
    add(true, (std::to_string(n) + " normed matri" + (n == 1 ? "x" : "ces") + " in a wide launch beside it").c_str());
  }
  if (*sep == ' ') text += " no shared-memory areas";
  return text + ")";
}

lab::UpdateClock CudaBackend::update_clock() const {
  lab::UpdateClock out;
  if (!clock_ || clock_launch_.blocks <= 0 || clock_launch_.cs <= 0) return out;
  const int n = std::min(clock_launch_.blocks, kClockBlocks);
  out.slots = cuda::kUpdateClockSlots;
  out.stamps.assign(static_cast<std::size_t>(n) * 2 * out.slots, 0);
  if (cudaMemcpy(out.stamps.data(), clock_, out.stamps.size() * sizeof(std::uint64_t), cudaMemcpyDeviceToHost) !=
      cudaSuccess) {
    cudaGetLastError();
    return {};
  }
  out.cluster_size = clock_launch_.cs;
  out.normed = clock_launch_.normed;
  // each block's normed matrix: the main launch's clusters, its other blocks, then the side
  // launch's clusters (a split update), as update_choices_ says
  const cuda::UpdateChoices& ch = update_choices_;
  const int cs = clock_launch_.cs;
  out.group.assign(static_cast<std::size_t>(n), -1);
  for (int blk = 0; blk < n; ++blk) {
    const int cid = blk < ch.main_blocks ? blk / cs : ch.main_normed + (blk - ch.main_blocks) / cs;
    const bool normed = blk < ch.main_blocks ? cid < ch.main_normed : cid < static_cast<int>(ch.clusters.size());
    if (normed) out.group[static_cast<std::size_t>(blk)] = ch.clusters[static_cast<std::size_t>(cid)];
  }
  int clock_khz = 0;
  if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device_) != cudaSuccess) cudaGetLastError();
  out.clock_khz = clock_khz;
  return out;
}

const CudaBackend::SnTable* CudaBackend::sn_table(const Update& u) const noexcept {
  const SnKey key = sn_key(u);
  for (const auto& tab : sn_tables_)
    if (tab.key == key) return &tab;
  return nullptr;
}

}  // namespace dqn::cuda
