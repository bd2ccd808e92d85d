"""Snapshots of the SQL sa_jobs sends: a change to a statement shows up as a diff of a file.

Every statement sa_jobs builds once and caches (or builds per call from a fixed shape) is
compiled here with PostgreSQL's psycopg dialect — no database needed — and compared with
``tests/unit/sql_snapshots/<name>.sql``: the SQL text with its placeholders (values are
never rendered), trailing whitespace stripped from each line.

When a test fails, read the diff. If the change to the SQL is intended, rewrite the
snapshots and commit them with the change, so a reviewer sees the new SQL::

    SA_JOBS_UPDATE_SNAPSHOTS=1 ./scripts/test.sh tests/unit/test_sql_snapshots.py

In that mode every snapshot is rewritten (the tests pass) and snapshot files that no
statement owns any more are deleted. A new statement: add it to ``STATEMENTS`` and run
the same command; a missing snapshot file fails the test otherwise.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.dialects.postgresql import psycopg

from sa_jobs._act.complete import _steps_statement, completed_statement, finish_statement
from sa_jobs._base.sql import json_recordset
from sa_jobs._declare.limits import ConcurrencyLimit, RateLimit
from sa_jobs._declare.options import JobKeyMode
from sa_jobs._insert.insert_statement import _ROW_COLUMNS, ROWS_PARAM, InsertShape, insert_statement
from sa_jobs._insert.sequence import (
    ids_param,
    jobs_advance_sequences,
    lock_keys,
    lock_keys_in,
    lock_keys_of_jobs,
)
from sa_jobs._insert.unique import release_expired_locks
from sa_jobs._table.schema import ALL_FEATURES, NO_FEATURES, Features
from sa_jobs.worker.limited_fetch import (
    count_starts,
    jobs_fetch_limited,
    limits_usage,
    lock_scopes,
    plan_limits,
)
from sa_jobs.worker.maintenance.rescuer import jobs_orphaned
from sa_jobs.worker.maintenance.scheduler import jobs_schedule_due
from sa_jobs.worker.maintenance.sequence_repair import jobs_stalled_sequences
from sa_jobs.worker.producer import jobs_fetch_available

SNAPSHOT_DIR = Path(__file__).parent / "sql_snapshots"
UPDATE_ENV = "SA_JOBS_UPDATE_SNAPSHOTS"
UPDATE_COMMAND = f"{UPDATE_ENV}=1 ./scripts/test.sh tests/unit/test_sql_snapshots.py"

# Values some builders take; they end up as placeholders, but keep them fixed anyway.
LIMIT = 100
RESCUE_AFTER = 60.0
JOB_IDS = [1, 2]
SEQUENCE_KEYS = ["\\x01ab", "\\xff00"]


#: A queue limit and a kind's two limits, as a worker would declare them.
LIMITS = plan_limits(
    [
        ConcurrencyLimit(queue="mail", max_running=5),
        ConcurrencyLimit(kind="send_email", max_running=2),
        RateLimit(kind="send_email", max_starts=100, per=60),
    ],
    ["mail"],
)["mail"]


def _insert_rows() -> Any:
    """The rows source of an insert statement without unique rows (``job_rows``)."""
    return json_recordset(ROWS_PARAM, _ROW_COLUMNS, "job_rows")


#: Snapshot name -> a builder of the statement. Builders run inside the tests, so one
#: that breaks fails its own test rather than the collection of all of them.
STATEMENTS: dict[str, Callable[[], Any]] = {
    # sa_jobs._insert.insert_statement: one statement per shape. insert_many sends
    # shape_of(rows); insert_job sends a single row with lock_sequences=True.
    "insert_plain": lambda: insert_statement(InsertShape()),
    "insert_unique": lambda: insert_statement(InsertShape(unique=True)),
    "insert_unique_numbered": lambda: insert_statement(InsertShape(unique=True, numbered=True)),
    "insert_sequenced": lambda: insert_statement(InsertShape(sequenced=True)),
    "insert_sequenced_lock_sequences": lambda: insert_statement(
        InsertShape(sequenced=True, lock_sequences=True)
    ),
    "insert_unique_sequenced": lambda: insert_statement(InsertShape(unique=True, sequenced=True)),
    "insert_unique_sequenced_lock_sequences": lambda: insert_statement(
        InsertShape(unique=True, sequenced=True, lock_sequences=True)
    ),
    "insert_unique_sequenced_numbered": lambda: insert_statement(
        InsertShape(unique=True, sequenced=True, numbered=True)
    ),
    # Keyed adds (sa_jobs._insert.job_key.keyed_upsert), one statement per mode.
    **{
        f"insert_keyed_{mode.value}": (
            lambda mode=mode: insert_statement(InsertShape(job_key_mode=mode))
        )
        for mode in JobKeyMode
    },
    # sa_jobs._act.complete
    "finish": lambda: finish_statement(),
    "finish_sequence": lambda: finish_statement(sequence=True),
    "finish_job_key": lambda: finish_statement(job_key=True),
    "finish_sequence_job_key": lambda: finish_statement(sequence=True, job_key=True),
    "finish_completed": lambda: completed_statement(),
    "finish_completed_sequence_job_key": lambda: completed_statement(sequence=True, job_key=True),
    # A batch of completed workflow steps: finish, release, counters, callbacks at once.
    "finish_completed_steps_job_key": lambda: _steps_statement(
        job_key=True, output=False, plain=True
    ),
    "finish_steps_output": lambda: _steps_statement(job_key=False, output=True, plain=False),
    # sa_jobs.worker.producer
    "fetch_available_core": lambda: jobs_fetch_available(NO_FEATURES),
    "fetch_available_all_features": lambda: jobs_fetch_available(ALL_FEATURES),
    "fetch_available_queue_controls": lambda: jobs_fetch_available(Features(queue=True)),
    # sa_jobs.worker.limited_fetch
    "fetch_limited": lambda: jobs_fetch_limited(ALL_FEATURES),
    "limits_lock_scopes": lambda: lock_scopes(LIMITS),
    "limits_usage": lambda: limits_usage(LIMITS),
    "limits_count_starts": lambda: count_starts(),
    # sa_jobs.worker.maintenance
    "schedule_due": lambda: jobs_schedule_due(LIMIT),
    "schedule_due_unique": lambda: jobs_schedule_due(LIMIT, unique=True),
    "orphaned": lambda: jobs_orphaned(RESCUE_AFTER, LIMIT),
    "orphaned_own": lambda: jobs_orphaned(RESCUE_AFTER, LIMIT, own=("worker-1", JOB_IDS)),
    "stalled_sequences": lambda: jobs_stalled_sequences(LIMIT),
    # sa_jobs._insert.sequence
    "lock_keys": lambda: lock_keys(SEQUENCE_KEYS),
    "lock_keys_in": lambda: lock_keys_in(_insert_rows().c.sequence_key),
    "lock_keys_of_jobs": lambda: lock_keys_of_jobs(ids_param(JOB_IDS)),
    "advance_sequences": lambda: jobs_advance_sequences(JOB_IDS),
    # sa_jobs._insert.unique: the CTE of a unique insert, here over the unparsed rows.
    "release_expired_locks": lambda: release_expired_locks(_insert_rows()),
}


def _updating() -> bool:
    return os.environ.get(UPDATE_ENV) == "1"


def compiled_sql(statement: Any) -> str:
    """The statement's SQL for the psycopg dialect, placeholders kept, lines right-stripped."""
    text = str(statement.compile(dialect=psycopg.dialect()))
    return "\n".join(line.rstrip() for line in text.splitlines()).strip("\n") + "\n"


@pytest.mark.parametrize("name", sorted(STATEMENTS))
def test_sql_matches_snapshot(name: str) -> None:
    actual = compiled_sql(STATEMENTS[name]())
    path = SNAPSHOT_DIR / f"{name}.sql"
    if _updating():
        SNAPSHOT_DIR.mkdir(exist_ok=True)
        if not path.exists() or path.read_text(encoding="utf-8") != actual:
            path.write_text(actual, encoding="utf-8")
        return
    if not path.exists():
        pytest.fail(f"no snapshot tests/unit/{SNAPSHOT_DIR.name}/{path.name}: run {UPDATE_COMMAND}")
    expected = path.read_text(encoding="utf-8")
    assert actual == expected, (
        f"the SQL of {name} changed; if that is intended, run {UPDATE_COMMAND} "
        "and commit the new snapshot"
    )


def test_no_stale_snapshots() -> None:
    known = {f"{name}.sql" for name in STATEMENTS}
    present = sorted(SNAPSHOT_DIR.iterdir()) if SNAPSHOT_DIR.exists() else []
    stale = [path for path in present if path.name not in known]
    if _updating():
        for path in stale:
            if path.suffix == ".sql":
                path.unlink()
        stale = [path for path in stale if path.suffix != ".sql"]
    assert not stale, (
        f"files in {SNAPSHOT_DIR.name}/ that belong to no statement: "
        f"{[path.name for path in stale]}; delete them, or run {UPDATE_COMMAND}"
    )
