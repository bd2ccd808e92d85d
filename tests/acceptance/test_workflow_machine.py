"""A Hypothesis state machine for workflows, worked by two real worker processes.

Each example inserts random workflows — chains, fan-outs and fan-ins, diamonds, with
callbacks — whose steps follow random plans per run (complete, fail then succeed, fail
twice and be discarded, cancel themselves, snooze), while the rules cancel random steps
and whole workflows, retry failed steps and add steps to running workflows. Two worker
processes (started once, for every example) work them meanwhile.

Checked after every rule, in one snapshot each:

* no step ever started while a dependency it does not run despite had not completed
  (each start checks it in the database, in the worker process, before it runs);
* no run of a step started twice (a release or a fetch that happened twice);
* each workflow's counters agree with its steps' states (``unfinished``, ``failed``);
* no callback ran more than once.

At the end of each example, once the workers have settled everything: every step is
final — none pending for ever, every workflow finished; a step whose (strict) dependency
failed is cancelled, and a step the cascade cancelled has a failed dependency; a step
that runs anyway was never cancelled by the cascade; ``on_complete`` ran exactly once
and ``on_success`` exactly once for a workflow that succeeded (unless the test cancelled
the workflow).

Bounded: 10 examples of up to 12 rules, workflows of up to 7 steps (about 30 s on a
loaded 2-core machine).
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

import sa_jobs
from tests.acceptance.conftest import Spawn
from tests.acceptance.workflow_machine_app import OUTCOMES, MachineCallback, MachineStep

pytestmark = pytest.mark.slow

APP = "tests.acceptance.workflow_machine_app"
FINAL = {"completed", "cancelled", "discarded"}
FAILED = {"cancelled", "discarded"}

plans = st.lists(st.sampled_from(OUTCOMES), max_size=3)


@st.composite
def workflows(draw: st.DrawFn) -> tuple[list[list[int]], list[list[str]], list[bool]]:
    """Steps as (dependencies, plan, runs anyway): each waits for up to three earlier
    ones, so chains, fan-outs, fan-ins and diamonds all come up."""
    n = draw(st.integers(1, 7))
    shape = draw(st.sampled_from(["chain", "fan", "random"]))
    deps: list[list[int]] = []
    for i in range(n):
        if i == 0:
            deps.append([])
        elif shape == "chain":
            deps.append([i - 1])
        elif shape == "fan":  # 0 -> 1..n-2 -> n-1
            deps.append(list(range(1, i)) if i == n - 1 and n > 2 else [0])
        else:
            deps.append(sorted(draw(st.sets(st.integers(0, i - 1), max_size=3))))
    step_plans = [draw(plans) for _ in range(n)]
    anyway = [draw(st.integers(0, 4)) == 0 for _ in range(n)]
    return deps, step_plans, anyway


class WorkflowMachine(RuleBasedStateMachine):
    engine: Engine

    def __init__(self) -> None:
        super().__init__()
        self.workflows: list[int] = []
        self.cancelled_workflows: set[int] = set()
        self.steps: list[int] = []
        self.cancelled_steps: set[int] = set()
        #: Every job of this example (steps and callbacks): the checks look at these
        #: only, so a failed example leaves nothing that fails the next one.
        self.jobs: list[int] = []

    # -- rules

    @rule(shape=workflows(), callbacks=st.booleans())
    def add_workflow(
        self, shape: tuple[list[list[int]], list[list[str]], list[bool]], callbacks: bool
    ) -> None:
        deps, step_plans, anyway = shape
        roles = ("on_success", "on_complete", "on_failure") if callbacks else ()
        wf = sa_jobs.Workflow("machine", **{role: MachineCallback(role) for role in roles})
        steps: list[sa_jobs.Step] = []
        for after, plan, run in zip(deps, step_plans, anyway, strict=True):
            steps.append(
                wf.add(
                    MachineStep(plan),
                    after=[steps[d] for d in after],
                    on_dependency_failure="run" if run else "cancel",
                )
            )
        with Session(self.engine) as session, session.begin():
            inserted = sa_jobs.insert_workflow(session, wf)
        self.workflows.append(inserted.id)
        self.steps.extend(inserted.jobs.values())
        self.jobs.extend([*inserted.jobs.values(), *inserted.callbacks.values()])

    @precondition(lambda self: self.steps)
    @rule(data=st.data())
    def cancel_a_step(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(self.steps))
        with Session(self.engine) as session, session.begin():
            sa_jobs.cancel_job(session, job_id)
        self.cancelled_steps.add(job_id)

    @precondition(lambda self: self.workflows)
    @rule(data=st.data())
    def cancel_a_workflow(self, data: st.DataObject) -> None:
        workflow_id = data.draw(st.sampled_from(self.workflows))
        with Session(self.engine) as session, session.begin():
            sa_jobs.cancel_workflow(session, workflow_id)
        self.cancelled_workflows.add(workflow_id)

    @precondition(lambda self: self.steps)
    @rule(pick=st.integers(0, 1000))
    def retry_a_failed_step(self, pick: int) -> None:
        with self.engine.connect() as connection:
            failed = list(
                connection.scalars(
                    text(
                        "SELECT id FROM sa_job WHERE id = ANY(:ids) "
                        "AND state IN ('cancelled', 'discarded') ORDER BY id"
                    ),
                    {"ids": self.steps},
                )
            )
        if not failed:
            return
        with Session(self.engine) as session, session.begin():
            sa_jobs.retry_job(session, failed[pick % len(failed)])

    @precondition(lambda self: self.workflows)
    @rule(
        data=st.data(),
        plan=plans,
        run=st.booleans(),
        picks=st.lists(st.integers(0, 1000), max_size=2),
    )
    def add_a_step(self, data: st.DataObject, plan: list[str], run: bool, picks: list[int]) -> None:
        # Steps are picked by index from what the database holds (the draws must not
        # depend on it, or Hypothesis cannot replay an example).
        workflow_id = data.draw(st.sampled_from(self.workflows))
        with self.engine.connect() as connection:
            members = list(
                connection.scalars(
                    text("SELECT id FROM sa_job WHERE workflow_id = :wf ORDER BY id"),
                    {"wf": workflow_id},
                )
            )
        after = sorted({members[pick % len(members)] for pick in picks})
        with Session(self.engine) as session, session.begin():
            added = sa_jobs.add_to_workflow(
                session,
                workflow_id,
                MachineStep(plan),
                after=after,
                on_dependency_failure="run" if run else "cancel",
            )
        self.steps.append(added.job_id)
        self.jobs.append(added.job_id)

    @rule(seconds=st.sampled_from([0.05, 0.2]))
    def let_the_workers_work(self, seconds: float) -> None:
        time.sleep(seconds)

    # -- after every rule

    @invariant()
    def no_step_started_early_or_twice(self) -> None:
        with self.engine.connect() as connection:
            violations = connection.execute(
                text(
                    "SELECT job_id, event FROM acceptance_runs "
                    "WHERE event LIKE 'violation%' AND job_id = ANY(:ids)"
                ),
                {"ids": self.jobs},
            ).all()
            assert not violations, violations
            twice = connection.execute(
                text(
                    "SELECT job_id, event, count(*) FROM acceptance_runs "
                    "WHERE event LIKE 'start%' AND job_id = ANY(:ids) "
                    "GROUP BY job_id, event HAVING count(*) > 1"
                ),
                {"ids": self.jobs},
            ).all()
            assert not twice, twice

    @invariant()
    def counters_agree_with_states(self) -> None:
        if not self.workflows:
            return
        with self.engine.connect() as connection:
            rows = connection.execute(
                text(
                    "SELECT w.id, w.unfinished, w.failed, "
                    "count(j.id) FILTER (WHERE j.state NOT IN "
                    "  ('completed', 'cancelled', 'discarded')) AS open, "
                    "count(j.id) FILTER (WHERE j.state IN ('cancelled', 'discarded')) AS bad "
                    "FROM sa_job_workflow w LEFT JOIN sa_job j ON j.workflow_id = w.id "
                    "WHERE w.id = ANY(:ids) GROUP BY w.id"
                ),
                {"ids": self.workflows},
            ).all()
        for row in rows:
            assert (row.unfinished, row.failed) == (row.open, row.bad), row

    @invariant()
    def callbacks_run_at_most_once(self) -> None:
        with self.engine.connect() as connection:
            twice = connection.execute(
                text(
                    "SELECT r.job_id, count(*) FROM acceptance_runs r JOIN sa_job j "
                    "ON j.id = r.job_id WHERE j.kind = 'wf_machine_callback' "
                    "AND j.id = ANY(:ids) GROUP BY r.job_id HAVING count(*) > 1"
                ),
                {"ids": self.jobs},
            ).all()
        assert not twice, twice

    # -- at the end of an example

    def teardown(self) -> None:
        if not self.workflows:
            return
        deadline = time.monotonic() + 30
        while not self._settled():
            assert time.monotonic() < deadline, f"not settled: {self._open_jobs()}"
            time.sleep(0.05)
        self._check_final()

    def _open_jobs(self) -> list[Any]:
        with self.engine.connect() as connection:
            return connection.execute(
                text(
                    "SELECT id, kind, state, workflow_id, workflow_deps FROM sa_job "
                    "WHERE state NOT IN ('completed', 'cancelled', 'discarded') "
                    "AND NOT (state = 'pending' AND kind = 'wf_machine_callback') "
                    "AND id = ANY(:ids)"
                ),
                {"ids": self.jobs},
            ).all()

    def _settled(self) -> bool:
        return not self._open_jobs()

    def _check_final(self) -> None:
        with self.engine.connect() as connection:
            jobs = {
                row.id: row
                for row in connection.execute(
                    text(
                        "SELECT id, state::text AS state, workflow_id, metadata FROM sa_job "
                        "WHERE workflow_id = ANY(:ids)"
                    ),
                    {"ids": self.workflows},
                )
            }
            edges = connection.execute(
                text(
                    "SELECT depends_on_id, job_id, run_on_failure FROM sa_job_dep "
                    "WHERE workflow_id = ANY(:ids)"
                ),
                {"ids": self.workflows},
            ).all()
            workflows = connection.execute(
                text("SELECT * FROM sa_job_workflow WHERE id = ANY(:ids)"),
                {"ids": self.workflows},
            ).all()
            callback_runs = Counter(
                connection.scalars(
                    text(
                        "SELECT r.job_id FROM acceptance_runs r JOIN sa_job j ON "
                        "j.id = r.job_id WHERE j.kind = 'wf_machine_callback'"
                    )
                )
            )
        assert {row.state for row in jobs.values()} <= FINAL, "a step never finished"
        strict: dict[int, list[int]] = {}
        anyway: set[int] = set()
        for edge in edges:
            if edge.run_on_failure:
                anyway.add(edge.job_id)
            else:
                strict.setdefault(edge.job_id, []).append(edge.depends_on_id)
        for job_id, row in jobs.items():
            dep_states = [jobs[d].state for d in strict.get(job_id, [])]
            cascaded = "workflow_cancelled" in row.metadata
            if any(state in FAILED for state in dep_states):
                assert row.state == "cancelled", (job_id, row.state, dep_states)
            by_the_test = (
                job_id in self.cancelled_steps or row.workflow_id in self.cancelled_workflows
            )
            if row.state == "cancelled" and cascaded and not by_the_test:
                assert job_id not in anyway, f"step {job_id} runs anyway, but was cascaded"
                assert any(state in FAILED for state in dep_states), (job_id, dep_states)
        for wf in workflows:
            steps = [row for row in jobs.values() if row.workflow_id == wf.id]
            failed = sum(1 for row in steps if row.state in FAILED)
            assert (wf.unfinished, wf.failed) == (0, failed), wf
            assert wf.finished_at is not None
            if wf.id in self.cancelled_workflows:
                continue
            if wf.on_complete_job_id is not None:
                assert callback_runs[wf.on_complete_job_id] == 1, wf
            if wf.on_success_job_id is not None and failed == 0:
                assert callback_runs[wf.on_success_job_id] == 1, wf


def test_workflows_under_two_worker_processes(engine: Engine, spawn: Spawn) -> None:
    workers = [spawn(f"wf-machine-{i}", app=APP) for i in range(2)]
    for worker in workers:
        worker.wait_ready(engine)
    WorkflowMachine.engine = engine
    run_state_machine_as_test(
        WorkflowMachine,
        settings=settings(
            max_examples=10,
            stateful_step_count=12,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            # No shrinking: each example costs seconds of real processes, and the first
            # failing one, printed with its rules, is the report.
            phases=[Phase.explicit, Phase.generate],
            database=None,
        ),
    )
    for worker in workers:
        assert worker.popen.poll() is None, worker.output()
    with engine.connect() as connection:
        by_pid = connection.execute(
            text("SELECT pid, count(*) FROM acceptance_runs WHERE event LIKE 'start%' GROUP BY pid")
        ).all()
        outcomes = connection.execute(
            text("SELECT state, count(*) FROM sa_job GROUP BY state ORDER BY state")
        ).all()
    print("starts by process:", by_pid, "final states:", outcomes)
