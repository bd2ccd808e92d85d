"""Rescuing jobs whose worker vanished.

River cannot tell a slow job from a dead worker, so it rescues any job running longer
than a horizon that must exceed every timeout. sa_jobs can tell: every worker process
heartbeats (:mod:`.heartbeat`), and a ``running`` job is rescued only when the process
that fetched it has not heartbeated for ``rescue_after`` seconds (or its row is gone).
A live worker's jobs are never touched, however long they run — the worker enforces
their timeouts itself.

A rescue is a failed attempt like any other, written by the same transition the
completer uses (:func:`sa_jobs._act.complete.finish_in`): the job becomes ``retryable``,
due after its retry policy's delay (the handler's policy if this process has a handler
for the kind, else the worker's), ``discarded`` if it has no attempts left, or
``cancelled`` if someone asked; the reason is appended to its ``errors``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Connection, Select, and_, exists, func, select
from sqlalchemy.orm import Session
from sqlalchemy.sql.expression import ColumnElement

from sa_jobs._act.complete import finish_in
from sa_jobs._base.error_records import message_record
from sa_jobs._base.records import Ending, Outcome
from sa_jobs._base.sql import seconds_interval
from sa_jobs._base.states import JobState
from sa_jobs._insert.sequence import lock_sequences_of_jobs
from sa_jobs._table.models import Job, state_is
from sa_jobs._table.schema import ALL_FEATURES, Features
from sa_jobs._table.service_tables import WorkerProcess
from sa_jobs.worker.retry import DEFAULT_RETRY_POLICY, retry_delay

__all__ = ["Rescuer", "jobs_orphaned"]

#: ``(delay in seconds, note)`` for a job whose attempt failed; see Worker.retry_delay_for.
RetryDelay = Callable[[Job[Any]], tuple[float, str | None]]


def _orphaned(
    rescue_after: float, own: tuple[str, Sequence[int]] | None
) -> list[ColumnElement[bool]]:
    """The conditions a rescued job meets (see :func:`jobs_orphaned`)."""
    last_worker = Job.attempted_by[func.cardinality(Job.attempted_by)]
    if own is None:
        alive = exists().where(
            WorkerProcess.id == last_worker,
            WorkerProcess.heartbeat_at > func.now() - seconds_interval(rescue_after),
        )
        lost: ColumnElement[bool] = ~alive
    else:
        worker_id, held = own
        lost = and_(last_worker == worker_id, Job.id.not_in(list(held)))
    return [
        state_is(Job.state, JobState.RUNNING),
        Job.attempted_at < func.now() - seconds_interval(rescue_after),
        lost,
    ]


def jobs_orphaned(
    rescue_after: float, limit: int, *, own: tuple[str, Sequence[int]] | None = None
) -> Select[Any]:
    """Ids of up to ``limit`` running jobs whose worker is gone (see the module docstring).

    With ``own=(worker_id, held_ids)``: instead, the jobs running under that worker id
    that the (live) process does not hold.
    """
    return select(Job.id).where(*_orphaned(rescue_after, own)).limit(limit)


def _default_retry_delay(job: Job[Any]) -> tuple[float, str | None]:
    return retry_delay(DEFAULT_RETRY_POLICY, job)


class Rescuer:
    def __init__(
        self,
        rescue_after: float,
        limit: int = 1000,
        *,
        features: Features = ALL_FEATURES,
        retry_delay: RetryDelay = _default_retry_delay,
    ) -> None:
        self.rescue_after = rescue_after
        self.limit = limit
        self.features = features
        self.retry_delay = retry_delay

    def run_once(
        self, connection: Connection, *, own: tuple[str, Sequence[int]] | None = None
    ) -> int:
        """Returns the number of jobs rescued (see :func:`jobs_orphaned` for ``own``)."""
        return len(self.rescue(connection, own=own))

    def rescue(
        self, connection: Connection, *, own: tuple[str, Sequence[int]] | None = None
    ) -> list[tuple[int, JobState]]:
        """Rescue orphaned jobs; returns ``(id, new state)`` of each."""
        candidates = list(connection.scalars(jobs_orphaned(self.rescue_after, self.limit, own=own)))
        if not candidates:
            return []
        if self.features.sequence:
            # Sequence locks before row locks, in the order inserters take them.
            lock_sequences_of_jobs(connection, candidates)
        with Session(bind=connection, expire_on_commit=False) as session:
            jobs = session.scalars(
                select(Job)
                .where(Job.id.in_(candidates), *_orphaned(self.rescue_after, own))
                .with_for_update(skip_locked=True)
            ).all()
            outcomes = [self._outcome(job) for job in jobs]
        return finish_in(connection, outcomes) if outcomes else []

    def _outcome(self, job: Job[Any]) -> Outcome:
        worker = job.attempted_by[-1] if job.attempted_by else "?"
        record = message_record(
            job.attempt,
            f"RescuedError: worker {worker} stopped heartbeating for over "
            f"{self.rescue_after:g} s while running this job",
        )
        delay, note = self.retry_delay(job)
        if note is not None:
            record["retry_policy_error"] = note
        return Outcome.of(job, Ending.FAILED, delay=delay, error=record)
