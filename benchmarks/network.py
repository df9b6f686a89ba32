"""The Q-network's own speed on one CPU thread: each torso in each memory layout, and Adam's step with and without
denormal floats flushed to zero.

    python benchmarks/network.py [--seconds 2]

For the Nature and NIPS torsos (6 actions), in float32 and, where this CPU computes it natively, in bfloat16
(network.precision), with frames and kernels channels-last and in the plain layout: a forward and backward pass at
batch 32 (what the learner's training thread does per update) and a forward pass alone at batch 32, 20 and 8 (the
learner's next observations, an evaluation round's 20 envs, a collector's 8), each from uint8 frames as the
learner's batches come.
Then Adam's fused step over the NIPS network's parameters with ordinary moment estimates, and with moments that
have decayed into the denormal range (below 1.2e-38) as they do for a weight whose gradient stays zero, each with
denormals computed and flushed to zero. One thread, so that the figures are a single core's; alternate rows of one
run compare, since these machines are noisy.
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import arguments  # noqa: E402  (benchmarks/arguments.py, beside this script)
from rl_dqn.network import QNetwork, fast_bfloat16  # noqa: E402
from rl_dqn.system import keep_freed_memory  # noqa: E402


def ms_per_call(call, seconds: float) -> float:
    for _ in range(5):
        call()
    calls, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        call()
        calls += 1
    return (time.perf_counter() - started) / calls * 1e3


def layouts(args) -> None:
    precisions = ("fp32", "bf16") if fast_bfloat16("cpu")[0] else ("fp32",)
    print(f"  {'torso':<7} {'precision':<9} {'layout':<13} {'fwd+bwd 32':>11} {'fwd 32':>8} {'fwd 20':>8} "
          f"{'fwd 8':>8}   (ms)")
    for torso, precision, channels_last in itertools.product(("nature", "nips"), precisions, (True, False)):
        torch.manual_seed(0)
        network = QNetwork((4, 84, 84), 6, torso=torso, precision=precision).set_layout(channels_last)
        frames = {b: torch.randint(0, 256, (b, 4, 84, 84), dtype=torch.uint8) for b in (32, 20, 8)}

        def train():
            network.zero_grad(set_to_none=True)
            network(frames[32]).sum().backward()
        row = [ms_per_call(train, args.seconds)]
        with torch.no_grad():
            row += [ms_per_call(lambda b=b: network(frames[b]), args.seconds) for b in (32, 20, 8)]
        layout = "channels-last" if channels_last else "plain"
        cells = " ".join(f"{v:>8.2f}" if i else f"{v:>11.2f}" for i, v in enumerate(row))
        print(f"  {torso:<7} {precision:<9} {layout:<13} {cells}", flush=True)


def adam(args) -> None:
    print(f"  {'Adam moments':<22} {'denormals computed':>19} {'flushed to zero':>16}   (ms per step, NIPS torso)")
    for label, scale in (("ordinary", 1e-3), ("decayed below 1.2e-38", 1e-19)):
        row = []
        for flush in (False, True):
            torch.set_flush_denormal(flush)
            network = QNetwork((4, 84, 84), 6, torso="nips")
            optimizer = torch.optim.Adam(network.parameters(), lr=1e-4, fused=True)
            for p in network.parameters():   # squares of 1e-19 are 1e-38: denormal second moments
                p.grad = torch.randn_like(p) * scale
            row.append(ms_per_call(optimizer.step, args.seconds))
        torch.set_flush_denormal(False)
        print(f"  {label:<22} {row[0]:>19.2f} {row[1]:>16.2f}", flush=True)


def main() -> None:
    parser = arguments.parser(__doc__)
    parser.add_argument("--seconds", type=arguments.positive, default=2.0, help="seconds per figure")
    args = parser.parse_args()
    keep_freed_memory()
    torch.set_num_threads(1)
    print(f"rl_dqn Q-network on one thread of {os.cpu_count()} CPU cores, torch {torch.__version__} "
          f"({time.strftime('%Y-%m-%d')})", flush=True)
    layouts(args)
    adam(args)


if __name__ == "__main__":
    main()
