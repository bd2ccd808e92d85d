"""Acting on jobs from outside the worker: cancel and retry, in the caller's transaction.

Both take a session and run in its transaction, like the insert paths, so an
application can cancel a job together with the change that made it pointless.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Text, case, func, literal, null, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from sa_jobs import sequence
from sa_jobs.errors import JobNotFoundError, JobStateError, UniqueConflictError
from sa_jobs.models import Job, entering, holds_unique_key, job_table, unique_index
from sa_jobs.schema import CONTROL_CHANNEL, Features
from sa_jobs.sessions import either_session
from sa_jobs.states import CANCEL_ATTEMPTED_KEY, FINAL_STATES, JobState

__all__ = ["cancel_job", "retry_job"]

_FINAL = [state.value for state in FINAL_STATES]
#: retry_job does not touch these: running needs a cancel first; available is retried
#: already.
_LEFT_ALONE = [JobState.RUNNING.value, JobState.AVAILABLE.value]


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
    connection = session.connection()
    features = Features.of(connection)
    if features.sequence:
        # Sequence locks before row locks, in the order inserters take them.
        sequence.lock_sequences_of_jobs(connection, [job_id])
    running = Job.state == JobState.RUNNING
    values: dict[str, Any] = {
        # A running job stays running until its worker ends the run.
        **entering(case((running, Job.state.cast(Text)), else_=JobState.CANCELLED.value)),
        "metadata_": Job.metadata_.op("||")(
            func.jsonb_build_object(CANCEL_ATTEMPTED_KEY, func.now())
        ),
    }
    if features.job_key:
        values["job_key"] = case((running, Job.job_key), else_=null())
    statement = (
        update(Job)
        .where(Job.id == job_id, Job.state.not_in(_FINAL))
        .values(values)
        .returning(Job.id, Job.state)
    )
    changed = session.execute(statement).one_or_none()
    if changed is not None and changed.state is JobState.RUNNING:
        session.execute(select(func.pg_notify(CONTROL_CHANNEL, json.dumps({"cancel": job_id}))))
    elif changed is not None and features.sequence:
        sequence.advance_sequences(connection, [job_id])
    return _reload(session, job_id)


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
    values: dict[str, Any] = {
        "state": JobState.AVAILABLE,
        "scheduled_at": func.least(Job.scheduled_at, func.now()),
        "finalized_at": null(),
        "max_attempts": case(
            (Job.attempt >= Job.max_attempts, Job.attempt + 1), else_=Job.max_attempts
        ),
        "metadata_": Job.metadata_.op("-")(literal(CANCEL_ATTEMPTED_KEY)),
    }
    try:
        # A savepoint, so a unique conflict leaves the caller's transaction usable.
        with session.begin_nested():
            connection = session.connection()
            if Features.of(connection).sequence:
                values.update(sequence.retry_values(connection, job_id))
            statement = (
                update(Job)
                .where(Job.id == job_id, Job.state.not_in(_LEFT_ALONE))
                .values(values)
                .returning(Job.id)
            )
            retried = session.execute(statement).one_or_none()
    except IntegrityError as exc:
        if str(unique_index.name) not in str(exc.orig):
            raise
        raise UniqueConflictError(job_id, _unique_key_holder(session, job_id)) from None
    if retried is None:
        job = _reload(session, job_id)
        if job.state is JobState.AVAILABLE:
            return job  # already waiting to run: nothing to do
        allowed = [state.value for state in JobState if state is not JobState.RUNNING]
        raise JobStateError(job_id, job.state.value, "retry", allowed)
    return _reload(session, job_id)


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
