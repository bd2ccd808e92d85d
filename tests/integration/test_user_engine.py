"""The worker uses the engine it was given — for everything.

Every engine here is built with ``creator=`` connecting to the test database while its
URL points somewhere else (a port nobody listens on, or another database): a worker that
rebuilt connections from ``engine.url`` would wake up from, or write to, the wrong place.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import URL, Engine, create_engine, event, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

import sa_jobs
from sa_jobs import Job, JobState
from sa_jobs.devdb import Server
from sa_jobs.errors import InvalidOptionsError
from tests.helpers import (
    add_job,
    effects,
    libpq_url,
    make_worker,
    migrated_database,
    reset_effects,
    running,
    url_text,
    wait_for_state,
    wait_listening,
    wait_until,
    write_effect_async,
)

NOWHERE = "postgresql+psycopg://nobody@127.0.0.1:1/nowhere"
MARKER = "sa_jobs_test_user_engine"


@sa_jobs.job_args(kind="user_engine_job")
class Touch:
    n: int = 0


def creator_engine(real: URL, pretend: str = NOWHERE, **options: Any) -> Engine:
    """An engine whose URL says ``pretend`` but whose connections go to ``real``."""
    engine = create_engine(pretend, creator=lambda: psycopg.connect(libpq_url(real)), **options)

    @event.listens_for(engine, "connect")
    def mark(dbapi_connection: Any, _record: Any) -> None:
        with dbapi_connection.cursor() as cursor:
            cursor.execute(f"SET application_name = '{MARKER}'")
        dbapi_connection.commit()

    return engine


@pytest.fixture
def user_engine(database_url: URL) -> Iterator[Engine]:
    engine = creator_engine(database_url)
    yield engine
    engine.dispose()


@pytest.fixture
def other_database(pg_server: Server) -> Iterator[URL]:
    with migrated_database(pg_server, "sa_jobs_other") as url:
        yield url


def test_wakeups_come_through_a_listen_connection_of_the_users_engine(
    user_engine: Engine, engine: Engine
) -> None:
    # Polling every 30 s: only a NOTIFY can start the job within the test.
    worker = make_worker(user_engine, poll_interval=30.0)

    @worker.handler(Touch)
    def touch(job: Job) -> None:
        pass

    with running(worker):
        wait_listening(worker, timeout=10)
        job_id = add_job(engine, Touch())
        wait_for_state(engine, job_id, JobState.COMPLETED, timeout=5)
        with engine.connect() as connection:
            listeners = (
                connection.execute(
                    text(
                        "SELECT application_name FROM pg_stat_activity "
                        "WHERE query LIKE 'LISTEN sa_jobs%' AND datname = current_database()"
                    )
                )
                .scalars()
                .all()
            )
        # The engine's own "connect" event ran on the LISTEN connection.
        assert MARKER in listeners


@sa_jobs.job_args(kind="user_engine_async")
class AsyncTouch:
    n: int = 0


def async_session_worker(engine: Engine, **options: Any) -> sa_jobs.Worker:
    worker = make_worker(engine, **options)

    @worker.handler(AsyncTouch)
    async def touch(job: Job, session: AsyncSession) -> None:
        await write_effect_async(session, job, "async")

    return worker


def test_an_async_session_handler_never_runs_on_another_database(
    database_url: URL, engine: Engine, other_database: URL
) -> None:
    # The URL names a real database, but not the one the creator connects to: an async
    # engine derived from the URL would write there.
    misleading = creator_engine(database_url, pretend=url_text(other_database))
    worker = async_session_worker(misleading)
    try:
        with pytest.raises(InvalidOptionsError, match="reaches another database") as exc:
            worker.start()
        assert "async_engine=" in str(exc.value)
        assert not worker.is_running
    finally:
        misleading.dispose()


def test_an_async_engine_that_cannot_connect_is_refused_at_start(user_engine: Engine) -> None:
    worker = async_session_worker(user_engine)  # derived from NOWHERE
    with pytest.raises(InvalidOptionsError, match="cannot reach the database"):
        worker.start()


def test_an_async_engine_given_to_the_worker_is_used_and_checked(
    user_engine: Engine, engine: Engine, database_url: URL, other_database: URL
) -> None:
    reset_effects(engine)
    async_engine = create_async_engine(database_url.set(drivername="postgresql+psycopg_async"))
    worker = async_session_worker(user_engine, async_engine=async_engine)
    job_id = add_job(engine, AsyncTouch())
    with running(worker):
        wait_for_state(engine, job_id, JobState.COMPLETED)
    assert effects(engine) == [(job_id, 1, "async")]
    # And it can run again: the engine's pool was emptied with the worker's event loop.
    second = add_job(engine, AsyncTouch(1))
    with running(worker):
        wait_for_state(engine, second, JobState.COMPLETED)

    elsewhere = create_async_engine(other_database.set(drivername="postgresql+psycopg_async"))
    wrong = async_session_worker(user_engine, async_engine=elsewhere)
    with pytest.raises(InvalidOptionsError, match="another database than the worker's engine"):
        wrong.start()
    wait_until(lambda: not wrong.is_running)
