"""Database URLs in another driver's form: what a worker derives an engine from, and what
the command line and the test tools connect with.

psycopg 3 is sa_jobs' own driver (always installed): its sync form runs the worker's
threads and the command line, its async form async handlers' sessions when the app
gives a sync engine. Switching a URL's driver must also translate the query parameters
that only one driver knows, or the other refuses to connect: asyncpg's ``ssl=`` is
libpq's ``sslmode=``, and asyncpg's statement-cache and timeout settings mean nothing to
libpq (psycopg 3 and psycopg2 share libpq's parameters, so between them nothing changes).

It also refuses, in one line, a URL or an engine of another database (``mysql://``,
``sqlite://``): everything in sa_jobs is PostgreSQL's SQL, which another database would
refuse later with a traceback about ``pg_advisory_xact_lock`` or ``information_schema``.
"""

from __future__ import annotations

from sqlalchemy import URL, Connection, Engine
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from sa_jobs.errors import InvalidOptionsError

__all__ = ["ASYNC_FORMS", "SYNC_FORMS", "in_driver", "require_postgresql", "servers"]

#: The async driver a sync URL is switched to (async handlers' sessions).
ASYNC_FORMS = {"psycopg": "psycopg_async", "psycopg2": "psycopg_async", "pg8000": "psycopg_async"}
#: The sync driver an async URL is switched to (an async psycopg engine's dialect calls
#: its driver ``psycopg`` too).
SYNC_FORMS = {"asyncpg": "psycopg", "psycopg": "psycopg", "psycopg_async": "psycopg"}

# asyncpg connection settings libpq does not know (asyncpg.connect's keyword arguments).
_ASYNCPG_ONLY = frozenset(
    {
        "prepared_statement_cache_size",
        "prepared_statement_name_func",
        "max_cached_statement_lifetime",
        "max_cacheable_statement_size",
        "command_timeout",
        "timeout",
        "server_settings",
        "direct_tls",
        "record_class",
    }
)
# asyncpg's ssl= values that are libpq sslmode values too; true/false are its booleans.
_SSL_TO_SSLMODE = {
    "true": "require",
    "false": "disable",
    **{
        mode: mode for mode in ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
    },
}


def in_driver(url: URL, driver: str) -> URL:
    """``url`` for ``driver`` (``psycopg``, ``psycopg_async``…), its query translated."""
    query = dict(url.query)
    if url.get_driver_name() == "asyncpg" and driver != "asyncpg":
        ssl = query.pop("ssl", None)
        if isinstance(ssl, str) and "sslmode" not in query:
            query["sslmode"] = _SSL_TO_SSLMODE.get(ssl.lower(), ssl)
        query = {key: value for key, value in query.items() if key not in _ASYNCPG_ONLY}
    return url.set(drivername=f"{url.get_backend_name()}+{driver}", query=query)


#: What a URL's backend is called for PostgreSQL (``postgres://`` is Heroku's spelling).
_POSTGRESQL_NAMES = frozenset({"postgresql", "postgres"})


def require_postgresql(
    target: URL | Engine | AsyncEngine | Connection | AsyncConnection, option: str
) -> None:
    """Refuse a URL or engine of another database before anything connects through it.

    Args:
        target: A URL, an engine or a connection.
        option: What the caller calls it, for the message (``engine``, ``bind``…).

    Raises:
        InvalidOptionsError: ``target`` is not PostgreSQL.
    """
    backend = target.get_backend_name() if isinstance(target, URL) else target.dialect.name
    if backend not in _POSTGRESQL_NAMES:
        raise InvalidOptionsError(
            option,
            f"sa_jobs needs PostgreSQL (14 or newer), not {backend}; "
            "give it a postgresql:// URL, e.g. postgresql+psycopg://user@host:5432/dbname",
        )


def servers(url: URL) -> str:
    """``host:port`` of the server ``url`` names, for messages — of each server, comma
    separated, for a multi-host URL (``?host=a:5432&host=b:5433``, or ``?host=a,b&port=
    5432,5433``: see docs/operations.md, "Failover")."""
    listed = url.query.get("host")
    if url.host or not listed:
        return f"{url.host or 'localhost'}:{url.port or 5432}"
    hosts = [h for entry in _as_tuple(listed) for h in entry.split(",")]
    ports = [p for entry in _as_tuple(url.query.get("port")) for p in entry.split(",")]
    default = str(url.port or 5432)
    named = []
    for index, host in enumerate(hosts):
        if ":" in host:
            named.append(host)
        else:
            port = ports[index] if index < len(ports) else (ports[0] if ports else default)
            named.append(f"{host}:{port}")
    return ",".join(named)


def _as_tuple(value: str | tuple[str, ...] | None) -> tuple[str, ...]:
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)
