#!/usr/bin/env bash
# What this machine is to rl_dqn and whether a config can run here as written (exit 0, or 2 with its problems):
#   ./launch/doctor.sh [CONFIG] [section.key=value ...]
# The GPU acceptance run (cuda tests, transport and learner benchmarks, a short training run; runs/doctor-*/report.md):
#   ./launch/doctor.sh --gpu [CONFIG]
set -euo pipefail
source "$(dirname "$0")/_venv.sh"
cd "$root"
RL_DQN_PROG="$0" exec "$PYTHON" -m rl_dqn doctor "$@"
