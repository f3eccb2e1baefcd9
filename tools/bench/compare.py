#!/usr/bin/env python3
"""Runs `dqn bench` and the PyTorch peer on the same GPU in one invocation and prints both with
the ratio (peer time / engine time). Shapes and constants are read from the pipeline by `dqn`;
the peer gets the same ones on its command line.

    python3 tools/bench/compare.py --dqn build-gpu/tools/dqn --pipeline pipelines/ref.yaml \
        --batch 256,1024,4096 --precision tf32,fp32,bf16 [--heads c51] [--json-out FILE]

With --epoch it compares training epochs that draw their batches from a full replay on the GPU
(`dqn bench --epoch` against torch_epoch.py), per replay kind, by time per step.

One batch size at a time: the engine, then the peer, then that batch's rows printed (and the JSON
file rewritten), so that a run cut off by a time box keeps every batch it finished.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys


def run_json_lines(cmd: list[str]) -> list[dict]:
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    out = subprocess.run(cmd, capture_output=True, text=True)
    sys.stderr.write(out.stderr)
    if out.returncode != 0:  # its own message says why (no GPU, a bad pipeline key, ...)
        sys.stderr.write(out.stdout)
        raise SystemExit(f"compare.py: {cmd[0]} exited with {out.returncode}")
    rows = []
    for line in out.stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            rows.append(json.loads(line))
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dqn", required=True, help="path to the dqn binary")
    p.add_argument("--pipeline", default="pipelines/ref.yaml")
    p.add_argument("--batch", default="256,1024,4096")
    p.add_argument("--precision", default="tf32")
    p.add_argument("--heads", default="c51", help="comma list for the peer (must match the pipeline)")
    p.add_argument("--peer-modes", default="graph", help="graph, eager or both (comma list)")
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--peer-args", default="", help="extra arguments for torch_peer.py (shapes, constants)")
    p.add_argument("--peer", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_peer.py"),
                   help="the peer script (default: torch_peer.py beside this one)")
    p.add_argument("--set", action="append", default=[], help="pipeline override for dqn (key=value)")
    p.add_argument("--json-out", help="write every row here")
    p.add_argument("--epoch", action="store_true", help="epochs drawing from a replay on the GPU, both sides")
    p.add_argument("--replay", default="uniform,prioritized", help="--epoch: replay kinds")
    p.add_argument("--replay-size", default="1000000", help="--epoch: transitions in the replay")
    p.add_argument("--epoch-steps", default="10000", help="--epoch: the engine's steps per timed epoch")
    p.add_argument("--peer-epoch-steps", default="2000", help="--epoch: the peer's steps per timed epoch")
    a = p.parse_args()

    batches = [b.strip() for b in a.batch.split(",") if b.strip()]
    if not batches:
        raise SystemExit(f"compare.py: --batch '{a.batch}': expected a comma list of batch sizes")
    common = ["--precision", a.precision, "--warmup", str(a.warmup), "--repeats", str(a.repeats), "--json"]
    if not a.epoch:
        common += ["--iters", str(a.iters)]
    sets = [arg for s in a.set for arg in ("--set", s)]  # the pipeline overrides, for dqn only
    ours, peer, rows = [], [], []
    print(f"{'precision':>9} {'batch':>6} {'replay':>11} {'dqn_us':>10} {'peer_mode':>9} {'peer_us':>10} {'ratio':>8}",
          flush=True)
    for batch in batches:
        # The engine on the GPU (the comparison is the same step on the same GPU): without one, dqn
        # stops at once with why, instead of timing thousands of CPU steps.
        if a.epoch:
            replay = ["--replay", a.replay, "--replay-size", a.replay_size]
            o_rows = run_json_lines([a.dqn, "bench", a.pipeline, "--backend", "cuda", "--batch", batch, "--epoch",
                                     "--epoch-steps", a.epoch_steps, *replay, *common, *sets])
            epoch_peer = os.path.join(os.path.dirname(a.peer), "torch_epoch.py")
            q_rows = run_json_lines([sys.executable, epoch_peer, "--heads", a.heads, "--batch", batch,
                                     "--epoch-steps", a.peer_epoch_steps, *replay, *common, *a.peer_args.split()])
        else:
            o_rows = run_json_lines([a.dqn, "bench", a.pipeline, "--backend", "cuda", "--batch", batch, *common,
                                     *sets])
            q_rows = run_json_lines([sys.executable, a.peer, "--mode", a.peer_modes, "--heads", a.heads,
                                     "--batch", batch, *common, *a.peer_args.split()])
        ours += o_rows
        peer += q_rows
        for o in o_rows:
            for q in q_rows:
                if q["batch"] == o["batch"] and q["precision"] == o["precision"] and \
                        q.get("replay", "none") == o.get("replay", "none"):
                    ratio = q["us_per_step_median"] / o["us_per_step_median"]
                    rows.append({"precision": o["precision"], "batch": o["batch"], "replay": o.get("replay", "none"),
                                 "dqn_us": o["us_per_step_median"], "dqn_epoch_s": o.get("epoch_s"),
                                 "peer_mode": q["mode"], "peer_us": q["us_per_step_median"], "ratio": ratio,
                                 "graph_nodes": o.get("graph_nodes"), "gpu": q.get("gpu"), "torch": q.get("torch")})
                    print(f"{o['precision']:>9} {o['batch']:>6} {o.get('replay', ''):>11} "
                          f"{o['us_per_step_median']:>10.2f} {q['mode']:>9} "
                          f"{q['us_per_step_median']:>10.2f} {ratio:>7.1f}x", flush=True)
        if a.json_out:  # rewritten after every batch: what a cut-off run finished stays
            with open(a.json_out, "w") as f:
                json.dump({"dqn": ours, "peer": peer, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
