"""``sa-jobs jobs list|show|retry|cancel|delete``: looking at jobs and acting on them.

Each command opens one session on ``--url`` (or ``$SA_JOBS_DATABASE_URL`` /
``$DATABASE_URL``); ``retry ID`` and ``cancel ID`` run :func:`sa_jobs.retry_job` /
:func:`sa_jobs.cancel_job` in a transaction of their own and print the state the job
is left in. With a filter instead of an id, ``retry``, ``cancel`` and ``delete`` act on
every job it matches, a transaction per batch (:mod:`sa_jobs.cli.filtered_actions`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import enum
import json
import sys
from collections.abc import Sequence
from typing import Any

from sqlalchemy import inspect, select
from sqlalchemy.dialects.postgresql import JSONB

from sa_jobs._act.control import cancel_job, retry_job
from sa_jobs._base.states import FINAL_STATES, JobState
from sa_jobs._declare.output import output_preview
from sa_jobs._table.models import Job
from sa_jobs._table.schema import Features
from sa_jobs.cli import filtered_actions, settings
from sa_jobs.cli.common import (
    UsageError,
    engine_from,
    format_table,
    reading_session,
    session_from,
)
from sa_jobs.errors import JobNotFoundError

__all__ = ["add_commands", "format_job"]

DEFAULT_LIMIT = 50
ERROR_WIDTH = 60


#: What the jobs commands read from the environment (filters and ids are not settings).
SETTINGS = (settings.URL, settings.LOG_LEVEL)


def add_commands(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add ``jobs`` and its actions to the top-level subparsers ``commands``; ``common``
    holds the global options."""
    jobs = commands.add_parser(
        "jobs", parents=[common], help="list, show, retry, cancel or delete jobs"
    )
    actions = jobs.add_subparsers(required=True, metavar="ACTION")

    listing = actions.add_parser(
        "list", parents=[common, settings.replica_options()], help="a table of jobs, newest first"
    )
    listing.add_argument(
        "--state",
        action="append",
        choices=[state.value for state in JobState],
        metavar="STATE",
        help="only jobs in this state (repeatable): "
        + ", ".join(state.value for state in JobState),
    )
    listing.add_argument("--queue", action="append", help="only this queue (repeatable)")
    listing.add_argument("--kind", action="append", help="only this kind (repeatable)")
    listing.add_argument(
        "--limit",
        type=settings.positive_int,
        default=DEFAULT_LIMIT,
        help=f"at most this many jobs (default {DEFAULT_LIMIT})",
    )
    listing.set_defaults(run=_list, settings=(*SETTINGS, *settings.REPLICA_SETTINGS))

    show = actions.add_parser(
        "show", parents=[common], help="every column of one job, its args and its errors"
    )
    show.add_argument("id", type=_job_id, metavar="ID", help="the job's id")
    show.set_defaults(run=_show, settings=SETTINGS)

    for name, run, text in (
        ("retry", _retry, "make a job, or every job a filter matches, run again now"),
        ("cancel", _cancel, "cancel a job, or every job a filter matches"),
    ):
        action = actions.add_parser(name, parents=[common], help=text)
        action.add_argument(
            "id", type=_job_id, nargs="?", metavar="ID", help="the job's id (or a filter)"
        )
        filtered_actions.add_filter_options(action, name)
        action.set_defaults(run=run, settings=SETTINGS)

    deleting = actions.add_parser(
        "delete", parents=[common], help="delete every job a filter matches (never running ones)"
    )
    filtered_actions.add_filter_options(deleting, "delete")
    deleting.set_defaults(run=_delete, settings=SETTINGS)


#: Job ids are bigint: 1 to 2**63 - 1.
MAX_JOB_ID = 2**63 - 1


def _job_id(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a job id (a whole number)") from None
    if not 1 <= value <= MAX_JOB_ID:
        raise argparse.ArgumentTypeError(f"{text} is not a job id (ids run from 1 to {MAX_JOB_ID})")
    return value


# ---------------------------------------------------------------------- list


def _list(options: argparse.Namespace) -> int:
    last_error = Job.errors[-1]["error"].astext
    statement = select(
        Job.id,
        Job.kind,
        Job.queue,
        Job.state,
        Job.attempt,
        Job.max_attempts,
        Job.scheduled_at,
        last_error,
    ).order_by(Job.id.desc())
    if options.state:
        statement = statement.where(Job.state.in_(options.state))
    if options.queue:
        statement = statement.where(Job.queue.in_(options.queue))
    if options.kind:
        statement = statement.where(Job.kind.in_(options.kind))
    with reading_session(options) as (session, replica):
        rows = session.execute(statement.limit(options.limit + 1)).all()
        # Checked after the listing, so a name with jobs costs nothing more than the list.
        unknown = filtered_actions.unknown_names(
            session,
            [k for k in options.kind or () if not any(row.kind == k for row in rows)],
            [q for q in options.queue or () if not any(row.queue == q for row in rows)],
        )
    for message in unknown:
        print(f"sa-jobs: warning: {message}", file=sys.stderr)
    if replica is not None:
        print(f"sa-jobs: {replica.describe()}", file=sys.stderr)
    if not rows:
        print("no jobs")
        return 0
    header = ("id", "kind", "queue", "state", "attempt", "scheduled_at (UTC)", "last error")
    body = [
        (
            str(row.id),
            row.kind,
            row.queue,
            row.state.value,
            f"{row.attempt}/{row.max_attempts}",
            _timestamp(row.scheduled_at),
            _shorten(row[-1] or "", ERROR_WIDTH),
        )
        for row in rows[: options.limit]
    ]
    print(format_table(header, body))
    if len(rows) > options.limit:
        print(f"(more jobs match; showing the newest {options.limit}, see --limit)")
    return 0


def _shorten(text: str, width: int) -> str:
    first = text.strip().splitlines()[0] if text.strip() else ""
    return first if len(first) <= width else first[: width - 3] + "..."


# ---------------------------------------------------------------------- show


def _show(options: argparse.Namespace) -> int:
    with session_from(options) as session:
        job = session.get(Job, options.id)
        if job is None:
            raise JobNotFoundError(options.id)
        print(format_job(job, output=Features.of(session.connection()).output))
    return 0


def format_job(job: Job[Any], *, output: bool = True) -> str:
    """Every column of ``job``: scalars first, then the JSON documents, the output (cut
    if long), then the errors. Without ``output`` (the branch is not installed) the
    output columns are left out."""
    scalars: list[tuple[str, str]] = []
    documents: list[tuple[str, Any]] = []
    stored_output: Any = None
    for attribute in inspect(Job).column_attrs:
        column = attribute.columns[0]
        if not output and column.name.startswith("output"):
            continue
        value = getattr(job, attribute.key)
        if column.name == "errors":
            continue
        if column.name == "output":
            stored_output = value
            continue
        if isinstance(column.type, JSONB):
            documents.append((column.name, value))
        else:
            scalars.append((column.name, _value(value)))
    width = max(len(name) for name, _ in scalars)
    lines = [f"{name.ljust(width)}  {value}" for name, value in scalars]
    for name, document in documents:
        lines.append(f"{name}:")
        lines.extend(_indent(json.dumps(document, indent=2, sort_keys=True), 2))
    if stored_output is not None:
        lines.append("output:")
        lines.extend(_indent(output_preview(stored_output), 2))
    elif output:
        lines.append("output: none")
    lines.extend(_errors(job.errors))
    return "\n".join(lines)


def _errors(errors: Sequence[dict[str, Any]]) -> list[str]:
    if not errors:
        return ["errors: none"]
    lines = [f"errors ({len(errors)}):"]
    for record in errors:
        at = f" at {record['at']}" if record.get("at") else ""
        lines.append(f"  attempt {record.get('attempt', '?')}{at}: {record.get('error', '')}")
        trace = record.get("trace")
        if trace:
            lines.extend(_indent(trace.rstrip(), 4))
    return lines


def _indent(text: str, spaces: int) -> list[str]:
    return [" " * spaces + line for line in text.splitlines()]


def _value(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, dt.datetime):
        return _timestamp(value)
    if isinstance(value, bytes | memoryview):
        return bytes(value).hex()
    if isinstance(value, list | tuple):
        return ", ".join(str(item) for item in value) if value else "-"
    return str(value)


def _timestamp(value: dt.datetime) -> str:
    return value.astimezone(dt.UTC).isoformat(sep=" ", timespec="seconds")


# ---------------------------------------------------------------------- retry, cancel


def _filtered(options: argparse.Namespace, operation: str) -> int:
    engine = engine_from(options)
    try:
        result = filtered_actions.run_filtered(engine, operation, options)
    finally:
        engine.dispose()
    print(filtered_actions.describe(operation, result))
    return 0


def _one_or_filtered(options: argparse.Namespace, operation: str) -> int | None:
    """Run the filtered form if no id was given; None: the single-job form runs."""
    if options.id is None:
        return _filtered(options, operation)
    if filtered_actions.has_filter(options):
        raise UsageError(f"jobs {operation} takes a job id or a filter, not both")
    return None


def _delete(options: argparse.Namespace) -> int:
    return _filtered(options, "delete")


def _retry(options: argparse.Namespace) -> int:
    filtered = _one_or_filtered(options, "retry")
    if filtered is not None:
        return filtered
    with session_from(options) as session, session.begin():
        job = retry_job(session, options.id)
        message = f"job {job.id}: {job.state.value} (attempt {job.attempt}/{job.max_attempts})"
    print(message)
    return 0


def _cancel(options: argparse.Namespace) -> int:
    filtered = _one_or_filtered(options, "cancel")
    if filtered is not None:
        return filtered
    with session_from(options) as session, session.begin():
        job = cancel_job(session, options.id)
        state = job.state
        message = f"job {job.id}: {state.value}"
    if state is JobState.RUNNING:
        message += " (cancel requested: its worker will interrupt it)"
    elif state in FINAL_STATES and state is not JobState.CANCELLED:
        message += " (already finished: nothing to cancel)"
    print(message)
    return 0
