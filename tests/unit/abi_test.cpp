// Freezes the plugin ABI: sizes, field offsets and enum values of everything a plugin shares with
// the engine, the descriptor symbol, and the virtual-slot order of the interfaces a plugin calls
// or implements. A failure here means a plugin built against the old headers would break: either
// undo the change or bump the version (kAbiMajor, or kAbiMinor for an append: plugin.hpp says which)
// and update these tables together.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "dqn/backend.hpp"
#include "dqn/env.hpp"
#include "dqn/head.hpp"
#include "dqn/plugin.hpp"
#include "dqn/policy_graph.hpp"

using namespace dqn;

namespace {

// The numbers below are the LP64 layout (x86-64 and aarch64 Linux, the only targets).
static_assert(sizeof(void*) == 8, "the ABI tables are for LP64 targets");

struct Row {
  const char* what;
  std::size_t actual, expected;
  const char* why;
};

void check_rows(const std::vector<Row>& rows) {
  for (const Row& r : rows) {
    INFO(std::string(r.what) << " — " << std::string(r.why));
    CHECK(r.actual == r.expected);
  }
}

// A test-local descriptor, exported through the SDK macro exactly as a plugin does it.
const PluginDescriptor kSelf{kAbiMajor, kAbiMinor, sizeof(PluginDescriptor), PluginKind::head, "abi_self", "0",
                             "the ABI test's own descriptor", 0.0, 0, 0, nullptr, nullptr, nullptr, 0, nullptr, nullptr};

}  // namespace

DQN_PLUGIN_EXPORT(kSelf)

// What the macro must have declared: a C-linkage function of exactly this name and type.
extern "C" const dqn::PluginDescriptor* dqn_plugin_descriptor();

TEST_CASE("abi.version") {
  CHECK(kAbiMajor == 21u);  // bump together with every table in this file
  CHECK(kAbiMinor == 2u);
  CHECK(std::is_same_v<std::remove_cv_t<decltype(kAbiMajor)>, std::uint32_t>);
  CHECK(std::is_same_v<std::remove_cv_t<decltype(kAbiMinor)>, std::uint32_t>);
  // A head's fields were all there at minor 0, so an older minor's head descriptor is whole; the
  // environment fields came in 21.1, export_policy in 21.2.
  CHECK(kDescriptorSizeMinor0 == offsetof(PluginDescriptor, env_count));
  CHECK(kDescriptorSizeMinor1 == offsetof(PluginDescriptor, export_policy));
  CHECK(kDescriptorSizeMinor2 == sizeof(PluginDescriptor));
}

TEST_CASE("abi.descriptor_symbol") {
  CHECK(std::string(kDescriptorSymbol) == "dqn_plugin_descriptor");
  CHECK(std::is_same_v<decltype(&dqn_plugin_descriptor), const PluginDescriptor* (*)()>);
  // The macro's function returns the object it was given.
  CHECK(dqn_plugin_descriptor() == &kSelf);
  CHECK(std::string(dqn_plugin_descriptor()->name) == "abi_self");
}

TEST_CASE("abi.descriptor_layout") {
  CHECK(std::is_standard_layout_v<PluginDescriptor>);
  CHECK(std::is_trivially_copyable_v<PluginDescriptor>);
  check_rows({
      {"sizeof(PluginDescriptor)", sizeof(PluginDescriptor), 104, "the struct_size every plugin records (80 at 21.0, 96 at 21.1)"},
      {"abi_major", offsetof(PluginDescriptor, abi_major), 0, "must stay first: read before anything else"},
      {"abi_minor", offsetof(PluginDescriptor, abi_minor), 4, "read with abi_major"},
      {"struct_size", offsetof(PluginDescriptor, struct_size), 8, "checked third"},
      {"kind", offsetof(PluginDescriptor, kind), 12, ""},
      {"name", offsetof(PluginDescriptor, name), 16, ""},
      {"version", offsetof(PluginDescriptor, version), 24, ""},
      {"description", offsetof(PluginDescriptor, description), 32, ""},
      {"default_budget", offsetof(PluginDescriptor, default_budget), 40, ""},
      {"can_be_primary", offsetof(PluginDescriptor, can_be_primary), 48, ""},
      {"schema_len", offsetof(PluginDescriptor, schema_len), 52, ""},
      {"schema", offsetof(PluginDescriptor, schema), 56, ""},
      {"create", offsetof(PluginDescriptor, create), 64, ""},
      {"destroy", offsetof(PluginDescriptor, destroy), 72, "last field of minor 0"},
      {"env_count", offsetof(PluginDescriptor, env_count), 80, "appended in 21.1"},
      {"envs", offsetof(PluginDescriptor, envs), 88, "after 4 bytes of padding; last field of 21.1"},
      {"export_policy", offsetof(PluginDescriptor, export_policy), 96, "appended in 21.2"},
  });
}

TEST_CASE("abi.policy_graph_layout") {
  CHECK(std::is_standard_layout_v<GraphAttr>);
  check_rows({
      {"sizeof(GraphAttr)", sizeof(GraphAttr), 48, "a head's export hands these to PolicyGraph::node (21.2)"},
      {"GraphAttr::name", offsetof(GraphAttr, name), 0, ""},
      {"GraphAttr::kind", offsetof(GraphAttr, kind), 8, ""},
      {"GraphAttr::i", offsetof(GraphAttr, i), 16, ""},
      {"GraphAttr::f", offsetof(GraphAttr, f), 24, ""},
      {"GraphAttr::ints", offsetof(GraphAttr, ints), 32, ""},
      {"GraphAttr::n_ints", offsetof(GraphAttr, n_ints), 40, ""},
  });
}

TEST_CASE("abi.environment_layout") {
  CHECK(std::is_standard_layout_v<EnvBranch>);
  CHECK(std::is_standard_layout_v<EnvSpec>);
  CHECK(std::is_standard_layout_v<EnvStep>);
  CHECK(std::is_standard_layout_v<EnvCreateInfo>);
  CHECK(std::is_standard_layout_v<EnvDescriptor>);
  check_rows({
      {"sizeof(EnvBranch)", sizeof(EnvBranch), 32, "an environment's spec points at an array of these"},
      {"EnvBranch::bins", offsetof(EnvBranch, bins), 0, ""},
      {"EnvBranch::continuous", offsetof(EnvBranch, continuous), 4, ""},
      {"EnvBranch::lo", offsetof(EnvBranch, lo), 8, ""},
      {"EnvBranch::hi", offsetof(EnvBranch, hi), 16, ""},
      {"EnvBranch::name", offsetof(EnvBranch, name), 24, ""},
      {"sizeof(EnvSpec)", sizeof(EnvSpec), 32, ""},
      {"EnvSpec::name", offsetof(EnvSpec, name), 0, ""},
      {"EnvSpec::obs_dim", offsetof(EnvSpec, obs_dim), 8, ""},
      {"EnvSpec::n_branches", offsetof(EnvSpec, n_branches), 12, ""},
      {"EnvSpec::branches", offsetof(EnvSpec, branches), 16, ""},
      {"EnvSpec::max_episode_steps", offsetof(EnvSpec, max_episode_steps), 24, ""},
      {"EnvSpec::reports_success", offsetof(EnvSpec, reports_success), 28, ""},
      {"sizeof(EnvStep)", sizeof(EnvStep), 64, "the engine hands one to every step() call"},
      {"EnvStep::actions", offsetof(EnvStep, actions), 0, ""},
      {"EnvStep::next_obs", offsetof(EnvStep, next_obs), 8, ""},
      {"EnvStep::rewards", offsetof(EnvStep, rewards), 16, ""},
      {"EnvStep::terminated", offsetof(EnvStep, terminated), 24, ""},
      {"EnvStep::truncated", offsetof(EnvStep, truncated), 32, ""},
      {"EnvStep::final_obs", offsetof(EnvStep, final_obs), 40, ""},
      {"EnvStep::success", offsetof(EnvStep, success), 48, ""},
      {"EnvStep::unstable", offsetof(EnvStep, unstable), 56, ""},
      {"sizeof(EnvCreateInfo)", sizeof(EnvCreateInfo), 40, ""},
      {"EnvCreateInfo::task", offsetof(EnvCreateInfo, task), 0, ""},
      {"EnvCreateInfo::num_envs", offsetof(EnvCreateInfo, num_envs), 8, ""},
      {"EnvCreateInfo::seed", offsetof(EnvCreateInfo, seed), 16, ""},
      {"EnvCreateInfo::params", offsetof(EnvCreateInfo, params), 24, ""},
      {"EnvCreateInfo::n_params", offsetof(EnvCreateInfo, n_params), 32, ""},
      {"sizeof(EnvDescriptor)", sizeof(EnvDescriptor), 48, "plugins export arrays of these"},
      {"EnvDescriptor::task", offsetof(EnvDescriptor, task), 0, ""},
      {"EnvDescriptor::description", offsetof(EnvDescriptor, description), 8, ""},
      {"EnvDescriptor::schema_len", offsetof(EnvDescriptor, schema_len), 16, ""},
      {"EnvDescriptor::schema", offsetof(EnvDescriptor, schema), 24, ""},
      {"EnvDescriptor::create", offsetof(EnvDescriptor, create), 32, ""},
      {"EnvDescriptor::destroy", offsetof(EnvDescriptor, destroy), 40, ""},
  });
}

TEST_CASE("abi.param_schema_and_value_layout") {
  CHECK(std::is_standard_layout_v<ParamSchema>);
  CHECK(std::is_standard_layout_v<ParamValue>);
  check_rows({
      {"sizeof(ParamSchema)", sizeof(ParamSchema), 48, "plugins export arrays of these"},
      {"ParamSchema::key", offsetof(ParamSchema, key), 0, ""},
      {"ParamSchema::type", offsetof(ParamSchema, type), 8, ""},
      {"ParamSchema::default_value", offsetof(ParamSchema, default_value), 16, ""},
      {"ParamSchema::doc", offsetof(ParamSchema, doc), 24, ""},
      {"ParamSchema::min", offsetof(ParamSchema, min), 32, ""},
      {"ParamSchema::max", offsetof(ParamSchema, max), 40, ""},
      {"sizeof(ParamValue)", sizeof(ParamValue), 40, "the engine passes arrays of these to create()"},
      {"ParamValue::key", offsetof(ParamValue, key), 0, ""},
      {"ParamValue::type", offsetof(ParamValue, type), 8, ""},
      {"ParamValue::i", offsetof(ParamValue, i), 16, "booleans and integers"},
      {"ParamValue::d", offsetof(ParamValue, d), 24, ""},
      {"ParamValue::s", offsetof(ParamValue, s), 32, ""},
  });
}

TEST_CASE("abi.network_dims_and_create_info_layout") {
  CHECK(std::is_standard_layout_v<NetworkDims>);
  CHECK(std::is_standard_layout_v<HeadCreateInfo>);
  CHECK(kMaxTrunkLayers == 8);  // the size of NetworkDims::trunk
  check_rows({
      {"sizeof(NetworkDims)", sizeof(NetworkDims), 64, ""},
      {"NetworkDims::state", offsetof(NetworkDims, state), 0, ""},
      {"NetworkDims::trunk_layers", offsetof(NetworkDims, trunk_layers), 4, ""},
      {"NetworkDims::trunk", offsetof(NetworkDims, trunk), 8, "kMaxTrunkLayers i32s"},
      {"NetworkDims::head_hidden", offsetof(NetworkDims, head_hidden), 40, "right after trunk[8]"},
      {"NetworkDims::branches", offsetof(NetworkDims, branches), 44, ""},
      {"NetworkDims::actions", offsetof(NetworkDims, actions), 48, ""},
      {"NetworkDims::atoms", offsetof(NetworkDims, atoms), 52, ""},
      {"NetworkDims::v_min", offsetof(NetworkDims, v_min), 56, ""},
      {"NetworkDims::v_max", offsetof(NetworkDims, v_max), 60, ""},
      {"sizeof(HeadCreateInfo)", sizeof(HeadCreateInfo), 64, ""},
      {"HeadCreateInfo::instance", offsetof(HeadCreateInfo, instance), 0, ""},
      {"HeadCreateInfo::role", offsetof(HeadCreateInfo, role), 8, ""},
      {"HeadCreateInfo::budget", offsetof(HeadCreateInfo, budget), 16, ""},
      {"HeadCreateInfo::net", offsetof(HeadCreateInfo, net), 24, ""},
      {"HeadCreateInfo::batch", offsetof(HeadCreateInfo, batch), 32, ""},
      {"HeadCreateInfo::gamma_n", offsetof(HeadCreateInfo, gamma_n), 36, ""},
      {"HeadCreateInfo::seed", offsetof(HeadCreateInfo, seed), 40, ""},
      {"HeadCreateInfo::params", offsetof(HeadCreateInfo, params), 48, ""},
      {"HeadCreateInfo::n_params", offsetof(HeadCreateInfo, n_params), 56, ""},
  });
}

TEST_CASE("abi.stage_desc_layout") {
  CHECK(std::is_standard_layout_v<StageDesc>);
  check_rows({
      {"sizeof(StageDesc)", sizeof(StageDesc), 48, "heads build these on their stack"},
      {"StageDesc::name", offsetof(StageDesc, name), 0, ""},
      {"StageDesc::tag", offsetof(StageDesc, tag), 8, ""},
      {"StageDesc::reads", offsetof(StageDesc, reads), 16, ""},
      {"StageDesc::n_reads", offsetof(StageDesc, n_reads), 24, ""},
      {"StageDesc::writes", offsetof(StageDesc, writes), 32, ""},
      {"StageDesc::n_writes", offsetof(StageDesc, n_writes), 40, ""},
  });
}

TEST_CASE("abi.op_argument_layout") {
  CHECK(std::is_standard_layout_v<Real>);
  CHECK(std::is_trivially_copyable_v<Real>);
  CHECK(std::is_standard_layout_v<Gemm>);
  CHECK(std::is_standard_layout_v<HeadForward>);
  CHECK(std::is_standard_layout_v<HeadBackward>);
  CHECK(std::is_standard_layout_v<DeviceContext>);
  check_rows({
      {"sizeof(Real)", sizeof(Real), 16, "passed by value through every op"},
      {"Real::p", offsetof(Real, p), 0, ""},
      {"Real::esize", offsetof(Real, esize), 8, ""},
      {"sizeof(Gemm)", sizeof(Gemm), 248, "heads fill these for every dense layer"},
      {"Gemm::ta", offsetof(Gemm, ta), 0, ""},
      {"Gemm::tb", offsetof(Gemm, tb), 1, ""},
      {"Gemm::m", offsetof(Gemm, m), 4, ""},
      {"Gemm::n", offsetof(Gemm, n), 8, ""},
      {"Gemm::k", offsetof(Gemm, k), 12, ""},
      {"Gemm::alpha", offsetof(Gemm, alpha), 16, ""},
      {"Gemm::a", offsetof(Gemm, a), 24, "Real is 8-aligned"},
      {"Gemm::lda", offsetof(Gemm, lda), 40, ""},
      {"Gemm::b", offsetof(Gemm, b), 48, ""},
      {"Gemm::ldb", offsetof(Gemm, ldb), 64, ""},
      {"Gemm::beta", offsetof(Gemm, beta), 68, ""},
      {"Gemm::c", offsetof(Gemm, c), 72, ""},
      {"Gemm::ldc", offsetof(Gemm, ldc), 88, ""},
      {"Gemm::batch", offsetof(Gemm, batch), 92, ""},
      {"Gemm::stride_a", offsetof(Gemm, stride_a), 96, ""},
      {"Gemm::stride_b", offsetof(Gemm, stride_b), 104, ""},
      {"Gemm::stride_c", offsetof(Gemm, stride_c), 112, ""},
      {"Gemm::weight_operand", offsetof(Gemm, weight_operand), 120, ""},
      {"Gemm::bias", offsetof(Gemm, bias), 128, "after 4 bytes of padding"},
      {"Gemm::stride_bias", offsetof(Gemm, stride_bias), 144, ""},
      {"Gemm::act", offsetof(Gemm, act), 152, "then 4 bytes of padding"},
      {"Gemm::mask", offsetof(Gemm, mask), 160, ""},
      {"Gemm::ldmask", offsetof(Gemm, ldmask), 176, ""},
      {"Gemm::mask_rows", offsetof(Gemm, mask_rows), 180, ""},
      {"Gemm::stride_mask", offsetof(Gemm, stride_mask), 184, ""},
      {"Gemm::batch2", offsetof(Gemm, batch2), 192, "then 4 bytes of padding"},
      {"Gemm::stride2_a", offsetof(Gemm, stride2_a), 200, ""},
      {"Gemm::stride2_b", offsetof(Gemm, stride2_b), 208, ""},
      {"Gemm::stride2_c", offsetof(Gemm, stride2_c), 216, ""},
      {"Gemm::stride2_bias", offsetof(Gemm, stride2_bias), 224, ""},
      {"Gemm::stride2_mask", offsetof(Gemm, stride2_mask), 232, ""},
      {"Gemm::sum_batch", offsetof(Gemm, sum_batch), 240, "then 4 bytes of padding"},
      {"sizeof(HeadForward)", sizeof(HeadForward), 264, ""},
      {"HeadForward::x", offsetof(HeadForward, x), 0, ""},
      {"HeadForward::ldx", offsetof(HeadForward, ldx), 16, ""},
      {"HeadForward::w1", offsetof(HeadForward, w1), 24, "after 4 bytes of padding"},
      {"HeadForward::bb2", offsetof(HeadForward, bb2), 104, ""},
      {"HeadForward::hidden", offsetof(HeadForward, hidden), 120, ""},
      {"HeadForward::v", offsetof(HeadForward, v), 136, ""},
      {"HeadForward::ldv", offsetof(HeadForward, ldv), 152, ""},
      {"HeadForward::adv", offsetof(HeadForward, adv), 160, ""},
      {"HeadForward::logp", offsetof(HeadForward, logp), 176, ""},
      {"HeadForward::q", offsetof(HeadForward, q), 192, ""},
      {"HeadForward::a_star", offsetof(HeadForward, a_star), 208, ""},
      {"HeadForward::star_from", offsetof(HeadForward, star_from), 216, ""},
      {"HeadForward::rows", offsetof(HeadForward, rows), 220, ""},
      {"HeadForward::v_max", offsetof(HeadForward, v_max), 248, ""},
      {"HeadForward::ldadv", offsetof(HeadForward, ldadv), 252, ""},
      {"HeadForward::wv2_rows", offsetof(HeadForward, wv2_rows), 256, ""},
      {"HeadForward::wb2_rows", offsetof(HeadForward, wb2_rows), 260, "last field"},
      {"sizeof(HeadBackward)", sizeof(HeadBackward), 136, ""},
      {"HeadBackward::dv", offsetof(HeadBackward, dv), 0, ""},
      {"HeadBackward::lddv", offsetof(HeadBackward, lddv), 16, ""},
      {"HeadBackward::dadv", offsetof(HeadBackward, dadv), 24, "after 4 bytes of padding"},
      {"HeadBackward::wv2", offsetof(HeadBackward, wv2), 40, ""},
      {"HeadBackward::wb2", offsetof(HeadBackward, wb2), 56, ""},
      {"HeadBackward::hidden", offsetof(HeadBackward, hidden), 72, ""},
      {"HeadBackward::dhidden", offsetof(HeadBackward, dhidden), 88, ""},
      {"HeadBackward::rows", offsetof(HeadBackward, rows), 104, ""},
      {"HeadBackward::Z", offsetof(HeadBackward, Z), 120, ""},
      {"HeadBackward::lddadv", offsetof(HeadBackward, lddadv), 124, ""},
      {"HeadBackward::wb2_rows", offsetof(HeadBackward, wb2_rows), 128, "last field"},
      {"sizeof(DeviceContext)", sizeof(DeviceContext), 48, "Backend::device() hands plugins a pointer to one"},
      {"DeviceContext::stream", offsetof(DeviceContext, stream), 0, ""},
      {"DeviceContext::device", offsetof(DeviceContext, device), 8, ""},
      {"DeviceContext::sm_count", offsetof(DeviceContext, sm_count), 12, ""},
      {"DeviceContext::cc_major", offsetof(DeviceContext, cc_major), 16, ""},
      {"DeviceContext::cc_minor", offsetof(DeviceContext, cc_minor), 20, ""},
      {"DeviceContext::pdl_max_shared", offsetof(DeviceContext, pdl_max_shared), 24, ""},
      {"DeviceContext::planning", offsetof(DeviceContext, planning), 32, ""},
      {"DeviceContext::precision", offsetof(DeviceContext, precision), 36, ""},
      {"DeviceContext::max_shared_optin", offsetof(DeviceContext, max_shared_optin), 40, ""},
      {"DeviceContext::reserved", offsetof(DeviceContext, reserved), 44, "last field"},
  });
  // Defaults a plugin relies on when it fills only some fields.
  const Gemm g;
  CHECK(g.alpha == 1.0f);
  CHECK(g.beta == 0.0f);
  CHECK(g.batch == 1);
  CHECK(!g.bias);
  CHECK(g.stride_bias == 0);
  CHECK(g.act == Act::none);
  CHECK(Real{}.esize == 4u);
}

TEST_CASE("abi.enum_values") {
  // Every enum crossing the boundary is 32 bits with fixed values.
  check_rows({
      {"sizeof(ParamType)", sizeof(ParamType), 4, ""},
      {"sizeof(Role)", sizeof(Role), 4, ""},
      {"sizeof(PluginKind)", sizeof(PluginKind), 4, ""},
      {"sizeof(StateType)", sizeof(StateType), 4, ""},
      {"sizeof(DType)", sizeof(DType), 4, ""},
      {"sizeof(BufferKind)", sizeof(BufferKind), 4, ""},
      {"sizeof(Act)", sizeof(Act), 4, ""},
  });
  struct E {
    const char* what;
    std::int64_t actual, expected;
  };
  const E values[] = {
      {"ParamType::boolean", std::int64_t(ParamType::boolean), 0},
      {"ParamType::integer", std::int64_t(ParamType::integer), 1},
      {"ParamType::number", std::int64_t(ParamType::number), 2},
      {"ParamType::string", std::int64_t(ParamType::string), 3},
      {"Role::primary", std::int64_t(Role::primary), 0},
      {"Role::auxiliary", std::int64_t(Role::auxiliary), 1},
      {"PluginKind::head", std::int64_t(PluginKind::head), 0},
      {"PluginKind::environment", std::int64_t(PluginKind::environment), 1},
      {"StateType::f64", std::int64_t(StateType::f64), 0},
      {"StateType::f32", std::int64_t(StateType::f32), 1},
      {"StateType::i32", std::int64_t(StateType::i32), 2},
      {"StateType::i64", std::int64_t(StateType::i64), 3},
      {"StateType::u8", std::int64_t(StateType::u8), 4},
      {"StateType::u64", std::int64_t(StateType::u64), 5},
      {"DType::real", std::int64_t(DType::real), 0},
      {"DType::i32", std::int64_t(DType::i32), 1},
      {"DType::i64", std::int64_t(DType::i64), 2},
      {"BufferKind::parameter", std::int64_t(BufferKind::parameter), 0},
      {"BufferKind::gradient", std::int64_t(BufferKind::gradient), 1},
      {"BufferKind::optimizer", std::int64_t(BufferKind::optimizer), 2},
      {"BufferKind::activation", std::int64_t(BufferKind::activation), 3},
      {"BufferKind::scratch", std::int64_t(BufferKind::scratch), 4},
      {"BufferKind::input", std::int64_t(BufferKind::input), 5},
      {"BufferKind::report", std::int64_t(BufferKind::report), 6},
      {"Act::none", std::int64_t(Act::none), 0},
      {"Act::relu", std::int64_t(Act::relu), 1},
      {"kParamSpectralNorm", std::int64_t(kParamSpectralNorm), 1},
      {"kParamAlign", std::int64_t(kParamAlign), 2},
      {"kParamAlignElems", kParamAlignElems, 4},
  };
  for (const E& e : values) {
    INFO(std::string(e.what));
    CHECK(e.actual == e.expected);
  }
}

TEST_CASE("abi.engine_buffer_names") {
  // Names heads hard-code to find the engine's buffers.
  const std::pair<const char*, const char*> names[] = {
      {buf::states2, "batch/states2"},   {buf::actions, "batch/actions"},   {buf::rewards, "batch/rewards"},
      {buf::dones, "batch/dones"},       {buf::is_weights, "batch/is_weights"}, {buf::h2, "trunk/h2"},
      {buf::target_h2, "target/h2"},     {buf::step, "opt/t"},              {buf::a_star, "target/a_star"},
      {buf::td_error, "report/td_error"}, {buf::act_h2, "act/h2"},          {buf::act_q, "act/q"},
  };
  for (const auto& [actual, expected] : names) CHECK(std::string(actual) == expected);
}

#if defined(__x86_64__) && defined(__GNUC__)
namespace {
// Itanium C++ ABI (x86-64): a pointer to a virtual member function holds 1 + the byte offset of
// its vtable slot. The slot order is what a plugin's compiled calls and overrides rely on.
template <class M>
std::size_t slot_of(M m) {
  static_assert(sizeof(M) == 2 * sizeof(std::ptrdiff_t));
  std::ptrdiff_t words[2];
  std::memcpy(words, &m, sizeof words);
  REQUIRE((words[0] & 1) == 1);  // virtual
  return std::size_t(words[0] - 1) / sizeof(void*);
}
}  // namespace

TEST_CASE("abi.interface_vtable_slots") {
  // Slots 0 and 1 are the (complete and deleting) virtual destructors of Head and Backend.
  check_rows({
      {"Head::declare", slot_of(&Head::declare), 2, "plugins override these four"},
      {"Head::bind", slot_of(&Head::bind), 3, ""},
      {"Head::run", slot_of(&Head::run), 4, ""},
      {"Head::error", slot_of(&Head::error), 5, ""},
      {"BuildContext::net", slot_of(&BuildContext::net), 0, "plugins call these; no virtual destructor"},
      {"BuildContext::batch", slot_of(&BuildContext::batch), 1, ""},
      {"BuildContext::param", slot_of(&BuildContext::param), 2, ""},
      {"BuildContext::buffer", slot_of(&BuildContext::buffer), 3, ""},
      {"BuildContext::stage", slot_of(&BuildContext::stage), 4, ""},
      {"BuildContext::fail", slot_of(&BuildContext::fail), 5, ""},
      {"BuildContext::act_rows", slot_of(&BuildContext::act_rows), 6, ""},
      {"BuildContext::act_stage", slot_of(&BuildContext::act_stage), 7, ""},
      {"BuildContext::batch_offset", slot_of(&BuildContext::batch_offset), 8, ""},
      {"Resolver::real", slot_of(&Resolver::real), 0, ""},
      {"Resolver::i32", slot_of(&Resolver::i32), 1, ""},
      {"Resolver::i64", slot_of(&Resolver::i64), 2, ""},
      {"Resolver::param", slot_of(&Resolver::param), 3, ""},
      {"Resolver::target", slot_of(&Resolver::target), 4, ""},
      {"Resolver::grad", slot_of(&Resolver::grad), 5, ""},
      {"Resolver::act_param", slot_of(&Resolver::act_param), 6, ""},
      {"Backend::name", slot_of(&Backend::name), 2, "the op table, in header order"},
      {"Backend::real_size", slot_of(&Backend::real_size), 3, ""},
      {"Backend::is_device", slot_of(&Backend::is_device), 4, ""},
      {"Backend::device", slot_of(&Backend::device), 5, "what a head's own kernels launch through"},
      {"Backend::status", slot_of(&Backend::status), 6, ""},
      {"Backend::message", slot_of(&Backend::message), 7, ""},
      {"Backend::fail", slot_of(&Backend::fail), 8, "what a head's own ops report through"},
      {"Backend::gemm", slot_of(&Backend::gemm), 9, ""},
      {"Backend::bias_act", slot_of(&Backend::bias_act), 10, ""},
      {"Backend::relu_backward", slot_of(&Backend::relu_backward), 11, ""},
      {"Backend::bias_grad", slot_of(&Backend::bias_grad), 12, ""},
      {"Backend::relu_bias_grad", slot_of(&Backend::relu_bias_grad), 13, ""},
      {"Backend::dueling_combine", slot_of(&Backend::dueling_combine), 14, ""},
      {"Backend::dueling_backward", slot_of(&Backend::dueling_backward), 15, ""},
      {"Backend::log_softmax", slot_of(&Backend::log_softmax), 16, ""},
      {"Backend::expected_q", slot_of(&Backend::expected_q), 17, ""},
      {"Backend::expected_q_backward", slot_of(&Backend::expected_q_backward), 18, ""},
      {"Backend::argmax", slot_of(&Backend::argmax), 19, ""},
      {"Backend::dueling_dist", slot_of(&Backend::dueling_dist), 20, ""},
      {"Backend::head_forward", slot_of(&Backend::head_forward), 21, ""},
      {"Backend::head_backward_inputs", slot_of(&Backend::head_backward_inputs), 22, ""},
      {"Backend::weighted_mean", slot_of(&Backend::weighted_mean), 23, ""},
      {"Backend::fill", slot_of(&Backend::fill), 24, ""},
      {"Backend::copy", slot_of(&Backend::copy), 25, ""},
      {"Backend::axpy", slot_of(&Backend::axpy), 26, ""},
      {"Backend::uniform", slot_of(&Backend::uniform), 27, ""},
      {"Backend::uniform_from", slot_of(&Backend::uniform_from), 28, "the last slot of 21.0"},
      {"Env::spec", slot_of(&Env::spec), 2, "environment plugins override these (21.1)"},
      {"Env::num_envs", slot_of(&Env::num_envs), 3, ""},
      {"Env::reset", slot_of(&Env::reset), 4, ""},
      {"Env::step", slot_of(&Env::step), 5, ""},
      {"Env::save_state", slot_of(&Env::save_state), 6, ""},
      {"Env::load_state", slot_of(&Env::load_state), 7, ""},
      {"StateWriter::put", slot_of(&StateWriter::put), 0, "environments call these; no virtual destructor"},
      {"StateWriter::fail", slot_of(&StateWriter::fail), 1, ""},
      {"StateReader::get", slot_of(&StateReader::get), 0, ""},
      {"StateReader::fail", slot_of(&StateReader::fail), 1, ""},
      {"StateReader::source", slot_of(&StateReader::source), 2, ""},
      {"PolicyGraph::trunk_output", slot_of(&PolicyGraph::trunk_output), 0, "a head's export calls these (21.2)"},
      {"PolicyGraph::param", slot_of(&PolicyGraph::param), 1, ""},
      {"PolicyGraph::constant", slot_of(&PolicyGraph::constant), 2, ""},
      {"PolicyGraph::constant_i64", slot_of(&PolicyGraph::constant_i64), 3, ""},
      {"PolicyGraph::node", slot_of(&PolicyGraph::node), 4, ""},
      {"PolicyGraph::q_values", slot_of(&PolicyGraph::q_values), 5, ""},
      {"PolicyGraph::manifest", slot_of(&PolicyGraph::manifest), 6, ""},
      {"PolicyGraph::fail", slot_of(&PolicyGraph::fail), 7, ""},
  });
}
#endif
