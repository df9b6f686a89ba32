#!/usr/bin/env bash
# The learner of a multi-node run (rank 0):
#   ./launch/learner.sh CONFIG cluster.init_method=tcp://THIS_HOST:PORT cluster.world_size=N cluster.interface=IFACE
#                       [section.key=value ...]
set -euo pipefail
source "$(dirname "$0")/_venv.sh"
RL_DQN_PROG="$0" exec "$PYTHON" -m rl_dqn learner "$@"
