"""A worker process killed with SIGKILL loses nothing: its jobs are rescued elsewhere."""

from __future__ import annotations

import collections
import signal

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import JobState
from tests.acceptance.conftest import Spawn
from tests.acceptance.processes import runs, started
from tests.acceptance.worker_app import LongJob, QuickJob
from tests.factories import job_row
from tests.helpers import job_states, wait_until

pytestmark = pytest.mark.slow


def test_killed_workers_jobs_are_rescued_and_completed_by_another_process(
    engine: Engine, spawn: Spawn
) -> None:
    first = spawn("kill9-first")
    first.wait_ready(engine)

    with Session(engine) as session, session.begin():
        # Long on its first attempt, quick once rescued.
        long_id = sa_jobs.insert(session, LongJob(first=60, later=0.05)).job.id
        quick_ids = [
            r.job.id
            for r in sa_jobs.insert_many(session, [QuickJob(n=i, sleep=0.05) for i in range(50)])
        ]

    wait_until(
        lambda: started(engine, long_id, attempt=1), timeout=10, what="the long job to start"
    )
    first.signal(signal.SIGKILL)
    assert first.wait(10) == -signal.SIGKILL
    before_kill = runs(engine)
    ended_in_first = {r.job_id for r in before_kill if r.pid == first.pid and r.event == "end"}
    cut_short = {r.job_id for r in before_kill if r.pid == first.pid} - ended_in_first
    assert job_row(engine, long_id).state is JobState.RUNNING

    second = spawn("kill9-second")
    second.wait_ready(engine)
    every_id = {long_id, *quick_ids}
    wait_until(
        lambda: set(job_states(engine).values()) == {JobState.COMPLETED},
        timeout=20,
        what="every job to complete",
    )
    assert set(job_states(engine)) == every_id

    long_job = job_row(engine, long_id)
    assert long_job.attempt == 2
    assert long_job.attempted_by == ["kill9-first", "kill9-second"]
    (error,) = long_job.errors
    assert error["attempt"] == 1
    assert "RescuedError" in error["error"]
    assert "kill9-first" in error["error"]
    assert [(r.attempt, r.pid, r.event) for r in runs(engine, long_id)] == [
        (1, first.pid, "start"),
        (2, second.pid, "start"),
        (2, second.pid, "end"),
    ]

    # Every quick job ran to its end at least once. Those the kill cut short, and any
    # whose completion had not been written yet, were rescued from the killed process and
    # ran again in the second one (at least once, never lost).
    ends = collections.Counter(r.job_id for r in runs(engine) if r.event == "end")
    assert set(ends) == every_id
    for job_id in quick_ids:
        job = job_row(engine, job_id)
        if job.attempt == 1:
            assert job.errors == []
            continue
        assert job.attempt == 2
        assert job.attempted_by == ["kill9-first", "kill9-second"]
        assert ["RescuedError" in e["error"] for e in job.errors] == [True]
    for job_id in cut_short:
        assert job_row(engine, job_id).attempt == 2

    second.signal(signal.SIGTERM)
    assert second.wait(15) == 0
