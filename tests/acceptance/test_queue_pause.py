"""A pause holds across worker processes and their restarts; a resume wakes them at once."""

from __future__ import annotations

import signal
import time

from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import Job, JobState
from tests.acceptance.conftest import Spawn
from tests.acceptance.worker_app import QuickJob
from tests.helpers import add_jobs, make_worker, running, wait_listening, wait_until

#: Far longer than the test: a paused producer could only fetch by a poll, and a resumed
#: one is woken by the resume notification, not by a poll.
SLOW_POLL = "30"


def counts(engine: Engine, queue: str) -> dict[JobState, int]:
    with engine.connect() as connection:
        rows = connection.execute(
            select(Job.state, func.count()).where(Job.queue == queue).group_by(Job.state)
        )
        return {state: n for state, n in rows}


def test_no_process_or_thread_fetches_a_paused_queue_across_a_restart_and_resume_wakes_them(
    engine: Engine, spawn: Spawn
) -> None:
    add_jobs(engine, [QuickJob(0)], queue="mail")
    with Session(engine) as session, session.begin():
        sa_jobs.pause_queue(session, "mail")
    env = {"SA_JOBS_TEST_QUEUES": "default,mail", "SA_JOBS_TEST_POLL": SLOW_POLL}
    process = spawn("paused-1", **env)
    threads = [make_worker(engine, queues={"default": 2, "mail": 2}, poll_interval=30.0)]
    threads.append(make_worker(engine, queues={"default": 2, "mail": 2}, poll_interval=30.0))
    for worker in threads:
        worker.handler(QuickJob)(lambda job: None)

    with running(threads[0]), running(threads[1]):
        for worker in threads:
            wait_listening(worker)
        process.wait_ready(engine)
        add_jobs(engine, [QuickJob(n) for n in range(40)], queue="mail")
        add_jobs(engine, [QuickJob(n) for n in range(40)], queue="default")
        wait_until(lambda: counts(engine, "default") == {JobState.COMPLETED: 40}, timeout=15)
        assert counts(engine, "mail") == {JobState.AVAILABLE: 41}

        # The process restarts: the pause is in the database, not in its memory.
        process.signal(signal.SIGTERM)
        assert process.wait(15) == 0
        process = spawn("paused-2", **env)
        process.wait_ready(engine)
        add_jobs(engine, [QuickJob(n) for n in range(10)], queue="default")
        wait_until(lambda: counts(engine, "default") == {JobState.COMPLETED: 50}, timeout=15)
        assert counts(engine, "mail") == {JobState.AVAILABLE: 41}

        resumed_at = time.monotonic()
        with Session(engine) as session, session.begin():
            sa_jobs.resume_queue(session, "mail")
        wait_until(lambda: counts(engine, "mail") == {JobState.COMPLETED: 41}, timeout=10)
        assert time.monotonic() - resumed_at < 10  # a poll would take 30 s

    with engine.connect() as connection:
        workers_of_mail = set(
            connection.scalars(
                select(func.unnest(Job.attempted_by)).where(Job.queue == "mail").distinct()
            )
        )
    assert "paused-1" not in workers_of_mail  # it ran only while "mail" was paused
