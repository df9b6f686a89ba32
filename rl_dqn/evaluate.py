"""Play of a checkpoint, `./launch/play.sh runs/<name> [--best] [--episodes 20] [--video episode.mp4]`, and
periodic evaluation during training, in a process of its own (`Evaluator`) that feeds no replay and does not slow the
learner's loop (the learner keeps the best-scoring network it evaluated as checkpoints/best.pt).

Both play whole episodes (game over or time limit, not lost lives), epsilon-greedy at the run's eval.epsilon (or
play.sh's --epsilon), report the raw score and can record env 0's first episode as a video of the game screen.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from envs import EnvError, make_vector_env
from rl_dqn import checkpoints, dqn
from rl_dqn.config import RUN_SEED_MAX, Config, ConfigError, from_dict, to_dict
from rl_dqn.console import OneLineParser, first_line
from rl_dqn.network import QNetwork
from rl_dqn.video import FORMATS, VideoError, VideoFile, fps_of, gif_bytes


def play(env, network: QNetwork, episodes: int, epsilon: float, generator: torch.Generator,
         record: Callable[[np.ndarray], None] | None = None, record_steps: int = 0,
         recording_over: Callable[[], None] | None = None) -> list[float]:
    """Raw scores of the first `episodes` episodes started in `env`, a vector env whose envs are stepped together
    and each play episodes one after another, in the order the episodes started: the envs' first episodes in env
    order, then each next one as it starts. `scores[0]` is thus env 0's first episode, the one `record` sees.
    Whether an episode counts is settled when it starts, before its outcome is known, so that short and long games
    count alike; an env whose episode does not count idles on until the last counted one ends. Fewer envs than
    episodes waste less of that idling than one episode per env, where every env waits for the longest. `record` is
    handed env 0's screen (the env must keep it) at the start of its first episode and after each of that
    episode's steps, up to `record_steps` steps; `recording_over` is called once that recording is over."""
    n = env.num_envs
    device = next(network.parameters()).device   # the env steps on the CPU; the network acts where it is
    epsilons = torch.full((n,), epsilon, device=device)
    returns = torch.zeros(n, dtype=torch.float64)
    started = min(n, episodes)
    slots = [i if i < started else None for i in range(n)]   # where each env's current episode goes in `scores`
    scores = [0.0] * episodes
    ended_count = 0
    obs = env.reset()
    recording, recorded = record is not None, 0
    if recording:
        record(env.screen)
    while ended_count < episodes:
        with torch.inference_mode():
            actions = dqn.select_actions(network(obs.to(device, non_blocking=True)), epsilons, generator)
        result = env.step(actions.cpu())
        returns += result.raw_reward
        ended = result.episode_end
        if recording and recorded < record_steps:
            record(env.screen)
            recorded += 1
        if recording and (ended[0] or recorded >= record_steps):
            recording = False
            if recording_over is not None:
                recording_over()
        # Each env whose episode ended starts its next one on its next step (the reset step, with no reward).
        for i in ended.nonzero().flatten().tolist():
            if slots[i] is not None:
                scores[slots[i]] = float(returns[i])
                ended_count += 1
            slots[i] = started if started < episodes else None
            started += int(slots[i] is not None)
        returns[ended] = 0.0
        obs = result.obs
    return scores


def play_round(envs: list, network: QNetwork, eval_cfg, generator: torch.Generator,
               record: Callable[[np.ndarray], None] | None = None, record_steps: int = 0) -> list[float]:
    """One evaluation round (`eval_cfg`: a config's `eval` section) on the vector envs of its phases (see
    Config.eval_phases): eval.episodes episodes, or with eval.screen_episodes that many first and the rest, on the
    second env, only if their mean reached eval.screen_score. `record` sees the first phase's env 0, whose first
    episode's score is `scores[0]`."""
    first = eval_cfg.screen_episodes or eval_cfg.episodes
    scores = play(envs[0], network, first, eval_cfg.epsilon, generator, record, record_steps)
    if first < eval_cfg.episodes and sum(scores) / len(scores) >= eval_cfg.screen_score:
        scores += play(envs[1], network, eval_cfg.episodes - first, eval_cfg.epsilon, generator)
    return scores


def load_player(checkpoint: Path) -> tuple[Config, QNetwork]:
    """The run's config and its online network from a checkpoint (the learner's or best.pt); CheckpointError where
    the file is not one, or holds what this version cannot rebuild a network from."""
    state = checkpoints.require_keys(checkpoints.read(checkpoint), checkpoint, ("config", "spec", "network"),
                                     "an rl_dqn checkpoint")
    try:
        cfg = from_dict(state["config"])
        spec = state["spec"]
        network = QNetwork.for_env(tuple(spec["obs_shape"]), spec["num_actions"], cfg.network, "cpu")
        network.load_state_dict(state["network"])
    except (ConfigError, RuntimeError, KeyError, TypeError, ValueError) as e:   # load_state_dict's run over lines
        raise checkpoints.CheckpointError(checkpoint, f"its network cannot be rebuilt ({type(e).__name__}: "
                                                      f"{first_line(e)})") from None
    return cfg, network.for_acting()


def evaluate(cfg: Config, network: QNetwork, episodes: int = 20, epsilon: float | None = None, seed: int = 12345,
             record: Callable[[np.ndarray], None] | None = None, record_steps: int = 0,
             max_episode_frames: int | None = None, recording_over: Callable[[], None] | None = None) -> list[float]:
    """Raw scores of `episodes` episodes played by a checkpoint's network (`load_player`), epsilon-greedy (`None`:
    the run's eval.epsilon), each cut at `max_episode_frames` (`None`: where the run's evaluation cuts them), in
    `play`'s order; env 0's screens go to `record` (then `recording_over` is called), and its first episode's
    score is `scores[0]`."""
    env_cfg = cfg.eval_env if max_episode_frames is None else \
        dataclasses.replace(cfg.eval_env, max_episode_frames=max_episode_frames)
    env = make_vector_env(env_cfg, min(cfg.eval.envs, episodes), seed=seed, screen=record is not None)
    try:
        return play(env, network, episodes, cfg.eval.epsilon if epsilon is None else epsilon,
                    torch.Generator().manual_seed(seed), record, record_steps, recording_over)
    finally:
        env.close()


class EvalResult(NamedTuple):
    env_steps: int          # env steps of the run when the weights were taken
    elapsed_s: float        # seconds on the run's clock (from its launch) when the weights were taken
    weights_version: int
    scores: list[float]
    video: bytes | None     # env 0's first episode (its score is scores[0]) as an animated GIF, with eval.video
    round_s: float          # wall seconds the round took to play
    round_cpu_s: float      # CPU seconds the evaluator process spent on it


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
        """Starts a round with `state` (a state_dict on the CPU), moved into shared memory here: the queue's feeder
        thread would otherwise move each tensor's storage there later, behind the back of a caller reading it."""
        for tensor in state.values():
            tensor.share_memory_()
        self._requests.put((state, env_steps, elapsed_s, version))
        self.busy = True

    def poll(self) -> EvalResult | None:
        """The finished round, if there is one; raises RuntimeError if the evaluator died."""
        try:
            outcome = self._results.get_nowait()
        except queue.Empty:
            if self.process.is_alive():
                return None
            try:   # what it said as it ended may have reached the pipe after the read above
                outcome = self._results.get(timeout=1.0)
            except queue.Empty:
                raise RuntimeError(f"the evaluator process exited with code {self.process.exitcode}") from None
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
    from rl_dqn.system import configure_process
    from rl_dqn.transport.devices import eval_device
    die_with_parent()
    configure_process()
    cfg = from_dict(cfg_dict)
    torch.set_num_threads(cfg.eval.torch_threads)
    envs, failed = [], False
    try:
        record = cfg.eval.video_max_steps if cfg.eval.video else 0
        for phase, (_, count) in enumerate(cfg.eval_phases):
            envs.append(make_vector_env(cfg.eval_env, count, seed=cfg.run.seed * 100_000 + 99_999 - 1_000 * phase,
                                        screen=record > 0 and phase == 0))
        spec = envs[0].spec
        device = eval_device(cfg, torch.cuda.device_count())
        network = QNetwork.for_env(spec.obs_shape, spec.num_actions, cfg.network, device).for_acting()
        generator = torch.Generator(device).manual_seed(cfg.run.seed + 99_999)
        while (request := requests.get()) is not None:
            state, env_steps, elapsed_s, version = request
            network.load_state_dict(state)
            started, cpu = time.monotonic(), time.process_time()
            frames: list[np.ndarray] = []
            scores = play_round(envs, network, cfg.eval, generator, frames.append if record else None, record)
            video = gif_bytes(frames, fps_of(cfg.env.frame_skip)) if record else None
            results.put((env_steps, elapsed_s, version, scores, video, time.monotonic() - started,
                         time.process_time() - cpu))
    except Exception as e:  # noqa: BLE001 - reported to the learner as one line
        results.put(f"evaluator failed: {type(e).__name__}: {first_line(e)}")
        # os._exit() would end the queue's feeder thread before it has written the line to the learner.
        results.close()
        results.join_thread()
        failed = True
    finally:
        for env in envs:
            env.close()
        os._exit(1 if failed else 0)


def main(argv: list[str] | None = None, prog: str = "./launch/play.sh") -> int:
    parser = OneLineParser(prog=prog, description="Plays a trained agent: episodes of a run's "
                                     "newest checkpoint (its best-scoring one with --best, or a given file), "
                                     "epsilon-greedy at the run's eval.epsilon unless --epsilon says otherwise; "
                                     "their mean raw score, and a video of env 0's first episode.")
    parser.add_argument("run", type=Path, help="a run folder (its newest checkpoint), e.g. runs/<name>, or a "
                                               "checkpoint file")
    parser.add_argument("--best", action="store_true",
                        help=f"play the network that scored best in the run's evaluations (checkpoints/"
                             f"{checkpoints.BEST}) instead of the newest checkpoint")
    parser.add_argument("--episodes", type=int, default=20, help="episodes, played side by side (default 20)")
    parser.add_argument("--epsilon", type=float, default=None,
                        help="chance of a random action (default: the run's eval.epsilon)")
    parser.add_argument("--seed", type=int, default=12345, help="seed of the envs and the random actions")
    parser.add_argument("--max-episode-frames", type=int, default=None,
                        help="cut each episode at this many frames (default: where the run's evaluation cuts them, "
                             "eval.max_episode_frames, else env.max_episode_frames); e.g. 108000, the 30 minutes of "
                             "play of ALE v5's own limit, to see what a shorter cut leaves out")
    parser.add_argument("--video", type=Path, default=None,
                        help=f"record the first episode of env 0 to this file ({' or '.join(FORMATS)})")
    parser.add_argument("--video-max-steps", type=int, default=None,
                        help="stop recording after this many agent steps (default: 27,000, a whole Atari episode, "
                             "for an mp4, which is written as it plays; 3,000 for a gif, which is held in memory)")
    parser.name = "play"
    args = parser.parse_args(argv)
    if args.episodes < 1:
        parser.error(f"--episodes must be >= 1, got {args.episodes}")
    if not 0 <= args.seed <= RUN_SEED_MAX:
        parser.error(f"--seed must be from 0 to {RUN_SEED_MAX:,}, got {args.seed}")
    if args.epsilon is not None and not 0.0 <= args.epsilon <= 1.0:
        parser.error(f"--epsilon must be in [0, 1], got {args.epsilon}")
    if args.video is not None and (args.video.suffix.lower() not in FORMATS or args.video.is_dir()):
        parser.error(f"--video must name a {' or '.join(FORMATS)} file, got {str(args.video)!r}"
                     + (", a folder" if args.video.is_dir() else ""))
    if args.video_max_steps is not None and args.video_max_steps < 1:
        parser.error(f"--video-max-steps must be >= 1, got {args.video_max_steps}")
    if not args.run.exists():
        return _fail(f"{args.run} is neither a run folder nor a checkpoint file")
    if args.best and args.run.is_file():
        parser.error(f"--best takes a run folder, not a checkpoint file ({args.run})")
    checkpoint = args.run
    try:
        if args.run.is_dir():
            checkpoint = checkpoints.best(args.run) if args.best else checkpoints.newest(args.run)
        cfg, network = load_player(checkpoint)
    except FileNotFoundError as e:
        return _fail(str(e))
    except checkpoints.CheckpointError as e:
        return _fail(f"cannot play {checkpoint}: {e.reason} (play takes a run folder, runs/<name>, or a .pt file "
                     f"of its checkpoints/)")
    if args.max_episode_frames is not None and not cfg.env.is_atari:
        parser.error(f"--max-episode-frames cuts Atari episodes; {cfg.env.id} keeps its own time limit")
    if args.max_episode_frames is not None and args.max_episode_frames < cfg.env.frame_skip:
        parser.error(f"--max-episode-frames must be >= the run's env.frame_skip ({cfg.env.frame_skip}), got "
                     f"{args.max_episode_frames}")
    video = None
    # A kill (SIGTERM) ends the play as Ctrl-C does, through the handler below (where this is the main thread, the
    # only one that can take a signal).
    on_main = threading.current_thread() is threading.main_thread()
    terminate = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum)) if on_main else None
    try:
        if args.video is not None:
            video = VideoFile(args.video, fps_of(cfg.env.frame_skip))
            steps = args.video_max_steps or (3_000 if video.gif else 27_000)
        scores = evaluate(cfg, network, args.episodes, args.epsilon, args.seed,
                          video.add if video is not None else None, steps if video is not None else 0,
                          args.max_episode_frames, video.close if video is not None else None)
        if video is not None:
            video.close()
    except BaseException as e:
        if video is not None:
            video.discard()     # a video still being recorded is not left half-written; a finished one stays
        if isinstance(e, (ConfigError, EnvError, VideoError)):
            return _fail(str(e))
        raise
    finally:
        if terminate is not None:   # None: not set here, or set from outside Python, which cannot be set back
            signal.signal(signal.SIGTERM, terminate)
    mean = sum(scores) / len(scores)
    std = (sum((s - mean) ** 2 for s in scores) / len(scores)) ** 0.5
    epsilon = f"epsilon {args.epsilon:g}" if args.epsilon is not None else \
        f"epsilon {cfg.eval.epsilon:g}, the run's eval.epsilon"
    frames = args.max_episode_frames or cfg.eval_env.max_episode_frames
    cut = f"; episodes cut at {frames:,} frames" if cfg.env.is_atari else ""   # other envs keep their own limits
    print(f"{checkpoint}: {len(scores)} episodes, score {mean:.2f} +- {std:.2f} "
          f"(min {min(scores):g}, max {max(scores):g}; {epsilon}{cut})")
    if video is not None:
        # The video is env 0's first episode (see `play`), which need not be the first to end.
        cut = (f"; the video stops after --video-max-steps ({steps:,} steps), the score is the whole episode's"
               if video.count > steps else "")
        print(f"video of env 0's first episode, which scored {scores[0]:g} ({video.count:,} frames{cut}): "
              f"{args.video}")
    return 0


def _fail(message: str) -> int:
    print(f"play: error: {message}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
