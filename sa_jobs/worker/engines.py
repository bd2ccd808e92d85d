"""The two engines a worker needs, made from the one the user gives, on any driver.

A worker's own work — fetching, writing outcomes, maintenance, ``LISTEN``, and the
sessions of sync handlers — runs in threads on a **sync** engine; async handlers run on
the worker's event loop with sessions on an **async** engine. The user gives one engine,
of either kind, on any of psycopg 3, psycopg2 or asyncpg (pg8000 works too, polling):

* The other kind is the one passed explicitly (``sync_engine=`` / ``async_engine=``), or
  else derived from the given engine's URL with the driver form that exists for it
  (:data:`SYNC_FORMS`, :data:`ASYNC_FORMS`; psycopg 3 is always installed, so there is
  always one). A derived engine cannot carry a ``creator=`` or ``connect_args`` over, so
  at start the worker checks that it reaches the very same database (same server start,
  database, oid and role) and refuses to start otherwise, saying what to pass.
* An async engine is used on the worker's own event loop, and async connections belong
  to the loop that opened them: the app's ``AsyncEngine`` may be serving the app's loop
  at the same time, so the worker never shares its pool. It uses :func:`own_pool`: the
  same dialect, URL, ``creator``/``connect_args`` and pool events, with a pool of its
  own that is emptied when the worker stops.
* Behind PgBouncer in transaction mode a server-side prepared statement does not survive
  its transaction, so psycopg 3 must not prepare (``prepare_threshold=None``). A derived
  async engine prepares as the given sync engine's connections do (psycopg 2 never
  prepares, so neither does the engine derived from it), and at start the worker warns
  when its engine reaches the server through a pooler and still prepares
  (:func:`prepare_warning`).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import URL, Connection, Engine, create_engine, func, select, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from sa_jobs._base.urls import ASYNC_FORMS, SYNC_FORMS, in_driver, require_postgresql
from sa_jobs.errors import InvalidOptionsError

__all__ = [
    "WorkerEngines",
    "async_identity",
    "database_identity",
    "own_pool",
    "prepare_warning",
]


# A derived engine serves the worker alone: its pool keeps a few connections and opens
# more as the worker's concurrency needs (never more than it has handlers running, plus
# its own threads), so session handlers never wait on a pool sized for someone else.
# No pool_pre_ping: it would add a round trip to every fetch and completion, and the
# worker already retries what a dropped connection fails (as on the user's own engine).
_DERIVED_POOL: dict[str, Any] = {"pool_size": 5, "max_overflow": -1}

# The last column is the sa_job table unqualified names reach: two engines on one
# database with different search_paths would otherwise work different tables.
_IDENTITY = text(
    "SELECT pg_postmaster_start_time(), current_database(), current_user, "
    "(SELECT oid FROM pg_database WHERE datname = current_database()), "
    "to_regclass('sa_job')::oid"
)


def _prepare_threshold(connection: Connection) -> int | None:
    """psycopg 3's ``prepare_threshold`` of this connection; None for a driver that never
    prepares statements on the server by itself (psycopg2)."""
    threshold = getattr(connection.connection.driver_connection, "prepare_threshold", None)
    return threshold if isinstance(threshold, int) else None


def _reported_pid(connection: Connection) -> int | None:
    """The backend pid the client was told at connect (a pooler tells its own)."""
    driver: Any = connection.connection.driver_connection
    info = getattr(driver, "info", None)  # psycopg 3
    pid = getattr(info, "backend_pid", None)
    if pid is None and callable(getattr(driver, "get_backend_pid", None)):  # psycopg2
        pid = driver.get_backend_pid()
    return pid if isinstance(pid, int) else None


def prepare_warning(connection: Connection) -> str | None:
    """What to say when ``connection`` reaches the server through a pooler (the backend
    pid it was given at connect is not the server's: PgBouncer hands out its own) and
    psycopg 3 still prepares statements on the server, which PgBouncer in transaction
    mode (before 1.21, or without ``max_prepared_statements``) loses between
    transactions. None when neither is the case. A session-mode pooler would be fine;
    hence a warning, not an error."""
    threshold = _prepare_threshold(connection)
    reported = _reported_pid(connection)
    if threshold is None or reported is None:
        return None
    if connection.scalar(select(func.pg_backend_pid())) == reported:
        return None
    return (
        "the worker's engine reaches the server through a connection pooler (PgBouncer?) "
        f"and psycopg 3 prepares statements run {threshold} times on the server; in "
        'transaction pooling mode they fail with \'prepared statement "_pg3_0" does not '
        "exist'. Build the engine with create_engine(url, connect_args="
        '{"prepare_threshold": None}) (see docs/operations.md)'
    )


def database_identity(connection: Connection) -> tuple[Any, ...]:
    """What tells one database apart from every other — its server's start, name, oid,
    the role we are — and which ``sa_job`` table (schema) it resolves to."""
    return tuple(connection.execute(_IDENTITY).one())


async def async_identity(engine: AsyncEngine) -> tuple[Any, ...]:
    """:func:`database_identity` through an async engine."""
    async with engine.connect() as connection:
        return await _identity_of(connection)


async def _identity_of(connection: AsyncConnection) -> tuple[Any, ...]:
    return tuple((await connection.execute(_IDENTITY)).one())


def own_pool(engine: AsyncEngine) -> AsyncEngine:
    """``engine`` with a pool of its own (see the module): the pool's ``recreate()``
    keeps its creator — hence ``connect_args`` and ``do_connect`` hooks, which live on
    the shared dialect — its size and its events."""
    sync = engine.sync_engine
    copy = Engine(
        sync.pool.recreate(),
        sync.dialect,
        sync.url,
        logging_name=sync.logging_name,
        echo=sync.echo,
        hide_parameters=sync.hide_parameters,
        execution_options=sync.get_execution_options(),
    )
    return AsyncEngine(copy)


class WorkerEngines:
    """The sync and async engines of one worker, and where each came from.

    Args:
        given: The engine passed as ``Worker(engine)``.
        sync_engine: ``Worker(..., sync_engine=)``: for an async ``given``, the engine of
            the worker's threads instead of a derived one.
        async_engine: ``Worker(..., async_engine=)``: the engine of async handlers'
            sessions instead of one derived from ``given`` (used with a pool of its own).
    """

    def __init__(
        self,
        given: Engine | AsyncEngine,
        *,
        sync_engine: Engine | None = None,
        async_engine: AsyncEngine | None = None,
    ) -> None:
        if not isinstance(given, Engine | AsyncEngine):
            raise InvalidOptionsError(
                "engine",
                f"must be a SQLAlchemy Engine or AsyncEngine, got {type(given).__name__}; "
                "build one with create_engine(...) or create_async_engine(...)",
            )
        for option, value, kind in (
            ("sync_engine", sync_engine, Engine),
            ("async_engine", async_engine, AsyncEngine),
        ):
            if value is not None and not isinstance(value, kind):
                raise InvalidOptionsError(
                    option, f"must be an {kind.__name__}, got {type(value).__name__}"
                )
        for option, value in (
            ("engine", given),
            ("sync_engine", sync_engine),
            ("async_engine", async_engine),
        ):
            if value is not None:
                require_postgresql(value, option)
        self.given = given
        self._derived_sync = False
        if isinstance(given, AsyncEngine):
            if sync_engine is None:
                sync_engine = self._derive_sync(given)
                self._derived_sync = True
            async_source: AsyncEngine | None = async_engine or given
        else:
            if sync_engine is not None:
                raise InvalidOptionsError(
                    "sync_engine", "is for a worker given an AsyncEngine; this one has an Engine"
                )
            sync_engine = given
            async_source = async_engine
        #: The engine of the worker's threads and of sync handlers' sessions.
        self.sync: Engine = sync_engine
        #: Where async handlers' engine comes from (None: derived from the sync URL).
        self._async_source = async_source
        self._async: AsyncEngine | None = None

    @staticmethod
    def _derive_sync(given: AsyncEngine) -> Engine:
        driver = given.dialect.driver
        sync_driver = SYNC_FORMS.get(driver)
        if sync_driver is None:
            raise InvalidOptionsError(
                "engine",
                f"sa_jobs does not know a sync form of the {driver} driver; pass "
                "Worker(async_engine_of_yours, sync_engine=create_engine(...))",
            )
        return create_engine(in_driver(given.url, sync_driver), **_DERIVED_POOL)

    @property
    def async_problem(self) -> str | None:
        """Why async handlers cannot have sessions, or None."""
        if self._async_source is not None or self.sync.dialect.driver in ASYNC_FORMS:
            return None
        return (
            f"the engine's driver ({self.sync.dialect.driver}) has no async form sa_jobs "
            "knows; pass Worker(..., async_engine=...) or make the handler sync"
        )

    def describe_async(self) -> str:
        if self._async_source is self.given:
            return "the worker's AsyncEngine"
        if self._async_source is not None:
            return "the async_engine you passed"
        return "the async engine sa_jobs derived from your engine's URL"

    def describe_sync(self) -> str:
        if self._derived_sync:
            return "the sync engine sa_jobs derived from your AsyncEngine's URL"
        if self.sync is not self.given:
            return "the sync_engine you passed"
        return "the worker's engine"

    @property
    def sync_is_derived(self) -> bool:
        return self._derived_sync

    @property
    def async_is_derived(self) -> bool:
        """Async handlers' engine is (or will be) derived from the sync engine's URL."""
        return self._async_source is None

    def async_url(self) -> URL:
        """The URL of async handlers' engine (made or still to be made)."""
        if self._async is not None:
            return self._async.url
        if self._async_source is not None:
            return self._async_source.url
        return self.sync.url

    def async_engine(self) -> AsyncEngine:
        """The async engine for the worker's loop (made on first use, see the module)."""
        if self._async is None:
            if self._async_source is not None:
                self._async = own_pool(self._async_source)
            else:
                driver = self.sync.dialect.driver
                async_driver = ASYNC_FORMS.get(driver)
                if async_driver is None:
                    raise InvalidOptionsError("async_engine", self.async_problem or driver)
                with self.sync.connect() as connection:
                    threshold = _prepare_threshold(connection)
                self._async = create_async_engine(
                    in_driver(self.sync.url, async_driver),
                    connect_args={"prepare_threshold": threshold},
                    **_DERIVED_POOL,
                )
        return self._async

    def forget_async(self) -> AsyncEngine | None:
        """Hand back the loop's async engine for disposal; the next run makes a new one."""
        engine, self._async = self._async, None
        return engine

    def dispose_derived(self) -> None:
        """Close the derived sync engine's connections (the worker owns it)."""
        if self._derived_sync:
            self.sync.dispose()
