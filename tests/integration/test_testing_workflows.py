"""``sa_jobs.testing.run_jobs`` runs a workflow to its end inline: each step when its
dependencies completed (released in the test's transaction, as a worker's completion
releases them), outputs read by step name, the callbacks once at the end — and a failed
step cancels its dependents and fires ``on_failure``. Nothing outlives the test."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import pytest
from sqlalchemy import URL, Engine, func, select
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import Job, JobState, Worker
from sa_jobs._act.workflow_callbacks import COUNTS_KEY
from sa_jobs.testing import InlineUsageError, RunSummary, run_jobs
from tests.helpers import AN_HOUR, url_text


@sa_jobs.job_args(kind="inline_wf.fetch", output=int)
class Fetch:
    n: int


@sa_jobs.job_args(kind="inline_wf.sum", output=int)
class Sum:
    pass


@sa_jobs.job_args(kind="inline_wf.report")
class Report:
    what: str


@pytest.fixture
def session(engine: Engine) -> Iterator[Session]:
    with engine.connect() as connection:
        transaction = connection.begin()
        with Session(bind=connection, join_transaction_mode="create_savepoint") as session:
            yield session
        transaction.rollback()


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


def worker_with(engine: Engine, ran: list[str], *, fail: str = "") -> Worker:
    worker = Worker(engine, queues={"default": 1}, retry_policy=AN_HOUR)

    @worker.handler(Fetch)
    def fetch(job: sa_jobs.Job[Fetch]) -> int:
        ran.append(f"fetch{job.args.n}")
        if str(job.args.n) == fail:
            raise ValueError("cannot fetch")
        return job.args.n * 10

    @worker.handler(Sum)
    def add(job: sa_jobs.Job[Sum]) -> int:
        total = int(job.output_of("left")) + int(job.output_of("right"))
        ran.append(f"sum={total}")
        return total

    @worker.handler(Report)
    def report(job: sa_jobs.Job[Report]) -> None:
        ran.append(f"{job.args.what}: {job.metadata_.get(COUNTS_KEY)}")

    return worker


def diamond() -> sa_jobs.Workflow:
    wf = sa_jobs.Workflow(
        "inline diamond",
        on_success=Report("success"),
        on_complete=Report("complete"),
        on_failure=Report("failure"),
    )
    root = wf.add(Fetch(1), name="root")
    left = wf.add(Fetch(2), name="left", after=[root])
    right = wf.add(Fetch(3), name="right", after=[root])
    wf.add(Sum(), name="sum", after=[left, right])
    return wf


def test_run_jobs_runs_a_workflow_to_its_end_with_outputs_and_callbacks(
    engine: Engine, session: Session
) -> None:
    ran: list[str] = []
    inserted = sa_jobs.insert_workflow(session, diamond())
    summary = run_jobs(session, worker_with(engine, ran))
    # 4 steps, then on_success and on_complete; on_failure is cancelled, never run.
    assert summary == RunSummary(completed=6)
    assert ran[0] == "fetch1" and set(ran[1:3]) == {"fetch2", "fetch3"}
    assert ran[3] == "sum=50"
    assert sorted(r.split(":")[0] for r in ran[4:]) == ["complete", "success"]
    status = sa_jobs.workflow_status(session, inserted.id)
    assert status.finished and status.succeeded
    assert status.callbacks["on_failure"][1] is JobState.CANCELLED
    assert session.scalar(select(Job.output_json).where(Job.id == inserted.jobs["sum"])) == 50
    with engine.connect() as other:  # all of it in the test's transaction, uncommitted
        assert other.scalar(select(func.count()).select_from(Job)) == 0


def test_a_failed_step_cancels_its_dependents_and_fires_on_failure_inline(
    engine: Engine, session: Session
) -> None:
    ran: list[str] = []
    inserted = sa_jobs.insert_workflow(session, diamond())
    worker = worker_with(engine, ran, fail="2")
    summary = run_jobs(session, worker)
    # max_attempts is 25 but the retry is an hour away: retryable, the workflow waits.
    assert summary.retryable == 1 and "sum=" not in " ".join(ran)
    states = dict(
        session.execute(
            select(Job.workflow_step, Job.state).where(Job.workflow_id == inserted.id)
        ).all()
    )
    assert states == {
        "root": JobState.COMPLETED,
        "left": JobState.RETRYABLE,
        "right": JobState.COMPLETED,
        "sum": JobState.PENDING,
    }
    sa_jobs.cancel_job(session, inserted.jobs["left"])  # give up on it
    summary = run_jobs(session, worker)
    assert summary == RunSummary(completed=2)  # on_failure and on_complete
    assert sorted(r.split(":")[0] for r in ran if r.startswith(("failure", "complete"))) == [
        "complete",
        "failure",
    ]
    status = sa_jobs.workflow_status(session, inserted.id)
    assert status.finished and not status.succeeded
    assert {f.name for f in status.failed_steps} == {"left", "sum"}


def test_await_run_jobs_gives_async_handlers_the_async_output_forms(
    engine: Engine, database_url: URL
) -> None:
    """With an AsyncSession, ``await job.output_of_async`` reads through it and
    ``await job.record_output_async`` is written with the run, as a worker does."""
    worker = Worker(engine, queues={"default": 1}, retry_policy=AN_HOUR)
    ran: list[str] = []

    @worker.handler(Fetch)
    async def fetch(job: sa_jobs.Job[Fetch]) -> int | None:
        if job.args.n == 1:
            return 10
        await job.record_output_async(job.args.n * 10)
        return None

    @worker.handler(Sum)
    async def add(job: sa_jobs.Job[Sum]) -> int:
        total = int(await job.output_of_async("left")) + int(await job.output_of_async("right"))
        ran.append(f"sum={total}")
        return total

    wf = sa_jobs.Workflow("async inline")
    root = wf.add(Fetch(1), name="root")
    left = wf.add(Fetch(2), name="left", after=[root])
    right = wf.add(Fetch(3), name="right", after=[root])
    wf.add(Sum(), name="sum", after=[left, right])

    async def scenario() -> None:
        async with rolled_back_async_session(database_url) as session:
            inserted = await sa_jobs.insert_workflow(session, wf)
            summary = await run_jobs(session, worker)
            assert summary == RunSummary(completed=4)
            total = await session.scalar(
                select(Job.output_json).where(Job.id == inserted.jobs["sum"])
            )
            assert total == 50

    asyncio.run(scenario())
    assert ran == ["sum=50"]


def test_await_run_jobs_reads_outputs_in_sync_handlers_and_refuses_the_sync_form_in_async_ones(
    engine: Engine, database_url: URL
) -> None:
    """Under ``await run_jobs(async_session)`` a sync handler's ``job.output_of`` reads
    through the AsyncSession's sync session; an ``async def`` handler's cannot, and is
    told to await ``output_of_async`` instead of failing on a MissingGreenlet."""
    worker = Worker(engine, queues={"default": 1}, retry_policy=AN_HOUR)
    ran: list[int] = []

    @worker.handler(Fetch)
    def fetch(job: sa_jobs.Job[Fetch]) -> int:
        return job.args.n * 10

    @worker.handler(Sum)
    def add(job: sa_jobs.Job[Sum]) -> int:
        total = int(job.output_of("left")) + int(job.output_of("right"))
        ran.append(total)
        return total

    wf = sa_jobs.Workflow("sync inline")
    left = wf.add(Fetch(2), name="left")
    right = wf.add(Fetch(3), name="right")
    wf.add(Sum(), name="sum", after=[left, right])

    async def scenario() -> None:
        async with rolled_back_async_session(database_url) as session:
            await sa_jobs.insert_workflow(session, wf)
            assert await run_jobs(session, worker) == RunSummary(completed=3)

    asyncio.run(scenario())
    assert ran == [50]

    worker = Worker(engine, queues={"default": 1}, retry_policy=AN_HOUR)
    worker.handler(Fetch)(fetch)

    @worker.handler(Sum)
    async def add_async(job: sa_jobs.Job[Sum]) -> int:
        return int(job.output_of("left"))

    wf = sa_jobs.Workflow("async inline, sync form")
    left = wf.add(Fetch(2), name="left")
    wf.add(Sum(), name="sum", after=[left])

    async def refused() -> None:
        async with rolled_back_async_session(database_url) as session:
            await sa_jobs.insert_workflow(session, wf)
            with pytest.raises(InlineUsageError, match=r"await job.output_of_async\('left'\)"):
                await run_jobs(session, worker)

    asyncio.run(refused())
