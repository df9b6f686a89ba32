"""The Q-network: the dueling head's composition, bfloat16 compute that keeps small action gaps, scaled inputs."""

from __future__ import annotations

import torch

from rl_dqn.network import QNetwork


def test_dueling_q_is_value_plus_centred_advantage():
    torch.manual_seed(0)
    net = QNetwork((4, 84, 84), 6, dueling=True)
    obs = torch.randint(0, 255, (5, 4, 84, 84), dtype=torch.uint8)
    with torch.no_grad():
        features = net.torso(obs.float() / 255.0)
        value = net.value(net.value_hidden(features))
        advantage = net.head(net.head_hidden(features))
        q = net(obs)
    assert q.shape == (5, 6)
    torch.testing.assert_close(q, value + advantage - advantage.mean(1, keepdim=True))


def test_mixed_precision_keeps_float32_parameters_and_gradients():
    torch.manual_seed(0)
    net = QNetwork((4, 84, 84), 6, precision="bf16")
    reference = QNetwork((4, 84, 84), 6)
    reference.load_state_dict(net.state_dict())
    obs = torch.randint(0, 255, (8, 4, 84, 84), dtype=torch.uint8)
    q = net(obs)
    assert q.dtype == torch.float32
    q.sum().backward()
    assert all(p.dtype == torch.float32 and p.grad is not None and p.grad.dtype == torch.float32
               for p in net.parameters())
    with torch.no_grad():
        torch.testing.assert_close(q.detach(), reference(obs), atol=2e-3, rtol=2e-2)


def test_mixed_precision_keeps_an_action_gap_far_below_bfloat16_resolution():
    # Q = 10 and 10.002: bfloat16 (8 significant bits) rounds both to 10; the float32 output layer keeps them apart.
    for dueling in (False, True):
        net = QNetwork((4,), 2, mlp_hidden=(16,), dueling=dueling, precision="bf16")
        with torch.no_grad():
            net.head.weight.zero_()
            net.head.bias.copy_(torch.tensor([10.0, 10.002]))
            if dueling:
                net.value.weight.zero_()
                net.value.bias.fill_(3.0)
        q = net(torch.randn(3, 4))
        assert q.argmax(1).tolist() == [1, 1, 1]
        torch.testing.assert_close(q[:, 1] - q[:, 0], torch.full((3,), 0.002), atol=1e-5, rtol=0)


def test_inputs_scale_frames_once_in_the_compute_dtype_and_pass_their_own_result_through():
    obs = torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)
    for precision in ("fp32", "bf16"):
        net = QNetwork((4, 84, 84), 6, precision=precision)
        x = net.inputs(obs)
        assert x.dtype == net.compute_dtype
        assert torch.equal(x, (obs.float() / 255.0).to(net.compute_dtype))
        assert net.inputs(x) is x
        with torch.no_grad():
            assert torch.equal(net(x), net(obs))
    vector = QNetwork((4,), 2, mlp_hidden=(16,), precision="bf16")
    assert vector.inputs(torch.ones(2, 4, dtype=torch.float64)).dtype == torch.float32


def test_a_network_for_acting_stores_bfloat16_weights_and_gives_the_same_q_values():
    torch.manual_seed(0)
    obs = torch.randint(0, 256, (8, 4, 84, 84), dtype=torch.uint8)
    for dueling in (False, True):
        trained = QNetwork((4, 84, 84), 6, dueling=dueling, precision="bf16")
        acting = QNetwork((4, 84, 84), 6, dueling=dueling, precision="bf16").for_acting()
        acting.load_state_dict(trained.state_dict())
        assert not acting.training
        hidden = [acting.torso, acting.head_hidden, *([acting.value_hidden] if dueling else [])]
        assert {p.dtype for layer in hidden for p in layer.parameters()} == {torch.bfloat16}
        assert acting.head.weight.dtype == torch.float32
        with torch.no_grad():
            assert torch.equal(acting(obs), trained(obs))
