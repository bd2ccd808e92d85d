"""Finishing a run of a job: the one statement every completion path shares.

A run is identified by ``(id, run_count)``: the fetch increments ``run_count``, and
nothing lowers it. :func:`finish_statement` only touches rows that are still ``running``
*with that run count*, so a late result from a run that timed out, was rescued, or was
completed by :func:`complete_in` never overwrites anything. ``attempt`` is River's: the
fetch increments it too, and a snooze or a shutdown gives it back (``max_attempts``
never changes).

The batched completer sends many outcomes in one statement (:func:`finish_in`);
:func:`complete_in` sends one, inside the caller's transaction.

A completion may carry the job's recorded output (the handler's return value, already
encoded by :mod:`sa_jobs._declare.output`): it is written by the same statement. Batches
without outputs use the statements they always did; only a batch holding an output uses
the variant with an ``output`` column (:func:`finish_statement` with ``output=True``).
"""

from __future__ import annotations

import functools
import logging
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
    any_,
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

from sa_jobs._act.workflow_release import (
    STEP_IDS_PARAM,
    after_finished,
    completed_steps_statement,
)
from sa_jobs._base.records import Ending, Outcome
from sa_jobs._base.sessions import either_session
from sa_jobs._base.sql import constant, id_array, json_recordset, seconds_interval
from sa_jobs._base.states import (
    CANCEL_ATTEMPTED_KEY,
    FINAL_STATES,
    JOB_KEY_REPLACED_KEY,
    RUNS_AGAIN_STATES,
    JobState,
)
from sa_jobs._declare.output import encode_output
from sa_jobs._insert.sequence import advance_sequences, lock_keys_of_jobs
from sa_jobs._table.models import Job, entering, state_is
from sa_jobs._table.schema import OUTPUT_BRANCH, Features
from sa_jobs.errors import JobNotFoundError, JobStateError, SchemaMissingError

__all__ = [
    "complete_in",
    "finish_in",
    "finish_steps_in",
    "one_statement_for_steps",
    "record_output_in",
]

log = logging.getLogger("sa_jobs.worker")


_OUTCOME_COLUMNS = (
    column("id", BigInteger),
    column("run", Integer),
    column("ending", Text),
    column("delay", Float),
    column("error", JSONB),
)
#: With :data:`_OUTCOME_COLUMNS`, in a batch that carries outputs.
_OUTPUT_COLUMN = column("output", JSONB)


#: The bound parameter of :func:`finish_statement`: the outcomes, as a JSON array.
OUTCOMES_PARAM = "sa_jobs_outcomes"


def outcomes_json(outcomes: Sequence[Outcome]) -> list[dict[str, Any]]:
    return [_outcome_json(outcome) for outcome in outcomes]


@functools.cache
def finish_statement(
    *, sequence: bool = False, job_key: bool = False, output: bool = False, workflow: bool = False
) -> ReturningUpdate[Any]:
    """The statement of :func:`_build_finish`, built once; execute it with
    ``{OUTCOMES_PARAM: [...]}``. With ``workflow`` it also returns ``workflow_id``."""
    return _build_finish(sequence=sequence, job_key=job_key, output=output, workflow=workflow)


def _build_finish(
    *,
    sequence: bool,
    job_key: bool,
    output: bool = False,
    workflow: bool = False,
) -> ReturningUpdate[Any]:
    """One ``UPDATE`` that writes every outcome; returns ``(id, new state)`` of rows it
    changed.

    The new state is decided here, with the row in hand: a failure with no attempts left
    is discarded; anything short of completion on a job someone tried to cancel ends
    cancelled. With ``sequence`` (the branch is installed) the jobs' sequence locks are
    taken first; follow with :func:`finish_in` or
    :func:`~sa_jobs._insert.sequence.advance_sequences`.
    With ``job_key``, a job that completes or is cancelled releases its key. With
    ``output`` (the batch carries outputs), an outcome's ``output`` replaces the job's.
    """
    columns = (*_OUTCOME_COLUMNS, _OUTPUT_COLUMN) if output else _OUTCOME_COLUMNS
    source = json_recordset(OUTCOMES_PARAM, columns, "outcome")
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
        (ending == Ending.DISCARDED.value, JobState.DISCARDED.value),
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
        ids = json_recordset(OUTCOMES_PARAM, [column("id", BigInteger)], "locking")
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
            # Only completions carry an output; one without keeps what was recorded.
            **({"output_json": func.coalesce(source.c.output, Job.output_json)} if output else {}),
        )
        .returning(*_returned(workflow))
    )
    return statement


def _returned(workflow: bool) -> tuple[Any, ...]:
    # A step's workflow_id tells finish_in to hand it to the workflow module; for other
    # jobs it is one NULL more in the result, the only cost they pay.
    return (Job.id, Job.state, Job.workflow_id) if workflow else (Job.id, Job.state)


#: The bound parameters of :func:`completed_statement`: job ids and their runs, as arrays.
COMPLETED_IDS_PARAM = "sa_jobs_completed_ids"
COMPLETED_RUNS_PARAM = "sa_jobs_completed_runs"


@functools.cache
def completed_statement(
    *, sequence: bool = False, job_key: bool = False, workflow: bool = False
) -> ReturningUpdate[Any]:
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
    values: dict[str, Any] = entering(JobState.COMPLETED)
    if job_key:
        values["job_key"] = null()
    return update(Job).where(*guards).values(values).returning(*_returned(workflow))


def _run_guards(source: Any, sequence_ids: Select[Any] | None) -> list[ColumnElement[bool]]:
    """The rows a finish statement may touch: the outcome's run of its job, still
    running. With ``sequence_ids`` (the jobs' ids) their sequence locks are taken first."""
    guards: list[ColumnElement[bool]] = [
        Job.id == source.c.id,
        Job.run_count == source.c.run,
        # Compared as text on purpose, so that no partial index on ``state = 'running'``
        # can serve the statement: with statistics from an ANALYZE taken while about
        # no job ran, the planner otherwise reads sa_job_running_idx — every running
        # row, for each batch — instead of one primary-key probe per outcome (500 jobs
        # running, a batch of 10: 3.6 ms against 0.8 ms; bench/big_tables.py saw it).
        Job.state.cast(Text) == constant(JobState.RUNNING.value),
        # And the ids as an array: sa_job is read by its primary key whatever join the
        # planner picks (a hash join on the outcomes alone would read the whole table).
        Job.id == any_(id_array(select(func.array_agg(source.c.id)))),
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
    data = {
        "id": outcome.job_id,
        "run": outcome.run,
        "ending": outcome.ending.value,
        "delay": outcome.delay,
        "error": outcome.error,
    }
    if outcome.output is not None:
        data["output"] = outcome.output
    return data


def _plain_completion(outcome: Outcome) -> bool:
    return outcome.ending is Ending.COMPLETED and outcome.error is None and outcome.output is None


#: Kinds whose output was dropped for want of the output branch (warned about once).
_warned_unstored: set[str] = set()


def _without_outputs(outcomes: Sequence[Outcome]) -> list[Outcome]:
    """The outcomes with their outputs dropped: the database has no ``sa_jobs_output``
    branch. A worker refuses to start with a kind that declares ``output=`` there, so
    these are untyped return values a handler written before outputs existed may give."""
    kept = []
    for outcome in outcomes:
        if outcome.output is not None:
            kind = outcome.job.kind if outcome.job is not None else str(outcome.job_id)
            if kind not in _warned_unstored:
                _warned_unstored.add(kind)
                log.warning(
                    "the handler of kind %r returned a value, which is not stored: the "
                    "sa_jobs %r migration branch is not installed (run `sa-jobs migrate`)",
                    kind,
                    OUTPUT_BRANCH,
                )
            outcome = attrs.evolve(outcome, output=None)
        kept.append(outcome)
    return kept


def finish_in(
    connection: Connection, outcomes: Sequence[Outcome], *, one_statement: bool = True
) -> list[tuple[int, JobState]]:
    """Write outcomes in the connection's transaction, and move sequences on with them.

    ``one_statement=False``: not :func:`finish_steps_in` first, even for a batch it
    would take (the writer's second try at what that statement did not write)."""
    # In id order: the statement's plan walks the outcomes as given and locks each row as
    # it goes, and a bulk action locks its rows in id order (control.locked_in_id_order).
    # A batch in completion order could hold a later row while waiting for an earlier one
    # the action holds, while the action waits for the later one: a deadlock.
    outcomes = sorted(outcomes, key=lambda outcome: outcome.job_id)
    features = Features.of(connection)
    sequence = features.sequence and any(o.sequenced is not False for o in outcomes)
    workflow = features.workflow
    if one_statement and workflow and not sequence and one_statement_for_steps(outcomes):
        changed, missed = finish_steps_in(connection, outcomes, features)
        if missed:  # in the caller's transaction: the statements below see them right
            changed += _finish_in_statements(connection, missed, features, sequence)
        return changed
    return _finish_in_statements(connection, outcomes, features, sequence)


def _finish_in_statements(
    connection: Connection, outcomes: Sequence[Outcome], features: Features, sequence: bool
) -> list[tuple[int, JobState]]:
    """:func:`finish_in` as a finish statement followed by the sequences' and workflows'
    (in the connection's transaction)."""
    workflow = features.workflow
    plain, output, outcomes, params = _finish_params(outcomes, features)
    if plain:
        finish = completed_statement(sequence=sequence, job_key=features.job_key, workflow=workflow)
    else:
        finish = finish_statement(
            sequence=sequence, job_key=features.job_key, output=output, workflow=workflow
        )
    rows = connection.execute(finish, params).all()
    changed = [(int(row[0]), JobState(row[1])) for row in rows]
    if sequence:
        finished = [job_id for job_id, state in changed if state in FINAL_STATES]
        advance_sequences(connection, finished)
    if workflow:
        steps = [(row[0], row[1], row[2]) for row in rows if row[2] is not None]
        if steps:
            after_finished(connection, [s for s in steps if s[1] in FINAL_STATES])
    return changed


def _finish_params(
    outcomes: Sequence[Outcome], features: Features
) -> tuple[bool, bool, Sequence[Outcome], dict[str, Any]]:
    """Which finishing statement a batch takes, and its parameters: ``(plain, output,
    outcomes, params)``. Plain completions (no error, no output) go as two arrays;
    anything else as a JSON recordset of outcomes, outputs dropped (with a warning) on a
    database without the output branch."""
    if all(_plain_completion(outcome) for outcome in outcomes):
        params: dict[str, Any] = {
            COMPLETED_IDS_PARAM: [outcome.job_id for outcome in outcomes],
            COMPLETED_RUNS_PARAM: [outcome.run for outcome in outcomes],
        }
        return True, False, outcomes, params
    output = any(outcome.output is not None for outcome in outcomes)
    if output and not features.output:
        outcomes, output = _without_outputs(outcomes), False
    return False, output, outcomes, {OUTCOMES_PARAM: outcomes_json(outcomes)}


def one_statement_for_steps(outcomes: Sequence[Outcome]) -> bool:
    """Whether a batch that may hold workflow steps is finished, released and counted by
    one statement (:func:`completed_steps_statement`): when every outcome is a completion.
    A completed run always completes, so no step fails and nothing cascades; any other
    ending may fail a step, and the cascade takes :func:`after_finished`'s statements."""
    return any(o.in_workflow is not False for o in outcomes) and all(
        o.ending is Ending.COMPLETED for o in outcomes
    )


@functools.cache
def _steps_statement(*, job_key: bool, output: bool, plain: bool) -> Select[Any]:
    finish = (
        completed_statement(job_key=job_key, workflow=True)
        if plain
        else finish_statement(job_key=job_key, output=output, workflow=True)
    )
    return completed_steps_statement(finish)


def finish_steps_in(
    connection: Connection, outcomes: Sequence[Outcome], features: Features | None = None
) -> tuple[list[tuple[int, JobState]], list[Outcome]]:
    """Completions of (maybe) workflow steps (:func:`one_statement_for_steps`), and all
    they release, in one statement; in autocommit mode it is its own transaction.

    Returns the rows it changed and the outcomes it did not write: stale runs, and steps
    updated since the statement's snapshot (see
    :func:`~sa_jobs._act.workflow_release.completed_steps_statement`), which the caller
    writes again with :func:`finish_in` in a transaction (stale runs then change nothing).
    """
    outcomes = sorted(outcomes, key=lambda outcome: outcome.job_id)
    if features is None:
        features = Features.of(connection)
    plain, output, outcomes, params = _finish_params(outcomes, features)
    statement = _steps_statement(job_key=features.job_key, output=output, plain=plain)
    params[STEP_IDS_PARAM] = [outcome.job_id for outcome in outcomes]
    rows = connection.execute(statement, params).all()
    changed = [(int(job_id), JobState(state)) for job_id, state in rows]
    written = {job_id for job_id, _ in changed}
    return changed, [outcome for outcome in outcomes if outcome.job_id not in written]


@either_session
def complete_in(session: Session, job: Job[Any], *, output: Any = None) -> None:
    """Complete a running job inside ``session``'s transaction.

    The completion commits or rolls back with whatever else the transaction does, so a
    handler's database effects and its job's completion happen exactly once together.
    If the job is in a sequence, the next job of the sequence is made available in the
    same transaction.
    Completing a job that this run already completed is a no-op (the worker's own completion
    after this one does nothing either).

    Args:
        output: The job's output, stored by the completing statement (converted by its
            kind's ``output=`` type; see docs/results.md). None: no output (one recorded
            earlier in the run stays).

    Raises:
        JobStateError: the job is not running this run any more (it timed out, was
            rescued and rerun, cancelled, ...): roll back, the work belongs to another run.
        JobNotFoundError: no such job.
        InvalidOutputError: ``output`` cannot be stored; nothing was written.
        SchemaMissingError: an ``output`` without the ``sa_jobs_output`` branch.
    """
    data = encode_output(job.job_kind, output) if output is not None else None
    complete_encoded(session, job, data)


def complete_encoded(session: Session, job: Job[Any], data: Any) -> None:
    """:func:`complete_in` with the output already encoded (the worker encodes it with
    its own cap); None for no output."""
    connection = session.connection()
    if data is not None and not Features.of(connection).output:
        raise SchemaMissingError(OUTPUT_BRANCH, "a job's output is stored there")
    changed = finish_in(connection, [Outcome.of(job, Ending.COMPLETED, output=data)])
    if changed:
        _mark_completed(job)
        if data is not None:
            set_committed_value(job, "output_json", data)
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


def record_output_in(connection: Connection, job: Job[Any], data: Any) -> bool:
    """Store ``data`` as the output of the current run of ``job`` (``job.record_output``);
    False when that run is over (nothing written).

    Raises:
        SchemaMissingError: the ``sa_jobs_output`` branch is not installed.
    """
    if not Features.of(connection).output:
        raise SchemaMissingError(OUTPUT_BRANCH, "job.record_output() stores the output there")
    written = connection.execute(
        update(Job)
        .where(
            Job.id == job.id,
            Job.run_count == job.run_count,
            state_is(Job.state, JobState.RUNNING),
        )
        .values(output_json=data)
        .returning(Job.id)
    ).first()
    return written is not None
