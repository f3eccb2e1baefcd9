// Plugin discovery and loading through Boost.DLL.
#include "core/plugin_loader.hpp"

#include <algorithm>
#include <boost/dll/shared_library.hpp>
#include <dlfcn.h>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <variant>
#include <cstring>
#include <sstream>
#include <stdexcept>

#include "dqn/env.hpp"
#include "dqn_config.h"
#include "pipeline/head_params.hpp"

namespace dqn {

namespace fs = std::filesystem;

HeadHandle& HeadHandle::operator=(HeadHandle&& o) noexcept {
  if (this != &o) {
    reset();
    head_ = o.head_;
    plugin_ = std::move(o.plugin_);
    o.head_ = nullptr;
  }
  return *this;
}

void HeadHandle::reset() noexcept {
  if (head_ && plugin_.descriptor) plugin_.descriptor->destroy(head_);
  head_ = nullptr;
  plugin_ = LoadedPlugin{};  // the library may unload only now
}

namespace {
std::vector<std::string> split_path(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == ':') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

std::string name_from_file(const std::string& path) {
  std::string n = fs::path(path).stem().string();
  if (n.rfind("lib", 0) == 0) n = n.substr(3);
  if (n.rfind("dqn_", 0) == 0) n = n.substr(4);
  return n;
}

const char* type_name(ParamType t) {
  switch (t) {
    case ParamType::boolean: return "bool";
    case ParamType::integer: return "int";
    case ParamType::number: return "number";
    case ParamType::string: return "string";
  }
  return "?";
}
}  // namespace

std::string PluginLoader::default_dir() {
  // Where this code is: the engine's shared library, or a program linked with it statically.
  Dl_info info{};
  std::error_code ec;
  if (dladdr(reinterpret_cast<void*>(&PluginLoader::default_dir), &info) != 0 && info.dli_fname) {
    const fs::path here = fs::weakly_canonical(fs::absolute(info.dli_fname, ec), ec);
    const fs::path build = fs::weakly_canonical(DQN_BUILD_ROOT, ec);
    const auto rel = here.lexically_relative(build);
    const bool in_build = !ec && !rel.empty() && *rel.begin() != "..";
    // Installed (anywhere: the prefix may have moved, as with meson install --destdir): the
    // plugins installed beside the library, <libdir>/dqn/plugins. Never the build tree.
    if (!in_build) return (here.parent_path() / "dqn" / "plugins").string();
  }
  return DQN_BUILD_PLUGIN_DIR;
}

std::vector<std::string> PluginLoader::search_path_from(const std::string& cli_value) {
  std::vector<std::string> dirs = split_path(cli_value);
  if (const char* env = std::getenv("DQN_PLUGIN_PATH")) {
    for (auto& d : split_path(env)) dirs.push_back(d);
  }
  if (const char* def = std::getenv("DQN_PLUGIN_DEFAULT_DIRS")) {
    for (auto& d : split_path(def)) dirs.push_back(d);
  } else {
    dirs.push_back(default_dir());
  }
  std::vector<std::string> unique;
  for (auto& d : dirs)
    if (std::find(unique.begin(), unique.end(), d) == unique.end()) unique.push_back(d);
  return unique;
}

LoadedPlugin PluginLoader::load_file(const std::string& path) {
  LoadedPlugin p;
  p.path = path;
  try {
    p.library = std::make_shared<boost::dll::shared_library>(
        boost::dll::fs::path(path), boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local);
  } catch (const std::exception& e) {
    throw std::runtime_error("plugin '" + path + "': cannot be loaded: " + e.what());
  }
  if (!p.library->has(kDescriptorSymbol))
    throw std::runtime_error("plugin '" + path + "': no '" + kDescriptorSymbol + "' symbol (not a dqn plugin?)");
  using Fn = const PluginDescriptor*();
  const PluginDescriptor* d = nullptr;
  try {
    d = p.library->get<Fn>(kDescriptorSymbol)();
  } catch (...) {
    throw std::runtime_error("plugin '" + path + "': its descriptor function threw");
  }
  if (!d) throw std::runtime_error("plugin '" + path + "': descriptor function returned null");
  // Only the first two fields are trusted before the version check: the name comes from the file.
  auto version = [](std::uint32_t major, std::uint32_t minor) {
    return std::to_string(major) + "." + std::to_string(minor);
  };
  if (d->abi_major != kAbiMajor)
    throw std::runtime_error("plugin '" + name_from_file(path) + "' (" + path + ") was built for ABI " +
                             version(d->abi_major, d->abi_minor) + ", engine is ABI " + version(kAbiMajor, kAbiMinor) +
                             ": another major version; rebuild it against this SDK");
  if (d->abi_minor > kAbiMinor)
    throw std::runtime_error("plugin '" + name_from_file(path) + "' (" + path + ") was built for ABI " +
                             version(d->abi_major, d->abi_minor) + ", newer than this engine's " +
                             version(kAbiMajor, kAbiMinor) + ": update the engine, or rebuild the plugin against its SDK");
  // A minor change may append fields: an older plugin's descriptor is a prefix of this one (every
  // field the engine reads today was there at minor 0).
  if (d->struct_size < kDescriptorSizeMinor0 || d->struct_size > sizeof(PluginDescriptor))
    throw std::runtime_error("plugin '" + path + "': descriptor size " + std::to_string(d->struct_size) +
                             " is not that of ABI " + version(d->abi_major, d->abi_minor) + " (" +
                             std::to_string(kDescriptorSizeMinor0) + " to " + std::to_string(sizeof(PluginDescriptor)) +
                             " bytes): a corrupt descriptor");
  if (!d->name || !*d->name)
    throw std::runtime_error("plugin '" + path + "': incomplete descriptor (it has no name)");
  if (d->kind == PluginKind::head) {
    if (!d->create || !d->destroy || (d->schema_len && !d->schema))
      throw std::runtime_error("plugin '" + path + "': incomplete descriptor (name, create, destroy and schema are required)");
  } else if (d->kind == PluginKind::environment) {
    if (d->struct_size < kDescriptorSizeMinor1)
      throw std::runtime_error("plugin '" + path + "': an environment plugin's descriptor is at least " +
                               std::to_string(kDescriptorSizeMinor1) + " bytes (ABI " + std::to_string(kAbiMajor) +
                               ".1), this one " + std::to_string(d->struct_size) + ": rebuild it against this SDK");
    if (d->env_count == 0 || !d->envs)
      throw std::runtime_error("plugin '" + path + "': an environment plugin that offers no task (env_count 0)");
    for (std::uint32_t i = 0; i < d->env_count; ++i) {
      const EnvDescriptor& t = d->envs[i];
      if (!t.task || !*t.task || !t.create || !t.destroy || (t.schema_len && !t.schema))
        throw std::runtime_error("plugin '" + path + "': task " + std::to_string(i) +
                                 " is incomplete (task name, create, destroy and schema are required)");
      for (std::uint32_t j = 0; j < i; ++j)
        if (std::strcmp(d->envs[j].task, t.task) == 0)
          throw std::runtime_error("plugin '" + path + "': task '" + t.task + "' is offered twice");
    }
  } else {
    throw std::runtime_error("plugin '" + path + "': unknown plugin kind " + std::to_string(int(d->kind)) +
                             " (a head is 0, environments 1)");
  }
  p.descriptor = d;
  return p;
}

PluginLoader::PluginLoader(std::vector<std::string> search_path) : dirs_(std::move(search_path)) {
  // Only listed here: a library is opened when a plugin it may hold is asked for.
  for (const auto& dir : dirs_) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) continue;
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const auto name = e.path().filename().string();
      if (e.is_regular_file(ec) && name.rfind("lib", 0) == 0 && e.path().extension() == ".so") files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
    for (const auto& f : files) files_.push_back(Candidate{f.string(), false});
  }
}

void PluginLoader::open(std::size_t i) const {
  Candidate& c = files_[i];
  if (c.opened) return;
  c.opened = true;
  try {
    LoadedPlugin p = load_file(c.path);
    const auto first = std::find_if(plugins_.begin(), plugins_.end(), [&](const LoadedPlugin& q) {
      return std::string(q.descriptor->name) == p.descriptor->name;
    });
    if (first != plugins_.end()) {
      // The first one found is used; another is reported, not silently used.
      problems_.push_back(c.path + ": plugin '" + p.descriptor->name + "' already loaded from " + first->path +
                          " (the first one found on the search path is used)");
      return;
    }
    plugins_.push_back(std::move(p));
  } catch (const std::exception& e) {
    problems_.push_back(e.what());
  }
}

void PluginLoader::open_all() const {
  for (std::size_t i = 0; i < files_.size(); ++i) open(i);
}

const LoadedPlugin* PluginLoader::loaded(const std::string& name) const {
  for (const auto& p : plugins_)
    if (name == p.descriptor->name) return &p;
  return nullptr;
}

const LoadedPlugin* PluginLoader::locate(const std::string& name) const {
  if (const LoadedPlugin* p = loaded(name)) return p;
  // The files named for it first (libdqn_<name>.so, lib<name>.so) along the search path, then the rest.
  for (std::size_t i = 0; i < files_.size(); ++i)
    if (name_from_file(files_[i].path) == name) {
      open(i);
      if (const LoadedPlugin* p = loaded(name)) return p;
    }
  for (std::size_t i = 0; i < files_.size(); ++i) {
    open(i);
    if (const LoadedPlugin* p = loaded(name)) return p;
  }
  return nullptr;
}

const LoadedPlugin* PluginLoader::get(const std::string& name) const { return locate(name); }

const PluginDescriptor* PluginLoader::find(const std::string& name) const {
  const LoadedPlugin* p = locate(name);
  return p ? p->descriptor : nullptr;
}

std::vector<std::string> PluginLoader::names() const {
  // The plugins loaded, and those the files not opened yet are named for (opening them to be sure
  // would run every library's code to spell-check one name).
  std::vector<std::string> out;
  for (const auto& p : plugins_) out.emplace_back(p.descriptor->name);
  for (const auto& c : files_) {
    const std::string n = name_from_file(c.path);
    if (!c.opened && std::find(out.begin(), out.end(), n) == out.end()) out.push_back(n);
  }
  return out;
}

const std::vector<LoadedPlugin>& PluginLoader::plugins() const {
  open_all();
  return plugins_;
}

std::vector<std::string> PluginLoader::files() const {
  std::vector<std::string> out;
  for (const auto& c : files_) out.push_back(c.path);
  return out;
}

std::string PluginLoader::search_path() const {
  std::string s;
  for (const auto& d : dirs_) s += (s.empty() ? "" : ":") + d;
  return s.empty() ? std::string("(empty)") : s;
}

HeadInfo::HeadInfo(const PipelineSpec& spec, std::size_t index, const PluginDescriptor& d, const NetworkDims& net) {
  const HeadSpec& hs = spec.heads[index];
  instance = hs.name.empty() ? hs.plugin : hs.name;
  values = resolve_head_params(hs, d, storage);
  info.instance = instance.c_str();
  info.role = hs.role;
  info.budget = resolved_budget(spec, index);
  info.net = &net;
  info.batch = spec.batch;
  info.gamma_n = float(spec.gamma_n());
  info.seed = spec.seed;
  info.params = values.data();
  info.n_params = std::uint32_t(values.size());
}

HeadHandle PluginLoader::create(const std::string& plugin, const HeadCreateInfo& info) const {
  if (const LoadedPlugin* found = locate(plugin)) {
    const LoadedPlugin& p = *found;
    if (p.descriptor->kind != PluginKind::head)
      throw std::runtime_error("plugin '" + plugin + "' (" + p.path + ") offers environments, not a loss head");
    char err[1024] = {0};
    Head* h = nullptr;
    try {  // create() must not throw across the boundary; one that does is reported, not fatal
      h = p.descriptor->create(&info, err, sizeof err);
    } catch (const std::exception& e) {
      throw std::runtime_error("plugin '" + plugin + "' (" + p.path + ") threw from create() for head '" +
                               (info.instance ? info.instance : "?") + "': " + e.what());
    } catch (...) {
      throw std::runtime_error("plugin '" + plugin + "' (" + p.path + ") threw from create() for head '" +
                               (info.instance ? info.instance : "?") + "'");
    }
    // The message as far as the buffer goes: a plugin may fill it without a terminating NUL.
    const std::string why(err, ::strnlen(err, sizeof err));
    if (!h)
      throw std::runtime_error("plugin '" + plugin + "' (" + p.path + ") could not create head '" +
                               (info.instance ? info.instance : "?") + "': " + (why.empty() ? "no reason given" : why));
    return HeadHandle(h, p);
  }
  std::string known;
  for (const auto& n : names()) known += (known.empty() ? "" : ", ") + n;
  throw std::runtime_error("plugin '" + plugin + "' not found (found: " + (known.empty() ? "none" : known) +
                           "; search path: " + search_path() + ")");
}

namespace {
void describe_schema(std::ostringstream& os, const ParamSchema* schema, std::uint32_t n, const char* indent,
                     const char* none) {
  if (n == 0) os << indent << none << "\n";
  for (std::uint32_t i = 0; i < n; ++i) {
    const auto& s = schema[i];
    os << indent << s.key << " (" << type_name(s.type) << ", default " << (s.default_value ? s.default_value : "-");
    if (s.type == ParamType::integer || s.type == ParamType::number) {
      if (std::isfinite(s.min)) os << ", min " << s.min;
      if (std::isfinite(s.max)) os << ", max " << s.max;
    }
    os << "): " << (s.doc ? s.doc : "") << "\n";
  }
}
}  // namespace

std::string describe_plugin(const LoadedPlugin& p) {
  const auto* d = p.descriptor;
  std::ostringstream os;
  os << d->name << " " << (d->version ? d->version : "") << "  (" << p.path << ")\n";
  if (d->description) os << "  " << d->description << "\n";
  if (d->kind == PluginKind::environment) {
    for (std::uint32_t i = 0; i < d->env_count; ++i) {
      const EnvDescriptor& t = d->envs[i];
      os << "  environment " << t.task;
      if (t.description && *t.description) os << ": " << t.description;
      os << "\n" << describe_env_spaces(t) << "";
      describe_schema(os, t.schema, t.schema_len, "    ", "options: none");
    }
    return os.str();
  }
  os << "  roles: " << (d->can_be_primary ? "primary, auxiliary" : "auxiliary");
  if (d->default_budget > 0) os << "; default budget " << d->default_budget;
  os << "\n";
  describe_schema(os, d->schema, d->schema_len, "  ", "parameters: none");
  return os.str();
}

std::string describe_env_spaces(const EnvDescriptor& t) {
  // One copy with the default options shows the spaces.
  std::vector<ParamValue> values;
  std::vector<std::string> texts;
  texts.reserve(t.schema_len);  // no reallocation: the c_str() pointers stay valid
  for (std::uint32_t i = 0; i < t.schema_len; ++i) {
    const ParamSchema& s = t.schema[i];
    const std::optional<HeadParam> def = dsl::parse_default(s);
    if (!def) return "    spaces: depend on options without a default\n";
    texts.push_back(dsl::param_text(*def));
    ParamValue v{s.key, s.type, 0, 0.0, texts.back().c_str()};
    if (auto b = std::get_if<bool>(&*def)) v.i = *b ? 1 : 0;
    if (auto x = std::get_if<std::int64_t>(&*def)) v.i = *x, v.d = double(*x);
    if (auto x = std::get_if<double>(&*def)) v.d = *x;
    values.push_back(v);
  }
  const EnvCreateInfo info{t.task, 1, 0, values.data(), std::uint32_t(values.size())};
  char err[512] = {0};
  Env* env = nullptr;
  try {
    env = t.create(&info, err, sizeof err);
  } catch (...) {
    return "    spaces: its create() threw with the default options\n";
  }
  if (!env) return std::string("    spaces: not made with the default options (") + err + ")\n";
  std::ostringstream os;
  const EnvSpec& s = env->spec();
  os << "    observation: " << s.obs_dim << " features; actions: " << s.n_branches << " branch"
     << (s.n_branches == 1 ? "" : "es");
  bool same = true;
  for (int b = 1; b < s.n_branches; ++b)
    same = same && s.branches[b].bins == s.branches[0].bins && s.branches[b].continuous == s.branches[0].continuous &&
           s.branches[b].lo == s.branches[0].lo && s.branches[b].hi == s.branches[0].hi;
  auto branch = [&](const EnvBranch& b) {
    std::ostringstream x;
    x << b.bins << " bins";
    if (b.continuous) x << " over [" << b.lo << ", " << b.hi << "]";
    return x.str();
  };
  if (s.n_branches > 0 && same) {
    os << " of " << branch(s.branches[0]);
  } else {
    for (int b = 0; b < s.n_branches; ++b)
      os << (b ? "; " : " (") << (s.branches[b].name ? s.branches[b].name : "") << " " << branch(s.branches[b]);
    if (s.n_branches) os << ")";
  }
  os << "; episodes of at most " << s.max_episode_steps << " steps" << (s.reports_success ? "; reports success" : "")
     << " (default options)\n";
  t.destroy(env);
  return os.str();
}

}  // namespace dqn
