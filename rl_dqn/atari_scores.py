"""Reference scores for the Atari games we report, keyed by ALE name (`ALE/<Game>-v5`), and the Atari-5 estimate.

RANDOM, HUMAN: the random-agent and human-tester scores of DQN Zoo,
    https://github.com/deepmind/dqn_zoo/blob/master/dqn_zoo/atari_data.py
DOPAMINE_DQN, DOPAMINE_RAINBOW: Dopamine's baselines at 10M frames, the mean over the 5 runs of iteration 9 in
    https://github.com/google/dopamine/tree/master/baselines/atari/data/<game>.json (agents "DQN (Adam + MSE in JAX)"
    and "Rainbow"). An iteration is Runner.training_steps = 250k agent steps = 1M frames, so index 9 ends at 10M
    frames (2.5M env steps); the configs use the 'continuous_train' schedule, so these are returns of training episodes.
ATARI5: the Atari-5 regression of Aitchison, Sweetser and Hutter, "Atari-5: Distilling the Arcade Learning Environment
    down to Five Games" (ICML 2023), refitted from https://github.com/maitchison/Atari-5 by
    benchmarks/atari5_regression.py.
"""

from __future__ import annotations

import math

RANDOM: dict[str, float] = {
    "BattleZone": 2360.0,
    "DoubleDunk": -18.6,
    "NameThisGame": 2292.3,
    "Phoenix": 761.4,
    "Qbert": 163.9,
    "Breakout": 1.7,
    "Pong": -20.7,
}
HUMAN: dict[str, float] = {
    "BattleZone": 37187.5,
    "DoubleDunk": -16.4,
    "NameThisGame": 8049.0,
    "Phoenix": 7242.6,
    "Qbert": 13455.0,
    "Breakout": 30.5,
    "Pong": 14.6,
}
DOPAMINE_DQN: dict[str, float] = {
    "BattleZone": 18594.1,
    "DoubleDunk": -18.3,
    "NameThisGame": 5553.2,
    "Phoenix": 3963.1,
    "Qbert": 1495.0,
    "Breakout": 46.9,
    "Pong": 6.3,
}
DOPAMINE_RAINBOW: dict[str, float] = {
    "BattleZone": 20209.1,
    "DoubleDunk": -18.9,
    "NameThisGame": 8604.0,
    "Phoenix": 4830.2,
    "Qbert": 5353.9,
    "Breakout": 41.9,
    "Pong": 15.2,
}
# log10(1 + median57) = sum over the five games of ATARI5[game] * log10(1 + max(HNS, 0)), HNS and median in percent,
# no intercept: the fit of atari5.py (run_init, fit_model) over the algorithms with all five games, at least 40 of the
# 57 and a median above 40%. The fit normalises with the repository's Atari-Human.csv, whose random and human scores
# equal RANDOM and HUMAN above to their rounding (at most 0.05 apart). The fit reproduces the authors' own
# constants (maitchison/PPO, tools/plot_util.py, AtariScoreNormalizer.SUBSETS['Atari_5']) to 15 digits, and their
# 10-fold cross-validated relative error of 10.4%.
ATARI5: dict[str, float] = {
    "BattleZone": 0.3820,
    "DoubleDunk": 0.06791,
    "NameThisGame": 0.3108,
    "Phoenix": 0.1241,
    "Qbert": 0.08049,
}


def human_normalized(game: str, score: float) -> float:
    """`score` on `game` in percent of the way from the random agent's score (0) to the human tester's (100)."""
    if game not in RANDOM or game not in HUMAN:
        raise ValueError(f"no random and human scores for {game!r}; known: {', '.join(RANDOM)}")
    return 100 * (score - RANDOM[game]) / (HUMAN[game] - RANDOM[game])


def atari5_median(scores: dict[str, float]) -> float:
    """The Atari-5 estimate of the median human-normalised score over the 57 games, in percent, from raw `scores`
    of the five ATARI5 games (other games are ignored)."""
    missing = [game for game in ATARI5 if game not in scores]
    if missing:
        raise ValueError(f"the Atari-5 estimate needs scores for {', '.join(missing)}")
    log_median = sum(weight * math.log10(1 + max(human_normalized(game, scores[game]), 0.0))
                     for game, weight in ATARI5.items())
    return 10 ** log_median - 1
