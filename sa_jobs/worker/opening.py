"""A transaction whose BEGIN carries its first statements: one round trip, not several.

The limited and keyed fetches (:mod:`.limited_fetch`, :mod:`.keyed_fetch`) open their
transaction with the limits' advisory locks and counts. Sent one by one, that is BEGIN,
the locks, the counts: a round trip each before the fetch itself. On psycopg 3 they go
as one query instead: a query without parameters is sent by the simple protocol, which
takes several statements separated by semicolons, and psycopg's ``nextset()`` reads each
statement's result in turn. The values are rendered as literals by the engine's dialect.

Soundness is that of separate statements: the server runs the statements of a simple
query in order, in the transaction the leading BEGIN opened, each on a snapshot of its
own (READ COMMITTED). So a count after the locks begins after they are held and sees
every fetch that committed before it, as it would have as a statement of its own.

Other drivers take the usual path: the driver's BEGIN, then each statement as its own
round trip. A statement that cannot be rendered as literals has no place in the opening:
run it after, on the connection.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

from sqlalchemy import Connection, CursorResult, Dialect, Engine, Select
from sqlalchemy.exc import DBAPIError

from sa_jobs.worker.db_access import autocommit

__all__ = ["GENERIC_PLANS", "Read", "opened_transaction", "opening_query"]


#: A ``settings`` for :func:`opened_transaction`: the fetch statements that follow run
#: their one generic plan once psycopg has prepared them (their fifth run on a
#: connection), instead of being planned again at every fetch, which costs about what
#: running them does (``docs/performance.md``). ``SET LOCAL``: it ends with the
#: transaction, so nothing else on the connection (a handler's queries) is affected, and
#: behind PgBouncer it cannot leak. Only statements whose generic plan was checked at
#: size may run under it: a generic plan takes a ``LIMIT`` parameter for a tenth of the
#: table, so a join whose plan follows that estimate can become a scan of ``sa_job`` (the
#: plain fetch reads by primary key, ``= ANY`` of its locked ids; the keyed statement's
#: plan was checked at 700,000 rows).
GENERIC_PLANS = "SET LOCAL plan_cache_mode = force_generic_plan"


class Read(NamedTuple):
    """What one opening statement returned: its column names and rows."""

    names: tuple[str, ...]
    rows: list[tuple[Any, ...]]

    def mapping(self) -> dict[str, Any]:
        """The statement's one row, by column name."""
        (row,) = self.rows
        return dict(zip(self.names, row, strict=True))


@functools.lru_cache(maxsize=128)
def opening_query(statements: tuple[Select[Any], ...], dialect: Dialect, settings: str) -> str:
    """BEGIN, ``settings`` (if any) and ``statements`` with their values as literals, as
    one query. Cached: the statements are cached objects, so a fetch renders them once
    per engine, not once per fetch."""
    parts = ["BEGIN", *([settings] if settings else [])]
    parts += [
        str(statement.compile(dialect=dialect, compile_kwargs={"literal_binds": True}))
        for statement in statements
    ]
    return "; ".join(parts)


def _read(result: CursorResult[Any]) -> Read:
    if not result.returns_rows:
        return Read((), [])
    return Read(tuple(result.keys()), [tuple(row) for row in result])


@contextmanager
def opened_transaction(
    engine: Engine, statements: Sequence[Select[Any]], *, settings: str = ""
) -> Iterator[tuple[Connection, list[Read]]]:
    """A transaction that has run ``statements`` (in order), with what each returned;
    committed when the block ends, rolled back if it raises (releasing any transaction
    lock the statements took).

    On psycopg 3: an autocommit connection that sends BEGIN, ``settings`` and the
    statements as one query (:func:`opening_query`), and its own COMMIT or ROLLBACK.
    ``settings`` (``SET LOCAL ...``) is sent on that path only: it is there for psycopg's
    prepared statements. Other drivers: :meth:`Engine.begin` and a round trip per
    statement."""
    if engine.dialect.driver != "psycopg":
        with engine.begin() as connection:
            yield connection, [_read(connection.execute(statement)) for statement in statements]
        return
    with autocommit(engine).connect() as connection:
        # The driver's own calls, not SQLAlchemy's: an execution context costs more CPU
        # than the round trip (a profile).
        driver: Any = connection.connection.driver_connection
        query = opening_query(tuple(statements), connection.dialect, settings)
        try:
            cursor = driver.execute(query)
            reads = []
            while True:
                if cursor.description:
                    names = tuple(column.name for column in cursor.description)
                    reads.append(Read(names, cursor.fetchall()))
                else:
                    reads.append(Read((), []))
                if not cursor.nextset():
                    break
            # The first results are BEGIN's and the settings'.
            yield connection, reads[len(reads) - len(statements) :]
            driver.commit()
        except BaseException as exc:
            # The opening query, the block (which raises SQLAlchemy's errors or its own)
            # or the COMMIT failed: end the transaction either way.
            _roll_back(connection, driver)
            translated = _as_sqlalchemy_error(exc, query, connection, driver)
            if translated is exc:
                raise
            raise translated from exc


def _roll_back(connection: Connection, driver: Any) -> None:
    """End the failed transaction. psycopg's rollback() reads the server's transaction
    status, so it ends it though the connection is in autocommit mode; a connection that
    cannot (lost with the server) is invalidated, so the pool drops it instead of trying
    to reset it."""
    try:
        driver.rollback()
    except Exception:
        connection.invalidate()


def _as_sqlalchemy_error(
    exc: BaseException, statement: str, connection: Connection, driver: Any
) -> BaseException:
    """An error of our own driver calls, as SQLAlchemy raises the same error from its
    own: a ``DBAPIError`` subclass (``OperationalError`` for a lost connection) saying
    whether the connection was invalidated. The worker tells a passing outage from a
    failure by those (``db_access.is_transient``); a bare psycopg error would be logged
    as a failure on every retry. Anything else (the caller's own errors, SQLAlchemy's
    from the statements run inside the block) is returned as it was."""
    dialect = connection.dialect
    driver_error = dialect.loaded_dbapi.Error
    if not isinstance(exc, driver_error):
        return exc
    lost = bool(driver.closed or driver.broken)
    if lost and not connection.invalidated:
        connection.invalidate()
    return DBAPIError.instance(
        statement,
        None,
        exc,  # type: ignore[arg-type]
        driver_error,
        connection_invalidated=lost,
        dialect=dialect,
    )
