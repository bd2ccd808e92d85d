"""What :meth:`~sa_jobs.worker.Worker.run_until_idle` asks the database, and what it answers.

``run_until_idle`` stops once no due job is left in the queues the worker serves. Due
jobs in *other* queues are not its work, but a script or a test that drained "everything"
while a job sat in a queue nobody serves (a kind that defaults to ``"mail"``, a worker
that serves ``"default"``) would otherwise believe it had: so it counts them, logs a
warning, and returns them in :class:`IdleResult`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import attrs
from sqlalchemy import Engine, exists, func, select

from sa_jobs.models import Job
from sa_jobs.queues import queue_not_paused
from sa_jobs.schema import Features
from sa_jobs.states import JobState

__all__ = ["UNSERVED_COUNTED", "IdleResult", "due_work_left", "unserved_due_jobs"]

#: Available jobs of unserved queues counted at most, in all (a backlog of millions in
#: another queue must not make ``run_until_idle`` slow to return).
UNSERVED_COUNTED = 10_000


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
        Job.state.in_([JobState.AVAILABLE, JobState.SCHEDULED, JobState.RETRYABLE]),
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
    conditions = [Job.state == JobState.AVAILABLE, Job.queue.not_in(list(queues))]
    with engine.connect() as connection:
        if Features.of(connection).queue:
            conditions.append(queue_not_paused(Job.queue))
        # Through the fetch index (its partial index on available jobs, queue first).
        capped = select(Job.queue).where(*conditions).limit(UNSERVED_COUNTED).subquery()
        rows = connection.execute(
            select(capped.c.queue, func.count()).group_by(capped.c.queue).order_by(capped.c.queue)
        )
        return {queue: count for queue, count in rows}
