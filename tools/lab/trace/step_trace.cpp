// dqn-trace: where a captured step's time goes. Replays the step with CUPTI's concurrent-kernel
// activity records on and prints, per graph node, the median start, duration and end relative
// to the step's first kernel, the stage that enqueued it, the node it waited for (of the kernels
// it depends on in the graph, the one that ended last), the time the whole GPU sat idle inside
// the step, and the critical path: from the last node back through what each waited for. ncu
// times kernels one at a time with cold caches; this times them where they run, side by side.
// With programmatic launch a node's "start" is when its first block is placed, which may be
// before the node it waits for ends.
// Usage: dqn-trace PIPELINE [key=value ...] [--batch N] [--precision P] [--steps N] [--update-clock]
//        [--replay uniform|prioritized [--replay-size N]]  (the step drawing from a full replay, as
//        `dqn bench --epoch` times it)
#include <cupti.h>
#include <cxxabi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/engine_access.hpp"
#include "pipeline/parse.hpp"
#include "core/plugin_loader.hpp"
#include "cuda/cuda_lab.hpp"

namespace {

struct Rec {
  std::uint64_t start, end, node;
  std::string name;
};
std::vector<Rec> g_recs;

constexpr std::size_t kBufBytes = 8u << 20;

void CUPTIAPI buffer_requested(uint8_t** buf, size_t* size, size_t* max_records) {
  *buf = static_cast<uint8_t*>(std::aligned_alloc(8, kBufBytes));
  *size = kBufBytes;
  *max_records = 0;
}

std::string short_name(const char* mangled) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> d(abi::__cxa_demangle(mangled, nullptr, nullptr, &status), std::free);
  std::string s = status == 0 && d ? d.get() : mangled;
  for (std::size_t p; (p = s.find("(anonymous namespace)::")) != std::string::npos;) s.erase(p, 23);
  // "void ns::kernel<...>(args)" -> "kernel<...>", then cut long template lists.
  int depth = 0;  // the argument list: the first '(' outside template brackets
  for (std::size_t p = 0; p < s.size(); ++p) {
    if (s[p] == '<') ++depth;
    if (s[p] == '>') --depth;
    if (s[p] == '(' && depth == 0) {
      s.resize(p);
      break;
    }
  }
  if (s.rfind("void ", 0) == 0) s.erase(0, 5);
  if (auto p = s.find("::"); p != std::string::npos && s.find('<') > p) s.erase(0, s.rfind("::", s.find('<')) + 2);
  if (s.size() > 60) s.resize(60);
  return s;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buf, size_t, size_t valid) {
  CUpti_Activity* r = nullptr;
  while (cuptiActivityGetNextRecord(buf, valid, &r) == CUPTI_SUCCESS) {
    if (r->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(r);
    g_recs.push_back({k->start, k->end, k->graphNodeId, short_name(k->name)});
  }
  std::free(buf);
}

/// The executable graph's node ids (what kernel records carry) → the ids of the captured graph's
/// nodes they were cloned from at instantiation (CUPTI's resource callback): how a record finds
/// its node in Runtime::graph_node_info(), whose handles are the captured graph's.
std::map<std::uint64_t, std::uint64_t> g_clone_of;

void CUPTIAPI on_resource(void*, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void* cbdata) {
  if (domain != CUPTI_CB_DOMAIN_RESOURCE || cbid != CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED || !cbdata) return;
  const auto* rd = static_cast<const CUpti_ResourceData*>(cbdata);
  const auto* gd = static_cast<const CUpti_GraphData*>(rd->resourceDescriptor);
  std::uint64_t id = 0, original = 0;
  if (gd && gd->node && gd->originalNode && cuptiGetGraphNodeId(gd->node, &id) == CUPTI_SUCCESS &&
      cuptiGetGraphNodeId(gd->originalNode, &original) == CUPTI_SUCCESS)
    g_clone_of[id] = original;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#define CUPTI_OK(x)                                                          \
  do {                                                                       \
    if (CUptiResult r_ = (x); r_ != CUPTI_SUCCESS) {                         \
      const char* s_ = nullptr;                                              \
      cuptiGetResultString(r_, &s_);                                         \
      std::fprintf(stderr, "dqn-trace: %s: %s\n", #x, s_ ? s_ : "CUPTI error"); \
      return 1;                                                              \
    }                                                                        \
  } while (0)

}  // namespace

/// --update-clock: `steps` more replays, each read back after a synchronize (so each starts
/// from an idle GPU), and per group of the cluster update's blocks (each normed matrix's cluster,
/// then the blocks of the other parameters) the median over replays of when its last block
/// reached each stamp, µs after the first block of the kernel was placed; then the phases of the
/// block that left last, from its SM's clock64.
void print_update_clock(dqn::Engine& e, int steps) {
  static const char* const kSlot[] = {"placed", "waited", "clips", "adam", "Wtu",   "gather",
                                      "v",      "Wv",     "sigma", "scaled", "exit"};
  constexpr int kSlots = static_cast<int>(std::size(kSlot));  // cuda::UpdateClockSlot's order
  std::vector<std::vector<std::vector<double>>> at;  // [group][slot] → per replay
  std::vector<std::vector<double>> cycles;           // the last block's slot-to-slot cycles, per replay
  dqn::cuda::lab::UpdateClock c;
  for (int r = 0; r < steps; ++r) {
    e.step();
    e.runtime().synchronize();
    c = dqn::cuda::lab::update_clock(e.runtime());
    if (c.stamps.empty() || c.slots != kSlots) {
      std::printf("update clock: nothing recorded (the cluster update did not run)\n");
      return;
    }
    const int S = c.slots, blocks = static_cast<int>(c.stamps.size()) / (2 * S);
    // groups: the normed matrices in table order, then the other parameters' blocks
    const auto group_of = [&](int b) {
      const int g = b < static_cast<int>(c.group.size()) ? c.group[std::size_t(b)] : -1;
      return g >= 0 && g < c.normed ? g : c.normed;
    };
    bool others = false;
    for (int b = 0; b < blocks; ++b) others = others || group_of(b) == c.normed;
    const int groups = c.normed + (others ? 1 : 0);
    if (at.empty()) at.assign(std::size_t(groups), std::vector<std::vector<double>>(std::size_t(S)));
    std::uint64_t t0 = ~0ull;
    for (int b = 0; b < blocks; ++b) t0 = std::min(t0, c.stamps[std::size_t(b) * 2 * S]);
    std::vector<std::vector<double>> last(std::size_t(groups), std::vector<double>(std::size_t(S), -1.0));
    int last_block = 0;  // the block that left last
    std::uint64_t last_exit = 0;
    for (int b = 0; b < blocks; ++b) {
      const std::uint64_t* st = &c.stamps[std::size_t(b) * 2 * S];
      const int g = group_of(b);
      for (int k = 0; k < S; ++k)
        if (st[k] >= st[0])  // reached in this run (older stamps are a previous run's)
          last[std::size_t(g)][std::size_t(k)] = std::max(last[std::size_t(g)][std::size_t(k)], (st[k] - t0) * 1e-3);
      if (st[S - 1] >= st[0] && st[S - 1] > last_exit) {
        last_exit = st[S - 1];
        last_block = b;
      }
    }
    for (int g = 0; g < groups; ++g)
      for (int k = 0; k < S; ++k)
        if (last[std::size_t(g)][std::size_t(k)] >= 0) at[std::size_t(g)][std::size_t(k)].push_back(last[std::size_t(g)][std::size_t(k)]);
    const std::uint64_t* gt = &c.stamps[std::size_t(last_block) * 2 * S];
    const std::uint64_t* cl = gt + S;
    std::vector<double> d;  // -1 where a stamp is not this run's
    for (int k = 1; k < S; ++k)
      d.push_back(gt[k] >= gt[0] && gt[k - 1] >= gt[0] && cl[k] >= cl[k - 1] ? double(cl[k] - cl[k - 1]) : -1.0);
    cycles.push_back(std::move(d));
  }
  std::printf("update clock (%d replays, each after an idle GPU; us after the kernel's first block was placed, "
              "median over replays of each group's last block):\n%-10s", steps, "group");
  for (const char* n : kSlot) std::printf(" %8s", n);
  std::printf("\n");
  for (std::size_t g = 0; g < at.size(); ++g) {
    const std::string name = int(g) < c.normed ? "normed " + std::to_string(g) : "others";
    std::printf("%-10s", name.c_str());
    for (const auto& v : at[g]) {
      if (v.empty()) std::printf(" %8s", "-");
      else std::printf(" %8.2f", median(v));
    }
    std::printf("\n");
  }
  if (!cycles.empty()) {
    const double per_us = c.clock_khz > 0 ? c.clock_khz * 1e-3 : 0.0;
    std::printf("the last block's phases (clock64, median over replays; us at the %d MHz nominal clock):\n",
                c.clock_khz / 1000);
    for (std::size_t k = 0; k + 1 < std::size_t(kSlots); ++k) {
      std::vector<double> v;
      for (const auto& d : cycles)
        if (d[k] >= 0) v.push_back(d[k]);
      if (v.empty()) continue;
      const double m = median(v);
      std::printf("  %-6s -> %-6s %9.0f cycles %7.2f us\n", kSlot[k], kSlot[k + 1], m, per_us > 0 ? m / per_us : 0.0);
    }
  }
}

int main(int argc, char** argv) {
  CLI::App app{"dqn-trace — per-node timeline of the captured step (CUPTI activity records)"};
  std::string pipeline, plugin_path;
  std::vector<std::string> overrides;
  int batch = 0, steps = 200, warmup = 200, clock_steps = 50;
  bool update_clock = false;
  std::string precision, replay;
  std::int64_t replay_size = 1000000;
  app.add_option("pipeline", pipeline, "pipeline file")->required();
  app.add_option("overrides", overrides, "key.path=value overrides");
  app.add_option("--plugin-path", plugin_path, "plugin directories (colon-separated)");
  app.add_option("--batch", batch, "batch size (default: the pipeline's)");
  app.add_option("--precision", precision, "fp32, tf32 or bf16 (default: the pipeline's)");
  app.add_option("--steps", steps, "traced replays")->check(CLI::Range(3, 100000));
  app.add_option("--warmup", warmup, "replays before tracing")->check(CLI::Range(0, 100000));
  app.add_flag("--update-clock", update_clock,
               "also stamp the fused update's phases and print when each normed matrix's cluster reached each "
               "(after the trace)");
  app.add_option("--clock-steps", clock_steps, "with --update-clock: replays whose update stamps are read")
      ->check(CLI::Range(1, 100000));
  app.add_option("--replay", replay, "the step draws its batch from a full replay of this kind")
      ->check(CLI::IsMember({"uniform", "prioritized"}));
  app.add_option("--replay-size", replay_size, "with --replay: transitions in it")
      ->check(CLI::Range(std::int64_t(1), std::int64_t(1) << 31));
  CLI11_PARSE(app, argc, argv);

  using namespace dqn;
  PluginLoader loader(PluginLoader::search_path_from(plugin_path));
  ParseOptions opt;
  opt.overrides = overrides;
  opt.overrides.push_back("backend=cuda");
  opt.overrides.push_back("report_every=1000000000");
  if (batch > 0) opt.overrides.push_back("batch=" + std::to_string(batch));
  if (!precision.empty()) opt.overrides.push_back("precision=" + precision);
  opt.plugins = &loader;
  PipelineSpec spec;
  try {
    spec = load_pipeline(pipeline, opt);
  } catch (const PipelineErrors& e) {
    for (const auto& err : e.errors()) std::fprintf(stderr, "%s\n", err.what());
    return 1;
  }
  if (spec.training.replay.capacity < spec.batch) spec.training.replay.capacity = spec.batch;
  // Before the engine captures and instantiates its step: which executable node came from which
  // captured one (a subscriber of its own; the activity API below needs none).
  // Optional: without it the records are matched by their ids' rank, as before.
  CUpti_SubscriberHandle subscriber = nullptr;
  if (cuptiSubscribe(&subscriber, on_resource, nullptr) != CUPTI_SUCCESS ||
      cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED) != CUPTI_SUCCESS)
    std::fprintf(stderr, "dqn-trace: no CUPTI resource callbacks: graph nodes will be matched by rank\n");
  std::unique_ptr<Engine> engine;
  try {
    // (read when the engine's CUDA runtime is made)
    if (!cuda::lab::record_update_clock(update_clock) && update_clock) {
      std::printf("update clock: this build has no phase stamps (a lab build has them: meson setup -Dlab=true)\n");
      update_clock = false;
    }
    EngineOptions eo;
    if (!replay.empty()) {
      EngineReplay r;
      r.spec = spec.training.replay;
      r.spec.capacity = std::max<std::int64_t>(replay_size, spec.batch);
      r.spec.prioritized = replay == "prioritized";
      r.beta_steps = r.spec.capacity;
      r.staging_rows = int(std::min<std::int64_t>(kReplayFillChunk, r.spec.capacity));
      eo.replay = r;
    }
    engine = std::make_unique<Engine>(spec, loader, eo);
    init_weights(*engine, spec.seed);
    if (eo.replay)
      fill_replay_random(*engine, eo.replay->spec.capacity);
    else
      set_batch(*engine, HostBatch::random(spec, 1));
    for (int i = 0; i < warmup; ++i) engine->step();
    engine->runtime().synchronize();
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "dqn-trace: %s\n", ex.what());
    return 1;
  }
  Engine& e = *engine;

  CUPTI_OK(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
  CUPTI_OK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
  for (int i = 0; i < steps; ++i) e.step();
  e.runtime().synchronize();
  CUPTI_OK(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
  CUPTI_OK(cuptiActivityFlushAll(1));

  // Replays run one after the other on one stream: sorted by start, every `per` records are one.
  std::sort(g_recs.begin(), g_recs.end(), [](const Rec& a, const Rec& b) { return a.start < b.start; });
  std::map<std::uint64_t, std::string> names;
  for (const auto& r : g_recs) names[r.node] = r.name;
  const std::size_t per = names.size();
  if (per == 0 || g_recs.size() % per != 0) {
    std::fprintf(stderr, "dqn-trace: %zu kernel records for %zu graph nodes: replays not separable\n", g_recs.size(),
                 per);
    return 1;
  }
  const std::size_t replays = g_recs.size() / per;
  std::map<std::uint64_t, std::vector<double>> st, du, en;
  std::vector<double> span, period, idle, busy_sum;
  for (std::size_t k = 0; k < replays; ++k) {
    const Rec* r = &g_recs[k * per];
    const std::uint64_t t0 = r[0].start;
    std::uint64_t last = 0, covered = t0, gap = 0, busy = 0;
    for (std::size_t i = 0; i < per; ++i) {
      st[r[i].node].push_back((r[i].start - t0) * 1e-3);
      du[r[i].node].push_back((r[i].end - r[i].start) * 1e-3);
      en[r[i].node].push_back((r[i].end - t0) * 1e-3);
      if (r[i].start > covered) gap += r[i].start - covered;  // nothing ran in between
      covered = std::max(covered, r[i].end);
      last = std::max(last, r[i].end);
      busy += r[i].end - r[i].start;
    }
    span.push_back((last - t0) * 1e-3);
    idle.push_back(gap * 1e-3);
    busy_sum.push_back(busy * 1e-3);
    if (k + 1 < replays) period.push_back((g_recs[(k + 1) * per].start - t0) * 1e-3);
  }
  // The graph's own structure (stage and dependencies per node), matched to the records by
  // CUPTI's node id, or else by rank (nodes made in capture order get rising ids).
  const auto info = e.runtime().graph_node_info();
  const auto waits = stage_waits(e);
  std::map<std::uint64_t, int> node_index;  // CUPTI id → index in info
  {
    // Kernel nodes; if the records hold more (a copy done by a kernel), copies and sets too.
    std::vector<std::pair<std::uint64_t, int>> ids;
    for (bool copies : {false, true}) {
      if (copies && ids.size() == names.size()) break;
      ids.clear();
      for (std::size_t i = 0; i < info.size(); ++i) {
        std::uint64_t id = 0;
        if ((info[i].kernel || (copies && info[i].copy)) &&
            cuptiGetGraphNodeId(static_cast<CUgraphNode>(const_cast<void*>(info[i].handle)), &id) == CUPTI_SUCCESS)
          ids.emplace_back(id, int(i));
      }
    }
    std::size_t hits = 0, cloned = 0;
    for (const auto& [id, i] : ids) hits += names.count(id);
    std::map<std::uint64_t, int> by_id(ids.begin(), ids.end());
    for (const auto& [id, name] : names)
      if (const auto c = g_clone_of.find(id); c != g_clone_of.end() && by_id.count(c->second)) ++cloned;
    if (hits == names.size()) {
      for (const auto& [id, i] : ids) node_index[id] = i;
    } else if (cloned == names.size()) {  // records carry the executable graph's ids
      for (const auto& [id, name] : names) node_index[id] = by_id[g_clone_of[id]];
      std::printf("(graph nodes matched through their clones: %zu of %zu)\n", cloned, names.size());
    } else if (ids.size() == names.size()) {  // by rank
      std::sort(ids.begin(), ids.end());
      std::size_t k = 0;
      for (const auto& [id, name] : names) node_index[id] = ids[k++].second;
      std::printf("(graph nodes matched by rank: %zu of %zu CUPTI ids matched, %zu through clones)\n", hits,
                  names.size(), cloned);
    } else {
      std::printf("(graph structure not available: %zu kernel nodes in the graph, %zu traced)\n", ids.size(),
                  names.size());
    }
  }
  struct Row {
    std::uint64_t node;
    double s, d, e;
    int idx;  // in info, or -1
  };
  std::vector<Row> rows;
  for (const auto& [node, name] : names) {
    const auto it = node_index.find(node);
    rows.push_back({node, median(st[node]), median(du[node]), median(en[node]), it == node_index.end() ? -1 : it->second});
  }
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.s < b.s; });
  std::map<int, const Row*> by_idx;
  for (const auto& r : rows)
    if (r.idx >= 0) by_idx[r.idx] = &r;
  const std::uint64_t base = rows.empty() ? 0 : std::min_element(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
                                                  return a.node < b.node;
                                                })->node;
  auto stage_name = [&](int idx) -> std::string {
    if (idx < 0) return "?";
    const int sidx = info[std::size_t(idx)].stage;
    return sidx >= 0 && std::size_t(sidx) < waits.size() ? waits[std::size_t(sidx)].first : "-";
  };
  // The kernel nodes a node waits for, through non-kernel nodes.
  auto kernel_deps = [&](int idx) {
    std::vector<int> out, queue;  // breadth first; the queue only grows
    std::vector<char> seen(info.size(), 0);
    for (int d : info[std::size_t(idx)].deps) queue.push_back(d);
    for (std::size_t q = 0; q < queue.size(); ++q) {
      const auto d = static_cast<std::size_t>(queue[q]);
      if (seen[d]) continue;
      seen[d] = 1;
      if (info[d].kernel || info[d].copy) out.push_back(int(d));
      else
        for (int x : info[d].deps) queue.push_back(x);
    }
    return out;
  };
  // The dependency that ended last: what held the node back.
  auto holder = [&](const Row& r) -> const Row* {
    if (r.idx < 0) return nullptr;
    const Row* h = nullptr;
    for (int d : kernel_deps(r.idx))
      if (const auto it = by_idx.find(d); it != by_idx.end() && (!h || it->second->e > h->e)) h = it->second;
    return h;
  };
  std::printf("%s: batch %d, %s, %zu kernel nodes, %zu replays traced\n", spec.name.c_str(), spec.batch,
              to_string(spec.precision), per, replays);
  std::printf("step period %.2f us (first kernel to next step's first), span %.2f us, GPU idle inside the step "
              "%.2f us, kernel time summed %.2f us\n",
              median(period), median(span), median(idle), median(busy_sum));
  std::printf("%5s %8s %8s %8s  %-24s %-44s %s\n", "node", "start", "dur", "end", "stage", "kernel",
              "waits for (its end to this start; p: a programmatic edge)");
  // Whether node idx waits for node d through a programmatic edge of its own (p after the number).
  auto programmatic = [&](int idx, int d) {
    const auto& n = info[std::size_t(idx)];
    for (std::size_t k = 0; k < n.deps.size() && k < n.programmatic.size(); ++k)
      if (n.deps[k] == d && n.programmatic[k]) return true;
    return false;
  };
  for (const auto& r : rows) {
    char after[96] = "";
    if (const Row* h = holder(r))
      std::snprintf(after, sizeof after, "%llu%s (%+.2f)", static_cast<unsigned long long>(h->node - base),
                    programmatic(r.idx, h->idx) ? "p" : "", r.s - h->e);
    std::printf("%5llu %8.2f %8.2f %8.2f  %-24.24s %-44.44s %s\n", static_cast<unsigned long long>(r.node - base), r.s,
                r.d, r.e, stage_name(r.idx).c_str(), names[r.node].c_str(), after);
  }
  // The critical path: from the node that ends last, back through what held each node.
  if (!by_idx.empty()) {
    const Row* r = &*std::max_element(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.e < b.e; });
    std::vector<const Row*> path;
    for (; r; r = holder(*r)) path.push_back(r);
    std::printf("critical path (%zu nodes; beside each, the other kernels running during it: how many, and the\n"
                "three that overlap it longest, by stage and µs of overlap):\n",
                path.size());
    for (auto it = path.rbegin(); it != path.rend(); ++it) {
      const Row& c = **it;
      std::vector<std::pair<double, const Row*>> over;  // (overlap, row)
      for (const auto& o : rows) {
        const double ov = std::min(c.e, o.e) - std::max(c.s, o.s);
        if (&o != &c && ov > 0.0) over.emplace_back(ov, &o);
      }
      std::sort(over.begin(), over.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
      std::string beside;
      for (std::size_t k = 0; k < over.size() && k < 3; ++k) {
        char one[64];
        std::snprintf(one, sizeof one, "%s%s %.1f", k ? ", " : "", stage_name(over[k].second->idx).c_str(), over[k].first);
        beside += one;
      }
      std::printf("  %8.2f %8.2f  %-24.24s %-40.40s beside %zu: %s\n", c.s, c.e, stage_name(c.idx).c_str(),
                  names[c.node].c_str(), over.size(), beside.c_str());
    }
  }
  if (update_clock) print_update_clock(e, clock_steps);
  return 0;
}
