"""The DQN math as small pure functions: exploration schedules, action choice, the DQN, Double DQN and Munchausen
targets and loss, and their QR-DQN forms over quantiles."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def apex_epsilons(num_envs: int, first: int, count: int, base: float = 0.4, alpha: float = 7.0) -> torch.Tensor:
    """Ape-X's fixed per-actor epsilons, eps_i = base^(1 + alpha * i / (N - 1)), for envs first..first+count-1
    of the N envs of the run (Horgan et al. 2018, https://arxiv.org/abs/1803.00933, section 4)."""
    i = torch.arange(first, first + count, dtype=torch.float64)
    exponent = 1.0 + alpha * i / max(num_envs - 1, 1)
    return (base ** exponent).float()


def linear_epsilon(env_steps: int, start: float, end: float | torch.Tensor, decay_env_steps: int
                   ) -> float | torch.Tensor:
    """Epsilon decayed linearly from `start` to `end` over `decay_env_steps`, then held (CleanRL's schedule); `end`
    may be a tensor of per-env floors."""
    fraction = min(env_steps / decay_env_steps, 1.0)
    return start + fraction * (end - start)


def select_actions(q_values: torch.Tensor, epsilons: torch.Tensor, generator: torch.Generator | None = None
                   ) -> torch.Tensor:
    """Epsilon-greedy over a batch: row b acts at random with probability epsilons[b], else greedily."""
    batch, num_actions = q_values.shape
    greedy = q_values.argmax(dim=1)
    random = torch.randint(num_actions, (batch,), generator=generator, device=q_values.device)
    explore = torch.rand(batch, generator=generator, device=q_values.device) < epsilons
    return torch.where(explore, random, greedy)


def double_dqn_target(returns: torch.Tensor, discounts: torch.Tensor, next_q_online: torch.Tensor,
                      next_q_target: torch.Tensor) -> torch.Tensor:
    """R + discount * Q_target(s', argmax_a Q_online(s', a)) (van Hasselt et al. 2016,
    https://arxiv.org/abs/1509.06461). For an n-step transition R is the discounted sum of its rewards and the
    discount gamma^m for the m steps it spans, or 0 when the episode terminated within them. A time-limit
    truncation is not terminal: it bootstraps, because the state after it is as valuable as any other."""
    next_actions = next_q_online.argmax(dim=1, keepdim=True)
    next_values = next_q_target.gather(1, next_actions).squeeze(1)
    return returns + discounts * next_values


def dqn_target(returns: torch.Tensor, discounts: torch.Tensor, next_q_target: torch.Tensor) -> torch.Tensor:
    """R + discount * max_a Q_target(s', a) (Mnih et al. 2015), with R and the discount as in double_dqn_target()."""
    return returns + discounts * next_q_target.max(dim=1).values


def td_loss(q_taken: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """Huber loss between Q(s, a) and the (constant) target, as in Nature DQN's error clipping, each sample
    scaled by its importance weight when replay is prioritized."""
    loss = F.smooth_l1_loss(q_taken, targets.detach(), reduction="none")
    return (loss if weights is None else loss * weights).mean()


def quantile_fractions(n: int, device: torch.device | str | None = None) -> torch.Tensor:
    """The fractions tau_i = (2i + 1) / 2n, i = 0..n-1, whose quantiles a QR-DQN head gives: the midpoints of n
    equal slices of probability (Dabney et al. 2017, https://arxiv.org/abs/1710.10044, Lemma 2)."""
    return (2 * torch.arange(n, device=device, dtype=torch.float32) + 1) / (2 * n)


def quantiles_of(quantiles: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """Each row's quantiles `[B, N]` of its action in `actions` `[B]`, from every action's `[B, actions, N]`."""
    return quantiles.gather(1, actions[:, None, None].expand(-1, 1, quantiles.shape[2])).squeeze(1)


def quantile_target(returns: torch.Tensor, discounts: torch.Tensor, next_quantiles_target: torch.Tensor,
                    next_q_online: torch.Tensor | None = None) -> torch.Tensor:
    """The target's quantiles `[B, N]`: R + discount * theta_j(s', a*) for each quantile j of the target network's
    `next_quantiles_target` `[B, actions, N]`, at the action a* that maximizes the online network's Q-values
    `next_q_online` (Double DQN's choice), or the target's own mean over its quantiles when that is None (Nature
    DQN's). R and the discount as in double_dqn_target()."""
    chooser = next_quantiles_target.mean(dim=2) if next_q_online is None else next_q_online
    next_values = quantiles_of(next_quantiles_target, chooser.argmax(dim=1))
    return returns[:, None] + discounts[:, None] * next_values


def munchausen_target(returns: torch.Tensor, discounts: torch.Tensor, actions: torch.Tensor, values: torch.Tensor,
                      next_values: torch.Tensor, tau: float, alpha: float, clip: float) -> torch.Tensor:
    """Munchausen DQN's target (Vieillard, Pietquin and Geist 2020, https://arxiv.org/abs/2007.14430, eq. 2):
    R + alpha * clamp(tau * log pi(a|s), clip, 0) + discount * sum_a' pi(a'|s') (Q(s', a') - tau * log pi(a'|s')),
    with pi = softmax(Q / tau) of the target network's Q-values. The first term rewards the taken action by how
    likely the target policy was to take it, which keeps the policy from changing faster than the values say it
    should (an implicit KL penalty); the bootstrap is the soft value of s' in place of a max. For an n-step
    transition the bonus is the first action's (the rewards after it carry none), and R and the discount are as in
    double_dqn_target().

    `values` and `next_values` are the target network's values of s and s': Q-values `[B, actions]`, or quantiles
    `[B, actions, N]` (the policy then reads each action's mean, and each quantile j of the target is
    R + bonus + discount * sum_a' pi(a'|s') (theta_j(s', a') - tau * log pi(a'|s')), as Munchausen-IQN's are);
    `actions` `[B]` are those taken in s. Computed in float32 whatever the networks' precision."""
    as_quantiles = next_values.dim() == 3
    values, next_values = (v.float() if as_quantiles else v.float()[:, :, None] for v in (values, next_values))
    log_policy = tau * F.log_softmax(values.mean(dim=2) / tau, dim=1)
    bonus = alpha * log_policy.gather(1, actions[:, None]).clamp(clip, 0.0)                       # [B, 1]
    next_logits = F.log_softmax(next_values.mean(dim=2) / tau, dim=1)
    soft = (next_logits.exp()[:, :, None] * (next_values - tau * next_logits[:, :, None])).sum(dim=1)   # [B, N]
    targets = returns[:, None] + bonus + discounts[:, None] * soft
    return targets if as_quantiles else targets.squeeze(1)


def quantile_huber_loss(quantiles: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """QR-DQN's loss of the taken action's quantiles `[B, N]` against the (constant) target's `[B, N']`: for every
    pair, u = target_j - quantile_i weighs Huber(u) (kappa 1) by |tau_i - 1{u < 0}|; averaged over the pairs of a
    sample, each sample scaled by its importance weight when replay is prioritized, then averaged over the batch.
    The paper sums over i: a constant factor N, which Adam's step would absorb but gradient clipping
    (train.max_grad_norm) and Adam's epsilon would not, so the mean keeps the gradients and priorities at the scale
    of the Huber loss of a TD error. Returns that loss and each sample's unweighted loss `[B]` (what prioritized
    replay takes as its priority).

    The gradient is computed with the loss, from the same pairs, in closed form (_QuantileHuberLoss): a few
    whole-tensor operations on the learner's training thread instead of autograd's way back through each of the
    formula's."""
    return _QuantileHuberLoss.apply(quantiles, targets.detach(), weights)


class _QuantileHuberLoss(torch.autograd.Function):
    """quantile_huber_loss() with its gradient in closed form. Huber(u) = c (u - c / 2) with c = clamp(u, -1, 1),
    whose derivative in u is c, and u = target_j - quantile_i, so d loss / d quantile_i of sample b is
    -w_b / B * mean_j |tau_i - 1{u_ij < 0}| c_ij / N (the indicator's derivative is 0 almost everywhere)."""

    @staticmethod
    def forward(ctx, quantiles: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor | None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        batch, n, n_target = quantiles.shape[0], quantiles.shape[1], targets.shape[1]
        tau = quantile_fractions(n, quantiles.device)[None, :, None]
        u = targets[:, None, :] - quantiles[:, :, None]                          # [B, N, N']
        clipped = u.clamp(-1.0, 1.0)
        slope = torch.where(u < 0, 1.0 - tau, tau) * clipped                   # |tau - 1{u < 0}| * Huber'(u)
        per_sample = (slope * torch.add(u, clipped, alpha=-0.5)).mean(dim=(1, 2))
        scale = -1.0 / (batch * n * n_target)
        per_row = torch.full_like(per_sample, scale) if weights is None else weights * scale
        ctx.save_for_backward(slope.sum(dim=2) * per_row[:, None])
        ctx.mark_non_differentiable(per_sample)
        loss = per_sample.mean() if weights is None else (per_sample * weights).mean()
        return loss, per_sample

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor, _grad_per_sample: torch.Tensor):
        gradient, = ctx.saved_tensors
        return gradient * grad_loss, None, None


def linear_schedule(env_steps: int, start: float, end: float | None, start_env_steps: int, end_env_steps: int
                    ) -> float:
    """A value that holds at `start` until `start_env_steps`, goes linearly to `end` at `end_env_steps` and holds
    there; `start` throughout when `end` is None (train.lr to lr_end, train.n_step to n_step_end)."""
    if end is None or end_env_steps <= start_env_steps:   # the run ends before the decay starts: it never does
        return start
    fraction = (env_steps - start_env_steps) / (end_env_steps - start_env_steps)
    return start + min(max(fraction, 0.0), 1.0) * (end - start)


def beta_schedule(env_steps: int, start: float, learning_starts: int, end_env_steps: int) -> float:
    """Prioritized replay's importance-sampling exponent, annealed linearly from `start` when learning starts to
    1 at `end_env_steps`."""
    fraction = (env_steps - learning_starts) / max(end_env_steps - learning_starts, 1)
    return start + min(max(fraction, 0.0), 1.0) * (1.0 - start)
