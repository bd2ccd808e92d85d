"""Shared helpers for the worker's integration tests.

A worker with fast maintenance and short grace periods, fixed-delay retry policies,
job inserts and reads through fresh sessions, waits with deadlines, a table for a
handler's database effects, and a counter of the completer's ``UPDATE`` statements.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import attrs
from sqlalchemy import Connection, Engine, event, func, select, text
from sqlalchemy import insert as core_insert
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import Job, JobState, MaintenanceConfig, Worker
from sa_jobs.models import job_table
from sa_jobs.worker.producer import fetch_jobs

T = TypeVar("T")

#: Heartbeats, leadership and the scheduler fast enough for tests (rescue stays > 2x).
FAST_MAINTENANCE = MaintenanceConfig(
    heartbeat_interval=0.2, rescue_after=1.0, leader_ttl=0.5, scheduler_interval=0.05
)

#: Heartbeats too slow to matter within a test: only NOTIFY can deliver a cancel fast.
SLOW_HEARTBEAT = MaintenanceConfig(
    heartbeat_interval=5.0, rescue_after=20.0, leader_ttl=10.0, scheduler_interval=0.05
)


@attrs.frozen
class FixedDelay:
    """A retry policy: every failed attempt runs again after ``seconds``."""

    seconds: float = 0.0

    def next_delay(self, job: Job) -> dt.timedelta:
        return dt.timedelta(seconds=self.seconds)


#: Failed jobs are due again at once (``run_until_idle`` then works them to the end).
NO_DELAY = FixedDelay(0.0)
#: Failed jobs are not due again within any test.
AN_HOUR = FixedDelay(3600.0)


def make_worker(engine: Engine, **options: Any) -> Worker:
    """A worker for tests: short polls, short grace, fast maintenance; override anything."""
    settings: dict[str, Any] = {
        "queues": {"default": 5},
        "poll_interval": 0.05,
        "interrupt_grace": 0.3,
        "maintenance": FAST_MAINTENANCE,
        "job_timeout": 10.0,
    }
    settings.update(options)
    return Worker(engine, **settings)


@contextmanager
def running(worker: Worker) -> Iterator[Worker]:
    """Start ``worker`` in the background; stop it (interrupting stragglers) on exit."""
    worker.start()
    try:
        yield worker
    finally:
        worker.stop(cancel=True)


def wait_listening(worker: Worker, timeout: float = 5.0) -> None:
    """Wait until the worker's LISTEN connection is up (so a NOTIFY reaches it)."""
    assert worker.listening.wait(timeout), "the worker never started listening"


# ------------------------------------------------------------------ jobs in the database


def add_job(engine: Engine, args: object, **options: Any) -> int:
    """Insert one job in its own committed transaction; returns its id."""
    with Session(engine) as session, session.begin():
        return sa_jobs.insert(session, args, **options).job.id


def add_jobs(engine: Engine, args: list[object], **options: Any) -> list[int]:
    with Session(engine) as session, session.begin():
        return [result.job.id for result in sa_jobs.insert_many(session, args, **options)]


def add_raw_job(engine: Engine, kind: str, args_json: Any, **columns: Any) -> int:
    """Insert a row by hand, bypassing args validation (e.g. args that no longer convert)."""
    with engine.begin() as connection:
        statement = (
            core_insert(job_table)
            .values(kind=kind, args=args_json, **columns)
            .returning(job_table.c.id)
        )
        return int(connection.execute(statement).scalar_one())


def get_job(engine: Engine, job_id: int) -> Job:
    """The job as the database has it now (a detached, fully loaded object)."""
    with Session(engine, expire_on_commit=False) as session:
        job = session.get(Job, job_id)
        assert job is not None, f"job {job_id} does not exist"
        return job


def db_now(engine: Engine) -> dt.datetime:
    """The database clock (``clock_timestamp``: the real time, not a transaction's start)."""
    with engine.connect() as connection:
        return connection.scalar(select(func.clock_timestamp()))


def fetch_running(engine: Engine, worker_id: str = "test-fetcher") -> Job:
    """Take the next available job of ``default`` as a worker would: ``running``, attempt+1."""
    jobs = fetch_jobs(engine, "default", 1, worker_id)
    assert len(jobs) == 1, "no available job to fetch"
    return jobs[0]


def make_available(engine: Engine, job_id: int) -> None:
    """Force a rerun, as the rescuer would for a worker it presumed dead."""
    with engine.begin() as connection:
        connection.execute(
            text("UPDATE sa_job SET state = 'available', scheduled_at = now() WHERE id = :id"),
            {"id": job_id},
        )


# ------------------------------------------------------------------ waiting


def wait_until(
    predicate: Callable[[], T], *, timeout: float = 5.0, interval: float = 0.01, what: str = ""
) -> T:
    """Poll until ``predicate()`` is truthy; return it. Fails the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or predicate}")
        time.sleep(interval)


def wait_for_state(engine: Engine, job_id: int, state: JobState, *, timeout: float = 5.0) -> Job:
    last: list[Job] = []

    def reached() -> bool:
        last[:] = [get_job(engine, job_id)]
        return last[0].state is state

    try:
        wait_until(reached, timeout=timeout, interval=0.02)
    except AssertionError:
        seen = last[0].state.value if last else "nothing"
        raise AssertionError(
            f"job {job_id} did not become {state.value} within {timeout} s (last: {seen})"
        ) from None
    return last[0]


def wait_event(flag: threading.Event, what: str, timeout: float = 5.0) -> None:
    assert flag.wait(timeout), f"timed out after {timeout} s waiting for {what}"


# ------------------------------------------------------------------ effects of handlers

EFFECT_TABLE = "sa_jobs_test_effect"


def reset_effects(engine: Engine) -> None:
    """Create (once) and empty the table handlers write their effects to."""
    with engine.begin() as connection:
        connection.execute(
            text(
                f"CREATE TABLE IF NOT EXISTS {EFFECT_TABLE} ("
                " job_id bigint NOT NULL, attempt int NOT NULL, note text NOT NULL DEFAULT '')"
            )
        )
        connection.execute(text(f"TRUNCATE {EFFECT_TABLE}"))


_INSERT_EFFECT = text(
    f"INSERT INTO {EFFECT_TABLE} (job_id, attempt, note) VALUES (:job_id, :attempt, :note)"
)


def write_effect(session: Session | Connection, job: Job, note: str = "") -> None:
    session.execute(_INSERT_EFFECT, {"job_id": job.id, "attempt": job.attempt, "note": note})


async def write_effect_async(session: AsyncSession, job: Job, note: str = "") -> None:
    await session.execute(_INSERT_EFFECT, {"job_id": job.id, "attempt": job.attempt, "note": note})


def effects(engine: Engine) -> list[tuple[int, int, str]]:
    """``(job_id, attempt, note)`` of every committed effect."""
    with engine.connect() as connection:
        rows = connection.execute(
            text(f"SELECT job_id, attempt, note FROM {EFFECT_TABLE} ORDER BY job_id, attempt")
        )
        return [(row.job_id, row.attempt, row.note) for row in rows]


def same_transaction(engine: Engine, job_id: int) -> bool:
    """True when the job row and its effect row were last written by one transaction."""
    with engine.connect() as connection:
        job_xmin = connection.scalar(
            text("SELECT xmin::text FROM sa_job WHERE id = :id"), {"id": job_id}
        )
        effect_xmins = connection.scalars(
            text(f"SELECT xmin::text FROM {EFFECT_TABLE} WHERE job_id = :id"), {"id": job_id}
        ).all()
    return bool(effect_xmins) and all(x == job_xmin for x in effect_xmins)


# ------------------------------------------------------------------ statements


def _is_finish_statement(statement: str) -> bool:
    # sa_jobs.complete.jobs_finish: [WITH ...] UPDATE sa_job SET state=CAST(CASE ...
    # FROM jsonb_to_recordset(...) AS outcome
    return "UPDATE sa_job SET state=CAST(CASE" in statement and "AS outcome(" in statement


@contextmanager
def finish_statements(engine: Engine) -> Iterator[list[str]]:
    """Every ``jobs_finish`` statement sent through ``engine`` inside the block."""
    seen: list[str] = []
    lock = threading.Lock()

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if _is_finish_statement(statement):
            with lock:
                seen.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)
