#!/usr/bin/env python3
"""`dqn export` on the CPU, for C51 on CartPole (one branch) and on the 4-link reacher (four
branches of continuous torques), and for the QR-DQN example as the primary on CartPole (built
from its sources among the test plugins): the ONNX file passes onnx.checker (full check), and a numpy
evaluation of its graph, and of the safetensors export's manifest graph over its tensors, gives the
engine's greedy actions (dqn_engine.Agent.act) on 1,000 observations, and Q-values within 1e-4 of
the engine's; the manifest says the sizes, the support (C51) or the quantiles (QR-DQN), the controls;
an existing file is not replaced without --force.

usage: export_test.py DQN SOURCE_ROOT FIXTURES_DIR   (PYTHONPATH holds the built dqn_engine; python3-onnx)"""
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import dqn_engine as de  # noqa: E402
from checks import check, finish  # noqa: E402

DQN, ROOT, FIXTURES = sys.argv[1], sys.argv[2], sys.argv[3]


def run(*args):
    p = subprocess.run([DQN, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return p.returncode, p.stdout, p.stderr


def evaluate(nodes, tensors, obs):
    """The graph's values for observations obs (float64 throughout): ONNX semantics of the
    operators the export uses."""
    v = dict(tensors)
    v["observations"] = obs.astype(np.float64)
    for n in nodes:
        x = [v[i] for i in n["inputs"]]
        a = n["attributes"]
        op = n["op"]
        if op == "Gemm":
            y = x[0] @ (x[1].T if a.get("transB", 0) else x[1]) + x[2]
        elif op == "Relu":
            y = np.maximum(x[0], 0.0)
        elif op == "Reshape":
            y = x[0].reshape([int(d) for d in x[1]])
        elif op == "Concat":
            y = np.concatenate(x, axis=a["axis"])
        elif op == "ReduceMean":
            y = x[0].mean(axis=tuple(a["axes"]), keepdims=bool(a.get("keepdims", 1)))
        elif op == "Add":
            y = x[0] + x[1]
        elif op == "Sub":
            y = x[0] - x[1]
        elif op == "Mul":
            y = x[0] * x[1]
        elif op == "Softmax":
            e = np.exp(x[0] - x[0].max(axis=a.get("axis", -1), keepdims=True))
            y = e / e.sum(axis=a.get("axis", -1), keepdims=True)
        elif op == "MatMul":
            y = x[0] @ x[1]
        elif op == "Identity":
            y = x[0]
        elif op == "ArgMax":
            y = np.argmax(x[0], axis=a["axis"])
            if a.get("keepdims", 1):
                y = np.expand_dims(y, a["axis"])
        else:
            raise ValueError(f"the test's evaluator has no {op}")
        v[n["output"]] = y
    return v["q"], v["actions"]


def onnx_graph(path):
    m = onnx.load(path)
    onnx.checker.check_model(m, full_check=True)
    tensors = {t.name: numpy_helper.to_array(t).astype(np.float64 if t.data_type == 1 else np.int64)
               for t in m.graph.initializer}
    nodes = []
    for n in m.graph.node:
        attrs = {}
        for at in n.attribute:
            attrs[at.name] = at.i if at.type == onnx.AttributeProto.INT else (
                at.f if at.type == onnx.AttributeProto.FLOAT else list(at.ints))
        nodes.append({"op": n.op_type, "inputs": list(n.input), "output": n.output[0], "attributes": attrs})
    return m, nodes, tensors


def safetensors_graph(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    manifest = json.loads(header.pop("__metadata__")["dqn.policy"])
    tensors = {}
    for name, t in header.items():
        a, b = t["data_offsets"]
        dt = {"F32": np.float32, "I64": np.int64}[t["dtype"]]
        arr = np.frombuffer(data[a:b], dtype=dt).reshape(t["shape"])
        tensors[name] = arr.astype(np.float64) if dt == np.float32 else arr
    return manifest, manifest["graph"]["nodes"], tensors


def engine_actions(run_dir, obs, plugin_path):
    agent = de.Agent.from_run(run_dir, backend="cpu", plugin_path=plugin_path)
    acts, qs = [], []
    for k in range(0, len(obs), agent.max_rows):
        acts.append(agent.act(obs[k:k + agent.max_rows]))
        qs.append(agent.q_values(obs[k:k + agent.max_rows]))
    return np.concatenate(acts), np.concatenate(qs)


def compare(label, q, actions, eq, ea):
    check(q.shape == eq.shape, f"{label}: q of shape {q.shape}")
    err = float(np.max(np.abs(q - eq) / (1.0 + np.abs(eq))))
    check(err < 1e-4, f"{label}: Q-values within 1e-4 of the engine's (largest relative error {err:.2e})")
    top2 = np.sort(eq, axis=-1)
    clear = (top2[..., -1] - top2[..., -2]) > 1e-5 * (1.0 + np.abs(top2[..., -1]))
    same = actions == ea
    check(bool(np.all(same[clear])), f"{label}: the engine's greedy action in all {int(clear.sum())} "
                                     f"(observation, branch) pairs without a near tie ({int((~clear).sum())} near ties)")
    check(clear.mean() > 0.95, f"{label}: near ties are rare ({int((~clear).sum())} of {clear.size})")


with tempfile.TemporaryDirectory(prefix="dqn-export-") as tmp:
    rng = np.random.default_rng(0)
    cases = [("cartpole", os.path.join(ROOT, "pipelines", "default.yaml"), ["training.total_steps=3000"], 4, 1, 2, ""),
             ("reacher", os.path.join(ROOT, "pipelines", "reacher.yaml"), ["training.total_steps=2000"], 26, 4, 5, ""),
             ("qr_dqn", os.path.join(ROOT, "examples", "plugins", "qr_dqn", "qr_dqn.yaml"),
              ["training.total_steps=3000"], 4, 1, 2, FIXTURES)]
    for name, pipeline, extra, S, D, A, plugin_path in cases:
        run_dir = os.path.join(tmp, name)
        where = ["--plugin-path", plugin_path] if plugin_path else []
        rc, _, err = run("train", pipeline, "--out", run_dir, "--backend", "cpu", "-q", *where, "training.stop_at_return=0",
                         "training.stop_at_success=0", "training.eval.every=1000", *extra)
        check(rc == 0, f"{name}: dqn train ({err.strip()[-300:]})")
        obs = rng.normal(0.0, 1.0, size=(1000, S)).astype(np.float32)
        ea, eq = engine_actions(run_dir, obs, plugin_path)
        onnx_path, st_path = os.path.join(tmp, name + ".onnx"), os.path.join(tmp, name + ".safetensors")
        rc, out, err = run("export", run_dir, "--format", "onnx", "--out", onnx_path, *where)
        check(rc == 0 and f"q [rows, {D}, {A}]" in out, f"{name}: dqn export --format onnx: {out.strip()} {err.strip()}")
        model, nodes, tensors = onnx_graph(onnx_path)
        check([i.name for i in model.graph.input] == ["observations"] and
              [o.name for o in model.graph.output] == ["q", "actions"], f"{name}: ONNX inputs and outputs")
        check(model.opset_import[0].version == 17, f"{name}: opset 17")
        q, actions = evaluate(nodes, tensors, obs)
        compare(f"{name} ONNX", q, actions, eq, ea)
        rc, out, err = run("export", run_dir, "--format", "safetensors", "--out", st_path, *where)
        check(rc == 0, f"{name}: dqn export --format safetensors ({err.strip()})")
        manifest, nodes, tensors = safetensors_graph(st_path)
        q, actions = evaluate(nodes, tensors, obs)
        compare(f"{name} safetensors", q, actions, eq, ea)
        check(manifest["observation_size"] == S and manifest["branches"] == D and
              manifest["actions_per_branch"] == [A] * D, f"{name}: the manifest's sizes")
        if name == "qr_dqn":
            taus = manifest.get("quantiles", [])
            check(manifest["head"]["plugin"] == "qr_dqn" and len(taus) == 32 and
                  abs(taus[0] - 1 / 64) < 1e-9 and abs(taus[-1] - 63 / 64) < 1e-9 and "support" not in manifest,
                  f"{name}: the 32 quantile midpoints {taus[:2]}…")
        else:
            check(len(manifest["support"]) == 51 and manifest["head"]["plugin"] == "c51", f"{name}: the C51 support")
        want = [None] if name != "reacher" else [[-1.0, 1.0]] * 4
        check(manifest["controls"] == want, f"{name}: controls {manifest['controls']}")
        check(manifest["pipeline_hash"].startswith("fnv1a64:"), f"{name}: the pipeline's hash")
        mine = os.path.join(tmp, name + ".module.onnx")
        de.Agent.from_run(run_dir, backend="cpu", plugin_path=plugin_path).export(mine, "onnx")
        check(open(mine, "rb").read() == open(onnx_path, "rb").read(), f"{name}: the module's export writes the same file")
        before = open(onnx_path, "rb").read()
        rc, _, err = run("export", run_dir, "--format", "onnx", "--out", onnx_path, *where)
        check(rc == 1 and "exists" in err and open(onnx_path, "rb").read() == before,
              f"{name}: an existing file is kept without --force: {err.strip()}")
        rc, _, _ = run("export", run_dir, "--format", "onnx", "--out", onnx_path, "--force", *where)
        check(rc == 0, f"{name}: --force replaces it")
finish()
