#!/usr/bin/env bash
# The demo: creates .venv if needed, installs sa_jobs, runs `sa-jobs demo`.
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
exec "$VENV/bin/sa-jobs" demo "$@"
