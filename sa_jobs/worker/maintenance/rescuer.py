"""Rescuing jobs whose worker vanished.

River cannot tell a slow job from a dead worker, so it rescues any job running longer
than a horizon that must exceed every timeout. sa_jobs can tell: every worker process
heartbeats (:mod:`.presence`), and a ``running`` job is rescued only when the process
that fetched it has not heartbeated for ``rescue_after`` seconds (or its row is gone).
A live worker's jobs are never touched, however long they run — the worker enforces
their timeouts itself.

A rescued job is ``retryable`` (due after the default backoff), ``discarded`` if it has
no attempts left, or ``cancelled`` if someone asked to cancel it; the reason is appended
to its ``errors``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Select, and_, case, exists, func, literal, null, select, update
from sqlalchemy import cast as sql_cast
from sqlalchemy.sql.dml import ReturningUpdate

from sa_jobs.complete import CANCEL_ATTEMPTED_KEY
from sa_jobs.models import FINAL_STATES, Job, JobState, WorkerProcess, job_state_type
from sa_jobs.sequence import advance_sequences, lock_sequences_of_jobs

__all__ = ["Rescuer", "jobs_rescue_orphaned"]


def _seconds(value: object) -> object:
    return func.make_interval(0, 0, 0, 0, 0, 0, value)


def jobs_orphaned(
    rescue_after: float, limit: int, *, own: tuple[str, Sequence[int]] | None = None
) -> Select[int]:
    """Ids of up to ``limit`` running jobs whose worker is gone (see the module docstring).

    With ``own=(worker_id, held_ids)``: instead, the jobs running under that worker id
    that the (live) process does not hold.
    """
    last_worker = Job.attempted_by[func.cardinality(Job.attempted_by)]
    if own is None:
        alive = exists().where(
            WorkerProcess.id == last_worker,
            WorkerProcess.heartbeat_at > func.now() - _seconds(literal(rescue_after)),
        )
        lost = ~alive
    else:
        worker_id, held = own
        lost = and_(last_worker == worker_id, Job.id.not_in(list(held)))
    return (
        select(Job.id)
        .where(
            Job.state == JobState.RUNNING,
            Job.attempted_at < func.now() - _seconds(literal(rescue_after)),
            lost,
        )
        .limit(limit)
    )


def jobs_rescue_orphaned(
    rescue_after: float,
    limit: int,
    *,
    job_key: bool = False,
    own: tuple[str, Sequence[int]] | None = None,
    among: Sequence[int] | None = None,
) -> ReturningUpdate[int, JobState]:
    """Rescue up to ``limit`` running jobs whose worker is gone; returns ``(id, state)``.

    ``own`` is as for :func:`jobs_orphaned`; ``among`` limits the rescue to these ids
    (already chosen, and their sequences locked). With ``job_key``, a rescued job that
    ends cancelled releases its key.
    """
    last_worker = Job.attempted_by[func.cardinality(Job.attempted_by)]
    candidates = jobs_orphaned(rescue_after, limit, own=own)
    if among is not None:
        candidates = candidates.where(Job.id.in_(list(among)))
    orphaned = candidates.with_for_update(skip_locked=True).cte("orphaned")
    next_state = case(
        (Job.metadata_.has_key(CANCEL_ATTEMPTED_KEY), JobState.CANCELLED.value),
        (Job.attempt >= Job.max_attempts, JobState.DISCARDED.value),
        else_=JobState.RETRYABLE.value,
    )
    error = func.jsonb_build_object(
        "attempt",
        Job.attempt,
        "error",
        func.concat(
            "RescuedError: worker ",
            last_worker,
            f" stopped heartbeating for over {rescue_after:g} s while running this job",
        ),
        "at",
        func.now(),
    )
    return (
        update(Job)
        .where(Job.id == orphaned.c.id)
        .values(
            state=sql_cast(next_state, job_state_type),
            finalized_at=case(
                (next_state.in_([s.value for s in FINAL_STATES]), func.now()), else_=null()
            ),
            # The process died, maybe not the job's fault: retry after the default backoff.
            scheduled_at=func.now() + _seconds(func.least(func.power(Job.attempt, 4), 86400)),
            errors=Job.errors + func.jsonb_build_array(error),
            **(
                {
                    "job_key": case(
                        (next_state == JobState.CANCELLED.value, null()), else_=Job.job_key
                    )
                }
                if job_key
                else {}
            ),
        )
        .returning(Job.id, Job.state)
    )


def _release_job_key(next_state: Any) -> dict[str, Any]:
    return {"job_key": case((next_state == JobState.CANCELLED.value, null()), else_=Job.job_key)}


class Rescuer:
    def __init__(
        self,
        rescue_after: float,
        limit: int = 1000,
        *,
        sequence: bool = False,
        job_key: bool = False,
    ) -> None:
        self.rescue_after = rescue_after
        self.limit = limit
        self.sequence = sequence
        self.job_key = job_key

    def run_once(
        self, connection: Connection, *, own: tuple[str, Sequence[int]] | None = None
    ) -> int:
        """Returns the number of jobs rescued (see :func:`jobs_rescue_orphaned` for ``own``)."""
        among = None
        if self.sequence:
            # Sequence locks before row locks, in the order inserters take them.
            among = list(connection.scalars(jobs_orphaned(self.rescue_after, self.limit, own=own)))
            if not among:
                return 0
            lock_sequences_of_jobs(connection, among)
        rescue = jobs_rescue_orphaned(
            self.rescue_after, self.limit, job_key=self.job_key, own=own, among=among
        )
        rescued = connection.execute(rescue).all()
        if self.sequence:
            finished = [job_id for job_id, state in rescued if state in FINAL_STATES]
            advance_sequences(connection, finished)
        return len(rescued)
