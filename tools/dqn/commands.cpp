// dqn plugins / validate / step, and the pipeline loading they share.
#include "commands.hpp"

#include <cstdio>
#include <fstream>
#include <iostream>

#include "core/engine.hpp"
#include "pipeline/parse.hpp"
#include "core/plugin_loader.hpp"
#include "core/safetensors.hpp"

namespace dqn::cli {

namespace {
PluginLoader make_loader(const Common& c) { return PluginLoader(PluginLoader::search_path_from(c.plugin_path)); }

void print_problems(const PluginLoader& l) {
  for (const auto& p : l.problems()) std::fprintf(stderr, "warning: %s\n", p.c_str());
}

bool write_text(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!(f << text)) {
      std::fprintf(stderr, "error: cannot write '%s'\n", tmp.c_str());
      return false;
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::fprintf(stderr, "error: cannot rename '%s' to '%s'\n", tmp.c_str(), path.c_str());
    return false;
  }
  return true;
}

bool load_with(const PluginLoader& loader, const Common& c, const std::string& file, PipelineSpec& out,
               std::string* resolved) {
  ParseOptions opt;
  opt.overrides = c.overrides;
  if (!c.backend.empty()) opt.overrides.push_back("backend=" + c.backend);
  opt.plugins = &loader;
  try {
    out = load_pipeline(file, opt);
    if (resolved) *resolved = to_yaml(out, loader);
    return true;
  } catch (const PipelineErrors& e) {
    for (const auto& err : e.errors()) std::fprintf(stderr, "%s\n", err.what());
    std::fprintf(stderr, "%s: %zu error%s\n", file.c_str(), e.errors().size(), e.errors().size() == 1 ? "" : "s");
    return false;
  }
}
}  // namespace

bool load(const Common& c, const std::string& file, PipelineSpec& out, std::string* resolved_yaml) {
  PluginLoader loader = make_loader(c);
  return load_with(loader, c, file, out, resolved_yaml);
}

int cmd_plugins(const Common& c) {
  PluginLoader loader = make_loader(c);
  std::printf("search path: %s\n", loader.search_path().c_str());
  if (loader.plugins().empty()) std::printf("no plugins found\n");
  for (const auto& p : loader.plugins()) std::printf("\n%s", describe_plugin(p).c_str());
  for (const auto& p : loader.problems()) std::printf("\nnot loaded: %s\n", p.c_str());
  return loader.plugins().empty() ? 1 : 0;
}

int cmd_validate(const Common& c, const std::vector<std::string>& files) {
  PluginLoader loader = make_loader(c);
  print_problems(loader);
  int bad = 0;
  for (const auto& f : files) {
    PipelineSpec spec;
    if (load_with(loader, c, f, spec, nullptr)) {
      std::size_t enabled = 0;
      for (const auto& h : spec.heads) enabled += h.enabled ? 1 : 0;
      const std::string heads = enabled == spec.heads.size()
                                    ? std::to_string(enabled) + (enabled == 1 ? " head" : " heads")
                                    : std::to_string(enabled) + " of " + std::to_string(spec.heads.size()) + " heads enabled";
      std::printf("%s: ok (%s, backend %s)\n", f.c_str(), heads.c_str(), spec.backend_auto ? "auto" : to_string(spec.backend));
    } else {
      ++bad;
    }
  }
  return bad ? 1 : 0;
}

int cmd_step(const StepArgs& a) {
  PluginLoader loader = make_loader(a.common);
  print_problems(loader);
  PipelineSpec spec;
  std::string resolved;
  if (!load_with(loader, a.common, a.pipeline, spec, &resolved)) return 1;
  if (a.print_pipeline) std::printf("%s", resolved.c_str());
  if (!a.batch.empty() && a.random_batch >= 0) {
    std::fprintf(stderr, "dqn step: give --batch or --random-batch, not both\n");
    return 2;
  }
  Engine engine(spec, loader);
  if (a.explain) std::printf("%s", engine.explain().c_str());

  if (!a.weights.empty()) {
    engine.load_weights(st::read_file(a.weights));
  } else {
    engine.init_weights(spec.seed);
  }
  if (!a.init.empty()) {
    st::write_file(a.init, engine.save_state(false));
    std::printf("wrote initial weights to %s\n", a.init.c_str());
  }
  const bool want_steps = !a.out.empty() || !a.batch.empty() || a.random_batch >= 0;
  if (!want_steps) return 0;

  HostBatch batch;
  if (!a.batch.empty()) {
    batch = HostBatch::from_file(st::read_file(a.batch), a.batch);
  } else {
    batch = HostBatch::random(spec, std::uint64_t(a.random_batch >= 0 ? a.random_batch : 1));
  }
  engine.set_batch(batch);
  if (!a.save_batch.empty()) {
    st::File bf;
    batch.to_file(bf);
    st::write_file(a.save_batch, bf);
  }
  // Per-step draws some heads make (IQN's τ, τ'): kept for the dump, spec "Step dump".
  struct Draw { std::string buffer, tensor; std::vector<float> values; std::int64_t per_step = 0; };
  std::vector<Draw> draws;
  std::vector<std::pair<std::string, std::string>> metrics;  // buffer → tensor, last step only
  for (const auto& h : engine.head_names()) {
    for (const char* t : {"tau", "tau_target"})
      if (const auto* b = engine.registry().find(h + "/" + t)) draws.push_back({b->name, h + "." + t, {}, b->numel()});
    if (engine.registry().find(h + "/disagreement")) metrics.emplace_back(h + "/disagreement", h + ".disagreement");
  }
  for (int i = 0; i < a.steps; ++i) {
    engine.step();
    for (auto& d : draws) {
      const auto v = engine.host_buffer(d.buffer);
      d.values.insert(d.values.end(), v.begin(), v.end());
    }
  }
  const StepReport r = engine.read_report();
  std::printf("%d step%s on %s: total loss %.6g, skipped %lld, adam step %lld\n", a.steps, a.steps == 1 ? "" : "s",
              engine.runtime().describe().c_str(), r.total_loss, static_cast<long long>(r.skipped_steps),
              static_cast<long long>(r.adam_step));
  for (std::size_t h = 0; h < r.heads.size(); ++h)
    std::printf("  %-10s loss %.6g  grad norm %.6g  clip %.4g  budget %.3g\n", r.heads[h].c_str(), r.losses[h],
                r.grad_norms[h], r.clips[h], r.fractions[h]);
  if (!a.out.empty()) {
    st::File dump = engine.save_state(true);
    for (const auto& d : draws) {
      const auto* b = engine.registry().find(d.buffer);
      std::vector<std::int64_t> shape{a.steps};
      shape.insert(shape.end(), b->shape.begin(), b->shape.end());
      dump.put_f32(d.tensor, shape, d.values.data());
    }
    for (const auto& [buffer, tensor] : metrics) {
      const auto v = engine.host_buffer(buffer);
      const std::vector<float> f(v.begin(), v.end());
      dump.put_f32(tensor, engine.registry().find(buffer)->shape, f.data());
    }
    st::write_file(a.out, dump);
    write_text(a.out + ".pipeline.yaml", resolved);
    std::printf("wrote %s (and %s.pipeline.yaml)\n", a.out.c_str(), a.out.c_str());
  }
  return 0;
}

}  // namespace dqn::cli
