#!/usr/bin/env bash
# A collector node of a multi-node run: collectors.count collector processes, ranks cluster.rank .. + count - 1:
#   ./launch/collector.sh CONFIG cluster.init_method=tcp://LEARNER_HOST:PORT cluster.world_size=N cluster.rank=R
#                         cluster.interface=IFACE [section.key=value ...]
set -euo pipefail
source "$(dirname "$0")/_venv.sh"
RL_DQN_PROG="$0" exec "$PYTHON" -m rl_dqn collectors "$@"
