"""The trainer: updates that learn a known answer (the two-step chain), its schedules (beta, learning rate, n-step),
the target network, preparing batches beside training, and its update in its two forms, eager and on static buffers
(what a CUDA graph captures and replays on a GPU), which must compute the same losses, gradients, priorities and
weights from the same replay."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from chain import S0, S1, chain_chunk, make_learner

from envs import EnvSpec
from rl_dqn import dqn
from rl_dqn.config import load_config
from rl_dqn.trainer import Trainer, torch_threads
from rl_dqn.types import Chunk

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import meta_device  # noqa: E402  (benchmarks/meta_device.py)
PONG = EnvSpec(obs_shape=(4, 84, 84), obs_dtype=torch.uint8, num_actions=6)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


@pytest.fixture(autouse=True)
def deterministic_convolutions(monkeypatch):
    """Two trainers compared update by update on a GPU: cuDNN's default convolution kernels may sum a gradient in
    another order each time, and in bfloat16 one rounding step of a weight moves the priorities enough for a later
    batch to draw other transitions. Its deterministic kernels keep a difference to the two forms' own."""
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)


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
                                       ["network.precision=bf16"], ["network.quantiles=8"],
                                       ["network.quantiles=8", "train.double=false", "train.munchausen_alpha=0.9"]],
                         ids=["pong_cpu", "nature-uniform-ema", "bf16", "quantiles", "munchausen"])
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
    assert static.static, static.capture_error   # the capture held
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


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fails", [False, True], ids=["warm-up", "failed warm-up"])
def test_the_warm_up_before_a_capture_changes_nothing_and_keeps_no_autograd_history(device, fails, monkeypatch):
    """The three updates run before a capture leave every tensor an update writes as it was (also when one of them
    fails), so the updates after it are those of a trainer that never warmed up. While they run, nothing made
    before them holds autograd history: a parameter's copy that did would bind its gradient accumulator to the
    stream the copy was made on, which a capture on another stream cannot hold."""
    import gc
    cfg = pong_config("eval.ema_updates=10")
    warmed, cold = filled(cfg, device, static=True), filled(cfg, device, static=True)
    run(warmed, 2), run(cold, 2)
    before = [t.detach().clone() for t in warmed._written_by_update()]
    body, bodies = warmed._graph_body, []

    def counted_body(n_step):
        bodies.append([o for o in gc.get_objects() if issubclass(type(o), torch.Tensor) and o.grad_fn is not None])
        if fails and len(bodies) == 2:
            raise RuntimeError("an operation a graph cannot hold")
        return body(n_step)

    monkeypatch.setattr(warmed, "_graph_body", counted_body)
    n_step = warmed._graph_inputs(cfg.train.lr)
    if fails:
        with pytest.raises(RuntimeError, match="cannot hold"):
            warmed._warm_up(n_step)
    else:
        warmed._warm_up(n_step)
    assert len(bodies) == (2 if fails else 3) and all(alive == [] for alive in bodies)
    for tensor, value in zip(warmed._written_by_update(), before, strict=True):
        torch.testing.assert_close(tensor, value, rtol=0, atol=0)
    monkeypatch.undo()
    warmed.generator.set_state(cold.generator.get_state())   # the warm-up's offsets were drawn from it
    warmed_losses, cold_losses = run(warmed, 3), run(cold, 3)
    assert [x for pair in warmed_losses for x in pair] == pytest.approx([x for pair in cold_losses for x in pair],
                                                                        rel=0 if device == "cpu" else 1e-4)


@pytest.mark.cuda
def test_the_graph_is_captured_once_and_again_after_a_resume():
    cfg = pong_config()
    trainer = filled(cfg, "cuda", static=True)
    run(trainer, 3)
    assert list(trainer._graphs) == [cfg.train.n_step], trainer.capture_error
    graph = trainer._graphs[cfg.train.n_step][0]
    run(trainer, 3)
    assert trainer._graphs[cfg.train.n_step][0] is graph
    trainer.load_state(trainer.state(), trainer.updates)
    assert not trainer._graphs
    run(trainer, 2)
    assert trainer._graphs and trainer._graphs[cfg.train.n_step][0] is not graph


def test_why_a_capture_failed_is_one_line_naming_the_line_that_raised_it():
    """What the learner's warning prints when the update cannot be captured: the error's type, its message's first
    line and where in this package it was raised."""
    import re

    from rl_dqn.trainer import _described
    trainer = filled(pong_config(), "cpu", static=True)
    with pytest.raises(ValueError) as raised:
        trainer.replay.sample_at(torch.zeros(4, dtype=torch.float64), 0.5, n_step=99)
    told = _described(raised.value)
    assert re.fullmatch(r"ValueError: n-step returns of 99 steps: must be from 1 to the memory's n_step \(10\) "
                        r"\(at rl_dqn/replay\.py:\d+\)", told), told


@pytest.mark.cuda
def test_an_update_that_cannot_be_captured_runs_eagerly_says_why_and_the_next_capture_holds(monkeypatch):
    """An update that reads a value back to the host cannot be captured: the trainer trains on, eagerly, with Adam
    reading a float learning rate, and names the operation that failed, not the capture's end. The failed capture
    leaves the thread on its own stream and the caching allocator out of the capture, so that another trainer in
    the process then captures its update (with network.frame_offset=background, whose histogram is counted on the
    device) and computes what an eager one does."""
    trainer = filled(pong_config(), "cuda", static=True)
    body = trainer._graph_body
    monkeypatch.setattr(trainer, "_graph_body", lambda n_step: (trainer._beta.item(), body(n_step))[1])
    losses = run(trainer, 4)
    assert not trainer.static and trainer.capture_error, trainer.capture_error
    assert "previous error during capture" not in trainer.capture_error, trainer.capture_error
    assert trainer.updates == 4 and all(torch.isfinite(torch.tensor(losses)).flatten())
    assert all(isinstance(g["lr"], float) for g in trainer.optimizer.param_groups)
    assert torch.cuda.current_stream() == torch.cuda.default_stream()
    cfg = pong_config("network.frame_offset=background")
    eager, static = filled(cfg, "cuda", static=False), filled(cfg, "cuda", static=True)
    losses = run(eager, 6), run(static, 6)
    assert static.static and static._graphs, static.capture_error
    assert [x for pair in losses[0] for x in pair] == pytest.approx([x for pair in losses[1] for x in pair],
                                                                    rel=1e-4, abs=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_the_static_update_follows_the_schedules_and_the_replay_as_they_change(device):
    """Between updates the learner puts chunks into the replay and its schedules move with the env steps: the
    learning rate, beta and the n of the n-step returns (a graph for each n). The static update, which reads them
    from tensors written in place before each replay, computes what the eager one does all the way."""
    cfg = pong_config("train.lr_end=0.00048828125", "train.lr_decay_start_env_steps=1000",
                      "train.lr_decay_end_env_steps=7000", "train.n_step_end=6",
                      "train.n_step_decay_start_env_steps=1000", "train.n_step_decay_end_env_steps=7000",
                      "train.priority_beta_env_steps=7000")
    eager, static = filled(cfg, device, static=False), filled(cfg, device, static=True)
    generator = torch.Generator().manual_seed(2)
    T, E = cfg.collectors.chunk_steps, cfg.env.envs_per_collector
    seen = ([], [])
    for i in range(14):
        if i % 3 == 2:   # the same new chunk into both replays
            chunk = Chunk(0, 3 + i, 0, torch.randint(0, 255, (T, E, 84, 84), dtype=torch.uint8, generator=generator),
                          torch.randint(0, 6, (T, E), generator=generator),
                          torch.randn(T, E, generator=generator).sign(), torch.rand(T, E, generator=generator) < 0.02,
                          torch.zeros(T, E, dtype=torch.bool), torch.zeros(0, dtype=torch.float64),
                          torch.zeros(0, dtype=torch.int64), torch.zeros(T, E), torch.zeros(T, E))
            for trainer in (eager, static):
                trainer.replay.extend(0, chunk)
        for trainer, losses in zip((eager, static), seen):
            update = trainer.step(env_steps=1000 + 500 * i)
            losses.append((update.loss.item(), (update.q - update.targets).abs().mean().item(), trainer.lr))
    assert static.static, static.capture_error
    n_steps = {round(dqn.linear_schedule(1000 + 500 * i, 10, 6, 1000, 7000)) for i in range(14)}
    assert len(n_steps) == 5 and (device == "cpu" or sorted(static._graphs) == sorted(n_steps))
    assert len({lr for _, _, lr in seen[0]}) > 10
    assert [x for row in seen[0] for x in row] == pytest.approx([x for row in seen[1] for x in row],
                                                                rel=1e-4, abs=1e-5)
    for a, b in [*zip(eager.network.parameters(), static.network.parameters()),
                 (eager.replay.tree.levels[0], static.replay.tree.levels[0])]:
        torch.testing.assert_close(a.float(), b.float(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("overrides", [[], ["train.double=false", "train.prioritized=false", "eval.ema_updates=10"],
                                       ["network.quantiles=8"],
                                       ["network.quantiles=8", "train.double=false", "train.munchausen_alpha=0.9"],
                                       ["network.frame_offset=background", "network.torso=nature",
                                        "network.dueling=true"]],
                         ids=["pong_cpu", "nature-uniform-ema", "quantiles", "munchausen", "background-dueling"])
def test_the_update_a_cuda_graph_captures_stays_on_the_device_and_is_the_same_program_each_time(
        overrides, monkeypatch):
    """What a CUDA graph can hold, checked without a GPU: the static update (_graph_body(), what a GPU captures and
    replays) runs on the meta device, where an operation that reads a value back to the host (.item(), a tensor
    as a bool, nonzero, a mask) fails, and it touches no tensor on another device (a CPU tensor would be copied
    in once, at the capture, or its value frozen into the graph). Three updates whose learning rates and betas
    differ run the same operations on the same shapes with the same arguments (a number computed in Python from a
    schedule would be frozen into the graph too), and write in place the tensors that outlive them (one rebound
    instead would leave the trainer reading a graph's output that stops changing). bfloat16's autocast has no
    meta device; its casts stay on the device of what they cast."""
    cfg = pong_config("train.lr_end=0.00048828125", "train.lr_decay_start_env_steps=1000",
                      "train.lr_decay_end_env_steps=7000", "train.priority_beta_env_steps=7000", *overrides)
    trainer = filled(cfg, "cpu", static=True)
    run(trainer, 1)   # Adam's state, as the warm-up before a capture makes it
    meta_device.on_meta(trainer)
    body, programs, schedules = trainer._graph_body, [], []

    def recorded(n_step: int):
        written = [id(t) for t in trainer._written_by_update()]
        with meta_device.Operators() as program:
            update = body(n_step)
        assert [id(t) for t in trainer._written_by_update()] == written, "the update rebound a tensor it writes"
        programs.append(program)
        return update

    monkeypatch.setattr(trainer, "_graph_body", recorded)
    with meta_device.fused_adam_kernel():
        for env_steps in (1000, 4000, 7000):
            trainer.step(env_steps)
            schedules.append((trainer._lr_set, dqn.beta_schedule(env_steps, cfg.train.priority_beta,
                                                                 cfg.train.learning_starts, 7000)))
    assert len(set(schedules)) == 3
    assert all(program.elsewhere == [] for program in programs), programs[0].elsewhere[:3]
    for program in programs[1:]:
        changed = [(a, b) for a, b in zip(programs[0].ops, program.ops) if a != b]
        assert len(program.ops) == len(programs[0].ops) and not changed, changed[:3]
    assert any(op.startswith("aten._fused_adam_.tensor_lr") for op in programs[0].ops)   # the step is in it


def test_the_learner_benchmark_counts_the_captured_updates_operators_by_part():
    """benchmarks/learner.py --operators: per setup and batch, the kernels of the captured update on the meta device,
    each part of the update counted (the parts add up to the whole; the bfloat16 setups, which autocast cannot run
    there, are left out)."""
    out = subprocess.run([sys.executable, "benchmarks/learner.py", "--operators", "--only", "NIPS, PER, 10-step",
                          "--batches", "32,64", "--replay", "20000"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = [line.split() for line in out.stdout.splitlines() if line.startswith("  NIPS")]
    assert [(row[3], row[4]) for row in rows] == [("fp32", "32"), ("fp32", "64")], out.stdout
    for row in rows:
        total, parts = int(row[5]), [int(n) for n in row[6:]]
        assert len(parts) == 10 and all(n > 0 for n in parts[:-1]) and sum(parts) == total, row


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_updates_learn_the_chain_values(tmp_path, device):
    learner = make_learner(tmp_path, f"learner.device={device}")
    assert next(learner.trainer.network.parameters()).device.type == device
    for seq in range(4):
        learner.intake.ingest(chain_chunk(seq % 2, seq // 2, episodes=10))
    for _ in range(600):
        learner.step()
    assert learner.trainer.weights(0).state["head.weight"].device.type == device   # the transport stages it if need be
    with torch.no_grad():
        q = learner.trainer.network(torch.tensor([[S0], [S1]], device=device)).cpu()
    assert q[1].tolist() == pytest.approx([1.0, 1.0], abs=0.05)
    assert q[0].tolist() == pytest.approx([0.9, 0.9], abs=0.05)     # gamma x Q(s1): it bootstraps
    assert learner.trainer.updates == 600


@pytest.mark.parametrize("overrides", [[], ["train.double=false", "network.dueling=true"]],
                         ids=["double", "nature-dueling"])
def test_quantile_updates_learn_the_chain_values_in_every_quantile(tmp_path, overrides):
    """network.quantiles: the chain's returns are certain, so every quantile of each action settles at its value,
    and prioritized replay takes each sample's quantile loss for its priority."""
    learner = make_learner(tmp_path, "network.quantiles=4", "train.prioritized=true", "train.initial_priority=max",
                           *overrides)
    for seq in range(4):
        learner.intake.ingest(chain_chunk(seq % 2, seq // 2, episodes=10))
    seen = []
    original = learner.trainer.replay.update_priorities
    learner.trainer.replay.update_priorities = lambda index, errors, tick: (seen.append(errors),
                                                                            original(index, errors, tick))
    for _ in range(600):
        learner.step()
    with torch.no_grad():
        quantiles = learner.trainer.network.quantile_values(torch.tensor([[S0], [S1]]))
    assert quantiles.shape == (2, 2, 4)
    assert quantiles[1].flatten().tolist() == pytest.approx([1.0] * 8, abs=0.05)
    assert quantiles[0].flatten().tolist() == pytest.approx([0.9] * 8, abs=0.05)   # gamma x Q(s1): it bootstraps
    assert len(seen) == 600 and all(e.shape == (32,) and (e >= 0).all() for e in seen)
    assert seen[-1].mean() < 0.1 * seen[0].mean()   # the priorities fall as the quantiles are learned


def test_quantiles_learn_the_spread_of_a_reward_that_is_a_coin_toss(tmp_path):
    """s1's reward is +1 or -1 with even odds: each action's quantiles of s1 spread out in order, from below -0.5 to
    above 0.5 (the quantile Huber loss puts the fractions 1/8 and 7/8 of an even +-1 at -6/7 and 6/7; the replay's
    80 tosses are not exactly even). Quantiles trained with their fraction on the wrong index, or not trained at
    all, would not spread."""
    learner = make_learner(tmp_path, "network.quantiles=4", "train.initial_priority=max")
    for seq in range(4):
        learner.intake.ingest(chain_chunk(seq % 2, seq // 2, episodes=10, coin=True))
    for _ in range(600):
        learner.step()
    with torch.no_grad():
        quantiles = learner.trainer.network.quantile_values(torch.tensor([[S1]]))[0]
    for action in quantiles:
        assert action.tolist() == sorted(action.tolist()), quantiles
        assert action[0] < -0.5 and action[-1] > 0.5, quantiles


def trained_with_and_without_overlap(tmp_path, *overrides: str):
    """Two learners of the chain with `overrides`, one preparing batches beside training and one not, after the
    same 600 updates; asserts that they made the same updates and returns the first."""
    learners = [make_learner(tmp_path / flag, *overrides, f"learner.overlap={flag}") for flag in ("true", "false")]
    for learner in learners:
        for seq in range(4):
            learner.intake.ingest(chain_chunk(seq % 2, seq // 2, episodes=10))
        for _ in range(600):
            learner.step()
    overlapped, plain = learners
    assert all(torch.equal(x, y) for x, y in zip(overlapped.trainer.network.parameters(),
                                                  plain.trainer.network.parameters()))
    return overlapped


def test_nature_dqn_targets_learn_the_chain_values_with_or_without_overlap(tmp_path, monkeypatch):
    """train.double=false: the target network's greedy value bootstraps s0 (one-step returns, so it does), the
    online network never evaluates s', and preparing batches beside training changes no update there either."""
    def no_online_pass(*args):
        raise AssertionError("the online network evaluated s' for a Nature DQN target")
    monkeypatch.setattr(Trainer, "_online_values", no_online_pass)
    overlapped = trained_with_and_without_overlap(tmp_path, "train.double=false", "train.n_step=1")
    with torch.no_grad():
        q = overlapped.trainer.network(torch.tensor([[S0], [S1]]))
    assert q[1].tolist() == pytest.approx([1.0, 1.0], abs=0.05)
    assert q[0].tolist() == pytest.approx([0.9, 0.9], abs=0.05)


@pytest.mark.parametrize("quantiles", [0, 4])
def test_munchausen_targets_learn_the_chain_values_of_its_soft_policy(tmp_path, quantiles):
    """train.munchausen_alpha: both actions of the chain are worth the same, so the target policy stays uniform and
    every Q-value settles at Munchausen's fixed point, with tau = 1 far from the plain DQN's: Q(s1) = 1 + alpha *
    log(1/2) (the bonus, its clip at -1 not reached), and Q(s0) = alpha * log(1/2) + gamma * (Q(s1) + log 2), s1's
    soft value being its Q-value plus the uniform policy's entropy. One-step returns, so that s0 bootstraps, with
    and without preparing batches beside training (the same updates either way); with quantiles, every one."""
    overlapped = trained_with_and_without_overlap(
        tmp_path, "train.double=false", "train.n_step=1", "train.munchausen_alpha=0.9", "train.munchausen_tau=1",
        f"network.quantiles={quantiles}", "train.initial_priority=max")
    gamma, bonus = overlapped.cfg.train.gamma, 0.9 * math.log(0.5)
    s1 = 1 + bonus
    s0 = bonus + gamma * (s1 + math.log(2))
    with torch.no_grad():
        states = torch.tensor([[S0], [S1]])
        values = overlapped.trainer.network.quantile_values(states).flatten(1) if quantiles \
            else overlapped.trainer.network(states)
    assert values[1].tolist() == pytest.approx([s1] * values.shape[1], abs=0.05)
    assert values[0].tolist() == pytest.approx([s0] * values.shape[1], abs=0.05)


def test_target_network_follows_every_target_update_updates(tmp_path):
    learner = make_learner(tmp_path)
    learner.intake.ingest(chain_chunk(0, 0, episodes=30))
    for _ in range(19):
        learner.step()
    online, target = learner.trainer.network.state_dict(), learner.trainer.target.state_dict()
    assert any(not torch.equal(online[k], target[k]) for k in online)
    learner.step()
    assert all(torch.equal(online[k], learner.trainer.target.state_dict()[k]) for k in online)


@pytest.mark.parametrize("overrides, beta", [
    (["train.total_env_steps=288"], 0.4 + 0.6 * (120 - 64) / (288 - 64)),        # 1 at the end of the run
    (["train.total_env_steps=288", "train.priority_beta_env_steps=176"], 0.4 + 0.6 * (120 - 64) / (176 - 64)),
])
def test_prioritized_replay_anneals_beta_to_one_at_priority_beta_env_steps(tmp_path, monkeypatch, overrides, beta):
    learner = make_learner(tmp_path, "train.priority_beta=0.4", *overrides)
    drawn, sample = [], learner.trainer.replay.sample
    monkeypatch.setattr(learner.trainer.replay, "sample",
                        lambda n, gen, b, *rest: drawn.append(b) or sample(n, gen, b, *rest))
    learner.intake.ingest(chain_chunk(0, 0, episodes=10))
    learner.intake.ingest(chain_chunk(1, 0, episodes=10))     # 120 env steps, 56 past train.learning_starts
    learner.step()
    assert drawn and drawn == pytest.approx([beta] * len(drawn))


@pytest.mark.parametrize("overrides, lr", [
    ([], 0.001),                                                                  # no lr_end: train.lr throughout
    (["train.lr_end=0.0001", "train.lr_decay_start_env_steps=100", "train.lr_decay_end_env_steps=200"],
     0.001 + (120 - 100) / (200 - 100) * (0.0001 - 0.001)),
    (["train.lr_end=0.0001", "train.lr_decay_start_env_steps=20", "train.lr_decay_end_env_steps=100"], 0.0001),
])
def test_the_optimizer_steps_at_the_learning_rate_of_its_schedule(tmp_path, overrides, lr):
    learner = make_learner(tmp_path, *overrides)
    learner.intake.ingest(chain_chunk(0, 0, episodes=10))
    learner.intake.ingest(chain_chunk(1, 0, episodes=10))     # 120 env steps
    learner.step()
    assert learner.trainer.updates >= 1
    assert [g["lr"] for g in learner.trainer.optimizer.param_groups] == pytest.approx([lr])


@pytest.mark.parametrize("overrides, n_step", [
    ([], 5),                                                                      # no n_step_end: train.n_step
    (["train.n_step_end=1", "train.n_step_decay_start_env_steps=100", "train.n_step_decay_end_env_steps=200"],
     4),                                                                          # 5 - (120 - 100) / 100 * 4, rounded
    (["train.n_step_end=2", "train.n_step_decay_start_env_steps=20", "train.n_step_decay_end_env_steps=100"], 2),
])
def test_batches_sum_the_rewards_of_the_n_step_schedule(tmp_path, monkeypatch, overrides, n_step):
    learner = make_learner(tmp_path, "train.n_step=5", *overrides)
    drawn, sample = [], learner.trainer.replay.sample
    monkeypatch.setattr(learner.trainer.replay, "sample", lambda n, gen, b, m: drawn.append(m) or sample(n, gen, b, m))
    learner.intake.ingest(chain_chunk(0, 0, episodes=10))
    learner.intake.ingest(chain_chunk(1, 0, episodes=10))     # 120 env steps
    learner.step()
    assert drawn and drawn == [n_step] * len(drawn)


def test_preparing_the_next_batch_beside_training_changes_no_update(tmp_path):
    """learner.overlap draws the same batches from the same generator and computes the same targets as one thread
    does: across target refreshes (every 20 updates here), with prioritized replay whose priorities from each
    batch are written before the next batch is drawn. One-step targets, so that s0's bootstrap from s1 comes from
    the target network (3-step returns of this chain all end at the terminal step)."""
    learners = [make_learner(tmp_path / flag, f"learner.overlap={flag}", "train.n_step=1")
                for flag in ("true", "false")]
    for learner in learners:
        learner.intake.ingest(chain_chunk(0, 0, episodes=30))
        for _ in range(45):
            learner.step()
    overlapped, plain = learners
    assert overlapped.cfg.train.prioritized
    assert overlapped.trainer._helper is not None and plain.trainer._helper is None
    for a, b in ((overlapped.trainer.network, plain.trainer.network),
                 (overlapped.trainer.target, plain.trainer.target)):
        assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    assert torch.equal(overlapped.trainer.replay.tree.levels[0], plain.trainer.replay.tree.levels[0])
    fresh = make_learner(tmp_path / "new")
    assert not torch.equal(overlapped.trainer.network.head.weight, fresh.trainer.network.head.weight)


def test_with_overlap_only_drawable_entries_hold_a_priority_as_chunks_come_in_between_updates(tmp_path):
    """learner.overlap draws each next batch before the chunks that come in meanwhile overwrite the lanes: its new
    priorities must not make drawable again what those chunks wrote (entries waiting for their n steps) or any
    entry that is no longer there. A replay of 70 steps per lane wraps every other chunk."""
    learner = make_learner(tmp_path, "learner.overlap=true", "train.replay_capacity=280", "train.n_step=3")
    replay = learner.trainer.replay
    assert learner.trainer._helper is not None and replay.prioritized
    cap, lanes = replay.lane_capacity, torch.arange(replay.num_lanes)[:, None]
    for seq in range(12):
        for collector in range(2):
            learner.intake.ingest(chain_chunk(collector, seq, episodes=10))
        for _ in range(3 if replay.ready else 0):
            learner.step()
        # Each position's entry, by its step in the lane; drawable when its stack and n steps are stored and its
        # step is not an episode's final observation.
        newest = replay.written[:, None] - 1
        tick = newest - (newest - torch.arange(cap)) % cap
        low, count = replay._sample_range()
        drawable = (tick >= low[:, None]) & (tick < (low + count)[:, None]) & ~replay.first[lanes, (tick + 1) % cap]
        assert torch.equal(replay.tree.get(torch.arange(replay.num_lanes * cap)).view(-1, cap) > 0, drawable), seq


def test_the_learner_shares_the_cores_out_among_its_compute_threads(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    cpu, gpu = torch.device("cpu"), torch.device("cuda:0")
    cfg = load_config(ROOT / "configs/cartpole.yaml", ["run.name=t"])
    assert cfg.learner.overlap and cfg.learner.cuda_graph and torch_threads(cfg, cpu) == 8
    assert torch_threads(cfg, gpu) == 16     # a captured update has no helper thread to share them with
    assert torch_threads(load_config(ROOT / "configs/cartpole.yaml", ["run.name=t", "learner.cuda_graph=false"]),
                         gpu) == 8
    assert torch_threads(load_config(ROOT / "configs/cartpole.yaml", ["run.name=t", "learner.overlap=false"]),
                         cpu) == 16
    assert torch_threads(load_config(ROOT / "configs/cartpole.yaml", ["run.name=t", "learner.torch_threads=3"]),
                         cpu) == 3
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    assert torch_threads(cfg, cpu) == 1
