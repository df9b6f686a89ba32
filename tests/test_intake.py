"""Chunks into replay: each collector's send order, the checks a delivery passes before it can enter, and the replay
ratio's gate on answers."""

from __future__ import annotations

import pytest
import torch
from chain import chain_chunk, make_learner

from rl_dqn.transport import Standing


def test_chunks_enter_replay_in_each_collectors_order(tmp_path):
    learner = make_learner(tmp_path)
    later, earlier = chain_chunk(1, seq=1, episodes=10), chain_chunk(1, seq=0, episodes=10)
    earlier.frames[:, :, 3] = 7.0      # mark the first chunk's frames
    learner.intake.ingest(later)
    assert learner.intake.env_steps == 0 and len(learner.trainer.replay) == 0      # held until seq 0 arrives
    learner.intake.ingest(earlier)
    assert learner.intake.env_steps == 120
    lanes = learner.trainer.replay.frames[2:4]                               # collector 1 owns lanes 2 and 3
    assert (lanes[:, :30, 3] == 7.0).all() and (lanes[:, 30:60, 3] == 0.0).all()
    assert learner.trainer.replay.written.tolist() == [0, 0, 60, 60]


def test_replay_ratio_is_held(tmp_path):
    learner = make_learner(tmp_path, "train.replay_ratio=2")
    learner.intake.ingest(chain_chunk(0, 0, episodes=10))                   # 60 env steps: before learning_starts
    assert not learner.intake.wants_update(learner.trainer.updates)
    for seq in (1, 2, 3):
        learner.intake.ingest(chain_chunk(0, seq, episodes=10))             # 240 env steps in all
    while learner.intake.wants_update(learner.trainer.updates):
        learner.step()
    assert learner.trainer.updates == 2 * (240 - 64) // 32                   # gradient samples = ratio x env steps


# At 64 each chunk owes 120 updates: 5 chunks a collector, more than twice its chunks in flight, keep it to 1,072.
@pytest.mark.parametrize("ratio, chunks", [(0.01, 20), (0.05, 20), (0.5, 20), (2, 20), (8, 10), (64, 5)])
def test_the_replay_ratio_gate_holds_collectors_back_without_stalling_them(tmp_path, ratio, chunks):
    """Driven as the learner's loop drives it, with two collectors that each stop sending at
    collectors.max_chunks_in_flight unanswered chunks: every chunk gets sent and answered (no stall), the training
    owed never runs more than the chunks in flight ahead of the updates, and at the end the updates are exactly the
    replay ratio's."""
    learner = make_learner(tmp_path, f"train.replay_ratio={ratio}")
    intake, limit = learner.intake, learner.cfg.collectors.max_chunks_in_flight
    sent, unanswered = [0, 0], [0, 0]
    chunk_samples = ratio * 60                                       # a chunk is 30 steps x 2 envs
    while True:
        moved = False
        for collector in (0, 1):
            if unanswered[collector] < limit and sent[collector] < chunks:
                learner.intake.ingest(chain_chunk(collector, sent[collector], episodes=10))
                intake.hold(collector)
                sent[collector] += 1
                unanswered[collector] += 1
                moved = True
        for collector in intake.release(learner.trainer.updates):
            unanswered[collector] -= 1
            moved = True
        if learner.intake.wants_update(learner.trainer.updates):
            learner.step()
            moved = True
        owed = intake.owed_samples(learner.trainer.updates)
        assert owed <= chunk_samples * (1 + 2 * limit) + 32, (ratio, intake.env_steps, learner.trainer.updates)
        if not moved:
            break
    assert sent == [chunks, chunks] and unanswered == [0, 0]
    assert learner.trainer.updates == int(ratio * (2 * chunks * 60 - 64) // 32)


def test_admit_says_what_became_of_each_delivery_and_counts_each_refusal(tmp_path):
    """Refused (with its cause, the first of each cause marked), held for an earlier chunk, or entered with the
    chunks held for it; a sender the run does not know, or one that was replaced, is refused."""
    intake = make_learner(tmp_path).intake
    later, earlier = chain_chunk(0, seq=1, episodes=10), chain_chunk(0, seq=0, episodes=10)
    assert intake.admit(later, Standing.NEWEST) == (None, False, [])                      # held for seq 0
    assert intake.admit(earlier, Standing.NEWEST).entered == [earlier, later]
    bad = chain_chunk(1, seq=0, episodes=10)._replace(rewards=torch.full((30, 2), float("nan")))
    assert intake.admit(bad, Standing.NEWEST) == ("non-finite reward", True, [])
    assert intake.admit(bad, Standing.NEWEST) == ("non-finite reward", False, [])
    assert intake.admit(chain_chunk(1, seq=0, episodes=10), Standing.UNKNOWN).refused == "unknown sender"
    assert intake.admit("hello", Standing.UNKNOWN).refused == "not a chunk (str)"
    assert intake.admit(earlier, Standing.NEWEST).refused == "a chunk sent twice"
    assert intake.admit(chain_chunk(1, seq=0, episodes=10)._replace(sender=9), Standing.FORMER).refused == \
        "from a collector process that was replaced"
    assert intake.rejected == {"non-finite reward": 2, "unknown sender": 1, "not a chunk (str)": 1,
                               "a chunk sent twice": 1, "from a collector process that was replaced": 1}
    assert intake.env_steps == 120


def test_a_chunks_episode_epsilons_must_be_one_per_episode_and_within_0_and_1(tmp_path):
    """A chunk may say at which epsilon each of its episodes was played (None: it does not); one that says so in
    the wrong form is refused with the cause, and enters nothing."""
    intake = make_learner(tmp_path).intake
    good = chain_chunk(0, seq=0, episodes=10)          # 20 episodes ended in it
    assert intake.admit(good._replace(episode_epsilons=torch.full((20,), 0.01)), Standing.NEWEST).refused is None
    wrong_form = "episode_epsilons is not None or a float32 list as long as episode_returns"
    for bad in (torch.full((19,), 0.01), torch.full((20,), 0.01, dtype=torch.float64), [0.01] * 20):
        assert intake.admit(chain_chunk(1, seq=0, episodes=10)._replace(episode_epsilons=bad),
                            Standing.NEWEST).refused == wrong_form
    for value in (-0.1, 1.5, float("nan")):
        assert intake.admit(chain_chunk(1, seq=0, episodes=10)._replace(episode_epsilons=torch.full((20,), value)),
                            Standing.NEWEST).refused == "episode epsilon outside 0..1"
    assert intake.env_steps == 60


def test_a_chunk_with_values_that_would_poison_replay_is_refused_and_sampling_goes_on(tmp_path):
    """A collector whose network diverged sends NaN Q-values, which become initial priorities: one of them in the
    sum tree and no batch could be drawn again. Such a chunk, and one with non-finite frames, a negative episode
    length or a tensor that holds no data, is refused with its cause; the replay still samples."""
    learner = make_learner(tmp_path, "train.prioritized=true", "train.initial_priority=collectors")
    intake = learner.intake
    nan = torch.full((30, 2), float("nan"))
    frames = chain_chunk(1, seq=0, episodes=10).frames.clone()
    frames[3, 1, 0] = float("inf")
    bad = {"non-finite Q-value": dict(q_taken=nan), "non-finite frame": dict(frames=frames),
           "negative episode length": dict(episode_lengths=torch.full((20,), -2)),
           "actions is not a dense tensor holding data":
               dict(actions=chain_chunk(1, seq=0, episodes=10).actions.to_sparse())}
    for cause, fields in bad.items():
        assert intake.admit(chain_chunk(1, seq=0, episodes=10)._replace(**fields), Standing.NEWEST).refused == cause
    assert intake.admit(chain_chunk(1, seq=0, episodes=10)._replace(q_max=nan), Standing.NEWEST).refused == \
        "non-finite Q-value"
    for seq in range(3):
        assert intake.admit(chain_chunk(0, seq=seq, episodes=10), Standing.NEWEST).refused is None
    batch = learner.trainer.replay.sample(32, torch.Generator().manual_seed(0), 0.4, 1)
    assert torch.isfinite(batch.weights).all()
    learner.step()


def test_refused_chunks_of_a_process_and_of_the_one_it_replaces_are_each_passed_over(tmp_path):
    """A new process's first chunk is refused, then one of the process it replaces still in flight: each one's
    later chunks go on without its refused one."""
    learner = make_learner(tmp_path)
    intake = learner.intake
    nan = {"rewards": torch.full((30, 2), float("nan"))}
    assert intake.admit(chain_chunk(0, seq=0, episodes=10)._replace(sender=1), Standing.NEWEST).entered
    assert intake.admit(chain_chunk(0, seq=0, episodes=10)._replace(sender=2, **nan), Standing.NEWEST).refused
    assert intake.admit(chain_chunk(0, seq=1, episodes=10)._replace(sender=1, **nan), Standing.FORMER).refused
    entered = intake.admit(chain_chunk(0, seq=1, episodes=10)._replace(sender=2), Standing.NEWEST).entered
    assert [(chunk.sender, chunk.seq) for chunk in entered] == [(2, 1)] and intake.env_steps == 2 * 60


def test_a_refused_chunk_is_passed_over_and_the_collectors_later_chunks_enter_starting_new_episodes(tmp_path):
    """One chunk with a NaN reward from a live collector: its later chunks, which would wait for it forever, enter
    replay in order, the first of them starting new episodes in its lanes (the refused steps are not there for
    its stacks and returns to continue). The refused chunk may arrive after the chunk that follows it, which then
    enters at once rather than waiting for the next one (the last chunk of a run has none)."""
    learner = make_learner(tmp_path)
    intake = learner.intake
    assert intake.admit(chain_chunk(0, seq=0, episodes=10), Standing.NEWEST).entered
    after = chain_chunk(0, seq=2, episodes=10)
    after.first[0] = False   # mid-episode, as a chunk usually begins
    assert intake.admit(after, Standing.NEWEST).entered == []               # waits for seq 1
    nan = chain_chunk(0, seq=1, episodes=10)._replace(rewards=torch.full((30, 2), float("nan")))
    refused = intake.admit(nan, Standing.NEWEST)
    assert refused.refused == "non-finite reward"
    assert [chunk.seq for chunk in refused.entered] == [2] and refused.entered[0].first[0].all()
    assert not after.first[0].any()   # the sender's tensors are left as they came
    assert [chunk.seq for chunk in intake.admit(chain_chunk(0, seq=3, episodes=10), Standing.NEWEST).entered] == [3]
    assert intake.env_steps == 3 * 60 and intake.rejected == {"non-finite reward": 1}
    replay = learner.trainer.replay
    assert replay.written[:2].tolist() == [90, 90] and replay.first[:2, 30].all()


def test_a_refused_chunks_place_stays_open_until_the_chunk_after_it_has_come(tmp_path):
    """A chunk held further on (seq 3) does not close the place of a refused seq 1: the same seq sent again, good,
    still enters there; only the chunk right after it (seq 2) passes it over."""
    for refused_first in (False, True):   # seq 3 held before the refusal, or arriving after it
        intake = make_learner(tmp_path).intake
        assert intake.admit(chain_chunk(0, seq=0, episodes=10), Standing.NEWEST).entered
        nan = chain_chunk(0, seq=1, episodes=10)._replace(rewards=torch.full((30, 2), float("nan")))
        if refused_first:
            assert intake.admit(nan, Standing.NEWEST) == ("non-finite reward", True, [])
        assert intake.admit(chain_chunk(0, seq=3, episodes=10), Standing.NEWEST).entered == []
        if not refused_first:
            assert intake.admit(nan, Standing.NEWEST) == ("non-finite reward", True, [])
        again = chain_chunk(0, seq=1, episodes=10)
        again.first[0] = False   # it continues the episodes of seq 0, with nothing missing in between
        entered = intake.admit(again, Standing.NEWEST).entered
        assert [chunk.seq for chunk in entered] == [1] and not entered[0].first[0].any()
        assert [c.seq for c in intake.admit(chain_chunk(0, seq=2, episodes=10), Standing.NEWEST).entered] == [2, 3]
