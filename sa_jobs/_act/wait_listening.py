r"""The listening half of :mod:`sa_jobs._act.waiting`: a connection that ``LISTEN``\s on
``sa_jobs_done`` and hands over the payloads (job ids) of the notifications, sync or
async, for each driver that can wait for them (None where one cannot: the waiter polls).
"""

from __future__ import annotations

import asyncio
import contextlib
import select as select_
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import AsyncEngine

from sa_jobs._table.schema import DONE_CHANNEL

__all__ = ["async_listening", "listening", "read_notifies"]


@contextlib.contextmanager
def listening(engine: Engine) -> Iterator[Callable[[float], Iterator[str]] | None]:
    """Payloads of done notifications, waited for up to a timeout, on a connection of
    ``engine``'s taken out of its pool for good; None where the driver cannot wait for
    notifications (psycopg 3 and psycopg2 can; the waiter polls otherwise).

    The same few lines as the worker's notifier (``sa_jobs.worker.notifier``), which
    this layer cannot import."""
    driver = engine.dialect.driver
    if driver not in ("psycopg", "psycopg2"):
        yield None
        return
    pooled = engine.raw_connection()
    connection: Any = pooled.driver_connection
    pooled.detach()
    try:
        connection.rollback()
        connection.autocommit = True
        if driver == "psycopg":
            connection.execute(f"LISTEN {DONE_CHANNEL}")

            def payloads(timeout: float) -> Iterator[str]:
                for notification in connection.notifies(timeout=timeout):
                    yield notification.payload

        else:
            with connection.cursor() as cursor:
                cursor.execute(f"LISTEN {DONE_CHANNEL}")

            def payloads(timeout: float) -> Iterator[str]:
                # psycopg2 reads notifications when polled; select() waits for the socket.
                if select_.select([connection], [], [], timeout)[0]:
                    connection.poll()
                    while connection.notifies:
                        yield connection.notifies.pop(0).payload

        yield payloads
    finally:
        with contextlib.suppress(Exception):
            pooled.close()


@contextlib.asynccontextmanager
async def async_listening(
    engine: AsyncEngine, wanted: Callable[[int], bool]
) -> AsyncIterator[asyncio.Event | None]:
    """An event set when a job ``wanted`` accepts is notified; None where the driver
    cannot listen (polls then). The connection goes back to the pool unlistened."""
    wake = asyncio.Event()

    def notified(payload: str) -> None:
        if payload.isdigit() and wanted(int(payload)):
            wake.set()

    async with engine.connect() as connection:
        raw = await connection.get_raw_connection()
        driver = raw.driver_connection
        driver_name = engine.dialect.driver
        if driver_name == "asyncpg":
            callback = lambda _c, _pid, _channel, payload: notified(payload)  # noqa: E731
            await driver.add_listener(DONE_CHANNEL, callback)  # type: ignore[union-attr]
            try:
                yield wake
            finally:
                with contextlib.suppress(Exception):
                    await driver.remove_listener(DONE_CHANNEL, callback)  # type: ignore[union-attr]
            return
        if driver_name != "psycopg":
            yield None
            return
        await connection.exec_driver_sql(f"LISTEN {DONE_CHANNEL}")
        reader = asyncio.create_task(read_notifies(driver, notified))
        try:
            yield wake
        finally:
            reader.cancel()
            with contextlib.suppress(BaseException):
                await reader
            try:
                await connection.exec_driver_sql("UNLISTEN *")
            except Exception:
                await connection.invalidate()


async def read_notifies(driver: Any, notified: Any) -> None:
    async for notification in driver.notifies():
        notified(notification.payload)
