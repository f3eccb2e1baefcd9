#!/usr/bin/python3
"""Offline learning: a partly trained C51 policy (default.yaml stopped at --partial-steps) collects a
dataset with `dqn collect` (ε-greedy); pipelines/offline.yaml then trains C51 + CQL from that file
alone, and its final greedy evaluation must beat the behaviour policy's mean return. Plain offline
C51 (the cql head off) runs from the same file for comparison and is reported, not asserted."""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def run(cmd):
    print("$", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(p.stdout, flush=True)
    if p.returncode != 0:
        sys.exit(f"FAIL: {cmd[1]} exited with {p.returncode}")
    return p.stdout


def evals(run_dir):
    lines = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl")) if l.strip()]
    return [(m["step"], m["eval_return"]) for m in lines if "eval_return" in m]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dqn")
    ap.add_argument("source_dir")
    ap.add_argument("--partial-steps", type=int, default=4000)
    ap.add_argument("--collect-steps", type=int, default=20000)
    ap.add_argument("--epsilon", type=float, default=0.1)
    ap.add_argument("--offline-steps", type=int, default=5000)
    a = ap.parse_args()
    pipelines = os.path.join(a.source_dir, "pipelines")
    with tempfile.TemporaryDirectory(prefix="dqn-offline-") as tmp:
        part, data = os.path.join(tmp, "partial"), os.path.join(tmp, "data.safetensors")
        run([a.dqn, "train", os.path.join(pipelines, "default.yaml"), "--backend", "cpu", "--out", part, "-q",
             "--steps", str(a.partial_steps), "--set", "training.stop_at_return=0"])
        out = run([a.dqn, "collect", part, "--steps", str(a.collect_steps), "--epsilon", str(a.epsilon),
                   "--out", data, "--backend", "cpu"])
        behaviour = float(out.split("behaviour policy's mean return ")[1].split()[0])
        results = {}
        for name, cql in (("c51+cql", "true"), ("c51", "false")):
            d = os.path.join(tmp, name)
            run([a.dqn, "train", os.path.join(pipelines, "offline.yaml"), "--backend", "cpu", "--out", d, "-q",
                 "--steps", str(a.offline_steps), "--set", f"training.dataset={data}",
                 "--set", f"heads.1.enabled={cql}"])
            e = evals(d)
            if not e:
                sys.exit(f"FAIL: {name}: no evaluation in metrics.jsonl")
            results[name] = e
            print(f"{name}: evaluations (training step, mean return):", ", ".join(f"({s}, {r:.1f})" for s, r in e))
        final = results["c51+cql"][-1][1]
        print(f"behaviour policy {behaviour:.1f}; offline C51 + CQL final {final:.1f}; "
              f"offline C51 alone final {results['c51'][-1][1]:.1f}")
        if final <= behaviour:
            sys.exit(f"FAIL: offline C51 + CQL ended at {final:.1f}, not above the behaviour policy's {behaviour:.1f}")
        print("OK")


if __name__ == "__main__":
    main()
