"""Every supported driver, sync and async: inserts, the session functions, and a worker.

The ``driver_engine`` fixture gives an ``Engine`` (psycopg 3, psycopg2) or an
``AsyncEngine`` (psycopg 3 async, asyncpg) on the test database; each test runs on each.
With an async engine every session function is awaited, as an async app would.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import inspect
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import asyncpg
import pytest
from sqlalchemy import URL, Engine, create_engine, func, select, text
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_scoped_session,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import Session, scoped_session, sessionmaker

import sa_jobs
from sa_jobs import InsertAction, Job, JobState, RemoveOutcome, UniqueOpts
from sa_jobs.devdb import Server, throwaway_database
from sa_jobs.errors import InvalidOptionsError
from tests.helpers import (
    AN_HOUR,
    add_job,
    cancel,
    effects,
    engine_at,
    get_job,
    make_worker,
    migrated_database,
    reset_effects,
    running,
    same_transaction,
    wait_for_state,
    wait_listening,
    wait_until,
    write_effect,
    write_effect_async,
)

T = TypeVar("T")

SYNC_DRIVERS = ("psycopg", "psycopg2")
ASYNC_DRIVERS = ("psycopg_async", "asyncpg")


@sa_jobs.job_args(kind="driver_plain")
class Plain:
    n: int


@sa_jobs.job_args(kind="driver_async")
class Async:
    n: int


@sa_jobs.job_args(kind="driver_plain_session")
class PlainWithSession:
    n: int


@sa_jobs.job_args(kind="driver_async_session")
class AsyncWithSession:
    n: int


@pytest.fixture(params=SYNC_DRIVERS + ASYNC_DRIVERS)
def driver_engine(request: pytest.FixtureRequest, database_url: URL) -> Iterator[Any]:
    driver: str = request.param
    url = database_url.set(drivername=f"postgresql+{driver}")
    if driver in ASYNC_DRIVERS:
        async_engine = create_async_engine(url)
        yield async_engine
        asyncio.run(async_engine.dispose())
    else:
        sync_engine = create_engine(url)
        yield sync_engine
        sync_engine.dispose()


def in_session(engine: Engine | AsyncEngine, work: Callable[[Any], Awaitable[T]]) -> T:
    """Run ``await work(session)`` in a transaction of a session of ``engine``'s kind (an
    ``AsyncSession`` for an async engine); ``work`` passes what sa_jobs returns through
    :func:`result`, which awaits it only when it is awaitable."""

    async def run() -> T:
        if isinstance(engine, AsyncEngine):
            async with AsyncSession(engine, expire_on_commit=False) as session, session.begin():
                return await work(session)
        with Session(engine, expire_on_commit=False) as session, session.begin():
            return await work(session)

    return asyncio.run(run())


async def result(value: Any) -> Any:
    """What a session function returned: awaited for an ``AsyncSession``."""
    return await value if inspect.isawaitable(value) else value


def test_every_insert_path_works_on_every_driver(driver_engine: Any, engine: Engine) -> None:
    once = UniqueOpts(by_args=True)

    async def work(session: Any) -> Any:
        session.add(sa_jobs.enqueue(Plain(1)))
        return (
            await result(sa_jobs.insert(session, Plain(2), priority=2)),
            await result(sa_jobs.insert_many(session, [Plain(3), Plain(4)], queue="other")),
            await result(sa_jobs.insert(session, Plain(5), unique=once)),
            await result(sa_jobs.insert(session, Plain(5), unique=once)),
        )

    single, many, first, duplicate = in_session(driver_engine, work)
    assert single.job.args == Plain(2) and single.job.priority == 2
    assert [r.job.queue for r in many] == ["other", "other"]
    assert first.action is InsertAction.INSERTED
    assert duplicate.action is InsertAction.SKIPPED_DUPLICATE
    assert duplicate.job.id == first.job.id
    with Session(engine) as session:
        stored = session.scalars(select(Job).order_by(Job.id)).all()
        assert sorted(job.args.n for job in stored) == [1, 2, 3, 4, 5]


def test_insert_many_fast_copies_on_every_driver(driver_engine: Any, engine: Engine) -> None:
    awkward = 'tab\t, newline\n, back\\slash, "quotes", é'
    later = sa_jobs.InsertOpts(scheduled_at=dt.datetime.now(dt.UTC) + dt.timedelta(hours=1))

    async def work(session: Any) -> Any:
        return await result(
            sa_jobs.insert_many_fast(
                session,
                [Plain(1), sa_jobs.InsertManyParams(Plain(2), later), Plain(3)],
                tags=[awkward],
            )
        )

    assert in_session(driver_engine, work) == 3
    with Session(engine) as session:
        stored = session.scalars(select(Job).order_by(Job.id)).all()
        assert [(job.args.n, job.state, job.tags) for job in stored] == [
            (1, JobState.AVAILABLE, [awkward]),
            (2, JobState.SCHEDULED, []),  # its own options, not the shared ones
            (3, JobState.AVAILABLE, [awkward]),
        ]


def test_a_rolled_back_transaction_leaves_no_job(driver_engine: Any, engine: Engine) -> None:
    class Rollback(Exception):
        pass

    async def work(session: Any) -> None:
        session.add(sa_jobs.enqueue(Plain(1)))
        await result(sa_jobs.insert(session, Plain(2)))
        await result(session.flush())
        raise Rollback

    with pytest.raises(Rollback):
        in_session(driver_engine, work)
    with Session(engine) as session:
        assert session.scalars(select(Job)).all() == []


def test_cancel_retry_remove_and_complete_in_take_either_session(
    driver_engine: Any, engine: Engine
) -> None:
    waiting = add_job(engine, Plain(1))
    finished = add_job(engine, Plain(2))
    with Session(engine) as session, session.begin():
        sa_jobs.insert(session, Plain(3), job_key="the-key")
        running_job = sa_jobs.insert(session, Plain(4)).job.id
        session.execute(
            text("UPDATE sa_job SET state = 'discarded', finalized_at = now() WHERE id = :id"),
            {"id": finished},
        )
        session.execute(
            text("UPDATE sa_job SET state = 'running', attempt = 1 WHERE id = :id"),
            {"id": running_job},
        )

    async def work(session: Any) -> Any:
        cancelled = await result(sa_jobs.cancel_job(session, waiting))
        retried = await result(sa_jobs.retry_job(session, finished))
        removed = await result(sa_jobs.remove_job(session, "the-key"))
        job = await result(session.get(Job, running_job))
        await result(sa_jobs.complete_in(session, job))
        return cancelled.state, retried.state, removed

    assert in_session(driver_engine, work) == (
        JobState.CANCELLED,
        JobState.AVAILABLE,
        RemoveOutcome.REMOVED,
    )
    assert get_job(engine, running_job).state is JobState.COMPLETED


def test_a_worker_runs_every_kind_of_handler_on_every_driver(
    driver_engine: Any, engine: Engine
) -> None:
    reset_effects(engine)
    seen: dict[str, type] = {}
    worker = make_worker(driver_engine)

    @worker.handler(Plain)
    def plain(job: Job[Plain]) -> None:
        seen["plain"] = type(job.args)

    @worker.handler(Async)
    async def in_loop(job: Job[Async]) -> None:
        await asyncio.sleep(0)
        seen["async"] = type(job.args)

    @worker.handler(PlainWithSession)
    def with_session(job: Job[PlainWithSession], session: Session) -> None:
        seen["plain_session"] = type(session)
        write_effect(session, job)

    @worker.handler(AsyncWithSession)
    async def with_async_session(job: Job[AsyncWithSession], session: AsyncSession) -> None:
        seen["async_session"] = type(session)
        await write_effect_async(session, job)

    ids = [add_job(engine, args) for args in (Plain(1), Async(2), PlainWithSession(3))]
    ids.append(add_job(engine, AsyncWithSession(4)))
    worker.run_until_idle(timeout=30)

    assert {job_id: get_job(engine, job_id).state for job_id in ids} == dict.fromkeys(
        ids, JobState.COMPLETED
    )
    assert seen == {
        "plain": Plain,
        "async": Async,
        "plain_session": Session,
        "async_session": AsyncSession,
    }
    # Session handlers' writes commit with their job's completion.
    assert [row[0] for row in effects(engine)] == ids[2:]
    assert all(same_transaction(engine, job_id) for job_id in ids[2:])


def test_failures_retry_and_a_cancel_interrupts_a_running_job_on_every_driver(
    driver_engine: Any, engine: Engine
) -> None:
    started = threading.Event()
    worker = make_worker(driver_engine, retry_policy=AN_HOUR)

    @worker.handler(Plain)
    def failing(job: Job[Plain]) -> None:
        raise RuntimeError(f"attempt {job.attempt} failed")

    @worker.handler(Async)
    async def waiting(job: Job[Async]) -> None:
        started.set()
        await asyncio.sleep(30)  # until cancelled

    with running(worker):
        wait_listening(worker)
        failed = add_job(engine, Plain(1))
        waiter = add_job(engine, Async(2))
        retryable = wait_for_state(engine, failed, JobState.RETRYABLE)
        assert retryable.errors[-1]["error"] == "RuntimeError: attempt 1 failed"
        assert started.wait(5)
        cancel(engine, waiter)  # the worker hears it on its LISTEN connection
        wait_for_state(engine, waiter, JobState.CANCELLED)


def test_new_jobs_wake_the_worker_on_every_driver(driver_engine: Any, engine: Engine) -> None:
    # Polling once a minute: only a notification can get the job worked in time.
    worker = make_worker(driver_engine, poll_interval=60.0)
    done = threading.Event()

    @worker.handler(Plain)
    def plain(job: Job[Plain]) -> None:
        done.set()

    with running(worker):
        wait_listening(worker)
        time.sleep(0.2)  # the first poll after start has passed
        job_id = add_job(engine, Plain(1))
        assert done.wait(5), "the worker was not woken by the insert's notification"
        wait_for_state(engine, job_id, JobState.COMPLETED)


def test_an_async_app_runs_the_worker_beside_its_own_use_of_the_engine(
    database_url: URL, engine: Engine
) -> None:
    """The FastAPI shape: one asyncpg engine, the app's requests on the app's loop, the
    worker started from that loop; both use the engine at once without sharing
    connections across loops."""
    app_engine = create_async_engine(database_url.set(drivername="postgresql+asyncpg"))
    worked: list[int] = []

    async def app() -> None:
        worker = make_worker(app_engine, queues={"default": 4})

        @worker.handler(AsyncWithSession)
        async def handle(job: Job[AsyncWithSession], session: AsyncSession) -> None:
            await session.execute(text("SELECT pg_sleep(0.01)"))
            worked.append(job.args.n)

        async with worker:

            async def request(n: int) -> None:
                async with AsyncSession(app_engine) as session, session.begin():
                    await sa_jobs.insert(session, AsyncWithSession(n))
                    await session.execute(text("SELECT pg_sleep(0.01)"))

            await asyncio.gather(*(request(n) for n in range(20)))
            deadline = time.monotonic() + 15
            while len(worked) < 20 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        await app_engine.dispose()

    asyncio.run(app())
    assert sorted(worked) == list(range(20))
    with engine.connect() as connection:
        states = connection.scalars(select(Job.state)).all()
    assert states == [JobState.COMPLETED] * 20


def test_an_engine_derived_from_an_async_engine_must_reach_its_database(
    pg_server: Server, database_url: URL
) -> None:
    """An asyncpg engine whose connections come from ``async_creator`` while its URL
    names another database: the sync engine sa_jobs derives from the URL would work
    the wrong database, so the worker refuses to start and says what to pass."""
    with migrated_database(pg_server, "sa_jobs_test_elsewhere") as elsewhere:
        real = database_url

        async def connect() -> Any:
            return await asyncpg.connect(
                user=real.username, host=real.host, port=real.port, database=real.database
            )

        pretend = elsewhere.set(drivername="postgresql+asyncpg")
        async_engine = create_async_engine(pretend, async_creator=connect)
        worker = make_worker(async_engine)

        @worker.handler(Plain)
        def plain(job: Job[Plain]) -> None:
            pass

        with pytest.raises(InvalidOptionsError, match="reaches another database") as exc:
            worker.start()
        assert "sync_engine=" in str(exc.value)
        assert not worker.is_running
        asyncio.run(async_engine.dispose())

        # Given the matching sync engine, the same worker starts and works.
        sync_engine = create_engine(real)
        ok = make_worker(async_engine, sync_engine=sync_engine)

        @ok.handler(Plain)
        def also_plain(job: Job[Plain]) -> None:
            pass

        with Session(sync_engine) as session, session.begin():
            job_id = sa_jobs.insert(session, Plain(1)).job.id
        ok.run_until_idle(timeout=20)
        assert get_job(sync_engine, job_id).state is JobState.COMPLETED
        sync_engine.dispose()
        asyncio.run(async_engine.dispose())


def test_an_async_app_migrates_through_run_sync_and_is_told_how_otherwise(
    pg_server: Server,
) -> None:
    with throwaway_database(pg_server, prefix="sa_jobs_test_async_migrate") as url:
        async_engine = create_async_engine(url.set(drivername="postgresql+asyncpg"))

        async def migrate() -> int:
            with pytest.raises(InvalidOptionsError, match=r"run_sync\(sa_jobs.migrate\)"):
                sa_jobs.migrate(async_engine)  # type: ignore[arg-type]
            async with async_engine.begin() as connection:
                await connection.run_sync(sa_jobs.migrate)
            async with AsyncSession(async_engine) as session, session.begin():
                job_id = (await sa_jobs.insert(session, Plain(1))).job.id
            await async_engine.dispose()
            return job_id

        assert asyncio.run(migrate()) >= 1


def test_asyncpg_url_settings_are_translated_for_the_derived_engine(
    database_url: URL, engine: Engine
) -> None:
    """asyncpg's own URL settings (ssl=, a statement cache size for PgBouncer, a command
    timeout) mean nothing to libpq; the worker's derived psycopg engine translates or
    drops them instead of failing to connect."""
    url = database_url.set(
        drivername="postgresql+asyncpg",
        query={"ssl": "disable", "prepared_statement_cache_size": "0", "command_timeout": "5"},
    )
    async_engine = create_async_engine(url)
    worker = make_worker(async_engine)
    assert dict(worker.engine.url.query) == {"sslmode": "disable"}

    @worker.handler(Plain)
    def plain(job: Job[Plain]) -> None:
        pass

    job_id = add_job(engine, Plain(1))
    worker.run_until_idle(timeout=20)
    assert get_job(engine, job_id).state is JobState.COMPLETED
    asyncio.run(async_engine.dispose())


def test_engine_options_of_the_wrong_kind_are_refused_with_what_to_pass(engine: Engine) -> None:
    with pytest.raises(InvalidOptionsError, match="Engine or AsyncEngine"):
        sa_jobs.Worker("postgresql://localhost/app")  # type: ignore[arg-type]
    with pytest.raises(InvalidOptionsError, match="sync_engine: is for a worker given an Async"):
        sa_jobs.Worker(engine, sync_engine=engine)
    with pytest.raises(InvalidOptionsError, match="async_engine: must be an AsyncEngine"):
        sa_jobs.Worker(engine, async_engine=engine)  # type: ignore[arg-type]


def test_an_engine_on_another_schema_of_the_same_database_is_refused(
    pg_server: Server,
) -> None:
    """The app's asyncpg engine works schema ``app`` (its search_path); ``public`` holds
    sa_jobs tables too. The derived sync engine would work ``public``: same server,
    database and role, yet another table — the worker refuses to start."""
    with throwaway_database(pg_server, prefix="sa_jobs_test_schemas") as url:
        with engine_at(url) as setup, setup.begin() as connection:
            connection.execute(text("CREATE SCHEMA app"))
        for options in ({}, {"options": "-c search_path=app"}):
            with engine_at(url, connect_args=options) as setup:
                sa_jobs.migrate(setup)
        app_engine = create_async_engine(
            url.set(drivername="postgresql+asyncpg"),
            connect_args={"server_settings": {"search_path": "app"}},
        )
        worker = make_worker(app_engine)

        @worker.handler(Plain)
        def plain(job: Job[Plain]) -> None:
            pass

        with pytest.raises(InvalidOptionsError, match="another sa_job table") as exc:
            worker.start()
        assert "sync_engine=" in str(exc.value)
        assert not worker.is_running
        asyncio.run(app_engine.dispose())


def test_scoped_sessions_count_as_their_session(database_url: URL, engine: Engine) -> None:
    """Flask-SQLAlchemy's ``db.session`` is a ``scoped_session``; async apps have
    ``async_scoped_session``."""
    scoped = scoped_session(sessionmaker(engine))
    with scoped.begin():
        first = sa_jobs.insert(scoped, Plain(1)).job.id
    scoped.remove()

    async_engine = create_async_engine(database_url.set(drivername="postgresql+asyncpg"))

    async def async_app() -> int:
        factory = async_sessionmaker(async_engine, expire_on_commit=False)
        session = async_scoped_session(factory, scopefunc=asyncio.current_task)
        async with session.begin():
            result = await sa_jobs.insert(session, Plain(2))
        await session.remove()
        await async_engine.dispose()
        return result.job.id

    second = asyncio.run(async_app())
    assert [get_job(engine, i).args for i in (first, second)] == [Plain(1), Plain(2)]


def test_a_session_passed_by_keyword_still_works(engine: Engine) -> None:
    job_id = add_job(engine, Plain(1))
    with Session(engine) as session, session.begin():
        assert sa_jobs.cancel_job(session=session, job_id=job_id).state is JobState.CANCELLED  # type: ignore[call-overload]


def test_cancelling_an_awaited_drain_stops_the_worker(engine: Engine) -> None:
    started = threading.Event()
    worker = make_worker(engine, queues={"default": 1})

    @worker.handler(Plain)
    def slow(job: Job[Plain]) -> None:
        started.set()
        time.sleep(0.3)

    for n in range(20):
        add_job(engine, Plain(n))

    async def drain_then_give_up() -> None:
        task = asyncio.create_task(worker.run_until_idle_async(timeout=60))
        await asyncio.to_thread(started.wait, 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(drain_then_give_up())
    assert not worker.is_running
    with engine.connect() as connection:
        left = connection.scalar(
            select(func.count()).select_from(Job).where(Job.state == JobState.AVAILABLE)
        )
    assert left and left >= 15  # the rest stayed queued


def test_a_handler_cannot_be_registered_on_a_running_worker(engine: Engine) -> None:
    worker = make_worker(engine)

    @worker.handler(Plain)
    def plain(job: Job[Plain]) -> None:
        pass

    with running(worker), pytest.raises(InvalidOptionsError, match="while the worker runs"):

        @worker.handler(Async)
        async def late(job: Job[Async]) -> None:
            pass


def test_a_lost_listen_connection_is_a_warning_and_comes_back_on_psycopg2(
    database_url: URL, engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    psycopg2_engine = create_engine(database_url.set(drivername="postgresql+psycopg2"))
    worker = make_worker(psycopg2_engine, poll_interval=60.0)  # only LISTEN wakes it
    done = threading.Event()

    @worker.handler(Plain)
    def plain(job: Job[Plain]) -> None:
        done.set()

    def lost() -> list[logging.LogRecord]:
        return [r for r in caplog.records if "listen connection lost" in r.getMessage()]

    with running(worker):
        wait_listening(worker)
        time.sleep(0.2)  # the first poll after start has passed
        with engine.connect() as connection:
            connection.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND query LIKE 'LISTEN%'"
                )
            )
        wait_until(lost, what="the worker to notice its LISTEN connection is gone")
        wait_listening(worker, timeout=10)
        add_job(engine, Plain(1))
        assert done.wait(5), "no wake-up after the LISTEN connection came back"
    psycopg2_engine.dispose()
    assert all(r.levelno == logging.WARNING for r in lost())
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_session_function_called_without_a_session_says_what_it_takes() -> None:
    with pytest.raises(TypeError, match=r"insert\(\) takes a Session or an AsyncSession first"):
        sa_jobs.insert()  # type: ignore[call-overload]
