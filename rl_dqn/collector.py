"""The collector role: steps its envs with its own copy of the Q-network, ships chunks, adopts new weights."""

from __future__ import annotations

import json
import os
import threading
import time

import torch

from envs import EnvSpec, StepResult, VectorEnv, make_vector_env
from rl_dqn import dqn
from rl_dqn.config import Config
from rl_dqn.console import PROGRESS_ENV, PROGRESS_MARK, StartupClock, launched_at, say
from rl_dqn.network import QNetwork, describe_precision
from rl_dqn.system import SystemMeter
from rl_dqn.transport.endpoints import CollectorEndpoint
from rl_dqn.types import Chunk


class ChunkBuilder:
    """Fills a chunk's tensors one vector step at a time; `take` hands them over and starts fresh ones (a chunk
    in flight is read by the transport until its send completes, so its memory is never reused).

    Frames and actions stay on `device`, where the collector acts (the observations uploaded for acting are the
    ones shipped); the per-step flags and rewards come from the env on the CPU and join them once per chunk."""

    def __init__(self, steps: int, num_envs: int, spec: EnvSpec, device: torch.device | str = "cpu"):
        self.steps, self.num_envs, self.spec, self.device = steps, num_envs, spec, torch.device(device)
        self.t = 0
        self._returns = torch.zeros(num_envs, dtype=torch.float64)
        self._lengths = torch.zeros(num_envs, dtype=torch.int64)
        self._ended_returns: list[torch.Tensor] = []
        self._ended_lengths: list[torch.Tensor] = []
        self._ended_epsilons: list[torch.Tensor] = []
        self._episode_epsilons = torch.zeros(num_envs, dtype=torch.float32)   # the highest of each episode so far
        self._epsilons_given = True   # by every step of the chunk
        self._allocate()

    def _allocate(self) -> None:
        shape = (self.steps, self.num_envs)
        self.frames = torch.empty(*shape, *self.spec.frame_shape, dtype=self.spec.obs_dtype, device=self.device)
        self.actions = torch.empty(shape, dtype=torch.int64, device=self.device)
        self.q_taken: torch.Tensor | None = None   # made by the first add() given Q-values
        self.q_max: torch.Tensor | None = None
        self.rewards = torch.empty(shape, dtype=torch.float32)
        self.terminated = torch.empty(shape, dtype=torch.bool)
        self.first = torch.empty(shape, dtype=torch.bool)

    @property
    def full(self) -> bool:
        return self.t == self.steps

    def add(self, obs: torch.Tensor, obs_first: torch.Tensor, actions: torch.Tensor, result: StepResult,
            q_values: torch.Tensor | None = None, epsilons: torch.Tensor | None = None) -> None:
        """Records one vector step: the observation acted on (its newest frame), the action, the outcome and,
        when given, the Q-values it was chosen from (the learner derives Ape-X priorities from them) and each env's
        epsilon (`[E]` on the CPU: the chunk gives the highest each episode that ended in it was played at, where
        every step of the chunk gave them)."""
        t = self.t
        self.frames[t] = obs[:, -1]
        self.first[t] = obs_first
        self.actions[t] = actions
        if q_values is not None:
            if self.q_taken is None:
                self.q_taken = torch.zeros(self.steps, self.num_envs, device=self.device)
                self.q_max = torch.zeros(self.steps, self.num_envs, device=self.device)
            self.q_taken[t] = q_values.gather(1, actions[:, None]).squeeze(1)
            self.q_max[t] = q_values.max(dim=1).values
        self.rewards[t] = result.reward
        self.terminated[t] = result.terminated
        self.t += 1
        # Raw game score per episode; the env's reset step (result.first) is not an agent step.
        self._returns += result.raw_reward
        self._lengths += (~result.first).long()
        if epsilons is None:
            self._epsilons_given = False
        else:
            torch.maximum(self._episode_epsilons, epsilons, out=self._episode_epsilons)
        ended = result.episode_end
        if ended.any():
            self._ended_returns.append(self._returns[ended].clone())
            self._ended_lengths.append(self._lengths[ended].clone())
            self._ended_epsilons.append(self._episode_epsilons[ended].clone())
            self._episode_epsilons[ended] = 0.0
            self._returns[ended] = 0.0
            self._lengths[ended] = 0

    def take(self, collector: int, seq: int, weights_version: int, system: tuple[float, ...] = ()) -> Chunk:
        returns = torch.cat(self._ended_returns) if self._ended_returns else torch.zeros(0, dtype=torch.float64)
        lengths = torch.cat(self._ended_lengths) if self._ended_lengths else torch.zeros(0, dtype=torch.int64)
        epsilons = None if not self._epsilons_given else \
            torch.cat(self._ended_epsilons) if self._ended_epsilons else torch.zeros(0, dtype=torch.float32)
        chunk = Chunk(collector, seq, weights_version, self.frames, self.actions, self.rewards.to(self.device),
                      self.terminated.to(self.device), self.first.to(self.device), returns, lengths,
                      self.q_taken, self.q_max, system=system, episode_epsilons=epsilons)
        self._ended_returns, self._ended_lengths, self._ended_epsilons = [], [], []
        self._epsilons_given = True
        self.t = 0
        self._allocate()
        return chunk


class Collector:
    """Acts epsilon-greedily in `env.envs_per_collector` envs and sends a chunk every `collectors.chunk_steps`
    vector steps. `index` (0-based) places its envs in the run: env i of the run is env `i - index * E` here.
    prepare() makes what needs no learner (envs, network, the first observations), which a role does before it
    joins, while the learner starts; run() is prepare(), start() and then step() until the run or this process
    stops."""

    def __init__(self, cfg: Config, index: int, transport: CollectorEndpoint | None,
                 stop: threading.Event | None = None, policy_device: torch.device | str = "cpu",
                 incarnation: int = 0):
        self.cfg, self.index, self.transport = cfg, index, transport
        self.incarnation = incarnation
        self.env: VectorEnv | None = None
        self.stop = stop or threading.Event()
        self.policy_device = torch.device(policy_device)
        self.name = f"collector{index}"
        # Its launcher reads its progress lines (a collector started any other way keeps quiet).
        self.report_progress = os.environ.get(PROGRESS_ENV) == "1"
        self.seq = 0                    # chunks sent
        self.version = -1               # of the weights it acts with
        self.run_env_steps = 0          # the run's env steps, as the learner last answered
        self.startup = StartupClock(launched_at())
        if transport is not None:   # it joined before it was made
            self.startup.mark("joined")

    @property
    def seed(self) -> int:
        """The seed of the envs and of exploration: a process that replaces a dead one in the same slot (a later
        incarnation) plays other episodes and explores anew."""
        return (self.cfg.run.seed * 100_000 + self.index * self.cfg.env.envs_per_collector
                + 1_000_003 * self.incarnation)

    def _epsilons(self, run_env_steps: int) -> torch.Tensor:
        c, E = self.cfg.collectors, self.cfg.env.envs_per_collector
        if c.exploration == "linear":
            eps = torch.full((E,), dqn.linear_epsilon(run_env_steps, c.epsilon_start, c.epsilon_end,
                                                       c.epsilon_decay_env_steps))
        else:
            eps = dqn.apex_epsilons(self.cfg.num_envs, self.index * E, E, c.apex_epsilon, c.apex_alpha)
            eps = eps.clamp(min=c.apex_floor)
            if c.exploration == "linear_apex":   # each env decays to its own end: the (floored) Ape-X spread
                eps = dqn.linear_epsilon(run_env_steps, c.epsilon_start, eps, c.epsilon_decay_env_steps)
        return eps.to(self.policy_device)

    def prepare(self) -> None:
        """Makes the envs, puts the network on its device and resets the envs, as the first incarnation of this
        slot would: none of it needs the learner. Once is enough (run() calls it when the role has not)."""
        if self.env is not None:
            return
        cfg, device = self.cfg, self.policy_device
        torch.set_num_threads(cfg.collectors.torch_threads)
        self.env = make_vector_env(cfg.env, cfg.env.envs_per_collector, seed=self.seed)
        self.startup.mark("envs made")
        self.net = QNetwork.for_env(self.env.spec.obs_shape, self.env.spec.num_actions, cfg.network,
                                    device).for_acting()
        self.generator = torch.Generator(device=device)
        self.startup.mark(f"network on {device}")
        self._reset()
        self.startup.mark("envs reset")

    def _reset(self) -> None:
        """Exploration and every env start anew from the seed."""
        self.generator.manual_seed(self.seed)
        self.obs = self.env.reset(seed=self.seed).to(self.policy_device)
        self.obs_first = torch.ones(self.env.num_envs, dtype=torch.bool)

    def joined(self, transport: CollectorEndpoint, incarnation: int) -> None:
        """The run took this process as `incarnation` of its slot. A later one than prepare() assumed (it replaces a
        process that died) seeds its envs and exploration again and starts new episodes."""
        self.transport = transport
        self.startup.mark("joined")
        if incarnation == self.incarnation:
            return
        self.incarnation = incarnation
        if self.env is not None:
            self._reset()
            self.startup.mark(f"envs reset as incarnation {incarnation}")

    def close(self) -> None:
        if self.env is not None:
            self.env.close()
            self.env = None

    def run(self) -> None:
        self.prepare()
        try:
            if not self.start():
                return
            started = time.monotonic()
            while not (self.stop.is_set() or self.transport.stop_requested):
                self.step()
            steps, elapsed = self.seq * self.builder.steps * self.builder.num_envs, time.monotonic() - started
            say(self.name, f"stopped after {self.seq} chunks ({steps:,} env steps, {steps / max(elapsed, 1e-9):,.0f}"
                           f"/s), weights version {self.version} on {next(self.net.parameters()).device}")
        finally:
            self.close()

    def start(self) -> bool:
        """Waits for the learner's weights (they come with the admission); False when the run or this process
        stopped first."""
        cfg, E, device = self.cfg, self.cfg.env.envs_per_collector, self.policy_device
        weights = self.transport.wait_weights(cfg.cluster.join_timeout_s)
        if weights is None:
            return False
        self.startup.mark("first weights")
        self.net.load_state_dict(weights.state)
        self.version = weights.version
        self.builder = ChunkBuilder(cfg.collectors.chunk_steps, E, self.env.spec, device)
        # The learner takes the Q-values of the actions as initial priorities with train.initial_priority:
        # collectors; else they are neither kept nor sent.
        self._sends_q_values = cfg.train.prioritized and cfg.train.initial_priority == "collectors"
        # A process that joins a run under way (a restart, a resumed learner) starts the schedule where the run is.
        self.run_env_steps = self.transport.env_steps_at_join
        self.epsilons = self._epsilons(self.run_env_steps)
        self._epsilons_cpu = self.epsilons.cpu()   # what the chunks say episodes were played at
        precision, warning = describe_precision(cfg.network.precision, device)
        if warning is not None:
            say(self.name, f"warning: {warning}")
        say(self.name, f"acting in {E} x {cfg.env.id} on {device} in {precision}, "
                       f"epsilon {self.epsilons.min():.3g}..{self.epsilons.max():.3g}")
        say(self.name, f"start-up {self.startup.line()}")
        self._last_report = time.monotonic()
        self._meter, self._system = SystemMeter(device), ()
        self._steps_then, self._run_steps_then = 0, self.run_env_steps
        return True

    def step(self) -> Chunk | None:
        """One step of every env, acting with the newest weights; every collectors.chunk_steps steps the chunk
        goes to the learner (returned), and its answer moves the exploration schedule to where the run is."""
        weights = self.transport.poll_weights()
        if weights is not None:
            self.net.load_state_dict(weights.state)
            self.version = weights.version
        with torch.inference_mode():
            q_values = self.net(self.obs)
            actions = dqn.select_actions(q_values, self.epsilons, self.generator)
        result = self.env.step(actions.cpu())   # the env runs on the CPU: one small copy per step on a GPU
        self.builder.add(self.obs, self.obs_first, actions, result, q_values if self._sends_q_values else None,
                         self._epsilons_cpu)
        self.obs, self.obs_first = result.obs.to(self.policy_device), result.first
        if not self.builder.full:
            return None
        chunk = self.builder.take(self.index, self.seq, self.version, self._system)
        ack = self.transport.send(chunk)
        self.seq += 1
        if ack is not None and not ack.stop:   # the answer that ends the run counts nothing
            self.run_env_steps = ack.env_steps
            if self.cfg.collectors.exploration != "apex":
                self.epsilons = self._epsilons(self.run_env_steps)
                self._epsilons_cpu = self.epsilons.cpu()
        if (now := time.monotonic()) - self._last_report >= self.cfg.metrics.interval_s:
            self._progress(now)
        return chunk

    def _progress(self, now: float) -> None:
        figures = self._meter.sample()   # travels with the next chunks, for TensorBoard
        self._system = (figures["cpu_percent"], figures["memory_mb"], figures.get("gpu_memory_mb", 0.0))
        steps, interval = self.seq * self.builder.steps * self.builder.num_envs, now - self._last_report
        if self.report_progress:
            # For the node's launcher, which sums its collectors into one progress line: this process's env
            # steps/s, and the run's env steps and their rate as the learner answers.
            report = {"rate": (steps - self._steps_then) / interval, "run_env_steps": self.run_env_steps,
                      "run_rate": (self.run_env_steps - self._run_steps_then) / interval,
                      "weights_version": self.version}
            print(f"[{self.name}] {PROGRESS_MARK} {json.dumps(report)}", flush=True)
        self._last_report, self._steps_then, self._run_steps_then = now, steps, self.run_env_steps
