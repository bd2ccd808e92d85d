"""The event loop that async handlers run on, in a thread of its own.

Async connections belong to the event loop that opened them, so the async engine of
:class:`~sa_jobs.worker.engines.WorkerEngines` is used on this loop only, and its pool is
emptied (``dispose()``) when the worker stops. Before anything runs, the loop checks that
the worker's sync and async engines reach the very same database — one of them may have
been derived from the other's URL, which cannot carry a ``creator=`` or ``connect_args``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
from collections.abc import Coroutine, Sequence
from typing import Any

from sqlalchemy import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from sa_jobs._base.error_records import describe
from sa_jobs.errors import InvalidOptionsError
from sa_jobs.worker.engines import WorkerEngines, async_identity, database_identity

__all__ = ["EventLoopThread"]


class EventLoopThread:
    def __init__(self, engines: WorkerEngines) -> None:
        self._engines = engines
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="sa_jobs-asyncio", daemon=True)
        # Coroutines handed over by other threads, started by one wake-up of the loop per
        # burst (a fetched batch) rather than one per job.
        self._incoming: collections.deque[Coroutine[Any, Any, None]] = collections.deque()
        self._wake_scheduled = False
        self._incoming_lock = threading.Lock()
        #: Running tasks: the loop keeps only weak references to tasks.
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coroutine: Coroutine[Any, Any, None]) -> None:
        """Run ``coroutine`` as a task on the loop (from any thread)."""
        self.submit_many([coroutine])

    def submit_many(self, coroutines: Sequence[Coroutine[Any, Any, None]]) -> None:
        """Run each coroutine as a task on the loop (from any thread): one wake-up of the
        loop for all of them, and none if one is on its way already."""
        with self._incoming_lock:
            self._incoming.extend(coroutines)
            if self._wake_scheduled:
                return
            self._wake_scheduled = True
        self.loop.call_soon_threadsafe(self._start_incoming)

    def _start_incoming(self) -> None:
        with self._incoming_lock:
            coroutines = list(self._incoming)
            self._incoming.clear()
            self._wake_scheduled = False
        for coroutine in coroutines:
            task = self.loop.create_task(coroutine)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def async_engine(self) -> AsyncEngine:
        """The async engine handlers' sessions use (checked by :meth:`check_engines`)."""
        return self._engines.async_engine()

    def check_engines(self, timeout: float = 30.0) -> None:
        """Make sure the sync and async engines reach the same database.

        Raises:
            InvalidOptionsError: they do not, or one cannot connect at all.
        """
        engines = self._engines
        try:
            with engines.sync.connect() as connection:
                expected = database_identity(connection)
        except Exception as exc:
            if not engines.sync_is_derived:
                raise  # the user's own engine: its error is the one to see
            raise InvalidOptionsError(
                "sync_engine",
                f"{engines.describe_sync()} cannot reach the database ({_first_line(exc)}); "
                "pass Worker(your_async_engine, sync_engine=create_engine(...)) built like it",
            ) from exc
        where = engines.describe_async()
        try:
            found = self.call(async_identity(self.async_engine()), timeout)
        except Exception as exc:
            raise InvalidOptionsError(
                "async_engine",
                f"{where} cannot reach the database ({_first_line(exc)}); pass one built like "
                "your engine: Worker(..., async_engine=create_async_engine(...))",
            ) from exc
        if found != expected:
            raise InvalidOptionsError(*_mismatch(engines, sync_id=expected, async_id=found))

    def call(self, coroutine: Coroutine[Any, Any, Any], timeout: float) -> Any:
        """Run ``coroutine`` on the loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def stop(self, timeout: float = 10.0) -> None:
        engine = self._engines.forget_async()
        if engine is not None and self._thread.is_alive():
            # Its pooled connections belong to this loop, which is about to close.
            with contextlib.suppress(Exception):  # the database may be gone already
                self.call(engine.dispose(), timeout)
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout)
        if not self._thread.is_alive():
            self.loop.close()


def _where(url: URL, database: object) -> str:
    """``'name' at host:port``: the database an engine reached, and where its URL points."""
    host = url.host or url.query.get("host") or "localhost"
    return f"{database!r} at {host}:{url.port or 5432}"


def _mismatch(
    engines: WorkerEngines, *, sync_id: tuple[Any, ...], async_id: tuple[Any, ...]
) -> tuple[str, str]:
    """The option at fault and what to say, for two engines on different databases.

    The engine at fault is the one that came from elsewhere than the worker's own
    engine: derived from its URL (which cannot carry ``creator=``, ``connect_args`` or
    server settings), or passed as ``sync_engine=`` / ``async_engine=``.
    """
    given_is_async = isinstance(engines.given, AsyncEngine)
    sync_url, async_url = engines.sync.url, engines.async_url()
    sync_at, async_at = _where(sync_url, sync_id[1]), _where(async_url, async_id[1])
    if given_is_async:  # the sync engine came from elsewhere
        option, odd, odd_at = "sync_engine", engines.describe_sync(), sync_at
        other, other_at = engines.describe_async(), async_at
        fix = "Worker(your_async_engine, sync_engine=create_engine(...)) built like it"
    else:  # the async engine did
        option, odd, odd_at = "async_engine", engines.describe_async(), async_at
        other, other_at = engines.describe_sync(), sync_at
        fix = "Worker(engine, async_engine=create_async_engine(...)) built like it"
    if sync_id[1] != async_id[1]:
        where_to = f"another database than {other} ({odd_at}, not {other_at})"
    else:
        where_to = f"another sa_job table than {other} (a different search_path or role)"
    derived = engines.sync_is_derived if given_is_async else engines.async_is_derived
    why = (
        "; a derived engine cannot copy creator=, connect_args or server settings"
        if derived
        else f"; a worker's engines must reach one database, and {option}= names another"
    )
    return option, f"{odd} reaches {where_to}{why}, so pass {fix}"


def _first_line(exc: BaseException) -> str:
    # SQLAlchemy appends a "Background on this error" paragraph; one line says enough.
    return describe(exc).splitlines()[0]
