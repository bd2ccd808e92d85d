"""Making due jobs available: ``scheduled`` and ``retryable`` jobs whose time has come."""

from __future__ import annotations

from sqlalchemy import Connection, func, literal, select, update

from sa_jobs.models import Job, JobState
from sa_jobs.worker.notifier import INSERT_CHANNEL

__all__ = ["Scheduler", "jobs_schedule_due"]


def jobs_schedule_due(limit: int):  # type: ignore[no-untyped-def]
    """Promote up to ``limit`` due jobs and notify their queues, in one statement.

    Returns ``(queue, count)`` per queue that received jobs.
    """
    due = (
        select(Job.id)
        .where(
            Job.state.in_([JobState.SCHEDULED, JobState.RETRYABLE]),
            Job.scheduled_at <= func.now(),
        )
        .order_by(Job.scheduled_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
        .cte("due")
    )
    promoted = (
        update(Job)
        .where(Job.id == due.c.id)
        .values(state=JobState.AVAILABLE)
        .returning(Job.queue)
        .cte("promoted")
    )
    return select(
        promoted.c.queue,
        func.count(),
        func.pg_notify(literal(INSERT_CHANNEL), promoted.c.queue),
    ).group_by(promoted.c.queue)


class Scheduler:
    def __init__(self, limit: int = 10_000) -> None:
        self.limit = limit

    def run_once(self, connection: Connection) -> int:
        """Returns the number of jobs made available."""
        rows = connection.execute(jobs_schedule_due(self.limit)).all()
        return sum(count for _, count, _ in rows)
