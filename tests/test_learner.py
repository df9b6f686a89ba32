"""The learner role in-process: its loop run against an in-memory endpoint (chunks in, answers, weights and membership
out, as LearnerEndpoint says; the RPC endpoints are tested in test_transport.py), checkpoints and resuming, the
evaluator and the best network it scored, and the end of a run at eval.stop_score."""

from __future__ import annotations

import collections
import json
import os
import queue
import re
import threading
import time
from typing import NamedTuple

import pytest
import torch
from chain import chain_chunk, make_learner
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.custom_scalar.layout_pb2 import Layout
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData
from test_end_to_end import TAGS, summaries_of

from rl_dqn import checkpoints
from rl_dqn.evaluate import EvalResult, load_player
from rl_dqn.learner import TrainingDiverged, next_round
from rl_dqn.transport import Change, LearnerEndpoint, Membership, Standing, TransportError
from rl_dqn.types import Ack, Chunk


class Delivery(NamedTuple):
    chunk: object


class MemoryEndpoint:
    """Plays the collectors of a run in memory: each sends its chunks in order, at most collectors.max_chunks_in_flight
    unanswered, and the test reads what the learner answered, published and was told. A collector named in `lost`
    is lost once it has sent its last chunk."""

    def __init__(self, chunks: dict[str, list], in_flight: int, lost: dict[str, str]):
        self.alive, self.lost, self.changes = set(chunks), {}, queue.SimpleQueue()
        self._to_send = {name: collections.deque(sent) for name, sent in chunks.items()}
        self._in_flight, self._losing = in_flight, dict(lost)
        self._unanswered = collections.Counter()
        self.delivered: list[object] = []
        self.answered: list[tuple[object, Ack]] = []
        self.published: list[int] = []
        self.stopped = False
        for name in chunks:
            self.changes.put(Change(Membership.JOINED, name, "process 1 of its slot"))

    def receive(self, timeout: float) -> list[Delivery]:
        deliveries = []
        for name, waiting in self._to_send.items():
            while waiting and name in self.alive and self._unanswered[name] < self._in_flight:
                deliveries.append(Delivery(waiting.popleft()))
                self._unanswered[name] += 1
            if not waiting and name in self._losing:
                self.alive.discard(name)
                self.lost[name] = self._losing.pop(name)
                self.changes.put(Change(Membership.LOST, name, self.lost[name]))
        self.delivered += [d.chunk for d in deliveries]
        return deliveries

    def acknowledge(self, delivery: Delivery, ack: Ack) -> None:
        self.answered.append((delivery.chunk, ack))
        if isinstance(delivery.chunk, Chunk):
            self._unanswered[f"collector{delivery.chunk.collector}"] -= 1

    def sender_standing(self, chunk) -> Standing:
        """The test's chunks carry Chunk's default sender: the newest process of their slot."""
        return Standing.NEWEST if isinstance(chunk, Chunk) and chunk.sender == Chunk._field_defaults["sender"] \
            else Standing.UNKNOWN

    def publish(self, weights, env_steps: int | None = None) -> int:
        self.published.append(weights.version)
        return len(self.alive)

    def watch(self) -> None:
        pass

    def stop_collectors(self, timeout: float) -> None:
        self.stopped = True

    def close(self) -> None:
        pass


def test_the_loop_takes_every_chunk_in_order_trains_at_the_ratio_and_ends_at_the_total(tmp_path, capsys):
    """Two collectors of 5 chunks each (600 env steps, the run's total), one of them also sending a bad chunk (last,
    after the one that follows it, which enters then) and then lost: every chunk enters replay and is reported,
    none is answered twice, the bad one is refused and counted, the updates
    are the replay ratio's, weights go out with rising versions, the loss is reported, and the run ends at its total
    with its summary, its last progress line and the dashboard's figures (as the smoke run in test_smoke_run.py
    shows them from real processes)."""
    learner = make_learner(tmp_path, "train.total_env_steps=600", "train.replay_ratio=2", "eval.every_env_steps=0",
                           "learner.publish_every_updates=5")
    bad = chain_chunk(1, 4, episodes=10)._replace(actions=torch.full((30, 2), 7))
    chunks = {"collector0": [chain_chunk(0, seq, episodes=10) for seq in range(5)],
              "collector1": [chain_chunk(1, seq, episodes=10) for seq in (0, 1, 2, 3, 5)] + [bad]}
    endpoint = MemoryEndpoint(chunks, learner.cfg.collectors.max_chunks_in_flight, lost={"collector1": "it died"})
    assert isinstance(endpoint, LearnerEndpoint)
    deadline = threading.Timer(60, learner.stop.set)   # a loop that would never end stops, and fails below
    deadline.start()
    try:
        learner.run(endpoint)
    finally:
        deadline.cancel()
    assert learner.intake.env_steps == 600 and learner.ended == "total_env_steps" and endpoint.stopped
    answered = [id(c) for c, _ in endpoint.answered]
    assert len(set(answered)) == len(answered) and set(answered) <= {id(c) for c in endpoint.delivered}
    assert any(c is bad for c, _ in endpoint.answered)   # refused: answered at once
    assert learner.trainer.updates == 2 * (600 - 64) // 32
    assert endpoint.published == list(range(len(endpoint.published))) and len(endpoint.published) > 3
    out = capsys.readouterr().out
    assert "[learner] collector1 lost: it died; training goes on" in out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["ended"] == "total_env_steps" and summary["env_steps"] == 600
    assert {name: c["chunks"] for name, c in summary["collectors"].items()} == {"collector0": 5, "collector1": 5}
    assert summary["lost_collectors"] == {"collector1": "it died"}
    assert summary["rejected_chunks"] == {"action out of range 0..1": 1}
    # The progress line, at the least as the run closes: done, a full bar, no ETA.
    assert re.search(r"\[learner\] env steps 600/600 \[#{20}\] 100% ETA - \| [\d,]+ steps/s \| .* updates/s", out), out
    # The dashboard: every tag, the config as HParams, score against env steps and wall time side by side.
    events = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})
    events.Reload()
    for tag in TAGS:
        assert events.Scalars(tag), f"TensorBoard tag {tag} holds no value"
    hparams = [HParamsPluginData.FromString(v.metadata.plugin_data.content) for v in summaries_of(tmp_path, "hparams")]
    session = next(d.session_start_info for d in hparams if d.HasField("session_start_info"))
    assert session.hparams["train.lr"].number_value == pytest.approx(1e-3)
    layout = Layout.FromString(summaries_of(tmp_path, "custom_scalars")[0].tensor.string_val[0])
    score = next(c for c in layout.category if c.title == "score")
    assert [chart.title for chart in score.chart] == ["score vs env steps", "score vs wall time (s)"]



DIVERGING = ("train.total_env_steps=600", "train.replay_ratio=2", "train.lr=1e30")


def run_to_divergence(learner) -> tuple[MemoryEndpoint, str]:
    """Runs `learner` on 2 collectors' chunks until it raises TrainingDiverged; returns the endpoint and the line."""
    chunks = {f"collector{i}": [chain_chunk(i, seq, episodes=10) for seq in range(5)] for i in range(2)}
    endpoint = MemoryEndpoint(chunks, learner.cfg.collectors.max_chunks_in_flight, lost={})
    with pytest.raises(TrainingDiverged) as raised:
        learner.run(endpoint)
    assert endpoint.stopped and json.loads((learner.run_dir / "summary.json").read_text())["ended"] == "diverged"
    return endpoint, str(raised.value)


def test_a_learner_whose_weights_diverge_stops_before_publishing_or_saving_them(tmp_path):
    """Adam at a learning rate of 1e30 takes the weights to about 1e30 in one update (finite, saved) and to NaN in
    the next: the run stops there with one line naming the update and the checkpoint kept, the collectors never get
    the NaN weights, no checkpoint of them is written (the newest stays the finite one, which resumes), and the
    summary says the run diverged."""
    learner = make_learner(tmp_path, *DIVERGING, "eval.every_env_steps=0", "learner.publish_every_updates=1",
                           "learner.checkpoint_every_updates=1")
    endpoint, line = run_to_divergence(learner)
    assert line == (
        "training diverged: the online network's weights are NaN or infinite after update 2 (240 env steps), and are "
        "not kept; the newest checkpoint, checkpoint_000000001.pt, was trained before (run.resume=true continues "
        "from it); a lower train.lr or train.max_grad_norm may keep it from diverging")
    assert learner.trainer.updates == 2 and endpoint.published == [0, 1]
    assert [p.name for p in checkpoints.all_of(tmp_path)] == ["checkpoint_000000001.pt"]
    fresh = make_learner(tmp_path / "again")
    fresh.restore(checkpoints.newest(tmp_path))
    assert fresh.trainer.updates == 1 and fresh.trainer.finite()


def test_weights_that_diverge_between_checks_are_caught_as_the_run_closes(tmp_path):
    """No publish or checkpoint falls due after the weights diverge: the run's close catches them, saves no
    checkpoint and still stops the collectors."""
    learner = make_learner(tmp_path, *DIVERGING, "learner.publish_every_updates=1000",
                           "learner.checkpoint_every_updates=1000", "eval.every_env_steps=0")
    endpoint, line = run_to_divergence(learner)
    assert line.startswith("training diverged: ") and "no checkpoint was saved before" in line, line
    assert endpoint.published == [0] and not checkpoints.all_of(tmp_path)


def test_weights_found_diverged_as_a_failing_run_closes_are_said_beside_its_error(tmp_path, capsys):
    """A run that fails (here: every collector lost, then none for cluster.join_timeout_s) ends with its own error;
    weights found diverged as it closes are said in a line, not saved, and not raised in that error's place."""
    learner = make_learner(tmp_path, *DIVERGING, "learner.publish_every_updates=1000",
                           "learner.checkpoint_every_updates=1000", "eval.every_env_steps=0",
                           "cluster.join_timeout_s=2")
    chunks = {f"collector{i}": [chain_chunk(i, seq, episodes=10) for seq in range(2)] for i in range(2)}
    endpoint = MemoryEndpoint(chunks, learner.cfg.collectors.max_chunks_in_flight,
                              lost={"collector0": "it died", "collector1": "it died"})
    with pytest.raises(TransportError, match="no collector has been in the run"):
        learner.run(endpoint)
    assert learner.trainer.updates > 2 and not checkpoints.all_of(tmp_path)
    assert "[learner] training diverged: " in capsys.readouterr().out
    assert json.loads((tmp_path / "summary.json").read_text())["ended"] == "diverged"


def test_an_evaluation_round_never_takes_diverged_weights(tmp_path):
    learner = make_learner(tmp_path, *DIVERGING, "eval.every_env_steps=60")
    learner.intake.ingest(chain_chunk(0, 0, episodes=30))
    learner.step()
    learner.step()
    assert not learner.trainer.finite()
    try:
        with pytest.raises(TrainingDiverged):
            learner._evaluate()
        assert learner.eval_state is None and learner.evaluator is not None and not learner.evaluator.busy
    finally:
        learner.close()


def test_a_replay_file_goes_once_no_kept_checkpoint_names_it(tmp_path):
    """A run resumed with learner.checkpoint_replay off: its checkpoints hold no replay from then on, and the last
    replay file goes with the last checkpoint that named it."""
    learner = make_learner(tmp_path, "learner.keep_checkpoints=2")
    learner.intake.ingest(chain_chunk(0, 0, episodes=30))
    learner.step()
    path = learner.save_checkpoint()
    assert (tmp_path / "checkpoints" / "replay_000000001.pt").is_file()
    resumed = make_learner(tmp_path, "learner.keep_checkpoints=2", "learner.checkpoint_replay=false")
    resumed.restore(path)
    for _ in range(3):
        resumed.step()
        resumed.save_checkpoint()
        named = (tmp_path / "checkpoints" / "checkpoint_000000001.pt").is_file()
        assert (tmp_path / "checkpoints" / "replay_000000001.pt").is_file() == named
    assert not list((tmp_path / "checkpoints").glob("replay_*"))


def test_a_checkpoint_written_again_without_its_replay_takes_the_old_replay_file_with_it(tmp_path):
    """A resumed run that ends, with no collector, at the update count it resumed from writes checkpoint_N again:
    without the replay (learner.checkpoint_replay off, or a full disk), replay_N is no longer named by anything."""
    checkpoints.save(tmp_path, {"counters": {}}, {"frames": torch.zeros(3)}, updates=5, keep=2)
    assert (tmp_path / "checkpoints" / "replay_000000005.pt").is_file()
    checkpoints.save(tmp_path, {"counters": {}}, None, updates=5, keep=2)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["checkpoint_000000005.pt"]


def test_checkpoints_are_complete_pruned_and_resume_everything(tmp_path):
    learner = make_learner(tmp_path, "learner.keep_checkpoints=2")
    learner.intake.ingest(chain_chunk(0, 0, episodes=30))
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


def test_a_checkpoint_reaches_the_disk_in_slices_and_tells_the_bytes_written_as_it_grows(tmp_path, monkeypatch):
    """A replay of gigabytes takes longer to write than a node's grace for its roles to stop: the file goes to disk
    as it is written (its last sync is short), and the learner hears how far it has got (its supervisor waits
    while it grows)."""
    monkeypatch.setattr(checkpoints._Writing, "SLICE_BYTES", 4096)
    monkeypatch.setattr(checkpoints._Writing, "SYNC_BYTES", 16384)
    monkeypatch.setattr(checkpoints._Writing, "TELL_S", 0.0)
    synced = []
    fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), fsync(fd))[1])
    learner = make_learner(tmp_path)
    learner.intake.ingest(chain_chunk(0, 0, episodes=30))
    told = []
    learner.saving = told.append
    path = learner.save_checkpoint()
    replay = learner.trainer.replay.state_dict()
    size = sum(p.stat().st_size for p in (tmp_path / "checkpoints").iterdir())
    assert size > 16384 * 4, size
    # Told as each slice went (two files, each counted from its start), synced every 16 KiB and at each end.
    assert len(told) >= size // 4096 and told[-1] <= path.stat().st_size, told
    assert len(synced) >= size // 16384 + 1, (len(synced), size)
    state, saved = checkpoints.load(path)
    assert state["counters"]["env_steps"] == learner.intake.env_steps
    assert all(torch.equal(saved[name], value) for name, value in replay.items())


def test_a_checkpoint_from_the_other_kind_of_device_resumes_with_a_new_sampling_seed(tmp_path, capsys):
    learner = make_learner(tmp_path)
    learner.intake.ingest(chain_chunk(0, 0, episodes=30))
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


def run_with_deadline(learner, endpoint, seconds: float = 120) -> None:
    """learner.run(endpoint), stopped as by a signal if it has not ended within `seconds`."""
    deadline = threading.Timer(seconds, learner.stop.set)
    deadline.start()
    try:
        learner.run(endpoint)
    finally:
        deadline.cancel()


def test_a_run_that_reaches_its_total_scores_the_round_due_there_before_it_ends(tmp_path, capsys):
    """With eval.every_env_steps at the run's total, the one round starts as the last chunk comes in: the run plays
    and logs it before it closes, instead of dropping the round in flight, and the summary holds its score."""
    learner = make_learner(tmp_path, "train.total_env_steps=600", "eval.every_env_steps=600", "eval.episodes=2")
    chunks = {f"collector{c}": [chain_chunk(c, seq, episodes=10) for seq in range(5)] for c in range(2)}
    endpoint = MemoryEndpoint(chunks, learner.cfg.collectors.max_chunks_in_flight, lost={})
    run_with_deadline(learner, endpoint)
    assert learner.ended == "total_env_steps" and learner.report.last_eval is not None
    assert learner.report.last_eval[2] == 600
    assert "reached train.total_env_steps: scoring the evaluation round still playing" in capsys.readouterr().out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["ended"] == "total_env_steps" and summary["best_eval_return"] == learner.report.last_eval[0]


def test_rounds_are_due_at_multiples_of_the_period_however_late_the_one_before_started():
    assert [next_round(e, 100_000) for e in (0, 99_999, 100_000, 102_304, 2_402_304)] == \
        [100_000, 100_000, 200_000, 200_000, 2_500_000]


@pytest.mark.parametrize("every", [200, 160])
def test_the_final_weights_are_scored_whether_or_not_the_total_is_a_multiple_of_the_period(tmp_path, every):
    """Chunks of 60 env steps, one at a time and none while a round plays, start each round past its due point: had
    the next been due a period after that, the rounds would drift past the total (200: at 240, 480, then due at 680)
    and the final weights would go unscored."""
    learner = make_learner(tmp_path, "train.total_env_steps=600", f"eval.every_env_steps={every}", "eval.episodes=2")
    chunks = {f"collector{c}": [chain_chunk(c, seq, episodes=10) for seq in range(5)] for c in range(2)}

    class Paced(MemoryEndpoint):
        def receive(self, timeout: float) -> list[Delivery]:
            if learner.evaluator is not None and learner.evaluator.busy:
                time.sleep(0.01)
                return []
            name = next((n for n, waiting in self._to_send.items() if waiting and not self._unanswered[n]), None)
            if name is None:
                return []
            self._unanswered[name] += 1
            self.delivered.append(chunk := self._to_send[name].popleft())
            return [Delivery(chunk)]

    endpoint = Paced(chunks, learner.cfg.collectors.max_chunks_in_flight, lost={})
    run_with_deadline(learner, endpoint)
    assert learner.ended == "total_env_steps" and learner.report.last_eval[2] == 600


def test_the_best_evaluated_network_is_kept_with_its_score(tmp_path):
    learner = make_learner(tmp_path, "eval.every_env_steps=60", "eval.episodes=3", "eval.epsilon=0")
    played, scores = [], []
    try:
        for seq in range(3):
            learner.intake.ingest(chain_chunk(0, seq, episodes=30))
            for _ in range(5):
                learner.step()                     # new weights for each round
            learner._evaluate()                    # a real evaluator process plays CartPole with them
            played.append({k: v.clone() for k, v in learner.eval_state.items()})
            where = {k: v.data_ptr() for k, v in learner.eval_state.items()}
            deadline = time.monotonic() + 60
            while learner.evaluator.busy and time.monotonic() < deadline:
                learner._evaluate()
                time.sleep(0.05)
            assert not learner.evaluator.busy, "no evaluation result in 60 s"
            # Sending them moved nothing under the learner (no thread swapped their storage for shared memory).
            assert {k: v.data_ptr() for k, v in learner.eval_state.items()} == where
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
    learner.intake.ingest(chain_chunk(0, 0, episodes=30))
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
    online.intake.ingest(chain_chunk(0, 0, episodes=30))
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
