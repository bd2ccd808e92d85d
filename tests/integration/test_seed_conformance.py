"""Where users compare sa_jobs with River, Faktory and Graphile Worker, it behaves like
them: runs fenced by their own counter, River's unique edges, batches in input order, and
small transitions that leave things alone."""

from __future__ import annotations

import datetime as dt

import attrs
import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import Job, JobState, SequenceOpts, UniqueOpts
from sa_jobs._base.records import Ending
from sa_jobs.errors import JobStateError
from sa_jobs.worker.producer import fetch_jobs
from tests.factories import job_row
from tests.helpers import (
    add_job,
    db_now,
    fetch_one,
    finish_run,
    get_job,
    make_worker,
    running,
    wait_for_state,
    xmin,
)


@sa_jobs.job_args(kind="conformance_task")
class Task:
    name: str = ""


# ------------------------------------------------------------------ 1. runs and attempts


def test_a_late_result_of_an_earlier_run_with_the_same_attempt_is_refused(engine: Engine) -> None:
    # A shutdown gives the attempt back, so the next run has attempt 1 again: only
    # run_count tells the two runs apart.
    job_id = add_job(engine, Task())
    first = fetch_one(engine)
    assert finish_run(engine, first, Ending.RETURNED)
    second = fetch_one(engine)
    assert (first.attempt, second.attempt) == (1, 1)
    assert (first.run_count, second.run_count) == (1, 2)
    assert finish_run(engine, first, Ending.COMPLETED) == []  # the stale run changes nothing
    with (
        Session(engine) as session,
        session.begin(),
        pytest.raises(JobStateError, match="running its run 2, not run 1"),
    ):
        sa_jobs.complete_in(session, first)
    assert get_job(engine, job_id).state is JobState.RUNNING
    assert finish_run(engine, second, Ending.COMPLETED)
    assert get_job(engine, job_id).state is JobState.COMPLETED


# ------------------------------------------------------------------ 3. River's unique edges


@attrs.frozen
class Customer:
    id: int = sa_jobs.field(unique=True)
    name: str = ""  # not marked: must not split keys


@sa_jobs.job_args(kind="conformance_nested_unique", unique=UniqueOpts(by_args=True))
class Reconcile:
    customer: Customer = sa_jobs.field(unique=True)
    trace_id: str = ""


def test_a_marked_field_holding_a_class_with_marked_fields_counts_only_those(
    engine: Engine,
) -> None:
    with Session(engine, expire_on_commit=False) as session, session.begin():
        first = sa_jobs.insert(session, Reconcile(Customer(1, "Ada"), "t1"))
        renamed = sa_jobs.insert(session, Reconcile(Customer(1, "Ada L."), "t2"))
        other = sa_jobs.insert(session, Reconcile(Customer(2, "Ada"), "t3"))
    assert not first.unique_skipped_as_duplicate
    assert renamed.unique_skipped_as_duplicate and renamed.job.id == first.job.id
    assert not other.unique_skipped_as_duplicate


def test_insert_marks_the_returned_job_of_a_skipped_duplicate(engine: Engine) -> None:
    opts = UniqueOpts(by_args=True)
    with Session(engine, expire_on_commit=False) as session, session.begin():
        first = sa_jobs.insert(session, Task("x"), unique=opts)
        assert first.job.unique_skipped_as_duplicate is False
        again = sa_jobs.insert(session, Task("x"), unique=opts)
        # The session's one object for the row now says what the last insert did.
        assert again.job is first.job
        assert again.job.unique_skipped_as_duplicate is True
        assert (first.unique_skipped_as_duplicate, again.unique_skipped_as_duplicate) == (
            False,
            True,
        )
        fresh = sa_jobs.insert(session, Task("y"), unique=opts)
        assert fresh.job.unique_skipped_as_duplicate is False
    with Session(engine) as session, session.begin():  # a job met in another session
        met = sa_jobs.insert(session, Task("y"), unique=opts)
        assert met.job.unique_skipped_as_duplicate is True


# ------------------------------------------------------------------ 4. a batch keeps its order

NAMES = [f"job-{n:02}" for n in range(40)]


def test_a_unique_batch_takes_ids_in_input_order_and_runs_first_in_first_out(
    engine: Engine,
) -> None:
    with Session(engine, expire_on_commit=False) as session, session.begin():
        results = sa_jobs.insert_many(
            session, [Task(name) for name in NAMES], unique=UniqueOpts(by_args=True)
        )
    ids = [r.job.id for r in results]
    assert ids == sorted(ids)
    # The keys are hashes, so key order differs from input order: it was not luck.
    keys = [job_row(engine, job_id).unique_key for job_id in ids]
    assert keys != sorted(keys)
    fetched = [job.args_json["name"] for job in fetch_jobs(engine, "default", 100, "fifo")]
    assert fetched == NAMES


@sa_jobs.job_args(
    kind="conformance_sequenced_unique",
    unique=UniqueOpts(by_args=True),
    sequence=SequenceOpts(),
)
class Step:
    name: str


def test_unique_and_sequenced_rows_of_one_batch_start_in_input_order(engine: Engine) -> None:
    order = ["e", "d", "c", "b", "a", "f"]
    with Session(engine) as session, session.begin():
        sa_jobs.insert_many(session, [Step(name) for name in order])
    started = []
    for _ in order:
        job = fetch_one(engine)
        started.append(job.args_json["name"])
        assert finish_run(engine, job, Ending.COMPLETED)
    assert started == order


# ------------------------------------------------------------------ 5. transitions left alone


def test_a_job_cancelled_after_its_handler_raised_keeps_its_scheduled_at(engine: Engine) -> None:
    job_id = add_job(engine, Task())
    before = get_job(engine, job_id).scheduled_at
    job = fetch_one(engine)
    with Session(engine) as session, session.begin():
        sa_jobs.cancel_job(session, job_id)  # a cancel request for a running job
    error = {"attempt": 1, "error": "Boom"}
    assert finish_run(engine, job, Ending.FAILED, delay=3600.0, error=error)
    after = get_job(engine, job_id)
    assert after.state is JobState.CANCELLED
    assert after.scheduled_at == before


def test_a_discarded_job_keeps_its_scheduled_at_too(engine: Engine) -> None:
    job_id = add_job(engine, Task(), max_attempts=1)
    before = get_job(engine, job_id).scheduled_at
    job = fetch_one(engine)
    assert finish_run(engine, job, Ending.FAILED, delay=3600.0, error={"attempt": 1, "error": "E"})
    after = get_job(engine, job_id)
    assert (after.state, after.scheduled_at) == (JobState.DISCARDED, before)


def test_retry_job_of_an_available_job_changes_nothing(engine: Engine) -> None:
    job_id = add_job(engine, Task())
    before, version = job_row(engine, job_id), xmin(engine, job_id)
    with Session(engine, expire_on_commit=False) as session, session.begin():
        job = sa_jobs.retry_job(session, job_id)
    assert job.state is JobState.AVAILABLE
    assert job_row(engine, job_id) == before
    assert xmin(engine, job_id) == version  # not even rewritten


def test_retry_job_only_ever_moves_scheduled_at_earlier(engine: Engine) -> None:
    later = add_job(
        engine, Task("later"), scheduled_at=dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    )
    with Session(engine, expire_on_commit=False) as session, session.begin():
        job = sa_jobs.retry_job(session, later)
    assert job.state is JobState.AVAILABLE
    assert job.scheduled_at <= db_now(engine)
    # A failed job whose retry was due long ago keeps its (earlier) place in line.
    failed = add_job(engine, Task("failed"))
    run = fetch_one(engine)
    assert finish_run(engine, run, Ending.FAILED, delay=0.0, error={"attempt": 1, "error": "E"})
    due = get_job(engine, failed).scheduled_at
    with Session(engine, expire_on_commit=False) as session, session.begin():
        assert sa_jobs.retry_job(session, failed).scheduled_at == due


# ------------------------------------------------------------------ the worker, end to end


def test_a_snoozed_then_failing_job_waits_one_second_not_sixteen(engine: Engine) -> None:
    # River: a snooze spends no attempt and records no error, so the first real failure
    # backs off (0 + 1) ** 4 = 1 s.
    job_id = add_job(engine, Task())
    worker = make_worker(engine, retry_policy=sa_jobs.ExponentialRetry(jitter=0.0))

    @worker.handler(Task)
    def handle(job: Job) -> None:
        if job.run_count == 1:
            raise sa_jobs.errors.JobSnooze(0)
        raise RuntimeError("fails after the snooze")

    with running(worker):
        job = wait_for_state(engine, job_id, JobState.RETRYABLE)
    failed_at = dt.datetime.fromisoformat(job.errors[-1]["at"])
    assert (job.attempt, job.max_attempts, job.run_count) == (1, 25, 2)
    assert abs((job.scheduled_at - failed_at).total_seconds() - 1.0) < 0.2
