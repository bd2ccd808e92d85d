"""``complete_in``: completing a job inside the caller's transaction, so the work's
database effects and the completion commit (or roll back) together, exactly once."""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time

import pytest
from sqlalchemy import Engine, delete
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import Job, JobState
from sa_jobs.errors import JobNotFoundError, JobStateError
from tests.helpers import (
    NO_DELAY,
    add_job,
    db_now,
    effects,
    fetch_one,
    get_job,
    make_available,
    make_worker,
    running,
    same_transaction,
    wait_event,
    wait_for_state,
    wait_stuck_handlers_returned,
    write_effect,
)


@sa_jobs.job_args(kind="complete_in_task", max_attempts=5)
class Task:
    n: int = 0


pytestmark = pytest.mark.usefixtures("effect_table")


def complete_with_effect(engine: Engine, job: Job, note: str = "") -> None:
    with Session(engine) as session, session.begin():
        write_effect(session, job, note)
        sa_jobs.complete_in(session, job)


# ------------------------------------------------------------------ the caller's transaction


def test_complete_in_completes_the_job_when_the_callers_transaction_commits(
    engine: Engine,
) -> None:
    job_id = add_job(engine, Task())
    job = fetch_one(engine)

    with Session(engine) as session, session.begin():
        write_effect(session, job, "work")
        sa_jobs.complete_in(session, job)
        assert job.state is JobState.COMPLETED  # reflected on the object at once
        # ... but nobody else sees it before the commit.
        assert get_job(engine, job_id).state is JobState.RUNNING
        assert effects(engine) == []

    completed = get_job(engine, job_id)
    assert completed.state is JobState.COMPLETED
    assert completed.finalized_at is not None
    assert completed.attempt == 1
    assert effects(engine) == [(job_id, 1, "work")]
    assert same_transaction(engine, job_id)


def test_complete_in_rolled_back_with_the_callers_transaction_leaves_the_job_running(
    engine: Engine,
) -> None:
    job_id = add_job(engine, Task())
    job = fetch_one(engine)

    with Session(engine) as session:
        session.begin()
        write_effect(session, job, "work")
        sa_jobs.complete_in(session, job)
        session.rollback()

    after = get_job(engine, job_id)
    assert (after.state, after.attempt) == (JobState.RUNNING, 1)
    assert after.finalized_at is None
    assert effects(engine) == []
    # The run can still be completed.
    complete_with_effect(engine, job)
    assert get_job(engine, job_id).state is JobState.COMPLETED


def test_completing_a_job_twice_is_a_no_op(engine: Engine) -> None:
    job_id = add_job(engine, Task())
    job = fetch_one(engine)

    with Session(engine) as session, session.begin():
        sa_jobs.complete_in(session, job)
        sa_jobs.complete_in(session, job)  # same transaction
    first = get_job(engine, job_id)

    with Session(engine) as session, session.begin():
        sa_jobs.complete_in(session, job)  # a later one

    again = get_job(engine, job_id)
    assert again.state is JobState.COMPLETED
    assert again.finalized_at == first.finalized_at
    assert again.errors == []


@pytest.mark.parametrize("how", ["available", "scheduled", "cancelled"])
def test_complete_in_on_a_job_that_is_not_running_raises_JobStateError(
    engine: Engine, how: str
) -> None:
    if how == "scheduled":
        job_id = add_job(engine, Task(), scheduled_at=db_now(engine) + dt.timedelta(hours=1))
    else:
        job_id = add_job(engine, Task())
    if how == "cancelled":
        with engine.begin() as connection:
            connection.exec_driver_sql(
                "UPDATE sa_job SET state = 'cancelled', finalized_at = now() WHERE id = %s",
                (job_id,),
            )
    job = get_job(engine, job_id)

    with (
        pytest.raises(JobStateError) as caught,
        Session(engine) as session,
        session.begin(),
    ):
        write_effect(session, job)
        sa_jobs.complete_in(session, job)

    assert str(caught.value) == (
        f"cannot complete job {job_id}: it is {how!r}, and complete needs one of running"
    )
    assert (caught.value.job_id, caught.value.state) == (job_id, how)
    assert get_job(engine, job_id).state.value == how
    assert effects(engine) == []


def test_complete_in_for_an_attempt_that_was_superseded_by_a_running_rerun_raises(
    engine: Engine,
) -> None:
    job_id = add_job(engine, Task())
    first = fetch_one(engine)
    make_available(engine, job_id)  # as if its worker had been presumed dead
    second = fetch_one(engine)
    assert (first.attempt, second.attempt) == (1, 2)

    with pytest.raises(JobStateError) as caught:
        complete_with_effect(engine, first, "stale")

    message = str(caught.value)
    assert f"cannot complete job {job_id}" in message
    assert "running its run 2, not run 1" in message
    assert effects(engine) == []
    after = get_job(engine, job_id)
    assert (after.state, after.attempt) == (JobState.RUNNING, 2)

    complete_with_effect(engine, second, "current")
    assert effects(engine) == [(job_id, 2, "current")]


def test_complete_in_for_an_attempt_superseded_by_a_completed_rerun_raises(
    engine: Engine,
) -> None:
    job_id = add_job(engine, Task())
    first = fetch_one(engine)
    make_available(engine, job_id)
    second = fetch_one(engine)
    complete_with_effect(engine, second, "attempt 2")

    with pytest.raises(JobStateError, match=f"cannot complete job {job_id}"):
        complete_with_effect(engine, first, "attempt 1, late")

    assert effects(engine) == [(job_id, 2, "attempt 2")]


def test_complete_in_on_a_job_that_no_longer_exists_raises_JobNotFoundError(
    engine: Engine,
) -> None:
    job_id = add_job(engine, Task())
    job = fetch_one(engine)
    with engine.begin() as connection:
        connection.execute(delete(Job).where(Job.id == job_id))

    with pytest.raises(JobNotFoundError):
        complete_with_effect(engine, job)
    assert effects(engine) == []


# ------------------------------------------------------------------ inside the worker


def test_complete_in_inside_a_handler_makes_the_workers_own_completion_a_no_op(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    job_id = add_job(engine, Task())
    finalized: list[object] = []
    worker = make_worker(engine)

    @worker.handler(Task)
    def handle(job: Job) -> None:  # no session parameter: the handler completes it itself
        complete_with_effect(engine, job, "in handler")
        finalized.append(get_job(engine, job.id).finalized_at)
        assert job.state is JobState.COMPLETED

    with caplog.at_level(logging.INFO, logger="sa_jobs"):
        worker.run_until_idle()

    job = get_job(engine, job_id)
    assert (job.state, job.attempt) == (JobState.COMPLETED, 1)
    assert job.errors == []
    assert job.finalized_at == finalized[0]  # the worker's completion changed nothing
    assert effects(engine) == [(job_id, 1, "in handler")]
    problems = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert problems == [], [r.getMessage() for r in problems]


def test_a_session_handler_writes_its_effects_exactly_once_under_a_forced_rerun(
    engine: Engine,
) -> None:
    # Attempt 1 writes, then hangs past its timeout and grace: the worker fails it
    # without waiting and runs attempt 2, which writes and commits. When attempt 1
    # finally returns, its transaction must not commit.
    job_id = add_job(engine, Task())
    woke_up = threading.Event()
    worker = make_worker(engine, retry_policy=NO_DELAY, interrupt_grace=0.2)

    @worker.handler(Task, timeout=0.2)
    def handle(job: Job, session: Session) -> None:
        write_effect(session, job, f"attempt {job.attempt}")
        if job.attempt == 1:
            time.sleep(1.0)  # ignores cancellation
            woke_up.set()

    with running(worker):
        wait_for_state(engine, job_id, JobState.COMPLETED, timeout=3)
        wait_event(woke_up, "attempt 1 to return", timeout=3)
        # Attempt 1's transaction is over (rolled back, or wrongly committed) once it returned.
        wait_stuck_handlers_returned(worker)

    job = get_job(engine, job_id)
    assert (job.state, job.attempt) == (JobState.COMPLETED, 2)
    assert effects(engine) == [(job_id, 2, "attempt 2")]
    assert same_transaction(engine, job_id)
