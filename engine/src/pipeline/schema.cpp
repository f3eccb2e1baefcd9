/** @file schema.cpp
 *  @brief The pipeline's key table (one row a key: type, bounds or choices, meaning, its field) and
 *  how a key's value and default read as text.
 */
#include "pipeline/schema.hpp"

#include <cmath>
#include <limits>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "pipeline/text.hpp"

namespace dqn {

bool NumberRange::contains(double v) const {
  return (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
}

bool NumberRange::unbounded() const { return std::isinf(lo) && std::isinf(hi); }

std::string NumberRange::text() const {
  using dsl::fmt;
  if (unbounded()) return "";
  if (std::isinf(hi)) return std::string(lo_open ? "> " : ">= ") + fmt(lo);
  if (std::isinf(lo)) return std::string(hi_open ? "< " : "<= ") + fmt(hi);
  return std::string(lo_open ? "in (" : "in [") + fmt(lo) + ", " + fmt(hi) + (hi_open ? ")" : "]");
}

std::string IntegerRange::text() const {
  if (hi_is_type_limit) return ">= " + std::to_string(lo);
  return "in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
}

std::string IntegerRange::text(std::int64_t v) const {
  if (!hi_is_type_limit) return text();
  return v < lo ? ">= " + std::to_string(lo) : "<= " + std::to_string(hi);
}

std::string PipelineKey::name() const {
  const std::size_t dot = path.rfind('.');
  return dot == std::string::npos ? path : path.substr(dot + 1);
}

std::string PipelineKey::parent() const {
  const std::size_t dot = path.rfind('.');
  return dot == std::string::npos ? std::string() : path.substr(0, dot);
}

namespace {

using Type = PipelineKey::Type;

/// A field of PipelineSpec, reached the same way to read it (through a const spec) and to set it.
#define DQN_FIELD(member) [](auto& spec) -> auto& { return spec.member; }

template <class Field>
using FieldType = std::remove_cvref_t<std::invoke_result_t<Field, PipelineSpec&>>;

/// The largest value of an integer field that KeyValue's int64 holds.
template <class T>
std::int64_t type_limit() {
  return static_cast<std::int64_t>(std::min<std::uint64_t>(
      static_cast<std::uint64_t>(std::numeric_limits<T>::max()),
      static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())));
}

/// The enum choices' text: the to_string overloads of dqn/pipeline.hpp.
constexpr auto by_name = [](auto value) { return std::string(to_string(value)); };

PipelineKey key(std::string path, Type type, std::string meaning) {
  PipelineKey k;
  k.path = std::move(path);
  k.type = type;
  k.meaning = std::move(meaning);
  return k;
}

PipelineKey section(std::string path, std::string meaning) {
  return key(std::move(path), Type::section, std::move(meaning));
}

/// A field held in KeyValue as V (its own type converted).
template <class V, class Field>
PipelineKey field_key(std::string path, Type type, Field field, std::string meaning) {
  PipelineKey k = key(std::move(path), type, std::move(meaning));
  k.get = [field](const PipelineSpec& s) { return KeyValue{static_cast<V>(field(s))}; };
  k.set = [field](PipelineSpec& s, const KeyValue& v) {
    field(s) = static_cast<FieldType<Field>>(std::get<V>(v));
  };
  return k;
}

template <class Field>
PipelineKey integer(std::string path, Field field, std::int64_t lo, std::string meaning) {
  PipelineKey k = field_key<std::int64_t>(std::move(path), Type::integer, field, std::move(meaning));
  k.integers = {lo, type_limit<FieldType<Field>>(), true};
  return k;
}

template <class Field>
PipelineKey number(std::string path, Field field, NumberRange range, std::string meaning) {
  PipelineKey k = field_key<double>(std::move(path), Type::number, field, std::move(meaning));
  k.numbers = range;
  return k;
}

template <class Field>
PipelineKey boolean(std::string path, Field field, std::string meaning) {
  return field_key<bool>(std::move(path), Type::boolean, field, std::move(meaning));
}

template <class Field>
PipelineKey string(std::string path, Field field, std::string meaning) {
  return field_key<std::string>(std::move(path), Type::string, field, std::move(meaning));
}

/// One of `values`, each written as text(value).
template <class Field, class Text, class T = FieldType<Field>>
PipelineKey choice(std::string path, Field field, std::vector<T> values, Text text, std::string meaning) {
  PipelineKey k = key(std::move(path), Type::choice, std::move(meaning));
  for (const T& v : values) k.choices.push_back(text(v));
  k.get = [field, text](const PipelineSpec& s) { return KeyValue{text(field(s))}; };
  k.set = [field, values, text](PipelineSpec& s, const KeyValue& v) {
    for (const T& c : values)
      if (text(c) == std::get<std::string>(v)) field(s) = c;
  };
  return k;
}

PipelineKey env_key() {
  PipelineKey k = key("training.env", Type::env,
                      "the environment: a map naming an environment plugin, one of its tasks and the task's options "
                      "(`{plugin: reacher, links: 6}`; `dqn plugins` lists them), or a plugin's or task's name alone "
                      "(`CartPole-v1`); `\"\"` (or left out, with training.dataset): none");
  k.default_note = "`{plugin: cartpole, task: CartPole-v1}`";
  return k;
}

NumberRange any() { return NumberRange{}; }
NumberRange at_least(double lo) { return NumberRange{lo, dsl::kInf, false, false}; }
NumberRange above(double lo) { return NumberRange{lo, dsl::kInf, true, false}; }
NumberRange closed(double lo, double hi) { return NumberRange{lo, hi, false, false}; }
NumberRange fraction_with_one() { return NumberRange{0, 1, true, false}; }  // (0, 1]

/// `auto` is not a BackendKind: it sets backend_auto (and cpu until a GPU is looked for).
PipelineKey backend() {
  PipelineKey k = key("backend", Type::choice,
                      "where the step runs: cpu (the reference), cuda, or auto (cuda when a GPU is found, else cpu)");
  k.choices = {"cpu", "cuda", "auto"};
  k.get = [](const PipelineSpec& s) {
    return KeyValue{std::string(s.backend_auto ? "auto" : to_string(s.backend))};
  };
  k.set = [](PipelineSpec& s, const KeyValue& v) {
    const std::string& text = std::get<std::string>(v);
    s.backend = text == "cuda" ? BackendKind::cuda : BackendKind::cpu;
    s.backend_auto = text == "auto";
  };
  return k;
}

PipelineKey trunk() {
  PipelineKey k = key("network.trunk", Type::integer_list,
                      "the trunk's hidden layer widths, from the state to the heads (ReLU after each)");
  k.integers = {1, type_limit<int>(), true};
  k.min_items = 1;
  k.max_items = kMaxTrunkLayers;
  k.items = "layers";
  k.shape = "a list of layer widths";
  k.example = "[256, 256]";
  k.get = [](const PipelineSpec& s) {
    return KeyValue{std::vector<std::int64_t>(s.network.trunk.begin(), s.network.trunk.end())};
  };
  k.set = [](PipelineSpec& s, const KeyValue& v) {
    const auto& widths = std::get<std::vector<std::int64_t>>(v);
    s.network.trunk.assign(widths.begin(), widths.end());
  };
  return k;
}

PipelineKey devices() {
  PipelineKey k = key("devices", Type::integer_list,
                      "the GPUs the step runs on, data-parallel: a list of device ordinals, or all (every GPU "
                      "found); one rank each, each drawing `batch` transitions (the global batch is batch × ranks) "
                      "from a replay of its own, the gradients averaged over the ranks before the budgets; the "
                      "cpu backend runs as many ranks as listed (all: one), as threads");
  k.integers = {0, 1023, false};
  k.min_items = 1;
  k.max_items = 64;
  k.items = "devices";
  k.shape = "a list of device ordinals, or all";
  k.example = "[0, 1]";
  k.word = "all";
  k.unique = true;
  k.get = [](const PipelineSpec& s) {
    return KeyValue{std::vector<std::int64_t>(s.devices.begin(), s.devices.end())};
  };
  k.set = [](PipelineSpec& s, const KeyValue& v) {
    const auto& d = std::get<std::vector<std::int64_t>>(v);
    s.devices.assign(d.begin(), d.end());
  };
  return k;
}

/// 0 (or `never`): no evaluation at all.
PipelineKey eval_every() {
  PipelineKey k = integer("training.eval.every", DQN_FIELD(training.eval.every), 0,
                          "environment steps (offline: training steps) between evaluations; 0 or never: no "
                          "evaluation (then no best.safetensors, and no stop_at_return or stop_at_success)");
  k.word = "never";
  return k;
}

PipelineKey adam_betas() {
  PipelineKey k = key("optimizer.adam.betas", Type::number_pair,
                      "β1 and β2: the decay rates of Adam's first and second moment estimates");
  k.numbers = NumberRange{0, 1, false, true};
  k.shape = "two numbers [beta1, beta2]";
  k.example = "betas: [0.9, 0.999]";
  k.get = [](const PipelineSpec& s) { return KeyValue{std::array<double, 2>{s.adam.beta1, s.adam.beta2}}; };
  k.set = [](PipelineSpec& s, const KeyValue& v) {
    const auto& betas = std::get<std::array<double, 2>>(v);
    s.adam.beta1 = betas[0];
    s.adam.beta2 = betas[1];
  };
  return k;
}

/// The target network moves one way or the other: to_yaml writes the one in use.
PipelineKey target_polyak() {
  PipelineKey k = number("target.polyak", DQN_FIELD(target.polyak), fraction_with_one(),
                         "τ: after every Adam step the target moves τ of the way to the online network");
  k.written = [](const PipelineSpec& s) { return s.target.period == 0; };
  return k;
}

PipelineKey target_period() {
  PipelineKey k = integer("target.period", DQN_FIELD(target.period), 1,
                          "a hard copy of the online network into the target every `period` Adam steps "
                          "(0, the default: the Polyak update)");
  k.written = [](const PipelineSpec& s) { return s.target.period > 0; };
  return k;
}

std::vector<PipelineKey> make_pipeline_keys() {
  using Gemm = CudaSpec::Gemm;
  using Loads = CudaSpec::TileLoads;
  using Pdl = CudaSpec::Pdl;
  return {
      string("name", DQN_FIELD(name),
             "the pipeline's name; it names the run directory (`runs/<name>-<time>`): not empty, no '/'"),
      integer("seed", DQN_FIELD(seed), 0,
              "the seed every random stream derives from (initial weights, environments, exploration, sampling)"),
      backend(),
      choice("precision", DQN_FIELD(precision), {Precision::fp32, Precision::tf32, Precision::bf16}, by_name,
             "the CUDA backend's GEMM arithmetic: fp32, tf32 (tensor cores on float data) or bf16; "
             "the CPU reference ignores it"),

      section("network", "The Q-network's shape: a shared trunk, then each head's distributional dueling branches."),
      integer("network.state", DQN_FIELD(network.state), 1, "S: the length of a state (observation) vector"),
      trunk(),
      integer("network.head_hidden", DQN_FIELD(network.head_hidden), 1, "Hh: the width of every head's hidden layer"),
      integer("network.branches", DQN_FIELD(network.branches), 1,
              "D: action dimensions (branches), each choosing one of `actions`"),
      integer("network.actions", DQN_FIELD(network.actions), 1, "A: the actions of each branch"),
      integer("network.atoms", DQN_FIELD(network.atoms), 2, "Z: the atoms of the return distribution's support"),
      number("network.v_min", DQN_FIELD(network.v_min), closed(-1e9, 1e9),
             "the support's lowest return (below v_max; the atoms are floats: rescale rewards beyond ±1e9)"),
      number("network.v_max", DQN_FIELD(network.v_max), closed(-1e9, 1e9), "the support's highest return"),

      key("heads", Type::heads,
          "The loss heads: exactly one primary and any auxiliaries, each a map of the keys below and its "
          "plugin's params."),

      number("max_grad_norm", DQN_FIELD(max_grad_norm), above(0),
             "G: the gradient norm budget; each head's gradient is clipped to norm f · G, f its budget"),
      section("optimizer", "The optimizer: Adam is the one there is."),
      section("optimizer.adam", "Adam's hyperparameters."),
      number("optimizer.adam.lr", DQN_FIELD(adam.lr), above(0), "the learning rate"),
      adam_betas(),
      number("optimizer.adam.eps", DQN_FIELD(adam.eps), above(0),
             "ε: added to the second moment's square root in the step's denominator"),
      section("spectral_norm", "Spectral normalisation of the weight matrices, after each Adam step."),
      boolean("spectral_norm.enabled", DQN_FIELD(spectral_norm.enabled),
              "rescale each weight matrix whose largest singular value exceeds sigma_max"),
      number("spectral_norm.sigma_max", DQN_FIELD(spectral_norm.sigma_max), above(0),
             "the largest singular value a matrix keeps (estimated by power iteration)"),
      section("target", "The target network's update: give `polyak` or `period`, not both."),
      target_polyak(),
      target_period(),
      integer("batch", DQN_FIELD(batch), 1, "B: the transitions of one training step (on each device)"),
      number("gamma", DQN_FIELD(gamma), fraction_with_one(), "γ: the discount factor"),
      integer("n_step", DQN_FIELD(n_step), 1, "n: rewards are n-step discounted sums; targets bootstrap with γ^n"),
      integer("report_every", DQN_FIELD(report_every), 1,
              "training steps between asynchronous reports (losses, gradient norms, clips, budgets)"),
      devices(),

      section("cuda",
              "The CUDA backend's choices: which kernels run and how they are launched, never the step's "
              "mathematics (the GEMM choices may change float rounding within the precision's tolerance). "
              "The CPU backend ignores this section."),
      boolean("cuda.autotune", DQN_FIELD(cuda.autotune),
              "time each GEMM's candidate kernels once, when the step is built, and keep the fastest "
              "(false: cuBLASLt's first choice, or the first tile shape that fits)"),
      choice("cuda.gemm", DQN_FIELD(cuda.gemm),
             {Gemm::automatic, Gemm::cublaslt, Gemm::tile, Gemm::tile16x32, Gemm::tile32x32, Gemm::tile64x64},
             by_name,
             "the GEMMs' kernel family: auto (autotuning picks per problem between cuBLASLt and, in tf32, "
             "tile_gemm), cublaslt only, tile (tile_gemm wherever it fits, tf32), or tile_gemm with one tile shape"),
      choice("cuda.tile_loads", DQN_FIELD(cuda.tile_loads), {Loads::automatic, Loads::plain, Loads::ldmatrix},
             by_name,
             "how tile_gemm reads its k-contiguous operands' fragments from shared memory: auto (autotuning "
             "times both), plain loads, or ldmatrix; the same bits either way"),
      choice("cuda.update_cluster", DQN_FIELD(cuda.update_cluster), {0, 8, 16, -1}, update_cluster_text,
             "blocks per thread-block cluster of the fused update (budgets, Adam, spectral norm, target): "
             "auto (16 where the device schedules such clusters, else 8), 8 or 16; off runs the update as "
             "its separate kernels"),
      choice("cuda.pdl", DQN_FIELD(cuda.pdl), {Pdl::automatic, Pdl::small, Pdl::all, Pdl::off}, by_name,
             "programmatic dependent launch (a kernel placed while the one before it runs): auto (every kernel, "
             "but in a step over more than 8 lanes only those with at most 16 KiB of dynamic shared memory), "
             "small (only those, in every step), all, or off"),

      section("training", "The training loop of `dqn train`; a step or benchmark workload may leave it out."),
      env_key(),
      integer("training.env_threads", DQN_FIELD(training.env_threads), 0,
              "threads stepping the environment's copies, each a contiguous range of them (the same numbers "
              "whatever the count); 0: chosen once the first steps are timed, one thread per 50 µs of a step's "
              "work, up to the cores the learner leaves"),
      integer("training.num_envs", DQN_FIELD(training.num_envs), 1,
              "environment copies stepped together; total_steps counts all of them"),
      integer("training.total_steps", DQN_FIELD(training.total_steps), 1,
              "environment steps to run, over all copies (a ceiling where stop_at_return ends the run)"),
      integer("training.learning_starts", DQN_FIELD(training.learning_starts), 0,
              "environment steps of uniform-random actions that fill the replay before training starts"),
      integer("training.train_every", DQN_FIELD(training.train_every), 1, "environment steps between training steps"),
      integer("training.gradient_steps", DQN_FIELD(training.gradient_steps), 1, "training steps each time"),
      integer("training.act_refresh", DQN_FIELD(training.act_refresh), 1,
              "training steps between refreshes of the acting snapshot: the learner copies its parameters on "
              "the device, and the actor takes the copy up once it has run (it never waits for the learner)"),
      integer("training.checkpoint_every", DQN_FIELD(training.checkpoint_every), 0,
              "environment steps (offline: training steps) between checkpoints in the run directory's "
              "checkpoints/, from which `dqn train --resume` continues exactly; one is also written on SIGINT or "
              "SIGTERM; 0: none"),
      number("training.checkpoint_minutes", DQN_FIELD(training.checkpoint_minutes), at_least(0),
             "wall-clock minutes after the last checkpoint (or the start) that bring one before checkpoint_every "
             "steps have passed: what a kill can lose, however slow the run; 0: by steps only"),
      integer("training.checkpoint_keep", DQN_FIELD(training.checkpoint_keep), 1,
              "the newest checkpoints kept (older ones are removed once a newer one is written whole)"),
      string("training.dataset", DQN_FIELD(training.dataset),
             "a file of transitions to train from offline, with no environment (safetensors; or a Minari "
             "dataset's HDF5 where libhdf5 is built in); empty: learn from training.env"),
      section("training.epsilon", "ε-greedy exploration, ε decaying linearly."),
      number("training.epsilon.start", DQN_FIELD(training.epsilon.start), closed(0, 1), "ε at the first step"),
      number("training.epsilon.end", DQN_FIELD(training.epsilon.end), closed(0, 1), "ε from decay_steps on"),
      integer("training.epsilon.decay_steps", DQN_FIELD(training.epsilon.decay_steps), 1,
              "environment steps over which ε goes from start to end"),
      section("training.replay",
              "The replay buffer, where the backend computes (device memory on CUDA): the step draws its batch "
              "from it and, prioritised, updates the priorities in the same step."),
      integer("training.replay.capacity", DQN_FIELD(training.replay.capacity), 1,
              "the transitions the replay holds (at least one batch)"),
      boolean("training.replay.prioritized", DQN_FIELD(training.replay.prioritized),
              "sample in proportion to (|TD error| + priority_eps)^alpha instead of uniformly"),
      number("training.replay.alpha", DQN_FIELD(training.replay.alpha), at_least(0),
             "α: how strongly priorities skew sampling (0: uniform)"),
      number("training.replay.beta_start", DQN_FIELD(training.replay.beta_start), closed(0, 1),
             "β at the first step: the importance-sampling correction's exponent, annealed linearly over "
             "total_steps"),
      number("training.replay.beta_end", DQN_FIELD(training.replay.beta_end), closed(0, 1), "β at total_steps"),
      number("training.replay.priority_eps", DQN_FIELD(training.replay.priority_eps), above(0),
             "added to every |TD error|, so that no transition's priority is zero (never sampled again)"),
      section("training.eval", "Greedy evaluation, on separately seeded environments."),
      eval_every(),
      integer("training.eval.episodes", DQN_FIELD(training.eval.episodes), 1, "episodes per evaluation"),
      number("training.stop_at_return", DQN_FIELD(training.stop_at_return), any(),
             "stop once an evaluation's mean return reaches this (0: run all total_steps)"),
      number("training.stop_at_success", DQN_FIELD(training.stop_at_success), closed(0, 1),
             "stop once an evaluation's success rate (a task that reports successes: the reachers) reaches this "
             "(0: run all total_steps)"),
      string("training.out_dir", DQN_FIELD(training.out_dir), "the run directory (empty: `runs/<name>-<timestamp>`)"),
  };
}

#undef DQN_FIELD

/// A head key: read by the validator's head code into HeadSpec, so no field of PipelineSpec.
PipelineKey head_entry(std::string name, Type type, std::string default_note, std::string meaning) {
  PipelineKey k = key(std::move(name), type, std::move(meaning));
  k.default_note = std::move(default_note);
  return k;
}

std::vector<PipelineKey> make_head_keys() {
  const HeadSpec defaults;
  PipelineKey role = head_entry("role", Type::choice, to_string(defaults.role),
                                "primary: the head whose a*, m and td_error drive the step (exactly one, enabled, "
                                "without a budget); auxiliary: one more loss, with a budget of its own");
  role.choices = {to_string(Role::primary), to_string(Role::auxiliary)};
  PipelineKey budget = head_entry("budget", Type::number, "the plugin's default (auxiliary)",
                                  "f: the share of max_grad_norm an auxiliary head's gradient gets; the enabled "
                                  "auxiliaries' budgets sum below 1 and the primary takes what they leave");
  budget.numbers = NumberRange{0, 1, true, true};
  return {
      head_entry("plugin", Type::string, "(required)",
                 "the plugin that computes the head's loss (`dqn plugins` lists those found)"),
      head_entry("name", Type::string, "the plugin's name",
                 "the head's instance name, which names its buffers and overrides (`heads.<name>.budget=...`): a "
                 "letter or '_', then letters, digits, '_' or '-'"),
      role,
      budget,
      head_entry("enabled", Type::boolean, defaults.enabled ? "true" : "false",
                 "false leaves the head out of the step, and its budget out of the sum (not the primary)"),
  };
}

}  // namespace

const std::vector<PipelineKey>& pipeline_keys() {
  static const std::vector<PipelineKey> keys = make_pipeline_keys();
  return keys;
}

const std::vector<PipelineKey>& head_keys() {
  static const std::vector<PipelineKey> keys = make_head_keys();
  return keys;
}

const PipelineKey& head_key(const std::string& name) {
  for (const PipelineKey& k : head_keys())
    if (k.path == name) return k;
  throw std::logic_error("head_key: '" + name + "' is not a head key");
}

std::vector<const PipelineKey*> child_keys(const std::string& section) {
  std::vector<const PipelineKey*> out;
  for (const PipelineKey& k : pipeline_keys())
    if (k.parent() == section) out.push_back(&k);
  return out;
}

std::vector<std::string> child_names(const std::string& section) {
  std::vector<std::string> out;
  for (const PipelineKey* k : child_keys(section)) out.push_back(k->name());
  return out;
}

std::vector<std::string> head_key_names() {
  std::vector<std::string> out;
  for (const PipelineKey& k : head_keys()) out.push_back(k.path);
  return out;
}

const char* type_name(PipelineKey::Type t) {
  switch (t) {
    case Type::section: return "section";
    case Type::heads: return "list of heads";
    case Type::env: return "environment";
    case Type::boolean: return "boolean";
    case Type::integer: return "integer";
    case Type::number: return "number";
    case Type::string: return "string";
    case Type::choice: return "choice";
    case Type::integer_list: return "list of integers";
    case Type::number_pair: return "pair of numbers";
  }
  return "?";
}

std::string value_text(const PipelineKey& k, const KeyValue& v) {
  if (auto b = std::get_if<bool>(&v)) return *b ? "true" : "false";
  if (auto i = std::get_if<std::int64_t>(&v)) return std::to_string(*i);
  if (auto d = std::get_if<double>(&v)) return dsl::format_double(*d);
  if (auto s = std::get_if<std::string>(&v)) return k.type == Type::choice ? *s : dsl::quote(*s);
  std::vector<std::string> items;
  if (auto list = std::get_if<std::vector<std::int64_t>>(&v); list && list->empty() && !k.word.empty()) return k.word;
  if (auto list = std::get_if<std::vector<std::int64_t>>(&v))
    for (std::int64_t i : *list) items.push_back(std::to_string(i));
  if (auto pair = std::get_if<std::array<double, 2>>(&v))
    for (double d : *pair) items.push_back(dsl::format_double(d));
  return "[" + dsl::join(items) + "]";
}

std::string default_text(const PipelineKey& k) {
  if (!k.default_note.empty() || !k.get) return k.default_note;
  static const PipelineSpec defaults;
  return value_text(k, k.get(defaults));
}

std::string range_text(const PipelineKey& k) {
  switch (k.type) {
    case Type::integer: return k.integers.text() + (k.word.empty() ? "" : "; or `" + k.word + "`");
    case Type::number: return k.numbers.text();
    case Type::choice: {
      std::vector<std::string> quoted;
      for (const auto& c : k.choices) quoted.push_back("`" + c + "`");
      return dsl::join(quoted);
    }
    case Type::integer_list:
      return std::to_string(k.min_items) + " to " + std::to_string(k.max_items) + " " + k.items + ", each " +
             k.integers.text() + (k.unique ? ", none twice" : "") + (k.word.empty() ? "" : "; or `" + k.word + "`");
    case Type::number_pair: return "each " + k.numbers.text();
    case Type::section:
    case Type::heads:
    case Type::env:
    case Type::boolean:
    case Type::string: return "";
  }
  return "";
}

}  // namespace dqn
