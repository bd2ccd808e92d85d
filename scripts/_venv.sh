# Sourced by the other scripts: make sure .venv exists and holds sa_jobs with its dev extras.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV="${SA_JOBS_VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
# Reinstall only when the dependency list changed, so repeated runs start at once.
stamp="$VENV/.sa_jobs-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  "$VENV/bin/python" -m pip install --quiet -e '.[dev]'
  touch "$stamp"
fi
