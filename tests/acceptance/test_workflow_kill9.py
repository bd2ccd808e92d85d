"""A worker killed with SIGKILL between a dependency's completion and its dependent's
start loses no step: the release committed with the completion, or neither did and the
dependency is rescued and run again; either way every step runs after its dependency."""

from __future__ import annotations

import itertools
import signal

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import JobState
from tests.acceptance.conftest import Spawn
from tests.acceptance.processes import runs
from tests.acceptance.worker_app import QuickJob
from tests.helpers import job_states, wait_until

pytestmark = pytest.mark.slow

CHAINS = 12
STEPS = 5


def test_killed_worker_loses_no_workflow_step(engine: Engine, spawn: Spawn) -> None:
    first = spawn("wf-kill9-first")
    first.wait_ready(engine)
    chains: list[list[int]] = []
    with Session(engine) as session, session.begin():
        for c in range(CHAINS):
            wf = sa_jobs.chain(
                *(QuickJob(n=c * 100 + s, sleep=0.05) for s in range(STEPS)), name=f"c{c}"
            )
            chains.append(list(sa_jobs.insert_workflow(session, wf).jobs.values()))

    def ends() -> int:
        return sum(1 for r in runs(engine) if r.event == "end")

    # Killed in the middle: some chains part done, steps running, completions unwritten.
    wait_until(lambda: ends() >= CHAINS * 2, timeout=30, what="some steps to finish")
    first.signal(signal.SIGKILL)
    assert first.wait(10) == -signal.SIGKILL

    second = spawn("wf-kill9-second")
    second.wait_ready(engine)
    every_id = {job_id for chain in chains for job_id in chain}
    wait_until(
        lambda: all(job_states(engine)[i] is JobState.COMPLETED for i in every_id),
        timeout=60,
        what="every step to complete",
    )
    # Every step started only after its dependency had ended at least once.
    order = [(r.job_id, r.event) for r in runs(engine)]
    for chain in chains:
        for dependency, step in itertools.pairwise(chain):
            first_start = order.index((step, "start"))
            assert (dependency, "end") in order[:first_start], (dependency, step)
    with engine.connect() as connection:
        counters = connection.exec_driver_sql(
            "SELECT sum(unfinished), sum(failed), count(*) FROM sa_job_workflow"
        ).one()
    assert tuple(counters) == (0, 0, CHAINS)
