#!/usr/bin/python3
"""Plots learning curves from `dqn train` run directories: the greedy evaluation return (mean over
the evaluation episodes) and the training episodes' running mean return,
against environment steps, one colour per run.

    tools/plot_learning.py runs/learning-seed1 runs/learning-seed2 runs/learning-seed3 -o docs/learning.png

Each argument is a run directory (or its metrics.jsonl). Needs matplotlib (Debian: python3-matplotlib).
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")  # files only: no display needed
import matplotlib.pyplot as plt  # noqa: E402


def read_metrics(path):
    if os.path.isdir(path):
        path = os.path.join(path, "metrics.jsonl")
    lines = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                lines.append(json.loads(line))
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{n}: not a JSON line: {e}")
    if not lines:
        sys.exit(f"{path}: no metrics lines")
    return path, lines


def label_of(path, lines):
    run = os.path.basename(os.path.dirname(os.path.abspath(path)))
    seed, stop = None, None
    yaml = os.path.join(os.path.dirname(path), "pipeline.yaml")
    if os.path.isfile(yaml):  # the resolved pipeline: one key per line
        for line in open(yaml):
            if line.startswith("seed:"):
                seed = line.split(":", 1)[1].strip()
            if line.strip().startswith("stop_at_return:"):
                stop = float(line.split(":", 1)[1])
    label = f"seed {seed}" if seed is not None else run
    return label + (", no early stop" if stop == 0 else "")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="run directories or metrics.jsonl files")
    ap.add_argument("-o", "--out", default="learning.png", help="image to write (default learning.png)")
    ap.add_argument("--target", type=float, default=475.0, help="horizontal line at this return (0: none)")
    ap.add_argument("--title", default="C51 on CartPole-v1: dqn train pipelines/default.yaml")
    a = ap.parse_args()

    fig, ax = plt.subplots(figsize=(8, 6), dpi=110)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, run in enumerate(a.runs):
        path, lines = read_metrics(run)
        c = colours[i % len(colours)]
        label = label_of(path, lines)
        ev = [m for m in lines if "eval_return" in m]
        if ev:
            steps = [m["step"] for m in ev]
            ax.plot(steps, [m["eval_return"] for m in ev], "-o", color=c, ms=4, lw=1.8, zorder=3 - 0.1 * i,
                    label=f"{label}: greedy eval (mean of {ev[-1].get('eval_episodes', '?')})")
        tr = [m for m in lines if m.get("episode_return") is not None]
        if tr:
            ax.plot([m["step"] for m in tr], [m["episode_return"] for m in tr], ":", color=c, lw=1.2,
                    label=f"{label}: training episodes (mean of last 20)")
        wall = lines[-1].get("wall_s")
        if wall is not None:
            print(f"{path}: {len(ev)} evaluations, final {ev[-1]['eval_return'] if ev else 'none'}, "
                  f"{lines[-1]['step']} env steps, {wall:.1f} s")
    if a.target > 0:
        ax.axhline(a.target, color="grey", lw=1, ls="--", label=f"target {a.target:g}")
    ax.set_xlabel("environment steps (all copies)")
    ax.set_ylabel("episode return")
    ax.set_ylim(0, 520)
    ax.set_title(a.title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, frameon=False)
    fig.tight_layout()
    fig.savefig(a.out)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
