"""The DQN math on hand-made tensors."""

from __future__ import annotations

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


def test_beta_is_annealed_to_one_over_the_run():
    assert dqn.beta_schedule(0, 0.4, 1000, 11000) == pytest.approx(0.4)
    assert dqn.beta_schedule(6000, 0.4, 1000, 11000) == pytest.approx(0.7)
    assert dqn.beta_schedule(20000, 0.4, 1000, 11000) == pytest.approx(1.0)


def test_a_linear_schedule_holds_then_moves_linearly_then_holds():
    assert dqn.linear_schedule(5000, 1e-3, None, 0, 100) == 1e-3
    assert dqn.linear_schedule(50, 1e-3, 1e-4, 100, 300) == pytest.approx(1e-3)
    assert dqn.linear_schedule(200, 1e-3, 1e-4, 100, 300) == pytest.approx(5.5e-4)
    assert dqn.linear_schedule(900, 1e-3, 1e-4, 100, 300) == pytest.approx(1e-4)


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
