"""One outage, three lines: a worker's database failures logged as an outage, not one
line per failed attempt.

While the database is away (a restart, a failover, a network cut) every thread of the
worker keeps failing and retrying — each producer's fetch, the completer's writes, every
maintenance step, the periodic ticks, the listen connection — so a line per attempt
made a 30 s outage 45 WARNING lines, and a 2 s failover 119. Instead the worker's
threads share one :class:`OutageLog`:

* the first **transient** failure (:func:`~sa_jobs.worker.db_access.is_transient`, or the
  driver's own ``OperationalError`` for the listen connection) logs one WARNING — when,
  and what failed first — and starts the outage;
* further transient failures are counted by operation and logged at DEBUG;
* the first success of any thread ends it — one that comes ``settle`` seconds or more
  after the start: a statement that was already under way when another thread failed
  can still report success a moment later, and ending the outage on it made every
  failover two outages per process — with one WARNING with how long it lasted and how
  many operations failed and were retried meanwhile, by operation; then whoever asked
  (:meth:`OutageLog.on_end`) is told — the worker wakes its producers, so they fetch at
  once instead of at the end of their backoff.

Any other error (the database refused the statement, a bug) is not part of an outage:
its thread logs it as an ERROR, each time, as before.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable

__all__ = ["OutageLog"]

log = logging.getLogger("sa_jobs.worker")


class OutageLog:
    """The outage state of one worker (see the module); thread-safe."""

    def __init__(self, settle: float = 0.5) -> None:
        self._settle = settle
        self._lock = threading.Lock()
        self._started: float | None = None  # time.monotonic() of the first failure
        self._failures: collections.Counter[str] = collections.Counter()
        self._listeners: list[Callable[[], None]] = []
        #: Outages ended so far (a test signal).
        self.ended = 0

    @property
    def ongoing(self) -> bool:
        return self._started is not None

    def on_end(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (no arguments, from the thread that succeeded) whenever an
        outage ends."""
        self._listeners.append(callback)

    def failed(self, operation: str, message: str) -> None:
        """A transient failure of ``operation`` (e.g. ``"fetch"``); ``message`` says what
        failed and why, for the outage's first line (or a DEBUG line)."""
        with self._lock:
            first = self._started is None
            if first:
                self._started = time.monotonic()
            self._failures[operation] += 1
        if first:
            log.warning(
                "database operations are failing: %s; retrying, and logging the outage's "
                "end (how long, how many operations were retried) instead of each attempt",
                message,
            )
        else:
            log.debug("%s (retrying)", message)

    def succeeded(self) -> None:
        """A database operation worked: ends the outage, if one is going on."""
        if self._started is None:  # the common case: no lock, nothing to do
            return
        with self._lock:
            if self._started is None:
                return
            lasted = time.monotonic() - self._started
            if lasted < self._settle:  # begun before the failure, most likely
                return
            failures, self._failures = self._failures, collections.Counter()
            self._started = None
            self.ended += 1
        by_operation = ", ".join(f"{name} {count}" for name, count in failures.most_common())
        log.warning(
            "database operations succeed again after %.1f s; %d failed operations were "
            "retried meanwhile (%s)",
            lasted,
            sum(failures.values()),
            by_operation,
        )
        for callback in self._listeners:
            try:
                callback()
            except Exception:  # a bug in ours; the outage is over all the same
                log.exception("after the outage: %r failed", callback)
