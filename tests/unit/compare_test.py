#!/usr/bin/env python3
"""unit.compare: tools/bench/compare.py against stand-ins for `dqn bench` and the PyTorch peer (no GPU).

It checks that each batch size runs the engine and then the peer by itself and that its rows are
printed and written to --json-out before the next batch starts. A run cut off or failing at a
later batch keeps the batches it finished. It also checks the ratio (peer / engine), the
arguments passed through, and that a bad --batch or a failing command stops with a message that
names it.

    python3 compare_test.py path/to/bench/compare.py
"""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tempfile

# The stand-ins log their argv (one JSON line per call) and print bench-like JSON rows: the
# engine 10 µs per 256 rows of batch, the peer 7× that; FAIL_AT makes the peer fail at a batch.
ENGINE = r'''#!PYTHON
import json, os, sys
argv = sys.argv[1:]
with open(os.environ["LOG"], "a") as f:
    f.write(json.dumps({"who": "dqn", "argv": argv}) + "\n")
batch = argv[argv.index("--batch") + 1]
for prec in argv[argv.index("--precision") + 1].split(","):
    print(json.dumps({"precision": prec, "batch": int(batch), "us_per_step_median": 10.0 * int(batch) / 256,
                      "graph_nodes": 30}))
'''
PEER = r'''import json, os, sys
argv = sys.argv[1:]
with open(os.environ["LOG"], "a") as f:
    f.write(json.dumps({"who": "peer", "argv": argv}) + "\n")
batch = argv[argv.index("--batch") + 1]
if os.environ.get("FAIL_AT") == batch:
    print("peer: out of memory", file=sys.stderr)
    sys.exit(3)
for prec in argv[argv.index("--precision") + 1].split(","):
    print(json.dumps({"precision": prec, "batch": int(batch), "mode": "graph",
                      "us_per_step_median": 70.0 * int(batch) / 256, "gpu": "stand-in", "torch": "0"}))
'''

failures = 0


def check(cond: bool, what: str) -> None:
    global failures
    if not cond:
        failures += 1
        print(f"FAIL: {what}")


def main() -> int:
    compare = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory() as tmp:
        dqn = os.path.join(tmp, "dqn")
        with open(dqn, "w") as f:
            f.write(ENGINE.replace("PYTHON", sys.executable))
        os.chmod(dqn, os.stat(dqn).st_mode | stat.S_IXUSR)
        peer = os.path.join(tmp, "peer.py")
        with open(peer, "w") as f:
            f.write(PEER)
        log, out_json = os.path.join(tmp, "log.jsonl"), os.path.join(tmp, "rows.json")

        def run(batch: str, fail_at: str = "") -> subprocess.CompletedProcess:
            for path in (log, out_json):
                if os.path.exists(path):
                    os.remove(path)
            env = dict(os.environ, LOG=log, FAIL_AT=fail_at)
            return subprocess.run([sys.executable, compare, "--dqn", dqn, "--peer", peer, "--pipeline", "p.yaml",
                                   "--batch", batch, "--precision", "tf32,bf16", "--set", "heads.1.enabled=true",
                                   "--json-out", out_json], capture_output=True, text=True, env=env)

        def rows_file() -> dict:
            if not os.path.exists(out_json):
                check(False, "--json-out written")
                return {"rows": [], "dqn": [], "peer": []}
            with open(out_json) as f:
                return json.load(f)

        def calls() -> list[dict]:
            if not os.path.exists(log):
                return []
            with open(log) as f:
                return [json.loads(line) for line in f]

        # 1. two batches: engine then peer for each, one batch a call; rows and ratios
        r = run("256,1024")
        check(r.returncode == 0, f"two batches exit 0 (got {r.returncode}: {r.stderr})")
        c = calls()
        check([x["who"] for x in c] == ["dqn", "peer", "dqn", "peer"], f"order engine, peer per batch: {c}")
        batches = [x["argv"][x["argv"].index("--batch") + 1] for x in c]
        check(batches == ["256", "256", "1024", "1024"], f"one batch a call: {batches}")
        d0 = c[0]["argv"] if c else []
        check(d0[:4] == ["bench", "p.yaml", "--backend", "cuda"], f"dqn bench on the pipeline, cuda: {d0}")
        check("--set" in d0 and d0[d0.index("--set") + 1] == "heads.1.enabled=true", f"--set passed to dqn: {d0}")
        check(len(c) > 1 and "--json" in d0 and "--json" in c[1]["argv"], "both asked for JSON rows")
        lines = [ln.split() for ln in r.stdout.splitlines()]
        check(lines and lines[0][0] == "precision", f"header first: {r.stdout}")
        body = lines[1:]
        check(len(body) == 4, f"four rows (2 batches x 2 precisions): {r.stdout}")
        check(body != [] and all(row[-1] == "7.0x" for row in body), f"ratio peer/dqn 7.0x: {r.stdout}")
        check([row[1] for row in body] == ["256", "256", "1024", "1024"], f"rows by batch: {r.stdout}")
        doc = rows_file()
        check(len(doc["rows"]) == 4 and len(doc["dqn"]) == 4 and len(doc["peer"]) == 4, f"JSON rows: {doc}")
        check(len(doc["rows"]) == 4 and abs(doc["rows"][2]["dqn_us"] - 40.0) < 1e-9 and
              abs(doc["rows"][2]["ratio"] - 7.0) < 1e-9, f"JSON figures: {doc['rows']}")

        # 2. the peer fails at the second batch: exit non-zero with the command's message, the
        # first batch's rows printed and in the JSON file
        r = run("256,1024", fail_at="1024")
        check(r.returncode != 0, "a failing peer fails the run")
        check("exited with 3" in r.stderr and "out of memory" in r.stderr, f"says which and why: {r.stderr}")
        check(sum(1 for ln in r.stdout.splitlines() if ln.split()[1:2] == ["256"]) == 2,
              f"the first batch's rows printed: {r.stdout}")
        doc = rows_file()
        check([row["batch"] for row in doc["rows"]] == [256, 256], f"the first batch's rows kept: {doc['rows']}")

        # 3. no batch at all: refused before anything runs
        r = run(" , ")
        check(r.returncode != 0 and "--batch ' , '" in r.stderr, f"an empty --batch refused: {r.stderr}")
        check(not os.path.exists(log), "nothing ran")
    print("compare_test: " + ("OK" if failures == 0 else f"{failures} failed"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
