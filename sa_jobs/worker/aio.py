"""The event loop that async handlers run on, in a thread of its own, and the async
engine their sessions use.

An ``async def`` handler that takes a session gets an ``AsyncSession`` on an
``AsyncEngine``: the one passed as ``Worker(..., async_engine=...)``, or else one
derived from the worker's engine URL with the driver's async form (``psycopg`` →
``psycopg_async``). A derived engine cannot carry a ``creator=`` or ``connect_args``
over, so before any handler uses it the worker checks that it reaches the very same
database as the sync engine (same server start time, same database, same user) — and
refuses to start if not, rather than let a handler write somewhere else. The same check
applies to an engine the user passes.

Async connections belong to the event loop that opened them, so an async engine given to
the worker is for the worker alone: it is used on the worker's loop, and its pool is
emptied (``dispose()``) when the worker stops.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any

from sqlalchemy import Connection, Engine, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from sa_jobs.error_records import describe
from sa_jobs.errors import InvalidOptionsError

__all__ = ["ASYNC_DRIVERS", "EventLoopThread", "database_identity"]

#: The async form of each sync driver that has one.
ASYNC_DRIVERS = {"psycopg": "psycopg_async"}

_IDENTITY = text(
    "SELECT pg_postmaster_start_time(), current_database(), current_user, "
    "(SELECT oid FROM pg_database WHERE datname = current_database())"
)


def database_identity(connection: Connection) -> tuple[Any, ...]:
    """What tells one database apart from every other: its server's start, name, oid, and
    the role we are."""
    return tuple(connection.execute(_IDENTITY).one())


async def _async_identity(connection: AsyncConnection) -> tuple[Any, ...]:
    return tuple((await connection.execute(_IDENTITY)).one())


def derive_async_engine(engine: Engine) -> AsyncEngine:
    """An async engine on ``engine``'s URL with the driver's async form.

    Raises:
        InvalidOptionsError: the driver has no async form.
    """
    driver = engine.dialect.driver
    async_driver = ASYNC_DRIVERS.get(driver)
    if async_driver is None:
        raise InvalidOptionsError(
            "async_engine",
            f"async handlers that take a session need an async engine, and the "
            f"{driver} driver has none; pass Worker(..., async_engine=create_async_engine(...))",
        )
    url = engine.url.set(drivername=f"{engine.url.get_backend_name()}+{async_driver}")
    return create_async_engine(url)


class EventLoopThread:
    def __init__(self, engine: Engine, async_engine: AsyncEngine | None) -> None:
        self._sync_engine = engine
        self._given = async_engine
        self._async_engine: AsyncEngine | None = async_engine
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="sa_jobs-asyncio", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coroutine: Coroutine[Any, Any, None]) -> concurrent.futures.Future[None]:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def async_engine(self) -> AsyncEngine:
        """The async engine handlers' sessions use (checked by :meth:`check_async_engine`)."""
        if self._async_engine is None:
            self._async_engine = derive_async_engine(self._sync_engine)
        return self._async_engine

    def check_async_engine(self, timeout: float = 30.0) -> None:
        """Make sure the async engine reaches the sync engine's database.

        Raises:
            InvalidOptionsError: it does not, or it cannot connect at all.
        """
        with self._sync_engine.connect() as connection:
            expected = database_identity(connection)
        engine = self.async_engine()
        where = (
            "the async_engine you passed"
            if self._given is not None
            else ("the async engine sa_jobs derived from your engine's URL")
        )
        try:
            found = self.call(self._identity_of(engine), timeout)
        except Exception as exc:
            raise InvalidOptionsError(
                "async_engine",
                f"{where} cannot reach the database ({describe(exc)}); pass one built like "
                "your engine: Worker(..., async_engine=create_async_engine(...))",
            ) from exc
        if found != expected:
            raise InvalidOptionsError(
                "async_engine",
                f"{where} reaches another database than the worker's engine "
                f"({found[1]!r} vs {expected[1]!r}); "
                + (
                    "a derived engine cannot copy creator= or connect_args, so pass "
                    "Worker(..., async_engine=create_async_engine(...)) built like your engine"
                    if self._given is None
                    else "pass an async engine on the same database"
                ),
            )

    @staticmethod
    async def _identity_of(engine: AsyncEngine) -> tuple[Any, ...]:
        async with engine.connect() as connection:
            return await _async_identity(connection)

    def call(self, coroutine: Coroutine[Any, Any, Any], timeout: float) -> Any:
        """Run ``coroutine`` on the loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def stop(self, timeout: float = 10.0) -> None:
        if self._async_engine is not None and self._thread.is_alive():
            # Its pooled connections belong to this loop, which is about to close.
            with contextlib.suppress(Exception):  # the database may be gone already
                self.call(self._async_engine.dispose(), timeout)
        self._async_engine = self._given
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout)
        if not self._thread.is_alive():
            self.loop.close()
