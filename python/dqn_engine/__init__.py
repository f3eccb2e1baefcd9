"""dqn-engine from Python: the engine's Agent (a pipeline's network, replay and training step, on
the CPU or CUDA), its environment plugins as Gymnasium-shaped objects, and `fit`, which trains an
agent on any object with Gymnasium's reset/step.

    import dqn_engine as de
    agent = de.Agent.from_file("pipelines/default.yaml", backend="cpu")
    history = de.fit(agent, de.make("CartPole-v1"), steps=30000, eval_env=de.make("CartPole-v1", seed=7))
    agent.evaluate(20)                  # on the pipeline's own environment plugin
    agent.save("cartpole.safetensors")
    agent.run("runs/cartpole")          # or the pipeline's own loop, as `dqn train` runs it

Errors from the engine arrive as ValueError (what was given is wrong: a pipeline error with its
file:line:column, an observation of the wrong shape with the expected one) or RuntimeError.
"""
from ._core import API_VERSION, Agent, Environment, cuda_devices
from .envs import Env, make
from .fit import evaluate, fit
from . import runs  # noqa: F401  (Agent.run, Agent.collect)

__all__ = ["API_VERSION", "Agent", "Environment", "cuda_devices", "Env", "make", "fit", "evaluate"]
