"""Finishing a run of a job: the one statement every completion path shares.

A run is identified by ``(id, run_count)``: the fetch increments ``run_count``, and
nothing lowers it. :func:`jobs_finish` only touches rows that are still ``running``
*with that run count*, so a late result from a run that timed out, was rescued, or was
completed by :func:`complete_in` never overwrites anything. ``attempt`` is River's: the
fetch increments it too, and a snooze or a shutdown gives it back (``max_attempts``
never changes).

The batched completer sends many outcomes in one :func:`jobs_finish` statement;
:func:`complete_in` sends one, inside the caller's transaction.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Sequence
from typing import Any

import attrs
from sqlalchemy import (
    BigInteger,
    Connection,
    Float,
    Integer,
    Text,
    and_,
    bindparam,
    case,
    column,
    func,
    null,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value
from sqlalchemy.sql.dml import ReturningUpdate
from sqlalchemy.sql.expression import ColumnElement, Select

from sa_jobs.errors import JobNotFoundError, JobStateError
from sa_jobs.models import Job, entering
from sa_jobs.schema import Features
from sa_jobs.sequence import advance_sequences, lock_keys_of_jobs
from sa_jobs.sessions import either_session
from sa_jobs.sql import json_recordset, seconds_interval
from sa_jobs.states import (
    CANCEL_ATTEMPTED_KEY,
    FINAL_STATES,
    JOB_KEY_REPLACED_KEY,
    RUNS_AGAIN_STATES,
    JobState,
)

__all__ = ["Outcome", "complete_in", "jobs_finish"]


class Ending(enum.StrEnum):
    """How a run ended, as the worker saw it."""

    COMPLETED = "completed"
    #: Failed: retryable, or discarded when no attempts are left (decided in SQL).
    FAILED = "failed"
    CANCELLED = "cancelled"
    #: Run again after ``delay`` without spending an attempt (a snooze).
    SNOOZED = "snoozed"
    #: Interrupted by shutdown: available again at once, attempt given back.
    RETURNED = "returned"


@attrs.frozen
class Outcome:
    """The result of one run, ready to be written."""

    job_id: int
    #: The run this outcome belongs to (the job's ``run_count`` when it was fetched).
    run: int
    ending: Ending
    #: Seconds from now (database clock) until the job is due again.
    delay: float | None = None
    #: Appended to the job's ``errors``.
    error: dict[str, Any] | None = None
    #: Whether the job is in a sequence; None when unknown (treated as maybe).
    sequenced: bool | None = None
    #: The job this outcome is for, when the writer has it (not written; lets a writer
    #: that cannot store the outcome fail the job with its retry policy instead).
    job: Job[Any] | None = attrs.field(default=None, eq=False, repr=False)

    @classmethod
    def of(cls, job: Job[Any], ending: Ending, **details: Any) -> Outcome:
        """An outcome for this run of ``job``."""
        return cls(job.id, job.run_count, ending, sequenced=in_sequence(job), job=job, **details)

    @classmethod
    def completed(cls, job: Job[Any]) -> Outcome:
        return cls.of(job, Ending.COMPLETED)


def in_sequence(job: Job[Any]) -> bool | None:
    """Whether a job is sequenced, if its row was loaded with ``sequence_key``."""
    if "sequence_key" not in job.__dict__:
        return None
    return job.__dict__["sequence_key"] is not None


_OUTCOME_COLUMNS = (
    column("id", BigInteger),
    column("run", Integer),
    column("ending", Text),
    column("delay", Float),
    column("error", JSONB),
)


#: The bound parameter of :func:`finish_statement`: the outcomes, as a JSON array.
OUTCOMES_PARAM = "sa_jobs_outcomes"


def outcomes_json(outcomes: Sequence[Outcome]) -> list[dict[str, Any]]:
    return [_outcome_json(outcome) for outcome in outcomes]


def jobs_finish(
    outcomes: Sequence[Outcome], *, sequence: bool = False, job_key: bool = False
) -> ReturningUpdate[int, JobState]:
    """:func:`finish_statement` with ``outcomes`` bound, ready to execute."""
    return _build_finish(sequence=sequence, job_key=job_key, outcomes=outcomes_json(outcomes))


@functools.cache
def finish_statement(
    *, sequence: bool = False, job_key: bool = False
) -> ReturningUpdate[int, JobState]:
    """The statement of :func:`_build_finish`, built once; execute it with
    ``{OUTCOMES_PARAM: [...]}``."""
    return _build_finish(sequence=sequence, job_key=job_key)


def _build_finish(
    *, sequence: bool, job_key: bool, outcomes: list[dict[str, Any]] | None = None
) -> ReturningUpdate[int, JobState]:
    """One ``UPDATE`` that writes every outcome; returns ``(id, new state)`` of rows it
    changed.

    The new state is decided here, with the row in hand: a failure with no attempts left
    is discarded; anything short of completion on a job someone tried to cancel ends
    cancelled. With ``sequence`` (the branch is installed) the jobs' sequence locks are
    taken first; follow with :func:`finish_in` or :func:`~sa_jobs.sequence.advance_sequences`.
    With ``job_key``, a job that completes or is cancelled releases its key.
    """
    source = json_recordset(OUTCOMES_PARAM, _OUTCOME_COLUMNS, "outcome", outcomes)
    ending = source.c.ending
    cancel_requested = Job.metadata_.has_key(CANCEL_ATTEMPTED_KEY)
    # A running job whose job key a new add took never runs again, not even by a snooze
    # or a shutdown that would otherwise give its attempt back.
    replaced = and_(
        Job.metadata_.has_key(JOB_KEY_REPLACED_KEY),
        ending.in_([Ending.SNOOZED.value, Ending.RETURNED.value]),
    )
    next_state = case(
        (ending == Ending.COMPLETED.value, JobState.COMPLETED.value),
        (ending == Ending.CANCELLED.value, JobState.CANCELLED.value),
        (cancel_requested, JobState.CANCELLED.value),
        (replaced, JobState.DISCARDED.value),
        (ending == Ending.SNOOZED.value, JobState.SCHEDULED.value),
        (ending == Ending.RETURNED.value, JobState.AVAILABLE.value),
        (Job.attempt >= Job.max_attempts, JobState.DISCARDED.value),
        else_=JobState.RETRYABLE.value,
    )
    runs_again = [state.value for state in RUNS_AGAIN_STATES]
    gives_attempt_back = and_(
        ending.in_([Ending.SNOOZED.value, Ending.RETURNED.value]), next_state.in_(runs_again)
    )
    sequence_ids = None
    if sequence:
        ids = json_recordset(OUTCOMES_PARAM, [column("id", BigInteger)], "locking", outcomes)
        sequence_ids = select(ids.c.id)
    guards = _run_guards(source, sequence_ids)
    statement = (
        update(Job)
        .where(*guards)
        .values(
            **entering(next_state),
            # Only a job that will run again gets a new time: a cancelled or discarded
            # job keeps the scheduled_at it had.
            scheduled_at=case(
                (
                    and_(source.c.delay.is_not(None), next_state.in_(runs_again)),
                    func.now() + seconds_interval(source.c.delay),
                ),
                else_=Job.scheduled_at,
            ),
            errors=case(
                (
                    source.c.error.is_not(None),
                    Job.errors
                    + func.jsonb_build_array(
                        source.c.error.op("||")(func.jsonb_build_object("at", func.now()))
                    ),
                ),
                else_=Job.errors,
            ),
            # River's snooze: the run did not count against max_attempts.
            attempt=case((gives_attempt_back, Job.attempt - 1), else_=Job.attempt),
            **(_release_job_key(next_state) if job_key else {}),
        )
        .returning(Job.id, Job.state)
    )
    return statement


#: The bound parameters of :func:`completed_statement`: job ids and their runs, as arrays.
COMPLETED_IDS_PARAM = "sa_jobs_completed_ids"
COMPLETED_RUNS_PARAM = "sa_jobs_completed_runs"


@functools.cache
def completed_statement(
    *, sequence: bool = False, job_key: bool = False
) -> ReturningUpdate[int, JobState]:
    """:func:`finish_statement` for a batch whose every outcome is a plain completion,
    the common case by far; execute it with ``{COMPLETED_IDS_PARAM: [ids],
    COMPLETED_RUNS_PARAM: [runs]}``.

    Same guards and same result as :func:`finish_statement`, whose first rule is that a
    completed run completes (whatever else is true of the row): the state becomes
    ``completed``, ``finalized_at`` is set, a job key is released, and ``scheduled_at``,
    ``errors`` and ``attempt`` stay as they are. It takes two arrays instead of a JSON
    document of one object per outcome: no JSON to build in Python, and no rules to
    evaluate per row.
    """
    ids = bindparam(COMPLETED_IDS_PARAM, type_=ARRAY(BigInteger))
    runs = bindparam(COMPLETED_RUNS_PARAM, type_=ARRAY(Integer))
    source = (
        func.unnest(ids, runs)
        .table_valued(column("id", BigInteger), column("run", Integer))
        .render_derived(name="outcome")
    )
    guards = _run_guards(source, select(func.unnest(ids)) if sequence else None)
    # entering(completed), spelled out: COMPLETED is final, so finalized_at is set.
    values: dict[str, Any] = {"state": JobState.COMPLETED, "finalized_at": func.now()}
    if job_key:
        values["job_key"] = null()
    return update(Job).where(*guards).values(values).returning(Job.id, Job.state)


def _run_guards(source: Any, sequence_ids: Select[Any] | None) -> list[ColumnElement[bool]]:
    """The rows a finish statement may touch: the outcome's run of its job, still
    running. With ``sequence_ids`` (the jobs' ids) their sequence locks are taken first."""
    guards: list[ColumnElement[bool]] = [
        Job.id == source.c.id,
        Job.run_count == source.c.run,
        Job.state == JobState.RUNNING,
    ]
    if sequence_ids is not None:
        # Sequence locks before row locks, in the order inserters take them.
        locks = lock_keys_of_jobs(sequence_ids).cte("sequence_locks")
        guards.append(select(func.count()).select_from(locks).scalar_subquery() >= 0)
    return guards


def _release_job_key(next_state: Any) -> dict[str, Any]:
    # Graphile deletes completed jobs, freeing their key; we keep the row and free the key.
    released = [JobState.COMPLETED.value, JobState.CANCELLED.value]
    return {"job_key": case((next_state.in_(released), null()), else_=Job.job_key)}


def _outcome_json(outcome: Outcome) -> dict[str, Any]:
    return {
        "id": outcome.job_id,
        "run": outcome.run,
        "ending": outcome.ending.value,
        "delay": outcome.delay,
        "error": outcome.error,
    }


def _plain_completion(outcome: Outcome) -> bool:
    return outcome.ending is Ending.COMPLETED and outcome.error is None


def finish_in(connection: Connection, outcomes: Sequence[Outcome]) -> list[tuple[int, JobState]]:
    """Write outcomes in the connection's transaction, and move sequences on with them."""
    # In id order: the statement's plan walks the outcomes as given and locks each row as
    # it goes, and a bulk action locks its rows in id order (control.locked_in_id_order).
    # A batch in completion order could hold a later row while waiting for an earlier one
    # the action holds, while the action waits for the later one: a deadlock.
    outcomes = sorted(outcomes, key=lambda outcome: outcome.job_id)
    features = Features.of(connection)
    sequence = features.sequence and any(o.sequenced is not False for o in outcomes)
    if all(_plain_completion(outcome) for outcome in outcomes):
        finish = completed_statement(sequence=sequence, job_key=features.job_key)
        params: dict[str, Any] = {
            COMPLETED_IDS_PARAM: [outcome.job_id for outcome in outcomes],
            COMPLETED_RUNS_PARAM: [outcome.run for outcome in outcomes],
        }
    else:
        finish = finish_statement(sequence=sequence, job_key=features.job_key)
        params = {OUTCOMES_PARAM: outcomes_json(outcomes)}
    rows = connection.execute(finish, params).all()
    changed = [(int(job_id), JobState(state)) for job_id, state in rows]
    if sequence:
        finished = [job_id for job_id, state in changed if state in FINAL_STATES]
        advance_sequences(connection, finished)
    return changed


@either_session
def complete_in(session: Session, job: Job[Any]) -> None:
    """Complete a running job inside ``session``'s transaction.

    The completion commits or rolls back with whatever else the transaction does, so a
    handler's database effects and its job's completion happen exactly once together.
    If the job is in a sequence, the next job of the sequence is made available in the
    same transaction.
    Completing a job that this run already completed is a no-op (the worker's own completion
    after this one does nothing either).

    Raises:
        JobStateError: the job is not running this run any more (it timed out, was
            rescued and rerun, cancelled, ...): roll back, the work belongs to another run.
        JobNotFoundError: no such job.
    """
    connection = session.connection()
    changed = finish_in(connection, [Outcome.completed(job)])
    if changed:
        _mark_completed(job)
        return
    current = connection.execute(
        select(Job.state, Job.run_count).where(Job.id == job.id)
    ).one_or_none()
    if current is None:
        raise JobNotFoundError(job.id)
    state, run = current
    if state is JobState.COMPLETED and run == job.run_count:
        return
    if state is JobState.RUNNING:
        raise JobStateError(
            job.id,
            f"running its run {run}, not run {job.run_count}",
            "complete",
            [f"running run {job.run_count}"],
        )
    raise JobStateError(job.id, state.value, "complete", [JobState.RUNNING.value])


def _mark_completed(job: Job[Any]) -> None:
    # Reflect the new state on the object without a reload and without marking it dirty.
    set_committed_value(job, "state", JobState.COMPLETED)
