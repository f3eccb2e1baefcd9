/** @file head_base.hpp
 *  @brief A base for heads written in C++: it keeps the head's name, role, sizes and typed
 *  configuration values, names its buffers and stages, turns exceptions into the status codes and
 *  messages the plugin boundary carries (declare/bind: the head's error(); run: a failure of the
 *  stage on the backend), and DQN_HEAD_PLUGIN writes the descriptor. A head derived from it is
 *  its declarations and its mathematics:
 *
 *    class MyHead final : public dqn::HeadBase {
 *     public:
 *      explicit MyHead(const dqn::HeadCreateInfo& info) : HeadBase(info) { kappa_ = number("kappa"); }
 *      void build(dqn::BuildContext& ctx) override { ... buffer(ctx, own("x"), {B, D}); stage(ctx, 0, "loss", ...); }
 *      void resolve(const dqn::Resolver& r) override { x_ = real(r, own("x")); }
 *      void step(std::int32_t tag, dqn::Backend& be) override { ... }
 *    };
 *    DQN_HEAD_PLUGIN(MyHead, "my_head", "0.1.0", "what it computes", 0.1, false, kSchema)
 */
#pragma once

#include <cstdint>
#include <cstdio>
#include <exception>
#include <initializer_list>
#include <iterator>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "dqn/backend.hpp"
#include "dqn/head.hpp"
#include "dqn/param_values.hpp"
#include "dqn/plugin.hpp"
#include "dqn/policy_graph.hpp"

namespace dqn {

class HeadBase : public Head {
 public:
  /// Copies what the head needs of info (the values outlive create()). Throws on a value of the
  /// wrong type (the engine checked them against the schema).
  explicit HeadBase(const HeadCreateInfo& info)
      : name_(info.instance && *info.instance ? info.instance : "head"), role_(info.role), net_(*info.net),
        batch_(info.batch), gamma_n_(info.gamma_n), seed_(info.seed), budget_(info.budget),
        values_(name_, info.params, info.n_params) {}

  // --- the head's work (throw std::exception on a problem: the base reports it) ---
  /// Declares parameters, buffers and stages (Head::declare).
  virtual void build(BuildContext& ctx) = 0;
  /// Resolves every pointer the stages need (Head::bind).
  virtual void resolve(const Resolver& r) = 0;
  /// Runs the stage declared with `tag` (Head::run): never allocates, synchronises or looks up.
  virtual void step(std::int32_t tag, Backend& be) = 0;

  // --- Head, final ---
  int declare(BuildContext& ctx) noexcept final {
    return guard([&] { build(ctx); });
  }
  int bind(const Resolver& r) noexcept final {
    return guard([&] { resolve(r); });
  }
  void run(std::int32_t tag, Backend& be) noexcept final {
    try {
      step(tag, be);
    } catch (const std::exception& e) {
      be.fail(stage_name(tag).c_str(), e.what());
    } catch (...) {
      be.fail(stage_name(tag).c_str(), "unknown exception");
    }
  }
  const char* error() const noexcept final { return error_.c_str(); }

 protected:
  const std::string& name() const noexcept { return name_; }
  Role role() const noexcept { return role_; }
  bool primary() const noexcept { return role_ == Role::primary; }
  const NetworkDims& net() const noexcept { return net_; }
  int batch() const noexcept { return batch_; }
  float gamma_n() const noexcept { return gamma_n_; }
  std::uint64_t seed() const noexcept { return seed_; }
  double budget() const noexcept { return budget_; }

  // --- typed configuration values (the schema's keys, defaults filled in) ---
  double number(const char* key) const { return values_.number(key); }
  std::int64_t integer(const char* key) const { return values_.integer(key); }
  bool flag(const char* key) const { return values_.flag(key); }
  const std::string& text(const char* key) const { return values_.text(key); }

  // --- names ---
  /// "<head>/<n>": a buffer of this head's own.
  std::string own(const std::string& n) const { return name_ + "/" + n; }
  /// "loss/<head>" [1] and "dtrunk/<head>" [B,H2]: the engine's buffers this head writes.
  std::string loss_buffer() const { return "loss/" + name_; }
  std::string dtrunk_buffer() const { return "dtrunk/" + name_; }
  /// "grad/<head>/<param>": the gradient of a parameter in this head's row, for stage declarations.
  std::string grad_of(const std::string& param) const { return "grad/" + name_ + "/" + param; }
  /// "<head>.<what>": the name a stage declared with `what` gets.
  std::string stage_name(std::int32_t tag) const {
    const auto it = stages_.find(tag);
    return it != stages_.end() ? it->second : name_ + ".stage" + std::to_string(tag);
  }

  // --- declarations (throw when the engine refuses one, with its reason) ---
  /// The status of a declaration made on the BuildContext directly (bdq::declare_params, say):
  /// throws when the engine refused it (its reason is kept by the engine).
  static void accepted(int rc) { refused(rc); }
  void param(BuildContext& ctx, const std::string& n, std::int32_t rows, std::int32_t cols, std::int32_t fan_in,
             std::uint32_t flags = 0) {
    refused(ctx.param(n.c_str(), rows, cols, fan_in, flags));
  }
  void buffer(BuildContext& ctx, const std::string& n, std::initializer_list<std::int64_t> shape,
              BufferKind kind = BufferKind::scratch, DType dtype = DType::real) {
    const std::vector<std::int64_t> s(shape);
    refused(ctx.buffer(n.c_str(), dtype, s.data(), static_cast<std::int32_t>(s.size()), kind));
  }
  /// A stage of the training step named "<head>.<what>" that runs step(tag, ...).
  void stage(BuildContext& ctx, std::int32_t tag, const std::string& what, const std::vector<std::string>& reads,
             const std::vector<std::string>& writes) {
    stages_[tag] = name_ + "." + what;
    refused(declare_stage(ctx, stages_[tag], tag, reads, writes));
  }
  /// A stage of the act step (the primary's forward for acting: head.hpp, "The primary's contract").
  void act_stage(BuildContext& ctx, std::int32_t tag, const std::string& what, const std::vector<std::string>& reads,
                 const std::vector<std::string>& writes) {
    stages_[tag] = name_ + "." + what;
    refused(declare_stage(ctx, stages_[tag], tag, reads, writes, true));
  }

  // --- resolution (throw when a name is unknown: the engine's reason is kept) ---
  static Real real(const Resolver& r, const std::string& n) { return found(r.real(n.c_str()), n); }
  static std::int32_t* i32(const Resolver& r, const std::string& n) { return found(r.i32(n.c_str()), n); }
  static std::int64_t* i64(const Resolver& r, const std::string& n) { return found(r.i64(n.c_str()), n); }
  static Real online_param(const Resolver& r, const std::string& n) { return found(r.param(n.c_str()), n); }
  static Real target_param(const Resolver& r, const std::string& n) { return found(r.target(n.c_str()), n); }
  /// n's gradient in this head's row.
  static Real grad_param(const Resolver& r, const std::string& n) { return found(r.grad(n.c_str()), n); }

 private:
  /// A declaration the engine refused: its status, the message already kept by the engine.
  struct Refused {
    int rc;
  };

  static void refused(int rc) {
    if (rc != 0) throw Refused{rc};
  }
  template <class P>
  static P found(P p, const std::string& n) {
    if (!p) throw std::invalid_argument("'" + n + "' is not there");
    return p;
  }
  template <class F>
  int guard(F&& f) noexcept {
    try {
      f();
      return 0;
    } catch (const Refused& r) {
      if (error_.empty()) error_ = name_ + ": a declaration was refused";
      return r.rc;
    } catch (const std::exception& e) {
      error_ = name_ + ": " + e.what();
      return 1;
    } catch (...) {
      error_ = name_ + ": unknown exception";
      return 1;
    }
  }

  std::string name_;
  Role role_;
  NetworkDims net_;
  int batch_;
  float gamma_n_;
  std::uint64_t seed_;
  double budget_;
  ParamValues values_;
  std::map<std::int32_t, std::string> stages_;
  std::string error_;
};

/// create() of a plugin whose head is H: new H(*info), an exception's message into err.
template <class H>
Head* create_head(const HeadCreateInfo* info, char* err, std::uint32_t errlen) noexcept {
  try {
    return new H(*info);
  } catch (const std::exception& e) {
    std::snprintf(err, errlen, "%s", e.what());
  } catch (...) {
    std::snprintf(err, errlen, "unknown exception");
  }
  return nullptr;
}

template <class H>
void destroy_head(Head* h) noexcept {
  delete h;
}

/// export_policy() of a plugin whose head H has `static void export_policy(const HeadCreateInfo&,
/// PolicyGraph&)` (dqn/policy_graph.hpp): an exception's message goes to PolicyGraph::fail.
template <class H>
int export_head(const HeadCreateInfo* info, PolicyGraph* graph) noexcept {
  try {
    H::export_policy(*info, *graph);
    return 0;
  } catch (const std::exception& e) {
    graph->fail(e.what());
  } catch (...) {
    graph->fail("unknown exception");
  }
  return 1;
}

/// The descriptor's export_policy for H: export_head<H> where H declares export_policy, else null.
template <class H>
constexpr int (*export_fn())(const HeadCreateInfo*, PolicyGraph*) {
  if constexpr (requires(const HeadCreateInfo& i, PolicyGraph& g) { H::export_policy(i, g); })
    return &export_head<H>;
  else
    return nullptr;
}

}  // namespace dqn

/// The descriptor and its export for head class H (derived from dqn::HeadBase, constructed from
/// a HeadCreateInfo; a constructor that throws refuses the configuration with its message):
/// plugin name, version text, description, default budget of an auxiliary, whether it can be the
/// primary (then it keeps the contract in head.hpp), and its configuration schema (an array of
/// dqn::ParamSchema). A primary H that declares `static void export_policy(const HeadCreateInfo&,
/// PolicyGraph&)` can be exported (`dqn export`). DQN_HEAD_PLUGIN_NO_SCHEMA for a head without keys. Once per plugin, at
/// namespace scope.
#define DQN_HEAD_PLUGIN(H, plugin_name, version_text, description_text, default_budget, can_primary, schema_array) \
  namespace {                                                                                                   \
  const ::dqn::PluginDescriptor dqn_head_descriptor_{                                                           \
      ::dqn::kAbiMajor, ::dqn::kAbiMinor, sizeof(::dqn::PluginDescriptor), ::dqn::PluginKind::head, plugin_name, \
      version_text, description_text, default_budget, (can_primary) ? 1 : 0,                                     \
      static_cast<std::uint32_t>(std::size(schema_array)), schema_array, &::dqn::create_head<H>,                \
      &::dqn::destroy_head<H>, 0, nullptr, ::dqn::export_fn<H>()};                                              \
  }                                                                                                             \
  DQN_PLUGIN_EXPORT(dqn_head_descriptor_)

#define DQN_HEAD_PLUGIN_NO_SCHEMA(H, plugin_name, version_text, description_text, default_budget, can_primary)    \
  namespace {                                                                                                   \
  const ::dqn::PluginDescriptor dqn_head_descriptor_{                                                           \
      ::dqn::kAbiMajor, ::dqn::kAbiMinor, sizeof(::dqn::PluginDescriptor), ::dqn::PluginKind::head, plugin_name, \
      version_text, description_text, default_budget, (can_primary) ? 1 : 0, 0, nullptr, &::dqn::create_head<H>, \
      &::dqn::destroy_head<H>, 0, nullptr, ::dqn::export_fn<H>()};                                              \
  }                                                                                                             \
  DQN_PLUGIN_EXPORT(dqn_head_descriptor_)
