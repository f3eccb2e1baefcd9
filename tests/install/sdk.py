"""What the install test and the QR-DQN learning test share: the build installed into a temporary
prefix (meson install --destdir), and examples/plugins/qr_dqn built against that prefix alone
(PKG_CONFIG_PATH only; the example is copied out of the repository first, so nothing of the source
tree can leak into its build)."""
import glob
import os
import shutil
import subprocess
import sys


def run(cmd, **kw):
    print("$", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)
    print(p.stdout, flush=True)
    return p


def must(cmd, what, **kw):
    p = run(cmd, **kw)
    if p.returncode != 0:
        sys.exit(f"FAIL: {what}: {' '.join(cmd)} exited with {p.returncode}")
    return p


def install(build_root, tmp):
    """Installs the build into tmp/destdir; returns (prefix root on disk, libdir, bin dir)."""
    dest = os.path.join(tmp, "destdir")
    must(["meson", "install", "-C", build_root, "--destdir", dest, "--no-rebuild", "--quiet"], "meson install")
    pcs = glob.glob(os.path.join(dest, "**", "pkgconfig", "dqn-engine.pc"), recursive=True)
    if len(pcs) != 1:
        sys.exit(f"FAIL: expected one installed dqn-engine.pc, found {pcs}")
    libdir = os.path.dirname(os.path.dirname(pcs[0]))
    bins = glob.glob(os.path.join(dest, "**", "bin", "dqn"), recursive=True)
    if len(bins) != 1:
        sys.exit(f"FAIL: expected one installed bin/dqn, found {bins}")
    return dest, libdir, os.path.dirname(bins[0])


def build_example(source_root, libdir, tmp, name="qr_dqn", kind="plugins", artifact=None):
    """Builds examples/<kind>/<name> (a head under plugins/, an environment under envs/, a program
    under api/) against the installed prefix; returns the folder holding what it builds (`artifact`,
    by default its plugin library)."""
    src = os.path.join(tmp, name + "-src")
    shutil.copytree(os.path.join(source_root, "examples", kind, name), src)
    bld = os.path.join(tmp, name + "-build")
    env = dict(os.environ, PKG_CONFIG_PATH=os.path.join(libdir, "pkgconfig"))
    env.pop("PKG_CONFIG_LIBDIR", None)
    must(["meson", "setup", bld, src, "--buildtype=release"], "configuring the example against the prefix", env=env)
    must(["ninja", "-C", bld], "building the example", env=env)
    lib = os.path.join(bld, artifact or f"libdqn_{name}.so")
    if not os.path.isfile(lib):
        sys.exit(f"FAIL: the example's build has no {lib}")
    return bld


def clean_env():
    """The environment for the installed dqn: nothing of the build tree's (no plugin path, and no
    library path, which meson test sets to the build's libraries and which would win over the
    installed dqn's own run path)."""
    env = dict(os.environ)
    for k in ("DQN_PLUGIN_PATH", "DQN_PLUGIN_DEFAULT_DIRS", "LD_LIBRARY_PATH"):
        env.pop(k, None)
    return env
