"""The statements on ``sa_job_periodic``, the durable state of periodic jobs.

Each builder returns a statement and the caller executes it (the ticker, the retire
step, :func:`sa_jobs.periodic.run_now`, ``sa-jobs periodic list``). The one that makes
"one job per instant" hold is :func:`periodic_advance`: a compare-and-set of
``next_run_at`` that matches only while the row still holds the instant the caller
read, executed in the transaction that inserts the instant's jobs. A second process —
or a stale leader — that read the same row finds it moved and inserts nothing.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

from sqlalchemy import Insert, Select, Update, case, delete, select, tuple_, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql.dml import ReturningDelete

from sa_jobs.models import PeriodicState

__all__ = [
    "periodic_advance",
    "periodic_due",
    "periodic_list",
    "periodic_record_job",
    "periodic_register",
    "periodic_request_run",
    "periodic_retire",
]


def periodic_register(rows: Iterable[dict[str, Any]], now: dt.datetime) -> Insert:
    """Make sure each periodic job of the code has its row, and mark it seen at ``now``.

    ``rows`` hold ``name``, ``schedule`` (canonical text) and ``next_run_at`` (the first
    instant of a fresh start). An existing row with the same schedule keeps its
    instants — that is what makes a restart neither skip nor repeat; one with another
    schedule starts over from the new one.
    """
    statement = pg_insert(PeriodicState).values([{**row, "seen_at": now} for row in rows])
    new = statement.excluded
    same = PeriodicState.schedule == new.schedule
    return statement.on_conflict_do_update(
        index_elements=[PeriodicState.name],
        set_={
            "schedule": new.schedule,
            "next_run_at": case((same, PeriodicState.next_run_at), else_=new.next_run_at),
            "seen_at": new.seen_at,
        },
    )


def periodic_due(
    schedules: dict[str, str], now: dt.datetime
) -> Select[str, dt.datetime, dt.datetime | None]:
    """Rows of these ``name -> schedule`` pairs that have an instant due at ``now`` or a
    run requested, locked; rows another process is firing are skipped (it holds them).

    A row whose schedule text differs from the caller's belongs to processes running
    another version of the code (a rolling deploy); they fire it, this one does not.
    """
    pairs = [(name, schedule) for name, schedule in schedules.items()]
    return (
        select(
            PeriodicState.name,
            PeriodicState.next_run_at,
            PeriodicState.run_now_requested_at,
        )
        .where(
            tuple_(PeriodicState.name, PeriodicState.schedule).in_(pairs),
            (PeriodicState.next_run_at <= now) | PeriodicState.run_now_requested_at.is_not(None),
        )
        .order_by(PeriodicState.name)
        .with_for_update(skip_locked=True)
    )


def periodic_advance(
    name: str,
    *,
    read_next: dt.datetime,
    read_request: dt.datetime | None,
    next_run_at: dt.datetime,
    last_run_at: dt.datetime | None,
) -> Update:
    """Move the row from the state the caller read to the next one; returns the name
    only if the row still held that state (the compare-and-set)."""
    request_unchanged = (
        PeriodicState.run_now_requested_at.is_(None)
        if read_request is None
        else PeriodicState.run_now_requested_at == read_request
    )
    values: dict[str, Any] = {"next_run_at": next_run_at, "run_now_requested_at": None}
    if last_run_at is not None:
        values["last_run_at"] = last_run_at
    return (
        update(PeriodicState)
        .where(
            PeriodicState.name == name,
            PeriodicState.next_run_at == read_next,
            request_unchanged,
        )
        .values(values)
        .returning(PeriodicState.name)
    )


def periodic_record_job(name: str, job_id: int, now: dt.datetime) -> Update:
    """Note the last job a fire inserted (or met, for a unique duplicate)."""
    return (
        update(PeriodicState)
        .where(PeriodicState.name == name)
        .values(last_job_id=job_id, last_enqueued_at=now, seen_at=now)
    )


def periodic_request_run(name: str, now: Any) -> Update:
    """Ask for an extra run of ``name``; a request already pending is kept (one run)."""
    pending = PeriodicState.run_now_requested_at
    return (
        update(PeriodicState)
        .where(PeriodicState.name == name)
        .values(run_now_requested_at=case((pending.is_(None), now), else_=pending))
        .returning(PeriodicState.run_now_requested_at)
    )


def periodic_retire(now: Any, retire_after: dt.timedelta) -> ReturningDelete[str]:
    """Delete the rows no worker has had in its code for ``retire_after``."""
    return (
        delete(PeriodicState)
        .where(PeriodicState.seen_at < now - retire_after)
        .returning(PeriodicState.name)
    )


def periodic_list() -> Select[PeriodicState]:
    """Every periodic job's row, by name."""
    return select(PeriodicState).order_by(PeriodicState.name)
