/** @file reference.cpp
 *  @brief The pipeline reference (docs/pipeline.md) rendered from the schema table, the head keys
 *  and the plugins' ParamSchema tables, as Markdown.
 */
#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "pipeline/head_params.hpp"
#include "dqn/env.hpp"
#include "pipeline/schema.hpp"
#include "pipeline/text.hpp"

namespace dqn {
namespace {

using Type = PipelineKey::Type;

/// Text for a table cell: a '|' would end the cell.
std::string cell(const std::string& text) {
  std::string out;
  for (char c : text) out += c == '|' ? std::string("\\|") : std::string(1, c);
  return out;
}

std::string code(const std::string& text) { return text.empty() ? "" : "`" + text + "`"; }

struct Row {
  std::string key, type, default_value, accepted, meaning;
};

void table(std::ostringstream& o, const char* first_column, const std::vector<Row>& rows) {
  o << "| " << first_column << " | type | default | accepted | meaning |\n";
  o << "| --- | --- | --- | --- | --- |\n";
  for (const Row& r : rows)
    o << "| " << code(r.key) << " | " << r.type << " | " << cell(r.default_value) << " | " << cell(r.accepted)
      << " | " << cell(r.meaning) << " |\n";
}

/// A key's row; a default that is a value (not a note) is shown as code.
Row row(const PipelineKey& k, const std::string& shown_key) {
  const std::string def = default_text(k);
  return {shown_key, type_name(k.type), k.default_note.empty() ? code(def) : def, range_text(k), k.meaning};
}

/// The keys directly in `section` that hold values (its subsections get headings of their own).
std::vector<Row> value_rows(const std::string& section) {
  std::vector<Row> rows;
  for (const PipelineKey* k : child_keys(section))
    if (k->type != Type::section && k->type != Type::heads) rows.push_back(row(*k, k->path));
  return rows;
}

void heads_section(std::ostringstream& o, const PipelineKey& heads) {
  o << "## `heads`\n\n" << heads.meaning << "\n\n";
  std::vector<Row> rows;
  for (const PipelineKey& k : head_keys()) rows.push_back(row(k, k.path));
  table(o, "head key", rows);
}

std::vector<Row> schema_rows(const ParamSchema* schema, std::uint32_t n) {
  std::vector<Row> rows;
  for (std::uint32_t i = 0; i < n; ++i) {
    const ParamSchema& s = schema[i];
    const bool bounded = s.type == ParamType::integer || s.type == ParamType::number;
    rows.push_back({s.key, dsl::type_name(s.type), s.default_value ? code(s.default_value) : "(required)",
                    bounded ? dsl::schema_range(s).text() : "", s.doc ? s.doc : ""});
  }
  return rows;
}

void plugin_section(std::ostringstream& o, const PluginDescriptor& d) {
  o << "### `" << d.name << "`\n\n";
  if (d.description && *d.description) o << d.description << "\n\n";
  if (d.kind == PluginKind::environment && d.struct_size >= kDescriptorSizeMinor1) {
    o << "An environment plugin (`training.env: {plugin: " << d.name << ", task: …}`); its tasks:\n\n";
    for (std::uint32_t t = 0; t < d.env_count; ++t) {
      const EnvDescriptor& task = d.envs[t];
      o << "- `" << task.task << "`" << (task.description && *task.description ? std::string(": ") + task.description : "")
        << (task.schema_len ? "" : " (no options)") << "\n";
      if (task.schema_len) {
        o << "\n";
        table(o, "option", schema_rows(task.schema, task.schema_len));
        o << "\n";
      } else if (t + 1 == d.env_count) {
        o << "\n";
      }
    }
    return;
  }
  o << "Roles: " << (d.can_be_primary ? "primary or auxiliary" : "auxiliary only");
  if (d.default_budget > 0) o << "; default budget " << dsl::fmt(d.default_budget);
  o << ".\n\n";
  if (d.schema_len == 0) {
    o << "No params.\n\n";
    return;
  }
  table(o, "param", schema_rows(d.schema, d.schema_len));
  o << "\n";
}

}  // namespace

std::string pipeline_reference(const PluginCatalog& plugins) {
  std::ostringstream o;
  o << "## Top level\n\n";
  table(o, "key", value_rows(""));
  for (const PipelineKey& k : pipeline_keys()) {  // value keys are in their section's table
    if (k.type == Type::heads) {
      o << "\n";
      heads_section(o, k);
    } else if (k.type == Type::section) {
      o << "\n## `" << k.path << "`\n\n" << k.meaning << "\n";
      const std::vector<Row> rows = value_rows(k.path);
      if (!rows.empty()) {
        o << "\n";
        table(o, "key", rows);
      }
    }
  }
  o << "\n## Plugins\n\n"
    << "Each head's plugin adds its own params, written beside the head keys "
       "(`{plugin: iqn, budget: 0.2, quantiles: 64}`); an environment's task takes its options beside "
       "`plugin` and `task` in `training.env` (`{plugin: cartpole, max_episode_steps: 200}`).\n\n";
  std::vector<std::string> names = plugins.names();
  std::sort(names.begin(), names.end());
  for (const std::string& name : names)
    if (const PluginDescriptor* d = plugins.find(name)) plugin_section(o, *d);
  std::string text = o.str();
  while (text.size() > 1 && text[text.size() - 1] == '\n' && text[text.size() - 2] == '\n') text.pop_back();
  return text;
}

}  // namespace dqn
