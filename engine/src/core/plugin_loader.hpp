/** @file plugin_loader.hpp
 *  @brief Finds loss-head plugins on a search path, loads them with Boost.DLL (rtld_now),
 *  checks their ABI, and keeps each library loaded while anything made from it lives.
 */
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dqn/head.hpp"
#include "dqn/plugin.hpp"
#include "pipeline/parse.hpp"

namespace boost::dll { class shared_library; }

namespace dqn {

struct LoadedPlugin {
  std::string path;
  std::shared_ptr<boost::dll::shared_library> library;
  const PluginDescriptor* descriptor = nullptr;
};

/// What a head plugin's create() and export_policy() get for pipeline head `index`: its instance
/// name, role, resolved params and budget, and the network's sizes (which must outlive it).
/// Pinned in place: `info` points into the other members.
struct HeadInfo {
  HeadInfo(const PipelineSpec& spec, std::size_t index, const PluginDescriptor& d, const NetworkDims& net);
  HeadInfo(const HeadInfo&) = delete;
  HeadInfo& operator=(const HeadInfo&) = delete;
  std::string instance;
  std::vector<std::string> storage;  ///< the params' text values
  std::vector<ParamValue> values;
  HeadCreateInfo info{};
};

/// A head together with the library it came from: destroying it calls the plugin's destroy()
/// and only then lets the library go.
class HeadHandle {
 public:
  HeadHandle() = default;
  HeadHandle(Head* h, const LoadedPlugin& from) : head_(h), plugin_(from) {}
  HeadHandle(HeadHandle&& o) noexcept : head_(o.head_), plugin_(std::move(o.plugin_)) { o.head_ = nullptr; }
  HeadHandle& operator=(HeadHandle&& o) noexcept;
  HeadHandle(const HeadHandle&) = delete;
  HeadHandle& operator=(const HeadHandle&) = delete;
  ~HeadHandle() { reset(); }
  void reset() noexcept;
  Head* get() const noexcept { return head_; }
  Head* operator->() const noexcept { return head_; }
  const LoadedPlugin& plugin() const noexcept { return plugin_; }

 private:
  Head* head_ = nullptr;
  LoadedPlugin plugin_;
};

class PluginLoader : public PluginCatalog {
 public:
  /// Lists each directory's lib*.so files (non-recursively) without opening any: a library is
  /// opened when a plugin it may hold is asked for (find, create), the files named for that plugin
  /// (libdqn_<name>.so, lib<name>.so) first along the search path, then the others in order; the
  /// first library found to hold a plugin is the one used. plugins() opens them all.
  explicit PluginLoader(std::vector<std::string> search_path);

  /// The search path: the command-line value (colon-separated) if given, then $DQN_PLUGIN_PATH,
  /// then the default directories ($DQN_PLUGIN_DEFAULT_DIRS when set, even empty; else
  /// default_dir()).
  static std::vector<std::string> search_path_from(const std::string& cli_value);
  /// The built-in plugins' directory for the engine that runs: beside an installed engine library,
  /// <libdir>/dqn/plugins (wherever the prefix now lies); the build tree's plugins/ for an engine
  /// running from its build tree.
  static std::string default_dir();

  /// Loads one library file; throws std::runtime_error with the path and the reason (system
  /// loader message, missing symbol, ABI mismatch naming both versions, bad descriptor).
  static LoadedPlugin load_file(const std::string& path);

  const PluginDescriptor* find(const std::string& name) const override;
  /// The plugin of that name with its library (null when none is found): what keeps the library
  /// loaded while something made from it lives.
  const LoadedPlugin* get(const std::string& name) const;
  std::vector<std::string> names() const override;
  std::string search_path() const override;

  /// Every plugin on the search path (opens every library).
  const std::vector<LoadedPlugin>& plugins() const;
  /// The library files on the search path, in search order (none opened by this).
  std::vector<std::string> files() const;
  /// Libraries opened so far that could not be used, each "path: reason".
  const std::vector<std::string>& problems() const { return problems_; }

  /// Creates a head; throws std::runtime_error naming the plugin and its message on failure.
  HeadHandle create(const std::string& plugin, const HeadCreateInfo& info) const;

 private:
  struct Candidate {
    std::string path;
    bool opened = false;
  };
  void open(std::size_t i) const;  ///< opens files_[i] once, into plugins_ or problems_
  void open_all() const;
  const LoadedPlugin* loaded(const std::string& name) const;
  const LoadedPlugin* locate(const std::string& name) const;  ///< opens what it must

  std::vector<std::string> dirs_;
  // Opened on demand from const lookups (PluginCatalog's interface), hence mutable; not thread-safe.
  mutable std::vector<Candidate> files_;
  mutable std::vector<LoadedPlugin> plugins_;
  mutable std::vector<std::string> problems_;
};

/// Human description of a plugin and its schema (for `dqn plugins`); an environment plugin's tasks
/// with their spaces and options.
std::string describe_plugin(const LoadedPlugin& p);
/// A task's spaces, from one copy made with its default options ("    observation: …\n").
std::string describe_env_spaces(const EnvDescriptor& task);

}  // namespace dqn
