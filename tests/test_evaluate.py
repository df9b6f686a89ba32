"""Evaluation rounds: which episodes a round scores when its envs play several one after another, and the
evaluation time limit."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import rl_dqn.evaluate
import rl_dqn.video
from envs import EnvSpec, StepResult, VectorEnv, make_vector_env
from rl_dqn.config import EvalConfig, load_config
from rl_dqn.evaluate import main, play, play_round
from rl_dqn.network import QNetwork
from rl_dqn.video import VideoError, VideoFile

ROOT = Path(__file__).resolve().parents[1]


class ScriptedEpisodes(VectorEnv):
    """Envs whose episodes last given numbers of steps, scoring 1 per step, with next-step autoreset as the real
    envs do: the step after an episode's end is its env's reset step (`first`, no reward)."""

    def __init__(self, lengths: list[list[int]]):
        self.lengths = [list(env) for env in lengths]
        self.num_envs = len(lengths)
        self.spec = EnvSpec((1, 2), torch.float32, 2)
        self.left = [env.pop(0) for env in self.lengths]   # steps left in each env's current episode
        self.resetting = [False] * self.num_envs

    def reset(self) -> torch.Tensor:
        return torch.zeros(self.num_envs, 1, 2)

    def step(self, actions: torch.Tensor) -> StepResult:
        reward, ended, first = torch.zeros(self.num_envs), torch.zeros(self.num_envs, dtype=torch.bool), \
            torch.tensor(self.resetting)
        for i in range(self.num_envs):
            if self.resetting[i]:
                self.resetting[i] = False
                self.left[i] = self.lengths[i].pop(0) if self.lengths[i] else 10**6
                continue
            reward[i] = 1.0
            self.left[i] -= 1
            ended[i] = self.resetting[i] = self.left[i] == 0
        none = torch.zeros(self.num_envs, dtype=torch.bool)
        return StepResult(self.reset(), reward, reward, ended, none, ended, first)

    def close(self) -> None:
        pass


def test_a_round_scores_the_first_episodes_started_whatever_their_length():
    # Env 0 plays episodes of 3, 10, 2, ... steps; env 1 of 5, 1, 12, ... Started in order: 3 and 5 at the start,
    # 10 after step 3, 1 after step 5, 12 after step 7 (5 episodes). The 2-step episode env 0 starts after step 14
    # is the 6th: it does not count, though it ends (step 17) before the counted 12-step one (step 20).
    env = ScriptedEpisodes([[3, 10, 2, 4], [5, 1, 12, 9]])
    network = QNetwork((1, 2), 2, mlp_hidden=(4,)).for_acting()
    scores = play(env, network, episodes=5, epsilon=0.0, generator=torch.Generator().manual_seed(0))
    assert scores == [3.0, 5.0, 10.0, 1.0, 12.0]   # in the order they started, not the order they ended


def test_a_round_with_an_env_per_episode_scores_each_envs_first_episode():
    env = ScriptedEpisodes([[4, 1], [2, 1], [6, 1]])
    network = QNetwork((1, 2), 2, mlp_hidden=(4,)).for_acting()
    recorded = []
    env.screen = "screen"
    scores = play(env, network, episodes=3, epsilon=0.0, generator=torch.Generator().manual_seed(0),
                  record=recorded.append, record_steps=100)
    assert sorted(scores) == [2.0, 4.0, 6.0]
    assert len(recorded) == 1 + 4   # env 0's first episode: its start and each of its 4 steps


def test_play_sh_reports_the_score_of_the_episode_in_its_video_though_another_ended_first(tmp_path, monkeypatch,
                                                                                               capsys):
    # Env 0's first episode, the one recorded, lasts 6 steps and scores 6; the 2-step one on env 1 ends first.
    cfg = load_config(ROOT / "configs/pong_cpu.yaml", ["eval.envs=3"])
    network = QNetwork((1, 2), 2, mlp_hidden=(4,)).for_acting()

    def make_vector_env(env_cfg, num_envs, seed, screen=False):
        assert num_envs == 3 and screen
        env = ScriptedEpisodes([[6, 1], [2, 1], [3, 1]])
        env.screen = np.zeros((4, 4, 3), dtype=np.uint8)
        return env
    monkeypatch.setattr(rl_dqn.evaluate, "load_player", lambda checkpoint: (cfg, network))
    monkeypatch.setattr(rl_dqn.evaluate, "make_vector_env", make_vector_env)
    checkpoint = tmp_path / "checkpoint.pt"
    checkpoint.write_bytes(b"")
    assert main([str(checkpoint), "--episodes", "3", "--video", str(tmp_path / "episode.gif")]) == 0
    out = capsys.readouterr().out
    assert (f"3 episodes, score 3.67 +- 1.70 (min 2, max 6; epsilon {cfg.eval.epsilon:g}, the run's eval.epsilon; "
            f"episodes cut at {cfg.eval_env.max_episode_frames:,} frames)") in out
    assert f"video of env 0's first episode, which scored 6 (7 frames): {tmp_path / 'episode.gif'}" in out
    assert (tmp_path / "episode.gif").stat().st_size > 0
    # Cut by --video-max-steps, the video holds its first steps and the score is still the whole episode's.
    assert main([str(checkpoint), "--episodes", "3", "--epsilon", "0", "--video", str(tmp_path / "cut.gif"),
                 "--video-max-steps", "4"]) == 0
    out = capsys.readouterr().out
    assert "(min 2, max 6; epsilon 0; episodes cut at" in out
    assert ("which scored 6 (5 frames; the video stops after --video-max-steps (4 steps), the score is the whole "
            "episode's)") in out


def test_play_reads_its_checkpoint_once_and_leaves_no_half_video_when_the_env_fails(tmp_path, monkeypatch, capsys):
    """An env that fails while env 0's first episode is recorded: no half-written mp4 is left. One that fails in a
    later episode leaves the finished video of the first."""
    from envs import EnvError
    cfg = load_config(ROOT / "configs/pong_cpu.yaml", ["eval.envs=1"])
    network = QNetwork((1, 2), 2, mlp_hidden=(4,)).for_acting()
    loads = []

    class Failing(ScriptedEpisodes):   # episodes of 5 and 4 steps, the env failing at its `fail_at`th step
        screen = np.zeros((16, 16, 3), dtype=np.uint8)
        steps = 0

        def step(self, actions):
            self.steps += 1
            if self.steps == fail_at:
                raise EnvError("the emulator stopped answering")
            if self.steps == kill_at:
                os.kill(os.getpid(), signal.SIGTERM)
            return super().step(actions)
    monkeypatch.setattr(rl_dqn.evaluate, "load_player", lambda checkpoint: loads.append(checkpoint) or (cfg, network))
    monkeypatch.setattr(rl_dqn.evaluate, "make_vector_env", lambda *args, **kwargs: Failing([[5, 4]]))
    checkpoint = tmp_path / "checkpoint.pt"
    checkpoint.write_bytes(b"")
    video = tmp_path / "episode.mp4"
    fail_at, kill_at = 3, None   # in the first episode, the one recorded
    assert main([str(checkpoint), "--episodes", "2", "--video", str(video)]) == 2
    assert capsys.readouterr().err == "play: error: the emulator stopped answering\n"
    assert loads == [checkpoint]
    assert not video.exists()     # the mp4 it had begun is gone
    fail_at = 8   # in the second episode
    assert main([str(checkpoint), "--episodes", "2", "--video", str(video)]) == 2
    assert video.stat().st_size > 0
    video.unlink()
    fail_at, kill_at = None, 3   # a kill (SIGTERM) while it records

    def untaken(signum, frame):   # this test's, in place of one that would end the test session
        raise AssertionError("play did not take the SIGTERM")
    handler = signal.signal(signal.SIGTERM, untaken)
    try:
        with pytest.raises(SystemExit) as killed:
            main([str(checkpoint), "--episodes", "2", "--video", str(video)])
        assert killed.value.code == 128 + signal.SIGTERM and not video.exists()
        assert signal.getsignal(signal.SIGTERM) is untaken
    finally:
        signal.signal(signal.SIGTERM, handler)
    # Called on another thread, which cannot take signals, it plays as well.
    fail_at, kill_at, codes = None, None, []
    player = threading.Thread(target=lambda: codes.append(main([str(checkpoint), "--episodes", "2", "--video",
                                                                str(video)])))
    player.start()
    player.join(timeout=30)
    assert codes == [0] and video.stat().st_size > 0


def test_a_video_file_that_cannot_be_opened_leaves_a_file_already_there_alone(tmp_path, monkeypatch):
    class Unopened:
        def __init__(self, *args):
            pass

        def isOpened(self):
            return False
    monkeypatch.setattr(rl_dqn.video.cv2, "VideoWriter", Unopened)
    there = tmp_path / "episode.mp4"
    there.write_bytes(b"an earlier video")
    video = VideoFile(there, 15.0)
    with pytest.raises(VideoError, match="cannot write an mp4 to "):
        video.add(np.zeros((16, 16, 3), dtype=np.uint8))
    video.discard()
    assert there.read_bytes() == b"an earlier video"


def test_play_cuts_episodes_where_it_is_told_or_where_the_run_evaluates(tmp_path, monkeypatch, capsys):
    cfg = load_config(ROOT / "configs/atari_cpu.yaml", ["eval.envs=2"])
    network = QNetwork((1, 2), 2, mlp_hidden=(4,)).for_acting()
    cuts = []

    def make_vector_env(env_cfg, num_envs, seed, screen=False):
        cuts.append(env_cfg.max_episode_frames)
        assert env_cfg.sticky_action_prob == cfg.eval_env.sticky_action_prob   # the rest is evaluation's
        return ScriptedEpisodes([[3, 1], [2, 1]])
    monkeypatch.setattr(rl_dqn.evaluate, "load_player", lambda checkpoint: (cfg, network))
    monkeypatch.setattr(rl_dqn.evaluate, "make_vector_env", make_vector_env)
    checkpoint = tmp_path / "checkpoint.pt"
    checkpoint.write_bytes(b"")
    assert main([str(checkpoint), "--episodes", "2"]) == 0
    assert main([str(checkpoint), "--episodes", "2", "--max-episode-frames", "108000"]) == 0
    assert cuts == [cfg.eval.max_episode_frames, 108_000] and cfg.eval.max_episode_frames == 18_000
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("episodes cut at 18,000 frames)") and out[1].endswith("episodes cut at 108,000 frames)")
    with pytest.raises(SystemExit) as exited:
        main([str(checkpoint), "--max-episode-frames", "3"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.startswith(
        "play: error: --max-episode-frames must be >= the run's env.frame_skip (4), got 3 (usage: ./launch/play.sh ")


def test_play_of_an_env_with_its_own_time_limit_says_no_cut_and_takes_none(tmp_path, monkeypatch, capsys):
    cfg = load_config(ROOT / "configs/cartpole.yaml")
    network = QNetwork((1, 2), 2, mlp_hidden=(4,)).for_acting()
    monkeypatch.setattr(rl_dqn.evaluate, "load_player", lambda checkpoint: (cfg, network))
    monkeypatch.setattr(rl_dqn.evaluate, "make_vector_env", lambda *args, **kwargs: ScriptedEpisodes([[3, 1]]))
    checkpoint = tmp_path / "checkpoint.pt"
    checkpoint.write_bytes(b"")
    assert main([str(checkpoint), "--episodes", "1"]) == 0
    assert capsys.readouterr().out.endswith("(min 3, max 3; epsilon 0, the run's eval.epsilon)\n")
    with pytest.raises(SystemExit) as exited:
        main([str(checkpoint), "--max-episode-frames", "108000"])
    assert exited.value.code == 2 and capsys.readouterr().err.startswith(
        "play: error: --max-episode-frames cuts Atari episodes; CartPole-v1 keeps its own time limit (usage: ")


@pytest.mark.parametrize("args, error", [
    (["--video", "x.avi"], "--video must name a .mp4 or .gif file, got 'x.avi'"),
    (["--episodes", "0"], "--episodes must be >= 1, got 0"),
    (["--epsilon", "2"], "--epsilon must be in [0, 1], got 2.0"),
    (["--video", "x.gif", "--video-max-steps", "0"], "--video-max-steps must be >= 1, got 0"),
    (["--best"], "--best takes a run folder, not a checkpoint file ({checkpoint})"),
    (["--video", "{tmp}/a.mp4"], "--video must name a .mp4 or .gif file, got '{tmp}/a.mp4', a folder"),
    (["--episodes", "many"], "argument --episodes: invalid int value: 'many'"),
])
def test_play_refuses_bad_arguments_with_its_usage_and_exit_2(tmp_path, capsys, args, error):
    """./launch/play.sh's refusals of its arguments (its launcher's one line and exit code 2 for a path that is not
    there: tests/test_smoke_run.py)."""
    checkpoint = tmp_path / "checkpoint_000000001.pt"
    checkpoint.write_bytes(b"")   # a file, not a checkpoint: the arguments are refused before it would be read
    (tmp_path / "a.mp4").mkdir()
    with pytest.raises(SystemExit) as exited:
        main([str(checkpoint), *[a.format(tmp=tmp_path) for a in args]])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("play: error: " + error.format(checkpoint=checkpoint, tmp=tmp_path) + " (usage: "
                          "./launch/play.sh "), err


def test_a_screened_round_plays_on_only_where_its_first_episodes_reached_the_screen_score():
    # The screen: 2 episodes on 2 envs, 3 and 5 (mean 4). The rest: 3 episodes on 2 more envs, 2 and 1 at once and
    # 12 after the 1-step one; the 4-step episode that follows the 2-step one does not count.
    network = QNetwork((1, 2), 2, mlp_hidden=(4,)).for_acting()
    for screen_score, expected in [(4.0, [1.0, 2.0, 3.0, 5.0, 12.0]), (4.5, [3.0, 5.0])]:
        cfg = EvalConfig(episodes=5, screen_episodes=2, screen_score=screen_score, epsilon=0.0)
        envs = [ScriptedEpisodes([[3, 10], [5, 7]]), ScriptedEpisodes([[2, 4], [1, 12, 9]])]
        scores = play_round(envs, network, cfg, torch.Generator().manual_seed(0))
        assert sorted(scores) == expected
    phases = load_config(ROOT / "configs/pong_cpu.yaml", ["eval.screen_episodes=5", "eval.envs=20"]).eval_phases
    assert phases == ((5, 5), (15, 15))
    unscreened = load_config(ROOT / "configs/pong_cpu.yaml", ["eval.screen_episodes=0", "eval.envs=8"])
    assert unscreened.eval_phases == ((20, 8),)


def test_evaluation_can_play_without_the_sticky_actions_of_training():
    sticky = ["env.sticky_action_prob=0.25", "eval.max_episode_frames=0"]
    assert load_config(ROOT / "configs/pong_cpu.yaml", sticky).eval_env.sticky_action_prob == 0.25
    cfg = load_config(ROOT / "configs/pong_cpu.yaml", [*sticky, "eval.sticky_action_prob=0"])
    assert cfg.env.sticky_action_prob == 0.25 and cfg.eval_env == dataclasses.replace(cfg.env, sticky_action_prob=0.0)
    # The evaluation env follows it: with epsilon 1 and one seed, the same actions play out differently only where
    # the emulator repeats some of them.
    def first_episode_frames(env_cfg):
        env = make_vector_env(env_cfg, 1, seed=5)
        try:
            actions, frames = torch.Generator().manual_seed(1), []
            env.reset()
            for _ in range(200):
                frames.append(env.step(torch.randint(env.spec.num_actions, (1,), generator=actions)).obs.clone())
            return torch.stack(frames)
        finally:
            env.close()
    assert torch.equal(first_episode_frames(cfg.eval_env), first_episode_frames(cfg.eval_env))
    assert not torch.equal(first_episode_frames(cfg.eval_env), first_episode_frames(cfg.env))


def test_evaluation_episodes_end_at_the_evaluation_time_limit_and_score_what_they_scored():
    cfg = load_config(ROOT / "configs/pong_cpu.yaml", ["eval.max_episode_frames=400"])
    assert cfg.eval_env.max_episode_frames == 400 and cfg.env.max_episode_frames == 108_000
    assert load_config(ROOT / "configs/pong_cpu.yaml", ["eval.max_episode_frames=0"]).eval_env == cfg.env
    env = make_vector_env(cfg.eval_env, 2, seed=3, screen=True)
    network = QNetwork.for_env(env.spec.obs_shape, env.spec.num_actions, cfg.network, "cpu").for_acting()
    steps = []
    try:
        scores = play(env, network, episodes=3, epsilon=1.0, generator=torch.Generator().manual_seed(0),
                      record=steps.append, record_steps=10_000)
    finally:
        env.close()
    assert len(steps) == 1 + 400 // cfg.env.frame_skip   # env 0's first episode: cut after 100 agent steps
    assert len(scores) == 3 and all(-21 <= s <= 0 for s in scores)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_evaluation_steps_its_envs_on_eval_threads_and_acts_on_eval_device(device):
    """eval.threads steps the evaluation's vector (0: as many threads as a collector's), and play() acts with the
    network wherever it is, the envs stepping on the CPU. On the CPU two rounds of the same seeds score the same
    (the threads change no episode); on a GPU, whose random numbers are another stream, the round plays out."""
    cfg = load_config(ROOT / "configs/pong_gpu.yaml", ["eval.max_episode_frames=400"])
    assert cfg.eval_env.threads_per_collector == 4 and cfg.env.threads_per_collector == 1
    assert load_config(ROOT / "configs/pong_gpu.yaml", ["eval.threads=0"]).eval_env.threads_per_collector == 1
    rounds = []
    for where in ("cpu", device):
        env = make_vector_env(cfg.eval_env, 4, seed=3)
        torch.manual_seed(0)
        network = QNetwork.for_env(env.spec.obs_shape, env.spec.num_actions, cfg.network, where).for_acting()
        try:
            rounds.append(play(env, network, episodes=4, epsilon=0.5, generator=torch.Generator(where).manual_seed(0)))
        finally:
            env.close()
    assert all(len(scores) == 4 and all(-21 <= s <= 21 for s in scores) for scores in rounds)
    if device == "cpu":
        assert rounds[0] == rounds[1]


def test_play_given_a_file_that_is_no_checkpoint_says_so_without_torchs_advice_to_load_it_unsafely(capsys):
    assert main([str(ROOT / "configs/smoke.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"play: error: cannot play {ROOT / 'configs/smoke.yaml'}: not in torch.save's zip format "
                          f"(play takes a run folder, ")
    assert err.count("\n") == 1 and "weights_only" not in err, err


@pytest.mark.parametrize("seed", ["-1", "99999999999999999999"])
def test_play_refuses_a_seed_outside_run_seeds_range(capsys, seed):
    with pytest.raises(SystemExit) as exit_:
        main([str(ROOT / "runs"), "--seed", seed])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"--seed must be from 0 to 2,147,483,647, got {seed}" in err, err


@pytest.mark.parametrize("damage, reason", [("cut", "the file is cut short"), ("folder", "it is a folder"),
                                            ("list", "it holds a list, not an rl_dqn checkpoint"),
                                            ("text", "not in torch.save's zip format")])
def test_play_given_a_damaged_checkpoint_says_what_is_wrong_in_one_line(tmp_path, capsys, damage, reason):
    path = tmp_path / "run" / "checkpoints" / "checkpoint_000000001.pt"   # the newest checkpoint of runs/run
    path.parent.mkdir(parents=True)
    if damage == "folder":
        path.mkdir()
    elif damage == "text":
        path.write_text("a text file, not a checkpoint")
    else:
        torch.save([1, 2] if damage == "list" else {"network": torch.zeros(10_000)}, path)
    if damage == "cut":
        path.write_bytes(path.read_bytes()[:5000])
    assert main([str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err == f"play: error: cannot play {path}: {reason} (play takes a run folder, runs/<name>, or a .pt file " \
                  f"of its checkpoints/)\n", err


@pytest.mark.slow   # a process of its own
def test_an_evaluator_that_fails_says_why_to_the_learner():
    """The evaluator process fails as it starts (here: a game its ale-py does not have): the learner hears its
    error, not only that it exited."""
    from rl_dqn.evaluate import Evaluator
    evaluator = Evaluator(load_config(ROOT / "configs/smoke.yaml", ["env.id=ALE/NoSuchGame-v5"]))
    try:
        evaluator.process.join(timeout=60)
        assert evaluator.process.exitcode == 1
        with pytest.raises(RuntimeError, match="^evaluator failed: .*NoSuchGame"):
            evaluator.poll()
    finally:
        evaluator.close()
