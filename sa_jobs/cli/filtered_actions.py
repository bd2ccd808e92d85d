"""The filters of ``sa-jobs jobs delete|retry|cancel`` and their batch loop.

A filtered action runs :func:`sa_jobs.delete_jobs` (or ``retry_jobs``/``cancel_jobs``)
one batch per transaction, each call continuing after the last id of the one before, so
no lock is held longer than a batch takes — on a table of millions of jobs too.
"""

from __future__ import annotations

import argparse
import datetime as dt
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from sa_jobs._act.by_filter import (
    DEFAULT_BATCH_SIZE,
    MAX_BATCH_SIZE,
    BulkResult,
    JobFilter,
    cancel_jobs,
    delete_jobs,
)
from sa_jobs._act.by_filter import retry_jobs as retry_jobs_
from sa_jobs._base.states import JobState
from sa_jobs._table.schema import translate_missing_schema
from sa_jobs.cli import settings
from sa_jobs.cli.common import UsageError
from sa_jobs.errors import UnknownKindError, UnknownQueueError

__all__ = [
    "FILTER_OPTIONS",
    "add_filter_options",
    "age",
    "describe",
    "has_filter",
    "run_filtered",
    "unknown_names",
]

#: The namespace attributes the filter options set.
FILTER_OPTIONS = ("kind", "queue", "state", "ids", "created_before", "finalized_before")


def age(text: str) -> dt.datetime | dt.timedelta:
    """An age — that long ago, in the one duration syntax (``7d``, ``12h``, ``30m``,
    ``90s``, ``2w``, ``90``: :func:`sa_jobs.cli.settings.duration`) — or an ISO 8601
    instant with its offset (``2026-01-31T00:00:00+00:00``)."""
    try:
        return settings.duration(text)
    except argparse.ArgumentTypeError:
        pass
    try:
        instant = dt.datetime.fromisoformat(text)
    except ValueError:
        instant = None
    if instant is None or instant.tzinfo is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither an age (7d, 12h, 30m, 90s, 2w, or seconds) nor an ISO 8601 "
            "time with its offset (2026-01-31T00:00:00+00:00)"
        )
    return instant


def _batch_size(text: str) -> int:
    value = settings.positive_int(text)
    if value > MAX_BATCH_SIZE:
        raise argparse.ArgumentTypeError(f"at most {MAX_BATCH_SIZE}, got {value}")
    return value


def add_filter_options(parser: argparse.ArgumentParser, operation: str) -> None:
    """The filter options (each repeatable list matches any of its values)."""
    states = ", ".join(state.value for state in JobState)
    parser.add_argument("--kind", action="append", help="only this kind (repeatable)")
    parser.add_argument("--queue", action="append", help="only this queue (repeatable)")
    parser.add_argument(
        "--state",
        action="append",
        choices=[state.value for state in JobState],
        metavar="STATE",
        help=f"only jobs in this state (repeatable): {states}",
    )
    parser.add_argument(
        "--id",
        dest="ids",
        action="append",
        type=settings.positive_int,
        help="only this job id (repeatable)",
    )
    parser.add_argument(
        "--created-before",
        type=age,
        metavar="AGE|TIME",
        help="only jobs created before: an age (7d, 12h, 30m) or an ISO time with offset",
    )
    if operation != "cancel":
        parser.add_argument(
            "--finalized-before",
            type=age,
            metavar="AGE|TIME",
            help="only jobs that finished before: an age (7d) or an ISO time with offset",
        )
    parser.add_argument(
        "--batch-size",
        type=_batch_size,
        default=DEFAULT_BATCH_SIZE,
        help=f"jobs per transaction (default {DEFAULT_BATCH_SIZE})",
    )


def has_filter(options: argparse.Namespace) -> bool:
    return any(getattr(options, name, None) for name in FILTER_OPTIONS)


_ACTIONS: dict[str, Any] = {"delete": delete_jobs, "retry": retry_jobs_, "cancel": cancel_jobs}


def run_filtered(engine: Engine, operation: str, options: argparse.Namespace) -> BulkResult:
    """Apply ``operation`` to every job the options' filter matches, a transaction per
    batch; the totals."""
    if not has_filter(options):
        raise UsageError(
            f"jobs {operation} needs a job id or a filter (--kind, --queue, --state, --id, "
            "--created-before"
            + (", --finalized-before" if operation != "cancel" else "")
            + "): without one it would match every job"
        )
    action = _ACTIONS[operation]
    filters = {
        name: getattr(options, name)
        for name in FILTER_OPTIONS
        if getattr(options, name, None) is not None
    }
    total = BulkResult()
    after = 0
    while True:
        with Session(engine) as session, session.begin(), translate_missing_schema():
            done: BulkResult = action(
                session,
                **filters,
                batch_size=options.batch_size,
                limit=options.batch_size,
                after_id=after,
            )
        if done.last_id is None:
            return total
        total = BulkResult(
            count=total.count + done.count,
            last_id=done.last_id,
            cancel_requested=total.cancel_requested + done.cancel_requested,
            unique_conflicts=total.unique_conflicts + done.unique_conflicts,
        )
        after = done.last_id


def unknown_names(session: Session, kinds: Sequence[str], queues: Sequence[str]) -> list[str]:
    """The refusals a bulk action's filter would meet — each kind and queue nothing knows
    (:meth:`sa_jobs._act.by_filter.JobFilter.check_known`) — as messages, for a command that only
    reads (``jobs list``) to warn with instead: a typo there would print "no jobs"."""
    messages = []
    for kind in kinds:
        try:
            JobFilter(kinds=(kind,)).check_known(session)
        except UnknownKindError as exc:
            messages.append(str(exc))
    for queue in queues:
        try:
            JobFilter(queues=(queue,)).check_known(session)
        except UnknownQueueError as exc:
            messages.append(str(exc))
    return messages


def describe(operation: str, result: BulkResult) -> str:
    """One line about what a filtered action did."""
    past = {"delete": "deleted", "retry": "retried", "cancel": "cancelled"}[operation]
    noun = "job" if result.count == 1 else "jobs"
    line = f"{past} {result.count} {noun}"
    if result.cancel_requested:
        line += (
            f" ({result.cancel_requested} of them running: cancel requested, their workers "
            "will interrupt them)"
        )
    if result.unique_conflicts:
        shown = ", ".join(str(job_id) for job_id in result.unique_conflicts[:20])
        more = ", ..." if len(result.unique_conflicts) > 20 else ""
        line += (
            f"; left {len(result.unique_conflicts)} as they were, another job holds their "
            f"unique key: {shown}{more}"
        )
    return line
