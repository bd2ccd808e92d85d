"""A pause holds across worker processes and their restarts, and from its commit on even
while they drain the queue; a resume wakes them at once."""

from __future__ import annotations

import datetime as dt
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


MAIL_JOBS = 1500
DRAINERS = 3


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


def db_clock(engine: Engine) -> dt.datetime:
    """The database's ``clock_timestamp()``: the clock ``attempted_at`` is read from."""
    with engine.connect() as connection:
        now: dt.datetime = connection.scalar(select(func.clock_timestamp()))
        return now


def attempts(engine: Engine, queue: str) -> list[tuple[int, dt.datetime | None]]:
    with engine.connect() as connection:
        rows = connection.execute(
            select(Job.attempt, Job.attempted_at).where(Job.queue == queue).order_by(Job.id)
        )
        return [(attempt, at) for attempt, at in rows]


def test_a_pause_mid_drain_stops_every_process_from_its_commit_on_and_resume_restarts_it(
    engine: Engine, spawn: Spawn
) -> None:
    """Three processes drain "mail" (30 slots, jobs of a few ms) and the queue is paused
    mid-drain. The bound: a fetch takes jobs only if its statement's snapshot did not see
    the pause, i.e. the statement began before the pause committed; its ``attempted_at``
    (the fetch's transaction time, ``now()``) is no later than the statement's start. So
    every job fetched despite the pause has ``attempted_at`` before the commit, and
    ``paused_by`` — the database's clock read after the commit returned — is later than
    the commit: no job of "mail" may have ``paused_by <= attempted_at`` until the resume.
    """
    env = {"SA_JOBS_TEST_QUEUES": "default,mail", "SA_JOBS_TEST_POLL": SLOW_POLL}
    processes = [spawn(f"drain-{n}", **env) for n in range(DRAINERS)]
    for process in processes:
        process.wait_ready(engine)
    add_jobs(engine, [QuickJob(n, sleep=0.004) for n in range(MAIL_JOBS)], queue="mail")
    wait_until(
        lambda: counts(engine, "mail").get(JobState.COMPLETED, 0) >= MAIL_JOBS // 5,
        timeout=15,
        interval=0.005,
        what="the drain to be under way",
    )

    with Session(engine) as session, session.begin():
        sa_jobs.pause_queue(session, "mail")
    paused_by = db_clock(engine)

    # Jobs running at the pause finish; what was waiting stays, however long we wait.
    wait_until(lambda: JobState.RUNNING not in counts(engine, "mail"), timeout=10)
    left = counts(engine, "mail").get(JobState.AVAILABLE, 0)
    # The other queue is worked meanwhile, by the same processes.
    add_jobs(engine, [QuickJob(n, sleep=0.004) for n in range(300)], queue="default")
    add_jobs(engine, [QuickJob(n) for n in range(10)], queue="mail")  # inserts still succeed
    wait_until(lambda: counts(engine, "default") == {JobState.COMPLETED: 300}, timeout=15)
    time.sleep(0.5)  # well past any fetch that was in flight at the pause
    late = [at for _, at in attempts(engine, "mail") if at is not None and at >= paused_by]
    assert late == [], f"{len(late)} jobs of the paused queue were fetched after the pause"
    assert counts(engine, "mail") == {
        JobState.COMPLETED: MAIL_JOBS - left,
        JobState.AVAILABLE: left + 10,
    }
    assert left > MAIL_JOBS // 5, "the pause came too late to interrupt the drain"

    resuming_at = db_clock(engine)
    with Session(engine) as session, session.begin():
        sa_jobs.resume_queue(session, "mail")
    wait_until(
        lambda: counts(engine, "mail") == {JobState.COMPLETED: MAIL_JOBS + 10},
        timeout=20,
        what="the drain to finish after the resume",
    )
    for process in processes:
        assert process.stop() == 0, process.output()

    mail = attempts(engine, "mail")
    assert {attempt for attempt, _ in mail} == {1}  # nothing ran twice
    started = sorted(at for _, at in mail if at is not None)
    before = [at for at in started if at < paused_by]
    during = [at for at in started if paused_by <= at < resuming_at]
    after = [at for at in started if at >= resuming_at]
    assert during == [], f"{len(during)} jobs of the paused queue were fetched after the pause"
    # The drain ran right up to the pause (so the bound is a test, not a formality) ...
    assert paused_by - before[-1] < dt.timedelta(seconds=1)
    assert len(before) + len(after) == MAIL_JOBS + 10
    # ... and the resume restarted it through NOTIFY, not a (30 s) poll.
    assert after[0] - resuming_at < dt.timedelta(seconds=2)
    default = [at for _, at in attempts(engine, "default")]
    assert all(at is not None and paused_by < at < resuming_at for at in default)
