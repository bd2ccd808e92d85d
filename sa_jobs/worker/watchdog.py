"""Deadlines for running jobs, on one thread for the whole worker.

At a job's deadline the watchdog interrupts it (an async handler is cancelled; a sync
one sees ``job.cancelled``). If the run has still not settled ``grace`` seconds later —
a sync handler that never checks — the watchdog settles it itself, so the job is failed
(or returned, on shutdown) and its slot freed even though the thread is stuck. Whatever
that thread returns later is dropped.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time

from sa_jobs.worker.execution import Execution, Interrupt

__all__ = ["Watchdog"]


class Watchdog:
    def __init__(self, grace: float) -> None:
        self.grace = grace
        self._heap: list[tuple[float, int, Interrupt, bool, Execution]] = []
        self._order = itertools.count()
        self._wake = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="sa_jobs-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify()
        self._thread.join()

    def watch(self, execution: Execution) -> None:
        if execution.deadline is not None:
            self._push(execution.deadline, Interrupt.TIMEOUT, execution, settle=False)

    def interrupt_now(self, execution: Execution, reason: Interrupt) -> None:
        """Interrupt at once, and settle it after the grace period if it is stuck."""
        execution.interrupt(reason)
        self._push(time.monotonic() + self.grace, reason, execution, settle=True)

    def _push(self, when: float, reason: Interrupt, execution: Execution, *, settle: bool) -> None:
        with self._wake:
            heapq.heappush(self._heap, (when, next(self._order), reason, settle, execution))
            # Only a new earliest deadline changes how long the loop should sleep.
            if self._heap[0][4] is execution:
                self._wake.notify()

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._stopping and (
                    not self._heap or self._heap[0][0] > time.monotonic()
                ):
                    timeout = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._wake.wait(timeout)
                if self._stopping:
                    return
                _, _, reason, settle, execution = heapq.heappop(self._heap)
            if execution.finished:
                continue
            if not settle:
                self.interrupt_now(execution, reason)
            elif execution.try_finish():
                execution.settle(execution.outcome_for_interrupt(reason))
