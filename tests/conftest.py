"""Fixtures shared by every test tier.

One PostgreSQL server per test run (see ``sa_jobs.devdb``: env URL, local server, or an
embedded one) and one throwaway database migrated to ``heads``; each test starts with an
empty job table.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import URL, Engine
from sqlalchemy.orm import Session, sessionmaker

from sa_jobs.cli import main
from sa_jobs.devdb import Server, embedded_forced, find_server, running_server
from tests.factories import clear_workers_and_leader
from tests.helpers import (
    CliRun,
    empty_job_table,
    engine_at,
    migrated_database,
    recorded_statements,
    reset_effects,
    url_text,
)
from tests.pgbouncer import PgBouncer, running_pgbouncer

#: The server the header named (None: the embedded one, started by the first test that
#: needs a database); absent when the header was not shown (``-q``).
_HEADER_SERVER = pytest.StashKey[Server | None]()
#: The server this run used, for the summary line of a ``-q`` run.
_USED_SERVER = pytest.StashKey[Server]()


def pytest_report_header(config: pytest.Config) -> str:
    """Say which PostgreSQL the run uses, first thing (the README promises it); an
    embedded one is only announced here, and started when a test first needs it."""
    try:
        forced = embedded_forced()
    except ValueError as exc:
        return f"sa_jobs tests cannot choose a PostgreSQL: {exc}"  # pg_server fails with it
    if forced:
        config.stash[_HEADER_SERVER] = None
        return "sa_jobs tests use an embedded PostgreSQL ($SA_JOBS_EMBEDDED), started on demand"
    server = config.stash[_HEADER_SERVER] = running_server()
    if server is None:
        return (
            "sa_jobs tests use an embedded PostgreSQL (no $SA_JOBS_DATABASE_URL, nothing on "
            "127.0.0.1:5432), started on demand"
        )
    return f"sa_jobs tests use {server.source}"


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    """Say it at the end too when the header did not (``-q``), or did not know it yet
    (an embedded server started on demand, in a directory of its own)."""
    server = config.stash.get(_USED_SERVER, None)
    if server is not None and config.stash.get(_HEADER_SERVER, None) is None:
        terminalreporter.write_line(f"sa_jobs tests used {server.source}")


@pytest.fixture(scope="session")
def pg_server(pytestconfig: pytest.Config) -> Iterator[Server]:
    server = pytestconfig.stash.get(_HEADER_SERVER, None) or find_server()
    pytestconfig.stash[_USED_SERVER] = server
    yield server
    server.stop()


@pytest.fixture(scope="session")
def database_url(pg_server: Server) -> Iterator[URL]:
    with migrated_database(pg_server, "sa_jobs_test") as url:
        yield url


@pytest.fixture(scope="session")
def engine(database_url: URL) -> Iterator[Engine]:
    with engine_at(database_url, pool_size=20, max_overflow=20) as engine:
        yield engine


@pytest.fixture(autouse=True)
def _empty_job_table(request: pytest.FixtureRequest) -> None:
    if "engine" not in request.fixturenames:
        return
    empty_job_table(request.getfixturevalue("engine"))


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
    with engine_at(core_only_url) as engine:
        empty_job_table(engine)
        yield engine


@pytest.fixture
def no_workers_or_leader(engine: Engine) -> Iterator[None]:
    """No heartbeat rows and no maintenance lease, before and after the test (other tests'
    workers leave theirs)."""
    clear_workers_and_leader(engine)
    yield
    clear_workers_and_leader(engine)


@pytest.fixture
def statements(engine: Engine) -> Iterator[list[str]]:
    """Every SQL statement the engine sends while the test runs."""
    with recorded_statements(engine) as seen:
        yield seen


@pytest.fixture
def effect_table(engine: Engine) -> None:
    """The (empty) table handlers write their effects to (see ``tests.helpers.effects``)."""
    reset_effects(engine)


@pytest.fixture(scope="session")
def pgbouncer(database_url: URL) -> Iterator[PgBouncer]:
    """A PgBouncer of the tests' own, in transaction pooling mode, in front of the test
    database (see ``tests.pgbouncer``); skipped where pgbouncer is not installed."""
    with running_pgbouncer(database_url) as bouncer:
        yield bouncer


@pytest.fixture
def bouncer_engine(pgbouncer: PgBouncer) -> Iterator[Engine]:
    """An engine through PgBouncer, as ``docs/operations.md`` says to build one: psycopg 3
    never prepares statements on the server (they would not survive a transaction)."""
    with engine_at(
        pgbouncer.url, pool_size=10, max_overflow=10, connect_args={"prepare_threshold": None}
    ) as engine:
        yield engine


@pytest.fixture
def cli(database_url: URL, engine: Engine, capsys: pytest.CaptureFixture[str]) -> CliRun:
    """``cli("jobs", "list")`` runs ``sa-jobs jobs list --url <test db>`` in-process and
    returns ``(exit code, stdout, stderr)``; ``engine`` makes the schema exist first."""
    url = url_text(database_url)

    def run(*argv: str) -> tuple[int, str, str]:
        code = main([*argv, "--url", url])
        out, err = capsys.readouterr()
        return code, out, err

    return run
