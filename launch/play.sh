#!/usr/bin/env bash
# Plays a trained agent: episodes at the run's eval.epsilon of its newest checkpoint (its best-scoring one with
# --best, or a given file), mean +- std of the raw score, and optionally a video of one episode:
#   ./launch/play.sh runs/<name> [--best] [--episodes 20] [--epsilon 0.01] [--video episode.mp4|.gif]
set -euo pipefail
source "$(dirname "$0")/_venv.sh"
RL_DQN_PROG="$0" exec "$PYTHON" -m rl_dqn play "$@"
