"""One LISTEN connection per worker: wake-ups for new jobs, and cancellation requests.

Channels: ``sa_jobs_insert`` (payload: a queue name; sent by the insert trigger and the
scheduler) and ``sa_jobs_control`` (payload: JSON such as ``{"cancel": 42}``, sent by
:func:`sa_jobs.cancel_job`). Notifications are a shortcut, never the only path: producers
also poll, and the worker also looks for cancel requests in running jobs' metadata, so a
notification lost while the connection was down delays work but never loses it.

The connection comes from the worker's own engine — its pool, its ``creator``, its
``connect_args``, its ``connect`` events — and is then detached from the pool, so the
``LISTEN`` it holds never leaks to a connection the application checks out later.
psycopg 3 and psycopg2 connections can wait for notifications (:class:`Listener`); with
any other driver (pg8000) the worker polls instead, and says so in its log.
"""

from __future__ import annotations

import contextlib
import json
import logging
import select
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import Engine

if TYPE_CHECKING:
    import psycopg

from sa_jobs.error_records import describe
from sa_jobs.schema import CONTROL_CHANNEL, INSERT_CHANNEL
from sa_jobs.worker.backoff import is_transient
from sa_jobs.worker.service import Backoff, Service

__all__ = ["Notifier"]

log = logging.getLogger("sa_jobs.worker")


class ListenUnsupportedError(Exception):
    """The engine's driver gives connections that cannot wait for notifications."""


class Listener(Protocol):
    """A driver connection in autocommit mode, ``LISTEN``-ing."""

    def notifications(self, timeout: float) -> Iterator[tuple[str, str]]:
        """``(channel, payload)`` pairs as they arrive, for up to ``timeout`` seconds."""
        ...


class _Psycopg3(Listener):
    def __init__(self, connection: psycopg.Connection[Any]) -> None:
        connection.rollback()
        connection.autocommit = True
        for channel in (INSERT_CHANNEL, CONTROL_CHANNEL):
            connection.execute(f"LISTEN {channel}")
        self._connection = connection

    def notifications(self, timeout: float) -> Iterator[tuple[str, str]]:
        for notification in self._connection.notifies(timeout=timeout):
            yield notification.channel, notification.payload


class _Psycopg2(Listener):
    def __init__(self, connection: Any) -> None:
        connection.rollback()
        connection.autocommit = True
        with connection.cursor() as cursor:
            for channel in (INSERT_CHANNEL, CONTROL_CHANNEL):
                cursor.execute(f"LISTEN {channel}")
        self._connection = connection

    def notifications(self, timeout: float) -> Iterator[tuple[str, str]]:
        connection = self._connection
        # psycopg2 reads notifications when polled; select() waits for the socket.
        if select.select([connection], [], [], timeout)[0]:
            connection.poll()
            while connection.notifies:
                notification = connection.notifies.pop(0)
                yield notification.channel, notification.payload


def _listener(driver: str, connection: Any) -> Listener:
    # psycopg is imported here, not at the top: an app on asyncpg can import sa_jobs on
    # a machine without libpq.
    import psycopg

    if driver == "psycopg" and isinstance(connection, psycopg.Connection):
        return _Psycopg3(connection)
    if driver == "psycopg2":
        return _Psycopg2(connection)
    raise ListenUnsupportedError(
        f"the {driver} driver's connections cannot wait for notifications here "
        "(psycopg 3 and psycopg2 can)"
    )


class Notifier(Service):
    def __init__(
        self,
        engine: Engine,
        *,
        on_queue: Callable[[str], None],
        on_cancel: Callable[[int], object],
        on_connect: Callable[[], None],
        stopping: threading.Event,
    ) -> None:
        super().__init__("notifier", stopping)
        self._engine = engine
        self._on_queue = on_queue
        self._on_cancel = on_cancel
        self._on_connect = on_connect
        #: Set while the LISTEN connection is up (a test signal too).
        self.connected = threading.Event()
        self._backoff = Backoff()

    def _connect(self) -> tuple[Any, Listener]:
        """A connection of the engine's, out of its pool for good, listening."""
        pooled = self._engine.raw_connection()
        driver_connection = pooled.driver_connection  # gone from ``pooled`` once detached
        pooled.detach()
        try:
            return pooled, _listener(self._engine.dialect.driver, driver_connection)
        except BaseException:
            pooled.close()
            raise

    def run_loop(self) -> None:
        while not self.stopping.is_set():
            try:
                pooled, listener = self._connect()
            except ListenUnsupportedError as exc:
                log.warning("%s; the worker polls for new jobs instead", exc)
                return
            except Exception as exc:
                self._log_failure("could not open the listen connection", exc)
                self.stopping.wait(self._backoff.next_wait())
                continue
            try:
                self._backoff.reset()
                self.connected.set()
                # Anything sent while we were not listening is found by this fetch.
                self._on_connect()
                while not self.stopping.is_set():
                    for channel, payload in listener.notifications(timeout=0.25):
                        self._dispatch(channel, payload)
                    self.passed()
            except Exception as exc:
                self.connected.clear()
                # A lost connection is invalidated, not closed: closing would first try
                # to reset it, and log that failure as an error.
                with contextlib.suppress(Exception):
                    pooled.invalidate()
                self._log_failure("listen connection lost", exc)
                self.stopping.wait(self._backoff.next_wait())
            else:
                self.connected.clear()
                with contextlib.suppress(Exception):  # the server may be gone already
                    pooled.close()

    def _log_failure(self, what: str, exc: Exception) -> None:
        # The listener talks to the driver directly, so its errors are the driver's own.
        driver_error = getattr(self._engine.dialect.dbapi, "OperationalError", None)
        transient = is_transient(exc) or (
            driver_error is not None and isinstance(exc, driver_error)
        )
        level = logging.WARNING if transient else logging.ERROR
        log.log(level, "%s (%s); reconnecting", what, describe(exc))

    def _dispatch(self, channel: str, payload: str) -> None:
        if channel == INSERT_CHANNEL:
            self._on_queue(payload)
            return
        try:
            message = json.loads(payload)
            job_id = int(message["cancel"])
        except (ValueError, KeyError, TypeError):
            log.warning("ignoring malformed control message %r", payload)
            return
        self._on_cancel(job_id)
