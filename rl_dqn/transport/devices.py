"""Where each role's tensors live, and the TensorPipe device maps that follow from it.

`place(cfg, rank, gpu_count)` is a pure function of the config, the process's rank and its node's GPU count, so
every rule is testable without a GPU and every mistake is refused before init_rpc: inside init_rpc a bad map
makes one process fail its check while the others wait for it, which surfaces as an unrelated store timeout.

Devices: the learner trains and keeps its replay on `learner.device`; each collector acts on `collectors.device`
(`auto`/`cuda` spread a node's collectors over its GPUs: collector j of the node on cuda:(j mod GPUs)).

Maps, with `transport.kind: cuda` (with `cpu` there are none and every tensor travels through host memory):
- collector -> learner: derived from the collector's device and `learner.device` (`auto`/`cuda` = cuda:0 of the
  learner's node), which every node knows; or given in `transport.device_map`;
- learner -> collector: derived for every collector when the whole run is on one node (`cluster.single_node`,
  as launch/local.sh runs it); on several nodes only from the learner's `transport.device_map`, since the learner
  cannot know the GPUs of other nodes;
- a pair without a map exchanges CPU tensors: a collector node without a GPU joins a CUDA run that way, and the
  learner sends such collectors a CPU copy of its weights. Replies travel on the inverse map.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from rl_dqn.config import Config, ConfigError

LEARNER_RANK = 0


def worker_name(rank: int) -> str:
    """RPC name of a rank: the learner is rank 0, collector i is rank i + 1."""
    return "learner" if rank == LEARNER_RANK else f"collector{rank - 1}"


def collector_rank(index: int) -> int:
    """The rank of collector `index` (0-based) in the run."""
    return LEARNER_RANK + 1 + index


def slot_of(name: str) -> int:
    """The collector slot of an RPC name: 3 for collector3."""
    return int(name.removeprefix("collector"))


class Placement(NamedTuple):
    device: torch.device
    """the learner's training and replay device, or a collector's acting device"""
    device_maps: dict[str, dict[int, int]]
    """peer name -> {local GPU: peer GPU}: CUDA tensors sent to that peer land on its GPU"""

    def sends_cuda_to(self, peer: str) -> bool:
        """Tensors on this role's device can go to `peer` as they are (else they go through host memory)."""
        return self.device.type == "cuda" and self.device.index in self.device_maps.get(peer, {})


def place(cfg: Config, rank: int, gpu_count: int) -> Placement:
    """This process's device and device maps; raises ConfigError naming the key at fault."""
    if rank == LEARNER_RANK:
        return _place_learner(cfg, gpu_count)
    return _place_collector(cfg, rank, gpu_count)


def _place_learner(cfg: Config, gpu_count: int) -> Placement:
    device = _device(cfg.learner.device, gpu_count, "learner.device", spread_index=0)
    if cfg.eval.every_env_steps:
        eval_device(cfg, gpu_count)   # refused here, before anything starts, rather than in the evaluator
    maps: dict[str, dict[int, int]] = {}
    if cfg.transport.kind == "cuda":
        if device.type != "cuda":
            if gpu_count == 0:
                raise ConfigError("transport.kind", "cuda needs a CUDA GPU on the learner's node and this node has "
                                                    "none (torch.cuda.is_available() is False); use transport.kind=cpu")
            raise ConfigError("learner.device", "must be a CUDA device when transport.kind is cuda, got cpu")
        explicit = _explicit_maps(cfg, LEARNER_RANK, gpu_count, device)
        for rank in range(1, cfg.world_size):
            if rank in explicit:
                maps[worker_name(rank)] = explicit[rank]
            elif cfg.cluster.single_node:
                collector = _device(cfg.collectors.device, gpu_count, "collectors.device", spread_index=rank - 1)
                if collector.type == "cuda":
                    maps[worker_name(rank)] = {device.index: collector.index}
    return Placement(device, maps)


def _place_collector(cfg: Config, rank: int, gpu_count: int) -> Placement:
    # cluster.rank is the rank of this node's first collector.
    device = _device(cfg.collectors.device, gpu_count, "collectors.device", spread_index=rank - cfg.cluster.rank)
    maps: dict[str, dict[int, int]] = {}
    if cfg.transport.kind == "cuda":
        if cfg.learner.device == "cpu":
            raise ConfigError("learner.device", "must be a CUDA device when transport.kind is cuda, got cpu")
        explicit = _explicit_maps(cfg, rank, gpu_count, device)
        if LEARNER_RANK in explicit:
            # Checked here, where it can be: inside init_rpc a map to a GPU the learner lacks fails in the joiner's
            # group update, which then waits out the store timeout and looks like a learner that never answered.
            landing = explicit[LEARNER_RANK].get(device.index) if device.type == "cuda" else None
            if landing is not None and landing != learner_gpu(cfg):
                raise ConfigError("transport.device_map", f"{worker_name(rank)} would send its chunks to the "
                                  f"learner's cuda:{landing}, but the learner trains on cuda:{learner_gpu(cfg)} "
                                  f"(learner.device={cfg.learner.device}); map {device} to {learner_gpu(cfg)}")
            maps[worker_name(LEARNER_RANK)] = explicit[LEARNER_RANK]
        elif device.type == "cuda":
            maps[worker_name(LEARNER_RANK)] = {device.index: learner_gpu(cfg)}
    return Placement(device, maps)


def eval_device(cfg: Config, gpu_count: int) -> torch.device:
    """Where the learner's evaluator acts: eval.device, `auto` being the learner's GPU where it trains on one."""
    if cfg.eval.device == "auto":
        learner = _device(cfg.learner.device, gpu_count, "learner.device", spread_index=0)
        return learner if learner.type == "cuda" else torch.device("cpu")
    return _device(cfg.eval.device, gpu_count, "eval.device", spread_index=0)


def learner_gpu(cfg: Config) -> int:
    """The learner's GPU index as every node can tell it from the config: cuda:N, or 0 for auto and cuda."""
    return int(cfg.learner.device.split(":")[1]) if ":" in cfg.learner.device else 0


def _device(setting: str, gpu_count: int, key: str, spread_index: int) -> torch.device:
    if setting == "cpu" or (setting == "auto" and gpu_count == 0):
        return torch.device("cpu")
    if setting in ("auto", "cuda"):
        if gpu_count == 0:
            raise ConfigError(key, "is cuda but this node has no CUDA GPU (torch.cuda.is_available() is False)")
        return torch.device("cuda", spread_index % gpu_count)
    index = int(setting.split(":")[1])
    if index >= gpu_count:
        have = {0: "no GPU", 1: "1 GPU (cuda:0)"}.get(gpu_count, f"{gpu_count} GPUs (cuda:0..cuda:{gpu_count - 1})")
        raise ConfigError(key, f"is {setting} but this node has {have}")
    return torch.device("cuda", index)


def _explicit_maps(cfg: Config, rank: int, gpu_count: int, device: torch.device) -> dict[int, dict[int, int]]:
    """transport.device_map as {peer rank: {local GPU: peer GPU}}, checked against this process and node."""
    key, maps = "transport.device_map", {}
    for entry in cfg.transport.device_map:
        if entry.peer >= cfg.world_size:
            raise ConfigError(key, f"names rank {entry.peer}, but the run has ranks 0..{cfg.world_size - 1} "
                                   f"(cluster.world_size={cfg.world_size})")
        if entry.peer == rank:
            raise ConfigError(key, f"maps {worker_name(rank)} (rank {rank}) to itself")
        if rank != LEARNER_RANK and entry.peer != LEARNER_RANK:
            raise ConfigError(key, f"{worker_name(rank)} talks only to the learner (rank 0), not to rank {entry.peer}")
        if entry.local_gpu >= gpu_count:
            raise ConfigError(key, f"sends from cuda:{entry.local_gpu}, but this node has {gpu_count} GPU"
                                   f"{'s' if gpu_count != 1 else ''}")
        maps.setdefault(entry.peer, {})[entry.local_gpu] = entry.peer_gpu
    for peer, gpus in maps.items():
        if device.type == "cuda" and device.index not in gpus:
            raise ConfigError(key, f"{worker_name(rank)} works on {device} but its map to {worker_name(peer)} has no "
                                   f"entry for GPU {device.index}")
    return maps
