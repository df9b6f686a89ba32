"""What an evaluation round costs: one checkpoint's round of episodes played over different numbers of envs side by
side, and of threads stepping them, in one process, as the evaluator plays them.

    python benchmarks/evaluation.py runs/<name>[/checkpoints/<file>.pt] [--envs 20,8,4] [--threads 1]
                                    [--episodes 20] [--epsilon 0.005] [--max-episode-frames 18000]

For each count of envs (eval.envs) and of threads stepping them (env.threads_per_collector, which the evaluator's
envs take from training's), the same seed: the round's wall seconds and CPU seconds, its mean score and each
episode's score, lowest first (a mean of 10 can be 20 games won and lost by similar margins, or all won narrowly).
With one env per episode every env steps on until the longest episode ends; with fewer, each plays episodes one
after another and only the last ones wait. A mid-training Pong agent plays long rallies, where this matters most.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import arguments  # noqa: E402  (benchmarks/arguments.py, beside this script)
from envs import make_vector_env  # noqa: E402
from rl_dqn import checkpoints  # noqa: E402
from rl_dqn.evaluate import load_player, play  # noqa: E402
from rl_dqn.system import configure_process  # noqa: E402


def main() -> None:
    parser = arguments.parser(__doc__)
    parser.add_argument("run", type=Path, help="a run folder (its newest checkpoint) or a checkpoint file")
    parser.add_argument("--envs", type=arguments.counts, default=[20, 8, 4],
                        help="envs side by side to compare (default 20,8,4)")
    parser.add_argument("--threads", type=arguments.counts, default=[1],
                        help="ALE threads stepping the envs to compare (default 1)")
    parser.add_argument("--episodes", type=arguments.count, default=20)
    parser.add_argument("--epsilon", type=arguments.probability, default=0.005)
    parser.add_argument("--max-episode-frames", type=arguments.count, default=18_000,
                        help="evaluation time limit in emulator frames (eval.max_episode_frames; default 18,000)")
    parser.add_argument("--seed", type=arguments.seed, default=7)
    args = parser.parse_args()
    configure_process()   # as the evaluator process does
    try:
        checkpoint = checkpoints.newest(args.run) if args.run.is_dir() else args.run
        if not checkpoint.is_file():
            raise FileNotFoundError(f"no such run folder or checkpoint file: {checkpoint}")
        cfg, network = load_player(checkpoint)
    except FileNotFoundError as e:
        parser.error(f"run {args.run}: {e}")
    except checkpoints.CheckpointError as e:
        parser.error(f"run {args.run}: cannot load {checkpoint} ({e.reason})")
    torch.set_num_threads(cfg.eval.torch_threads)
    # The evaluator's env: training's with the run's eval.sticky_action_prob (see Config.eval_env).
    env_cfg = dataclasses.replace(cfg.eval_env, max_episode_frames=args.max_episode_frames)
    print(f"{checkpoint}: {args.episodes} episodes of {env_cfg.id} at epsilon {args.epsilon:g}, sticky actions "
          f"{env_cfg.sticky_action_prob:g}, cut at {args.max_episode_frames:,} frames, {cfg.eval.torch_threads} torch "
          f"thread(s) ({time.strftime('%Y-%m-%d')})", flush=True)
    print(f"  {'envs':>4} {'threads':>7} {'wall s':>8} {'CPU s':>8} {'score':>7}   episodes", flush=True)
    for envs, threads in itertools.product(args.envs, args.threads):
        env = make_vector_env(dataclasses.replace(env_cfg, threads_per_collector=threads), envs, seed=args.seed)
        started, cpu = time.perf_counter(), time.process_time()
        try:
            scores = play(env, network, args.episodes, args.epsilon, torch.Generator().manual_seed(args.seed))
        finally:
            env.close()
        print(f"  {envs:>4} {threads:>7} {time.perf_counter() - started:>8.1f} {time.process_time() - cpu:>8.1f} "
              f"{sum(scores) / len(scores):>7.2f}   {' '.join(f'{score:g}' for score in sorted(scores))}", flush=True)


if __name__ == "__main__":
    main()
