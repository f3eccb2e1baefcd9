#!/usr/bin/env python3
"""dqn_engine.fit trains C51 (pipelines/default.yaml) on a CartPole written in plain Python with
Gymnasium's interface (tests/python/cartpole.py) until a greedy evaluation on another instance
reaches a mean return of 475; the callback sees every record; the trained agent saves and loads;
the engine's errors cross as ValueError with their message.

usage: fit_cartpole_test.py SOURCE_ROOT cpu|cuda   (PYTHONPATH holds the built dqn_engine; cuda without a GPU
exits 77)"""
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dqn_engine as de  # noqa: E402
from cartpole import CartPole  # noqa: E402
from checks import args, check, finish  # noqa: E402

root, backend = args()


agent = de.Agent.from_file(os.path.join(root, "pipelines", "default.yaml"), backend=backend)
print(agent.describe(), flush=True)
check(agent.backend == backend, f"the agent runs on {agent.backend}")
seen = []


def callback(rec):
    seen.append(rec)
    if "eval_return" in rec:
        print(f"step {rec['step']}: eval {rec['eval_return']:.1f}, training episodes {rec['episode_return']}", flush=True)


history = de.fit(agent, CartPole(), steps=60000, eval_env=CartPole(), eval_episodes=20, callback=callback, seed=1)
evals = [h for h in history if "eval_return" in h]
check(history == seen, f"the callback saw all {len(history)} records")
check(bool(evals) and evals[-1]["eval_return"] >= 475,
      f"fit reached a mean greedy return of 475 on the Python CartPole: {evals[-1]['eval_return'] if evals else None} "
      f"at step {history[-1]['step']}")
check(all(h["train_steps"] > 0 for h in history if h["step"] > 2000), "it trained after learning_starts")
final = de.evaluate(agent, CartPole(), episodes=10, seed=99)
check(final["mean"] >= 400, f"10 more greedy episodes on a fresh instance: mean {final['mean']:.1f}")
# the engine's own CartPole plugin agrees that the policy balances
own = agent.evaluate(20)
check(own["mean"] >= 400, f"and on the cartpole plugin: mean {own['mean']:.1f} over {own['episodes']} episodes")

with tempfile.TemporaryDirectory() as tmp:
    f = os.path.join(tmp, "agent.safetensors")
    agent.save(f)
    again = de.Agent.from_file(os.path.join(root, "pipelines", "default.yaml"), backend=backend)
    again.load(f)
    obs = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
    check(np.array_equal(again.q_values(obs), agent.q_values(obs)), "save → load gives the same Q-values")

try:
    agent.act(np.zeros((2, 5), dtype=np.float32))
    check(False, "an observation of the wrong shape is refused")
except ValueError as e:
    check("expected (rows, 4)" in str(e), f"an observation of the wrong shape names the expected one: {e}")
try:
    de.Agent.from_text("name: t\nheads: [{plugin: c51, role: primary}]\ngama: 0.5\n", name="mine.yaml", backend="cpu")
    check(False, "a pipeline error is raised")
except ValueError as e:
    check("mine.yaml:3:1" in str(e) and "gamma" in str(e), f"a pipeline error keeps its place: {e}")

finish()
