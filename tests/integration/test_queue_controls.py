"""Pausing and resuming queues: enforced by the fetch statement for every worker, kept in
the database, announced by NOTIFY; and refused clearly where it cannot work."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, func, select
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import Job, JobState
from sa_jobs._table.schema import (
    CONTROL_CHANNEL,
    CORE_BRANCH,
    QUEUE_BRANCH,
    Features,
    missing_schema_error,
)
from sa_jobs._table.service_tables import JobQueue
from sa_jobs.errors import InvalidOptionsError, SchemaMissingError, UnknownQueueError
from sa_jobs.worker.producer import fetch_jobs
from tests.factories import make_job, make_worker_row
from tests.helpers import (
    add_jobs,
    libpq_url,
    make_worker,
    recorded_statements,
    running,
    wait_listening,
    wait_until,
)


@sa_jobs.job_args(kind="queue_controls_task")
class Task:
    n: int = 0


def pause(engine: Engine, queue: str, **options: bool) -> sa_jobs.QueueState:
    with Session(engine) as session, session.begin():
        return sa_jobs.pause_queue(session, queue, **options)


def resume(engine: Engine, queue: str) -> sa_jobs.QueueState:
    with Session(engine) as session, session.begin():
        return sa_jobs.resume_queue(session, queue)


def fetch(engine: Engine, queue: str, limit: int = 100) -> list[Job]:
    return fetch_jobs(engine, queue, limit, "test-fetcher")


def control_rows(engine: Engine) -> list[tuple[str, bool]]:
    with engine.connect() as connection:
        rows = connection.execute(
            select(JobQueue.name, JobQueue.paused_at.is_not(None)).order_by(JobQueue.name)
        )
        return [(name, paused) for name, paused in rows]


def states(engine: Engine, queue: str) -> dict[JobState, int]:
    with engine.connect() as connection:
        rows = connection.execute(
            select(Job.state, func.count()).where(Job.queue == queue).group_by(Job.state)
        )
        return {state: count for state, count in rows}


# ------------------------------------------------------------------ the fetch statement


def test_a_paused_queue_gives_no_job_while_other_queues_do_and_resume_gives_them_back(
    engine: Engine,
) -> None:
    add_jobs(engine, [Task(n) for n in range(3)], queue="mail")
    add_jobs(engine, [Task(n) for n in range(2)], queue="default")

    state = pause(engine, "mail")

    assert state.paused and state.name == "mail"
    assert fetch(engine, "mail") == []
    assert len(fetch(engine, "default")) == 2
    resumed = resume(engine, "mail")
    assert not resumed.paused and resumed.updated_at is not None
    assert sorted(job.args.n for job in fetch(engine, "mail")) == [0, 1, 2]


def test_inserts_into_a_paused_queue_succeed_and_wait(engine: Engine) -> None:
    add_jobs(engine, [Task(0)], queue="mail")
    fetch(engine, "mail")
    pause(engine, "mail")

    ids = add_jobs(engine, [Task(n) for n in range(5)], queue="mail")

    assert len(ids) == 5
    assert fetch(engine, "mail") == []
    assert states(engine, "mail") == {JobState.RUNNING: 1, JobState.AVAILABLE: 5}


def test_pausing_twice_keeps_the_first_pause_time_and_resuming_an_active_queue_is_a_no_op(
    engine: Engine,
) -> None:
    add_jobs(engine, [Task(0)], queue="mail")
    first = pause(engine, "mail")
    second = pause(engine, "mail")
    assert second.paused_at == first.paused_at

    resume(engine, "mail")
    again = resume(engine, "mail")
    assert not again.paused
    assert control_rows(engine) == [("mail", False)]  # the row stays, for later settings


def test_a_pause_rolled_back_pauses_nothing_and_notifies_no_one(engine: Engine) -> None:
    import psycopg

    add_jobs(engine, [Task(0)], queue="mail")
    with psycopg.connect(libpq_url(engine.url), autocommit=True) as listener:
        listener.execute(f"LISTEN {CONTROL_CHANNEL}")
        with Session(engine) as session, session.begin():
            sa_jobs.pause_queue(session, "mail")
            session.rollback()
        with Session(engine) as session, session.begin():
            sa_jobs.pause_queue(session, "mail")
        heard = [n.payload for n in listener.notifies(timeout=0.5, stop_after=1)]

    assert heard == ['{"pause": "mail"}']  # the committed one only
    assert control_rows(engine) == [("mail", True)]


def test_queue_states_lists_controlled_queues_by_name(engine: Engine) -> None:
    add_jobs(engine, [Task(0)], queue="b")
    add_jobs(engine, [Task(0)], queue="a")
    pause(engine, "b")
    pause(engine, "a")
    resume(engine, "a")

    with Session(engine) as session:
        listed = sa_jobs.queue_states(session)
        paused = sa_jobs.queue_states(session, paused_only=True)

    assert [(s.name, s.paused) for s in listed] == [("a", False), ("b", True)]
    assert [s.name for s in paused] == ["b"]


# ------------------------------------------------------------------ workers


def test_several_workers_fetch_nothing_from_a_paused_queue_and_resume_wakes_them_at_once(
    engine: Engine,
) -> None:
    # Polls are 30 s apart: only the resume notification can restart them within the test.
    worked: list[tuple[str, int]] = []
    workers = [
        make_worker(engine, queues={"default": 3, "mail": 3}, poll_interval=30.0) for _ in range(3)
    ]
    for worker in workers:
        worker.handler(Task)(lambda job: worked.append((job.queue, job.id)))
    add_jobs(engine, [Task(0)], queue="mail")  # so "mail" is a known queue
    pause(engine, "mail")
    with running(workers[0]), running(workers[1]), running(workers[2]):
        for worker in workers:
            wait_listening(worker)
        mail = add_jobs(engine, [Task(n) for n in range(30)], queue="mail")
        default = add_jobs(engine, [Task(n) for n in range(30)], queue="default")

        wait_until(lambda: len(worked) == 30, what="the default queue to be worked")
        time.sleep(0.3)  # and longer: still nothing from "mail"
        assert {queue for queue, _ in worked} == {"default"}
        assert states(engine, "mail") == {JobState.AVAILABLE: 31}

        resumed_at = time.monotonic()
        resume(engine, "mail")
        wait_until(lambda: len(worked) == 61, timeout=5, what="the mail queue to be worked")
        assert time.monotonic() - resumed_at < 5  # far sooner than a 30 s poll

    assert sorted(job_id for queue, job_id in worked if queue == "mail") == sorted([1, *mail])
    assert len(default) == 30


def test_jobs_running_when_a_queue_is_paused_finish(engine: Engine) -> None:
    import threading

    release = threading.Event()
    started = threading.Event()
    worker = make_worker(engine, queues={"mail": 2})

    @worker.handler(Task)
    def slow(job: Job[Task]) -> None:
        started.set()
        release.wait(5)

    add_jobs(engine, [Task(0)], queue="mail")
    with running(worker):
        assert started.wait(5)
        pause(engine, "mail")
        release.set()
        wait_until(lambda: states(engine, "mail") == {JobState.COMPLETED: 1})


def test_a_pause_outlives_the_worker_that_saw_it(engine: Engine) -> None:
    add_jobs(engine, [Task(0)], queue="mail")
    pause(engine, "mail")
    for _ in range(2):  # a worker, then a new one after it stopped
        worker = make_worker(engine, queues={"mail": 2, "default": 2})
        worker.handler(Task)(lambda job: None)
        add_jobs(engine, [Task(1)], queue="default")
        worker.run_until_idle()
        assert states(engine, "mail") == {JobState.AVAILABLE: 1}
    assert states(engine, "default") == {JobState.COMPLETED: 2}


def test_a_worker_stops_waking_for_inserts_into_a_queue_paused_while_it_listened(
    engine: Engine,
) -> None:
    add_jobs(engine, [Task(0)], queue="mail")
    worker = make_worker(engine, queues={"mail": 2}, poll_interval=30.0)
    worker.handler(Task)(lambda job: None)

    def is_mail_fetch(statement: str) -> bool:
        return statement.lstrip().startswith("WITH locked AS") and "sa_job_queue" in statement

    with running(worker):
        wait_listening(worker)
        wait_until(lambda: states(engine, "mail") == {JobState.COMPLETED: 1})
        pause(engine, "mail")
        time.sleep(0.2)  # the pause notification arrives
        with recorded_statements(engine, keep=is_mail_fetch) as fetches:
            for n in range(5):
                add_jobs(engine, [Task(n)], queue="mail")
            time.sleep(0.3)
        assert fetches == []  # five insert notifications, no fetch
        resume(engine, "mail")
        wait_until(lambda: states(engine, "mail") == {JobState.COMPLETED: 6})


# ------------------------------------------------------------------ bad input, no branch


def test_an_unknown_queue_is_refused_and_nothing_is_written(engine: Engine) -> None:
    add_jobs(engine, [Task(0)], queue="mail")
    for call in (sa_jobs.pause_queue, sa_jobs.resume_queue):
        with Session(engine) as session, pytest.raises(UnknownQueueError, match="'mial'"):
            call(session, "mial")
    with Session(engine) as session, pytest.raises(InvalidOptionsError, match="queue"):
        sa_jobs.pause_queue(session, "")
    assert control_rows(engine) == []


def test_a_queue_a_worker_serves_is_known_and_allow_unknown_pauses_any_name(
    engine: Engine, no_workers_or_leader: None
) -> None:
    make_worker_row(engine, "w-1")  # serves "default", which holds no job
    assert pause(engine, "default").paused
    assert pause(engine, "not-yet", allow_unknown=True).paused
    assert control_rows(engine) == [("default", True), ("not-yet", True)]


def test_without_the_queue_branch_pausing_names_the_branch_and_fetch_is_unchanged(
    core_only: Engine,
) -> None:
    with Session(core_only) as session:
        assert not Features.of(session.connection()).queue
        with pytest.raises(SchemaMissingError, match=QUEUE_BRANCH):
            sa_jobs.pause_queue(session, "default", allow_unknown=True)
        with pytest.raises(SchemaMissingError, match=QUEUE_BRANCH):
            sa_jobs.resume_queue(session, "default")
        assert sa_jobs.queue_states(session) == []
    make_job(core_only)
    with recorded_statements(core_only) as sent:
        assert len(fetch(core_only, "default")) == 1
    assert not any("sa_job_queue" in statement for statement in sent)


def test_a_missing_queue_table_is_reported_as_the_queue_branch_not_the_core() -> None:
    class UndefinedTable(Exception):
        sqlstate = "42P01"

    queue_table = missing_schema_error(UndefinedTable('relation "sa_job_queue" does not exist'))
    job_table = missing_schema_error(UndefinedTable('relation "sa_job" does not exist'))

    assert queue_table is not None and queue_table.branch == QUEUE_BRANCH
    assert job_table is not None and job_table.branch == CORE_BRANCH


# ------------------------------------------------------------------ AsyncSession


@pytest.fixture
def async_engine(engine: Engine) -> Iterator[AsyncEngine]:
    async_engine = create_async_engine(engine.url.set(drivername="postgresql+psycopg"))
    yield async_engine
    asyncio.run(async_engine.dispose())


def test_queue_controls_take_an_async_session(engine: Engine, async_engine: AsyncEngine) -> None:
    add_jobs(engine, [Task(0)], queue="mail")
    sessions = async_sessionmaker(async_engine)

    async def scenario() -> tuple[bool, list[str], bool]:
        async with sessions() as session, session.begin():
            paused = await sa_jobs.pause_queue(session, "mail")
        async with sessions() as session:
            listed = await sa_jobs.queue_states(session)
        async with sessions() as session, session.begin():
            resumed = await sa_jobs.resume_queue(session, "mail")
        return paused.paused, [s.name for s in listed], resumed.paused

    assert asyncio.run(scenario()) == (True, ["mail"], False)
