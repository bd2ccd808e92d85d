"""delete_jobs, retry_jobs and cancel_jobs: filters, batches, the single-job transitions
(sequences, unique keys, running jobs), AsyncSession, and bad input refused before any
write."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, func, select
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import BulkResult, Job, JobState
from sa_jobs._base.states import CANCEL_ATTEMPTED_KEY
from sa_jobs.errors import (
    InvalidOptionsError,
    UnknownKindError,
    UnknownQueueError,
)
from tests.factories import FACTORY_KIND, job_row, make_job
from tests.helpers import add_job, add_jobs, recorded_statements


@sa_jobs.job_args(kind="bulk_task")
class Task:
    n: int = 0


@sa_jobs.job_args(kind="bulk_other")
class Other:
    n: int = 0


@sa_jobs.job_args(kind="bulk_sequenced", sequence=sa_jobs.SequenceOpts())
class Step:
    n: int = 0


@sa_jobs.job_args(kind="bulk_unique", unique=sa_jobs.UniqueOpts(by_args=True))
class Once:
    n: int = 0


def bulk(engine: Engine, action: Any, **filters: Any) -> BulkResult:
    with Session(engine) as session, session.begin():
        result: BulkResult = action(session, **filters)
        return result


def states(engine: Engine) -> dict[int, JobState]:
    with engine.connect() as connection:
        return dict(connection.execute(select(Job.id, Job.state).order_by(Job.id)).all())


def count(engine: Engine) -> int:
    with engine.connect() as connection:
        return int(connection.scalar(select(func.count()).select_from(Job)) or 0)


# ------------------------------------------------------------------ delete


def test_delete_jobs_by_state_and_age_in_batches_leaves_the_rest(engine: Engine) -> None:
    old = [make_job(engine, state=JobState.COMPLETED, finalized_at=-dt.timedelta(days=8))]
    old += [
        make_job(engine, state=JobState.DISCARDED, finalized_at=-dt.timedelta(days=9))
        for _ in range(24)
    ]
    recent = make_job(engine, state=JobState.COMPLETED)
    waiting = make_job(engine)

    with recorded_statements(engine, keep=lambda s: "DELETE FROM sa_job" in s) as deletes:
        result = bulk(
            engine,
            sa_jobs.delete_jobs,
            state=["completed", JobState.DISCARDED],
            finalized_before=dt.timedelta(days=7),
            batch_size=10,
        )

    assert result == BulkResult(count=25, last_id=max(old))
    assert len(deletes) == 3  # 10 + 10 + 5
    assert states(engine) == {recent: JobState.COMPLETED, waiting: JobState.AVAILABLE}


def test_delete_jobs_never_deletes_a_running_job(engine: Engine) -> None:
    running = make_job(engine, state=JobState.RUNNING, queue="mail")
    others = [
        make_job(engine, queue="mail", state=state) for state in JobState if state != "running"
    ]

    result = bulk(engine, sa_jobs.delete_jobs, queue="mail")

    assert result.count == len(others)
    assert states(engine) == {running: JobState.RUNNING}
    with Session(engine) as session, pytest.raises(InvalidOptionsError, match="cancel them first"):
        sa_jobs.delete_jobs(session, state="running")


def test_delete_jobs_by_kind_class_or_string_and_ids(engine: Engine) -> None:
    tasks = add_jobs(engine, [Task(n) for n in range(3)])
    other = add_job(engine, Other())

    assert bulk(engine, sa_jobs.delete_jobs, kind=Task, ids=[tasks[0], other]).count == 1
    assert bulk(engine, sa_jobs.delete_jobs, kind="bulk_task").count == 2
    assert states(engine) == {other: JobState.AVAILABLE}


def test_deleting_a_halted_sequences_job_lets_the_sequence_go_on(engine: Engine) -> None:
    first, second = add_jobs(engine, [Step(1), Step(2)])
    bulk(engine, sa_jobs.cancel_jobs, ids=[first])
    assert states(engine) == {first: JobState.CANCELLED, second: JobState.PENDING}

    assert bulk(engine, sa_jobs.delete_jobs, ids=[first]).count == 1

    assert states(engine) == {second: JobState.AVAILABLE}


def test_limit_and_after_id_let_a_caller_commit_between_batches(engine: Engine) -> None:
    ids = [make_job(engine, state=JobState.COMPLETED) for _ in range(7)]
    seen: list[int] = []
    after = 0
    while True:
        result = bulk(engine, sa_jobs.delete_jobs, kind=FACTORY_KIND, limit=3, after_id=after)
        if result.last_id is None:
            break
        seen.append(result.count)
        after = result.last_id
    assert seen == [3, 3, 1]
    assert count(engine) == 0 and after == ids[-1]


# ------------------------------------------------------------------ cancel


def test_cancel_jobs_cancels_waiting_jobs_and_asks_running_ones_to_stop(engine: Engine) -> None:
    waiting = add_jobs(engine, [Task(n) for n in range(3)], queue="mail")
    running = make_job(engine, kind="bulk_task", queue="mail", state=JobState.RUNNING)
    done = make_job(engine, kind="bulk_task", queue="mail", state=JobState.COMPLETED)
    elsewhere = add_job(engine, Task(), queue="default")

    result = bulk(engine, sa_jobs.cancel_jobs, queue="mail", batch_size=2)

    assert (result.count, result.cancel_requested) == (4, 1)
    assert states(engine) == {
        **dict.fromkeys(waiting, JobState.CANCELLED),
        running: JobState.RUNNING,
        done: JobState.COMPLETED,
        elsewhere: JobState.AVAILABLE,
    }
    assert CANCEL_ATTEMPTED_KEY in job_row(engine, running).metadata


def test_cancel_jobs_halts_a_sequence_as_cancel_job_does(engine: Engine) -> None:
    first, second, third = add_jobs(engine, [Step(1), Step(2), Step(3)])

    assert bulk(engine, sa_jobs.cancel_jobs, ids=[first]).count == 1

    assert states(engine) == {
        first: JobState.CANCELLED,
        second: JobState.PENDING,
        third: JobState.PENDING,
    }


# ------------------------------------------------------------------ retry


def test_retry_jobs_revives_discarded_jobs_and_leaves_available_and_running_ones(
    engine: Engine,
) -> None:
    discarded = [
        make_job(engine, kind="bulk_task", state=JobState.DISCARDED, attempt=3, max_attempts=3)
        for _ in range(5)
    ]
    running = make_job(engine, kind="bulk_task", state=JobState.RUNNING)
    waiting = add_job(engine, Task())

    result = bulk(engine, sa_jobs.retry_jobs, kind=Task, batch_size=2)

    assert (result.count, result.unique_conflicts) == (5, ())
    assert states(engine) == {
        **dict.fromkeys(discarded, JobState.AVAILABLE),
        running: JobState.RUNNING,
        waiting: JobState.AVAILABLE,
    }
    assert job_row(engine, discarded[0]).max_attempts == 4  # one more attempt allowed


def test_retry_jobs_leaves_a_job_whose_unique_key_is_taken_and_retries_the_rest(
    engine: Engine,
) -> None:
    first = add_job(engine, Once(1))
    bulk(engine, sa_jobs.cancel_jobs, ids=[first])
    holder = add_job(engine, Once(1))  # the key is free again: a new job takes it
    lone = add_job(engine, Once(2))
    bulk(engine, sa_jobs.cancel_jobs, ids=[lone])

    result = bulk(engine, sa_jobs.retry_jobs, state="cancelled")

    assert (result.count, result.unique_conflicts) == (1, (first,))
    assert states(engine) == {
        first: JobState.CANCELLED,
        holder: JobState.AVAILABLE,
        lone: JobState.AVAILABLE,
    }


def test_retry_jobs_resumes_a_halted_sequence_in_id_order(engine: Engine) -> None:
    first, second = add_jobs(engine, [Step(1), Step(2)])
    bulk(engine, sa_jobs.cancel_jobs, ids=[first, second])
    assert states(engine) == {first: JobState.CANCELLED, second: JobState.CANCELLED}

    result = bulk(engine, sa_jobs.retry_jobs, kind=Step)

    assert result.count == 2
    assert states(engine) == {first: JobState.AVAILABLE, second: JobState.PENDING}


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    ("filters", "error", "match"),
    [
        ({}, InvalidOptionsError, "an empty filter would match every job"),
        ({"state": "finished"}, InvalidOptionsError, "not a job state"),
        ({"kind": "bulk_tsak"}, UnknownKindError, "no job has it"),
        ({"queue": "mial"}, UnknownQueueError, "'mial'"),
        ({"kind": int}, InvalidOptionsError, "not a job args class"),
        ({"ids": [0]}, InvalidOptionsError, "not a job id"),
        ({"created_before": dt.datetime(2026, 1, 1)}, InvalidOptionsError, "naive"),
        ({"queue": "default", "batch_size": 0}, InvalidOptionsError, "batch_size"),
    ],
)
def test_bad_filters_are_refused_before_anything_is_written(
    engine: Engine, filters: dict[str, Any], error: type[Exception], match: str
) -> None:
    ids = [make_job(engine, state=JobState.COMPLETED), add_job(engine, Task())]
    before = states(engine)
    for action in (sa_jobs.delete_jobs, sa_jobs.retry_jobs, sa_jobs.cancel_jobs):
        with (
            Session(engine) as session,
            recorded_statements(engine) as sent,
            pytest.raises(error, match=match),
        ):
            action(session, **filters)
        assert not [s for s in sent if s.lstrip().startswith(("UPDATE", "DELETE", "INSERT"))]
    assert states(engine) == before and len(ids) == 2


def test_each_action_refuses_the_states_it_cannot_act_on(engine: Engine) -> None:
    with Session(engine) as session:
        with pytest.raises(InvalidOptionsError, match="finished already"):
            sa_jobs.cancel_jobs(session, state="completed")
        with pytest.raises(InvalidOptionsError, match="waiting to run already"):
            sa_jobs.retry_jobs(session, state=["discarded", "available"])


def test_a_kind_only_job_rows_have_is_known(engine: Engine) -> None:
    make_job(engine, kind="legacy_kind", state=JobState.COMPLETED)  # no class declares it
    assert bulk(engine, sa_jobs.delete_jobs, kind="legacy_kind").count == 1


# ------------------------------------------------------------------ AsyncSession


@pytest.fixture
def async_engine(engine: Engine) -> Iterator[AsyncEngine]:
    async_engine = create_async_engine(engine.url.set(drivername="postgresql+psycopg"))
    yield async_engine
    asyncio.run(async_engine.dispose())


def test_bulk_actions_take_an_async_session(engine: Engine, async_engine: AsyncEngine) -> None:
    ids = add_jobs(engine, [Task(n) for n in range(4)])
    sessions = async_sessionmaker(async_engine)

    async def scenario() -> tuple[int, int, int]:
        async with sessions() as session, session.begin():
            cancelled = await sa_jobs.cancel_jobs(session, ids=ids[:3])
        async with sessions() as session, session.begin():
            retried = await sa_jobs.retry_jobs(session, state="cancelled")
        async with sessions() as session, session.begin():
            deleted = await sa_jobs.delete_jobs(session, kind=Task)
        return cancelled.count, retried.count, deleted.count

    assert asyncio.run(scenario()) == (3, 3, 4)
    assert count(engine) == 0
