"""Acting on jobs from outside the worker: cancel and retry, in the caller's transaction.

Both take a session and run in its transaction, like the insert paths, so an
application can cancel a job together with the change that made it pointless. The
transitions are written once, for a list of ids: :func:`cancel_job` and
:func:`retry_job` apply them to one job, :mod:`sa_jobs._act.by_filter` to a batch.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Text, bindparam, case, func, literal, null, select, update
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from sqlalchemy.sql.expression import CTE, ColumnElement

from sa_jobs._act import workflow_revive as revive
from sa_jobs._act.workflow_release import after_finished
from sa_jobs._base.sessions import either_session
from sa_jobs._base.states import CANCEL_ATTEMPTED_KEY, FINAL_STATES, JobState
from sa_jobs._insert import sequence
from sa_jobs._table.feature_indexes import holds_unique_key, unique_index
from sa_jobs._table.models import Job, entering, job_table, state_is
from sa_jobs._table.schema import CONTROL_CHANNEL, Features
from sa_jobs.errors import JobNotFoundError, JobStateError, UniqueConflictError

__all__ = ["cancel_ids", "cancel_job", "locked_in_id_order", "retry_ids", "retry_job", "retry_one"]

_FINAL = [state.value for state in FINAL_STATES]
#: retry_job does not touch these: running needs a cancel first; available is retried
#: already.
_LEFT_ALONE = [JobState.RUNNING.value, JobState.AVAILABLE.value]


def locked_in_id_order(job_ids: Sequence[int], *where: ColumnElement[bool]) -> CTE:
    """The ids of these jobs that match ``where``, locked ``FOR UPDATE`` in id order: a
    CTE for a statement that changes several jobs to join (``Job.id == cte.c.id``).

    Locking in one order is what keeps two such statements from deadlocking when their
    batches overlap. ``UPDATE``/``DELETE … WHERE id IN (…)`` alone locks rows in whatever
    order its plan visits them — a bitmap scan goes in physical order, which differs
    with each statement's snapshot once rows have been updated — and two bulk actions
    racing a worker did deadlock that way. A row locked by someone else is waited for,
    then ``where`` is checked again on its latest version (a job a worker started
    meanwhile no longer matches ``state != running``).
    """
    return (
        select(Job.id)
        .where(Job.id.in_(job_ids), *where)
        .order_by(Job.id)
        .with_for_update()
        .cte("locked_in_id_order")
    )


@either_session
def cancel_job(session: Session, job_id: int) -> Job[Any]:
    """Cancel a job.

    A job that is not running is ``cancelled`` at once. A running one is marked (its
    metadata gets ``cancel_attempted_at``) and its worker is told through ``NOTIFY``
    when the transaction commits; the worker interrupts the handler and the job ends
    ``cancelled`` (unless it completes first). A finished job is returned unchanged.

    Raises:
        JobNotFoundError: no such job.
    """
    cancel_ids(session, [job_id])
    return _reload(session, job_id)


def cancel_ids(
    session: Session, job_ids: Sequence[int], *where: ColumnElement[bool]
) -> list[tuple[int, JobState]]:
    """Cancel these jobs, as :func:`cancel_job` cancels one (and :func:`sa_jobs.cancel_jobs`
    a batch); ``where`` narrows them further, checked on each row's latest version.

    Returns:
        ``(id, state)`` of every job changed: ``running`` for a cancel request.
    """
    if not job_ids:
        return []
    connection = session.connection()
    features = Features.of(connection)
    if features.sequence:
        # Sequence locks before row locks, in the order inserters take them.
        sequence.lock_sequences_of_jobs(connection, job_ids)
    running = state_is(Job.state, JobState.RUNNING)
    values: dict[str, Any] = {
        # A running job stays running until its worker ends the run.
        **entering(case((running, Job.state.cast(Text)), else_=JobState.CANCELLED.value)),
        "metadata_": Job.metadata_.op("||")(
            func.jsonb_build_object(CANCEL_ATTEMPTED_KEY, func.now())
        ),
    }
    if features.job_key:
        values["job_key"] = case((running, Job.job_key), else_=null())
    locked = locked_in_id_order(job_ids, Job.state.not_in(_FINAL), *where)
    returned = (Job.id, Job.state, Job.workflow_id) if features.workflow else (Job.id, Job.state)
    statement = (
        update(Job)
        .where(Job.id == locked.c.id)
        .values(values)
        .returning(*returned)
        .execution_options(synchronize_session="fetch")
    )
    rows = session.execute(statement).all()
    changed = [(row[0], row[1]) for row in rows]
    requested = [job_id for job_id, state in changed if state is JobState.RUNNING]
    if requested:
        _notify_cancel(session, requested)
    stopped = [job_id for job_id, state in changed if state is not JobState.RUNNING]
    if stopped and features.sequence:
        sequence.advance_sequences(connection, stopped)
    if features.workflow:
        # Cancelled steps cascade to their dependents, and count in their workflows.
        stopped_steps = [(row[0], row[1], row[2]) for row in rows if row[1] is not JobState.RUNNING]
        after_finished(connection, stopped_steps)
    return changed


def _notify_cancel(session: Session, job_ids: Sequence[int]) -> None:
    """Tell the workers running these jobs (one statement, one notification per job)."""
    payloads = [json.dumps({"cancel": job_id}) for job_id in job_ids]
    each = func.unnest(bindparam("sa_jobs_cancel_payloads", payloads, type_=ARRAY(Text)))
    payload = each.table_valued("payload").render_derived(name="cancels")
    session.execute(select(func.count(func.pg_notify(CONTROL_CHANNEL, payload.c.payload))))


@either_session
def retry_job(session: Session, job_id: int) -> Job[Any]:
    """Make a job available to run again now (River's ``JobRetry``).

    Works on any job that is not running: a finished one is revived (with one more
    attempt allowed if it had spent them all), a scheduled or retryable one is brought
    forward. Its ``scheduled_at`` only ever moves earlier (to now), so a job already
    waiting keeps its place in line, and a job that is ``available`` already is left
    exactly as it is. Errors are kept; ``attempt`` keeps counting.

    Raises:
        JobStateError: the job is running (cancel it first).
        UniqueConflictError: the job is unique and another job now holds its key.
        JobNotFoundError: no such job.
    """
    if not retry_one(session, job_id):
        job = _reload(session, job_id)
        if job.state is JobState.AVAILABLE:
            return job  # already waiting to run: nothing to do
        allowed = [state.value for state in JobState if state is not JobState.RUNNING]
        raise JobStateError(job_id, job.state.value, "retry", allowed)
    return _reload(session, job_id)


def _retry_values(workflow: bool = False) -> dict[str, Any]:
    # A step whose dependencies are not all resolved waits again (revive.retry_state).
    return {
        **entering(JobState.AVAILABLE),
        "scheduled_at": func.least(Job.scheduled_at, func.now()),
        "max_attempts": case(
            (Job.attempt >= Job.max_attempts, Job.attempt + 1), else_=Job.max_attempts
        ),
        "metadata_": Job.metadata_.op("-")(literal(CANCEL_ATTEMPTED_KEY)),
        **(revive.retry_state() if workflow else {}),
    }


def retry_one(session: Session, job_id: int, *where: ColumnElement[bool]) -> bool:
    """Retry one job as :func:`retry_job` does (sequence rules included), in a savepoint;
    whether it changed (False: running, available, gone, or not matching ``where``).

    Raises:
        UniqueConflictError: the job is unique and another job now holds its key.
    """
    try:
        # A savepoint, so a unique conflict leaves the caller's transaction usable.
        with session.begin_nested():
            connection = session.connection()
            features = Features.of(connection)
            values = _retry_values(features.workflow)
            steps = revive.lock_for_retry(connection, [job_id]) if features.workflow else {}
            if features.sequence:
                values.update(sequence.retry_values(connection, job_id))
            statement = (
                update(Job)
                .where(Job.id == job_id, Job.state.not_in(_LEFT_ALONE), *where)
                .values(values)
                .returning(Job.id)
                .execution_options(synchronize_session="fetch")
            )
            retried = session.execute(statement).one_or_none()
            if retried is not None and steps:
                revive.after_retried(connection, steps, [job_id])
    except IntegrityError as exc:
        if str(unique_index.name) not in str(exc.orig):
            raise
        raise UniqueConflictError(job_id, _unique_key_holder(session, job_id)) from None
    return retried is not None


def retry_ids(
    session: Session, job_ids: Sequence[int], *where: ColumnElement[bool]
) -> tuple[list[int], list[int]]:
    """Retry these jobs as :func:`retry_job` retries one; ``where`` narrows them further.

    Jobs outside any sequence are retried by one statement; should it meet a unique
    conflict, and for every sequenced job (whose slot is decided job by job, in id
    order, as :func:`~sa_jobs._insert.sequence.retry_values` does), one job at a time.

    Returns:
        The ids retried, and those left as they were because another job holds their
        unique key.
    """
    if not job_ids:
        return [], []
    connection = session.connection()
    features = Features.of(connection)
    one_by_one: list[int] = []
    plain = list(job_ids)
    if features.sequence:
        sequenced = set(
            session.scalars(
                select(Job.id).where(Job.id.in_(job_ids), Job.sequence_key.is_not(None))
            )
        )
        plain = [job_id for job_id in job_ids if job_id not in sequenced]
        one_by_one = sorted(sequenced)
    retried: list[int] = []
    if plain:
        locked = locked_in_id_order(plain, Job.state.not_in(_LEFT_ALONE), *where)
        statement = (
            update(Job)
            .where(Job.id == locked.c.id)
            .values(_retry_values(features.workflow))
            .returning(Job.id)
            .execution_options(synchronize_session="fetch")
        )
        try:
            with session.begin_nested():
                steps = revive.lock_for_retry(connection, plain) if features.workflow else {}
                done = list(session.scalars(statement))
                if steps:
                    revive.after_retried(connection, steps, done)
                retried.extend(done)
        except IntegrityError as exc:
            if str(unique_index.name) not in str(exc.orig):
                raise
            one_by_one = sorted([*plain, *one_by_one])
    conflicts: list[int] = []
    for job_id in one_by_one:
        try:
            if retry_one(session, job_id, *where):
                retried.append(job_id)
        except UniqueConflictError:
            conflicts.append(job_id)
    return sorted(retried), conflicts


def _unique_key_holder(session: Session, job_id: int) -> int | None:
    other = job_table.alias("other")
    key = select(Job.unique_key).where(Job.id == job_id).scalar_subquery()
    return session.scalar(
        select(other.c.id).where(other.c.unique_key == key, holds_unique_key(other)).limit(1)
    )


def _reload(session: Session, job_id: int) -> Job[Any]:
    job = session.execute(
        select(Job).where(Job.id == job_id).execution_options(populate_existing=True)
    ).scalar_one_or_none()
    if job is None:
        raise JobNotFoundError(job_id)
    return job
