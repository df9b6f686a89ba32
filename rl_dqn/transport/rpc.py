"""Chunks, acknowledgements, weights and the stop signal over torch.distributed.rpc (TensorPipe).

Five plain module-level RPC functions carry everything; each routes to the one endpoint of its process:
- collector -> learner `_submit_chunk(chunk)`: answered with an `Ack` only when the learner wants more data,
  so a collector with `max_chunks_in_flight` unanswered chunks waits (this is the throttle). The learner may hold
  an answer for as long as it trains, so this call has no deadline; a collector that has waited
  `transport.rpc_timeout_s` checks that the learner is alive with `_ping()`, which its RPC threads answer at once;
- learner -> collector `_receive_weights(weights)`: the newest weights replace any not yet adopted;
- learner -> collector `_request_stop()`: the run is over;
- either way `_ping()`: a collector that has waited long for an answer checks the learner, and the learner checks
  every collector it has not heard from for QUIET_S (a dead peer fails at once, a hung one at the RPC timeout).
Every wait has a deadline. Shutdown follows an explicit stop: graceful (every process leaves together, so no
pipe breaks under a peer) with a deadline when all peers are believed alive, local (`graceful=False`) when one is
known to be gone, because a graceful shutdown with no deadline waits forever on a dead peer.
"""

from __future__ import annotations

import collections
import logging
import os
import queue
import threading
import time
import warnings
from typing import NamedTuple

import torch
import torch.distributed.rpc as rpc
from torch.futures import Future

from rl_dqn.config import Config
from rl_dqn.transport.devices import LEARNER_RANK, Placement, worker_name
from rl_dqn.types import Ack, Chunk, Weights

SHUTDOWN_TIMEOUT_S = 10.0
QUIET_S = 5.0          # the learner pings a collector it has not heard from for this long


class TransportError(RuntimeError):
    """The run cannot go on over this transport: a peer is gone, or the run could not be joined."""


def collector_rank(index: int) -> int:
    return index + 1


# The endpoint of this process; the RPC functions below run on RPC threads and route to it.
_endpoint: LearnerTransport | CollectorTransport | None = None


@rpc.functions.async_execution
def _submit_chunk(chunk: Chunk) -> Future:
    return _endpoint._on_chunk(chunk)


def _ping() -> bool:
    return True


def _receive_weights(weights: Weights) -> None:
    _endpoint._on_weights(weights)


def _request_stop() -> None:
    _endpoint._on_stop()


def _join(cfg: Config, rank: int, stop: threading.Event, placement: Placement) -> None:
    """init_rpc for `rank`, with TensorPipe on the configured transports and interface.

    init_rpc blocks in C++ until every process of the run has joined: no signal handler runs there, and its
    rendezvous waits torch's default 30 minutes. So it runs on a thread while this one waits for it with the
    run's deadline and its stop event (set by SIGINT or SIGTERM); a process that gives up exits with the thread
    still blocked, which is harmless because nothing has started yet.
    """
    if cfg.cluster.init_method == "":
        raise TransportError("cluster.init_method is empty: give tcp://HOST:PORT (the learner's node) or env://")
    if cfg.cluster.interface:
        os.environ["TP_SOCKET_IFNAME"] = cfg.cluster.interface
    options = rpc.TensorPipeRpcBackendOptions(
        num_worker_threads=cfg.transport.worker_threads,
        # The rendezvous waits this long for the other processes; calls use their own timeouts below.
        rpc_timeout=cfg.cluster.join_timeout_s,
        init_method=cfg.cluster.init_method,
        _transports=list(cfg.transport.tensorpipe_transports),
    )
    for peer, gpus in placement.device_maps.items():
        options.set_device_map(peer, gpus)
    joined, failure = threading.Event(), []

    def join() -> None:
        try:
            with warnings.catch_warnings():
                # init_rpc itself uses a deprecated ProcessGroup call for its device-map exchange (torch 2.x).
                warnings.filterwarnings("ignore", message="You are using a Backend")
                rpc.init_rpc(worker_name(rank), rank=rank, world_size=cfg.world_size, rpc_backend_options=options)
        except Exception as e:  # noqa: BLE001 - init_rpc raises RuntimeError, ValueError or socket errors
            failure.append(e)
        finally:
            joined.set()

    threading.Thread(target=join, name="rpc-join", daemon=True).start()
    deadline = time.monotonic() + cfg.cluster.join_timeout_s
    where = f"the run at {cfg.cluster.init_method} as rank {rank} of {cfg.world_size}"
    while not joined.wait(0.2):
        if stop.is_set():
            raise TransportError(f"stopped while waiting to join {where}")
        if time.monotonic() > deadline:
            raise TransportError(f"could not join {where} within cluster.join_timeout_s="
                                 f"{cfg.cluster.join_timeout_s:g} s: is every process of the run started, with the "
                                 f"same cluster.world_size and its own rank?")
    if failure:
        raise TransportError(f"could not join {where}: {_reason(failure[0])}")


def _leave(graceful: bool) -> None:
    global _endpoint
    try:
        if graceful:
            # On a timeout torch logs the exception and still finishes the local shutdown; the caller only
            # needs to know that it is over.
            logging.getLogger("torch.distributed.rpc.api").setLevel(logging.CRITICAL)
            rpc.shutdown(graceful=True, timeout=SHUTDOWN_TIMEOUT_S)
        else:
            rpc.shutdown(graceful=False)
    except Exception:  # noqa: BLE001 - a peer that did not take part in the graceful shutdown in time
        pass
    finally:
        _endpoint = None


def _arrival(tensors) -> torch.cuda.Event | None:
    """On an RPC thread: an event after which tensors that arrived on a GPU are complete.

    TensorPipe orders a request's incoming copies before the stream it runs the handler on, and nothing else;
    the tensors are used later on another thread's stream, which must wait for this event first."""
    device = next((t.device for t in tensors if isinstance(t, torch.Tensor) and t.is_cuda), None)
    if device is None:
        return None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event


def _settle(tensors, arrived: torch.cuda.Event | None) -> None:
    """On the thread that uses them: wait for `arrived` on its stream, and keep the caching allocator from reusing
    their memory before that stream is done with them."""
    if arrived is None:
        return
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.is_cuda:
            stream = torch.cuda.current_stream(t.device)
            stream.wait_event(arrived)
            t.record_stream(stream)


def _on_cpu(message):
    """A chunk or weights with every tensor in host memory (what a peer without a device map can take)."""
    if isinstance(message, Weights):
        return Weights(message.version, {k: v.cpu() for k, v in message.state.items()})
    return type(message)(*(v.cpu() if isinstance(v, torch.Tensor) else v for v in message))


def _reason(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


# --------------------------------------------------------------------------------------------- learner side


class Delivery(NamedTuple):
    chunk: Chunk
    ack: Future     # complete it (LearnerTransport.acknowledge) to let the collector send more
    arrived: torch.cuda.Event | None = None


class LearnerTransport:
    """The learner's endpoint: receive chunks, acknowledge them when more data is wanted, publish weights
    without waiting on a slow collector, stop the collectors at the end."""

    def __init__(self, cfg: Config, stop: threading.Event, placement: Placement):
        global _endpoint
        self.cfg = cfg
        self.placement = placement
        self._inbox: queue.SimpleQueue[Delivery] = queue.SimpleQueue()
        self._publishing: dict[str, Future] = {}
        self.alive = {worker_name(collector_rank(i)) for i in range(cfg.num_collectors)}
        self.lost: dict[str, str] = {}        # collector name -> why it was dropped
        self._unanswered: set[Future] = set()  # every chunk's answer until it is sent, so stopping answers all
        self._heard = {name: time.monotonic() for name in self.alive}   # last chunk or answered ping
        self._pinging: dict[str, Future] = {}
        self._lock = threading.Lock()
        self._closed = False
        _endpoint = self
        _join(cfg, LEARNER_RANK, stop, placement)

    def _on_chunk(self, chunk: Chunk) -> Future:
        ack = Future()
        self._heard[worker_name(collector_rank(chunk.collector))] = time.monotonic()
        with self._lock:
            if self._closed:
                ack.set_result(Ack(0, stop=True))
            else:
                self._unanswered.add(ack)
                self._inbox.put(Delivery(chunk, ack, _arrival(chunk)))
        return ack

    def receive(self, timeout: float) -> list[Delivery]:
        """Everything that arrived, waiting up to `timeout` seconds for the first delivery; chunks that arrived on
        a GPU are ready to use on the calling thread's stream."""
        deliveries = []
        try:
            deliveries.append(self._inbox.get(timeout=timeout) if timeout > 0 else self._inbox.get_nowait())
            while True:
                deliveries.append(self._inbox.get_nowait())
        except queue.Empty:
            pass
        for delivery in deliveries:
            _settle(delivery.chunk, delivery.arrived)
        return deliveries

    def acknowledge(self, delivery: Delivery, ack: Ack) -> None:
        with self._lock:
            if delivery.ack in self._unanswered:
                self._unanswered.discard(delivery.ack)
                delivery.ack.set_result(ack)

    def _answer_all_with_stop(self) -> None:
        with self._lock:
            self._closed = True
            for ack in self._unanswered:
                ack.set_result(Ack(0, stop=True))
            self._unanswered.clear()

    def publish(self, weights: Weights) -> int:
        """Sends `weights` to every live collector whose previous weights have arrived; a collector still busy
        receiving skips this version and gets a newer one. Collectors without a device map get a CPU copy.
        Returns how many it was sent to."""
        sent, on_cpu = 0, None
        for name in sorted(self.alive):
            previous = self._publishing.get(name)
            if previous is not None:
                if not previous.done():
                    continue
                self._check(name, previous)
                if name not in self.alive:
                    continue
            if self.placement.sends_cuda_to(name):
                message = weights
            else:
                message = on_cpu = on_cpu or _on_cpu(weights)
            self._publishing[name] = rpc.rpc_async(name, _receive_weights, args=(message,),
                                                   timeout=self.cfg.transport.rpc_timeout_s)
            sent += 1
        return sent

    def watch(self) -> None:
        """Pings each live collector not heard from for QUIET_S; one whose ping fails is lost."""
        now = time.monotonic()
        for name in sorted(self.alive):
            ping = self._pinging.get(name)
            if ping is not None:
                if ping.done():
                    del self._pinging[name]
                    self._check(name, ping)
                    self._heard[name] = now
            elif now - self._heard[name] > QUIET_S:
                self._pinging[name] = rpc.rpc_async(name, _ping, timeout=self.cfg.transport.rpc_timeout_s)

    def _check(self, name: str, future: Future) -> None:
        try:
            future.wait()
        except Exception as e:  # noqa: BLE001 - RPC errors arrive as RuntimeError
            self.alive.discard(name)
            self.lost[name] = _reason(e)

    def stop_collectors(self, timeout: float) -> None:
        """Tells every live collector that the run is over and answers every chunk still waiting."""
        self._answer_all_with_stop()
        futures = {name: rpc.rpc_async(name, _request_stop, timeout=timeout) for name in sorted(self.alive)}
        for name, future in futures.items():
            self._check(name, future)

    def close(self) -> None:
        self._answer_all_with_stop()
        deadline = time.monotonic() + 5.0
        for future in self._publishing.values():
            while not future.done() and time.monotonic() < deadline:
                time.sleep(0.01)
        _leave(graceful=not self.lost)


# ------------------------------------------------------------------------------------------- collector side


class CollectorTransport:
    """A collector's endpoint: send chunks with at most `max_chunks_in_flight` unanswered, pick up the newest
    weights, learn that the run is over."""

    def __init__(self, cfg: Config, index: int, stop: threading.Event, placement: Placement):
        global _endpoint
        self.cfg = cfg
        self.placement = placement
        self._cuda_to_learner = placement.sends_cuda_to(worker_name(LEARNER_RANK))
        self._local_stop = stop                  # this process is asked to stop (a signal)
        self._in_flight: collections.deque[Future] = collections.deque()
        self._weights: tuple[Weights, torch.cuda.Event | None] | None = None
        self._weights_arrived = threading.Condition()
        self._stop = threading.Event()           # the learner says the run is over
        self._learner_lost = False
        self.last_ack: Ack | None = None
        _endpoint = self
        _join(cfg, collector_rank(index), stop, placement)

    def _on_weights(self, weights: Weights) -> None:
        arrived = _arrival(weights.state.values())
        with self._weights_arrived:
            if self._weights is None or weights.version > self._weights[0].version:
                self._weights = (weights, arrived)
            self._weights_arrived.notify_all()

    def _on_stop(self) -> None:
        self._stop.set()
        with self._weights_arrived:
            self._weights_arrived.notify_all()

    @property
    def stop_requested(self) -> bool:
        return self._stop.is_set()

    def poll_weights(self) -> Weights | None:
        """The newest weights not yet taken (ready on the calling thread's stream), or None."""
        with self._weights_arrived:
            taken, self._weights = self._weights, None
        return self._taken(taken)

    @staticmethod
    def _taken(taken: tuple[Weights, torch.cuda.Event | None] | None) -> Weights | None:
        if taken is None:
            return None
        weights, arrived = taken
        _settle(weights.state.values(), arrived)
        return weights

    def wait_weights(self, timeout: float) -> Weights | None:
        """Blocks until the learner's first weights arrive; None if the run or this process stops first."""
        deadline = time.monotonic() + timeout
        with self._weights_arrived:
            while self._weights is None and not self._stop.is_set() and not self._local_stop.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TransportError(f"no weights from the learner within {timeout:g} s")
                self._weights_arrived.wait(min(left, 0.2))
            taken, self._weights = self._weights, None
        return self._taken(taken)

    def send(self, chunk: Chunk) -> Ack | None:
        """Sends a chunk; first waits for the oldest answer while `max_chunks_in_flight` are unanswered.
        Returns the newest answer so far."""
        if not self._cuda_to_learner:
            chunk = _on_cpu(chunk)   # staged in host memory (the cpu transport, or a learner this GPU cannot reach)
        # No deadline (0): the learner holds the answer while it trains; _await checks that it is alive.
        self._in_flight.append(rpc.rpc_async(worker_name(LEARNER_RANK), _submit_chunk, args=(chunk,), timeout=0))
        while self._in_flight and (self._in_flight[0].done() or
                                   len(self._in_flight) > self.cfg.collectors.max_chunks_in_flight):
            if not self._await(self._in_flight[0]):
                break
            self._take_answer(self._in_flight.popleft())
        return self.last_ack

    def _await(self, future: Future, patience_s: float | None = None) -> bool:
        """Waits for an answer; every transport.rpc_timeout_s without one, pings the learner, and gives up on a
        learner that does not answer. Returns False when this process is asked to stop, or when `patience_s`
        (which replaces that condition) runs out."""
        if future.done():
            return True
        arrived = threading.Event()
        future.add_done_callback(lambda _: arrived.set())
        timeout = self.cfg.transport.rpc_timeout_s
        started = last_sign_of_life = time.monotonic()
        while not arrived.wait(0.2):
            now = time.monotonic()
            if patience_s is None:
                if self._local_stop.is_set():
                    return False
            elif now - started > patience_s:
                return False
            if now - last_sign_of_life > timeout:
                try:
                    rpc.rpc_sync(worker_name(LEARNER_RANK), _ping, timeout=timeout)
                except Exception as e:  # noqa: BLE001 - RPC errors arrive as RuntimeError
                    self._learner_lost = True
                    raise TransportError(f"learner unreachable: no answer to a ping within "
                                         f"transport.rpc_timeout_s={timeout:g} s ({_reason(e)})") from None
                last_sign_of_life = time.monotonic()
        return True

    def _take_answer(self, future: Future) -> None:
        try:
            ack = future.wait()
        except Exception as e:  # noqa: BLE001 - RPC errors arrive as RuntimeError
            self._learner_lost = True
            if self._stop.is_set():
                return
            raise TransportError(f"learner unreachable: {_reason(e)}") from None
        self.last_ack = ack
        if ack.stop:
            self._stop.set()

    def close(self) -> None:
        """Waits a few seconds for the answers to chunks in flight (the learner answers them all when it stops
        the run), then leaves."""
        self._stop.set()   # errors from here on are the run ending, not a lost learner
        deadline = time.monotonic() + 5.0
        try:
            while self._in_flight and not self._learner_lost:
                future = self._in_flight.popleft()
                if not future.done() and not self._await(future, patience_s=max(deadline - time.monotonic(), 0)):
                    break
                self._take_answer(future)
        except TransportError:
            pass
        finally:
            _leave(graceful=not self._learner_lost and not self._in_flight)
