"""The pytest plugin: fixtures for testing an application that uses sa_jobs.

Installed with sa_jobs (entry point ``pytest11``), so the fixtures are there in any
project that has sa_jobs and pytest; nothing happens until a test asks for one.

* ``sa_jobs_database_url`` (session): a throwaway database with sa_jobs' schema, on the
  server of ``--sa-jobs-url`` or found by :func:`sa_jobs.devdb.find_server`; dropped at
  the end of the run.
* ``sa_jobs_engine`` (session): an engine on it. Override it to create your own tables.
* ``sa_jobs_session``: a ``Session`` in a transaction that is rolled back after the
  test, whatever the code under test commits (it commits savepoints).
* ``sa_jobs_worker``: your application's :class:`~sa_jobs.Worker`, named by the
  ``sa_jobs_worker = MODULE:ATTRIBUTE`` ini option, or by a fixture of that name you
  define.
* ``sa_jobs_tester``: :class:`JobsTester`, the assertions and :func:`run_jobs` bound to
  ``sa_jobs_session`` and ``sa_jobs_worker``.

See ``docs/testing.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pytest
from sqlalchemy import URL, Engine, create_engine
from sqlalchemy.orm import Session

from sa_jobs._table.models import Job
from sa_jobs.testing.asserts import (
    KindLike,
    assert_enqueued,
    assert_not_enqueued,
    enqueued_jobs,
)
from sa_jobs.testing.database import migrated_database_on, server_at
from sa_jobs.testing.inline import DEFAULT_MAX_RUNS, RunSummary, run_jobs
from sa_jobs.worker import Worker

__all__ = [
    "JobsTester",
    "sa_jobs_database_url",
    "sa_jobs_engine",
    "sa_jobs_session",
    "sa_jobs_tester",
    "sa_jobs_worker",
]

URL_OPTION = "--sa-jobs-url"
WORKER_INI = "sa_jobs_worker"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("sa_jobs", "sa_jobs job queue")
    group.addoption(
        URL_OPTION,
        default=None,
        metavar="URL",
        help="PostgreSQL server on which the sa_jobs_database_url fixture creates (and "
        "drops) a throwaway database; default $SA_JOBS_DATABASE_URL, $DATABASE_URL, "
        "127.0.0.1:5432, then an embedded server (sa-jobs[embedded])",
    )
    parser.addini(
        WORKER_INI,
        "MODULE:ATTRIBUTE of your sa_jobs.Worker (or of a function returning it), "
        "for the sa_jobs_worker fixture",
        default="",
    )


_USED_DATABASE = pytest.StashKey[str]()


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    used = config.stash.get(_USED_DATABASE, None)
    if used is not None:
        terminalreporter.write_line(f"sa_jobs: tests used the throwaway database {used}")


@pytest.fixture(scope="session")
def sa_jobs_database_url(request: pytest.FixtureRequest) -> Iterator[URL]:
    """A throwaway database migrated to every sa_jobs branch; dropped after the run."""
    server = server_at(request.config.getoption(URL_OPTION))
    try:
        with migrated_database_on(server) as url:
            # Said in the summary: which server a run touched, and the database's name.
            request.config.stash[_USED_DATABASE] = f"{url.database} on {server.source}"
            yield url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def sa_jobs_engine(sa_jobs_database_url: URL) -> Iterator[Engine]:
    """An engine on ``sa_jobs_database_url``. Override it (asking for the original by
    the same name) to create your application's tables on it."""
    engine = create_engine(sa_jobs_database_url)
    yield engine
    engine.dispose()


@pytest.fixture
def sa_jobs_session(sa_jobs_engine: Engine) -> Iterator[Session]:
    """A session whose work is rolled back after the test.

    The session joins an outer transaction that the fixture rolls back; the code under
    test may commit, which commits a savepoint (SQLAlchemy's
    ``join_transaction_mode="create_savepoint"``), so nothing outlives the test.
    """
    with sa_jobs_engine.connect() as connection:
        transaction = connection.begin()
        session = Session(bind=connection, join_transaction_mode="create_savepoint")
        try:
            yield session
        finally:
            session.close()
            transaction.rollback()


@pytest.fixture
def sa_jobs_worker(request: pytest.FixtureRequest) -> Worker:
    """Your application's worker: the one its handlers are registered on."""
    spec = str(request.config.getini(WORKER_INI) or "").strip()
    if not spec:
        raise pytest.UsageError(
            "sa_jobs_worker: say which sa_jobs.Worker has your handlers, either with "
            f"`{WORKER_INI} = myapp.jobs:worker` under [tool.pytest.ini_options] (or "
            "[pytest]), or with a fixture in conftest.py:\n\n"
            "    @pytest.fixture\n"
            "    def sa_jobs_worker():\n"
            "        from myapp.jobs import worker\n"
            "        return worker\n"
        )
    # The command line's loader: same MODULE:ATTRIBUTE rules, same messages.
    from sa_jobs.cli.common import CommandError
    from sa_jobs.cli.work import load_worker

    try:
        return load_worker(spec)
    except CommandError as exc:
        raise pytest.UsageError(f"{WORKER_INI} = {spec}: {exc}") from None


class JobsTester:
    """The assertions and :func:`~sa_jobs.testing.run_jobs`, bound to a session and to
    the worker (asked for only when jobs are run, so assertions need no worker)."""

    def __init__(self, session: Session, worker: Callable[[], Worker]) -> None:
        self.session = session
        self._worker = worker

    @property
    def worker(self) -> Worker:
        return self._worker()

    def run_jobs(
        self,
        *,
        queues: Iterable[str] | None = None,
        scheduled: bool = False,
        max_runs: int = DEFAULT_MAX_RUNS,
    ) -> RunSummary:
        """:func:`~sa_jobs.testing.run_jobs` in the test's session."""
        return run_jobs(
            self.session, self.worker, queues=queues, scheduled=scheduled, max_runs=max_runs
        )

    def enqueued(self, kind: KindLike = None, /, **criteria: Any) -> list[Job[Any]]:
        """:func:`~sa_jobs.testing.enqueued_jobs` in the test's session."""
        return enqueued_jobs(self.session, kind, **criteria)

    def assert_enqueued(self, kind: KindLike = None, /, **criteria: Any) -> Job[Any]:
        """:func:`~sa_jobs.testing.assert_enqueued` in the test's session."""
        __tracebackhide__ = True
        return assert_enqueued(self.session, kind, **criteria)

    def assert_not_enqueued(self, kind: KindLike = None, /, **criteria: Any) -> None:
        """:func:`~sa_jobs.testing.assert_not_enqueued` in the test's session."""
        __tracebackhide__ = True
        assert_not_enqueued(self.session, kind, **criteria)


@pytest.fixture
def sa_jobs_tester(sa_jobs_session: Session, request: pytest.FixtureRequest) -> JobsTester:
    """Assertions and ``run_jobs`` bound to ``sa_jobs_session`` and ``sa_jobs_worker``."""
    return JobsTester(sa_jobs_session, lambda: request.getfixturevalue("sa_jobs_worker"))
