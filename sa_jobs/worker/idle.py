"""How :meth:`~sa_jobs.worker.Worker.run_until_idle` knows it is done, and what it reports.

``run_until_idle`` stops once no due job is left in the queues the worker serves. Due
jobs in *other* queues are not its work, but a script or a test that drained "everything"
while a job sat in a queue nobody serves (a kind that defaults to ``"mail"``, a worker
that serves ``"default"``) would otherwise believe it had: so it counts them, logs a
warning, and returns them in :class:`IdleResult`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection, Mapping
from typing import Protocol

import attrs
from sqlalchemy import Connection, Engine, exists, func, select

from sa_jobs._act.queues import queue_not_paused
from sa_jobs._base.states import JobState
from sa_jobs._table.models import Job, state_is
from sa_jobs._table.schema import Features

__all__ = [
    "UNSERVED_COUNTED",
    "IdleResult",
    "drain_until_idle",
    "due_work_left",
    "unserved_due_jobs",
]

#: Available jobs of unserved queues counted at most, in all (a backlog of millions in
#: another queue must not make ``run_until_idle`` slow to return).
UNSERVED_COUNTED = 10_000


class _Promoter(Protocol):
    def make_due_jobs_available(self, connection: Connection) -> int: ...


class DrainingRun(Protocol):
    """What :func:`drain_until_idle` needs of a worker's run (``worker.run.WorkerRun``)."""

    stop_requested: threading.Event

    @property
    def maintenance(self) -> _Promoter: ...

    @property
    def dispatched_batches(self) -> int: ...

    def wake_all(self) -> None: ...

    def idle(self) -> bool: ...


def drain_until_idle(
    run: DrainingRun,
    engine: Engine,
    queues: Collection[str],
    timeout: float | None,
    limited_recheck: float | None,
) -> bool:
    """Wait while ``run`` works, until no due job is left in ``queues``: True then, False
    if a stop was requested first.

    Idle in memory (nothing running, nothing to write, every producer's last fetch
    empty) is not enough: a scheduled job may have come due, a limit may have held jobs
    back. So the database is asked too, and its answer is taken only if the run stayed
    idle and dispatched nothing while it was asked.

    Args:
        timeout: Seconds after which :class:`TimeoutError` is raised (None: never).
        limited_recheck: With limits, the pause before looking again for due jobs that
            a limit holds back (their scope full elsewhere, or its rate spent).
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    stop_requested = run.stop_requested
    while not stop_requested.is_set():
        with engine.begin() as connection:
            promoted = run.maintenance.make_due_jobs_available(connection)
        run.wake_all()
        while True:
            # Read before each look at idle(): see the check below.
            dispatched = run.dispatched_batches
            if run.idle() or stop_requested.is_set():
                break
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"worker still busy after {timeout} s")
            # A short wait: the drain's end is noticed within 5 ms, without taking the
            # GIL from the handlers every couple of milliseconds.
            stop_requested.wait(0.005)
        if stop_requested.is_set():
            return False
        if (
            not promoted
            and not due_work_left(engine, queues)
            # A fetch that began after the idle check may have taken a job whose
            # completion releases more (a workflow's next step) before the database was
            # asked: then its answer is stale, look again.
            and run.idle()
            and run.dispatched_batches == dispatched
        ):
            return True
        if limited_recheck is not None:
            stop_requested.wait(limited_recheck)
    return False


@attrs.frozen
class IdleResult:
    """What one :meth:`~sa_jobs.worker.Worker.run_until_idle` call did and left behind.

    Attributes:
        worked: Attempts that ended during the call (completed, failed, cancelled,
            snoozed, ...).
        unserved: Queue -> available jobs waiting in a queue this worker does not
            serve (paused queues left out), counted up to :data:`UNSERVED_COUNTED` in
            all; empty when there are none, or when the call stopped early.
        stopped_early: :meth:`~sa_jobs.worker.Worker.stop` or a signal ended the call
            before the queues were idle; what was left stays queued.
    """

    worked: int = 0
    unserved: Mapping[str, int] = attrs.field(factory=dict)
    stopped_early: bool = False


def due_work_left(engine: Engine, queues: Collection[str]) -> bool:
    """Whether a job of ``queues`` (not paused) is due now: available, or scheduled or
    retryable with its time come."""
    conditions = [
        Job.queue.in_(list(queues)),
        Job.scheduled_at <= func.now(),
        state_is(Job.state, JobState.AVAILABLE, JobState.SCHEDULED, JobState.RETRYABLE),
    ]
    with engine.connect() as connection:
        if Features.of(connection).queue:
            # A paused queue's jobs are not work this worker could do now.
            conditions.append(queue_not_paused(Job.queue))
        return bool(connection.scalar(select(exists().where(*conditions))))


def unserved_due_jobs(engine: Engine, queues: Collection[str]) -> dict[str, int]:
    """Available jobs per queue outside ``queues`` (paused queues left out), at most
    :data:`UNSERVED_COUNTED` in all. Called once the served queues are idle: the
    scheduler has just made every due job available, whatever its queue."""
    conditions = [state_is(Job.state, JobState.AVAILABLE), Job.queue.not_in(list(queues))]
    with engine.connect() as connection:
        if Features.of(connection).queue:
            conditions.append(queue_not_paused(Job.queue))
        # Through the fetch index (its partial index on available jobs, queue first).
        capped = select(Job.queue).where(*conditions).limit(UNSERVED_COUNTED).subquery()
        rows = connection.execute(
            select(capped.c.queue, func.count()).group_by(capped.c.queue).order_by(capped.c.queue)
        )
        return {queue: count for queue, count in rows}
