#!/usr/bin/env bash
# Runs the test suite, setting up .venv on first use. Extra arguments go to pytest (e.g. -k replay, -m "not slow").
# The tests run on 2 pytest-xdist workers, a test file to each at a time (--dist loadfile: a file's tests share
# what its module fixtures start); `-n 0` after these runs them in this one process. An interpreter of your own
# (RL_DQN_PYTHON) without pytest-xdist runs them in one process.
set -euo pipefail
source "$(dirname "$0")/_venv.sh"
cd "$root"
workers=()
if "$PYTHON" -c "import xdist" 2>/dev/null; then
  workers=(-n 2 --dist loadfile)
fi
exec "$PYTHON" -m pytest "${workers[@]}" "$@"
