"""What the Python tests share: the arguments (source root, backend), the skip without a GPU, and
check() that records failures and ends with the count."""
import sys

import dqn_engine as de

failures = []


def args():
    """(source root, backend) from the command line; exits 77 (skipped) for cuda without a GPU."""
    root, backend = sys.argv[1], sys.argv[2]
    if backend == "cuda" and de.cuda_devices() == 0:
        print("skipped: no GPU (or a build without CUDA) for the cuda backend")
        sys.exit(77)
    return root, backend


def check(ok, what):
    print(("ok: " if ok else "FAIL: ") + what, flush=True)
    if not ok:
        failures.append(what)


def finish():
    print(f"{len(failures)} failure(s)")
    sys.exit(1 if failures else 0)
