"""From job args and options to one validated row: what every insert path sends.

A :class:`JobRow` is one element of the JSON array the insert statement reads with
``jsonb_to_recordset`` (:mod:`sa_jobs._insert.insert_statement`). Building it validates and
converts everything — args, options, unique and sequence keys — so no SQL is sent for
a batch until every row of it is known to be good.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

from sa_jobs._base.jsonvalue import check_json_document
from sa_jobs._base.records import JobRow
from sa_jobs._declare.args import JobKind, check_kind_name, default_registry, encode_args
from sa_jobs._declare.options import InsertOpts, KindDefaults, ResolvedInsert
from sa_jobs._declare.partitions import metadata_key_of, partition_key_of
from sa_jobs._insert.sequence import sequence_values
from sa_jobs._insert.unique import unique_values
from sa_jobs._table.models import Job
from sa_jobs.errors import InvalidJobArgsError

__all__ = ["build_rows", "row_for", "row_of_job"]


def row_for(kind: JobKind, args_json: Any, opts: InsertOpts) -> JobRow:
    """The row of one job of a registered kind."""
    return _row(kind, kind.name, args_json, opts.resolve(kind.defaults))


def build_rows(items: Iterable[tuple[object, InsertOpts]]) -> list[JobRow]:
    """Validate and convert every item before any SQL is sent."""
    rows = []
    # insert_many passes one InsertOpts for most items: resolve it once per kind, not per
    # row. The entries keep their opts and kind alive, so an id is never reused for another.
    resolved: dict[tuple[int, int], tuple[InsertOpts, JobKind, ResolvedInsert]] = {}
    for args, opts in items:
        kind, args_json = encode_args(args)
        entry = resolved.get((id(opts), id(kind)))
        if entry is None:
            entry = resolved[id(opts), id(kind)] = (opts, kind, opts.resolve(kind.defaults))
        rows.append(_row(kind, kind.name, args_json, entry[2]))
    return rows


def row_of_job(job: Job[Any]) -> JobRow:
    """The row of a ``Job`` built by hand (say, for a kind another service handles):
    its attributes are validated like any other insert and defaulted the same way."""
    opts = InsertOpts(
        queue=job.queue,
        priority=job.priority,
        max_attempts=job.max_attempts,
        tags=job.tags,
        metadata=job.metadata_,
        scheduled_at=job.scheduled_at,
    )
    registered = default_registry.get(job.kind) if job.kind in default_registry else None
    defaults = registered.defaults if registered is not None else KindDefaults()
    check_kind_name(job.kind)
    args_json = job.args_json if job.args_json is not None else {}
    if not isinstance(args_json, dict | list):
        raise InvalidJobArgsError(
            f"a job's args must be a JSON object or array, got {type(args_json).__name__} "
            f"for kind {job.kind!r}"
        )
    check_json_document(args_json, f"job of kind {job.kind!r}")
    if registered is not None:
        # A kind this process knows: its worker will decode these args, so they must read back.
        registered.check_stored(args_json)
    return _row(registered, job.kind, args_json, opts.resolve(defaults))


def _row(kind: JobKind | None, kind_name: str, args_json: Any, resolved: ResolvedInsert) -> JobRow:
    row: JobRow = {
        "kind": kind_name,
        "args": args_json,
        "queue": resolved.queue,
        "priority": resolved.priority,
        "max_attempts": resolved.max_attempts,
        "tags": list(resolved.tags),
        # A copy per row: one resolved value may serve many rows (build_rows).
        "metadata": dict(resolved.metadata),
        "scheduled_at": _iso(resolved.scheduled_at),
    }
    if kind is not None:
        row.update(unique_values(kind, args_json, resolved, dt.datetime.now(dt.UTC)))  # type: ignore[typeddict-item]
        row.update(sequence_values(kind, args_json, resolved))  # type: ignore[typeddict-item]
        key = None
        if kind.partition_by is not None:
            key = partition_key_of(kind_name, kind.partition_by, args_json)
        elif kind.partition_by_metadata is not None:
            key = metadata_key_of(kind_name, kind.partition_by_metadata, resolved.metadata)
        if key is not None:
            row["partition_key"] = key
    if resolved.job_key is not None:
        row["job_key"] = resolved.job_key
        row["job_key_mode"] = resolved.job_key_mode.value
    return row


def _iso(value: dt.datetime | None) -> str | None:
    return value.isoformat() if value is not None else None
