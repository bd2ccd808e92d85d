"""Plain jobs through ``COPY``: the bulk path that returns nothing but a count.

:func:`sa_jobs.insert_many_fast` is River's ``InsertManyFast``: jobs validated exactly as
:func:`sa_jobs.insert_many` validates them (:mod:`sa_jobs._insert.rows`), then streamed into
``sa_job`` with ``COPY … FROM STDIN`` in the caller's transaction, instead of the
``INSERT … SELECT FROM jsonb_to_recordset`` statement that returns every row. What the
statement does and ``COPY`` cannot — deciding ``scheduled`` on the database clock,
``ON CONFLICT`` for unique keys and job keys, the advisory locks of sequences — is left to
the statement path: such rows (:func:`copyable` says which) go through
:func:`~sa_jobs._insert.insert.write_rows` in the same transaction, in their place, so ids
still follow input order.

``COPY`` fires the table's statement-level triggers, so the workers' ``NOTIFY`` is sent
as for any insert. The rows are written as ``COPY``'s text format, built here, and handed
to whichever driver the engine uses (psycopg 3 sync or async, psycopg2, asyncpg): one
encoding, four thin calls.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

from sa_jobs._base.records import JobRow
from sa_jobs._table.models import Job, job_table

__all__ = ["COPY_COLUMNS", "copy_rows", "copy_statement", "copyable", "encode", "supports_copy"]

#: Written for every copied row; ``state`` is ``available`` (nothing scheduled is copied)
#: and every other column takes its default.
COPY_COLUMNS = ("kind", "args", "queue", "priority", "max_attempts", "tags", "metadata", "state")
#: Written only when a row of the batch has one (the sa_jobs_fairness branch's column).
_PARTITION_KEY = "partition_key"

#: What the statement path does and ``COPY`` cannot: a row with one of these goes there.
_STATEMENT_ONLY = ("unique_key", "sequence_key", "job_key", "scheduled_at")

# COPY's text format: backslash escapes for the characters that delimit it.
_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


def copyable(row: JobRow) -> bool:
    """Whether ``COPY`` writes ``row`` as the statement would: available now, no keys."""
    return not any(row.get(name) is not None for name in _STATEMENT_ONLY)


def _text(value: str) -> str:
    return value.translate(_ESCAPES)


def _array(values: Sequence[str]) -> str:
    # An array literal, then escaped for COPY like any other value.
    quoted = ('"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"' for value in values)
    return _text("{" + ",".join(quoted) + "}")


def encode(rows: Sequence[JobRow], partitioned: bool) -> bytes:
    """The rows in ``COPY``'s text format, columns as :func:`copy_statement` lists them."""
    lines = []
    for row in rows:
        fields = [
            _text(row["kind"]),
            _text(_JSON(row["args"])),
            _text(row["queue"]),
            str(row["priority"]),
            str(row["max_attempts"]),
            _array(row["tags"]),
            _text(_JSON(row["metadata"])),
            "available",
        ]
        if partitioned:
            key = row.get("partition_key")
            fields.append("\\N" if key is None else _text(key))
        lines.append("\t".join(fields))
    lines.append("")
    return "\n".join(lines).encode()


def _columns(partitioned: bool) -> tuple[str, ...]:
    return (*COPY_COLUMNS, _PARTITION_KEY) if partitioned else COPY_COLUMNS


def copy_statement(connection: Connection, partitioned: bool) -> str:
    """``COPY sa_job (…) FROM STDIN``, the table named as the dialect quotes it."""
    table = connection.dialect.identifier_preparer.format_table(Job.__table__)
    return f"COPY {table} ({', '.join(_columns(partitioned))}) FROM STDIN"


def copy_rows(connection: Connection, rows: Sequence[JobRow]) -> int:
    """``COPY`` ``rows`` (each :func:`copyable`) into ``sa_job`` in the connection's
    transaction; returns how many were written."""
    if not rows:
        return 0
    partitioned = any(row.get(_PARTITION_KEY) is not None for row in rows)
    data = encode(rows, partitioned)
    sql = copy_statement(connection, partitioned)
    try:
        _DRIVERS.get(_driver(connection), _unsupported)(
            connection, sql, data, _columns(partitioned)
        )
    except Exception as exc:
        # The driver's own error, raised past SQLAlchemy: wrap it as SQLAlchemy wraps a
        # statement's (ProgrammingError and so on), so callers catch one family, and a
        # missing schema branch is named (translate_missing_schema).
        if isinstance(exc, DBAPIError | NotImplementedError):
            raise
        raise DBAPIError.instance(sql, None, exc, Exception) from exc
    return len(rows)


# ------------------------------------------------------------------------------ drivers
# Each takes the connection, the COPY statement, the data and the column names.
_Copy = Callable[[Connection, str, bytes, tuple[str, ...]], None]


def _psycopg(connection: Connection, sql: str, data: bytes, _columns: tuple[str, ...]) -> None:
    driver: Any = connection.connection.driver_connection
    with driver.cursor() as cursor, cursor.copy(sql) as copy:
        copy.write(data)


def _psycopg_async(
    connection: Connection, sql: str, data: bytes, _columns: tuple[str, ...]
) -> None:
    async def write(driver: Any) -> None:
        async with driver.cursor() as cursor, cursor.copy(sql) as copy:
            await copy.write(data)

    _adapted(connection).run_async(write)


def _psycopg2(connection: Connection, sql: str, data: bytes, _columns: tuple[str, ...]) -> None:
    driver: Any = connection.connection.driver_connection
    with driver.cursor() as cursor:
        cursor.copy_expert(sql, io.BytesIO(data))


def _asyncpg(connection: Connection, _sql: str, data: bytes, columns: tuple[str, ...]) -> None:
    table = job_table

    async def write(driver: Any) -> None:
        await driver.copy_to_table(
            table.name,
            schema_name=table.schema,
            source=io.BytesIO(data),
            columns=list(columns),
            format="text",
        )

    _adapted(connection).run_async(write)


def _adapted(connection: Connection) -> Any:
    # An async driver's connection as SQLAlchemy adapts it: run_async() awaits a call of
    # the driver from the sync code AsyncSession.run_sync runs in a greenlet.
    return connection.connection.dbapi_connection


def _unsupported(connection: Connection, sql: str, data: bytes, columns: tuple[str, ...]) -> None:
    raise NotImplementedError(  # guarded by supports_copy(); a new driver must be added
        f"COPY through the {_driver(connection)} driver"
    )


_DRIVERS: dict[tuple[str, bool], _Copy] = {
    ("psycopg", False): _psycopg,
    ("psycopg", True): _psycopg_async,
    ("psycopg2", False): _psycopg2,
    ("asyncpg", True): _asyncpg,
}


def _driver(connection: Connection) -> tuple[str, bool]:
    # psycopg 3 is one dialect name for both engines; is_async tells them apart.
    return connection.dialect.driver, bool(connection.dialect.is_async)


def supports_copy(connection: Connection) -> bool:
    """Whether the engine's driver has a ``COPY`` path here (else the statement is used)."""
    return _driver(connection) in _DRIVERS
