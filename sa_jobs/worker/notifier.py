"""One LISTEN connection per worker: wake-ups for new jobs, and cancellation requests.

Channels: ``sa_jobs_insert`` (payload: a queue name; sent by the insert trigger and the
scheduler) and ``sa_jobs_control`` (payload: JSON such as ``{"cancel": 42}``, sent by
:func:`sa_jobs.cancel_job`). Notifications are a shortcut, never the only path: producers
also poll, and the worker also looks for cancel requests in running jobs' metadata, so a
notification lost while the connection was down delays work but never loses it.

The connection comes from the worker's own engine — its pool, its ``creator``, its
``connect_args``, its ``connect`` events — and is then detached from the pool, so the
``LISTEN`` it holds never leaks to a connection the application checks out later. A
driver whose connections cannot wait for notifications makes the worker poll instead,
and says so in its log.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable
from typing import Any

import psycopg
from sqlalchemy import Engine

from sa_jobs.error_records import describe
from sa_jobs.schema import CONTROL_CHANNEL, INSERT_CHANNEL
from sa_jobs.worker.backoff import is_transient
from sa_jobs.worker.service import Backoff, Service

__all__ = ["Notifier"]

log = logging.getLogger("sa_jobs.worker")


class ListenUnsupportedError(Exception):
    """The engine's driver gives connections that cannot wait for notifications."""


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

    def _connect(self) -> tuple[Any, psycopg.Connection[Any]]:
        """A connection of the engine's, out of its pool for good, listening."""
        pooled = self._engine.raw_connection()
        driver = pooled.driver_connection
        pooled.detach()
        if not isinstance(driver, psycopg.Connection):
            pooled.close()
            raise ListenUnsupportedError(
                f"the {self._engine.dialect.driver} driver's connections cannot wait for "
                "notifications here"
            )
        try:
            driver.rollback()
            driver.autocommit = True
            driver.execute(f"LISTEN {INSERT_CHANNEL}")
            driver.execute(f"LISTEN {CONTROL_CHANNEL}")
        except BaseException:
            pooled.close()
            raise
        return pooled, driver

    def run_loop(self) -> None:
        while not self.stopping.is_set():
            try:
                pooled, connection = self._connect()
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
                    for notification in connection.notifies(timeout=0.25):
                        self._dispatch(notification.channel, notification.payload)
                    self.passed()
            except Exception as exc:
                self._log_failure("listen connection lost", exc)
                self.stopping.wait(self._backoff.next_wait())
            finally:
                self.connected.clear()
                # A dead connection may fail to close; it is gone anyway.
                with contextlib.suppress(Exception):
                    pooled.close()

    @staticmethod
    def _log_failure(what: str, exc: Exception) -> None:
        transient = is_transient(exc) or isinstance(exc, psycopg.OperationalError)
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
