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

from sqlalchemy import Connection, func, select, text

from sa_jobs._insert.insert import ROW_COLUMNS, core_run, write_rows
from sa_jobs._insert.rows import build_rows
from sa_jobs.periodic.definition import PeriodicJob
from sa_jobs.periodic.plan import Fire, plan
from sa_jobs.periodic.state import (
    periodic_advance,
    periodic_claim,
    periodic_due,
    periodic_lock_rows,
    periodic_mark_seen,
    periodic_names,
    periodic_record_job,
    periodic_register,
    periodic_retire,
)

__all__ = ["Clock", "PeriodicRetirer", "PeriodicTicker", "database_clock"]

log = logging.getLogger("sa_jobs.worker")

#: Reads "now" in the tick's transaction; tests inject their own.
Clock = Callable[[Connection], dt.datetime]

#: How often a process re-registers its periodic jobs (marking them seen, and
#: recreating a row deleted meanwhile).
REGISTER_INTERVAL = 60.0
#: A tick gives up on a lock after this long (and the next tick tries again).
TICK_LOCK_TIMEOUT_MS = 5000


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
        #: This process's start: the clock at its first tick. Rows whose schedule was set
        #: before it take this process's schedule; it never takes a row back from a
        #: process started later.
        self.started_at: dt.datetime | None = None
        self._registered_at: float | None = None
        #: Names whose start-time schedule check has not run yet (their row was locked).
        self._unclaimed = set(self.jobs)

    def run_once(self, connection: Connection) -> int:
        """Register if due, then fire every due periodic job; returns jobs inserted."""
        # Nothing in a tick should wait long on a lock (a unique job's insert racing
        # another): better to fail this tick and try again than to hang the thread.
        connection.execute(text(f"SET LOCAL lock_timeout = '{TICK_LOCK_TIMEOUT_MS}ms'"))
        now = self.clock(connection)
        try:
            if self._registered_at is None or time.monotonic() >= self._registered_at + (
                REGISTER_INTERVAL
            ):
                self.register(connection, now)
            if self._unclaimed:
                self._claim(connection, now)
            inserted: list[int] = []
            for row in connection.execute(periodic_due(self.schedules, now)).all():
                inserted += self._fire_one(connection, row, now)
        except BaseException:
            # The registration and the claims may have been rolled back: redo them (both
            # are idempotent).
            self._registered_at = None
            self._unclaimed = set(self.jobs)
            raise
        if inserted and self.before_commit is not None:
            self.before_commit(inserted)
        return len(inserted)

    def register(self, connection: Connection, now: dt.datetime) -> None:
        """Create the rows of periodic jobs new to the database and mark all of this
        process's as seen. An existing row's schedule is not touched here (see
        :meth:`_claim`), and nothing waits for a row another process is firing."""
        if self.started_at is None:
            self.started_at = now
        existing = set(connection.scalars(periodic_names(self.jobs)))
        rows = [
            {
                "name": job.name,
                "schedule": job.schedule.description,
                "next_run_at": self._first_run(job, now),
                "schedule_set_at": self.started_at,
            }
            for job in self.jobs.values()
            if job.name not in existing
        ]
        if rows:
            connection.execute(periodic_register(rows, now))
        connection.execute(periodic_mark_seen(self.jobs, now))
        self._registered_at = time.monotonic()

    def _claim(self, connection: Connection, now: dt.datetime) -> None:
        """This process's start-time say on its rows' schedules: a row whose schedule
        differs from the code's and was set before this process started starts over
        from the code's. Rows locked by a tick elsewhere are left for the next tick."""
        assert self.started_at is not None
        for row in connection.execute(periodic_lock_rows(self._unclaimed)).all():
            self._unclaimed.discard(row.name)
            job = self.jobs[row.name]
            if row.schedule == job.schedule.description or row.schedule_set_at >= self.started_at:
                continue
            claimed = connection.execute(
                periodic_claim(
                    job.name,
                    schedule=job.schedule.description,
                    next_run_at=self._first_run(job, now),
                    started_at=self.started_at,
                    now=now,
                )
            ).first()
            if claimed is not None:
                log.info(
                    "periodic job %s: schedule %r replaces %r",
                    job.name,
                    job.schedule.description,
                    row.schedule,
                )

    @staticmethod
    def _first_run(job: PeriodicJob, now: dt.datetime) -> dt.datetime:
        return now if job.run_on_start else job.schedule.after(now, now)

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

        written = write_rows(connection, rows, core_run(connection), ROW_COLUMNS)
        ids = [ROW_COLUMNS.id_of(entry.returned.job) for entry in written]
        connection.execute(periodic_record_job(job.name, ids[-1], now))
        return ids


class PeriodicRetirer:
    """Deletes the rows of periodic jobs no worker has had in its code for
    ``retire_after`` (a leader step: it must run even where no process has periodic
    jobs any more), once it has been running for ``2 * REGISTER_INTERVAL``."""

    def __init__(self, retire_after: dt.timedelta, *, clock: Clock = database_clock) -> None:
        self.retire_after = retire_after
        self.clock = clock
        self._watching_since: dt.datetime | None = None

    def run_once(self, connection: Connection) -> int:
        now = self.clock(connection)
        # After a downtime of the whole fleet longer than retire_after, every row looks
        # abandoned until the workers that have it register again. So this leader
        # deletes nothing until it has watched for two re-registration intervals: by
        # then every running worker has marked its rows seen.
        if self._watching_since is None:
            self._watching_since = now
        if now < self._watching_since + dt.timedelta(seconds=2 * REGISTER_INTERVAL):
            return 0
        names = connection.scalars(periodic_retire(now, self.retire_after)).all()
        for name in names:
            log.info(
                "periodic job %s retired: no worker has had it for %s", name, self.retire_after
            )
        return len(names)
