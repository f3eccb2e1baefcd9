#!/usr/bin/env python3
"""dqn_engine trains the reacher plugin's 4-link arm (pipelines/reacher.yaml: one branch of 5
torques per joint) through the module: the plugin's task as a Gymnasium-shaped dqn_engine.Env
(same-step reset, the final observation and the success in info), dqn_engine.fit, and the
engine's own greedy evaluation (50 episodes) until 90 % of them reach the target.

usage: fit_reacher_test.py SOURCE_ROOT cpu|cuda   (PYTHONPATH holds the built dqn_engine; cuda without a GPU
exits 77)"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dqn_engine as de  # noqa: E402
from checks import args, check, finish  # noqa: E402

root, backend = args()

env = de.make("reacher:reacher", seed=5, links=4, bins=5)
check(env.branches == 4 and env.actions_per_branch == [5] * 4 and env.observation_size == 26,
      f"the task's spaces: {env.observation_size} features, branches {env.actions_per_branch}")
check(env.control_ranges[0] == (-1.0, 1.0) and env.control(np.array([0, 2, 4, 1])) == [-1.0, 0.0, 1.0, -0.5],
      "bins map to evenly spaced torques")
obs, info = env.reset(seed=3)
ends = 0
for _ in range(200):
    obs, r, term, trunc, info = env.step(np.array([2, 2, 2, 2]))
    if term or trunc:
        ends += 1
        check("final_observation" in info and "success" in info and len(info["final_observation"]) == 26,
              "an ended episode's info holds its final observation and success")
        break
check(ends == 1, "an episode ends (75 steps at most)")
try:
    env.step(np.array([5, 0, 0, 0]))
    check(False, "an action out of range is refused")
except ValueError as e:
    check("5" in str(e), f"an action out of range is refused: {e}")

agent = de.Agent.from_file(os.path.join(root, "pipelines", "reacher.yaml"), backend=backend, overrides=["seed=3"])
rates = []


def callback(rec):
    if rec["step"] % 2000:
        return True
    ev = agent.evaluate(50)
    rates.append(ev["success"])
    print(f"step {rec['step']}: greedy success {ev['success']:.2f}, return {ev['mean']:.2f}", flush=True)
    return ev["success"] < 0.9


de.fit(agent, de.make("reacher:reacher", seed=3, links=4, bins=5), steps=60000, callback=callback, seed=3)
check(bool(rates) and rates[-1] >= 0.9, f"the agent reaches the target in {rates[-1] if rates else None:.0%} of 50 "
                                         f"greedy episodes after {2000 * len(rates)} steps")
finish()
