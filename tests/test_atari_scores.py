"""The reference scores of the games we report, the human-normalised score and the Atari-5 estimate."""

from __future__ import annotations

import math

import pytest

from rl_dqn import atari_scores as ref


def test_a_score_is_normalised_between_the_random_agent_and_the_human_tester():
    assert ref.human_normalized("Pong", -20.7) == 0.0
    assert ref.human_normalized("Pong", 14.6) == pytest.approx(100.0)
    assert ref.human_normalized("Breakout", 30.5 + 28.8) == pytest.approx(200.0)   # random 1.7, human 30.5
    with pytest.raises(ValueError, match="no random and human scores for 'Seaquest'"):
        ref.human_normalized("Seaquest", 100.0)


def test_the_atari5_estimate_is_the_regression_on_the_five_games_normalised_scores():
    """Every game at the human tester's score: each normalised score is 100%, and the estimate is
    10 ** (sum of the coefficients * log10(101)) - 1; at the random agent's, 0%; below it, clipped to 0%."""
    human = {game: ref.HUMAN[game] for game in ref.ATARI5}
    assert ref.atari5_median(human) == pytest.approx(10 ** (sum(ref.ATARI5.values()) * math.log10(101)) - 1)
    assert ref.atari5_median({game: ref.RANDOM[game] for game in ref.ATARI5}) == 0.0
    assert ref.atari5_median({game: ref.RANDOM[game] - 1000 for game in ref.ATARI5}) == 0.0
    one = dict({game: ref.RANDOM[game] for game in ref.ATARI5}, Qbert=ref.HUMAN["Qbert"], Pong=21.0)
    assert ref.atari5_median(one) == pytest.approx(101 ** ref.ATARI5["Qbert"] - 1)   # other games are ignored
    with pytest.raises(ValueError, match="DoubleDunk, Phoenix"):
        ref.atari5_median({game: 0.0 for game in ("BattleZone", "NameThisGame", "Qbert")})


def test_every_reported_game_has_all_four_reference_scores():
    assert set(ref.RANDOM) == set(ref.HUMAN) == set(ref.DOPAMINE_DQN) == set(ref.DOPAMINE_RAINBOW)
    assert set(ref.ATARI5) <= set(ref.RANDOM)
    assert all(ref.HUMAN[game] > ref.RANDOM[game] for game in ref.RANDOM)


def test_dopamines_curves_end_at_the_scores_at_10m_frames():
    for curve, at_10m in ((ref.DOPAMINE_DQN_CURVE, ref.DOPAMINE_DQN),
                          (ref.DOPAMINE_RAINBOW_CURVE, ref.DOPAMINE_RAINBOW)):
        assert set(curve) == set(ref.RANDOM)
        assert all(len(values) == 10 and values[9] == at_10m[game] for game, values in curve.items())


def test_a_baseline_over_the_same_env_steps_is_the_iteration_that_holds_them():
    breakout = ref.DOPAMINE_RAINBOW_CURVE["Breakout"]
    assert ref.dopamine_at(ref.DOPAMINE_RAINBOW_CURVE, "Breakout", 1) == breakout[0]
    assert ref.dopamine_at(ref.DOPAMINE_RAINBOW_CURVE, "Breakout", 250_000) == breakout[0]
    assert ref.dopamine_at(ref.DOPAMINE_RAINBOW_CURVE, "Breakout", 250_001) == breakout[1]
    assert ref.dopamine_at(ref.DOPAMINE_RAINBOW_CURVE, "Breakout", 1_680_000) == breakout[6]
    assert ref.dopamine_at(ref.DOPAMINE_RAINBOW_CURVE, "Breakout", 2_500_000) == breakout[9] == 41.9
    # A run to 2.5M env steps ends with the chunk that crosses them (2,500,096 with atari_cpu.yaml's).
    assert ref.dopamine_at(ref.DOPAMINE_RAINBOW_CURVE, "Breakout", 2_500_096) == 41.9
    assert ref.dopamine_at(ref.DOPAMINE_RAINBOW_CURVE, "Breakout", 2_502_501) is None   # past its 10M frames
    assert ref.dopamine_at(ref.DOPAMINE_RAINBOW_CURVE, "Seaquest", 100_000) is None
