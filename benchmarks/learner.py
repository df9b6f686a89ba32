"""Learner speed on its own: updates/s and samples/s at several batch sizes, and the share of sampling in an update.

    python benchmarks/learner.py [--seconds 10] [--batches 32,256,512] [--devices cpu,cuda] [--replay 200000]
                                 [--overlap on,off] [--graph on,off] [--only NIPS] [--profile UPDATES]

For each device present (CPU, and the GPU when there is one), each batch size and each of: prioritized 10-step
replay with the NIPS torso (configs/pong_cpu.yaml; also with QR-DQN's 32 quantiles, and in bfloat16 with Nature
DQN's target, with and without the quantiles, and with Munchausen's on the quantiles, configs/atari_cpu.yaml's
update), uniform 1-step replay (configs/pong.yaml) and prioritized 3-step replay with a dueling network
(configs/pong_apex.yaml), the last two with the Nature torso,
each with the network in float32 and in bfloat16, it fills a replay of Pong-shaped frames on that device and times
Learner.step() (sample, Double DQN update, new priorities) and replay.sample() alone, with the next batch prepared
on a second thread (learner.overlap, the default) and without, and on a GPU with the whole update captured as one
CUDA graph (learner.cuda_graph, the default; "graph" on, where overlap does not apply) and launched op by op. Torch
threads are the learner process's: all cores, shared out between the two threads under overlap. "CPU ms" is the
process's CPU time per update, which on a small machine is what the collectors and the learner share. --profile N
then prints torch.profiler's table of the operators that took the most time over N updates (use --overlap off: it
sees only the thread that calls step()).

--operators counts instead of timing, on any machine: each setup's update as a CUDA graph captures it (the trainer's
_graph_body()), run on PyTorch's meta device (benchmarks/meta_device.py), its operators that run a kernel counted by
part. On a GPU most of the captured update's time goes to starting its many small kernels one after another, so the
count is what a change to the update can lower without a GPU to time it. (The meta device clips gradients one
parameter at a time, as the CPU does: on a GPU that part is a few kernels over all of them.)
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import arguments  # noqa: E402  (benchmarks/arguments.py, beside this script)
import meta_device  # noqa: E402
from envs import EnvSpec  # noqa: E402
from rl_dqn.config import Config, ConfigError, load_config  # noqa: E402
from rl_dqn.learner import Learner  # noqa: E402
from rl_dqn.trainer import Trainer, torch_threads  # noqa: E402
from rl_dqn.system import configure_process  # noqa: E402
from rl_dqn.types import Chunk  # noqa: E402

SPEC = EnvSpec(obs_shape=(4, 84, 84), obs_dtype=torch.uint8, num_actions=6)
SETUPS = {
    "NIPS, PER, 10-step, fp32": ("pong_cpu.yaml", ["network.precision=fp32"]),
    "NIPS, PER, 10-step, bf16": ("pong_cpu.yaml", ["network.precision=bf16"]),
    "NIPS, PER, 10-step, bf16, Nature target": ("pong_cpu.yaml", ["network.precision=bf16", "train.double=false"]),
    "NIPS, 32 quantiles, PER, 10-step, fp32": ("pong_cpu.yaml", ["network.precision=fp32", "network.quantiles=32"]),
    "NIPS, 32 quantiles, PER, 10-step, bf16": ("pong_cpu.yaml", ["network.precision=bf16", "network.quantiles=32"]),
    "NIPS, 32 quantiles, PER, 10-step, bf16, Nature target": ("pong_cpu.yaml", [
        "network.precision=bf16", "network.quantiles=32", "train.double=false"]),
    "NIPS, 32 quantiles, PER, 10-step, bf16, Munchausen target": ("pong_cpu.yaml", [
        "network.precision=bf16", "network.quantiles=32", "train.double=false", "train.munchausen_alpha=0.9"]),
    "uniform, 1-step, fp32": ("pong.yaml", ["network.precision=fp32"]),
    "uniform, 1-step, bf16": ("pong.yaml", ["network.precision=bf16"]),
    "PER, 3-step, dueling, fp32": ("pong_apex.yaml", ["network.precision=fp32"]),
    "PER, 3-step, dueling, bf16": ("pong_apex.yaml", ["network.precision=bf16"]),
}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(call, device: torch.device, seconds: float) -> tuple[float, float]:
    """Seconds per call and the process's CPU seconds per call, after a warm-up, over about `seconds`."""
    for _ in range(5):
        call()
    synchronize(device)
    calls, started, cpu = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - started < seconds:
        call()
        calls += 1
        if calls % 10 == 0:
            synchronize(device)
    synchronize(device)
    return (time.perf_counter() - started) / calls, (time.process_time() - cpu) / calls


def setup_config(config: str, overrides: list[str], device: str, batch: int, transitions: int) -> Config:
    return load_config(ROOT / "configs" / config, [
        "run.name=bench", f"learner.device={device}", f"train.batch_size={batch}", "collectors.count=2",
        "env.envs_per_collector=8", f"train.replay_capacity={transitions}", "train.learning_starts=1000",
        *overrides])


def filled_learner(config: str, overrides: list[str], device: str, batch: int, transitions: int,
                   run_dir: Path) -> Learner:
    cfg = setup_config(config, overrides, device, batch, transitions)
    learner = Learner(cfg, SPEC, run_dir, device=device)
    generator = torch.Generator().manual_seed(0)
    for seq in range(transitions // (CHUNK_STEPS * cfg.env.envs_per_collector * cfg.num_collectors)):
        for collector in range(cfg.num_collectors):
            learner.intake.ingest(random_chunk(collector, seq, cfg.env.envs_per_collector, generator))
    return learner


CHUNK_STEPS = 64


def random_chunk(collector: int, seq: int, envs: int, generator: torch.Generator) -> Chunk:
    """A chunk of CHUNK_STEPS steps of `envs` Pong envs with random frames, actions, rewards and episode ends."""
    T, E = CHUNK_STEPS, envs
    return Chunk(collector, seq, 0, torch.randint(0, 255, (T, E, 84, 84), dtype=torch.uint8, generator=generator),
                 torch.randint(0, 6, (T, E), generator=generator), torch.randn(T, E),
                 torch.rand(T, E, generator=generator) < 0.01, torch.rand(T, E, generator=generator) < 0.002,
                 torch.zeros(0, dtype=torch.float64), torch.zeros(0, dtype=torch.int64),
                 torch.randn(T, E, generator=generator), torch.randn(T, E, generator=generator))


def measure(learner: Learner, seconds: float) -> tuple[float, float, float | None]:
    """Seconds per update, the process's CPU seconds per update, and seconds per sample() alone (None where the
    update is a captured graph, which samples inside it)."""
    torch.set_num_threads(torch_threads(learner.cfg, learner.device))
    replay, generator, batch = learner.trainer.replay, learner.trainer.generator, learner.cfg.train.batch_size
    step, cpu = timed(learner.step, learner.device, seconds)
    if learner.trainer.static:
        return step, cpu, None
    sample, _ = timed(lambda: replay.sample(batch, generator, 0.5), learner.device, seconds / 2)
    return step, cpu, sample


def profile(learner: Learner, updates: int, rows: int = 15) -> str:
    """torch.profiler's table of the operators that took the most time over `updates` updates. It records the thread
    that calls step(): under learner.overlap, the helper thread's work (sampling, the target network's values, the
    online network's values of s') is left out, so profile with --overlap off to see a whole update."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if learner.device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as profiler:
        for _ in range(updates):
            learner.step()
        synchronize(learner.device)
    key = "self_device_time_total" if learner.device.type == "cuda" else "self_cpu_time_total"
    return profiler.key_averages().table(sort_by=key, row_limit=rows)


def operators(config: str, overrides: list[str], batch: int, transitions: int) -> Counter:
    """The operators that run a kernel in the update a CUDA graph captures, by part (meta_device.PARTS): a trainer
    on the CPU trains once on a few chunks (Adam's state), then moves to the meta device and updates there."""
    cfg = setup_config(config, overrides, "cpu", batch, transitions)
    trainer = Trainer(cfg, SPEC, torch.device("cpu"), static=True)
    generator, E = torch.Generator().manual_seed(0), cfg.env.envs_per_collector
    for collector in range(cfg.num_collectors):
        trainer.replay.extend(collector * E, random_chunk(collector, 0, E, generator))
    trainer.step(cfg.train.learning_starts)
    meta_device.on_meta(trainer)
    counted = meta_device.Operators()
    meta_device.recorded_parts(trainer, counted)
    with meta_device.fused_adam_kernel(), counted:
        trainer._graph_body(trainer._n_step())
    trainer.close()
    return counted.kernels()


def count_operators(setups: dict, batches: list[int], transitions: int) -> None:
    width = max(len(label) for label in setups)
    print(f"operators of the captured update, by part (replay {transitions:,} transitions; views left out)")
    print(f"  {'replay and network':<{width}} {'batch':>5} {'all':>5}  " + "  ".join(meta_device.PARTS), flush=True)
    for label, (config, overrides) in setups.items():
        if "bf16" in label:   # autocast has no meta device
            continue
        for batch in batches:
            counted = operators(config, overrides, batch, transitions)
            print(f"  {label:<{width}} {batch:>5} {sum(counted.values()):>5}  " +
                  "  ".join(f"{counted[part]:>{len(part)}}" for part in meta_device.PARTS), flush=True)


ON_OFF = {"on": "true", "off": "false"}


def on_off(text: str) -> list[str]:
    settings = text.split(",")
    if not settings or any(s not in ON_OFF for s in settings):
        raise argparse.ArgumentTypeError(f"must be on, off or on,off, got {text!r}")
    return settings


def variants(device: str, overlap: list[str], graph: list[str]) -> list[tuple[str, str]]:
    """(learner.overlap, learner.cuda_graph) pairs to measure: a captured graph only on a GPU, where overlap does
    not apply to it."""
    pairs = [(o, "off") for o in overlap] if device == "cpu" or "off" in graph else []
    return pairs + ([("-", "on")] if device != "cpu" and "on" in graph else [])


def main() -> None:
    parser = arguments.parser(__doc__)
    parser.add_argument("--seconds", type=arguments.positive, default=10.0, help="seconds per measurement")
    parser.add_argument("--batches", type=arguments.counts, default=[32, 256, 512])
    parser.add_argument("--devices", default="cpu,cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--replay", type=arguments.count, default=200_000, help="transitions in the replay")
    parser.add_argument("--overlap", default="on,off", type=on_off,
                        help="learner.overlap settings to measure: on, off or on,off")
    parser.add_argument("--graph", default="on,off", type=on_off,
                        help="learner.cuda_graph settings to measure on a GPU: on, off or on,off")
    parser.add_argument("--only", default="", help="measure only the setups whose label contains this, e.g. NIPS")
    parser.add_argument("--profile", type=int, default=0, metavar="UPDATES",
                        help="after each measurement, profile this many updates and print the costliest operators")
    parser.add_argument("--operators", action="store_true",
                        help="count the captured update's operators by part instead of timing (float32 setups)")
    args = parser.parse_args()
    if args.profile < 0:
        parser.error(f"--profile must be >= 0 updates, got {args.profile}")
    setups = {label: setup for label, setup in SETUPS.items() if args.only in label}
    if not setups:
        parser.error(f"--only {args.only!r} is in no setup's label: {'; '.join(SETUPS)}")
    devices = args.devices.split(",")
    for device in devices:
        cuda = re.fullmatch(r"cuda(?::(\d+))?", device)
        if cuda and torch.cuda.device_count() <= int(cuda[1] or 0):
            parser.error(f"--devices {args.devices}: no {device} here ({torch.cuda.device_count()} GPU(s))")
        # Every setup's config is built before any measures: one that is refused would end the benchmark midway.
        for config, overrides in setups.values():
            for batch in args.batches:
                try:
                    setup_config(config, overrides, device, batch, args.replay)
                except ConfigError as e:
                    flag = {"learner.device": f"--devices {args.devices}", "train.batch_size": f"--batches {batch}",
                            "train.replay_capacity": f"--replay {args.replay}"}.get(e.key, f"{config}")
                    parser.error(f"{flag}: {e}")
    if args.operators:
        count_operators(setups, args.batches, args.replay)
        return
    configure_process()   # as the learner process does
    gpu = f", {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""
    print(f"rl_dqn learner on {os.cpu_count()} CPU cores{gpu}, torch {torch.__version__}, replay "
          f"{args.replay:,} Pong transitions ({time.strftime('%Y-%m-%d')})", flush=True)
    width = max(len(label) for label in SETUPS)
    print(f"  {'device':<6} {'replay and network':<{width}} {'overlap':>7} {'graph':>5} {'batch':>5} {'updates/s':>10} "
          f"{'samples/s':>10} {'CPU ms':>8} {'sampling share':>15}", flush=True)
    failed = False
    for device in devices:
        for label, (config, overrides) in setups.items():
            for batch in args.batches:
                for overlap, graph in variants(device, args.overlap, args.graph):
                    with tempfile.TemporaryDirectory() as run_dir:
                        settings = [f"learner.overlap={ON_OFF.get(overlap, 'false')}",
                                    f"learner.cuda_graph={ON_OFF[graph]}"]
                        learner = filled_learner(config, [*overrides, *settings], device, batch, args.replay,
                                                 Path(run_dir))
                        step, cpu, sample = measure(learner, args.seconds)
                        shown = "fail" if graph == "on" and not learner.trainer.static else graph   # eager updates
                        failed = failed or shown == "fail"
                        share = "-" if sample is None else f"{sample / step:.0%}"
                        print(f"  {device:<6} {label:<{width}} {overlap:>7} {shown:>5} {batch:>5} {1 / step:>10,.1f} "
                              f"{batch / step:>10,.0f} {cpu * 1e3:>8.1f} {share:>14}", flush=True)
                        if args.profile:
                            print(profile(learner, args.profile), flush=True)
                        learner.report.close()
    if failed:
        print("  graph fail: the update could not be captured (the learner's warning above says why); the row's "
              "updates ran eagerly", flush=True)


if __name__ == "__main__":
    main()
