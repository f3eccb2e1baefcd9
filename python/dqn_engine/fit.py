"""Training and evaluation on any object with Gymnasium's single-environment interface: reset(seed)
→ (obs, info), step(action) → (obs, reward, terminated, truncated, info). An environment that
resets itself (dqn_engine.Env) gives the episode's last observation in info["final_observation"];
one that does not is reset here. An action goes to the environment as an int where the network has
one branch, else as an int32 array of one bin per branch."""
import math

import numpy as np


def _to_env(a, branches):
    return int(a[0]) if branches == 1 else a.copy()


def evaluate(agent, env, episodes=10, seed=None, epsilon=0.0):
    """Greedy (or ε-greedy) episodes of `agent` on `env`; returns {"mean", "std", "min", "max",
    "episodes", "returns", "lengths"}."""
    rng = np.random.default_rng(seed)
    bins = agent.actions_per_branch
    returns, lengths = [], []
    for k in range(episodes):
        obs, _ = env.reset(seed=None if seed is None else seed + k)
        total, n = 0.0, 0
        while True:
            a = agent.act(np.asarray(obs, dtype=np.float32))
            if epsilon > 0 and rng.random() < epsilon:
                a = np.array([rng.integers(b) for b in bins], dtype=np.int32)
            obs, r, term, trunc, info = env.step(_to_env(a, agent.branches))
            total += float(r)
            n += 1
            if term or trunc:
                break
        returns.append(total)
        lengths.append(n)
    mean = sum(returns) / len(returns)
    std = math.sqrt(sum((x - mean) ** 2 for x in returns) / len(returns))
    return {"mean": mean, "std": std, "min": min(returns), "max": max(returns), "episodes": episodes,
            "returns": returns, "lengths": lengths}


def fit(agent, env, steps=None, *, eval_env=None, eval_every=None, eval_episodes=None, stop_at_return=None,
        callback=None, seed=0, log_every=1000):
    """Trains `agent` on `env` for `steps` environment steps (None: the pipeline's
    training.total_steps), acting ε-greedily and training as the pipeline's `training` section says
    (learning_starts, train_every, gradient_steps, the ε schedule). With `eval_env`, greedy episodes
    on it every `eval_every` steps (default training.eval.every; eval_episodes likewise), stopping
    once their mean reaches `stop_at_return` (default training.stop_at_return; 0: never).

    Every `log_every` steps and at each evaluation, `callback(record)` is called with a dict: step,
    train_steps, episodes, episode_return (the mean of the last 20 training episodes, or None),
    epsilon, and the newest report's losses, with eval_return/eval_min/eval_max at evaluations;
    returning False stops the run. Returns the list of records."""
    t = agent.training
    steps = t["total_steps"] if steps is None else steps
    eval_every = t["eval_every"] if eval_every is None else eval_every
    eval_episodes = t["eval_episodes"] if eval_episodes is None else eval_episodes
    stop_at_return = t["stop_at_return"] if stop_at_return is None else stop_at_return
    start, end, decay = t["epsilon_start"], t["epsilon_end"], t["epsilon_decay_steps"]
    rng = np.random.default_rng(seed)
    bins = agent.actions_per_branch
    D = agent.branches
    history, recent = [], []
    episodes, ep_return = 0, 0.0
    next_train = t["learning_starts"]
    obs, _ = env.reset(seed=seed)
    obs = np.asarray(obs, dtype=np.float32)
    eval_round = 0
    for step in range(1, steps + 1):
        eps = 1.0 if step <= t["learning_starts"] else start + (end - start) * min(1.0, step / max(decay, 1))
        if rng.random() < eps:
            a = np.array([rng.integers(b) for b in bins], dtype=np.int32)
        else:
            a = agent.act(obs)
        nxt, r, term, trunc, info = env.step(_to_env(a, D))
        nxt = np.asarray(nxt, dtype=np.float32)
        ended = bool(term) or bool(trunc)
        final = np.asarray(info["final_observation"], dtype=np.float32) if ended and "final_observation" in info else nxt
        agent.observe(obs[None], a[None], np.array([r], dtype=np.float32), final[None],
                      np.array([term], dtype=np.uint8), np.array([trunc], dtype=np.uint8))
        ep_return += float(r)
        if ended:
            episodes += 1
            recent = (recent + [ep_return])[-20:]
            ep_return = 0.0
            if "final_observation" not in info:  # a Gymnasium environment that waits for reset()
                nxt, _ = env.reset()
                nxt = np.asarray(nxt, dtype=np.float32)
        obs = nxt
        if step >= t["learning_starts"] and agent.replay_size >= t["batch"]:
            while next_train <= step:
                agent.train(t["gradient_steps"])
                next_train += t["train_every"]
        else:
            next_train = max(next_train, step + t["train_every"])
        do_eval = eval_env is not None and eval_every > 0 and step % eval_every == 0
        if step % log_every == 0 or do_eval or step == steps:
            rec = {"step": step, "train_steps": agent.train_steps, "episodes": episodes,
                   "episode_return": sum(recent) / len(recent) if recent else None, "epsilon": eps}
            rep = agent.latest_report()
            if rep:
                rec.update({k: v for k, v in rep.items() if k.startswith("loss.") or k == "total_loss"})
            if do_eval:
                ev = evaluate(agent, eval_env, eval_episodes, seed=seed + 1_000_000 * (eval_round + 1))
                eval_round += 1
                rec.update(eval_return=ev["mean"], eval_min=ev["min"], eval_max=ev["max"])
            history.append(rec)
            if callback is not None and callback(rec) is False:
                break
            if do_eval and stop_at_return and rec["eval_return"] >= stop_at_return:
                break
    return history

