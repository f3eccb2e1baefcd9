#!/usr/bin/python3
"""Runs `dqn train PIPELINE --out TMP --seed N -q` and checks the run directory it wrote: the
resolved pipeline, metrics.jsonl (every line a JSON object with the documented keys, per head for
--heads), the weights,
and that the final evaluation's mean greedy return is at least --min-return."""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

KEYS = ["step", "episodes", "episode_return", "epsilon", "loss.c51", "grad_norm.c51", "clip.c51",
        "total_loss", "steps_per_s", "wall_s", "skipped_steps"]


def safetensors_names(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return set(header) - {"__metadata__"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dqn")
    ap.add_argument("pipeline")
    ap.add_argument("--seed", default="1")
    ap.add_argument("--min-return", type=float, default=475.0)
    ap.add_argument("--heads", default="c51", help="heads whose loss, grad_norm and clip every line carries")
    a = ap.parse_args()
    keys = KEYS + [f"{k}.{h}" for h in a.heads.split(",") if h != "c51" for k in ("loss", "grad_norm", "clip")]
    with tempfile.TemporaryDirectory(prefix="dqn-learning-") as tmp:
        out = os.path.join(tmp, "run")
        cmd = [a.dqn, "train", a.pipeline, "--out", out, "--seed", a.seed, "-q"]
        print("$", " ".join(cmd), flush=True)
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
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
        if "c51.value.0.weight" not in safetensors_names(os.path.join(out, "weights.safetensors")):
            sys.exit("FAIL: weights.safetensors has no c51.value.0.weight")
        print("evaluations (step, mean return):", ", ".join(f"({s}, {r:.1f})" for s, r in evals))
        final = evals[-1][1]
        if final < a.min_return:
            sys.exit(f"FAIL: final mean greedy eval return {final:.1f} < {a.min_return}")
        print(f"OK: final mean greedy eval return {final:.1f} >= {a.min_return} at step {evals[-1][0]}")


if __name__ == "__main__":
    main()
