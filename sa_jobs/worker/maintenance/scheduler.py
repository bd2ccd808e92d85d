"""Making due jobs available: ``scheduled`` and ``retryable`` jobs whose time has come.

With unique jobs, promotion is where a key can be taken twice: a job left the unique
index when it became ``retryable`` (``by_state`` without retryable), a duplicate took
its key, and now it wants to be ``available`` again. River's answer, and ours: such a
job is discarded, and its metadata says which job holds the key. Of several due jobs
sharing a free key, the oldest is promoted and the others discarded.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Select, Text, case, func, literal, null, select, update

from sa_jobs._base.states import UNIQUE_CONFLICT_KEY, JobState
from sa_jobs._insert.sequence import advance_sequences
from sa_jobs._table.feature_indexes import holds_unique_key
from sa_jobs._table.models import Job, entering, job_table, state_is
from sa_jobs._table.schema import ALL_FEATURES, INSERT_CHANNEL, Features

__all__ = ["Scheduler", "jobs_schedule_due"]


def jobs_schedule_due(limit: int, *, unique: bool = False) -> Select[Any]:
    """Promote up to ``limit`` due jobs and notify their queues, in one statement.

    Returns ``(id, new state, _)`` for every job it changed: made available, or — a unique
    job whose key was taken meanwhile — discarded.
    """
    due = (
        select(Job.id)
        .where(
            state_is(Job.state, JobState.SCHEDULED, JobState.RETRYABLE),
            Job.scheduled_at <= func.now(),
        )
        .order_by(Job.scheduled_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
        .cte("due")
    )
    values: dict[str, Any] = entering(JobState.AVAILABLE)
    target = due
    if unique:
        taken_by = _key_taken_by(due).cte("taken")
        target = taken_by
        conflict = taken_by.c.taken_by.is_not(None)
        values = {
            **entering(case((conflict, JobState.DISCARDED.value), else_=JobState.AVAILABLE.value)),
            "metadata_": case(
                (
                    conflict,
                    Job.metadata_.op("||")(
                        func.jsonb_build_object(
                            UNIQUE_CONFLICT_KEY,
                            func.jsonb_build_object(
                                "discarded_at", func.now(), "key_held_by_job", taken_by.c.taken_by
                            ),
                        )
                    ),
                ),
                else_=Job.metadata_,
            ),
        }
    promoted = (
        update(Job)
        .where(Job.id == target.c.id)
        .values(values)
        .returning(Job.id, Job.queue, Job.state)
        .cte("promoted")
    )
    # PostgreSQL folds identical notifications within a transaction: one per queue.
    notify = case(
        (
            state_is(promoted.c.state, JobState.AVAILABLE),
            func.pg_notify(literal(INSERT_CHANNEL), promoted.c.queue).cast(Text),
        )
    )
    return select(promoted.c.id, promoted.c.state, notify)


def _key_taken_by(due: Any) -> Select[Any]:
    """For each due job: the id of a job that already holds its unique key, if any."""
    mine = job_table.alias("mine")
    # A due job that already holds its key (a scheduled one) keeps it as it becomes
    # available; only the jobs that do not hold theirs compete, the oldest first.
    holds = holds_unique_key(mine)
    ranked = (
        select(
            mine.c.id,
            mine.c.unique_key,
            holds.label("holds"),
            func.first_value(mine.c.id)
            .over(partition_by=(mine.c.unique_key, holds), order_by=mine.c.id)
            .label("first_id"),
        )
        .where(mine.c.id == due.c.id)
        .subquery("ranked")
    )
    other = job_table.alias("other")
    holder = (
        select(other.c.id)
        .where(
            other.c.unique_key == ranked.c.unique_key,
            other.c.id != ranked.c.id,
            holds_unique_key(other),
        )
        .limit(1)
        .scalar_subquery()
    )
    taken_by = case(
        (ranked.c.unique_key.is_(None), null()),
        (ranked.c.holds, null()),
        (ranked.c.first_id != ranked.c.id, ranked.c.first_id),
        else_=holder,
    )
    return select(ranked.c.id, taken_by.label("taken_by"))


class Scheduler:
    def __init__(self, limit: int = 10_000, *, features: Features = ALL_FEATURES) -> None:
        self.limit = limit
        self.features = features

    def run_once(self, connection: Connection) -> int:
        """Returns the number of jobs made available."""
        rows = connection.execute(jobs_schedule_due(self.limit, unique=self.features.unique)).all()
        discarded = [job_id for job_id, state, _ in rows if state is JobState.DISCARDED]
        if self.features.sequence and discarded:
            # A discarded job in a sequence passes its slot on (or halts it) like any other.
            advance_sequences(connection, discarded)
        return sum(1 for _, state, _ in rows if state is JobState.AVAILABLE)
