"""What this machine is to rl_dqn, in a few seconds, and whether a config can run here as written:

    ./launch/doctor.sh [CONFIG] [section.key=value ...]          (python -m rl_dqn.doctor ...)
    ./launch/doctor.sh --gpu [CONFIG]                             the GPU acceptance run (docs/gpu.md)
    ./launch/doctor.sh --gpu --quick [CONFIG]                     a GPU node's figures, in about 9 minutes

Prints the versions, the CPU's cores and the instruction sets that decide network.precision, the GPUs, the TensorPipe
transports and channels this torch build has, what each role of the config would run on (device, precision,
threads), the disk under runs/ against the config's checkpoints, and what it recommends. Exit status 0 when the
config can run here as written; 2 with one line per problem when it cannot.

`--gpu` is the acceptance run of a GPU machine: the `cuda` tests, the CPU-vs-CUDA transport benchmark, the learner
benchmark on the GPU and a short training run of the config, each passed or failed with its error and figures, in
runs/doctor-<date>-<time>/report.md with each check's whole output beside it, ready to attach to a bug report. On a
machine without a GPU it says so and exits 2.

`--gpu --quick` measures what a GPU node is worth to a run, for a node config (default configs/pong_gpu.yaml): the
`cuda` tests of the update, the learner's updates/s eager and as a captured CUDA graph, one learning run of the
config to Pong's 18, and how the pipeline scales with collectors over the CPU and the CUDA transport and with the
collectors acting on the CPU. Each step has a time limit, the limits adding up to 9 minutes (a step stopped at its
limit has STOP_GRACE_S more to stop), and the report is written after each step.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import NamedTuple

from rl_dqn.config import (TENSORPIPE_CPU_CHANNELS, TENSORPIPE_CUDA_CHANNELS, TENSORPIPE_TRANSPORTS, Config,
                           ConfigError, load_config)
from rl_dqn.console import OneLineParser, description, proc_stat

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = "configs/pong_cpu.yaml"
NODE_CONFIG = "configs/pong_gpu.yaml"
FRAME_BYTES = 84 * 84 + 39   # a stored Atari transition: its frame and its step's scalars, sum tree and index


class Finding(NamedTuple):
    problems: list[str]          # why the config cannot run here as written (exit 2)
    recommendations: list[str]   # what would make it run better


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def cpu_lines() -> list[str]:
    import torch
    model = next((line.split(":", 1)[1].strip() for line in _read("/proc/cpuinfo").splitlines()
                  if line.startswith("model name")), platform.processor() or "unknown CPU")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    sets = {"AVX2": torch.cpu._is_avx2_supported(), "AVX-512": torch.cpu._is_avx512_supported(),
            "AVX512-BF16": torch.cpu._is_avx512_bf16_supported(), "AMX": torch.cpu._is_amx_tile_supported()}
    return [f"CPU: {model}, {cores} cores for this process; PyTorch computes with "
            f"{torch.backends.cpu.get_cpu_capability()}; " + ", ".join(f"{k} {'yes' if v else 'no'}"
                                                                        for k, v in sets.items())]


def gpu_lines() -> list[str]:
    import torch

    from rl_dqn.network import fast_bfloat16
    if not torch.cuda.is_available():
        return ["GPUs: none (torch.cuda.is_available() is False)"]
    lines = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        fast, _ = fast_bfloat16(f"cuda:{i}")
        lines.append(f"GPU cuda:{i}: {p.name}, {p.total_memory / 2**30:.1f} GiB, compute capability "
                     f"{p.major}.{p.minor} (bfloat16 {'fast' if fast else 'emulated'})")
    return lines


def tensorpipe_lines(cfg: Config) -> list[str]:
    from rl_dqn.transport.rpc import built_channels, built_transports
    transports = built_transports(TENSORPIPE_TRANSPORTS)
    channels = built_channels(TENSORPIPE_CPU_CHANNELS + TENSORPIPE_CUDA_CHANNELS)
    used = built_channels(cfg.transport.tensorpipe_channels)
    return [f"TensorPipe in this torch build: transports {', '.join(transports)}; channels {', '.join(channels)}",
            f"  the config uses transports {', '.join(cfg.transport.tensorpipe_transports)}; channels "
            f"{', '.join(used)} (each at run time only where TensorPipe finds it viable)"]


def roles(cfg: Config) -> tuple[list[str], list[str]]:
    """What each role of this node would run on (the learner's node: the learner and, in a one-node run, the
    collectors; a collector node: its collectors), and recommendations about it."""
    import torch

    from rl_dqn.network import describe_precision
    from rl_dqn.trainer import compute_threads, torch_threads
    from rl_dqn.transport import eval_device, place
    gpus = torch.cuda.device_count()
    lines, advice = [], []
    if cfg.cluster.rank == 0:
        learner = place(cfg, 0, gpus)
        precision, warning = describe_precision(cfg.network.precision, learner.device)
        threads = compute_threads(cfg, learner.device)
        lines.append(f"  learner: {learner.device}, {precision}; {threads} compute thread"
                     f"{'s' if threads > 1 else ''} x {torch_threads(cfg, learner.device)} torch thread(s)")
        advice += [warning] if warning else []
    if cfg.cluster.single_node or cfg.cluster.rank > 0:
        # launch/local.sh starts a one-node run's collectors as a collector node of rank 1.
        node = dataclasses.replace(cfg, cluster=dataclasses.replace(cfg.cluster, rank=1)) \
            if cfg.cluster.single_node else cfg
        for rank in range(node.cluster.rank, node.cluster.rank + cfg.collectors.count):
            collector = place(node, rank, gpus)
            precision, warning = describe_precision(cfg.network.precision, collector.device)
            lines.append(f"  collector{rank - 1}: {collector.device}, {precision}; {cfg.env.envs_per_collector} envs "
                         f"on {cfg.env.threads_per_collector} env thread(s), {cfg.collectors.torch_threads} torch "
                         f"thread(s)")
            if warning and warning not in advice:
                advice.append(warning)
    if cfg.eval.every_env_steps and cfg.cluster.rank == 0:
        phases = " then ".join(f"{episodes} episodes on {envs} envs" for episodes, envs in cfg.eval_phases)
        lines.append(f"  evaluator: {eval_device(cfg, gpus)}, {phases} on {cfg.eval_env.threads_per_collector} env "
                     f"thread(s), {cfg.eval.torch_threads} torch thread(s), every {cfg.eval.every_env_steps:,} env "
                     f"steps")
    return lines, advice


def disk(cfg: Config, runs_dir: Path) -> tuple[list[str], Finding]:
    """Free space under runs/ against what the config's checkpoints hold."""
    folder = runs_dir if runs_dir.exists() else runs_dir.parent
    free = shutil.disk_usage(folder).free
    replay = cfg.train.replay_capacity * FRAME_BYTES if cfg.learner.checkpoint_replay and cfg.env.is_atari else 0
    # While a checkpoint is written the previous replay is still on disk: two of them for a moment.
    need = 2 * replay + 100 * 2**20
    lines = [f"disk: {free / 1e9:,.1f} GB free under {folder}; the config's checkpoints hold "
             + (f"its replay, up to {replay / 1e9:,.1f} GB when full (twice that while a newer one is written)"
                if replay else "no replay")]
    problems = []
    if need > free:
        problems.append(f"learner.checkpoint_replay: a full replay checkpoint needs {need / 1e9:,.1f} GB and "
                        f"{folder} has {free / 1e9:,.1f} GB free; set learner.checkpoint_replay=false, lower "
                        f"train.replay_capacity, or move the runs with RL_DQN_RUNS_DIR")
    return lines, Finding(problems, [])


def load(config: str, overrides: list[str]) -> Config:
    """The config as this node would run it: a one-node run (launch/local.sh) unless cluster.world_size is set."""
    path = Path(config) if Path(config).is_file() else ROOT / config
    cfg = load_config(path, overrides)
    if cfg.cluster.world_size == 0:
        cfg = load_config(path, [*overrides, "cluster.single_node=true"])
    return cfg


def check(config: str, overrides: list[str], runs_dir: Path) -> tuple[list[str], Finding]:
    """Every line of the report and what it found, for `config` as it would run on this machine."""
    import torch

    from rl_dqn.cli import check_env, check_replay_memory, check_run_dir, resume_check
    from rl_dqn.system import available_memory
    from rl_dqn.transport import place
    lines = [f"rl_dqn doctor, {time.strftime('%Y-%m-%d %H:%M')} on {socket.gethostname()}", *software_lines(),
             *cpu_lines(), *gpu_lines()]
    try:
        cfg = load(config, overrides)
        spec = check_env(cfg)
        lines += tensorpipe_lines(cfg)
        lines.append(f"{config} as it would run here:")
        role_lines, advice = roles(cfg)
        # What the launchers refuse before anything starts: the run folder, and what a resumed run continues from.
        if (ended := resume_check(cfg)) is not None:
            role_lines.append(f"  {ended}")
        check_run_dir(cfg)
    except ConfigError as e:
        return lines, Finding([str(e)], [])
    problems = []
    if cfg.cluster.rank == 0:   # the replay the learner allocates, as the launchers check it
        device = place(cfg, 0, torch.cuda.device_count()).device
        try:
            check_replay_memory(cfg, spec, device, available_memory(device))
        except ConfigError as e:
            problems.append(str(e))
    disk_lines, found = disk(cfg, runs_dir)
    return lines + role_lines + disk_lines, Finding(problems + found.problems, advice)


def software_lines() -> list[str]:
    import torch
    return [f"software: Python {platform.python_version()}, torch {torch.__version__} (CUDA "
            f"{torch.version.cuda or 'none in this build'}), gymnasium {_version('gymnasium')}, ale-py "
            f"{_version('ale-py')}"]


# ------------------------------------------------------------------------------------ the GPU acceptance run


class Step(NamedTuple):
    name: str
    argv: list[str]
    timeout_s: float
    env: dict[str, str] = {}


class Outcome(NamedTuple):
    step: Step
    passed: bool
    seconds: float
    output: str          # stdout and stderr together
    error: str           # one line: why it failed ("" when it passed)


def gpu_steps(config: str, overrides: list[str], name: str) -> list[Step]:
    """What the acceptance run runs, in order, each within its time limit."""
    python = sys.executable
    return [
        Step("cuda tests", [python, "-m", "pytest", "-q", "-m", "cuda", "tests/"], 900),
        # TP_VERBOSE_LOGGING makes TensorPipe log the channels it sets up and its pipes' traffic (kept in the log).
        Step("CPU vs CUDA transport", [python, "benchmarks/transport.py", "--quick"], 600, {"TP_VERBOSE_LOGGING": "1"}),
        Step("learner on the GPU", [python, "benchmarks/learner.py", "--devices", "cuda", "--seconds", "3",
                                    "--batches", "32,512", "--overlap", "on", "--replay", "50000"], 600),
        Step("short training run", [python, "-m", "rl_dqn", "local", config, *overrides, f"run.name={name}-train",
                                    "train.total_env_steps=150000", "eval.every_env_steps=50000",
                                    "learner.checkpoint_replay=false"], 600),
    ]


def node_steps(config: str, overrides: list[str], name: str) -> list[Step]:
    """What --gpu --quick runs, in order, each within its time limit (9 minutes in all): the node's headline figures
    first, so that a run cut short keeps them."""
    python = sys.executable
    return [
        Step("cuda tests of the update", [python, "-m", "pytest", "-q", "-m", "cuda", "tests/test_trainer.py",
                                          "tests/test_sumtree.py"], 65),
        Step("learner: eager and captured", [python, "benchmarks/learner.py", "--devices", "cuda", "--only",
                                             "NIPS, PER, 10-step", "--batches", "32,256", "--overlap", "on",
                                             "--graph", "on,off", "--seconds", "1", "--replay", "20000"], 75),
        Step("Pong to 18", [python, "benchmarks/learning.py", config, *overrides, "--seeds", "1", "--minutes", "2.5",
                            "--stop-at", "18", "--prefix", f"{name}-pong"], 175),
        Step("scaling over the CPU transport", [python, "benchmarks/scaling.py", config, *overrides, "--collectors",
                                                "4,14", "--ratios", "2,0", "--transports", "cpu", "--seconds", "12",
                                                "--prefix", f"{name}-scaling"], 140),
        Step("scaling over the CUDA transport", [python, "benchmarks/scaling.py", config, *overrides,
                                                 "--collectors", "14", "--ratios", "2", "--transports", "cuda",
                                                 "--seconds", "12", "--prefix", f"{name}-scaling"], 45),
        # The collectors' acting shares the GPU with the learner's updates, each process in its own context: the
        # same row with the collectors acting on their CPU cores says which way the node trains faster.
        Step("scaling with collectors acting on the CPU", [python, "benchmarks/scaling.py", config, *overrides,
                                                           "collectors.device=cpu", "--collectors", "14",
                                                           "--ratios", "2", "--transports", "cpu",
                                                           "--seconds", "12", "--prefix", f"{name}-cpu-acting"], 40),
    ]


def run_steps(steps: list[Step], logs: Path, after_each=lambda outcomes: None) -> list[Outcome]:
    """Runs `steps` in order, each writing its output to logs/<n>-<name>.log as it goes (a check cut off by a time
    limit leaves what it printed); `after_each(outcomes so far)` is called after each, so a cut-off run keeps its
    report. An interrupt (KeyboardInterrupt) stops the step that runs, which is reported as interrupted, and is
    raised again."""
    outcomes = []
    for n, step in enumerate(steps, 1):
        print(f"doctor --gpu: {step.name}: {' '.join(step.argv[1:])}", flush=True)
        log = logs / f"{n}-{step.name.replace(' ', '-')}.log"
        started = time.monotonic()
        interrupted = False
        with open(log, "w") as out:
            try:
                code = _run_step(step, out)
            except KeyboardInterrupt:
                code, interrupted = None, True
        output = log.read_text(errors="replace")
        error = ("interrupted" if interrupted else f"did not finish within {step.timeout_s:g} s" if code is None
                 else "" if code == 0 else f"exit code {code}: {_last_error(output)}")
        outcome = Outcome(step, error == "", time.monotonic() - started, output, error)
        print(f"doctor --gpu: {step.name}: {'passed' if outcome.passed else 'FAILED: ' + error} "
              f"({outcome.seconds:.0f} s)", flush=True)
        outcomes.append(outcome)
        after_each(outcomes)
        if interrupted:
            raise KeyboardInterrupt
    return outcomes


STOP_GRACE_S = 10.0   # a step stopped before its end: from its SIGINT to the SIGKILL of what is left of it


def _run_step(step: Step, out) -> int | None:
    """Runs `step` in a session of its own and returns its exit code, or None when it was stopped at its time
    limit. A step stopped at its limit, or as the doctor is interrupted, is stopped with every process it started
    (_stop()): a benchmark killed alone would leave its run's learner and collectors holding the GPU and the cores
    through the steps after it. The steps launch their runs with this interpreter (RL_DQN_PYTHON) unless told
    otherwise: one without it would set up .venv from requirements.txt, which a node without the network cannot."""
    env = {"RL_DQN_PYTHON": sys.executable, **os.environ, **step.env}
    process = subprocess.Popen(step.argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                               start_new_session=True)
    try:
        return process.wait(timeout=step.timeout_s)
    except subprocess.TimeoutExpired:
        _stop(process)
        return None
    except BaseException:
        _stop(process)
        raise


def _stop(process: subprocess.Popen) -> None:
    """Stops a step as Ctrl-C stops a command in a terminal, with SIGINT to its process group: a benchmark stops the
    run it started, whose launcher, in that group, stops the run's roles (each in a session of its own). Whatever
    of the step's process tree still runs STOP_GRACE_S later, or at a second interrupt, is killed."""
    tree = _tree([process.pid])
    try:
        os.killpg(process.pid, signal.SIGINT)
    except ProcessLookupError:   # the step has just ended
        pass
    try:
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline and (process.poll() is None or any(map(_running, tree))):
            time.sleep(0.1)
    finally:
        for pid, _ in _tree([found[0] for found in tree if _running(found)]):   # with any child started since
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        process.wait()


def _tree(roots: list[int]) -> list[tuple[int, str]]:
    """The processes `roots` and all their descendants, read from /proc, each as (pid, start time): the start time
    tells a process from a later one given the same pid."""
    children, started = {}, {}
    for folder in Path("/proc").glob("[0-9]*"):
        pid = int(folder.name)
        try:
            fields = proc_stat(pid)
        except OSError:   # it ended meanwhile
            continue
        children.setdefault(int(fields[1]), []).append(pid)
        started[pid] = fields[19]
    found, todo = [], [pid for pid in roots if pid in started]
    while todo:
        pid = todo.pop()
        found.append((pid, started[pid]))
        todo += children.get(pid, [])
    return found


def _running(process: tuple[int, str]) -> bool:
    """Whether (pid, start time) from _tree() still runs: not ended, nor ended and waiting to be reaped."""
    pid, started = process
    try:
        fields = proc_stat(pid)
    except OSError:
        return False
    return fields[19] == started and fields[0] not in ("Z", "X")


def _last_error(output: str) -> str:
    """The line of `output` that most likely says what went wrong."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for marker in ("Error", "error", "FAILED", "failed", "Traceback"):
        found = [line for line in lines if marker in line]
        if found:
            return found[-1][:300]
    return lines[-1][:300] if lines else "no output"


TENSORPIPE_LOG = re.compile(r"[VIWEF]\d{4} [\d:.]+ +\d+ tensorpipe/")   # glog's prefix, then the source file


def report(header: list[str], outcomes: list[Outcome]) -> str:
    """report.md: the machine, one row per check, then each check's own figures (its output's tail)."""
    rows = "\n".join(f"| {o.step.name} | {'passed' if o.passed else 'FAILED: ' + o.error.replace('|', '/')} | "
                      f"{o.seconds:.0f} |" for o in outcomes)
    parts = [f"# rl_dqn GPU acceptance run\n", "```", *header, "```", "",
             "| check | result | seconds |", "|-|-|-:|", rows, ""]
    for o in outcomes:
        # TensorPipe's verbose log (TP_VERBOSE_LOGGING) would push a check's own figures out of its tail.
        tail = "\n".join([line for line in o.output.splitlines() if not TENSORPIPE_LOG.match(line)][-60:])
        channels = sorted({line.strip() for line in o.output.splitlines() if "channel" in line.lower()
                           and "tensorpipe" in line.lower()})[:20] if "TP_VERBOSE_LOGGING" in o.step.env else []
        parts += [f"## {o.step.name}", "", f"`{' '.join(o.step.argv[1:])}`", "", "```", tail, "```", ""]
        if channels:
            parts += ["TensorPipe's channel lines:", "", "```", *channels, "```", ""]
    return "\n".join(parts)


def acceptance_run(config: str, overrides: list[str], runs_dir: Path, steps: list[Step] | None = None,
                   quick: bool = False) -> int:
    """Runs the GPU checks and writes runs/doctor-<date>-<time>/report.md; exit 0 when every check passed, else 1."""
    import torch
    if steps is None and not torch.cuda.is_available():
        print("doctor: no CUDA GPU here (torch.cuda.is_available() is False); the GPU acceptance run needs one",
              file=sys.stderr)
        return 2
    if steps is None:   # a config that cannot load would fail every step: said once, before anything runs
        try:
            load(config, overrides)
        except ConfigError as e:
            print(f"doctor: config error: {e}", file=sys.stderr)
            return 2
    name = f"doctor-{time.strftime('%Y%m%d-%H%M%S')}"
    folder = runs_dir / name
    folder.mkdir(parents=True, exist_ok=True)
    header, found = check(config, overrides, runs_dir)
    header += [f"recommended: {a}" for a in found.recommendations] + [f"problem: {p}" for p in found.problems]
    if steps is None:
        steps = (node_steps if quick else gpu_steps)(config, overrides, name)
    signals = []

    def interrupt(signum, _frame):
        signals.append(signum)
        raise KeyboardInterrupt

    # SIGTERM (e.g. from `timeout`) stops the step that runs as Ctrl-C does: each step has a session of its own,
    # which a signal to the doctor's process group does not reach.
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        outcomes = run_steps(steps, folder,
                             after_each=lambda so_far: (folder / "report.md").write_text(report(header, so_far)))
    except KeyboardInterrupt:
        print(f"doctor --gpu: interrupted; report so far: {folder / 'report.md'}", file=sys.stderr)
        return 128 + (signals[0] if signals else signal.SIGINT)
    finally:
        signal.signal(signal.SIGTERM, previous)
    failed = [o.step.name for o in outcomes if not o.passed]
    print(f"doctor --gpu: {len(outcomes) - len(failed)} of {len(outcomes)} checks passed"
          + (f" (failed: {', '.join(failed)})" if failed else "") + f"; report: {folder / 'report.md'}")
    return 1 if failed else 0


def main(argv: list[str] | None = None, prog: str = "./launch/doctor.sh") -> int:
    parser = OneLineParser(prog=prog, description=description(__doc__))
    parser.name = "doctor"
    parser.add_argument("config", nargs="?", default=None,
                        help=f"default {DEFAULT_CONFIG} ({NODE_CONFIG} with --gpu --quick)")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value")
    parser.add_argument("--gpu", action="store_true", help="the GPU acceptance run (several minutes)")
    parser.add_argument("--quick", action="store_true", help="with --gpu: a GPU node's figures for a node config "
                                                             "(about 9 minutes)")
    args = parser.parse_args(argv)
    if args.quick and not args.gpu:
        parser.error("--quick goes with --gpu")
    config = args.config or (NODE_CONFIG if args.quick else DEFAULT_CONFIG)
    from rl_dqn.cli import RUNS_DIR
    if args.gpu:
        return acceptance_run(config, args.overrides, RUNS_DIR, quick=args.quick)
    lines, found = check(config, args.overrides, RUNS_DIR)
    print("\n".join(lines))
    for advice in found.recommendations:
        print(f"recommended: {advice}")
    if found.problems:
        for problem in found.problems:
            print(f"doctor: {problem}", file=sys.stderr)
        return 2
    print(f"{config} can run here as written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
