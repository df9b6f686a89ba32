"""The trainer's update in its two forms: eager, and on static buffers (what a CUDA graph captures and replays on a
GPU). Both must compute the same losses, gradients, priorities and weights from the same replay."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from envs import EnvSpec
from rl_dqn.config import load_config
from rl_dqn.trainer import Trainer
from rl_dqn.types import Chunk

ROOT = Path(__file__).resolve().parents[1]
PONG = EnvSpec(obs_shape=(4, 84, 84), obs_dtype=torch.uint8, num_actions=6)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def pong_config(*overrides: str):
    """configs/pong_cpu.yaml's learner (the NIPS torso with its LayerNorm, prioritized 10-step replay) at a small
    scale, with a target refresh every 5 updates so that a few updates cross one. Its learning rate, 2^-10, is
    the same number as a float and as the float32 tensor that the static form's Adam reads."""
    return load_config(ROOT / "configs/pong_cpu.yaml", [
        "run.name=t", "collectors.count=2", "env.envs_per_collector=4", "collectors.chunk_steps=64",
        "train.replay_capacity=4096", "train.learning_starts=256", "train.target_update_updates=5",
        "network.precision=fp32", "learner.overlap=false", "train.lr=0.0009765625", *overrides])


def filled(cfg, device: str, static: bool) -> Trainer:
    """A trainer whose replay holds the same random Pong-shaped chunks (episodes starting and ending in them)."""
    torch.manual_seed(0)
    trainer = Trainer(cfg, PONG, torch.device(device), static=static)
    generator = torch.Generator().manual_seed(1)
    T, E = cfg.collectors.chunk_steps, cfg.env.envs_per_collector
    for seq in range(3):
        for collector in range(cfg.num_collectors):
            first = torch.rand(T, E, generator=generator) < 0.02
            first[0] = seq == 0
            chunk = Chunk(collector, seq, 0, torch.randint(0, 255, (T, E, 84, 84), dtype=torch.uint8,
                                                           generator=generator),
                          torch.randint(0, 6, (T, E), generator=generator),
                          torch.randn(T, E, generator=generator).sign(), torch.rand(T, E, generator=generator) < 0.02,
                          first, torch.zeros(0, dtype=torch.float64), torch.zeros(0, dtype=torch.int64),
                          torch.zeros(T, E), torch.zeros(T, E))
            trainer.replay.extend(collector * E, chunk)
    return trainer


def run(trainer: Trainer, updates: int) -> list[tuple[float, float]]:
    """Each update's loss and mean |TD error|, and the gradients of the last, as the trainer left them."""
    seen = []
    for _ in range(updates):
        update = trainer.step(env_steps=1000)
        seen.append((update.loss.item(), (update.q - update.targets).abs().mean().item()))
    return seen


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("overrides", [[], ["train.double=false", "train.prioritized=false", "eval.ema_updates=10"],
                                       ["network.precision=bf16"]], ids=["pong_cpu", "nature-uniform-ema", "bf16"])
def test_the_static_update_computes_what_the_eager_one_does(device, overrides):
    """Same replay, same seed: the update on static buffers (replayed as a CUDA graph on a GPU) and the eager one
    give the same losses and TD errors update after update, across a target refresh, and leave the same gradients,
    weights, Adam moments, priorities and moving average."""
    cfg = pong_config(*overrides)
    eager, static = filled(cfg, device, static=False), filled(cfg, device, static=True)
    assert static.static and not eager.static
    # On the CPU the two run the same kernels on the same numbers: bit for bit the same. A GPU may pick other
    # kernels inside a captured graph (in bfloat16 the rounding of those differs the most).
    tolerance = dict(rtol=0, atol=0) if device == "cpu" else \
        dict(rtol=2e-2, atol=2e-3) if "bf16" in str(overrides) else dict(rtol=1e-4, atol=1e-5)
    losses = run(eager, 12), run(static, 12)
    approx = dict(rel=tolerance["rtol"], abs=tolerance["atol"])
    assert [x for pair in losses[0] for x in pair] == pytest.approx([x for pair in losses[1] for x in pair], **approx)
    assert len({loss for loss, _ in losses[0]}) > 6   # the updates learn: each loss differs
    pairs = [(a.grad, b.grad) for a, b in zip(eager.network.parameters(), static.network.parameters())]
    pairs += list(zip(eager.network.parameters(), static.network.parameters()))
    pairs += list(zip(eager.target.parameters(), static.target.parameters()))
    pairs += [(eager.optimizer.state[a][key], static.optimizer.state[b][key])
              for a, b in zip(eager.network.parameters(), static.network.parameters())
              for key in ("exp_avg", "exp_avg_sq", "step")]
    pairs += [(eager.replay.tree.levels[0], static.replay.tree.levels[0]),
              (eager.replay.max_priority, static.replay.max_priority)]
    if eager.averaged is not None:
        pairs += list(zip(eager.averaged, static.averaged))
    for a, b in pairs:
        torch.testing.assert_close(a.float(), b.float(), **tolerance)
    assert eager.mean_loss_and_q() == pytest.approx(static.mean_loss_and_q(), **approx)
    assert eager.lr == static.lr == cfg.train.lr


@pytest.mark.parametrize("device", DEVICES)
def test_a_checkpoint_moves_between_the_two_forms(device, tmp_path):
    """A static trainer's state (Adam's learning rate on the device) resumes an eager one and the other way round,
    each going on as the trainer that saved it does."""
    cfg = pong_config()
    for saver_static in (True, False):
        saver = filled(cfg, device, static=saver_static)
        run(saver, 3)
        torch.save(saver.state(), tmp_path / "state.pt")
        state = torch.load(tmp_path / "state.pt", map_location="cpu", weights_only=True)
        assert all(isinstance(g["lr"], float) and not g["capturable"] for g in state["optimizer"]["param_groups"])
        resumed = filled(cfg, device, static=not saver_static)
        resumed.replay.load_state_dict(saver.replay.state_dict())
        assert resumed.load_state(state, saver.updates)
        going_on, saved = run(resumed, 4), run(saver, 4)
        assert [x for pair in going_on for x in pair] == pytest.approx([x for pair in saved for x in pair],
                                                                       rel=1e-4, abs=1e-5)
        assert resumed.updates == saver.updates == 7


@pytest.mark.cuda
def test_the_graph_is_captured_once_and_again_after_a_resume():
    cfg = pong_config()
    trainer = filled(cfg, "cuda", static=True)
    run(trainer, 3)
    assert list(trainer._graphs) == [cfg.train.n_step]
    graph = trainer._graphs[cfg.train.n_step][0]
    run(trainer, 3)
    assert trainer._graphs[cfg.train.n_step][0] is graph
    trainer.load_state(trainer.state(), trainer.updates)
    assert not trainer._graphs
    run(trainer, 2)
    assert trainer._graphs and trainer._graphs[cfg.train.n_step][0] is not graph


@pytest.mark.cuda
def test_an_update_that_cannot_be_captured_runs_eagerly_and_says_why():
    """network.frame_offset=background counts each frame's pixel values with bincount, which reads its size back to
    the host: not in a CUDA graph. The trainer trains on, eagerly, with Adam reading a float learning rate."""
    trainer = filled(pong_config("network.frame_offset=background"), "cuda", static=True)
    losses = run(trainer, 4)
    assert not trainer.static and trainer.capture_error, trainer.capture_error
    assert trainer.updates == 4 and all(torch.isfinite(torch.tensor(losses)).flatten())
    assert all(isinstance(g["lr"], float) for g in trainer.optimizer.param_groups)
