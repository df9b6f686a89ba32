"""Greedy evaluation: of a checkpoint, `python -m rl_dqn.evaluate runs/<name> [--episodes 20] [--epsilon 0]`, and
periodically during training, in a process of its own (`Evaluator`) that feeds no replay and does not slow the
learner's loop.

Both play whole episodes (game over or time limit, not lost lives) and report the raw score.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import pickle
import queue
import sys
from pathlib import Path
from typing import NamedTuple

import torch

from envs import make_vector_env
from rl_dqn import dqn
from rl_dqn.config import Config, ConfigError, from_dict, to_dict
from rl_dqn.network import QNetwork


def latest_checkpoint(run_dir: Path) -> Path:
    checkpoints = sorted((run_dir / "checkpoints").glob("checkpoint_*.pt"))
    if not checkpoints:
        raise FileNotFoundError(f"no checkpoint in {run_dir / 'checkpoints'}")
    return checkpoints[-1]


def play(env, network: QNetwork, epsilon: float, generator: torch.Generator) -> list[float]:
    """Raw scores of one episode per env of `env` (a vector env), all stepped together, each env scoring the first
    episode it finishes after a reset."""
    n = env.num_envs
    epsilons = torch.full((n,), epsilon)
    returns = torch.zeros(n, dtype=torch.float64)
    scores = torch.zeros(n, dtype=torch.float64)
    done = torch.zeros(n, dtype=torch.bool)
    obs = env.reset()
    while not done.all():
        with torch.inference_mode():
            actions = dqn.select_actions(network(obs), epsilons, generator)
        result = env.step(actions)
        returns += result.raw_reward
        ended = result.episode_end & ~done
        scores[ended] = returns[ended]
        done |= ended
        obs = result.obs
    return scores.tolist()


def evaluate(checkpoint: Path, episodes: int = 20, epsilon: float = 0.0, seed: int = 12345) -> list[float]:
    """Raw scores of `episodes` episodes played by the checkpoint's network, epsilon-greedy."""
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    cfg = from_dict(state["config"])
    env = make_vector_env(cfg.env, episodes, seed=seed)
    network = QNetwork.for_env(env.spec.obs_shape, env.spec.num_actions, cfg.network)
    network.load_state_dict(state["network"])
    network.eval()
    try:
        return play(env, network, epsilon, torch.Generator().manual_seed(seed))
    finally:
        env.close()


class EvalResult(NamedTuple):
    env_steps: int          # env steps of the run when the weights were taken
    elapsed_s: float        # seconds since the learner started, then
    weights_version: int
    scores: list[float]


class Evaluator:
    """Plays `eval.episodes` episodes with the weights it is given, in a child process, one round at a time."""

    def __init__(self, cfg: Config):
        context = multiprocessing.get_context("spawn")
        self._requests, self._results = context.Queue(), context.Queue()
        self.process = context.Process(target=_evaluator_main, args=(to_dict(cfg), self._requests, self._results),
                                       name="rl_dqn-evaluator", daemon=True)
        self.process.start()
        self.busy = False

    def submit(self, state: dict[str, torch.Tensor], env_steps: int, elapsed_s: float, version: int) -> None:
        """Starts a round with `state` (a state_dict on the CPU)."""
        self._requests.put((state, env_steps, elapsed_s, version))
        self.busy = True

    def poll(self) -> EvalResult | None:
        """The finished round, if there is one; raises RuntimeError if the evaluator died."""
        try:
            outcome = self._results.get_nowait()
        except queue.Empty:
            if not self.process.is_alive():
                raise RuntimeError(f"the evaluator process exited with code {self.process.exitcode}") from None
            return None
        self.busy = False
        if isinstance(outcome, str):
            raise RuntimeError(outcome)
        return EvalResult(*outcome)

    def close(self) -> None:
        if self.process.is_alive():
            self._requests.put(None)
            self.process.join(timeout=2.0)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=2.0)
        self._requests.cancel_join_thread()


def _evaluator_main(cfg_dict: dict, requests, results) -> None:
    from rl_dqn.supervisor import die_with_parent
    die_with_parent()
    cfg = from_dict(cfg_dict)
    torch.set_num_threads(cfg.eval.torch_threads)
    env = None
    try:
        env = make_vector_env(cfg.env, cfg.eval.episodes, seed=cfg.run.seed * 100_000 + 99_999)
        network = QNetwork.for_env(env.spec.obs_shape, env.spec.num_actions, cfg.network).eval()
        generator = torch.Generator().manual_seed(cfg.run.seed + 99_999)
        while (request := requests.get()) is not None:
            state, env_steps, elapsed_s, version = request
            network.load_state_dict(state)
            results.put((env_steps, elapsed_s, version, play(env, network, cfg.eval.epsilon, generator)))
    except Exception as e:  # noqa: BLE001 - reported to the learner as one line
        results.put(f"evaluator failed: {type(e).__name__}: {str(e).strip().splitlines()[0] if str(e) else ''}")
    finally:
        if env is not None:
            env.close()
        os._exit(0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rl_dqn.evaluate", description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a run folder (its newest checkpoint) or a checkpoint file")
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--epsilon", type=float, default=0.0)
    args = parser.parse_args(argv)
    if args.episodes < 1:
        parser.error(f"--episodes must be >= 1, got {args.episodes}")
    try:
        checkpoint = args.run if args.run.is_file() else latest_checkpoint(args.run)
        scores = evaluate(checkpoint, args.episodes, args.epsilon)
    except (FileNotFoundError, ConfigError) as e:
        print(f"rl_dqn.evaluate: error: {e}", file=sys.stderr)
        return 2
    except (RuntimeError, KeyError, pickle.UnpicklingError, EOFError) as e:
        print(f"rl_dqn.evaluate: error: {checkpoint} is not an rl_dqn checkpoint ({type(e).__name__}: "
              f"{str(e).strip().splitlines()[0] if str(e).strip() else ''})", file=sys.stderr)
        return 2
    mean = sum(scores) / len(scores)
    std = (sum((s - mean) ** 2 for s in scores) / len(scores)) ** 0.5
    print(f"{checkpoint}: {len(scores)} episodes, score {mean:.2f} +- {std:.2f} "
          f"(min {min(scores):g}, max {max(scores):g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
