"""Bulk actions on jobs by filter: :func:`delete_jobs`, :func:`retry_jobs`, :func:`cancel_jobs`.

Each takes a session and works in its transaction, like the single-job functions, and
goes through the very same transitions (:mod:`sa_jobs._act.control`): a cancelled sequenced
job halts its sequence, a retry respects unique keys and sequence slots, a running job is
asked to stop rather than changed under its worker.

**The filter.** Keywords, combined with AND; each list keyword matches any of its values:
``kind`` (args classes or kind strings), ``queue``, ``state``, ``ids``, ``created_before``
and ``finalized_before`` (an aware datetime, or a timedelta meaning "that long ago" on the
database's clock). A call without any of them is refused — nothing is deleted, cancelled
or retried by accident — and so is a kind or queue nothing knows (a typo would match
nothing and look like success): a *known kind* is one a declared args class has or some
job row has; a *known queue* is one a job is in, a worker serves, or a queue control
names (:mod:`sa_jobs._act.queues`). Every check runs before anything is written, on the first
call of a run (``after_id=0``; a continuing call skips the kind and queue checks, as the
jobs that made them known may be the ones deleted).

**Batches.** Matching ids are read in id order, :data:`DEFAULT_BATCH_SIZE` at a time
(``batch_size=``), from a cursor (``id > last id``) on the primary key; each batch is
then changed by one statement that checks the filter again on the row's latest version
(a job a worker started meanwhile is not deleted). So no statement runs long, holds a
large result, or locks more than a batch of rows at once; each statement locks its rows
in id order first (:func:`~sa_jobs._act.control.locked_in_id_order`), so two bulk actions
cannot deadlock on each other. The locks of every batch are held
until the caller's transaction ends, though: on a large table, pass ``limit=`` and commit
between calls, continuing from the result's ``last_id`` (``after_id=``), which is what
``sa-jobs jobs delete|retry|cancel`` do — a transaction per batch.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal

import attrs
from sqlalchemy import Text, bindparam, delete, exists, func, select
from sqlalchemy.orm import Session
from sqlalchemy.sql.expression import ColumnElement

from sa_jobs._act.control import cancel_ids, locked_in_id_order, retry_ids
from sa_jobs._act.queues import check_known_queues
from sa_jobs._act.workflow_release import after_finished
from sa_jobs._act.workflow_retention import forget_deleted_steps
from sa_jobs._base.sessions import either_session
from sa_jobs._base.sql import seconds_interval
from sa_jobs._base.states import FINAL_STATES, JobState
from sa_jobs._declare.args import check_kind, default_registry
from sa_jobs._declare.option_checks import check_queue
from sa_jobs._insert import sequence
from sa_jobs._table.models import Job, state_is
from sa_jobs._table.schema import Features, translate_missing_schema
from sa_jobs.errors import InvalidOptionsError, UnknownKindError

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "MAX_BATCH_SIZE",
    "BulkResult",
    "JobFilter",
    "cancel_jobs",
    "delete_jobs",
    "retry_jobs",
]

#: Rows per statement: large enough that a million jobs take a thousand round trips,
#: small enough that each statement ends in milliseconds and locks few rows.
DEFAULT_BATCH_SIZE = 1000
MAX_BATCH_SIZE = 10_000
#: Job ids are bigint.
MAX_JOB_ID = 2**63 - 1

Operation = Literal["delete", "retry", "cancel"]

#: The states each action may be asked for, and why the others are refused.
_ALLOWED: dict[Operation, tuple[frozenset[JobState], str]] = {
    "delete": (
        frozenset(JobState) - {JobState.RUNNING},
        "running jobs are never deleted: cancel them first (cancel_jobs), then delete them "
        "once they have stopped",
    ),
    "retry": (
        frozenset(JobState) - {JobState.RUNNING, JobState.AVAILABLE},
        "running jobs cannot be retried (cancel them first) and available ones are "
        "waiting to run already",
    ),
    "cancel": (
        frozenset(JobState) - FINAL_STATES,
        "completed, cancelled and discarded jobs are finished already",
    ),
}

KindFilter = type | str
Age = dt.datetime | dt.timedelta


@attrs.frozen
class BulkResult:
    """What a bulk action did.

    Attributes:
        count: Jobs deleted, retried, or cancelled (cancel requests to running jobs
            included).
        last_id: The highest id this call went through; pass it as ``after_id`` to
            continue after a ``limit``. None when nothing matched.
        cancel_requested: ``cancel_jobs``: of ``count``, the running jobs whose workers
            were told to stop them.
        unique_conflicts: ``retry_jobs``: ids left as they were, because another job
            holds their unique key now.
    """

    count: int = 0
    last_id: int | None = None
    cancel_requested: int = 0
    unique_conflicts: tuple[int, ...] = ()


@attrs.frozen
class JobFilter:
    """A validated bulk filter (see the module); build it with :meth:`build`."""

    kinds: tuple[str, ...] = ()
    queues: tuple[str, ...] = ()
    states: tuple[JobState, ...] = ()
    ids: tuple[int, ...] = ()
    created_before: Age | None = None
    finalized_before: Age | None = None

    @classmethod
    def build(
        cls,
        operation: Operation,
        *,
        kind: KindFilter | Iterable[KindFilter] | None = None,
        queue: str | Iterable[str] | None = None,
        state: JobState | str | Iterable[JobState | str] | None = None,
        ids: Iterable[int] | None = None,
        created_before: Age | None = None,
        finalized_before: Age | None = None,
    ) -> JobFilter:
        """Check every value for ``operation``; nothing touches the database.

        Raises:
            InvalidOptionsError: an empty filter, a bad value (a class that is not a job
                args class too), or a state the operation refuses.
        """
        built = cls(
            kinds=tuple(check_kind(k) for k in _many(kind, (str, type))),
            queues=tuple(check_queue(q) for q in _many(queue, (str,))),
            states=tuple(_state(s) for s in _many(state, (str, JobState))),
            ids=tuple(_job_id(i) for i in _many(ids, ())),
            created_before=_age("created_before", created_before),
            finalized_before=_age("finalized_before", finalized_before),
        )
        if built == cls():
            raise InvalidOptionsError(
                "filter",
                f"{operation}_jobs() needs at least one of kind, queue, state, ids, "
                "created_before, finalized_before (an empty filter would match every job)",
            )
        allowed, why = _ALLOWED[operation]
        refused = sorted(s.value for s in built.states if s not in allowed)
        if refused:
            raise InvalidOptionsError("state", f"{operation}_jobs() refuses {refused}: {why}")
        return built

    def where(self, operation: Operation) -> list[ColumnElement[bool]]:
        """The filter as conditions on ``sa_job``, the operation's states included."""
        allowed, _ = _ALLOWED[operation]
        states = self.states or tuple(s for s in JobState if s in allowed)
        conditions: list[ColumnElement[bool]] = [state_is(Job.state, *states)]
        if self.kinds:
            conditions.append(Job.kind.in_(self.kinds))
        if self.queues:
            conditions.append(Job.queue.in_(self.queues))
        if self.ids:
            conditions.append(Job.id.in_(self.ids))
        if self.created_before is not None:
            conditions.append(Job.created_at < _instant(self.created_before))
        if self.finalized_before is not None:
            conditions.append(Job.finalized_at < _instant(self.finalized_before))
        return conditions

    def check_known(self, session: Session) -> None:
        """Refuse a kind or queue nothing knows (see the module), before any write.

        Raises:
            UnknownKindError: a kind no declared class and no job row has.
            UnknownQueueError: a queue no job, worker or queue control names.
        """
        for kind in self.kinds:
            if kind in default_registry:
                continue
            name = bindparam("kind_name", kind, type_=Text)
            with translate_missing_schema():
                found = session.scalar(select(exists().where(Job.kind == name)))
            if not found:
                raise UnknownKindError(
                    kind,
                    f"no job args class declares kind {kind!r} and no job has it; check its "
                    "spelling, or import the module that declares it",
                )
        check_known_queues(session, list(self.queues))


def _many(value: Any, singles: tuple[type, ...]) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, singles) or not isinstance(value, Iterable):
        return [value]
    return list(value)


def _state(state: object) -> JobState:
    if isinstance(state, str) and state in JobState.__members__.values():
        return JobState(state)
    names = ", ".join(s.value for s in JobState)
    raise InvalidOptionsError("state", f"{state!r} is not a job state; one of {names}")


def _job_id(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_JOB_ID:
        raise InvalidOptionsError("ids", f"{value!r} is not a job id (1 to {MAX_JOB_ID})")
    return value


def _age(option: str, value: object) -> Age | None:
    if value is None:
        return None
    if isinstance(value, dt.timedelta):
        if value < dt.timedelta(0):
            raise InvalidOptionsError(option, f"a negative age ({value}) is in the future")
        return value
    if isinstance(value, dt.datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise InvalidOptionsError(
                option, f"{value.isoformat()} is naive; pass a time-zone-aware datetime"
            )
        return value
    raise InvalidOptionsError(
        option, f"must be a datetime or a timedelta (an age), got {type(value).__name__}"
    )


def _instant(value: Age) -> Any:
    if isinstance(value, dt.timedelta):
        return func.now() - seconds_interval(value.total_seconds())
    return value


def _check_batching(batch_size: object, limit: object, after_id: object) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int):
        raise InvalidOptionsError("batch_size", f"must be an int, got {batch_size!r}")
    if not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise InvalidOptionsError("batch_size", f"must be 1 to {MAX_BATCH_SIZE}, got {batch_size}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise InvalidOptionsError("limit", f"must be a positive int or None, got {limit!r}")
    if isinstance(after_id, bool) or not isinstance(after_id, int) or after_id < 0:
        raise InvalidOptionsError("after_id", f"must be a job id or 0, got {after_id!r}")


def _batches(
    session: Session,
    where: list[ColumnElement[bool]],
    batch_size: int,
    limit: int | None,
    after_id: int,
) -> Iterator[list[int]]:
    """Ids matching ``where``, in id order, a batch at a time (see the module)."""
    last, left = after_id, limit
    while left is None or left > 0:
        size = batch_size if left is None else min(batch_size, left)
        ids = list(
            session.scalars(
                select(Job.id).where(*where, Job.id > last).order_by(Job.id).limit(size)
            )
        )
        if not ids:
            return
        yield ids
        last = ids[-1]
        if left is not None:
            left -= len(ids)
        if len(ids) < size:
            return


def _run(
    session: Session,
    operation: Operation,
    job_filter: JobFilter,
    batch_size: int,
    limit: int | None,
    after_id: int,
    act: Callable[[Session, list[int], list[ColumnElement[bool]]], BulkResult],
) -> BulkResult:
    _check_batching(batch_size, limit, after_id)
    if after_id == 0:
        # A continuing call skips it: the jobs that made a kind or queue known may be
        # the very ones the earlier calls deleted.
        job_filter.check_known(session)
    where = job_filter.where(operation)
    total = BulkResult()
    with translate_missing_schema():
        for ids in _batches(session, where, batch_size, limit, after_id):
            done = act(session, ids, where)
            total = BulkResult(
                count=total.count + done.count,
                last_id=ids[-1],
                cancel_requested=total.cancel_requested + done.cancel_requested,
                unique_conflicts=total.unique_conflicts + done.unique_conflicts,
            )
    return total


def _delete_batch(session: Session, ids: list[int], where: list[ColumnElement[bool]]) -> BulkResult:
    connection = session.connection()
    features = Features.of(connection)
    sequenced = features.sequence
    if sequenced:
        # Sequence locks before row locks, as every path that changes sequenced jobs.
        sequence.lock_sequences_of_jobs(connection, ids)
    returned: tuple[Any, ...] = (
        (Job.id, Job.sequence_key, Job.sequence_slot) if sequenced else (Job.id,)
    )
    if features.workflow:
        returned += (Job.state, Job.workflow_id)
    locked = locked_in_id_order(ids, Job.state != JobState.RUNNING, *where)
    statement = (
        delete(Job)
        .where(Job.id == locked.c.id)
        .returning(*returned)
        .execution_options(synchronize_session="fetch")
    )
    rows = session.execute(statement).all()
    if sequenced:
        sequence.promote_after_delete(
            connection, [bytes(row.sequence_key) for row in rows if row.sequence_slot]
        )
    if features.workflow:
        # An unfinished step deleted counts as cancelled: its dependents are cancelled
        # (or released, if they run anyway) rather than left waiting for it.
        after_finished(
            connection,
            [
                (row.id, JobState.CANCELLED, row.workflow_id)
                for row in rows
                if row.workflow_id is not None and row.state not in FINAL_STATES
            ],
        )
        # Then (the cascade above walks them) their edges, and workflows left empty.
        forget_deleted_steps(connection, [(row.id, row.workflow_id) for row in rows])
    return BulkResult(count=len(rows))


def _retry_batch(session: Session, ids: list[int], where: list[ColumnElement[bool]]) -> BulkResult:
    retried, conflicts = retry_ids(session, ids, *where)
    return BulkResult(count=len(retried), unique_conflicts=tuple(conflicts))


def _cancel_batch(session: Session, ids: list[int], where: list[ColumnElement[bool]]) -> BulkResult:
    changed = cancel_ids(session, ids, *where)
    requested = sum(1 for _, state in changed if state is JobState.RUNNING)
    return BulkResult(count=len(changed), cancel_requested=requested)


@either_session
def delete_jobs(
    session: Session,
    *,
    kind: KindFilter | Iterable[KindFilter] | None = None,
    queue: str | Iterable[str] | None = None,
    state: JobState | str | Iterable[JobState | str] | None = None,
    ids: Iterable[int] | None = None,
    created_before: Age | None = None,
    finalized_before: Age | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    limit: int | None = None,
    after_id: int = 0,
) -> BulkResult:
    """Delete the jobs matching the filter, in the session's transaction (see the module).

    Running jobs are never deleted, whatever the filter: cancel them first
    (:func:`cancel_jobs`) and delete them once they have stopped. Without ``state``, every
    other state matches. Deleting the job that holds a sequence's slot (its active job,
    or the failed one that halted it) lets the sequence go on with its next job.

    Args:
        batch_size: Rows per statement.
        limit: At most this many jobs; continue with ``after_id=result.last_id``.
        after_id: Only jobs with a greater id.

    Raises:
        InvalidOptionsError: an empty filter, ``state="running"``, or a bad value.
        UnknownKindError: a kind no declared class and no job row has.
        UnknownQueueError: a queue no job, worker or queue control names.
    """
    job_filter = JobFilter.build(
        "delete",
        kind=kind,
        queue=queue,
        state=state,
        ids=ids,
        created_before=created_before,
        finalized_before=finalized_before,
    )
    return _run(session, "delete", job_filter, batch_size, limit, after_id, _delete_batch)


@either_session
def retry_jobs(
    session: Session,
    *,
    kind: KindFilter | Iterable[KindFilter] | None = None,
    queue: str | Iterable[str] | None = None,
    state: JobState | str | Iterable[JobState | str] | None = None,
    ids: Iterable[int] | None = None,
    created_before: Age | None = None,
    finalized_before: Age | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    limit: int | None = None,
    after_id: int = 0,
) -> BulkResult:
    """Retry the jobs matching the filter, as :func:`~sa_jobs.retry_job` retries one, in
    the session's transaction (see the module).

    Without ``state``, every state but ``running`` and ``available`` matches. A job whose
    unique key another job holds now is left as it is and listed in
    ``unique_conflicts``; sequenced jobs are retried in id order, so the first one of a
    halted sequence resumes it and the later ones wait their turn.

    Raises:
        InvalidOptionsError: an empty filter, ``running``/``available`` states, or a bad
            value.
        UnknownKindError: a kind no declared class and no job row has.
        UnknownQueueError: a queue no job, worker or queue control names.
    """
    job_filter = JobFilter.build(
        "retry",
        kind=kind,
        queue=queue,
        state=state,
        ids=ids,
        created_before=created_before,
        finalized_before=finalized_before,
    )
    return _run(session, "retry", job_filter, batch_size, limit, after_id, _retry_batch)


@either_session
def cancel_jobs(
    session: Session,
    *,
    kind: KindFilter | Iterable[KindFilter] | None = None,
    queue: str | Iterable[str] | None = None,
    state: JobState | str | Iterable[JobState | str] | None = None,
    ids: Iterable[int] | None = None,
    created_before: Age | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    limit: int | None = None,
    after_id: int = 0,
) -> BulkResult:
    """Cancel the jobs matching the filter, as :func:`~sa_jobs.cancel_job` cancels one,
    in the session's transaction (see the module).

    Without ``state``, every unfinished state matches. Running jobs are asked to stop
    (their workers hear it when the transaction commits; counted in
    ``cancel_requested``); the others are ``cancelled`` at once, and a sequenced one
    halts its sequence unless its ``continue_on_cancelled`` says otherwise.

    Raises:
        InvalidOptionsError: an empty filter, a finished state, or a bad value.
        UnknownKindError: a kind no declared class and no job row has.
        UnknownQueueError: a queue no job, worker or queue control names.
    """
    job_filter = JobFilter.build(
        "cancel", kind=kind, queue=queue, state=state, ids=ids, created_before=created_before
    )
    return _run(session, "cancel", job_filter, batch_size, limit, after_id, _cancel_batch)
