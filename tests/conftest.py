"""Fixtures shared by every test tier.

One PostgreSQL server per test run (see ``sa_jobs.devdb``: env URL, local server, or an
embedded one) and one throwaway database migrated to ``heads``; each test starts with an
empty job table.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import URL, Engine, create_engine, text
from sqlalchemy.orm import Session, sessionmaker

from sa_jobs.devdb import Server, find_server
from tests.databases import migrated_database


@pytest.fixture(scope="session")
def pg_server() -> Iterator[Server]:
    server = find_server()
    print(f"\nsa_jobs tests use {server.source}")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def database_url(pg_server: Server) -> Iterator[URL]:
    with migrated_database(pg_server, "sa_jobs_test") as url:
        yield url


@pytest.fixture(scope="session")
def engine(database_url: URL) -> Iterator[Engine]:
    engine = create_engine(database_url, pool_size=20, max_overflow=20)
    yield engine
    engine.dispose()


@pytest.fixture(autouse=True)
def _empty_job_table(request: pytest.FixtureRequest) -> None:
    if "engine" not in request.fixturenames:
        return
    engine: Engine = request.getfixturevalue("engine")
    with engine.begin() as connection:
        connection.execute(text("TRUNCATE sa_job RESTART IDENTITY"))


@pytest.fixture
def session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine)


@pytest.fixture(scope="session")
def core_only_url(pg_server: Server) -> Iterator[URL]:
    """A database with only the core branch installed (no unique, sequence, job_key)."""
    with migrated_database(pg_server, "sa_jobs_core_only", "sa_jobs_core@head") as url:
        yield url


@pytest.fixture
def core_only(core_only_url: URL) -> Iterator[Engine]:
    engine = create_engine(core_only_url)
    with engine.begin() as connection:
        connection.execute(text("TRUNCATE sa_job RESTART IDENTITY"))
    yield engine
    engine.dispose()
