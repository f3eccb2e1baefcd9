// The pointer registry: declarations and their errors, the one-arena layout (kinds grouped,
// 256-byte alignment, one contiguous report range, one allocation), counted lookups that are
// refused after seal(), and the layout text.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/registry.hpp"
#include "core/runtime.hpp"

using namespace dqn;

namespace {

/// The message of the exception `f` throws (of type E), or "" with a failed check if none.
template <class E = std::exception>
std::string thrown(const std::function<void()>& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL_CHECK("threw the wrong type: " << e.what());
    return e.what();
  }
  FAIL_CHECK("did not throw");
  return "";
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

/// One buffer of every kind, declared interleaved so that grouping is the registry's doing.
void declare_mixed(Registry& r) {
  r.declare("act.a", DType::real, {3, 5}, BufferKind::activation, "h1");
  r.declare("rep.a", DType::real, {2}, BufferKind::report, "engine");
  r.declare("par.a", DType::real, {7}, BufferKind::parameter, "engine");
  r.declare("in.a", DType::i32, {4, 2}, BufferKind::input, "engine");
  r.declare("scr.a", DType::real, {1}, BufferKind::scratch, "h1");
  r.declare("opt.a", DType::i64, {1}, BufferKind::optimizer, "engine");
  r.declare("grad.a", DType::real, {9}, BufferKind::gradient, "engine");
  r.declare("rep.b", DType::i64, {1}, BufferKind::report, "engine");
  r.declare("act.b", DType::real, {33}, BufferKind::activation, "h2");
  r.declare("par.b", DType::real, {65}, BufferKind::parameter, "engine");
  r.declare("in.b", DType::real, {8, 3}, BufferKind::input, "engine");
  r.declare("scr.b", DType::i32, {3}, BufferKind::scratch, "h2");
  r.declare("opt.b", DType::real, {2}, BufferKind::optimizer, "engine");
  r.declare("grad.b", DType::real, {2, 9}, BufferKind::gradient, "engine");
  r.declare("rep.c", DType::real, {5}, BufferKind::report, "h2");
}

}  // namespace

TEST_CASE("registry.declare.duplicate_names_both_owners") {
  Registry r;
  r.declare("x", DType::real, {2}, BufferKind::activation, "alpha");
  const std::string m = thrown<std::invalid_argument>([&] { r.declare("x", DType::i32, {3}, BufferKind::scratch, "beta"); });
  CHECK(has(m, "'x'"));
  CHECK(has(m, "'alpha'"));  // the first owner
  CHECK(has(m, "'beta'"));   // the second
  // The first declaration stands.
  REQUIRE(r.find("x"));
  CHECK(r.find("x")->owner == "alpha");
  CHECK(r.buffer_order().size() == 1);

  r.declare_param("w", 2, 3, 3, 0, "alpha");
  const std::string pm = thrown<std::invalid_argument>([&] { r.declare_param("w", 2, 3, 3, 0, "gamma"); });
  CHECK(has(pm, "'w'"));
  CHECK(has(pm, "'alpha'"));
  CHECK(has(pm, "'gamma'"));
  CHECK(r.param_count() == 6);  // the refused duplicate takes no space
}

TEST_CASE("registry.declare.bad_input") {
  struct Case {
    const char* why;
    std::function<void(Registry&)> act;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {"negative dimension", [](Registry& r) { r.declare("neg", DType::real, {2, -1}, BufferKind::scratch, "h"); },
       {"'neg'", "negative", "[2,-1]", "(h)"}},
      {"empty name", [](Registry& r) { r.declare("", DType::real, {1}, BufferKind::scratch, "h"); },
       {"'h'", "empty name"}},
      {"parameter with zero rows", [](Registry& r) { r.declare_param("p0", 0, 3, 3, 0, "h"); },
       {"'p0'", "(h)", "0x3"}},
      {"parameter with negative cols", [](Registry& r) { r.declare_param("pn", 2, -3, 3, 0, "h"); },
       {"'pn'", "2x-3"}},
      {"parameter with zero fan_in", [](Registry& r) { r.declare_param("pf", 2, 3, 0, 0, "h"); },
       {"'pf'", "fan_in 0"}},
      {"view of an unknown buffer", [](Registry& r) { r.declare_view("v", "nowhere", 0, {1}, "h"); },
       {"'v'", "'nowhere'", "unknown"}},
  };
  for (const Case& c : cases) {
    INFO(std::string(c.why));
    Registry r;
    const std::string m = thrown<std::invalid_argument>([&] { c.act(r); });
    for (const auto& p : c.parts) CHECK_MESSAGE(has(m, p), m);
  }
}

TEST_CASE("registry.view.bounds") {
  struct Case {
    std::int64_t offset;
    std::vector<std::int64_t> shape;
    bool ok;
    const char* why;
  };
  const Case cases[] = {
      {0, {10}, true, "the whole parent"},
      {4, {2, 3}, true, "ends exactly at the end"},
      {9, {1}, true, "the last element"},
      {0, {11}, false, "one element too many"},
      {5, {2, 3}, false, "runs one past the end"},
      {10, {1}, false, "starts at the end"},
      {-1, {1}, false, "negative offset"},
  };
  for (const Case& c : cases) {
    INFO(std::string(c.why));
    Registry r;
    r.declare("parent", DType::real, {10}, BufferKind::activation, "engine");
    if (c.ok) {
      CHECK_NOTHROW(r.declare_view("view", "parent", c.offset, c.shape, "h"));
      REQUIRE(r.find("view"));
      CHECK(r.find("view")->view_of == "parent");
      CHECK(r.find("view")->kind == BufferKind::activation);  // inherited
    } else {
      const std::string m = thrown<std::invalid_argument>([&] { r.declare_view("view", "parent", c.offset, c.shape, "h"); });
      CHECK(has(m, "'view'"));
      CHECK(has(m, "outside 'parent'"));
      CHECK(has(m, "(10 elements)"));
      // A refused view leaves nothing behind: the name is free for a corrected declaration.
      CHECK_FALSE(r.has("view"));
      CHECK(r.buffer_order().size() == 1);
      CHECK_NOTHROW(r.declare_view("view", "parent", 0, {1}, "h"));
    }
  }
  // A view of a view is refused (views are one level deep).
  Registry r;
  r.declare("parent", DType::real, {10}, BufferKind::activation, "engine");
  r.declare_view("lo", "parent", 0, {5}, "h");
  CHECK(has(thrown<std::invalid_argument>([&] { r.declare_view("lolo", "lo", 0, {2}, "h"); }), "view 'lolo' of a view 'lo'"));
  // A view with a negative dimension is refused as such.
  CHECK(has(thrown<std::invalid_argument>([&] { r.declare_view("neg", "parent", 0, {-2}, "h"); }), "negative dimension"));
  CHECK_FALSE(r.has("neg"));
  // A view's name may not repeat a buffer's.
  CHECK(has(thrown<std::invalid_argument>([&] { r.declare_view("lo", "parent", 5, {5}, "h2"); }), "declared twice"));
  CHECK(r.find("lo")->view_offset == 0);
}

TEST_CASE("registry.view.resolves_into_parent") {
  auto rt = make_cpu_runtime(false);
  Registry r;
  r.declare("parent", DType::real, {4, 6}, BufferKind::report, "engine");
  r.declare("ints", DType::i64, {8}, BufferKind::scratch, "engine");
  r.declare_view("row2", "parent", 12, {6}, "h");
  r.declare_view("ints.tail", "ints", 5, {3}, "h");
  r.freeze(*rt);
  CHECK(r.real("row2").p == static_cast<void*>(static_cast<char*>(r.real("parent").p) + 12 * 4));
  CHECK(r.i64("ints.tail") == r.i64("ints") + 5);
  CHECK(r.find("row2")->bytes == 6 * 4);
  CHECK(r.find("row2")->dtype == DType::real);
  // Views add no storage: the arena is the same as without them.
  Registry plain;
  plain.declare("parent", DType::real, {4, 6}, BufferKind::report, "engine");
  plain.declare("ints", DType::i64, {8}, BufferKind::scratch, "engine");
  auto rt2 = make_cpu_runtime(false);
  plain.freeze(*rt2);
  CHECK(plain.arena_bytes() == r.arena_bytes());
}

TEST_CASE("registry.params.contiguous_in_declaration_order") {
  Registry r;
  struct P {
    const char* name;
    int rows, cols;
    std::int64_t offset;
    std::vector<std::int64_t> shape;
  };
  const P table[] = {
      {"a.weight", 3, 4, 0, {3, 4}},   // first at 0
      {"a.bias", 3, 0, 12, {3}},       // cols 0: a vector of rows
      {"b.weight", 5, 2, 15, {5, 2}},  // right after, no padding inside the flat vector
      {"c.weight", 1, 1, 25, {1, 1}},
      {"b.bias", 5, 0, 26, {5}},       // declaration order, not name order
  };
  for (const P& p : table) r.declare_param(p.name, p.rows, p.cols, std::max(1, p.cols), 0, "h");
  CHECK(r.param_count() == 31);
  REQUIRE(r.params().size() == 5);
  for (std::size_t i = 0; i < 5; ++i) {
    INFO(std::string(table[i].name));
    CHECK(r.params()[i].name == table[i].name);
    CHECK(r.params()[i].offset == table[i].offset);
    CHECK(r.params()[i].shape() == table[i].shape);
    REQUIRE(r.find_param(table[i].name));
    CHECK(r.find_param(table[i].name)->offset == table[i].offset);
  }
  CHECK(r.find_param("nope") == nullptr);
  // Flags and fan-in are kept.
  r.declare_param("sn.weight", 2, 2, 7, kParamSpectralNorm, "h");
  CHECK(r.find_param("sn.weight")->flags == kParamSpectralNorm);
  CHECK(r.find_param("sn.weight")->fan_in == 7);
  CHECK(r.find_param("sn.weight")->owner == "h");
  // kParamAlign: padded to a multiple of 4 elements (31 + 4 = 35 → 36); the tensor after it, without
  // the flag, follows directly; an already aligned offset gets no padding.
  r.declare_param("g.weight", 3, 3, 3, kParamAlign | kParamSpectralNorm, "h");
  r.declare_param("g.bias", 3, 0, 3, 0, "h");
  r.declare_param("h.weight", 2, 2, 2, kParamAlign, "h");  // 36 + 9 + 3 = 48: aligned already
  r.declare_param("h.bias", 1, 0, 2, kParamAlign, "h");    // 52
  CHECK(r.find_param("g.weight")->offset == 36);
  CHECK(r.find_param("g.bias")->offset == 45);
  CHECK(r.find_param("h.weight")->offset == 48);
  CHECK(r.find_param("h.bias")->offset == 52);
  CHECK(r.param_count() == 53);
  // kParamPadRows: the rows are held rounded up to 4 (5 → 8 rows of 3, a vector of 5 → 8); the
  // logical shape and numel stay, and the next tensor starts after the zero rows.
  r.declare_param("o.weight", 5, 3, 3, kParamAlign | kParamPadRows, "h");  // 53 → 56
  r.declare_param("o.bias", 5, 0, 3, kParamPadRows, "h");                 // 56 + 24
  r.declare_param("o.next", 2, 0, 3, 0, "h");                             // 80 + 8
  const auto* ow = r.find_param("o.weight");
  CHECK(ow->offset == 56);
  CHECK(ow->numel() == 15);
  CHECK(ow->stored_rows == 8);
  CHECK(ow->stored() == 24);
  CHECK(ow->shape() == std::vector<std::int64_t>{5, 3});
  CHECK(r.find_param("o.bias")->offset == 80);
  CHECK(r.find_param("o.bias")->stored() == 8);
  CHECK(r.find_param("o.next")->offset == 88);
  CHECK(r.find_param("o.next")->stored() == 2);  // no flag: held as declared
  CHECK(r.param_count() == 90);
}

TEST_CASE("registry.freeze.layout") {
  for (bool f64 : {false, true}) {
    INFO("f64 reference: " << f64);
    auto rt = make_cpu_runtime(f64);
    Registry r;
    declare_mixed(r);
    r.freeze(*rt);
    REQUIRE(r.frozen());
    CHECK(r.real_size() == (f64 ? 8u : 4u));
    CHECK(reinterpret_cast<std::uintptr_t>(r.base()) % 256 == 0);

    std::vector<const Registry::Buffer*> all;
    for (const auto& n : r.buffer_order()) all.push_back(r.find(n));
    std::sort(all.begin(), all.end(), [](auto* a, auto* b) { return a->offset_bytes < b->offset_bytes; });
    for (const auto* b : all) {
      INFO(b->name);
      CHECK(b->offset_bytes % 256 == 0);
      CHECK(b->bytes == std::size_t(b->numel()) * r.element_size(b->dtype));
      CHECK(b->offset_bytes + b->bytes <= r.arena_bytes());
    }
    CHECK(r.element_size(DType::i32) == 4);
    CHECK(r.element_size(DType::i64) == 8);
    // No two buffers overlap.
    for (std::size_t i = 1; i < all.size(); ++i) CHECK(all[i - 1]->offset_bytes + all[i - 1]->bytes <= all[i]->offset_bytes);
    // Kinds are grouped: walking the arena, each kind appears in one run.
    std::vector<BufferKind> runs;
    for (const auto* b : all)
      if (runs.empty() || runs.back() != b->kind) runs.push_back(b->kind);
    CHECK(runs.size() == 7);
    // Within a kind, declaration order (stable).
    CHECK(r.find("act.a")->offset_bytes < r.find("act.b")->offset_bytes);
    CHECK(r.find("rep.a")->offset_bytes < r.find("rep.b")->offset_bytes);
    CHECK(r.find("rep.b")->offset_bytes < r.find("rep.c")->offset_bytes);
    // The report block comes last so it ends the arena's used range.
    CHECK(all.back()->kind == BufferKind::report);
  }
}

TEST_CASE("registry.freeze.report_range_is_one_contiguous_block") {
  auto rt = make_cpu_runtime(false);
  Registry r;
  declare_mixed(r);
  r.declare_view("rep.c.first", "rep.c", 0, {1}, "h2");
  r.freeze(*rt);
  const auto [begin, end] = r.report_range();
  CHECK(begin == r.find("rep.a")->offset_bytes);
  CHECK(end == r.find("rep.c")->offset_bytes + r.find("rep.c")->bytes);
  CHECK(begin < end);
  for (const auto& n : r.buffer_order()) {
    const auto* b = r.find(n);
    INFO(n);
    const bool inside = b->offset_bytes >= begin && b->offset_bytes + b->bytes <= end;
    const bool outside = b->offset_bytes + b->bytes <= begin || b->offset_bytes >= end;
    if (b->kind == BufferKind::report) CHECK(inside);  // every report buffer (and view) in the range
    else CHECK(outside);                               // nothing else in it
  }
}

TEST_CASE("registry.freeze.one_zeroed_allocation") {
  auto rt = make_cpu_runtime(false);
  Registry r;
  declare_mixed(r);
  r.declare_param("w", 3, 3, 3, 0, "h");
  CHECK(r.arena_allocations() == 0);
  CHECK_FALSE(r.frozen());
  r.freeze(*rt);
  CHECK(r.arena_allocations() == 1);
  CHECK(r.arena_bytes() % 256 == 0);
  CHECK(std::all_of(r.base(), r.base() + r.arena_bytes(), [](char c) { return c == 0; }));
  // After freeze: no second arena, no new buffers or parameters.
  CHECK(has(thrown<std::logic_error>([&] { r.freeze(*rt); }), "twice"));
  CHECK(has(thrown<std::logic_error>([&] { r.declare("late", DType::real, {1}, BufferKind::scratch, "h9"); }),
            "'late' declared by 'h9' after freeze()"));
  CHECK(has(thrown<std::logic_error>([&] { r.declare_param("late.w", 1, 1, 1, 0, "h9"); }), "after freeze()"));
  CHECK(r.arena_allocations() == 1);
  // An empty registry still gets one (minimal) arena.
  Registry empty;
  auto rt2 = make_cpu_runtime(false);
  empty.freeze(*rt2);
  CHECK(empty.arena_allocations() == 1);
  CHECK(empty.arena_bytes() == 256);
}

TEST_CASE("registry.lookup.counted_and_refused_after_seal") {
  auto rt = make_cpu_runtime(false);
  Registry r;
  declare_mixed(r);
  r.declare_param("w", 2, 2, 2, 0, "h");
  // Before freeze there is nothing to point at.
  CHECK(has(thrown<std::logic_error>([&] { (void)r.real("act.a"); }), "before freeze()"));
  r.freeze(*rt);
  const std::int64_t before = r.lookups();
  const Real act = r.real("act.a");
  (void)r.i32("in.a");
  (void)r.i64("opt.a");
  (void)r.raw("scr.a");
  (void)r.param_in(r.real("par.b"), "w");
  CHECK(r.lookups() == before + 6);  // real, i32, i64, raw, real, param_in
  CHECK(r.lookups_after_seal() == 0);
  // find()/has() are metadata, not resolution: not counted.
  (void)r.find("act.a");
  (void)r.has("act.a");
  CHECK(r.lookups() == before + 6);

  r.seal();
  struct Late {
    const char* what;
    std::function<void()> f;
  };
  const Late late[] = {
      {"real", [&] { (void)r.real("act.a"); }},
      {"i32", [&] { (void)r.i32("in.a"); }},
      {"i64", [&] { (void)r.i64("opt.a"); }},
      {"raw", [&] { (void)r.raw("scr.a"); }},
      {"param_in", [&] { (void)r.param_in(act, "w"); }},
      {"unknown name", [&] { (void)r.real("no.such"); }},  // refused as late before being unknown
  };
  std::int64_t n = 0;
  for (const Late& l : late) {
    INFO(std::string(l.what));
    const std::string m = thrown<std::logic_error>(l.f);
    CHECK(has(m, "during steps"));
    ++n;
    CHECK(r.lookups_after_seal() == n);
  }
  CHECK(r.lookups() == before + 6 + n);
  // Unsealed again (checkpoint I/O between steps), lookups work and are not late.
  r.unseal();
  CHECK(r.real("act.a").p == act.p);
  CHECK(r.lookups_after_seal() == n);
}

TEST_CASE("registry.lookup.errors") {
  auto rt = make_cpu_runtime(false);
  Registry r;
  declare_mixed(r);
  r.declare_param("w1", 2, 2, 2, 0, "h");
  r.declare_param("w2", 3, 0, 2, 0, "h");
  r.freeze(*rt);
  // Unknown buffer: named, with the declared ones listed.
  const std::string unknown = thrown<std::invalid_argument>([&] { (void)r.real("act.c"); });
  CHECK(has(unknown, "no buffer named 'act.c'"));
  for (const char* n : {"act.a", "rep.a", "par.a", "in.a", "scr.b"}) CHECK_MESSAGE(has(unknown, n), unknown);
  // A long list is cut short rather than flooding the message.
  Registry big;
  for (int i = 0; i < 30; ++i) big.declare("buf" + std::to_string(i), DType::real, {1}, BufferKind::scratch, "h");
  auto rt2 = make_cpu_runtime(false);
  big.freeze(*rt2);
  const std::string cut = thrown<std::invalid_argument>([&] { (void)big.raw("nope"); });
  CHECK(has(cut, "buf0"));
  CHECK(has(cut, "buf11"));
  CHECK_FALSE(has(cut, "buf29"));
  CHECK(has(cut, "…"));

  // Wrong dtype: says what it is and what was asked.
  struct Case {
    std::function<void()> f;
    const char* expect;
  };
  const Case wrong[] = {
      {[&] { (void)r.i32("act.a"); }, "'act.a' is real, not i32"},
      {[&] { (void)r.i64("in.a"); }, "'in.a' is i32, not i64"},
      {[&] { (void)r.real("opt.a"); }, "'opt.a' is i64, not real"},
  };
  for (const Case& c : wrong) CHECK(has(thrown<std::invalid_argument>(c.f), c.expect));
  // Unknown parameter: named, with the declared ones.
  const std::string p = thrown<std::invalid_argument>([&] { (void)r.param_in(r.real("par.b"), "w3"); });
  CHECK(has(p, "no parameter named 'w3'"));
  CHECK(has(p, "w1, w2"));
}

TEST_CASE("registry.param_in") {
  for (bool f64 : {false, true}) {
    INFO("f64 reference: " << f64);
    auto rt = make_cpu_runtime(f64);
    Registry r;
    r.declare_param("a", 4, 3, 3, 0, "h");
    r.declare_param("b", 4, 0, 3, 0, "h");
    r.declare_param("c", 2, 5, 5, 0, "h");
    r.declare("params", DType::real, {r.param_count()}, BufferKind::parameter, "engine");
    r.declare("grads", DType::real, {2, r.param_count()}, BufferKind::gradient, "engine");
    r.freeze(*rt);
    const Real flat = r.real("params");
    const std::size_t es = f64 ? 8 : 4;
    CHECK(r.param_in(flat, "a").p == flat.p);
    CHECK(r.param_in(flat, "b").p == static_cast<void*>(static_cast<char*>(flat.p) + 12 * es));
    CHECK(r.param_in(flat, "c").p == static_cast<void*>(static_cast<char*>(flat.p) + 16 * es));
    CHECK(r.param_in(flat, "c").esize == es);
    // Any flat [P] row works: the second row of a [2,P] gradient block.
    const Real row1 = r.real("grads") + r.param_count();
    CHECK(r.param_in(row1, "b").p == static_cast<void*>(static_cast<char*>(row1.p) + 12 * es));
  }
}

TEST_CASE("registry.layout_text") {
  auto rt = make_cpu_runtime(false);
  Registry r;
  r.declare("batch/states", DType::real, {4, 3}, BufferKind::input, "engine");
  r.declare("idx", DType::i32, {4}, BufferKind::activation, "c51");
  r.declare("report/losses", DType::real, {2}, BufferKind::report, "engine");
  r.declare_view("loss/c51", "report/losses", 1, {1}, "engine");
  r.declare_param("w", 3, 2, 2, 0, "engine");
  r.freeze(*rt);
  const std::string t = r.layout_text();
  INFO(t);
  CHECK(has(t, "arena: " + std::to_string(r.arena_bytes()) + " bytes, 4 buffers, 6 parameters in 1 tensors (real = 4 bytes)"));
  // One line per buffer: offset, bytes, kind, dtype+shape, name, owner.
  const auto* s = r.find("batch/states");
  CHECK(has(t, std::to_string(s->offset_bytes) + "\t48\tinput\treal[4,3]\tbatch/states  <engine>"));
  CHECK(has(t, "\t16\tactivation\ti32[4]\tidx  <c51>"));
  CHECK(has(t, "\t8\treport\treal[2]\treport/losses  <engine>"));
  const auto* v = r.find("loss/c51");
  CHECK(has(t, std::to_string(v->offset_bytes) + "\t4\treport\treal[1]\tloss/c51  (view of report/losses @1)  <engine>"));
  CHECK(std::count(t.begin(), t.end(), '\n') == 5);
  // In arena order.
  CHECK(t.find("batch/states") < t.find("idx"));
  CHECK(t.find("idx") < t.find("report/losses"));
  // to_string of kinds and dtypes, as printed.
  CHECK(std::string(to_string(BufferKind::optimizer)) == "optimizer");
  CHECK(std::string(to_string(BufferKind::gradient)) == "gradient");
  CHECK(std::string(to_string(BufferKind::scratch)) == "scratch");
  CHECK(std::string(to_string(BufferKind::parameter)) == "parameter");
  CHECK(std::string(to_string(DType::i64)) == "i64");
}

TEST_CASE("registry.merge_ranges") {
  using R = std::vector<std::pair<std::int64_t, std::int64_t>>;
  // sorted, overlapping and touching ranges joined, empty ones dropped
  CHECK(merge_ranges(R{{10, 20}, {0, 5}, {5, 8}, {15, 30}, {40, 40}}, 4) == R{{0, 8}, {10, 30}});
  // more than max: the smallest gaps close first (2 between 12 and 14, then 4 between 14·16 and 20)
  CHECK(merge_ranges(R{{0, 10}, {12, 14}, {16, 18}, {50, 60}, {100, 101}}, 3) == R{{0, 18}, {50, 60}, {100, 101}});
  CHECK(merge_ranges(R{{0, 10}, {12, 14}, {16, 18}, {50, 60}, {100, 101}}, 1) == R{{0, 101}});
  CHECK(merge_ranges(R{}, 4).empty());
}
