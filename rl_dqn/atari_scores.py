"""Reference scores for the Atari games we report, keyed by ALE name (`ALE/<Game>-v5`), and the Atari-5 estimate.

RANDOM, HUMAN: the random-agent and human-tester scores of DQN Zoo,
    https://github.com/deepmind/dqn_zoo/blob/master/dqn_zoo/atari_data.py
DOPAMINE_DQN_CURVE, DOPAMINE_RAINBOW_CURVE: Dopamine's baselines over their first 10M frames, for each iteration the
    mean over the 5 runs in https://github.com/google/dopamine/tree/master/baselines/atari/data/<game>.json (agents
    "DQN (Adam + MSE in JAX)" and "Rainbow"). An iteration is Runner.training_steps = 250k agent steps = 1M frames
    (ITERATION_ENV_STEPS), so index 9 ends at 10M frames (2.5M env steps); the configs use the 'continuous_train'
    schedule, so an iteration's value is the mean return of the training episodes that ended in it.
DOPAMINE_DQN, DOPAMINE_RAINBOW: those baselines at 10M frames, iteration 9.
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
ITERATION_ENV_STEPS = 250_000
PAST_THE_END = ITERATION_ENV_STEPS // 100   # see dopamine_at()
DOPAMINE_DQN_CURVE: dict[str, tuple[float, ...]] = {
    "BattleZone": (3666.8, 3393.6, 5055.1, 12242.4, 17405.6, 16863.3, 16674.8, 18364.0, 18157.5, 18594.1),
    "DoubleDunk": (-19.0, -21.0, -20.2, -19.6, -19.3, -19.4, -18.8, -18.9, -18.5, -18.3),
    "NameThisGame": (2281.5, 2347.3, 3999.5, 4894.1, 5198.2, 5260.8, 5415.9, 5388.2, 5359.6, 5553.2),
    "Phoenix": (676.5, 605.5, 1228.1, 2226.6, 3428.7, 4240.5, 4349.8, 4515.4, 4177.1, 3963.1),
    "Qbert": (238.1, 447.5, 568.2, 746.8, 909.0, 1048.5, 1105.8, 1025.8, 1128.8, 1495.0),
    "Breakout": (1.8, 6.5, 15.2, 18.9, 23.7, 27.8, 32.4, 38.3, 41.6, 46.9),
    "Pong": (-20.2, -18.5, -16.3, -13.9, -10.7, -7.8, -4.2, -0.8, 2.9, 6.3),
}
DOPAMINE_RAINBOW_CURVE: dict[str, tuple[float, ...]] = {
    "BattleZone": (3426.8, 3086.0, 3162.9, 3453.7, 3605.1, 4179.4, 7784.7, 11894.8, 18160.2, 20209.1),
    "DoubleDunk": (-19.3, -23.3, -22.6, -22.1, -21.4, -20.7, -20.0, -19.9, -19.0, -18.9),
    "NameThisGame": (2251.3, 1748.9, 3389.3, 4562.8, 6048.3, 7133.1, 7778.0, 7964.4, 8303.8, 8604.0),
    "Phoenix": (780.0, 294.0, 558.1, 1219.3, 2340.1, 3744.6, 4675.0, 4600.3, 4897.4, 4830.2),
    "Qbert": (198.6, 450.6, 723.8, 1189.0, 2511.9, 3283.4, 3782.5, 4046.9, 4568.8, 5353.9),
    "Breakout": (1.8, 4.5, 11.8, 15.6, 19.8, 24.1, 27.4, 32.4, 37.6, 41.9),
    "Pong": (-20.4, -20.6, -18.7, -16.5, -12.6, -1.6, 6.3, 10.7, 13.1, 15.2),
}
DOPAMINE_DQN: dict[str, float] = {game: curve[9] for game, curve in DOPAMINE_DQN_CURVE.items()}
DOPAMINE_RAINBOW: dict[str, float] = {game: curve[9] for game, curve in DOPAMINE_RAINBOW_CURVE.items()}
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


def dopamine_at(curve: dict[str, tuple[float, ...]], game: str, env_steps: int) -> float | None:
    """A Dopamine baseline (DOPAMINE_DQN_CURVE or DOPAMINE_RAINBOW_CURVE) over the same env steps as a run at
    `env_steps`: the value of the iteration in which its env step number `env_steps` falls (the mean return of that
    iteration's training episodes); None for a game it has no curve of, or past its 10 iterations (2.5M env steps).
    A run to 2.5M env steps stops a little past them, its chunks coming in whole, and so does the round of
    evaluation it plays there: up to PAST_THE_END env steps past the last iteration still read against it."""
    values = curve.get(game)
    iteration = (env_steps - 1) // ITERATION_ENV_STEPS
    if values is not None and 0 < env_steps - len(values) * ITERATION_ENV_STEPS <= PAST_THE_END:
        iteration = len(values) - 1
    if values is None or not 0 <= iteration < len(values):
        return None
    return values[iteration]
