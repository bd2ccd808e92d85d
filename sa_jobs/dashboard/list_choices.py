"""What the jobs list offers beside its rows: each state's count (its state tabs), the
queue and kind names its filters suggest, and which bulk actions can apply to a state.

Each is bounded, whatever the table holds:

* **Counts** are the overview's (:func:`sa_jobs._inspect.job_counts.count_jobs`, as
  ``sa_jobs.stats()`` reads them): exact up to ``EXACT_LIMIT`` jobs per state through the
  state's partial index, estimated past it — of the filtered queue, or of all queues.
* **Queues** are the *known* queues of :mod:`sa_jobs._act.queues`: a job is in it (the counts
  just read list every queue holding jobs), a worker's heartbeat row lists it, or it has
  a control row. Both tables are one row per worker process or per paused queue.
* **Kinds** are the kinds declared in this process (``sa_jobs._declare.args.default_registry``;
  empty under a standalone ``sa-jobs dashboard``, which imports no app code) and the
  distinct kinds of the newest :data:`KIND_WINDOW` jobs, read backwards along the primary
  key. No index on ``kind`` exists (it would cost every insert), so a kind no recent job
  has is not suggested — the field still takes any name typed into it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs
from sqlalchemy import select
from sqlalchemy.orm import Session

from sa_jobs._act.by_filter import JobFilter, Operation
from sa_jobs._act.queues import queue_states
from sa_jobs._base.states import JobState
from sa_jobs._declare.args import default_registry
from sa_jobs._inspect.job_counts import count_jobs, oldest_available
from sa_jobs._table.models import job_table
from sa_jobs._table.schema import Features
from sa_jobs._table.service_tables import WorkerProcess
from sa_jobs.errors import InvalidOptionsError

__all__ = [
    "KIND_WINDOW",
    "MAX_NAMES",
    "ListChoices",
    "StateTab",
    "applicable_operations",
    "list_choices",
    "not_offered",
]

#: The newest jobs whose kinds the kind filter suggests.
KIND_WINDOW = 10_000
#: Names offered per filter, at most (a datalist of thousands helps nobody).
MAX_NAMES = 500

OPERATIONS: tuple[Operation, ...] = ("retry", "cancel", "delete")


@attrs.frozen
class StateTab:
    """One state's tab: its jobs (of the filtered queue, or all), and whether the figure
    is an estimate."""

    state: JobState
    count: int
    estimated: bool


@attrs.frozen
class ListChoices:
    tabs: Sequence[StateTab]
    #: Every job counted in the tabs (None when one of them is an estimate).
    total: int | None
    queues: Sequence[str]
    kinds: Sequence[str]


def list_choices(session: Session, queue: str = "") -> ListChoices:
    """The state tabs' counts (of ``queue`` when given) and the names the filters offer."""
    connection = session.connection()
    features = Features.of(connection)
    counted = count_jobs(
        connection,
        JobState,
        features=features,
        available_queues=oldest_available(connection),
    )
    per_state: dict[JobState, int] = dict.fromkeys(JobState, 0)
    for name, counts in counted.counts.items():
        if queue and name != queue:
            continue
        for state, count in counts.items():
            per_state[state] += count
    tabs = [
        StateTab(state, count, state in counted.estimated) for state, count in per_state.items()
    ]
    total = None if counted.estimated else sum(per_state.values())
    return ListChoices(
        tabs=tabs,
        total=total,
        queues=_queues(session, counted.counts),
        kinds=_kinds(session),
    )


def _queues(session: Session, with_jobs: Mapping[str, object]) -> list[str]:
    names = {name for name in with_jobs if name != "?"}  # "?": an estimate naming none
    for served in session.scalars(select(WorkerProcess.queues)):
        names.update(served or ())
    names.update(state.name for state in queue_states(session))
    return sorted(names)[:MAX_NAMES]


def _kinds(session: Session) -> list[str]:
    newest = select(job_table.c.kind).order_by(job_table.c.id.desc()).limit(KIND_WINDOW).subquery()
    seen = session.scalars(select(newest.c.kind).distinct().limit(MAX_NAMES))
    return sorted({*default_registry.names(), *seen})[:MAX_NAMES]


def applicable_operations(state: JobState | None) -> dict[str, bool]:
    """Which of retry, cancel and delete can act on jobs in ``state`` — by the rules of
    ``retry_jobs``/``cancel_jobs``/``delete_jobs`` themselves (a running job is neither
    deleted nor retried, a finished one not cancelled). Any, for no state."""
    found: dict[str, bool] = {}
    for operation in OPERATIONS:
        try:
            if state is not None:
                JobFilter.build(operation, state=state)
        except InvalidOptionsError:
            found[operation] = False
        else:
            found[operation] = True
    return found


#: Why the list offers no button for some actions, by the actions it leaves out.
_WHY_NOT = {
    ("retry", "delete"): "running jobs are neither retried nor deleted; cancel them first "
    "(their workers are asked to stop)",
    ("retry",): "available jobs are waiting to run already",
    ("cancel",): "finished jobs cannot be cancelled",
}


def not_offered(operations: Mapping[str, bool]) -> str | None:
    """What the list says in place of the buttons :func:`applicable_operations` left out."""
    missing = tuple(operation for operation in OPERATIONS if not operations[operation])
    if not missing:
        return None
    names = " and ".join(operation.capitalize() for operation in missing)
    why = _WHY_NOT.get(missing, "the action does not apply to these jobs")
    return f"No {names} here: {why}."
