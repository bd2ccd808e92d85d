"""One LISTEN connection per worker: wake-ups for new jobs, and cancellation requests.

Channels: ``sa_jobs_insert`` (payload: a queue name; sent by the insert trigger and the
scheduler) and ``sa_jobs_control`` (payload: JSON such as ``{"cancel": 42}``, sent by
:func:`sa_jobs.cancel_job`). Notifications are a shortcut, never the only path: producers
also poll, and the worker also looks for cancel requests in running jobs' metadata, so a
notification lost while the connection was down delays work but never loses it.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable

import psycopg
from sqlalchemy import Engine

from sa_jobs.worker.backoff import is_transient

__all__ = ["CONTROL_CHANNEL", "INSERT_CHANNEL", "Notifier"]

from sa_jobs.schema import CONTROL_CHANNEL, INSERT_CHANNEL

log = logging.getLogger("sa_jobs.worker")


class Notifier:
    def __init__(
        self,
        engine: Engine,
        *,
        on_queue: Callable[[str], None],
        on_cancel: Callable[[int], object],
        on_connect: Callable[[], None],
        stopping: threading.Event,
    ) -> None:
        self._engine = engine
        self._on_queue = on_queue
        self._on_cancel = on_cancel
        self._on_connect = on_connect
        self._stopping = stopping
        self.connected = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sa_jobs-notifier", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self) -> None:
        self._thread.join()

    def _connect(self) -> psycopg.Connection[tuple[object, ...]]:
        args, kwargs = self._engine.dialect.create_connect_args(self._engine.url)
        connection = psycopg.connect(*args, **kwargs, autocommit=True)
        connection.execute(f"LISTEN {INSERT_CHANNEL}")
        connection.execute(f"LISTEN {CONTROL_CHANNEL}")
        return connection

    def _loop(self) -> None:
        failures = 0
        while not self._stopping.is_set():
            try:
                with self._connect() as connection:
                    failures = 0
                    self.connected.set()
                    # Anything sent while we were not listening is found by this fetch.
                    self._on_connect()
                    while not self._stopping.is_set():
                        for notification in connection.notifies(timeout=0.25):
                            self._dispatch(notification.channel, notification.payload)
            except Exception as exc:
                self.connected.clear()
                failures += 1
                level = (
                    logging.WARNING
                    if is_transient(exc) or isinstance(exc, psycopg.OperationalError)
                    else logging.ERROR
                )
                log.log(level, "listen connection lost (%s); reconnecting", exc)
                self._stopping.wait(min(0.1 * 2**failures, 5.0))
        self.connected.clear()

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
