"""What a finished step does to its workflow, in the transaction that finished it.

Every path that moves a job into a final state — the worker's completer (batched and
inline), :func:`~sa_jobs.complete_in`, the rescuer (all through
:func:`sa_jobs._act.complete.finish_in`) and cancellation (:func:`sa_jobs._act.control.cancel_ids`)
— hands the rows it changed that belong to a workflow to :func:`after_finished`:

1. **Cascade.** A step cancelled or discarded cancels its pending dependents, recursively,
   unless a dependent runs anyway (``on_dependency_failure="run"``); each one cancelled
   records why in ``metadata.workflow_cancelled``.
2. **Release.** A completed step resolves its out-edges (a failed one its "run anyway"
   out-edges) and takes one off each dependent's ``workflow_deps``; the dependent that
   reaches 0 becomes ``available`` (``scheduled`` if not due) and its queue is notified.
3. **Counters.** ``unfinished`` and ``failed`` of each workflow move by what finished;
   the transaction that brings ``unfinished`` to 0 fires the callbacks
   (:mod:`sa_jobs._act.workflow_callbacks`).

A batch in which every step completed (the common one) has nothing to cascade. The
worker and ``complete_in`` write it with :func:`completed_steps_statement`: the finish,
the release, the counters and the callbacks as one statement (in autocommit mode, one
round trip and atomic by construction). Elsewhere (a step finished by the rescuer as
completed, say) its release and counters are one statement after the finish.

Exactly once without a lock of our own: a dependent's row lock serialises the
completions of its dependencies, and an ``UPDATE`` that waited for one re-reads the row
(READ COMMITTED), so each decrement sees the one before and exactly one reaches 0. Rows
are locked in id order, and a step's id is always greater than its dependencies' (they
are inserted first), so concurrent completions, cascades and cancellations never wait
for each other in a cycle. Jobs outside workflows never get here: the finishing
statements return ``workflow_id``, and only rows that have one are passed on.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import (
    BigInteger,
    Connection,
    Integer,
    Text,
    and_,
    any_,
    bindparam,
    case,
    cast,
    func,
    literal_column,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.sql.dml import ReturningUpdate
from sqlalchemy.sql.expression import CTE, ColumnElement, Select

from sa_jobs._act.workflow_callbacks import (
    callbacks_fired,
    fire_callbacks,
    release_state,
)
from sa_jobs._base.sql import constant, id_array
from sa_jobs._base.states import JobState
from sa_jobs._table.models import Job, entering, job_table, state_is
from sa_jobs._table.schema import INSERT_CHANNEL
from sa_jobs._table.workflow_tables import dep_table, workflow_table

__all__ = [
    "CANCELLED_KEY",
    "FAILED_STATES",
    "STEP_IDS_PARAM",
    "adjust_counters",
    "after_finished",
    "cascade",
    "completed_steps_statement",
    "release",
    "release_state",
    "touch_running",
]

#: ``metadata`` key of a step cancelled because a dependency failed:
#: ``{"because": <the failed job's id>, "step": <its step name>}``.
CANCELLED_KEY = "workflow_cancelled"
#: The final states that count as a step's failure.
FAILED_STATES = frozenset({JobState.CANCELLED, JobState.DISCARDED})

_DONE = "sa_jobs_wf_done"
_FAILED = "sa_jobs_wf_failed"
_CAUSES = "sa_jobs_wf_causes"


def _ids(name: str) -> Any:
    return bindparam(name, type_=ARRAY(BigInteger))


@functools.cache
def _release_statement() -> Select[int, Any]:
    """Resolve the edges out of ``done`` (and the run-anyway edges out of ``failed``),
    decrement the dependents, release those that reach 0; returns (released, notified)."""
    dep = dep_table
    return _release_select(
        or_(
            dep.c.depends_on_id == any_(_ids(_DONE)),
            and_(dep.c.depends_on_id == any_(_ids(_FAILED)), dep.c.run_on_failure),
        )
    )


def _release_select(edges: ColumnElement[bool]) -> Select[int, Any]:
    """The release of :func:`_release_statement`, for the unresolved ``edges``."""
    dep = dep_table
    resolved = (
        update(dep)
        .where(~dep.c.resolved, edges)
        .values(resolved=true())
        .returning(dep.c.job_id)
        .cte("resolved_edges")
    )
    counts = (
        select(resolved.c.job_id, func.count().label("n"))
        .group_by(resolved.c.job_id)
        .cte("resolved_counts")
    )
    # Only to take the row locks in id order; the UPDATE below re-reads each locked row.
    # Each join to sa_job also compares the ids with an array of them: the planner then
    # reads sa_job by its primary key whatever join it picks (a hash join on the CTE
    # alone reads the whole table, see workflow_callbacks._release_statement).
    locked = (
        select(Job.id, counts.c.n)
        .join(counts, Job.id == counts.c.job_id)
        .where(Job.id == any_(id_array(select(func.array_agg(counts.c.job_id)))))
        .where(state_is(Job.state, JobState.PENDING))
        .order_by(Job.id)
        .with_for_update(of=Job)
        .cte("dependents_locked")
    )
    # The UPDATE reads sa_job by the locked ids alone (no join: a planner that estimated
    # the locked rows at one, or sa_job at a few, nested one scan inside the other, and
    # 1,000 released dependents cost 0.3-0.6 s) and looks each row's count up in a JSON
    # object of them by id, in log time. ``array_position`` in an array of them was linear
    # per row, so a fan-out's release grew with the square of its width (50,000: 42 s).
    ids = id_array(select(func.array_agg(locked.c.id)))
    counts_by_id = select(func.jsonb_object_agg(locked.c.id, locked.c.n)).scalar_subquery()
    resolved_here = cast(counts_by_id.op("->>")(cast(Job.id, Text)), BigInteger)
    remaining = Job.workflow_deps - resolved_here
    pending = constant(JobState.PENDING.value)
    next_state = case((remaining > constant(0), pending), else_=release_state())
    released = (
        update(Job)
        .where(Job.id == any_(ids), state_is(Job.state, JobState.PENDING))
        .values(workflow_deps=remaining, **entering(next_state))
        .returning(Job.state, Job.queue)
        .cte("released_steps")
    )
    notify = func.pg_notify(constant(INSERT_CHANNEL), released.c.queue).cast(Text)
    return select(
        func.count().filter(~state_is(released.c.state, JobState.PENDING)),
        func.max(case((state_is(released.c.state, JobState.AVAILABLE), notify))),
    ).select_from(released)


def release(connection: Connection, done: Sequence[int], failed: Sequence[int] = ()) -> int:
    """Resolve what ``done`` (completed) and ``failed`` release; returns steps released."""
    if not done and not failed:
        return 0
    params = {_DONE: list(done), _FAILED: list(failed)}
    released, _ = connection.execute(_release_statement(), params).one()
    return int(released)


@functools.cache
def _cascade_statement() -> Any:
    """Cancel the pending steps that wait, directly or not, on a step in ``_FAILED``
    (through edges of dependents that do not run anyway), each recording as its cause
    the matching entry of ``_CAUSES``; returns (id, workflow_id, cause)."""
    dep = dep_table
    frontier = (
        func.unnest(_ids(_FAILED), _ids(_CAUSES))
        .table_valued("id", "because")
        .render_derived(name="frontier")
    )
    seed = (
        select(dep.c.job_id.label("id"), frontier.c.because)
        .join(frontier, dep.c.depends_on_id == frontier.c.id)
        .where(dep.c.depends_on_id == any_(_ids(_FAILED)), ~dep.c.resolved, ~dep.c.run_on_failure)
    )
    doomed = seed.cte("doomed", recursive=True)
    edge = dep.alias("next_edge")
    through = job_table.alias("doomed_job")
    doomed = doomed.union(
        select(edge.c.job_id, doomed.c.because)
        .select_from(doomed)
        .join(edge, edge.c.depends_on_id == doomed.c.id)
        .join(through, through.c.id == doomed.c.id)
        .where(
            state_is(through.c.state, JobState.PENDING), ~edge.c.resolved, ~edge.c.run_on_failure
        )
    )
    once = (
        select(doomed.c.id, func.min(doomed.c.because).label("because"))
        .group_by(doomed.c.id)
        .cte("doomed_once")
    )
    locked = (
        select(Job.id, once.c.because)
        .join(once, Job.id == once.c.id)
        .where(state_is(Job.state, JobState.PENDING))
        .order_by(Job.id)
        .with_for_update(of=Job)
        .cte("doomed_locked")
    )
    cause = job_table.alias("cause")
    cause_step = select(cause.c.workflow_step).where(cause.c.id == locked.c.because)
    reason = func.jsonb_build_object(
        constant("because"), locked.c.because, constant("step"), cause_step.scalar_subquery()
    )
    return (
        update(Job)
        .where(Job.id == locked.c.id, state_is(Job.state, JobState.PENDING))
        .values(
            **entering(constant(JobState.CANCELLED.value)),
            metadata_=Job.metadata_.op("||")(
                func.jsonb_build_object(constant(CANCELLED_KEY), reason)
            ),
        )
        .returning(Job.id, Job.workflow_id, locked.c.because)
    )


def cascade(connection: Connection, failed: Sequence[int]) -> list[tuple[int, int]]:
    """Cancel the pending dependents of ``failed`` (recursively); ``(id, workflow_id)``
    of each step cancelled.

    Once more from the steps each pass cancelled, until one cancels nothing: a pass is
    one statement, whose recursion reads the edges under the snapshot it began with. A
    step added meanwhile (``add_to_workflow``) holds its dependencies' row locks until
    it commits, so the pass that waited for them missed its edge; the next pass, a new
    snapshot, sees it. Usually that second pass finds nothing: one more round trip, on
    the failure path only. A step cancelled by a later pass records the failed step the
    first one started from, as one cancelled by the first pass does.
    """
    cancelled: list[tuple[int, int]] = []
    frontier = {job_id: job_id for job_id in failed}
    while frontier:
        ids = sorted(frontier)
        rows = connection.execute(
            _cascade_statement(), {_FAILED: ids, _CAUSES: [frontier[i] for i in ids]}
        ).all()
        cancelled.extend((int(job_id), int(wf)) for job_id, wf, _ in rows)
        frontier = {int(job_id): int(because) for job_id, _, because in rows}
    return cancelled


_WF_IDS = "sa_jobs_wf_ids"
_WF_UNFINISHED = "sa_jobs_wf_unfinished"
_WF_FAILED = "sa_jobs_wf_failed_delta"


@functools.cache
def _counters_statement(*, after_release: bool = False) -> Any:
    """Move the counters of ``_WF_IDS`` by the deltas; returns each workflow's row and
    whether this brought it to 0 unfinished.

    ``after_release``: first (as CTEs of the same statement) run the release of
    :func:`_release_statement` — one round trip instead of two for the common batch, in
    which every step completed. The workflow rows are locked only once the release has
    locked and updated its dependents: their lock joins the release's one-row summary
    (an aggregate over every released row), so no workflow row can reach the lock before
    the release is done — jobs first, then workflows, as every path takes them.
    """
    source = (
        func.unnest(
            _ids(_WF_IDS),
            bindparam(_WF_UNFINISHED, type_=ARRAY(Integer)),
            bindparam(_WF_FAILED, type_=ARRAY(Integer)),
        )
        .table_valued("id", "d_unfinished", "d_failed")
        .render_derived(name="deltas")
    )
    summary = _release_statement().cte("release_summary") if after_release else None
    return _counters_update(source, _ids(_WF_IDS), summary)


def _counters_update(source: Any, ids: Any, summary: CTE | None) -> Any:
    """The update of :func:`_counters_statement`: ``source`` has ``(id, d_unfinished,
    d_failed)``, ``ids`` is the array of its ids; with ``summary`` (a one-row CTE), the
    workflow rows are locked only once it has been computed."""
    wf = workflow_table
    rows: Any = wf if summary is None else wf.join(summary, true())
    locked = (
        select(wf.c.id)
        .select_from(rows)
        .where(wf.c.id == any_(ids))
        .order_by(wf.c.id)
        .with_for_update(of=wf)
        .cte("workflows_locked")
    )
    unfinished = wf.c.unfinished + source.c.d_unfinished
    return (
        update(wf)
        .where(wf.c.id == locked.c.id, wf.c.id == source.c.id, wf.c.id == any_(ids))
        .values(
            unfinished=unfinished,
            failed=wf.c.failed + source.c.d_failed,
            finished_at=case(
                (unfinished == constant(0), func.coalesce(wf.c.finished_at, func.now())),
                else_=wf.c.finished_at,
            ),
        )
        .returning(
            wf.c.id,
            wf.c.name,
            wf.c.total,
            wf.c.failed,
            wf.c.on_success_job_id,
            wf.c.on_complete_job_id,
            wf.c.on_failure_job_id,
            and_(wf.c.unfinished == constant(0), source.c.d_unfinished < constant(0)).label(
                "finished_now"
            ),
        )
    )


#: The bound parameter of :func:`completed_steps_statement`: the ids it finishes.
STEP_IDS_PARAM = "sa_jobs_step_ids"
#: A row version's creating transaction; compared within one statement, so wraparound of
#: the 32-bit counter cannot matter.
_XMIN: ColumnElement[Any] = literal_column("sa_job.xmin")


def completed_steps_statement(finish: ReturningUpdate[Any]) -> Select[Any]:
    """``finish`` (an ``UPDATE`` of ``sa_job`` returning ``id, state, workflow_id``, every
    row it changes ``completed``) with everything a completed step does to its workflow,
    as one statement: the release of the dependents, the counters, and the callbacks of
    the workflows this finishes. Returns ``(id, state)`` of the rows ``finish`` changed.

    One statement is atomic by construction: sent in autocommit mode it is the whole
    transaction, one round trip where the same work took four or five (``BEGIN``, the
    finish, the release with the counters, the callbacks, ``COMMIT``), and no crash can
    split it. No step fails here, so nothing cascades (a batch that may fail a step takes
    the transaction of :func:`after_finished`).

    Lock order, as every path takes it: the finished jobs (in the order ``finish`` walks
    them), then the dependents in id order (greater than their dependencies'), then the
    workflow rows in id order, then the callbacks in id order. Each stage waits for the
    previous one through an aggregate over all its rows: the edges to resolve are those
    of the ``array_agg`` of every finished step, the workflow rows join the release's
    one-row summary, the callbacks come from the counters' ``RETURNING``.
    """
    # One statement reads everything under the snapshot taken when it began, before it
    # may wait for a step's row lock; a transaction holding that lock could meanwhile
    # commit a new edge out of the step (add_to_workflow), which this snapshot would miss.
    # Such a transaction gives the step a new row version (:func:`touch_running`),
    # and a row is finished only if its version is the one the snapshot saw: a step
    # updated since is not returned, and the writer finishes it in a transaction instead
    # (in READ COMMITTED each statement there has a new snapshot).
    seen = (
        select(Job.id, _XMIN.label("xmin"))
        .where(Job.id == any_(_ids(STEP_IDS_PARAM)))
        .cte("steps_seen")
        .prefix_with("MATERIALIZED")
    )
    finished = finish.where(Job.id == seen.c.id, seen.c.xmin == _XMIN).cte("finished_jobs")
    steps = finished.c.workflow_id.is_not(None)
    done = id_array(select(func.array_agg(finished.c.id)).where(steps))
    summary = _release_select(dep_table.c.depends_on_id == any_(done)).cte("release_summary")
    deltas = (
        select(
            finished.c.workflow_id.label("id"),
            (-func.count()).label("d_unfinished"),
            constant(0).label("d_failed"),
        )
        .where(steps)
        .group_by(finished.c.workflow_id)
        .cte("workflow_deltas")
    )
    workflows = id_array(select(func.array_agg(deltas.c.id)))
    counters = _counters_update(deltas, workflows, summary).cte("workflow_counters")
    fired = callbacks_fired(counters)
    return select(finished.c.id, finished.c.state).select_from(finished.join(fired, true()))


def touch_running(connection: Connection, job_ids: Sequence[int]) -> None:
    """Give these running steps a new row version, in a transaction that holds their row
    locks and changes what their completion must release (a new edge out of them, a
    dependent brought back to ``pending``). A completion of a batch is one statement
    (:func:`completed_steps_statement`) whose snapshot may predate that change: it
    finishes only rows whose version is the one its snapshot saw, so the completion of a
    step touched here waits for the commit and then leaves the step to the writer's
    transactional path, whose statements each see the change."""
    if job_ids:
        connection.execute(
            update(Job)
            .where(Job.id == any_(bindparam("running", list(job_ids), type_=ARRAY(BigInteger))))
            .values(workflow_step=Job.workflow_step)
        )


def adjust_counters(connection: Connection, deltas: dict[int, tuple[int, int]]) -> None:
    """Move each workflow's ``(unfinished, failed)`` by the deltas; fire the callbacks of
    those this brought to 0 unfinished."""
    deltas = {wf_id: d for wf_id, d in deltas.items() if d != (0, 0)}
    if not deltas:
        return
    ids = sorted(deltas)
    params = {
        _WF_IDS: ids,
        _WF_UNFINISHED: [deltas[i][0] for i in ids],
        _WF_FAILED: [deltas[i][1] for i in ids],
    }
    _fire_finished(connection, connection.execute(_counters_statement(), params).all())


def _count(connection: Connection, completed: dict[int, int], done: Sequence[int]) -> None:
    """Release what ``done`` releases and take ``completed[wf]`` steps off each workflow's
    ``unfinished``, in one statement; fire the callbacks of workflows this finished."""
    ids = sorted(completed)
    params = {
        _DONE: list(done),
        _FAILED: [],
        _WF_IDS: ids,
        _WF_UNFINISHED: [-completed[i] for i in ids],
        _WF_FAILED: [0 for _ in ids],
    }
    statement = _counters_statement(after_release=True)
    _fire_finished(connection, connection.execute(statement, params).all())


def _fire_finished(connection: Connection, rows: Sequence[Any]) -> None:
    finished = [row for row in rows if row.finished_now]
    if finished:
        fire_callbacks(connection, finished)


def after_finished(
    connection: Connection, rows: Iterable[tuple[int, JobState, int | None]]
) -> None:
    """Steps ``(id, new final state, workflow_id)`` finished in this transaction: cascade,
    release and count (see the module). Rows without a workflow are ignored."""
    steps = [(job_id, state, wf) for job_id, state, wf in rows if wf is not None]
    if not steps:
        return
    done = [job_id for job_id, state, _ in steps if state is JobState.COMPLETED]
    failed = [job_id for job_id, state, _ in steps if state in FAILED_STATES]
    if not failed:
        # The common batch: nothing to cascade; release and count in one statement.
        _count(connection, dict(Counter(wf for _, _, wf in steps if wf is not None)), done)
        return
    cancelled = cascade(connection, failed)
    release(connection, done, [*failed, *(job_id for job_id, _ in cancelled)])
    unfinished: Counter[int] = Counter()
    failures: Counter[int] = Counter()
    for _, state, wf in steps:
        assert wf is not None
        unfinished[wf] -= 1
        if state in FAILED_STATES:
            failures[wf] += 1
    for _, wf in cancelled:
        unfinished[wf] -= 1
        failures[wf] += 1
    adjust_counters(
        connection, {wf: (unfinished[wf], failures[wf]) for wf in set(unfinished) | set(failures)}
    )
