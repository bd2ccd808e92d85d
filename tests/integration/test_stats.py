"""``sa_jobs.stats``: counts per queue and state (exact, and estimated past the limit),
the oldest available job's age, running jobs by worker, halted sequences."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import threading
from collections.abc import Iterator

import pytest
from sqlalchemy import URL, Engine, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import Job, JobState, SequenceOpts
from sa_jobs._inspect import job_counts
from sa_jobs._inspect.queue_stats import Stats, as_dict
from sa_jobs.errors import InvalidOptionsError
from tests.factories import make_job, make_worker_row
from tests.helpers import (
    add_job,
    cancel,
    make_worker,
    running,
    wait_for_state,
)


def read_stats(engine: Engine, **options: object) -> Stats:
    with Session(engine) as session:
        return sa_jobs.stats(session, **options)  # type: ignore[arg-type]


def counts(found: Stats, queue: str) -> dict[JobState, int]:
    return {state: n for state, n in found.queues[queue].counts.items() if n}


def test_counts_every_state_per_queue_exactly(engine: Engine) -> None:
    layout = {
        ("default", JobState.AVAILABLE): 3,
        ("default", JobState.SCHEDULED): 1,
        ("default", JobState.RUNNING): 2,
        ("default", JobState.COMPLETED): 4,
        ("mail", JobState.RETRYABLE): 1,
        ("mail", JobState.CANCELLED): 2,
        ("mail", JobState.DISCARDED): 1,
        ("mail", JobState.AVAILABLE): 1,
    }
    for (queue, state), n in layout.items():
        for _ in range(n):
            make_job(
                engine,
                queue=queue,
                state=state,
                scheduled_at=dt.timedelta(hours=1) if state is JobState.SCHEDULED else None,
            )

    found = read_stats(engine)

    assert sorted(found.queues) == ["default", "mail"]
    assert counts(found, "default") == {
        JobState.AVAILABLE: 3,
        JobState.SCHEDULED: 1,
        JobState.RUNNING: 2,
        JobState.COMPLETED: 4,
    }
    assert counts(found, "mail") == {
        JobState.RETRYABLE: 1,
        JobState.CANCELLED: 2,
        JobState.DISCARDED: 1,
        JobState.AVAILABLE: 1,
    }
    assert set(found.queues["default"].counts) == set(JobState)
    assert found.totals[JobState.AVAILABLE] == 4
    assert found.totals[JobState.PENDING] == 0
    assert found.estimated == frozenset()
    assert all(not q.estimated for q in found.queues.values())
    assert found.queues["mail"].paused is False  # the queue branch is installed here


def test_an_empty_table_has_no_queues_and_zero_totals(engine: Engine) -> None:
    found = read_stats(engine)
    assert found.queues == {}
    assert set(found.totals.values()) == {0}


def test_works_with_an_async_session(database_url: URL, engine: Engine) -> None:
    make_job(engine, queue="a", state=JobState.AVAILABLE)
    make_job(engine, queue="a", state=JobState.COMPLETED)

    async def read() -> Stats:
        async_engine = create_async_engine(database_url.set(drivername="postgresql+psycopg"))
        try:
            async with AsyncSession(async_engine) as session:
                return await sa_jobs.stats(session)
        finally:
            await async_engine.dispose()

    found = asyncio.run(read())
    assert counts(found, "a") == {JobState.AVAILABLE: 1, JobState.COMPLETED: 1}


def test_finished_states_past_the_exact_limit_are_estimated_and_flagged(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 6,000 rows, a limit of 500, and a sample of about half the pages: the
    # estimate path runs, sampling for real.
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO sa_job (kind, state, queue, finalized_at) "
                "SELECT 'k', 'completed', CASE WHEN i % 4 = 0 THEN 'b' ELSE 'a' END, now() "
                "FROM generate_series(1, 6000) AS i"
            )
        )
    for _ in range(7):
        make_job(engine, queue="a", state=JobState.DISCARDED)
    with engine.connect() as connection:
        pages = connection.execute(text("SELECT pg_relation_size('sa_job') / 8192")).scalar()
    monkeypatch.setattr(job_counts, "SAMPLE_PAGES", max(1, int(pages or 0) // 2))

    found = read_stats(engine, exact_limit=500)

    assert found.estimated == {JobState.COMPLETED}
    assert found.queues["a"].estimated == {JobState.COMPLETED}
    assert found.queues["a"].counts[JobState.DISCARDED] == 7  # under the limit: exact
    total = found.totals[JobState.COMPLETED]
    assert total >= 501
    assert 6000 * 0.6 <= total <= 6000 * 1.4, total
    a, b = (
        found.queues["a"].counts[JobState.COMPLETED],
        found.queues["b"].counts[JobState.COMPLETED],
    )
    assert 0.5 <= a / (a + b) <= 0.9, (a, b)  # 3 in 4 are in "a"


def test_an_available_backlog_past_the_limit_is_estimated_and_flagged(engine: Engine) -> None:
    # The active states are capped like the finished ones: a backlog of millions is
    # not counted row by row when someone runs stats.
    for _ in range(12):
        make_job(engine, queue="busy", scheduled_at=-dt.timedelta(minutes=3))
    make_job(engine, queue="quiet")
    for _ in range(2):
        make_job(engine, queue="busy", state=JobState.RUNNING)

    found = read_stats(engine, exact_limit=5)

    assert found.estimated == {JobState.AVAILABLE}
    assert found.queues["busy"].estimated == {JobState.AVAILABLE}
    assert found.totals[JobState.AVAILABLE] >= 6  # never below what the capped count saw
    assert found.queues["busy"].counts[JobState.AVAILABLE] >= 1
    assert found.queues["quiet"].counts[JobState.AVAILABLE] >= 1  # known from the index
    assert found.queues["busy"].counts[JobState.RUNNING] == 2  # under the limit: exact
    age = found.queues["busy"].oldest_available_age
    assert age is not None and dt.timedelta(minutes=3) <= age < dt.timedelta(minutes=4)


def test_at_the_limit_counts_stay_exact(engine: Engine) -> None:
    for _ in range(5):
        make_job(engine, state=JobState.COMPLETED)
    found = read_stats(engine, exact_limit=5)
    assert found.estimated == frozenset()
    assert found.totals[JobState.COMPLETED] == 5


def test_a_bad_exact_limit_is_refused(engine: Engine) -> None:
    with pytest.raises(InvalidOptionsError, match="exact_limit"):
        read_stats(engine, exact_limit=0)


def test_oldest_available_age_is_per_queue(engine: Engine) -> None:
    make_job(engine, queue="slow", scheduled_at=-dt.timedelta(minutes=10))
    make_job(engine, queue="slow", scheduled_at=-dt.timedelta(minutes=1))
    make_job(engine, queue="fast", scheduled_at=-dt.timedelta(seconds=5))
    make_job(engine, queue="idle", state=JobState.COMPLETED)

    found = read_stats(engine)

    slow = found.queues["slow"].oldest_available_age
    fast = found.queues["fast"].oldest_available_age
    assert slow is not None and dt.timedelta(minutes=10) <= slow < dt.timedelta(minutes=11)
    assert fast is not None and dt.timedelta(seconds=5) <= fast < dt.timedelta(minutes=1)
    assert found.queues["idle"].oldest_available_age is None


@sa_jobs.job_args(kind="stats_blocking")
class Blocking:
    n: int = 0


@pytest.fixture
def released() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()


def test_running_jobs_are_shown_by_worker(
    engine: Engine, no_workers_or_leader: None, released: threading.Event
) -> None:
    started = threading.Semaphore(0)
    worker = make_worker(engine, queues={"default": 3}, worker_id="stats-worker-1")

    @worker.handler(Blocking)
    def handle(job: Job[Blocking]) -> None:
        started.release()
        released.wait(10)

    job_ids = [add_job(engine, Blocking(n)) for n in range(2)]
    make_job(engine, state=JobState.RUNNING, attempted_by=["elsewhere", "gone-worker"])
    make_worker_row(engine, "idle-worker")
    with running(worker):
        for _ in job_ids:
            assert started.acquire(timeout=5)
        found = read_stats(engine)
        released.set()
        for job_id in job_ids:
            wait_for_state(engine, job_id, JobState.COMPLETED)

    by_id = {w.id: w for w in found.workers}
    assert set(by_id) == {"stats-worker-1", "gone-worker", "idle-worker"}
    ours = by_id["stats-worker-1"]
    assert ours.running == 2
    assert ours.hostname and ours.pid and ours.queues == ("default",)
    assert ours.heartbeat_age is not None and ours.heartbeat_age < dt.timedelta(minutes=1)
    # A worker with jobs but no heartbeat row has gone away (the rescuer's business).
    assert by_id["gone-worker"].running == 1 and by_id["gone-worker"].hostname is None
    assert by_id["idle-worker"].running == 0


@sa_jobs.job_args(kind="stats_sequenced", sequence=SequenceOpts(by_args=True))
class Sequenced:
    account: int = sa_jobs.field(sequence=True)
    step: int = 0


def test_a_halted_sequence_is_listed_with_the_jobs_waiting_behind_it(engine: Engine) -> None:
    first = add_job(engine, Sequenced(1, 0))
    add_job(engine, Sequenced(1, 1))
    add_job(engine, Sequenced(1, 2))
    add_job(engine, Sequenced(2, 0))  # another sequence, running along

    cancel(engine, first)
    found = read_stats(engine)

    assert found.halted_sequences is not None
    assert found.halted_sequences.count == 1
    (halted,) = found.halted_sequences.listed
    assert (halted.job_id, halted.kind, halted.state, halted.waiting) == (
        first,
        "stats_sequenced",
        JobState.CANCELLED,
        2,
    )
    assert counts(found, "default")[JobState.PENDING] == 2


def test_without_the_sequence_branch_there_are_no_halted_sequences(core_only: Engine) -> None:
    make_job(core_only, state=JobState.AVAILABLE)
    found = read_stats(core_only)
    assert found.halted_sequences is None
    assert found.totals[JobState.AVAILABLE] == 1


def test_paused_queues_are_flagged_and_listed_even_when_empty(engine: Engine) -> None:
    make_job(engine, state=JobState.AVAILABLE, queue="mail")
    make_job(engine, state=JobState.AVAILABLE, queue="default")
    with Session(engine) as session, session.begin():
        sa_jobs.pause_queue(session, "mail")
        sa_jobs.pause_queue(session, "reports", allow_unknown=True)
    found = read_stats(engine)
    assert {name: q.paused for name, q in found.queues.items()} == {
        "default": False,
        "mail": True,
        "reports": True,
    }
    assert set(found.queues["reports"].counts.values()) == {0}
    with Session(engine) as session, session.begin():
        sa_jobs.resume_queue(session, "mail")
    assert read_stats(engine).queues["mail"].paused is False


def test_without_the_queue_branch_paused_is_unknown(core_only: Engine) -> None:
    make_job(core_only, state=JobState.AVAILABLE)
    assert read_stats(core_only).queues["default"].paused is None


def test_nothing_is_written(engine: Engine) -> None:
    make_job(engine)
    with Session(engine) as session:
        sa_jobs.stats(session)
        wrote = session.execute(text("SELECT pg_current_xact_id_if_assigned()")).scalar()
    assert wrote is None


def test_stats_as_dict_is_a_method_of_the_result(engine: Engine) -> None:
    # docs/observability.md tells users to call found.as_dict(): no import from the
    # internal module holding the function.
    make_job(engine, queue="default", state=JobState.AVAILABLE)
    with Session(engine) as session:
        found = sa_jobs.stats(session)
    data = found.as_dict()
    assert data == as_dict(found)
    assert data["totals"]["available"] == 1
    json.dumps(data)  # JSON-ready
