"""``job.record_output`` survives a ``kill -9`` of the worker running the job: each value
is committed when it is recorded, and a later attempt's return value replaces it."""

from __future__ import annotations

import signal
from typing import Any

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import Job, JobState
from tests.acceptance.conftest import Spawn
from tests.acceptance.processes import runs
from tests.acceptance.worker_app import ProgressJob
from tests.factories import job_row
from tests.helpers import wait_until

pytestmark = pytest.mark.slow


def stored_output(engine: Engine, job_id: int) -> Any:
    with engine.connect() as connection:
        return connection.scalar(select(Job.output_json).where(Job.id == job_id))


def test_recorded_progress_survives_a_kill_and_the_next_attempts_output_replaces_it(
    engine: Engine, spawn: Spawn
) -> None:
    first = spawn("output-first")
    first.wait_ready(engine)
    with Session(engine) as session, session.begin():
        job_id = sa_jobs.insert(session, ProgressJob(steps=3)).job.id

    wait_until(
        lambda: any(r.event == "step 3" for r in runs(engine, job_id)),
        timeout=15,
        what="the job to record its third step",
    )
    first.signal(signal.SIGKILL)
    assert first.wait(10) == -signal.SIGKILL
    assert job_row(engine, job_id).state is JobState.RUNNING
    assert stored_output(engine, job_id) == {"step": 3}  # committed before the kill

    second = spawn("output-second")
    second.wait_ready(engine)
    wait_until(
        lambda: job_row(engine, job_id).state is JobState.COMPLETED,
        timeout=20,
        what="the rescued job to complete",
    )
    assert stored_output(engine, job_id) == {"finished": True, "attempt": 2}
    assert [(r.attempt, r.event) for r in runs(engine, job_id)] == [
        (1, "start"),
        (1, "step 1"),
        (1, "step 2"),
        (1, "step 3"),
        (2, "start"),
        (2, "end"),
    ]
