# Sourced by the launchers; sets PYTHON, which runs rl_dqn as `"$PYTHON" -m rl_dqn COMMAND` (the `rl-dqn` command).
# On first use it makes .venv: the exact pins of requirements.txt (the build backend, setuptools, among them), then
# this repository as an editable package, `pip install --no-deps --no-build-isolation -e .`, which downloads nothing more
# and resolves nothing twice. It does so again only when requirements.txt or pyproject.toml changed.
# RL_DQN_PYTHON=/path/to/python skips the venv and uses that interpreter (an environment you manage yourself, e.g. a
# GPU machine's own): nothing is installed into it, and the repository is put on PYTHONPATH instead.
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -n "${RL_DQN_PYTHON:-}" ]; then
  PYTHON="$RL_DQN_PYTHON"
  export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
else
  venv="$root/.venv"
  want="$(cat "$root/requirements.txt" "$root/pyproject.toml" | sha256sum | cut -d' ' -f1)"
  exec 9>"$root/.venv.lock"
  flock 9   # two launchers started at once set up the venv once
  if [ ! -x "$venv/bin/python" ] || [ "$(cat "$venv/.setup.sha256" 2>/dev/null)" != "$want" ]; then
    if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
      echo "rl_dqn: error: python3 >= 3.10 is needed to create $venv (found: $(python3 --version 2>&1))" >&2
      exit 2
    fi
    echo "rl_dqn: setting up $venv from requirements.txt and pyproject.toml (first use, or one of them changed) ..." >&2
    rm -f "$venv/.setup.sha256" "$venv/.requirements.sha256"
    pip=("$venv/bin/python" -m pip install --disable-pip-version-check -q)
    # requirements.txt pins setuptools, pyproject.toml's build backend: with it in the venv the editable install
    # builds offline (a new venv's own setuptools may be too old to, or absent).
    python3 -m venv "$venv" && "${pip[@]}" -r "$root/requirements.txt" ||
      { echo "rl_dqn: error: installing requirements.txt into $venv failed (see pip's output above)" >&2; exit 1; }
    "${pip[@]}" --no-deps --no-build-isolation -e "$root" ||
      { echo "rl_dqn: error: installing rl_dqn into $venv (pip install -e .) failed (see pip's output above)" >&2
        exit 1; }
    echo "$want" >"$venv/.setup.sha256"
  fi
  exec 9>&-
  PYTHON="$venv/bin/python"
fi
