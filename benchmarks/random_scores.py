"""The floor of each game's table row: raw scores of a uniformly random policy, with the training preprocessing.

    python benchmarks/random_scores.py [--episodes 20] [--set section.key=value ...] [CONFIG ...]

Plays `--episodes` whole episodes side by side per config (default: every Atari game config in configs/) with
epsilon 1 and prints mean +- std, min and max of the raw game score. `--set` overrides apply to every config (e.g.
`--set env.id=ALE/Breakout-v5` with configs/pong_cpu.yaml: that game under pong_cpu's protocol).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from envs import make_vector_env  # noqa: E402
from rl_dqn.config import load_config  # noqa: E402
from rl_dqn.evaluate import play  # noqa: E402
from rl_dqn.network import QNetwork  # noqa: E402

GAME_CONFIGS = ["pong.yaml", "breakout.yaml", "space_invaders.yaml", "seaquest.yaml", "beam_rider.yaml"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("configs", nargs="*", default=[str(ROOT / "configs" / name) for name in GAME_CONFIGS])
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", action="append", default=[], metavar="section.key=value",
                        help="an override applied to every config")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{'config':<22} {'game':<22} {'episodes':>8} {'score mean +- std':>20} {'min':>7} {'max':>7} "
          f"{'seconds':>8}")
    for path in args.configs:
        cfg = load_config(path, args.set)
        env = make_vector_env(cfg.env, args.episodes, seed=args.seed)
        # Epsilon 1: the network is never consulted for the choice, only shaped for the env.
        network = QNetwork.for_env(env.spec.obs_shape, env.spec.num_actions, cfg.network, "cpu").eval()
        started = time.monotonic()
        try:
            scores = torch.tensor(play(env, network, args.episodes, 1.0, torch.Generator().manual_seed(args.seed)))
        finally:
            env.close()
        print(f"{Path(path).name:<22} {cfg.env.id:<22} {args.episodes:>8} "
              f"{f'{scores.mean():.1f} +- {scores.std(unbiased=False):.1f}':>20} {scores.min():>7.0f} "
              f"{scores.max():>7.0f} {time.monotonic() - started:>8.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
