"""Sequences: one job at a time per sequence key, in id order, halting on failure.

Every sequence has one *slot* (``sequence_slot``). The job holding it is the sequence's
active job — or, when the sequence is halted, the cancelled or discarded job that halted
it. The other jobs of the sequence wait as ``pending``. The database guarantees the rest:
a unique index admits one slot holder per key, and a CHECK makes every active
(available, running, retryable, scheduled) sequence job a slot holder.

Who decides what, without races:

* **Inserting** takes a transaction-level advisory lock per key (sorted, so batches do
  not deadlock), then inserts with a fresh snapshot: a job takes the slot when nobody
  holds it and nobody waits before it, otherwise it waits. Inserters of one sequence are
  therefore serialised until they commit — which is what keeps ids in start order.
* **Finishing** the slot holder (completer, ``complete_in``, rescuer, cancellation)
  passes the slot, in the same transaction and under the same lock, to the lowest
  pending id: a completed job always does, a cancelled or discarded one only with its
  ``continue_on_*`` flag — otherwise it keeps the slot and the sequence halts.
* **Retrying** the halted job resumes the sequence from it (it still holds the slot);
  retrying a later job moves the slot to it, skipping the halted one.
* A **maintenance pass** (:mod:`sa_jobs.worker.maintenance.sequence_repair`) gives the
  slot to the lowest pending job of any sequence that has waiting jobs and no holder
  (after a crash, a rolled-back inserter, or a manual change) — a repair, not the normal
  path.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import (
    BigInteger,
    Connection,
    Integer,
    LargeBinary,
    Select,
    Text,
    and_,
    bindparam,
    case,
    exists,
    func,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.sql.expression import ColumnElement, FromClause

from sa_jobs._base.states import FINAL_STATES, JobState
from sa_jobs._declare.args import JobKind
from sa_jobs._declare.options import ResolvedInsert
from sa_jobs._declare.unique_sequence_keys import canonical_args, canonical_bytes, key_digest
from sa_jobs._table.models import Job, entering, job_table, state_is
from sa_jobs._table.schema import INSERT_CHANNEL

__all__ = [
    "advance_sequences",
    "halts_sequence",
    "ids_param",
    "lock_keys",
    "lock_keys_in",
    "lock_keys_of_jobs",
    "lock_sequences_of_jobs",
    "passes_slot_on",
    "promote_after_delete",
    "promote_next",
    "retry_values",
    "sequence_values",
    "waits_in_sequence",
]

#: The first argument of ``pg_advisory_xact_lock(int4, int4)`` for sequence locks, so they
#: cannot collide with an application's own single-argument advisory locks.
LOCK_CLASS = 0x5A_5E_0001


# --------------------------------------------------------------------------- keys


def sequence_values(kind: JobKind, args_json: Any, resolved: ResolvedInsert) -> dict[str, Any]:
    """The ``sequence_*`` fields of one row (empty when the job is not sequenced)."""
    opts = resolved.sequence
    if opts is None:
        return {}
    canonical = canonical_bytes(
        "sequence",
        kind=None if opts.exclude_kind else kind.name,
        args=canonical_args(kind.args_class, args_json, "sequence") if opts.by_args else None,
        queue=resolved.queue if opts.by_queue else None,
    )
    return {
        "sequence_key": "\\x" + key_digest(canonical).hex(),
        "sequence_continue_on_cancelled": opts.continue_on_cancelled,
        "sequence_continue_on_discarded": opts.continue_on_discarded,
    }


# --------------------------------------------------------------------------- locks
#
# Every path that inserts or finishes sequenced jobs takes the advisory locks of their
# sequences first, all in one global order (smallest lock number first), so none can
# deadlock with another. A lock is ``pg_advisory_xact_lock(LOCK_CLASS, n)`` where ``n`` is
# the key's first byte: the locks are striped over 256 numbers, so a transaction that
# touches thousands of sequences holds at most 256 locks (PostgreSQL's lock table is
# small: ``max_locks_per_transaction`` times the connections), at the price of sequences
# sharing a stripe waiting for each other while they insert or finish.


def lock_number(hex_key: str) -> int:
    """The lock number of a key (``\\x``-prefixed hex): its first byte."""
    return bytes.fromhex(hex_key[2:4])[0]


def _lock_number_sql(key: Any) -> ColumnElement[int]:
    # The same number, computed in SQL from a bytea key.
    return func.get_byte(key, 0)


def _take_locks(numbers: Select[Any]) -> Select[Any]:
    """Lock each distinct number ``numbers`` selects (column ``n``), smallest first."""
    distinct = numbers.distinct().subquery("lock_numbers")
    ordered = select(distinct.c.n).order_by(distinct.c.n).subquery("ordered_lock_numbers")
    return select(func.count(func.pg_advisory_xact_lock(LOCK_CLASS, ordered.c.n)))


def lock_keys(hex_keys: Iterable[str]) -> Select[Any]:
    """A statement that locks these keys' sequences (keys known in Python)."""
    numbers = sorted({lock_number(key) for key in hex_keys})
    return _lock_numbers().params({_LOCK_NUMBERS: numbers})


_LOCK_NUMBERS = "sa_jobs_sequence_locks"


@functools.cache
def _lock_numbers() -> Select[Any]:
    numbers = func.unnest(bindparam(_LOCK_NUMBERS, type_=ARRAY(Integer)))
    number = numbers.table_valued("n").render_derived(name="lock_numbers")
    return select(func.count(func.pg_advisory_xact_lock(LOCK_CLASS, number.c.n)))


def lock_keys_in(key: ColumnElement[Any]) -> Select[Any]:
    """Locks the sequences of the keys in ``key``, a column of the rows being inserted."""
    return _take_locks(select(_lock_number_sql(key).label("n")).where(key.is_not(None)))


def lock_keys_of_jobs(ids: Select[Any]) -> Select[Any]:
    """Locks the sequences of the existing jobs whose ids ``ids`` selects (use it as a
    statement, or as a CTE that an UPDATE references so that it runs first)."""
    numbers = select(_lock_number_sql(Job.sequence_key).label("n")).where(
        Job.id.in_(ids), Job.sequence_key.is_not(None)
    )
    return _take_locks(numbers)


def lock_sequences_of_jobs(connection: Connection, job_ids: Sequence[int]) -> None:
    """Take the sequence locks of existing jobs (before changing them)."""
    connection.execute(lock_keys_of_jobs(ids_param(job_ids)))


def ids_param(job_ids: Sequence[int]) -> Select[Any]:
    """``SELECT unnest(:ids)``: job ids known in Python, as one bound array."""
    # Job ids are bigint: an int[] parameter would overflow past 2**31 - 1.
    return select(func.unnest(bindparam("sa_jobs_job_ids", list(job_ids), type_=ARRAY(BigInteger))))


# --------------------------------------------------------------------------- inserting


def waits_in_sequence(
    key: Any, ord_: Any, inserted: ColumnElement[bool] | None = None
) -> ColumnElement[bool]:
    """For a row being inserted: must it wait (``pending``) rather than take the slot?

    It waits if an earlier row of the same batch is in its sequence, or if the sequence
    has a slot holder or waiting jobs. Sound only under the keys' advisory locks.
    ``inserted`` tells rows that will really be written from unique duplicates that
    will not; only the former count as earlier rows.
    """
    holder = job_table.alias("holder")
    waiting = job_table.alias("waiting")
    if inserted is None:
        earlier_in_batch = func.row_number().over(partition_by=key, order_by=ord_) > 1
    else:
        earlier = func.count().filter(inserted)
        window = earlier.over(partition_by=key, order_by=ord_, rows=(None, -1))
        earlier_in_batch = func.coalesce(window, 0) > 0
    slot_taken = exists().where(
        holder.c.sequence_key == key, holder.c.sequence_key.is_not(None), holder.c.sequence_slot
    )
    others_waiting = exists().where(
        waiting.c.sequence_key == key,
        waiting.c.sequence_key.is_not(None),
        state_is(waiting.c.state, JobState.PENDING),
    )
    return and_(key.is_not(None), or_(earlier_in_batch, slot_taken, others_waiting))


# --------------------------------------------------------------------------- advancing


def passes_slot_on() -> ColumnElement[bool]:
    """A finished slot holder that lets its sequence go on (the others halt it)."""
    return or_(
        state_is(Job.state, JobState.COMPLETED),
        and_(state_is(Job.state, JobState.CANCELLED), Job.sequence_continue_on_cancelled),
        and_(state_is(Job.state, JobState.DISCARDED), Job.sequence_continue_on_discarded),
    )


def halts_sequence(jobs: FromClause) -> ColumnElement[bool]:
    """True for rows of ``jobs`` that halt their sequence: a slot holder that finished
    (only a halting cancel or discard keeps the slot). Read through the slot index."""
    return and_(
        jobs.c.sequence_key.is_not(None),
        jobs.c.sequence_slot,
        state_is(jobs.c.state, *sorted(FINAL_STATES)),
    )


def promote_next(released: Any) -> Select[int, Any]:
    """Give each released sequence's slot to its lowest pending job; notify queues."""
    pending = job_table.alias("next_pending")
    next_id = (
        select(pending.c.id)
        .where(
            pending.c.sequence_key == released.c.sequence_key,
            pending.c.sequence_key.is_not(None),
            state_is(pending.c.state, JobState.PENDING),
        )
        .order_by(pending.c.id)
        .limit(1)
        .correlate(released)
        .scalar_subquery()
    )
    promoted = (
        update(Job)
        .where(Job.id.in_(select(next_id).select_from(released)))
        .values(
            # clock_timestamp, not now(): now() is when this transaction began, and a job
            # inserted since then would wrongly look scheduled (and wait for a pass).
            **entering(
                case(
                    (Job.scheduled_at > func.clock_timestamp(), JobState.SCHEDULED.value),
                    else_=JobState.AVAILABLE.value,
                )
            ),
            sequence_slot=True,
        )
        .returning(Job.queue, Job.state)
        .cte("promoted_in_sequence")
    )
    return select(
        func.count(),
        func.max(
            case(
                (
                    state_is(promoted.c.state, JobState.AVAILABLE),
                    func.pg_notify(INSERT_CHANNEL, promoted.c.queue).cast(Text),
                ),
            )
        ),
    ).select_from(promoted)


def jobs_advance_sequences(job_ids: Sequence[int]) -> Select[int, Any]:
    """Release the slots of these jobs where they finished without halting, and promote."""
    ids = ids_param(job_ids)
    released = (
        update(Job)
        .where(Job.id.in_(ids), Job.sequence_slot, passes_slot_on())
        .values(sequence_slot=False)
        .returning(Job.sequence_key)
        .cte("released_slots")
    )
    return promote_next(released)


def advance_sequences(connection: Connection, job_ids: Sequence[int]) -> int:
    """After jobs finished in this transaction: pass their sequences on. Returns promotions.

    Takes the sequences' advisory locks first, so an inserter that saw the holder
    still active has committed its waiting job before we look for the next one.
    """
    if not job_ids:
        return 0
    lock_sequences_of_jobs(connection, job_ids)
    promoted, _ = connection.execute(jobs_advance_sequences(job_ids)).one()
    return int(promoted)


def promote_after_delete(connection: Connection, keys: Sequence[bytes]) -> int:
    """Slot holders of these sequences were deleted (under their locks, in this
    transaction): give each slot to its lowest pending job. Returns promotions.

    A deleted job, halted or active, no longer holds its sequence back.
    """
    if not keys:
        return 0
    each = func.unnest(bindparam("sa_jobs_released_keys", list(keys), type_=ARRAY(LargeBinary)))
    released = each.table_valued("sequence_key").render_derived(name="released_slots")
    promoted, _ = connection.execute(promote_next(released)).one()
    return int(promoted)


# --------------------------------------------------------------------------- retrying


def retry_values(connection: Connection, job_id: int) -> dict[str, Any]:
    """What a manual retry of this job must also set to respect its sequence.

    The job holding the slot (the halted one) keeps it: the sequence resumes from it.
    Another job takes the slot if nobody active holds it — moving it off a halted job,
    which skips that job — and otherwise waits its turn as ``pending``.
    """
    row = connection.execute(
        select(Job.sequence_key, Job.sequence_slot).where(Job.id == job_id)
    ).one_or_none()
    if row is None or row.sequence_key is None or row.sequence_slot:
        return {}
    hex_key = "\\x" + bytes(row.sequence_key).hex()
    connection.execute(lock_keys([hex_key]))
    holder = connection.execute(
        select(Job.id, Job.state).where(
            Job.sequence_key == row.sequence_key, Job.sequence_key.is_not(None), Job.sequence_slot
        )
    ).one_or_none()
    if holder is not None and holder.state in FINAL_STATES:
        connection.execute(update(Job).where(Job.id == holder.id).values(sequence_slot=False))
        holder = None
    if holder is None:
        return {"sequence_slot": True}
    return entering(JobState.PENDING)
