#!/usr/bin/env bash
# The test suite: creates .venv if needed, installs sa_jobs[dev], runs pytest.
# Uses $SA_JOBS_DATABASE_URL (or $DATABASE_URL), else the server on 127.0.0.1:5432,
# else an embedded throwaway PostgreSQL; the header of the run says which (tests/conftest.py).
# Extra arguments go to pytest.
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
exec "$VENV/bin/python" -m pytest "$@"
