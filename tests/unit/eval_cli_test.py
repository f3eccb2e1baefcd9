#!/usr/bin/env python3
"""`dqn eval` on the CPU: a short CartPole run's last evaluation replayed from its metrics line's
eval_seed (the same mean, to the bit), the JSON's fields, the episodes spread evenly over the
copies, the default seed apart from training's and reproducible, ε = 1 playing at random, --best,
and the errors (no run, a weights file without its pipeline, an unknown task, a task the network
does not fit).

usage: eval_cli_test.py DQN PIPELINE
"""
import json
import os
import subprocess
import sys
import tempfile

DQN, PIPELINE = sys.argv[1], sys.argv[2]
failures = []


def check(ok, what):
    print(("ok: " if ok else "FAIL: ") + what, flush=True)
    if not ok:
        failures.append(what)


def dqn(*args):
    p = subprocess.run([DQN, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return p.returncode, p.stdout, p.stderr


with tempfile.TemporaryDirectory(prefix="dqn-eval-") as tmp:
    run = os.path.join(tmp, "run")
    rc, out, err = dqn("train", PIPELINE, "--out", run, "--backend", "cpu", "--steps", "6000", "--seed", "2", "-q",
                       "training.stop_at_return=0", "training.eval.every=3000")
    check(rc == 0, f"dqn train exits 0 ({rc}: {err.strip()[-300:]})")
    lines = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl"))]
    evals = [l for l in lines if "eval_return" in l]
    last = evals[-1]
    check(last.get("final") and "eval_seed" in last, "the final metrics line has an evaluation and its eval_seed")
    check(len({l["eval_seed"] for l in evals}) == len(evals), "every evaluation has a seed of its own")

    rc, out, err = dqn("eval", run, "--seed", str(last["eval_seed"]), "--json")
    check(rc == 0, f"dqn eval --json exits 0 ({err.strip()})")
    r = json.loads(out)
    check(r["mean"] == last["eval_return"], f"the replayed evaluation's mean {r['mean']} is the run's {last['eval_return']}")
    check(r["min"] == last["eval_min"] and r["max"] == last["eval_max"], "and its min and max")
    check(r["episodes"] == last["eval_episodes"] == 20, f"{r['episodes']} episodes, as training.eval.episodes")
    check(len(r["returns"]) == 20 and len(r["lengths"]) == 20, "every episode's return and length listed")
    check(abs(sum(r["returns"]) / 20 - r["mean"]) < 1e-9, "the mean is the returns' mean")
    check(r["lengths"] == [int(x) for x in r["returns"]], "CartPole: each length is its return")
    check(r["env"] == "cartpole:CartPole-v1" and r["success"] is None, f"env {r['env']}, no success rate")
    check(min(r["lengths"]) == r["length_min"] and max(r["lengths"]) == r["length_max"], "the lengths' min and max")

    rc, text, err = dqn("eval", run, "--seed", str(last["eval_seed"]))
    check(rc == 0 and "20 episodes" in text and f"mean {r['mean']:.2f}" in text,
          f"the text output says the same:\n{text}")

    rc1, a, _ = dqn("eval", run, "--json")
    rc2, b, _ = dqn("eval", run, "--json")
    check(rc1 == rc2 == 0 and a == b, "without --seed the evaluation is reproducible")
    check(json.loads(a)["seed"] not in {l["eval_seed"] for l in evals}, "and its seed is none of training's")

    # every seed a metrics line can hold (64 bits): one past 2^63 is taken as it is
    rc, out, _ = dqn("eval", run, "--seed", str(2**63 + 5), "--json")
    check(rc == 0 and json.loads(out)["seed"] == 2**63 + 5, "a seed above 2^63 is kept whole")
    rc, _, err = dqn("eval", run, "--seed", "-1")
    check(rc != 0 and "seed" in err.lower(), f"a negative seed is refused: {err.strip()}")

    rc, out, _ = dqn("eval", run, "--episodes", "30", "--json")
    r30 = json.loads(out) if rc == 0 else {}
    check(rc == 0 and r30["episodes"] == 30 and len(r30["returns"]) == 30,
          "--episodes 30: 30 episodes (15 copies of 2: the act step takes 20 rows)")

    rc, out, _ = dqn("eval", run, "--epsilon", "1", "--episodes", "40", "--json")
    rnd = json.loads(out) if rc == 0 else {"mean": 1e9}
    check(rnd["mean"] < 60, f"ε = 1 plays at random: mean {rnd['mean']:.1f} (a random CartPole policy: about 22)")

    rc, out, _ = dqn("eval", run, "--best", "--json")
    check(rc == 0 and json.loads(out)["episodes"] == 20, "--best evaluates best.safetensors")

    rc, _, err = dqn("eval", os.path.join(tmp, "nope"))
    check(rc == 1 and "nope" in err and "no such run directory" in err, f"a missing run is named: {err.strip()}")
    rc, _, err = dqn("eval", os.path.join(run, "weights.safetensors"))
    check(rc == 1 and "name the pipeline" in err, f"a weights file needs its pipeline: {err.strip()}")
    rc, out, err = dqn("eval", os.path.join(run, "weights.safetensors"), "--pipeline", os.path.join(run, "pipeline.yaml"),
                       "--seed", str(last["eval_seed"]), "--json")
    check(rc == 0 and json.loads(out)["mean"] == last["eval_return"], "a weights file with --pipeline: the same mean")
    rc, _, err = dqn("eval", run, "--env", "CartPol-v1")
    check(rc == 1 and "CartPole-v1" in err, f"an unknown task, with the close name: {err.strip()}")
    rc, _, err = dqn("eval", run, "--env", "reacher")
    check(rc == 1 and "network.state" in err, f"a task the network does not fit: {err.strip()}")
    rc, _, err = dqn("eval", run, "network.atoms=11")
    check(rc == 1 and "c51" in err.lower(), f"weights of another network: {err.strip()[:300]}")

print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
