"""Random DAGs, run inline: every step runs after the steps it waits for, failures cascade
exactly to what a model predicts, counters and callbacks agree, and retrying the failed
steps brings the whole workflow to success.

Each example runs in one transaction (``run_jobs`` works in the test's session) that is
rolled back, so examples share nothing.
"""

from __future__ import annotations

from typing import Any

import attrs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import Job, JobState
from sa_jobs._table.workflow_tables import workflow_table
from sa_jobs.errors import JobCancel
from sa_jobs.testing import run_jobs
from tests.budget import examples


@sa_jobs.job_args(kind="prop_wf_step")
class Node:
    index: int = 0
    #: Ends cancelled on its first attempt (a later one completes).
    fail: bool = False


@sa_jobs.job_args(kind="prop_wf_callback")
class Callback:
    role: str = ""


@attrs.frozen
class Dag:
    deps: list[list[int]]
    fail: list[bool]
    run_anyway: list[bool]


@st.composite
def dags(draw: st.DrawFn) -> Dag:
    n = draw(st.integers(1, 9))
    deps = [sorted(draw(st.sets(st.integers(0, i - 1), max_size=3))) if i else [] for i in range(n)]
    fail = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    run_anyway = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    return Dag(deps, fail, run_anyway)


def expected(dag: Dag) -> list[JobState]:
    """The model: a step runs when each dependency completed (or failed, if it runs
    anyway); otherwise it is cancelled by the cascade."""
    states: list[JobState] = []
    for i, deps in enumerate(dag.deps):
        blocked = any(states[d] is not JobState.COMPLETED for d in deps) and not dag.run_anyway[i]
        states.append(JobState.CANCELLED if blocked or dag.fail[i] else JobState.COMPLETED)
    return states


@settings(
    max_examples=examples(30),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(dag=dags())
def test_random_dags(machine_engine: Engine, dag: Dag) -> None:
    ran: list[int] = []
    worker = sa_jobs.Worker(machine_engine, queues={"default": 1})

    @worker.handler(Node)
    def node(job: Job[Node]) -> None:
        ran.append(job.args.index)
        if job.args.fail and job.attempt == 1:
            raise JobCancel("planned failure")

    @worker.handler(Callback)
    def callback(job: Job[Callback]) -> None:
        ran.append(-1)

    wf = sa_jobs.Workflow(
        "random",
        on_success=Callback("on_success"),
        on_complete=Callback("on_complete"),
        on_failure=Callback("on_failure"),
    )
    steps: list[sa_jobs.Step] = []
    for i, deps in enumerate(dag.deps):
        mode: Any = "run" if dag.run_anyway[i] else "cancel"
        steps.append(
            wf.add(Node(i, dag.fail[i]), after=[steps[d] for d in deps], on_dependency_failure=mode)
        )
    with Session(machine_engine) as session:
        inserted = sa_jobs.insert_workflow(session, wf)
        ids = list(inserted.jobs.values())
        run_jobs(session, worker)

        want = expected(dag)
        assert [state_of(session, job_id) for job_id in ids] == want
        check_order(dag, [r for r in ran if r >= 0])
        failed = sum(1 for state in want if state is not JobState.COMPLETED)
        assert counters(session, inserted.id) == (0, failed)
        cb = {role: state_of(session, job_id) for role, job_id in inserted.callbacks.items()}
        assert cb["on_complete"] is JobState.COMPLETED
        assert cb["on_success"] is (JobState.PENDING if failed else JobState.COMPLETED)
        assert cb["on_failure"] is (JobState.COMPLETED if failed else JobState.CANCELLED)

        # Retry the steps that failed by themselves (a step the cascade cancelled fails
        # on its first run later): everything completes.
        for _ in range(len(ids)):
            own = failed_by_themselves(session, ids)
            if not own:
                break
            sa_jobs.retry_jobs(session, ids=own)
            run_jobs(session, worker)
        assert {state_of(session, job_id) for job_id in ids} == {JobState.COMPLETED}
        assert counters(session, inserted.id) == (0, 0)
        assert state_of(session, inserted.callbacks["on_success"]) is JobState.COMPLETED
        session.rollback()


def failed_by_themselves(session: Session, ids: list[int]) -> list[int]:
    """Cancelled steps the cascade did not cancel."""
    return list(
        session.scalars(
            select(Job.id).where(
                Job.id.in_(ids),
                Job.state == JobState.CANCELLED,
                ~Job.metadata_.has_key("workflow_cancelled"),
            )
        )
    )


def state_of(session: Session, job_id: int) -> JobState:
    return session.execute(select(Job.state).where(Job.id == job_id)).scalar_one()


def counters(session: Session, workflow_id: int) -> tuple[int, int]:
    row = session.execute(
        select(workflow_table.c.unfinished, workflow_table.c.failed).where(
            workflow_table.c.id == workflow_id
        )
    ).one()
    return int(row.unfinished), int(row.failed)


def check_order(dag: Dag, ran: list[int]) -> None:
    """Each step ran after every dependency that completed ran."""
    first_run = {}
    for position, index in enumerate(ran):
        first_run.setdefault(index, position)
    for index, position in first_run.items():
        for dep in dag.deps[index]:
            if dep in first_run:
                assert first_run[dep] < position, (dep, index, ran)
            else:
                assert dag.run_anyway[index], (dep, index, ran)
