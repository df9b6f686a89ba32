#!/usr/bin/env bash
# One node runs the whole run: ./launch/local.sh CONFIG [section.key=value ...]
# Sets up .venv on first use, starts the learner and collectors.count collectors on 127.0.0.1, and writes
# TensorBoard events, the resolved config, checkpoints and summary.json to runs/<run.name>/.
set -euo pipefail
source "$(dirname "$0")/_venv.sh"
RL_DQN_PROG="$0" exec "$PYTHON" -m rl_dqn local "$@"
