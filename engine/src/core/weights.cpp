// The engine's weights: seeded initialisation, weights files in and out (every value checked
// before any is uploaded), the online parameters for tools.
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/engine.hpp"
#include "core/philox.h"

namespace dqn {

namespace {
constexpr std::uint32_t kInitStream = 0xA11CEu & 0xFFFFu;
constexpr std::uint32_t kSnStream = 0x5EEDu;
}  // namespace

void Engine::init_weights(std::uint64_t seed) {
  rt_->synchronize();
  EngineBackend& be = rt_->ops();
  const std::int64_t P = reg_.param_count();
  std::vector<float> host(std::size_t(P), 0.0f);
  const auto& ps = reg_.params();
  for (std::size_t k = 0; k < ps.size(); ++k) {
    const auto& p = ps[k];
    const double bound = 1.0 / std::sqrt(double(p.fan_in));
    for (std::int64_t i = 0; i < p.numel(); ++i)
      host[std::size_t(p.offset + i)] = float((2.0 * philox::uniform(seed, k, kInitStream, std::uint64_t(i)) - 1.0) * bound);
  }
  be.upload_reals(params_, host.data(), P);
  be.upload_reals(target_, host.data(), P);
  std::vector<float> zeros(std::size_t(P), 0.0f);
  be.upload_reals(adam_m_, zeros.data(), P);
  be.upload_reals(adam_v_, zeros.data(), P);
  const std::int64_t zero = 0;
  be.upload(t_, &zero, 8);
  for (std::size_t i = 0; i < update_->normed().size(); ++i) {
    const auto* p = reg_.find_param(update_->normed()[i].first);
    std::vector<float> u(std::size_t(p->rows));
    double norm = 0;
    for (int r = 0; r < p->rows; ++r) {
      u[std::size_t(r)] = float(2.0 * philox::uniform(seed, i, kSnStream, std::uint64_t(r)) - 1.0);
      norm += double(u[std::size_t(r)]) * u[std::size_t(r)];
    }
    norm = std::sqrt(std::max(norm, 1e-30));
    for (auto& x : u) x = float(x / norm);
    be.upload_reals(update_->normed_vectors()[i], u.data(), p->rows);
  }
  broadcast_state();
  act_->snapshot_now();
  if (be.status()) throw std::runtime_error(std::string("init_weights: ") + be.message());
}

void Engine::load_weights(const st::File& f) {
  rt_->synchronize();
  EngineBackend& be = rt_->ops();
  const std::string where = f.path.empty() ? std::string("weights") : f.path;
  std::vector<std::string> missing;
  for (const auto& p : reg_.params())
    for (const std::string& name : {p.name, "target." + p.name, "adam.m." + p.name, "adam.v." + p.name})
      if (!f.has(name)) missing.push_back(name);
  for (const auto& [p, u] : update_->normed())
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
  for (const auto& p : reg_.params()) {
    const auto shape = p.shape();
    for (const std::string& name : {p.name, "target." + p.name, "adam.m." + p.name, "adam.v." + p.name}) {
      values.push_back(f.get_f32(name, shape));
      first_bad(name, values.back(), name.rfind("adam.v.", 0) == 0);
    }
  }
  std::vector<std::vector<float>> us;
  for (std::size_t i = 0; i < update_->normed().size(); ++i) {
    const auto* p = reg_.find_param(update_->normed()[i].first);
    us.push_back(f.get_f32(update_->normed()[i].second, {p->rows}));
    first_bad(update_->normed()[i].second, us.back(), false);
  }
  std::size_t k = 0;
  for (const auto& p : reg_.params()) {
    be.upload_reals(params_ + p.offset, values[k++].data(), p.numel());
    be.upload_reals(target_ + p.offset, values[k++].data(), p.numel());
    be.upload_reals(adam_m_ + p.offset, values[k++].data(), p.numel());
    be.upload_reals(adam_v_ + p.offset, values[k++].data(), p.numel());
  }
  for (std::size_t i = 0; i < update_->normed().size(); ++i) {
    const auto* p = reg_.find_param(update_->normed()[i].first);
    be.upload_reals(update_->normed_vectors()[i], us[i].data(), p->rows);
  }
  be.upload(t_, &t, 8);
  broadcast_state();
  act_->snapshot_now();
  if (be.status()) throw std::runtime_error(std::string("load_weights: ") + be.message());
}

st::File Engine::save_state(bool dump) {
  rt_->synchronize();
  EngineBackend& be = rt_->ops();
  st::File f;
  std::vector<float> tmp;
  auto put = [&](const std::string& name, Real src, std::vector<std::int64_t> shape, std::int64_t n) {
    tmp.resize(std::size_t(n));
    be.download_reals(tmp.data(), src, n);
    f.put_f32(name, std::move(shape), tmp.data());
  };
  for (const auto& p : reg_.params()) {
    put(p.name, params_ + p.offset, p.shape(), p.numel());
    put("target." + p.name, target_ + p.offset, p.shape(), p.numel());
    put("adam.m." + p.name, adam_m_ + p.offset, p.shape(), p.numel());
    put("adam.v." + p.name, adam_v_ + p.offset, p.shape(), p.numel());
  }
  for (std::size_t i = 0; i < update_->normed().size(); ++i) {
    const auto* p = reg_.find_param(update_->normed()[i].first);
    put(update_->normed()[i].second, update_->normed_vectors()[i], {p->rows}, p->rows);
  }
  std::int64_t t = 0;
  be.download(&t, t_, 8);
  f.put_i64("adam.step", {}, &t);
  if (dump) {
    const StepReport r = read_report();
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
  f.metadata["pipeline"] = spec_.name;
  if (be.status()) throw std::runtime_error(std::string("save_state: ") + be.message());
  return f;
}

std::vector<float> Engine::online_params() {
  rt_->synchronize();
  std::vector<float> out(std::size_t(reg_.param_count()));
  rt_->ops().download_reals(out.data(), params_, reg_.param_count());
  return out;
}

}  // namespace dqn
