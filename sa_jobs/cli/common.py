"""What every ``sa-jobs`` command shares: the one-line errors, the engine (and a session)
on ``--url``, and the plain-text table."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import NoReturn

from sqlalchemy import URL, Engine, create_engine
from sqlalchemy.exc import ArgumentError, OperationalError
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from sa_jobs._base.replicas import ReplicaReads, ReplicaStatus
from sa_jobs._table.schema import translate_missing_schema
from sa_jobs.devdb import normalize_url
from sa_jobs.errors import InvalidOptionsError

__all__ = [
    "CommandError",
    "Parser",
    "UsageError",
    "connection_failure",
    "engine_from",
    "first_line",
    "format_table",
    "parse_url",
    "reading_session",
    "replica_from",
    "session_from",
    "with_connect_timeout",
]


class Parser(argparse.ArgumentParser):
    """argparse, with a usage mistake reported on one line like every other error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


class CommandError(Exception):
    """A failure the user can fix from the command line; printed as one line, exit 1."""

    exit_code = 1


class UsageError(CommandError):
    """The command was asked wrongly (a bad option or variable value); exit 2, as argparse
    does for its own usage errors."""

    exit_code = 2


def engine_from(options: argparse.Namespace, *, pool_size: int | None = None) -> Engine:
    """An engine on the resolved ``--url``: one connection at a time, or a pool of
    ``pool_size`` for a long-running command that makes many short queries."""
    raw = options.url
    if not raw:
        raise CommandError("no database; pass --url or set SA_JOBS_DATABASE_URL")
    url = with_connect_timeout(parse_url(raw))
    if pool_size is not None:
        return create_engine(url, pool_size=pool_size)
    return create_engine(url, poolclass=NullPool)


#: Seconds each server of the URL gets to accept a connection, when the URL sets no
#: ``connect_timeout``: libpq's own default is to wait for ever, and a host that vanished
#: (packets dropped, not refused) would hang a command for the OS's TCP timeout.
DEFAULT_CONNECT_TIMEOUT = 10


def with_connect_timeout(url: URL) -> URL:
    """``url`` with :data:`DEFAULT_CONNECT_TIMEOUT` unless it sets its own."""
    if "connect_timeout" in url.query or url.get_driver_name() == "asyncpg":
        return url
    return url.update_query_dict({"connect_timeout": str(DEFAULT_CONNECT_TIMEOUT)})


def parse_url(raw: str) -> URL:
    """``--url`` (or its variable) as a psycopg 3 URL; one line for one that cannot be
    parsed or is not PostgreSQL's."""
    try:
        return normalize_url(raw)
    except InvalidOptionsError as exc:
        # mysql://, sqlite://: said before any driver is imported or any file created.
        raise CommandError(str(exc)) from None
    except (ArgumentError, ValueError):
        # Not echoed: a URL may hold a password.
        raise CommandError(
            "the database URL cannot be parsed; expected e.g. postgresql://user@host:5432/dbname"
        ) from None


@contextmanager
def session_from(options: argparse.Namespace) -> Iterator[Session]:
    """A session on the resolved ``--url`` for one command, its engine disposed after;
    a missing schema is reported as the one-line error that says to migrate."""
    engine = engine_from(options)
    try:
        with Session(engine) as session, translate_missing_schema():
            yield session
    finally:
        engine.dispose()


def replica_from(
    options: argparse.Namespace, *, pool_size: int | None = None
) -> ReplicaReads | None:
    """The replica of ``--read-url`` and its guard's settings (an engine as
    :func:`engine_from` makes); None without one."""
    raw = getattr(options, "read_url", None)
    if not raw:
        return None
    url = with_connect_timeout(parse_url(raw))
    engine = (
        create_engine(url, poolclass=NullPool)
        if pool_size is None
        else create_engine(url, pool_size=pool_size)
    )
    return ReplicaReads(
        engine,
        max_lag=options.max_replica_lag.total_seconds(),
        on_lag=options.on_replica_lag,
        option="--read-url",
    )


@contextmanager
def reading_session(options: argparse.Namespace) -> Iterator[tuple[Session, ReplicaStatus | None]]:
    """A session to read in: on ``--read-url`` when given (or on ``--url`` when the
    replica is too far behind and the guard falls back), and where it went."""
    replica = replica_from(options)
    if replica is None:
        with session_from(options) as session:
            yield session, None
        return
    primary = engine_from(options)
    try:
        with (
            translate_missing_schema(),
            replica.reading(primary.begin) as (connection, status),
            Session(bind=connection) as session,
        ):
            yield session, status
    finally:
        primary.dispose()
        replica.sync_engine.dispose()


#: What libpq says when the server answers but has no such database. SQLSTATE 3D000
#: would say it too, but libpq gives no SQLSTATE for a connection that failed (psycopg's
#: ``sqlstate`` is None there); asyncpg and a failure after connecting do carry it.
_MISSING_DATABASE = re.compile(r'database "(?P<name>[^"]+)" does not exist')
_PLAIN_NAME = re.compile(r"[a-z_][a-z0-9_$]*")


def connection_failure(exc: OperationalError) -> str:
    """One line for a failed connection that says which side is missing: a server that
    answered without the database (and how to create it), or no server at all."""
    orig = exc.orig or exc
    match = _MISSING_DATABASE.search(str(orig))
    if match is None and getattr(orig, "sqlstate", None) != "3D000":
        each = _each_server(str(orig))
        if len(each) > 1:
            return (
                f"cannot reach the database: none of the URL's {len(each)} servers accepted "
                f"a connection ({'; '.join(each)}); start one, or fix the host list"
            )
        return f"cannot reach the database: {first_line(orig)}"
    if match is None:
        return (
            f"the server answered, but the database does not exist ({first_line(orig)}): "
            "create it with createdb, or CREATE DATABASE in psql"
        )
    name = match["name"]
    quoted = name if _PLAIN_NAME.fullmatch(name) else '"' + name.replace('"', '""') + '"'
    shell = name if _PLAIN_NAME.fullmatch(name) else "'" + name.replace("'", "'\\''") + "'"
    return (
        f'the server answered, but it has no database "{name}": create it '
        f"(`createdb {shell}`, or `CREATE DATABASE {quoted};` in psql), then run this again"
    )


def first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns separated by two spaces; trailing blanks trimmed."""
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in (header, *rows)
    )


#: One server's line in psycopg's report of a multi-host connect that failed everywhere:
#: "- host: 'a', port: '5432', hostaddr: '…': connection failed: <why>" (psycopg 3.1+;
#: libpq's own report, psycopg2's, names only the last server).
_SERVER_FAILURE = re.compile(
    r"^- host: '(?P<host>[^']*)', port: '(?P<port>[^']*)'(?:, hostaddr: '[^']*')?: (?P<why>.*)$",
    re.MULTILINE,
)
#: libpq's wording of a refused or timed-out connect, shortened to its cause.
_CAUSE = re.compile(
    r"(?:connection failed: )?(?:connection to server at [^,]+, port \d+ failed: )?"
)


def _each_server(message: str) -> list[str]:
    """``host:port: why`` for each server a multi-host connect tried, in order."""
    return [
        f"{found['host']}:{found['port']}: {_CAUSE.sub('', found['why'], count=1).strip()}"
        for found in _SERVER_FAILURE.finditer(message)
    ]
