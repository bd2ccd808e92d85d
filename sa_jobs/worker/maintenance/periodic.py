"""Firing periodic jobs: the ticker every process with ``periodic=[...]`` runs, and the
leader's retirement of periodic jobs no code has any more.

Each tick, in one transaction: read the clock (the database's, so hosts with skewed
clocks agree), lock this process's due rows (``FOR UPDATE SKIP LOCKED``), plan each
one's jobs (:mod:`sa_jobs.periodic.plan`), move its ``next_run_at`` forward with a
compare-and-set, and insert the jobs — all or nothing. Several processes may tick at
once: the row lock makes the others skip a row being fired, and the compare-and-set
makes a process that read a stale row (a leader that lost its lease, a paused VM)
insert nothing. A process killed mid-tick leaves neither the jobs nor the moved
instant behind, so the next tick anywhere fires that instant. See
``docs/periodic-jobs.md``.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Connection, func, select

from sa_jobs.insert import Returned, write_rows
from sa_jobs.models import EXISTED_COLUMN
from sa_jobs.periodic.definition import PeriodicJob
from sa_jobs.periodic.plan import Fire, plan
from sa_jobs.periodic.state import (
    periodic_advance,
    periodic_due,
    periodic_record_job,
    periodic_register,
    periodic_retire,
)
from sa_jobs.rows import build_rows

__all__ = ["Clock", "PeriodicRetirer", "PeriodicTicker", "database_clock"]

log = logging.getLogger("sa_jobs.worker")

#: Reads "now" in the tick's transaction; tests inject their own.
Clock = Callable[[Connection], dt.datetime]

#: How often a process re-registers its periodic jobs (marking them seen, and
#: recreating a row deleted meanwhile).
REGISTER_INTERVAL = 60.0


def database_clock(connection: Connection) -> dt.datetime:
    """The database's ``now()``: one clock for every process, whatever their hosts say."""
    now: dt.datetime = connection.execute(select(func.now())).scalar_one()
    return now


class PeriodicTicker:
    """Fires this process's periodic jobs (a step of every process's maintenance loop).

    Args:
        jobs: The worker's periodic jobs (names already checked distinct).
        clock: Where "now" comes from (default: the database's).
    """

    def __init__(self, jobs: Sequence[PeriodicJob], *, clock: Clock = database_clock) -> None:
        self.jobs = {job.name: job for job in jobs}
        self.schedules = {job.name: job.schedule.description for job in jobs}
        self.clock = clock
        #: Test seam: called after a tick's jobs are inserted, before its commit.
        self.before_commit: Callable[[list[int]], None] | None = None
        self._registered_at: float | None = None

    def run_once(self, connection: Connection) -> int:
        """Register if due, then fire every due periodic job; returns jobs inserted."""
        now = self.clock(connection)
        try:
            if self._registered_at is None or time.monotonic() >= self._registered_at + (
                REGISTER_INTERVAL
            ):
                self.register(connection, now)
            inserted: list[int] = []
            for row in connection.execute(periodic_due(self.schedules, now)).all():
                inserted += self._fire_one(connection, row, now)
        except BaseException:
            self._registered_at = None  # the registration may have been rolled back
            raise
        if inserted and self.before_commit is not None:
            self.before_commit(inserted)
        return len(inserted)

    def register(self, connection: Connection, now: dt.datetime) -> None:
        """Create the rows of periodic jobs new to the database (or whose schedule
        changed) and mark all of this process's as seen."""
        rows = [
            {
                "name": job.name,
                "schedule": job.schedule.description,
                "next_run_at": now if job.run_on_start else job.schedule.after(now, now),
            }
            for job in self.jobs.values()
        ]
        if rows:
            connection.execute(periodic_register(rows, now))
        self._registered_at = time.monotonic()

    def _fire_one(self, connection: Connection, row: Any, now: dt.datetime) -> list[int]:
        job = self.jobs[row.name]
        try:
            # A savepoint: one periodic job whose args factory fails leaves the others'
            # fires in this tick alone; its own instant stays due for the next tick.
            with connection.begin_nested():
                return self._fire(connection, job, row, now)
        except Exception as exc:
            log.error("periodic job %s: firing failed, will retry: %s", job.name, exc)
            return []

    def _fire(
        self, connection: Connection, job: PeriodicJob, row: Any, now: dt.datetime
    ) -> list[int]:
        fires: list[Fire] = []
        next_run_at = row.next_run_at
        if row.next_run_at <= now:
            planned = plan(
                job.schedule,
                row.next_run_at,
                now,
                catch_up=job.catch_up,
                misfire_grace=job.misfire_grace,
            )
            fires.extend(planned.fires)
            next_run_at = planned.next_run_at
            if planned.dropped:
                log.warning(
                    "periodic job %s: %d missed run(s) skipped (catch_up=%r)",
                    job.name,
                    planned.dropped,
                    job.catch_up,
                )
        if row.run_now_requested_at is not None:
            fires.append(Fire(row.run_now_requested_at, requested=True))
        advanced = connection.execute(
            periodic_advance(
                job.name,
                read_next=row.next_run_at,
                read_request=row.run_now_requested_at,
                next_run_at=next_run_at,
                last_run_at=max((fire.instant for fire in fires), default=None),
            )
        ).first()
        if advanced is None:
            return []  # another process fired this state first
        if not fires:
            return []
        rows = build_rows([(job.build_args(), job.insert_opts(fire)) for fire in fires])

        def run(statement: Any, params: dict[str, Any], _keyed: bool) -> list[Returned]:
            found = connection.execute(statement, params).mappings()
            return [
                Returned(r, bool(r[EXISTED_COLUMN]), r.get("job_key"), r.get("revision"))
                for r in found
            ]

        written = write_rows(connection, rows, run)
        ids = [int(entry.returned.job["id"]) for entry in written]
        connection.execute(periodic_record_job(job.name, ids[-1], now))
        return ids


class PeriodicRetirer:
    """Deletes the rows of periodic jobs no worker has had in its code for
    ``retire_after`` (a leader step: it must run even where no process has periodic
    jobs any more)."""

    def __init__(self, retire_after: dt.timedelta, *, clock: Clock = database_clock) -> None:
        self.retire_after = retire_after
        self.clock = clock

    def run_once(self, connection: Connection) -> int:
        now = self.clock(connection)
        names = connection.scalars(periodic_retire(now, self.retire_after)).all()
        for name in names:
            log.info(
                "periodic job %s retired: no worker has had it for %s", name, self.retire_after
            )
        return len(names)
