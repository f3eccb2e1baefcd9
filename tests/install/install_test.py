#!/usr/bin/python3
"""The installable SDK, end to end (suite `install`): the build installed into a temporary prefix
holds the dqn program, the engine's shared library exporting the SDK's symbols only, the built-in
plugins, the public headers and a relocatable dqn-engine.pc; the installed dqn finds its own
plugins and no build tree's; examples/plugins/qr_dqn builds against that prefix alone, loads,
passes `dqn check-head` and runs steps on the CPU; examples/envs/pendulum builds against it alone, is
listed with its spaces and trains on the CPU; examples/api/cartpole, a program on the C++ API,
builds against it alone and trains CartPole to a mean greedy return of 475.
Usage: install_test.py BUILD_ROOT SOURCE_ROOT"""
import json
import math
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sdk  # noqa: E402

# The SDK's headers: what a plugin includes, cli.hpp, and the API (agent.hpp, environment.hpp, with export.hpp).
HEADERS = ["agent.hpp", "backend.hpp", "bdq.hpp", "cli.hpp", "device.cuh", "dist_device.cuh", "env.hpp", "env_base.hpp", "environment.hpp",
           "export.hpp", "head.hpp", "head_base.hpp", "own_ops.hpp", "param_values.hpp", "plugin.hpp", "policy_graph.hpp"]
BUILTIN = ["c51", "cql", "ensemble", "iqn", "cartpole", "reacher"]
# What libdqn_engine.so may export (engine/libdqn_engine.map): the SDK's functions and exceptions.
SDK_SYMBOL = re.compile(r"^(dqn::(cli_main|make_cpu_runtime|make_cuda_runtime|cuda_available|cuda_device_count|to_string|"
                        r"update_cluster_text|SourceLoc::|PipelineError::|PipelineErrors::|Agent::|AgentEval::|AgentTraining::|Environment::)|"
                        r"(typeinfo|typeinfo name|vtable) for dqn::PipelineErrors?$)")
# Small sizes: the checks take seconds on two cores.
SMALL = ["batch=8", "network.trunk=[16,16]", "network.head_hidden=8"]


def fail(msg):
    sys.exit("FAIL: " + msg)


def main():
    build_root, source_root = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory(prefix="dqn-install-") as tmp:
        dest, libdir, bindir = sdk.install(build_root, tmp)
        prefix = os.path.dirname(bindir)
        dqn = os.path.join(bindir, "dqn")
        # 1. what the prefix holds
        for h in HEADERS:
            if not os.path.isfile(os.path.join(prefix, "include", "dqn", h)):
                fail(f"include/dqn/{h} is not installed")
        extra = sorted(set(os.listdir(os.path.join(prefix, "include", "dqn"))) - set(HEADERS))
        if extra:
            fail(f"include/dqn holds headers no plugin or exported function needs: {', '.join(extra)}")
        lib = os.path.join(libdir, "libdqn_engine.so")
        if not os.path.exists(lib):
            fail("libdqn_engine.so is not installed beside the pkgconfig folder")
        plugindir = os.path.join(libdir, "dqn", "plugins")
        for p in BUILTIN:
            if not os.path.isfile(os.path.join(plugindir, f"libdqn_{p}.so")):
                fail(f"the built-in plugin {p} is not in {plugindir}")
        pc = open(os.path.join(libdir, "pkgconfig", "dqn-engine.pc")).read()
        print(pc)
        if "prefix=${pcfiledir}" not in pc:
            fail("dqn-engine.pc is not relocatable (its prefix is not relative to the file)")
        cuda = re.search(r"^cuda=(\w+)", pc, re.M)
        if not cuda or f"-DDQN_WITH_CUDA={1 if cuda.group(1) == 'true' else 0}" not in pc:
            fail("dqn-engine.pc's Cflags do not say DQN_WITH_CUDA as its cuda variable does")
        if cuda.group(1) == "true" and ("-lcudart" not in pc or "nvcc_flags=" not in pc):
            fail("dqn-engine.pc of a CUDA build lacks the runtime library or the nvcc flags")
        # its abi variable is the one the installed plugin.hpp declares
        hpp = open(os.path.join(prefix, "include", "dqn", "plugin.hpp")).read()
        want = ".".join(re.search(rf"kAbi{part} = (\d+);", hpp).group(1) for part in ("Major", "Minor"))
        if f"abi={want}\n" not in pc:
            fail(f"dqn-engine.pc's abi variable is not {want}, the installed plugin.hpp's")
        # 2. the shared library exports the SDK only
        nm = sdk.must(["nm", "-D", "--defined-only", "-C", lib], "listing the library's symbols")
        names = [" ".join(l.split()[2:]) for l in nm.stdout.splitlines() if len(l.split()) >= 3]
        stray = [n for n in names if not SDK_SYMBOL.match(n)]
        if stray:
            fail(f"libdqn_engine.so exports {len(stray)} symbol(s) outside the SDK, e.g. {stray[:5]}")
        if "dqn::cli_main(int, char**)" not in names:
            fail("libdqn_engine.so does not export dqn::cli_main")
        print(f"libdqn_engine.so exports {len(names)} symbols, all the SDK's")
        # 3. the installed dqn finds its own plugins, and no build tree's
        env = sdk.clean_env()
        p = sdk.must([dqn, "plugins"], "the installed dqn listing its plugins", env=env)
        if f"search path: {plugindir}\n" not in p.stdout:
            fail(f"the installed dqn's search path is not {plugindir}")
        if os.path.realpath(build_root) in p.stdout:
            fail("the installed dqn searches the build tree")
        for b in BUILTIN:
            if f"\n{b} " not in p.stdout:
                fail(f"the installed dqn does not list {b}")
        # 4. the example, against the prefix alone
        ex = sdk.build_example(source_root, libdir, tmp)
        p = sdk.must([dqn, "plugins", "--plugin-path", ex], "listing the example", env=env)
        if "\nqr_dqn " not in p.stdout or "roles: primary, auxiliary" not in p.stdout:
            fail("the installed dqn does not list the qr_dqn plugin as a primary")
        yaml = os.path.join(source_root, "examples", "plugins", "qr_dqn", "qr_dqn.yaml")
        p = sdk.must([dqn, "check-head", yaml, "--plugin-path", ex] + SMALL, "dqn check-head on the example", env=env)
        if "head qr_dqn:" not in p.stdout or "all within tolerance" not in p.stdout:
            fail("dqn check-head did not pass the example's head")
        p = sdk.must([dqn, "step", yaml, "--plugin-path", ex, "--backend", "cpu", "--random-batch", "1", "--steps", "5"]
                     + SMALL, "CPU steps with the example as the primary", env=env)
        m = re.search(r"^\s+qr_dqn\s+loss (\S+)", p.stdout, re.M)
        if not m or not math.isfinite(float(m.group(1))) or float(m.group(1)) <= 0:
            fail("the steps' report has no positive finite qr_dqn loss")
        # 5. the environment example, against the prefix alone: listed with its spaces, and trained
        ex = sdk.build_example(source_root, libdir, tmp, name="pendulum", kind="envs")
        p = sdk.must([dqn, "plugins", "--plugin-path", ex], "listing the environment example", env=env)
        if "environment Pendulum-v1" not in p.stdout or "1 branch of 5 bins over [-2, 2]" not in p.stdout:
            fail("the installed dqn does not list the pendulum example's task and spaces")
        yaml = os.path.join(source_root, "examples", "envs", "pendulum", "pendulum.yaml")
        run_dir = os.path.join(tmp, "pendulum-run")
        sdk.must([dqn, "train", yaml, "--plugin-path", ex, "--backend", "cpu", "--out", run_dir, "-q",
                  "training.total_steps=800", "training.learning_starts=200", "training.eval.every=400",
                  "training.eval.episodes=2"] + SMALL, "training on the environment example", env=env)
        lines = [l for l in open(os.path.join(run_dir, "metrics.jsonl")) if l.strip()]
        last = json.loads(lines[-1])
        if last.get("step") != 800 or last.get("train_steps", 0) <= 0 or not math.isfinite(last.get("eval_return", math.nan)):
            fail(f"the pendulum run did not train 800 steps with an evaluation: {lines[-1]}")
        # 6. a program on the API, against the prefix alone: it trains CartPole to a mean return of 475
        ex = sdk.build_example(source_root, libdir, tmp, name="cartpole", kind="api", artifact="cartpole_agent")
        run_env = dict(env, LD_LIBRARY_PATH=libdir)
        p = sdk.run([os.path.join(ex, "cartpole_agent"), os.path.join(source_root, "pipelines", "default.yaml"),
                     "--backend", "cpu"], env=run_env)
        if p.returncode != 0 or "solved at step" not in p.stdout:
            fail(f"the API example did not train CartPole to 475 (exit {p.returncode})")
        print("OK: installed SDK, exports, plugin discovery, the head example built, checked and stepped, the "
              "environment example built, listed and trained, and the API example built and trained to 475")


if __name__ == "__main__":
    main()
