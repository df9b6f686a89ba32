"""Command line: `rl-dqn COMMAND ...` (`pip install -e .` makes it), or `python -m rl_dqn COMMAND ...`.

- local:      this node runs the whole run: a learner and collectors.count collectors on 127.0.0.1
- learner:    the learner process of a multi-node run (rank 0)
- collectors: a collector node: collectors.count collector processes, ranks cluster.rank .. + count - 1
- collector:  one collector process (what `collectors` and `local` start)
- worker:     one process of the run by its rank, torchrun-style: the learner for rank 0, else that collector
Each takes CONFIG [section.key=value ...]. The tools take their own arguments (`rl-dqn TOOL --help`):
- play:       a trained agent's episodes at eval.epsilon and video (rl_dqn.evaluate, ./launch/play.sh)
- doctor:     what this machine is to rl_dqn and whether a config can run here (rl_dqn.doctor, ./launch/doctor.sh)
- plot:       learning curves of runs (rl_dqn.plot)
- results:    docs/results.md from the records under results/ (rl_dqn.results)
With cluster.init_method=env://, MASTER_ADDR and MASTER_PORT name the rendezvous, and WORLD_SIZE and RANK fill
cluster.world_size and cluster.rank where the config leaves them unset (RANK: the first process this command starts).
Bad input exits with code 2 and one line naming the problem; a role that fails exits 1. A resumed run
(run.resume=true) whose newest checkpoint already reached its end exits 0 with one line, training and writing nothing.
`local` and `collectors` start their roles at once: each loads its modules while the node checks the env, the
devices and the run folder, and goes on only once those checks pass.
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib
import json
import os
import shutil
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import NoReturn

from rl_dqn.config import Config, ConfigError, load_config, save_config, to_dict
from rl_dqn.console import (LAUNCHED_AT_ENV, PROGRESS_ENV, PROGRESS_MARK, OneLineParser, StartupClock, description,
                            first_line, launched_at, process_started_at, say)
from rl_dqn.supervisor import EXIT_BAD_INPUT, EXIT_LEARNER_LOST, GATE_ENV, GO, SAVING, free_port

RUNS_DIR = Path(os.environ.get("RL_DQN_RUNS_DIR") or Path(__file__).resolve().parents[1] / "runs")


# The tools, each a module whose main(argv) parses its own arguments: `rl-dqn plot ...` is `python -m rl_dqn.plot ...`.
TOOLS = {"play": ("rl_dqn.evaluate", "play a trained agent: episodes at eval.epsilon, mean +- std, a video"),
         "doctor": ("rl_dqn.doctor", "what this machine is to rl_dqn; whether a config can run here"),
         "plot": ("rl_dqn.plot", "learning curves of runs"),
         "results": ("rl_dqn.results", "docs/results.md from the records under results/")}


# The launcher a command runs under (launch/*.sh set it to how they were called), named in --help and errors.
PROG_ENV = "RL_DQN_PROG"


def _prog(launcher: str = "") -> str:
    return launcher or ("rl-dqn" if Path(sys.argv[0]).name == "rl-dqn" else "python -m rl_dqn")


def _parser(launcher: str = "") -> argparse.ArgumentParser:
    parser = OneLineParser(prog=_prog(launcher), description=description(__doc__))
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    for name, text in (("local", "learner and collectors on this node"), ("learner", "the learner process"),
                       ("collectors", "this node's collector processes"), ("collector", "one collector process"),
                       ("worker", "the learner (rank 0) or one collector, by cluster.rank (or RANK under env://)")):
        p = sub.add_parser(name, help=text, **({"prog": launcher} if launcher else {}))
        p.set_defaults(parser=p)   # an argument it does not take is refused with its usage, not the command's
        p.add_argument("config", help="YAML file, e.g. configs/pong.yaml")
        p.add_argument("overrides", nargs="*", default=[], metavar="section.key=value")   # a default: optional
        if name == "collector":
            p.add_argument("--local-index", type=int, default=0,
                           help="which of this node's collectors: rank = cluster.rank + local index")
    for name, (_, text) in TOOLS.items():   # listed in --help; main() hands their arguments to the module
        sub.add_parser(name, help=text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    launcher = os.environ.pop(PROG_ENV, "")   # this process's: the roles it starts are not the launcher
    if argv and argv[0] in TOOLS:
        return importlib.import_module(TOOLS[argv[0]][0]).main(argv[1:], prog=launcher or f"{_prog()} {argv[0]}")
    # The run's launch, for its roles' start-up lines: this process's start where no launcher set it before.
    os.environ.setdefault(LAUNCHED_AT_ENV, repr(process_started_at() or time.time()))
    args, unknown = _parser(launcher).parse_known_args(argv)
    if unknown:
        args.parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command == "worker":
        args.overrides = [*args.overrides, "collectors.count=1"]   # a process is one role
    _stacks_on_crash()
    try:
        cfg = load_config(args.config, args.overrides)
        if args.command != "local" and not cfg.cluster.single_node:
            cfg = _from_environment(cfg, args, dict(os.environ))
        return _COMMANDS[args.command](cfg, args)
    except ConfigError as e:
        print(f"rl_dqn: config error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT


def entry() -> NoReturn:
    """The `rl-dqn` console command (pyproject.toml) and `python -m rl_dqn`. A Ctrl-C that reaches Python (a node's
    checks, a tool) ends it with 130 and no traceback."""
    # Before torch loads, which reads it once: TensorPipe warns in C++ about every pipe a departing peer closes,
    # where the roles say in one line who left and why. TORCH_CPP_LOG_LEVEL=INFO brings its messages back. (Set
    # here, it reaches every role however it is launched: local.sh, learner.sh, torchrun, SLURM.)
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    try:
        code = main()
    except KeyboardInterrupt:
        code = 128 + signal.SIGINT
    exit_process(code)


def exit_process(code: int) -> NoReturn:
    """Ends the process with `code`, as `python -m rl_dqn` does. A role that gave up joining or starting a run
    leaves a thread blocked in C++ (rl_dqn.transport.rpc.stranded()): that process ends at once, its console
    flushed, without the interpreter's finalization, which could abort it under that thread."""
    rpc = sys.modules.get("rl_dqn.transport.rpc")   # imported only by roles that joined, or tried to
    if rpc is not None and rpc.stranded():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def _from_environment(cfg: Config, args, environ: dict[str, str]) -> Config:
    """env:// takes cluster.world_size and cluster.rank from WORLD_SIZE and RANK (as torchrun and SLURM scripts
    set them) where the config leaves them at 0; a config that sets them otherwise is refused."""
    if cfg.cluster.init_method != "env://":
        return cfg
    extra = []
    for variable, key, current in (("WORLD_SIZE", "cluster.world_size", cfg.cluster.world_size),
                                   ("RANK", "cluster.rank", cfg.cluster.rank)):
        text = environ.get(variable)
        if text is None:
            continue
        if not text.isdigit():
            raise ConfigError(key, f"{variable} must be a non-negative integer, got {text!r}")
        if current == 0:
            extra.append(f"{key}={int(text)}")
        elif current != int(text):
            raise ConfigError(key, f"is {current} but {variable} is {text}; give one of them")
    return load_config(args.config, [*args.overrides, f"run.name={cfg.run.name}", *extra]) if extra else cfg


def run_dir(cfg: Config) -> Path:
    return RUNS_DIR / cfg.run.name


def _placement(cfg: Config, rank: int):
    """This role's device and device maps on this node (ConfigError, exit 2, before any role goes on)."""
    import torch

    from rl_dqn.transport import place
    return place(cfg, rank, torch.cuda.device_count())


def _check_interface(cfg: Config) -> None:
    """cluster.interface names an interface of this node with an IPv4 address (every socket listens there)."""
    from rl_dqn.transport.membership import MembershipError, interface_address
    if cfg.cluster.interface:
        try:
            interface_address(cfg.cluster.interface)
        except MembershipError as e:
            raise ConfigError("cluster.interface", str(e).removeprefix("cluster.interface: ")) from None


def _check_rendezvous(cfg: Config) -> None:
    """cluster.init_method names a store: tcp://HOST:PORT, or env:// with MASTER_ADDR and MASTER_PORT set."""
    from rl_dqn.transport.membership import MembershipError, rendezvous_address, torchrun_prefix
    if torchrun_prefix(dict(os.environ)) is not None:
        return
    try:
        rendezvous_address(cfg.cluster.init_method, dict(os.environ))
    except MembershipError as e:
        raise ConfigError("cluster.init_method", str(e).removeprefix("cluster.init_method ")) from None


def _check_learner_address(cfg: Config) -> None:
    """The rendezvous host is the learner's own address on cluster.interface: its store listens there and nowhere
    else, so a host that names another address (a hostname that resolves elsewhere) would leave every collector
    knocking at a closed door. Under torchrun the store is torchrun's, wherever it put it."""
    from rl_dqn.transport.membership import MembershipError, interface_address, rendezvous_address, torchrun_prefix
    if torchrun_prefix(dict(os.environ)) is not None:
        return
    try:
        host, _ = rendezvous_address(cfg.cluster.init_method, dict(os.environ))
        mine = interface_address(cfg.cluster.interface)
    except MembershipError as e:
        raise ConfigError("cluster.init_method", str(e).removeprefix("cluster.init_method ")) from None
    try:
        resolved = socket.gethostbyname(host)
    except OSError:
        raise ConfigError("cluster.init_method", f"the host {host!r} does not resolve here") from None
    if resolved != mine:
        where = "MASTER_ADDR" if cfg.cluster.init_method == "env://" else "cluster.init_method"
        raise ConfigError("cluster.init_method", f"{where} names {host} ({resolved}), but the learner listens only "
                                                 f"on cluster.interface={cfg.cluster.interface} ({mine}); give {mine}")


def check_env(cfg: Config):
    """The env's spec, as every role checks it before it starts: a ConfigError naming env.id (or eval.video) where
    the env cannot run as configured."""
    from envs import EnvError, describe_env
    try:
        spec = describe_env(cfg.env)
    except EnvError as e:
        raise ConfigError("env.id", str(e)) from None
    if cfg.eval.video and not cfg.env.is_atari:
        raise ConfigError("eval.video", f"videos are recorded from Atari games (ALE/...), not from {cfg.env.id}; "
                                        f"set it false")
    return spec


def check_replay_memory(cfg: Config, spec, device, available: int | None) -> None:
    """The replay fits the memory `available` on the learner's device (None: unknown, not checked): a replay that
    does not is refused before the run starts, rather than killed by the kernel once it has filled."""
    from rl_dqn.replay import bytes_needed
    t = cfg.train
    need = bytes_needed(t.replay_capacity, spec.frame_shape, spec.obs_dtype,
                        t.prioritized and t.initial_priority == "collectors")
    if available is not None and need > available:
        per = need // t.replay_capacity
        raise ConfigError("train.replay_capacity",
                          f"{t.replay_capacity:,} transitions of {per:,} bytes need {need / 2**30:,.1f} GiB on "
                          f"{device}, which has {available / 2**30:.1f} GiB available; at most "
                          f"{available // per:,} fit there")


def finished_already(cfg: Config, state: dict) -> str | None:
    """Why resuming with `cfg` the run whose newest checkpoint holds `state` would have nothing to do, as one line
    that says how to go on; None when it would train. The run is over at `cfg`'s train.total_env_steps, and, when it
    ended at an evaluation that reached its eval.stop_score, at `cfg`'s eval.stop_score if that is at most the
    evaluation's score (a checkpoint written before runs kept this has no "stop_score_reached")."""
    name, total, env_steps = cfg.run.name, cfg.train.total_env_steps, state["counters"]["env_steps"]
    stopped = state["schedule"].get("stop_score_reached")
    at_total = env_steps >= total
    at_score = stopped is not None and cfg.eval.stop_score is not None and cfg.eval.stop_score <= stopped["eval"]
    if not (at_total or at_score):
        return None
    longer = 2 * total if 2 * total > env_steps else 2 * env_steps
    advice = [f"a larger train.total_env_steps (e.g. train.total_env_steps={longer})"] if at_total else []
    if at_score:
        advice.append(f"eval.stop_score=null or a higher one (above {stopped['eval']:.2f})")
    if at_total:
        what = f"reached train.total_env_steps={total:,} at {env_steps:,} env steps"
    else:
        what = (f"ended at its eval.stop_score={stopped['stop_score']:g} (eval {stopped['eval']:.2f} at "
                f"{stopped['env_steps']:,} env steps)")
    return f"run {name} already {what}: nothing to do; to train on, resume with {' and '.join(advice)}"


# What a resumed run keeps from its first process: the keys that shape its networks or what they read.
KEPT_ON_RESUME = ("env.id", "network.torso", "network.mlp_hidden", "network.dueling", "network.norm",
                  "network.quantiles", "network.frame_offset")


def changed_on_resume(cfg: Config, state: dict) -> list[str]:
    """The KEPT_ON_RESUME keys that `cfg` sets otherwise than the run whose checkpoint holds `state` (none for a
    checkpoint that holds no config), each as `key: <the run's> in the run, <cfg's> now`."""
    saved, now = state.get("config"), to_dict(cfg)
    if not isinstance(saved, dict):
        return []
    changed = []
    for key in KEPT_ON_RESUME:
        section, field = key.split(".")
        was, is_now = (list(v) if isinstance(v, (list, tuple)) else v
                       for v in (saved.get(section, {}).get(field), now[section][field]))
        if was is not None and was != is_now:
            changed.append(f"{key}: {was} in the run, {is_now} now")
    return changed


def resume_check(cfg: Config) -> str | None:
    """finished_already() for a resumed run's newest checkpoint; None for a new run, or for one that holds no
    checkpoint (which _make_run_dir refuses). Refused here, before anything is written or started: a checkpoint
    that cannot be read, a config that changes what the run's networks are (changed_on_resume()), and a replay file
    that cannot be read or does not fit this config's replay (its tensors are mapped from the file, not read)."""
    from rl_dqn import checkpoints
    from rl_dqn.replay import ReplayMemory
    found = checkpoints.all_of(run_dir(cfg)) if cfg.run.resume else []
    if not found:
        return None
    newest = found[-1]
    try:
        state = checkpoints.load_state(newest)
        changed = changed_on_resume(cfg, state)
        ended = finished_already(cfg, state)
        replay = checkpoints.replay_path(newest, state)
    except checkpoints.CheckpointError as e:
        raise ConfigError("run.resume", f"cannot continue from {newest}: {e.reason}; move it aside to resume from "
                                        f"the one before it") from None
    except (KeyError, TypeError, AttributeError) as e:   # a dict, but not of the shape this version writes
        raise ConfigError("run.resume", f"cannot continue from {newest}: it is not a checkpoint this version "
                                        f"writes ({type(e).__name__}: {e}); move it aside to resume from the one "
                                        f"before it") from None
    if changed:
        raise ConfigError("run.resume", f"run {cfg.run.name} keeps its networks and game, and this config changes "
                                        f"them ({'; '.join(changed)}): drop those overrides, or start a new run.name")
    if ended is None and replay is not None and replay.exists():
        aside = f"move {replay.name} aside to resume with an empty replay"
        try:
            why = ReplayMemory.saved_mismatch(checkpoints.read(replay, mmap=True), cfg.train.replay_capacity,
                                              cfg.num_envs)
        except checkpoints.CheckpointError as e:
            raise ConfigError("run.resume", f"cannot continue from {newest}: its replay file {replay.name}: "
                                            f"{e.reason}; {aside}") from None
        if why is not None:
            raise ConfigError("run.resume", f"cannot continue from {newest}: its replay file {replay.name}: {why} "
                                            f"(collectors.count x env.envs_per_collector lanes, "
                                            f"train.replay_capacity / lanes steps each); set them as the run had "
                                            f"them, or {aside}")
    return ended


def _make_run_dir(cfg: Config) -> Path:
    """Creates runs/<run.name>/, which must be new or empty and writable; a resumed run's must hold a checkpoint."""
    folder = check_run_dir(cfg)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / ".write-check").touch()
        (folder / ".write-check").unlink()
    except OSError as e:
        raise ConfigError("run.name", f"cannot write the run folder {folder}: {e.strerror} "
                                      f"(RL_DQN_RUNS_DIR moves the runs folder)") from None
    return folder


def check_run_dir(cfg: Config) -> Path:
    """runs/<run.name>/, refused (ConfigError) where it is a file, holds another run and this one is new, or holds
    no checkpoint and this one resumes; nothing is created."""
    folder = run_dir(cfg)
    if folder.exists() and not folder.is_dir():
        raise ConfigError("run.name", f"{folder} is a file, not a run folder; choose another run.name")
    if cfg.run.resume:
        from rl_dqn import checkpoints
        if not checkpoints.all_of(folder):
            raise ConfigError("run.resume", f"{folder} holds no checkpoint to resume from; give the run.name of an "
                                            f"earlier run")
    elif folder.exists() and any(folder.iterdir()):
        raise ConfigError("run.name", f"{folder} already holds a run; choose another run.name, or continue it "
                                      f"with run.resume=true")
    return folder


# ----------------------------------------------------------------------------------------------- nodes


def _local(cfg: Config, args) -> int:
    """Learner and collectors of a one-node run, on a free port on 127.0.0.1, listening on loopback only."""
    from rl_dqn.supervisor import RoleSpec, supervise
    if cfg.cluster.world_size not in (0, 1 + cfg.collectors.count) or cfg.cluster.rank != 0:
        raise ConfigError("cluster.world_size", "a local run sizes itself from collectors.count; "
                                                "leave cluster.world_size and cluster.rank unset")
    # A run folder's config.yaml (cluster.single_node) names the port its run happened to take: a free one instead,
    # unless the command line names one.
    named = any(item.startswith("cluster.init_method=") for item in args.overrides)
    given = cfg.cluster.init_method if named or not cfg.cluster.single_node else ""
    init_method = given or f"tcp://127.0.0.1:{free_port()}"
    common = [*args.overrides, f"run.name={cfg.run.name}", f"cluster.init_method={init_method}",
              f"cluster.world_size={1 + cfg.collectors.count}", f"cluster.interface={cfg.cluster.interface or 'lo'}",
              "cluster.single_node=true"]
    one_node = load_config(args.config, [*common, "cluster.rank=1"])

    def checks() -> bool:
        """The env, every role's devices and maps as each will see them, and the replay's memory, checked while
        the roles load their modules and before any of them goes on."""
        _check_rendezvous(one_node)
        spec = check_env(cfg)
        placements = [_placement(one_node, rank) for rank in range(one_node.world_size)]
        learner_device = placements[0].device
        if learner_device.type == "cpu":   # a GPU's free memory the learner reads itself: CUDA does not start here
            from rl_dqn.system import available_memory
            check_replay_memory(cfg, spec, learner_device, available_memory(learner_device))
        if (line := resume_check(cfg)) is not None:
            say("local", line)
            return False
        _make_run_dir(cfg)
        say("local", f"run {cfg.run.name}: learner + {cfg.collectors.count} collectors at {init_method}; "
                     f"writing {run_dir(cfg)}")
        return True

    here = [sys.executable, "-m", "rl_dqn"]
    specs = [RoleSpec("learner", [*here, "learner", args.config, *common], finishes_run=True)]
    specs += [RoleSpec(f"collector{i}", [*here, "collector", args.config, *common, "cluster.rank=1",
                                         f"--local-index={i}"], finishes_run=False,
                       restarts=cfg.collectors.max_restarts)
              for i in range(cfg.collectors.count)]
    return supervise(specs, node="local", checks=checks)


def _collectors(cfg: Config, args) -> int:
    from rl_dqn.supervisor import NodeProgress, RoleSpec, supervise
    _require_cluster(cfg, collector_node=True)

    def checks() -> bool:
        """The interface, the env and every collector's devices and maps (torch's import, most of it), checked
        while they load their modules."""
        _check_interface(cfg)
        _check_rendezvous(cfg)
        check_env(cfg)
        for rank in range(cfg.cluster.rank, cfg.cluster.rank + cfg.collectors.count):
            _placement(cfg, rank)
        return True

    here = [sys.executable, "-m", "rl_dqn"]
    specs = [RoleSpec(f"collector{cfg.cluster.rank - 1 + i}",
                      [*here, "collector", args.config, *args.overrides, f"--local-index={i}"], finishes_run=False,
                      restarts=cfg.collectors.max_restarts)
             for i in range(cfg.collectors.count)]
    last = cfg.cluster.rank + cfg.collectors.count - 1
    node = f"collectors (ranks {cfg.cluster.rank}..{last})"
    return supervise(specs, node=node, checks=checks,
                     progress=NodeProgress(f"[{node}]", cfg.train.total_env_steps, cfg.metrics.interval_s))


def _require_cluster(cfg: Config, collector_node: bool) -> None:
    if cfg.cluster.init_method == "":
        raise ConfigError("cluster.init_method", "must be set for a multi-node run: tcp://LEARNER_HOST:PORT or env://")
    if cfg.cluster.world_size == 0:
        raise ConfigError("cluster.world_size", "must be set for a multi-node run: 1 + every collector of every node")
    if collector_node and cfg.cluster.rank < 1:
        raise ConfigError("cluster.rank", "must be >= 1 on a collector node: the rank of its first collector "
                                          "(the learner is rank 0)")
    if not collector_node and cfg.cluster.rank != 0:
        raise ConfigError("cluster.rank", f"must be 0 for the learner, got {cfg.cluster.rank}")
    if cfg.cluster.interface == "":
        raise ConfigError("cluster.interface", "must name the network interface this node listens on in a "
                                               "multi-node run, e.g. eth0 (`ip -br addr` lists them): RPC runs "
                                               "whatever it receives, so it listens on no other")


# ----------------------------------------------------------------------------------------------- roles


# A role still running this long after its first stop signal prints where each of its threads stands, once: a
# supervisor kills what still runs after its grace (supervise()'s grace_s), and the stacks say what held the role up.
STOPPING_STACKS_S = 15.0


def _stop_on_signals() -> threading.Event:
    """SIGINT and SIGTERM ask the role to stop and flush; a third signal ends the process at once."""
    stop = threading.Event()
    received = []

    def handler(signum, _frame):
        received.append(signum)
        if len(received) >= 3:
            os._exit(128 + signum)
        if len(received) == 1:
            _stacks_later()
        stop.set()

    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, handler)
    return stop


def _stacks_on_crash() -> None:
    """A role that dies of a fatal signal (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL) prints every Python thread's
    stack on its way out, so that a crash in C++ (TensorPipe, ale-py) says which call it came from."""
    try:
        faulthandler.enable(file=sys.stderr, all_threads=True)
    except (AttributeError, ValueError, OSError):   # stderr is no file (captured)
        pass


def _stacks_later() -> None:
    """Every thread's stack to stderr in STOPPING_STACKS_S, unless called again before (faulthandler's own thread:
    it prints even while this process's threads are blocked in C++). Not where stderr is no file (captured)."""
    try:
        faulthandler.dump_traceback_later(STOPPING_STACKS_S, exit=False, file=sys.stderr)
    except (AttributeError, ValueError, OSError):   # io.UnsupportedOperation is both an OSError and a ValueError
        pass


def _saving_told(role: str, stop: threading.Event):
    """What a role does as a checkpoint it writes grows: a progress line for its node's supervisor, which waits for
    a stopping role while these come (a replay of gigabytes takes longer to write than its grace), and, once the
    role is stopping, its stacks printed only after STOPPING_STACKS_S without one."""
    lines = os.environ.get(PROGRESS_ENV) == "1"

    def told(written: int) -> None:
        if stop.is_set():
            _stacks_later()
        if lines:
            print(f"[{role}] {PROGRESS_MARK} {json.dumps({SAVING: written})}", flush=True)
    return told


def _checks_passed() -> bool:
    """Under a node's supervisor (GATE_ENV), a role has loaded its modules while the node checked the run: True
    once the node says to go on; False when its checks failed or found nothing to do (the node says why)."""
    if os.environ.pop(GATE_ENV, None) is None:
        return True
    return sys.stdin.readline().strip() == GO


def _role_error(role: str, message: str, code: int = 1) -> int:
    print(f"[{role}] error: {message}", file=sys.stderr, flush=True)
    return code


def _learner(cfg: Config, args) -> int:
    import torch
    from rl_dqn import checkpoints
    from rl_dqn.learner import Learner, TrainingDiverged
    from rl_dqn.trainer import torch_threads
    from rl_dqn.system import available_memory, configure_process
    from rl_dqn.transport import LearnerTransport, TransportError
    import envs.vector  # noqa: F401 - gymnasium and ale-py, for the env check
    startup = StartupClock(launched_at())
    startup.mark("modules loaded")
    # Adam's first construction imports torch._dynamo (torch.optim's methods are wrapped to keep it out), which
    # is a large import of its own: imported with the rest (under a node, while it checks the run), and
    # marked apart.
    import torch._dynamo  # noqa: F401
    startup.mark("torch._dynamo imported")
    if GATE_ENV in os.environ:
        if not _checks_passed():
            return 0
        startup.mark("node's checks passed")
    if not cfg.cluster.single_node:
        _require_cluster(cfg, collector_node=False)
    _check_interface(cfg)
    _check_learner_address(cfg)
    spec = check_env(cfg)
    startup.mark("env checked")
    placement = _placement(cfg, 0)
    check_replay_memory(cfg, spec, placement.device, available_memory(placement.device))   # a GPU's context made
    startup.mark(f"{placement.device} ready")
    if (line := resume_check(cfg)) is not None:   # before the run folder is touched or RPC joined
        say("learner", line)
        return 0
    folder = _make_run_dir(cfg)
    stop = _stop_on_signals()
    torch.set_num_threads(torch_threads(cfg, placement.device))
    configure_process()
    learner = Learner(cfg, spec, folder, stop=stop, device=placement.device, launched_at=launched_at(),
                      startup=startup)
    learner.saving = _saving_told("learner", stop)
    if cfg.run.resume:   # before the run's config.yaml and run.json are written: a failed resume leaves them be
        checkpoint = checkpoints.newest(folder)
        try:
            learner.restore(checkpoint)
        # CheckpointError, or the networks' and optimizer's load_state_dict on what they cannot take.
        except (RuntimeError, ValueError, KeyError, TypeError) as e:
            learner.report.close()
            reason = e.reason if isinstance(e, checkpoints.CheckpointError) else first_line(e) or type(e).__name__
            raise ConfigError("run.resume", f"cannot continue from {checkpoint}: {reason}") from None
    save_config(learner.config_as_run(), folder / "config.yaml")
    learner.report.write_run_info(sys.argv, resumed=cfg.run.resume)
    try:
        learner.run(LearnerTransport(cfg, stop, placement))
    except (TransportError, TrainingDiverged) as e:
        learner.close()
        if learner.ended is None and not cfg.run.resume:
            # The run never began (its rendezvous or first publish failed): nothing was collected or learned, and
            # without its folder the same command starts it again.
            shutil.rmtree(folder, ignore_errors=True)
        return _role_error("learner", str(e))
    how = {"total_env_steps": "done", "stop_score": "reached eval.stop_score"}.get(learner.ended,
                                                                                  "stopped on a signal")
    for line in learner.closing_lines(how):
        say("learner", line)
    if learner.unsaved is not None:
        return _role_error("learner", f"the run's last checkpoint could not be written ({learner.unsaved}); free "
                                      f"space, and run.resume=true continues from the newest one on disk")
    return 0


def _collector(cfg: Config, args) -> int:
    """One collector process in slot cluster.rank + local index - 1; it may replace one that died."""
    from rl_dqn.collector import Collector
    from rl_dqn.system import configure_process
    from rl_dqn.transport import CollectorTransport, TransportError
    if not _checks_passed():
        return 0
    rank = cfg.cluster.rank + args.local_index
    if rank < 1 or rank >= cfg.world_size:
        raise ConfigError("cluster.rank", f"collector rank {rank} (cluster.rank + local index) must be in "
                                          f"1..{cfg.world_size - 1}")
    if cfg.cluster.init_method == "":
        raise ConfigError("cluster.init_method", "must be set: tcp://LEARNER_HOST:PORT or env://")
    if cfg.cluster.interface == "":
        raise ConfigError("cluster.interface", "must name the network interface this process listens on, e.g. "
                                               "eth0 (lo on one node)")
    _check_interface(cfg)
    _check_rendezvous(cfg)
    check_env(cfg)
    placement = _placement(cfg, rank)
    name = f"collector{rank - 1}"
    stop = _stop_on_signals()
    configure_process()
    transport = None
    # Its envs, network and first observations need no learner: made while the learner starts.
    collector = Collector(cfg, rank - 1, None, stop, placement.device)
    try:
        collector.prepare()
        say(name, f"joining the run at {cfg.cluster.init_method}")
        transport = CollectorTransport(cfg, rank - 1, stop, placement)
        collector.joined(transport, transport.incarnation)
        collector.run()
    except TransportError as e:
        lost = transport is not None and transport.learner_lost
        # A slot outside the run is its node's config: a new process would be refused the same way.
        return _role_error(name, str(e), EXIT_BAD_INPUT if e.outside_run else EXIT_LEARNER_LOST if lost else 1)
    finally:
        collector.close()
        if transport is not None:
            transport.close()
    return 0


def _worker(cfg: Config, args) -> int:
    """One process by its rank, as torchrun starts them: rank 0 is the learner, rank k is collector k - 1. Under
    torchrun a collector that dies is not started again on its own (torchrun restarts every process of the run,
    or none)."""
    if cfg.cluster.rank == 0:
        return _learner(cfg, args)
    args.local_index = 0
    return _collector(cfg, args)


_COMMANDS = {"local": _local, "learner": _learner, "collectors": _collectors, "collector": _collector,
             "worker": _worker}
