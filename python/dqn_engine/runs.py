"""Agent.run and Agent.collect: the engine's own training loop and dataset collection, run on a
worker thread so that Ctrl-C (KeyboardInterrupt) in the main thread reaches Agent.request_stop(),
as SIGINT does for `dqn train` and `dqn collect`: a run stops at its next step with a checkpoint
written (Agent.resume continues it), a collection stops writing nothing."""
import threading

from ._core import Agent


def _interruptible(agent, work):
    out, err, finished = [None], [None], threading.Event()

    def body():
        try:
            out[0] = work()
        except BaseException as e:  # handed to the caller's thread
            err[0] = e
        finally:
            finished.set()

    threading.Thread(target=body, name="dqn_engine-run", daemon=True).start()
    # (an Event, not Thread.join: a join that KeyboardInterrupt cut short can return early later)
    try:
        while not finished.wait(0.1):
            pass
    except KeyboardInterrupt:
        agent.request_stop()
        while not finished.wait(0.1):
            pass
    if err[0] is not None:
        raise err[0]
    return out[0]


def run(self, run_dir="", progress=True):
    """The pipeline's own training loop (what `dqn train` runs) into `run_dir` ("": training.out_dir
    or runs/<name>-<time>): its environment or dataset, evaluations, stopping rules, metrics.jsonl,
    weights and checkpoints. Returns a dict: run_dir, env_steps, train_steps, episodes, final_eval,
    final_success, best_eval, solved, interrupted, checkpoint, …"""
    return _interruptible(self, lambda: self._run(run_dir, progress))


def collect(self, path, steps, epsilon=0.05, seed=1, replace=False):
    """`steps` environment steps of the current policy, ε-greedy, on the pipeline's environment,
    written at `path` as a dataset that training.dataset reads. Returns a dict: path, env, steps,
    episodes, complete_episodes, behaviour_return (None while no episode has ended), stopped (nothing
    written when True)."""
    return _interruptible(self, lambda: self._collect(path, steps, epsilon, seed, replace))


Agent.run = run
Agent.collect = collect
