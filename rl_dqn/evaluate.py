"""Greedy evaluation of a checkpoint: `python -m rl_dqn.evaluate runs/<name> [--episodes 20] [--epsilon 0]`.

Plays whole episodes (game over or time limit, not lost lives) in envs that feed no replay, and prints the mean
and standard deviation of the raw score.
"""

from __future__ import annotations

import argparse
import pickle
import sys
from pathlib import Path

import torch

from envs import make_vector_env
from rl_dqn import dqn
from rl_dqn.config import ConfigError, from_dict
from rl_dqn.network import QNetwork


def latest_checkpoint(run_dir: Path) -> Path:
    checkpoints = sorted((run_dir / "checkpoints").glob("checkpoint_*.pt"))
    if not checkpoints:
        raise FileNotFoundError(f"no checkpoint in {run_dir / 'checkpoints'}")
    return checkpoints[-1]


def evaluate(checkpoint: Path, episodes: int = 20, epsilon: float = 0.0, seed: int = 12345) -> list[float]:
    """Raw scores of `episodes` episodes played by the checkpoint's network, epsilon-greedy: one env per
    episode, all stepped together, each scoring its first whole episode."""
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    cfg = from_dict(state["config"])
    env = make_vector_env(cfg.env, episodes, seed=seed)
    network = QNetwork(env.spec.obs_shape, env.spec.num_actions, cfg.network.mlp_hidden)
    network.load_state_dict(state["network"])
    network.eval()
    generator = torch.Generator().manual_seed(seed)
    epsilons = torch.full((episodes,), epsilon)
    returns = torch.zeros(episodes, dtype=torch.float64)
    scores = torch.zeros(episodes, dtype=torch.float64)
    done = torch.zeros(episodes, dtype=torch.bool)
    obs = env.reset()
    try:
        while not done.all():
            with torch.inference_mode():
                actions = dqn.select_actions(network(obs), epsilons, generator)
            result = env.step(actions)
            returns += result.raw_reward
            ended = result.episode_end & ~done
            scores[ended] = returns[ended]
            done |= ended
            obs = result.obs
    finally:
        env.close()
    return scores.tolist()


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
