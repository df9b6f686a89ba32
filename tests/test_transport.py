"""Transport contract: the same scenarios run over every transport kind, with real processes and real RPC. The main
contract over the CPU transport is in the fast tests (`-m "not slow"`); the faults, which wait out RPC timeouts, are
marked slow, as their causes' handling is also driven in memory (test_learner.py, test_intake.py)."""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import time

import pytest

import rpc_scenarios
from rl_dqn.supervisor import free_port

KINDS = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.cuda)]


def run_processes(targets, timeout: float = 60.0, extra: tuple = ()) -> list[tuple]:
    """Runs each (function, args) in a spawned process with (events, *extra) after its args; returns every event
    they reported, in order."""
    context = multiprocessing.get_context("spawn")
    events = context.Queue()
    processes = [context.Process(target=f, args=(*args, events, *extra)) for f, args in targets]
    for p in processes:
        p.start()
    deadline = time.monotonic() + timeout
    for p in processes:
        p.join(max(deadline - time.monotonic(), 0.1))
    alive = [p for p in processes if p.is_alive()]
    for p in alive:
        p.kill()
    reported = drained(events)
    assert not alive, f"processes still running after {timeout} s; events: {reported}"
    return reported


def drained(events) -> list[tuple]:
    """Every event on the queue, once its writers are done."""
    reported = []
    while True:
        try:
            reported.append(events.get(timeout=0.5))
        except queue.Empty:
            return reported


@pytest.mark.parametrize("kind", KINDS)
def test_chunks_answers_throttle_weights_and_stop(kind):
    port = free_port()
    events = run_processes([(rpc_scenarios.contract_learner, (port, kind)),
                            (rpc_scenarios.contract_collector, (port, kind, 0)),
                            (rpc_scenarios.contract_collector, (port, kind, 1))])
    by = {(who, what): value for who, what, value in events}
    order = [(who, what, value) for who, what, value in events]
    # Both collectors start from the learner's first weights, and every weights they get hold what was sent (the
    # first come as a CPU copy made on an RPC thread, which must wait for the GPU work that made them).
    assert by[("collector0", "weights")] == 0 and by[("collector1", "weights")] == 0
    assert [v for who, what, v in events if what == "weights intact"] and \
        all(v for who, what, v in events if what == "weights intact"), events
    # Over the cuda transport, chunks land on the learner's GPU and weights on the collectors', no host staging.
    expected = "cuda:0" if kind == "cuda" else "cpu"
    assert {v for who, what, v in events if what in ("chunk device", "weights device")} == {expected}
    # Every chunk arrives intact, from both collectors; collector0 stops after 3 unanswered chunks
    # (2 in flight, the third waits for the first answer).
    assert by[("learner", "held")] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
    assert all(intact for who, what, (_, _, intact) in
               [(w, e, v) for w, e, v in events if e == "intact"]), events
    third_sent = order.index(("collector0", "sent", 2))
    held = next(i for i, (who, what, _) in enumerate(order) if what == "held")
    assert held < third_sent, "collector0's third send returned before the learner answered a chunk"
    acks = [value for who, what, value in events if (who, what) == ("collector0", "ack")]
    # The learner's answer, then its stop; a member of the run is never told it was dropped.
    assert acks[0] == (123, False, False) and acks[-1] == (0, True, False)
    assert by[("learner", "fourth chunk arrived")]
    # Newer weights reach both collectors and replace older ones; stop reaches both; nobody was lost.
    assert by[("learner", "published v1 to")] == 2 and by[("learner", "published v2 to")] == 2
    for i in (0, 1):
        versions = by[(f"collector{i}", "versions")]
        assert versions and versions[-1] == 2 and versions == sorted(versions)
        assert by[(f"collector{i}", "stopped")] and by[(f"collector{i}", "closed")]
    assert by[("learner", "lost")] == {}


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_collector_notices_a_dead_learner(kind):
    port = free_port()
    events = run_processes([(rpc_scenarios.dying_learner, (port, kind)),
                            (rpc_scenarios.orphaned_collector, (port, kind))])
    by = {(who, what): value for who, what, value in events}
    message, noticed = by[("collector0", "error")]
    assert message.startswith("learner unreachable")
    assert noticed - by[("learner", "dying")] < 10.0
    assert by[("collector0", "closed")]


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_collector_notices_a_hung_learner(kind):
    """A learner that stops answering (SIGSTOP) is found by the ping within a few transport.rpc_timeout_s (1 s)."""
    port = free_port()
    context = multiprocessing.get_context("spawn")
    events, learner_events = context.Queue(), context.Queue()   # the learner's own: see stalled_learner
    learner = context.Process(target=rpc_scenarios.stalled_learner, args=(port, kind, learner_events))
    collector = context.Process(target=rpc_scenarios.waiting_collector, args=(port, kind, events))
    learner.start()
    collector.start()
    try:
        who, what, pid = learner_events.get(timeout=60)
        assert (who, what) == ("learner", "took a chunk")
        os.kill(pid, signal.SIGSTOP)
        stopped = time.monotonic()
        who, what, value = events.get(timeout=30)
        message, noticed = value
        assert (who, what) == ("collector0", "error") and message.startswith("learner unreachable: no answer to a ping")
        assert noticed - stopped < 10.0   # a ping each second, each given 1 s: with room for a loaded machine
        collector.join(timeout=30)
        assert collector.exitcode == 0
    finally:
        for p in (learner, collector):
            if p.is_alive():
                p.kill()


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_a_killed_collectors_replacement_gets_chunks_through_and_new_weights(kind):
    """A collector killed with SIGKILL is forgotten and a new process takes its slot; the learner's next weights
    reach the new process, GPU to GPU over the cuda transport (a leave once took the learner's GPU from TensorPipe's
    device list, and its next CUDA send failed)."""
    port = free_port()
    context = multiprocessing.get_context("spawn")
    events = context.Queue()
    learner = context.Process(target=rpc_scenarios.replacing_learner, args=(port, kind, events))
    first = context.Process(target=rpc_scenarios.killed_collector, args=(port, kind, events))
    replacement = context.Process(target=rpc_scenarios.replacement_collector, args=(port, kind, events))
    learner.start()
    first.start()
    try:
        first.join(timeout=60)
        assert first.exitcode == -signal.SIGKILL
        replacement.start()
        replacement.join(timeout=60)
        learner.join(timeout=60)
        reported = drained(events)
    finally:
        for p in (learner, first, replacement):
            if p.pid is not None and p.is_alive():
                p.kill()
    by = {}
    for who, what, value in reported:
        by.setdefault((who, what), []).append(value)
    expected = "cuda:0" if kind == "cuda" else "cpu"
    assert by[("learner", "chunk")] == [(0, True, expected), (0, True, expected)], reported
    assert by[("learner", "published v1 to")] == [1]
    assert by[("replacement", "weights")][0] == (0, True)
    assert by[("replacement", "weights")][-1] == (1, True, expected)
    assert by[("replacement", "stopped")] == [True]
    changes = by[("learner", "changes")][0]
    assert changes[:2] == ["joined", "lost"] and changes.count("joined") == 2, changes


@pytest.mark.parametrize("kind", KINDS)
def test_collectors_that_join_together_all_get_in_though_they_outnumber_the_learners_rpc_threads(kind):
    """A node's collectors get ready before the learner and join it together. Each joiner holds the group's join
    token while it calls the learner; the learner once answered each hello on its RPC thread by waiting for that
    token, so with more collectors than RPC threads every thread waited for a joiner that waited for a thread: the
    joins timed out and the run stalled."""
    port = free_port()
    context = multiprocessing.get_context("spawn")
    go = context.Event()
    crowd = rpc_scenarios.CROWD
    events = run_processes([(rpc_scenarios.crowded_learner, (port, kind))]
                           + [(rpc_scenarios.crowd_collector, (port, kind, i)) for i in range(crowd)],
                           timeout=120, extra=(go,))
    by = {(who, what): value for who, what, value in events}
    joined, seconds = by[("learner", "joined")]
    assert joined == crowd, events
    assert [who for who, what, _ in events if what == "error"] == [], events
    assert all(by[(f"collector{i}", "weights")] == 0 and by[(f"collector{i}", "stopped")] for i in range(crowd))
    assert by[("learner", "lost")] == {}


@pytest.mark.slow
def test_bad_chunks_are_refused_counted_and_replay_stays_intact(tmp_path, monkeypatch):
    """A real learner takes a good chunk, refuses each kind of bad one (counted once per cause), never crashes, and
    takes the next good chunk into the same place in replay as if the bad ones had not come."""
    monkeypatch.setenv("RL_DQN_TEST_RUN_DIR", str(tmp_path))
    port = free_port()
    context = multiprocessing.get_context("spawn")
    done = context.Event()
    events = run_processes([(rpc_scenarios.guarded_learner, (port,)), (rpc_scenarios.bad_sender, (port,))],
                           extra=(done,))
    by = {(who, what): value for who, what, value in events}
    assert by[("sender", "good after bad")]
    assert by[("sender", "forged")][2] is True    # the answer tells a stranger it is not in the run
    rejected = by[("learner", "rejected")]
    assert rejected == {
        "frames has shape (4, 2, 5), not (4, 2, 4)": 1,
        "frames has dtype torch.float64, not torch.float32": 1,
        "action out of range 0..1": 1,
        "non-finite reward": 1,
        "episode epsilon outside 0..1": 1,
        "not a chunk (str)": 1,
        "unknown sender": 1,
    }, rejected
    assert by[("learner", "env_steps")] == 2 * rpc_scenarios.T * rpc_scenarios.E
    # Lane 0: the first chunk's frames (value 0), then the second good chunk's (value 5).
    assert by[("learner", "replay frames")] == [0.0] * rpc_scenarios.T + [5.0]


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_a_collector_that_joins_before_the_first_publish_gets_those_weights(kind):
    port = free_port()
    events = run_processes([(rpc_scenarios.late_publishing_learner, (port, kind)),
                            (rpc_scenarios.early_collector, (port, kind))])
    by = {(who, what): value for who, what, value in events}
    assert by[("learner", "published v0 to")] == 1, events
    assert by[("collector0", "weights")] == (0, True, "cuda:0" if kind == "cuda" else "cpu"), events


def test_the_learner_leaves_rpc_only_once_its_agent_has_dropped_the_collectors_that_said_goodbye():
    """A goodbye takes the collector out of the learner's live set before its RPC agent drops it, on an RPC thread:
    the learner, which has then seen everyone leave, waits for that drop before it shuts the agent down."""
    port = free_port()
    events = run_processes([(rpc_scenarios.slow_forgetting_learner, (port, "cpu")),
                            (rpc_scenarios.early_collector, (port, "cpu"))])
    by = {(who, what): value for who, what, value in events}
    assert by[("learner", "left after forgetting")] == ["collector0"], events


def test_a_signal_during_the_learners_wait_does_not_make_it_wait_for_good():
    """The learner's loop waits for chunks with a timeout in the main thread; a signal whose handler runs past that
    timeout (a stop signal on a busy machine) still lets the wait end, so the loop sees the stop."""
    events = run_processes([(rpc_scenarios.signalled_learner, (free_port(),))], timeout=45)
    waits = [value for who, what, value in events if what == "waited"]
    assert len(waits) == 3 and all(delivered == [] and took < 5 for took, delivered in waits), events
