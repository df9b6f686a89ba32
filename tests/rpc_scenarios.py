"""Process bodies for the transport contract tests (spawned processes import this module by name).

Each process reports what it saw as (who, event, value) tuples on a shared queue; the tests read the order."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import torch

from rl_dqn.config import load_config
from rl_dqn.transport import CollectorTransport, LearnerTransport, TransportError, place
from rl_dqn.types import Ack, Chunk, Weights

ROOT = Path(__file__).resolve().parents[1]
T, E = 4, 2


def config(port: int, kind: str, world_size: int, *extra: str):
    return load_config(ROOT / "configs/cartpole.yaml", [*extra,
        "run.name=contract", f"transport.kind={kind}", f"cluster.init_method=tcp://127.0.0.1:{port}",
        f"cluster.world_size={world_size}", f"collectors.count={world_size - 1}", "cluster.interface=lo",
        f"collectors.chunk_steps={T}", f"env.envs_per_collector={E}", "collectors.max_chunks_in_flight=2",
        "cluster.single_node=true", "cluster.rank=1",
        "cluster.join_timeout_s=60", "transport.rpc_timeout_s=1"])


def device(kind: str) -> torch.device:
    """Where each side's tensors live: over the cuda transport, every process here shares cuda:0."""
    return torch.device("cuda", 0) if kind == "cuda" else torch.device("cpu")


def make_chunk(collector: int, seq: int, kind: str = "cpu") -> Chunk:
    """Frames filled with a value that identifies the chunk."""
    value, d = 100 * collector + seq, device(kind)
    return Chunk(collector, seq, 0, torch.full((T, E, 4), float(value), device=d),
                 torch.zeros(T, E, dtype=torch.int64, device=d), torch.ones(T, E, device=d),
                 torch.zeros(T, E, dtype=torch.bool, device=d), torch.zeros(T, E, dtype=torch.bool, device=d),
                 torch.tensor([float(value)], dtype=torch.float64), torch.tensor([7]),
                 torch.full((T, E), value / 2, device=d), torch.full((T, E), float(value), device=d),
                 episode_epsilons=torch.tensor([0.01]))


def weights(version: int, kind: str = "cpu") -> Weights:
    """Contents that say their version (never zeros, which unwritten memory may also hold)."""
    return Weights(version, {"w": torch.full((3,), version + 0.25, device=device(kind))})


def intact(received: Weights) -> bool:
    return torch.equal(received.state["w"].cpu(), weights(received.version).state["w"])


def _wait(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.01)


# ------------------------------------------------------------------------------ the main contract scenario


def contract_learner(port: int, kind: str, events) -> None:
    cfg = config(port, kind, world_size=3)
    transport = LearnerTransport(cfg, threading.Event(), place(cfg, 0, torch.cuda.device_count()))
    try:
        transport.publish(weights(0, kind))
        held = []

        def take():
            held.extend(transport.receive(timeout=0.05))
            return held
        # collector0 sends 3 chunks and then waits for the first answer; collector1 sends 2. The answers are held
        # for three times transport.rpc_timeout_s, as a learner busy training holds them: nobody may give up.
        _wait(lambda: len(take()) >= 5, 30, "5 chunks")
        time.sleep(3.0)
        take()
        events.put(("learner", "held", sorted((d.chunk.collector, d.chunk.seq) for d in held)))
        for d in held:
            expected = make_chunk(d.chunk.collector, d.chunk.seq, kind)
            intact = all(torch.equal(a, b) for a, b in zip(d.chunk, expected) if isinstance(b, torch.Tensor))
            events.put(("learner", "intact", (d.chunk.collector, d.chunk.seq, intact)))
            events.put(("learner", "chunk device", str(d.chunk.frames.device)))
        first = next(d for d in held if d.chunk.collector == 0 and d.chunk.seq == 0)
        transport.acknowledge(first, Ack(env_steps=123, stop=False))
        _wait(lambda: any(d.chunk.seq == 3 for d in take()), 20, "collector0's fourth chunk")
        events.put(("learner", "fourth chunk arrived", True))
        for version in (1, 2):
            # Pushed to both (the first weights went out with their admission, as a CPU copy).
            events.put(("learner", f"published v{version} to", transport.publish(weights(version, kind))))
            # Delivered before the next version (publish() skips a collector still receiving the previous one).
            _wait(lambda: all(f.done() for f in transport._publishing.values()), 20, f"v{version} delivered")
        transport.stop_collectors(timeout=10)
        events.put(("learner", "lost", dict(transport.lost)))
    finally:
        transport.close()


def contract_collector(port: int, kind: str, index: int, events) -> None:
    cfg = config(port, kind, world_size=3)
    transport = CollectorTransport(cfg, index, threading.Event(), place(cfg, index + 1, torch.cuda.device_count()))
    try:
        first = transport.wait_weights(timeout=30)
        events.put((f"collector{index}", "weights", first.version))
        events.put((f"collector{index}", "weights intact", intact(first)))
        for seq in range(4 if index == 0 else 2):
            ack = transport.send(make_chunk(index, seq, kind))
            events.put((f"collector{index}", "sent", seq))
            if ack is not None:
                events.put((f"collector{index}", "ack", tuple(ack)))
        versions = []
        deadline = time.monotonic() + 30
        while not transport.stop_requested and time.monotonic() < deadline:
            w = transport.poll_weights()
            if w is not None:
                versions.append(w.version)
                events.put((f"collector{index}", "weights device", str(w.state["w"].device)))
                events.put((f"collector{index}", "weights intact", intact(w)))
            time.sleep(0.01)
        w = transport.poll_weights()   # collector0 was waiting on an answer while the weights arrived
        if w is not None:
            versions.append(w.version)
        events.put((f"collector{index}", "versions", versions))
        events.put((f"collector{index}", "stopped", transport.stop_requested))
    finally:
        transport.close()
    events.put((f"collector{index}", "closed", True))


# ---------------------------------------------------------------------------- a learner that hangs or dies


def _learner_that_took_a_chunk(port: int, kind: str) -> LearnerTransport:
    """A learner of a one-collector run that has published weights and received a chunk it will not answer."""
    cfg = config(port, kind, world_size=2)
    transport = LearnerTransport(cfg, threading.Event(), place(cfg, 0, torch.cuda.device_count()))
    transport.publish(weights(0, kind))
    _wait(lambda: transport.receive(timeout=0.05), 30, "a chunk")
    return transport


def stalled_learner(port: int, kind: str, events) -> None:
    """Takes chunks and never answers; the test stops this process (SIGSTOP) as if it hung."""
    _learner_that_took_a_chunk(port, kind)
    # `events` is this process's own queue: stopped while its feeder thread holds a queue's write lock (the test
    # may read the event before the lock is let go), it would block every other writer of that queue.
    events.put(("learner", "took a chunk", os.getpid()))
    time.sleep(600)


def dying_learner(port: int, kind: str, events) -> None:
    _learner_that_took_a_chunk(port, kind)
    events.put(("learner", "dying", time.monotonic()))
    events.close()
    events.join_thread()          # the event must leave before the process does
    os.kill(os.getpid(), signal.SIGKILL)


def _send_until_an_error(port: int, kind: str, events, chunks: int, pause_s: float) -> None:
    """A lone collector sends `chunks` chunks `pause_s` apart and reports the TransportError that stops it
    (None if none did)."""
    cfg = config(port, kind, world_size=2)
    transport = CollectorTransport(cfg, 0, threading.Event(), place(cfg, 1, torch.cuda.device_count()))
    transport.wait_weights(timeout=30)
    try:
        for seq in range(chunks):
            transport.send(make_chunk(0, seq, kind))
            time.sleep(pause_s)
        events.put(("collector0", "error", None))
    except TransportError as e:
        events.put(("collector0", "error", (str(e), time.monotonic())))
    finally:
        transport.close()
    events.put(("collector0", "closed", True))


def orphaned_collector(port: int, kind: str, events) -> None:
    _send_until_an_error(port, kind, events, chunks=1000, pause_s=0.05)


def waiting_collector(port: int, kind: str, events) -> None:
    """Sends until it has to wait for an answer, and reports how that wait ends."""
    _send_until_an_error(port, kind, events, chunks=10, pause_s=0.0)


# ------------------------------------------------------------------------- a collector killed and replaced


def replacing_learner(port: int, kind: str, events) -> None:
    """Answers every chunk and reports who sent it; once a second process of collector0's slot has sent one,
    publishes new weights to it (over a CUDA run, GPU to GPU: what a learner that lost its GPU to a leave fails)."""
    cfg = config(port, kind, world_size=2)
    transport = LearnerTransport(cfg, threading.Event(), place(cfg, 0, torch.cuda.device_count()))
    try:
        transport.publish(weights(0, kind))
        senders, published, deadline = [], False, time.monotonic() + 60
        while time.monotonic() < deadline and not published:
            for d in transport.receive(timeout=0.05):
                expected = make_chunk(d.chunk.collector, d.chunk.seq, kind)
                same = all(torch.equal(a, b) for a, b in zip(d.chunk, expected) if isinstance(b, torch.Tensor))
                events.put(("learner", "chunk", (d.chunk.seq, same, str(d.chunk.frames.device))))
                if d.chunk.sender not in senders:
                    senders.append(d.chunk.sender)
                transport.acknowledge(d, Ack(0, stop=False))
            transport.watch()
            if len(senders) == 2:
                events.put(("learner", "published v1 to", transport.publish(weights(1, kind))))
                published = True
        _wait(lambda: transport._publishing.get("collector0") is not None
              and transport._publishing["collector0"].done(), 20, "v1 to arrive")
        transport.stop_collectors(timeout=10)
        changes = []
        while not transport.changes.empty():
            changes.append(transport.changes.get().what.value)
        events.put(("learner", "changes", changes))
    finally:
        transport.close()


def killed_collector(port: int, kind: str, events) -> None:
    """Joins collector0's slot, sends a chunk, and dies (SIGKILL) once the learner has answered it: a process
    killed while its chunk is on the way loses that chunk (over CUDA IPC the sender must outlive the copy)."""
    cfg = config(port, kind, world_size=2)
    transport = CollectorTransport(cfg, 0, threading.Event(), place(cfg, 1, torch.cuda.device_count()))
    transport.wait_weights(timeout=30)
    transport.send(make_chunk(0, 0, kind))
    # The transport drops a chunk from _in_flight once its answer is handled, which may be before this first looks.
    _wait(lambda: not transport._in_flight or transport._in_flight[0].done(), 30, "the learner's answer to the chunk")
    events.put(("killed collector", "sent", 0))
    events.close()
    events.join_thread()
    os.kill(os.getpid(), signal.SIGKILL)


def replacement_collector(port: int, kind: str, events) -> None:
    """Takes collector0's slot after the killed process, sends a chunk, and reports the weights it gets."""
    cfg = config(port, kind, world_size=2)
    transport = CollectorTransport(cfg, 0, threading.Event(), place(cfg, 1, torch.cuda.device_count()))
    try:
        first = transport.wait_weights(timeout=30)
        events.put(("replacement", "weights", (first.version, intact(first))))
        transport.send(make_chunk(0, 0, kind))
        deadline = time.monotonic() + 30
        while not transport.stop_requested and time.monotonic() < deadline:
            w = transport.poll_weights()
            if w is not None:
                events.put(("replacement", "weights", (w.version, intact(w), str(w.state["w"].device))))
            time.sleep(0.01)
        events.put(("replacement", "stopped", transport.stop_requested))
    finally:
        transport.close()


def late_publishing_learner(port: int, kind: str, events) -> None:
    """Publishes its first weights only once collector0 has joined (a learner still building its network)."""
    cfg = config(port, kind, world_size=2)
    transport = LearnerTransport(cfg, threading.Event(), place(cfg, 0, torch.cuda.device_count()))
    try:
        _wait(lambda: "collector0" in transport.alive, 30, "collector0 to join")
        events.put(("learner", "published v0 to", transport.publish(weights(0, kind))))
        _wait(lambda: transport._publishing["collector0"].done(), 20, "v0 to arrive")
        transport.stop_collectors(timeout=10)
    finally:
        transport.close()


def early_collector(port: int, kind: str, events) -> None:
    """Joins before the learner has published anything; reports the weights it then gets."""
    cfg = config(port, kind, world_size=2)
    transport = CollectorTransport(cfg, 0, threading.Event(), place(cfg, 1, torch.cuda.device_count()))
    try:
        first = transport.wait_weights(timeout=30)
        events.put(("collector0", "weights", (first.version, intact(first), str(first.state["w"].device))))
        _wait(lambda: transport.stop_requested, 30, "the learner's stop")
    finally:
        transport.close()


def slow_forgetting_learner(port: int, kind: str, events) -> None:
    """Stops its one collector, whose goodbye takes a second to be dropped from this process's RPC agent, and
    reports whether it left RPC only after that drop had ended (an agent changed while it shuts down can crash)."""
    from rl_dqn.transport import rpc as rpc_transport
    cfg = config(port, kind, world_size=2)
    transport = LearnerTransport(cfg, threading.Event(), place(cfg, 0, torch.cuda.device_count()))
    forget, leave, forgot = transport.registry.forget, rpc_transport._leave, []

    def slow_forget(name: str) -> None:
        time.sleep(1.0)
        forget(name)
        forgot.append(name)

    def leave_and_report() -> None:
        events.put(("learner", "left after forgetting", list(forgot)))
        leave()
    transport.registry.forget = slow_forget
    rpc_transport._leave = leave_and_report
    try:
        transport.publish(weights(0, kind))
        _wait(lambda: "collector0" in transport.alive, 30, "collector0 to join")
        transport.stop_collectors(timeout=10)
    finally:
        transport.close()


# ------------------------------------------------------------------------- many collectors joining at once

CROWD, CROWD_THREADS = 5, 2   # more collectors joining together than the learner has RPC threads


def crowded_learner(port: int, kind: str, events, go) -> None:
    """A learner with CROWD_THREADS RPC threads that CROWD collectors join at once; each join's call that updates
    this process's member list takes half a second here, as on a loaded machine, so that collectors which have
    joined say hello while another still holds the group's join token. Reports how many joined and how soon."""
    from torch.distributed.rpc import _utils

    update = _utils._update_group_membership

    def slow_update(*args):
        time.sleep(0.5)
        return update(*args)
    cfg = config(port, kind, CROWD + 1, f"transport.worker_threads={CROWD_THREADS}", "transport.rpc_timeout_s=5")
    transport = LearnerTransport(cfg, threading.Event(), place(cfg, 0, torch.cuda.device_count()))
    # What a joiner's RPC to this process runs, by name (set once this process has joined, which calls it itself).
    _utils._update_group_membership = slow_update
    try:
        transport.publish(weights(0, kind))
        go.set()
        start = time.monotonic()
        while len(transport.alive) < CROWD and time.monotonic() - start < 30:
            time.sleep(0.05)
        events.put(("learner", "joined", (len(transport.alive), time.monotonic() - start)))
        transport.stop_collectors(timeout=10)
        events.put(("learner", "lost", dict(transport.lost)))
    finally:
        transport.close()


def crowd_collector(port: int, kind: str, index: int, events, go) -> None:
    """Joins once the learner is up, together with the rest of the crowd, and stays until the run stops."""
    cfg = config(port, kind, CROWD + 1, f"transport.worker_threads={CROWD_THREADS}", "transport.rpc_timeout_s=5")
    go.wait(60)
    try:
        transport = CollectorTransport(cfg, index, threading.Event(), place(cfg, index + 1, torch.cuda.device_count()))
    except TransportError as e:
        events.put((f"collector{index}", "error", str(e)))
        return
    try:
        events.put((f"collector{index}", "weights", transport.wait_weights(timeout=30).version))
        deadline = time.monotonic() + 40
        while not transport.stop_requested and time.monotonic() < deadline:
            time.sleep(0.05)
        events.put((f"collector{index}", "stopped", transport.stop_requested))
    finally:
        transport.close()


# ------------------------------------------------------------------------------------------------ bad data


def guarded_learner(port: int, events, sender_done) -> None:
    """A real Learner on CartPole (4 floats per frame, 2 actions) that takes chunks until the sender is done."""
    from envs import describe_env
    from rl_dqn.learner import Learner
    cfg = config(port, "cpu", 2, "train.replay_ratio=0", "train.replay_capacity=1000", "eval.every_env_steps=0")
    stop = threading.Event()
    learner = Learner(cfg, describe_env(cfg.env), Path(os.environ["RL_DQN_TEST_RUN_DIR"]), stop=stop)
    threading.Thread(target=lambda: (sender_done.wait(60), time.sleep(1.0), stop.set()), daemon=True).start()
    transport = LearnerTransport(cfg, stop, place(cfg, 0, 0))
    learner.run(transport)
    events.put(("learner", "rejected", dict(learner.intake.rejected)))
    events.put(("learner", "env_steps", learner.intake.env_steps))
    events.put(("learner", "replay frames", learner.trainer.replay.frames[0, :T + 1, 0].tolist()))


def bad_sender(port: int, events, sender_done) -> None:
    """Joins as collector0, sends a good chunk, one bad chunk of each kind, then another good chunk."""
    cfg = config(port, "cpu", world_size=2)
    transport = CollectorTransport(cfg, 0, threading.Event(), place(cfg, 1, 0))
    transport.wait_weights(timeout=30)
    good = make_chunk(0, 0)._replace(actions=torch.ones(T, E, dtype=torch.int64))
    bad = {
        "wrong shape": good._replace(seq=1, frames=torch.zeros(T, E, 5)),
        "wrong dtype": good._replace(seq=1, frames=torch.zeros(T, E, 4, dtype=torch.float64)),
        "action out of range": good._replace(seq=1, actions=torch.full((T, E), 2)),
        "nan reward": good._replace(seq=1, rewards=torch.full((T, E), float("nan"))),
        "episode epsilon above 1": good._replace(seq=1, episode_epsilons=torch.tensor([2.0])),
        "not a chunk": "rm -rf /",
    }
    try:
        transport.send(good)
        for what, chunk in bad.items():
            if isinstance(chunk, Chunk):
                answer = transport.send(chunk)
            else:
                answer = rpc_call(chunk)
            events.put(("sender", what, answer is not None))
        # From an unknown sender: a forged RPC id, straight through the RPC function.
        events.put(("sender", "forged", tuple(rpc_call(good._replace(seq=1, sender=999)))))
        transport.send(good._replace(seq=1, frames=torch.full((T, E, 4), 5.0)))
        events.put(("sender", "good after bad", True))
    finally:
        transport.close()   # waits for the answers to the chunks sent, before the learner is told to stop
        sender_done.set()


def rpc_call(message):
    import torch.distributed.rpc as rpc

    from rl_dqn.transport import rpc as transport_rpc
    return rpc.rpc_sync("learner", transport_rpc._submit_chunk, args=(message,), timeout=10)


# ------------------------------------------------------------------------------------------------- signals


def signalled_learner(port: int, events) -> None:
    """A learner transport waiting for chunks in the main thread, where a signal lands whose handler outlasts the
    wait's timeout (a SimpleQueue there once waited for good, and a stop signal never stopped the learner)."""
    cfg = config(port, "cpu", world_size=2)
    transport = LearnerTransport(cfg, threading.Event(), place(cfg, 0, 0))
    signal.signal(signal.SIGALRM, lambda *_: time.sleep(0.1))
    try:
        for _ in range(3):
            signal.setitimer(signal.ITIMER_REAL, 0.01)
            started = time.monotonic()
            delivered = transport.receive(timeout=0.05)
            events.put(("learner", "waited", (round(time.monotonic() - started, 2), delivered)))
    finally:
        transport.close()
