// The dqn command line, run as a process from the build tree (stdout and stderr captured):
// plugins, validate (shipped, invalid and missing-plugin pipelines), step (the dump's spec names,
// the saved resolved pipeline, init/weights/batch round trips bit for bit, corrupt weights),
// --explain, bench on the CPU reference (its JSON and table, refused input), and docs/pipeline.md against
// `dqn doc pipeline`.
#include <doctest/doctest.h>

#include <csignal>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dqn/plugin.hpp"
#include "core/safetensors.hpp"

namespace fs = std::filesystem;

namespace {

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::string env_or_fail(const char* name) {
  const char* v = std::getenv(name);
  REQUIRE_MESSAGE(v != nullptr, name << " is not set: run this test through `meson test`");
  return v;
}
std::string source_dir() { return env_or_fail("DQN_SOURCE_DIR"); }
std::string plugin_dir() { return env_or_fail("DQN_PLUGIN_PATH"); }
std::string dqn() { return env_or_fail("DQN_BUILD_DIR") + "/tools/dqn"; }
std::string c51_yaml() { return source_dir() + "/pipelines/c51.yaml"; }

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

struct Run {
  int rc = -1;
  std::string out;  ///< stdout and stderr together
};

/// Runs `dqn <args>` through the shell with the test environment (plugin path = build tree);
/// `env` ("NAME=value ...", already quoted) is prepended to the command.
Run dqn_run(const std::string& args, const std::string& env = "") {
  const std::string cmd = env + (env.empty() ? "" : " ") + quote(dqn()) + " " + args + " 2>&1";
  Run r;
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  return r;
}

struct TempDir {
  fs::path dir;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "dqn-cli-XXXXXX").string();
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    dir = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  std::string path(const std::string& name) const { return (dir / name).string(); }
  std::string file(const std::string& name, const std::string& contents) const {
    std::ofstream(dir / name, std::ios::binary) << contents;
    return path(name);
  }
};

// Small sizes so every step takes milliseconds on the CPU.
const std::string kSmall = "--backend cpu network.trunk=[32,32] batch=16";

/// Every tensor a C51-only step dump must hold (docs/step-math.md, "Files"), with its shape, for trunk [32,32],
/// S = 64, Hh = 128, D = 3, A = 5, Z = 51, B = 16.
std::map<std::string, std::vector<std::int64_t>> expected_dump(bool spectral_norm, bool with_reports) {
  std::map<std::string, std::vector<std::int64_t>> params = {
      {"trunk.0.weight", {32, 64}}, {"trunk.0.bias", {32}}, {"trunk.1.weight", {32, 32}}, {"trunk.1.bias", {32}},
      {"c51.value.0.weight", {128, 32}}, {"c51.value.0.bias", {128}},
      {"c51.value.1.weight", {51, 128}}, {"c51.value.1.bias", {51}},
  };
  for (int d = 0; d < 3; ++d) {
    const std::string b = "c51.branch." + std::to_string(d);
    params[b + ".0.weight"] = {128, 32};
    params[b + ".0.bias"] = {128};
    params[b + ".1.weight"] = {5 * 51, 128};
    params[b + ".1.bias"] = {5 * 51};
  }
  std::map<std::string, std::vector<std::int64_t>> all;
  for (const auto& [n, s] : params) {
    for (const std::string prefix : {"", "target.", "adam.m.", "adam.v."}) all[prefix + n] = s;
    if (spectral_norm && s.size() == 2) all["sn.u." + n] = {s[0]};  // every weight matrix: trunk and c51
  }
  all["adam.step"] = {};
  if (with_reports) {
    for (const char* n : {"loss.c51", "grad_norm.c51", "clip.c51", "loss.total", "skipped_steps"}) all[n] = {};
    all["td_error"] = {16};
  }
  return all;
}

void check_names_and_shapes(const dqn::st::File& f, bool spectral_norm, bool with_reports) {
  const auto expect = expected_dump(spectral_norm, with_reports);
  for (const auto& [name, shape] : expect) {
    INFO(name);
    REQUIRE(f.has(name));
    CHECK(dqn::st::shape_str(f.get(name).shape) == dqn::st::shape_str(shape));
  }
  std::vector<std::string> extra;
  for (const auto& n : f.names())
    if (!expect.count(n)) extra.push_back(n);
  CHECK_MESSAGE(extra.empty(), "unexpected tensors, first: " << (extra.empty() ? "" : extra[0]));
}

/// Bit-for-bit equality of two files' tensors (names, dtypes, shapes, bytes).
void check_identical(const dqn::st::File& a, const dqn::st::File& b) {
  REQUIRE(a.names() == b.names());
  for (const auto& n : a.names()) {
    INFO(n);
    const auto& x = a.get(n);
    const auto& y = b.get(n);
    CHECK(x.dtype == y.dtype);
    CHECK(x.shape == y.shape);
    CHECK(x.bytes == y.bytes);
  }
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

/// "" when the texts are equal; else the first line where they differ, from both.
std::string first_difference(const std::string& a_name, const std::string& a, const std::string& b_name,
                             const std::string& b) {
  std::istringstream in_a(a), in_b(b);
  std::string line_a, line_b;
  for (int line = 1;; ++line) {
    const bool more_a = static_cast<bool>(std::getline(in_a, line_a));
    const bool more_b = static_cast<bool>(std::getline(in_b, line_b));
    if (!more_a && !more_b) return a == b ? "" : a_name + " and " + b_name + " differ in their last line's end";
    if (more_a && more_b && line_a == line_b) continue;
    return a_name + " differs from " + b_name + " first at line " + std::to_string(line) + ":\n  " + a_name +
           ": " + (more_a ? line_a : "(ends)") + "\n  " + b_name + ": " + (more_b ? line_b : "(ends)");
  }
}

/// The command that writes docs/pipeline.md with this build's plugins only (as the tests see them).
std::string doc_pipeline_command(const std::string& doc_path) {
  return "DQN_PLUGIN_DEFAULT_DIRS= DQN_PLUGIN_PATH=" + quote(plugin_dir()) + " " + quote(dqn()) +
         " doc pipeline > " + quote(doc_path);
}

}  // namespace

TEST_CASE("cli.plugins") {
  const Run r = dqn_run("plugins");
  INFO(r.out);
  CHECK(r.rc == 0);
  CHECK(has(r.out, "search path: " + plugin_dir() + "\n"));
  CHECK(has(r.out, "\nc51 "));
  CHECK(has(r.out, "(" + plugin_dir() + "/libdqn_c51.so)"));
  CHECK(has(r.out, "roles: primary"));
  CHECK_FALSE(has(r.out, "not loaded"));
  // A directory holding broken libraries and a third-party head: both are listed, with reasons.
  const std::string fixtures = env_or_fail("DQN_TEST_FIXTURES");
  const Run f = dqn_run("plugins --plugin-path " + quote(fixtures));
  INFO(f.out);
  CHECK(f.rc == 0);
  CHECK(has(f.out, "search path: " + fixtures + ":" + plugin_dir()));
  CHECK(has(f.out, "h2_l2 0.4.0"));
  CHECK(has(f.out, "roles: auxiliary; default budget 0.1"));
  CHECK(has(f.out, "weight (number, default 0.01, min 0): "));  // its schema
  CHECK(has(f.out, "not loaded: plugin 'wrong_abi' (" + fixtures + "/libdqn_wrong_abi.so) was built for ABI 99.0, engine is ABI " +
                      std::to_string(dqn::kAbiMajor) + "." + std::to_string(dqn::kAbiMinor)));
  CHECK(has(f.out, "not loaded: plugin '" + fixtures + "/libdqn_not_a_plugin.so': no 'dqn_plugin_descriptor' symbol"));
  CHECK(has(f.out, "\nc51 "));  // still found after the fixtures
  // A library that crashes while being loaded: reported, and the listing goes on; commands that do
  // not need it never open it.
  const std::string crashing = env_or_fail("DQN_TEST_CRASHING");
  const Run c = dqn_run("plugins --plugin-path " + quote(crashing));
  INFO(c.out);
  CHECK(c.rc == 0);
  CHECK(has(c.out, "not loaded: plugin '" + crashing + "/libdqn_crasher.so': crashed while being loaded or described (signal " +
                       std::to_string(SIGABRT)));
  CHECK(has(c.out, "\nc51 "));
  const Run v = dqn_run("validate " + quote(c51_yaml()) + " --plugin-path " + quote(crashing));
  INFO(v.out);
  CHECK(v.rc == 0);
  CHECK(has(v.out, ": ok ("));
  const Run s = dqn_run("step " + quote(c51_yaml()) + " --backend cpu --random-batch 1 --steps 1 --plugin-path " + quote(crashing));
  INFO(s.out);
  CHECK(s.rc == 0);
  // Nothing on the path: said so, and a failing exit.
  TempDir empty;
  const Run none = dqn_run("plugins", "DQN_PLUGIN_PATH=" + quote(empty.dir.string()));
  INFO(none.out);
  CHECK(none.rc != 0);
  CHECK(has(none.out, "search path: " + empty.dir.string() + "\n"));
  CHECK(has(none.out, "no plugins found"));
}

TEST_CASE("cli.check_head: finite differences pass every built-in head and catch a wrong gradient by name") {
  const std::string fixtures = env_or_fail("DQN_TEST_FIXTURES");
  TempDir tmp;
  auto pipeline = [&](const std::string& name, const std::string& aux) {
    return tmp.file(name + ".yaml",
                    "name: " + name + "\nbackend: cpu\nbatch: 5\n"
                    "network: {state: 4, trunk: [7, 6], head_hidden: 5, branches: 2, actions: 3, atoms: 5, v_min: -2, "
                    "v_max: 2}\nheads:\n  - {plugin: c51, role: primary}\n" + aux);
  };
  const Run ok = dqn_run("check-head " + quote(pipeline("ok", "  - {plugin: iqn, quantiles: 3, target_quantiles: 4, embed: 5}\n"
                                                                "  - {plugin: ensemble, members: 2}\n  - {plugin: cql}\n"
                                                                "  - {plugin: h2_l2}\n")) +
                         " --plugin-path " + quote(fixtures));
  INFO(ok.out);
  CHECK(ok.rc == 0);
  for (const char* h : {"head c51:", "head iqn:", "head ensemble:", "head cql:", "head h2_l2:"}) CHECK(has(ok.out, h));
  CHECK(has(ok.out, "5 heads,"));
  CHECK(has(ok.out, "all within tolerance"));
  CHECK_FALSE(has(ok.out, "FAIL"));
  const Run bad = dqn_run("check-head " + quote(pipeline("bad", "  - {plugin: bad_grad}\n")) + " --plugin-path " +
                          quote(fixtures) + " --head bad_grad");
  INFO(bad.out);
  CHECK(bad.rc == 1);
  CHECK(has(bad.out, "head bad_grad:"));
  CHECK(has(bad.out, "FAIL trunk.1.weight"));  // the trunk's last layer sees the doubled ∂L/∂h2 first
  CHECK(has(bad.out, "FAILED"));
  CHECK_FALSE(has(bad.out, "head c51:"));  // --head: only that one
  const Run unknown = dqn_run("check-head " + quote(pipeline("bad", "  - {plugin: bad_grad}\n")) + " --plugin-path " +
                              quote(fixtures) + " --head nosuch");
  CHECK(unknown.rc == 2);
  CHECK(has(unknown.out, "--head 'nosuch' is not a head of"));
}

TEST_CASE("cli.doc.pipeline: docs/pipeline.md is what `dqn doc pipeline` prints") {
  const Run r = dqn_run("doc pipeline");
  REQUIRE_MESSAGE(r.rc == 0, r.out);
  const std::string doc_path = source_dir() + "/docs/pipeline.md";
  const std::string difference = first_difference("docs/pipeline.md", read_text(doc_path), "dqn doc pipeline", r.out);
  CHECK_MESSAGE(difference.empty(), difference << "\nregenerate it with: " << doc_pipeline_command(doc_path));
}

TEST_CASE("cli.validate.shipped_pipelines") {
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(source_dir() + "/pipelines"))
    if (e.path().extension() == ".yaml") files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  REQUIRE(std::find(files.begin(), files.end(), c51_yaml()) != files.end());
  std::string all;
  for (const auto& f : files) {
    INFO(f);
    const Run r = dqn_run("validate " + quote(f));
    INFO(r.out);
    CHECK(r.rc == 0);
    CHECK(has(r.out, f + ": ok"));
    all += ' ';  // not " " + quote(f): GCC 12's -Wrestrict misreads that insert in release builds
    all += quote(f);
  }
  const Run r = dqn_run("validate" + all);  // several at once
  CHECK(r.rc == 0);
  CHECK(std::count(r.out.begin(), r.out.end(), '\n') == std::ptrdiff_t(files.size()));
}

TEST_CASE("cli.validate.invalid") {
  TempDir tmp;
  struct Case {
    const char* why;
    std::string name, yaml;
    std::vector<std::string> parts;  ///< "@" stands for the file's path
  };
  const std::vector<Case> cases = {
      {"a wrong type, at its line and column", "type.yaml",
       "name: bad\nnetwork:\n  state: 4\n  trunk: [8]\nbatch: lots\nheads:\n  - {plugin: c51, role: primary}\n",
       {"@:5:8: key 'batch' = 'lots'", "expected an integer", "@: 1 error"}},
      {"an unknown key, with a suggestion", "typo.yaml",
       "name: typo\nnetwrok:\n  state: 4\nheads:\n  - {plugin: c51, role: primary}\n",
       {"@:2:1: key 'netwrok'", "did you mean 'network'?"}},
      {"a missing plugin, with the search path", "missing.yaml",
       "name: missing\nheads:\n  - {plugin: c51, role: primary}\n  - {plugin: nosuch_head, role: auxiliary, budget: 0.2}\n",
       {"@:4:14: key 'heads[1].plugin' = 'nosuch_head'", "plugin 'nosuch_head' not found", "search path: " + plugin_dir()}},
      {"two errors, both reported", "two.yaml",
       "name: two\nbatch: -4\ngamma: 7\nheads:\n  - {plugin: c51, role: primary}\n",
       {"@:2:8: key 'batch'", "@:3:8: key 'gamma'", "@: 2 errors"}},
  };
  for (const Case& c : cases) {
    INFO(std::string(c.why));
    const std::string path = tmp.file(c.name, c.yaml);
    const Run r = dqn_run("validate " + quote(path));
    INFO(r.out);
    CHECK(r.rc != 0);
    for (std::string part : c.parts) {
      for (auto at = part.find('@'); at != std::string::npos; at = part.find('@')) part.replace(at, 1, path);
      CHECK_MESSAGE(has(r.out, part), part);
    }
  }
  // A good file next to a bad one: the bad one still fails the run, the good one is still checked.
  const Run mixed = dqn_run("validate " + quote(c51_yaml()) + " " + quote(tmp.path("typo.yaml")));
  CHECK(mixed.rc != 0);
  CHECK(has(mixed.out, c51_yaml() + ": ok"));
  // Overrides after the files, as for every other command (and --set); --print shows the result.
  const Run over = dqn_run("validate " + quote(c51_yaml()) + " batch=lots");
  CHECK(over.rc != 0);
  CHECK(has(over.out, "<override 'batch=lots'>: key 'batch' = 'lots'"));
  const Run printed = dqn_run("validate " + quote(c51_yaml()) + " batch=48 --set gamma=0.5 --print");
  INFO(printed.out);
  CHECK(printed.rc == 0);
  CHECK(has(printed.out, "\nbatch: 48\n"));
  CHECK(has(printed.out, "\ngamma: 0.5\n"));
  CHECK(has(printed.out, c51_yaml() + ": ok"));
  CHECK(dqn_run("validate batch=48").rc == 2);  // no file
  // target: polyak or period; on the command line setting one clears the other.
  const Run period = dqn_run("validate " + quote(c51_yaml()) + " target.period=500 --print");
  INFO(period.out);
  CHECK(period.rc == 0);
  CHECK(has(period.out, "\ntarget:\n  period: 500\n"));
  const Run back = dqn_run("validate " + quote(c51_yaml()) + " target.period=500 target.polyak=0.2 --print");
  CHECK(has(back.out, "\ntarget:\n  polyak: 0.2\n"));
  const Run both = dqn_run("validate " + quote(tmp.file("both.yaml", "name: both\ntarget: {polyak: 0.1, period: 9}\n"
                                                                      "heads:\n  - {plugin: c51, role: primary}\n")));
  CHECK(both.rc != 0);
  CHECK(has(both.out, "key 'target.period' = '9': give either 'polyak' (soft update every step) or 'period' (hard copy), not both"));
  CHECK(has(both.out, "hint: on the command line, setting one clears the other"));
  // A file that is not there.
  const Run gone = dqn_run("validate " + quote(tmp.path("gone.yaml")));
  CHECK(gone.rc != 0);
  CHECK(has(gone.out, tmp.path("gone.yaml") + ": cannot read the pipeline file"));
  // step refuses a pipeline naming a missing plugin the same way, before doing anything.
  const Run step = dqn_run("step " + quote(tmp.path("missing.yaml")) + " --backend cpu --random-batch 1 --out " +
                           quote(tmp.path("never.safetensors")));
  CHECK(step.rc != 0);
  CHECK(has(step.out, "search path: " + plugin_dir()));
  CHECK_FALSE(fs::exists(tmp.path("never.safetensors")));
}

TEST_CASE("cli.step.dump_has_the_spec_names") {
  TempDir tmp;
  for (bool sn : {false, true}) {
    INFO("spectral norm " << sn);
    const std::string out = tmp.path(sn ? "sn.safetensors" : "o.safetensors");
    const Run r = dqn_run("step " + quote(c51_yaml()) + " " + kSmall + (sn ? " spectral_norm.enabled=true" : "") +
                          " --random-batch 1 --steps 3 --out " + quote(out));
    INFO(r.out);
    REQUIRE(r.rc == 0);
    CHECK(has(r.out, "3 steps on cpu"));
    REQUIRE(fs::exists(out));
    REQUIRE(fs::exists(out + ".pipeline.yaml"));
    const dqn::st::File f = dqn::st::read_file(out);
    check_names_and_shapes(f, sn, true);
    CHECK(f.get_scalar_i64("adam.step") == 3);
    CHECK(f.get("adam.step").dtype == dqn::st::DType::I64);
    CHECK(f.get_scalar_i64("skipped_steps") == 0);
    CHECK(f.get("trunk.0.weight").dtype == dqn::st::DType::F32);
    const float loss = f.get_scalar_f32("loss.c51");
    CHECK(std::isfinite(loss));
    CHECK(loss > 0);
    CHECK(f.get_scalar_f32("loss.total") == loss);  // one head
    CHECK(f.get_scalar_f32("grad_norm.c51") > 0);
    CHECK(f.get_scalar_f32("clip.c51") > 0);
    CHECK(f.get_scalar_f32("clip.c51") <= 1);
    // td_error(b) = L_c51(b), per sample.
    const auto td = f.get_f32("td_error", {16});
    for (float x : td) CHECK(std::isfinite(x));
    CHECK(std::any_of(td.begin(), td.end(), [](float x) { return x > 0; }));
    // Three steps moved the online weights and, by Polyak, the target a little.
    CHECK(f.get("trunk.0.weight").bytes != f.get("target.trunk.0.weight").bytes);
    const auto m = f.get_f32("adam.m.trunk.0.weight");
    CHECK(std::any_of(m.begin(), m.end(), [](float x) { return x != 0; }));
    if (sn) {
      const auto u = f.get_f32("sn.u.trunk.0.weight", {32});
      double norm = 0;
      for (float x : u) norm += double(x) * x;
      CHECK(norm == doctest::Approx(1.0).epsilon(1e-3));  // a unit power-iteration vector
    }
    // The saved pipeline is the resolved one: it validates, and re-running it reproduces the dump.
    const std::string saved = read_text(out + ".pipeline.yaml");
    CHECK(has(saved, "trunk: [32, 32]"));
    CHECK(has(saved, "batch: 16"));
    CHECK(has(saved, "backend: cpu"));
    CHECK(dqn_run("validate " + quote(out + ".pipeline.yaml")).rc == 0);
    const std::string again = tmp.path("again.safetensors");
    const Run r2 = dqn_run("step " + quote(out + ".pipeline.yaml") + " --random-batch 1 --steps 3 --out " + quote(again));
    INFO(r2.out);
    REQUIRE(r2.rc == 0);
    check_identical(f, dqn::st::read_file(again));
  }
}

TEST_CASE("cli.step.init_weights_batch_round_trip") {
  TempDir tmp;
  const std::string w = tmp.path("w.safetensors"), b = tmp.path("b.safetensors");
  const std::string o1 = tmp.path("o1.safetensors"), o2 = tmp.path("o2.safetensors");
  const std::string base = "step " + quote(c51_yaml()) + " " + kSmall + " spectral_norm.enabled=true";
  // 1: seeded init, a random batch saved, two steps.
  const Run r1 = dqn_run(base + " --random-batch 5 --save-batch " + quote(b) + " --steps 2 --out " + quote(o1));
  INFO(r1.out);
  REQUIRE(r1.rc == 0);
  // 2: the same seeded init, written out (no steps without a batch or --out).
  const Run r2 = dqn_run(base + " --init " + quote(w));
  INFO(r2.out);
  REQUIRE(r2.rc == 0);
  CHECK(has(r2.out, "wrote initial weights to " + w));
  const dqn::st::File init = dqn::st::read_file(w);
  check_names_and_shapes(init, true, false);
  CHECK(init.get_scalar_i64("adam.step") == 0);
  for (const auto& n : init.names()) {
    if (n.rfind("trunk.", 0) != 0 && n.rfind("c51.", 0) != 0) continue;
    INFO(n);
    CHECK(init.get("target." + n).bytes == init.get(n).bytes);  // target = online
    const auto mo = init.get_f32("adam.m." + n), vo = init.get_f32("adam.v." + n);
    CHECK(std::all_of(mo.begin(), mo.end(), [](float x) { return x == 0; }));
    CHECK(std::all_of(vo.begin(), vo.end(), [](float x) { return x == 0; }));
  }
  // The batch file has docs/step-math.md's tensors.
  const dqn::st::File batch = dqn::st::read_file(b);
  CHECK(batch.names() == std::vector<std::string>{"actions", "dones", "is_weights", "next_states", "rewards", "states"});
  CHECK(batch.get("actions").dtype == dqn::st::DType::I32);
  CHECK(dqn::st::shape_str(batch.get("states").shape) == "[16,64]");
  // 3: those weights and that batch: the same dump, bit for bit (the CPU step is deterministic).
  const Run r3 = dqn_run(base + " --weights " + quote(w) + " --batch " + quote(b) + " --steps 2 --out " + quote(o2));
  INFO(r3.out);
  REQUIRE(r3.rc == 0);
  const dqn::st::File d1 = dqn::st::read_file(o1), d2 = dqn::st::read_file(o2);
  check_identical(d1, d2);
  CHECK(d2.get_scalar_i64("adam.step") == 2);
  // Seeded init is a function of the seed.
  const std::string w2 = tmp.path("w2.safetensors"), w3 = tmp.path("w3.safetensors");
  REQUIRE(dqn_run(base + " --init " + quote(w2)).rc == 0);
  REQUIRE(dqn_run(base + " seed=2 --init " + quote(w3)).rc == 0);
  check_identical(init, dqn::st::read_file(w2));
  CHECK(dqn::st::read_file(w3).get("trunk.0.weight").bytes != init.get("trunk.0.weight").bytes);
  // --batch and --random-batch together are refused.
  const Run both = dqn_run(base + " --batch " + quote(b) + " --random-batch 1");
  CHECK(both.rc != 0);
  CHECK(has(both.out, "give --batch or --random-batch, not both"));
}

TEST_CASE("cli.step.bad_weights_files") {
  TempDir tmp;
  const std::string base = "step " + quote(c51_yaml()) + " " + kSmall;
  const std::string w = tmp.path("w.safetensors");
  REQUIRE(dqn_run(base + " --init " + quote(w)).rc == 0);
  const std::string image = read_text(w);
  REQUIRE(image.size() > 10000);
  struct Case {
    const char* why;
    std::string name, contents, args;
    std::vector<std::string> parts;  ///< "@" stands for the file's path
  };
  const std::vector<Case> cases = {
      {"truncated inside the header", "head.safetensors", image.substr(0, 3000), "",
       {"safetensors file '@'", "larger than the file", "truncated"}},
      {"truncated inside the data", "data.safetensors", image.substr(0, image.size() - 100), "",
       {"safetensors file '@'", "truncated"}},
      {"shorter than the length prefix", "tiny.safetensors", "abc", "", {"safetensors file '@'"}},
      {"weights of another network", "other.safetensors", image, " network.trunk=[16]",
       {"@", "'trunk.0.weight'", "[32,64]", "expected [16,64]"}},
  };
  for (const Case& c : cases) {
    INFO(std::string(c.why));
    const std::string path = tmp.file(c.name, c.contents);
    const std::string out = tmp.path("never.safetensors");
    const Run r = dqn_run(base + c.args + " --weights " + quote(path) + " --random-batch 1 --out " + quote(out));
    INFO(r.out);
    CHECK(r.rc != 0);
    CHECK(has(r.out, "error"));
    for (std::string part : c.parts) {
      for (auto at = part.find('@'); at != std::string::npos; at = part.find('@')) part.replace(at, 1, path);
      CHECK_MESSAGE(has(r.out, part), part);
    }
    CHECK_FALSE(fs::exists(out));
  }
  // Values that cannot be trained from: the tensor and the first bad element named.
  auto edited = [&](const std::string& name, const std::function<void(dqn::st::File&)>& edit) {
    dqn::st::File f = dqn::st::read_file(w);
    edit(f);
    const std::string path = tmp.path(name);
    dqn::st::write_file(path, f);
    return path;
  };
  auto set = [](dqn::st::File& f, const std::string& t, std::size_t i, float v) {
    std::memcpy(f.tensors.at(t).bytes.data() + i * 4, &v, 4);
  };
  const std::vector<std::pair<std::string, std::string>> bad_values = {
      {edited("nan.safetensors", [&](dqn::st::File& f) { set(f, "c51.value.0.weight", 17, std::nanf("")); }),
       "tensor 'c51.value.0.weight': element 17 is nan (must be finite)"},
      {edited("inf_target.safetensors",
              [&](dqn::st::File& f) { set(f, "target.trunk.1.bias", 3, std::numeric_limits<float>::infinity()); }),
       "tensor 'target.trunk.1.bias': element 3 is inf (must be finite)"},
      {edited("negative_v.safetensors", [&](dqn::st::File& f) { set(f, "adam.v.trunk.0.weight", 5, -1.0f); }),
       "tensor 'adam.v.trunk.0.weight': element 5 is -1.000000 (must be finite and >= 0)"},
      {edited("huge_step.safetensors",
              [&](dqn::st::File& f) {
                const std::int64_t t = std::numeric_limits<std::int64_t>::max() - 1;
                f.put_i64("adam.step", {}, &t);
              }),
       "adam.step is 9223372036854775806, beyond 2^53 steps"},
  };
  for (const auto& [path, says] : bad_values) {
    INFO(path);
    const Run r = dqn_run(base + " --weights " + quote(path) + " --random-batch 1");
    CHECK(r.rc != 0);
    CHECK_MESSAGE(has(r.out, says), r.out);
  }
  // A missing weights file names itself too.
  const Run gone = dqn_run(base + " --weights " + quote(tmp.path("gone.safetensors")) + " --random-batch 1");
  CHECK(gone.rc != 0);
  CHECK(has(gone.out, tmp.path("gone.safetensors")));
}

TEST_CASE("cli.step.explain") {
  const Run r = dqn_run("step " + quote(c51_yaml()) + " " + kSmall + " --explain");
  INFO(r.out);
  REQUIRE(r.rc == 0);
  const auto begin = r.out.find("stages in order");
  REQUIRE(begin != std::string::npos);
  std::vector<std::string> order;
  std::istringstream in(r.out.substr(begin));
  std::string line;
  std::getline(in, line);
  while (std::getline(in, line) && line.rfind("  ", 0) == 0) {
    if (has(line, "reads:") || has(line, "writes:") || has(line, "waits:")) continue;
    const auto dot = line.find(". ");
    REQUIRE(dot != std::string::npos);
    CHECK(std::stoi(line.substr(0, dot)) == int(order.size()) + 1);  // numbered from 1
    const std::string rest = line.substr(dot + 2);
    order.push_back(rest.substr(0, rest.find(' ')));
  }
  // The online and the target chains are independent until the loss (they run side by side on
  // the GPU); from the loss on, the output layers' gradients, the input side with the trunk's
  // layers and the weight gradients of each form branches that meet at the update.
  const std::vector<std::pair<std::string, std::string>> before = {
      {"trunk.forward.0", "trunk.forward.1"}, {"trunk.forward.1", "c51.forward"},
      {"target.trunk.forward", "c51.target"}, {"c51.forward", "c51.loss"},
      {"c51.target", "c51.loss"}, {"c51.loss", "c51.weights.out"}, {"c51.loss", "c51.backward"},
      {"c51.backward", "c51.weights"}, {"c51.backward", "trunk.backward.1"},
      {"trunk.backward.1", "trunk.weights.1"}, {"trunk.backward.1", "trunk.weights.0"},
      {"trunk.backward.1", "trunk.bias.1"}, {"trunk.backward.1", "trunk.bias.0"},
      {"c51.loss", "c51.loss.mean"}, {"c51.loss.mean", "update"},
      {"c51.weights.out", "update"}, {"c51.weights", "update"},
      {"trunk.weights.1", "update"}, {"trunk.weights.0", "update"}, {"trunk.bias.1", "update"},
      {"trunk.bias.0", "update"}};
  auto pos = [&](const std::string& n) {
    const auto it = std::find(order.begin(), order.end(), n);
    CHECK_MESSAGE(it != order.end(), n);
    return it - order.begin();
  };
  CHECK(order.size() == 16);
  // the first layer's gradient arrives masked from the layer above's GEMM: no stage of its own
  CHECK(std::find(order.begin(), order.end(), "trunk.backward.0") == order.end());
  for (const auto& [a, b] : before) CHECK_MESSAGE(pos(a) < pos(b), a << " before " << b);
  CHECK(has(r.out, "stages in order (16):"));
  // Each stage names what it waits for when stages run side by side: the loss both chains.
  CHECK(has(r.out, "c51.loss  <c51>"));
  CHECK(has(r.out, "       waits:  c51.forward, c51.target\n"));
  // the two trunk forwards wait for nothing: the step's two roots
  CHECK(has(r.out, "trunk.forward.0  <engine>\n       reads:  batch/states2, params\n"));
  CHECK(has(r.out, "target.trunk.forward  <engine>\n       reads:  batch/states2, target\n"));
  CHECK(has(r.out, "       waits:  -\n"));
  CHECK(has(r.out, "registry:\narena: "));
  CHECK(has(r.out, "c51.loss  <c51>"));
  // With spectral norm the update stage reads the matrix table and writes every power-iteration
  // vector (budgets, Adam, spectral norm and the target update are one op).
  const Run sn = dqn_run("step " + quote(c51_yaml()) + " " + kSmall + " spectral_norm.enabled=true --explain");
  REQUIRE(sn.rc == 0);
  CHECK(has(sn.out, "  16. update  <engine>"));
  CHECK(has(sn.out, "sn.u.trunk.0.weight"));
  CHECK(has(sn.out, "sn/table"));
  // The loss's batch mean a stage of its own after the loss, declared last, which only the update
  // waits for
  CHECK(has(r.out, "c51.loss.mean  <c51>\n       reads:  report/td_error, batch/is_weights\n"));
  {
    std::istringstream lines(r.out);
    int waiting = 0;
    for (std::string l; std::getline(lines, l);)
      if (l.rfind("       waits:", 0) == 0 && has(l, "c51.loss.mean")) ++waiting;
    CHECK(waiting == 1);
  }
}

TEST_CASE("cli.bench: the CPU reference timed per configuration, a JSON object or a table row each; bad input refused") {
  const std::string small = quote(c51_yaml()) + " --backend cpu network.trunk=[32,32] --warmup 1 --iters 2 --repeats 3";
  // --profile-range is accepted everywhere (the CPU has no profiler: nothing happens)
  const Run r = dqn_run("bench " + small + " --batch 8,12 --precision fp32,tf32 --json --profile-range");
  INFO(r.out);
  REQUIRE(r.rc == 0);
  std::vector<nlohmann::json> rows;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line[0] == '{') rows.push_back(nlohmann::json::parse(line));
  REQUIRE(rows.size() == 4);  // precisions outer, batches inner
  const std::vector<std::pair<std::string, int>> want = {{"fp32", 8}, {"fp32", 12}, {"tf32", 8}, {"tf32", 12}};
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& j = rows[i];
    CAPTURE(j.dump());
    CHECK(j["impl"] == "dqn");
    CHECK(j["pipeline"] == "c51");
    CHECK(j["backend"] == "cpu");
    CHECK(j["precision"] == want[i].first);
    CHECK(j["batch"] == want[i].second);
    CHECK(j["heads"] == nlohmann::json::array({"c51"}));
    CHECK(j["warmup"] == 1);
    CHECK(j["iters"] == 2);
    CHECK(j["repeats"] == 3);
    const double med = j["us_per_step_median"], mn = j["us_min"], mx = j["us_max"];
    CHECK(mn > 0.0);
    CHECK(mn <= med);
    CHECK(med <= mx);
    CHECK(j["steps_per_s"].get<double>() == doctest::Approx(1e6 / med));
    CHECK(j["host_us_per_step"].get<double>() > 0.0);
    CHECK(j["arena_bytes"].get<std::int64_t>() > 0);
    CHECK(j["graph_nodes"] == 0);  // nothing captured on the CPU
    CHECK(j["captures"] == 0);
    CHECK(j["skipped_steps"] == 0);
    const double loss = j["loss_total"];
    CHECK(std::isfinite(loss));
    CHECK(loss > 0.0);
  }
  // a larger batch needs a larger arena
  CHECK(rows[1]["arena_bytes"].get<std::int64_t>() > rows[0]["arena_bytes"].get<std::int64_t>());
  // the table: a header, then a row per configuration
  const Run t = dqn_run("bench " + small + " --batch 8");
  INFO(t.out);
  REQUIRE(t.rc == 0);
  CHECK(has(t.out, "pipeline   prec    batch ranks    device_us"));
  CHECK(has(t.out, "\nc51        tf32        8 "));
  // the table says when the times are the CPU reference's (the JSON rows carry "backend")
  CHECK(has(t.out, "note: timed on the CPU reference backend"));
  CHECK_FALSE(has(r.out, "note: timed on the CPU"));
  // refused, with where and why: a batch below 1, an unknown precision, no timed replays
  const Run b0 = dqn_run("bench " + small + " --batch 0");
  CHECK(b0.rc != 0);
  CHECK(has(b0.out, "key 'batch' = '0': must be >= 1"));
  CHECK_FALSE(has(b0.out, "device_us"));  // no table header before the error
  const Run p = dqn_run("bench " + small + " --precision fp64");
  CHECK(p.rc != 0);
  CHECK(has(p.out, "key 'precision' = 'fp64': expected one of fp32, tf32, bf16"));
  const Run it = dqn_run("bench " + quote(c51_yaml()) + " --iters 0");
  CHECK(it.rc != 0);
  CHECK(has(it.out, "--iters: Value 0 not in range"));
}

TEST_CASE("cli.step.dump_has_aux_head_draws_and_metrics") {
  // docs/step-math.md, "Step dump": with IQN, the fractions drawn in every step; with the ensemble, its
  // disagreement.
  TempDir tmp;
  const std::string out = tmp.path("full.safetensors");
  // ref.yaml with every auxiliary head enabled (N = N' = 32), shrunk
  const Run r = dqn_run("step " + quote(source_dir() + "/pipelines/ref.yaml") +
                        " --backend cpu heads.1.enabled=true heads.2.enabled=true heads.3.enabled=true"
                        " network.trunk=[16,16] network.head_hidden=8 batch=8 --random-batch 2 --steps 3 --out " +
                        quote(out));
  REQUIRE_MESSAGE(r.rc == 0, r.out);
  const dqn::st::File f = dqn::st::read_file(out);
  for (const char* t : {"iqn.tau", "iqn.tau_target"}) {
    INFO(t);
    REQUIRE(f.has(t));
    CHECK(f.get(t).shape == std::vector<std::int64_t>{3, 8, 32});
    const auto v = f.get_f32(t);
    for (float x : v) CHECK((x > 0.0f && x < 1.0f));
    // Fresh numbers every step.
    CHECK(std::vector<float>(v.begin(), v.begin() + 256) != std::vector<float>(v.begin() + 256, v.begin() + 512));
  }
  REQUIRE(f.has("ensemble.disagreement"));
  CHECK(f.get("ensemble.disagreement").shape == std::vector<std::int64_t>{8});
  for (const char* h : {"c51", "iqn", "ensemble", "cql"}) {
    INFO(h);
    CHECK(f.has(std::string("loss.") + h));
    CHECK(f.has(std::string("grad_norm.") + h));
    CHECK(f.has(std::string("clip.") + h));
  }
}

TEST_CASE("cli.step.devices: ranks split the global batch; the dump is one step on all of it") {
  // two CPU ranks of batch 8 against one of batch 16, on the same 16 rows (all four heads, shrunk)
  TempDir tmp;
  const std::string base = "step " + quote(source_dir() + "/pipelines/ref.yaml") +
                           " --backend cpu heads.1.enabled=true heads.2.enabled=true heads.3.enabled=true"
                           " network.trunk=[16,16] network.head_hidden=8 --random-batch 2 --steps 2 ";
  const std::string two = tmp.path("two.safetensors"), one = tmp.path("one.safetensors");
  const Run r2 = dqn_run(base + "batch=8 devices=[0,1] --out " + quote(two));
  REQUIRE_MESSAGE(r2.rc == 0, r2.out);
  CHECK(has(r2.out, "2 ranks of batch 8 (host)"));
  const Run r1 = dqn_run(base + "batch=16 --out " + quote(one));
  REQUIRE_MESSAGE(r1.rc == 0, r1.out);
  const dqn::st::File f2 = dqn::st::read_file(two), f1 = dqn::st::read_file(one);
  CHECK(f2.get("td_error").shape == std::vector<std::int64_t>{16});
  CHECK(f2.get("ensemble.disagreement").shape == std::vector<std::int64_t>{16});
  CHECK(f2.get("iqn.tau").shape == std::vector<std::int64_t>{2, 16, 32});
  // C51, the ensemble and CQL draw nothing: their losses and the rows' td_error match one rank on
  // all rows (IQN's fractions are drawn per rank's rows, so its loss differs)
  for (const char* t : {"loss.c51", "loss.ensemble", "loss.cql", "td_error"}) {
    INFO(t);
    const auto a = f2.get_f32(t), b = f1.get_f32(t);
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i] == doctest::Approx(b[i]).epsilon(1e-4));
  }
  // a batch file must hold every rank's rows
  const std::string bf = tmp.path("b.safetensors");
  REQUIRE(dqn_run(base + "batch=8 --save-batch " + quote(bf)).rc == 0);
  const Run short_file = dqn_run("step " + quote(source_dir() + "/pipelines/c51.yaml") +
                                 " --backend cpu network.trunk=[16,16] batch=8 devices=[0,1] --batch " + quote(bf));
  CHECK(short_file.rc != 0);
  CHECK(has(short_file.out, ": 8 rows; 2 devices of batch 8 step on 16"));
  // the epoch benchmark: every rank fills and draws from a replay of its own
  const Run ep = dqn_run("bench --epoch " + quote(source_dir() + "/pipelines/c51.yaml") +
                         " --backend cpu network.trunk=[16,16] batch=8 devices=[0,1] --replay uniform --replay-size 64"
                         " --epoch-steps 2 --repeats 1 --warmup 0 --json");
  REQUIRE_MESSAGE(ep.rc == 0, ep.out);
  CHECK(has(ep.out, "\"ranks\":2"));
  CHECK(has(ep.out, "\"replay\":\"uniform\",\"replay_size\":64"));
  // training over two CPU ranks: one run directory, and a policy dqn collect acts with (on one)
  const std::string run = tmp.path("run");
  const Run t = dqn_run("train " + quote(source_dir() + "/pipelines/default.yaml") +
                        " --backend cpu -q --steps 304 --set devices=[0,1] --out " + quote(run));
  REQUIRE_MESSAGE(t.rc == 0, t.out);
  CHECK(has(t.out, "304 env steps on each of 2 ranks (608 in all)"));
  CHECK(has(read_text(run + "/metrics.jsonl"), "\"ranks\":2,\"env_steps_all_ranks\":608"));
  const Run c = dqn_run("collect " + quote(run) + " --backend cpu --steps 40 --out " + quote(tmp.path("d.safetensors")));
  CHECK_MESSAGE(c.rc == 0, c.out);
  // stopped (SIGINT), a run over several devices leaves a checkpoint of every rank's state and
  // resumes from it to its end
  const std::string run2 = tmp.path("run2");
  const Run stopped = dqn_run("train " + quote(source_dir() + "/pipelines/default.yaml") +
                                  " --backend cpu -q --steps 5000 --set devices=[0,1] --out " + quote(run2),
                              "timeout --preserve-status -s INT 3");
  REQUIRE_MESSAGE(stopped.rc == 130, stopped.out);
  CHECK_MESSAGE(has(stopped.out, "continue with: dqn train --resume"), stopped.out);
  const Run resumed = dqn_run("train -q --resume " + quote(run2));
  REQUIRE_MESSAGE(resumed.rc == 0, resumed.out);
  CHECK(has(resumed.out, "5000 env steps on each of 2 ranks (10000 in all)"));
  CHECK(has(read_text(run2 + "/metrics.jsonl"), "\"ranks\":2,\"env_steps_all_ranks\":10000"));
}

TEST_CASE("cli.collect_and_offline: datasets written whole, never over a file, and bad ones refused before a run") {
  TempDir t;
  // A policy to collect with: a short run (no training yet; its weights are the initial ones).
  Run r = dqn_run("train " + quote(source_dir() + "/pipelines/default.yaml") + " --backend cpu -q --steps 200 --out " +
                  quote(t.path("run")));
  REQUIRE_MESSAGE(r.rc == 0, r.out);
  const std::string data = t.path("data.safetensors");
  r = dqn_run("collect " + quote(t.path("run")) + " --backend cpu --steps 400 --epsilon 0.2 --out " + quote(data));
  REQUIRE_MESSAGE(r.rc == 0, r.out);
  CHECK(has(r.out, "400 steps in"));
  CHECK(has(r.out, "behaviour policy's mean return"));
  const dqn::st::File f = dqn::st::read_file(data);
  CHECK(f.get("states").shape == std::vector<std::int64_t>{400, 4});
  CHECK(f.get("actions").shape == std::vector<std::int64_t>{400, 1});
  CHECK(f.metadata.count("behaviour_return") == 1);
  // An existing file is not replaced without --force (and is left as it was).
  const auto before = fs::file_size(data);
  r = dqn_run("collect " + quote(t.path("run")) + " --backend cpu --steps 80 --out " + quote(data));
  CHECK(r.rc == 1);
  CHECK(has(r.out, "exists; nothing was written (--force replaces it)"));
  CHECK(fs::file_size(data) == before);
  r = dqn_run("collect " + quote(t.path("run")) + " --backend cpu --steps 80 --force --out " + quote(data));
  CHECK(r.rc == 0);
  CHECK(dqn::st::read_file(data).get("states").shape == std::vector<std::int64_t>{80, 4});
  // Interrupted (SIGINT, as Ctrl-C), it writes nothing: the file there stays as it was.
  const auto kept = fs::file_size(data);
  r = dqn_run("collect " + quote(t.path("run")) + " --backend cpu --steps 1000000000000 --force --out " + quote(data),
              "timeout --preserve-status -s INT 2");
  CHECK(r.rc == 130);
  CHECK_MESSAGE(has(r.out, "stopped by a signal after"), r.out);
  CHECK(has(r.out, "nothing was written"));
  CHECK(fs::file_size(data) == kept);
  CHECK(dqn::st::read_file(data).get("states").shape == std::vector<std::int64_t>{80, 4});
  // No episode ended (one step of each of the 8 copies): no return yet, and none recorded.
  const std::string early = t.path("early.safetensors");
  r = dqn_run("collect " + quote(t.path("run")) + " --backend cpu --steps 8 --out " + quote(early));
  INFO(r.out);
  REQUIRE(r.rc == 0);
  CHECK(has(r.out, "8 steps in 8 episodes (0 complete), behaviour policy's mean return none yet (no episode ended)"));
  CHECK(dqn::st::read_file(early).metadata.count("behaviour_return") == 0);
  r = dqn_run("train " + quote(source_dir() + "/pipelines/offline.yaml") + " --backend cpu --steps 4 "
              "--set training.eval.every=never --set training.learning_starts=0 --set batch=4 --set training.dataset=" +
              quote(early) + " --out " + quote(t.path("early_run")));
  CHECK_MESSAGE(has(r.out, "behaviour policy's mean return none (no episode of it ended)"), r.out);
  // A weights file needs its pipeline.
  r = dqn_run("collect " + quote(t.path("run") + "/weights.safetensors") + " --out " + quote(t.path("x.safetensors")));
  CHECK(r.rc == 2);
  CHECK(has(r.out, "name its pipeline with --pipeline"));

  // Offline training from it works; a bad dataset stops before any run directory exists.
  const std::string offline = quote(source_dir() + "/pipelines/offline.yaml");
  r = dqn_run("train " + offline + " --backend cpu -q --steps 40 --set training.eval.every=20 --set training.eval.episodes=2 "
              "--set training.dataset=" + quote(data) + " --out " + quote(t.path("off")));
  REQUIRE_MESSAGE(r.rc == 0, r.out);
  CHECK(has(r.out, "0 env steps, 40 training steps"));
  CHECK(fs::exists(t.path("off") + "/best.safetensors"));
  // over two ranks: each holds the whole dataset and trains on batches of its own
  r = dqn_run("train " + offline + " --backend cpu --steps 40 --set training.eval.every=20 --set training.eval.episodes=2 "
              "--set devices=[0,1] --set training.dataset=" + quote(data) + " --out " + quote(t.path("off2")));
  REQUIRE_MESSAGE(r.rc == 0, r.out);
  CHECK(has(r.out, "2 ranks (host), offline from"));
  CHECK(has(r.out, "the whole of it in each rank's replay"));
  CHECK(has(r.out, "0 env steps, 40 training steps on each of 2 ranks"));
  dqn::st::File bad = dqn::st::read_file(data);
  const float nan = std::nanf("");
  std::memcpy(bad.tensors.at("rewards").bytes.data() + 7 * 4, &nan, 4);
  dqn::st::write_file(t.path("bad.safetensors"), bad);
  r = dqn_run("train " + offline + " --backend cpu -q --set training.dataset=" + quote(t.path("bad.safetensors")) +
              " --out " + quote(t.path("bad_run")));
  CHECK(r.rc == 1);
  CHECK_MESSAGE(has(r.out, "tensor 'rewards': element [7] is nan"), r.out);
  CHECK_FALSE(fs::exists(t.path("bad_run")));
  r = dqn_run("train " + offline + " --backend cpu -q --set training.dataset=" + quote(t.path("none.safetensors")) +
              " --out " + quote(t.path("bad_run")));
  CHECK(r.rc == 1);
  CHECK(has(r.out, "none.safetensors"));
  CHECK_FALSE(fs::exists(t.path("bad_run")));
}

TEST_CASE("cli.train: --out naming a directory that holds anything is refused and left as it was") {
  TempDir t;
  const std::string run = t.path("run");
  fs::create_directories(run);
  const std::string metrics = t.file("run/metrics.jsonl", "{\"step\": 1}\n");
  t.file("run/weights.safetensors", "not touched");
  const auto before = fs::last_write_time(metrics);
  const Run r = dqn_run("train " + quote(source_dir() + "/pipelines/default.yaml") + " --backend cpu -q --steps 100 --out " +
                        quote(run));
  CHECK(r.rc == 1);
  CHECK_MESSAGE(has(r.out, "is a directory that is not empty"), r.out);
  CHECK(has(r.out, "a run never writes over another"));
  CHECK_FALSE(has(r.out, "what was written so far"));
  CHECK(read_text(metrics) == "{\"step\": 1}\n");
  CHECK(fs::last_write_time(metrics) == before);
  CHECK(read_text(t.path("run/weights.safetensors")) == "not touched");
  CHECK_FALSE(fs::exists(t.path("run/pipeline.yaml")));
  // An empty directory is fine.
  fs::create_directories(t.path("empty"));
  CHECK(dqn_run("train " + quote(source_dir() + "/pipelines/default.yaml") + " --backend cpu -q --steps 100 --out " +
                quote(t.path("empty"))).rc == 0);
  CHECK(fs::exists(t.path("empty/metrics.jsonl")));
}

TEST_CASE("cli.export: a primary head whose plugin offers no export is refused by name, and nothing is written") {
  const std::string fixtures = env_or_fail("DQN_TEST_FIXTURES");
  TempDir tmp;
  const std::string run = tmp.path("run"), out = tmp.path("policy.onnx");
  const std::string p = tmp.file("plain.yaml",
                                 "name: plain\nbackend: cpu\nbatch: 16\n"
                                 "network: {state: 4, trunk: [8, 8], head_hidden: 4, branches: 1, actions: 2, atoms: 5}\n"
                                 "heads:\n  - {plugin: plain_primary, role: primary}\n"
                                 "training: {env: CartPole-v1, num_envs: 2, total_steps: 200, learning_starts: 50,"
                                 " eval: {every: 100, episodes: 2}}\n");
  const Run t = dqn_run("train " + quote(p) + " --out " + quote(run) + " -q --plugin-path " + quote(fixtures));
  INFO(t.out);
  REQUIRE(t.rc == 0);  // it trains and acts: the primary's contract holds
  for (const char* format : {"onnx", "safetensors"}) {
    const Run e = dqn_run("export " + quote(run) + " --format " + format + " --out " + quote(out) + " --plugin-path " +
                          quote(fixtures));
    INFO(e.out);
    CHECK(e.rc == 1);
    CHECK(has(e.out, "the primary head 'plain_primary' (plugin plain_primary) cannot be exported: its plugin offers no "
                     "export_policy"));
    CHECK_FALSE(fs::exists(out));
  }
}

TEST_CASE("cli.train.eval_off: training.eval.every 0 or never runs no evaluation; a stopping rule needing one is refused") {
  TempDir t;
  const std::string p = quote(source_dir() + "/pipelines/default.yaml");
  for (const char* off : {"0", "never"}) {
    INFO(off);
    const std::string run = t.path(std::string("run_") + off);
    const Run r = dqn_run("train " + p + " --backend cpu -q --steps 600 --out " + quote(run) +
                          " training.stop_at_return=0 training.eval.every=" + off);
    INFO(r.out);
    REQUIRE(r.rc == 0);
    CHECK(has(r.out, "no evaluation (training.eval.every is 0)"));
    CHECK_FALSE(fs::exists(run + "/best.safetensors"));
    CHECK(read_text(run + "/metrics.jsonl").find("eval_return") == std::string::npos);
    CHECK(read_text(run + "/pipeline.yaml").find("every: 0") != std::string::npos);
  }
  const Run refused = dqn_run("train " + p + " --backend cpu -q --steps 600 --out " + quote(t.path("refused")) +
                              " training.eval.every=never");
  INFO(refused.out);
  CHECK(refused.rc == 1);
  CHECK(has(refused.out, "key 'training.stop_at_return' = '475': stops the run on an evaluation, but "
                         "training.eval.every is 0 (never): there is none"));
  CHECK(has(refused.out, "hint: set training.stop_at_return=0"));
  CHECK_FALSE(fs::exists(t.path("refused")));
  const Run word = dqn_run("train " + p + " --backend cpu -q --out " + quote(t.path("w")) + " training.eval.every=nevr");
  CHECK(word.rc == 1);
  CHECK(has(word.out, "key 'training.eval.every' = 'nevr'"));
}

TEST_CASE("cli.csv: a run's metrics.jsonl as CSV, a column per key, never over a file unless asked") {
  TempDir t;
  const std::string run = t.path("run");
  REQUIRE(dqn_run("train " + quote(source_dir() + "/pipelines/default.yaml") + " --backend cpu -q --steps 2000 --out " +
                  quote(run) + " training.eval.every=1000 training.stop_at_return=0").rc == 0);
  const Run r = dqn_run("csv " + quote(run));
  INFO(r.out);
  REQUIRE(r.rc == 0);
  std::vector<std::string> lines;
  {
    std::istringstream in(read_text(run + "/metrics.csv"));
    for (std::string l; std::getline(in, l);) lines.push_back(l);
  }
  std::vector<nlohmann::json> rows;
  {
    std::istringstream in(read_text(run + "/metrics.jsonl"));
    for (std::string l; std::getline(in, l);) rows.push_back(nlohmann::json::parse(l));
  }
  REQUIRE(lines.size() == rows.size() + 1);
  auto split = [](const std::string& s) {
    std::vector<std::string> out(1);
    for (char c : s) {
      if (c == ',')
        out.emplace_back();
      else
        out.back().push_back(c);
    }
    return out;
  };
  const std::vector<std::string> header = split(lines[0]);
  CHECK(header.at(0) == "step");
  for (const char* k : {"train_steps", "episode_return", "loss.c51", "eval_return", "eval_seed", "wall_s", "final"})
    CHECK_MESSAGE(std::find(header.begin(), header.end(), k) != header.end(), k);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const std::vector<std::string> cells = split(lines[i + 1]);
    REQUIRE(cells.size() == header.size());
    for (std::size_t c = 0; c < header.size(); ++c) {
      const auto it = rows[i].find(header[c]);
      const std::string want = it == rows[i].end() || it->is_null() ? "" : it->dump();
      CHECK_MESSAGE(cells[c] == want, "row " << i << " column " << header[c]);
    }
  }
  const Run again = dqn_run("csv " + quote(run));
  CHECK(again.rc == 1);
  CHECK(has(again.out, "exists; nothing was written (--force replaces it)"));
  CHECK(dqn_run("csv " + quote(run) + " --force").rc == 0);
  const Run out = dqn_run("csv " + quote(run) + " --out -");
  CHECK(out.out.rfind(lines[0] + "\n", 0) == 0);
  const Run none = dqn_run("csv " + quote(t.path("nowhere")));
  CHECK(none.rc == 1);
  CHECK(has(none.out, "no such directory"));
}
