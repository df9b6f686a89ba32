"""A Collector driven in-process, step by step, on real Pong envs, against an in-memory endpoint that does what
CollectorEndpoint says: hands it weights, takes its chunks and answers them. (The RPC endpoints are tested in
test_transport.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from envs import describe_env
from rl_dqn import dqn
from envs.vector import EnvSpec, StepResult
from rl_dqn.collector import ChunkBuilder, Collector
from rl_dqn.config import load_config
from rl_dqn.intake import Intake
from rl_dqn.network import QNetwork
from rl_dqn.trainer import Trainer
from rl_dqn.transport import CollectorEndpoint, Standing
from rl_dqn.types import Ack, Chunk, Weights

ROOT = Path(__file__).resolve().parents[1]


class MemoryEndpoint:
    """Keeps what the collector sends and answers with the run's env steps that the test sets."""

    def __init__(self, weights: Weights, env_steps_at_join: int = 0):
        self.env_steps_at_join = env_steps_at_join
        self.sent: list[Chunk] = []
        self.new_weights: Weights | None = weights
        self.run_env_steps = env_steps_at_join
        self.stop_after: int | None = None

    @property
    def stop_requested(self) -> bool:
        return self.stop_after is not None and len(self.sent) >= self.stop_after

    def wait_weights(self, timeout: float) -> Weights | None:
        return self.poll_weights()

    def poll_weights(self) -> Weights | None:
        weights, self.new_weights = self.new_weights, None
        return weights

    def send(self, chunk: Chunk) -> Ack | None:
        self.sent.append(chunk)
        return Ack(self.run_env_steps, stop=False)

    def close(self) -> None:
        pass


def prepared(*overrides: str):
    cfg = load_config(ROOT / "configs/smoke.yaml", ["run.name=t", "collectors.exploration=linear",
                                                    "collectors.epsilon_decay_env_steps=10000", *overrides])
    spec = describe_env(cfg.env)
    torch.manual_seed(0)
    state = QNetwork.for_env(spec.obs_shape, spec.num_actions, cfg.network, "cpu").state_dict()
    return cfg, spec, MemoryEndpoint(Weights(7, state))


def weights_like(state: dict, version: int, value: float) -> Weights:
    return Weights(version, {k: torch.full_like(v, value) for k, v in state.items()})


def test_a_collector_steps_sends_chunks_and_adopts_weights_and_the_runs_schedule():
    cfg, spec, endpoint = prepared()
    collector = Collector(cfg, index=1, transport=endpoint)
    collector.prepare()
    assert isinstance(endpoint, CollectorEndpoint)
    try:
        assert collector.start()
        assert collector.epsilons.tolist() == [1.0] * 4
        T = cfg.collectors.chunk_steps
        returned = [collector.step() for _ in range(T)]
        assert returned[:-1] == [None] * (T - 1) and returned[-1] is endpoint.sent[0]
        first = endpoint.sent[0]
        assert (first.collector, first.seq, first.weights_version) == (1, 0, 7)
        assert first.frames.shape == (T, 4, *spec.frame_shape) and first.first[0].all()
        # The learner answered that the run is at 5,000 env steps: epsilon is halfway down from then on.
        endpoint.run_env_steps = 5_000
        new = weights_like(collector.net.state_dict(), version=8, value=0.0)
        endpoint.new_weights = new
        for _ in range(T):
            collector.step()
        second = endpoint.sent[1]
        assert (second.seq, second.weights_version) == (1, 8)
        assert all(torch.equal(v.float(), new.state[k].float()) for k, v in collector.net.state_dict().items())
        expected = 1.0 + (cfg.collectors.epsilon_end - 1.0) * 0.5
        assert torch.allclose(collector.epsilons, torch.full((4,), expected))
        # A learner of the same config takes both chunks as they are.
        intake = Intake(cfg, spec, Trainer(cfg, spec, torch.device("cpu")).replay)
        for chunk in endpoint.sent:
            admission = intake.admit(chunk._replace(sender=0), Standing.NEWEST)
            assert admission.refused is None and len(admission.entered) == 1
        assert intake.env_steps == 2 * T * 4
    finally:
        collector.close()


def test_the_answer_that_ends_the_run_leaves_the_runs_env_steps_where_the_learner_last_said():
    """The node's progress line shows the run's env steps as its collectors last heard them: not 0 at the end."""
    cfg, spec, endpoint = prepared()
    collector = Collector(cfg, index=0, transport=endpoint)
    try:
        collector.prepare()
        assert collector.start()
        endpoint.run_env_steps = 3_000
        for _ in range(cfg.collectors.chunk_steps):
            collector.step()
        endpoint.send = lambda chunk: Ack(0, stop=True)
        for _ in range(cfg.collectors.chunk_steps):
            collector.step()
        assert collector.run_env_steps == 3_000
    finally:
        collector.close()


@pytest.mark.parametrize("initial_priority", ["collectors", "max"])
def test_a_collector_sends_q_values_only_to_a_learner_that_takes_them_as_priorities(initial_priority):
    cfg, spec, endpoint = prepared("train.prioritized=true", f"train.initial_priority={initial_priority}")
    collector = Collector(cfg, index=0, transport=endpoint)
    try:
        collector.prepare()
        assert collector.start()
        T = cfg.collectors.chunk_steps
        for _ in range(T):
            collector.step()
        (chunk,) = endpoint.sent
        if initial_priority == "collectors":
            assert chunk.q_taken.shape == chunk.q_max.shape == (T, 4) and (chunk.q_max >= chunk.q_taken).all()
        else:
            assert chunk.q_taken is None and chunk.q_max is None
        intake = Intake(cfg, spec, Trainer(cfg, spec, torch.device("cpu")).replay)
        assert intake.admit(chunk._replace(sender=0), Standing.NEWEST).refused is None
    finally:
        collector.close()


def test_linear_apex_exploration_decays_each_env_to_its_apex_epsilon():
    cfg, spec, endpoint = prepared("collectors.exploration=linear_apex", "collectors.epsilon_decay_env_steps=1000")
    collector = Collector(cfg, index=1, transport=endpoint)
    collector.prepare()
    E, c = cfg.env.envs_per_collector, cfg.collectors
    floors = dqn.apex_epsilons(cfg.num_envs, E, E, c.apex_epsilon, c.apex_alpha)   # collector 1's envs
    try:
        assert collector.start()
        assert collector.epsilons.tolist() == [1.0] * E
        endpoint.run_env_steps = 500   # halfway down, each env towards its own floor
        for _ in range(c.chunk_steps):
            collector.step()
        assert torch.allclose(collector.epsilons, (1.0 + floors) / 2)
        endpoint.run_env_steps = 5_000   # past the decay: Ape-X's spread, held
        for _ in range(c.chunk_steps):
            collector.step()
        assert torch.allclose(collector.epsilons, floors) and len(set(collector.epsilons.tolist())) == E
    finally:
        collector.close()


def test_apex_floor_lifts_only_the_envs_below_it():
    overrides = ("collectors.exploration=apex", "collectors.apex_alpha=15", "collectors.apex_floor=0.01")
    cfg = prepared(*overrides)[0]
    E, c = cfg.env.envs_per_collector, cfg.collectors
    spread = torch.cat([dqn.apex_epsilons(cfg.num_envs, i * E, E, c.apex_epsilon, c.apex_alpha) for i in (0, 1)])
    assert (spread > 0.01).any() and (spread < 0.01).any()
    epsilons = []
    for index in (0, 1):
        _, _, endpoint = prepared(*overrides)
        collector = Collector(cfg, index=index, transport=endpoint)
        collector.prepare()
        try:
            assert collector.start()
            epsilons.append(collector.epsilons)
        finally:
            collector.close()
    assert torch.equal(torch.cat(epsilons), torch.where(spread < 0.01, torch.tensor(0.01), spread))


def test_a_collector_prepared_before_it_joins_plays_as_the_incarnation_the_run_gives_it():
    """A collector role makes its envs, network and first observations before it joins (while the learner starts),
    as the slot's first incarnation. Joined as that one it goes on from them; joined as a later one (it replaces a
    process that died) it plays and explores as a collector made as that incarnation does."""
    cfg, _, endpoint = prepared()
    for incarnation in (0, 2):
        early, made_joined = Collector(cfg, index=1, transport=None), Collector(cfg, index=1, transport=endpoint,
                                                                                incarnation=incarnation)
        try:
            early.prepare()
            early.joined(endpoint, incarnation)
            made_joined.prepare()
            assert early.seed == made_joined.seed and early.incarnation == incarnation
            assert torch.equal(early.obs, made_joined.obs) and early.obs_first.all()
            assert early.generator.initial_seed() == made_joined.generator.initial_seed() == early.seed
            assert torch.equal(early.env.step(torch.ones(4, dtype=torch.long)).obs,
                               made_joined.env.step(torch.ones(4, dtype=torch.long)).obs)
        finally:
            early.close(), made_joined.close()


def test_a_collector_runs_until_the_learner_says_the_run_is_over():
    cfg, _, endpoint = prepared()
    endpoint.stop_after = 3
    Collector(cfg, index=0, transport=endpoint).run()
    assert [chunk.seq for chunk in endpoint.sent] == [0, 1, 2]


def test_a_collector_that_gets_no_weights_leaves_without_stepping():
    cfg, _, endpoint = prepared()
    endpoint.new_weights = None
    Collector(cfg, index=0, transport=endpoint).run()
    assert endpoint.sent == []


def test_a_chunk_says_at_which_epsilon_each_of_its_episodes_was_played():
    """Each episode that ended in a chunk comes with its score, its length and the highest epsilon its env acted at
    in it, in the same order; a chunk with a step that gave no epsilons gives none."""
    spec = EnvSpec((1, 2), torch.float32, 2)
    E = 3

    def step(ended: list[bool], reward: float) -> StepResult:
        flags = torch.tensor(ended)
        return StepResult(torch.zeros(E, 1, 2), torch.full((E,), reward), torch.full((E,), reward), flags,
                          torch.zeros(E, dtype=torch.bool), flags, torch.zeros(E, dtype=torch.bool))
    builder = ChunkBuilder(4, E, spec)
    obs, first, actions = torch.zeros(E, 1, 2), torch.zeros(E, dtype=torch.bool), torch.zeros(E, dtype=torch.long)
    epsilons = torch.tensor([0.4, 0.1, 0.01])
    builder.add(obs, first, actions, step([False, False, False], 1.0), epsilons=epsilons)
    builder.add(obs, first, actions, step([False, True, False], 2.0), epsilons=epsilons)
    builder.add(obs, first, actions, step([True, False, True], 3.0), epsilons=torch.tensor([0.5, 0.1, 0.005]))
    builder.add(obs, first, actions, step([False, False, False], 4.0), epsilons=epsilons)
    chunk = builder.take(0, 0, 0)
    assert chunk.episode_returns.tolist() == [3.0, 6.0, 6.0] and chunk.episode_lengths.tolist() == [2, 3, 3]
    assert chunk.episode_epsilons.dtype == torch.float32
    assert torch.equal(chunk.episode_epsilons, torch.tensor([0.1, 0.5, 0.01]))
    # Env 1's second episode began in the first chunk at 0.1 and ends here at 0.05.
    builder.add(obs, first, actions, step([False, True, False], 1.0), epsilons=torch.tensor([0.4, 0.05, 0.01]))
    for _ in range(3):
        builder.add(obs, first, actions, step([False, False, False], 1.0), epsilons=epsilons)
    assert torch.equal(builder.take(0, 1, 0).episode_epsilons, torch.tensor([0.1]))
    builder.add(obs, first, actions, step([True, False, False], 1.0))
    for _ in range(3):
        builder.add(obs, first, actions, step([False, False, False], 1.0), epsilons=epsilons)
    assert builder.take(0, 2, 0).episode_epsilons is None
    for _ in range(4):
        builder.add(obs, first, actions, step([False, False, False], 1.0), epsilons=epsilons)
    assert builder.take(0, 3, 0).episode_epsilons.shape == (0,)   # no episode ended: none to say
