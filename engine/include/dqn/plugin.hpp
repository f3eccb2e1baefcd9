/** @file plugin.hpp
 *  @brief The plugin ABI: one C-layout descriptor per loss-head plugin, ABI version first,
 *  exported under a single well-known symbol. Frozen by tests/unit/abi_test.cpp.
 */
#pragma once

#include <cstdint>

#include "dqn/backend.hpp"

namespace dqn {

/// Bumped whenever the descriptor, the Head/BuildContext/Resolver interfaces or the op table
/// change layout or meaning. The loader refuses any other value.
inline constexpr std::uint32_t kAbiVersion = 19;  // 2: auxiliary-head ops appended to the op table; 3: Gemm bias/act epilogue;
                                                   // 4: fused update op appended; 5: head_forward op appended;
                                                   // 6: advantage strides (dueling_backward's lddadv, ldadv fields);
                                                   // 7: padded output-layer rows (kParamPadRows, wv2_rows, wb2_rows);
                                                   // 8: Gemm::mask (ReLU backward in the GEMM), relu_bias_grad without db;
                                                   // 9: Gemm::batch2 (a second batch dimension), Gemm::sum_batch;
                                                   // 10: Gemm fields for the layer below's dW and db with C,
                                                   //     and for the next layer in the same call;
                                                   // 11: Gemm strides batching the next layer;
                                                   // 12: C51Loss::online (the distribution fused into the loss);
                                                   // 13: C51Loss::online removed (C51Loss as in 11);
                                                   // 14: weighted_mean op appended, C51Loss::loss may be null
                                                   // 15: weighted_mean_members op appended
                                                   // 16: weighted_mean_members removed (the table as in 14)
                                                   // 17: C51Loss::m_all, parts 3 and 4 (every action's projection)
                                                   // 18: C51Loss::m_all, parts 3 and 4 removed (C51Loss as in 16)
                                                   // 19: ABI 10's and 11's Gemm fields and C51Loss::part
                                                   //     removed

/// The exported symbol every plugin defines (through DQN_PLUGIN_EXPORT below).
inline constexpr const char* kDescriptorSymbol = "dqn_plugin_descriptor";

enum class ParamType : std::int32_t { boolean = 0, integer = 1, number = 2, string = 3 };

/// One configurable key of a head. Defaults are given as text in YAML syntax ("0.2", "true").
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

enum class PluginKind : std::int32_t { head = 0 };

struct PluginDescriptor {
  std::uint32_t abi_version;      ///< must stay the first field
  std::uint32_t struct_size;      ///< sizeof(PluginDescriptor) as the plugin saw it
  const char* name;
  PluginKind kind;
  const char* version;
  const char* description;
  double default_budget;          ///< fraction an auxiliary takes unless the pipeline says
  std::int32_t can_be_primary;    ///< 1 when the head produces a*, m and td_error
  const ParamSchema* schema;
  std::uint32_t schema_len;
  /// Returns a new head or null; on failure writes a message into err (errlen bytes).
  Head* (*create)(const HeadCreateInfo* info, char* err, std::uint32_t errlen);
  void (*destroy)(Head* head);
};

}  // namespace dqn

/// Defines the exported descriptor symbol; use exactly once per plugin, at namespace scope.
/// A plain C function, so a plugin needs no Boost headers; the loader reads it with Boost.DLL.
#define DQN_PLUGIN_EXPORT(descriptor_object)                                                 \
  extern "C" __attribute__((visibility("default"))) const ::dqn::PluginDescriptor*         \
  dqn_plugin_descriptor() {                                                                \
    return &(descriptor_object);                                                           \
  }
