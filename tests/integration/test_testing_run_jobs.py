"""``sa_jobs.testing.run_jobs``: due jobs worked in the test's own transaction, with the
worker's real handlers, outcomes written as the worker writes them.

Every test works in a session whose outer transaction is rolled back, as a user's test
does; ``committed_jobs`` looks from another connection to show nothing leaked.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import pytest
from sqlalchemy import URL, Engine, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import Job, JobState, SequenceOpts, Worker
from sa_jobs.errors import JobCancel, JobSnooze
from sa_jobs.testing import (
    InlineUsageError,
    MaxRunsExceededError,
    RunSummary,
    assert_enqueued,
    run_jobs,
)
from tests.helpers import AN_HOUR, NO_DELAY, count_jobs, url_text

EFFECTS = text("SELECT job_id, attempt, note FROM sa_jobs_test_effect ORDER BY job_id, attempt")
WRITE_EFFECT = text(
    "INSERT INTO sa_jobs_test_effect (job_id, attempt, note) VALUES (:job_id, :attempt, :note)"
)


@sa_jobs.job_args(kind="test_inline.greet")
class Greet:
    name: str


@sa_jobs.job_args(kind="test_inline.other")
class Other:
    n: int = 0


@sa_jobs.job_args(kind="test_inline.step", sequence=SequenceOpts(by_args=True))
class Step:
    order: str = sa_jobs.field(sequence=True)
    n: int = 0


@pytest.fixture
def session(engine: Engine) -> Iterator[Session]:
    """A session in a transaction rolled back after the test (what the plugin gives)."""
    with engine.connect() as connection:
        transaction = connection.begin()
        with Session(bind=connection, join_transaction_mode="create_savepoint") as session:
            yield session
        transaction.rollback()


def make_worker(engine: Engine, **options: object) -> Worker:
    settings: dict[str, object] = {"queues": {"default": 1}, "retry_policy": AN_HOUR}
    settings.update(options)
    return Worker(engine, **settings)  # type: ignore[arg-type]


def add(session: Session, args: object, **options: object) -> Job:
    job = sa_jobs.enqueue(args, **options)  # type: ignore[arg-type]
    session.add(job)
    return job


# ------------------------------------------------------------------ outcomes


def test_works_uncommitted_jobs_with_the_real_handler_and_leaves_nothing_committed(
    engine: Engine, session: Session
) -> None:
    worker = make_worker(engine)
    greeted: list[str] = []

    @worker.handler(Greet)
    def greet(job: Job) -> None:
        greeted.append(job.args.name)

    job = add(session, Greet("ada"))  # not even flushed

    assert run_jobs(session, worker) == RunSummary(completed=1)

    assert greeted == ["ada"]
    assert (job.state, job.attempt, job.attempted_by) == (JobState.COMPLETED, 1, [worker.id])
    assert count_jobs(engine) == 0, "run_jobs committed something"


@pytest.mark.usefixtures("effect_table")
def test_a_session_handler_gets_the_test_session_and_a_failure_undoes_its_writes(
    engine: Engine, session: Session
) -> None:
    worker = make_worker(engine)

    @worker.handler(Greet)
    def greet(job: Job, session: Session) -> None:
        session.execute(WRITE_EFFECT, {"job_id": job.id, "attempt": job.attempt, "note": "x"})
        if job.args.name == "fail":
            raise ValueError("no greeting for you")

    ok, failing = add(session, Greet("ok")), add(session, Greet("fail"))

    summary = run_jobs(session, worker)

    assert summary == RunSummary(completed=1, retryable=1)
    assert summary.errors == (
        f"job {failing.id} (test_inline.greet) attempt 1: ValueError: no greeting for you",
    )
    # The completed job's write is in the test's transaction; the failed one's was
    # rolled back with its savepoint, as the worker rolls back its transaction.
    assert session.execute(EFFECTS).all() == [(ok.id, 1, "x")]
    assert failing.state is JobState.RETRYABLE
    assert failing.errors[0]["error"] == "ValueError: no greeting for you"


def test_failures_are_retried_by_the_retry_policy_until_discarded(
    engine: Engine, session: Session
) -> None:
    worker = make_worker(engine, retry_policy=NO_DELAY)

    @worker.handler(Greet)
    def greet(job: Job) -> None:
        raise RuntimeError(f"attempt {job.attempt}")

    job = add(session, Greet("x"), max_attempts=3)

    summary = run_jobs(session, worker)

    # Retried after 0 s, a failure is due again in the same call (as run_until_idle).
    assert summary == RunSummary(retryable=2, discarded=1)
    assert (job.state, job.attempt) == (JobState.DISCARDED, 3)
    assert [e["error"] for e in job.errors] == [f"RuntimeError: attempt {n}" for n in (1, 2, 3)]


def test_snooze_cancel_and_a_missing_handler_end_as_in_the_worker(
    engine: Engine, session: Session
) -> None:
    worker = make_worker(engine, queues={"default": 1, "other": 1})

    @worker.handler(Greet)
    def greet(job: Job) -> None:
        if job.args.name == "snooze":
            raise JobSnooze(dt.timedelta(minutes=5))
        raise JobCancel("not wanted")

    snoozed, cancelled = add(session, Greet("snooze")), add(session, Greet("cancel"))
    unhandled = add(session, Other(), queue="other")

    summary = run_jobs(session, worker)

    assert summary == RunSummary(snoozed=1, cancelled=1, retryable=1)
    assert (snoozed.state, snoozed.attempt) == (JobState.SCHEDULED, 0)  # attempt given back
    assert cancelled.state is JobState.CANCELLED
    assert unhandled.state is JobState.RETRYABLE
    assert "NoHandlerError" in unhandled.errors[0]["error"]


def test_jobs_enqueued_by_handlers_and_next_jobs_of_a_sequence_run_in_the_same_call(
    engine: Engine, session: Session
) -> None:
    worker = make_worker(engine)
    ran: list[str] = []

    @worker.handler(Step)
    def step(job: Job, session: Session) -> None:
        ran.append(f"{job.args.order}:{job.args.n}")
        if (job.args.order, job.args.n) == ("a", 1):
            session.add(sa_jobs.enqueue(Step("b", 1)))

    add(session, Step("a", 1))
    add(session, Step("a", 2))  # waits for a:1, its sequence's running job

    assert run_jobs(session, worker) == RunSummary(completed=3)
    assert ran == ["a:1", "a:2", "b:1"]


def test_jobs_run_in_priority_order_across_queues_and_only_the_queues_asked_for(
    engine: Engine, session: Session
) -> None:
    worker = make_worker(engine, queues={"default": 1, "mail": 1})
    ran: list[str] = []

    @worker.handler(Greet)
    def greet(job: Job) -> None:
        ran.append(job.args.name)

    add(session, Greet("low"), priority=4)
    add(session, Greet("mail"), queue="mail", priority=2)
    add(session, Greet("high"), priority=1)
    elsewhere = add(session, Greet("elsewhere"), queue="elsewhere")

    assert run_jobs(session, worker).completed == 3
    assert ran == ["high", "mail", "low"]
    assert elsewhere.state is JobState.AVAILABLE

    assert run_jobs(session, worker, queues=["elsewhere"]) == RunSummary(completed=1)


def test_scheduled_jobs_run_only_when_asked(engine: Engine, session: Session) -> None:
    worker = make_worker(engine)

    @worker.handler(Greet)
    def greet(job: Job) -> None:
        pass

    later = add(session, Greet("later"), scheduled_at=dt.datetime.now(dt.UTC) + dt.timedelta(1))

    assert run_jobs(session, worker) == RunSummary()
    assert later.state is JobState.SCHEDULED
    assert run_jobs(session, worker, scheduled=True) == RunSummary(completed=1)


def test_a_loop_of_snoozes_stops_at_max_runs(engine: Engine, session: Session) -> None:
    worker = make_worker(engine)

    @worker.handler(Greet)
    def greet(job: Job) -> None:
        raise JobSnooze(0)

    add(session, Greet("forever"))

    with pytest.raises(MaxRunsExceededError, match="ran 5 jobs and jobs are still due"):
        run_jobs(session, worker, max_runs=5)


# ------------------------------------------------------------------ async handlers


def test_an_async_handler_runs_from_a_sync_test(engine: Engine, session: Session) -> None:
    worker = make_worker(engine)
    greeted: list[str] = []

    @worker.handler(Greet)
    async def greet(job: Job) -> None:
        await asyncio.sleep(0)
        greeted.append(job.args.name)

    add(session, Greet("ada"))

    assert run_jobs(session, worker) == RunSummary(completed=1)
    assert greeted == ["ada"]


def test_an_async_handler_taking_a_session_needs_an_async_session(
    engine: Engine, session: Session
) -> None:
    worker = make_worker(engine)

    @worker.handler(Greet)
    async def greet(job: Job, session: AsyncSession) -> None:
        pass

    add(session, Greet("ada"))

    with pytest.raises(InlineUsageError, match=r"await run_jobs\(async_session, worker\)"):
        run_jobs(session, worker)


@asynccontextmanager
async def rolled_back_async_session(url: URL) -> AsyncIterator[AsyncSession]:
    engine = create_async_engine(url_text(url))
    try:
        async with engine.connect() as connection:
            transaction = await connection.begin()
            async with AsyncSession(
                bind=connection, join_transaction_mode="create_savepoint"
            ) as session:
                yield session
            await transaction.rollback()
    finally:
        await engine.dispose()


@pytest.mark.usefixtures("effect_table")
def test_with_an_async_session_every_kind_of_handler_runs_in_its_transaction(
    engine: Engine, database_url: URL
) -> None:
    worker = make_worker(engine)

    @worker.handler(Greet)
    async def greet(job: Job, session: AsyncSession) -> None:
        await session.execute(
            WRITE_EFFECT, {"job_id": job.id, "attempt": job.attempt, "note": "async"}
        )
        if job.args.name == "fail":
            raise ValueError("async failure")

    @worker.handler(Step)
    def step(job: Job, session: Session) -> None:
        session.execute(WRITE_EFFECT, {"job_id": job.id, "attempt": job.attempt, "note": "sync"})

    async def scenario() -> None:
        async with rolled_back_async_session(database_url) as session:
            ok = sa_jobs.enqueue(Greet("ok"))
            session.add_all([ok, sa_jobs.enqueue(Greet("fail")), sa_jobs.enqueue(Step("a"))])

            summary = await run_jobs(session, worker)

            assert summary == RunSummary(completed=2, retryable=1)
            assert [row.note for row in (await session.execute(EFFECTS)).all()] == [
                "async",
                "sync",
            ]
            failed = await assert_enqueued(session, Greet, name="fail", state="retryable")
            assert failed.errors[0]["error"] == "ValueError: async failure"

    asyncio.run(scenario())
    assert count_jobs(engine) == 0


def test_bad_arguments_say_what_is_expected(engine: Engine, session: Session) -> None:
    worker = make_worker(engine)
    with pytest.raises(TypeError, match=r"needs your application's sa_jobs\.Worker"):
        run_jobs(session, engine)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="needs a sqlalchemy Session or AsyncSession"):
        run_jobs(engine, worker)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="max_runs must be a positive int"):
        run_jobs(session, worker, max_runs=0)
    with pytest.raises(TypeError, match="queues must be queue names"):
        run_jobs(session, worker, queues="default")  # a str is an iterable of names


def test_an_async_handler_that_changes_its_job_and_fails_is_recorded(
    engine: Engine, database_url: URL
) -> None:
    # The savepoint's rollback expires what the handler changed, the job included; the
    # failure's outcome must still be built (it reads the job) without a MissingGreenlet.
    worker = make_worker(engine)

    @worker.handler(Greet)
    async def greet(job: Job, session: AsyncSession) -> None:
        job.tags = ["touched"]
        await session.flush()
        raise ValueError("changed my job, then failed")

    async def scenario() -> None:
        async with rolled_back_async_session(database_url) as session:
            session.add(sa_jobs.enqueue(Greet("x")))

            summary = await run_jobs(session, worker)

            assert summary == RunSummary(retryable=1)
            job = await assert_enqueued(session, Greet, state="retryable")
            assert job.tags == []  # rolled back with the savepoint

    asyncio.run(scenario())
