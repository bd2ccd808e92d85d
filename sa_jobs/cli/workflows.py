"""``sa-jobs workflows list|show|cancel``: looking at workflows and stopping one.

Like ``sa-jobs jobs``: one session on ``--url`` (or ``$SA_JOBS_DATABASE_URL`` /
``$DATABASE_URL``). ``list`` reads each workflow's own counters (never a count of its
steps); ``show`` prints :func:`sa_jobs.workflow_status` and a page of steps by name
with what each waits for; ``cancel`` runs :func:`sa_jobs.cancel_workflow` in a
transaction of its own.
"""

from __future__ import annotations

import argparse
import datetime as dt
from typing import Any

from sqlalchemy import BigInteger, bindparam, func, select, true
from sqlalchemy.dialects.postgresql import ARRAY

from sa_jobs._act.workflow_status import cancel_workflow, workflow_status
from sa_jobs._base.states import JobState
from sa_jobs._table.models import job_table
from sa_jobs._table.schema import WORKFLOW_BRANCH, Features
from sa_jobs._table.workflow_tables import dep_table, workflow_table
from sa_jobs.cli import settings
from sa_jobs.cli.common import format_table, session_from
from sa_jobs.errors import SchemaMissingError

__all__ = ["add_commands"]

DEFAULT_LIMIT = 50
#: Dependencies listed per step in ``show``; more are counted.
DEPS_SHOWN = 10

SETTINGS = (settings.URL, settings.LOG_LEVEL)

#: Workflow ids are bigint.
MAX_ID = 2**63 - 1


def add_commands(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add ``workflows`` and its actions to the top-level subparsers ``commands``."""
    workflows = commands.add_parser(
        "workflows", parents=[common], help="list, show or cancel workflows"
    )
    actions = workflows.add_subparsers(required=True, metavar="ACTION")

    listing = actions.add_parser(
        "list", parents=[common], help="a table of workflows, newest first"
    )
    listing.add_argument(
        "--unfinished", action="store_true", help="only workflows with unfinished steps"
    )
    listing.add_argument(
        "--limit",
        type=settings.positive_int,
        default=DEFAULT_LIMIT,
        help=f"at most this many workflows (default {DEFAULT_LIMIT})",
    )
    listing.set_defaults(run=_list, settings=SETTINGS)

    show = actions.add_parser(
        "show", parents=[common], help="a workflow's counts, callbacks, failed steps and steps"
    )
    show.add_argument("id", type=_workflow_id, metavar="ID", help="the workflow's id")
    show.add_argument(
        "--steps",
        type=settings.positive_int,
        default=DEFAULT_LIMIT,
        help=f"list at most this many steps, by name (default {DEFAULT_LIMIT})",
    )
    show.add_argument("--after", default="", metavar="NAME", help="list the steps named after NAME")
    show.set_defaults(run=_show, settings=SETTINGS)

    cancel = actions.add_parser(
        "cancel",
        parents=[common],
        help="cancel a workflow's unfinished steps and its callbacks that have not run",
    )
    cancel.add_argument("id", type=_workflow_id, metavar="ID", help="the workflow's id")
    cancel.set_defaults(run=_cancel, settings=SETTINGS)


def _workflow_id(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a workflow id (a whole number)"
        ) from None
    if not 1 <= value <= MAX_ID:
        raise argparse.ArgumentTypeError(f"{text} is not a workflow id (1 to {MAX_ID})")
    return value


def _require(session: Any) -> None:
    if not Features.of(session.connection()).workflow:
        raise SchemaMissingError(WORKFLOW_BRANCH, "workflows are stored there")


def _timestamp(value: dt.datetime | None) -> str:
    if value is None:
        return "-"
    return value.astimezone(dt.UTC).isoformat(sep=" ", timespec="seconds")


# ---------------------------------------------------------------------- list


def _list(options: argparse.Namespace) -> int:
    wf = workflow_table.c
    statement = select(workflow_table).order_by(wf.id.desc()).limit(options.limit + 1)
    if options.unfinished:
        statement = statement.where(wf.unfinished > 0)
    with session_from(options) as session:
        _require(session)
        rows = session.execute(statement).all()
    if not rows:
        print("no workflows")
        return 0
    header = (
        "id",
        "name",
        "created (UTC)",
        "steps",
        "completed",
        "failed",
        "unfinished",
        "finished (UTC)",
    )
    body = [
        (
            str(row.id),
            row.name,
            _timestamp(row.created_at),
            str(row.total),
            str(row.total - row.unfinished - row.failed),
            str(row.failed),
            str(row.unfinished),
            _timestamp(row.finished_at) if row.unfinished == 0 else "no",
        )
        for row in rows[: options.limit]
    ]
    print(format_table(header, body))
    if len(rows) > options.limit:
        print(f"(more workflows; showing the newest {options.limit}, see --limit)")
    return 0


# ---------------------------------------------------------------------- show


def _show(options: argparse.Namespace) -> int:
    with session_from(options) as session:
        _require(session)
        status = workflow_status(session, options.id)
        steps = _steps(session, options.id, options.after, options.steps + 1)
    lines = [
        f"workflow {status.id}: {status.name}",
        f"created     {_timestamp(status.created_at)}",
        f"finished    {_timestamp(status.finished_at) if status.finished else 'no'}",
        f"steps       {status.total}: {status.total - status.unfinished - status.failed} "
        f"completed, {status.failed} failed, {status.unfinished} unfinished",
        "per state   "
        + (", ".join(f"{s.value} {n}" for s, n in status.counts.items() if n) or "none"),
    ]
    if status.callbacks:
        lines.append(
            "callbacks   "
            + ", ".join(
                f"{role} job {job_id} ({state.value})"
                for role, (job_id, state) in status.callbacks.items()
            )
        )
    if status.failed_steps:
        lines.append(f"failed steps ({status.failed}):")
        for failed in status.failed_steps:
            why = f", because job {failed.because} failed" if failed.because else ""
            lines.append(
                f"  {failed.name} (job {failed.job_id}): {failed.state.value}{why}, "
                f"{failed.errors} error{'s' if failed.errors != 1 else ''}"
            )
    print("\n".join(lines))
    shown = steps[: options.steps]
    if shown:
        header = ("step", "job", "kind", "state", "waits for")
        print()
        print(format_table(header, [_step_line(step) for step in shown]))
    if len(steps) > options.steps:
        print(f"(more steps; see --after {shown[-1]['name']})")
    return 0


def _steps(session: Any, workflow_id: int, after: str, limit: int) -> list[dict[str, Any]]:
    """A page of steps by name, along the unique (workflow_id, workflow_step) index, each
    with the names of up to DEPS_SHOWN (+ 1, to tell there are more) of its dependencies."""
    jobs = job_table.c
    statement = (
        select(jobs.id, jobs.workflow_step, jobs.kind, jobs.state, jobs.workflow_deps)
        .where(jobs.workflow_id == workflow_id, jobs.workflow_step.is_not(None))
        .order_by(jobs.workflow_step)
        .limit(limit)
    )
    if after:
        statement = statement.where(jobs.workflow_step > after)
    steps = [
        {
            "id": row.id,
            "name": row.workflow_step,
            "kind": row.kind,
            "state": JobState(row.state),
            "unresolved": row.workflow_deps or 0,
            "deps": [],
        }
        for row in session.execute(statement)
    ]
    by_id = {step["id"]: step for step in steps}
    if by_id:
        # One LATERAL read per step along sa_job_dep's (job_id, depends_on_id) index,
        # DEPS_SHOWN + 1 edges at most: a fan-in of 100,000 costs what one of 3 does.
        deps = dep_table.c
        ids = bindparam("sa_jobs_step_ids", list(by_id), type_=ARRAY(BigInteger))
        page = select(func.unnest(ids).label("id")).subquery("page")
        edges = (
            select(deps.depends_on_id.label("other"), deps.resolved)
            .where(deps.job_id == page.c.id)
            .order_by(deps.depends_on_id)
            .limit(DEPS_SHOWN + 1)
            .lateral("edges")
        )
        rows = session.execute(
            select(page.c.id, jobs.workflow_step, jobs.state, edges.c.resolved)
            .select_from(page.join(edges, true()).join(job_table, jobs.id == edges.c.other))
            .order_by(page.c.id, edges.c.other)
        )
        for job_id, name, state, resolved in rows:
            # A resolved dependency by name; one still in the way with its state.
            shown = name or "?"
            by_id[job_id]["deps"].append(shown if resolved else f"{shown} ({state.value})")
    return steps


def _step_line(step: dict[str, Any]) -> tuple[str, ...]:
    deps: list[str] = step["deps"]
    waits = ", ".join(deps[:DEPS_SHOWN]) or "-"
    if len(deps) > DEPS_SHOWN:
        waits += " and more"
    return (step["name"], str(step["id"]), step["kind"], step["state"].value, waits)


# ---------------------------------------------------------------------- cancel


def _cancel(options: argparse.Namespace) -> int:
    with session_from(options) as session, session.begin():
        _require(session)
        changed = cancel_workflow(session, options.id)
    print(
        f"workflow {options.id}: {changed} job{'s' if changed != 1 else ''} cancelled or asked "
        "to stop (unfinished steps and callbacks that had not run)"
    )
    return 0
