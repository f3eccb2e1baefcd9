#!/usr/bin/env python3
"""Agent.run, Agent.resume and Agent.collect from Python: the pipeline's own loop into a run
directory (as `dqn train` writes it), Ctrl-C (KeyboardInterrupt in the main thread) stopping a run
with a checkpoint, Agent.resume finishing it with the uninterrupted run's final weights bit for
bit, and a dataset collected from the trained policy that an offline agent trains on.

usage: run_test.py SOURCE_ROOT BACKEND   (PYTHONPATH holds the built dqn_engine)"""
import _thread
import os
import tempfile
import threading
import time

import dqn_engine as de
from checks import args, check, finish

ROOT, BACKEND = args()
PIPELINE = os.path.join(ROOT, "pipelines", "default.yaml")
SMALL = ["network.trunk=[32,32]", "batch=32", "training.total_steps=6000", "training.learning_starts=200",
         "training.eval.every=2000", "training.eval.episodes=4", "training.checkpoint_every=1000",
         "training.stop_at_return=0"]


def read(path):
    with open(path, "rb") as f:
        return f.read()


with tempfile.TemporaryDirectory(prefix="dqn-run-") as tmp:
    full_dir, cut_dir = os.path.join(tmp, "full"), os.path.join(tmp, "cut")
    agent = de.Agent.from_file(PIPELINE, overrides=SMALL, backend=BACKEND)
    full = agent.run(full_dir, progress=False)
    check(full["env_steps"] == 6000 and full["train_steps"] > 0 and not full["interrupted"],
          f"run: 6000 env steps, {full['train_steps']} training steps")
    check(all(os.path.exists(os.path.join(full_dir, f)) for f in ("pipeline.yaml", "metrics.jsonl", "weights.safetensors")),
          "run: the run directory as dqn train writes it")
    check(full["final_eval"] is not None and agent.train_steps == full["train_steps"], "run: a final evaluation")

    # Ctrl-C once the first metrics line is written: the run stops with a checkpoint.
    cut = de.Agent.from_file(PIPELINE, overrides=SMALL, backend=BACKEND)
    metrics = os.path.join(cut_dir, "metrics.jsonl")

    def interrupt():
        end = time.time() + 120
        while time.time() < end and not (os.path.exists(metrics) and os.path.getsize(metrics) > 0):
            time.sleep(0.001)
        _thread.interrupt_main()

    threading.Thread(target=interrupt, daemon=True).start()
    stopped = cut.run(cut_dir, progress=False)
    check(stopped["interrupted"] and stopped["env_steps"] < 6000 and stopped["checkpoint"],
          f"Ctrl-C stops the run at {stopped['env_steps']} env steps with a checkpoint")
    again = de.Agent.resume(cut_dir, backend=BACKEND)
    check(again.resume_point is not None and again.resume_point[0] == stopped["checkpoint"],
          f"resume: from {again.resume_point}")
    done = again.run(progress=False)
    check(done["env_steps"] == 6000 and not done["interrupted"], "resume: the run ends where it would have")
    if BACKEND == "cpu":  # (CUDA's sums are deterministic too, but the test asks it of the reference)
        check(read(os.path.join(cut_dir, "weights.safetensors")) == read(os.path.join(full_dir, "weights.safetensors")),
              "resume: the final weights are the uninterrupted run's, bit for bit")
    try:
        de.Agent.resume(cut_dir, backend=BACKEND).run(progress=False)
        check(False, "a finished run is not resumed")
    except ValueError as e:
        check("nothing to resume" in str(e), f"a finished run is not resumed: {e}")

    # A dataset from the trained policy, and an offline agent trained on it.
    data = os.path.join(tmp, "data.safetensors")
    d = agent.collect(data, 2000, epsilon=0.1, seed=3)
    check(d["steps"] == 2000 and not d["stopped"] and os.path.exists(data) and d["complete_episodes"] >= 1,
          f"collect: {d['steps']} steps, {d['complete_episodes']} complete episodes, mean {d['behaviour_return']:.1f}")
    try:
        agent.collect(data, 100)
        check(False, "collect refuses an existing file")
    except ValueError as e:
        check("exists" in str(e), f"collect refuses an existing file: {e}")
    off = de.Agent.from_file(os.path.join(ROOT, "pipelines", "offline.yaml"), backend=BACKEND,
                             overrides=["training.dataset=" + data, "training.total_steps=200", "training.eval.every=100",
                                        "training.eval.episodes=2"])
    r = off.run(os.path.join(tmp, "offline"), progress=False)
    check(r["offline"] and r["env_steps"] == 0 and r["train_steps"] == 200, "offline: 200 training steps from the dataset")
finish()
