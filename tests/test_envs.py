"""Env preprocessing on real ALE: shapes, dtypes, stacks, the raw-score / clipped-reward split, lost lives and
time limits."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from envs import EnvConfig, EnvError, describe_env, make_vector_env


def atari(**changes) -> EnvConfig:
    return dataclasses.replace(EnvConfig(id="ALE/SpaceInvaders-v5", sticky_action_prob=0.0), **changes)


def play(cfg: EnvConfig, num_envs: int, steps: int, seed: int = 0):
    """Random play; returns the reset observation and every StepResult."""
    env = make_vector_env(cfg, num_envs, seed)
    generator = torch.Generator().manual_seed(seed)
    try:
        obs = env.reset()
        results = [env.step(torch.randint(env.spec.num_actions, (num_envs,), generator=generator))
                   for _ in range(steps)]
    finally:
        env.close()
    return obs, results


def test_atari_observations_are_stacked_84x84_grayscale_bytes():
    obs, results = play(atari(), num_envs=2, steps=6)
    assert obs.shape == (2, 4, 84, 84) and obs.dtype == torch.uint8
    # Zero-padded at the start of an episode: only the newest frame is real.
    assert (obs[:, :3] == 0).all() and obs[:, 3].float().mean() > 0
    previous = obs
    for r in results:
        assert r.obs.shape == (2, 4, 84, 84) and r.obs.dtype == torch.uint8
        assert r.reward.dtype == r.raw_reward.dtype == torch.float32 and r.reward.shape == (2,)
        assert r.terminated.dtype == r.truncated.dtype == r.first.dtype == torch.bool
        assert torch.equal(r.obs[:, :3], previous[:, 1:])   # the stack shifts by one frame per step
        previous = r.obs


def test_training_reward_is_clipped_while_the_score_stays_raw():
    _, results = play(atari(), num_envs=4, steps=300)
    raw = torch.stack([r.raw_reward for r in results])
    clipped = torch.stack([r.reward for r in results])
    assert raw.max() > 1, "Space Invaders scores 5-30 points per alien"
    assert torch.equal(clipped, torch.sign(raw))
    _, results = play(atari(clip_rewards=False), num_envs=4, steps=300)
    assert all(torch.equal(r.reward, r.raw_reward) for r in results)


def test_lost_life_is_terminal_for_training_only():
    _, results = play(atari(), num_envs=4, steps=800)
    life_lost = [(r.terminated & ~r.game_over) for r in results]
    assert any(x.any() for x in life_lost), "random play loses a life within 800 steps"
    for t, lost in enumerate(life_lost[:-1]):
        # The game goes on after a lost life: no reset, the stack continues.
        assert not results[t + 1].first[lost].any()
    _, results = play(atari(terminal_on_life_loss=False), num_envs=4, steps=800)
    assert all(torch.equal(r.terminated, r.game_over) for r in results)


def test_time_limit_truncates_and_the_next_step_resets():
    _, results = play(atari(max_episode_frames=200), num_envs=2, steps=60)
    ends = [t for t, r in enumerate(results) if r.truncated.all()]
    assert ends, "200 frames at frame skip 4 is about 50 steps"
    t = ends[0]
    assert not results[t].terminated.any()   # a time limit is not a terminal state
    after = results[t + 1]
    assert after.first.all() and (after.reward == 0).all()
    assert (after.obs[:, :3] == 0).all()     # the new episode's stack is zero-padded again


def test_classic_control_through_the_same_factory():
    cfg = EnvConfig(id="CartPole-v1", clip_rewards=False)
    spec = describe_env(cfg)
    assert spec.obs_shape == (1, 4) and spec.obs_dtype == torch.float32 and spec.num_actions == 2
    obs, results = play(cfg, num_envs=3, steps=100)
    assert obs.shape == (3, 1, 4) and obs.dtype == torch.float32
    ended = [t for t, r in enumerate(results[:-1]) if r.episode_end.any()]
    assert ended
    t = ended[0]
    e = results[t].episode_end.nonzero()[0, 0]
    assert results[t + 1].first[e] and results[t + 1].reward[e] == 0


def test_unknown_env_id_is_refused_by_name():
    with pytest.raises(EnvError, match="Pongg"):
        describe_env(EnvConfig(id="ALE/Pongg-v5"))
    with pytest.raises(EnvError, match="NoSuchEnv"):
        describe_env(EnvConfig(id="NoSuchEnv-v0"))


def test_the_recorded_screen_is_env_0s_game_in_colour():
    """The screen is env 0 played a second time in colour; it shows the same game: grayscale and shrunk, it is the
    agent's own newest frame, step after step, across a lost life and an episode's end (sticky actions on)."""
    import cv2
    cfg = atari(sticky_action_prob=0.25, max_episode_frames=2000)
    env = make_vector_env(cfg, 3, seed=5, screen=True)
    generator = torch.Generator().manual_seed(0)
    try:
        obs = env.reset()
        ends = 0
        for _ in range(700):
            assert env.screen.shape == (210, 160, 3) and env.screen.dtype.name == "uint8"
            seen = cv2.resize(cv2.cvtColor(env.screen, cv2.COLOR_RGB2GRAY), (84, 84), interpolation=cv2.INTER_AREA)
            assert abs(seen.astype(float) - obs[0, -1].numpy()).mean() < 1.0
            result = env.step(torch.randint(env.spec.num_actions, (3,), generator=generator))
            obs, ends = result.obs, ends + int(result.episode_end[0])
        assert ends >= 1
    finally:
        env.close()
    with pytest.raises(EnvError, match="Atari"):
        make_vector_env(EnvConfig(id="CartPole-v1"), 1, seed=0, screen=True)
