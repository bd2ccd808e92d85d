"""``sa-jobs queue pause|resume|list``: queue controls from the command line.

``pause`` and ``resume`` run :func:`sa_jobs.pause_queue` / :func:`sa_jobs.resume_queue`
in a transaction of their own; ``list`` prints :func:`sa_jobs.queue_states` (``--json``
as JSON, like ``sa-jobs stats`` and ``health``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from typing import Any

from sa_jobs._act.queues import (
    ALLOW_UNKNOWN_HINT,
    QueueState,
    pause_queue,
    queue_states,
    resume_queue,
)
from sa_jobs._inspect.queue_stats import as_dict
from sa_jobs.cli import settings
from sa_jobs.cli.common import CommandError, format_table, session_from
from sa_jobs.errors import UnknownQueueError

__all__ = ["add_command"]

SETTINGS = (settings.URL, settings.LOG_LEVEL)
ALLOW_UNKNOWN_OPTION_HINT = "or pass --allow-unknown to pause it before any job or worker names it"


def add_command(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add ``queue`` and its actions to the top-level subparsers ``commands``."""
    queue = commands.add_parser(
        "queue", parents=[common], help="pause or resume a queue for every worker, or list them"
    )
    actions = queue.add_subparsers(required=True, metavar="ACTION")
    pause = actions.add_parser(
        "pause", parents=[common], help="no worker fetches from the queue until it is resumed"
    )
    pause.add_argument("name", metavar="QUEUE")
    pause.add_argument(
        "--allow-unknown",
        action="store_true",
        help="pause a queue no job, worker or earlier pause names yet",
    )
    pause.set_defaults(run=_pause, settings=SETTINGS)
    resume = actions.add_parser("resume", parents=[common], help="workers fetch from it again")
    resume.add_argument("name", metavar="QUEUE")
    resume.set_defaults(run=_resume, settings=SETTINGS)
    listing = actions.add_parser(
        "list", parents=[common], help="queues with controls: paused or not, since when"
    )
    listing.add_argument("--json", action="store_true", help="print the queues as JSON")
    listing.set_defaults(run=_list, settings=SETTINGS)


def _change(options: argparse.Namespace, paused: bool) -> int:
    try:
        with session_from(options) as session, session.begin():
            if paused:
                state = pause_queue(session, options.name, allow_unknown=options.allow_unknown)
            else:
                state = resume_queue(session, options.name)
    except UnknownQueueError as exc:
        if not paused:
            raise
        # The Python API's hint names allow_unknown=True; here the option is the way.
        message = str(exc).replace(ALLOW_UNKNOWN_HINT, ALLOW_UNKNOWN_OPTION_HINT)
        raise CommandError(message) from None
    print(_describe(state))
    return 0


def _pause(options: argparse.Namespace) -> int:
    return _change(options, paused=True)


def _resume(options: argparse.Namespace) -> int:
    return _change(options, paused=False)


def _describe(state: QueueState) -> str:
    if state.paused_at is not None:
        return f"queue {state.name!r}: paused since {_timestamp(state.paused_at)} UTC"
    return f"queue {state.name!r}: active"


def _list(options: argparse.Namespace) -> int:
    with session_from(options) as session:
        states = queue_states(session)
    if options.json:
        shown = [
            {
                "name": state.name,
                "paused": state.paused,
                "paused_at": state.paused_at,
                "updated_at": state.updated_at,
            }
            for state in states
        ]
        print(json.dumps(as_dict(shown), indent=2))
        return 0
    if not states:
        print("no queue has been paused (every queue is active)")
        return 0
    rows = [
        (
            state.name,
            "paused" if state.paused else "active",
            _timestamp(state.paused_at) if state.paused_at else "-",
            _timestamp(state.updated_at) if state.updated_at else "-",
        )
        for state in states
    ]
    print(format_table(("queue", "state", "paused_at (UTC)", "updated_at (UTC)"), rows))
    return 0


def _timestamp(value: dt.datetime) -> str:
    # The zone is said once, by the line ("UTC") or the column header ("(UTC)"), not
    # again as a "+00:00" on every value.
    return value.astimezone(dt.UTC).replace(tzinfo=None).isoformat(sep=" ", timespec="seconds")
