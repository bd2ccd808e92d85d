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

from sa_jobs._table.service_tables import PeriodicState

__all__ = [
    "periodic_advance",
    "periodic_claim",
    "periodic_due",
    "periodic_list",
    "periodic_lock_rows",
    "periodic_mark_seen",
    "periodic_names",
    "periodic_record_job",
    "periodic_register",
    "periodic_request_run",
    "periodic_retire",
]


def periodic_register(rows: Iterable[dict[str, Any]], now: dt.datetime) -> Insert:
    """Create the row of each periodic job of the code that has none; an existing row is
    left alone (``ON CONFLICT DO NOTHING`` neither waits for nor takes its lock).

    ``rows`` hold ``name``, ``schedule`` (canonical text), ``next_run_at`` (the first
    instant of a fresh start) and ``schedule_set_at`` (the registering process's start).
    Whether an existing row's schedule changes is :func:`periodic_claim`'s question.
    """
    statement = pg_insert(PeriodicState).values([{**row, "seen_at": now} for row in rows])
    return statement.on_conflict_do_nothing(index_elements=[PeriodicState.name])


def periodic_names(names: Iterable[str]) -> Select[str]:
    """Which of these names have a row (a plain read: it waits for no lock)."""
    return select(PeriodicState.name).where(PeriodicState.name.in_(list(names)))


def periodic_lock_rows(names: Iterable[str]) -> Select[str, str, dt.datetime]:
    """These rows' schedules and when they were set, locked; rows another process holds
    (it is firing them) are skipped rather than waited for."""
    return (
        select(PeriodicState.name, PeriodicState.schedule, PeriodicState.schedule_set_at)
        .where(PeriodicState.name.in_(list(names)))
        .order_by(PeriodicState.name)
        .with_for_update(skip_locked=True)
    )


def periodic_claim(
    name: str,
    *,
    schedule: str,
    next_run_at: dt.datetime,
    started_at: dt.datetime,
    now: dt.datetime,
) -> Update:
    """Give the row the schedule of a process that started at ``started_at`` — only if
    its schedule differs and was set before that start (by a process started earlier).

    The most recently started process's schedule wins, once: a process started earlier
    can never take the row back, so two versions of the code in a rolling deploy do not
    reset each other's schedule. Executed on a row the caller has locked.
    """
    return (
        update(PeriodicState)
        .where(
            PeriodicState.name == name,
            PeriodicState.schedule != schedule,
            PeriodicState.schedule_set_at < started_at,
        )
        .values(
            schedule=schedule,
            next_run_at=next_run_at,
            schedule_set_at=started_at,
            seen_at=now,
        )
        .returning(PeriodicState.name)
    )


def periodic_mark_seen(names: Iterable[str], now: dt.datetime) -> Update:
    """Mark these rows seen (a worker still has them in its code), skipping rows another
    process holds locked: a plain update that waits for nobody and changes no schedule."""
    free = (
        select(PeriodicState.name)
        .where(PeriodicState.name.in_(list(names)))
        .with_for_update(skip_locked=True)
    )
    return update(PeriodicState).where(PeriodicState.name.in_(free)).values(seen_at=now)


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
