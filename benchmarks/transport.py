"""CPU staging against CUDA RPC, side by side in one run: `python benchmarks/transport.py [--quick]`.

(a) The seeds' experiment (PyTorch's CUDA RPC tutorial): two Linear(1000, 1000) shards on two processes, forward
    and distributed backward, 10 iterations, with the activations staged through host memory against sent GPU to
    GPU over a device map.
(b) Weight broadcast latency for configs/pong.yaml's Q-network to 1, 2 and 4 collectors: from the learner's
    publish to the last collector holding the weights, usable on its device (median of repeats).
(c) Chunk ingest: collectors send Pong chunks as fast as the learner answers; the learner puts them into its
    replay memory on its device. MB/s and transitions/s for several chunk sizes.
Every process uses rl_dqn's own transport, placement and replay, except (a), which is the tutorial's code.
Without a GPU only the CPU side runs, and the CUDA side says so. On one GPU every process shares cuda:0, which is
the setting where TensorPipe should pick its CUDA IPC channel; `TP_VERBOSE_LOGGING=1` makes TensorPipe log its
channel choices.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import arguments  # noqa: E402  (benchmarks/arguments.py, beside this script)
from rl_dqn.supervisor import free_port  # noqa: E402

KINDS = ("cpu", "cuda")


def run(targets, timeout: float = 600.0) -> list:
    """Runs (function, args) in spawned processes that report on a queue; returns the reports."""
    context = multiprocessing.get_context("spawn")
    reports = context.Queue()
    processes = [context.Process(target=f, args=(*args, reports)) for f, args in targets]
    for p in processes:
        p.start()
    for p in processes:
        p.join(timeout)
        if p.is_alive():
            for q in processes:
                q.kill()
            raise RuntimeError(f"{p.name} did not finish in {timeout} s")
    results = []
    while not reports.empty():
        results.append(reports.get())
    return results


# ------------------------------------------------------------------------------- (a) the seeds' experiment


class Shard(torch.nn.Module):
    def __init__(self, device: str, comm_mode: str):
        super().__init__()
        self.device, self.comm_mode = device, comm_mode
        self.linear = torch.nn.Linear(1000, 1000).to(device)

    def forward(self, x):
        y = self.linear(x.to(self.device))
        return y.cpu() if self.comm_mode == "cpu" else y


def _seed_worker(rank: int, port: int, device: str, reports) -> None:
    import torch.distributed.autograd as dist_autograd
    import torch.distributed.rpc as rpc
    options = rpc.TensorPipeRpcBackendOptions(num_worker_threads=16, init_method=f"tcp://127.0.0.1:{port}",
                                              _transports=["uv"])
    if rank == 0 and device.startswith("cuda"):
        options.set_device_map("worker1", {0: 0})   # one GPU: both shards on cuda:0, in two processes
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=2, rpc_backend_options=options)
    if rank == 0:
        modes = ("cpu", "cuda") if device.startswith("cuda") else ("cpu",)
        for mode in modes:
            local = Shard(device, mode)
            remote = rpc.remote("worker1", Shard, args=(device, mode))
            x = torch.randn(1000, 1000, device=device)
            for timed in (False, True):       # a warm-up round, then the measured one
                if device.startswith("cuda"):
                    torch.cuda.synchronize()
                started = time.perf_counter()
                for _ in range(10):
                    with dist_autograd.context() as context:
                        y = remote.rpc_sync().forward(local(x))
                        dist_autograd.backward(context, [y.sum()])
                if device.startswith("cuda"):
                    torch.cuda.current_stream().synchronize()
                if timed:
                    reports.put(("a", mode, time.perf_counter() - started))
    rpc.shutdown()


def seeds_experiment(device: str) -> dict[str, float]:
    port = free_port()
    return {mode: seconds for _, mode, seconds in run([(_seed_worker, (0, port, device)),
                                                        (_seed_worker, (1, port, device))])}


# ----------------------------------------------------------------- (b) weights and (c) chunks, our transport


def _config(kind: str, port: int, collectors: int, chunk_steps: int = 32, envs: int = 8):
    from rl_dqn.config import load_config
    return load_config(ROOT / "configs/pong.yaml", [
        "run.name=bench", f"transport.kind={kind}", f"cluster.init_method=tcp://127.0.0.1:{port}",
        f"collectors.count={collectors}", "cluster.single_node=true", "cluster.rank=1", "cluster.interface=lo",
        f"collectors.chunk_steps={chunk_steps}", f"env.envs_per_collector={envs}", "collectors.max_chunks_in_flight=2",
        "train.replay_capacity=200000", "train.learning_starts=1000"])


def _endpoint(cfg, rank: int):
    from rl_dqn.transport import CollectorTransport, LearnerTransport, place
    placement = place(cfg, rank, torch.cuda.device_count())
    if rank == 0:
        return LearnerTransport(cfg, threading.Event(), placement), placement
    return CollectorTransport(cfg, rank - 1, threading.Event(), placement), placement


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _broadcast_learner(kind: str, port: int, collectors: int, repeats: int, reports) -> None:
    from rl_dqn.network import QNetwork
    from rl_dqn.types import Weights
    cfg = _config(kind, port, collectors)
    transport, placement = _endpoint(cfg, 0)
    network = QNetwork.for_env((4, 84, 84), 6, cfg.network, placement.device)
    for version in range(repeats + 3):             # the first 3 warm up
        snapshot = {k: v.detach().clone() for k, v in network.state_dict().items()}
        if version == 0:
            reports.put(("b", "size", sum(p.numel() for p in network.parameters()),
                         sum(t.numel() * t.element_size() for t in snapshot.values())))
        _sync(placement.device)
        time.sleep(0.3)                               # every collector is idle and waiting
        started = time.monotonic()
        transport.publish(Weights(version, snapshot))
        reports.put(("b", "published", version, started))
        time.sleep(0.3)
    transport.stop_collectors(timeout=10)
    transport.close()


def _broadcast_collector(kind: str, port: int, collectors: int, rank: int, reports) -> None:
    cfg = _config(kind, port, collectors)
    transport, placement = _endpoint(cfg, rank)
    while not transport.stop_requested:
        weights = transport.poll_weights()
        if weights is not None:
            _sync(placement.device)                  # usable on this device
            reports.put(("b", "held", weights.version, time.monotonic(), str(weights.state["head.weight"].device)))
        time.sleep(0.0002)
    transport.close()


def broadcast_latency(kind: str, collectors: int, repeats: int) -> tuple[float, str, int, int]:
    """The median latency, the device the weights land on, the network's parameters and the bytes published."""
    port = free_port()
    reports = run([(_broadcast_learner, (kind, port, collectors, repeats))] +
                  [(_broadcast_collector, (kind, port, collectors, rank)) for rank in range(1, collectors + 1)])
    published = {r[2]: r[3] for r in reports if r[1] == "published"}
    held: dict[int, list[float]] = {}
    for r in reports:
        if r[1] == "held":
            held.setdefault(r[2], []).append(r[3])
    latencies = [max(times) - published[v] for v, times in held.items() if len(times) == collectors and v >= 3]
    device = next(r[4] for r in reports if r[1] == "held" and r[2] >= 3)   # the first may be the welcome's CPU copy
    parameters, nbytes = next(r[2:] for r in reports if r[1] == "size")
    return statistics.median(latencies), device, parameters, nbytes


def _ingest_learner(kind: str, port: int, collectors: int, chunk_steps: int, envs: int, seconds: float,
                    reports) -> None:
    from rl_dqn.replay import ReplayMemory
    from rl_dqn.types import Ack
    cfg = _config(kind, port, collectors, chunk_steps, envs)
    transport, placement = _endpoint(cfg, 0)
    replay = ReplayMemory(cfg.train.replay_capacity, cfg.num_envs, (84, 84), torch.uint8, 4, placement.device)
    nbytes = transitions = chunk_bytes = 0
    devices = set()
    started = None
    while started is None or time.monotonic() - started < seconds:
        for delivery in transport.receive(timeout=0.05):
            chunk = delivery.chunk
            replay.extend(chunk.collector * envs, chunk)
            transport.acknowledge(delivery, Ack(0, stop=False))
            chunk_bytes = max(chunk_bytes, chunk.nbytes)
            if started is None:
                _sync(placement.device)
                started = time.monotonic()
                continue
            nbytes += chunk.nbytes
            transitions += chunk.env_steps
            devices.add(str(chunk.frames.device))
    _sync(placement.device)
    elapsed = time.monotonic() - started
    reports.put(("c", nbytes / elapsed / 1e6, transitions / elapsed, sorted(devices), str(replay.frames.device),
                 chunk_bytes))
    transport.stop_collectors(timeout=10)
    transport.close()


def _ingest_collector(kind: str, port: int, collectors: int, chunk_steps: int, envs: int, rank: int,
                      reports) -> None:
    from rl_dqn.types import Chunk
    cfg = _config(kind, port, collectors, chunk_steps, envs)
    transport, placement = _endpoint(cfg, rank)
    d, T, E = placement.device, chunk_steps, envs
    frames = torch.randint(0, 255, (T, E, 84, 84), dtype=torch.uint8, device=d)
    seq = 0
    while not transport.stop_requested:
        # A fresh chunk each time, as a collector builds one (the transport may still read the previous one).
        transport.send(Chunk(rank - 1, seq, 0, frames.clone(), torch.zeros(T, E, dtype=torch.int64, device=d),
                             torch.zeros(T, E, device=d), torch.zeros(T, E, dtype=torch.bool, device=d),
                             torch.zeros(T, E, dtype=torch.bool, device=d), torch.zeros(0, dtype=torch.float64),
                             torch.zeros(0, dtype=torch.int64), torch.zeros(T, E, device=d),
                             torch.zeros(T, E, device=d)))
        seq += 1
    transport.close()


def ingest(kind: str, collectors: int, chunk_steps: int, envs: int, seconds: float) -> tuple:
    """MB/s and transitions/s into the replay, the devices chunks and replay were on, and the bytes of a chunk's
    tensors as received."""
    port = free_port()
    senders = [(_ingest_collector, (kind, port, collectors, chunk_steps, envs, r)) for r in range(1, collectors + 1)]
    reports = run([(_ingest_learner, (kind, port, collectors, chunk_steps, envs, seconds))] + senders)
    return next(r[1:] for r in reports if r[0] == "c")


# ---------------------------------------------------------------------------------------------------- main


def main() -> None:
    parser = arguments.parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repeats and shorter ingest runs")
    args = parser.parse_args()
    gpus = torch.cuda.device_count()
    gpu = torch.cuda.get_device_name(0) if gpus else "no GPU"
    print(f"rl_dqn transport benchmark: torch {torch.__version__}, {os.cpu_count()} CPU cores, {gpus} GPU(s): {gpu} "
          f"({time.strftime('%Y-%m-%d')})", flush=True)
    kinds = KINDS if gpus else ("cpu",)
    if not gpus:
        print("  (no GPU here: CUDA rows are not measured)", flush=True)

    device = "cuda:0" if gpus else "cpu"
    seconds = seeds_experiment(device)
    line = (f"(a) seeds' experiment, 2 x Linear(1000,1000) on {device}, 10 iterations: "
            f"CPU staging {seconds['cpu']:.3f} s")
    if "cuda" in seconds:
        line += f", CUDA RPC {seconds['cuda']:.3f} s, {seconds['cpu'] / seconds['cuda']:.1f}x"
    print(line, flush=True)

    repeats = 5 if args.quick else 20
    for n in (1, 2, 4):
        cells = {kind: broadcast_latency(kind, n, repeats) for kind in kinds}
        if n == 1:
            _, _, parameters, nbytes = cells["cpu"]
            print(f"(b) weight broadcast, configs/pong.yaml's Q-network ({parameters / 1e6:.2f}M parameters, "
                  f"{nbytes / 1e6:.2f} MB published), median of {repeats}, publish to usable on the collector's "
                  f"device:", flush=True)
        text = ", ".join(f"{kind} {ms * 1e3:7.2f} ms (lands on {where})" for kind, (ms, where, *_) in cells.items())
        ratio = f", {cells['cpu'][0] / cells['cuda'][0]:.1f}x" if len(cells) == 2 else ""
        print(f"    {n} collector(s): {text}{ratio}", flush=True)

    duration = 4.0 if args.quick else 10.0
    print(f"(c) chunk ingest into the learner's replay, 2 collectors, {duration:g} s each:", flush=True)
    for steps, envs in ((16, 8), (32, 8), (64, 16)):
        cells = {kind: ingest(kind, 2, steps, envs, duration) for kind in kinds}
        parts = [f"{kind} {mbs:8,.0f} MB/s {tps:10,.0f} transitions/s (chunks on {'/'.join(on)}, replay on {rd})"
                 for kind, (mbs, tps, on, rd, _) in cells.items()]
        ratio = f", {cells['cuda'][0] / cells['cpu'][0]:.1f}x" if len(cells) == 2 else ""
        chunk_mb = cells["cpu"][4] / 1e6   # the bytes of a received chunk's tensors, which the MB/s count
        print(f"    {steps} steps x {envs} envs ({chunk_mb:.2f} MB a chunk): " + "; ".join(parts) + ratio,
              flush=True)


if __name__ == "__main__":
    main()
