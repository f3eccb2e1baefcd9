// dqn check-head: every head's parameter gradients against central differences, on the f64 CPU
// reference at the pipeline's own sizes (core/grad_check.hpp).
#include <algorithm>
#include <cstdio>
#include <string>

#include "commands.hpp"
#include "core/engine_access.hpp"
#include "core/grad_check.hpp"
#include "core/plugin_loader.hpp"

namespace dqn::cli {

int cmd_check_head(const CheckHeadArgs& a) {
  PluginLoader loader(PluginLoader::search_path_from(a.common.plugin_path));
  Common c = a.common;
  c.backend = "cpu";  // the reference: gradients in double
  PipelineSpec spec;
  if (!load_with(loader, c, a.pipeline, spec)) return 1;
  EngineOptions eo;
  eo.f64 = true;
  eo.backend = BackendKind::cpu;
  Engine engine(spec, loader, eo);
  init_weights(engine, spec.seed);
  set_batch(engine, HostBatch::random(spec, a.batch_seed));
  for (const auto& h : a.heads) {
    const auto& names = engine.head_names();
    if (std::find(names.begin(), names.end(), h) == names.end()) {
      std::string known;
      for (const auto& n : names) known += (known.empty() ? "" : ", ") + n;
      std::fprintf(stderr, "dqn check-head: --head '%s' is not a head of %s (heads: %s)\n", h.c_str(),
                   a.pipeline.c_str(), known.c_str());
      return 2;
    }
  }
  GradCheckOptions g;
  g.samples = a.samples;
  g.eps = a.eps;
  g.rtol = a.rtol;
  g.atol = a.atol;
  g.seed = a.seed;
  std::printf("%s: finite differences (step %.1e, %d entries a tensor) against every head's gradient, f64 CPU\n",
              a.pipeline.c_str(), g.eps, g.samples);
  int failed = 0, tensors = 0, entries = 0, heads = 0;
  for (const auto& h : engine.head_names()) {
    if (!a.heads.empty() && std::find(a.heads.begin(), a.heads.end(), h) == a.heads.end()) continue;
    ++heads;
    const auto rows = check_head_gradients(engine, h, g);
    int reached = 0, head_failed = 0;
    for (const auto& r : rows) {
      reached += r.reaches ? 1 : 0;
      head_failed += r.ok ? 0 : 1;
      ++tensors;
      entries += r.checked;
    }
    std::printf("\nhead %s: reaches %d of %d parameter tensors%s\n", h.c_str(), reached, int(rows.size()),
                head_failed ? "" : ", every gradient within tolerance");
    for (const auto& r : rows) {
      if (!a.verbose && r.ok) continue;
      std::printf("  %-4s %-28s %s  max |fd - grad| %.3g (largest |grad| %.3g); worst [%lld]: fd %.9g, grad %.9g\n",
                  r.ok ? "ok" : "FAIL", r.param.c_str(), r.reaches ? "reached  " : "unreached", r.max_abs_err,
                  r.scale, static_cast<long long>(r.worst_index), r.worst_fd, r.worst_analytic);
    }
    failed += head_failed;
  }
  std::printf("\n%d head%s, %d tensor checks, %d entries: %s (|fd - grad| <= %.1g + %.1g * max(|fd|, largest |grad|))\n",
              heads, heads == 1 ? "" : "s", tensors, entries,
              failed ? (std::to_string(failed) + " FAILED").c_str() : "all within tolerance", g.atol, g.rtol);
  return failed ? 1 : 0;
}

}  // namespace dqn::cli
