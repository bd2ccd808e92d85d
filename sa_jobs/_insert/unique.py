"""Unique jobs: from :class:`~sa_jobs._declare.options.UniqueOpts` to row values, and the pieces of
the insert statement that enforce them.

The database does the enforcing: every unique row carries its key and the states in
which it blocks duplicates (``unique_states``), and the partial unique index
``sa_job_unique_idx`` admits at most one row per key among rows in their own unique
states. The insert is one ``INSERT ... ON CONFLICT`` statement against that index; for
Faktory's TTL, a data-modifying CTE in the same statement first releases keys whose
lock has expired.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from sqlalchemy import (
    and_,
    any_,
    exists,
    func,
    literal_column,
    null,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import TIMESTAMP
from sqlalchemy.sql.expression import ColumnElement
from sqlalchemy.sql.selectable import CTE, TableValuedAlias

from sa_jobs._declare.args import JobKind
from sa_jobs._declare.options import DEFAULT_UNIQUE_STATES, ResolvedInsert, UniqueOpts
from sa_jobs._declare.unique_sequence_keys import (
    canonical_args,
    canonical_bytes,
    key_digest,
    period_start_us,
)
from sa_jobs._table.feature_indexes import holds_ttl_lock, holds_unique_key
from sa_jobs._table.models import Job, job_table, states_bitmask

#: A row of an insert batch (sa_jobs._base.records.JobRow).
R = TypeVar("R", bound=Mapping[str, Any])

__all__ = ["fold_duplicates", "release_expired_locks", "unique_key_bytes", "unique_values"]


def unique_key_bytes(
    kind: JobKind, args_json: Any, resolved: ResolvedInsert, opts: UniqueOpts, now: dt.datetime
) -> bytes:
    """The canonical bytes of a job's unique key.

    See :mod:`sa_jobs._declare.unique_sequence_keys`.
    """
    period = None
    if opts.by_period is not None:
        period = period_start_us(resolved.scheduled_at or now, opts.by_period)
    return canonical_bytes(
        "unique",
        kind=None if opts.exclude_kind else kind.name,
        args=canonical_args(kind.args_class, args_json, "unique") if opts.by_args else None,
        period_us=period,
        queue=resolved.queue if opts.by_queue else None,
    )


def unique_values(
    kind: JobKind, args_json: Any, resolved: ResolvedInsert, now: dt.datetime
) -> dict[str, Any]:
    """The ``unique_*`` fields of one row (all None when the job is not unique)."""
    opts = resolved.unique
    if opts is None or opts.is_empty:
        return {}
    key = key_digest(unique_key_bytes(kind, args_json, resolved, opts, now))
    values = {"unique_key": "\\x" + key.hex()}
    values.update(_lock_values(opts))
    return values


@functools.lru_cache(maxsize=1024)
def _lock_values(opts: UniqueOpts) -> tuple[tuple[str, Any], ...]:
    """The row fields that follow from the options alone, left out where they hold the
    default (the statement reads a missing field as the default): rows stay small."""
    values: list[tuple[str, Any]] = []
    if opts.states != DEFAULT_UNIQUE_STATES:
        values.append(("unique_states", states_bitmask(opts.states)))
    if opts.ttl is not None:
        values.append(("unique_ttl", opts.ttl.total_seconds()))
    if opts.until == "start":
        values.append(("unique_until_start", True))
    return tuple(values)


def fold_duplicates(rows: Sequence[R]) -> tuple[list[R], list[int]]:
    """Drop later rows whose unique key an earlier row of the batch already has.

    PostgreSQL refuses an ``ON CONFLICT DO UPDATE`` that would touch one row twice, and
    the first of several identical requests is the one that should win. Returns the rows
    to send and, for every input row, the index of the sent row that answers it.
    """
    sent: list[R] = []
    answer: list[int] = []
    first_with_key: dict[str, int] = {}
    for row in rows:
        key = row.get("unique_key")
        if key is not None and key in first_with_key:
            answer.append(first_with_key[key])
            continue
        if key is not None:
            first_with_key[key] = len(sent)
        answer.append(len(sent))
        sent.append(row)
    return sent, answer


def unique_duplicate(key: Any) -> ColumnElement[bool]:
    """For a row being inserted: will ON CONFLICT find a live holder of its unique key?"""
    holder = job_table.alias("unique_holder")
    return and_(
        key.is_not(None),
        exists().where(
            holder.c.unique_key == key,
            holds_unique_key(holder),
            or_(holder.c.unique_expires_at.is_(None), holder.c.unique_expires_at > func.now()),
        ),
    )


_NEVER = literal_column("'infinity'", TIMESTAMP(timezone=True))


def release_expired_locks(source: TableValuedAlias) -> CTE:
    """Clear the key of jobs whose TTL has passed, for the keys this batch inserts.

    Runs as a CTE of the insert statement itself, referenced by it so that it runs
    first and under the same row locks: two inserters racing for an expired key queue
    on the old row, and the loser then meets the winner's new row in ON CONFLICT.

    Two things keep it cheap, and both matter at scale:

    * The batch's keys are compared with ``= ANY(ARRAY(...))``, an index condition, so
      each key is one probe. (``IN (SELECT ...)`` is planned as a semi-join, and since the
      planner cannot estimate the index predicate it may read every held key instead.)
    * A guard runs once, before anything else: has the earliest TTL lock expired? That
      is ``min(unique_expires_at)`` over ``sa_job_unique_ttl_idx``, one lookup at the
      low end of the index. While the answer is no (no TTL locks, or none expired), the
      batch's keys are never even read.

    Both are written so that no plan PostgreSQL may pick reads more, including the
    generic plan a pooled connection caches while the table is still small:

    * The guard asks for the ``min()``, which only an index ordered by expiry answers in
      one lookup. ``EXISTS (... WHERE unique_expires_at <= now())`` was cached as a scan
      of every held key in ``sa_job_unique_idx``.
    * The rows to release test ``coalesce(unique_expires_at, 'infinity')`` (a lock
      without a TTL never expires) rather than the bare column, which let the planner
      sweep every expired lock in ``sa_job_unique_ttl_idx`` instead of probing the
      batch's keys in ``sa_job_unique_idx``.
    """
    keys = select(source.c.unique_key).where(source.c.unique_key.is_not(None))
    ttl_holder = job_table.alias("ttl_holder")
    earliest_expiry = (
        select(func.min(ttl_holder.c.unique_expires_at))
        .where(holds_ttl_lock(ttl_holder))
        .scalar_subquery()
    )
    return (
        update(Job)
        .where(
            earliest_expiry <= func.now(),
            Job.unique_key == any_(func.array(keys.scalar_subquery())),
            holds_unique_key(job_table),
            func.coalesce(Job.unique_expires_at, _NEVER) <= func.now(),
        )
        .values(unique_key=null())
        .returning(Job.id)
        .cte("released_unique_keys")
    )
