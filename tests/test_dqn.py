"""The DQN math on hand-made tensors."""

from __future__ import annotations

import math

import pytest
import torch

from rl_dqn import dqn


def test_double_dqn_target_by_hand():
    returns = torch.tensor([1.0, 0.0, -1.0])
    discounts = torch.tensor([0.9, 0.0, 0.81])            # one step; terminal; two steps
    next_q_online = torch.tensor([[1.0, 3.0], [5.0, 2.0], [0.5, 0.2]])   # argmax: 1, 0, 0
    next_q_target = torch.tensor([[10.0, 20.0], [30.0, 40.0], [7.0, 8.0]])
    targets = dqn.double_dqn_target(returns, discounts, next_q_online, next_q_target)
    # 1 + 0.9 * 20; terminal: no bootstrap; -1 + 0.81 * 7 (the online net's choice, not the target's max of 8)
    assert targets.tolist() == pytest.approx([19.0, 0.0, -1 + 0.81 * 7])


def test_dqn_target_by_hand():
    returns = torch.tensor([1.0, 0.0, -1.0])
    discounts = torch.tensor([0.9, 0.0, 0.81])
    next_q_target = torch.tensor([[10.0, 20.0], [30.0, 40.0], [7.0, 8.0]])
    # the target network's own greedy value in each s': 20, (terminal), 8
    assert dqn.dqn_target(returns, discounts, next_q_target).tolist() == pytest.approx([19.0, 0.0, -1 + 0.81 * 8])


def test_huber_loss_by_hand():
    loss = dqn.td_loss(torch.tensor([0.0, 3.0]), torch.tensor([0.5, 0.0]))
    assert loss.item() == pytest.approx((0.5 * 0.5 ** 2 + (3.0 - 0.5)) / 2)
    weighted = dqn.td_loss(torch.tensor([0.0, 3.0]), torch.tensor([0.5, 0.0]), torch.tensor([1.0, 0.25]))
    assert weighted.item() == pytest.approx((0.5 * 0.5 ** 2 + 0.25 * (3.0 - 0.5)) / 2)


def test_quantile_fractions_are_the_midpoints_of_equal_slices():
    assert dqn.quantile_fractions(4).tolist() == [0.125, 0.375, 0.625, 0.875]


def test_quantile_target_bootstraps_every_quantile_of_the_chosen_action():
    returns, discounts = torch.tensor([1.0, 2.0]), torch.tensor([0.9, 0.0])     # the second terminal
    next_quantiles = torch.tensor([[[0.0, 10.0], [3.0, 5.0]],                    # means 5 and 4
                                   [[1.0, 1.0], [7.0, 9.0]]])
    next_q_online = torch.tensor([[0.0, 1.0], [1.0, 0.0]])                       # Double DQN's choice: 1, 0
    double = dqn.quantile_target(returns, discounts, next_quantiles, next_q_online)
    torch.testing.assert_close(double, torch.tensor([[1 + 0.9 * 3, 1 + 0.9 * 5], [2.0, 2.0]]))
    # Without the online network's values, the target's own greedy action by its quantiles' mean: 0 (5 > 4).
    nature = dqn.quantile_target(returns, discounts, next_quantiles)
    torch.testing.assert_close(nature, torch.tensor([[1.0, 1 + 0.9 * 10], [2.0, 2.0]]))


def test_munchausen_target_by_hand():
    returns, discounts, actions = torch.tensor([1.0, 0.0]), torch.tensor([0.9, 0.0]), torch.tensor([0, 1])
    values = torch.tensor([[1.0, 2.0], [0.0, 0.0]])       # the target network's Q(s)
    next_values = torch.tensor([[0.0, 0.0], [5.0, 1.0]])  # and Q(s'); the second transition is terminal
    targets = dqn.munchausen_target(returns, discounts, actions, values, next_values, tau=1.0, alpha=0.5, clip=-1.0)
    # Sample 0: log pi(a=0|s) = 1 - log(e + e^2) = -1.31, clipped to -1, so the bonus is 0.5 * -1; s' has two
    # equal actions, so its soft value is their Q plus the entropy of the uniform policy, log 2.
    # Sample 1: log pi(a=1|s) = -log 2, unclipped; terminal, so no bootstrap.
    assert targets.tolist() == pytest.approx([1 - 0.5 + 0.9 * math.log(2), 0.5 * -math.log(2)])


def test_munchausen_target_at_a_low_temperature_is_the_greedy_target():
    """As tau goes to 0 the policy is greedy: the taken greedy action's bonus goes to 0 and the soft value of s' to
    its max, Nature DQN's target."""
    generator = torch.Generator().manual_seed(0)
    returns, discounts = torch.randn(16, generator=generator), torch.rand(16, generator=generator)
    values, next_values = torch.randn(16, 4, generator=generator), torch.randn(16, 4, generator=generator)
    targets = dqn.munchausen_target(returns, discounts, values.argmax(dim=1), values, next_values,
                                    tau=1e-4, alpha=0.9, clip=-1.0)
    torch.testing.assert_close(targets, dqn.dqn_target(returns, discounts, next_values), rtol=0, atol=1e-3)


def test_munchausen_quantile_target_bootstraps_each_quantile_under_the_soft_policy():
    """With quantiles the policy reads each action's mean, and each target quantile is the policy's mixture of the
    actions' quantile j, less tau * log pi: the targets' mean over the quantiles is the Q-value target of the
    means."""
    generator = torch.Generator().manual_seed(0)
    returns, discounts = torch.randn(8, generator=generator), torch.rand(8, generator=generator)
    actions = torch.randint(3, (8,), generator=generator)
    values, next_values = torch.randn(8, 3, 5, generator=generator), torch.randn(8, 3, 5, generator=generator)
    targets = dqn.munchausen_target(returns, discounts, actions, values, next_values, tau=0.5, alpha=0.9, clip=-1.0)
    assert targets.shape == (8, 5)
    means = dqn.munchausen_target(returns, discounts, actions, values.mean(dim=2), next_values.mean(dim=2),
                                  tau=0.5, alpha=0.9, clip=-1.0)
    torch.testing.assert_close(targets.mean(dim=1), means)
    policy = torch.softmax(next_values.mean(dim=2) / 0.5, dim=1)
    bonus = 0.9 * (0.5 * torch.log_softmax(values.mean(dim=2) / 0.5, dim=1)).gather(1, actions[:, None]).clamp(-1, 0)
    by_hand = returns[:, None] + bonus + discounts[:, None] * torch.einsum(
        "ba,ban->bn", policy, next_values - 0.5 * policy.log()[:, :, None])
    torch.testing.assert_close(targets, by_hand)


def test_quantile_huber_loss_by_hand():
    # Two quantiles at fractions 0.25 and 0.75 against two target quantiles. Quantile 0 (value 0): u = 1 gives
    # 0.25 * 0.5 * 1^2, u = 4 gives 0.25 * (4 - 0.5); quantile 1 (value 2): u = -1 gives |0.75 - 1| * 0.5,
    # u = 2 gives 0.75 * (2 - 0.5). Their mean over the four pairs: 2.25 / 4.
    quantiles = torch.tensor([[0.0, 2.0], [1.0, 1.0]])
    targets = torch.tensor([[1.0, 4.0], [1.0, 1.0]])     # the second sample's quantiles already exact: loss 0
    loss, per_sample = dqn.quantile_huber_loss(quantiles, targets)
    assert per_sample.tolist() == pytest.approx([0.5625, 0.0])
    assert loss.item() == pytest.approx(0.5625 / 2)
    weighted, _ = dqn.quantile_huber_loss(quantiles, targets, torch.tensor([0.5, 1.0]))
    assert weighted.item() == pytest.approx(0.5 * 0.5625 / 2)


def test_quantile_huber_loss_gradient_by_hand():
    # The example above: d Huber(u) / du is u clamped to [-1, 1], and du / d quantile = -1. Quantile 0 (tau 0.25,
    # u = 1 and 4): -(0.25 * 1 + 0.25 * 1); quantile 1 (tau 0.75, u = -1 and 2): -(0.25 * -1 + 0.75 * 1); each over
    # the 4 pairs and the 2 samples. The second sample's u are all 0: no gradient.
    quantiles = torch.tensor([[0.0, 2.0], [1.0, 1.0]], requires_grad=True)
    targets = torch.tensor([[1.0, 4.0], [1.0, 1.0]])
    loss, _ = dqn.quantile_huber_loss(quantiles, targets)
    loss.backward()
    assert quantiles.grad.tolist() == [pytest.approx([-0.0625, -0.0625]), [0.0, 0.0]]


def _quantile_huber_loss_by_autograd(quantiles, targets, weights):
    """The loss as the QR-DQN paper writes it, differentiated by autograd: what the closed-form gradient must match."""
    tau = dqn.quantile_fractions(quantiles.shape[1])[None, :, None]
    u = targets[:, None, :] - quantiles[:, :, None]
    huber = torch.where(u.abs() <= 1, 0.5 * u ** 2, u.abs() - 0.5)
    per_sample = ((tau - (u.detach() < 0).float()).abs() * huber).mean(dim=(1, 2))
    return (per_sample if weights is None else per_sample * weights).mean(), per_sample.detach()


@pytest.mark.parametrize("weighted", [False, True])
def test_quantile_huber_loss_matches_autograd_of_its_formula(weighted):
    generator = torch.Generator().manual_seed(0)
    quantiles = (3 * torch.randn(16, 8, generator=generator)).requires_grad_()
    targets = 3 * torch.randn(16, 12, generator=generator)   # N' != N: the target may have other quantiles
    targets[0, :8] = quantiles.detach()[0]                    # u = 0 exactly: the indicator's edge
    weights = torch.rand(16, generator=generator) if weighted else None
    loss, per_sample = dqn.quantile_huber_loss(quantiles, targets, weights)
    expected, expected_per_sample = _quantile_huber_loss_by_autograd(quantiles, targets, weights)
    assert torch.allclose(loss, expected, rtol=1e-6, atol=0)
    assert torch.allclose(per_sample, expected_per_sample, rtol=1e-6, atol=0)
    gradient, = torch.autograd.grad(loss, quantiles)
    expected_gradient, = torch.autograd.grad(expected, quantiles)
    assert torch.allclose(gradient, expected_gradient, rtol=1e-5, atol=1e-9)
    assert not per_sample.requires_grad


def test_minimizing_the_quantile_huber_loss_finds_the_quantiles_of_the_targets():
    """Against samples of a uniform distribution on [0, 100], each of 5 quantiles trained by gradient descent settles
    near its fraction's quantile, 100 tau (within the Huber loss's quadratic band of 1), in order."""
    generator = torch.Generator().manual_seed(0)
    quantiles = torch.full((1, 5), 50.0, requires_grad=True)
    optimizer = torch.optim.Adam([quantiles], lr=0.5)
    for _ in range(3000):
        targets = torch.rand(1, 64, generator=generator) * 100
        loss, _ = dqn.quantile_huber_loss(quantiles, targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    expected = 100 * dqn.quantile_fractions(5)
    assert quantiles.detach()[0].tolist() == pytest.approx(expected.tolist(), abs=3.0)


def test_beta_is_annealed_to_one_over_the_run():
    assert dqn.beta_schedule(0, 0.4, 1000, 11000) == pytest.approx(0.4)
    assert dqn.beta_schedule(6000, 0.4, 1000, 11000) == pytest.approx(0.7)
    assert dqn.beta_schedule(20000, 0.4, 1000, 11000) == pytest.approx(1.0)


def test_a_linear_schedule_holds_then_moves_linearly_then_holds():
    assert dqn.linear_schedule(5000, 1e-3, None, 0, 100) == 1e-3
    assert dqn.linear_schedule(50, 1e-3, 1e-4, 100, 300) == pytest.approx(1e-3)
    assert dqn.linear_schedule(200, 1e-3, 1e-4, 100, 300) == pytest.approx(5.5e-4)
    assert dqn.linear_schedule(900, 1e-3, 1e-4, 100, 300) == pytest.approx(1e-4)
    # A run whose end (the decay's end, where it is the run's) comes before the decay's start never decays, also
    # in the updates it makes past its total.
    assert dqn.linear_schedule(20_100, 1e-3, 1e-4, 1_500_000, 20_000) == 1e-3
    assert dqn.linear_schedule(20_100, 1e-3, 1e-4, 20_000, 20_000) == 1e-3


def test_apex_epsilons():
    eps = dqn.apex_epsilons(num_envs=8, first=0, count=8)
    assert eps[0] == pytest.approx(0.4) and eps[7] == pytest.approx(0.4 ** 8) and eps[3] == pytest.approx(0.4 ** 4)
    assert torch.equal(dqn.apex_epsilons(8, first=4, count=4), eps[4:])   # a second collector's share
    assert dqn.apex_epsilons(num_envs=1, first=0, count=1).tolist() == pytest.approx([0.4])


def test_linear_epsilon():
    assert dqn.linear_epsilon(0, 1.0, 0.01, 100) == 1.0
    assert dqn.linear_epsilon(50, 1.0, 0.01, 100) == pytest.approx(0.505)
    assert dqn.linear_epsilon(10_000, 1.0, 0.01, 100) == pytest.approx(0.01)
    floors = torch.tensor([0.4, 0.1, 0.0])   # per-env floors: each env decays to its own
    assert dqn.linear_epsilon(50, 1.0, floors, 100).tolist() == pytest.approx([0.7, 0.55, 0.5])
    assert dqn.linear_epsilon(100, 1.0, floors, 100).tolist() == pytest.approx(floors.tolist())


def test_select_actions_is_greedy_at_zero_and_uniform_at_one():
    generator = torch.Generator().manual_seed(0)
    q = torch.tensor([[0.0, 1.0, 0.0, 0.0]]).expand(10_000, 4)
    assert (dqn.select_actions(q, torch.zeros(10_000), generator) == 1).all()
    counts = torch.bincount(dqn.select_actions(q, torch.ones(10_000), generator), minlength=4)
    assert ((counts - 2500).abs() < 200).all(), counts   # 4 sigma of Binomial(10000, 1/4)
    mixed = dqn.select_actions(q, torch.tensor([0.0, 1.0]).repeat(5_000), generator)
    assert (mixed[0::2] == 1).all() and (mixed[1::2] != 1).any()
