"""One LISTEN connection per worker: wake-ups for new jobs, and cancellation requests.

Channels: ``sa_jobs_insert`` (payload: a queue name; sent by the insert trigger and the
scheduler) and ``sa_jobs_control`` (payload: JSON such as ``{"cancel": 42}``, sent by
:func:`sa_jobs.cancel_job`, or ``{"pause": "mail"}`` / ``{"resume": "mail"}``, sent by
:func:`sa_jobs.pause_queue` / :func:`sa_jobs.resume_queue`). Notifications are a
shortcut, never the only path: producers also poll, and the worker also looks for cancel
requests in running jobs' metadata, so a notification lost while the connection was down
delays work but never loses it.

The connection comes from the worker's own engine — its pool, its ``creator``, its
``connect_args``, its ``connect`` events — or from ``Worker(listen_engine=...)``, and is
then detached from the pool, so the ``LISTEN`` it holds never leaks to a connection the
application checks out later. psycopg 3 and psycopg2 connections can wait for
notifications (:class:`Listener`); with any other driver (pg8000) the worker polls
instead, and says so in its log.

``LISTEN`` needs a session: through a pooler in transaction mode (PgBouncer's usual
setting) it lands on whichever server connection serves that one statement, and no
notification ever comes back. So every listen connection is **probed** before it is
trusted: it listens to a channel of its own, the worker's engine notifies that channel,
and unless the notification arrives within :data:`PROBE_TIMEOUT` the worker polls and
says why in its log, naming ``listen_engine`` (a direct connection) and ``poll_only``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import select
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

import attrs
from sqlalchemy import URL, Engine, create_engine, func, make_url
from sqlalchemy import select as select_
from sqlalchemy.exc import ArgumentError
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import NullPool

if TYPE_CHECKING:
    import psycopg

from sa_jobs._base.error_records import describe
from sa_jobs._base.urls import SYNC_FORMS, in_driver, servers
from sa_jobs._table.schema import CONTROL_CHANNEL, INSERT_CHANNEL
from sa_jobs.errors import InvalidOptionsError
from sa_jobs.worker.db_access import is_transient
from sa_jobs.worker.engines import database_identity
from sa_jobs.worker.service import Backoff, Service

__all__ = ["PROBE_TIMEOUT", "ListenOptions", "Notifier"]

log = logging.getLogger("sa_jobs.worker")

#: Seconds a new listen connection gets to receive the worker's own probe notification.
#: On a direct connection it arrives in milliseconds; through a transaction pooler never.
PROBE_TIMEOUT = 5.0

#: Drivers whose connections can wait for notifications.
_LISTENING_DRIVERS = ("psycopg", "psycopg2")


@attrs.frozen
class ListenOptions:
    """How a worker hears of new jobs and cancel requests (``Worker(listen_engine=,
    poll_only=)``, validated by :meth:`build`).

    Attributes:
        engine: Where the ``LISTEN`` connection comes from; None: the worker's engine.
        poll_only: Never ``LISTEN``: poll for jobs, find cancel requests at heartbeats.
    """

    engine: Engine | None = None
    poll_only: bool = False

    @classmethod
    def build(cls, listen_engine: Engine | URL | str | None, poll_only: bool) -> ListenOptions:
        """Check the options; a URL becomes an engine of the worker's own (without a
        pool: its one connection is the listen connection, closed when the worker stops).

        Raises:
            InvalidOptionsError: not an engine or URL, an async engine, a driver that
                cannot wait for notifications, or both options at once.
        """
        if not isinstance(poll_only, bool):
            raise InvalidOptionsError("poll_only", f"must be True or False, got {poll_only!r}")
        if listen_engine is None:
            return cls(poll_only=poll_only)
        if poll_only:
            raise InvalidOptionsError(
                "listen_engine",
                "is not used with poll_only=True (a polling worker never listens); "
                "pass one or the other",
            )
        if isinstance(listen_engine, AsyncEngine):
            raise InvalidOptionsError(
                "listen_engine",
                "must be a sync Engine (its connection waits in a thread of the worker); "
                "pass create_engine(url) on psycopg 3 or psycopg2, or the URL itself",
            )
        if isinstance(listen_engine, str | URL):
            return cls(engine=_engine_for(listen_engine))
        if not isinstance(listen_engine, Engine):
            raise InvalidOptionsError(
                "listen_engine",
                f"must be an Engine or a database URL, got {type(listen_engine).__name__}",
            )
        _check_driver(listen_engine)
        return cls(engine=listen_engine)


def _engine_for(raw: URL | str) -> Engine:
    try:
        url = make_url(raw)
    except ArgumentError as exc:
        raise InvalidOptionsError(
            "listen_engine", f"is not a database URL ({exc}); e.g. postgresql://host/db"
        ) from None
    if url.get_backend_name() not in ("postgresql", "postgres"):
        raise InvalidOptionsError(
            "listen_engine", f"must be a PostgreSQL URL, got a {url.get_backend_name()} one"
        )
    # A plain postgresql:// URL means psycopg 3 (sa_jobs' own driver), and an async
    # driver's URL its sync form.
    driver = url.get_driver_name() if "+" in url.drivername else "psycopg"
    driver = SYNC_FORMS.get(driver, driver)
    if driver not in _LISTENING_DRIVERS:
        raise InvalidOptionsError(
            "listen_engine",
            f"its {driver} connections cannot wait for notifications; use psycopg 3 or psycopg2",
        )
    try:
        return create_engine(in_driver(url, driver), poolclass=NullPool)
    except (ImportError, ArgumentError) as exc:
        raise InvalidOptionsError(
            "listen_engine", f"cannot make an engine of {driver} ({exc}); is it installed?"
        ) from exc


def _check_driver(engine: Engine) -> None:
    driver = engine.dialect.driver
    if engine.dialect.name != "postgresql" or driver not in _LISTENING_DRIVERS:
        raise InvalidOptionsError(
            "listen_engine",
            f"its {engine.dialect.name}+{driver} connections cannot wait for notifications; "
            "use psycopg 3 or psycopg2",
        )


def where(engine: Engine) -> str:
    """``host:port/database`` of an engine, for the log."""
    return f"{servers(engine.url)}/{engine.url.database}"


def check_same_database(listen: Engine, engine: Engine) -> None:
    """Refuse a ``listen_engine`` that reaches another database than the worker's engine:
    its ``LISTEN`` would never hear this database's notifications.

    Raises:
        InvalidOptionsError: the two reach different databases (or schemas).
    """
    with engine.connect() as connection:
        expected = database_identity(connection)
    with listen.connect() as connection:
        found = database_identity(connection)
    # The role may differ (a direct login for LISTEN); the server, database and table not.
    if (found[:2], found[3:]) != (expected[:2], expected[3:]):
        raise InvalidOptionsError(
            "listen_engine",
            f"reaches database {found[1]!r} at {where(listen)}, not the worker's {expected[1]!r} "
            f"at {where(engine)}: pass an engine on the same database (a direct connection, "
            "not through PgBouncer)",
        )


class ListenUnsupportedError(Exception):
    """The engine's driver gives connections that cannot wait for notifications."""


class Listener(Protocol):
    """A driver connection in autocommit mode, ``LISTEN``-ing."""

    def listen(self, channel: str) -> None:
        """``LISTEN`` ``channel``."""
        ...

    def unlisten(self, channel: str) -> None: ...

    def notifications(self, timeout: float) -> Iterator[tuple[str, str]]:
        """``(channel, payload)`` pairs as they arrive, for up to ``timeout`` seconds."""
        ...


class _Psycopg3(Listener):
    def __init__(self, connection: psycopg.Connection[Any]) -> None:
        connection.rollback()
        connection.autocommit = True
        self._connection = connection

    def listen(self, channel: str) -> None:
        self._connection.execute(f"LISTEN {channel}")

    def unlisten(self, channel: str) -> None:
        self._connection.execute(f"UNLISTEN {channel}")

    def notifications(self, timeout: float) -> Iterator[tuple[str, str]]:
        for notification in self._connection.notifies(timeout=timeout):
            yield notification.channel, notification.payload


class _Psycopg2(Listener):
    def __init__(self, connection: Any) -> None:
        connection.rollback()
        connection.autocommit = True
        self._connection = connection

    def listen(self, channel: str) -> None:
        with self._connection.cursor() as cursor:
            cursor.execute(f"LISTEN {channel}")

    def unlisten(self, channel: str) -> None:
        with self._connection.cursor() as cursor:
            cursor.execute(f"UNLISTEN {channel}")

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


class _ProbeFailed(Exception):
    """The listen connection did not receive the worker's own notification."""


class Notifier(Service):
    """The worker's listen connection, in a thread (see the module).

    Args:
        engine: The worker's engine (the probe's notification is sent through it).
        listen: Where the listen connection comes from, or whether to poll only.
        poll_interval: The producers' poll (for the log of a polling worker).
        heartbeat_interval: When missed cancel requests are found (for the same log).
    """

    def __init__(
        self,
        engine: Engine,
        *,
        on_queue: Callable[[str], None],
        on_cancel: Callable[[int], object],
        on_connect: Callable[[], None],
        stopping: threading.Event,
        on_queue_control: Callable[[str, bool], None] = lambda queue, paused: None,
        listen: ListenOptions | None = None,
        poll_interval: float = 1.0,
        heartbeat_interval: float = 5.0,
    ) -> None:
        super().__init__("notifier", stopping)
        self._engine = engine
        self._listen = listen or ListenOptions()
        self._listen_engine = self._listen.engine or engine
        self._on_queue = on_queue
        self._on_cancel = on_cancel
        self._on_connect = on_connect
        self._on_queue_control = on_queue_control
        self._polling = (
            f"the worker polls for new jobs every {poll_interval:g} s and finds cancel "
            f"requests at its heartbeat (every {heartbeat_interval:g} s)"
        )
        #: Set while the LISTEN connection is up (a test signal too).
        self.connected = threading.Event()
        #: Set once the worker gave up listening and polls (a test signal).
        self.polling = threading.Event()
        self._backoff = Backoff()
        self._said_listening = False

    def _connect(self) -> tuple[Any, Listener]:
        """A connection of the listen engine's, out of its pool for good, listening."""
        engine = self._listen_engine
        pooled = engine.raw_connection()
        driver_connection = pooled.driver_connection  # gone from ``pooled`` once detached
        pooled.detach()
        try:
            listener = _listener(engine.dialect.driver, driver_connection)
            self._probe(listener)
            for channel in (INSERT_CHANNEL, CONTROL_CHANNEL):
                listener.listen(channel)
            return pooled, listener
        except BaseException:
            with contextlib.suppress(Exception):
                pooled.close()
            raise

    def _probe(self, listener: Listener) -> None:
        """Prove that notifications reach ``listener``: listen to a channel of our own,
        notify it through the worker's engine, wait for it (see the module).

        Raises:
            _ProbeFailed: nothing arrived within :data:`PROBE_TIMEOUT`.
        """
        channel = f"sa_jobs_probe_{uuid.uuid4().hex[:16]}"
        listener.listen(channel)
        with self._engine.begin() as connection:
            connection.execute(select_(func.pg_notify(channel, "")))
        deadline = time.monotonic() + PROBE_TIMEOUT
        while not self.stopping.is_set():  # a stop ends the probe; run_loop then returns
            left = deadline - time.monotonic()
            if left <= 0:
                raise _ProbeFailed
            # Only our channel is listened to yet. Each wait is read to its end (short),
            # so the driver connection is free again before UNLISTEN.
            arrived = [c for c, _ in listener.notifications(timeout=min(left, 0.05))]
            if channel in arrived:
                listener.unlisten(channel)
                return

    def run_loop(self) -> None:
        if self._listen.poll_only:
            log.info("poll_only: %s", self._polling)
            self.polling.set()
            return
        where_ = where(self._listen_engine)
        while not self.stopping.is_set():
            try:
                pooled, listener = self._connect()
            except ListenUnsupportedError as exc:
                log.warning("%s; the worker polls for new jobs instead", exc)
                self.polling.set()
                return
            except _ProbeFailed:
                log.warning(
                    "LISTEN through %s received no notification within %g s: the "
                    "connection goes through a pooler in transaction mode (PgBouncer?), or "
                    "is not a session of its own. %s. For notifications, pass "
                    "Worker(listen_engine=...) a direct connection to the database; to poll "
                    "without this warning, Worker(poll_only=True)",
                    where_,
                    PROBE_TIMEOUT,
                    self._polling[0].upper() + self._polling[1:],
                )
                self.polling.set()
                return
            except Exception as exc:
                self._log_failure("could not open the listen connection", exc)
                self.stopping.wait(self._backoff.next_wait())
                continue
            if self.stopping.is_set():  # stopped while probing
                with contextlib.suppress(Exception):
                    pooled.close()
                return
            try:
                self._backoff.reset()
                self.outage.succeeded()
                self.connected.set()
                level = logging.DEBUG if self._said_listening else logging.INFO
                self._said_listening = True
                log.log(level, "listening for new jobs and cancel requests on %s", where_)
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
        driver_error = getattr(self._listen_engine.dialect.dbapi, "OperationalError", None)
        transient = is_transient(exc) or (
            driver_error is not None and isinstance(exc, driver_error)
        )
        if transient:
            self.outage.failed("listen", f"{what} ({describe(exc)}); reconnecting")
        else:
            log.error("%s (%s); reconnecting", what, describe(exc))

    def _dispatch(self, channel: str, payload: str) -> None:
        if channel == INSERT_CHANNEL:
            self._on_queue(payload)
            return
        message: Any = None
        with contextlib.suppress(ValueError):
            message = json.loads(payload)
        if not isinstance(message, dict):
            log.warning("ignoring malformed control message %r", payload)
        elif isinstance(message.get("cancel"), int):
            self._on_cancel(message["cancel"])
        elif isinstance(message.get("pause"), str):
            self._on_queue_control(message["pause"], True)
        elif isinstance(message.get("resume"), str):
            self._on_queue_control(message["resume"], False)
        else:
            log.warning("ignoring malformed control message %r", payload)
