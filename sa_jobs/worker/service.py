"""One lifecycle for every background thread of the worker, and one backoff.

A :class:`Service` is a daemon thread running :meth:`Service.run_loop` until its
``stopping`` event is set (its own, or one it shares with other services: the producers
stop fetching before the rest of the worker closes). Each pass of its loop calls
:meth:`Service.passed`, which is also the test signal: :meth:`Service.wait_passes` waits
for a number of further passes instead of a test sleeping and hoping.

:class:`Backoff` is the wait between failures, doubling from ``first`` to ``cap`` with
±20% jitter, reset by a success: the producers, the listener and the completer retry
the database this way.
"""

from __future__ import annotations

import logging
import random
import threading

from sa_jobs.worker.outage import OutageLog

__all__ = ["Backoff", "Service"]

log = logging.getLogger("sa_jobs.worker")


class Backoff:
    """Waits that double after each consecutive failure, up to ``cap`` seconds."""

    def __init__(self, first: float = 0.1, cap: float = 5.0) -> None:
        self.first = first
        self.cap = cap
        self.failures = 0

    def next_wait(self) -> float:
        """Count a failure; how long to wait before trying again."""
        self.failures += 1
        wait: float = min(self.first * 2 ** (self.failures - 1), self.cap)
        return wait * random.uniform(0.8, 1.2)

    def reset(self) -> None:
        """A success: the next failure waits ``first`` again."""
        self.failures = 0


class Service:
    """A background daemon thread with a start, a stop and a loop of passes.

    Subclasses implement :meth:`run_loop`, which runs until ``stopping`` is set and
    calls :meth:`passed` once per pass.
    """

    def __init__(self, name: str, stopping: threading.Event | None = None) -> None:
        self.name = name
        self.stopping = stopping if stopping is not None else threading.Event()
        self._passes = 0
        self._pass_made = threading.Condition()
        self._thread = threading.Thread(target=self._main, name=f"sa_jobs-{name}", daemon=True)
        #: Where transient database failures are logged (the worker shares one).
        self.outage = OutageLog()

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Ask the loop to end, and wait up to ``timeout`` seconds for it."""
        self.stopping.set()
        self.join(timeout)

    def join(self, timeout: float | None = None) -> None:
        if self._thread.is_alive():
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("the %s thread did not end within %s s", self.name, timeout)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def run_loop(self) -> None:
        raise NotImplementedError

    def passed(self) -> None:
        """Record one pass of the loop (and wake whoever waits for passes)."""
        with self._pass_made:
            self._passes += 1
            self._pass_made.notify_all()

    def wait_passes(self, count: int = 1, timeout: float = 10.0) -> bool:
        """Wait until the loop has made ``count`` more passes; False on timeout."""
        with self._pass_made:
            target = self._passes + count
            return self._pass_made.wait_for(lambda: self._passes >= target, timeout)

    def _main(self) -> None:
        try:
            self.run_loop()
        except Exception:  # a bug in ours; the worker must say so, not die silently
            log.exception("the %s thread stopped on an unexpected error", self.name)
