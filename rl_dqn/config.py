"""Run configuration: frozen dataclasses loaded from YAML, dotted `key=value` overrides, checked before any
process starts, and written to the run folder.

Each field is documented where it is declared, with its unit. A bad key or value raises `ConfigError`, whose
message names the key and what is allowed; the command line turns it into one line and exit code 2.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import time
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple

import yaml

# The env section and the error of every check live in envs, below the agent, which imports nothing from rl_dqn.
from envs.config import ConfigError, EnvConfig, game_of, require


DEVICE_PATTERN = r"auto|cpu|cuda(:\d+)?"


class DeviceMapEntry(NamedTuple):
    """CUDA tensors this process sends from `cuda:<local_gpu>` land on `cuda:<peer_gpu>` of rank `peer`."""

    peer: int
    local_gpu: int
    peer_gpu: int


# What run.name takes: a folder name of letters, digits and ._+=- characters (no path, no spaces).
FOLDER_CHARACTERS = "A-Za-z0-9._+=-"
FOLDER_NAME = re.compile(f"[{FOLDER_CHARACTERS}]+")

# A 32-bit seed, as RL seeds go; ale-py takes each env's seed as a C int, and the envs' seeds derived from run.seed
# are brought into that range where they are handed over (envs/vector.py).
RUN_SEED_MAX = 2**31 - 1
INT_MAX = 2**63 - 1   # any integer key
MAX_RESTARTS = 1_000

# Durations reach torch.distributed as whole milliseconds: an RPC timeout of 0 ms means none at all, and the store's
# socket polls take a C int of milliseconds (at most 24.8 days). A week is far beyond any real wait.
DURATION_S_MIN, DURATION_S_MAX = 0.001, 7 * 24 * 3600

# Network sizes far beyond any real use, refused before a role allocates them: a hidden layer's weights grow with the
# product of two widths, and the quantile loss compares every pair of a sample's quantiles (batch_size x N^2 values
# in each of its intermediate tensors; QR-DQN used 200).
MLP_WIDTH_MAX, MLP_LAYERS_MAX, MLP_WEIGHTS_MAX = 16_384, 16, 16_384**2
QUANTILES_MAX = 1_000

# TensorPipe starts this many threads in each process, beside its own; tens of thousands exhaust a node's thread limit.
WORKER_THREADS_MAX = 1_024


def require_duration(key: str, seconds: float) -> None:
    require(DURATION_S_MIN <= seconds <= DURATION_S_MAX, key,
            f"must be from {DURATION_S_MIN:g} to {DURATION_S_MAX:,} seconds (a week), got {seconds:g}")


@dataclass(frozen=True)
class RunConfig:
    name: str = ""
    """output folder `runs/<name>/`; empty derives `<game>__<config file>__s<seed>__<date-time>`"""
    seed: int = 1
    """seed of networks, envs and exploration, from 0 to 2^31 - 1 (each collector and env offsets it by its
    index)"""
    resume: bool = False
    """continue the run in `runs/<name>/` from its newest checkpoint: networks, optimizer, counters, schedules and
    (with learner.checkpoint_replay) the replay contents; its TensorBoard curves go on from the checkpoint's step"""

    def __post_init__(self):
        require(self.name == "" or FOLDER_NAME.fullmatch(self.name) is not None and
                 self.name not in (".", ".."), "run.name",
                 f"must be a folder name of letters, digits and ._+=- characters, got {self.name!r}")
        require(0 <= self.seed <= RUN_SEED_MAX, "run.seed", f"must be from 0 to {RUN_SEED_MAX:,}, got {self.seed}")


@dataclass(frozen=True)
class NetworkConfig:
    torso: Literal["nature", "nips"] = "nature"
    """the CNN for image observations: `nature` (Mnih et al. 2015: conv 32 8x8 stride 4, conv 64 4x4/2, conv 64
    3x3/1, fully connected 512) or `nips` (Mnih et al. 2013: conv 16 8x8/4, conv 32 4x4/2, fully connected 256;
    about a third of the multiply-adds per sample)"""
    mlp_hidden: tuple[int, ...] = (256, 256)
    """hidden layer widths of the Q-network for vector observations (image observations use network.torso): 1 to 16
    layers of 1 to 16,384 units, with at most 16,384^2 weights between consecutive layers in all"""
    dueling: bool = False
    """a dueling head (state value + advantages, each with its own hidden layer) instead of a plain Q head"""
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    """`bf16`: the torso and hidden layers compute in bfloat16 under autocast (parameters, optimizer and the
    output layers stay float32); `fp32`: everything in float32; `auto`: each process picks bf16 where its device
    computes it fast (CUDA GPUs of compute capability 8.0 or newer, CPUs with AVX512-BF16 or AMX), else fp32"""
    frame_offset: Literal["none", "half", "background"] = "none"
    """what is taken off uint8 frames after scaling them to [0, 1] on their way into the network: `none`; `half`, 0.5
    (frames in [-0.5, 0.5]); `background`, each observation's background, the most common pixel value of its newest
    frame (counted on every 4th pixel each way), so that the background enters as 0 in any game. Most of an Atari
    screen is one flat background (Pong's grey, Breakout's black), and a background far from 0 gives every
    first-layer filter a large input of one sign everywhere: a filter pushed below zero there is below zero on every
    screen, and a ReLU passes it no gradient, so it stays dead (what each setting did on Pong and Breakout:
    docs/tried.md). A checkpoint's network is read back with its own run's setting"""
    norm: Literal["none", "layer"] = "none"
    """`layer`: each hidden fully connected layer's outputs (the head's hidden layer after a CNN torso, every layer of
    network.mlp_hidden) are normalized by LayerNorm, with a learned gain and bias, before their ReLU, as PQN's
    networks are (Gallici et al. 2024, https://arxiv.org/abs/2407.04811), to keep TD learning's values from
    running away; `none`: plain layers. The convolutions are never normalized. A checkpoint's network is read back
    with its own run's setting"""

    quantiles: int = 0
    """0: the head gives each action's Q-value, trained on the Huber loss of its TD error; N from 2 to 1,000: it
    gives N quantiles of each action's return, at the fractions (2i + 1) / 2N, trained on the quantile Huber loss
    against the N quantiles of the target's bootstrap (QR-DQN, Dabney et al. 2017, https://arxiv.org/abs/1710.10044;
    the distributional part of Rainbow, as quantiles rather than C51's fixed atoms). Acting takes the mean of an
    action's quantiles as its Q-value; prioritized replay takes each sample's quantile loss as its priority, which
    grows with the square of an error below 1 where a TD error's grows with the error. The output layer grows
    N-fold, the rest of the network not at all. A checkpoint's network is read back with its own run's setting"""

    def __post_init__(self):
        widths = self.mlp_hidden
        got = list(widths) if len(widths) <= MLP_LAYERS_MAX else f"{len(widths):,} widths"
        require(1 <= len(widths) <= MLP_LAYERS_MAX and all(1 <= h <= MLP_WIDTH_MAX for h in widths),
                 "network.mlp_hidden", f"must be a list of 1 to {MLP_LAYERS_MAX} widths of 1 to {MLP_WIDTH_MAX:,}, "
                                       f"got {got}")
        weights = sum(a * b for a, b in zip(widths, widths[1:]))
        require(weights <= MLP_WEIGHTS_MAX, "network.mlp_hidden",
                 f"must have at most {MLP_WEIGHTS_MAX:,} weights between consecutive hidden layers (two layers of "
                 f"{MLP_WIDTH_MAX:,}), got {weights:,} for {got}")
        require(self.quantiles == 0 or 2 <= self.quantiles <= QUANTILES_MAX, "network.quantiles",
                 f"must be 0 (Q-values) or a number of quantiles from 2 to {QUANTILES_MAX:,}, got {self.quantiles}")


@dataclass(frozen=True)
class CollectorsConfig:
    count: int = 2
    """collector processes on each node that runs collectors"""
    chunk_steps: int = 32
    """vector steps per chunk sent to the learner; a chunk holds chunk_steps x env.envs_per_collector transitions"""
    max_chunks_in_flight: int = 2
    """chunks sent but not yet acknowledged by the learner before a collector waits (this is how it is throttled)"""
    exploration: Literal["apex", "linear", "linear_apex"] = "apex"
    """`apex`: env i of N in the run acts with eps_i = apex_epsilon^(1 + apex_alpha * i / (N - 1));
    `linear`: every env decays eps from epsilon_start to epsilon_end over epsilon_decay_env_steps of the run;
    `linear_apex`: env i decays from epsilon_start to its Ape-X eps_i over epsilon_decay_env_steps, then holds it"""
    apex_epsilon: float = 0.4
    """base epsilon of the Ape-X schedule"""
    apex_alpha: float = 7.0
    """exponent range of the Ape-X schedule"""
    apex_floor: float = 0.0
    """apex and linear_apex schedules: no env's Ape-X epsilon below this (0 keeps Ape-X's spread as it is; Dopamine's
    agents train at 0.01)"""
    epsilon_start: float = 1.0
    """linear and linear_apex schedules: epsilon at env step 0 of the run"""
    epsilon_end: float = 0.01
    """linear schedule: epsilon from epsilon_decay_env_steps on"""
    epsilon_decay_env_steps: int = 1_000_000
    """linear and linear_apex schedules: env steps of the whole run (all collectors) over which epsilon decays"""
    torch_threads: int = 1
    """torch intra-op threads of each collector process (acting is a small batched forward pass)"""
    device: str = "auto"
    """where each collector acts: `auto` (a node's collectors spread over its GPUs, cuda:0 when it has one, else the
    CPU), `cpu`, `cuda` (the same spread) or `cuda:N`"""
    max_restarts: int = 10
    """times a node's launcher starts a new process for a collector that died, at most 1,000; the new one joins the
    running learner in the same slot. 0 = a dead collector stops the node"""

    def __post_init__(self):
        require(0 <= self.max_restarts <= MAX_RESTARTS, "collectors.max_restarts",
                 f"must be from 0 to {MAX_RESTARTS:,}, got {self.max_restarts}")
        require(self.count >= 1, "collectors.count", f"must be >= 1, got {self.count}")
        require(re.fullmatch(DEVICE_PATTERN, self.device) is not None, "collectors.device",
                 f"must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        require(self.chunk_steps >= 1, "collectors.chunk_steps", f"must be >= 1, got {self.chunk_steps}")
        require(self.max_chunks_in_flight >= 1, "collectors.max_chunks_in_flight",
                 f"must be >= 1, got {self.max_chunks_in_flight}")
        require(0.0 < self.apex_epsilon <= 1.0, "collectors.apex_epsilon",
                 f"must be in (0, 1], got {self.apex_epsilon}")
        require(self.apex_alpha >= 0.0, "collectors.apex_alpha", f"must be >= 0, got {self.apex_alpha}")
        for key in ("apex_floor", "epsilon_start", "epsilon_end"):
            value = getattr(self, key)
            require(0.0 <= value <= 1.0, f"collectors.{key}", f"must be in [0, 1], got {value}")
        require(self.epsilon_decay_env_steps >= 1, "collectors.epsilon_decay_env_steps",
                 f"must be >= 1, got {self.epsilon_decay_env_steps}")
        require(self.torch_threads >= 1, "collectors.torch_threads", f"must be >= 1, got {self.torch_threads}")


@dataclass(frozen=True)
class TrainConfig:
    total_env_steps: int = 10_000_000
    """the run ends when all collectors together have taken this many env steps (agent steps, not frames; each env
    counts every step, also the one per episode on which it resets and ignores the action)"""
    learning_starts: int = 80_000
    """env steps collected before the first gradient update"""
    replay_capacity: int = 1_000_000
    """transitions the replay memory holds (each stores one frame)"""
    batch_size: int = 32
    """transitions per gradient update"""
    replay_ratio: float = 8.0
    """gradient samples per env step after learning_starts (8 = a batch of 32 every 4 env steps); 0 = no training"""
    gamma: float = 0.99
    """discount per env step"""
    lr: float = 1e-4
    """Adam learning rate (until lr_decay_start_env_steps when lr_end is set)"""
    lr_end: float | None = None
    """learning rate reached at lr_decay_end_env_steps and held from there, decayed linearly from train.lr from
    lr_decay_start_env_steps on; null = train.lr throughout"""
    lr_decay_start_env_steps: int = 0
    """env steps at which the learning rate leaves train.lr for lr_end (with lr_end set)"""
    lr_decay_end_env_steps: int = 0
    """env steps at which the learning rate reaches lr_end (with lr_end set; 0 = train.total_env_steps)"""
    adam_eps: float = 1e-8
    """Adam epsilon"""
    max_grad_norm: float = 10.0
    """gradients are clipped to this global L2 norm"""
    target_update_updates: int = 250
    """updates between copies of the online network into the target network"""
    double: bool = True
    """Double DQN's target, the target network's value of the online network's greedy action in s'; false:
    Nature DQN's, the target network's greedy value, which skips the online network's pass over s'"""
    munchausen_alpha: float = 0.0
    """Munchausen DQN's target (Vieillard et al. 2020) when above 0: the reward gains munchausen_alpha times the
    target network's tau * log softmax(Q(s) / tau) of the taken action, clipped to [munchausen_clip, 0], and s' is
    valued by its soft value under that policy in place of a max (so train.double must be false); 0 = off"""
    munchausen_tau: float = 0.03
    """Munchausen DQN: the temperature of the target network's softmax policy, in units of Q (clipped rewards)"""
    munchausen_clip: float = -1.0
    """Munchausen DQN: the lowest the scaled log-policy bonus goes (below 0), so that an action the policy all but
    never takes does not drive its target to minus infinity"""
    n_step: int = 3
    """steps of reward summed before bootstrapping (1 = one-step DQN); shorter where an episode ends first (until
    n_step_decay_start_env_steps when n_step_end is set)"""
    n_step_end: int | None = None
    """steps of reward summed from n_step_decay_end_env_steps on, shortened from train.n_step linearly (rounded to
    whole steps) from n_step_decay_start_env_steps on; from 1 to train.n_step; null = train.n_step throughout"""
    n_step_decay_start_env_steps: int = 0
    """env steps at which the returns start to shorten from train.n_step towards n_step_end (with n_step_end set)"""
    n_step_decay_end_env_steps: int = 0
    """env steps at which the returns reach n_step_end (with n_step_end set; 0 = train.total_env_steps)"""
    prioritized: bool = False
    """proportional prioritized replay; false draws uniformly"""
    priority_alpha: float = 0.6
    """prioritized replay: a transition is drawn in proportion to (|TD error| + priority_eps)^priority_alpha"""
    priority_beta: float = 0.4
    """prioritized replay: importance-sampling exponent when learning starts, annealed linearly to 1 at
    priority_beta_env_steps"""
    priority_beta_env_steps: int = 0
    """prioritized replay: env steps at which the importance-sampling exponent reaches 1 (0 = train.total_env_steps,
    the end of the run), so that a run's length need not set how fast it anneals"""
    priority_eps: float = 1e-6
    """prioritized replay: added to |TD error| so that no transition becomes undrawable"""
    initial_priority: Literal["max", "collectors"] = "max"
    """prioritized replay: new transitions enter with the largest priority so far (`max`), or with the n-step TD
    error the collector computed from its own Q-values (`collectors`, as in Ape-X)"""

    def __post_init__(self):
        require(self.total_env_steps >= 1, "train.total_env_steps", f"must be >= 1, got {self.total_env_steps}")
        require(self.batch_size >= 1, "train.batch_size", f"must be >= 1, got {self.batch_size}")
        require(self.learning_starts >= self.batch_size, "train.learning_starts",
                 f"must be >= train.batch_size ({self.batch_size}), got {self.learning_starts}")
        require(self.replay_capacity >= self.learning_starts, "train.replay_capacity",
                 f"must be >= train.learning_starts ({self.learning_starts}), got {self.replay_capacity}")
        require(self.replay_ratio >= 0.0, "train.replay_ratio", f"must be >= 0, got {self.replay_ratio}")
        require(0.0 <= self.gamma <= 1.0, "train.gamma", f"must be in [0, 1], got {self.gamma}")
        require(self.lr > 0.0, "train.lr", f"must be > 0, got {self.lr}")
        require(self.lr_end is None or self.lr_end > 0.0, "train.lr_end",
                 f"must be > 0 or null (train.lr throughout), got {self.lr_end}")
        self._require_decay_span("lr")
        require(self.adam_eps > 0.0, "train.adam_eps", f"must be > 0, got {self.adam_eps}")
        require(self.max_grad_norm > 0.0, "train.max_grad_norm", f"must be > 0, got {self.max_grad_norm}")
        require(self.target_update_updates >= 1, "train.target_update_updates",
                 f"must be >= 1, got {self.target_update_updates}")
        require(0.0 <= self.munchausen_alpha <= 1.0, "train.munchausen_alpha",
                 f"must be in [0, 1] (0 = off), got {self.munchausen_alpha}")
        require(not (self.munchausen_alpha and self.double), "train.double",
                 "must be false with train.munchausen_alpha > 0: Munchausen's target values s' by its soft value, "
                 "not by Double DQN's choice of action")
        require(self.munchausen_tau > 0.0, "train.munchausen_tau", f"must be > 0, got {self.munchausen_tau}")
        require(self.munchausen_clip < 0.0, "train.munchausen_clip", f"must be < 0, got {self.munchausen_clip}")
        require(self.n_step >= 1, "train.n_step", f"must be >= 1, got {self.n_step}")
        require(self.n_step_end is None or 1 <= self.n_step_end <= self.n_step, "train.n_step_end",
                 f"must be from 1 to train.n_step ({self.n_step}) or null (train.n_step throughout), "
                 f"got {self.n_step_end}")
        self._require_decay_span("n_step")
        require(self.priority_alpha >= 0.0, "train.priority_alpha", f"must be >= 0, got {self.priority_alpha}")
        require(0.0 <= self.priority_beta <= 1.0, "train.priority_beta",
                 f"must be in [0, 1], got {self.priority_beta}")
        require(self.priority_beta_env_steps == 0 or self.priority_beta_env_steps > self.learning_starts,
                 "train.priority_beta_env_steps", f"must be 0 (train.total_env_steps) or > train.learning_starts "
                 f"({self.learning_starts}), got {self.priority_beta_env_steps}")
        require(self.priority_eps > 0.0, "train.priority_eps", f"must be > 0, got {self.priority_eps}")

    def _require_decay_span(self, name: str) -> None:
        """train.<name>_decay_start_env_steps >= 0, and train.<name>_decay_end_env_steps 0 or after it. With 0 (the
        run's end) a run that ends before the decay's start is allowed, and never decays: a short run of a config
        made for a long one."""
        start_key, end_key = f"{name}_decay_start_env_steps", f"{name}_decay_end_env_steps"
        start, end = getattr(self, start_key), getattr(self, end_key)
        require(start >= 0, f"train.{start_key}", f"must be >= 0, got {start}")
        require(end == 0 or end > start, f"train.{end_key}",
                 f"must be 0 (train.total_env_steps) or > train.{start_key} ({start}), got {end}")


@dataclass(frozen=True)
class LearnerConfig:
    device: str = "auto"
    """where the learner trains: `auto` (cuda when present, else cpu), `cpu`, `cuda` or `cuda:N`"""
    torch_threads: int = 0
    """torch intra-op threads of each of the learner's compute threads (the training thread, and with
    learner.overlap the one preparing batches); 0 = the CPU cores shared out among them"""
    overlap: bool = True
    """a second thread computes the online network's values of each batch's next observations while the training
    thread computes those of its observations, then draws the next batch and evaluates the target network on it
    during the backward pass and the optimizer step: each thread runs whole operations on its own cores rather than
    every operation being split over all of them (its figures: docs/benchmarks.md). The same updates as without
    it, except that chunks arriving during an update enter replay after the next batch was drawn"""
    cuda_graph: bool = True
    """on a GPU, capture the whole update (sampling, both networks, the loss, new priorities, backward, Adam) as one
    CUDA graph and replay it, instead of launching its kernels one by one from Python; the same math. Ignored on
    the CPU, and learner.overlap with it"""
    publish_every_updates: int = 100
    """updates between weight broadcasts to the collectors"""
    checkpoint_every_updates: int = 50_000
    """updates between checkpoints (one is also written when the run ends)"""
    checkpoint_replay: bool = True
    """checkpoints also hold the replay contents (the newest checkpoint's only; an Atari transition is stored as its
    one 84x84 frame, 7,056 bytes), so a resumed run has the data it had"""
    keep_checkpoints: int = 3
    """newest checkpoints kept in runs/<name>/checkpoints/"""

    def __post_init__(self):
        require(re.fullmatch(DEVICE_PATTERN, self.device) is not None, "learner.device",
                 f"must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        require(self.torch_threads >= 0, "learner.torch_threads", f"must be >= 0, got {self.torch_threads}")
        require(self.publish_every_updates >= 1, "learner.publish_every_updates",
                 f"must be >= 1, got {self.publish_every_updates}")
        require(self.checkpoint_every_updates >= 1, "learner.checkpoint_every_updates",
                 f"must be >= 1, got {self.checkpoint_every_updates}")
        require(self.keep_checkpoints >= 1, "learner.keep_checkpoints", f"must be >= 1, got {self.keep_checkpoints}")


TENSORPIPE_TRANSPORTS = ("uv", "shm", "ibv")
TENSORPIPE_CPU_CHANNELS = ("cma", "mpt_uv", "basic")
TENSORPIPE_CUDA_CHANNELS = ("cuda_xth", "cuda_ipc", "cuda_gdr", "cuda_basic")


@dataclass(frozen=True)
class TransportConfig:
    kind: Literal["cpu", "cuda"] = "cpu"
    """how tensors travel: `cpu` stages them in host memory; `cuda` sends them GPU to GPU over TensorPipe device
    maps (chunks from a collector's GPU to the learner's, weights back); peers without a GPU fall back to CPU"""
    device_map: tuple[DeviceMapEntry, ...] = ()
    """this process's explicit device maps for multi-node runs, as `{peer: {local_gpu: peer_gpu}}` (peer a rank or
    a name such as `learner` or `collector3`) or DI-engine's `<peer rank>_<local gpu>_<peer gpu>,...`; the maps
    not given are derived (see docs/cluster.md, Transport)"""
    tensorpipe_transports: tuple[str, ...] = ("uv",)
    """TensorPipe transports, in order of preference: uv (TCP; idle when there is nothing to send), shm
    (same-host shared memory; busy-polls a core per process), ibv (InfiniBand)"""
    tensorpipe_channels: tuple[str, ...] = ("cma", "mpt_uv", "basic", "cuda_xth", "cuda_ipc", "cuda_basic")
    """TensorPipe channels that move tensors, in order of preference (per tensor, the first that both ends can use):
    for host memory cma (between processes of one host), mpt_uv (TCP over several connections), basic (over the
    transport); for GPU memory cuda_xth (within a process), cuda_ipc (between processes of one host), cuda_gdr
    (GPUDirect RDMA over InfiniBand), cuda_basic (staged through host memory). The default leaves out cuda_gdr,
    whose setup fails inside init_rpc on some hosts with RDMA NICs (pytorch/pytorch#130513); name it where
    GPUDirect RDMA works. CUDA channels are used only by a CUDA build of torch"""
    rpc_timeout_s: float = 20.0
    """seconds a call (a weights broadcast, a ping, a stop) may take before its peer is taken for lost: a hung peer
    is found within 5 s + this; from 0.001 to 604,800 (a week)"""
    worker_threads: int = 8
    """threads serving incoming RPCs in each process, 2 to 1,024"""

    def __post_init__(self):
        transports = self.tensorpipe_transports
        require(len(transports) >= 1 and set(transports) <= set(TENSORPIPE_TRANSPORTS),
                 "transport.tensorpipe_transports",
                 f"must be a non-empty list of {', '.join(TENSORPIPE_TRANSPORTS)}, got {list(transports)}")
        channels = self.tensorpipe_channels
        known = TENSORPIPE_CPU_CHANNELS + TENSORPIPE_CUDA_CHANNELS
        require(set(channels) <= set(known) and set(channels) & set(TENSORPIPE_CPU_CHANNELS),
                 "transport.tensorpipe_channels",
                 f"must list channels of {', '.join(known)}, at least one of {', '.join(TENSORPIPE_CPU_CHANNELS)}, "
                 f"got {list(channels)}")
        require(self.kind != "cuda" or set(channels) & set(TENSORPIPE_CUDA_CHANNELS),
                 "transport.tensorpipe_channels", f"must list a CUDA channel ({', '.join(TENSORPIPE_CUDA_CHANNELS)}) "
                                                  f"when transport.kind is cuda, got {list(channels)}")
        require_duration("transport.rpc_timeout_s", self.rpc_timeout_s)
        require(2 <= self.worker_threads <= WORKER_THREADS_MAX, "transport.worker_threads",
                 f"must be from 2 to {WORKER_THREADS_MAX:,}, got {self.worker_threads}")


@dataclass(frozen=True)
class ClusterConfig:
    init_method: str = ""
    """rendezvous: `tcp://HOST:PORT` (the learner's node) or `env://` (MASTER_ADDR, MASTER_PORT);
    launch/local.sh picks a free port on 127.0.0.1 when this is empty"""
    world_size: int = 0
    """processes in the run: 1 learner + every collector of every node; 0 = this node only (1 + collectors.count)"""
    rank: int = 0
    """rank of the first process this node starts: 0 on the learner's node, its first collector's rank elsewhere
    (a collector node's processes take ranks rank .. rank + collectors.count - 1)"""
    interface: str = ""
    """the network interface every process of this node listens on, and nothing else: the learner's rendezvous
    store and each process's TensorPipe (e.g. `eth0`); launch/local.sh uses `lo`; a multi-node run must name it"""
    single_node: bool = False
    """every process of the run is on this node (launch/local.sh sets it), so device maps are derived for every
    pair that talks"""
    join_timeout_s: float = 300.0
    """seconds a process waits for the whole run to join before it gives up; from 0.001 to 604,800 (a week)"""

    def __post_init__(self):
        tcp = re.fullmatch(r"tcp://[^:/\s]+:(\d{1,5})", self.init_method)
        require(self.init_method in ("", "env://") or tcp is not None and 1 <= int(tcp.group(1)) <= 65535,
                 "cluster.init_method", f"must be tcp://HOST:PORT (port 1-65535) or env://, got {self.init_method!r}")
        require(self.world_size >= 0, "cluster.world_size", f"must be >= 0, got {self.world_size}")
        require(self.rank >= 0, "cluster.rank", f"must be >= 0, got {self.rank}")
        require_duration("cluster.join_timeout_s", self.join_timeout_s)


@dataclass(frozen=True)
class EvalConfig:
    every_env_steps: int = 0
    """env steps of the run between evaluations (episodes at eval.epsilon in a process of the learner's node that
    feeds no replay), each due at a multiple of this, and one at train.total_env_steps, scored before the run ends;
    0 = none"""
    episodes: int = 10
    """episodes per evaluation: the first this many started (see eval.envs)"""
    screen_episodes: int = 0
    """a round first plays this many episodes and plays on to eval.episodes only where their mean reached
    eval.screen_score; a round that stops there scores the mean of these few. Rounds far below the score that
    matters then cost a fraction of a whole one, and a score at or above eval.screen_score is always the mean of
    eval.episodes. 0 = every round plays eval.episodes"""
    screen_score: float = 0.0
    """the mean raw score of a round's first eval.screen_episodes episodes at which it plays on to eval.episodes"""
    envs: int = 8
    """envs the evaluation plays side by side, each one episode after another until eval.episodes have started
    (with one env per episode, every env steps on until the longest episode ends); a screened round's two phases
    each play on at most as many envs as they have episodes"""
    epsilon: float = 0.01
    """epsilon of the evaluation episodes (0.001 - 0.05 is usual for Atari)"""
    max_episode_frames: int = 0
    """evaluation episodes are cut after this many emulator frames and score what they scored so far (18,000 = the
    5 minutes of play of Nature DQN's evaluation; Atari); 0 = env.max_episode_frames"""
    sticky_action_prob: float | None = None
    """probability that the emulator repeats the previous action on each frame of an evaluation episode (Atari),
    e.g. 0 to evaluate on the NoFrameskip-v4 protocol an agent trained with sticky actions; null =
    env.sticky_action_prob"""
    torch_threads: int = 1
    """torch intra-op threads of the evaluation process"""
    device: str = "cpu"
    """where the evaluation process computes its actions: `cpu`, `auto` (the learner's GPU when it trains on one,
    else cpu), `cuda` or `cuda:N`"""
    threads: int = 0
    """threads stepping each of the evaluation's Atari vectors (ale-py's AtariVectorEnv); 0 =
    env.threads_per_collector"""
    ema_updates: int = 0
    """the evaluator plays an exponential moving average of the online network's weights over about this many
    updates (each update moves it 1/ema_updates of the way to the new weights) instead of the weights as they are,
    and checkpoints/best.pt keeps the average that scored: weight averaging smooths out the update-to-update noise
    that makes a DQN's score swing and forget a good policy (Nikishin et al. 2018,
    https://openreview.net/forum?id=h_pqG28iST0). Collectors act with the online weights either way; 0 = none"""
    stop_score: float | None = None
    """the run ends (final checkpoint and summary, as at train.total_env_steps) after the first evaluation round whose
    mean score reaches this, e.g. 475 for CartPole-v1 or 18 for Pong; null, or no evaluations (eval.every_env_steps 0)
    = it runs to train.total_env_steps"""
    video: bool = False
    """each evaluation also records its first episode's game screen to TensorBoard (`eval/video`, an animated GIF
    in the Images tab; Atari only)"""
    video_max_steps: int = 2_000
    """agent steps recorded at most per video (2,000 steps = 2 min 13 s of play at frame skip 4)"""

    def __post_init__(self):
        require(self.video_max_steps >= 1, "eval.video_max_steps", f"must be >= 1, got {self.video_max_steps}")
        require(self.sticky_action_prob is None or 0.0 <= self.sticky_action_prob < 1.0, "eval.sticky_action_prob",
                 f"must be in [0, 1) or null (env.sticky_action_prob), got {self.sticky_action_prob}")
        require(self.every_env_steps >= 0, "eval.every_env_steps", f"must be >= 0, got {self.every_env_steps}")
        require(self.episodes >= 1, "eval.episodes", f"must be >= 1, got {self.episodes}")
        require(self.envs >= 1, "eval.envs", f"must be >= 1, got {self.envs}")
        require(self.screen_episodes == 0 or 0 < self.screen_episodes < self.episodes, "eval.screen_episodes",
                 f"must be 0 (off) or 1 to eval.episodes - 1 ({self.episodes - 1}), got {self.screen_episodes}")
        require(self.max_episode_frames >= 0, "eval.max_episode_frames",
                 f"must be >= 0, got {self.max_episode_frames}")
        require(0.0 <= self.epsilon <= 1.0, "eval.epsilon", f"must be in [0, 1], got {self.epsilon}")
        require(self.torch_threads >= 1, "eval.torch_threads", f"must be >= 1, got {self.torch_threads}")
        require(re.fullmatch(DEVICE_PATTERN, self.device) is not None, "eval.device",
                 f"must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        require(self.threads >= 0, "eval.threads", f"must be >= 0 (0 = env.threads_per_collector), got {self.threads}")
        require(self.ema_updates >= 0, "eval.ema_updates", f"must be >= 0 (0 = none), got {self.ema_updates}")


@dataclass(frozen=True)
class MetricsConfig:
    interval_s: float = 10.0
    """seconds between console lines, rate scalars and system figures in TensorBoard; from 0.001 to 604,800 (a
    week)"""
    histogram_every_updates: int = 10_000
    """updates between histograms of a batch's Q-values and TD errors in TensorBoard; 0 = none"""
    return_epsilon: float | None = 0.01
    """the training episodes played at this epsilon (within 1% of it) are also scored on their own: as
    collector/episode_return_at_epsilon in TensorBoard, and in summary.json's returns_at_epsilon their mean over the
    last metrics.return_epsilon_env_steps. Dopamine's baselines report the returns of training episodes played at
    0.01, so with collectors.apex_floor 0.01 (or a linear decay to 0.01) that mean reads like their figures: whole
    episodes at their epsilon, where an evaluation plays its own cut and epsilon. null: not kept apart"""
    return_epsilon_env_steps: int = 250_000
    """the env steps over which summary.json averages those episodes (250k: one iteration of Dopamine's curves)"""

    def __post_init__(self):
        require_duration("metrics.interval_s", self.interval_s)
        require(self.histogram_every_updates >= 0, "metrics.histogram_every_updates",
                 f"must be >= 0, got {self.histogram_every_updates}")
        require(self.return_epsilon is None or 0.0 <= self.return_epsilon <= 1.0, "metrics.return_epsilon",
                 f"must be null or in [0, 1], got {self.return_epsilon}")
        require(self.return_epsilon_env_steps >= 1, "metrics.return_epsilon_env_steps",
                 f"must be >= 1, got {self.return_epsilon_env_steps}")


@dataclass(frozen=True)
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    collectors: CollectorsConfig = field(default_factory=CollectorsConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    transport: TransportConfig = field(default_factory=TransportConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)

    def __post_init__(self):
        world_size = self.world_size
        require(world_size >= 2, "cluster.world_size", f"must be >= 2 (a learner and a collector), got {world_size}")
        require(self.cluster.rank < world_size, "cluster.rank",
                 f"must be < cluster.world_size ({world_size}), got {self.cluster.rank}")
        if self.cluster.rank > 0:
            last = self.cluster.rank + self.collectors.count - 1
            require(last < world_size, "cluster.rank",
                     f"this node's collectors take ranks {self.cluster.rank}..{last}, beyond cluster.world_size "
                     f"{world_size}; lower collectors.count or raise cluster.world_size")
        require(self.eval.max_episode_frames == 0 or self.eval.max_episode_frames >= self.env.frame_skip,
                 "eval.max_episode_frames", f"must be 0 or >= env.frame_skip ({self.env.frame_skip}), got "
                                            f"{self.eval.max_episode_frames}")
        require(not (self.network.quantiles and self.train.prioritized and self.train.initial_priority == "collectors"),
                 "train.initial_priority", "must be max with network.quantiles: the collectors' priorities are TD "
                                           "errors of Q-values, the learner's each sample's quantile loss")
        lane_steps = self.train.replay_capacity // self.num_envs
        need = 2 * self.collectors.chunk_steps + self.env.frame_stack + self.train.n_step + 1
        require(lane_steps >= need, "train.replay_capacity",
                 f"must hold at least {need} steps for each of the run's {self.num_envs} envs "
                 f"(>= {need * self.num_envs}), got {self.train.replay_capacity}")

    @property
    def eval_phases(self) -> tuple[tuple[int, int], ...]:
        """(episodes, envs) of each phase of an evaluation round: eval.episodes, or with eval.screen_episodes that
        many and then the rest. Each phase plays on eval.envs envs, or as many as its episodes where that is fewer,
        so that no env plays an episode that cannot count."""
        e = self.eval
        counts = (e.screen_episodes, e.episodes - e.screen_episodes) if e.screen_episodes else (e.episodes,)
        return tuple((n, min(e.envs, n)) for n in counts)

    @property
    def eval_env(self) -> EnvConfig:
        """The env of evaluation episodes: training's, cut at eval.max_episode_frames, with eval.sticky_action_prob and
        stepped by eval.threads threads where those are set."""
        changes = {"max_episode_frames": self.eval.max_episode_frames or None,
                   "sticky_action_prob": self.eval.sticky_action_prob,
                   "threads_per_collector": self.eval.threads or None}
        return dataclasses.replace(self.env, **{key: value for key, value in changes.items() if value is not None})

    @property
    def world_size(self) -> int:
        """Processes in the run: the configured size, or this node's learner and collectors."""
        return self.cluster.world_size or 1 + self.collectors.count

    @property
    def num_collectors(self) -> int:
        return self.world_size - 1

    @property
    def num_envs(self) -> int:
        """Environments in the whole run, over all collectors of all nodes."""
        return self.num_collectors * self.env.envs_per_collector


SECTIONS: dict[str, type] = typing.get_type_hints(Config)


# ---------------------------------------------------------------------------------------------- loading


def load_config(path: str | Path, overrides: list[str] = ()) -> Config:
    """Reads a YAML config, applies `key=value` overrides and checks everything; raises ConfigError."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError("config", f"{path} is a folder, not a YAML config file" if path.is_dir() else
                                    f"no such file: {path}")
    try:
        raw, twice = _read_yaml(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError, ValueError) as e:   # ValueError: a date or number YAML cannot make
        raise ConfigError("config", f"{path} is not valid UTF-8 YAML: {str(e).splitlines()[0]}") from None
    if twice is not None:
        key, first, again = twice
        raise ConfigError(key, f"is given twice in {path} (lines {first} and {again}); give it once")
    raw = raw or {}
    if not isinstance(raw, dict):
        raise ConfigError("config", f"{path} must hold a mapping of sections ({', '.join(SECTIONS)})")
    for item in overrides:
        _apply_override(raw, item)
    cfg = from_dict(raw)
    if cfg.run.name == "":
        cfg = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, name=default_run_name(cfg, path.stem)))
    return cfg


def _read_yaml(text: str) -> tuple[Any, tuple[str, int, int] | None]:
    """The YAML document, or None for an empty one, and the first key given twice in one of its mappings (dotted,
    and its two lines), which PyYAML would otherwise read as the last value alone."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, None
        twice = _key_given_twice(loader, node, "", set())
        return (None if twice else loader.construct_document(node)), twice
    finally:
        loader.dispose()


def _key_given_twice(loader: yaml.SafeLoader, node: yaml.Node, path: str, seen: set[int]
                     ) -> tuple[str, int, int] | None:
    if id(node) in seen:   # an alias repeats a node (a recursive one would never end)
        return None
    seen.add(id(node))
    if isinstance(node, yaml.SequenceNode):
        return next(filter(None, (_key_given_twice(loader, item, path, seen) for item in node.value)), None)
    if not isinstance(node, yaml.MappingNode):
        return None
    lines: dict[Any, int] = {}
    for key_node, value_node in node.value:
        # Keys compare as constructed, as the dict built from them would (`1` and `0x1` are one key); a merge key
        # (`<<`) and a key that is itself a list or mapping are left to the constructor.
        if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
            key = loader.construct_object(key_node)
            dotted = f"{path}.{key}" if path else str(key)
            if key in lines:
                return dotted, lines[key], key_node.start_mark.line + 1
            lines[key] = key_node.start_mark.line + 1
        else:
            dotted = path
        if found := _key_given_twice(loader, value_node, dotted, seen):
            return found
    return None


def default_run_name(cfg: Config, config_name: str) -> str:
    """<game>__<config>__s<seed>__<date-time>, with any character run.name does not take (a ':' of an env id, a
    space in a config's file name) written as '_'."""
    name = f"{game_of(cfg.env.id)}__{config_name}__s{cfg.run.seed}__{time.strftime('%Y%m%d-%H%M%S')}"
    return re.sub(f"[^{FOLDER_CHARACTERS}]", "_", name)


def _apply_override(raw: dict, item: str) -> None:
    key, sep, text = item.partition("=")
    if not sep or "." not in key:
        raise ConfigError(item, "overrides take the form section.key=value, e.g. train.lr=1e-4")
    section, _, name = key.partition(".")
    if raw.get(section) is None:   # a section left empty in the file (`eval:` with nothing under it) reads as null
        raw[section] = {}
    if not isinstance(raw[section], dict):
        raise ConfigError(section, "must be a mapping of keys")
    try:
        value = yaml.safe_load(text) if text != "" else ""
    except (yaml.YAMLError, ValueError):   # ValueError: 2024-13-01 as a date, a number of thousands of digits
        value = text
    # A string field takes the text as typed (run.name=007 stays "007"), as does a device map in DI-engine's form
    # (YAML would read 1_0_0 as the number 100).
    hints = typing.get_type_hints(SECTIONS[section]) if section in SECTIONS else {}
    if hints.get(name) is str or hints.get(name) == tuple[DeviceMapEntry, ...] and not text.lstrip().startswith("{"):
        value = text
    raw.setdefault(section, {})[name] = value


def from_dict(raw: dict[str, Any]) -> Config:
    sections = {}
    for section, values in raw.items():
        if section not in SECTIONS:
            raise ConfigError(str(section), _unknown(section, SECTIONS))
        if values is None:
            values = {}
        if not isinstance(values, dict):
            raise ConfigError(section, f"must be a mapping of keys, got {values!r}")
        cls = SECTIONS[section]
        hints = typing.get_type_hints(cls)
        if section == "network" and "centered_frames" in values:   # frame_offset's earlier name, in older configs
            offset = "half" if _convert("network.centered_frames", values["centered_frames"], bool) else "none"
            given = _convert("network.frame_offset", values.get("frame_offset", offset), hints["frame_offset"])
            require(given == offset, "network.centered_frames",
                     f"is network.frame_offset's earlier name (true = half, false = none) and says {offset}, but "
                     f"network.frame_offset is {given}: give network.frame_offset alone")
            values = {k: v for k, v in values.items() if k != "centered_frames"} | {"frame_offset": offset}
        kwargs = {}
        for name, value in values.items():
            key = f"{section}.{name}"
            if name not in hints:
                raise ConfigError(key, _unknown(name, hints))
            kwargs[name] = _convert(key, value, hints[name])
        sections[section] = cls(**kwargs)
        # After the section's own bounds, which say more: what tensors and TensorBoard count in (a longer integer
        # would fail in a role, after the run has started).
        for name, value in kwargs.items():
            require(not isinstance(value, int) or abs(value) <= INT_MAX, f"{section}.{name}",
                    f"must be an integer of at most {INT_MAX:,} (2^63 - 1), got {value!r}")
    return Config(**sections)


def _unknown(name: str, allowed) -> str:
    close = difflib.get_close_matches(str(name), list(allowed), n=1)   # YAML keys may be numbers, or null
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"unknown key{hint}; allowed: {', '.join(allowed)}"


def _convert(key: str, value: Any, tp: Any) -> Any:
    """Converts a YAML value to the field's type. PyYAML reads `1e-4` as a string, so numbers are parsed here."""
    if typing.get_origin(tp) is Literal:
        choices = typing.get_args(tp)
        require(value in choices, key, f"must be one of {', '.join(map(str, choices))}, got {value!r}")
        return value
    if tp == tuple[DeviceMapEntry, ...]:
        return parse_device_map(key, value)
    if typing.get_origin(tp) is tuple:
        (item_tp, _) = typing.get_args(tp)
        require(isinstance(value, (list, tuple)), key, f"must be a list, got {value!r}")
        return tuple(_convert(key, v, item_tp) for v in value)
    if typing.get_args(tp) in ((float, type(None)), (int, type(None))):
        return None if value is None else _convert(key, value, typing.get_args(tp)[0])
    if tp is bool:
        require(isinstance(value, bool), key, f"must be true or false, got {value!r}")
        return value
    if tp is int:
        number = _number(value)
        require(isinstance(number, int) or number is not None and math.isfinite(number) and number.is_integer(),
                key, f"must be an integer, got {value!r}")
        return int(number)
    if tp is float:
        number = _number(value)
        require(number is not None and math.isfinite(_float(number)), key, f"must be a number, got {value!r}")
        return float(number)
    if tp is str:
        require(isinstance(value, str), key, f"must be a string, got {value!r}")
        return value
    raise TypeError(f"{key}: unsupported field type {tp}")


def parse_device_map(key: str, value: Any) -> tuple[DeviceMapEntry, ...]:
    """`{peer: {local_gpu: peer_gpu}}` or DI-engine's `<peer rank>_<local gpu>_<peer gpu>,...`."""
    form = "{peer: {local_gpu: peer_gpu}} or <peer rank>_<local gpu>_<peer gpu>,... (e.g. 1_0_0,2_0_1)"
    entries = []
    if isinstance(value, int) and not isinstance(value, bool):
        require(False, key, f"must be {form}; YAML reads 1_0_0 as the number {value}: put the map in quotes")
    if isinstance(value, str):
        for item in filter(None, (part.strip() for part in value.split(","))):
            parts = item.split("_")
            require(len(parts) == 3 and all(p.isdigit() for p in parts), key, f"must be {form}, got {item!r}")
            entries.append(DeviceMapEntry(*map(int, parts)))
    elif isinstance(value, dict):
        for peer, gpus in value.items():
            require(isinstance(gpus, dict) and gpus, key, f"must be {form}; peer {peer!r} maps to {gpus!r}")
            rank = _peer_rank(key, peer)
            for local, remote in gpus.items():
                require(_gpu_index(local) is not None and _gpu_index(remote) is not None, key,
                         f"GPUs are indices or cuda:N, got {local!r}: {remote!r} for peer {peer!r}")
                entries.append(DeviceMapEntry(rank, _gpu_index(local), _gpu_index(remote)))
    else:
        require(False, key, f"must be {form}, got {value!r}")
    require(len({(e.peer, e.local_gpu) for e in entries}) == len(entries), key,
             f"maps one local GPU to two GPUs of the same peer: {value!r}")
    return tuple(entries)


def _peer_rank(key: str, peer: Any) -> int:
    if isinstance(peer, int) and not isinstance(peer, bool) and peer >= 0:
        return peer
    match = re.fullmatch(r"learner|collector(\d+)", str(peer))
    require(match is not None, key, f"peers are ranks or names (learner, collector0, ...), got {peer!r}")
    return 0 if match.group(1) is None else int(match.group(1)) + 1


def _gpu_index(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    match = re.fullmatch(r"(?:cuda:)?(\d+)", str(value))
    return int(match.group(1)) if match else None


def device_map_text(entries: tuple[DeviceMapEntry, ...]) -> str:
    return ",".join(f"{e.peer}_{e.local_gpu}_{e.peer_gpu}" for e in entries)


def _float(number: float | int) -> float:
    """`number` as a float; an int too long for one (hundreds of digits) as infinity, which no field takes."""
    try:
        return float(number)
    except OverflowError:
        return math.inf


def _number(value: Any) -> float | int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        try:
            return int(value.replace("_", ""))
        except ValueError:
            pass
        try:
            return float(value.replace("_", ""))
        except ValueError:
            return None
    return None


def to_dict(cfg: Config) -> dict[str, dict[str, Any]]:
    """Plain YAML-able values; a device map in its string form."""
    def plain(section: str, key: str, value: Any) -> Any:
        if typing.get_type_hints(SECTIONS[section])[key] == tuple[DeviceMapEntry, ...]:
            return device_map_text(value)
        return list(value) if isinstance(value, tuple) else value
    return {s: {k: plain(s, k, getattr(getattr(cfg, s), k)) for k in typing.get_type_hints(SECTIONS[s])}
            for s in SECTIONS}


def save_config(cfg: Config, path: Path) -> None:
    path.write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))


# ---------------------------------------------------------------------------------------------- docs


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of a config dataclass (Python keeps them only in the source)."""
    import ast
    import inspect
    import textwrap
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    docs = {}
    for field_node, doc_node in zip(body, body[1:]):
        if (isinstance(field_node, ast.AnnAssign) and isinstance(doc_node, ast.Expr)
                and isinstance(doc_node.value, ast.Constant) and isinstance(doc_node.value.value, str)):
            docs[field_node.target.id] = " ".join(doc_node.value.value.split())
    return docs


def reference_markdown() -> str:
    """docs/config.md: every config key with its default and meaning, one table per section (`python -m rl_dqn.config`
    prints it; a test keeps the page and the docstrings the same)."""
    defaults = to_dict(Config())
    parts = ["# Every config key\n\nGenerated from the docstrings in `rl_dqn/config.py` (the `env` section's in "
             "`envs/config.py`) by\n`python -m rl_dqn.config > docs/config.md`. Defaults are the dataclasses'; the "
             "files in `configs/` set many of\nthem. Any key can be set on the command line as `section.key=value` "
             "after the config."]
    for section, cls in SECTIONS.items():
        docs = field_docs(cls)
        rows = []
        for key in typing.get_type_hints(cls):
            value = defaults[section][key]
            rows.append(f"| `{section}.{key}` | `{_shown(value)}` | {docs[key].replace('|', '&#124;')} |")
        parts.append(f"## {section}\n\n| key | default | meaning |\n|-|-|-|\n" + "\n".join(rows))
    return "\n\n".join(parts) + "\n"


def _shown(value: Any) -> str:
    """A default as one would type it in YAML."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ", ".join(map(_shown, value)) + "]"
    if isinstance(value, int):
        return f"{value:_}"
    if isinstance(value, float):
        return f"{value:g}"
    return '""' if value == "" else str(value)


if __name__ == "__main__":
    print(reference_markdown(), end="")
