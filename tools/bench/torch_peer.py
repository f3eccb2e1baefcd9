#!/usr/bin/env python3
"""The dqn-engine training step in plain PyTorch: a benchmark peer and a golden reference.

It computes the step of ``docs/step-math.md`` (BDQ + C51 primary head, optional IQN /
ensemble / CQL auxiliary heads, per-head gradient budgets, Adam, spectral norm, Polyak or hard
target update) with ordinary PyTorch ops, in two uses:

1. Benchmark (needs a CUDA GPU): device microseconds per training step from CUDA events, eager
   or captured whole as one ``torch.cuda.CUDAGraph``, in fp32 / tf32 / bf16.

       # C51 primary alone, graph-captured, tf32, at three batch sizes, JSON lines on stdout
       python3 tools/bench/torch_peer.py --mode graph --precision tf32 --batch 256,1024,4096 \\
           --heads c51 --json

       # all four heads (C51 + IQN + ensemble + CQL)
       python3 tools/bench/torch_peer.py --mode graph --precision tf32 --batch 256,1024,4096 \\
           --heads c51,iqn,ensemble,cql --json

       # everything: both head sets, eager and graph, every precision
       python3 tools/bench/torch_peer.py --mode eager,graph --precision fp32,tf32,bf16 \\
           --batch 256,1024,4096 --heads c51 --heads c51,iqn,ensemble,cql --json

2. Golden reference (CPU, float64 by default; deterministic): N steps from a weights file and a
   batch file, writing a step dump (docs/step-math.md, "Files: weights, batches, step dumps").

       python3 tools/bench/torch_peer.py --golden WEIGHTS.safetensors BATCH.safetensors \\
           --steps 100 --out DUMP.safetensors [--heads c51] [--device cpu] [--dtype float64]

   With IQN in --heads the batch file must carry the fractions ``iqn.tau [N_steps,B,N]`` and
   ``iqn.tau_target [N_steps,B,N']`` (the engine draws them with its Philox generator; this
   script does not reproduce that generator). To make a fresh (spec-initialised) weights file
   and a random batch to feed the golden run:

       python3 tools/bench/torch_peer.py --make-inputs WEIGHTS.safetensors BATCH.safetensors \\
           [--heads ...] [--batch 256] [--steps 100] [--seed 1]

Network shapes come from the arguments (defaults: docs/step-math.md's ``ref`` workload) for the benchmark
and --make-inputs; the golden run reads them from the weights file.

Layout. All online parameters live in one flat buffer ``theta [P]``, ordered by group
(trunk, c51, ensemble, iqn); each named parameter (spec checkpoint names: ``trunk.0.weight``,
``c51.branch.1.0.bias``, ...) is a leaf tensor that is a view of that buffer, so autograd gives
per-tensor gradients while Adam, the budget sum and the target update run on whole flat buffers.
Target parameters, Adam moments likewise (``target``, ``adam_m``, ``adam_v`` [P]).

Adam is written by hand (not torch.optim.Adam): docs/step-math.md's form, with the step counter ``t`` and
``lr`` in device tensors, and the NaN/Inf skip applied with ``torch.where`` on a device flag, so a
captured graph never syncs with the host.

Requires torch (1.13 or later); the `safetensors` package where installed, else the project's
own reader and writer (tools/bench/st_file.py). numpy is not needed.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import sys
from dataclasses import dataclass, field, replace
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

try:
    from safetensors.torch import load_file, save_file
except ImportError:  # Debian 12 has no safetensors package: the project's own reader and writer
    import st_file   # tools/bench/st_file.py, beside this script

    _ST_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
                  "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32,
                  "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}

    def load_file(path: str) -> Dict[str, torch.Tensor]:
        out = {}
        for name, (dtype, shape, raw) in st_file.read(path)[0].items():
            if dtype not in _ST_DTYPES:
                raise SystemExit(f"{path}: tensor {name}: dtype {dtype} has no torch type here")
            flat = (torch.frombuffer(bytearray(raw), dtype=_ST_DTYPES[dtype]) if raw
                    else torch.empty(0, dtype=_ST_DTYPES[dtype]))
            out[name] = flat.reshape(shape)
        return out

    def save_file(tensors: Dict[str, torch.Tensor], path: str) -> None:
        names = {t: n for n, t in _ST_DTYPES.items()}
        st_file.write(path, {k: (names[v.dtype], list(v.shape),
                                 bytes(v.detach().cpu().reshape(-1).view(torch.uint8).tolist()))
                             for k, v in tensors.items()})

HEAD_NAMES = ("c51", "iqn", "ensemble", "cql")
AUX_DEFAULT_FRACTION = {"iqn": 0.2, "ensemble": 0.1, "cql": 0.1}
# Parameter groups each head's gradient can reach (all others are zero in its g_h).
HEAD_GROUPS = {"c51": ("trunk", "c51"), "cql": ("trunk", "c51"),
               "ensemble": ("trunk", "ensemble"), "iqn": ("trunk", "iqn")}
GROUP_ORDER = ("trunk", "c51", "ensemble", "iqn")


# ----------------------------------------------------------------------------------------------
# Configuration
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Shapes:
    S: int                  # state features
    trunk: Tuple[int, ...]  # trunk widths (H1, H2, ...)
    Hh: int                 # head hidden width
    D: int                  # branches
    A: int                  # actions per branch
    Z: int                  # atoms
    K: int = 0              # ensemble members (0: no ensemble)
    N: int = 32             # IQN online quantiles
    Np: int = 32            # IQN target quantiles
    E: int = 64             # IQN cosine embedding size

    @property
    def H(self) -> int:     # trunk output width (H2)
        return self.trunk[-1]


@dataclass(frozen=True)
class Hyper:
    gamma_n: float = 0.99
    lr: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    max_grad_norm: float = 10.0
    polyak: float = 0.005
    target_period: int = 0          # > 0: hard copy every `period` Adam steps instead of Polyak
    spectral_norm: bool = True
    sigma_max: float = 2.0
    v_min: float = -10.0
    v_max: float = 10.0
    kappa: float = 1.0
    cql_alpha: float = 1.0


def head_fractions(heads: Sequence[str], aux: Dict[str, float]) -> List[float]:
    """Spec "Gradient budgets": aux heads take their fraction, the primary what is left."""
    f_aux = [aux[h] for h in heads if h != "c51"]
    f_primary = 1.0 - sum(f_aux)
    if f_primary <= 0.0:
        raise SystemExit(f"primary budget fraction {f_primary} <= 0 (aux fractions sum to "
                         f"{sum(f_aux)}); the engine rejects such a pipeline")
    return [f_primary if h == "c51" else aux[h] for h in heads]


def parse_heads(text: str) -> Tuple[str, ...]:
    if text == "all":
        text = ",".join(HEAD_NAMES)
    heads = tuple(h.strip() for h in text.split(",") if h.strip())
    bad = [h for h in heads if h not in HEAD_NAMES]
    if bad:
        raise SystemExit(f"unknown head(s) {bad}; choose from {HEAD_NAMES}")
    if not heads or heads[0] != "c51":
        raise SystemExit("--heads must start with the primary head c51 (e.g. c51,iqn,ensemble,cql)")
    if len(set(heads)) != len(heads):
        raise SystemExit(f"duplicate head in {text}")
    return heads


# ----------------------------------------------------------------------------------------------
# Parameter layout: names and shapes exactly as docs/step-math.md's checkpoint names
# ----------------------------------------------------------------------------------------------

def dist_head_specs(prefix: str, sh: Shapes) -> List[Tuple[str, Tuple[int, ...]]]:
    """A distributional dueling branching head: value [Hh,H]->[Z,Hh], D branches [Hh,H]->[A*Z,Hh]."""
    out = []

    def dense(name, fan_out, fan_in):
        out.append((f"{name}.weight", (fan_out, fan_in)))
        out.append((f"{name}.bias", (fan_out,)))

    dense(f"{prefix}.value.0", sh.Hh, sh.H)
    dense(f"{prefix}.value.1", sh.Z, sh.Hh)
    for d in range(sh.D):
        dense(f"{prefix}.branch.{d}.0", sh.Hh, sh.H)
        dense(f"{prefix}.branch.{d}.1", sh.A * sh.Z, sh.Hh)
    return out


def param_specs(sh: Shapes, heads: Sequence[str]) -> List[Tuple[str, Tuple[int, ...], str]]:
    """(name, shape, group) for every online parameter, grouped in GROUP_ORDER."""
    specs: List[Tuple[str, Tuple[int, ...], str]] = []
    fan_in = sh.S
    for l, width in enumerate(sh.trunk):
        specs.append((f"trunk.{l}.weight", (width, fan_in), "trunk"))
        specs.append((f"trunk.{l}.bias", (width,), "trunk"))
        fan_in = width
    specs += [(n, s, "c51") for n, s in dist_head_specs("c51", sh)]
    if "ensemble" in heads:
        for k in range(sh.K):
            specs += [(n, s, "ensemble") for n, s in dist_head_specs(f"ensemble.{k}", sh)]
    if "iqn" in heads:
        specs += [("iqn.embed.weight", (sh.H, sh.E), "iqn"), ("iqn.embed.bias", (sh.H,), "iqn"),
                  ("iqn.0.weight", (sh.Hh, sh.H), "iqn"), ("iqn.0.bias", (sh.Hh,), "iqn"),
                  ("iqn.1.weight", (sh.D * sh.A, sh.Hh), "iqn"), ("iqn.1.bias", (sh.D * sh.A,), "iqn")]
    return specs


def spectral_names(sh: Shapes) -> List[str]:
    """The 2 + 2 + 2D spectrally normed matrices: trunk and primary (c51) head weights."""
    names = [f"trunk.{l}.weight" for l in range(len(sh.trunk))]
    names += ["c51.value.0.weight", "c51.value.1.weight"]
    for d in range(sh.D):
        names += [f"c51.branch.{d}.0.weight", f"c51.branch.{d}.1.weight"]
    return names


@dataclass
class Layout:
    names: List[str]
    shapes: Dict[str, Tuple[int, ...]]
    offsets: Dict[str, int]
    groups: Dict[str, Tuple[int, int]]           # group -> [lo, hi) in the flat buffer
    group_names: Dict[str, List[str]]            # group -> its parameter names, in order
    P: int

    @staticmethod
    def build(specs: List[Tuple[str, Tuple[int, ...], str]]) -> "Layout":
        names, shapes, offsets, groups, group_names = [], {}, {}, {}, {}
        off = 0
        for g in GROUP_ORDER:
            lo = off
            for name, shape, grp in specs:
                if grp != g:
                    continue
                names.append(name)
                shapes[name] = tuple(shape)
                offsets[name] = off
                off += math.prod(shape)
                group_names.setdefault(g, []).append(name)
            if off > lo:
                groups[g] = (lo, off)
        return Layout(names, shapes, offsets, groups, group_names, off)

    def views(self, flat: torch.Tensor) -> Dict[str, torch.Tensor]:
        """name -> view of `flat` (shares storage; writes to flat are seen through it)."""
        return {n: flat.narrow(0, self.offsets[n], math.prod(self.shapes[n])).view(self.shapes[n])
                for n in self.names}


# ----------------------------------------------------------------------------------------------
# Training state (everything a step reads and writes lives here, in device memory)
# ----------------------------------------------------------------------------------------------

@dataclass
class State:
    sh: Shapes
    hp: Hyper
    heads: Tuple[str, ...]
    layout: Layout
    theta: torch.Tensor                        # [P] online parameters
    target: torch.Tensor                       # [P] target parameters
    adam_m: torch.Tensor                       # [P]
    adam_v: torch.Tensor                       # [P]
    t: torch.Tensor                            # [] i64 Adam step counter
    lr: torch.Tensor                           # [] learning rate
    fractions: torch.Tensor                    # [H] budget fractions, one per head in `heads`
    skipped: torch.Tensor                      # [] i64 skipped-step counter
    sn_u: Dict[str, torch.Tensor]              # matrix name -> u [rows]
    z: torch.Tensor                            # [Z] atom support
    params: Dict[str, torch.Tensor] = field(default_factory=dict)    # leaf views of theta (grad)
    theta_w: Dict[str, torch.Tensor] = field(default_factory=dict)   # plain views of theta
    target_w: Dict[str, torch.Tensor] = field(default_factory=dict)  # plain views of target

    def __post_init__(self):
        self.theta_w = self.layout.views(self.theta)
        self.target_w = self.layout.views(self.target)
        # Leaves that share theta's storage: autograd differentiates w.r.t. them; the optimizer
        # writes theta in place (under no_grad) and they see the new values.
        self.params = {n: v.detach().requires_grad_(True) for n, v in self.theta_w.items()}


@dataclass
class Batch:
    states: torch.Tensor       # [B,S]
    next_states: torch.Tensor  # [B,S]
    actions: torch.Tensor      # [B,D] int64 (the files hold i32; indexing wants i64)
    rewards: torch.Tensor      # [B]
    dones: torch.Tensor        # [B]
    is_weights: torch.Tensor   # [B]

    @property
    def B(self) -> int:
        return self.states.shape[0]


@dataclass
class Report:
    """What a step reports (docs/step-math.md, "What a step reports"); static tensors, written in place."""
    losses: torch.Tensor       # [H] per head loss L_h
    norms: torch.Tensor        # [H] pre-clip ||g_h||
    clips: torch.Tensor        # [H] c_h
    total: torch.Tensor        # [] sum_h L_h
    td_error: torch.Tensor     # [B] L_c51(b)
    disagreement: Optional[torch.Tensor] = None  # [B] with the ensemble

    @staticmethod
    def empty(n_heads: int, B: int, ensemble: bool, dtype, device) -> "Report":
        z = lambda *s: torch.zeros(*s, dtype=dtype, device=device)  # noqa: E731
        return Report(z(n_heads), z(n_heads), z(n_heads), z(()), z(B), z(B) if ensemble else None)


def init_weights(sh: Shapes, heads: Sequence[str], seed: int) -> Dict[str, torch.Tensor]:
    """A fresh weights file's tensors (docs/step-math.md, "Initialisation"), float32 on the CPU:
    weights and biases uniform in +-1/sqrt(fan_in), target = online, zero moments, step 0,
    u = a normalised Gaussian vector per spectrally normed matrix."""
    gen = torch.Generator().manual_seed(seed)
    out: Dict[str, torch.Tensor] = {}
    specs = param_specs(sh, heads)
    fan_in_of = {n[: -len(".weight")]: s[1] for n, s, _ in specs if n.endswith(".weight")}
    for name, shape, _ in specs:
        layer = name.rsplit(".", 1)[0]
        bound = 1.0 / math.sqrt(fan_in_of[layer])
        out[name] = (torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1).mul_(bound).float()
    for name, shape, _ in specs:
        out[f"target.{name}"] = out[name].clone()
        out[f"adam.m.{name}"] = torch.zeros(shape)
        out[f"adam.v.{name}"] = torch.zeros(shape)
    out["adam.step"] = torch.zeros((), dtype=torch.int64)
    rows = {n: s[0] for n, s, _ in specs}
    for name in spectral_names(sh):
        u = torch.randn(rows[name], generator=gen, dtype=torch.float64)
        out[f"sn.u.{name}"] = (u / u.norm()).float()
    return out


def make_state(weights: Dict[str, torch.Tensor], sh: Shapes, hp: Hyper, heads: Tuple[str, ...],
               fractions: List[float], dtype: torch.dtype, device) -> State:
    """Builds the flat device state from a weights dict (spec file names)."""
    layout = Layout.build(param_specs(sh, heads))

    def flat(prefix: str) -> torch.Tensor:
        buf = torch.empty(layout.P, dtype=dtype, device=device)
        for n in layout.names:
            key = prefix + n
            if key not in weights:
                raise SystemExit(f"weights file lacks {key}")
            src = weights[key]
            if tuple(src.shape) != layout.shapes[n]:
                raise SystemExit(f"{key}: shape {tuple(src.shape)}, expected {layout.shapes[n]}")
            buf.narrow(0, layout.offsets[n], src.numel()).copy_(src.reshape(-1).to(dtype))
        return buf

    sn_u = {}
    if hp.spectral_norm:
        for n in spectral_names(sh):
            key = f"sn.u.{n}"
            if key not in weights:
                raise SystemExit(f"spectral norm is on but the weights file lacks {key}")
            sn_u[n] = weights[key].reshape(-1).to(dtype=dtype, device=device).clone()
    step = weights.get("adam.step", torch.zeros((), dtype=torch.int64))
    Z = sh.Z
    dz = (hp.v_max - hp.v_min) / (Z - 1)
    z = hp.v_min + torch.arange(Z, dtype=dtype, device=device) * dz   # z_i = v_min + i*dz
    return State(sh=sh, hp=hp, heads=heads, layout=layout,
                 theta=flat(""), target=flat("target."), adam_m=flat("adam.m."),
                 adam_v=flat("adam.v."),
                 t=step.reshape(()).to(dtype=torch.int64, device=device).clone(),
                 lr=torch.tensor(hp.lr, dtype=dtype, device=device),
                 fractions=torch.tensor(fractions, dtype=dtype, device=device),
                 skipped=torch.zeros((), dtype=torch.int64, device=device),
                 sn_u=sn_u, z=z)


def state_to_weights(st: State) -> Dict[str, torch.Tensor]:
    """The weights-file tensors of a state (contiguous CPU copies: safetensors refuses shared storage)."""
    out = {}
    tw, gw = st.theta_w, st.target_w
    mw, vw = st.layout.views(st.adam_m), st.layout.views(st.adam_v)
    for n in st.layout.names:
        out[n] = tw[n].detach().cpu().clone()
        out[f"target.{n}"] = gw[n].cpu().clone()
        out[f"adam.m.{n}"] = mw[n].cpu().clone()
        out[f"adam.v.{n}"] = vw[n].cpu().clone()
    out["adam.step"] = st.t.cpu().clone()
    for n, u in st.sn_u.items():
        out[f"sn.u.{n}"] = u.cpu().clone()
    return out


# ----------------------------------------------------------------------------------------------
# Network (docs/step-math.md, "Network")
# ----------------------------------------------------------------------------------------------

def _f32(x: torch.Tensor) -> torch.Tensor:
    """Leave autocast's bf16 at the GEMM outputs: the head math after them runs in fp32."""
    return x.float() if x.dtype in (torch.bfloat16, torch.float16) else x


def dense(x: torch.Tensor, P: Dict[str, torch.Tensor], name: str) -> torch.Tensor:
    return F.linear(x, P[f"{name}.weight"], P[f"{name}.bias"])      # y = W x + b


def trunk_forward(P, s: torch.Tensor, n_layers: int) -> torch.Tensor:
    h = s                                                           # [B,S]
    for l in range(n_layers):
        h = torch.relu(dense(h, P, f"trunk.{l}"))                   # [B,H_l]
    return h                                                        # [B,H]


def dist_head_logp(P, prefix: str, h: torch.Tensor, sh: Shapes) -> torch.Tensor:
    """log p_d(a) over atoms for every branch and action: [B,D,A,Z]."""
    B = h.shape[0]
    hv = torch.relu(dense(h, P, f"{prefix}.value.0"))               # [B,Hh]
    v = _f32(dense(hv, P, f"{prefix}.value.1"))                     # [B,Z]
    adv = torch.stack([
        _f32(dense(torch.relu(dense(h, P, f"{prefix}.branch.{d}.0")), P,
                   f"{prefix}.branch.{d}.1")).view(B, sh.A, sh.Z)   # [B,A,Z]
        for d in range(sh.D)], dim=1)                               # [B,D,A,Z]
    logits = v[:, None, None, :] + adv - adv.mean(dim=2, keepdim=True)  # dueling per atom
    return torch.log_softmax(logits, dim=-1)                        # [B,D,A,Z]


def expected_q(logp: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    return (logp.exp() * z).sum(-1)                                 # [B,D,A]: sum_i z_i p_i


def iqn_quantiles(P, h: torch.Tensor, tau: torch.Tensor, sh: Shapes) -> torch.Tensor:
    """q(tau) for every sample and fraction: [B,N,D,A]."""
    B, N = tau.shape
    i = torch.arange(sh.E, dtype=tau.dtype, device=tau.device)
    c = torch.cos((math.pi * i) * tau[:, :, None])                  # [B,N,E] cos(pi i tau)
    phi = torch.relu(dense(c, P, "iqn.embed"))                      # [B,N,H]
    x = h[:, None, :] * phi                                         # [B,N,H] Hadamard with h2
    hq = torch.relu(dense(x, P, "iqn.0"))                           # [B,N,Hh]
    q = _f32(dense(hq, P, "iqn.1"))                                 # [B,N,D*A]
    return q.view(B, N, sh.D, sh.A)


def take_action(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """x [B,D,A,Z], idx [B,D] -> x[b,d,idx[b,d],:] as [B,D,Z]."""
    B, D, _, Z = x.shape
    return x.gather(2, idx[:, :, None, None].expand(B, D, 1, Z)).squeeze(2)


def take_quantile_action(q: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """q [B,N,D,A], idx [B,D] -> q[b,n,d,idx[b,d]] as [B,N,D]."""
    B, N, D, _ = q.shape
    return q.gather(3, idx[:, None, :, None].expand(B, N, D, 1)).squeeze(3)


# ----------------------------------------------------------------------------------------------
# Losses (docs/step-math.md, "C51 loss", "Ensemble loss", "IQN loss", "CQL penalty")
# ----------------------------------------------------------------------------------------------

def c51_project(p_next: torch.Tensor, rewards, dones, z, hp: Hyper) -> torch.Tensor:
    """Dense projection m [B,D,Z] of the target distribution p_next [B,D,Z] (no scatter)."""
    dz = (hp.v_max - hp.v_min) / (z.shape[0] - 1)
    tz = (rewards[:, None] + hp.gamma_n * (1 - dones)[:, None] * z[None, :]
          ).clamp(hp.v_min, hp.v_max)                               # [B,Zj]
    w = (1 - (tz[:, None, :] - z[None, :, None]).abs() / dz).clamp(0, 1)  # [B,Zi,Zj]
    return torch.bmm(p_next, w.transpose(1, 2))                     # [B,D,Zj]@[B,Zj,Zi] -> [B,D,Zi]


def xent_per_sample(logp: torch.Tensor, actions, m: torch.Tensor) -> torch.Tensor:
    """(1/D) sum_d -sum_i m_{d,i} log p_d(s,a_d)_i : [B]."""
    return -(m * take_action(logp, actions)).sum(-1).mean(-1)


def iqn_loss_per_sample(theta_q, target_q, tau, kappa: float) -> torch.Tensor:
    """theta_q [B,N,D] (online, grad), target_q [B,N',D] (no grad), tau [B,N] -> [B]."""
    delta = (target_q.permute(0, 2, 1)[:, :, None, :]
             - theta_q.permute(0, 2, 1)[:, :, :, None])             # [B,D,N,N']: T_j - theta_i
    ad = delta.abs()
    huber = torch.where(ad <= kappa, 0.5 * delta * delta, kappa * (ad - 0.5 * kappa))
    weight = (tau[:, None, :, None] - (delta.detach() < 0).to(delta.dtype)).abs()  # [B,D,N,N']
    # sum over N, mean over N', mean over D
    return (weight * huber / kappa).mean(-1).sum(-1).mean(-1)       # [B]


# ----------------------------------------------------------------------------------------------
# The step
# ----------------------------------------------------------------------------------------------

def train_step(st: State, b: Batch, rep: Report, autocast: Callable[[], contextlib.AbstractContextManager],
               taus: Optional[Tuple[torch.Tensor, torch.Tensor]] = None) -> None:
    """One training step, in place on `st`, reporting into `rep`. No host synchronisation.

    taus: (tau [B,N], tau' [B,N']) for IQN; None draws them with torch.rand on the device.
    Order (spec): losses and gradients from the start-of-step parameters, budgets, Adam,
    spectral norm, target update.
    """
    sh, hp, P, T, z = st.sh, st.hp, st.params, st.target_w, st.z
    L = len(sh.trunk)
    losses: Dict[str, torch.Tensor] = {}

    # ---- forward (autocast in bf16 mode; backward runs outside it, as PyTorch recommends,
    #      its ops taking the dtypes autocast chose for the forward) ----
    with autocast():
        h2 = trunk_forward(P, b.states, L)                          # [B,H]
        logp = dist_head_logp(P, "c51", h2, sh)                     # [B,D,A,Z]
        with torch.no_grad():
            # double DQN: a* from the online C51 head at s' (argmax returns the lowest index on ties)
            a_star = expected_q(dist_head_logp(P, "c51", trunk_forward(P, b.next_states, L), sh),
                                z).argmax(-1)                        # [B,D]
            h2_t = trunk_forward(T, b.next_states, L)               # [B,H] target trunk at s'
            p_next = take_action(dist_head_logp(T, "c51", h2_t, sh), a_star).exp()  # [B,D,Z]
            with torch.autocast(device_type=b.states.device.type, enabled=False):
                m = c51_project(_f32(p_next), b.rewards, b.dones, z, hp)           # [B,D,Z]
        td = xent_per_sample(logp, b.actions, m)                    # [B]
        losses["c51"] = (b.is_weights * td).mean()

        if "ensemble" in st.heads:
            member_logp = [dist_head_logp(P, f"ensemble.{k}", h2, sh) for k in range(sh.K)]
            losses["ensemble"] = torch.stack(
                [(b.is_weights * xent_per_sample(lp, b.actions, m)).mean() for lp in member_logp]
            ).mean()
            if rep.disagreement is not None:
                with torch.no_grad():   # std of Q over the K members, mean over (d, a)
                    qk = torch.stack([expected_q(lp, z) for lp in member_logp])     # [K,B,D,A]
                    rep.disagreement.copy_(qk.std(dim=0, correction=0).mean(dim=(1, 2)))

        if "iqn" in st.heads:
            if taus is None:
                tau = torch.rand(b.B, sh.N, device=h2.device, dtype=z.dtype)        # [B,N]
                tau_t = torch.rand(b.B, sh.Np, device=h2.device, dtype=z.dtype)     # [B,N']
            else:
                tau, tau_t = taus
            theta_q = take_quantile_action(iqn_quantiles(P, h2, tau, sh), b.actions)  # [B,N,D]
            with torch.no_grad():
                qt = take_quantile_action(iqn_quantiles(T, h2_t, tau_t, sh), a_star)  # [B,N',D]
                target_q = b.rewards[:, None, None] + hp.gamma_n * (1 - b.dones)[:, None, None] * qt
            losses["iqn"] = (b.is_weights * iqn_loss_per_sample(theta_q, target_q, tau, hp.kappa)).mean()

        if "cql" in st.heads:
            q = expected_q(logp, z)                                 # [B,D,A]
            gap = torch.logsumexp(q, dim=-1) - q.gather(-1, b.actions[..., None]).squeeze(-1)  # [B,D]
            losses["cql"] = hp.cql_alpha * gap.mean()               # not importance-weighted

    # ---- per-head gradients over all online parameters: G [H,P] ----
    lay = st.layout
    G = torch.empty(len(st.heads), lay.P, dtype=st.theta.dtype, device=st.theta.device)
    for k, head in enumerate(st.heads):
        reach = [grp for grp in HEAD_GROUPS[head] if grp in lay.groups]
        inputs = [P[n] for grp in reach for n in lay.group_names[grp]]
        grads = torch.autograd.grad(losses[head], inputs, retain_graph=k + 1 < len(st.heads),
                                    allow_unused=True)   # None where a parameter is unused
        it = (torch.zeros_like(p) if g is None else g for p, g in zip(inputs, grads))
        for grp, (lo, hi) in lay.groups.items():                 # groups in flat-buffer order
            if grp in reach:   # this head's grads of the group, flattened into G[k, lo:hi]
                torch.cat([next(it).reshape(-1) for _ in lay.group_names[grp]], out=G[k, lo:hi])
            else:
                G[k, lo:hi].zero_()                                 # the head does not reach it

    with torch.no_grad():
        # ---- budgets ----
        norms = torch.linalg.vector_norm(G, dim=1)                  # [H]
        clips = torch.clamp(st.fractions * hp.max_grad_norm / (norms + 1e-6), max=1.0)  # [H]
        g = (clips[:, None] * G).sum(0)                             # [P]
        skip = ~torch.isfinite(G).all()                             # [] bool, stays on the device
        live = ~skip

        # ---- Adam (hand-written; docs/step-math.md's form, t and lr in device memory) ----
        t_new = st.t + live.to(torch.int64)                         # [] i64
        tf = t_new.to(st.theta.dtype)
        bc1 = 1 - hp.beta1 ** tf
        bc2 = 1 - hp.beta2 ** tf
        m_new = hp.beta1 * st.adam_m + (1 - hp.beta1) * g
        v_new = hp.beta2 * st.adam_v + (1 - hp.beta2) * (g * g)
        theta_new = st.theta - st.lr * (m_new / bc1) / (torch.sqrt(v_new / bc2) + hp.eps)
        # Skipped step: everything keeps its old value (theta_new may be NaN there: discarded).
        st.adam_m.copy_(torch.where(skip, st.adam_m, m_new))
        st.adam_v.copy_(torch.where(skip, st.adam_v, v_new))
        st.theta.copy_(torch.where(skip, st.theta, theta_new))
        st.t.copy_(t_new)

        # ---- spectral norm on the post-Adam matrices: one power iteration with stored u ----
        if hp.spectral_norm:
            one = torch.ones((), dtype=st.theta.dtype, device=st.theta.device)
            for name, u in st.sn_u.items():
                W = st.theta_w[name]                                # [rows,cols] view of theta
                v = torch.mv(W.t(), u)                              # [cols]
                v = v / torch.linalg.vector_norm(v)
                wv = torch.mv(W, v)                                 # [rows]
                sigma = torch.linalg.vector_norm(wv)
                u.copy_(torch.where(skip, u, wv / sigma))
                W.mul_(torch.where(skip, one, torch.clamp(hp.sigma_max / sigma, max=1.0)))

        # ---- target update ----
        if hp.target_period > 0:
            copy_now = live & (t_new % hp.target_period == 0)
            st.target.copy_(torch.where(copy_now, st.theta, st.target))
        else:
            # lerp(a, b, w) = a + w (b - a) for w < 0.5: docs/step-math.md's Polyak formula
            st.target.copy_(torch.where(skip, st.target, torch.lerp(st.target, st.theta, hp.polyak)))

        # ---- report ----
        lvec = torch.stack([losses[h].detach().to(rep.losses.dtype) for h in st.heads])  # [H]
        rep.losses.copy_(lvec)
        rep.total.copy_(lvec.sum())
        rep.norms.copy_(norms)
        rep.clips.copy_(clips)
        rep.td_error.copy_(td.detach())
        st.skipped.add_(skip.to(torch.int64))


# ----------------------------------------------------------------------------------------------
# Precision
# ----------------------------------------------------------------------------------------------

def set_tf32(enabled: bool) -> None:
    """TF32 for fp32 matmuls on or off (the new API where torch has it, else allow_tf32)."""
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        torch.backends.cuda.matmul.fp32_precision = "tf32" if enabled else "ieee"
    else:
        torch.backends.cuda.matmul.allow_tf32 = enabled


def autocast_factory(precision: str, device_type: str) -> Callable[[], contextlib.AbstractContextManager]:
    if precision == "bf16":
        # cache_enabled=False: the weight-cast cache must be off under CUDA graph capture.
        return lambda: torch.autocast(device_type=device_type, dtype=torch.bfloat16, cache_enabled=False)
    return contextlib.nullcontext


# ----------------------------------------------------------------------------------------------
# Benchmark
# ----------------------------------------------------------------------------------------------

def random_batch(sh: Shapes, B: int, seed: int, device, dtype=torch.float32) -> Batch:
    gen = torch.Generator().manual_seed(seed + 1000 + B)
    return Batch(
        states=torch.randn(B, sh.S, generator=gen).to(device, dtype),
        next_states=torch.randn(B, sh.S, generator=gen).to(device, dtype),
        actions=torch.randint(0, sh.A, (B, sh.D), generator=gen).to(device),
        rewards=torch.randn(B, generator=gen).to(device, dtype),
        dones=(torch.rand(B, generator=gen) < 0.1).to(device, dtype),
        is_weights=(0.5 + 0.5 * torch.rand(B, generator=gen)).to(device, dtype))


def time_steps(run_once: Callable[[], None], iters: int, repeats: int) -> List[float]:
    """Per repeat: event, `iters` steps, event, synchronize; microseconds per step."""
    out = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            run_once()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) * 1000.0 / iters)
    return out


def capture_graph(step):
    """Warms `step` up on a side stream, then captures it as one CUDA graph (PyTorch's "CUDA
    Graphs" notes); returns the graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph


def bench_one(args, sh: Shapes, hp: Hyper, heads: Tuple[str, ...], B: int, mode: str,
              precision: str) -> dict:
    device = torch.device("cuda")
    torch.manual_seed(args.seed)
    set_tf32(precision == "tf32")
    st = make_state(init_weights(sh, heads, args.seed), sh, hp, heads,
                    head_fractions(heads, args.fractions), torch.float32, device)
    batch = random_batch(sh, B, args.seed, device)                 # static inputs, uploaded once
    rep = Report.empty(len(heads), B, "ensemble" in heads, torch.float32, device)
    autocast = autocast_factory(precision, "cuda")
    step = lambda: train_step(st, batch, rep, autocast)             # noqa: E731

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    if mode == "graph":
        graph = capture_graph(step)
        run_once, iters = graph.replay, args.iters
    else:
        run_once, iters = step, args.eager_iters
    for _ in range(args.warmup):
        run_once()
    torch.cuda.synchronize()
    us = time_steps(run_once, iters, args.repeats)
    skipped = int(st.skipped.item())
    peak = torch.cuda.max_memory_allocated()
    return {"impl": "torch", "mode": mode, "precision": precision, "batch": B,
            "heads": ",".join(heads), "us_per_step_median": statistics.median(us),
            "us_min": min(us), "us_max": max(us), "iters": iters, "repeats": args.repeats,
            "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "peak_mem_bytes": peak, "skipped_steps": skipped}


def run_bench(args) -> None:
    if not torch.cuda.is_available():
        raise SystemExit("the benchmark needs a CUDA GPU (the golden run works on the CPU)")
    hp = hyper_from_args(args)
    batches = [int(x) for x in args.batch.split(",")]
    modes = [x.strip() for x in args.mode.split(",")]
    precisions = [x.strip() for x in args.precision.split(",")]
    for x in modes:
        if x not in ("eager", "graph"):
            raise SystemExit(f"--mode {x}: eager or graph")
    for x in precisions:
        if x not in ("fp32", "tf32", "bf16"):
            raise SystemExit(f"--precision {x}: fp32, tf32 or bf16")
    rows = []
    if not args.json:
        print(f"{'heads':<24} {'mode':<6} {'prec':<5} {'batch':>6} {'median us':>10} "
              f"{'min':>9} {'max':>9} {'iters':>6}", flush=True)
    for heads in args.head_sets:
        sh = shapes_from_args(args, heads)
        for B in batches:
            for mode in modes:
                for precision in precisions:
                    r = bench_one(args, sh, hp, heads, B, mode, precision)
                    rows.append(r)
                    if args.json:
                        print(json.dumps(r), flush=True)
                    else:
                        print(f"{r['heads']:<24} {mode:<6} {precision:<5} {B:>6} "
                              f"{r['us_per_step_median']:>10.1f} {r['us_min']:>9.1f} "
                              f"{r['us_max']:>9.1f} {r['iters']:>6}", flush=True)
                    torch.cuda.empty_cache()
    if not args.json and rows:
        print(f"# {rows[0]['gpu']}, torch {rows[0]['torch']}; device us/step from CUDA events, "
              f"median of {args.repeats} repeats after {args.warmup} warm-up steps", flush=True)


# ----------------------------------------------------------------------------------------------
# Golden reference
# ----------------------------------------------------------------------------------------------

def shapes_from_weights(w: Dict[str, torch.Tensor], heads: Sequence[str], args) -> Shapes:
    trunk = []
    while f"trunk.{len(trunk)}.weight" in w:
        trunk.append(w[f"trunk.{len(trunk)}.weight"].shape[0])
    if not trunk:
        raise SystemExit("weights file has no trunk.0.weight")
    S = w["trunk.0.weight"].shape[1]
    Z = w["c51.value.1.weight"].shape[0]
    Hh = w["c51.value.0.weight"].shape[0]
    D = 0
    while f"c51.branch.{D}.0.weight" in w:
        D += 1
    AZ = w["c51.branch.0.1.weight"].shape[0]
    if AZ % Z:
        raise SystemExit(f"c51.branch.0.1.weight has {AZ} rows, not a multiple of Z = {Z}")
    K = 0
    while f"ensemble.{K}.value.0.weight" in w:
        K += 1
    if "ensemble" in heads and K == 0:
        raise SystemExit("--heads has ensemble but the weights file has no ensemble.0.*")
    if "iqn" in heads and "iqn.embed.weight" not in w:
        raise SystemExit("--heads has iqn but the weights file has no iqn.*")
    E = w["iqn.embed.weight"].shape[1] if "iqn.embed.weight" in w else args.embed
    return Shapes(S=S, trunk=tuple(trunk), Hh=Hh, D=D, A=AZ // Z, Z=Z, K=K,
                  N=args.quantiles, Np=args.target_quantiles, E=E)


def run_golden(args) -> None:
    heads = args.head_sets[0]
    if len(args.head_sets) > 1:
        raise SystemExit("--golden takes one --heads")
    dtype = {"float64": torch.float64, "float32": torch.float32}[args.dtype]
    device = torch.device(args.device)
    if device.type == "cuda":
        set_tf32(False)
    torch.use_deterministic_algorithms(True, warn_only=True)
    weights = load_file(args.golden[0])
    bfile = load_file(args.golden[1])
    sh = shapes_from_weights(weights, heads, args)
    hp = hyper_from_args(args)
    st = make_state(weights, sh, hp, heads, head_fractions(heads, args.fractions), dtype, device)
    batch = Batch(states=bfile["states"].to(device, dtype),
                  next_states=bfile["next_states"].to(device, dtype),
                  actions=bfile["actions"].to(device, torch.int64),
                  rewards=bfile["rewards"].to(device, dtype).reshape(-1),
                  dones=bfile["dones"].to(device, dtype).reshape(-1),
                  is_weights=bfile["is_weights"].to(device, dtype).reshape(-1))
    B = batch.B
    if tuple(batch.actions.shape) != (B, sh.D) or batch.states.shape[1] != sh.S:
        raise SystemExit(f"batch shapes {tuple(batch.states.shape)}, {tuple(batch.actions.shape)} "
                         f"do not fit the weights (S {sh.S}, D {sh.D})")
    taus = None
    if "iqn" in heads:
        if "iqn.tau" not in bfile or "iqn.tau_target" not in bfile:
            raise SystemExit("IQN in the golden run needs iqn.tau [N_steps,B,N] and "
                             "iqn.tau_target [N_steps,B,N'] in the batch file")
        tau_all = bfile["iqn.tau"].to(device, dtype)
        taut_all = bfile["iqn.tau_target"].to(device, dtype)
        if tau_all.dim() != 3 or taut_all.dim() != 3 or tau_all.shape[1] != B or taut_all.shape[1] != B:
            raise SystemExit(f"iqn.tau {tuple(tau_all.shape)} / iqn.tau_target "
                             f"{tuple(taut_all.shape)}: expected [N_steps,{B},N]")
        if tau_all.shape[0] < args.steps or taut_all.shape[0] < args.steps:
            raise SystemExit(f"iqn.tau holds {tau_all.shape[0]} steps, --steps is {args.steps}")
        sh = replace(sh, N=tau_all.shape[2], Np=taut_all.shape[2])
        st.sh = sh
        taus = (tau_all, taut_all)
    rep = Report.empty(len(heads), B, "ensemble" in heads, dtype, device)
    print(f"golden: heads {','.join(heads)}, S {sh.S}, trunk {list(sh.trunk)}, Hh {sh.Hh}, "
          f"D {sh.D}, A {sh.A}, Z {sh.Z}, K {sh.K}, B {B}, {args.steps} steps, {args.dtype} on "
          f"{device}, spectral norm {'on' if hp.spectral_norm else 'off'}", file=sys.stderr)
    for s in range(args.steps):
        step_taus = (taus[0][s], taus[1][s]) if taus is not None else None
        train_step(st, batch, rep, contextlib.nullcontext, step_taus)

    out = state_to_weights(st)
    known = set(out)
    passthrough = [k for k in weights if k not in known]
    if passthrough:
        print(f"golden: {len(passthrough)} weights-file tensors not used by heads {heads} are "
              f"copied unchanged (e.g. {passthrough[0]})", file=sys.stderr)
        for k in passthrough:
            out[k] = weights[k].clone()
    for i, h in enumerate(heads):
        out[f"loss.{h}"] = rep.losses[i].cpu().clone()
        out[f"grad_norm.{h}"] = rep.norms[i].cpu().clone()
        out[f"clip.{h}"] = rep.clips[i].cpu().clone()
    out["loss.total"] = rep.total.cpu().clone()
    out["td_error"] = rep.td_error.cpu().clone()
    out["skipped_steps"] = st.skipped.cpu().clone()
    if taus is not None:
        out["iqn.tau"] = taus[0][: args.steps].cpu().clone()
        out["iqn.tau_target"] = taus[1][: args.steps].cpu().clone()
    if rep.disagreement is not None:
        out["ensemble.disagreement"] = rep.disagreement.cpu().clone()
    if args.out_dtype == "float32":
        out = {k: (v.float() if v.is_floating_point() else v) for k, v in out.items()}
    save_file({k: v.contiguous() for k, v in out.items()}, args.out)
    print(f"golden: wrote {len(out)} tensors to {args.out}; last step loss.total "
          f"{float(rep.total):.10g}, skipped {int(st.skipped)}", file=sys.stderr)


def run_make_inputs(args) -> None:
    heads = args.head_sets[0]
    sh = shapes_from_args(args, heads)
    B = int(args.batch.split(",")[0])
    save_file(init_weights(sh, heads, args.seed), args.make_inputs[0])
    b = random_batch(sh, B, args.seed, "cpu")
    bt = {"states": b.states, "next_states": b.next_states, "actions": b.actions.to(torch.int32),
          "rewards": b.rewards, "dones": b.dones, "is_weights": b.is_weights}
    if "iqn" in heads:
        gen = torch.Generator().manual_seed(args.seed + 7)
        bt["iqn.tau"] = torch.rand(args.steps, B, sh.N, generator=gen)
        bt["iqn.tau_target"] = torch.rand(args.steps, B, sh.Np, generator=gen)
    save_file({k: v.contiguous() for k, v in bt.items()}, args.make_inputs[1])
    print(f"wrote {args.make_inputs[0]} (heads {','.join(heads)}) and {args.make_inputs[1]} "
          f"(B {B})", file=sys.stderr)


# ----------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------

def shapes_from_args(args, heads: Sequence[str]) -> Shapes:
    return Shapes(S=args.state, trunk=tuple(int(x) for x in args.trunk.split(",")),
                  Hh=args.head_hidden, D=args.branches, A=args.actions, Z=args.atoms,
                  K=args.members if "ensemble" in heads else 0,
                  N=args.quantiles, Np=args.target_quantiles, E=args.embed)


def hyper_from_args(args) -> Hyper:
    return Hyper(gamma_n=args.gamma ** args.n_step, lr=args.lr, max_grad_norm=args.max_grad_norm,
                 polyak=args.polyak, target_period=args.target_period,
                 spectral_norm=args.spectral_norm == "on", sigma_max=args.sigma_max,
                 v_min=args.v_min, v_max=args.v_max, kappa=args.kappa, cql_alpha=args.cql_alpha)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("what to run")
    g.add_argument("--mode", default="graph", help="eager, graph, or a comma list (default graph)")
    g.add_argument("--precision", default="tf32", help="fp32, tf32, bf16, or a comma list")
    g.add_argument("--batch", default="256", help="batch size or comma list, e.g. 256,1024,4096")
    g.add_argument("--heads", action="append", default=None,
                   help="c51 | c51,iqn,ensemble,cql | all; repeat to run several head sets")
    g.add_argument("--json", action="store_true", help="one JSON object per line")
    g.add_argument("--golden", nargs=2, metavar=("WEIGHTS", "BATCH"), help="golden reference run")
    g.add_argument("--make-inputs", nargs=2, metavar=("WEIGHTS", "BATCH"),
                   help="write a fresh weights file and a random batch, then exit")
    g.add_argument("--steps", type=int, default=1, help="golden: steps to run on the batch")
    g.add_argument("--out", help="golden: step dump to write")
    g.add_argument("--device", default="cpu", help="golden: cpu or cuda")
    g.add_argument("--dtype", default="float64", choices=("float64", "float32"), help="golden")
    g.add_argument("--out-dtype", default="compute", choices=("compute", "float32"),
                   help="golden: dtype of the dump's reals (default: the compute dtype)")
    g.add_argument("--seed", type=int, default=1)

    t = p.add_argument_group("timing")
    t.add_argument("--warmup", type=int, default=200)
    t.add_argument("--iters", type=int, default=2000, help="graph replays per repeat")
    t.add_argument("--eager-iters", type=int, default=300, help="eager steps per repeat")
    t.add_argument("--repeats", type=int, default=5)

    s = p.add_argument_group("shapes (spec `ref` defaults)")
    s.add_argument("--state", type=int, default=64)
    s.add_argument("--trunk", default="256,256")
    s.add_argument("--head-hidden", type=int, default=128)
    s.add_argument("--branches", type=int, default=3)
    s.add_argument("--actions", type=int, default=5)
    s.add_argument("--atoms", type=int, default=51)
    s.add_argument("--members", type=int, default=4)
    s.add_argument("--quantiles", type=int, default=32)
    s.add_argument("--target-quantiles", type=int, default=32)
    s.add_argument("--embed", type=int, default=64)

    h = p.add_argument_group("pipeline constants")
    h.add_argument("--gamma", type=float, default=0.99)
    h.add_argument("--n-step", type=int, default=1, help="gamma_n = gamma ** n_step")
    h.add_argument("--lr", type=float, default=1e-4)
    h.add_argument("--max-grad-norm", type=float, default=10.0)
    h.add_argument("--polyak", type=float, default=0.005)
    h.add_argument("--target-period", type=int, default=0, help="> 0: hard copy instead of Polyak")
    h.add_argument("--spectral-norm", nargs="?", const="on", default="on", choices=("on", "off"))
    h.add_argument("--no-spectral-norm", dest="spectral_norm", action="store_const", const="off")
    h.add_argument("--sigma-max", type=float, default=2.0)
    h.add_argument("--v-min", type=float, default=-10.0)
    h.add_argument("--v-max", type=float, default=10.0)
    h.add_argument("--kappa", type=float, default=1.0)
    h.add_argument("--cql-alpha", type=float, default=1.0)
    h.add_argument("--frac-iqn", type=float, default=AUX_DEFAULT_FRACTION["iqn"])
    h.add_argument("--frac-ensemble", type=float, default=AUX_DEFAULT_FRACTION["ensemble"])
    h.add_argument("--frac-cql", type=float, default=AUX_DEFAULT_FRACTION["cql"])
    args = p.parse_args(argv)

    args.head_sets = [parse_heads(x) for x in (args.heads or ["c51"])]
    args.fractions = {"iqn": args.frac_iqn, "ensemble": args.frac_ensemble, "cql": args.frac_cql}
    if args.golden and args.make_inputs:
        p.error("--golden and --make-inputs are separate runs")
    if args.golden and not args.out:
        p.error("--golden needs --out")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.make_inputs:
        run_make_inputs(args)
    elif args.golden:
        run_golden(args)
    else:
        run_bench(args)


if __name__ == "__main__":
    main()
