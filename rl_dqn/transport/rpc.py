"""Chunks, acknowledgements, weights and the stop signal over torch.distributed.rpc (TensorPipe).

Plain module-level RPC functions carry everything; each routes to the one endpoint of its process:
- collector -> learner `_hello(slot, rpc_id)` once joined: answered with the newest weights (a CPU copy; None
  before the learner's first publish, which then reaches the collector as it does every member) and the run's env
  steps so far (where a linear epsilon schedule stands), or with None for a process the run does not take;
- collector -> learner `_submit_chunk(chunk)`: answered with an `Ack` only when the learner wants more data,
  so a collector with `max_chunks_in_flight` unanswered chunks waits (this is the throttle). The learner may hold
  an answer for as long as it trains, so this call has no deadline; a collector that has waited QUIET_S checks
  that the learner is alive with `_ping()`, which its RPC threads answer at once;
- learner -> collector `_receive_weights(weights)`: the newest weights replace any not yet adopted;
- learner -> collector `_request_stop()`: the run is over;
- collector -> learner `_goodbye(slot, rpc_id)` before it leaves;
- either way `_ping()`: the learner checks every collector it has not heard from for QUIET_S (a dead peer fails
  at once, a hung one at transport.rpc_timeout_s), and a collector checks a learner that keeps it waiting.
Collectors join and leave a running learner (see `membership`): a collector that dies or hangs is dropped and its
slot can be taken by a new process at any time. Every wait has a deadline; every process leaves with a local
shutdown (`graceful=False`), since a graceful one waits forever on a dead peer.
"""

from __future__ import annotations

import collections
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
from rl_dqn.console import first_line
from rl_dqn.transport import membership
from rl_dqn.transport.devices import LEARNER_RANK, Placement, collector_rank, slot_of, worker_name
from rl_dqn.transport.endpoints import Change, Membership, Standing
from rl_dqn.types import Ack, Chunk, Weights

QUIET_S = 5.0          # a peer not heard from for this long is pinged
JOIN_GRACE_S = 30.0    # a joining collector's store is opened with cluster.join_timeout_s plus this
FORGET_WAIT_S = 10.0   # the longest a closing learner waits for collectors being dropped from its agent
_stranded = threading.Event()   # set when _in_thread() gave up on a thread still blocked in C++


class TransportError(RuntimeError):
    """The run cannot go on over this transport: the learner is gone, or the run could not be joined.
    `outside_run`: the learner refused this process's slot, which its config puts outside the run."""

    def __init__(self, message: str, outside_run: bool = False):
        super().__init__(message)
        self.outside_run = outside_run


# The endpoint of this process; the RPC functions below run on RPC threads and route to it.
_endpoint: LearnerTransport | CollectorTransport | None = None


@rpc.functions.async_execution
def _submit_chunk(chunk: Chunk) -> Future:
    return _endpoint._on_chunk(chunk)


def _ping() -> bool:
    return True


def _hello(slot: int, rpc_id: int) -> tuple[Weights | None, int] | None:
    return _endpoint._on_hello(slot, rpc_id)


def _goodbye(slot: int, rpc_id: int) -> None:
    _endpoint._on_goodbye(slot, rpc_id)


def _receive_weights(weights: Weights) -> None:
    _endpoint._on_weights(weights)


def _request_stop() -> None:
    _endpoint._on_stop()


def built_transports(names) -> list[str]:
    """Those of TensorPipe transports `names` that this torch build has."""
    return [name for name in names if _accepted("_transports", name)]


def built_channels(names) -> list[str]:
    """Those of TensorPipe channels `names` that this torch build has (its CUDA channels only in a CUDA build)."""
    return [name for name in names if _accepted("_channels", name)]


def _accepted(option: str, name: str) -> bool:
    """Whether TensorPipe's backend options take `name` in `option` (they refuse a name the build lacks)."""
    try:
        rpc.TensorPipeRpcBackendOptions(init_method="tcp://127.0.0.1:1", **{option: [name]})
    except RuntimeError:
        return False
    return True


def _options(cfg: Config, placement: Placement, host: str, port: int) -> rpc.TensorPipeRpcBackendOptions:
    options = rpc.TensorPipeRpcBackendOptions(
        num_worker_threads=cfg.transport.worker_threads,
        # The join waits this long; calls use their own timeouts below.
        rpc_timeout=cfg.cluster.join_timeout_s,
        init_method=f"{membership.SCHEME}://{host}:{port}",
        _transports=list(cfg.transport.tensorpipe_transports),
        _channels=built_channels(cfg.transport.tensorpipe_channels),
    )
    for peer, gpus in placement.device_maps.items():
        options.set_device_map(peer, gpus)
    if placement.device.type == "cuda" and cfg.transport.kind == "cuda":
        # A dynamic group does not derive this list from the peers' maps: name the GPU that tensors land on.
        options.set_devices([placement.device])
        # Tensors may land there before this process has used the GPU (weights that reach a collector before it
        # builds its network): CUDA's caching allocator must be set up first, or the RPC thread aborts the process.
        torch.zeros(1, device=placement.device)
    return options


def _listen_address(cfg: Config) -> str:
    """The address every socket of this process listens on: cluster.interface's (TensorPipe's listeners follow
    TP_SOCKET_IFNAME, which must be set before the agent starts)."""
    if not cfg.cluster.interface:
        raise TransportError("cluster.interface is empty: name the network interface this node's processes may "
                             "listen on (lo for one node; see `ip -br addr`)")
    try:
        address = membership.interface_address(cfg.cluster.interface)
    except membership.MembershipError as e:
        raise TransportError(str(e)) from None
    os.environ["TP_SOCKET_IFNAME"] = cfg.cluster.interface
    return address


def _in_thread(work, stop: threading.Event, timeout_s: float, what: str, stage: list[str] | None = None):
    """Runs `work()` on a thread while this one waits for it with a deadline and the stop event. `stage`, which
    `work` appends to as it goes, says on a timeout where it stood.

    Opening the store and init_rpc block in C++, where no signal handler runs; a process that gives up leaves the
    thread blocked there, and must then end without finalizing the interpreter (see stranded())."""
    done, result, failure = threading.Event(), [], []

    def run() -> None:
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="You are using a Backend")
                result.append(work())
        except Exception as e:  # noqa: BLE001 - the store and init_rpc raise RuntimeError, ValueError, OSError
            failure.append(e)
        finally:
            done.set()

    threading.Thread(target=run, name="rpc-join", daemon=True).start()
    deadline = time.monotonic() + timeout_s
    try:
        while not done.wait(0.2):
            if stop.is_set():
                raise TransportError(f"stopped while {what}")
            if time.monotonic() > deadline:
                where = stage[-1] if stage else "is the learner running, at this address?"
                raise TransportError(f"gave up {what} after cluster.join_timeout_s={timeout_s:g} s: {where}")
    finally:
        if not done.is_set():
            _stranded.set()
    if failure:
        _leave()   # what got as far as init_rpc: its threads left running would abort the interpreter's exit
        raise TransportError(f"failed {what}: {_reason(failure[0])}",
                             outside_run=isinstance(failure[0], membership.SlotOutsideRun))
    return result[0]


def stranded() -> bool:
    """Whether this process gave up joining (or starting) a run while a thread was still blocked in the store's or
    TensorPipe's C++ code. Finalizing the interpreter under that thread can abort the process ("terminate called
    without an active exception") after its one-line error: such a process ends with os._exit() instead (see
    rl_dqn.cli.exit_process)."""
    return _stranded.is_set()


def _leave() -> None:
    global _endpoint
    try:
        rpc.shutdown(graceful=False)
    except Exception:  # noqa: BLE001 - already shut down
        pass
    finally:
        _endpoint = None


def _arrival(tensors) -> torch.cuda.Event | None:
    """An event after which the work this thread's stream has queued on `tensors` (those on a GPU) is complete.

    On an RPC thread, for tensors that arrived: TensorPipe orders a request's incoming copies before the stream it
    runs the handler on, and nothing else; the tensors are used later on another thread's stream, which must wait
    for this event first. On the learner's thread, for weights it publishes: a collector that joins later gets
    them copied on an RPC thread, whose stream must wait for it as well."""
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
    """The first line of an RPC error, without TensorPipe's source location; a timeout said as such."""
    text = first_line(error).split(" (this error originated at")[0]
    if not text:
        return type(error).__name__
    if "RPC ran for more than set timeout" in text:
        return "no answer within transport.rpc_timeout_s (hung, or too slow)"
    return text


# --------------------------------------------------------------------------------------------- learner side


class RpcDelivery(NamedTuple):
    chunk: Chunk
    ack: Future     # complete it (LearnerTransport.acknowledge) to let the collector send more
    arrived: torch.cuda.Event | None = None


class LearnerTransport:
    """The learner's endpoint: admit collectors into their slots, receive chunks, acknowledge them when more data
    is wanted, publish weights without waiting on a slow collector, drop collectors that die or hang, stop the
    collectors at the end."""

    def __init__(self, cfg: Config, stop: threading.Event, placement: Placement):
        global _endpoint
        self.cfg = cfg
        self.placement = placement
        # A Queue, not a SimpleQueue: the loop waits on it in the main thread, where signals land, and CPython's
        # SimpleQueue.get(timeout=...) waits for good once a signal handler runs past its deadline.
        self._inbox: queue.Queue[RpcDelivery] = queue.Queue()
        self._lock = threading.RLock()         # membership below: the admission thread, RPC threads, the loop
        self.alive: set[str] = set()           # collectors that said hello and have not been lost or left
        self.lost: dict[str, str] = {}         # collector name -> why it was last dropped
        self.changes: queue.SimpleQueue[Change] = queue.SimpleQueue()
        self._publishing: dict[str, Future] = {}
        self._pinging: dict[str, Future] = {}
        self._heard: dict[str, float] = {}     # last chunk or answered ping
        self._active: dict[int, int] = {}      # slot -> RPC id of the live process in it
        # The newest weights, and an event after which the GPU work that made them is done (None on the CPU).
        self._latest: tuple[Weights, torch.cuda.Event | None] | None = None
        self._env_steps = 0                    # the run's env steps in the newest answer
        self._unanswered: set[Future] = set()  # every chunk's answer until it is sent, so stopping answers all
        self._closed = False
        # Collectors being dropped from this process's RPC agent (see _forget): close() waits for them, as the agent
        # must not change while it shuts down.
        self._forgetting = 0
        self._forgot = threading.Condition(self._lock)
        _endpoint = self
        host, port = membership.rendezvous_address(cfg.cluster.init_method, dict(os.environ))
        address = _listen_address(cfg)
        timeout = cfg.cluster.join_timeout_s

        def start() -> membership.Registry:
            store = membership.open_store(host, port, listen_on=address, timeout_s=timeout,
                                          prefix=membership.torchrun_prefix(dict(os.environ)))
            rpc.init_rpc(worker_name(LEARNER_RANK), rank=LEARNER_RANK,
                         rpc_backend_options=_options(cfg, placement, host, port))
            # Set before it admits anyone: a collector's hello reads it.
            self.registry = membership.Registry(store, cfg.num_collectors, on_replace=self._on_replace,
                                                on_outside=self._on_outside)
            self.registry.start()
            return self.registry

        self.registry = _in_thread(start, stop, timeout, f"starting the run's rendezvous at {address}:{port}")

    # ------------------------------------------------------------------------------------- membership

    def _on_outside(self, slot: str, why: str) -> None:
        """Admission thread: a process asked for `slot`, which the run does not have."""
        self.changes.put(Change(Membership.OUTSIDE, f"collector{slot}", why))

    def _on_replace(self, slot: int) -> None:
        """Admission thread: a new process takes `slot`; the one before it (dead, hung or not) is dropped."""
        name = worker_name(collector_rank(slot))
        with self._lock:
            if name in self.alive:
                self._drop(name, "replaced by a new process")
        self._forget(name)

    def _on_hello(self, slot: int, rpc_id: int) -> tuple[Weights | None, int] | None:
        name = worker_name(collector_rank(slot))
        with self._lock:
            if not self.registry.is_current(slot, rpc_id) or self._closed:
                return None
            self.alive.add(name)
            self._active[slot] = rpc_id
            self._heard[name] = time.monotonic()
            self._publishing.pop(name, None)
            self._pinging.pop(name, None)
            incarnation = self.registry.incarnations[slot] - 1
        self.changes.put(Change(Membership.JOINED, name, f"process {incarnation + 1} of its slot"))
        self.registry.trim_soon()
        if (latest := self._latest) is None:
            return None, self._env_steps     # a member now: the first publish sends it the weights
        weights, ready = latest
        _settle(weights.state.values(), ready)   # this RPC thread's stream waits for the publisher's
        return _on_cpu(weights), self._env_steps

    def _on_goodbye(self, slot: int, rpc_id: int) -> None:
        name = worker_name(collector_rank(slot))
        with self._lock:
            if not self.registry.is_current(slot, rpc_id) or name not in self.alive:
                return
            self.alive.discard(name)
            self._active.pop(slot, None)
            self._forgetting += 1
        self.changes.put(Change(Membership.LEFT, name, ""))
        self._forget_in_thread(name)

    def _drop(self, name: str, why: str) -> None:
        """Call with the lock held."""
        self.alive.discard(name)
        self._active.pop(slot_of(name), None)
        self._publishing.pop(name, None)
        self._pinging.pop(name, None)
        self.lost[name] = why
        self.changes.put(Change(Membership.LOST, name, why))

    def _lose(self, name: str, why: str) -> None:
        """A collector that failed a call is dropped."""
        with self._lock:
            if name not in self.alive:
                return
            self._drop(name, why)
            self._forgetting += 1   # from now: close() must not miss a thread not yet started
        self._forget_in_thread(name)

    def _forget_in_thread(self, name: str) -> None:
        """Forgets `name` (counted in _forgetting already) on a thread of its own: forgetting waits for the join
        token, which an RPC thread (a goodbye) must never do, and nor should the learner's loop (see membership)."""
        threading.Thread(target=self._forget, args=(name, True), name="forget", daemon=True).start()

    def _forget(self, name: str, counted: bool = False) -> None:
        """Drops `name` from this process's RPC agent (membership.Registry.forget), counted while it runs: a goodbye
        takes the collector out of `alive` before this, so a learner that has seen every collector leave may be
        closing its agent meanwhile, and close() waits for these first."""
        if not counted:
            with self._lock:
                self._forgetting += 1
        try:
            self.registry.forget(name)
        finally:
            with self._lock:
                self._forgetting -= 1
                self._forgot.notify_all()

    def sender_standing(self, chunk: Chunk) -> Standing:
        """Where the process that sent a chunk stands in the run (see Standing): UNKNOWN for anything that does not
        name a slot and a process."""
        if not (isinstance(chunk, Chunk) and isinstance(chunk.collector, int) and isinstance(chunk.sender, int)):
            return Standing.UNKNOWN
        if self.registry.is_current(chunk.collector, chunk.sender):
            return Standing.NEWEST
        return Standing.FORMER if chunk.sender in self.registry.admitted else Standing.UNKNOWN

    # ------------------------------------------------------------------------------------------ data

    def _on_chunk(self, chunk: Chunk) -> Future:
        ack = Future()
        if isinstance(chunk, Chunk) and isinstance(chunk.collector, int):
            self._heard[worker_name(collector_rank(chunk.collector))] = time.monotonic()
        with self._lock:
            if self._closed:
                ack.set_result(Ack(0, stop=True))
            else:
                self._unanswered.add(ack)
                arrived = _arrival(chunk) if isinstance(chunk, Chunk) else None
                self._inbox.put(RpcDelivery(chunk, ack, arrived))
        return ack

    def receive(self, timeout: float) -> list[RpcDelivery]:
        """Everything that arrived, waiting up to `timeout` seconds for the first delivery; chunks that arrived on
        a GPU are ready to use on the calling thread's stream. A delivery may hold anything a peer sent: the
        learner checks it before use."""
        deliveries = []
        try:
            deliveries.append(self._inbox.get(timeout=timeout) if timeout > 0 else self._inbox.get_nowait())
            while True:
                deliveries.append(self._inbox.get_nowait())
        except queue.Empty:
            pass
        for delivery in deliveries:
            if isinstance(delivery.chunk, Chunk):
                _settle(delivery.chunk, delivery.arrived)
        return deliveries

    def acknowledge(self, delivery: RpcDelivery, ack: Ack) -> None:
        """Answers a chunk; a process that is no longer in the run learns so from the answer."""
        with self._lock:
            chunk = delivery.chunk
            if getattr(chunk, "sender", None) != self._active.get(getattr(chunk, "collector", None)):
                ack = ack._replace(dropped=True)
            self._env_steps = max(self._env_steps, ack.env_steps)
            if delivery.ack in self._unanswered:
                self._unanswered.discard(delivery.ack)
                delivery.ack.set_result(ack)

    def _answer_all_with_stop(self) -> None:
        with self._lock:
            self._closed = True
            for ack in self._unanswered:
                ack.set_result(Ack(0, stop=True))
            self._unanswered.clear()

    def publish(self, weights: Weights, env_steps: int | None = None) -> int:
        """Sends `weights` to every live collector whose previous weights have arrived; a collector still busy
        receiving skips this version and gets a newer one. Collectors without a device map get a CPU copy.
        `env_steps`, the run's so far, goes to collectors that join later with these weights. Returns how many it
        was sent to."""
        self._latest = (weights, _arrival(weights.state.values()))
        if env_steps is not None:
            self._env_steps = max(self._env_steps, env_steps)
        sent, on_cpu = 0, None
        with self._lock:
            names = sorted(self.alive)
        for name in names:
            previous = self._publishing.get(name)
            if previous is not None:
                if not previous.done() or not self._check(name, previous):   # busy, or lost with the last one
                    continue
            if self.placement.sends_cuda_to(name):
                message = weights
            else:
                message = on_cpu = on_cpu or _on_cpu(weights)
            future = self._call(name, _receive_weights, (message,))
            if future is not None:
                self._publishing[name] = future
                sent += 1
        return sent

    def _call(self, name: str, function, args: tuple = ()) -> Future | None:
        try:
            return rpc.rpc_async(name, function, args=args, timeout=self.cfg.transport.rpc_timeout_s)
        except RuntimeError as e:   # dropped meanwhile by another thread
            self._lose(name, _reason(e))
            return None

    def watch(self) -> None:
        """Pings each live collector not heard from for QUIET_S; one whose ping fails is lost."""
        now = time.monotonic()
        with self._lock:
            names = sorted(self.alive)
        for name in names:
            ping = self._pinging.get(name)
            if ping is not None:
                if ping.done():
                    self._pinging.pop(name, None)
                    if self._check(name, ping):
                        self._heard[name] = now
            elif now - self._heard.get(name, now) > QUIET_S:
                future = self._call(name, _ping)
                if future is not None:
                    self._pinging[name] = future

    def _check(self, name: str, future: Future) -> bool:
        try:
            future.wait()
            return True
        except Exception as e:  # noqa: BLE001 - RPC errors arrive as RuntimeError
            self._lose(name, _reason(e))
            return False

    def stop_collectors(self, timeout: float) -> None:
        """Refuses new collectors, tells every live one that the run is over, answers every chunk still waiting,
        and gives them `timeout` seconds to say goodbye."""
        self.registry.close()
        self._answer_all_with_stop()
        with self._lock:
            names = sorted(self.alive)
        futures = {name: self._call(name, _request_stop) for name in names}
        for name, future in futures.items():
            if future is not None:
                self._check(name, future)
        deadline = time.monotonic() + timeout
        while self.alive and time.monotonic() < deadline:
            time.sleep(0.05)

    def close(self) -> None:
        self.registry.close()
        self._answer_all_with_stop()
        deadline = time.monotonic() + 5.0
        for future in list(self._publishing.values()):
            while not future.done() and time.monotonic() < deadline:
                time.sleep(0.01)
        with self._lock:
            self._forgot.wait_for(lambda: self._forgetting == 0, timeout=FORGET_WAIT_S)
        _leave()


# ------------------------------------------------------------------------------------------- collector side


class CollectorTransport:
    """A collector's endpoint: join the run in slot `index`, send chunks with at most `max_chunks_in_flight`
    unanswered, pick up the newest weights, learn that the run is over, say goodbye."""

    def __init__(self, cfg: Config, index: int, stop: threading.Event, placement: Placement):
        global _endpoint
        self.cfg = cfg
        self.index = index
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
        host, port = membership.rendezvous_address(cfg.cluster.init_method, dict(os.environ))
        _listen_address(cfg)
        timeout = cfg.cluster.join_timeout_s
        name = worker_name(collector_rank(index))

        stage = ["no learner's store answered: is the learner running, at this address?"]

        def join() -> tuple[membership.Admission, tuple[Weights | None, int] | None]:
            # The store's own connect timeout outlasts the join's deadline: the process gives up at that deadline
            # with one line, before the store logs a C++ trace of its own timeout.
            store = membership.open_store(host, port, listen_on=None, timeout_s=timeout + JOIN_GRACE_S,
                                          prefix=membership.torchrun_prefix(dict(os.environ)))
            stage.append("the learner's store answered, but the learner admitted no process into this slot")
            admission = membership.ask_admission(store, index, timeout, stop)
            # A device map that does not fit the peers' GPUs fails inside init_rpc's group update, which then waits
            # out the store timeout: from here on the learner is known to be running.
            stage.append("the learner admitted this process, but joining its RPC group did not finish: a device "
                         "map that does not fit the learner's GPUs stalls it (check transport.device_map on both "
                         "nodes), or TensorPipe's ports between the nodes are blocked (docs/operations.md, "
                         "Troubleshooting)")
            rpc.init_rpc(name, rank=admission.rpc_id, rpc_backend_options=_options(cfg, placement, host, port))
            return admission, rpc.rpc_sync(worker_name(LEARNER_RANK), _hello, args=(index, admission.rpc_id),
                                           timeout=cfg.transport.rpc_timeout_s)

        admission, welcome = _in_thread(join, stop, timeout, f"joining the run at {host}:{port} as {name}", stage)
        self.rpc_id, self.incarnation = admission.rpc_id, admission.incarnation
        if welcome is None:
            _leave()   # RPC threads left running would abort the interpreter's exit
            raise TransportError(f"the learner took {name} for replaced or the run is over")
        first, self.env_steps_at_join = welcome     # where the run stood when this process joined
        if first is not None:
            self._on_weights(first)                 # unless a newer publish arrived first

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
        """Blocks until the learner's weights arrive (they come with the admission); None if the run or this
        process stops first."""
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
        chunk = chunk._replace(sender=self.rpc_id)
        if not self._cuda_to_learner:
            chunk = _on_cpu(chunk)   # staged in host memory (the cpu transport, or a learner this GPU cannot reach)
        # No deadline (0): the learner holds the answer while it trains; _await checks that it is alive.
        try:
            self._in_flight.append(rpc.rpc_async(worker_name(LEARNER_RANK), _submit_chunk, args=(chunk,), timeout=0))
        except RuntimeError as e:
            self._learner_lost = True
            raise TransportError(f"learner unreachable: {_reason(e)}") from None
        while self._in_flight and (self._in_flight[0].done() or
                                   len(self._in_flight) > self.cfg.collectors.max_chunks_in_flight):
            if not self._await(self._in_flight[0]):
                break
            self._take_answer(self._in_flight.popleft())
        return self.last_ack

    def _await(self, future: Future, patience_s: float | None = None) -> bool:
        """Waits for an answer; after QUIET_S without one, and then every QUIET_S, pings the learner and gives up
        on a learner that does not answer within transport.rpc_timeout_s. Returns False when this process is
        asked to stop, or when `patience_s` (which replaces that condition) runs out."""
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
            if now - last_sign_of_life > min(QUIET_S, timeout):
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
        elif ack.dropped:
            raise TransportError("the learner dropped this process from the run (it took it for dead, or a new "
                                 "process took its slot)")

    @property
    def learner_lost(self) -> bool:
        return self._learner_lost

    def close(self) -> None:
        """Waits a few seconds for the answers to chunks in flight (the learner answers them all when it stops
        the run), says goodbye, and leaves."""
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
        try:
            if not self._learner_lost:
                rpc.rpc_sync(worker_name(LEARNER_RANK), _goodbye, args=(self.index, self.rpc_id), timeout=5.0)
        except Exception:  # noqa: BLE001 - the learner left first: nothing to tell it
            pass
        finally:
            _leave()
