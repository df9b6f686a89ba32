"""TensorPipe transports side by side: CPU burnt while idle, round trip of a small call, chunk throughput.

    python benchmarks/tensorpipe_transports.py

Two processes on this host talk over each transport list in turn, through torch's RPC: first both sit idle for 3 s
(CPU time per wall second, each), then 500 tiny calls, then 100 calls that each send the frames of one of rl_dqn's
chunks of configs/pong.yaml's shape (collectors.chunk_steps x env.envs_per_collector 84x84 frames, the bulk of a
chunk; the other fields stay behind), with at most 2 in flight. The MB/s count the bytes of the tensors sent.
"""

from __future__ import annotations

import multiprocessing
import resource
import socket
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import arguments  # noqa: E402  (benchmarks/arguments.py, beside this script)

CHOICES = [["uv"], ["shm", "uv"]]


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _idle_share(seconds: float = 3.0) -> float:
    cpu, wall = _cpu(), time.monotonic()
    time.sleep(seconds)
    return (_cpu() - cpu) / (time.monotonic() - wall)


def _echo(x):
    return x.numel()


def _worker(rank: int, port: int, transports: list[str], chunk_steps: int, envs: int, results) -> None:
    import torch
    import torch.distributed.rpc as rpc

    from rl_dqn.types import Chunk
    torch.set_num_threads(1)
    options = rpc.TensorPipeRpcBackendOptions(num_worker_threads=8, init_method=f"tcp://127.0.0.1:{port}",
                                              _transports=transports)
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=2, rpc_backend_options=options)
    idle = _idle_share()
    if rank == 0:
        tiny = torch.zeros(1)
        for _ in range(50):
            rpc.rpc_sync("w1", _echo, args=(tiny,))
        started, n = time.perf_counter(), 500
        for _ in range(n):
            rpc.rpc_sync("w1", _echo, args=(tiny,))
        round_trip_ms = (time.perf_counter() - started) / n * 1e3
        T, E = chunk_steps, envs
        chunk = Chunk(0, 0, 0, torch.randint(0, 255, (T, E, 84, 84), dtype=torch.uint8),
                      torch.zeros(T, E, dtype=torch.int64), torch.zeros(T, E), torch.zeros(T, E, dtype=torch.bool),
                      torch.zeros(T, E, dtype=torch.bool), torch.zeros(0, dtype=torch.float64),
                      torch.zeros(0, dtype=torch.int64))
        sent = (chunk.frames,)
        nbytes = sum(t.numel() * t.element_size() for t in sent)
        futures, n = [], 100
        started = time.perf_counter()
        for _ in range(n):
            futures.append(rpc.rpc_async("w1", _echo, args=sent))
            if len(futures) > 2:
                futures.pop(0).wait()
        for f in futures:
            f.wait()
        seconds = time.perf_counter() - started
        results.put((rank, idle, round_trip_ms, n * nbytes / seconds / 1e6, n * T * E / seconds, nbytes))
    else:
        results.put((rank, idle, None, None, None, None))
    rpc.shutdown()


def main() -> None:
    arguments.parser(__doc__).parse_args()   # it takes none: a flag meant for another benchmark is refused
    from rl_dqn.config import load_config
    cfg = load_config(ROOT / "configs/pong.yaml", [])
    chunk_steps, envs = cfg.collectors.chunk_steps, cfg.env.envs_per_collector
    context = multiprocessing.get_context("spawn")
    print(f"each send: the frames of a chunk of {chunk_steps} steps x {envs} envs (configs/pong.yaml)", flush=True)
    print(f"{'transports':<14} {'idle CPU, each':>15} {'tiny call':>10} {'frames sent':>12} {'transitions/s':>14}")
    for transports in CHOICES:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        results = context.Queue()
        workers = [context.Process(target=_worker, args=(r, port, transports, chunk_steps, envs, results))
                   for r in (0, 1)]
        for w in workers:
            w.start()
        rows = sorted(results.get(timeout=120) for _ in workers)
        for w in workers:
            w.join()
        (_, idle0, rtt, mbs, tps, nbytes), (_, idle1, *_) = rows
        print(f"{'+'.join(transports):<14} {f'{idle0:.0%} / {idle1:.0%}':>15} {rtt:>8.2f}ms {mbs:>7,.0f} MB/s "
              f"{tps:>14,.0f}   ({nbytes / 1e6:.2f} MB a send)", flush=True)


if __name__ == "__main__":
    main()
