"""The environment plugins' tasks with Gymnasium's interface: reset(seed) → (obs, info) and
step(action) → (obs, reward, terminated, truncated, info). The engine resets a copy in the same
step its episode ends, so the observation step() returns is then the new episode's first, and
info["final_observation"] holds the one that ended it (as Gymnasium's vector environments do);
info["success"] says whether the task counted the episode a success, where it reports successes."""
import numpy as np

from ._core import Environment


class Env:
    """`task` ("CartPole-v1", "reacher", "plugin:task") with its options as keywords. One copy
    (num_envs None): observations [features], an action an int (one branch) or a sequence of one
    int per branch, a float reward, bool flags. num_envs = N: arrays with a leading N."""

    def __init__(self, task, num_envs=None, seed=0, plugin_path="", threads=1, **options):
        opts = [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in options.items()]
        self.vector = num_envs is not None
        self._env = Environment.make(task, num_envs or 1, seed, opts, plugin_path, threads)
        self._seed = seed
        self._resets = 0
        self.num_envs = self._env.copies
        self.observation_size = self._env.observation_size
        self.branches = self._env.branches
        self.actions_per_branch = list(self._env.actions_per_branch)
        self.control_ranges = list(self._env.control_ranges)
        self.max_episode_steps = self._env.max_episode_steps
        self.label = self._env.label

    def reset(self, seed=None, options=None):
        """New episodes on every copy, seeded from `seed` (None: the next of the seed given at
        construction)."""
        if seed is None:
            seed = self._seed + self._resets
        self._resets += 1
        obs = self._env.reset(int(seed))
        return (obs if self.vector else obs[0]), {}

    def step(self, action):
        a = np.asarray(action, dtype=np.int32).reshape(self.num_envs, self.branches)
        nxt, rew, term, trunc, fin, success = self._env.step(a)
        ended = (term | trunc).astype(bool)
        if self.vector:
            info = {}
            if ended.any():
                info = {"final_observation": fin, "_final_observation": ended}
                if self._env.reports_success:
                    info["success"] = success.astype(bool)
            return nxt, rew, term.astype(bool), trunc.astype(bool), info
        info = {}
        if ended[0]:
            info["final_observation"] = fin[0]
            if self._env.reports_success:
                info["success"] = bool(success[0])
        return nxt[0], float(rew[0]), bool(term[0]), bool(trunc[0]), info

    def control(self, action):
        """The controls a bin index per branch stands for, where the branch is continuous."""
        a = np.asarray(action).reshape(-1)
        out = []
        for d, k in enumerate(a):
            r, bins = self.control_ranges[d], self.actions_per_branch[d]
            out.append(float(k) if r is None else r[0] + float(k) * (r[1] - r[0]) / (bins - 1))
        return out


def make(task, num_envs=None, seed=0, **options):
    """Env(task, num_envs, seed, **options)."""
    return Env(task, num_envs=num_envs, seed=seed, **options)
