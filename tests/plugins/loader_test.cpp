// The plugin loader: the c51 plugin from the build tree, search-path precedence, every refusal
// (ABI, struct size, no symbol, unloadable file, failing create) with its message, directory
// listing that keeps going past bad files, library lifetime, and a third-party head (built
// against the SDK headers only, from tests/plugins/fixtures) composed with c51 in an Engine.
#include <doctest/doctest.h>
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <boost/dll/shared_library.hpp>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "dqn_config.h"
#include "core/engine_access.hpp"
#include "pipeline/parse.hpp"
#include "core/plugin_loader.hpp"

using namespace dqn;
namespace fs = std::filesystem;

namespace {

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::string env_or_fail(const char* name) {
  const char* v = std::getenv(name);
  REQUIRE_MESSAGE(v != nullptr, name << " is not set: run this test through `meson test`");
  return v;
}
std::string plugin_dir() { return env_or_fail("DQN_PLUGIN_PATH"); }
std::string fixtures_dir() { return env_or_fail("DQN_TEST_FIXTURES"); }
std::string fixture(const std::string& name) { return fixtures_dir() + "/libdqn_" + name + ".so"; }
std::string abi() { return std::to_string(kAbiMajor) + "." + std::to_string(kAbiMinor); }

/// Sets or unsets environment variables for one scope, restoring what was there.
class EnvGuard {
 public:
  void set(const std::string& name, const std::optional<std::string>& value) {
    if (std::find_if(saved_.begin(), saved_.end(), [&](auto& s) { return s.first == name; }) == saved_.end()) {
      const char* old = std::getenv(name.c_str());
      saved_.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
    }
    if (value) setenv(name.c_str(), value->c_str(), 1);
    else unsetenv(name.c_str());
  }
  ~EnvGuard() {
    for (auto& [n, v] : saved_) {
      if (v) setenv(n.c_str(), v->c_str(), 1);
      else unsetenv(n.c_str());
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

struct TempDir {
  fs::path dir;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "dqn-loader-XXXXXX").string();
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    dir = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  std::string file(const std::string& name, const std::string& contents) const {
    const fs::path p = dir / name;
    std::ofstream(p, std::ios::binary) << contents;
    return p.string();
  }
};

/// The message of the std::runtime_error `f` throws ("" and a failed check if none).
std::string thrown(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  FAIL_CHECK("did not throw");
  return "";
}

/// What the system's loader itself says about `path` (empty if it loads).
std::string dlopen_message(const std::string& path) {
  dlerror();
  if (void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) {
    dlclose(h);
    return "";
  }
  const char* m = dlerror();
  return m ? m : "";
}

/// Whether the library at `path` is currently loaded in this process (does not load it).
bool is_loaded(const std::string& path) {
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (!h) return false;
  dlclose(h);
  return true;
}

NetworkDims tiny_dims() {
  NetworkDims n{};
  n.state = 5;
  n.trunk_layers = 1;
  n.trunk[0] = 7;
  n.head_hidden = 6;
  n.branches = 2;
  n.actions = 3;
  n.atoms = 5;
  n.v_min = -2;
  n.v_max = 2;
  return n;
}

const char* kThirdPartyPipeline = R"(name: third_party
seed: 3
backend: cpu
precision: fp32
network: {state: 5, trunk: [7], head_hidden: 6, branches: 2, actions: 3, atoms: 5, v_min: -2, v_max: 2}
heads:
  - {plugin: c51, role: primary}
  - {plugin: h2_l2, role: auxiliary, weight: 0.5}
max_grad_norm: 10
optimizer:
  adam: {lr: 1.0e-2, betas: [0.9, 0.999], eps: 1.0e-8}
spectral_norm: {enabled: true, sigma_max: 2.0}
target: {polyak: 0.01}
batch: 4
gamma: 0.99
n_step: 1
report_every: 1
)";

}  // namespace

TEST_CASE("loader.c51_from_build_tree") {
  PluginLoader loader(PluginLoader::search_path_from(""));
  CHECK(loader.search_path() == plugin_dir());  // DQN_PLUGIN_DEFAULT_DIRS is blanked by the test env
  CHECK(loader.problems().empty());
  const PluginDescriptor* d = loader.find("c51");
  REQUIRE(d != nullptr);
  CHECK(d->abi_major == kAbiMajor);
  CHECK(d->abi_minor == kAbiMinor);
  CHECK(d->struct_size == sizeof(PluginDescriptor));
  CHECK(std::string(d->name) == "c51");
  CHECK(d->kind == PluginKind::head);
  CHECK(d->can_be_primary == 1);
  CHECK(d->default_budget == 0.0);
  CHECK(d->version != nullptr);
  CHECK(std::string(d->version).size() > 0);
  CHECK(d->description != nullptr);
  CHECK(has(d->description, "C51"));
  CHECK((d->create != nullptr));
  CHECK((d->destroy != nullptr));
  CHECK((d->schema_len == 0 || d->schema != nullptr));
  const auto names = loader.names();
  CHECK(std::find(names.begin(), names.end(), "c51") != names.end());
  const auto it = std::find_if(loader.plugins().begin(), loader.plugins().end(),
                               [](const LoadedPlugin& p) { return std::string(p.descriptor->name) == "c51"; });
  REQUIRE(it != loader.plugins().end());
  CHECK(it->path == plugin_dir() + "/libdqn_c51.so");
  REQUIRE(it->library);
  CHECK(it->library->is_loaded());
  CHECK(it->library->has("dqn_plugin_descriptor"));  // the literal name, not just kDescriptorSymbol
  // Nothing from the fixtures directory leaks onto the default path.
  CHECK(loader.find("h2_l2") == nullptr);
  const std::string text = describe_plugin(*it);
  CHECK(has(text, "c51 "));
  CHECK(has(text, "roles: primary, auxiliary"));
}

TEST_CASE("loader.default_dir: the build tree's plugins for an engine that runs from it") {
  CHECK(PluginLoader::default_dir() == std::string(DQN_BUILD_PLUGIN_DIR));
}

TEST_CASE("loader.search_path_precedence") {
  struct Case {
    const char* why;
    std::string cli;
    std::optional<std::string> env, defaults;
    std::vector<std::string> expect;  ///< "<default>" stands for PluginLoader::default_dir()
  };
  const std::vector<Case> cases = {
      {"command line, then DQN_PLUGIN_PATH, then the defaults", "/c1:/c2", "/e1:/e2", "/d1",
       {"/c1", "/c2", "/e1", "/e2", "/d1"}},
      {"no command line: the environment first", "", "/e", "/d1:/d2", {"/e", "/d1", "/d2"}},
      {"DQN_PLUGIN_PATH unset: the defaults only", "", std::nullopt, "/d", {"/d"}},
      {"blank defaults leave only what was given", "/c", "/e", "", {"/c", "/e"}},
      {"everything blank: an empty path", "", "", "", {}},
      {"repeats are dropped, first position kept", "/x:/y", "/y:/x:/z", "/z:/x", {"/x", "/y", "/z"}},
      {"empty components are skipped", "::/c::", ":/e:", "::", {"/c", "/e"}},
      {"defaults unset: the built-in plugins' directory (this test runs in the build tree: its plugins/)", "/c",
       std::nullopt, std::nullopt, {"/c", "<default>"}},
  };
  for (const Case& c : cases) {
    INFO(std::string(c.why));
    EnvGuard env;
    env.set("DQN_PLUGIN_PATH", c.env);
    env.set("DQN_PLUGIN_DEFAULT_DIRS", c.defaults);
    std::vector<std::string> expect;
    for (const auto& e : c.expect)
      expect.push_back(e == "<default>" ? PluginLoader::default_dir() : e);
    CHECK(PluginLoader::search_path_from(c.cli) == expect);
  }
  // The guard put the test environment back.
  CHECK(std::string(std::getenv("DQN_PLUGIN_PATH")) == plugin_dir());
  REQUIRE(std::getenv("DQN_PLUGIN_DEFAULT_DIRS") != nullptr);
  CHECK(std::string(std::getenv("DQN_PLUGIN_DEFAULT_DIRS")).empty());
  // And the first directory on the path wins when two hold a plugin of one name.
  TempDir tmp;
  fs::copy_file(plugin_dir() + "/libdqn_c51.so", tmp.dir / "libdqn_c51.so");
  PluginLoader loader({tmp.dir.string(), plugin_dir()});
  REQUIRE(loader.find("c51"));
  CHECK(loader.plugins().front().path == (tmp.dir / "libdqn_c51.so").string());
  REQUIRE(loader.problems().size() == 1);
  CHECK(has(loader.problems()[0], plugin_dir() + "/libdqn_c51.so"));
  CHECK(has(loader.problems()[0], "already loaded from " + (tmp.dir / "libdqn_c51.so").string()));
  CHECK(loader.search_path() == tmp.dir.string() + ":" + plugin_dir());
  CHECK(PluginLoader({}).search_path() == "(empty)");
}

TEST_CASE("loader.load_file_refusals") {
  TempDir tmp;
  const std::string missing = (tmp.dir / "libdqn_missing.so").string();
  const std::string garbage = tmp.file("libdqn_garbage.so", "this is not an ELF file\n");
  struct Case {
    const char* why;
    std::string path;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {"another major: both versions, the plugin and its path", fixture("wrong_abi"),
       {"plugin 'wrong_abi'", "(" + fixture("wrong_abi") + ")", "was built for ABI 99.0, engine is ABI " + abi(), "another major",
        "rebuild"}},
      {"a newer minor: both versions", fixture("newer_minor"),
       {"plugin 'newer_minor'", "was built for ABI " + std::to_string(kAbiMajor) + "." + std::to_string(kAbiMinor + 1),
        "newer than this engine's " + abi()}},
      {"a descriptor smaller than any of this major's", fixture("wrong_size"),
       {fixture("wrong_size"), "descriptor size " + std::to_string(kDescriptorSizeMinor0 - 8), "corrupt"}},
      {"an unresolved symbol: the path and the dynamic linker's message", fixture("unresolved"),
       {fixture("unresolved"), "cannot be loaded", "dqn_fixture_symbol_nobody_defines"}},
      {"a library without the descriptor symbol", fixture("not_a_plugin"),
       {fixture("not_a_plugin"), "no 'dqn_plugin_descriptor' symbol"}},
      {"a missing file: the path and the system's message", missing,
       {missing, "cannot be loaded", dlopen_message(missing)}},
      {"not a shared library: the path and the system's message", garbage,
       {garbage, "cannot be loaded", dlopen_message(garbage)}},
  };
  for (const Case& c : cases) {
    INFO(std::string(c.why));
    const std::string m = thrown([&] { (void)PluginLoader::load_file(c.path); });
    for (const auto& p : c.parts) {
      REQUIRE_FALSE(p.empty());
      CHECK_MESSAGE(has(m, p), "'" << p << "' not in: " << m);
    }
  }
  // The system messages really are the system's (so the checks above say something).
  CHECK(has(dlopen_message(missing), "No such file"));
  CHECK_FALSE(dlopen_message(garbage).empty());
  // And a good file loads, as does one built for an older minor of this major.
  const LoadedPlugin ok = PluginLoader::load_file(fixture("h2_l2"));
  CHECK(std::string(ok.descriptor->name) == "h2_l2");
  CHECK(ok.path == fixture("h2_l2"));
  const LoadedPlugin old = PluginLoader::load_file(fixture("old_minor"));
  CHECK(std::string(old.descriptor->name) == "old_minor");
  CHECK(old.descriptor->abi_major == kAbiMajor);
  CHECK(old.descriptor->abi_minor == 0u);
}

TEST_CASE("loader.listing_reports_bad_files_and_continues") {
  TempDir tmp;
  const std::string garbage = tmp.file("libdqn_garbage.so", "not a library");
  tmp.file("notes.txt", "ignored: not lib*.so");
  tmp.file("dqn_noprefix.so", "ignored: no lib prefix");
  tmp.file("libdqn_other.so.1", "ignored: not .so");
  fs::create_directory(tmp.dir / "libdqn_dir.so");  // ignored: not a regular file
  const std::string nowhere = (tmp.dir / "does-not-exist").string();
  PluginLoader loader({plugin_dir(), fixtures_dir(), tmp.dir.string(), nowhere});
  (void)loader.plugins();  // opens every library, in search order
  // Everything usable was loaded, from every directory...
  for (const char* n : {"c51", "h2_l2", "refuser", "thrower", "old_minor"}) CHECK_MESSAGE(loader.find(n) != nullptr, n);
  for (const char* n : {"wrong_abi", "newer_minor", "unresolved"}) CHECK_MESSAGE(loader.find(n) == nullptr, n);
  CHECK(std::string(loader.find("h2_l2")->version) == "0.4.0");  // the first of the two h2_l2s
  // ...and each bad library is one problem naming its path and why, in search order.
  struct Expect {
    std::string path, why;
  };
  const std::vector<Expect> expect = {
      {fixture("newer_minor"), "newer than this engine's " + abi()},
      {fixture("not_a_plugin"), "no 'dqn_plugin_descriptor' symbol"},
      {fixture("unresolved"), "dqn_fixture_symbol_nobody_defines"},
      {fixture("wrong_abi"), "was built for ABI 99.0, engine is ABI " + abi()},
      {fixture("wrong_size"), "descriptor size"},
      {fixture("zz_duplicate"), "plugin 'h2_l2' already loaded from " + fixture("h2_l2")},
      {garbage, "cannot be loaded"},
  };
  REQUIRE(loader.problems().size() == expect.size());
  for (std::size_t i = 0; i < expect.size(); ++i) {
    INFO(loader.problems()[i]);
    CHECK(has(loader.problems()[i], expect[i].path));
    CHECK(has(loader.problems()[i], expect[i].why));
  }
  CHECK(loader.search_path() == plugin_dir() + ":" + fixtures_dir() + ":" + tmp.dir.string() + ":" + nowhere);
}

TEST_CASE("loader.create_errors") {
  PluginLoader loader({plugin_dir(), fixtures_dir()});
  const NetworkDims net = tiny_dims();
  HeadCreateInfo info{};
  info.instance = "probe";
  info.role = Role::auxiliary;
  info.budget = 0.1;
  info.net = &net;
  info.batch = 4;
  info.gamma_n = 0.99f;
  struct Case {
    const char* why;
    std::string plugin;
    Role role;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {"create() fails: the plugin, its path, the instance and the plugin's own message", "refuser", Role::auxiliary,
       {"plugin 'refuser'", fixture("refuser"), "could not create head 'probe'",
        "refuser: head 'probe' refused on purpose (batch 4)"}},
      {"c51 refuses the auxiliary role with a reason", "c51", Role::auxiliary,
       {"plugin 'c51'", "could not create head 'probe'", "c51 is a primary head"}},
      {"the third-party head refuses the primary role", "h2_l2", Role::primary, {"h2_l2 is an auxiliary head only"}},
      {"create() throws: the plugin, its path and the exception's message", "thrower", Role::auxiliary,
       {"plugin 'thrower'", fixture("thrower"), "threw from create()", "thrower: create() threw on purpose"}},
      {"an unknown plugin: what was found and where it looked", "nosuch", Role::auxiliary,
       {"plugin 'nosuch' not found", "c51", "h2_l2", "search path: " + plugin_dir() + ":" + fixtures_dir()}},
  };
  for (const Case& c : cases) {
    INFO(std::string(c.why));
    info.role = c.role;
    const std::string m = thrown([&] { (void)loader.create(c.plugin, info); });
    for (const auto& p : c.parts) CHECK_MESSAGE(has(m, p), "'" << p << "' not in: " << m);
  }
  // Thrown things that are no std::exception, and a message that fills the whole buffer unterminated.
  info.role = Role::auxiliary;
  info.instance = "int";
  std::string m = thrown([&] { (void)loader.create("thrower", info); });
  CHECK(has(m, "plugin 'thrower'"));
  CHECK(has(m, "threw from create() for head 'int'"));
  info.instance = "flood";
  m = thrown([&] { (void)loader.create("refuser", info); });
  CHECK(has(m, "could not create head 'flood': " + std::string(1024, 'x')));
  CHECK_FALSE(has(m, std::string(1025, 'x')));
}

TEST_CASE("loader.pipeline_with_missing_plugin_names_the_search_path") {
  PluginLoader loader(PluginLoader::search_path_from(""));
  const std::string yaml =
      "name: missing\n"
      "backend: cpu\n"
      "network: {state: 5, trunk: [7], head_hidden: 6, branches: 2, actions: 3, atoms: 5}\n"
      "heads:\n"
      "  - {plugin: c51, role: primary}\n"
      "  - {plugin: c52, role: auxiliary, budget: 0.1}\n"
      "batch: 4\n";
  std::string message;
  try {
    (void)parse_pipeline(yaml, "missing.yaml", ParseOptions{.overrides = {}, .plugins = &loader, .environments = {}, .program_envs = {}});
    FAIL_CHECK("parsed a pipeline naming a missing plugin");
  } catch (const PipelineErrors& e) {
    message = e.what();
    REQUIRE(e.errors().size() == 1);
    CHECK(e.errors()[0].where().line == 6);
    CHECK(e.errors()[0].key() == "heads[1].plugin");
  }
  INFO(message);
  CHECK(has(message, "missing.yaml:6:"));
  CHECK(has(message, "plugin 'c52' not found"));
  CHECK(has(message, "did you mean 'c51'?"));
  CHECK(has(message, "search path: " + plugin_dir()));
  // The same pipeline with only the real plugin parses.
  const std::string good = yaml.substr(0, yaml.find("  - {plugin: c52")) + "batch: 4\n";
  CHECK_NOTHROW(
      (void)parse_pipeline(good, "good.yaml", ParseOptions{.overrides = {}, .plugins = &loader, .environments = {}, .program_envs = {}}));
}

TEST_CASE("loader.opens_only_what_is_asked_for") {
  PluginLoader loader({plugin_dir(), fixtures_dir()});
  CHECK(loader.files().size() > 10);
  REQUIRE(loader.find("c51") != nullptr);  // libdqn_c51.so, by its name
  CHECK(loader.problems().empty());         // no broken fixture was opened
  for (const char* f : {"wrong_abi", "unresolved", "h2_l2"}) CHECK_MESSAGE(!is_loaded(fixture(f)), f);
  REQUIRE(loader.find("h2_l2") != nullptr);
  CHECK(is_loaded(fixture("h2_l2")));
  CHECK_FALSE(is_loaded(fixture("wrong_abi")));
  // Names for suggestions come from the files not opened, without opening them.
  const std::vector<std::string> names = loader.names();
  CHECK(std::find(names.begin(), names.end(), "wrong_abi") != names.end());
  CHECK_FALSE(is_loaded(fixture("wrong_abi")));
  // A name no file is named for opens the rest, in order, and is then not found.
  CHECK(loader.find("no_such_head") == nullptr);
  CHECK(is_loaded(fixture("old_minor")));
  CHECK_FALSE(loader.problems().empty());
}

TEST_CASE("loader.head_keeps_its_library_loaded") {
  const std::string path = fixture("h2_l2");
  REQUIRE_FALSE(is_loaded(path));
  const NetworkDims net = tiny_dims();
  const ParamValue weight{"weight", ParamType::number, 0, 0.25, "0.25"};
  HeadCreateInfo info{};
  info.instance = "l2";
  info.role = Role::auxiliary;
  info.budget = 0.1;
  info.net = &net;
  info.batch = 4;
  info.gamma_n = 0.99f;
  info.params = &weight;
  info.n_params = 1;
  HeadHandle head;
  {
    PluginLoader loader({fixtures_dir()});
    CHECK_FALSE(is_loaded(path));  // opened when asked for
    head = loader.create("h2_l2", info);
    REQUIRE(head.get() != nullptr);
    CHECK(is_loaded(path));
    CHECK(head.plugin().library.use_count() == 2);  // the loader's and the head's
  }
  // The loader is gone; the head alone holds the library, which is still mapped and callable.
  CHECK(head.plugin().library.use_count() == 1);
  CHECK(head.plugin().library->is_loaded());
  CHECK(is_loaded(path));
  CHECK(std::string(head->error()).empty());  // a virtual call into the plugin's code
  HeadHandle moved = std::move(head);
  CHECK(head.get() == nullptr);
  CHECK(moved.get() != nullptr);
  CHECK(is_loaded(path));
  moved.reset();  // destroy() from the plugin, then the library goes
  CHECK(moved.get() == nullptr);
  CHECK_FALSE(moved.plugin().library);
  CHECK_FALSE(is_loaded(path));
}

TEST_CASE("loader.third_party_head_runs_with_c51") {
  auto loader = std::make_unique<PluginLoader>(std::vector<std::string>{plugin_dir(), fixtures_dir()});
  const PipelineSpec spec =
      parse_pipeline(kThirdPartyPipeline, "third_party.yaml",
                     ParseOptions{.overrides = {}, .plugins = loader.get(), .environments = {}, .program_envs = {}});
  auto engine_ptr = std::make_unique<Engine>(spec, *loader);
  Engine& engine = *engine_ptr;
  // The engine's heads hold their libraries: the loader may go before the engine is used.
  loader.reset();
  CHECK(is_loaded(fixture("h2_l2")));
  REQUIRE(engine.head_names() == std::vector<std::string>{"c51", "h2_l2"});
  CHECK(engine.backend() == BackendKind::cpu);
  REQUIRE(engine.update().fractions().size() == 2);
  CHECK(engine.update().fractions()[0] == doctest::Approx(0.9));  // the primary takes 1 − the plugin's default 0.1
  CHECK(engine.update().fractions()[1] == doctest::Approx(0.1));

  // Its stages are scheduled among the engine's: penalty (declared second) before report, both
  // after the trunk and before the budget; its trunk backward after its penalty.
  const std::string explain = dqn::explain(engine);
  std::vector<std::string> order;
  {
    std::istringstream in(explain.substr(explain.find("stages in order")));
    std::string line;
    std::getline(in, line);
    while (std::getline(in, line) && line.rfind("  ", 0) == 0) {  // up to "registry:"
      if (has(line, "reads:") || has(line, "writes:") || has(line, "waits:")) continue;
      const auto dot = line.find(". ");
      REQUIRE(dot != std::string::npos);
      const std::string rest = line.substr(dot + 2);
      order.push_back(rest.substr(0, rest.find(' ')));
    }
    CHECK(order.size() == 15);  // with c51.loss.mean
  }
  INFO(explain);
  auto pos = [&](const std::string& n) {
    const auto it = std::find(order.begin(), order.end(), n);
    CHECK_MESSAGE(it != order.end(), n << " not scheduled");
    return it - order.begin();
  };
  CHECK(pos("trunk.forward.0") < pos("h2_l2.penalty"));
  CHECK(pos("h2_l2.penalty") < pos("h2_l2.report"));
  CHECK(pos("h2_l2.report") < pos("update"));
  CHECK(pos("h2_l2.penalty") < pos("trunk.backward.0"));  // one trunk backward for every head
  CHECK(pos("trunk.backward.0") < pos("trunk.weights.0"));
  CHECK(pos("trunk.weights.0") < pos("update"));
  CHECK(pos("c51.loss") < pos("update"));
  CHECK(has(explain, "h2_l2/sum_sq"));  // its own buffer is in the arena

  init_weights(engine, 11);
  set_batch(engine, HostBatch::random(spec, 5));
  const Registry& reg = engine.registry();
  const std::int64_t lookups = reg.lookups();
  const int B = spec.batch, H2 = 7;
  const double lambda = 0.5;
  auto at = [&](const char* name) {
    const auto* b = reg.find(name);
    REQUIRE(b != nullptr);
    return reinterpret_cast<const float*>(reg.base() + b->offset_bytes);
  };
  std::vector<double> aux_losses;
  for (int step = 1; step <= 4; ++step) {
    INFO("step " << step);
    engine.step();
    const StepReport r = engine.read_report();
    REQUIRE(r.losses.size() == 2);
    CHECK(std::isfinite(r.losses[0]));
    CHECK(r.losses[0] > 0);  // cross-entropy
    CHECK(r.total_loss == doctest::Approx(r.losses[0] + r.losses[1]));
    for (std::size_t h = 0; h < 2; ++h) {
      CHECK(std::isfinite(r.grad_norms[h]));
      CHECK(r.grad_norms[h] > 0);
      CHECK(r.clips[h] > 0);
      CHECK(r.clips[h] <= 1);
    }
    CHECK(r.skipped_steps == 0);
    CHECK(r.adam_step == step);
    // The plugin computed what it says: λ/(2B) Σ_b ‖h2_b‖² over the rows of `states`...
    const float* h2 = at("trunk/h2");
    const float* dtrunk = at("dtrunk/h2_l2");
    double sum_sq = 0;
    for (int i = 0; i < B * H2; ++i) sum_sq += double(h2[i]) * h2[i];
    CHECK(sum_sq > 0);
    CHECK(r.losses[1] == doctest::Approx(lambda / (2.0 * B) * sum_sq).epsilon(1e-5));
    // ...and its gradient (λ/B) h2 (the trunk's in-place ReLU backward leaves it unchanged: h2 ≥ 0).
    for (int i = 0; i < B * H2; ++i) CHECK(dtrunk[i] == doctest::Approx(lambda / B * h2[i]).epsilon(1e-6));
    aux_losses.push_back(r.losses[1]);
  }
  // The head has no parameters of its own: its gradient row touches the trunk only.
  const float* grad_aux = at("grad/h2_l2");
  double trunk_norm = 0, head_norm = 0;
  for (const auto& p : reg.params())
    for (std::int64_t i = 0; i < p.numel(); ++i) {
      const double g = grad_aux[p.offset + i];
      (p.owner == "engine" ? trunk_norm : head_norm) += g * g;
    }
  CHECK(trunk_norm > 0);
  CHECK(head_norm == 0);
  // Training moved the weights: the penalty changed between steps.
  CHECK(aux_losses.front() != aux_losses.back());
  // No registry lookups and no allocation during the steps.
  CHECK(reg.lookups() == lookups);
  CHECK(reg.lookups_after_seal() == 0);
  CHECK(reg.arena_allocations() == 1);
  // A step dump carries the third-party head's report like ours.
  const st::File dump = save_weights(engine, true);
  for (const char* n : {"loss.h2_l2", "grad_norm.h2_l2", "clip.h2_l2", "loss.c51", "loss.total"})
    CHECK_MESSAGE(dump.has(n), n);
  CHECK(dump.get_scalar_f32("loss.h2_l2") == doctest::Approx(aux_losses.back()));
  // With the engine gone, nothing holds the third-party library any more.
  engine_ptr.reset();
  CHECK_FALSE(is_loaded(fixture("h2_l2")));
}
