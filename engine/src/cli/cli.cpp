// The dqn command line (dqn::cli_main, dqn/cli.hpp): train, eval, export, collect, csv, step, bench, check-head, validate,
// plugins, doc.
#include <CLI/CLI.hpp>
#include <charconv>
#include <cstdio>
#include <exception>
#include <filesystem>

#include "commands.hpp"
#include "dqn/cli.hpp"
#include "dqn_config.h"
#include "spdlog/spdlog.h"

namespace {
void add_common(CLI::App* app, dqn::cli::Common& c, bool overrides) {
  app->add_option("--plugin-path", c.plugin_path, "plugin directories (colon-separated), searched before $DQN_PLUGIN_PATH");
  if (overrides) {
    app->add_option("--set", c.overrides, "override a pipeline key: key.path=value (repeatable)");
    app->add_option("--backend", c.backend, "cpu or cuda (overrides the pipeline)")->check(CLI::IsMember({"cpu", "cuda"}));
  }
}
/// What eval and export read a trained policy from: a run directory or a weights file (with
/// --pipeline), its overrides, --best.
void add_policy_source(CLI::App* app, std::string& source, std::vector<std::string>& overrides, std::string& pipeline,
                       bool& best) {
  app->add_option("source", source, "a run directory, or a weights file (with --pipeline)")->required();
  app->add_option("overrides", overrides, "key.path=value overrides");
  app->add_option("--pipeline", pipeline, "the weights' pipeline (a run directory has its own)");
  app->add_flag("--best", best, "a run directory's best.safetensors instead of its final weights");
}
}  // namespace

int dqn::cli_main(int argc, char** argv) {
  using namespace dqn::cli;
  CLI::App app{"dqn — DQN training steps as one captured CUDA graph (with a CPU reference)"};
  app.set_version_flag("--version", DQN_VERSION);
  app.require_subcommand(1);
  bool verbose = false;
  app.add_flag("-v,--verbose", verbose, "debug logging");

  Common plugins_c;
  auto* plugins = app.add_subcommand("plugins", "list the loss-head plugins found, with their schemas");
  add_common(plugins, plugins_c, false);

  Common doc_c;
  auto* doc = app.add_subcommand("doc", "print reference documentation generated from the code");
  doc->require_subcommand(1);
  auto* doc_pipeline = doc->add_subcommand(
      "pipeline", "every pipeline key and the plugins' params, as Markdown (docs/pipeline.md)");
  add_common(doc_pipeline, doc_c, false);

  Common validate_c;
  std::vector<std::string> files;
  bool validate_print = false;
  auto* validate = app.add_subcommand("validate", "check pipeline files; non-zero exit with the errors");
  add_common(validate, validate_c, true);
  validate->add_option("files", files, "pipeline files, then key.path=value overrides applied to each")->required();
  validate->add_flag("--print", validate_print, "print each pipeline resolved (every default written out)");

  StepArgs step;
  std::vector<std::string> step_extra;
  auto* step_cmd = app.add_subcommand("step", "run N training steps on one batch and write everything out");
  add_common(step_cmd, step.common, true);
  step_cmd->add_option("pipeline", step.pipeline, "pipeline file")->required();
  step_cmd->add_option("overrides", step_extra, "key.path=value overrides");
  step_cmd->add_option("--init", step.init, "write seeded initial weights to this file");
  step_cmd->add_option("--weights", step.weights, "start from this weights file (default: seeded init)");
  step_cmd->add_option("--batch", step.batch, "batch file (safetensors)");
  step_cmd->add_option("--random-batch", step.random_batch, "generate a random batch with this seed");
  step_cmd->add_option("--save-batch", step.save_batch, "save the batch used to this file");
  step_cmd->add_option("--steps", step.steps, "number of steps")->check(CLI::Range(0, 100000000));
  step_cmd->add_option("--out", step.out, "write the step dump (weights + reports) here");
  step_cmd->add_flag("--explain", step.explain, "print the stage order and the registry layout");
  step_cmd->add_flag("--print-pipeline", step.print_pipeline, "print the fully resolved pipeline");

  TrainArgs train;
  std::vector<std::string> train_extra;
  auto* train_cmd = app.add_subcommand("train", "train an agent on the pipeline's environment");
  add_common(train_cmd, train.common, true);
  train_cmd->add_option("pipeline", train.pipeline, "pipeline file (not with --resume)");
  train_cmd->add_option("overrides", train_extra, "key.path=value overrides");
  train_cmd->add_option("--out", train.out_dir, "run directory (default runs/<name>-<timestamp>)");
  train_cmd->add_option("--seed", train.seed, "override the pipeline's seed");
  train_cmd->add_option("--steps", train.total_steps, "override training.total_steps");
  train_cmd->add_option("--weights", train.weights, "start from this weights file");
  train_cmd->add_flag("-q,--quiet", train.quiet, "no progress lines");
  train_cmd->add_option("--resume", train.resume,
                        "continue the run in this directory from its newest whole checkpoint, exactly as it would "
                        "have gone on (its own pipeline.yaml; only --backend and -q may be given with it)");

  BenchArgs bench;
  std::vector<std::string> bench_extra;
  std::string batches = "", precisions = "";
  auto* bench_cmd = app.add_subcommand("bench", "time the captured step (CUDA events, median of repeats)");
  add_common(bench_cmd, bench.common, true);
  bench_cmd->add_option("pipeline", bench.pipeline, "pipeline file")->required();
  bench_cmd->add_option("overrides", bench_extra, "key.path=value overrides");
  bench_cmd->add_option("--batch", batches, "comma-separated batch sizes (default: the pipeline's)");
  bench_cmd->add_option("--precision", precisions, "comma-separated precisions (default: the pipeline's)");
  bench_cmd->add_option("--warmup", bench.warmup, "warm-up replays")->check(CLI::Range(0, 1000000));
  bench_cmd->add_option("--iters", bench.iters, "timed replays per repeat")->check(CLI::Range(1, 10000000));
  bench_cmd->add_option("--repeats", bench.repeats, "repeats (the median is reported)")->check(CLI::Range(1, 1000));
  bench_cmd->add_flag("--json", bench.json, "one JSON object per configuration");
  bench_cmd->add_flag("--profile-range", bench.profile_range,
                      "open the profiler's range only around the timed replays (ncu --profile-from-start off)");
  std::string replays = "uniform,prioritized";
  bench_cmd->add_flag("--epoch", bench.epoch,
                      "time epochs of --epoch-steps steps drawing their batches from a full replay on the device");
  bench_cmd->add_option("--epoch-steps", bench.epoch_steps, "steps per epoch")->check(CLI::Range(1, 100000000));
  bench_cmd->add_option("--replay-size", bench.replay_size, "transitions in the replay")
      ->check(CLI::Range(std::int64_t(1), std::int64_t(1) << 31));
  bench_cmd->add_option("--replay", replays, "comma-separated replay kinds: uniform, prioritized");

  CollectArgs collect;
  auto* collect_cmd = app.add_subcommand(
      "collect", "write a dataset of transitions from a trained policy acting ε-greedily (for training.dataset)");
  add_common(collect_cmd, collect.common, true);
  collect_cmd->add_option("source", collect.source, "a run directory, or a weights file (with --pipeline)")->required();
  collect_cmd->add_option("--pipeline", collect.pipeline, "the weights' pipeline (a run directory has its own)");
  collect_cmd->add_option("--steps", collect.steps, "environment steps over all copies")
      ->check(CLI::Range(std::int64_t(1), std::int64_t(1) << 40));
  collect_cmd->add_option("--epsilon", collect.epsilon, "probability of a uniform-random action")->check(CLI::Range(0.0, 1.0));
  collect_cmd->add_option("--seed", collect.seed, "the environments' and the ε draws' seed");
  collect_cmd->add_option("--out", collect.out, "the dataset file (safetensors)")->required();
  collect_cmd->add_flag("--force", collect.force, "replace --out when it exists");

  EvalArgs eval;
  std::vector<std::string> eval_extra;
  auto* eval_cmd = app.add_subcommand(
      "eval", "play episodes with a trained policy (greedy or ε-greedy) and summarise their returns and lengths");
  add_common(eval_cmd, eval.common, true);
  add_policy_source(eval_cmd, eval.source, eval_extra, eval.pipeline, eval.best);
  eval_cmd->add_option("--episodes", eval.episodes,
                       "episodes in all, the same number on every environment copy (default: training.eval.episodes)")
      ->check(CLI::Range(1, 100000000));
  // A 64-bit seed read exactly: CLI11's own conversion wraps "-1" and saturates past 2^64 - 1.
  CLI::Option* eval_seed = eval_cmd->add_option_function<std::string>(
      "--seed",
      [&eval](const std::string& text) {
        const char* end = text.data() + text.size();
        const auto [p, ec] = std::from_chars(text.data(), end, eval.seed);
        if (text.empty() || ec != std::errc() || p != end)
          throw CLI::ValidationError("--seed", "'" + text + "' is not a whole number from 0 to 18446744073709551615");
      },
      "the environments' reset seed, 0 to 2^64-1 (default: derived from the pipeline's seed, apart from "
      "training's; a metrics line's eval_seed replays that evaluation)");
  eval_cmd->add_option("--epsilon", eval.epsilon, "probability of a uniform-random action")->check(CLI::Range(0.0, 1.0));
  eval_cmd->add_option("--env", eval.env, "another task: a name, or plugin:task (default: the pipeline's training.env)");
  eval_cmd->add_flag("--json", eval.json, "one JSON object on stdout");

  ExportArgs exp;
  std::vector<std::string> export_extra;
  auto* export_cmd = app.add_subcommand(
      "export", "write a trained policy's acting network alone: ONNX (observations → q, actions) or safetensors with a manifest");
  add_common(export_cmd, exp.common, true);
  add_policy_source(export_cmd, exp.source, export_extra, exp.pipeline, exp.best);
  export_cmd->add_option("--format", exp.format, "onnx or safetensors")->check(CLI::IsMember({"onnx", "safetensors"}));
  export_cmd->add_option("--out", exp.out, "the file to write")->required();
  export_cmd->add_flag("--force", exp.force, "replace --out when it exists");

  CsvArgs csv;
  auto* csv_cmd = app.add_subcommand("csv", "a run's metrics.jsonl as a CSV table (a column per key)");
  csv_cmd->add_option("run", csv.run, "a run directory")->required();
  csv_cmd->add_option("--out", csv.out, "the file to write (default <run>/metrics.csv; - for standard output)");
  csv_cmd->add_flag("--force", csv.force, "replace --out when it exists");

  CheckHeadArgs check;
  std::vector<std::string> check_extra;
  auto* check_cmd = app.add_subcommand(
      "check-head", "finite-difference check of every parameter gradient of every head (f64, CPU reference)");
  add_common(check_cmd, check.common, false);
  check_cmd->add_option("--set", check.common.overrides, "override a pipeline key: key.path=value (repeatable)");
  check_cmd->add_option("pipeline", check.pipeline, "pipeline file")->required();
  check_cmd->add_option("overrides", check_extra, "key.path=value overrides");
  check_cmd->add_option("--head", check.heads, "check only this head (repeatable)");
  check_cmd->add_option("--samples", check.samples, "entries checked per tensor")->check(CLI::Range(1, 1000000));
  check_cmd->add_option("--eps", check.eps, "central-difference step")->check(CLI::PositiveNumber);
  check_cmd->add_option("--rtol", check.rtol, "relative tolerance")->check(CLI::NonNegativeNumber);
  check_cmd->add_option("--atol", check.atol, "absolute tolerance")->check(CLI::NonNegativeNumber);
  check_cmd->add_option("--seed", check.seed, "which entries are sampled");
  check_cmd->add_option("--batch-seed", check.batch_seed, "the random batch's seed");
  check_cmd->add_flag("--verbose", check.verbose, "a line for every tensor, not only the failures");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  spdlog::set_level(verbose ? spdlog::level::debug : spdlog::level::info);
  auto split = [](const std::string& s) {
    std::vector<std::string> out;
    std::string cur;
    for (char ch : s + ",") {
      if (ch == ',') {
        if (!cur.empty()) out.push_back(cur);
        cur.clear();
      } else {
        cur += ch;
      }
    }
    return out;
  };
  try {
    if (*plugins) return cmd_plugins(plugins_c);
    if (*doc_pipeline) return cmd_doc_pipeline(doc_c);
    if (*validate) {
      // key.path=value arguments (that are not files) are overrides, as for every other command
      std::vector<std::string> paths;
      for (const std::string& f : files)
        (f.find('=') != std::string::npos && !std::filesystem::exists(f) ? validate_c.overrides : paths).push_back(f);
      return cmd_validate(validate_c, paths, validate_print);
    }
    if (*step_cmd) {
      for (auto& o : step_extra) step.common.overrides.push_back(o);
      return cmd_step(step);
    }
    if (*train_cmd) {
      for (auto& o : train_extra) train.common.overrides.push_back(o);
      return cmd_train(train);
    }
    if (*collect_cmd) return cmd_collect(collect);
    if (*csv_cmd) return cmd_csv(csv);
    if (*export_cmd) {
      for (auto& o : export_extra) exp.common.overrides.push_back(o);
      return cmd_export(exp);
    }
    if (*eval_cmd) {
      for (auto& o : eval_extra) eval.common.overrides.push_back(o);
      eval.seed_given = eval_seed->count() > 0;
      return cmd_eval(eval);
    }
    if (*check_cmd) {
      for (auto& o : check_extra) check.common.overrides.push_back(o);
      return cmd_check_head(check);
    }
    if (*bench_cmd) {
      for (auto& o : bench_extra) bench.common.overrides.push_back(o);
      for (auto& b : split(batches)) {
        try {
          bench.batches.push_back(std::stoi(b));
        } catch (...) {
          std::fprintf(stderr, "dqn bench: --batch: '%s' is not a number\n", b.c_str());
          return 2;
        }
      }
      bench.precisions = split(precisions);
      bench.replays = split(replays);
      return bench.epoch ? cmd_bench_epoch(bench) : cmd_bench(bench);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dqn: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
