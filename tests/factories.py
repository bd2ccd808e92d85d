"""Rows written straight into sa_jobs' tables, in any state, for tests of the machinery.

The public insert paths only make ``available`` and ``scheduled`` jobs; maintenance and
fetch tests need jobs that are already running, retryable, finished long ago, or
attempted by a worker that has vanished. :func:`make_job` writes such a row with one Core
``INSERT`` and returns its id.

Times are either aware datetimes or :class:`datetime.timedelta` offsets from the
*database's* clock (``now()`` of the inserting transaction), so "finished 25 hours ago"
is ``finalized_at=-hours(25)`` and never depends on the test machine's clock.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Engine, delete, func, insert, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql.elements import ColumnElement

from sa_jobs._base.states import FINAL_STATES, JobState
from sa_jobs._table.models import Job
from sa_jobs._table.service_tables import Leader, WorkerProcess

__all__ = [
    "FACTORY_KIND",
    "clear_workers_and_leader",
    "expire_ttl_locks",
    "job_row",
    "leader_row",
    "make_job",
    "make_worker_row",
    "seconds",
    "when",
]

FACTORY_KIND = "factory_job"

Bind = Engine | Connection
When = dt.datetime | dt.timedelta | ColumnElement[Any]


def seconds(value: float) -> dt.timedelta:
    return dt.timedelta(seconds=value)


def when(value: When) -> Any:
    """A datetime as is; a timedelta as ``now() + offset`` on the database's clock."""
    if isinstance(value, dt.timedelta):
        return func.now() + value
    return value


def _run(bind: Bind, statement: Any) -> list[Any]:
    """Execute on the connection given, or in a transaction of its own; return the rows."""
    if isinstance(bind, Connection):
        result = bind.execute(statement)
        return result.all() if result.returns_rows else []
    with bind.begin() as connection:
        result = connection.execute(statement)
        return result.all() if result.returns_rows else []


def make_job(
    bind: Bind,
    *,
    kind: str = FACTORY_KIND,
    args: dict[str, Any] | None = None,
    state: JobState = JobState.AVAILABLE,
    queue: str = "default",
    priority: int = 1,
    attempt: int = 0,
    max_attempts: int = 25,
    attempted_by: Sequence[str] | None = None,
    attempted_at: When | None = None,
    scheduled_at: When | None = None,
    finalized_at: When | None = None,
    metadata: dict[str, Any] | None = None,
    errors: list[dict[str, Any]] | None = None,
) -> int:
    """Insert one job row exactly as described and return its id.

    A final state without ``finalized_at`` gets ``now()`` (the table requires one); a
    running job without ``attempted_at`` gets ``now()`` too.
    """
    values: dict[str, Any] = {
        "kind": kind,
        "args_json": args or {},
        "state": state,
        "queue": queue,
        "priority": priority,
        "attempt": attempt,
        "max_attempts": max_attempts,
        "metadata_": metadata or {},
        "errors": errors or [],
    }
    if attempted_by is not None:
        values["attempted_by"] = list(attempted_by)
    if attempted_at is not None:
        values["attempted_at"] = when(attempted_at)
    elif state is JobState.RUNNING:
        values["attempted_at"] = func.now()
    if scheduled_at is not None:
        values["scheduled_at"] = when(scheduled_at)
    if finalized_at is not None:
        values["finalized_at"] = when(finalized_at)
    elif state in FINAL_STATES:
        values["finalized_at"] = func.now()
    statement = insert(Job).values(**values).returning(Job.id)
    return int(_run(bind, statement)[0][0])


def expire_ttl_locks(bind: Bind, job_ids: Sequence[int] | None = None) -> None:
    """Move the TTL deadline of these jobs' unique locks (all, by default) an hour into
    the past, as if their time had run out."""
    statement = (
        update(Job)
        .where(Job.unique_expires_at.is_not(None))
        .values(unique_expires_at=func.now() - dt.timedelta(hours=1))
    )
    if job_ids is not None:
        statement = statement.where(Job.id.in_(list(job_ids)))
    _run(bind, statement)


def make_worker_row(bind: Bind, worker_id: str, *, heartbeat_at: When = dt.timedelta(0)) -> None:
    """Write (or move) a worker process's heartbeat row (no worker runs behind it)."""
    statement = pg_insert(WorkerProcess).values(
        id=worker_id, hostname="factory", pid=0, queues=["default"], heartbeat_at=when(heartbeat_at)
    )
    statement = statement.on_conflict_do_update(
        index_elements=[WorkerProcess.id], set_={"heartbeat_at": statement.excluded.heartbeat_at}
    )
    _run(bind, statement)


def job_row(bind: Bind, job_id: int) -> Any:
    """The job's row as it is now (a Core row with every column, ``metadata`` included)."""
    table = Job.__table__
    (row,) = _run(bind, select(table).where(table.c.id == job_id))
    return row


def leader_row(bind: Bind) -> Any:
    """The maintenance lease row, or ``None``."""
    rows = _run(bind, select(Leader.__table__))
    return rows[0] if rows else None


def clear_workers_and_leader(bind: Bind) -> None:
    """Forget every heartbeat and the lease (left over by other tests' workers)."""
    _run(bind, delete(WorkerProcess))
    _run(bind, delete(Leader))
