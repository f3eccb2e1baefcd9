#!/usr/bin/python3
"""The QR-DQN example as the primary learns CartPole: the build installed into a temporary prefix,
examples/plugins/qr_dqn built against it alone (tests/install/sdk.py), then the installed dqn trains
its pipeline for each seed and every final greedy evaluation must reach --min-return
(learns.check_run).
Usage: qr_dqn_learns.py BUILD_ROOT SOURCE_ROOT [--seed 1,2,3] [--min-return 475]"""
import argparse
import os
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
sys.path.insert(0, os.path.join(here, "..", "install"))
import learns  # noqa: E402
import sdk  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build_root")
    ap.add_argument("source_root")
    ap.add_argument("--seed", default="1,2,3")
    ap.add_argument("--min-return", type=float, default=475.0)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="dqn-qr-") as tmp:
        _, libdir, bindir = sdk.install(a.build_root, tmp)
        ex = sdk.build_example(a.source_root, libdir, tmp)
        pipeline = os.path.join(a.source_root, "examples", "plugins", "qr_dqn", "qr_dqn.yaml")
        for seed in a.seed.split(","):
            learns.check_run(os.path.join(bindir, "dqn"), pipeline, seed, a.min_return, ["qr_dqn"],
                                      "qr.value.0.weight", plugin_path=ex, env=sdk.clean_env())


if __name__ == "__main__":
    main()
