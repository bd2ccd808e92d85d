"""Limits across worker processes: three processes, each with more slots than any limit,
never run more jobs of a limited queue or kind at once than the limit allows, nor start
more jobs of a rate-limited queue per period; and they do reach the limits, while the
queue without a limit runs as wide as the processes allow."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, func, select, text
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import Job, JobState
from tests.acceptance.conftest import Spawn
from tests.acceptance.limits_worker_app import (
    KIND_LIMIT,
    QUEUE_LIMIT,
    RATE,
    RATE_PERIOD,
    RUNS_DDL,
    RUNS_TABLE,
    CappedJob,
    SleepJob,
)
from tests.helpers import count_jobs, wait_until

APP = "tests.acceptance.limits_worker_app"
PROCESSES = 3
LIMITED_JOBS = 120
CAPPED_JOBS = 60
RATED_JOBS = 40
OTHER_JOBS = 120
BEHIND_JOBS = 30
TOTAL = LIMITED_JOBS + 2 * CAPPED_JOBS + BEHIND_JOBS + RATED_JOBS + OTHER_JOBS


@pytest.fixture
def runs_table(engine: Engine) -> Iterator[None]:
    with engine.begin() as connection:
        connection.execute(text(f"DROP TABLE IF EXISTS {RUNS_TABLE}"))
        connection.execute(text(RUNS_DDL))
    yield
    with engine.begin() as connection:
        connection.execute(text(f"DROP TABLE IF EXISTS {RUNS_TABLE}"))


def peak_overlap(runs: Iterable[Any]) -> int:
    """The most handler runs in progress at one instant (an end before a start at a tie)."""
    events = sorted(
        (run.at, 1 if run.event == "start" else -1) for run in runs
    )  # -1 sorts first at a tie
    running = peak = 0
    for _, change in events:
        running += change
        peak = max(peak, running)
    return peak


class RunningSampler:
    """Counts running jobs of the limited queue and kind in the database, every few ms,
    while the test runs: each count is one statement's snapshot."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.peaks = {"queue": 0, "kind": 0}
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RunningSampler:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        running = Job.state == JobState.RUNNING
        statement = select(
            select(func.count()).where(running, Job.queue == "limited").scalar_subquery(),
            select(func.count()).where(running, Job.kind == "limits_capped").scalar_subquery(),
        )
        with self.engine.connect() as connection:
            while not self._stop.wait(0.005):
                queue, kind = connection.execute(statement).one()
                connection.rollback()
                self.peaks["queue"] = max(self.peaks["queue"], queue)
                self.peaks["kind"] = max(self.peaks["kind"], kind)
                self.samples += 1


def insert_jobs(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        sa_jobs.insert_many(session, [SleepJob(0.03)] * LIMITED_JOBS, queue="limited")
        sa_jobs.insert_many(session, [CappedJob(0.03)] * CAPPED_JOBS, queue="mixed_a")
        sa_jobs.insert_many(session, [CappedJob(0.03)] * CAPPED_JOBS, queue="mixed_b")
        # Jobs of an unlimited kind behind the capped ones, in the same queue.
        sa_jobs.insert_many(session, [SleepJob(0.01)] * BEHIND_JOBS, queue="mixed_a")
        sa_jobs.insert_many(session, [SleepJob(0.01)] * RATED_JOBS, queue="rated")
        sa_jobs.insert_many(session, [SleepJob(0.03)] * OTHER_JOBS, queue="other")


@pytest.mark.usefixtures("runs_table", "no_workers_or_leader")
def test_limits_hold_across_three_worker_processes(engine: Engine, spawn: Spawn) -> None:
    apps = [spawn(f"limits-{n}", app=APP) for n in range(PROCESSES)]
    for app in apps:
        app.wait_ready(engine, timeout=20)

    with RunningSampler(engine) as sampler:
        insert_jobs(engine)
        wait_until(
            lambda: count_jobs(engine, JobState.COMPLETED) == TOTAL,
            timeout=60,
            interval=0.1,
            what=f"all {TOTAL} jobs to complete",
        )
    for app in apps:
        assert app.stop() == 0, app.output()

    with engine.connect() as connection:
        runs = connection.execute(
            text(f"SELECT job_id, kind, queue, pid, event, at FROM {RUNS_TABLE}")
        ).all()
        jobs = connection.execute(select(Job.id, Job.queue, Job.attempted_at, Job.attempt)).all()
    assert len(runs) == 2 * TOTAL, "a job ran more than once"
    assert {job.attempt for job in jobs} == {1}

    limited = [run for run in runs if run.queue == "limited"]
    capped = [run for run in runs if run.kind == "limits_capped"]
    other = [run for run in runs if run.queue == "other"]

    # Never more than the limit, measured from inside the handlers and in the database.
    assert sampler.samples > 50
    assert peak_overlap(limited) <= QUEUE_LIMIT
    assert sampler.peaks["queue"] <= QUEUE_LIMIT
    assert peak_overlap(capped) <= KIND_LIMIT
    assert sampler.peaks["kind"] <= KIND_LIMIT
    # ... and the limits are reached, by jobs of more than one process.
    assert peak_overlap(limited) == QUEUE_LIMIT
    assert peak_overlap(capped) == KIND_LIMIT
    assert len({run.pid for run in limited}) > 1
    assert len({run.pid for run in capped}) > 1
    assert {run.queue for run in capped} == {"mixed_a", "mixed_b"}
    # A kind at its limit does not hold up the other kinds of its queue.
    behind = [run for run in runs if run.queue == "mixed_a" and run.kind == "limits_sleep"]
    assert max(run.at for run in behind) < max(run.at for run in capped)
    # The queue without a limit runs wider than any limit.
    assert peak_overlap(other) > QUEUE_LIMIT + 2

    # Rate: in any RATE_PERIOD-long stretch, at most RATE starts (attempted_at is the
    # moment a start was counted at), and the rate is used: some stretch has RATE.
    rated = sorted(job.attempted_at for job in jobs if job.queue == "rated")
    assert len(rated) == RATED_JOBS
    per_stretch = [
        sum(1 for other_start in rated if start - RATE_PERIOD < other_start <= start)
        for start in rated
    ]
    assert max(per_stretch) <= RATE
    assert max(per_stretch) == RATE
    # 40 starts at 8 per second: the last is at least 4 periods after the first.
    assert rated[-1] - rated[0] >= (RATED_JOBS // RATE - 1) * RATE_PERIOD
    assert len({run.pid for run in runs if run.queue == "rated"}) > 1
