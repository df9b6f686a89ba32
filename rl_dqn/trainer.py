"""(Double) DQN on a replay memory: the networks, the optimizer, the replay and its sampling, and step(), one update.
It knows nothing of collectors, transports, metrics or files; the learner role wires it to them."""

from __future__ import annotations

import concurrent.futures
import copy
import os
from typing import NamedTuple

import torch

from envs import EnvSpec
from rl_dqn import dqn
from rl_dqn.config import Config
from rl_dqn.network import QNetwork
from rl_dqn.replay import ReplayMemory
from rl_dqn.types import Weights


def torch_threads(cfg: Config) -> int:
    """Intra-op threads for each of the learner's compute threads: learner.torch_threads, or the CPU cores shared
    out among them (see Trainer.step())."""
    return cfg.learner.torch_threads or max(1, (os.cpu_count() or 1) // (2 if cfg.learner.overlap else 1))


class Update(NamedTuple):
    """What one update computed, on the trainer's device: the batch's Q(s, a), its TD targets and the loss."""
    q: torch.Tensor
    targets: torch.Tensor
    loss: torch.Tensor


class Trainer:
    """The online and target Q-networks, Adam, the replay memory (on the same device) and the sampling generator.
    `cfg` is the config as this process runs it (network.precision resolved for `device`)."""

    def __init__(self, cfg: Config, spec: EnvSpec, device: torch.device):
        t = cfg.train
        self.cfg, self.device = cfg, device
        torch.manual_seed(cfg.run.seed)
        self.network = QNetwork.for_env(spec.obs_shape, spec.num_actions, cfg.network, device)
        self.target = copy.deepcopy(self.network).for_acting(channels_last=self.network.channels_last)
        # The fused kernel: 0.5 ms per step for the Nature CNN on 2 CPU cores against 6 ms for the default.
        self.optimizer = torch.optim.Adam(self.network.parameters(), lr=t.lr, eps=t.adam_eps, fused=True)
        self.replay = ReplayMemory(t.replay_capacity, cfg.num_envs, spec.frame_shape, spec.obs_dtype,
                                   spec.frame_stack, replay_device=device, n_step=t.n_step, gamma=t.gamma,
                                   prioritized=t.prioritized, alpha=t.priority_alpha, priority_eps=t.priority_eps,
                                   initial_priority=t.initial_priority)
        self.generator = torch.Generator(device).manual_seed(cfg.run.seed)
        self.updates = 0
        # eval.ema_updates: a moving average of the online network's parameters, which the evaluator plays.
        self.averaged = [p.detach().clone() for p in self.network.parameters()] if cfg.eval.ema_updates else None
        # learner.overlap: the helper thread prepares the next batch during an update (see step()).
        self._helper = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="learner-batches") \
            if cfg.learner.overlap else None
        self._prepared: concurrent.futures.Future | None = None
        self._generator_before_prepared: torch.Tensor | None = None   # its state before the prepared batch
        self._env_steps = 0   # of the update in progress: the beta and n-step schedules follow it
        # Sums since mean_loss_and_q() last read them, so that an update never waits on a host sync.
        self._loss_sum = torch.zeros((), device=device)
        self._q_sum = torch.zeros((), device=device)
        self._summed = 0

    def step(self, env_steps: int) -> Update:
        """One update (Double DQN's, or with train.double false Nature DQN's) on an n-step batch, drawn uniformly
        or by priority (then weighted by importance and re-prioritized by its TD errors), `env_steps` into the run.

        With learner.overlap the helper thread computes the online network's values of s' (Double DQN's) while this
        thread computes those of s, then samples the next batch, converts its frames and evaluates the target network
        on it while this one runs the backward pass and the optimizer. Each side runs whole operations on its own
        cores, which on a small CPU wastes less than splitting every operation over all of them. The helper is idle
        again when step() returns, so replay inserts, checkpoints and target refreshes never run beside it."""
        t = self.cfg.train
        self._env_steps = env_steps
        batch, inputs, next_inputs, next_target = self._take_prepared() or self._prepare_batch()
        if self._helper is not None and t.double:
            next_online = self._helper.submit(self._online_values, next_inputs)
        q = self.network(inputs).gather(1, batch.actions[:, None]).squeeze(1)
        with torch.no_grad():
            if t.double:
                online = next_online.result() if self._helper is not None else self._online_values(next_inputs)
                targets = dqn.double_dqn_target(batch.returns, batch.discounts, online, next_target)
            else:
                targets = dqn.dqn_target(batch.returns, batch.discounts, next_target)
        loss = dqn.td_loss(q, targets, batch.weights if t.prioritized else None)
        self.replay.update_priorities(batch.index, q.detach() - targets)   # before the next batch is drawn
        # Not across a target refresh: the prepared batch's targets would come from the old target network.
        if self._helper is not None and (self.updates + 1) % t.target_update_updates != 0:
            self._generator_before_prepared = self.generator.get_state()
            self._prepared = self._helper.submit(self._prepare_batch)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.network.parameters(), t.max_grad_norm)
        lr = dqn.linear_schedule(env_steps, t.lr, t.lr_end, t.lr_decay_start_env_steps,
                                 t.lr_decay_end_env_steps or t.total_env_steps)
        for group in self.optimizer.param_groups:   # a float: the fused step reads it, no recompilation
            group["lr"] = lr
        self.optimizer.step()
        if self.averaged is not None:   # one fused pass over all parameters
            torch._foreach_lerp_(self.averaged, list(self.network.parameters()), 1.0 / self.cfg.eval.ema_updates)
        if self._prepared is not None:
            concurrent.futures.wait([self._prepared])
        self.updates += 1
        self._loss_sum += loss.detach()
        self._q_sum += q.detach().mean()
        self._summed += 1
        if self.updates % t.target_update_updates == 0:
            self.target.load_state_dict(self.network.state_dict())
        return Update(q.detach(), targets, loss.detach())

    @property
    def lr(self) -> float:
        """The learning rate of the newest update (before the first, train.lr or a resumed optimizer's)."""
        return self.optimizer.param_groups[0]["lr"]

    def _prepare_batch(self) -> tuple:
        """A batch, its observations converted for the online network (QNetwork.inputs()), its next observations
        converted once for both networks, and the target network's values of them: under learner.overlap all of it
        is done here, off the training thread's path."""
        t = self.cfg.train
        beta = dqn.beta_schedule(self._env_steps, t.priority_beta, t.learning_starts,
                                 t.priority_beta_env_steps or t.total_env_steps)
        n_step = round(dqn.linear_schedule(self._env_steps, t.n_step, t.n_step_end, t.n_step_decay_start_env_steps,
                                           t.n_step_decay_end_env_steps or t.total_env_steps))
        batch = self.replay.sample(t.batch_size, self.generator, beta, n_step)
        with torch.no_grad():
            next_inputs = self.target.inputs(batch.next_obs)        # converted once for both networks
            return batch, self.network.inputs(batch.obs), next_inputs, self.target(next_inputs)

    def _online_values(self, next_inputs: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.network(next_inputs)

    def _take_prepared(self) -> tuple | None:
        prepared, self._prepared, self._generator_before_prepared = self._prepared, None, None
        return prepared.result() if prepared is not None else None

    def mean_loss_and_q(self) -> tuple[float, float] | None:
        """The mean loss and Q(s, a) of the updates since the last call (None: there were none). A host sync."""
        if not self._summed:
            return None
        means = ((self._loss_sum / self._summed).item(), (self._q_sum / self._summed).item())
        self._loss_sum.zero_()
        self._q_sum.zero_()
        self._summed = 0
        return means

    def weights(self, version: int) -> Weights:
        """A snapshot of the online network on the trainer's device, detached from the copy that keeps training
        (the transport sends it as it is, or a CPU copy to a collector it cannot reach GPU to GPU)."""
        return Weights(version, {k: v.detach().clone() for k, v in self.network.state_dict().items()})

    def evaluated_weights(self) -> dict[str, torch.Tensor]:
        """What the evaluator plays, as a CPU state dict of the online network: its weights, or their moving
        average with eval.ema_updates."""
        state = self.network.state_dict()
        if self.averaged is not None:
            state |= dict(zip((name for name, _ in self.network.named_parameters()), self.averaged))
        return {k: v.detach().to("cpu", copy=True) for k, v in state.items()}

    def state(self) -> dict:
        """Networks, optimizer, the sampling generator and the weights' moving average if any (with `updates`, all a
        resumed trainer needs): it draws the batch that this one has prepared but not trained on yet."""
        return {"network": self.network.state_dict(), "target": self.target.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "generator": self._generator_before_prepared if self._prepared is not None
                else self.generator.get_state(),
                "averaged": self.averaged}

    def load_state(self, state: dict, updates: int) -> bool:
        """Continues from state() after `updates` updates. Returns False when its generator was another kind of
        device's (a CPU generator's state is 5,056 bytes, a CUDA one's 16): sampling then goes on from a seed of the
        run and its updates instead of the saved stream."""
        self.network.load_state_dict(state["network"])
        self.target.load_state_dict(state["target"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.averaged is not None:   # a run that had none (or an older checkpoint) starts one from the weights
            for average, saved in zip(self.averaged, state.get("averaged") or self.network.parameters()):
                average.copy_(saved.detach())
        self.updates = updates
        self._take_prepared()
        if state["generator"].numel() == self.generator.get_state().numel():
            self.generator.set_state(state["generator"])
            return True
        self.generator.manual_seed(self.cfg.run.seed * 1_000_003 + self.updates)
        return False

    def close(self) -> None:
        if self._helper is not None:
            self._helper.shutdown()
