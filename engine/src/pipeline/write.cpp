/** @file write.cpp
 *  @brief to_yaml: the resolved pipeline written back from the schema table (every key, in table
 *  order), the heads with their params, re-parseable to an equal spec.
 */
#include <sstream>
#include <string>
#include <vector>

#include "dqn/env.hpp"
#include "pipeline/head_params.hpp"
#include "pipeline/parse.hpp"
#include "pipeline/schema.hpp"
#include "pipeline/text.hpp"

namespace dqn {
namespace {

using namespace dsl;
using Type = PipelineKey::Type;

std::string yaml_key(const std::string& k) { return is_identifier(k) ? k : quote(k); }

std::string yaml_param(const HeadParam& p) {
  if (auto s = std::get_if<std::string>(&p)) return quote(*s);
  return param_text(p);
}

void write_heads(std::ostringstream& o, const PipelineSpec& spec, const PluginCatalog* catalog) {
  for (std::size_t i = 0; i < spec.heads.size(); ++i) {
    const HeadSpec& h = spec.heads[i];
    o << "  - plugin: " << quote(h.plugin) << "\n";
    o << "    name: " << quote(h.name) << "\n";
    o << "    role: " << to_string(h.role) << "\n";
    o << "    enabled: " << (h.enabled ? "true" : "false") << "\n";
    if (h.role == Role::primary) {
      try {
        o << "    # budget: what the enabled auxiliaries leave (" << fmt(resolved_budget(spec, i)) << ")\n";
      } catch (const std::exception&) {
        o << "    # budget: what the enabled auxiliaries leave\n";
      }
    } else if (h.budget >= 0) {
      o << "    budget: " << format_double(h.budget) << "\n";
    } else {
      o << "    # budget: the plugin's default\n";
    }
    const PluginDescriptor* desc = catalog ? catalog->find(h.plugin) : nullptr;
    if (desc) {
      std::vector<std::string> storage;
      std::vector<ParamValue> vals = resolve_head_params(h, *desc, storage);
      for (std::uint32_t k = 0; k < desc->schema_len; ++k) {
        const ParamSchema& s = desc->schema[k];
        const ParamValue& v = vals[k];
        std::string text = s.type == ParamType::string ? quote(v.s) : std::string(v.s);
        o << "    " << yaml_key(s.key) << ": " << text;
        if (s.doc && *s.doc) o << "  # " << s.doc;
        o << "\n";
      }
    } else {
      for (const auto& [k, v] : h.params) o << "    " << yaml_key(k) << ": " << yaml_param(v) << "\n";
    }
  }
}

/// training.env as a map of plugin, task and options (the task's whole schema, documented, where
/// the catalog has the plugin), or the task's name alone for a program's own, or "" for none.
void write_env(std::ostringstream& o, const PipelineSpec& spec, const PluginCatalog* catalog, const std::string& indent) {
  const EnvChoice& e = spec.training.env;
  if (e.none()) {
    o << " \"\"\n";
    return;
  }
  if (e.plugin.empty() && e.options.empty()) {
    o << " " << quote(e.task) << "\n";
    return;
  }
  o << "\n";
  if (!e.plugin.empty()) o << indent << "  plugin: " << quote(e.plugin) << "\n";
  if (!e.task.empty()) o << indent << "  task: " << quote(e.task) << "\n";
  const PluginDescriptor* d = catalog && !e.plugin.empty() ? catalog->find(e.plugin) : nullptr;
  const EnvDescriptor* task = nullptr;
  if (d && d->kind == PluginKind::environment && d->struct_size >= kDescriptorSizeMinor1)
    for (std::uint32_t i = 0; i < d->env_count; ++i)
      if (d->envs[i].task && e.task == d->envs[i].task) task = &d->envs[i];
  if (task) {
    std::vector<std::string> storage;
    const std::vector<ParamValue> vals = resolve_env_options(e, *task, storage);
    for (std::uint32_t k = 0; k < task->schema_len; ++k) {
      const ParamSchema& s = task->schema[k];
      o << indent << "  " << yaml_key(s.key) << ": " << (s.type == ParamType::string ? quote(vals[k].s) : vals[k].s);
      if (s.doc && *s.doc) o << "  # " << s.doc;
      o << "\n";
    }
  } else {
    for (const auto& [k, v] : e.options) o << indent << "  " << yaml_key(k) << ": " << yaml_param(v) << "\n";
  }
}

/// Every key of `section` that the spec writes, nested two spaces a level.
void write_section(std::ostringstream& o, const PipelineSpec& spec, const PluginCatalog* catalog,
                   const std::string& section, int depth) {
  const std::string indent(2 * static_cast<std::size_t>(depth), ' ');
  for (const PipelineKey* k : child_keys(section)) {
    if (k->written && !k->written(spec)) continue;
    o << indent << k->name() << ":";
    if (k->type == Type::section) {
      o << "\n";
      write_section(o, spec, catalog, k->path, depth + 1);
    } else if (k->type == Type::heads) {
      o << "\n";
      write_heads(o, spec, catalog);
    } else if (k->type == Type::env) {
      write_env(o, spec, catalog, indent);
    } else {
      o << " " << value_text(*k, k->get(spec)) << "\n";
    }
  }
}

std::string write_yaml(const PipelineSpec& spec, const PluginCatalog* catalog) {
  std::ostringstream o;
  o << "# dqn-engine pipeline, fully resolved\n";
  write_section(o, spec, catalog, "", 0);
  return o.str();
}

}  // namespace

std::string to_yaml(const PipelineSpec& spec) { return write_yaml(spec, nullptr); }

std::string to_yaml(const PipelineSpec& spec, const PluginCatalog& plugins) { return write_yaml(spec, &plugins); }

}  // namespace dqn
