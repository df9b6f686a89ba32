"""Env steps/s from the raw vector env to the whole distributed pipeline, measured side by side in one run.

    python benchmarks/throughput.py [--seconds 20] [--train-env-steps 8000]

Prints, for configs/pong.yaml's collector (env.envs_per_collector Pong envs on env.threads_per_collector threads,
collectors.torch_threads torch threads):
  raw vector env (ale-py AtariVectorEnv), and gymnasium's SyncVectorEnv over AtariPreprocessing for comparison;
  one process stepping and acting with the Q-network, building chunks (a collector without RPC);
  the pipeline (launch/local.sh's learner and 1, 2 or 4 collectors over CPU RPC), learner not training;
  the pipeline while training at the config's train.replay_ratio, the network in float32 and in bfloat16;
  learner updates/s on its own (train.batch_size from a replay of random Pong-shaped frames), float32 and bfloat16.
Rates are ratios to the raw env rate measured in the same run, because these machines are noisy.

With `--cleanrl PATH/dqn_atari.py [--cleanrl-python PYTHON]` it also runs CleanRL's single-process DQN on Pong
(PongNoFrameskip-v4, its own defaults otherwise) in the same session, with the same learning start and length as
the training pipeline, and reads its rates from the cumulative `SPS:` line it prints every 100 steps once learning
has started. CleanRL is not part of this repository: its script (github.com/vwxyzjn/cleanrl, cleanrl/dqn_atari.py)
needs an environment with stable-baselines3, and under gymnasium 1.x the renamed wrappers
(GrayscaleObservation, FrameStackObservation), ALE registration and same-step autoreset.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import arguments  # noqa: E402  (benchmarks/arguments.py, beside this script)
from envs import make_vector_env  # noqa: E402
from rl_dqn import dqn  # noqa: E402
from rl_dqn.collector import ChunkBuilder  # noqa: E402
from rl_dqn.config import load_config  # noqa: E402
from rl_dqn.learner import Learner  # noqa: E402
from rl_dqn.trainer import torch_threads  # noqa: E402
from rl_dqn.network import QNetwork  # noqa: E402
from rl_dqn.system import configure_process  # noqa: E402

CONFIG = ROOT / "configs/pong.yaml"


def timed(step, seconds: float, warmup: int = 20) -> float:
    """Calls per second of `step` over about `seconds`."""
    for _ in range(warmup):
        step()
    calls, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        step()
        calls += 1
    return calls / (time.perf_counter() - started)


def raw_env(cfg, seconds: float) -> float:
    env = make_vector_env(cfg.env, cfg.env.envs_per_collector, seed=0)
    env.reset()
    generator = torch.Generator().manual_seed(0)
    n, E = env.spec.num_actions, env.num_envs
    rate = timed(lambda: env.step(torch.randint(n, (E,), generator=generator)), seconds)
    env.close()
    return rate * E


def gymnasium_env(cfg, seconds: float) -> float:
    import ale_py
    import gymnasium as gym
    import numpy as np
    from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation
    gym.register_envs(ale_py)

    def make():
        env = gym.make(cfg.env.id, frameskip=1, repeat_action_probability=cfg.env.sticky_action_prob)
        return FrameStackObservation(AtariPreprocessing(env, frame_skip=cfg.env.frame_skip,
                                                        noop_max=cfg.env.noop_max), cfg.env.frame_stack)
    E = cfg.env.envs_per_collector
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env = gym.vector.SyncVectorEnv([make] * E)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    n = env.single_action_space.n
    rate = timed(lambda: env.step(rng.integers(0, n, E)), seconds)
    env.close()
    return rate * E


def acting_process(cfg, seconds: float) -> float:
    """What a collector does per step, without the transport: act, step, record into a chunk."""
    torch.set_num_threads(cfg.collectors.torch_threads)
    E = cfg.env.envs_per_collector
    env = make_vector_env(cfg.env, E, seed=0)
    net = QNetwork.for_env(env.spec.obs_shape, env.spec.num_actions, cfg.network, "cpu").for_acting()
    builder = ChunkBuilder(cfg.collectors.chunk_steps, E, env.spec)
    epsilons = dqn.apex_epsilons(E, 0, E)
    generator = torch.Generator().manual_seed(0)
    state = {"obs": env.reset(), "first": torch.ones(E, dtype=torch.bool)}

    def step():
        with torch.inference_mode():
            actions = dqn.select_actions(net(state["obs"]), epsilons, generator)
        result = env.step(actions)
        builder.add(state["obs"], state["first"], actions, result)
        state["obs"], state["first"] = result.obs, result.first
        if builder.full:
            builder.take(0, 0, 0)
    rate = timed(step, seconds)
    env.close()
    return rate * E


def pipeline(overrides: list[str], key: str, timeout: float = 900) -> dict:
    """Runs launch/local.sh's launcher on configs/pong.yaml and returns its summary.json (rates from `key`)."""
    with tempfile.TemporaryDirectory() as runs:
        env = dict(os.environ, RL_DQN_RUNS_DIR=runs)
        result = subprocess.run([sys.executable, "-m", "rl_dqn", "local", str(CONFIG), "run.name=bench",
                                 "metrics.interval_s=5", *overrides], cwd=ROOT, env=env, capture_output=True,
                                text=True, timeout=timeout)
        if result.returncode != 0:
            raise RuntimeError(f"pipeline {overrides} failed:\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
        summary = json.loads((Path(runs) / "bench" / "summary.json").read_text())
    summary["rate"] = summary[key]
    return summary


def cleanrl(python: str, script: str, learning_starts: int, train_env_steps: int) -> tuple[float, float]:
    """CleanRL's dqn_atari.py on Pong: env steps/s before learning starts and while learning."""
    result = subprocess.run([python, script, "--env-id", "PongNoFrameskip-v4", "--total-timesteps",
                             str(learning_starts + train_env_steps), "--learning-starts", str(learning_starts),
                             "--buffer-size", "100000", "--no-track", "--no-capture-video"],
                            cwd=Path(script).parent, env=dict(os.environ, PYTHONUNBUFFERED="1"), capture_output=True,
                            text=True, timeout=3600)
    # "SPS: <global_step / elapsed>" at global steps learning_starts, +100, +200, ...
    sps = [int(line.split()[1]) for line in result.stdout.splitlines() if line.startswith("SPS:")]
    if result.returncode != 0 or len(sps) < 2:
        raise RuntimeError(f"CleanRL run failed:\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
    steps = [learning_starts + 100 * i for i in range(len(sps))]
    elapsed = [step / rate for step, rate in zip(steps, sps)]
    return steps[0] / elapsed[0], (steps[-1] - steps[0]) / (elapsed[-1] - elapsed[0])


def learner_updates(cfg, seconds: float) -> float:
    """Learner.step() alone, with the learner process's torch threads: batches of train.batch_size from a replay
    holding 500 steps of each collector's envs, random Pong-shaped frames."""
    from envs import describe_env
    from rl_dqn.types import Chunk
    spec = describe_env(cfg.env)
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, replay_capacity=50_000, learning_starts=32))
    with tempfile.TemporaryDirectory() as run_dir:
        learner = Learner(cfg, spec, Path(run_dir))
        torch.set_num_threads(torch_threads(cfg, learner.device))
        T, E = 500, cfg.env.envs_per_collector
        for collector in range(cfg.num_collectors):
            learner.intake.ingest(Chunk(collector, 0, 0, torch.randint(0, 255, (T, E, 84, 84), dtype=torch.uint8),
                                 torch.randint(0, spec.num_actions, (T, E)), torch.zeros(T, E),
                                 torch.zeros(T, E, dtype=torch.bool), torch.zeros(T, E, dtype=torch.bool),
                                 torch.zeros(0, dtype=torch.float64), torch.zeros(0, dtype=torch.int64)))
        rate = timed(learner.step, seconds, warmup=5)
        learner.report.close()
    return rate


def main() -> None:
    parser = arguments.parser(__doc__)
    parser.add_argument("--seconds", type=arguments.positive, default=20.0, help="seconds per in-process measurement")
    parser.add_argument("--train-env-steps", type=arguments.count, default=8000,
                        help="env steps the training pipeline runs after learning starts")
    parser.add_argument("--cleanrl", metavar="DQN_ATARI_PY", help="CleanRL's dqn_atari.py, to run side by side")
    parser.add_argument("--cleanrl-python", default=sys.executable, help="the interpreter for --cleanrl")
    args = parser.parse_args()
    # CleanRL runs after the pipelines, minutes in: a script that is not there is refused before them.
    if args.cleanrl and not Path(args.cleanrl).is_file():
        parser.error(f"--cleanrl {args.cleanrl}: no such file (CleanRL's cleanrl/dqn_atari.py)")
    if args.cleanrl and not (shutil.which(args.cleanrl_python) or Path(args.cleanrl_python).is_file()):
        parser.error(f"--cleanrl-python {args.cleanrl_python}: no such interpreter")
    configure_process()   # as the learner and collector processes do
    cfg = load_config(CONFIG, ["run.name=bench"])
    print(f"rl_dqn throughput on {os.cpu_count()} CPU cores, torch {torch.__version__}, {cfg.env.id}, "
          f"{cfg.env.envs_per_collector} envs per collector, {cfg.collectors.torch_threads} torch thread(s) acting "
          f"({time.strftime('%Y-%m-%d')})", flush=True)
    threads, batch, ratio = cfg.env.threads_per_collector, cfg.train.batch_size, cfg.train.replay_ratio

    rows = []

    def report(label: str, rate: float, unit: str = "env steps/s", base: float | None = None) -> None:
        ratio = f"{rate / base:6.2f}x raw" if base else ""
        rows.append((label, rate, unit, ratio))
        print(f"  {label:<62} {rate:>9,.0f} {unit:<12} {ratio}", flush=True)

    raw = raw_env(cfg, args.seconds)
    report(f"raw vector env: ale-py AtariVectorEnv, {threads} thread(s)", raw, base=raw)
    report("raw vector env: gymnasium SyncVectorEnv + AtariPreprocessing", gymnasium_env(cfg, args.seconds), base=raw)
    report("one process acting with the Q-network (no RPC)", acting_process(cfg, args.seconds), base=raw)
    steps = int(raw * 8)
    for count in (1, 2, 4):
        s = pipeline([f"collectors.count={count}", "train.replay_ratio=0", f"train.total_env_steps={steps}"],
                     "env_steps_per_s")
        report(f"pipeline, {count} collector(s) over CPU RPC, learner not training", s["rate"], base=raw)
    start = 5000
    if args.cleanrl:
        before, learning = cleanrl(args.cleanrl_python, args.cleanrl, start, args.train_env_steps)
        report("CleanRL dqn_atari.py (one process) before learning starts", before, base=raw)
        report("CleanRL dqn_atari.py while learning (batch 32 every 4 steps)", learning, base=raw)
    for precision in ("fp32", "bf16"):
        s = pipeline([f"network.precision={precision}", f"train.learning_starts={start}",
                      f"train.total_env_steps={start + args.train_env_steps}"], "env_steps_per_s_training")
        report(f"pipeline training at replay ratio {ratio:g}, network in {precision}", s["rate"], base=raw)
        report(f"  ... its learner updates/s (batch {batch})", s["updates_per_s_training"], "updates/s")
    for precision in ("fp32", "bf16"):
        precise = dataclasses.replace(cfg, network=dataclasses.replace(cfg.network, precision=precision))
        report(f"learner alone, batch {batch}, {precision}", learner_updates(precise, args.seconds), "updates/s")


if __name__ == "__main__":
    main()
