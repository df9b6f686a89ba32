"""The learner in-process: ordered ingest, the replay ratio, updates that learn a known answer, checkpoints."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch

from envs import EnvSpec
from rl_dqn.config import load_config
from rl_dqn.evaluate import EvalResult, load_player
from rl_dqn.learner import Learner
from rl_dqn.trainer import Trainer, torch_threads
from rl_dqn.types import Chunk

ROOT = Path(__file__).resolve().parents[1]
SPEC = EnvSpec((1, 4), torch.float32, 2)
S0, S1, S2 = [1.0, 0, 0, 0], [0, 1.0, 0, 0], [0, 0, 1.0, 0]


def chain_chunk(collector: int, seq: int, episodes: int, envs: int = 2) -> Chunk:
    """Episodes of a two-step chain in every env: s0 -> s1 (reward 0), s1 -> s2 (reward 1, terminal), then the
    env's reset step from the final observation s2. Whatever the action, Q(s1, .) = 1 and Q(s0, .) = gamma."""
    frames = torch.tensor([S0, S1, S2] * episodes).view(3 * episodes, 1, 4).expand(-1, envs, -1).clone()
    T = 3 * episodes
    actions = torch.randint(2, (T, envs), generator=torch.Generator().manual_seed(seq))
    rewards = torch.tensor([0.0, 1.0, 0.0] * episodes).view(T, 1).expand(-1, envs).clone()
    terminated = torch.tensor([False, True, False] * episodes).view(T, 1).expand(-1, envs).clone()
    first = torch.tensor([True, False, False] * episodes).view(T, 1).expand(-1, envs).clone()
    return Chunk(collector, seq, 0, frames, actions, rewards, terminated, first,
                 torch.ones(episodes * envs, dtype=torch.float64), torch.full((episodes * envs,), 2),
                 torch.zeros(T, envs), torch.zeros(T, envs))   # the collector's Q-values: an untrained network


def make_learner(tmp_path, *overrides) -> Learner:
    cfg = load_config(ROOT / "configs/cartpole.yaml", [
        "run.name=t", "collectors.count=2", "env.envs_per_collector=2", "collectors.chunk_steps=30",
        "train.replay_capacity=1200", "train.learning_starts=64", "train.batch_size=32", "train.gamma=0.9",
        "train.lr=0.001", "train.target_update_updates=20", *overrides])
    return Learner(cfg, SPEC, tmp_path)


def test_chunks_enter_replay_in_each_collectors_order(tmp_path):
    learner = make_learner(tmp_path)
    later, earlier = chain_chunk(1, seq=1, episodes=10), chain_chunk(1, seq=0, episodes=10)
    earlier.frames[:, :, 3] = 7.0      # mark the first chunk's frames
    learner.ingest(later)
    assert learner.intake.env_steps == 0 and len(learner.trainer.replay) == 0      # held until seq 0 arrives
    learner.ingest(earlier)
    assert learner.intake.env_steps == 120
    lanes = learner.trainer.replay.frames[2:4]                               # collector 1 owns lanes 2 and 3
    assert (lanes[:, :30, 3] == 7.0).all() and (lanes[:, 30:60, 3] == 0.0).all()
    assert learner.trainer.replay.written.tolist() == [0, 0, 60, 60]


def test_replay_ratio_is_held(tmp_path):
    learner = make_learner(tmp_path, "train.replay_ratio=2")
    learner.ingest(chain_chunk(0, 0, episodes=10))                   # 60 env steps: before learning_starts
    assert not learner.wants_update()
    for seq in (1, 2, 3):
        learner.ingest(chain_chunk(0, seq, episodes=10))             # 240 env steps in all
    while learner.wants_update():
        learner.step()
    assert learner.trainer.updates == 2 * (240 - 64) // 32                   # gradient samples = ratio x env steps


@pytest.mark.parametrize("ratio", [0.01, 0.05, 0.5, 2, 8, 64])
def test_the_replay_ratio_gate_holds_collectors_back_without_stalling_them(tmp_path, ratio):
    """Driven as the learner's loop drives it, with two collectors that each stop sending at
    collectors.max_chunks_in_flight unanswered chunks: every chunk gets sent and answered (no stall), the training
    owed never runs more than the chunks in flight ahead of the updates, and at the end the updates are exactly the
    replay ratio's."""
    learner = make_learner(tmp_path, f"train.replay_ratio={ratio}")
    intake, limit, chunks = learner.intake, learner.cfg.collectors.max_chunks_in_flight, 20
    sent, unanswered = [0, 0], [0, 0]
    chunk_samples = ratio * 60                                       # a chunk is 30 steps x 2 envs
    while True:
        moved = False
        for collector in (0, 1):
            if unanswered[collector] < limit and sent[collector] < chunks:
                learner.ingest(chain_chunk(collector, sent[collector], episodes=10))
                intake.hold(collector)
                sent[collector] += 1
                unanswered[collector] += 1
                moved = True
        for collector in intake.release(learner.trainer.updates):
            unanswered[collector] -= 1
            moved = True
        if learner.wants_update():
            learner.step()
            moved = True
        owed = intake.owed_samples(learner.trainer.updates)
        assert owed <= chunk_samples * (1 + 2 * limit) + 32, (ratio, intake.env_steps, learner.trainer.updates)
        if not moved:
            break
    assert sent == [chunks, chunks] and unanswered == [0, 0]
    assert learner.trainer.updates == int(ratio * (2 * chunks * 60 - 64) // 32)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_updates_learn_the_chain_values(tmp_path, device):
    learner = make_learner(tmp_path, f"learner.device={device}")
    assert next(learner.trainer.network.parameters()).device.type == device
    for seq in range(4):
        learner.ingest(chain_chunk(seq % 2, seq // 2, episodes=10))
    for _ in range(600):
        learner.step()
    assert learner.trainer.weights(0).state["head.weight"].device.type == device   # the transport stages it if need be
    with torch.no_grad():
        q = learner.trainer.network(torch.tensor([[S0], [S1]], device=device)).cpu()
    assert q[1].tolist() == pytest.approx([1.0, 1.0], abs=0.05)
    assert q[0].tolist() == pytest.approx([0.9, 0.9], abs=0.05)     # gamma x Q(s1): it bootstraps
    assert learner.trainer.updates == 600


def test_nature_dqn_targets_learn_the_chain_values_with_or_without_overlap(tmp_path, monkeypatch):
    """train.double=false: the target network's greedy value bootstraps s0 (one-step returns, so it does), the
    online network never evaluates s', and preparing batches beside training changes no update there either."""
    def no_online_pass(*args):
        raise AssertionError("the online network evaluated s' for a Nature DQN target")
    monkeypatch.setattr(Trainer, "_online_values", no_online_pass)
    learners = [make_learner(tmp_path / flag, "train.double=false", "train.n_step=1", f"learner.overlap={flag}")
                for flag in ("true", "false")]
    for learner in learners:
        for seq in range(4):
            learner.ingest(chain_chunk(seq % 2, seq // 2, episodes=10))
        for _ in range(600):
            learner.step()
    overlapped, plain = learners
    assert all(torch.equal(x, y) for x, y in zip(overlapped.trainer.network.parameters(),
                                                  plain.trainer.network.parameters()))
    with torch.no_grad():
        q = overlapped.trainer.network(torch.tensor([[S0], [S1]]))
    assert q[1].tolist() == pytest.approx([1.0, 1.0], abs=0.05)
    assert q[0].tolist() == pytest.approx([0.9, 0.9], abs=0.05)


def test_target_network_follows_every_target_update_updates(tmp_path):
    learner = make_learner(tmp_path)
    learner.ingest(chain_chunk(0, 0, episodes=30))
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
    learner.ingest(chain_chunk(0, 0, episodes=10))
    learner.ingest(chain_chunk(1, 0, episodes=10))     # 120 env steps, 56 past train.learning_starts
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
    learner.ingest(chain_chunk(0, 0, episodes=10))
    learner.ingest(chain_chunk(1, 0, episodes=10))     # 120 env steps
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
    learner.ingest(chain_chunk(0, 0, episodes=10))
    learner.ingest(chain_chunk(1, 0, episodes=10))     # 120 env steps
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
        learner.ingest(chain_chunk(0, 0, episodes=30))
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


def test_the_learner_shares_the_cores_out_among_its_compute_threads(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    cfg = load_config(ROOT / "configs/cartpole.yaml", ["run.name=t"])
    assert cfg.learner.overlap and torch_threads(cfg) == 8
    assert torch_threads(load_config(ROOT / "configs/cartpole.yaml", ["run.name=t", "learner.overlap=false"])) == 16
    assert torch_threads(load_config(ROOT / "configs/cartpole.yaml", ["run.name=t", "learner.torch_threads=3"])) == 3
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    assert torch_threads(cfg) == 1


def test_the_summary_rates_end_where_training_ended_not_after_the_final_save(tmp_path):
    learner = make_learner(tmp_path)
    learner.ingest(chain_chunk(0, 0, episodes=30))
    for _ in range(3):
        learner.step()
    learner.close()     # the final checkpoint, then summary.json
    first = json.loads((tmp_path / "summary.json").read_text())
    time.sleep(0.3)     # a slow save would add this much before the summary is written
    learner.write_summary()
    again = json.loads((tmp_path / "summary.json").read_text())
    assert first["updates_per_s_training"] > 0
    assert again["updates_per_s_training"] == first["updates_per_s_training"]
    assert again["env_steps_per_s"] == first["env_steps_per_s"]
    assert again["wall_s"] >= first["wall_s"] + 0.3


def test_checkpoints_are_complete_pruned_and_resume_everything(tmp_path):
    learner = make_learner(tmp_path, "learner.keep_checkpoints=2")
    learner.ingest(chain_chunk(0, 0, episodes=30))
    paths = []
    for _ in range(3):
        learner.step()
        paths.append(learner.save_checkpoint())
    folder = tmp_path / "checkpoints"
    # The newest two checkpoints, the newest replay, no partial files.
    assert sorted(folder.iterdir()) == [*paths[1:], folder / "replay_000000003.pt"]
    state = torch.load(paths[-1], weights_only=True)
    assert state["counters"] == {"env_steps": 180, "updates": 3, "weights_version": 0}
    assert set(state) >= {"network", "target", "optimizer", "config", "schedule", "generator", "replay_file"}

    fresh = make_learner(tmp_path / "again", "learner.keep_checkpoints=2")
    fresh.restore(paths[-1])
    assert (fresh.intake.env_steps, fresh.trainer.updates) == (180, 3)
    # Its clock goes on from the checkpoint's, and its summary says where this process took over.
    fresh.write_summary()
    resumed_at = json.loads((tmp_path / "again/summary.json").read_text())["resumed_at_s"]
    assert resumed_at == state["schedule"]["elapsed_s"] > 0
    for a, b in ((fresh.trainer.network, learner.trainer.network), (fresh.trainer.target, learner.trainer.target)):
        assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    assert all(torch.equal(x, y) for x, y in zip(fresh.trainer.optimizer.state_dict()["state"][0].values(),
                                                learner.trainer.optimizer.state_dict()["state"][0].values()))
    for name, value in learner.trainer.replay.state_dict().items():
        assert torch.equal(fresh.trainer.replay.state_dict()[name], value), name
    # Both go on identically: the same batch, the same update.
    fresh.step()
    learner.step()
    assert all(torch.equal(x, y) for x, y in zip(fresh.trainer.network.parameters(),
                                                learner.trainer.network.parameters()))


def test_a_checkpoint_from_the_other_kind_of_device_resumes_with_a_new_sampling_seed(tmp_path, capsys):
    learner = make_learner(tmp_path)
    learner.ingest(chain_chunk(0, 0, episodes=30))
    learner.step()
    path = learner.save_checkpoint()
    state = torch.load(path, weights_only=True)
    state["generator"] = torch.zeros(16, dtype=torch.uint8)   # a CUDA generator's state: seed and offset
    torch.save(state, path)
    fresh = make_learner(tmp_path / "again")
    fresh.restore(path)
    assert "not a cpu generator's: the run goes on with batches drawn from a new seed" in capsys.readouterr().out
    assert all(torch.equal(x, y) for x, y in zip(fresh.trainer.network.parameters(),
                                                learner.trainer.network.parameters()))
    assert len(fresh.trainer.replay) == len(learner.trainer.replay)
    fresh.step()
    assert fresh.trainer.updates == 2


def test_the_best_evaluated_network_is_kept_with_its_score(tmp_path):
    learner = make_learner(tmp_path, "eval.every_env_steps=60", "eval.episodes=3", "eval.epsilon=0")
    played, scores = [], []
    try:
        for seq in range(3):
            learner.ingest(chain_chunk(0, seq, episodes=30))
            for _ in range(5):
                learner.step()                     # new weights for each round
            learner._evaluate()                    # a real evaluator process plays CartPole with them
            played.append({k: v.clone() for k, v in learner.eval_state.items()})
            deadline = time.monotonic() + 60
            while learner.evaluator.busy and time.monotonic() < deadline:
                learner._evaluate()
                time.sleep(0.05)
            assert not learner.evaluator.busy, "no evaluation result in 60 s"
            scores.append(learner.report.last_eval[0])
            # best.pt: the weights that round played when it beat every earlier round, with its score.
            best = torch.load(tmp_path / "checkpoints/best.pt", weights_only=True)
            first_best = scores.index(max(scores))
            assert best["eval"]["mean"] == max(scores) == learner.report.best_eval
            assert best["eval"]["episodes"] == 3
            assert all(torch.equal(best["network"][k], v) for k, v in played[first_best].items())
    finally:
        learner.close_evaluator()
    assert len({tuple(v.flatten()[:4].tolist()) for p in played for v in [p["head.weight"]]}) == 3
    cfg, network = load_player(tmp_path / "checkpoints/best.pt")   # play.sh can play it
    assert cfg.env.id == "CartPole-v1" and network.head.out_features == 2


def test_the_evaluator_plays_the_moving_average_of_the_weights_which_a_resumed_run_continues(tmp_path):
    learner = make_learner(tmp_path, "eval.ema_updates=4", "eval.every_env_steps=60")
    learner.ingest(chain_chunk(0, 0, episodes=30))
    trainer = learner.trainer
    expected = [p.detach().clone() for p in trainer.network.parameters()]   # the average starts at the weights
    for _ in range(6):
        learner.step()
        expected = [e + (p.detach() - e) / 4 for e, p in zip(expected, trainer.network.parameters())]
    played = trainer.evaluated_weights()
    names = [name for name, _ in trainer.network.named_parameters()]
    assert set(played) == set(trainer.network.state_dict())
    for name, value in zip(names, expected):
        torch.testing.assert_close(played[name], value, rtol=1e-6, atol=1e-7)
        assert not torch.allclose(played[name], trainer.network.state_dict()[name])   # not the online weights
    try:
        learner._evaluate()   # what an evaluation round is given (and best.pt would keep)
        assert all(torch.equal(learner.eval_state[k], v) for k, v in played.items())
    finally:
        learner.close_evaluator()
    # Without eval.ema_updates it plays the online weights as they are.
    online = make_learner(tmp_path / "online")
    online.ingest(chain_chunk(0, 0, episodes=30))
    online.step()
    assert all(torch.equal(v, online.trainer.network.state_dict()[k])
               for k, v in online.trainer.evaluated_weights().items())
    # A resumed run goes on from the saved average; a checkpoint without one starts it from the weights.
    path = learner.save_checkpoint()
    fresh = make_learner(tmp_path / "again", "eval.ema_updates=4")
    fresh.restore(path)
    assert all(torch.equal(fresh.trainer.evaluated_weights()[k], v) for k, v in played.items())
    fresh.step()
    learner.step()
    assert all(torch.equal(fresh.trainer.evaluated_weights()[k], v)
               for k, v in learner.trainer.evaluated_weights().items())
    state = torch.load(path, weights_only=True)
    state["averaged"] = None
    torch.save(state, path)
    fresh = make_learner(tmp_path / "older", "eval.ema_updates=4")
    fresh.restore(path)
    assert all(torch.equal(fresh.trainer.evaluated_weights()[k], v)
               for k, v in fresh.trainer.network.state_dict().items())


def test_the_first_evaluation_that_reaches_eval_stop_score_ends_the_run(tmp_path, capsys):
    learner = make_learner(tmp_path, "eval.every_env_steps=60", "eval.stop_score=20")
    for env_steps, scores in [(60, [10.0, 20.0]), (120, [19.0, 20.0])]:
        learner._evaluated(EvalResult(env_steps, 1.0, 0, scores, None, 0.1, 0.1))
        assert not learner.reached_stop_score                         # 15, then 19.5: below 20
    learner._evaluated(EvalResult(180, 2.0, 0, [19.0, 21.0], None, 0.1, 0.1))
    assert learner.reached_stop_score                                 # 20: the loop in run() ends
    assert "eval 20.00 at 180 env steps reached eval.stop_score=20: the run ends here" in capsys.readouterr().out
