"""Writing outcomes: batched by default, inline for tests and debugging.

Both strategies implement :class:`Completer` and write through one
:class:`OutcomeWriter`, whose rules keep one job's outcome from ever holding up
another's:

* **Transient errors** (a lost connection, a server restarting, a deadlock) are retried
  with backoff, for at most ``give_up_after`` seconds (the worker passes its
  ``rescue_after``).
* **Any other error** (PostgreSQL refused the data, a trigger raised) is not retried as
  is: the batch is written one outcome at a time, so the others land. An outcome that
  still cannot be written is replaced by a plain failure of its job — the attempt is
  failed, retried per the job's retry policy, and the reason is recorded in its
  ``errors`` (``OutcomeNotStored: ...``).
* **Whatever is given up on is left to the rescuer**: its jobs stay ``running`` and are
  no longer counted as held by this process, so the rescuer retries them once
  ``rescue_after`` has passed. Nothing is held forever, and nothing is lost.

The batched strategy writes an outcome at once when it has been idle, and while busy
collects outcomes until ``interval`` seconds after its previous write (at most
``max_batch`` of them), writing each batch with one statement
(:func:`~sa_jobs._act.complete.finish_in`): a batch of plain completions, the common case, as
two arrays of ids and runs; any other batch as one JSON document.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from sqlalchemy import Engine

from sa_jobs._act.complete import finish_in, finish_steps_in, one_statement_for_steps
from sa_jobs._base.error_records import describe, message_record
from sa_jobs._base.records import Ending, Outcome
from sa_jobs._table.models import Job
from sa_jobs._table.schema import Features
from sa_jobs.worker.db_access import autocommit, is_transient
from sa_jobs.worker.outage import OutageLog
from sa_jobs.worker.service import Backoff, Service

__all__ = ["BatchCompleter", "Completer", "InlineCompleter", "OutcomeWriter"]

log = logging.getLogger("sa_jobs.worker")

#: Used when an outcome that cannot be stored belongs to a job whose retry policy is
#: unknown here (no Job object came with it).
FALLBACK_RETRY_DELAY = 60.0


class Completer(Protocol):
    def start(self) -> None: ...

    def submit(self, outcome: Outcome) -> None:
        """Queue an outcome for writing."""
        ...

    def pending(self) -> int:
        """Outcomes submitted but not yet written (or given up on)."""
        ...

    def pending_ids(self) -> set[int]:
        """The jobs of those outcomes."""
        ...

    def stop(self, timeout: float | None = None) -> None:
        """Write everything submitted so far, for at most ``timeout`` seconds, then stop."""
        ...


def write_outcomes(engine: Engine, outcomes: Sequence[Outcome], features: Features) -> int:
    """Write outcomes (and move their sequences on).

    Without sequenced jobs it is one statement, sent in autocommit mode (one round trip
    instead of three), when the batch holds no workflow step or only completions: then a
    step's completion, the release of its dependents, its workflow's counters and the
    callbacks of a workflow it finishes are that one statement
    (:func:`~sa_jobs._act.complete.one_statement_for_steps`), atomic by construction.
    Sequenced jobs need a transaction: their locks must hold until the next job of each
    sequence is promoted. So does a batch in which a step may fail: the cascade to its
    dependents is several statements that must commit together (a crash between them
    would leave a dependent pending for good, or a workflow that never finishes).
    """
    sequenced = features.sequence and any(outcome.sequenced is not False for outcome in outcomes)
    steps = features.workflow and any(outcome.in_workflow is not False for outcome in outcomes)
    if steps and not sequenced and one_statement_for_steps(outcomes):
        with autocommit(engine).connect() as connection:
            changed, missed = finish_steps_in(connection, outcomes, features)
        if not missed:
            return len(changed)
        # Stale runs (nothing to write) or steps updated since the statement began: in a
        # transaction, whose statements each see what committed before them.
        with engine.begin() as connection:
            return len(changed) + len(finish_in(connection, missed, one_statement=False))
    if not (sequenced or steps):
        with autocommit(engine).connect() as connection:
            return len(finish_in(connection, outcomes))
    with engine.begin() as connection:
        return len(finish_in(connection, outcomes))


class _GiveUp(Exception):
    """Transient errors outlasted the retry budget, or the writer is stopping."""


class OutcomeWriter:
    """Writes outcomes under the rules in the module docstring.

    Args:
        engine: The worker's engine.
        features: The database's feature branches.
        give_up_after: How long transient errors are retried before a batch is left to
            the rescuer.
        retry_delay: The retry delay of a job whose outcome cannot be stored.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        features: Features,
        give_up_after: float,
        retry_delay: Callable[[Job[Any]], float] | None = None,
        backoff: tuple[float, float] = (0.1, 5.0),
    ) -> None:
        self._engine = engine
        self._features = features
        self.give_up_after = give_up_after
        self._retry_delay = retry_delay
        self._backoff_range = backoff
        #: Set to stop retrying at once (a worker out of time to stop).
        self.stopping = threading.Event()
        #: Jobs whose outcomes were given up on (left to the rescuer), for the record.
        self.given_up = 0
        #: Where transient failures are logged (the worker shares one).
        self.outage = OutageLog()

    def write(self, batch: Sequence[Outcome]) -> None:
        """Write ``batch``; never raises, never retries forever."""
        try:
            self._with_retries(batch)
        except _GiveUp as exc:
            self._give_up(batch, str(exc))
        except Exception as exc:
            if len(batch) > 1:
                log.warning(
                    "writing %d outcomes failed (%s); writing them one at a time",
                    len(batch),
                    describe(exc),
                )
                for outcome in batch:
                    self.write([outcome])
            else:
                self._store_failure_instead(batch[0], exc)

    def _with_retries(self, batch: Sequence[Outcome]) -> None:
        deadline = time.monotonic() + self.give_up_after
        backoff = Backoff(*self._backoff_range)
        while True:
            try:
                write_outcomes(self._engine, batch, self._features)
                self.outage.succeeded()
                return
            except Exception as exc:
                if not is_transient(exc):
                    raise
                wait = backoff.next_wait()
                if self.stopping.is_set() or time.monotonic() + wait > deadline:
                    raise _GiveUp(describe(exc)) from exc
                failure = f"writing outcomes failed ({describe(exc)}); retrying in {wait:.1f} s"
                self.outage.failed("outcomes", failure)
                self.stopping.wait(wait)

    def _store_failure_instead(self, outcome: Outcome, exc: Exception) -> None:
        """The database refused this one outcome: fail the attempt plainly instead."""
        reason = (
            f"OutcomeNotStored: the worker could not store this attempt's outcome "
            f"({outcome.ending.value}): {describe(exc)}"
        )
        log.error("job %d: %s", outcome.job_id, reason)
        delay = outcome.delay if outcome.ending is Ending.FAILED else None
        if delay is None and outcome.job is not None and self._retry_delay is not None:
            delay = self._retry_delay(outcome.job)
        attempt = outcome.job.attempt if outcome.job is not None else None
        failure = Outcome(
            outcome.job_id,
            outcome.run,
            Ending.FAILED,
            delay=delay if delay is not None else FALLBACK_RETRY_DELAY,
            error=message_record(attempt, reason),
            sequenced=outcome.sequenced,
            in_workflow=outcome.in_workflow,
        )
        try:
            self._with_retries([failure])
        except Exception as second:
            self._give_up([outcome], describe(second))

    def _give_up(self, batch: Sequence[Outcome], reason: str) -> None:
        self.given_up += len(batch)
        log.error(
            "gave up writing the outcomes of jobs %s (%s); they stay running until the "
            "rescuer retries them",
            [outcome.job_id for outcome in batch],
            reason,
        )


class _Pending:
    """Outcomes submitted and not yet settled in the database, by job id."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[int, int] = {}

    def add(self, outcome: Outcome) -> None:
        with self._lock:
            self._counts[outcome.job_id] = self._counts.get(outcome.job_id, 0) + 1

    def remove(self, outcomes: Sequence[Outcome]) -> None:
        with self._lock:
            for outcome in outcomes:
                left = self._counts.pop(outcome.job_id, 1) - 1
                if left:
                    self._counts[outcome.job_id] = left

    def count(self) -> int:
        with self._lock:
            return sum(self._counts.values())

    def ids(self) -> set[int]:
        with self._lock:
            return set(self._counts)


class InlineCompleter:
    """Writes each outcome at once, in the thread that produced it."""

    def __init__(self, writer: OutcomeWriter) -> None:
        self.writer = writer
        self._pending = _Pending()

    def start(self) -> None:
        pass

    def submit(self, outcome: Outcome) -> None:
        self._pending.add(outcome)
        try:
            self.writer.write([outcome])
        finally:
            self._pending.remove([outcome])

    def pending(self) -> int:
        return self._pending.count()

    def pending_ids(self) -> set[int]:
        return self._pending.ids()

    def stop(self, timeout: float | None = None) -> None:
        self.writer.stopping.set()


class BatchCompleter(Service):
    """Writes outcomes in batches from a thread of its own."""

    def __init__(
        self, writer: OutcomeWriter, *, interval: float = 0.005, max_batch: int = 1000
    ) -> None:
        super().__init__("completer")
        self.writer = writer
        self._interval = interval
        self._max_batch = max_batch
        self._queue: queue.SimpleQueue[Outcome | None] = queue.SimpleQueue()
        self._pending = _Pending()

    def submit(self, outcome: Outcome) -> None:
        self._pending.add(outcome)
        self._queue.put(outcome)

    def pending(self) -> int:
        return self._pending.count()

    def pending_ids(self) -> set[int]:
        return self._pending.ids()

    def stop(self, timeout: float | None = None) -> None:
        """Write what was submitted; after ``timeout`` seconds (plus one to notice) stop
        retrying and leave the rest to the rescuer."""
        if not self.running:
            return
        self._queue.put(None)
        self.join(timeout)
        if self.running:
            self.writer.stopping.set()
            self.join(1.0)
        if self.running:
            log.error(
                "the completer is still writing after %s s (the database does not answer); "
                "%d outcomes are left to the rescuer",
                timeout,
                self.pending(),
            )

    def run_loop(self) -> None:
        # The batch size adapts to the load: an outcome that arrives while the completer
        # is idle (its last write was more than `interval` ago) is written at once; while
        # busy, outcomes gather until `interval` after the previous write, so a busy
        # worker writes one statement per interval however many jobs it finishes.
        # Meanwhile the completer sleeps rather than waiting on the queue, so a handler
        # thread's submit never has to wake it.
        last_write = -math.inf
        stopping = False
        while not stopping:
            first = self._queue.get()
            if first is None:
                break
            wait = last_write + self._interval - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            batch = [first]
            while len(batch) < self._max_batch:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stopping = True
                    break
                batch.append(item)
            last_write = time.monotonic()
            try:
                self.writer.write(batch)
            except Exception:  # write() never raises; if it does, it is our bug
                log.exception("unexpected error writing %d outcomes", len(batch))
            finally:
                self._pending.remove(batch)
            self.passed()
