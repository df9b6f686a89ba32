"""What the transport hands torch's RPC agent, checked on the CPU: the devices a leave keeps, the channels it may
use."""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.distributed.rpc as rpc

from rl_dqn.transport import membership


def test_forgetting_a_collector_hands_the_agent_the_learners_own_devices(monkeypatch):
    """On a leave TensorPipe keeps only the devices it is handed: a CUDA learner that handed none would lose its
    GPU's streams. This checks what is handed (a CUDA run checks the effect: doctor.sh --gpu)."""
    calls = []

    class Agent:   # what forget() uses of torch's TensorPipeAgent, for a learner configured with cuda:0
        def get_worker_info(self, name):
            return SimpleNamespace(name=name, id=3)

        def _get_backend_options(self):
            return SimpleNamespace(devices=[torch.device("cuda:0")])

        def _update_group_membership(self, info, devices, reverse_device_maps, is_join):
            calls.append((info.name, devices, reverse_device_maps, is_join))

    monkeypatch.setattr(rpc.api, "_get_current_rpc_agent", lambda: Agent())
    monkeypatch.setattr(rpc, "get_worker_info", lambda: SimpleNamespace(name="learner", id=0))
    store = dist.HashStore()
    store.set(membership._MEMBERS_KEY, "learner-0,collector0-3,")
    store.set(membership._TOKEN_KEY, "")
    membership.Registry(store, 2, on_replace=lambda slot: None).forget("collector0")
    assert calls == [("collector0", [torch.device("cuda:0")], {}, False)]
    assert store.get(membership._MEMBERS_KEY) == b"learner-0,"   # joiners talk to the learner only
    assert store.get(membership._TOKEN_KEY) == b""                # the join token is free again


def test_the_agent_is_handed_the_configured_channels_this_build_has_in_their_order():
    from rl_dqn.config import TENSORPIPE_CPU_CHANNELS, Config
    from rl_dqn.transport.rpc import built_channels
    default = Config().transport.tensorpipe_channels
    assert "cuda_gdr" not in default   # pytorch/pytorch#130513: its setup can fail inside init_rpc
    cuda = torch.backends.cuda.is_built()
    assert built_channels(default) == [c for c in default if c in TENSORPIPE_CPU_CHANNELS or cuda]
    assert built_channels(["basic", "cma"]) == ["basic", "cma"]


def test_a_join_that_times_out_says_where_it_stood():
    import threading
    import time

    import pytest

    from rl_dqn.transport.rpc import TransportError, _in_thread
    stage = ["no learner's store answered"]

    def work():
        stage.append("the learner admitted this process, but joining its RPC group did not finish")
        time.sleep(5)
    with pytest.raises(TransportError) as error:
        _in_thread(work, threading.Event(), 0.5, "joining the run at 10.0.0.1:29500 as collector0", stage)
    assert str(error.value) == ("gave up joining the run at 10.0.0.1:29500 as collector0 after "
                                "cluster.join_timeout_s=0.5 s: the learner admitted this process, but joining its RPC "
                                "group did not finish")


def test_a_join_that_fails_after_init_rpc_leaves_no_rpc_agent_running():
    """The learner's hello failing after init_rpc (or its admission thread failing to start): the agent's threads
    are shut down, where they would keep running into the interpreter's exit and can abort it."""
    import threading

    import pytest

    from rl_dqn.supervisor import free_port
    from rl_dqn.transport.rpc import TransportError, _in_thread
    port = free_port()

    def work():
        rpc.init_rpc("collector0", rank=0, world_size=1, rpc_backend_options=rpc.TensorPipeRpcBackendOptions(
            init_method=f"tcp://127.0.0.1:{port}", _transports=["uv"]))
        raise RuntimeError("the learner's hello failed")
    with pytest.raises(TransportError, match="^failed joining the run: the learner's hello failed$"):
        _in_thread(work, threading.Event(), 30, "joining the run")
    assert not rpc.api._is_current_rpc_agent_set()


def test_a_join_token_held_by_a_dead_joiner_is_taken_back_though_its_name_joined_before(monkeypatch):
    """torch leaves each joiner's key "Done" in the store: a process of a name that joined before (a replacement
    in the same slot) that dies holding the token must not keep the learner's admission thread spinning on that
    old key, past its wait and past the run's end."""
    import threading
    import time
    monkeypatch.setattr(membership, "TOKEN_WAIT_S", 0.5)
    store = dist.HashStore()
    store.set(membership._RPC_PREFIX + "Token_for_collector3_join", "Done")   # its earlier process joined
    store.set(membership._TOKEN_KEY, "Token_for_collector3_join")             # the new one died holding it
    registry = membership.Registry(store, 4, on_replace=lambda slot: None)
    outcomes = []

    def hold(give_up):   # on a thread of its own: a wait without end fails the test rather than hanging it
        try:
            with registry._token(give_up=give_up):
                outcomes.append(store.get(membership._TOKEN_KEY))
        except membership.MembershipError as e:
            outcomes.append(str(e))

    for give_up in (lambda: True, lambda: False):
        started = time.monotonic()
        waiting = threading.Thread(target=hold, args=(give_up,), daemon=True)
        waiting.start()
        waiting.join(timeout=10)
        assert not waiting.is_alive() and time.monotonic() - started < 5
    assert outcomes == ["the run is over", b"Token_for_learner_membership"]
    assert store.get(membership._TOKEN_KEY) == b""


def test_the_admission_thread_goes_on_after_a_store_call_fails(monkeypatch, caplog):
    """A store call that fails once must not end admissions for the rest of the run (no collector could join or
    rejoin then), nor admit the same ticket twice."""
    import time

    class Store(dist.HashStore):
        fail = {"get": 1, "set": 1}

        def get(self, key):
            if key.startswith("rl_dqn/claim/") and self.fail["get"]:
                self.fail["get"] -= 1
                raise RuntimeError("connection reset by peer")
            return super().get(key)

        def set(self, key, value):
            if key.startswith("rl_dqn/admit/") and self.fail["set"]:
                self.fail["set"] -= 1
                raise RuntimeError("broken pipe")
            return super().set(key, value)

    store = Store()
    outside = []
    registry = membership.Registry(store, 2, on_replace=lambda slot: None,
                                   on_outside=lambda slot, why: outside.append(slot))
    registry._thread.start()
    try:
        for ticket, slot in ((1, "7"), (2, "8")):
            store.set(f"rl_dqn/claim/{ticket}", slot)
            deadline = time.monotonic() + 10
            while not store.check([f"rl_dqn/admit/{ticket}"]) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert store.check([f"rl_dqn/admit/{ticket}"]), f"ticket {ticket} never answered"
            assert store.get(f"rl_dqn/admit/{ticket}").decode().startswith("outside ")
    finally:
        registry.close()
    assert outside == ["7", "8"]    # each ticket judged once, though its verdict's first store failed
    warnings = [r.getMessage() for r in caplog.records if r.name == "rl_dqn.learner"]
    assert warnings == ["warning: admitting collectors to the run failed (connection reset by peer); trying again",
                        "warning: admitting collectors to the run failed (broken pipe); trying again"]


def test_a_trim_of_the_member_list_that_fails_is_tried_again(monkeypatch):
    """A collector that joined is listed in the store until the learner trims the list; a trim whose store call
    fails stays wanted, or a joiner could later call that collector after it died."""
    import time

    class Store(dist.HashStore):
        fail = 0

        def set(self, key, value):
            if key == membership._MEMBERS_KEY and self.fail:
                self.fail -= 1
                raise RuntimeError("broken pipe")
            return super().set(key, value)

    monkeypatch.setattr(rpc, "get_worker_info", lambda: SimpleNamespace(name="learner", id=0))
    store = Store()
    store.set(membership._TOKEN_KEY, "")
    store.set(membership._MEMBERS_KEY, "learner-0,collector0-1,")
    store.fail = 1
    registry = membership.Registry(store, 2, on_replace=lambda slot: None)
    registry._thread.start()
    try:
        registry.trim_soon()
        deadline = time.monotonic() + 10
        while store.get(membership._MEMBERS_KEY) != b"learner-0," and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        registry.close()
    assert store.fail == 0 and store.get(membership._MEMBERS_KEY) == b"learner-0,"
