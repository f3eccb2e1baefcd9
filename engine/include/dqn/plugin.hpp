/** @file plugin.hpp
 *  @brief The plugin ABI: one C-layout descriptor per plugin library (a loss head, or an
 *  environment library offering one task or more), ABI version first, exported under a single
 *  well-known symbol. Frozen by tests/unit/abi_test.cpp.
 */
#pragma once

#include <cstdint>

#include "dqn/backend.hpp"

namespace dqn {

/// The plugin ABI, major.minor. The loader takes a plugin built for this major and any minor up to
/// kAbiMinor; another major, or a newer minor, is refused with both versions in the message.
/// A minor change only appends: an op at the end of the op table, a method at the end of an
/// interface the engine implements (BuildContext, Resolver, Backend), a field at the end of a
/// struct a plugin fills (the engine reads only what the plugin's minor has), a buffer name. So a
/// plugin built for an older minor loads and works unchanged. Anything else — a changed signature,
/// order or layout, a method added to Head (which plugins implement) — is a major change.
inline constexpr std::uint32_t kAbiMajor = 21;
inline constexpr std::uint32_t kAbiMinor = 2;

/// The exported symbol every plugin defines (through DQN_PLUGIN_EXPORT below).
inline constexpr const char* kDescriptorSymbol = "dqn_plugin_descriptor";

enum class ParamType : std::int32_t { boolean = 0, integer = 1, number = 2, string = 3 };

/// One configurable key of a head or an environment task. Defaults are given as text in YAML syntax ("0.2", "true").
struct ParamSchema {
  const char* key;
  ParamType type;
  const char* default_value;
  const char* doc;
  double min;  ///< inclusive lower bound for integer/number (use -inf for none)
  double max;  ///< inclusive upper bound (use +inf for none)
};

/// A resolved value of one schema key, as handed to create(). Booleans are in `i`.
struct ParamValue {
  const char* key;
  ParamType type;
  std::int64_t i;
  double d;
  const char* s;
};

enum class Role : std::int32_t { primary = 0, auxiliary = 1 };

inline constexpr int kMaxTrunkLayers = 8;

/// Network sizes from the pipeline (docs/step-math.md, "Shapes and names").
struct NetworkDims {
  std::int32_t state;
  std::int32_t trunk_layers;
  std::int32_t trunk[kMaxTrunkLayers];
  std::int32_t head_hidden;
  std::int32_t branches;  ///< D
  std::int32_t actions;   ///< A
  std::int32_t atoms;     ///< Z
  float v_min, v_max;
  std::int32_t h2() const noexcept { return trunk[trunk_layers - 1]; }
};

struct HeadCreateInfo {
  const char* instance;       ///< the head's name in the pipeline (the plugin name by default)
  Role role;
  double budget;              ///< the fraction this head takes (resolved by the engine)
  const NetworkDims* net;
  std::int32_t batch;         ///< B
  float gamma_n;              ///< γ^n
  std::uint64_t seed;
  const ParamValue* params;   ///< every schema key, defaults filled in
  std::uint32_t n_params;
};

class Head;
class PolicyGraph;
struct EnvDescriptor;

/// What a library offers: a loss head (create/destroy and the head fields), or environments (the
/// tasks in envs, appended in 21.1; the head fields are then zero and null).
enum class PluginKind : std::int32_t { head = 0, environment = 1 };

struct PluginDescriptor {
  std::uint32_t abi_major;        ///< must stay the first field: read before anything else
  std::uint32_t abi_minor;        ///< the minor the plugin was built against (<= kAbiMinor loads)
  std::uint32_t struct_size;      ///< sizeof(PluginDescriptor) as the plugin saw it
  PluginKind kind;
  const char* name;
  const char* version;
  const char* description;
  double default_budget;          ///< fraction an auxiliary takes unless the pipeline says
  std::int32_t can_be_primary;    ///< 1 when the head keeps the primary's contract (head.hpp)
  std::uint32_t schema_len;
  const ParamSchema* schema;
  /// Returns a new head or null; on failure writes a message into err (errlen bytes).
  Head* (*create)(const HeadCreateInfo* info, char* err, std::uint32_t errlen);
  void (*destroy)(Head* head);
  // --- appended in 21.1 (environment plugins) ---
  std::uint32_t env_count;        ///< kind environment: the tasks offered (>= 1)
  const EnvDescriptor* envs;      ///< [env_count]
  // --- appended in 21.2 (dqn export) ---
  /// A primary head's part of the acting network for `dqn export` (dqn/policy_graph.hpp): the nodes
  /// from the trunk's output to the Q-values, for the head `info` describes; 0 on success, else
  /// non-zero after PolicyGraph::fail. Null: this head cannot be exported.
  int (*export_policy)(const HeadCreateInfo* info, PolicyGraph* graph);
  // --- a minor version appends fields here; the loader reads only the struct_size bytes a plugin has ---
};

/// The descriptor's size at minor 0 of this major: the smallest struct_size the loader takes.
inline constexpr std::uint32_t kDescriptorSizeMinor0 = 80;
/// The size from minor 1 on, which an environment plugin's descriptor has at least.
inline constexpr std::uint32_t kDescriptorSizeMinor1 = 96;
/// The size from minor 2 on (export_policy): a descriptor this short has no export.
inline constexpr std::uint32_t kDescriptorSizeMinor2 = 104;

}  // namespace dqn

/// Defines the exported descriptor symbol; use exactly once per plugin, at namespace scope.
/// A plain C function, so a plugin needs no Boost headers; the loader reads it with Boost.DLL.
#define DQN_PLUGIN_EXPORT(descriptor_object)                                                 \
  extern "C" __attribute__((visibility("default"))) const ::dqn::PluginDescriptor*         \
  dqn_plugin_descriptor() {                                                                \
    return &(descriptor_object);                                                           \
  }
