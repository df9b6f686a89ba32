"""Scores recorded runs' final weights in whole games, the games Dopamine's baselines score, into their records.

    python benchmarks/whole_games.py RUN_DIR [RUN_DIR ...] --record BENCHMARK [--episodes 10] [--seed 12345]
                                     [--max-episode-frames 108000]

A run's evaluation may cut its episodes short (configs/atari_cpu.yaml's eval.max_episode_frames: 5 minutes of play, so
that rounds stay short beside training), where Dopamine's baselines score whole games, up to ALE v5's 30 minutes.
For each run this plays its newest checkpoint (its final weights) for `--episodes` episodes at the run's eval.epsilon,
each cut at `--max-episode-frames`, and writes the scores, with the code and machine that played them, to
results/<BENCHMARK>/<run name>/whole_games.json; docs/results.md shows them beside the run's last evaluation.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import arguments  # noqa: E402  (benchmarks/arguments.py, beside this script)
from rl_dqn import checkpoints  # noqa: E402
from envs import EnvConfig, EnvError  # noqa: E402
from rl_dqn.config import ConfigError, load_config  # noqa: E402
from rl_dqn.evaluate import evaluate, load_player  # noqa: E402
from rl_dqn.results import RESULTS, ResultsError, benchmarks, whole_games_path  # noqa: E402
from rl_dqn.system import code_version, machine  # noqa: E402

ALE_V5_FRAMES = EnvConfig.max_episode_frames   # the envs' own limit, ALE v5's: 30 minutes of play


def main(argv: list[str] | None = None) -> int:
    parser = arguments.parser(__doc__, prog="whole_games.py")   # also when benchmarks/learning.py calls main()
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR",
                        help="finished, recorded runs, e.g. runs/<name>")
    parser.add_argument("--record", required=True, metavar="BENCHMARK",
                        help="the benchmark in results/ that holds the runs' records, e.g. atari_cpu_mdqn")
    parser.add_argument("--results", type=Path, default=RESULTS, help=argparse.SUPPRESS)   # tests' own folder
    parser.add_argument("--episodes", type=int, default=10, help="episodes per run, played side by side (default 10)")
    parser.add_argument("--seed", type=arguments.seed, default=12345, help="seed of the envs and the random actions")
    parser.add_argument("--max-episode-frames", type=int, default=ALE_V5_FRAMES,
                        help=f"cut each episode at this many frames (default {ALE_V5_FRAMES:,}, ALE v5's limit)")
    args = parser.parse_args(argv)
    # Without it, each run would be refused with advice to record it there, which fails the same way.
    if not (args.results / args.record / "benchmark.yaml").is_file():
        try:
            known = ", ".join(b.name for b in benchmarks(args.results)) or "none yet"
        except ResultsError as e:
            known = f"unknown ({e})"
        parser.error(f"--record {args.record}: no such benchmark in {args.results} (a folder with a benchmark.yaml; "
                     f"there are: {known})")
    if args.episodes < 1:
        parser.error(f"--episodes must be >= 1, got {args.episodes}")
    if args.max_episode_frames < 1:
        parser.error(f"--max-episode-frames must be >= 1, got {args.max_episode_frames}")
    try:
        # Every run is checked before any plays: a bad one in the list costs no time.
        plan = [(run, whole_games_path(run, args.record, args.results), checkpoints.newest(run)) for run in args.runs]
    except (ResultsError, FileNotFoundError) as e:
        print(f"whole_games: error: {e}", file=sys.stderr)
        return 2
    code, where = code_version(), machine()
    for run, path, checkpoint in plan:
        started = time.monotonic()
        epsilon = load_config(path.parent / "config.yaml").eval.epsilon   # the run's, as its record keeps it
        try:
            scores = evaluate(*load_player(checkpoint), args.episodes, epsilon, args.seed,
                              max_episode_frames=args.max_episode_frames)
        except checkpoints.CheckpointError as e:
            print(f"whole_games: error: {checkpoint} could not be played: {e.reason}", file=sys.stderr)
            return 1
        except (ConfigError, EnvError, RuntimeError, KeyError, TypeError, ValueError, EOFError) as e:
            print(f"whole_games: error: {checkpoint} could not be played ({type(e).__name__}: {e})", file=sys.stderr)
            return 1
        values = torch.tensor(scores, dtype=torch.float64)
        played = {"checkpoint": checkpoint.name, "episodes": len(scores), "epsilon": epsilon,
                  "max_episode_frames": args.max_episode_frames, "seed": args.seed, "scores": scores,
                  "mean": values.mean().item(), "std": values.std(unbiased=False).item(),
                  "seconds": round(time.monotonic() - started, 1), **code, "machine": where,
                  "command": " ".join(["python", "benchmarks/whole_games.py", str(run), "--record", args.record,
                                       "--episodes", str(args.episodes), "--seed", str(args.seed),
                                       "--max-episode-frames", str(args.max_episode_frames)])}
        path.write_text(json.dumps(played, indent=2) + "\n")
        print(f"{run.name}: {played['mean']:.2f} +- {played['std']:.2f} over {len(scores)} episodes cut at "
              f"{args.max_episode_frames:,} frames (min {min(scores):g}, max {max(scores):g}; epsilon "
              f"{epsilon:g}) in {played['seconds']:.0f} s: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
