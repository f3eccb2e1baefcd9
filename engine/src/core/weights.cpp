// The engine's weights: seeded initialisation, weights files in and out (every value checked
// before any is uploaded).
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/engine_access.hpp"
#include "core/philox.h"

namespace dqn {

namespace {
constexpr std::uint32_t kInitStream = 0xA11CEu & 0xFFFFu;
constexpr std::uint32_t kSnStream = 0x5EEDu;

/// The parts of an engine its weights live in, after every queued step has run.
struct Parts {
  EngineBackend& be;
  const Registry& reg;
  const StepBuffers& sb;
  const UpdateStages& up;
  explicit Parts(Engine& e) : be(e.runtime().ops()), reg(e.registry()), sb(e.buffers()), up(e.update()) {
    e.runtime().synchronize();
  }
};
}  // namespace

void init_weights(Engine& e, std::uint64_t seed) {
  const Parts w(e);
  EngineBackend& be = w.be;
  const Registry& reg = w.reg;
  const StepBuffers& sb = w.sb;
  const UpdateStages& up = w.up;
  const std::int64_t P = reg.param_count();
  std::vector<float> host(std::size_t(P), 0.0f);
  const auto& ps = reg.params();
  for (std::size_t k = 0; k < ps.size(); ++k) {
    const auto& p = ps[k];
    const double bound = 1.0 / std::sqrt(double(p.fan_in));
    for (std::int64_t i = 0; i < p.numel(); ++i)
      host[std::size_t(p.offset + i)] = float((2.0 * philox::uniform(seed, k, kInitStream, std::uint64_t(i)) - 1.0) * bound);
  }
  be.upload_reals(sb.params, host.data(), P);
  be.upload_reals(sb.target, host.data(), P);
  std::vector<float> zeros(std::size_t(P), 0.0f);
  be.upload_reals(sb.adam_m, zeros.data(), P);
  be.upload_reals(sb.adam_v, zeros.data(), P);
  const std::int64_t zero = 0;
  be.upload(sb.step, &zero, 8);
  for (std::size_t i = 0; i < up.normed().size(); ++i) {
    const auto* p = reg.find_param(up.normed()[i].first);
    std::vector<float> u(std::size_t(p->rows));
    double norm = 0;
    for (int r = 0; r < p->rows; ++r) {
      u[std::size_t(r)] = float(2.0 * philox::uniform(seed, i, kSnStream, std::uint64_t(r)) - 1.0);
      norm += double(u[std::size_t(r)]) * u[std::size_t(r)];
    }
    norm = std::sqrt(std::max(norm, 1e-30));
    for (auto& x : u) x = float(x / norm);
    be.upload_reals(up.normed_vectors()[i], u.data(), p->rows);
  }
  e.parallel().broadcast();
  e.actor().snapshot_now();
  if (be.status()) throw std::runtime_error(std::string("init_weights: ") + be.message());
}

void load_weights(Engine& e, const st::File& f) {
  const Parts w(e);
  EngineBackend& be = w.be;
  const Registry& reg = w.reg;
  const StepBuffers& sb = w.sb;
  const UpdateStages& up = w.up;
  const std::string where = f.path.empty() ? std::string("weights") : f.path;
  std::vector<std::string> missing;
  for (const auto& p : reg.params())
    for (const std::string& name : {p.name, "target." + p.name, "adam.m." + p.name, "adam.v." + p.name})
      if (!f.has(name)) missing.push_back(name);
  for (const auto& [p, u] : up.normed())
    if (!f.has(u)) missing.push_back(u);
  if (!f.has("adam.step")) missing.push_back("adam.step");
  if (!missing.empty()) {
    std::string list;
    for (std::size_t i = 0; i < missing.size() && i < 8; ++i) list += (i ? ", " : "") + missing[i];
    if (missing.size() > 8) list += ", … (" + std::to_string(missing.size()) + " in all)";
    throw std::invalid_argument(where + ": not a weights file for this pipeline: missing " + list);
  }
  const std::int64_t t = f.get_scalar_i64("adam.step");
  if (t < 0) throw std::invalid_argument(where + ": adam.step is negative (" + std::to_string(t) + ")");
  // Adam's bias correction takes β^t in double and the step counts on: beyond 2^53 neither is exact.
  if (t > (std::int64_t(1) << 53))
    throw std::invalid_argument(where + ": adam.step is " + std::to_string(t) + ", beyond 2^53 steps");
  // Every value checked before any is uploaded: a file that cannot be trained from changes nothing.
  auto first_bad = [&](const std::string& name, const std::vector<float>& v, bool non_negative) {
    for (std::size_t i = 0; i < v.size(); ++i)
      if (!std::isfinite(v[i]) || (non_negative && v[i] < 0.0f))
        throw std::invalid_argument(where + ": tensor '" + name + "': element " + std::to_string(i) + " is " +
                                    std::to_string(v[i]) + (non_negative ? " (must be finite and >= 0)" : " (must be finite)"));
  };
  std::vector<std::vector<float>> values;
  for (const auto& p : reg.params()) {
    const auto shape = p.shape();
    for (const std::string& name : {p.name, "target." + p.name, "adam.m." + p.name, "adam.v." + p.name}) {
      values.push_back(f.get_f32(name, shape));
      first_bad(name, values.back(), name.rfind("adam.v.", 0) == 0);
    }
  }
  std::vector<std::vector<float>> us;
  for (std::size_t i = 0; i < up.normed().size(); ++i) {
    const auto* p = reg.find_param(up.normed()[i].first);
    us.push_back(f.get_f32(up.normed()[i].second, {p->rows}));
    first_bad(up.normed()[i].second, us.back(), false);
  }
  std::size_t k = 0;
  for (const auto& p : reg.params()) {
    be.upload_reals(sb.params + p.offset, values[k++].data(), p.numel());
    be.upload_reals(sb.target + p.offset, values[k++].data(), p.numel());
    be.upload_reals(sb.adam_m + p.offset, values[k++].data(), p.numel());
    be.upload_reals(sb.adam_v + p.offset, values[k++].data(), p.numel());
  }
  for (std::size_t i = 0; i < up.normed().size(); ++i) {
    const auto* p = reg.find_param(up.normed()[i].first);
    be.upload_reals(up.normed_vectors()[i], us[i].data(), p->rows);
  }
  be.upload(sb.step, &t, 8);
  e.parallel().broadcast();
  e.actor().snapshot_now();
  if (be.status()) throw std::runtime_error(std::string("load_weights: ") + be.message());
}

st::File save_weights(Engine& e, bool dump) {
  const Parts w(e);
  EngineBackend& be = w.be;
  const Registry& reg = w.reg;
  const StepBuffers& sb = w.sb;
  const UpdateStages& up = w.up;
  st::File f;
  std::vector<float> tmp;
  auto put = [&](const std::string& name, Real src, std::vector<std::int64_t> shape, std::int64_t n) {
    tmp.resize(std::size_t(n));
    be.download_reals(tmp.data(), src, n);
    f.put_f32(name, std::move(shape), tmp.data());
  };
  for (const auto& p : reg.params()) {
    put(p.name, sb.params + p.offset, p.shape(), p.numel());
    put("target." + p.name, sb.target + p.offset, p.shape(), p.numel());
    put("adam.m." + p.name, sb.adam_m + p.offset, p.shape(), p.numel());
    put("adam.v." + p.name, sb.adam_v + p.offset, p.shape(), p.numel());
  }
  for (std::size_t i = 0; i < up.normed().size(); ++i) {
    const auto* p = reg.find_param(up.normed()[i].first);
    put(up.normed()[i].second, up.normed_vectors()[i], {p->rows}, p->rows);
  }
  std::int64_t t = 0;
  be.download(&t, sb.step, 8);
  f.put_i64("adam.step", {}, &t);
  if (dump) {
    const StepReport r = e.read_report();
    for (std::size_t h = 0; h < r.heads.size(); ++h) {
      const float l = float(r.losses[h]), n = float(r.grad_norms[h]), c = float(r.clips[h]);
      f.put_f32("loss." + r.heads[h], {}, &l);
      f.put_f32("grad_norm." + r.heads[h], {}, &n);
      f.put_f32("clip." + r.heads[h], {}, &c);
    }
    const float tot = float(r.total_loss);
    f.put_f32("loss.total", {}, &tot);
    f.put_f32("td_error", {std::int64_t(r.td_error.size())}, r.td_error.data());
    f.put_i64("skipped_steps", {}, &r.skipped_steps);
  }
  f.metadata["format"] = dump ? "dqn-engine step dump" : "dqn-engine weights";
  f.metadata["pipeline"] = e.spec().name;
  if (be.status()) throw std::runtime_error(std::string("save_weights: ") + be.message());
  return f;
}

}  // namespace dqn
