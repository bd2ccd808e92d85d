"""Deadlines for running jobs, on one thread for the whole worker.

At a job's deadline the watchdog interrupts it (an async handler is cancelled; a sync
one sees ``job.cancelled``). If the run has still not settled ``grace`` seconds later —
a sync handler that never checks — the watchdog settles it itself, so the job is failed
(or returned, on shutdown) and its slot freed even though the thread is stuck. Whatever
that thread returns later is dropped.

Its heap holds weak references and is compacted as it grows: a worker that finishes
thousands of jobs a second long before their deadlines must not keep each of them (and
its job, args and errors) alive until a deadline a minute away.

The thread never dies: it sleeps at most :data:`MAX_SLEEP` at a time (a deadline a year
away must not overflow ``threading``'s wait), and an error while settling one run is
logged without ending timeout enforcement for the others.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
import weakref

from sa_jobs.worker.execution import Execution, Interrupt
from sa_jobs.worker.service import Service

__all__ = ["Watchdog"]

log = logging.getLogger("sa_jobs.worker")

#: The longest single wait; a later deadline is simply waited for in several steps.
MAX_SLEEP = 60.0
_MIN_COMPACT = 1024


class Watchdog(Service):
    def __init__(self, grace: float) -> None:
        super().__init__("watchdog")
        self.grace = grace
        self._heap: list[tuple[float, int, Interrupt, bool, weakref.ref[Execution]]] = []
        self._order = itertools.count()
        self._wake = threading.Condition()
        #: The heap size that triggers dropping entries of finished runs.
        self._compact_at = _MIN_COMPACT

    def stop(self, timeout: float | None = None) -> None:
        with self._wake:
            self.stopping.set()
            self._wake.notify()
        self.join(timeout)

    def watch(self, execution: Execution) -> None:
        if execution.deadline is not None:
            self._push(execution.deadline, Interrupt.TIMEOUT, execution, settle=False)

    def interrupt_now(self, execution: Execution, reason: Interrupt) -> None:
        """Interrupt at once, and settle it after the grace period if it is stuck."""
        execution.interrupt(reason)
        self._push(time.monotonic() + self.grace, reason, execution, settle=True)

    def _push(self, when: float, reason: Interrupt, execution: Execution, *, settle: bool) -> None:
        entry = (when, next(self._order), reason, settle, weakref.ref(execution))
        with self._wake:
            if len(self._heap) >= self._compact_at:
                self._compact()
            heapq.heappush(self._heap, entry)
            # Only a new earliest deadline changes how long the loop should sleep.
            if self._heap[0] is entry:
                self._wake.notify()

    def _compact(self) -> None:
        """Drop the entries of finished (or collected) runs; amortised O(1) per push,
        since the next compaction waits until the heap has doubled again."""
        live = []
        for entry in self._heap:
            execution = entry[4]()
            if execution is not None and not execution.finished:
                live.append(entry)
        heapq.heapify(live)
        self._heap = live
        self._compact_at = max(_MIN_COMPACT, 2 * len(live))

    def run_loop(self) -> None:
        while True:
            with self._wake:
                while not self.stopping.is_set() and (
                    not self._heap or self._heap[0][0] > time.monotonic()
                ):
                    wait = self._heap[0][0] - time.monotonic() if self._heap else MAX_SLEEP
                    self._wake.wait(min(wait, MAX_SLEEP))
                if self.stopping.is_set():
                    return
                _, _, reason, settle, ref = heapq.heappop(self._heap)
            execution = ref()
            if execution is None:  # finished and gone
                continue
            try:
                self._fire(reason, settle, execution)
            except Exception:
                log.exception("the watchdog failed to stop job %d", execution.job.id)
            self.passed()

    def _fire(self, reason: Interrupt, settle: bool, execution: Execution) -> None:
        if execution.finished:
            return
        if not settle:
            self.interrupt_now(execution, reason)
        elif execution.try_finish():
            outcome = execution.outcome_for_interrupt(reason, abandoned=True)
            execution.settle(outcome, by_runner=False)
