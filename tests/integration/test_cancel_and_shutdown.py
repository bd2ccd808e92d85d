"""Cancelling and retrying jobs from outside the worker, and stopping a worker with jobs
in flight."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import time

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import Job, JobState
from sa_jobs._base.states import CANCEL_ATTEMPTED_KEY
from sa_jobs.errors import JobCancelledError, JobStateError, WorkerShutdownError
from tests.helpers import (
    SLOW_HEARTBEAT,
    add_job,
    cancel,
    db_now,
    fetch_one,
    get_job,
    make_worker,
    retry,
    running,
    wait_event,
    wait_for_state,
    wait_listening,
    wait_until,
)


@sa_jobs.job_args(kind="cancel_task", max_attempts=5)
class Task:
    n: int = 0


class Boom(Exception):
    pass


# ------------------------------------------------------------------ cancel_job


def test_cancelling_an_available_job_cancels_it_at_once_and_it_never_runs(
    engine: Engine,
) -> None:
    job_id = add_job(engine, Task())
    calls: list[int] = []

    job = cancel(engine, job_id)

    assert job.state is JobState.CANCELLED
    assert job.finalized_at is not None
    assert get_job(engine, job_id).state is JobState.CANCELLED

    worker = make_worker(engine)

    @worker.handler(Task)
    def handle(job: Job) -> None:
        calls.append(job.id)

    worker.run_until_idle()
    assert calls == []
    assert get_job(engine, job_id).state is JobState.CANCELLED


def test_cancelling_a_scheduled_job_cancels_it_at_once(engine: Engine) -> None:
    later = db_now(engine) + dt.timedelta(hours=1)
    job_id = add_job(engine, Task(), scheduled_at=later)
    assert get_job(engine, job_id).state is JobState.SCHEDULED

    job = cancel(engine, job_id)

    assert job.state is JobState.CANCELLED
    assert job.finalized_at is not None
    assert job.attempt == 0


def test_cancelling_a_running_async_job_cancels_its_handler_through_notify(
    engine: Engine,
) -> None:
    job_id = add_job(engine, Task())
    started = threading.Event()
    events: list[str] = []
    # Heartbeats every 5 s: a cancel seen within a second came through NOTIFY. A long
    # grace: the run must end because the task was cancelled, not given up on.
    worker = make_worker(engine, maintenance=SLOW_HEARTBEAT, interrupt_grace=5.0)

    @worker.handler(Task, timeout=None)
    async def sleepy(job: Job) -> None:
        started.set()
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            events.append("cancelled")
            raise
        events.append("woke up")

    with running(worker):
        wait_listening(worker)
        wait_event(started, "the handler to start")
        asked = time.monotonic()
        marked = cancel(engine, job_id)
        assert marked.state is JobState.RUNNING  # only marked; the worker ends it
        assert CANCEL_ATTEMPTED_KEY in marked.metadata_
        job = wait_for_state(engine, job_id, JobState.CANCELLED, timeout=3)
        took = time.monotonic() - asked

    assert took < 1.0, f"cancel took {took:.2f} s"
    assert events == ["cancelled"]
    assert job.finalized_at is not None
    assert job.attempt == 1
    assert [(e["attempt"], e["error"]) for e in job.errors] == [
        (1, f"JobCancelledError: job {job_id} was cancelled")
    ]


def test_cancelling_a_running_sync_job_that_polls_job_cancelled_cancels_it(
    engine: Engine,
) -> None:
    job_id = add_job(engine, Task())
    started = threading.Event()
    raised: list[type[BaseException]] = []
    worker = make_worker(engine, maintenance=SLOW_HEARTBEAT, interrupt_grace=5.0)

    @worker.handler(Task, timeout=None)
    def polite(job: Job) -> None:
        started.set()
        deadline = time.monotonic() + 10
        while not job.cancelled and time.monotonic() < deadline:
            time.sleep(0.01)  # a handler that looks at job.cancelled between steps
        try:
            job.check_cancelled()
        except BaseException as exc:
            raised.append(type(exc))
            raise

    with running(worker):
        wait_listening(worker)
        wait_event(started, "the handler to start")
        asked = time.monotonic()
        cancel(engine, job_id)
        job = wait_for_state(engine, job_id, JobState.CANCELLED, timeout=3)
        took = time.monotonic() - asked

    assert took < 1.0, f"cancel took {took:.2f} s"
    assert raised == [JobCancelledError]
    assert job.errors[0]["error"] == f"JobCancelledError: job {job_id} was cancelled"


def test_a_running_job_that_finishes_its_work_despite_a_cancel_request_ends_completed(
    engine: Engine,
) -> None:
    # docs/dev/decisions.md: a cancel request that the handler finishes anyway ends completed.
    job_id = add_job(engine, Task())
    started, release = threading.Event(), threading.Event()
    runs: list[Job] = []
    worker = make_worker(engine)

    @worker.handler(Task, timeout=None)
    def finishes(job: Job) -> None:
        runs.append(job)
        started.set()
        wait_event(release, "the test to release the handler")

    with running(worker):
        wait_event(started, "the handler to start")
        cancel(engine, job_id)
        wait_until(lambda: runs[0].cancelled, what="the cancel request to reach the handler")
        release.set()
        job = wait_for_state(engine, job_id, JobState.COMPLETED, timeout=3)

    assert job.errors == []


def test_a_cancel_request_missed_by_notify_is_found_by_the_next_heartbeat(
    engine: Engine,
) -> None:
    job_id = add_job(engine, Task())
    started = threading.Event()
    worker = make_worker(engine, interrupt_grace=5.0)  # heartbeats every 0.2 s

    @worker.handler(Task, timeout=None)
    async def sleepy(job: Job) -> None:
        started.set()
        await asyncio.sleep(10)

    with running(worker):
        wait_event(started, "the handler to start")
        # What cancel_job writes, without its NOTIFY.
        with engine.begin() as connection:
            connection.execute(
                text(
                    "UPDATE sa_job SET metadata = metadata"
                    " || jsonb_build_object(CAST(:key AS text), now()) WHERE id = :id"
                ),
                {"key": CANCEL_ATTEMPTED_KEY, "id": job_id},
            )
        job = wait_for_state(engine, job_id, JobState.CANCELLED, timeout=2)

    assert job.errors[0]["error"].startswith("JobCancelledError")


def test_a_running_job_asked_to_cancel_ends_cancelled_even_if_it_then_fails(
    engine: Engine,
) -> None:
    job_id = add_job(engine, Task())
    started, release = threading.Event(), threading.Event()
    worker = make_worker(engine)

    @worker.handler(Task, timeout=None)
    def fails(job: Job) -> None:
        started.set()
        wait_event(release, "the test to release the handler")
        raise Boom("failed anyway")

    with running(worker):
        wait_event(started, "the handler to start")
        cancel(engine, job_id)
        release.set()
        job = wait_for_state(engine, job_id, JobState.CANCELLED, timeout=3)

    assert job.finalized_at is not None


def test_cancelling_a_completed_job_is_a_no_op_that_returns_it(engine: Engine) -> None:
    job_id = add_job(engine, Task())
    worker = make_worker(engine)

    @worker.handler(Task)
    def handle(job: Job) -> None:
        pass

    worker.run_until_idle()
    before = get_job(engine, job_id)
    assert before.state is JobState.COMPLETED

    job = cancel(engine, job_id)

    assert job.id == job_id
    assert job.state is JobState.COMPLETED
    assert job.finalized_at == before.finalized_at
    assert CANCEL_ATTEMPTED_KEY not in job.metadata_
    assert CANCEL_ATTEMPTED_KEY not in get_job(engine, job_id).metadata_


# ------------------------------------------------------------------ retry_job


def test_retrying_a_discarded_job_makes_it_available_with_one_more_attempt(
    engine: Engine,
) -> None:
    job_id = add_job(engine, Task(), max_attempts=1)
    worker = make_worker(engine)

    @worker.handler(Task)
    def explode(job: Job) -> None:
        raise Boom

    worker.run_until_idle()
    assert get_job(engine, job_id).state is JobState.DISCARDED

    job = retry(engine, job_id)

    assert job.state is JobState.AVAILABLE
    assert (job.attempt, job.max_attempts) == (1, 2)
    assert job.finalized_at is None
    assert len(job.errors) == 1  # history is kept

    worker = make_worker(engine)
    attempts: list[int] = []

    @worker.handler(Task)
    def succeed(job: Job) -> None:
        attempts.append(job.attempt)

    worker.run_until_idle()
    assert attempts == [2]
    assert get_job(engine, job_id).state is JobState.COMPLETED


def test_retrying_a_running_job_raises_JobStateError_and_changes_nothing(
    engine: Engine,
) -> None:
    job_id = add_job(engine, Task())
    fetch_one(engine)

    with (
        pytest.raises(JobStateError, match=f"cannot retry job {job_id}: it is 'running'"),
        Session(engine) as session,
        session.begin(),
    ):
        sa_jobs.retry_job(session, job_id)

    job = get_job(engine, job_id)
    assert (job.state, job.attempt, job.max_attempts) == (JobState.RUNNING, 1, 5)


# ------------------------------------------------------------------ shutdown


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_stop_waits_for_a_running_job_to_finish_and_writes_its_completion(
    engine: Engine, flavour: str
) -> None:
    job_id = add_job(engine, Task())
    started, finished = threading.Event(), threading.Event()
    worker = make_worker(engine)

    if flavour == "sync":

        @worker.handler(Task)
        def slow(job: Job) -> None:
            started.set()
            time.sleep(0.4)  # the job's work, which stop() must wait for
            finished.set()

    else:

        @worker.handler(Task)
        async def slow_async(job: Job) -> None:
            started.set()
            await asyncio.sleep(0.4)
            finished.set()

    worker.start()
    try:
        wait_event(started, "the handler to start")
        assert not finished.is_set()
        worker.stop()
        assert finished.is_set()
    finally:
        worker.stop(cancel=True)

    job = get_job(engine, job_id)
    assert (job.state, job.attempt) == (JobState.COMPLETED, 1)


def test_stop_with_cancel_returns_a_running_async_job_without_spending_an_attempt(
    engine: Engine,
) -> None:
    job_id = add_job(engine, Task(), max_attempts=5)
    started = threading.Event()
    events: list[str] = []
    worker = make_worker(engine, interrupt_grace=5.0)

    @worker.handler(Task)
    async def sleepy(job: Job) -> None:
        started.set()
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            events.append("cancelled")
            raise
        events.append("woke up")

    worker.start()
    try:
        wait_event(started, "the handler to start")
        asked = time.monotonic()
        worker.stop(cancel=True)
        took = time.monotonic() - asked
    finally:
        worker.stop(cancel=True)

    assert events == ["cancelled"]
    assert took < 2.0  # the task was cancelled; nobody waited out the 5 s grace
    job = get_job(engine, job_id)
    assert job.state is JobState.AVAILABLE
    # River: the attempt is given back, max_attempts never changes.
    assert (job.attempt, job.max_attempts, job.run_count) == (0, 5, 1)
    assert job.errors == []
    assert job.finalized_at is None


def test_stop_with_cancel_asked_while_a_plain_stop_waits_escalates_it(
    engine: Engine,
) -> None:
    job_id = add_job(engine, Task(), max_attempts=5)
    started = threading.Event()
    raised: list[type[BaseException]] = []
    worker = make_worker(engine, interrupt_grace=5.0)

    @worker.handler(Task, timeout=None)
    def polite(job: Job) -> None:
        started.set()
        try:
            for _ in range(1000):
                job.check_cancelled()
                time.sleep(0.01)  # ten seconds of work in small steps
        except BaseException as exc:
            raised.append(type(exc))
            raise

    worker.start()
    plain_stop = threading.Thread(target=worker.stop, name="plain-stop")
    try:
        wait_event(started, "the handler to start")
        plain_stop.start()
        time.sleep(0.2)  # time for a plain stop() that did not wait for the job to return
        assert plain_stop.is_alive()  # waiting for the job
        asked = time.monotonic()
        worker.stop(cancel=True)
        plain_stop.join(timeout=3)
        took = time.monotonic() - asked
        assert not plain_stop.is_alive()
    finally:
        worker.stop(cancel=True)
        plain_stop.join(timeout=5)

    assert raised == [WorkerShutdownError]
    assert took < 2.0
    job = get_job(engine, job_id)
    assert job.state is JobState.AVAILABLE
    assert (job.attempt, job.max_attempts) == (0, 5)
    assert job.errors == []


def test_stop_with_cancel_settles_a_sync_handler_that_ignores_it_after_the_grace(
    engine: Engine,
) -> None:
    job_id = add_job(engine, Task(), max_attempts=5)
    started, woke_up = threading.Event(), threading.Event()
    worker = make_worker(engine, interrupt_grace=0.3)

    handler_threads: list[threading.Thread] = []

    @worker.handler(Task, timeout=None)
    def stubborn(job: Job) -> None:
        handler_threads.append(threading.current_thread())
        started.set()
        time.sleep(1.5)  # never looks at job.cancelled
        woke_up.set()

    worker.start()
    try:
        wait_event(started, "the handler to start")
        asked = time.monotonic()
        worker.stop(cancel=True)
        took = time.monotonic() - asked
    finally:
        worker.stop(cancel=True)

    assert not woke_up.is_set()  # stop() did not wait for the handler...
    assert took > 0.25  # ... but gave it the grace period
    job = get_job(engine, job_id)
    assert job.state is JobState.AVAILABLE
    assert (job.attempt, job.max_attempts) == (0, 5)

    wait_event(woke_up, "the stuck handler to return", timeout=3)
    # Its thread ends once the late return is dealt with (the pool was shut down).
    (thread,) = handler_threads
    wait_until(lambda: not thread.is_alive(), what="the stuck handler's thread to end")
    assert get_job(engine, job_id).state is JobState.AVAILABLE
