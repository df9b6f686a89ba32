"""The floor of each game's table row: raw scores of a uniformly random policy, played as the evaluation plays.

    python benchmarks/random_scores.py [--episodes 20] [--games Qbert,Pong] [--set section.key=value ...] [CONFIG ...]

Plays `--episodes` whole episodes side by side per config (default: every Atari game config in configs/) with
epsilon 1 in the config's evaluation env (training's preprocessing, eval.max_episode_frames and
eval.sticky_action_prob) and prints mean +- std, min and max of the raw game score. `--games` plays each game with
each config (env.id=ALE/<Game>-v5); `--set` overrides apply to every config (e.g. `--set env.sticky_action_prob=0`).
"""

from __future__ import annotations

import csv
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import arguments  # noqa: E402  (benchmarks/arguments.py, beside this script)
from envs import EnvError, describe_env, make_vector_env  # noqa: E402
from envs.config import ConfigError, game_of  # noqa: E402
from rl_dqn.config import load_config  # noqa: E402
from rl_dqn.evaluate import play  # noqa: E402
from rl_dqn.network import QNetwork  # noqa: E402
from rl_dqn.results import RANDOM_COLUMNS  # noqa: E402

GAME_CONFIGS = ["pong.yaml", "breakout.yaml", "space_invaders.yaml", "seaquest.yaml", "beam_rider.yaml"]


def main() -> int:
    parser = arguments.parser(__doc__)
    parser.add_argument("configs", nargs="*", default=[str(ROOT / "configs" / name) for name in GAME_CONFIGS])
    parser.add_argument("--episodes", type=arguments.count, default=20)
    parser.add_argument("--seed", type=arguments.seed, default=0)
    parser.add_argument("--set", action="append", default=[], metavar="section.key=value",
                        help="an override applied to every config")
    parser.add_argument("--games", default="", help="Atari games, each played with every config, e.g. Qbert,Pong")
    parser.add_argument("--csv", type=Path, default=None, metavar="PATH",
                        help="also write the rows to this CSV (game, config, episodes, mean, std, min, max), e.g. "
                             "results/atari_cpu/random.csv, which docs/results.md shows beside the games")
    args = parser.parse_args()
    games = [g.strip() for g in args.games.split(",") if g.strip()]
    # The CSV is written once every game has played: a folder it cannot go into would lose all of them.
    if args.csv and (args.csv.is_dir() or not args.csv.parent.is_dir()):
        parser.error(f"--csv {args.csv}: " + ("is a folder; give a file's path" if args.csv.is_dir() else
                                               f"no folder {args.csv.parent} to write it into"))
    # Every config with every game is checked, and each game made once, before any plays.
    plan, described = [], set()
    for path, game in [(path, game) for path in args.configs for game in games or [None]]:
        try:
            cfg = load_config(path, [*args.set, *([f"env.id=ALE/{game}-v5"] if game else [])])
            if cfg.env.id not in described:
                describe_env(cfg.eval_env)
                described.add(cfg.env.id)
        except ConfigError as e:
            parser.error(arguments.config_error(e, path, args.set, "--set"))
        except EnvError as e:
            parser.error(f"--games {game}: {e}" if game else f"{path}: {e}")
        plan.append((path, game, cfg))
    torch.set_num_threads(1)
    print(f"{'config':<22} {'game':<22} {'episodes':>8} {'score mean +- std':>20} {'min':>7} {'max':>7} "
          f"{'seconds':>8}")
    rows = []
    for path, game, cfg in plan:
        env = make_vector_env(cfg.eval_env, args.episodes, seed=args.seed)
        # Epsilon 1: the network is never consulted for the choice, only shaped for the env.
        network = QNetwork.for_env(env.spec.obs_shape, env.spec.num_actions, cfg.network, "cpu").eval()
        started = time.monotonic()
        try:
            scores = torch.tensor(play(env, network, args.episodes, 1.0, torch.Generator().manual_seed(args.seed)))
        finally:
            env.close()
        rows.append([game_of(cfg.env.id), Path(path).name, args.episodes, f"{scores.mean():.2f}",
                     f"{scores.std(unbiased=False):.2f}", f"{scores.min():.0f}", f"{scores.max():.0f}"])
        print(f"{Path(path).name:<22} {cfg.env.id:<22} {args.episodes:>8} "
              f"{f'{scores.mean():.1f} +- {scores.std(unbiased=False):.1f}':>20} {scores.min():>7.0f} "
              f"{scores.max():>7.0f} {time.monotonic() - started:>8.0f}", flush=True)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            csv.writer(f).writerows([RANDOM_COLUMNS, *rows])
        print(f"wrote {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
