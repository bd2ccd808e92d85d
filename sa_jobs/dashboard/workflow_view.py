"""What the dashboard shows of workflows: the list, one workflow (its steps, their
dependencies, its callbacks, its graph), and a step's place in its workflow on the job page.

Every read is bounded, so a workflow of 100,000 steps costs what one of ten does:

* the list pages ``sa_job_workflow`` by its primary key, and its figures are the
  workflow's own counters (``total``, ``unfinished``, ``failed``), never a count of steps;
* a workflow's counts per state are counted only up to :data:`COUNT_LIMIT` steps (past
  it, the page shows the counters and says so);
* its steps are paged by name along the unique ``(workflow_id, workflow_step)`` index,
  :data:`STEPS_PAGE` at a time, each with at most :data:`EDGES_SHOWN` dependencies and
  dependents (one ``LATERAL`` read each through the edge table's two indexes);
* the graph is drawn only for a workflow of at most :data:`GRAPH_LIMIT` steps.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
from sqlalchemy import BigInteger, bindparam, func, select, true
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session

from sa_jobs._base.states import JobState
from sa_jobs._table.models import job_table
from sa_jobs._table.schema import Features
from sa_jobs._table.workflow_tables import CALLBACK_KEY, dep_table, workflow_table

__all__ = [
    "COUNT_LIMIT",
    "EDGES_SHOWN",
    "GRAPH_LIMIT",
    "LIST_PAGE",
    "STEPS_PAGE",
    "Edge",
    "Graph",
    "StepPlace",
    "StepRow",
    "WorkflowDetail",
    "WorkflowPage",
    "WorkflowSummary",
    "list_workflows",
    "step_place",
    "workflow_detail",
]

#: Workflows per page of the list.
LIST_PAGE = 50
#: Steps per page of a workflow.
STEPS_PAGE = 100
#: Dependencies (and dependents) listed per step; more are counted as "more".
EDGES_SHOWN = 20
#: Steps counted per state, at most; a bigger workflow shows its counters only.
COUNT_LIMIT = 20_000
#: The graph is drawn for workflows of at most this many steps.
GRAPH_LIMIT = 200

_jobs = job_table.c
_deps = dep_table.c
_wf = workflow_table.c
_ROLES = ("on_success", "on_complete", "on_failure")


@attrs.frozen
class WorkflowSummary:
    """A workflow as its row has it (counters kept by the transactions that finish steps)."""

    id: int
    name: str
    created_at: dt.datetime
    finished_at: dt.datetime | None
    total: int
    unfinished: int
    failed: int

    @property
    def completed(self) -> int:
        return self.total - self.unfinished - self.failed

    @property
    def finished(self) -> bool:
        return self.unfinished == 0


@attrs.frozen
class WorkflowPage:
    workflows: Sequence[WorkflowSummary]
    #: The ``before`` of the next (older) page; None: this is the last.
    next_before: int | None


def _summary(row: Any) -> WorkflowSummary:
    return WorkflowSummary(
        row.id, row.name, row.created_at, row.finished_at, row.total, row.unfinished, row.failed
    )


def list_workflows(session: Session, before: int | None = None) -> WorkflowPage:
    """The newest workflows first, :data:`LIST_PAGE` at a time (by id, through the key)."""
    query = select(workflow_table).order_by(_wf.id.desc()).limit(LIST_PAGE + 1)
    if before is not None:
        query = query.where(_wf.id < before)
    rows = session.execute(query).all()
    found = [_summary(row) for row in rows[:LIST_PAGE]]
    more = len(rows) > LIST_PAGE
    return WorkflowPage(found, found[-1].id if more and found else None)


@attrs.frozen
class Edge:
    """The other end of a dependency: a step, its state, and (towards a dependency)
    whether the edge is resolved."""

    job_id: int
    name: str
    state: JobState
    resolved: bool = False


@attrs.frozen
class StepRow:
    id: int
    name: str
    kind: str
    queue: str
    state: JobState
    #: Dependencies not resolved yet (the step is pending while this is above 0).
    unresolved: int
    deps: Sequence[Edge]
    #: More dependencies than listed.
    more_deps: bool
    dependents: Sequence[Edge]
    more_dependents: bool


@attrs.frozen
class Node:
    id: int
    name: str
    kind: str
    state: JobState
    x: int
    y: int


@attrs.frozen
class Graph:
    """The steps laid out in layers by depth (a step sits one layer right of its deepest
    dependency), for a server-rendered SVG."""

    nodes: Sequence[Node]
    #: ``(x1, y1, x2, y2, resolved)``: from a dependency's right edge to its dependent's left.
    lines: Sequence[tuple[int, int, int, int, bool]]
    width: int
    height: int
    node_width: int
    node_height: int


@attrs.frozen
class WorkflowDetail:
    summary: WorkflowSummary
    on_dependency_failure: str
    #: Steps per state (None: more than COUNT_LIMIT steps, not counted).
    counts: Mapping[JobState, int] | None
    #: ``(role, job id, state)`` of each callback still in the table.
    callbacks: Sequence[tuple[str, int, JobState]]
    steps: Sequence[StepRow]
    #: The ``after`` of the next page of steps (a step name); None: last page.
    next_after: str | None
    graph: Graph | None


def workflow_detail(session: Session, workflow_id: int, after: str = "") -> WorkflowDetail | None:
    """One workflow, a page of its steps (by name, after ``after``), or None if absent."""
    row = session.execute(select(workflow_table).where(_wf.id == workflow_id)).first()
    if row is None:
        return None
    summary = _summary(row)
    counts = None
    if summary.total <= COUNT_LIMIT:
        counts = {state: 0 for state in JobState}
        for state, n in session.execute(
            select(_jobs.state, func.count())
            .where(_jobs.workflow_id == workflow_id, _jobs.workflow_step.is_not(None))
            .group_by(_jobs.state)
        ):
            counts[JobState(state)] = int(n)
    ids = {role: getattr(row, f"{role}_job_id") for role in _ROLES}
    states = dict(
        session.execute(
            select(_jobs.id, _jobs.state).where(_jobs.id.in_([i for i in ids.values() if i]))
        ).all()
    )
    callbacks = [
        (role, job_id, JobState(states[job_id]))
        for role, job_id in ids.items()
        if job_id is not None and job_id in states
    ]
    steps, next_after = _steps_page(session, workflow_id, after)
    graph = _graph(session, workflow_id) if summary.total <= GRAPH_LIMIT else None
    return WorkflowDetail(
        summary, row.on_dependency_failure, counts, callbacks, steps, next_after, graph
    )


def _steps_page(session: Session, workflow_id: int, after: str) -> tuple[list[StepRow], str | None]:
    query = (
        select(
            _jobs.id,
            _jobs.workflow_step,
            _jobs.kind,
            _jobs.queue,
            _jobs.state,
            _jobs.workflow_deps,
        )
        # The unique (workflow_id, workflow_step) index, in its order: a page costs the
        # same at step 100,000 as at step 1. Callbacks have no step name.
        .where(_jobs.workflow_id == workflow_id, _jobs.workflow_step.is_not(None))
        .order_by(_jobs.workflow_step)
        .limit(STEPS_PAGE + 1)
    )
    if after:
        query = query.where(_jobs.workflow_step > after)
    rows = session.execute(query).all()
    more = len(rows) > STEPS_PAGE
    rows = rows[:STEPS_PAGE]
    page_ids = [int(r.id) for r in rows]
    deps = _edges(session, page_ids, towards_dependencies=True)
    dependents = _edges(session, page_ids, towards_dependencies=False)
    steps = []
    for r in rows:
        mine = deps.get(r.id, [])
        theirs = dependents.get(r.id, [])
        steps.append(
            StepRow(
                r.id,
                r.workflow_step,
                r.kind,
                r.queue,
                JobState(r.state),
                int(r.workflow_deps or 0),
                mine[:EDGES_SHOWN],
                len(mine) > EDGES_SHOWN,
                theirs[:EDGES_SHOWN],
                len(theirs) > EDGES_SHOWN,
            )
        )
    return steps, (rows[-1].workflow_step if more and rows else None)


def _edges(
    session: Session, ids: Sequence[int], *, towards_dependencies: bool
) -> dict[int, list[Edge]]:
    """Per step of ``ids``, up to EDGES_SHOWN + 1 of its dependencies (or dependents):
    one LATERAL read per step through the edge table's index on that side."""
    if not ids:
        return {}
    given = bindparam("sa_jobs_step_ids", list(ids), type_=ARRAY(BigInteger))
    page = select(func.unnest(given).label("id")).subquery("page")
    mine, other = (
        (_deps.job_id, _deps.depends_on_id)
        if towards_dependencies
        else (_deps.depends_on_id, _deps.job_id)
    )
    edges = (
        select(other.label("other"), _deps.resolved)
        .where(mine == page.c.id)
        .order_by(other)
        .limit(EDGES_SHOWN + 1)
        .lateral("edges")
    )
    rows = session.execute(
        select(page.c.id, edges.c.other, edges.c.resolved, _jobs.workflow_step, _jobs.state)
        .select_from(page.join(edges, true()).join(job_table, _jobs.id == edges.c.other))
        .order_by(page.c.id, edges.c.other)
    ).all()
    found: dict[int, list[Edge]] = {}
    for step_id, other_id, resolved, name, state in rows:
        found.setdefault(step_id, []).append(
            Edge(other_id, name or "", JobState(state), bool(resolved))
        )
    return found


NODE_WIDTH = 170
NODE_HEIGHT = 34
GAP_X = 60
GAP_Y = 14
MARGIN = 8


def _graph(session: Session, workflow_id: int) -> Graph:
    steps = session.execute(
        select(_jobs.id, _jobs.workflow_step, _jobs.kind, _jobs.state)
        .where(_jobs.workflow_id == workflow_id, _jobs.workflow_step.is_not(None))
        .order_by(_jobs.id)
    ).all()
    ids = [int(s.id) for s in steps]
    edges = (
        session.execute(
            select(_deps.depends_on_id, _deps.job_id, _deps.resolved).where(_deps.job_id.in_(ids))
        ).all()
        if ids
        else []
    )
    return layout(
        [(int(s.id), s.workflow_step or "", s.kind, JobState(s.state)) for s in steps],
        [(int(a), int(b), bool(r)) for a, b, r in edges],
    )


def layout(
    steps: Sequence[tuple[int, str, str, JobState]], edges: Sequence[tuple[int, int, bool]]
) -> Graph:
    """Place ``steps`` (id, name, kind, state) in columns by depth; ``edges`` are
    ``(dependency, dependent, resolved)``. Within a column, steps keep id order."""
    known = {step[0] for step in steps}
    parents: dict[int, list[int]] = {step[0]: [] for step in steps}
    for dep, job, _ in edges:
        if dep in known and job in known:
            parents[job].append(dep)
    depth: dict[int, int] = {}
    for start in parents:
        # Iteratively (a chain of 200 would be deep recursion): the DAG has no cycle.
        stack = [start]
        while stack:
            node = stack[-1]
            pending = [p for p in parents[node] if p not in depth]
            if pending:
                stack.extend(pending)
                continue
            stack.pop()
            depth[node] = 1 + max((depth[p] for p in parents[node]), default=-1)
    rows_in: dict[int, int] = {}
    nodes = []
    place: dict[int, tuple[int, int]] = {}
    for step_id, name, kind, state in steps:
        column = depth[step_id]
        row = rows_in.get(column, 0)
        rows_in[column] = row + 1
        x = MARGIN + column * (NODE_WIDTH + GAP_X)
        y = MARGIN + row * (NODE_HEIGHT + GAP_Y)
        place[step_id] = (x, y)
        nodes.append(Node(step_id, name, kind, state, x, y))
    lines = []
    for dep, job, resolved in edges:
        if dep in place and job in place:
            (x1, y1), (x2, y2) = place[dep], place[job]
            half = NODE_HEIGHT // 2
            lines.append((x1 + NODE_WIDTH, y1 + half, x2, y2 + half, resolved))
    columns = max(rows_in, default=-1) + 1
    tallest = max(rows_in.values(), default=0)
    return Graph(
        nodes,
        lines,
        width=2 * MARGIN + max(columns * (NODE_WIDTH + GAP_X) - GAP_X, 0),
        height=2 * MARGIN + max(tallest * (NODE_HEIGHT + GAP_Y) - GAP_Y, 0),
        node_width=NODE_WIDTH,
        node_height=NODE_HEIGHT,
    )


@attrs.frozen
class StepPlace:
    """A job's place in its workflow, for the job page."""

    workflow_id: int
    workflow_name: str
    #: The step's name; None for a callback.
    step: str | None
    #: The callback's role (``on_success``...) for a callback job.
    role: str | None
    unresolved: int
    deps: Sequence[Edge]
    more_deps: bool
    dependents: Sequence[Edge]
    more_dependents: bool


def step_place(session: Session, job_id: int) -> StepPlace | None:
    """Where job ``job_id`` sits in a workflow; None if it is in none (or the workflow
    branch is not installed)."""
    if not Features.of(session.connection()).workflow:
        return None
    row = session.execute(
        select(
            _jobs.workflow_id,
            _jobs.workflow_step,
            _jobs.workflow_deps,
            # A callback is no step (no workflow_id): its metadata names its workflow.
            _jobs["metadata"][CALLBACK_KEY]["workflow_id"].as_integer().label("callback_of"),
        ).where(_jobs.id == job_id)
    ).first()
    if row is None:
        return None
    workflow_id = row.workflow_id if row.workflow_id is not None else row.callback_of
    if workflow_id is None:
        return None
    workflow = session.execute(select(workflow_table).where(_wf.id == workflow_id)).first()
    if workflow is None:
        return None
    role = next((r for r in _ROLES if getattr(workflow, f"{r}_job_id") == job_id), None)
    deps = _edges(session, [job_id], towards_dependencies=True).get(job_id, [])
    dependents = _edges(session, [job_id], towards_dependencies=False).get(job_id, [])
    return StepPlace(
        int(workflow_id),
        workflow.name,
        row.workflow_step,
        role,
        int(row.workflow_deps or 0),
        deps[:EDGES_SHOWN],
        len(deps) > EDGES_SHOWN,
        dependents[:EDGES_SHOWN],
        len(dependents) > EDGES_SHOWN,
    )
