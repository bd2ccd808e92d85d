"""Writing outcomes: batched by default, inline for tests and debugging.

Both strategies implement :class:`Completer`. The batched one collects outcomes for up
to ``interval`` seconds (or ``max_batch`` of them) and writes them with one
:func:`~sa_jobs.complete.jobs_finish` statement. A failed write is retried with backoff
and never dropped: until it lands the jobs stay ``running``, and if the process dies
first they are rescued and run again (at least once, never lost).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Protocol

from sqlalchemy import Engine

from sa_jobs.complete import Outcome, finish_in
from sa_jobs.worker.backoff import Backoff, autocommit

__all__ = ["BatchCompleter", "Completer", "InlineCompleter"]

log = logging.getLogger("sa_jobs.worker")


class Completer(Protocol):
    def start(self) -> None: ...

    def submit(self, outcome: Outcome) -> None:
        """Queue an outcome for writing."""
        ...

    def pending(self) -> int:
        """Outcomes submitted but not yet written."""
        ...

    def pending_ids(self) -> set[int]:
        """The jobs of those outcomes."""
        ...

    def stop(self) -> None:
        """Write everything submitted so far, then stop."""
        ...


def write_outcomes(engine: Engine, outcomes: list[Outcome], *, sequences: bool = True) -> int:
    """Write outcomes (and move their sequences on).

    Without sequenced jobs it is one statement, sent in autocommit mode (one round trip
    instead of three). Sequenced jobs need a transaction: their locks must hold until the
    next job of each sequence is promoted. ``sequences`` says whether the database has
    the sequence branch at all.
    """
    if not (sequences and any(outcome.sequenced is not False for outcome in outcomes)):
        with autocommit(engine).connect() as connection:
            return len(finish_in(connection, outcomes))
    with engine.begin() as connection:
        return len(finish_in(connection, outcomes))


class InlineCompleter:
    """Writes each outcome at once, in the thread that produced it."""

    def __init__(self, engine: Engine, *, sequences: bool = True) -> None:
        self._engine = engine
        self._sequences = sequences
        self._backoff = Backoff("completing a job")

    def start(self) -> None:
        pass

    def submit(self, outcome: Outcome) -> None:
        self._backoff.retry_forever(
            lambda: write_outcomes(self._engine, [outcome], sequences=self._sequences)
        )

    def pending(self) -> int:
        return 0

    def pending_ids(self) -> set[int]:
        return set()

    def stop(self) -> None:
        pass


class BatchCompleter:
    """Writes outcomes in batches from a thread of its own."""

    def __init__(
        self,
        engine: Engine,
        *,
        interval: float = 0.005,
        max_batch: int = 1000,
        sequences: bool = True,
    ) -> None:
        self._engine = engine
        self._sequences = sequences
        self._interval = interval
        self._max_batch = max_batch
        self._queue: queue.Queue[Outcome | None] = queue.Queue()
        self._in_flight: dict[int, int] = {}
        self._lock = threading.Lock()
        self._backoff = Backoff("completing jobs")
        self._thread = threading.Thread(target=self._loop, name="sa_jobs-completer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, outcome: Outcome) -> None:
        with self._lock:
            self._in_flight[outcome.job_id] = self._in_flight.get(outcome.job_id, 0) + 1
        self._queue.put(outcome)

    def pending(self) -> int:
        with self._lock:
            return sum(self._in_flight.values())

    def pending_ids(self) -> set[int]:
        with self._lock:
            return set(self._in_flight)

    def stop(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _loop(self) -> None:
        stopping = False
        while not stopping:
            first = self._queue.get()
            if first is None:
                break
            batch = [first]
            deadline = time.monotonic() + self._interval
            while len(batch) < self._max_batch:
                try:
                    item = self._queue.get(timeout=max(deadline - time.monotonic(), 0))
                except queue.Empty:
                    break
                if item is None:
                    stopping = True
                    break
                batch.append(item)
            self._write(batch)
            with self._lock:
                for outcome in batch:
                    left = self._in_flight.pop(outcome.job_id) - 1
                    if left:
                        self._in_flight[outcome.job_id] = left

    def _write(self, batch: list[Outcome]) -> None:
        self._backoff.retry_forever(
            lambda: write_outcomes(self._engine, batch, sequences=self._sequences)
        )
