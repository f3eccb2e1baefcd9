#!/usr/bin/env python3
"""The PyTorch peer of `dqn bench --epoch`: torch_peer.py's training step drawing its batch from
a replay resident on the GPU, sampled inside the same captured CUDA graph (uniform:
torch.randint; prioritised: a cumulative sum of p^α searched with stratified points, importance
weights (p_min/p_i)^β, priorities written back from td_error in the graph). Times whole epochs
of graph replays with CUDA events, median of repeats; one JSON line per configuration.

    python3 tools/bench/torch_epoch.py --replay uniform,prioritized --replay-size 1000000 \
        --epoch-steps 2000 --batch 256 --precision tf32 --json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

import torch_peer as tp


def epoch_one(args, sh, hp, heads, B: int, kind: str, precision: str) -> dict:
    device = torch.device("cuda")
    torch.manual_seed(args.seed)
    tp.set_tf32(precision == "tf32")
    st = tp.make_state(tp.init_weights(sh, heads, args.seed), sh, hp, heads,
                       tp.head_fractions(heads, args.fractions), torch.float32, device)
    C = args.replay_size
    gen = torch.Generator(device=device).manual_seed(args.seed)
    # The replay, filled once: states in [-1, 1], rewards in [-1, 1], 10 % dones.
    r_states = torch.rand(C, sh.S, device=device, generator=gen) * 2 - 1
    r_next = torch.rand(C, sh.S, device=device, generator=gen) * 2 - 1
    r_actions = torch.randint(0, sh.A, (C, sh.D), device=device, generator=gen)
    r_rewards = torch.rand(C, device=device, generator=gen) * 2 - 1
    r_dones = (torch.rand(C, device=device, generator=gen) < 0.1).float()
    leaf = torch.ones(C, device=device)            # p^α, new transitions at the running max (1)
    max_p = torch.ones((), device=device)
    batch = tp.Batch(states=torch.zeros(B, sh.S, device=device), next_states=torch.zeros(B, sh.S, device=device),
                     actions=torch.zeros(B, sh.D, dtype=torch.int64, device=device),
                     rewards=torch.zeros(B, device=device), dones=torch.zeros(B, device=device),
                     is_weights=torch.ones(B, device=device))
    rep = tp.Report.empty(len(heads), B, "ensemble" in heads, torch.float32, device)
    autocast = tp.autocast_factory(precision, "cuda")
    strata = torch.arange(B, device=device, dtype=torch.float32)
    alpha, beta, eps = args.alpha, args.beta, args.priority_eps

    def step() -> None:
        if kind == "prioritized":
            cdf = torch.cumsum(leaf, 0)
            total = cdf[-1]
            points = (strata + torch.rand(B, device=device)) * (total / B)
            idx = torch.searchsorted(cdf, points).clamp_(max=C - 1)
            batch.is_weights.copy_((leaf.min() / leaf[idx]) ** beta)
        else:
            idx = torch.randint(0, C, (B,), device=device)
        batch.states.copy_(r_states[idx])
        batch.next_states.copy_(r_next[idx])
        batch.actions.copy_(r_actions[idx])
        batch.rewards.copy_(r_rewards[idx])
        batch.dones.copy_(r_dones[idx])
        tp.train_step(st, batch, rep, autocast)
        if kind == "prioritized":
            with torch.no_grad():
                p = rep.td_error.abs() + eps
                leaf[idx] = p ** alpha
                torch.maximum(max_p, p.max(), out=max_p)

    torch.cuda.synchronize()
    graph = tp.capture_graph(step)
    for _ in range(args.warmup):
        graph.replay()
    torch.cuda.synchronize()
    us = tp.time_steps(graph.replay, args.epoch_steps, args.repeats)
    med = statistics.median(us)
    return {"impl": "torch", "mode": "epoch", "replay": kind, "replay_size": C, "precision": precision, "batch": B,
            "heads": ",".join(heads), "epoch_steps": args.epoch_steps, "epoch_s": med * args.epoch_steps * 1e-6,
            "us_per_step_median": med, "us_min": min(us), "us_max": max(us), "repeats": args.repeats,
            "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "skipped_steps": int(st.skipped.item())}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replay", default="uniform,prioritized", help="comma list: uniform, prioritized")
    p.add_argument("--replay-size", type=int, default=1000000)
    p.add_argument("--epoch-steps", type=int, default=2000, help="graph replays per timed epoch")
    p.add_argument("--alpha", type=float, default=0.6)
    p.add_argument("--beta", type=float, default=1.0)
    p.add_argument("--priority-eps", type=float, default=1e-6)
    own, rest = p.parse_known_args(argv)
    args = tp.parse_args(rest)  # shapes, constants, --batch, --precision, --heads, timing, --json
    for k, v in vars(own).items():
        setattr(args, k, v)
    if not torch.cuda.is_available():
        raise SystemExit("torch_epoch.py needs a CUDA GPU")
    hp = tp.hyper_from_args(args)
    kinds = [k.strip() for k in args.replay.split(",") if k.strip()]
    for k in kinds:
        if k not in ("uniform", "prioritized"):
            raise SystemExit(f"--replay {k}: uniform or prioritized")
    for heads in args.head_sets:
        sh = tp.shapes_from_args(args, heads)
        for B in [int(x) for x in args.batch.split(",")]:
            for precision in [x.strip() for x in args.precision.split(",")]:
                for kind in kinds:
                    r = epoch_one(args, sh, hp, heads, B, kind, precision)
                    if args.json:
                        print(json.dumps(r), flush=True)
                    else:
                        print(f"{r['heads']:<12} {precision:<5} {B:>6} {kind:<12} {r['us_per_step_median']:>10.1f} us/step "
                              f"{r['epoch_s']:>8.3f} s/{args.epoch_steps} steps", flush=True)
                    torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
