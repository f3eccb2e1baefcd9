#!/usr/bin/python3
"""Runs `dqn train PIPELINE --out TMP --seed N -q [KEY=VALUE …]` for each seed and checks the run
directory it wrote: the resolved pipeline, metrics.jsonl (every line a JSON object with the
documented keys, per head for --heads, the first being the primary), the weights (the primary's
--weights-key among them), and that the final evaluation's mean greedy return is at least
--min-return, and, with --min-success, that its success rate (a task that reports successes) is at
least that; and that `dqn eval` with the last evaluation's seed reports the same mean."""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

KEYS = ["step", "episodes", "episode_return", "epsilon", "total_loss", "steps_per_s", "wall_s", "skipped_steps"]


def safetensors_names(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return set(header) - {"__metadata__"}


def check_run(dqn, pipeline, seed, min_return, heads, weights_key, plugin_path=None, env=None, overrides=(),
              min_success=None):
    """One training run and its checks; exits with FAIL on the first problem."""
    keys = KEYS + [f"{k}.{h}" for h in heads for k in ("loss", "grad_norm", "clip")]
    with tempfile.TemporaryDirectory(prefix="dqn-learning-") as tmp:
        out = os.path.join(tmp, "run")
        cmd = [dqn, "train", pipeline, "--out", out, "--seed", str(seed), "-q"] + list(overrides)
        if plugin_path:
            cmd += ["--plugin-path", plugin_path]
        print("$", " ".join(cmd), flush=True)
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        print(p.stdout)
        if p.returncode != 0:
            sys.exit(f"FAIL: dqn train exited with {p.returncode}")
        for f in ("pipeline.yaml", "metrics.jsonl", "weights.safetensors", "best.safetensors"):
            if not os.path.isfile(os.path.join(out, f)):
                sys.exit(f"FAIL: the run directory lacks {f}")
        lines = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if l.strip()]
        if not lines:
            sys.exit("FAIL: metrics.jsonl is empty")
        for i, m in enumerate(lines):
            missing = [k for k in keys if k not in m]
            if missing:
                sys.exit(f"FAIL: metrics.jsonl line {i + 1} lacks {missing}")
        steps = [m["step"] for m in lines]
        if steps != sorted(steps):
            sys.exit(f"FAIL: steps go backwards: {steps}")
        evals = [(m["step"], m["eval_return"]) for m in lines if "eval_return" in m]
        if not evals:
            sys.exit("FAIL: no evaluation in metrics.jsonl")
        if not lines[-1].get("final") or "eval_return" not in lines[-1]:
            sys.exit("FAIL: the last line is not the final evaluation")
        if weights_key not in safetensors_names(os.path.join(out, "weights.safetensors")):
            sys.exit(f"FAIL: weights.safetensors has no {weights_key}")
        # dqn eval replays the last evaluation from its seed: the same mean, to the bit.
        cmd = [dqn, "eval", out, "--seed", str(lines[-1]["eval_seed"]), "--json"]
        if plugin_path:
            cmd += ["--plugin-path", plugin_path]
        e = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        if e.returncode != 0:
            sys.exit(f"FAIL: dqn eval exited with {e.returncode}: {e.stderr}")
        replay = json.loads(e.stdout)
        if replay["mean"] != lines[-1]["eval_return"] or replay["episodes"] != lines[-1]["eval_episodes"]:
            sys.exit(f"FAIL: dqn eval --seed {lines[-1]['eval_seed']}: mean {replay['mean']} over {replay['episodes']} "
                     f"episodes, the run's last evaluation {lines[-1]['eval_return']} over {lines[-1]['eval_episodes']}")
        print(f"OK: dqn eval replays the last evaluation: mean {replay['mean']:.1f}")
        print("evaluations (step, mean return):", ", ".join(f"({s}, {r:.1f})" for s, r in evals))
        final = evals[-1][1]
        if min_success is not None:
            rates = [(m["step"], m.get("eval_success")) for m in lines if "eval_return" in m]
            print("success rates (step, rate):", ", ".join(f"({s}, {r})" for s, r in rates))
            rate = lines[-1].get("eval_success")
            if rate is None:
                sys.exit("FAIL: the final evaluation has no eval_success (does the task report successes?)")
            if rate < min_success:
                sys.exit(f"FAIL: seed {seed}: final greedy success rate {rate:.2f} < {min_success}")
            print(f"OK: seed {seed}: final greedy success rate {rate:.2f} >= {min_success} at step {evals[-1][0]}")
        if final < min_return:
            sys.exit(f"FAIL: seed {seed}: final mean greedy eval return {final:.1f} < {min_return}")
        print(f"OK: seed {seed}: final mean greedy eval return {final:.1f} >= {min_return} at step {evals[-1][0]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dqn")
    ap.add_argument("pipeline")
    ap.add_argument("--seed", default="1", help="comma-separated: every seed must learn")
    ap.add_argument("--min-return", type=float, default=475.0)
    ap.add_argument("--heads", default="c51", help="heads whose loss, grad_norm and clip every line carries")
    ap.add_argument("--weights-key", default="c51.value.0.weight", help="a tensor the weights must hold")
    ap.add_argument("--plugin-path", default=None)
    ap.add_argument("--min-success", type=float, default=None, help="the final evaluation's success rate, at least")
    ap.add_argument("overrides", nargs="*", help="pipeline overrides, key=value")
    a = ap.parse_args()
    for seed in a.seed.split(","):
        check_run(a.dqn, a.pipeline, seed, a.min_return, a.heads.split(","), a.weights_key, a.plugin_path,
                  overrides=a.overrides, min_success=a.min_success)


if __name__ == "__main__":
    main()
