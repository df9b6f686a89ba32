"""Config: every shipped file loads, overrides convert to the field types, and bad input names its key."""

from __future__ import annotations

import os
import select
import socket
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from rl_dqn.config import ConfigError, load_config, save_config
from rl_dqn.supervisor import free_port

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_shipped_configs_load(path):
    cfg = load_config(path)
    assert cfg.run.name.startswith(cfg.env.id.split("/")[-1].split("-")[0] + "__" + path.stem + "__s")


def test_required_keys_exist_with_their_meaning():
    cfg = load_config(ROOT / "configs/pong.yaml", ["run.name=x", "run.seed=3", "env.id=ALE/Breakout-v5",
                                                   "collectors.count=3", "train.total_env_steps=1e6",
                                                   "transport.kind=cpu"])
    assert (cfg.run.name, cfg.run.seed, cfg.env.id, cfg.collectors.count) == ("x", 3, "ALE/Breakout-v5", 3)
    assert cfg.train.total_env_steps == 1_000_000 and isinstance(cfg.train.total_env_steps, int)
    assert cfg.transport.kind == "cpu"
    assert cfg.world_size == 4   # a one-node run: learner + 3 collectors


def test_overrides_convert_like_a_person_means_them(tmp_path):
    # PyYAML reads 1e-4 as a string; the float field still gets a float.
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  lr: 1e-4\n  total_env_steps: 2_000_000\n")
    cfg = load_config(path, ["train.gamma=0.5", "run.name=007", "transport.tensorpipe_transports=[uv, shm]",
                             "env.terminal_on_life_loss=false"])
    assert cfg.train.lr == pytest.approx(1e-4) and cfg.train.total_env_steps == 2_000_000
    assert cfg.train.gamma == 0.5 and cfg.run.name == "007"
    assert cfg.transport.tensorpipe_transports == ("uv", "shm") and cfg.env.terminal_on_life_loss is False
    # A number, or null for none.
    assert load_config(path, ["eval.every_env_steps=100", "eval.stop_score=18"]).eval.stop_score == 18.0
    assert load_config(path, ["eval.every_env_steps=100", "eval.stop_score=null"]).eval.stop_score is None
    assert load_config(path, ["train.n_step=5", "train.n_step_end=2"]).train.n_step_end == 2
    assert load_config(path, ["train.n_step_end=null"]).train.n_step_end is None


@pytest.mark.parametrize("override, key, allowed", [
    ("train.bach_size=32", "train.bach_size", "did you mean batch_size"),
    ("trian.lr=1", "trian", "did you mean train"),
    ("train.batch_size=abc", "train.batch_size", "must be an integer"),
    ("train.batch_size=3.5", "train.batch_size", "must be an integer"),
    ("train.lr=fast", "train.lr", "must be a number"),
    ("train.gamma=1.5", "train.gamma", "[0, 1]"),
    ("collectors.count=0", "collectors.count", ">= 1"),
    ("transport.kind=tcp", "transport.kind", "one of cpu"),
    ("transport.tensorpipe_transports=[carrier_pigeon]", "transport.tensorpipe_transports", "uv, shm, ibv"),
    ("env.clip_rewards=maybe", "env.clip_rewards", "true or false"),
    ("collectors.exploration=boltzmann", "collectors.exploration", "apex, linear, linear_apex"),
    ("collectors.apex_floor=-0.01", "collectors.apex_floor", "must be in [0, 1]"),
    ("train.learning_starts=10", "train.learning_starts", ">= train.batch_size"),
    ("train.replay_capacity=100", "train.replay_capacity", ">= train.learning_starts"),
    ("learner.device=tpu", "learner.device", "auto, cpu, cuda or cuda:N"),
    ("cluster.init_method=http://x", "cluster.init_method", "tcp://HOST:PORT (port 1-65535) or env://"),
    ("cluster.init_method=tcp://10.0.0.1:99999", "cluster.init_method", "port 1-65535"),
    ("run.name=../escape", "run.name", "folder name"),
    ("lr=1", "lr=1", "section.key=value"),
    ("network.torso=resnet", "network.torso", "one of nature, nips"),
    ("network.precision=fp16", "network.precision", "one of auto, fp32, bf16"),
    ("network.quantiles=1", "network.quantiles", "0 (Q-values) or a number of quantiles from 2 to 1,000"),
    ("network.quantiles=-3", "network.quantiles", "0 (Q-values) or a number of quantiles from 2 to 1,000"),
    ("eval.envs=0", "eval.envs", ">= 1"),
    ("eval.ema_updates=-1", "eval.ema_updates", ">= 0 (0 = none)"),
    ("eval.screen_episodes=-1", "eval.screen_episodes", "0 (off) or 1 to eval.episodes - 1"),
    ("eval.screen_episodes=2", "eval.screen_episodes", "1 to eval.episodes - 1 (1)"),
    ("transport.tensorpipe_channels=[cuda_ipc]", "transport.tensorpipe_channels", "at least one of cma, mpt_uv, basic"),
    ("transport.tensorpipe_channels=[basic, carrier_pigeon]", "transport.tensorpipe_channels", "cuda_gdr"),
    ("eval.max_episode_frames=2", "eval.max_episode_frames", "0 or >= env.frame_skip (4)"),
    ("train.priority_beta_env_steps=500", "train.priority_beta_env_steps", "0 (train.total_env_steps) or > train"),
    ("eval.stop_score=high", "eval.stop_score", "must be a number"),
    ("train.lr_end=0", "train.lr_end", "> 0 or null"),
    ("train.lr_decay_start_env_steps=-1", "train.lr_decay_start_env_steps", ">= 0"),
    ("train.lr_decay_end_env_steps=-5", "train.lr_decay_end_env_steps", "> train.lr_decay_start_env_steps (0)"),
    ("train.n_step_end=0", "train.n_step_end", "from 1 to train.n_step"),
    ("train.munchausen_alpha=0.9", "train.double", "must be false with train.munchausen_alpha > 0"),
    ("train.munchausen_alpha=1.5", "train.munchausen_alpha", "[0, 1] (0 = off)"),
    ("train.munchausen_tau=0", "train.munchausen_tau", "> 0"),
    ("train.munchausen_clip=0", "train.munchausen_clip", "< 0"),
    ("eval.sticky_action_prob=1", "eval.sticky_action_prob", "[0, 1) or null"),
    ("train.n_step_end=1.5", "train.n_step_end", "must be an integer"),
    ("train.n_step_end=99", "train.n_step_end", "from 1 to train.n_step"),
    ("train.n_step_decay_start_env_steps=-1", "train.n_step_decay_start_env_steps", ">= 0"),
    ("train.n_step_decay_end_env_steps=-5", "train.n_step_decay_end_env_steps",
     "> train.n_step_decay_start_env_steps (0)"),
    ("train.lr=2024-13-01", "train.lr", "must be a number, got '2024-13-01'"),
    ("env.id=Pong v5", "env.id", "must be a gymnasium id such as ALE/Pong-v5"),   # not blamed on run.name   # not a date YAML can make
    ("run.seed=" + "9" * 5000, "run.seed", "must be an integer"),                  # more digits than Python reads
    # Beyond what the libraries take, refused before a role fails on it: ale-py's seeds are C ints (and torch's 64-bit)
    ("run.seed=99999999999999999999", "run.seed", "from 0 to 2,147,483,647"),
    ("run.seed=4294967295", "run.seed", "from 0 to 2,147,483,647"),
    ("collectors.max_restarts=1001", "collectors.max_restarts", "from 0 to 1,000"),
    # Integers beyond what tensors and TensorBoard count in, and numbers too long for a float
    ("train.total_env_steps=" + "1" * 400, "train.total_env_steps", "at most 9,223,372,036,854,775,807 (2^63 - 1)"),
    ("train.total_env_steps=9223372036854775808", "train.total_env_steps", "at most 9,223,372,036,854,775,807"),
    ("train.lr=" + "1" * 400, "train.lr", "must be a number, got 1111"),
    # Sizes no machine allocates
    ("network.mlp_hidden=[100000000000]", "network.mlp_hidden", "1 to 16 widths of 1 to 16,384, got [100000000000]"),
    ("network.mlp_hidden=[16384, 16384, 16384]", "network.mlp_hidden", "at most 268,435,456 weights between"),
    ("network.mlp_hidden=[" + "8, " * 17 + "8]", "network.mlp_hidden", "1 to 16 widths of 1 to 16,384, got 18 widths"),
    ("network.quantiles=1000000000", "network.quantiles", "from 2 to 1,000"),
    ("transport.worker_threads=100000", "transport.worker_threads", "from 2 to 1,024"),
    # Durations that torch.distributed cannot hold in its milliseconds, or would read as no timeout at all
    ("cluster.join_timeout_s=1e300", "cluster.join_timeout_s", "from 0.001 to 604,800 seconds (a week)"),
    ("cluster.join_timeout_s=604801", "cluster.join_timeout_s", "from 0.001 to 604,800 seconds (a week)"),
    ("transport.rpc_timeout_s=1e300", "transport.rpc_timeout_s", "from 0.001 to 604,800 seconds (a week)"),
    ("transport.rpc_timeout_s=0.0001", "transport.rpc_timeout_s", "from 0.001 to 604,800 seconds (a week)"),
    ("metrics.interval_s=1e300", "metrics.interval_s", "from 0.001 to 604,800 seconds (a week)"),
])
def test_bad_values_name_their_key(override, key, allowed):
    with pytest.raises(ConfigError) as error:
        load_config(ROOT / "configs/smoke.yaml", [override])
    assert error.value.key == key
    assert str(error.value).startswith(f"{key}: ") and allowed in str(error.value)


@pytest.mark.parametrize("text, key, allowed", [
    ("1: {}\n", "1", "unknown key; allowed: run, env"),
    ("null: 3\n", "None", "unknown key; allowed: run, env"),
    ("train: {1: 2}\n", "train.1", "unknown key; allowed: total_env_steps"),
    ("run: {seed: 2024-13-45}\n", "config", "is not valid UTF-8 YAML: month must be in 1..12"),
    # PyYAML keeps the last of a key given twice: a section, a key or a device map's GPU, at any depth, is refused
    ("run:\n  seed: 1\nrun:\n  seed: 2\n", "run", "is given twice in "),
    ("train:\n  lr: 1e-4\n  lr: 2e-4\n", "train.lr", "odd.yaml (lines 2 and 3); give it once"),
    ("transport: {device_map: {1: {0: 0, 0: 1}}}\n", "transport.device_map.1.0", "is given twice in "),
    ("env: {frame_skip: 4, 0x1: 1, 1: 2}\n", "env.1", "(lines 1 and 1)"),     # one key in two spellings
    # centered_frames is frame_offset's earlier name: the two may not say different things
    ("network: {centered_frames: true, frame_offset: none}\n", "network.centered_frames",
     "earlier name (true = half, false = none) and says half, but network.frame_offset is none"),
    ("network: {centered_frames: false, frame_offset: background}\n", "network.centered_frames",
     "says none, but network.frame_offset is background"),
])
def test_a_config_file_with_keys_or_values_yaml_reads_oddly_names_them(text, key, allowed, tmp_path):
    (tmp_path / "odd.yaml").write_text(text)
    with pytest.raises(ConfigError) as error:
        load_config(tmp_path / "odd.yaml")
    assert error.value.key == key and allowed in str(error.value)


@pytest.mark.parametrize("name", ["lr", "n_step"])
def test_a_decay_ends_after_it_starts_and_a_run_shorter_than_its_start_never_decays(name):
    with pytest.raises(ConfigError, match=f"^train.{name}_decay_end_env_steps: must be 0 .* or > "
                                          f"train.{name}_decay_start_env_steps \\(5000\\), got 5000$"):
        load_config(ROOT / "configs/atari_cpu.yaml", [f"train.{name}_decay_start_env_steps=5000",
                                                      f"train.{name}_decay_end_env_steps=5000"])
    # A short run of a config made for 30 minutes: its schedules hold at their start values throughout.
    load_config(ROOT / "configs/atari_cpu.yaml", ["train.total_env_steps=20000", "train.n_step_end=1",
                                                  "train.n_step_decay_start_env_steps=1000000"])


def test_an_override_fills_a_section_the_file_leaves_empty(tmp_path):
    (tmp_path / "empty.yaml").write_text("eval:\nenv:\n  id: CartPole-v1\n")   # `eval:` reads as null
    assert load_config(tmp_path / "empty.yaml", ["eval.episodes=5"]).eval.episodes == 5


def test_a_config_file_may_still_repeat_values_through_anchors_and_merge_keys(tmp_path):
    (tmp_path / "anchors.yaml").write_text("collectors: &threads {torch_threads: 2}\neval: *threads\nnetwork:\n"
                                           "  <<: {torso: nips}\n  torso: nature\n  centered_frames: true\n"
                                           "  frame_offset: half\n")
    cfg = load_config(tmp_path / "anchors.yaml")
    assert (cfg.collectors.torch_threads, cfg.eval.torch_threads) == (2, 2)
    assert (cfg.network.torso, cfg.network.frame_offset) == ("nature", "half")


def test_the_largest_run_seed_and_restarts_give_seeds_ale_py_takes():
    """ale-py seeds env k with seed + k as a C int; the seeds the roles derive from the largest run.seed (here a
    collector's after its last restart, Collector.seed) are brought into that range where the envs take them."""
    from types import SimpleNamespace
    from envs import make_vector_env
    from rl_dqn.collector import Collector
    cfg = load_config(ROOT / "configs/smoke.yaml", [f"run.seed={2**31 - 1}", "collectors.max_restarts=1000"])
    last = Collector.seed.fget(SimpleNamespace(cfg=cfg, index=cfg.num_collectors - 1,
                                               incarnation=cfg.collectors.max_restarts))
    assert last > 2**31
    env = make_vector_env(cfg.env, cfg.env.envs_per_collector, seed=last)
    try:
        first = env.reset()
        assert torch.equal(env.reset(seed=last), first)   # the same seed, the same episodes
        env.reset(seed=2**31 - 1)
    finally:
        env.close()


def test_quantiles_refuse_the_collectors_priorities_which_measure_another_error():
    with pytest.raises(ConfigError) as error:
        load_config(ROOT / "configs/cartpole.yaml", ["network.quantiles=8", "train.initial_priority=collectors"])
    assert error.value.key == "train.initial_priority" and "must be max with network.quantiles" in str(error.value)
    assert load_config(ROOT / "configs/cartpole.yaml", ["network.quantiles=8", "train.initial_priority=max"])


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config(ROOT / "configs/pong.yaml", ["run.name=rt", "train.lr=3e-4"])
    save_config(cfg, tmp_path / "config.yaml")
    again = load_config(tmp_path / "config.yaml")
    assert again == cfg
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["train"]["lr"] == 3e-4


def _cli(*args, env=None, timeout=60):
    return subprocess.run([sys.executable, "-m", "rl_dqn", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.mark.parametrize("args, key", [
    (["local", "configs/smoke.yaml", "train.bach_size=3"], "train.bach_size"),
    (["local", "configs/smoke.yaml", "run.seed=99999999999999999999"], "run.seed"),
    (["local", "configs/smoke.yaml", "cluster.join_timeout_s=1e300"], "cluster.join_timeout_s"),
    (["local", "configs/smoke.yaml", "env.id=ALE/Pongg-v5"], "env.id"),
    (["local", "configs/smoke.yaml", "env.id=NoSuchEnv-v0"], "env.id"),
    (["local", "configs/smoke.yaml", "env.id=PongNoFrameskip-v4"], "env.id"),     # old-style Atari id
    (["local", "configs/smoke.yaml", "env.id=ALE/Pong-ram-v5"], "env.id"),        # RAM observations
    (["local", "configs/smoke.yaml", "env.id=LunarLander-v3"], "env.id"),         # needs box2d, not installed
    (["learner", "configs/smoke.yaml"], "cluster.init_method"),
    (["collectors", "configs/smoke.yaml", "cluster.init_method=tcp://127.0.0.1:1", "cluster.world_size=3"],
     "cluster.rank"),
    (["local", "configs/no_such_file.yaml"], "config"),
    # Device placement, refused before init_rpc (inside it, a bad map can surface as an unrelated store timeout).
    (["local", "configs/smoke.yaml", "transport.kind=cuda"] if not torch.cuda.is_available() else
     ["local", "configs/smoke.yaml", "transport.kind=cuda", "learner.device=cpu"],
     "transport.kind" if not torch.cuda.is_available() else "learner.device"),
    (["local", "configs/smoke.yaml", "collectors.device=cuda:9"], "collectors.device"),
    (["collectors", "configs/smoke.yaml", "cluster.init_method=tcp://127.0.0.1:1", "cluster.world_size=3",
      "cluster.rank=1", "cluster.interface=lo", "transport.kind=cuda", "transport.device_map=2_0_0"],
     "transport.device_map"),
    # Listening: a multi-node run names its interface, which must exist here.
    (["collectors", "configs/smoke.yaml", "cluster.init_method=tcp://127.0.0.1:1", "cluster.world_size=3",
      "cluster.rank=1"], "cluster.interface"),
    (["collectors", "configs/smoke.yaml", "cluster.init_method=tcp://127.0.0.1:1", "cluster.world_size=3",
      "cluster.rank=1", "cluster.interface=nosuch0"], "cluster.interface"),
    (["local", "configs/smoke.yaml", "run.name=never-ran", "run.resume=true"], "run.resume"),
    (["local", "configs/cartpole.yaml", "eval.video=true"], "eval.video"),              # videos are Atari's
    # The learner listens on its interface's address only: a rendezvous host elsewhere could never be reached.
    (["learner", "configs/smoke.yaml", "cluster.init_method=tcp://127.0.0.2:1", "cluster.world_size=3",
      "cluster.interface=lo"], "cluster.init_method"),
])
def test_cli_refuses_bad_input_with_one_line_and_exit_2(args, key, capsys, monkeypatch, tmp_path):
    """In this process, as `python -m rl_dqn` runs it (a fresh interpreter per case costs seconds: the one below
    goes through it)."""
    from rl_dqn.cli import main
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr("rl_dqn.cli.RUNS_DIR", tmp_path)
    assert main(args) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"rl_dqn: config error: {key}: ")


@pytest.mark.parametrize("role", [["collector", "cluster.world_size=3", "cluster.rank=1", "cluster.interface=lo"],
                                  ["local"]])
def test_env_rendezvous_without_its_variables_is_refused_before_any_role_starts(role, capsys, monkeypatch, tmp_path):
    from rl_dqn.cli import main
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr("rl_dqn.cli.RUNS_DIR", tmp_path)
    for name in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE"):
        monkeypatch.delenv(name, raising=False)
    assert main([role[0], "configs/smoke.yaml", "cluster.init_method=env://", *role[1:]]) == 2
    err = capsys.readouterr().err
    assert err == "rl_dqn: config error: cluster.init_method: is env:// but MASTER_ADDR and MASTER_PORT are not " \
                  "set\n", err
    assert not any(tmp_path.iterdir())


def test_env_rendezvous_on_a_port_out_of_range_is_refused_before_the_run_folder_is_made(capsys, monkeypatch,
                                                                                         tmp_path):
    from rl_dqn.cli import main
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr("rl_dqn.cli.RUNS_DIR", tmp_path)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "99999")
    assert main(["local", "configs/smoke.yaml", "cluster.init_method=env://"]) == 2
    err = capsys.readouterr().err
    assert err.endswith("MASTER_PORT must be a port number from 1 to 65535, got '99999'\n") and \
        err.count("\n") == 1, err
    assert not any(tmp_path.iterdir())


def test_python_m_rl_dqn_refuses_bad_input_with_one_line_and_exit_2():
    result = _cli("local", "configs/smoke.yaml", "train.bach_size=3")
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("rl_dqn: config error: train.bach_size: ") and result.stderr.count("\n") == 1


@pytest.mark.parametrize("override, variables, key", [
    ("cluster.world_size=5", {"WORLD_SIZE": "3", "RANK": "1"}, "cluster.world_size"),   # disagrees with the config
    ("cluster.rank=2", {"WORLD_SIZE": "3", "RANK": "1"}, "cluster.rank"),
    ("run.seed=1", {"WORLD_SIZE": "3", "RANK": "one"}, "cluster.rank"),                 # not a number
])
def test_torchrun_variables_that_disagree_are_refused(override, variables, key):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT="1", **variables)
    result = _cli("worker", "configs/smoke.yaml", "cluster.init_method=env://", "cluster.interface=lo", override,
                  env=env)
    assert result.returncode == 2 and result.stderr.startswith(f"rl_dqn: config error: {key}: "), result.stderr


def test_torchrun_variables_fill_rank_and_world_size():
    from rl_dqn.cli import _from_environment, _parser
    args = _parser().parse_args(["collectors", "configs/smoke.yaml", "cluster.init_method=env://", "run.name=x"])
    cfg = load_config(ROOT / args.config, args.overrides)
    args.config = ROOT / args.config
    filled = _from_environment(cfg, args, {"WORLD_SIZE": "9", "RANK": "5", "MASTER_ADDR": "h", "MASTER_PORT": "1"})
    assert (filled.cluster.world_size, filled.cluster.rank, filled.run.name) == (9, 5, "x")
    # Without env:// the variables mean nothing to the run.
    args.overrides = ["run.name=x"]
    plain = load_config(ROOT / "configs/smoke.yaml", args.overrides)
    assert _from_environment(plain, args, {"WORLD_SIZE": "9", "RANK": "5"}) == plain


def test_the_config_reference_page_is_the_one_generated_from_the_config_classes():
    """docs/config.md is `python -m rl_dqn.config`'s output."""
    from rl_dqn.config import reference_markdown
    assert (ROOT / "docs/config.md").read_text() == reference_markdown(), \
        "docs/config.md is out of date: python -m rl_dqn.config > docs/config.md"


def test_launcher_script_refuses_bad_input_before_starting_anything(tmp_path):
    env = dict(os.environ, RL_DQN_PYTHON=sys.executable, RL_DQN_RUNS_DIR=str(tmp_path))
    result = subprocess.run([str(ROOT / "launch/local.sh"), "configs/smoke.yaml", "collectors.count=-1"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 2
    assert result.stderr.strip() == "rl_dqn: config error: collectors.count: must be >= 1, got -1"
    assert list(tmp_path.iterdir()) == []


def test_a_replay_larger_than_the_memory_is_refused_before_starting(tmp_path):
    env = dict(os.environ, RL_DQN_RUNS_DIR=str(tmp_path))
    result = _cli("local", "configs/smoke.yaml", "train.replay_capacity=10000000000000", env=env)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("rl_dqn: config error: train.replay_capacity: 10,000,000,000,000 transitions of ")
    assert "GiB available; at most " in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_replay_check_counts_what_the_memory_allocates():
    from envs import EnvSpec
    from rl_dqn.cli import check_replay_memory
    cfg = load_config(ROOT / "configs/atari_cpu.yaml", ["train.replay_capacity=200000"])
    spec = EnvSpec((4, 84, 84), torch.uint8, 6)
    check_replay_memory(cfg, spec, "cpu", None)                  # unknown: not checked
    check_replay_memory(cfg, spec, "cpu", 200_000 * 7_082 + 7_056)   # a frame and 26 bytes each, one zero frame
    with pytest.raises(ConfigError, match=r"^train.replay_capacity: 200,000 transitions of 7,082 bytes need 1.3 GiB "
                                          r"on cpu, which has 1.0 GiB available; at most 151,615 fit there$"):
        check_replay_memory(cfg, spec, "cpu", 2**30)


def test_config_that_is_not_utf8_is_refused(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("run:\n  name: caf\xe9\n".encode("latin-1"))
    result = _cli("local", str(path))
    assert result.returncode == 2 and result.stderr.startswith("rl_dqn: config error: config: ")


def test_unwritable_runs_folder_is_refused_before_starting(tmp_path):
    env = dict(os.environ, RL_DQN_RUNS_DIR=str(tmp_path / "a-file" / "runs"))
    (tmp_path / "a-file").write_text("not a folder")
    result = _cli("local", "configs/smoke.yaml", env=env)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith("rl_dqn: config error: run.name: cannot write the run folder")


def test_a_run_name_that_is_a_file_is_refused_in_one_line(tmp_path):
    (tmp_path / "taken").write_text("a file")
    result = _cli("local", "configs/smoke.yaml", "run.name=taken", env=dict(os.environ, RL_DQN_RUNS_DIR=str(tmp_path)))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"rl_dqn: config error: run.name: {tmp_path / 'taken'} is a file, not a run "
                                    f"folder")


@pytest.mark.parametrize("timeout_s", [3, 1])
def test_a_collector_gives_up_joining_at_its_deadline(timeout_s):
    """With one line, and exit code 1: the store's connect, still blocked when the process gives up, neither logs a
    C++ trace nor aborts the process as it exits (it did, with exit -6, in 6 of 15 tries on a busy machine)."""
    port = free_port()
    started = time.monotonic()
    result = _cli("collector", "configs/smoke.yaml", f"cluster.init_method=tcp://127.0.0.1:{port}",
                  "cluster.world_size=3", "cluster.rank=1", f"cluster.join_timeout_s={timeout_s}",
                  "cluster.interface=lo")
    assert result.returncode == 1, result.stderr[-2000:]
    assert result.stderr.strip() == (
        f"[collector0] error: gave up joining the run at 127.0.0.1:{port} as collector0 after "
        f"cluster.join_timeout_s={timeout_s} s: no learner's store answered: is the learner running, at this address?")
    assert time.monotonic() - started < 30


def wait_for_output(process: subprocess.Popen, text: str, timeout: float = 60) -> None:
    """Reads the process's stdout (raw, past its text buffer) until `text` comes."""
    seen, deadline = b"", time.monotonic() + timeout
    while text.encode() not in seen:
        left = deadline - time.monotonic()
        assert left > 0 and process.poll() is None, f"no {text!r} within {timeout} s: {seen.decode()[-2000:]}"
        if select.select([process.stdout], [], [], left)[0]:
            seen += os.read(process.stdout.fileno(), 65536)


def test_sigterm_while_joining_ends_the_process(tmp_path):
    process = subprocess.Popen([sys.executable, "-m", "rl_dqn", "collector", "configs/smoke.yaml",
                                f"cluster.init_method=tcp://127.0.0.1:{free_port()}", "cluster.world_size=3",
                                "cluster.rank=1", "cluster.interface=lo", "run.name=joining"],
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=dict(os.environ, RL_DQN_RUNS_DIR=str(tmp_path)))
    wait_for_output(process, "[collector0] joining the run at")   # for a learner that never comes
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=20)
    assert process.returncode == 1 and "stopped while joining the run" in stderr


def test_a_learner_alone_stops_on_sigterm_and_keeps_a_checkpoint(tmp_path):
    process = subprocess.Popen([sys.executable, "-m", "rl_dqn", "learner", "configs/smoke.yaml",
                                f"cluster.init_method=tcp://127.0.0.1:{free_port()}", "cluster.world_size=3",
                                "cluster.interface=lo", "run.name=alone"], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=dict(os.environ, RL_DQN_RUNS_DIR=str(tmp_path)))
    wait_for_output(process, "waiting for 2 collectors")   # that never come
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=20)
    assert process.returncode == 0 and "[learner] stopped on a signal" in stdout, stderr
    assert list((tmp_path / "alone" / "checkpoints").glob("checkpoint_*.pt"))


def test_a_learner_that_cannot_start_its_rendezvous_loses_nothing_and_leaves_nothing_in_the_way(tmp_path):
    """Its port taken: a new run leaves no run folder, so that the same command starts it once the port is free;
    a resumed one leaves its checkpoint, replay and summary as they were (before, each was written again)."""
    def learner(port: int | None, *overrides: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "rl_dqn", "learner", "configs/smoke.yaml", "run.name=r",
                                 f"cluster.init_method=tcp://127.0.0.1:{port}", "cluster.world_size=3",
                                 "cluster.interface=lo", *overrides], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=dict(os.environ, RL_DQN_RUNS_DIR=str(tmp_path)))

    def refused(*overrides: str) -> None:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            _, stderr = learner(taken.getsockname()[1], *overrides).communicate(timeout=120)
        assert stderr.count("\n") == 1 and "Address already in use" in stderr, stderr

    refused()
    assert not (tmp_path / "r").exists()
    alone = learner(free_port())   # the same command: the run starts, and stops on SIGTERM with a checkpoint
    wait_for_output(alone, "waiting for 2 collectors")
    alone.send_signal(signal.SIGTERM)
    alone.communicate(timeout=30)
    kept = {path: (path.stat().st_mtime_ns, path.read_bytes()) for path in (tmp_path / "r").rglob("*")
            if path.suffix in (".pt", ".json")}
    assert len(kept) == 4   # checkpoint, replay, summary.json, run.json
    refused("run.resume=true")
    assert all((path.stat().st_mtime_ns, path.read_bytes()) == was for path, was in kept.items()
               if path.name != "run.json")   # run.json notes each launch of the run
