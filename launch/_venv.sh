# Sourced by the launchers. Makes .venv from requirements.txt on first use and re-installs only when
# requirements.txt changed; then sets PYTHON and puts the repository on PYTHONPATH.
# RL_DQN_PYTHON=/path/to/python skips the venv and uses that interpreter (an environment you manage yourself).
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
if [ -n "${RL_DQN_PYTHON:-}" ]; then
  PYTHON="$RL_DQN_PYTHON"
else
  venv="$root/.venv"
  want="$(sha256sum "$root/requirements.txt" | cut -d' ' -f1)"
  exec 9>"$root/.venv.lock"
  flock 9   # two launchers started at once set up the venv once
  if [ ! -x "$venv/bin/python" ] || [ "$(cat "$venv/.requirements.sha256" 2>/dev/null)" != "$want" ]; then
    if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
      echo "rl_dqn: error: python3 >= 3.10 is needed to create $venv (found: $(python3 --version 2>&1))" >&2
      exit 2
    fi
    echo "rl_dqn: setting up $venv from requirements.txt (first use, or requirements.txt changed) ..." >&2
    rm -f "$venv/.requirements.sha256"
    python3 -m venv "$venv" &&
      "$venv/bin/python" -m pip install --disable-pip-version-check -q -r "$root/requirements.txt" ||
      { echo "rl_dqn: error: installing requirements.txt into $venv failed (see pip's output above)" >&2; exit 1; }
    echo "$want" >"$venv/.requirements.sha256"
  fi
  exec 9>&-
  PYTHON="$venv/bin/python"
fi
