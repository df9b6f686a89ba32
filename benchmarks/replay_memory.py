"""Memory and speed of the replay memory at full scale: 1M Atari transitions.

    python benchmarks/replay_memory.py [--transitions 1000000]

Fills the replay with chunks of configs/pong.yaml's shape (collectors.count x env.envs_per_collector envs,
collectors.chunk_steps steps) and prints the resident memory the process gained, per transition, plus the time to
insert a chunk and to sample a batch.
Needs about 8 GB of free memory at the default size.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import arguments  # noqa: E402  (benchmarks/arguments.py, beside this script)
from rl_dqn.config import load_config  # noqa: E402
from rl_dqn.replay import ReplayMemory  # noqa: E402
from rl_dqn.types import Chunk  # noqa: E402


def resident_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def main() -> None:
    parser = arguments.parser(__doc__)
    parser.add_argument("--transitions", type=arguments.count, default=1_000_000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = load_config(ROOT / "configs/pong.yaml", [])
    collectors, E, T = cfg.collectors.count, cfg.env.envs_per_collector, cfg.collectors.chunk_steps
    least = collectors * E * (4 + 1 + 1)   # each lane holds a frame stack of 4 and a 1-step transition
    if args.transitions < least:
        parser.error(f"--transitions must be >= {least:,} ({collectors * E} lanes of at least 6 steps), got "
                     f"{args.transitions:,}")
    before = resident_bytes()
    replay = ReplayMemory(args.transitions, collectors * E, (84, 84), torch.uint8, frame_stack=4)
    generator = torch.Generator().manual_seed(0)
    frames = torch.randint(0, 255, (T, E, 84, 84), dtype=torch.uint8, generator=generator)
    chunk = Chunk(0, 0, 0, frames, torch.randint(0, 6, (T, E)), torch.randn(T, E),
                  torch.rand(T, E) < 0.01, torch.rand(T, E) < 0.001, torch.zeros(0, dtype=torch.float64),
                  torch.zeros(0, dtype=torch.int64))
    inserts, started = 0, time.perf_counter()
    while int(replay.written.sum()) < args.transitions:
        replay.extend((inserts % collectors) * E, chunk)
        inserts += 1
    insert_ms = (time.perf_counter() - started) / inserts * 1e3
    gained = resident_bytes() - before
    # A lane keeps its newest lane_capacity steps: what was written beyond that was overwritten.
    held = int(replay.written.clamp(max=replay.lane_capacity).sum())
    print(f"replay of {replay.num_lanes * replay.lane_capacity:,} transitions, {held:,} held "
          f"({int(replay.written.sum()):,} written): resident memory +{gained / 1e9:.2f} GB, "
          f"{gained / held:,.0f} bytes per transition held (one 84x84 frame is {frames[0, 0].nbytes:,})")
    print(f"insert a chunk of {T * E} transitions: {insert_ms:.2f} ms")
    for batch in (32, 256):
        replay.sample(batch, generator)
        n, started = 200, time.perf_counter()
        for _ in range(n):
            replay.sample(batch, generator)
        print(f"sample a batch of {batch} with stacks rebuilt: {(time.perf_counter() - started) / n * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
