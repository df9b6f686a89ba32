#!/usr/bin/env bash
# Runs the test suite, setting up .venv on first use. Extra arguments go to pytest (e.g. -k replay, -m "not slow").
set -euo pipefail
source "$(dirname "$0")/_venv.sh"
cd "$root"
exec "$PYTHON" -m pytest "$@"
