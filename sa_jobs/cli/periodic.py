"""``sa-jobs periodic list``: every periodic job the database knows, with its schedule,
its last and next runs, a pending ``run_now`` request, and when a worker last had it
(``--json`` as JSON, like ``sa-jobs stats``)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
from typing import Any

from sa_jobs._inspect.queue_stats import as_dict
from sa_jobs.cli import settings
from sa_jobs.cli.common import format_table, session_from
from sa_jobs.periodic import periodic_jobs

__all__ = ["add_commands"]

SETTINGS = (settings.URL, settings.LOG_LEVEL)
#: What ``periodic list --json`` gives of each periodic job.
JSON_COLUMNS = (
    "name",
    "schedule",
    "last_run_at",
    "last_job_id",
    "next_run_at",
    "run_now_requested_at",
    "seen_at",
)


def add_commands(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add ``periodic`` and its actions to the top-level subparsers ``commands``."""
    periodic = commands.add_parser("periodic", parents=[common], help="look at periodic jobs")
    actions = periodic.add_subparsers(required=True, metavar="ACTION")
    listing = actions.add_parser(
        "list", parents=[common], help="names, schedules, last and next runs"
    )
    listing.add_argument("--json", action="store_true", help="print the periodic jobs as JSON")
    listing.set_defaults(run=_list, settings=SETTINGS)


def _list(options: argparse.Namespace) -> int:
    with session_from(options) as session:
        rows = periodic_jobs(session)
    if options.json:
        shown = [{column: getattr(row, column) for column in JSON_COLUMNS} for row in rows]
        print(json.dumps(as_dict(shown), indent=2))
        return 0
    if not rows:
        print("no periodic jobs (a worker registers its periodic jobs when it starts)")
        return 0
    header = ("name", "schedule", "last run (UTC)", "last job", "next run (UTC)", "seen (UTC)")
    body = [
        (
            row.name,
            row.schedule + (" [run requested]" if row.run_now_requested_at else ""),
            _timestamp(row.last_run_at),
            str(row.last_job_id) if row.last_job_id is not None else "-",
            _timestamp(row.next_run_at),
            _timestamp(row.seen_at),
        )
        for row in rows
    ]
    print(format_table(header, body))
    return 0


def _timestamp(value: dt.datetime | None) -> str:
    if value is None:
        return "-"
    return value.astimezone(dt.UTC).isoformat(sep=" ", timespec="seconds")
