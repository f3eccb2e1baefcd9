// dqn_engine._core: the engine's C++ API (dqn/agent.hpp, dqn/environment.hpp) for Python. numpy
// arrays of float32/int32/uint8 in C order pass without a copy (others are converted once); the
// GIL is released while the engine works; the engine's exceptions arrive as ValueError
// (std::invalid_argument) or RuntimeError with the engine's message.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <vector>

#include "dqn/agent.hpp"
#include "dqn/environment.hpp"

namespace py = pybind11;
using dqn::Agent;
using dqn::AgentEval;
using dqn::AgentOptions;
using dqn::AgentReport;
using dqn::Environment;

namespace {

template <class T>
using Array = py::array_t<T, py::array::c_style | py::array::forcecast>;

/// Rows of a [rows, cols] array (or one row of a [cols] array, `single` then true); ValueError
/// naming the expected shape otherwise.
template <class T>
int rows_of(const Array<T>& a, int cols, const char* what, bool& single) {
  single = a.ndim() == 1;
  if ((a.ndim() == 1 && a.shape(0) == cols) || (a.ndim() == 2 && a.shape(1) == cols && a.shape(0) >= 1))
    return single ? 1 : int(a.shape(0));
  std::string got = "(";
  for (py::ssize_t i = 0; i < a.ndim(); ++i) got += (i ? ", " : "") + std::to_string(a.shape(i));
  got += a.ndim() == 1 ? ",)" : ")";
  throw py::value_error(std::string(what) + " of shape " + got + ": expected (rows, " + std::to_string(cols) +
                        ") or (" + std::to_string(cols) + ",)");
}

/// A flat array of `n` entries ([n] or [n, 1]) or ValueError.
template <class T>
void check_flat(const Array<T>& a, int n, const char* what) {
  if (a.size() != n || a.ndim() > 2)
    throw py::value_error(std::string(what) + ": " + std::to_string(a.size()) + " entries, expected " +
                          std::to_string(n) + " (one per copy)");
}

py::dict report_dict(const AgentReport& r) {
  py::dict d;
  d["step"] = r.step;
  d["total_loss"] = r.total_loss;
  d["skipped_steps"] = r.skipped_steps;
  for (std::size_t i = 0; i < r.heads.size(); ++i) {
    d[py::str("loss." + r.heads[i])] = r.losses[i];
    d[py::str("grad_norm." + r.heads[i])] = r.grad_norms[i];
    d[py::str("clip." + r.heads[i])] = r.clips[i];
  }
  return d;
}

py::dict eval_dict(const AgentEval& e) {
  py::dict d;
  d["env"] = e.env;
  d["episodes"] = e.episodes;
  d["mean"] = e.mean;
  d["std"] = e.std;
  d["min"] = e.min;
  d["max"] = e.max;
  d["success"] = e.success ? py::object(py::float_(*e.success)) : py::object(py::none());
  d["seed"] = e.seed;
  d["returns"] = e.returns;
  d["lengths"] = e.lengths;
  return d;
}

py::dict run_dict(const dqn::AgentRun& r) {
  auto opt = [](const std::optional<double>& v) { return v ? py::object(py::float_(*v)) : py::object(py::none()); };
  py::dict d;
  d["run_dir"] = r.run_dir;
  d["env_steps"] = r.env_steps;
  d["env_steps_all_ranks"] = r.env_steps_all_ranks;
  d["train_steps"] = r.train_steps;
  d["episodes"] = r.episodes;
  d["skipped_steps"] = r.skipped_steps;
  d["ranks"] = r.ranks;
  d["offline"] = r.offline;
  d["final_eval"] = opt(r.final_eval);
  d["final_success"] = opt(r.final_success);
  d["last_eval"] = opt(r.last_eval);
  d["last_eval_step"] = r.last_eval_step;
  d["best_eval"] = opt(r.best_eval);
  d["best_eval_step"] = r.best_eval_step;
  d["solved"] = r.solved;
  d["interrupted"] = r.interrupted;
  d["wall_s"] = r.wall_s;
  d["checkpoint"] = r.checkpoint;
  d["write_errors"] = r.write_errors;
  return d;
}

AgentOptions options(const std::vector<std::string>& overrides, const std::string& backend,
                     const std::string& plugin_path, bool best = false) {
  AgentOptions o;
  o.overrides = overrides;
  o.backend = backend;
  o.plugin_path = plugin_path;
  o.best = best;
  return o;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "dqn-engine's C++ API: Agent and Environment";
  m.attr("API_VERSION") = py::make_tuple(dqn::kAgentApiMajor, dqn::kAgentApiMinor);

  m.def("cuda_devices", &Agent::cuda_devices, "GPUs the CUDA backend can use (0 without CUDA or a GPU).");

  py::class_<Agent>(m, "Agent")
      .def_static(
          "from_file",
          [](const std::string& path, const std::vector<std::string>& overrides, const std::string& backend,
             const std::string& plugin_path) { return Agent::from_file(path, options(overrides, backend, plugin_path)); },
          py::arg("pipeline"), py::arg("overrides") = std::vector<std::string>{}, py::arg("backend") = "",
          py::arg("plugin_path") = "", "An agent from a pipeline file, with key=value overrides.")
      .def_static(
          "from_text",
          [](const std::string& yaml, const std::vector<std::string>& overrides, const std::string& backend,
             const std::string& plugin_path, const std::string& name) {
            return Agent::from_text(yaml, options(overrides, backend, plugin_path), name);
          },
          py::arg("yaml"), py::arg("overrides") = std::vector<std::string>{}, py::arg("backend") = "",
          py::arg("plugin_path") = "", py::arg("name") = "<pipeline text>", "An agent from a pipeline's YAML text.")
      .def_static(
          "from_run",
          [](const std::string& source, const std::vector<std::string>& overrides, const std::string& backend,
             const std::string& plugin_path, const std::string& pipeline, bool best) {
            return Agent::from_run(source, options(overrides, backend, plugin_path, best), pipeline);
          },
          py::arg("source"), py::arg("overrides") = std::vector<std::string>{}, py::arg("backend") = "",
          py::arg("plugin_path") = "", py::arg("pipeline") = "", py::arg("best") = false,
          "An agent from a run directory of `dqn train` (or a weights file with its pipeline).")
      .def_static(
          "resume",
          [](const std::string& run_dir, const std::string& backend, const std::string& plugin_path) {
            return Agent::resume(run_dir, options({}, backend, plugin_path));
          },
          py::arg("run_dir"), py::arg("backend") = "", py::arg("plugin_path") = "",
          "An agent that continues a stopped run from its newest whole checkpoint; run() goes on there.")
      .def_property_readonly("warnings", &Agent::warnings)
      .def_property_readonly("resume_point",
                             [](const Agent& a) -> py::object {
                               const auto p = a.resume_point();
                               return p ? py::object(py::make_tuple(p->path, p->step)) : py::object(py::none());
                             })
      .def(
          "_run",
          [](Agent& a, const std::string& run_dir, bool progress) {
            dqn::AgentRunOptions o;
            o.run_dir = run_dir;
            o.progress = progress;
            dqn::AgentRun r;
            {
              py::gil_scoped_release free;
              r = a.run(o);
            }
            return run_dict(r);
          },
          py::arg("run_dir") = "", py::arg("progress") = true)
      .def(
          "_collect",
          [](Agent& a, const std::string& path, std::int64_t steps, double epsilon, std::uint64_t seed, bool replace) {
            dqn::AgentDataset r;
            {
              py::gil_scoped_release free;
              r = a.collect(path, steps, epsilon, seed, replace);
            }
            py::dict d;
            d["path"] = r.path;
            d["env"] = r.env;
            d["steps"] = r.steps;
            d["episodes"] = r.episodes;
            d["complete_episodes"] = r.complete_episodes;
            d["behaviour_return"] =
                r.behaviour_return ? py::object(py::float_(*r.behaviour_return)) : py::object(py::none());
            d["stopped"] = r.stopped;
            return d;
          },
          py::arg("path"), py::arg("steps"), py::arg("epsilon") = 0.05, py::arg("seed") = 1, py::arg("replace") = false)
      .def("request_stop", &Agent::request_stop,
           "Ends run() or collect() in progress at its next step (safe from any thread).")
      .def_property_readonly("observation_size", &Agent::observation_size)
      .def_property_readonly("branches", &Agent::branches)
      .def_property_readonly("actions_per_branch", &Agent::actions_per_branch)
      .def_property_readonly("max_rows", &Agent::max_rows)
      .def_property_readonly("pipeline_yaml", &Agent::pipeline_yaml)
      .def_property_readonly("backend", &Agent::backend)
      .def_property_readonly("seed", &Agent::seed)
      .def_property_readonly("replay_size", &Agent::replay_size)
      .def_property_readonly("train_steps", &Agent::train_steps)
      .def_property_readonly("training",
                             [](const Agent& a) {
                               const dqn::AgentTraining t = a.training();
                               py::dict d;
                               d["env"] = t.env;
                               d["num_envs"] = t.num_envs;
                               d["total_steps"] = t.total_steps;
                               d["learning_starts"] = t.learning_starts;
                               d["train_every"] = t.train_every;
                               d["gradient_steps"] = t.gradient_steps;
                               d["epsilon_start"] = t.epsilon_start;
                               d["epsilon_end"] = t.epsilon_end;
                               d["epsilon_decay_steps"] = t.epsilon_decay_steps;
                               d["eval_every"] = t.eval_every;
                               d["eval_episodes"] = t.eval_episodes;
                               d["stop_at_return"] = t.stop_at_return;
                               d["stop_at_success"] = t.stop_at_success;
                               d["batch"] = t.batch;
                               return d;
                             })
      .def("describe", &Agent::describe)
      .def(
          "act",
          [](Agent& a, const Array<float>& obs) {
            bool single = false;
            const int rows = rows_of(obs, a.observation_size(), "observations", single);
            Array<std::int32_t> out(single ? std::vector<py::ssize_t>{a.branches()}
                                           : std::vector<py::ssize_t>{rows, a.branches()});
            const float* in = obs.data();
            std::int32_t* o = out.mutable_data();
            {
              py::gil_scoped_release free;
              a.act(in, rows, o);
            }
            return out;
          },
          py::arg("observations"), "Greedy actions [rows, branches] (or [branches] for one observation).")
      .def(
          "q_values",
          [](Agent& a, const Array<float>& obs) {
            bool single = false;
            const int rows = rows_of(obs, a.observation_size(), "observations", single);
            const py::ssize_t D = a.branches(), A = a.actions_per_branch().at(0);
            Array<float> out(single ? std::vector<py::ssize_t>{D, A} : std::vector<py::ssize_t>{rows, D, A});
            const float* in = obs.data();
            float* o = out.mutable_data();
            {
              py::gil_scoped_release free;
              a.q_values(in, rows, o);
            }
            return out;
          },
          py::arg("observations"), "The primary head's Q-values [rows, branches, actions].")
      .def(
          "observe",
          [](Agent& a, const Array<float>& obs, const Array<std::int32_t>& actions, const Array<float>& rewards,
             const Array<float>& next_obs, const Array<std::uint8_t>& terminated, const Array<std::uint8_t>& truncated) {
            bool single = false, single_next = false;
            const int n = rows_of(obs, a.observation_size(), "observations", single);
            if (rows_of(next_obs, a.observation_size(), "next observations", single_next) != n)
              throw py::value_error("next observations: not as many rows as the observations");
            check_flat(actions, n * a.branches(), "actions");
            check_flat(rewards, n, "rewards");
            check_flat(terminated, n, "terminated");
            check_flat(truncated, n, "truncated");
            py::gil_scoped_release free;
            a.observe(obs.data(), actions.data(), rewards.data(), next_obs.data(), terminated.data(), truncated.data(),
                      n);
          },
          py::arg("observations"), py::arg("actions"), py::arg("rewards"), py::arg("next_observations"),
          py::arg("terminated"), py::arg("truncated"),
          "One environment step of every copy (next: the final observation where an episode ended).")
      .def(
          "train",
          [](Agent& a, std::int64_t steps) {
            AgentReport r;
            {
              py::gil_scoped_release free;
              r = a.train(steps);
            }
            return report_dict(r);
          },
          py::arg("steps") = 1, "Training steps on batches from the replay; their last report.")
      .def("latest_report",
           [](Agent& a) -> py::object {
             std::optional<AgentReport> r = a.latest_report();
             return r ? py::object(report_dict(*r)) : py::object(py::none());
           })
      .def(
          "evaluate",
          [](Agent& a, int episodes, std::optional<std::uint64_t> seed, double epsilon, const std::string& env) {
            AgentEval e;
            {
              py::gil_scoped_release free;
              e = a.evaluate(episodes, seed, epsilon, env);
            }
            return eval_dict(e);
          },
          py::arg("episodes") = 0, py::arg("seed") = py::none(), py::arg("epsilon") = 0.0, py::arg("env") = "",
          "Episodes of the greedy (or ε-greedy) policy on an environment plugin's task.")
      .def("export", &Agent::export_policy, py::arg("path"), py::arg("format") = "onnx",
           py::call_guard<py::gil_scoped_release>(),
           "The acting network alone as ONNX or as safetensors with its manifest (what dqn export writes).")
      .def("save", &Agent::save, py::arg("path"), py::call_guard<py::gil_scoped_release>())
      .def("load", &Agent::load, py::arg("path"), py::call_guard<py::gil_scoped_release>());

  py::class_<Environment>(m, "Environment")
      .def_static("make", &Environment::make, py::arg("task"), py::arg("copies") = 1, py::arg("seed") = 0,
                  py::arg("options") = std::vector<std::string>{}, py::arg("plugin_path") = "", py::arg("threads") = 1,
                  "Copies of an environment plugin's task; options as key=value.")
      .def_property_readonly("copies", &Environment::copies)
      .def_property_readonly("observation_size", &Environment::observation_size)
      .def_property_readonly("branches", &Environment::branches)
      .def_property_readonly("actions_per_branch", &Environment::actions_per_branch)
      .def_property_readonly("control_ranges", &Environment::control_ranges)
      .def_property_readonly("label", &Environment::label)
      .def_property_readonly("max_episode_steps", &Environment::max_episode_steps)
      .def_property_readonly("reports_success", &Environment::reports_success)
      .def(
          "reset",
          [](Environment& e, std::uint64_t seed) {
            Array<float> obs(std::vector<py::ssize_t>{e.copies(), e.observation_size()});
            float* o = obs.mutable_data();
            {
              py::gil_scoped_release free;
              e.reset(seed, o);
            }
            return obs;
          },
          py::arg("seed"), "Observations [copies, features] of new episodes.")
      .def(
          "step",
          [](Environment& e, const Array<std::int32_t>& actions) {
            const py::ssize_t N = e.copies(), S = e.observation_size();
            check_flat(actions, int(N) * e.branches(), "actions");
            Array<float> next(std::vector<py::ssize_t>{N, S}), fin(std::vector<py::ssize_t>{N, S});
            Array<float> rew(std::vector<py::ssize_t>{N});
            Array<std::uint8_t> term(std::vector<py::ssize_t>{N}), trunc(std::vector<py::ssize_t>{N}),
                success(std::vector<py::ssize_t>{N});
            const std::int32_t* a = actions.data();
            float *pn = next.mutable_data(), *pf = fin.mutable_data(), *pr = rew.mutable_data();
            std::uint8_t *pt = term.mutable_data(), *pu = trunc.mutable_data();
            {
              py::gil_scoped_release free;
              e.step(a, pn, pr, pt, pu, pf);
            }
            std::copy(e.success(), e.success() + N, success.mutable_data());
            return py::make_tuple(next, rew, term, trunc, fin, success);
          },
          py::arg("actions"),
          "actions [copies, branches] → (next observations, rewards, terminated, truncated, final observations, "
          "successes)");
}
