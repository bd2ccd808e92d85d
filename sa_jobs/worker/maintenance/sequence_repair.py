"""Restarting stalled sequences: a maintenance pass, a repair rather than the normal path.

Normally the job that finishes holding a sequence's slot passes it on in the same
transaction (:func:`sa_jobs._insert.sequence.advance_sequences`). Two kinds of stall escape that:
a slot holder that finished without passing its slot on (its state was changed by
hand, say), and waiting jobs with no holder at all (an inserter rolled back, a crash, a
hand edit). This pass finds both and gives each such sequence's slot to its lowest
pending job.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Select, any_, exists, func, select

from sa_jobs._base.states import JobState
from sa_jobs._insert.sequence import (
    advance_sequences,
    ids_param,
    lock_keys_of_jobs,
    passes_slot_on,
    promote_next,
)
from sa_jobs._table.models import Job, job_table, state_is

__all__ = ["SequenceRepair", "jobs_stalled_sequences"]


def jobs_stalled_sequences(limit: int, among: Sequence[int] | None = None) -> Select[Any]:
    """Ids of the lowest pending job of sequences that have waiting jobs and no holder.

    With ``among``, only the sequences of those jobs are looked at.
    """
    holder = job_table.alias("holder")
    waiting = job_table.alias("waiting")
    conditions = []
    if among is not None:
        # ARRAY(subquery) is computed once (an InitPlan) and becomes an index condition
        # on the pending index. As an IN (subquery), the planner, which expects almost
        # no pending rows on a big table, drove from the pending rows and re-ran the
        # key lookup for each: quadratic in the candidates (5,050 lookups for 100).
        keys = select(Job.sequence_key).where(Job.id.in_(ids_param(among))).scalar_subquery()
        conditions.append(waiting.c.sequence_key == any_(func.array(keys)))
    return (
        select(func.min(waiting.c.id).label("id"))
        .where(
            *conditions,
            waiting.c.sequence_key.is_not(None),
            state_is(waiting.c.state, JobState.PENDING),
            ~exists().where(
                holder.c.sequence_key == waiting.c.sequence_key,
                holder.c.sequence_key.is_not(None),
                holder.c.sequence_slot,
            ),
        )
        .group_by(waiting.c.sequence_key)
        .limit(limit)
    )


class SequenceRepair:
    """The maintenance pass (see the module docstring)."""

    def __init__(self, limit: int = 1000) -> None:
        self.limit = limit

    def run_once(self, connection: Connection) -> int:
        """Returns the number of sequences restarted."""
        finished_holders = connection.scalars(
            select(Job.id)
            .where(Job.sequence_key.is_not(None), Job.sequence_slot, passes_slot_on())
            .limit(self.limit)
        ).all()
        restarted = advance_sequences(connection, list(finished_holders))
        candidates = [row.id for row in connection.execute(jobs_stalled_sequences(self.limit))]
        if not candidates:
            return restarted
        connection.execute(lock_keys_of_jobs(ids_param(candidates)))
        # Under the locks, with a fresh snapshot: take only the sequences whose locks were
        # just taken, and only those still without a holder.
        stalled = jobs_stalled_sequences(self.limit, among=candidates).subquery("still_stalled")
        keys = select(Job.sequence_key).where(Job.id.in_(select(stalled.c.id))).cte("stalled_keys")
        promoted, _ = connection.execute(promote_next(keys)).one()
        return restarted + int(promoted)
