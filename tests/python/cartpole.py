"""CartPole-v1 in plain Python with Gymnasium's interface (the classic cart-pole of Barto, Sutton and
Anderson as Gymnasium writes it: Euler steps of 20 ms, force ±10 N, done past 12° or 2.4 m,
truncated at 500 steps). It waits for reset() after an episode ends, as Gymnasium environments do."""
import math
import random


class CartPole:
    gravity, masscart, masspole, length, force_mag, tau = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
    theta_limit, x_limit, max_steps = 12 * 2 * math.pi / 360, 2.4, 500

    def __init__(self):
        self.rng = random.Random(0)
        self.state = None
        self.steps = 0

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.rng = random.Random(seed)
        self.state = [self.rng.uniform(-0.05, 0.05) for _ in range(4)]
        self.steps = 0
        return list(self.state), {}

    def step(self, action):
        if self.state is None:
            raise RuntimeError("step() before reset()")
        x, x_dot, theta, theta_dot = self.state
        force = self.force_mag if int(action) == 1 else -self.force_mag
        cos, sin = math.cos(theta), math.sin(theta)
        total_mass = self.masscart + self.masspole
        polemass_length = self.masspole * self.length
        temp = (force + polemass_length * theta_dot ** 2 * sin) / total_mass
        theta_acc = (self.gravity * sin - cos * temp) / (
            self.length * (4.0 / 3.0 - self.masspole * cos ** 2 / total_mass))
        x_acc = temp - polemass_length * theta_acc * cos / total_mass
        x += self.tau * x_dot
        x_dot += self.tau * x_acc
        theta += self.tau * theta_dot
        theta_dot += self.tau * theta_acc
        self.state = [x, x_dot, theta, theta_dot]
        self.steps += 1
        terminated = abs(x) > self.x_limit or abs(theta) > self.theta_limit
        truncated = not terminated and self.steps >= self.max_steps
        if terminated or truncated:
            obs, self.state = list(self.state), None
            return obs, 1.0, terminated, truncated, {}
        return list(self.state), 1.0, False, False, {}
