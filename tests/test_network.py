"""The Q-network: the torsos, the dueling head's composition, bfloat16 compute that keeps small action gaps, scaled
channels-last inputs, and the precision `auto` picks for a device."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rl_dqn.config import ConfigError, NetworkConfig, from_dict, load_config, to_dict
from rl_dqn.evaluate import load_player
from rl_dqn.network import QNetwork, background, channels_last_copy, describe_precision, resolve_precision

ROOT = Path(__file__).resolve().parents[1]


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


@pytest.mark.parametrize("dueling", [False, True])
def test_a_quantile_head_gives_n_quantiles_per_action_and_acts_on_their_mean(dueling):
    torch.manual_seed(0)
    net = QNetwork((4, 84, 84), 6, dueling=dueling, quantiles=8)
    obs = torch.randint(0, 255, (5, 4, 84, 84), dtype=torch.uint8)
    with torch.no_grad():
        quantiles = net.quantile_values(obs)
        q = net(obs)
        features = net.torso(obs.float() / 255.0)
        head = net.head(net.head_hidden(features)).view(5, 6, 8)
    assert net.head.out_features == 6 * 8 and quantiles.shape == (5, 6, 8)
    torch.testing.assert_close(q, quantiles.mean(dim=2))
    if dueling:   # each quantile of the state value, plus the advantages' quantile less their mean over actions
        value = net.value(net.value_hidden(features))
        assert value.shape == (5, 8)
        head = value[:, None] + head - head.mean(dim=1, keepdim=True)
    torch.testing.assert_close(quantiles, head, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="network.quantiles=0"):
        QNetwork((4, 84, 84), 6).quantile_values(obs)


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


def test_inputs_convert_frames_once_in_the_compute_dtype_and_pass_their_own_result_through():
    obs = torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)
    for precision in ("fp32", "bf16"):
        net = QNetwork((4, 84, 84), 6, precision=precision)
        x = net.inputs(obs)
        assert x.dtype == net.compute_dtype
        assert torch.equal(x.float(), obs.float())   # pixel values, exact: the first layer scales them
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
            # The same values up to the order of bfloat16 sums: oneDNN may pick another convolution algorithm for
            # the acting network's plain layout than for the trained one's channels-last (it does on CPUs that
            # compute bfloat16 natively), so the last bit of Q can differ; other weights would differ by ~Q itself.
            want = trained(obs)
            torch.testing.assert_close(acting(obs), want, rtol=0, atol=0.02 * want.abs().max().item())


def test_the_torsos_are_the_papers_layers():
    for torso, convolutions, hidden in (("nature", [(4, 32, 8, 4), (32, 64, 4, 2), (64, 64, 3, 1)], (3136, 512)),
                                        ("nips", [(4, 16, 8, 4), (16, 32, 4, 2)], (2592, 256))):
        net = QNetwork((4, 84, 84), 6, torso=torso)
        convs = [m for m in net.torso if isinstance(m, torch.nn.Conv2d)]
        assert [(c.in_channels, c.out_channels, c.kernel_size[0], c.stride[0]) for c in convs] == convolutions
        linear = net.head_hidden[0]
        assert (linear.in_features, linear.out_features) == hidden
        assert net(torch.zeros(3, 4, 84, 84, dtype=torch.uint8)).shape == (3, 6)


def test_a_trained_network_is_channels_last_an_acting_one_plain_and_both_give_the_plain_layouts_values():
    torch.manual_seed(0)
    obs = torch.randint(0, 256, (8, 4, 84, 84), dtype=torch.uint8)
    for torso in ("nature", "nips"):
        net = QNetwork((4, 84, 84), 6, torso=torso)
        assert net.inputs(obs).is_contiguous(memory_format=torch.channels_last)
        assert all(m.weight.is_contiguous(memory_format=torch.channels_last) for m in net.torso
                   if isinstance(m, torch.nn.Conv2d))
        acting = QNetwork((4, 84, 84), 6, torso=torso).for_acting()
        acting.load_state_dict(net.state_dict())
        assert not acting.inputs(obs).is_contiguous(memory_format=torch.channels_last)
        assert all(m.weight.is_contiguous() for m in acting.torso if isinstance(m, torch.nn.Conv2d))
        x = obs.float() / 255.0
        for layer in net.torso:   # the same layers on plain (NCHW) tensors
            x = torch.nn.functional.conv2d(x.contiguous(), layer.weight.contiguous(), layer.bias, layer.stride) \
                if isinstance(layer, torch.nn.Conv2d) else layer(x)
        with torch.no_grad():
            plain = net.head(net.head_hidden(x))
            torch.testing.assert_close(net(obs), plain, atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(acting(obs), plain, atol=1e-5, rtol=1e-4)
        # A state dict in the plain layout loads into it, and its own loads into a plain copy.
        other = QNetwork((4, 84, 84), 6, torso=torso)
        other.load_state_dict({k: v.contiguous() for k, v in net.state_dict().items()})
        with torch.no_grad():
            assert torch.equal(other(obs), net(obs))


def test_the_configs_network_trains_channels_last_in_either_precision_with_the_plain_layouts_values():
    torch.manual_seed(0)
    obs = torch.randint(0, 256, (8, 4, 84, 84), dtype=torch.uint8)
    for dtype in (torch.float32, torch.bfloat16):
        converted = channels_last_copy(obs, dtype)
        assert converted.is_contiguous(memory_format=torch.channels_last) and converted.dtype == dtype
        assert torch.equal(converted, obs.to(dtype))
    networks = {precision: QNetwork.for_env((4, 84, 84), 6, NetworkConfig(torso="nips", precision=precision), "cpu")
                for precision in ("fp32", "bf16")}
    for network in networks.values():
        assert network.inputs(obs).is_contiguous(memory_format=torch.channels_last)
        assert all(m.weight.is_contiguous(memory_format=torch.channels_last) for m in network.torso
                   if isinstance(m, torch.nn.Conv2d))
    plain = QNetwork((4, 84, 84), 6, precision="bf16", torso="nips").set_layout(channels_last=False)
    plain.load_state_dict(networks["bf16"].state_dict())
    assert not plain.inputs(obs).is_contiguous(memory_format=torch.channels_last)
    for network in (networks["bf16"], plain):   # the same values and gradients, up to bfloat16's rounding
        network(obs).square().mean().backward()
    torch.testing.assert_close(networks["bf16"](obs), plain(obs), atol=0.02, rtol=0.02)
    for (name, trained), (_, other) in zip(networks["bf16"].named_parameters(), plain.named_parameters()):
        torch.testing.assert_close(trained.grad.contiguous(), other.grad, atol=2e-3, rtol=0.05, msg=name)
    # The learner's target network acts on the inputs it converts for the online network: in the same layout.
    target = QNetwork.for_env((4, 84, 84), 6, NetworkConfig(torso="nips", precision="bf16"), "cpu")
    target.load_state_dict(networks["bf16"].state_dict())
    target = target.for_acting(channels_last=True)
    assert target.channels_last and not target.training
    with torch.no_grad():
        want = networks["bf16"](obs)
        torch.testing.assert_close(target(networks["bf16"].inputs(obs)), want, rtol=0,
                                   atol=0.02 * want.abs().max().item())


def test_frame_offsets_take_half_or_each_observations_background_off_and_a_checkpoint_keeps_the_setting(tmp_path):
    torch.manual_seed(0)
    obs = torch.randint(0, 256, (8, 4, 84, 84), dtype=torch.uint8)
    obs[:4, :, 20:] = 87    # a Pong-grey background under most of the newest frame
    obs[4:, :, 30:] = 0     # a black one
    obs[7, -1, :50] = 142   # the newest frame is what counts: its most common value is 142 (50 rows against 34)
    expected_background = torch.tensor([87] * 4 + [0] * 3 + [142], dtype=torch.float32).view(8, 1, 1, 1)
    assert torch.equal(background(obs).float(), expected_background)
    assert background(obs[0]).shape == (1, 1, 1)   # one observation, unbatched
    offsets = {"none": 0.0, "half": 0.5, "background": expected_background / 255}
    for precision in ("fp32", "bf16"):
        networks = {offset: QNetwork.for_env((4, 84, 84), 6, NetworkConfig(torso="nips", precision=precision,
                                                                           frame_offset=offset), "cpu")
                    for offset in offsets}
        for offset, network in networks.items():
            acting = QNetwork((4, 84, 84), 6, precision=precision, torso="nips", frame_offset=offset).for_acting()
            acting.load_state_dict(network.state_dict())
            # What the network computes: the plain layers in float32 on frames scaled to [0, 1] less the offset.
            reference = QNetwork((4, 84, 84), 6, torso="nips").set_layout(channels_last=False)
            reference.load_state_dict(network.state_dict())
            with torch.no_grad():
                want = reference.head(reference.head_hidden(reference.torso(obs.float() / 255 - offsets[offset])))
            for net in (network, acting):
                inputs = net.inputs(obs)   # pixel values less each observation's background, exact
                assert inputs.dtype == net.compute_dtype
                want_inputs = obs.float() - (expected_background if offset == "background" else 0)
                assert torch.equal(inputs.float(), want_inputs)
                with torch.no_grad():
                    tolerance = 1e-5 if precision == "fp32" else 0.02 * want.abs().max().item()
                    torch.testing.assert_close(net(obs), want, rtol=0, atol=tolerance)
        for offset in ("half", "background"):   # the same weights see other inputs
            networks[offset].load_state_dict(networks["none"].state_dict())
            assert not torch.allclose(networks[offset](obs), networks["none"](obs))
    with pytest.raises(ValueError, match="frame_offset must be none, half or background"):
        QNetwork((4, 84, 84), 6, frame_offset="mean")
    cfg = load_config(ROOT / "configs/pong_cpu.yaml", ["network.frame_offset=background"])
    trained = QNetwork.for_env((4, 84, 84), 6, cfg.network, "cpu")
    checkpoint = tmp_path / "checkpoint.pt"
    torch.save({"config": to_dict(cfg), "spec": {"obs_shape": [4, 84, 84], "num_actions": 6},
                "network": trained.state_dict()}, checkpoint)
    _, player = load_player(checkpoint)
    assert player.frame_offset == "background"
    torch.testing.assert_close(player(obs), trained.for_acting()(obs))


def test_layer_norm_normalizes_each_hidden_dense_layer_before_its_relu_and_a_checkpoint_keeps_the_setting(tmp_path):
    torch.manual_seed(0)
    obs = torch.randint(0, 256, (8, 4, 84, 84), dtype=torch.uint8)
    cfg = load_config(ROOT / "configs/pong_cpu.yaml", ["network.norm=layer", "network.precision=fp32"])
    net = QNetwork.for_env((4, 84, 84), 6, cfg.network, "cpu")
    linear, norm, relu = net.head_hidden
    assert isinstance(norm, torch.nn.LayerNorm) and norm.normalized_shape == (256,) and isinstance(relu, torch.nn.ReLU)
    assert not any(isinstance(m, torch.nn.LayerNorm) for m in net.torso)   # the convolutions stay plain
    with torch.no_grad():
        norm.weight.uniform_(0.5, 2.0)
        norm.bias.uniform_(-0.5, 0.5)
        pre = linear(net.torso(obs.float() / 255 - 0.5))   # pong_cpu.yaml's frames, centred on 0.5
        normalized = (pre - pre.mean(1, keepdim=True)) / torch.sqrt(pre.var(1, unbiased=False, keepdim=True) + 1e-5)
        torch.testing.assert_close(net(obs), net.head(torch.relu(normalized * norm.weight + norm.bias)))
    vector = QNetwork((4,), 2, mlp_hidden=(16, 8), norm="layer")
    assert [m.normalized_shape for m in vector.torso if isinstance(m, torch.nn.LayerNorm)] == [(16,), (8,)]
    assert len([m for m in QNetwork((4,), 2, mlp_hidden=(16, 8)).torso if isinstance(m, torch.nn.LayerNorm)]) == 0
    # bfloat16 for acting, the same Q as the trained network up to its rounding; a checkpoint keeps the setting.
    trained = QNetwork.for_env((4, 84, 84), 6, load_config(ROOT / "configs/pong_cpu.yaml",
                                                           ["network.norm=layer", "network.precision=bf16"]).network,
                               "cpu")
    checkpoint = tmp_path / "checkpoint.pt"
    torch.save({"config": to_dict(load_config(ROOT / "configs/pong_cpu.yaml", ["network.norm=layer"])),
                "spec": {"obs_shape": [4, 84, 84], "num_actions": 6}, "network": trained.state_dict()}, checkpoint)
    _, player = load_player(checkpoint)
    assert isinstance(player.head_hidden[1], torch.nn.LayerNorm)
    with torch.no_grad():
        want = trained(obs)
        torch.testing.assert_close(player(obs), want, rtol=0, atol=0.03 * want.abs().max().item())
    with pytest.raises(ValueError, match="norm must be none or layer"):
        QNetwork((4, 84, 84), 6, norm="batch")
    with pytest.raises(ConfigError, match="network.norm: must be one of none, layer"):
        from_dict({"network": {"norm": "batch"}})


def test_the_key_centered_frames_of_earlier_configs_and_checkpoints_reads_as_frame_offset():
    assert from_dict({"network": {"centered_frames": True}}).network.frame_offset == "half"
    assert from_dict({"network": {"centered_frames": False, "torso": "nips"}}).network.frame_offset == "none"
    with pytest.raises(ConfigError, match="network.centered_frames: must be true or false"):
        from_dict({"network": {"centered_frames": "yes"}})
    with pytest.raises(ConfigError, match="network.frame_offset: must be one of none, half, background"):
        from_dict({"network": {"frame_offset": "mean"}})


# How network.precision resolves on the CPU, in a process of its own with the CPU features PyTorch may use narrowed
# by environment variables (as on a laptop with AVX2 only).
_PRECISION = """
from rl_dqn.network import describe_precision, resolve_precision
print(resolve_precision("auto", "cpu"), resolve_precision("fp32", "cpu"), resolve_precision("bf16", "cpu"))
print(describe_precision("auto", "cpu")[0])
print(describe_precision("bf16", "cpu")[1])
"""


@pytest.mark.slow   # three fresh interpreters
def test_auto_precision_is_float32_on_a_cpu_without_fast_bfloat16_and_an_explicit_bf16_warns():
    for narrowed, shown in (({"ATEN_CPU_CAPABILITY": "avx2"}, "PyTorch uses AVX2 on this CPU"),
                            ({"ONEDNN_MAX_CPU_ISA": "AVX2"}, "ONEDNN_MAX_CPU_ISA=AVX2"),
                            ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE", "ATEN_CPU_CAPABILITY": "avx512"},
                             "ONEDNN_MAX_CPU_ISA=AVX512_CORE")):
        env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")}
        env |= narrowed | {"PYTHONPATH": str(ROOT)}
        lines = subprocess.run([sys.executable, "-c", _PRECISION], cwd=ROOT, env=env, capture_output=True, text=True,
                               check=True).stdout.splitlines()
        assert lines[0] == "fp32 fp32 bf16", narrowed
        assert lines[1] == f"fp32 (network.precision=auto: {shown})"
        assert shown in lines[2] and "set network.precision=auto or fp32" in lines[2]


def test_auto_precision_on_this_cpu_follows_its_bfloat16_instructions():
    flags = set(Path("/proc/cpuinfo").read_text().split())
    fast = bool(flags & {"avx512_bf16", "amx_bf16"}) and not os.environ.get("ATEN_CPU_CAPABILITY") \
        and not os.environ.get("ONEDNN_MAX_CPU_ISA")
    assert resolve_precision("auto", "cpu") == ("bf16" if fast else "fp32")
    assert describe_precision("auto", "cpu")[1] is None and describe_precision("fp32", "cpu") == ("fp32", None)
    assert (describe_precision("bf16", "cpu")[1] is None) == fast
