"""Device placement and TensorPipe device maps, for any number of GPUs (a pure function of the config, the rank
and the node's GPU count, so these run without a GPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rl_dqn.config import ConfigError, DeviceMapEntry, load_config
from rl_dqn.transport import place

ROOT = Path(__file__).resolve().parents[1]


def cfg(*overrides):
    return load_config(ROOT / "configs/smoke.yaml", ["run.name=t", *overrides])


def one_node(*overrides):
    """How launch/local.sh configures each role of a one-node run."""
    return cfg("transport.kind=cuda", "cluster.single_node=true", "cluster.rank=1", *overrides)


def test_device_map_forms_agree():
    di = cfg("cluster.world_size=4", "transport.device_map=1_0_1,2_0_2,3_1_0").transport.device_map
    by_rank = cfg("cluster.world_size=4", "transport.device_map={1: {0: 1}, 2: {0: 2}, 3: {1: 0}}").transport.device_map
    by_name = cfg("cluster.world_size=4",
                  "transport.device_map={collector0: {cuda:0: cuda:1}, collector1: {0: 2}, collector2: {1: 0}}"
                  ).transport.device_map
    assert di == by_rank == by_name == (DeviceMapEntry(1, 0, 1), DeviceMapEntry(2, 0, 2), DeviceMapEntry(3, 1, 0))


@pytest.mark.parametrize("text, problem", [
    ("1_0", "<peer rank>_<local gpu>_<peer gpu>"),
    ("a_b_c", "<peer rank>_<local gpu>_<peer gpu>"),
    ("{learner: 5}", "maps to 5"),
    ("{boss: {0: 0}}", "peers are ranks or names"),
    ("1_0_0,1_0_1", "one local GPU to two GPUs"),
])
def test_malformed_device_maps_are_refused(text, problem):
    with pytest.raises(ConfigError, match="transport.device_map") as error:
        cfg(f"transport.device_map={text}")
    assert problem in str(error.value)


def test_one_gpu_shared_by_every_process():
    c = one_node()
    learner = place(c, 0, gpu_count=1)
    assert learner.device == torch.device("cuda", 0)
    assert learner.device_maps == {"collector0": {0: 0}, "collector1": {0: 0}}   # cuda:0 -> cuda:0, CUDA IPC
    for rank in (1, 2):
        collector = place(c, rank, gpu_count=1)
        assert collector.device == torch.device("cuda", 0) and collector.device_maps == {"learner": {0: 0}}
        assert collector.sends_cuda_to("learner")


def test_several_gpus_spread_the_collectors():
    c = one_node("collectors.count=4", "learner.device=cuda:1")
    assert [place(c, r, gpu_count=2).device.index for r in (1, 2, 3, 4)] == [0, 1, 0, 1]
    assert place(c, 0, gpu_count=2).device_maps == {"collector0": {1: 0}, "collector1": {1: 1},
                                                    "collector2": {1: 0}, "collector3": {1: 1}}
    assert place(c, 3, gpu_count=2).device_maps == {"learner": {0: 1}}
    c = one_node("collectors.count=3", "learner.device=cuda:3")
    assert place(c, 0, gpu_count=4).device_maps == {"collector0": {3: 0}, "collector1": {3: 1}, "collector2": {3: 2}}


def test_cpu_transport_has_no_maps_even_with_gpus():
    c = cfg("cluster.single_node=true", "cluster.rank=1")
    learner, collector = place(c, 0, gpu_count=2), place(c, 1, gpu_count=2)
    assert learner.device.type == "cuda" and learner.device_maps == {}
    assert collector.device.type == "cuda" and not collector.sends_cuda_to("learner")   # staged in host memory


def test_multi_node_maps_learner_to_collectors_only_where_given():
    """Two collector nodes; the learner is told the GPU of collector0 only."""
    c = cfg("transport.kind=cuda", "cluster.world_size=5", "cluster.init_method=tcp://10.0.0.1:29500",
            "transport.device_map=1_0_1")
    learner = place(c, 0, gpu_count=1)
    assert learner.device_maps == {"collector0": {0: 1}}
    assert learner.sends_cuda_to("collector0") and not learner.sends_cuda_to("collector1")   # CPU weights
    # A collector node derives its own map to the learner: it knows its GPU and learner.device.
    node = cfg("transport.kind=cuda", "cluster.world_size=5", "cluster.rank=3", "collectors.count=2",
               "learner.device=cuda:2")
    assert [place(node, r, gpu_count=2).device_maps for r in (3, 4)] == [{"learner": {0: 2}}, {"learner": {1: 2}}]


def test_mixed_cluster_collectors_without_a_gpu_use_cpu_tensors():
    node = cfg("transport.kind=cuda", "cluster.world_size=3", "cluster.rank=1")
    for rank in (1, 2):
        collector = place(node, rank, gpu_count=0)
        assert collector.device == torch.device("cpu") and collector.device_maps == {}
        assert not collector.sends_cuda_to("learner")


@pytest.mark.parametrize("overrides, rank, gpus, key, words", [
    (["transport.kind=cuda"], 0, 0, "transport.kind", "needs a CUDA GPU on the learner's node"),
    (["transport.kind=cuda", "learner.device=cpu"], 0, 1, "learner.device", "must be a CUDA device"),
    (["transport.kind=cuda", "learner.device=cpu"], 1, 1, "learner.device", "must be a CUDA device"),
    (["learner.device=cuda:2"], 0, 1, "learner.device", "is cuda:2 but this node has 1 GPU (cuda:0)"),
    (["learner.device=cuda"], 0, 0, "learner.device", "no CUDA GPU"),
    (["collectors.device=cuda:1"], 1, 1, "collectors.device", "is cuda:1 but this node has 1 GPU"),
    (["collectors.device=cuda"], 1, 0, "collectors.device", "no CUDA GPU"),
    (["transport.kind=cuda", "transport.device_map=7_0_0"], 0, 1, "transport.device_map",
     "names rank 7, but the run has ranks 0..2"),
    (["transport.kind=cuda", "transport.device_map=2_0_0"], 1, 1, "transport.device_map",
     "collector0 talks only to the learner"),
    (["transport.kind=cuda", "transport.device_map=0_0_0"], 0, 1, "transport.device_map", "to itself"),
    (["transport.kind=cuda", "transport.device_map=0_3_0"], 1, 1, "transport.device_map",
     "sends from cuda:3, but this node has 1 GPU"),
    (["transport.kind=cuda", "collectors.device=cuda:1", "transport.device_map=0_0_0"], 1, 2,
     "transport.device_map", "works on cuda:1 but its map to learner has no entry for GPU 1"),
    (["transport.kind=cuda", "transport.device_map=0_0_1"], 1, 1, "transport.device_map",
     "would send its chunks to the learner's cuda:1, but the learner trains on cuda:0 (learner.device=auto)"),
    (["transport.kind=cuda", "learner.device=cuda:2", "transport.device_map=0_0_0"], 1, 1, "transport.device_map",
     "map cuda:0 to 2"),
])
def test_placement_errors_name_their_key(overrides, rank, gpus, key, words):
    with pytest.raises(ConfigError) as error:
        place(cfg("cluster.rank=1", *overrides), rank, gpu_count=gpus)
    assert error.value.key == key and words in str(error.value), str(error.value)


@pytest.mark.parametrize("setting, learner, gpus, expected", [
    ("cpu", "auto", 1, "cpu"),
    ("auto", "auto", 1, "cuda:0"),      # the learner's GPU
    ("auto", "cuda:1", 2, "cuda:1"),
    ("auto", "cpu", 1, "cpu"),          # a learner on the CPU: so is its evaluator
    ("auto", "auto", 0, "cpu"),
    ("cuda:1", "auto", 2, "cuda:1"),
])
def test_the_evaluator_acts_on_eval_device_auto_being_the_learners_gpu(setting, learner, gpus, expected):
    from rl_dqn.transport import eval_device
    assert eval_device(cfg(f"eval.device={setting}", f"learner.device={learner}"), gpus) == torch.device(expected)


@pytest.mark.parametrize("setting, problem", [("cuda", "this node has no CUDA GPU"),
                                              ("cuda:1", "this node has no GPU")])
def test_an_evaluator_device_the_node_lacks_is_refused_before_the_learner_starts(setting, problem):
    with pytest.raises(ConfigError, match="eval.device") as error:
        place(cfg(f"eval.device={setting}"), 0, gpu_count=0)
    assert problem in str(error.value)
    place(cfg(f"eval.device={setting}", "eval.every_env_steps=0"), 0, gpu_count=0)   # no evaluator, no problem
