"""Job keys (Graphile Worker): replace, preserve_run_at and unsafe_dedupe — without its race.

At most one job holds a key (``sa_job_job_key_idx``). Adding a job with a key follows
Graphile's algorithm:

* no job holds the key → a new job;
* ``unsafe_dedupe`` → the existing job, untouched, whatever its state;
* the holder is running (Graphile: *locked*) → it loses the key and its remaining
  attempts (it finishes, but never runs again), and a new job is created;
* the holder failed for good (``discarded``: Graphile's attempts ≥ max_attempts, which
  its SQL treats like a locked job) → it loses the key, keeping its attempts and errors
  as a record, and a new job is created;
* otherwise it is updated in place and takes every new value, its ``revision`` goes up
  by one, and its retry state is reset as Graphile resets it: ``attempt`` back to 0,
  ``errors`` cleared, ``max_attempts`` as given. Under ``preserve_run_at`` it keeps its
  ``scheduled_at`` — unless it has failed before (``attempt > 0``), which always takes
  the new one.

When both the stored and the new args are JSON arrays they are concatenated instead of
replaced. A job's key is released when it completes or is cancelled (Graphile deletes
such jobs).

**The race Graphile documents (issue #580).** Each round is one statement: a CTE
first takes the key from a *running* holder, then ``INSERT ... ON CONFLICT (job_key) DO
UPDATE ... WHERE state <> 'running'`` replaces an unlocked holder. If a worker starts the
holder after the statement's snapshot, the ``DO UPDATE`` waits for it and then declines
(the row is running now), and the row comes back with nothing. Graphile returns null to
its caller there; we run another round for exactly those rows, whose CTE now sees the
running holder and detaches it. Every add therefore ends inserted, replaced or
deduplicated — never lost.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from sqlalchemy import and_, case, delete, func, literal_column, null, select, text, update
from sqlalchemy.dialects.postgresql import Insert as PgInsert
from sqlalchemy.orm import Session
from sqlalchemy.sql.dml import ReturningInsert
from sqlalchemy.sql.selectable import CTE

from sa_jobs._base.records import JobRow
from sa_jobs._base.sessions import either_session
from sa_jobs._base.states import JOB_KEY_REPLACED_KEY, JobState
from sa_jobs._declare.options import JobKeyMode, check_job_key
from sa_jobs._table.feature_indexes import job_key_index
from sa_jobs._table.models import CORE_COLUMNS, EXISTED_COLUMN, Job, entering, job_table, state_is
from sa_jobs._table.schema import translate_missing_schema
from sa_jobs.errors import SaJobsError

__all__ = [
    "JobKeyMode",
    "detach_unavailable_holders",
    "insert_keyed",
    "keyed_upsert",
    "remove_job",
    "rounds",
]

R = TypeVar("R")

#: Rounds a contended add may take before we give up loudly (never seen in practice).
MAX_ROUNDS = 1000


def rounds(rows: Sequence[JobRow]) -> list[list[int]]:
    """Split row positions so no key appears twice in a round (the k-th use of each key
    goes in round k), which applies repeats in order, exactly as separate adds would."""
    seen: dict[str, int] = {}
    result: list[list[int]] = []
    for position, row in enumerate(rows):
        occurrence = seen.get(row["job_key"], 0)
        seen[row["job_key"]] = occurrence + 1
        if occurrence == len(result):
            result.append([])
        result[occurrence].append(position)
    return result


def detach_unavailable_holders(source: Any) -> CTE:
    """Take the keys of this round from holders a new add cannot update in place.

    A running holder finishes, but never runs again: it loses its remaining attempts
    (``max_attempts = attempt``), and its metadata records when, so a snooze or a
    shutdown cannot bring it back either. A discarded holder only loses the key.
    """
    running = state_is(Job.state, JobState.RUNNING)
    detached = _detached_values()
    return (
        update(Job)
        .where(
            Job.job_key.in_(select(source.c.job_key)),
            Job.job_key.is_not(None),
            state_is(Job.state, JobState.RUNNING, JobState.DISCARDED),
        )
        .values(
            job_key=null(),
            max_attempts=case((running, detached["max_attempts"]), else_=Job.max_attempts),
            metadata_=case((running, detached["metadata_"]), else_=Job.metadata_),
        )
        .returning(Job.id)
        .cte("detached_holders")
    )


def _detached_values() -> dict[str, Any]:
    return {
        "job_key": null(),
        "max_attempts": Job.attempt,
        "metadata_": Job.metadata_.op("||")(
            func.jsonb_build_object(JOB_KEY_REPLACED_KEY, func.now())
        ),
    }


def keyed_upsert(
    statement: PgInsert, mode: JobKeyMode, *, partitioned: bool = False
) -> ReturningInsert[Any]:
    """The ``ON CONFLICT (job_key)`` clause of a keyed add; returns the job columns, the
    key, and whether an existing job was replaced or returned. ``partitioned``: the rows
    carry partition keys, which a replacement takes with its args."""
    excluded = statement.excluded
    columns = job_table.c
    if mode is JobKeyMode.UNSAFE_DEDUPE:
        # A no-op update, so the existing job comes back from RETURNING untouched.
        upsert = statement.on_conflict_do_update(
            constraint=job_key_index, set_={columns.kind: columns.kind}
        )
    else:
        failed_before = columns.attempt > 0
        scheduled_at: Any = excluded.scheduled_at
        if mode is JobKeyMode.PRESERVE_RUN_AT:
            scheduled_at = case((failed_before, excluded.scheduled_at), else_=columns.scheduled_at)
        both_arrays = and_(
            func.jsonb_typeof(columns.args) == "array",
            func.jsonb_typeof(excluded.args) == "array",
        )
        replaced: dict[Any, Any] = (
            {columns.partition_key: excluded.partition_key} if partitioned else {}
        )
        upsert = statement.on_conflict_do_update(
            constraint=job_key_index,
            set_={
                **replaced,
                columns.kind: excluded.kind,
                columns.args: case(
                    (both_arrays, columns.args.op("||")(excluded.args)), else_=excluded.args
                ),
                columns.queue: excluded.queue,
                columns.priority: excluded.priority,
                # Graphile always resets the retry state. Runs are fenced by run_count,
                # which this leaves alone, so a late result of an old run still cannot
                # complete the updated job.
                columns.attempt: 0,
                columns.errors: text("'[]'::jsonb"),
                columns.max_attempts: excluded.max_attempts,
                columns.revision: columns.revision + 1,
                columns.tags: excluded.tags,
                columns.metadata: excluded["metadata"],
                columns.scheduled_at: scheduled_at,
                **entering(
                    case(
                        (scheduled_at > func.now(), JobState.SCHEDULED.value),
                        else_=JobState.AVAILABLE.value,
                    )
                ),
            },
            # A holder that a worker started after our snapshot: decline; next round.
            where=columns.state != JobState.RUNNING,
        )
    existed: Any = literal_column("xmax <> 0").label(EXISTED_COLUMN)
    returning: ReturningInsert[Any] = upsert.returning(
        *CORE_COLUMNS, columns.job_key, columns.revision, existed
    )
    return returning


class JobKeyContentionError(SaJobsError):
    """An add kept losing its job key to workers starting it (not expected in practice)."""


def insert_keyed(
    rows: Sequence[JobRow],
    mode: JobKeyMode,
    run_round: Callable[[Sequence[JobRow], JobKeyMode], list[R]],
    key_of: Callable[[R], str],
) -> list[R]:
    """Apply keyed adds round by round until every row has a result; results in order.

    ``run_round`` executes one round's statement and returns its rows; ``key_of`` reads
    the job key from such a row.
    """
    results: list[R | None] = [None] * len(rows)
    for positions in rounds(rows):
        waiting = list(positions)
        for _ in range(MAX_ROUNDS):
            returned = {key_of(row): row for row in run_round([rows[p] for p in waiting], mode)}
            for position in waiting:
                found = returned.get(rows[position]["job_key"])
                if found is not None:
                    results[position] = found
            waiting = [p for p in waiting if results[p] is None]
            if not waiting:
                break
        else:
            raise JobKeyContentionError(
                f"job keys {[rows[p]['job_key'] for p in waiting]} were taken by starting "
                f"workers {MAX_ROUNDS} times in a row; retry the transaction"
            )
    return [result for result in results if result is not None]


class RemoveOutcome(enum.StrEnum):
    """What :func:`remove_job` did."""

    #: The job was not running: it is gone.
    REMOVED = "removed"
    #: The job is running: it keeps running but lost its key and will not run again.
    WILL_NOT_RUN_AGAIN = "will_not_run_again"
    #: No job holds the key (a completed job's key is already released).
    NOT_FOUND = "not_found"


@either_session
def remove_job(session: Session, job_key: str) -> RemoveOutcome:
    """Remove the job holding ``job_key``, in the session's transaction (Graphile's
    ``remove_job``).

    The holder is locked first (``FOR UPDATE``, which sees its latest state), so a worker
    cannot start it halfway through: a job that is not running is deleted; a running one
    loses its key and its remaining attempts — it finishes but never runs again.
    """
    check_job_key(job_key)
    with translate_missing_schema():
        holder = session.execute(
            select(Job.id, Job.state)
            .where(Job.job_key == job_key, Job.job_key.is_not(None))
            .with_for_update()
        ).one_or_none()
    if holder is None:
        return RemoveOutcome.NOT_FOUND
    if holder.state is JobState.RUNNING:
        session.execute(update(Job).where(Job.id == holder.id).values(_detached_values()))
        return RemoveOutcome.WILL_NOT_RUN_AGAIN
    session.execute(delete(Job).where(Job.id == holder.id))
    return RemoveOutcome.REMOVED
