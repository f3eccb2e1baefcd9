#!/usr/bin/python3
"""The golden suite: the engine's CPU step against tools/bench/torch_peer.py in float64.

For one head set: seeded weights (`dqn step --init`), a random batch (`--random-batch
--save-batch`), STEPS engine steps written as a dump, the same steps by the peer from the same
weights and batch (IQN's fractions: the ones the engine drew, from its dump's `iqn.tau` and
`iqn.tau_target`), and every tensor of the two dumps compared within TOLERANCES. Then the
self-check: copies of the engine's dump with errors of the size a real bug makes must fail.

Exit status 0 (pass), 1 (fail) or 77 (skipped: /usr/bin/python3 cannot import torch).
"""
import argparse
import os
import struct
import subprocess
import sys

try:
    import torch
except ImportError as e:
    print(f"SKIP: the golden suite needs torch for {sys.executable} ({e}); tools/setup.sh "
          "installs Debian's python3-torch", flush=True)
    sys.exit(77)

STEPS = 3
BATCH_SEED = 7
# Small shapes for every head set: D and A above 1 so that branches and dueling are exercised.
SHAPES = ["backend=cpu", "precision=fp32", "seed=3", "batch=8", "network.state=8",
          "network.trunk=[16,16]", "network.head_hidden=8", "network.branches=2",
          "network.actions=3", "network.atoms=11"]
# Pipeline constants: (engine override, peer flags). One table, so the two runs cannot differ.
# max_grad_norm 0.5: the primary's cap (f·G ≥ 0.35) is above its norm and the auxiliaries' (0.05)
# below theirs, so both sides of c = min(1, f·G/‖g‖) are taken. sigma_max 1.2: some of the
# normed matrices are scaled and some are not. v_min/v_max ±5 with γ_n z: Tz is clamped at the
# edges of the support.
GAMMA, WRONG_GAMMA = 0.97, 0.971   # the self-check's peer run with a wrong discount must fail
LR = 1e-3
CONSTANTS = [
    (f"gamma={GAMMA}", ["--gamma", str(GAMMA)]),
    ("n_step=2", ["--n-step", "2"]),
    ("network.v_min=-5", ["--v-min", "-5"]),
    ("network.v_max=5", ["--v-max", "5"]),
    ("max_grad_norm=0.5", ["--max-grad-norm", "0.5"]),
    (f"optimizer.adam={{lr: {LR}, betas: [0.9, 0.999], eps: 1.0e-8}}", ["--lr", str(LR)]),  # the peer's β, ε
    ("spectral_norm={enabled: true, sigma_max: 1.2}", ["--spectral-norm", "on", "--sigma-max", "1.2"]),
]
POLYAK = ("target={polyak: 0.05}", ["--polyak", "0.05"])
HARD_COPY = ("target={period: 2}", ["--target-period", "2"])   # copies after step 2 of 3
HEAD_CONSTANTS = {
    "c51": [],
    "iqn": [("heads.iqn.budget=0.1", ["--frac-iqn", "0.1"]), ("heads.iqn.kappa=1.0", ["--kappa", "1.0"]),
            ("heads.iqn.quantiles=4", []), ("heads.iqn.target_quantiles=5", []),  # from iqn.tau
            ("heads.iqn.embed=6", [])],                                           # from the weights
    "ensemble": [("heads.ensemble.budget=0.1", ["--frac-ensemble", "0.1"]),
                 ("heads.ensemble.members=2", [])],                               # from the weights
    "cql": [("heads.cql.budget=0.1", ["--frac-cql", "0.1"]), ("heads.cql.alpha=0.5", ["--cql-alpha", "0.5"])],
}


# ----------------------------------------------------------------------------------------------
# Tolerances
# ----------------------------------------------------------------------------------------------
# Element i passes when |engine_i − peer_i| ≤ rtol·|peer_i| + atol. The engine stores every value
# in float32 (u = 2^-24 ≈ 6e-8 a rounding; the CPU backend sums in double and rounds each stored
# result), the peer computes in float64 from the same float32 inputs, so the differences are float32
# roundings carried through ~10 stored layers forward and back and 3 steps. Every run prints the
# worst errors met; at these shapes they are ≤ 2.2e-7 relative (reports), ≤ 4.3e-7 of the tensor's
# largest value (Adam's m) and ≤ 7.1e-8 absolute (weights).
#   reports (losses, norms, clips, td_error, disagreement): rtol 1e-5, ~170 u, 45× the worst seen.
#   m: rtol 1e-5 plus atol 1e-5·max|m| of the tensor. A gradient component is a sum whose terms
#      are as large as the tensor's largest; its float32 error is relative to those, not to itself
#      (cancellation). A gradient 0.1% off fails by 100×.
#   v: as m, plus the engine's β2, a float in the backend's Adam op (0.999f): 1 − β2 is 1.29e-5
#      relatively off 0.001, so every v is by as much (the bias correction 1 − β2^t moves with it,
#      and the weights do not see it).
#   weights, target, sn.u: atol 1e-5 = lr/100. Adam moves a weight by ~lr a step whatever the
#      gradient's size; the float32 error of that move and of the stored weight is ≤ ~1e-7. A
#      tenth of a step wrong, a Polyak blend or a hard copy at the wrong step, a spectral scaling
#      1e-4 off, fail. u is a unit vector: its entries are ≤ 1 like the weights.
#   exact: integers, and the fractions copied from the engine's dump.
# A NaN on either side fails.
F32_BETA2 = struct.unpack("<f", struct.pack("<f", 0.999))[0]
BETA2_SHIFT = abs(1 - (1 - F32_BETA2) / (1 - 0.999))        # 1.29e-5


def tolerance(name):
    """(rtol, atol, atol relative to max|peer| of the tensor, exact) for a dump tensor."""
    if name in ("adam.step", "skipped_steps") or name.startswith("iqn.tau"):
        return 0.0, 0.0, 0.0, True
    if name.startswith("adam.m."):
        return 1e-5, 0.0, 1e-5, False
    if name.startswith("adam.v."):
        return 1e-5 + BETA2_SHIFT, 0.0, 1e-5 + BETA2_SHIFT, False
    if name.startswith(("loss.", "grad_norm.", "clip.")) or name in ("td_error", "ensemble.disagreement"):
        return 1e-5, 0.0, 0.0, False
    return 0.0, LR / 100, 0.0, False   # online and target weights, sn.u


def unravel(flat_index, shape):
    idx = []
    for n in reversed(shape):
        idx.append(flat_index % n)
        flat_index //= n
    return tuple(reversed(idx))


def compare(engine, peer, quiet=False):
    """Compares two dumps ({name: tensor}); prints a line per tensor; returns the failures."""
    failures = []
    for name in sorted(set(engine) - set(peer)):
        failures.append(f"{name}: in the engine's dump only")
    for name in sorted(set(peer) - set(engine)):
        failures.append(f"{name}: in the peer's dump only")
    if not quiet:
        print(f"{'tensor':<40} {'shape':<10} {'max abs err':>11} {'max rel err':>11}  tolerance", flush=True)
    for name in sorted(set(engine) & set(peer)):
        e, r = engine[name], peer[name]
        if tuple(e.shape) != tuple(r.shape):
            failures.append(f"{name}: shape {tuple(e.shape)} in the engine's dump, {tuple(r.shape)} in the peer's")
            continue
        rtol, atol_abs, atol_scale, exact = tolerance(name)
        e64, r64 = e.reshape(-1).to(torch.float64), r.reshape(-1).to(torch.float64)
        diff = (e64 - r64).abs()
        scale = r64[torch.isfinite(r64)].abs().max().item() if torch.isfinite(r64).any() else 0.0
        atol = atol_abs + atol_scale * scale
        limit = rtol * r64.abs() + atol
        bad = (diff != 0) if exact else ~(diff <= limit)   # NaN fails both
        nz = r64.abs() > 0
        max_abs = diff.max().item() if diff.numel() else 0.0
        max_rel = (diff[nz] / r64.abs()[nz]).max().item() if nz.any() else 0.0
        tol = "exact" if exact else f"{atol:.2g}" + (f" + {rtol:.2g}·|peer|" if rtol else "")
        if not quiet:
            shape = "[" + ",".join(map(str, e.shape)) + "]"
            print(f"{name:<40} {shape:<10} {max_abs:>11.3g} {max_rel:>11.3g}  {tol}"
                  f"{'  FAIL' if bad.any() else ''}", flush=True)
        if bad.any():
            i = int(bad.nonzero()[0])
            at = list(unravel(i, list(e.shape)))
            failures.append(f"{name}: first failing index {at}: engine {e64[i].item():.9g}, peer "
                            f"{r64[i].item():.9g}, |diff| {diff[i].item():.3g} > {tol} "
                            f"({int(bad.sum())} of {bad.numel()} elements fail)")
    return failures


# ----------------------------------------------------------------------------------------------
# The runs
# ----------------------------------------------------------------------------------------------

def run(cmd):
    print("$ " + " ".join(cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sys.stdout.write(p.stdout)
    if p.returncode != 0:
        sys.exit(f"FAIL: {os.path.basename(cmd[0])} exited with {p.returncode}")


def scaled(factor):
    return lambda t: t * factor


def nudged(by, at=None):
    """Adds `by` to one element: `at` (flat), else the largest in magnitude."""
    def f(t):
        i = int(t.reshape(-1).abs().argmax()) if at is None else at
        t.view(-1)[i] += by(t.view(-1)[i].item()) if callable(by) else by
        return t
    return f


# Errors of the size a wrong step makes: (tensor, what, how). Gradients are checked through Adam's
# moments (after 3 steps m and v are sums of the 3 gradients and their squares).
SELF_CHECK = [
    ("adam.m.trunk.0.weight", "every head's trunk gradient 0.1% too large", scaled(1.001)),
    ("adam.v.c51.value.1.bias", "one gradient component 0.1% off (its square 0.2%)", nudged(lambda x: 2e-3 * x)),
    ("adam.m.c51.branch.1.1.weight", "one C51 gradient component 0.1% off", nudged(lambda x: 1e-3 * x)),
    ("td_error", "one sample's td_error 1e-4 off (relative)", nudged(lambda x: 1e-4 * x, at=3)),
    ("loss.total", "the total loss 1e-4 off (relative)", scaled(1 + 1e-4)),
    ("trunk.1.weight", "one weight a tenth of an Adam step (lr/10) off", nudged(LR / 10, at=5)),
    ("target.c51.value.0.weight", "one target weight lr/10 off", nudged(LR / 10, at=2)),
    ("c51.branch.0.1.weight", "a normed matrix scaled 1e-4 more", scaled(1 - 1e-4)),
    ("sn.u.trunk.0.weight", "one entry of u 1e-4 off", nudged(1e-4, at=1)),
    ("adam.step", "one Adam step more", lambda t: t + 1),
    ("skipped_steps", "one skipped step", lambda t: t + 1),
]
HEAD_SELF_CHECK = {   # per head, besides its loss, norm and clip: what only it writes
    "c51": [],
    "iqn": [("adam.m.iqn.embed.weight", "the IQN embedding's gradient 0.1% too large", scaled(1.001))],
    "ensemble": [("adam.m.ensemble.1.value.1.weight", "a member's gradient 0.1% too large", scaled(1.001)),
                 ("ensemble.disagreement", "one sample's disagreement 1e-4 off (relative)",
                  nudged(lambda x: 1e-4 * x, at=0))],
    "cql": [],
}


def self_check(engine, peer, heads):
    """Puts each SELF_CHECK error into a copy of the engine's dump: every one must fail the
    comparison, and fail it on the tensor it was put into alone. Returns whether all did."""
    cases = list(SELF_CHECK)
    for h in heads:
        cases += [(f"loss.{h}", f"the {h} loss 1e-4 off (relative)", scaled(1 + 1e-4)),
                  (f"grad_norm.{h}", f"the {h} gradient's norm 1e-4 off (relative)", scaled(1 + 1e-4)),
                  (f"clip.{h}", f"the {h} clip factor 1e-4 off (relative)", scaled(1 - 1e-4))]
        cases += HEAD_SELF_CHECK[h]
    ok = True
    for name, what, how in cases:
        wrong = dict(engine)
        t = engine[name].clone()
        wrong[name] = how(t.to(torch.float64) if t.is_floating_point() else t)
        fails = compare(wrong, peer, quiet=True)
        named = [f for f in fails if f.startswith(name + ":")]
        good = bool(named) and len(fails) == len(named)
        verdict = f"fails, as it must: {named[0]}" if good else (
            f"PASSES (a tolerance too loose): {fails}" if not fails else f"fails elsewhere: {fails}")
        print(f"self-check: {what} ({name}): {verdict}", flush=True)
        ok = ok and good
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dqn", required=True)
    ap.add_argument("--peer", required=True, help="tools/bench/torch_peer.py")
    ap.add_argument("--pipeline", required=True)
    ap.add_argument("--heads", required=True, help="the pipeline's heads, primary first: c51,iqn,...")
    ap.add_argument("--hard-copy", action="store_true", help="target update: hard copy every 2 steps")
    ap.add_argument("--work", required=True, help="directory for the files (kept for inspection)")
    a = ap.parse_args()
    heads = a.heads.split(",")
    sys.path.insert(0, os.path.dirname(os.path.abspath(a.peer)))
    from torch_peer import load_file, save_file   # the safetensors package, else tools/bench/st_file.py

    table = CONSTANTS + [HARD_COPY if a.hard_copy else POLYAK]
    table += [c for h in heads for c in HEAD_CONSTANTS[h]]
    overrides = SHAPES + [o for o, _ in table]
    os.makedirs(a.work, exist_ok=True)
    path = lambda f: os.path.join(a.work, f + ".safetensors")   # noqa: E731

    run([a.dqn, "step", a.pipeline, *overrides, "--init", path("weights")])
    run([a.dqn, "step", a.pipeline, *overrides, "--weights", path("weights"), "--random-batch",
         str(BATCH_SEED), "--save-batch", path("batch"), "--steps", str(STEPS), "--out", path("engine")])
    engine = load_file(path("engine"))
    got = sorted(n[len("loss."):] for n in engine if n.startswith("loss.") and n != "loss.total")
    if got != sorted(heads):
        sys.exit(f"FAIL: the engine's dump has losses for {got}, --heads says {sorted(heads)}")
    batch = load_file(path("batch"))
    if "iqn" in heads:   # the fractions the engine drew, [STEPS,B,N] and [STEPS,B,N']
        batch["iqn.tau"], batch["iqn.tau_target"] = engine["iqn.tau"], engine["iqn.tau_target"]
    save_file(batch, path("batch_peer"))

    def peer_run(out, gamma=GAMMA):
        flags = [f for _, fl in table for f in fl]
        flags[flags.index("--gamma") + 1] = str(gamma)
        run([sys.executable, a.peer, "--golden", path("weights"), path("batch_peer"), "--steps",
             str(STEPS), "--out", path(out), "--heads", a.heads, "--device", "cpu", "--dtype",
             "float64", *flags])
        return load_file(path(out))

    failures = compare(engine, peer_run("peer"))
    for f in failures:
        print("FAIL: " + f, flush=True)
    checked = self_check(engine, load_file(path("peer")), heads)
    wrong = compare(engine, peer_run("peer_wrong_gamma", WRONG_GAMMA), quiet=True)
    print(f"self-check: the peer with gamma {WRONG_GAMMA} for {GAMMA}: "
          + (f"fails, as it must ({len(wrong)} tensors, e.g. {wrong[0]})" if wrong else "PASSES"), flush=True)
    checked = checked and bool(wrong)
    if failures or not checked:
        sys.exit(f"FAIL: {len(failures)} tensors differ" + ("" if checked else "; the self-check failed"))
    print(f"PASS: {len(engine)} tensors of heads {a.heads} agree after {STEPS} steps", flush=True)


if __name__ == "__main__":
    main()
