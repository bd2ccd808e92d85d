"""What becomes of a job after its handler ran: completed, retried, discarded, snoozed,
cancelled — written by the worker against a real database."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import ExponentialRetry, Job, JobState
from sa_jobs.errors import JobCancel, JobSnooze
from tests.helpers import (
    NO_DELAY,
    FixedDelay,
    add_job,
    add_jobs,
    add_raw_job,
    db_now,
    effects,
    finish_statements,
    get_job,
    make_worker,
    recorded_statements,
    same_transaction,
    write_effect,
    write_effect_async,
)


@sa_jobs.job_args(kind="outcomes_task", max_attempts=5)
class Task:
    n: int = 0


@sa_jobs.job_args(kind="outcomes_other")
class Other:
    n: int = 0


@sa_jobs.job_args(kind="outcomes_unhandled")
class Unhandled:
    n: int = 0


class Boom(Exception):
    pass


def assert_due_after(
    job: Job, seconds: float, before: dt.datetime, after: dt.datetime, jitter: float = 0.0
) -> None:
    """``job.scheduled_at`` is ``seconds`` (+-jitter) after a moment between before/after."""
    low = before + dt.timedelta(seconds=seconds * (1 - jitter))
    high = after + dt.timedelta(seconds=seconds * (1 + jitter))
    assert low <= job.scheduled_at <= high, (
        f"due at {job.scheduled_at}, expected {seconds} s (+-{jitter:.0%}) after {before}..{after}"
    )


# ------------------------------------------------------------------ returning


def test_a_handler_that_returns_completes_its_job(engine: Engine) -> None:
    ids = add_jobs(engine, [Task(n=i) for i in range(3)])
    seen: list[Task] = []
    worker = make_worker(engine)

    @worker.handler(Task)
    def handle(job: Job) -> None:
        seen.append(job.args)

    worker.run_until_idle()

    assert sorted(seen, key=lambda args: args.n) == [Task(n=0), Task(n=1), Task(n=2)]
    for job_id in ids:
        job = get_job(engine, job_id)
        assert job.state is JobState.COMPLETED
        assert job.attempt == 1
        assert job.finalized_at is not None
        assert job.errors == []
        assert job.attempted_by is not None and job.attempted_by[-1] == worker.id


def test_completions_of_many_jobs_are_written_by_few_statements(engine: Engine) -> None:
    ids = add_jobs(engine, [Task(n=i) for i in range(200)])
    worker = make_worker(engine, queues={"default": 20})

    @worker.handler(Task)
    def handle(job: Job) -> None:
        pass

    with finish_statements(engine) as statements:
        worker.run_until_idle()

    with Session(engine) as session:
        states = session.execute(text("SELECT state, count(*) FROM sa_job GROUP BY state")).all()
    assert dict(states) == {"completed": len(ids)}
    # One statement per batch, not per job.
    assert 1 <= len(statements) < len(ids) // 4, f"{len(statements)} statements for 200 jobs"


def test_completing_unsequenced_jobs_takes_no_sequence_locks(engine: Engine) -> None:
    """The fetch loads ``sequence_key`` (a deferred column), so the completer knows these
    jobs are not sequenced and writes their outcomes in one autocommitted statement,
    without the sequence locks and bookkeeping a sequenced batch needs."""
    add_jobs(engine, [Task(n=i) for i in range(50)])
    worker = make_worker(engine, queues={"default": 10})

    @worker.handler(Task)
    def handle(job: Job[Task]) -> None:
        pass

    with recorded_statements(engine, lambda sql: "pg_advisory_xact_lock" in sql) as locks:
        worker.run_until_idle()

    with Session(engine) as session:
        states = session.execute(text("SELECT state, count(*) FROM sa_job GROUP BY state")).all()
    assert dict(states) == {"completed": 50}
    assert locks == []


def test_the_inline_completer_writes_one_statement_per_job(engine: Engine) -> None:
    # The counterpart of the batching test, and proof that the counting sees every write.
    add_jobs(engine, [Task(n=i) for i in range(20)])
    worker = make_worker(engine, queues={"default": 20}, completer="inline")

    @worker.handler(Task)
    def handle(job: Job) -> None:
        pass

    with finish_statements(engine) as statements:
        worker.run_until_idle()

    assert len(statements) == 20


# ------------------------------------------------------------------ failing


def test_a_handler_that_raises_leaves_the_job_retryable_with_the_error_recorded(
    engine: Engine,
) -> None:
    job_id = add_job(engine, Task(n=7))
    worker = make_worker(engine)  # the default retry policy: 1 s after attempt 1

    @worker.handler(Task)
    def explode(job: Job) -> None:
        raise Boom(f"boom {job.args.n}")

    before = db_now(engine)
    worker.run_until_idle()
    after = db_now(engine)

    job = get_job(engine, job_id)
    assert job.state is JobState.RETRYABLE
    assert job.attempt == 1
    assert job.finalized_at is None
    assert len(job.errors) == 1
    record = job.errors[0]
    assert record["attempt"] == 1
    assert record["error"] == "Boom: boom 7"
    assert "Traceback" in record["trace"]
    assert "in explode" in record["trace"] and "Boom: boom 7" in record["trace"]
    assert before <= dt.datetime.fromisoformat(record["at"]) <= after  # the database's clock
    # attempt ** 4 = 1 s, +-10%, counted from when the failure was written.
    assert_due_after(job, 1.0, before, after, jitter=0.1)


def test_default_backoff_counts_recorded_errors_to_the_fourth_power_with_ten_percent_jitter(
    engine: Engine,
) -> None:
    # River's policy: (errors + 1) ** 4. A first failure waits 1 s; a job on its fifth
    # attempt with two earlier errors (snoozed twice) waits 3 ** 4 = 81 s, not 5 ** 4.
    first = add_job(engine, Task(n=1))
    two_errors = [{"attempt": 1, "error": "E"}, {"attempt": 2, "error": "E"}]
    fifth = add_raw_job(
        engine, "outcomes_task", {"n": 3}, attempt=4, max_attempts=9, errors=two_errors
    )
    worker = make_worker(engine, retry_policy=ExponentialRetry())

    @worker.handler(Task)
    def explode(job: Job) -> None:
        raise Boom

    before = db_now(engine)
    worker.run_until_idle()
    after = db_now(engine)

    for job_id, attempt, base in ((first, 1, 1.0), (fifth, 5, 81.0)):
        job = get_job(engine, job_id)
        assert (job.state, job.attempt) == (JobState.RETRYABLE, attempt)
        assert job.errors[-1]["error"] == "Boom: Boom"
        assert_due_after(job, base, before, after, jitter=0.1)


def test_a_job_is_discarded_once_its_attempts_are_spent(engine: Engine) -> None:
    job_id = add_job(engine, Task(n=1), max_attempts=3)
    calls: list[int] = []
    worker = make_worker(engine, retry_policy=NO_DELAY)

    @worker.handler(Task)
    def explode(job: Job) -> None:
        calls.append(job.attempt)
        raise Boom(f"attempt {job.attempt}")

    worker.run_until_idle()

    job = get_job(engine, job_id)
    assert calls == [1, 2, 3]
    assert job.state is JobState.DISCARDED
    assert job.attempt == 3
    assert job.finalized_at is not None
    assert [(e["attempt"], e["error"]) for e in job.errors] == [
        (1, "Boom: attempt 1"),
        (2, "Boom: attempt 2"),
        (3, "Boom: attempt 3"),
    ]


def test_a_job_that_fails_once_then_succeeds_ends_completed_with_its_error_kept(
    engine: Engine,
) -> None:
    job_id = add_job(engine, Task(n=1))
    worker = make_worker(engine, retry_policy=NO_DELAY)

    @worker.handler(Task)
    def flaky(job: Job) -> None:
        if job.attempt == 1:
            raise Boom("transient")

    worker.run_until_idle()

    job = get_job(engine, job_id)
    assert (job.state, job.attempt) == (JobState.COMPLETED, 2)
    assert [e["attempt"] for e in job.errors] == [1]
    assert job.finalized_at is not None


def test_the_workers_retry_policy_decides_when_a_failed_job_runs_again(engine: Engine) -> None:
    job_id = add_job(engine, Task(n=1))
    worker = make_worker(engine, retry_policy=FixedDelay(120.0))

    @worker.handler(Task)
    def explode(job: Job) -> None:
        raise Boom

    before = db_now(engine)
    worker.run_until_idle()
    after = db_now(engine)

    job = get_job(engine, job_id)
    assert job.state is JobState.RETRYABLE
    assert_due_after(job, 120.0, before, after)


def test_a_handlers_retry_policy_overrides_the_workers(engine: Engine) -> None:
    task_id = add_job(engine, Task(n=1))
    other_id = add_job(engine, Other(n=1))
    worker = make_worker(engine, retry_policy=FixedDelay(120.0))

    @worker.handler(Task, retry_policy=FixedDelay(300.0))
    def explode_task(job: Job) -> None:
        raise Boom

    @worker.handler(Other)
    def explode_other(job: Job) -> None:
        raise Boom

    before = db_now(engine)
    worker.run_until_idle()
    after = db_now(engine)

    task, other = get_job(engine, task_id), get_job(engine, other_id)
    assert_due_after(task, 300.0, before, after)
    assert_due_after(other, 120.0, before, after)


# ------------------------------------------------------------------ snooze and cancel


@pytest.mark.parametrize("delay", [30, dt.timedelta(seconds=30)], ids=["seconds", "timedelta"])
def test_a_snoozed_job_is_scheduled_later_without_spending_an_attempt(
    engine: Engine, delay: float | dt.timedelta
) -> None:
    job_id = add_job(engine, Task(n=1), max_attempts=5)
    worker = make_worker(engine, retry_policy=NO_DELAY)

    @worker.handler(Task)
    def snooze(job: Job) -> None:
        raise JobSnooze(delay)

    before = db_now(engine)
    worker.run_until_idle()
    after = db_now(engine)

    job = get_job(engine, job_id)
    assert job.state is JobState.SCHEDULED
    # River: a snooze gives its attempt back; max_attempts never changes.
    assert (job.attempt, job.max_attempts, job.run_count) == (0, 5, 1)
    assert job.errors == []
    assert job.finalized_at is None
    assert_due_after(job, 30.0, before, after)


def test_a_snooze_gives_back_the_attempt_so_a_later_failure_is_still_retried(
    engine: Engine,
) -> None:
    # Two attempts allowed. Snooze, fail, succeed: without the attempt given back by the
    # snooze, the failure on attempt 2 would discard the job.
    job_id = add_job(engine, Task(n=1), max_attempts=2)
    calls: list[tuple[int, int]] = []
    worker = make_worker(engine, retry_policy=NO_DELAY)

    @worker.handler(Task)
    def handle(job: Job) -> None:
        calls.append((job.run_count, job.attempt))
        if job.run_count == 1:
            raise JobSnooze(0)
        if job.run_count == 2:
            raise Boom("after the snooze")

    worker.run_until_idle()

    job = get_job(engine, job_id)
    # The run after the snooze has the attempt the snoozed one had: 1.
    assert calls == [(1, 1), (2, 1), (3, 2)]
    assert (job.state, job.attempt, job.max_attempts) == (JobState.COMPLETED, 2, 2)
    assert [e["attempt"] for e in job.errors] == [1]


def test_a_handler_raising_JobCancel_cancels_the_job_for_good(engine: Engine) -> None:
    job_id = add_job(engine, Task(n=1), max_attempts=5)
    calls: list[int] = []
    worker = make_worker(engine, retry_policy=NO_DELAY)

    @worker.handler(Task)
    def give_up(job: Job) -> None:
        calls.append(job.attempt)
        raise JobCancel("account closed")

    worker.run_until_idle()

    job = get_job(engine, job_id)
    assert calls == [1]
    assert job.state is JobState.CANCELLED
    assert job.finalized_at is not None
    assert [(e["attempt"], e["error"]) for e in job.errors] == [(1, "JobCancel: account closed")]


# ------------------------------------------------------------------ jobs the worker cannot run


def test_a_job_whose_kind_has_no_handler_fails_with_NoHandlerError(engine: Engine) -> None:
    registered = add_job(engine, Unhandled(n=1))
    unknown = add_raw_job(engine, "outcomes_never_declared", {})
    worker = make_worker(engine)

    @worker.handler(Task)
    def handle(job: Job) -> None:
        pass

    worker.run_until_idle()

    for job_id, kind in ((registered, "outcomes_unhandled"), (unknown, "outcomes_never_declared")):
        job = get_job(engine, job_id)
        assert (job.state, job.attempt) == (JobState.RETRYABLE, 1)
        error = job.errors[0]["error"]
        assert error.startswith(f"NoHandlerError: this worker has no handler for kind {kind!r}")


def test_a_job_whose_stored_args_no_longer_convert_fails_with_InvalidJobArgsError(
    engine: Engine,
) -> None:
    job_id = add_raw_job(engine, "outcomes_task", {"n": "not a number"})
    calls: list[int] = []
    worker = make_worker(engine)

    @worker.handler(Task)
    def handle(job: Job) -> None:
        calls.append(job.id)

    worker.run_until_idle()

    job = get_job(engine, job_id)
    assert calls == []
    assert (job.state, job.attempt) == (JobState.RETRYABLE, 1)
    error = job.errors[0]["error"]
    assert error.startswith("InvalidJobArgsError: stored args do not convert to Task")
    assert "trace" in job.errors[0]


# ------------------------------------------------------------------ async handlers


def test_async_handlers_complete_and_fail_like_sync_ones(engine: Engine) -> None:
    ok, failing = add_jobs(engine, [Task(n=1), Task(n=2)])
    loops: list[bool] = []
    worker = make_worker(engine)

    @worker.handler(Task)
    async def handle(job: Job) -> None:
        await asyncio.sleep(0.01)  # the job's work: it awaits on the worker's loop
        loops.append(asyncio.get_running_loop().is_running())
        if job.args.n == 2:
            raise Boom("async boom")

    worker.run_until_idle()

    assert loops == [True, True]
    assert get_job(engine, ok).state is JobState.COMPLETED
    job = get_job(engine, failing)
    assert job.state is JobState.RETRYABLE
    assert job.errors[0]["error"] == "Boom: async boom"
    assert "in handle" in job.errors[0]["trace"]


# ------------------------------------------------------------------ handlers with a session


@pytest.mark.usefixtures("effect_table")
def test_a_session_handlers_writes_commit_in_the_same_transaction_as_its_completion(
    engine: Engine,
) -> None:
    job_id = add_job(engine, Task(n=1))
    visible_during_run: list[bool] = []
    worker = make_worker(engine)

    @worker.handler(Task)
    def handle(job: Job, session: Session) -> None:
        write_effect(session, job, "done")
        # Not committed yet: nobody else sees the effect while the handler runs.
        visible_during_run.append(bool(effects(engine)))

    worker.run_until_idle()

    assert visible_during_run == [False]
    assert get_job(engine, job_id).state is JobState.COMPLETED
    assert effects(engine) == [(job_id, 1, "done")]
    assert same_transaction(engine, job_id)


@pytest.mark.usefixtures("effect_table")
def test_an_async_session_handlers_writes_commit_with_its_completion(engine: Engine) -> None:
    job_id = add_job(engine, Task(n=1))
    worker = make_worker(engine)

    @worker.handler(Task)
    async def handle(job: Job, session: AsyncSession) -> None:
        await write_effect_async(session, job, "async")

    worker.run_until_idle()

    assert get_job(engine, job_id).state is JobState.COMPLETED
    assert effects(engine) == [(job_id, 1, "async")]
    assert same_transaction(engine, job_id)


@pytest.mark.usefixtures("effect_table")
def test_a_session_handler_that_raises_rolls_back_its_writes_and_the_job_is_retryable(
    engine: Engine,
) -> None:
    job_id = add_job(engine, Task(n=1))
    worker = make_worker(engine)

    @worker.handler(Task)
    def handle(job: Job, session: Session) -> None:
        write_effect(session, job, "half done")
        raise Boom("after writing")

    worker.run_until_idle()

    job = get_job(engine, job_id)
    assert job.state is JobState.RETRYABLE
    assert job.errors[0]["error"] == "Boom: after writing"
    assert effects(engine) == []


@pytest.mark.usefixtures("effect_table")
def test_a_session_handler_that_fails_once_leaves_only_the_successful_attempts_effects(
    engine: Engine,
) -> None:
    job_id = add_job(engine, Task(n=1))
    worker = make_worker(engine, retry_policy=NO_DELAY)

    @worker.handler(Task)
    def handle(job: Job, session: Session) -> None:
        write_effect(session, job)
        if job.attempt < 3:
            raise Boom

    worker.run_until_idle()

    assert get_job(engine, job_id).state is JobState.COMPLETED
    assert effects(engine) == [(job_id, 3, "")]


def test_a_sync_wrapper_around_an_async_function_fails_instead_of_completing(
    engine: Engine,
) -> None:
    """Calling such a wrapper only makes a coroutine; the work never happens. The job
    must not be marked completed."""
    ran: list[int] = []

    async def send(job: Job[Task]) -> None:
        ran.append(job.id)

    worker = make_worker(engine, retry_policy=FixedDelay(3600.0))

    @worker.handler(Task)
    def wrapper(job: Job[Task]) -> object:  # not async def: hides `send` from the worker
        return send(job)

    job_id = add_job(engine, Task())
    worker.run_until_idle(timeout=20)

    job = get_job(engine, job_id)
    assert job.state is JobState.RETRYABLE
    assert ran == []
    assert "returned an awaitable" in job.errors[-1]["error"]
    assert "async def" in job.errors[-1]["error"]
