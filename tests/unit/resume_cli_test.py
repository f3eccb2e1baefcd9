#!/usr/bin/env python3
"""`dqn train --resume` against the uninterrupted run, on the CPU.

Runs the same short training (checkpoints every 1000 steps) uninterrupted, and then:
  * killed with SIGKILL once a checkpoint is written, and resumed;
  * the same killed run with its newest checkpoint torn, resumed from the one before it;
  * killed with SIGKILL while a checkpoint is being written, resumed from the one before it;
  * stopped with SIGINT, resumed.
Every resumed run's metrics.jsonl (the measured times aside) and final weights must be identical to
the uninterrupted run's, and its TensorBoard event file must hold its metrics lines' numbers, one
record per line (the records written after the checkpoint cut away, as the lines are). Then the refusals: --out over a run, resuming a finished run, --resume with
a pipeline, a directory that is not a run, a run with no checkpoint.

usage: resume_cli_test.py DQN PIPELINE
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tb_events  # noqa: E402

DQN, PIPELINE = sys.argv[1], sys.argv[2]
SETTINGS = ["--backend", "cpu", "--steps", "4000", "-q",
            "--set", "training.checkpoint_every=1000", "--set", "training.checkpoint_keep=2",
            # a replay of 300,000 slots makes each checkpoint some 13 MB: a write lasts long enough
            # to be caught in the middle
            "--set", "training.replay.capacity=300000", "--set", "training.stop_at_return=0"]
TIMES = {"wall_s", "steps_per_s", "train_steps_per_s"}
failures = []


def check(ok, what):
    print(("ok: " if ok else "FAIL: ") + what, flush=True)
    if not ok:
        failures.append(what)


def rows(run):
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return [{k: v for k, v in json.loads(line).items() if k not in TIMES} for line in f]


def read(path):
    with open(path, "rb") as f:
        return f.read()


def train(run, *extra):
    return subprocess.run([DQN, "train", PIPELINE, "--out", run, *SETTINGS, *extra], capture_output=True, text=True)


def resume(run):
    return subprocess.run([DQN, "train", "--resume", run, "-q"], capture_output=True, text=True)


def start(run):
    return subprocess.Popen([DQN, "train", PIPELINE, "--out", run, *SETTINGS], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def ckpt(run, step):
    return os.path.join(run, "checkpoints", "step-%012d.safetensors" % step)


def wait_for(proc, cond, what, timeout=300):
    end = time.time() + timeout
    while not cond():
        if proc.poll() is not None:
            raise SystemExit("FAIL: the run ended before " + what + ":\n" + proc.stderr.read())
        if time.time() > end:
            proc.kill()
            raise SystemExit("FAIL: no " + what + " within %d s" % timeout)
        time.sleep(0.0002)


def same_as_full(run, res, label):
    check(res.returncode == 0, "%s: resumed run exits 0 (rc %d: %s)" % (label, res.returncode, res.stderr.strip()[-300:]))
    a, b = rows(full), rows(run)
    check(a == b, "%s: %d metrics rows identical to the uninterrupted run's (%d there)" % (label, len(b), len(a)))
    if a != b:
        for x, y in zip(a, b):
            if x != y:
                print("  uninterrupted:", x, "\n  resumed:      ", y)
                break
    check(read(os.path.join(run, "weights.safetensors")) == read(os.path.join(full, "weights.safetensors")),
          "%s: final weights.safetensors bit-identical" % label)
    events_match(run, label)


def events_match(run, label):
    try:
        problems = tb_events.compare_with_metrics(run)
    except ValueError as e:
        problems = [str(e)]
    check(not problems, "%s: the event file holds the metrics lines' numbers at their steps%s" %
          (label, "" if not problems else ": " + "; ".join(problems[:3])))


tmp = tempfile.mkdtemp(prefix="dqn-resume-cli-")
try:
    full = os.path.join(tmp, "full")
    r = train(full)
    check(r.returncode == 0, "uninterrupted run exits 0 (%s)" % r.stderr.strip()[-300:])
    n_full = len(rows(full))
    events_match(full, "uninterrupted")

    # SIGKILL once the checkpoint at 2000 is written.
    killed = os.path.join(tmp, "killed")
    p = start(killed)
    wait_for(p, lambda: os.path.exists(ckpt(killed, 2000)), "checkpoint at step 2000")
    p.kill()
    p.wait()
    torn = os.path.join(tmp, "torn")
    shutil.copytree(killed, torn)
    res = resume(killed)
    check("from %s (step 2000 of 4000)" % ckpt(killed, 2000) in res.stderr, "killed: resumes from step 2000")
    same_as_full(killed, res, "killed")

    # The same with the newest checkpoint torn (as a disk that lost its tail leaves it).
    with open(ckpt(torn, 2000), "r+b") as f:
        f.truncate(os.path.getsize(ckpt(torn, 2000)) // 3)
    res = resume(torn)
    check("step-000000002000.safetensors: truncated" in res.stderr and "skipped" in res.stderr,
          "torn: the torn checkpoint is named and skipped (%s)" % res.stderr.strip().splitlines()[:1])
    check("from %s (step 1000 of 4000)" % ckpt(torn, 1000) in res.stderr, "torn: resumes from step 1000")
    same_as_full(torn, res, "torn")

    # SIGKILL while the checkpoint at 2000 is being written (its temporary exists, the file not yet).
    caught = False
    for attempt in range(3):
        mid = os.path.join(tmp, "mid%d" % attempt)
        p = start(mid)
        wait_for(p, lambda: os.path.exists(ckpt(mid, 1000)), "checkpoint at step 1000")
        folder = os.path.join(mid, "checkpoints")
        prefix = os.path.basename(ckpt(mid, 2000)) + ".tmp."
        wait_for(p, lambda: any(n.startswith(prefix) for n in os.listdir(folder)) or os.path.exists(ckpt(mid, 2000)),
                 "checkpoint write at step 2000")
        p.kill()
        p.wait()
        if not os.path.exists(ckpt(mid, 2000)) and any(n.startswith(prefix) for n in os.listdir(folder)):
            caught = True
            break
        print("  (the write at 2000 finished before the kill landed: again)")
    check(caught, "mid-write: killed while the checkpoint at 2000 was being written")
    if caught:
        res = resume(mid)
        check("an interrupted write" in res.stderr, "mid-write: the half-written file is reported (%s)" %
              res.stderr.strip().splitlines()[:1])
        check("from %s (step 1000 of 4000)" % ckpt(mid, 1000) in res.stderr, "mid-write: resumes from step 1000")
        check(not any(n.startswith(prefix) for n in os.listdir(folder)), "mid-write: the temporary is removed")
        same_as_full(mid, res, "mid-write")

    # SIGINT: the run stops, writes a checkpoint of where it stopped, and says how to continue.
    stopped = os.path.join(tmp, "sigint")
    p = start(stopped)
    wait_for(p, lambda: os.path.exists(ckpt(stopped, 1000)), "checkpoint at step 1000")
    p.send_signal(signal.SIGINT)
    _, err = p.communicate()
    check(p.returncode == 130 and "dqn train --resume " + stopped in err,
          "sigint: exits 130 naming the resume command (rc %d)" % p.returncode)
    check(rows(stopped)[-1].get("interrupted") is True, "sigint: its last metrics line says interrupted")
    same_as_full(stopped, resume(stopped), "sigint")
    check(any(n.startswith("metrics.after-step-") for n in os.listdir(stopped)),
          "sigint: the interrupted run's final line is kept aside")

    # Refusals.
    r = train(full)
    check(r.returncode == 1 and "--resume " + full in r.stderr and len(rows(full)) == n_full,
          "--out over a run is refused, pointing to --resume, and the run is untouched")
    r = resume(full)
    check(r.returncode == 1 and "the run finished at step 4000: there is nothing to resume" in r.stderr and
          r.stderr.count("nothing to resume") == 1 and "--weights " + os.path.join(full, "weights.safetensors") in r.stderr,
          "a finished run is not resumed, said once, with how to train on from its weights (%s)" % r.stderr.strip())
    r = subprocess.run([DQN, "train", PIPELINE, "--resume", full], capture_output=True, text=True)
    check(r.returncode == 2 and "cannot be given with it: a pipeline file" in r.stderr, "--resume with a pipeline is refused")
    r = resume(os.path.join(tmp, "nowhere"))
    check(r.returncode == 1 and "no such directory" in r.stderr, "--resume of a missing directory")
    bare = os.path.join(tmp, "bare")
    r = subprocess.run([DQN, "train", PIPELINE, "--out", bare, "--backend", "cpu", "--steps", "200", "-q",
                        "--set", "training.checkpoint_every=0"], capture_output=True, text=True)
    check(r.returncode == 0 and not os.path.exists(os.path.join(bare, "checkpoints")),
          "checkpoint_every 0 writes no checkpoint")
    lines = open(os.path.join(bare, "metrics.jsonl")).read().splitlines()
    with open(os.path.join(bare, "metrics.jsonl"), "w") as f:  # as if it had been killed before its end
        f.write("".join(line + "\n" for line in lines[:-1]))
    r = resume(bare)
    check(r.returncode == 1 and "no whole checkpoint" in r.stderr and "ended before its first one" in r.stderr and
          "start the run again" in r.stderr, "a run without checkpoints says so and how to start over: %s" %
          r.stderr.strip())

    # training.checkpoint_minutes: a checkpoint once that much wall-clock time has passed, whatever
    # checkpoint_every says (a vanishing bound: one after every iteration but the last, keep 1).
    timed = os.path.join(tmp, "timed")
    r = subprocess.run([DQN, "train", PIPELINE, "--out", timed, "--backend", "cpu", "--steps", "2000", "-q",
                        "--set", "training.checkpoint_every=100000", "--set", "training.checkpoint_minutes=1e-9",
                        "--set", "training.checkpoint_keep=1", "--set", "training.stop_at_return=0"],
                       capture_output=True, text=True)
    folder = os.path.join(timed, "checkpoints")
    check(r.returncode == 0 and os.path.isdir(folder) and os.listdir(folder) == ["step-000000001992.safetensors"],
          "checkpoint_minutes brings checkpoints between checkpoint_every's (%s)" %
          (os.listdir(folder) if os.path.isdir(folder) else r.stderr.strip()[-200:]))
finally:
    shutil.rmtree(tmp, ignore_errors=True)

print("%d failure(s)" % len(failures))
sys.exit(1 if failures else 0)
