// Central differences of a head's loss against its gradient row, tensor by tensor.
#include "core/grad_check.hpp"

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>

namespace dqn {

std::vector<GradCheckRow> check_head_gradients(Engine& e, const std::string& head, const GradCheckOptions& opt) {
  if (e.backend() != BackendKind::cpu || e.runtime().ops().real_size() != sizeof(double))
    throw std::invalid_argument("gradient check: needs the f64 CPU reference (EngineOptions::f64)");
  const auto& names = e.head_names();
  if (std::find(names.begin(), names.end(), head) == names.end())
    throw std::invalid_argument("gradient check: no head named '" + head + "'");
  if (opt.samples < 1 || !(opt.eps > 0)) throw std::invalid_argument("gradient check: samples >= 1 and eps > 0");
  e.forward_backward();
  const std::vector<double> grad = host_buffer(e, "grad/" + head);
  const std::vector<double> theta = host_buffer(e, "params");
  const std::string loss = "loss/" + head;
  auto loss_at = [&](std::int64_t at, double value) {
    host_write(e, "params", at, value);
    e.forward_backward();
    return host_buffer(e, loss)[0];
  };
  std::mt19937_64 rng(opt.seed);
  std::vector<GradCheckRow> rows;
  for (const auto& p : e.registry().params()) {
    GradCheckRow r;
    r.head = head;
    r.param = p.name;
    for (std::int64_t i = 0; i < p.numel(); ++i) r.scale = std::max(r.scale, std::fabs(grad[std::size_t(p.offset + i)]));
    r.reaches = r.scale > 0;
    std::vector<std::int64_t> idx{0, p.numel() / 2, p.numel() - 1};  // then random entries, `samples` in all
    std::uniform_int_distribution<std::int64_t> pick(0, p.numel() - 1);
    while (int(idx.size()) < opt.samples) idx.push_back(pick(rng));
    idx.resize(std::size_t(opt.samples));
    for (const std::int64_t i : idx) {
      const std::int64_t at = p.offset + i;
      const double t0 = theta[std::size_t(at)];
      const double lp = loss_at(at, t0 + opt.eps), lm = loss_at(at, t0 - opt.eps);
      host_write(e, "params", at, t0);
      const double fd = (lp - lm) / (2 * opt.eps), an = grad[std::size_t(at)];
      const double err = std::fabs(fd - an);
      const bool good = err <= opt.atol + opt.rtol * std::max(std::fabs(fd), r.scale);  // NaN fails
      if (r.worst_index < 0 || std::isnan(err) || (!std::isnan(r.max_abs_err) && err > r.max_abs_err)) {
        r.max_abs_err = err;
        r.worst_fd = fd;
        r.worst_analytic = an;
        r.worst_index = i;
      }
      r.ok = r.ok && good;
      ++r.checked;
    }
    rows.push_back(r);
  }
  e.forward_backward();  // buffers as they were before the check
  return rows;
}

}  // namespace dqn
