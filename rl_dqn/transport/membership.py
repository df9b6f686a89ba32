"""Who is in the run: the rendezvous store, where it listens, and how collectors join, leave and rejoin.

torch.distributed.rpc, as measured with torch 2.13, has no way back for a crashed process in a static group, and in
a dynamic group (`init_rpc` without `world_size`) a crashed member stays listed: every later joiner calls it and
fails, holding the group's join token for good; a restarted process that reuses its RPC id hits its predecessor's
broken pipe. So the run is a dynamic group kept by the learner:

- Collector *slots* are fixed (`cluster.world_size - 1` of them: they own replay lanes and epsilons); the processes
  filling them come and go. Each process that takes a slot is a new *incarnation* with a fresh RPC id, under the
  slot's stable name (`collector3`), so the learner's device maps, which are keyed by name, still apply.
- A collector asks the learner for admission through the store before `init_rpc`: it takes a ticket, names its
  slot, and waits. The learner's admission thread first forgets the slot's previous incarnation if there is one (a
  hung process is replaced, not waited for), then admits the ticket; the ticket number is the RPC id.
- After every change, the learner trims the store's member list to itself, so a joiner only ever talks to the
  learner, never to another collector that may have died. A dead collector is forgotten the same way.
- The learner waits for the group's join token only off its RPC threads (the admission thread, a forgetting
  thread): a joiner holds that token while it calls the learner, and a learner whose RPC threads all waited for it
  would answer no one. Collectors that join together may see each other listed until the next trim.

The store listens only on `cluster.interface` (loopback for a one-node run): torch's own `tcp://` rendezvous binds
it to every interface. RPC unpickles what it receives, so whoever reaches these ports can run code.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import math
import socket
import struct
import threading
import time
from collections.abc import Callable
from urllib.parse import urlparse

import torch.distributed as dist
import torch.distributed.rpc as rpc
from torch.distributed.rendezvous import register_rendezvous_handler

from rl_dqn.console import first_line, say

SCHEME = "rldqn"
_store: dist.Store | None = None    # this process's store, handed to init_rpc by the rendezvous handler below

# Where torch 2.x keeps a dynamic group's members and its join token, under the prefix of the first init_rpc of a
# process ("rpc_prefix_0"); checked when the learner starts, so another layout fails loudly, not silently.
_RPC_PREFIX = "rpc_prefix_0/"
_MEMBERS_KEY = _RPC_PREFIX + "names/_ALL_WORKER_INFOS"
_TOKEN_KEY = _RPC_PREFIX + "RpcGroupManagementToken"
TOKEN_WAIT_S = 60.0   # how long the join token's holder may keep it before the learner takes it back


def _handler(url: str, **kwargs):
    yield (_store, None, None)


register_rendezvous_handler(SCHEME, _handler)


class MembershipError(RuntimeError):
    """The store could not be opened, or this process was refused a place in the run."""


class SlotOutsideRun(MembershipError):
    """The learner refused this process's slot, which is not one of the run's: its node's cluster.world_size or
    cluster.rank disagrees with the learner's, and a new process would be refused the same way."""


def interface_address(name: str) -> str:
    """The IPv4 address of network interface `name` (Linux)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
        except OSError:
            names = ", ".join(n for _, n in socket.if_nameindex())
            raise MembershipError(f"cluster.interface: no IPv4 address on interface {name!r}; this node has "
                                  f"{names}") from None
    return socket.inet_ntoa(packed[20:24])


def rendezvous_address(init_method: str, environ: dict[str, str]) -> tuple[str, int]:
    """(host, port) of the store from `tcp://HOST:PORT` or `env://` (MASTER_ADDR, MASTER_PORT)."""
    if init_method == "env://":
        missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if not environ.get(v)]
        if missing:
            raise MembershipError(f"cluster.init_method is env:// but {' and '.join(missing)} "
                                  f"{'is' if len(missing) == 1 else 'are'} not set")
        if not (environ["MASTER_PORT"].isdigit() and 1 <= int(environ["MASTER_PORT"]) <= 65535):
            raise MembershipError(f"MASTER_PORT must be a port number from 1 to 65535, got "
                                  f"{environ['MASTER_PORT']!r}")
        return environ["MASTER_ADDR"], int(environ["MASTER_PORT"])
    url = urlparse(init_method)
    return url.hostname, url.port


def torchrun_prefix(environ: dict[str, str]) -> str | None:
    """Under torchrun the store at MASTER_ADDR:MASTER_PORT is its agent's (TORCHELASTIC_USE_AGENT_STORE=True):
    every process of the run, the learner too, is a client of it, under a prefix of torchrun's current attempt (as
    torch's own env:// rendezvous does), so that a restarted attempt starts from an empty membership."""
    if environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    return f"/rl_dqn/attempt_{environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def open_store(host: str, port: int, listen_on: str | None, timeout_s: float, prefix: str | None = None
               ) -> dist.Store:
    """The learner's store (`listen_on` = the address it binds, nothing else) or a client of it (None); with
    `prefix`, a client of a store someone else runs (torchrun's), every key under the prefix."""
    global _store
    timeout = datetime.timedelta(seconds=timeout_s)
    if listen_on is None or prefix is not None:
        try:
            _store = dist.TCPStore(host, port, None, False, timeout)
        except (RuntimeError, ValueError) as e:
            whom = "torchrun's rendezvous store" if prefix is not None else "learner"
            raise MembershipError(f"no {whom} answered at {host}:{port} within {timeout_s:g} s "
                                  f"({str(e).splitlines()[0]})") from None
        if prefix is not None:
            _store = dist.PrefixStore(prefix, _store)
        return _store
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((listen_on, port))
    except OSError as e:
        listener.close()
        raise MembershipError(f"cannot listen on {listen_on}:{port}: {e.strerror}") from None
    listener.listen(512)
    # The store takes the socket over and closes it with itself; keep the Python object from closing it first.
    _store = dist.TCPStore(host, port, None, True, timeout, wait_for_workers=False, master_listen_fd=listener.detach())
    return _store


# ------------------------------------------------------------------------------------------ collector side


class Admission:
    """What the learner answered a collector that asked to fill a slot."""

    def __init__(self, rpc_id: int, incarnation: int):
        self.rpc_id = rpc_id            # fresh for every process that joins
        self.incarnation = incarnation  # 0 for a slot's first process, 1 for its first replacement, ...


def ask_admission(store: dist.Store, slot: int, timeout_s: float, stop: threading.Event) -> Admission:
    ticket = store.add("rl_dqn/tickets", 1)
    store.set(f"rl_dqn/claim/{ticket}", str(slot))
    key = f"rl_dqn/admit/{ticket}"
    if not _poll(store, key, lambda: stop.is_set(), timeout_s):
        raise MembershipError("stopped while waiting for admission" if stop.is_set() else
                              f"the learner did not admit collector{slot} within {timeout_s:g} s")
    verdict, _, detail = store.get(key).decode().partition(" ")
    if verdict == "outside":
        raise SlotOutsideRun(f"the learner refused collector{slot}: {detail}")
    if verdict != "ok":
        raise MembershipError(f"the learner refused collector{slot}: {detail}")
    return Admission(ticket, int(detail))


def _poll(store: dist.Store, key: str, give_up: Callable[[], bool], timeout_s: float = math.inf) -> bool:
    """Waits for `key` by polling (a store's timed-out wait logs a warning each time); False if given up."""
    deadline = time.monotonic() + timeout_s
    while not store.check([key]):
        if give_up() or time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


# -------------------------------------------------------------------------------------------- learner side


class Registry:
    """The learner's view of the slots and the processes filling them, kept by its admission thread and its loop.

    `admit(slot)` is called for each ticket in order and returns a refusal or None; the learner's transport
    decides what a slot's previous incarnation means there (`on_replace`), and hears of a process that asked for a
    slot the run does not have (`on_outside(slot, why)`)."""

    def __init__(self, store: dist.Store, slots: int, on_replace: Callable[[int], None],
                 on_outside: Callable[[str, str], None] = lambda slot, why: None):
        self.store, self.slots, self.on_replace, self.on_outside = store, slots, on_replace, on_outside
        self.current: dict[int, int] = {}       # slot -> RPC id of its newest incarnation
        self.incarnations = [0] * slots         # processes admitted per slot so far
        self.admitted: set[int] = set()         # RPC ids of every process ever admitted
        self.lock = threading.Lock()
        self._closed = threading.Event()
        self._trim_wanted = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="admission", daemon=True)

    def start(self) -> None:
        if not self.store.check([_MEMBERS_KEY, _TOKEN_KEY]):
            raise MembershipError("this torch keeps an RPC group's members where rl_dqn does not expect them "
                                  "(torch 2.11 to 2.13 are supported)")
        self._thread.start()

    def is_current(self, slot: int, rpc_id: int) -> bool:
        return self.current.get(slot) == rpc_id

    def trim_soon(self) -> None:
        """Has the admission thread trim the store's member list (a collector joined, listing itself there)."""
        self._trim_wanted.set()

    def _serve(self) -> None:
        """Admits the tickets in order and trims the member list when asked, until close(). A store call that
        fails meanwhile is tried again (with a warning), so that collectors can still join and rejoin."""
        ticket, verdict, failing = 1, None, ""
        while not self._closed.is_set():
            try:
                claim = f"rl_dqn/claim/{ticket}"
                if verdict is None and self.store.check([claim]):
                    verdict = self._admit(ticket, self.store.get(claim).decode())
                if verdict is not None:     # kept until it is stored: a ticket is admitted once
                    self.store.set(f"rl_dqn/admit/{ticket}", verdict)
                    ticket, verdict = ticket + 1, None
                elif self._trim_wanted.is_set():
                    with contextlib.suppress(MembershipError):   # the run is over
                        self.keep_learner_only()
                else:
                    self._trim_wanted.wait(0.1)
                failing = ""
            except RuntimeError as e:
                if self._closed.is_set():
                    return      # the store is closing with the run
                if first_line(e) != failing:
                    failing = first_line(e)
                    say("learner", f"warning: admitting collectors to the run failed ({failing}); trying again")
                self._closed.wait(1.0)

    def _admit(self, ticket: int, slot_text: str) -> str:
        if not slot_text.isdigit() or int(slot_text) >= self.slots:
            why = f"the run has collector slots 0..{self.slots - 1} (cluster.world_size - 1), not {slot_text!r}"
            self.on_outside(slot_text, why)
            return f"outside {why}"
        slot = int(slot_text)
        with self.lock:
            if self._closed.is_set():
                return "refused the run is over"
            if slot in self.current:
                self.on_replace(slot)
            else:
                try:
                    self.keep_learner_only()
                except MembershipError:
                    return "refused the run is over"
            self.current[slot] = ticket
            self.admitted.add(ticket)
            incarnation = self.incarnations[slot]
            self.incarnations[slot] += 1
        return f"ok {incarnation}"

    def forget(self, name: str) -> None:
        """Drops `name` from this process's RPC agent and trims the store's member list to the learner, holding
        the group's join token so that no join runs meanwhile."""
        agent = rpc.api._get_current_rpc_agent()
        with self._token():
            try:
                info = agent.get_worker_info(name)
            except RuntimeError:
                info = None      # never joined, or forgotten already
            if info is not None:
                # On a leave TensorPipe keeps only the devices it is handed (TensorPipeAgent::updateGroupMembership
                # erases the rest), so hand it this process's own: with none, a CUDA learner loses its GPU and its
                # next CUDA send fails ("No stream found for device"). The learner's answers to collectors carry
                # no tensors, so they need no reverse device maps.
                agent._update_group_membership(info, list(agent._get_backend_options().devices), {}, False)
            self._trim()

    def keep_learner_only(self) -> None:
        """Trims the store's member list to the learner once a collector has joined (it listed itself there).
        Raises MembershipError if the run closes while the join token is held by another."""
        with self._token(give_up=self._closed.is_set):
            self._trim()

    def _trim(self) -> None:
        """Every trim answers the requests before it (trim_soon()); one that fails leaves them standing."""
        me = rpc.get_worker_info()
        self._trim_wanted.clear()
        try:
            self.store.set(_MEMBERS_KEY, f"{me.name}-{me.id},")
        except BaseException:
            self._trim_wanted.set()
            raise

    @contextlib.contextmanager
    def _token(self, give_up: Callable[[], bool] = lambda: False):
        """Holds the group's join token, as torch's own joins do (a waiter waits for the holder's key); raises
        MembershipError if `give_up()` turns true meanwhile. Never on an RPC thread (see the module's docstring)."""
        mine = "Token_for_learner_membership"
        deadline = time.monotonic() + TOKEN_WAIT_S
        while (held := self.store.compare_set(_TOKEN_KEY, "", mine).decode()) != mine:
            if give_up():
                raise MembershipError("the run is over")
            if time.monotonic() > deadline:
                # A joiner died holding the token (torch's join does not give it back when it fails): take it
                # back, and wake whoever waits on it.
                self.store.set(_RPC_PREFIX + held, "Done")
                self.store.compare_set(_TOKEN_KEY, held, "")
                deadline = time.monotonic() + TOKEN_WAIT_S
            elif self.store.check([_RPC_PREFIX + held]):
                # Its holder's key says done, but the token is still held: being given back, or the key is an
                # earlier process's of the same name, which stays in the store. Try again shortly.
                time.sleep(0.1)
            else:   # the holder sets its key as it gives the token back
                _poll(self.store, _RPC_PREFIX + held, lambda: give_up() or time.monotonic() > deadline)
        try:
            yield
        finally:
            self.store.set(_TOKEN_KEY, "")
            self.store.set(_RPC_PREFIX + mine, "Done")

    def close(self) -> None:
        """Refuses every later ticket; an admission waiting for the join token gives up."""
        self._closed.set()
        with self.lock:     # an admission under way has ended
            pass
        self._thread.join(timeout=2.0)
