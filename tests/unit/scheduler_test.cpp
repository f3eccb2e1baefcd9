// The stage scheduler: a table of stage sets, each with the order it must produce or the error
// it must give, then explain()'s text.
#include <doctest/doctest.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/registry.hpp"
#include "core/runtime.hpp"
#include "core/scheduler.hpp"

using namespace dqn;

namespace {

/// The buffers every case sees, one of each kind that matters for ordering.
Registry make_registry() {
  Registry r;
  r.declare("in", DType::real, {4}, BufferKind::input, "engine");
  r.declare("params", DType::real, {10}, BufferKind::parameter, "engine");
  r.declare("opt", DType::real, {10}, BufferKind::optimizer, "engine");
  r.declare("a", DType::real, {4}, BufferKind::activation, "producer_head");
  r.declare("b", DType::real, {4}, BufferKind::activation, "engine");
  r.declare("c", DType::real, {4}, BufferKind::scratch, "engine");
  r.declare("g", DType::real, {4}, BufferKind::gradient, "engine");
  r.declare("report/block", DType::real, {2}, BufferKind::report, "engine");
  r.declare_view("report/x", "report/block", 0, {1}, "engine");
  r.declare_view("report/y", "report/block", 1, {1}, "engine");
  r.declare("whole", DType::real, {8}, BufferKind::activation, "engine");
  r.declare_view("whole/lo", "whole", 0, {4}, "engine");
  r.declare_view("whole/hi", "whole", 4, {4}, "engine");
  return r;
}

struct S {
  const char* name;
  std::vector<std::string> reads, writes;
  const char* owner = "h";
};

struct Case {
  const char* why;
  std::vector<S> stages;
  std::vector<std::string> order;  ///< expected order (empty: expect an error)
  std::vector<std::string> error;  ///< parts the error message must contain
};

std::vector<Stage> to_stages(const std::vector<S>& ss) {
  std::vector<Stage> out;
  for (const auto& s : ss) out.push_back(Stage{s.name, s.owner, s.reads, s.writes, {}});
  return out;
}

const std::vector<Case>& cases() {
  static const std::vector<Case> table = {
      // --- orders ---
      {"writer before reader, declared in order",
       {{"w", {"in"}, {"a"}}, {"r", {"a"}, {"b"}}}, {"w", "r"}, {}},
      {"writer before reader, declared reader first",
       {{"r", {"a"}, {"b"}}, {"w", {"in"}, {"a"}}}, {"w", "r"}, {}},
      {"a chain declared backwards runs forwards",
       {{"third", {"b"}, {"c"}}, {"second", {"a"}, {"b"}}, {"first", {"in"}, {"a"}}}, {"first", "second", "third"}, {}},
      {"independent stages keep declaration order",
       {{"y", {"in"}, {"b"}}, {"x", {"in"}, {"a"}}}, {"y", "x"}, {}},
      {"every writer of a per-step buffer runs before any reader, writers in declaration order",
       {{"w1", {"in"}, {"a"}}, {"r", {"a"}, {"b"}}, {"w2", {"in"}, {"a"}}}, {"w1", "w2", "r"}, {}},
      {"an in-place stage (reads and writes a) follows the earlier writer",
       {{"w", {"in"}, {"a"}}, {"inplace", {"a"}, {"a"}}, {"r", {"a"}, {"b"}}}, {"w", "inplace", "r"}, {}},
      {"input and persistent buffers need no writer",
       {{"fwd", {"in", "params", "opt"}, {"a"}}}, {"fwd"}, {}},
      {"persistent state: a reader declared before the writer runs before it",
       // Without the rule `upd` (ready at once) would run first; `early` must see the old params.
       {{"early", {"params", "a"}, {"b"}}, {"upd", {}, {"params"}}, {"prod", {"in"}, {"a"}}},
       {"prod", "early", "upd"}, {}},
      {"persistent state: a reader declared after the writer sees the write",
       // Without the rule `late` (ready at once) would run first.
       {{"upd", {"a"}, {"params"}}, {"late", {"params"}, {"b"}}, {"prod", {"in"}, {"a"}}},
       {"prod", "upd", "late"}, {}},
      {"optimizer state follows program order too",
       {{"adam", {"g"}, {"opt"}}, {"reader", {"opt"}, {"c"}}, {"grad", {"in"}, {"g"}}},
       {"grad", "adam", "reader"}, {}},
      {"writes of views satisfy a read of the parent, and precede it",
       {{"budget", {"report/block"}, {"b"}}, {"lx", {"in"}, {"report/x"}}, {"ly", {"in"}, {"report/y"}}},
       {"lx", "ly", "budget"}, {}},
      {"a write of the parent satisfies a read of a view, and precedes it",
       {{"r", {"whole/lo"}, {"b"}}, {"w", {"in"}, {"whole"}}}, {"w", "r"}, {}},
      {"a write of a view orders readers of a sibling view (one storage)",
       {{"r", {"whole/lo"}, {"b"}}, {"wlo", {"in"}, {"whole/lo"}}, {"whi", {"in"}, {"whole/hi"}}},
       {"wlo", "whi", "r"}, {}},
      {"an empty stage set is an empty order", {}, {}, {}},

      // --- errors ---
      {"a read of an undeclared buffer names the stage and the buffer",
       {{"w", {"in"}, {"a"}}, {"c51.loss", {"a", "nope"}, {"b"}, "c51"}}, {},
       {"stage 'c51.loss'", "(c51)", "reads 'nope'", "nobody declared"}},
      {"a write of an undeclared buffer names the stage and the buffer",
       {{"iqn.fwd", {"in"}, {"ghost"}, "iqn"}}, {}, {"stage 'iqn.fwd'", "(iqn)", "writes 'ghost'", "nobody declared"}},
      {"a read of a declared per-step buffer nobody writes names stage, buffer and its declarer",
       {{"cql.loss", {"a"}, {"b"}, "cql"}}, {},
       {"stage 'cql.loss'", "(cql)", "reads 'a'", "no stage writes", "declared by 'producer_head'"}},
      {"scratch and gradients are per-step too",
       {{"r", {"in", "g"}, {"c"}}}, {}, {"reads 'g'", "no stage writes", "declared by 'engine'"}},
      {"a write of one view does not satisfy a read of its sibling",
       {{"whi", {"in"}, {"whole/hi"}}, {"r", {"whole/lo"}, {"b"}}}, {}, {"stage 'r'", "reads 'whole/lo'", "no stage writes"}},
      {"two stages reading each other's output form a named cycle",
       {{"p", {"b"}, {"a"}}, {"q", {"a"}, {"b"}}}, {}, {"cycle", "p → q → p"}},
      {"a cycle is named even when other stages could run",
       {{"ok", {"in"}, {"c"}}, {"x", {"c", "b"}, {"a"}}, {"y", {"a"}, {"g"}}, {"z", {"g"}, {"b"}}}, {},
       {"cycle", "x → y → z → x"}},
      {"a stage downstream of a cycle is not named as part of it",
       // `down` is declared first and never runs, but the cycle is p ⇄ q.
       {{"down", {"a"}, {"c"}}, {"p", {"b"}, {"a"}}, {"q", {"a"}, {"b"}}}, {}, {"cycle", "p → q → p"}},
      {"a stage reading its own output through a view cycle with the writer",
       {{"r", {"whole/lo", "in"}, {"whole/hi"}}, {"w", {"whole/hi"}, {"whole/lo"}}}, {}, {"cycle", "r → w → r"}},
      {"two stages with one name are refused",
       {{"dup", {"in"}, {"a"}}, {"other", {"a"}, {"b"}}, {"dup", {"in"}, {"c"}}}, {}, {"two stages are named 'dup'"}},
  };
  return table;
}

std::vector<std::string> names_in(const std::vector<Stage>& stages, const std::vector<std::size_t>& order) {
  std::vector<std::string> out;
  for (auto i : order) out.push_back(stages[i].name);
  return out;
}

}  // namespace

TEST_CASE("scheduler.table") {
  const Registry reg = make_registry();
  for (const Case& c : cases()) {
    INFO(std::string(c.why));
    const std::vector<Stage> stages = to_stages(c.stages);
    if (c.error.empty()) {
      std::vector<std::size_t> order;
      try {
        order = schedule(stages, reg);
      } catch (const std::exception& e) {
        FAIL_CHECK("unexpected error: " << e.what());
        continue;
      }
      CHECK(names_in(stages, order) == c.order);
    } else {
      std::string message;
      try {
        const auto order = schedule(stages, reg);
        FAIL_CHECK("expected an error, got an order of " << order.size());
      } catch (const std::invalid_argument& e) {
        message = e.what();
      }
      for (const auto& part : c.error) CHECK_MESSAGE(message.find(part) != std::string::npos, "'" << part << "' not in: " << message);
    }
  }
}

TEST_CASE("scheduler.step_shaped_set") {
  // Shaped like the engine's step: head stages declared scrambled, the engine's updates of
  // persistent state declared last (as the engine does), so they run after every reader.
  Registry reg = make_registry();
  reg.declare("h2", DType::real, {4}, BufferKind::activation, "engine");
  reg.declare("logp", DType::real, {4}, BufferKind::activation, "c51");
  reg.declare("dtrunk", DType::real, {4}, BufferKind::gradient, "engine");
  const std::vector<Stage> stages = to_stages({
      {"c51.loss", {"logp"}, {"report/x", "report/y"}, "c51"},
      {"c51.backward", {"logp", "h2", "params"}, {"dtrunk", "g"}, "c51"},
      {"c51.forward", {"h2", "params"}, {"logp"}, "c51"},
      {"trunk.forward", {"in", "params"}, {"h2"}, "engine"},
      {"budget", {"report/block", "g"}, {"c"}, "engine"},
      {"adam", {"c", "g", "opt"}, {"params", "opt"}, "engine"},
      {"target.update", {"params"}, {"opt"}, "engine"},
  });
  const std::vector<std::string> expected = {"trunk.forward", "c51.forward", "c51.loss", "c51.backward",
                                             "budget", "adam", "target.update"};
  CHECK(names_in(stages, schedule(stages, reg)) == expected);
}

TEST_CASE("scheduler.dependencies") {
  // What a stage waits for when stages run side by side: the earlier stages touching an
  // overlapping byte range with one of the two writing it. Disjoint views of one buffer (a
  // layer's weight and bias gradients, the per-head rows of grad/all) do not wait for each other.
  auto rt = make_cpu_runtime(false);
  Registry reg = make_registry();
  reg.declare("grad/all", DType::real, {2, 10}, BufferKind::gradient, "engine");
  reg.declare_view("grad/h/w", "grad/all", 0, {6}, "engine");
  reg.declare_view("grad/h/b", "grad/all", 6, {4}, "engine");
  reg.declare_view("grad/h", "grad/all", 0, {10}, "engine");
  reg.declare_view("grad/k/w", "grad/all", 10, {6}, "engine");
  reg.freeze(*rt);
  const std::vector<Stage> stages = to_stages({
      {"fwd", {"in", "params"}, {"a"}},
      {"data", {"a"}, {"b", "grad/h/b"}},         // RAW on a
      {"weights", {"a", "in"}, {"grad/h/w"}},     // RAW on a; beside data (disjoint view)
      {"other", {"in"}, {"grad/k/w"}},            // another row: independent of everything so far
      {"reread", {"a"}, {"c"}},                   // RAW on a only
      {"whole", {"grad/h"}, {"g"}},               // reads the row both wrote
      {"update", {"grad/all", "c"}, {"params"}},  // every gradient, c; WAR on params after fwd
  });
  const std::vector<std::size_t> order = {0, 1, 2, 3, 4, 5, 6};
  const auto deps = dependencies(stages, order, reg);
  REQUIRE(deps.size() == 7);
  CHECK(deps[0].empty());
  CHECK(deps[1] == std::vector<std::size_t>{0});
  CHECK(deps[2] == std::vector<std::size_t>{0});
  CHECK(deps[3].empty());
  CHECK(deps[4] == std::vector<std::size_t>{0});
  CHECK(deps[5] == std::vector<std::size_t>{1, 2});
  CHECK(deps[6] == std::vector<std::size_t>{0, 1, 2, 3, 4});
}

TEST_CASE("scheduler.plan_lanes") {
  using Deps = std::vector<std::vector<std::size_t>>;
  using After = std::vector<std::vector<std::size_t>>;
  // A chain stays on one lane and waits for nothing else.
  {
    const LanePlan p = plan_lanes(Deps{{}, {0}, {1}}, 4);
    CHECK(p.lane == std::vector<int>{0, 0, 0});
    CHECK(p.after == After{{}, {}, {}});
    CHECK(p.used == 1);
    CHECK(p.false_deps == 0);
  }
  // 0 → {1 → 3 → {4 → 5}, 2}; 3 also waits for 2; 6 needs only 4 (so 2 too, through 4): lane 1,
  // whose last stage (2) is an ancestor of 6, takes it, although 6 does not name 2. Two lanes
  // suffice and nothing queues behind a stage it does not need (5 is not 6's ancestor).
  {
    const Deps deps{{}, {0}, {0}, {1}, {2, 3}, {4}, {4}};
    const LanePlan p = plan_lanes(deps, 2);
    CHECK(p.lane == std::vector<int>{0, 0, 1, 0, 0, 0, 1});
    CHECK(p.after == After{{}, {}, {0}, {}, {2}, {}, {4}});
    CHECK(p.used == 2);
    CHECK(p.false_deps == 0);
  }
  // More independent branches than lanes: the extra one queues behind the longest idle lane.
  {
    const LanePlan p = plan_lanes(Deps{{}, {}, {}}, 2);
    CHECK(p.lane == std::vector<int>{0, 1, 0});
    CHECK(p.false_deps == 1);
  }
  CHECK_THROWS_AS(plan_lanes(Deps{{1}, {}}, 2), std::invalid_argument);
}

TEST_CASE("scheduler.explain") {
  const Registry reg = make_registry();
  const std::vector<Stage> stages = to_stages({
      {"second", {"a", "params"}, {"b", "c"}, "c51"},
      {"first", {"in"}, {"a"}, "engine"},
      {"sink", {"b"}, {}, "iqn"},
  });
  const auto order = schedule(stages, reg);
  const std::string text = explain(stages, order);
  const std::string expected =
      "  1. first  <engine>\n"
      "       reads:  in\n"
      "       writes: a\n"
      "  2. second  <c51>\n"
      "       reads:  a, params\n"
      "       writes: b, c\n"
      "  3. sink  <iqn>\n"
      "       reads:  b\n"
      "       writes: -\n";
  CHECK(text == expected);
  CHECK(explain(stages, {}) == "");
  // With dependencies, a "waits:" line per stage names them.
  const std::vector<std::vector<std::size_t>> deps{{}, {0}, {1}};
  const std::string with = explain(stages, order, &deps);
  CHECK(with.find("       writes: a\n       waits:  -\n") != std::string::npos);
  CHECK(with.find("       writes: b, c\n       waits:  first\n") != std::string::npos);
  CHECK(with.find("       writes: -\n       waits:  second\n") != std::string::npos);
}
