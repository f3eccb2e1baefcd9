// Stage ordering by reads and writes (a deterministic topological sort).
#include "core/scheduler.hpp"

#include <algorithm>
#include <map>
#include <queue>
#include <set>
#include <sstream>
#include <stdexcept>

#include "core/registry.hpp"

namespace dqn {

namespace {
bool persistent(BufferKind k) { return k == BufferKind::parameter || k == BufferKind::optimizer; }

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

// A view shares storage with its parent: order by the parent's name.
std::string storage_of(const Registry& reg, const std::string& name) {
  const auto* b = reg.find(name);
  return b && !b->view_of.empty() ? b->view_of : name;
}
}  // namespace

std::vector<std::size_t> schedule(const std::vector<Stage>& stages, const Registry& reg) {
  const std::size_t n = stages.size();
  std::set<std::string> names;
  for (const auto& s : stages)
    if (!names.insert(s.name).second) throw std::invalid_argument("scheduler: two stages are named '" + s.name + "'");

  // Per storage: who writes it, who reads it, in declaration order. Views of one buffer that are
  // written by different stages (per-head slots of a report block) are ordered as the whole.
  struct Use { std::vector<std::size_t> writers, readers; };
  std::map<std::string, Use> uses;
  std::map<std::string, std::set<std::string>> written_names;  // exact names written
  for (std::size_t i = 0; i < n; ++i) {
    for (const auto& w : stages[i].writes) {
      if (!reg.has(w))
        throw std::invalid_argument("scheduler: stage '" + stages[i].name + "' (" + stages[i].owner +
                                    ") writes '" + w + "', which nobody declared");
      uses[storage_of(reg, w)].writers.push_back(i);
      written_names[w].insert(stages[i].name);
    }
  }
  // A read is satisfied by a write of the same name, of its parent, or of one of its views.
  auto written = [&](const std::string& r) {
    if (written_names.count(r)) return true;
    const auto* b = reg.find(r);
    if (b && !b->view_of.empty() && written_names.count(b->view_of)) return true;
    for (const auto& [wn, ws] : written_names)
      if (const auto* wb = reg.find(wn); wb && wb->view_of == r) return true;
    return false;
  };
  for (std::size_t i = 0; i < n; ++i) {
    for (const auto& r : stages[i].reads) {
      const auto* b = reg.find(r);
      if (!b)
        throw std::invalid_argument("scheduler: stage '" + stages[i].name + "' (" + stages[i].owner +
                                    ") reads '" + r + "', which nobody declared or writes");
      const bool from_outside = b->kind == BufferKind::input || persistent(b->kind);
      if (!from_outside && !written(r))
        throw std::invalid_argument("scheduler: stage '" + stages[i].name + "' (" + stages[i].owner +
                                    ") reads '" + r + "', which no stage writes (declared by '" + b->owner + "')");
      if (!contains(stages[i].writes, r)) uses[storage_of(reg, r)].readers.push_back(i);
    }
  }

  std::vector<std::set<std::size_t>> succ(n);
  std::vector<int> indeg(n, 0);
  auto edge = [&](std::size_t a, std::size_t b) {
    if (a != b && succ[a].insert(b).second) ++indeg[b];
  };
  for (auto& [name, u] : uses) {
    std::sort(u.writers.begin(), u.writers.end());
    u.writers.erase(std::unique(u.writers.begin(), u.writers.end()), u.writers.end());
    std::sort(u.readers.begin(), u.readers.end());
    u.readers.erase(std::unique(u.readers.begin(), u.readers.end()), u.readers.end());
    for (std::size_t k = 1; k < u.writers.size(); ++k) edge(u.writers[k - 1], u.writers[k]);
    const auto* b = reg.find(name);
    if (b && (persistent(b->kind) || b->kind == BufferKind::input)) {
      // Program order: a reader sees the writes declared before it, and precedes later writes
      // (state kept across steps, and inputs that a late stage fills for the next step).
      for (auto r : u.readers)
        for (auto w : u.writers) {
          if (w < r) edge(w, r);
          else edge(r, w);
        }
    } else {
      for (auto r : u.readers)
        for (auto w : u.writers) edge(w, r);
    }
  }

  std::priority_queue<std::size_t, std::vector<std::size_t>, std::greater<>> ready;
  for (std::size_t i = 0; i < n; ++i)
    if (indeg[i] == 0) ready.push(i);
  std::vector<std::size_t> order;
  while (!ready.empty()) {
    auto i = ready.top();
    ready.pop();
    order.push_back(i);
    for (auto j : succ[i])
      if (--indeg[j] == 0) ready.push(j);
  }
  if (order.size() != n) {
    // Name one cycle: walk back from any unscheduled stage along unscheduled predecessors (every
    // unscheduled stage has one, so the walk must close a cycle; successors may dead-end in a
    // stage that merely waits on the cycle).
    std::vector<bool> done(n, false);
    for (auto i : order) done[i] = true;
    std::vector<std::vector<std::size_t>> pred(n);
    for (std::size_t i = 0; i < n; ++i)
      for (auto j : succ[i]) pred[j].push_back(i);
    std::size_t start = 0;
    while (done[start]) ++start;
    std::vector<std::size_t> path{start};
    std::map<std::size_t, std::size_t> seen{{start, 0}};
    for (;;) {
      std::size_t prev = n;
      for (auto j : pred[path.back()])
        if (!done[j]) { prev = j; break; }
      if (prev == n) break;
      if (auto it = seen.find(prev); it != seen.end()) {
        // path[it->second..] runs against the edges: reverse it, start at the first declared.
        std::vector<std::size_t> cyc(path.rbegin(), path.rend() - std::ptrdiff_t(it->second));
        std::rotate(cyc.begin(), std::min_element(cyc.begin(), cyc.end()), cyc.end());
        std::string text;
        for (auto k : cyc) text += stages[k].name + " → ";
        throw std::invalid_argument("scheduler: the stages form a cycle: " + text + stages[cyc.front()].name);
      }
      seen[prev] = path.size();
      path.push_back(prev);
    }
    throw std::invalid_argument("scheduler: the stages form a cycle involving '" + stages[start].name + "'");
  }
  return order;
}

std::vector<std::vector<std::size_t>> dependencies(const std::vector<Stage>& stages,
                                                   const std::vector<std::size_t>& order, const Registry& reg) {
  struct Range { std::size_t lo, hi; bool write; };
  std::vector<std::vector<Range>> acc(order.size());
  for (std::size_t k = 0; k < order.size(); ++k) {
    const Stage& s = stages[order[k]];
    auto add = [&](const std::string& name, bool write) {
      const auto* b = reg.find(name);
      if (!b) throw std::invalid_argument("scheduler: stage '" + s.name + "' uses '" + name + "', which nobody declared");
      acc[k].push_back(Range{b->offset_bytes, b->offset_bytes + b->bytes, write});
    };
    for (const auto& w : s.writes) add(w, true);
    for (const auto& r : s.reads)
      if (!contains(s.writes, r)) add(r, false);
  }
  std::vector<std::vector<std::size_t>> deps(order.size());
  for (std::size_t k = 0; k < order.size(); ++k)
    for (std::size_t j = 0; j < k; ++j) {
      bool conflict = false;
      for (const auto& x : acc[k]) {
        for (const auto& y : acc[j])
          if ((x.write || y.write) && x.lo < y.hi && y.lo < x.hi) { conflict = true; break; }
        if (conflict) break;
      }
      if (conflict) deps[k].push_back(j);
    }
  return deps;
}

LanePlan plan_lanes(const std::vector<std::vector<std::size_t>>& deps, int lanes) {
  const std::size_t n = deps.size();
  const int L = std::max(1, lanes);
  LanePlan p;
  p.lane.assign(n, 0);
  p.after.assign(n, {});
  // ancestors[k]: every position stage k waits for, directly or through others
  std::vector<std::vector<bool>> ancestors(n, std::vector<bool>(n, false));
  std::vector<int> last(std::size_t(L), -1);  // per lane its last position, -1: unused
  for (std::size_t k = 0; k < n; ++k) {
    for (auto j : deps[k]) {
      if (j >= k) throw std::invalid_argument("plan_lanes: stage " + std::to_string(k) + " depends on a later one");
      ancestors[k][j] = true;
      for (std::size_t i = 0; i < j; ++i)
        if (ancestors[j][i]) ancestors[k][i] = true;
    }
    int lane = -1, best = -1;
    for (int l = 0; l < L; ++l) {  // the lane whose last stage is k's newest ancestor
      const int t = last[std::size_t(l)];
      if (t >= 0 && ancestors[k][std::size_t(t)] && t > best) best = t, lane = l;
    }
    for (int l = 0; l < L && lane < 0; ++l)
      if (last[std::size_t(l)] < 0) lane = l;
    if (lane < 0) {
      lane = int(std::min_element(last.begin(), last.end()) - last.begin());
      ++p.false_deps;
    }
    std::vector<int> newest(std::size_t(L), -1);
    for (auto j : deps[k])
      if (p.lane[j] != lane) newest[std::size_t(p.lane[j])] = std::max(newest[std::size_t(p.lane[j])], int(j));
    for (int v : newest)
      if (v >= 0) p.after[k].push_back(std::size_t(v));
    std::sort(p.after[k].begin(), p.after[k].end());
    p.lane[k] = lane;
    last[std::size_t(lane)] = int(k);
    p.used = std::max(p.used, lane + 1);
  }
  return p;
}

std::string explain(const std::vector<Stage>& stages, const std::vector<std::size_t>& order,
                    const std::vector<std::vector<std::size_t>>* deps) {
  std::ostringstream os;
  auto join = [](const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
    return s.empty() ? std::string("-") : s;
  };
  for (std::size_t k = 0; k < order.size(); ++k) {
    const auto& s = stages[order[k]];
    os << "  " << k + 1 << ". " << s.name << "  <" << s.owner << ">\n"
       << "       reads:  " << join(s.reads) << "\n"
       << "       writes: " << join(s.writes) << "\n";
    if (deps && k < deps->size()) {
      std::vector<std::string> names;
      for (auto j : (*deps)[k]) names.push_back(stages[order[j]].name);
      os << "       waits:  " << join(names) << "\n";
    }
  }
  return os.str();
}

}  // namespace dqn
