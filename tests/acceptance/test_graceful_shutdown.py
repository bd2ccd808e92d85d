"""SIGTERM lets running jobs finish; a second signal interrupts them without spending an attempt."""

from __future__ import annotations

import signal
import time

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import JobState
from tests.acceptance.conftest import Spawn
from tests.acceptance.processes import runs, started
from tests.acceptance.worker_app import LongJob, PoisonJob, QuickJob
from tests.factories import job_row
from tests.helpers import add_job, wait_until

pytestmark = pytest.mark.slow


def test_sigterm_lets_the_running_job_finish_and_exits_cleanly(
    engine: Engine, spawn: Spawn
) -> None:
    worker = spawn("graceful")
    worker.wait_ready(engine)
    job_id = add_job(engine, LongJob(first=1.5))
    wait_until(lambda: started(engine, job_id, attempt=1), timeout=10, what="the job to start")

    worker.signal(signal.SIGTERM)
    time.sleep(0.5)  # time to stop fetching, and for a worker that did not wait to exit
    # Still finishing its job, and no longer taking new ones.
    assert worker.popen.poll() is None
    with Session(engine) as session, session.begin():
        late_id = sa_jobs.insert(session, QuickJob()).job.id

    assert worker.wait(15) == 0
    job = job_row(engine, job_id)
    assert job.state is JobState.COMPLETED
    assert job.attempt == 1
    assert job.errors == []
    assert [(r.attempt, r.event) for r in runs(engine, job_id)] == [(1, "start"), (1, "end")]
    # The job enqueued after SIGTERM was left for another worker.
    assert job_row(engine, late_id).state is JobState.AVAILABLE
    assert runs(engine, late_id) == []


@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_second_signal_interrupts_the_job_and_gives_its_attempt_back(
    engine: Engine, spawn: Spawn, second: signal.Signals
) -> None:
    worker = spawn(f"hard-stop-{second.name}")
    worker.wait_ready(engine)
    job_id = add_job(engine, LongJob(first=60))
    before = job_row(engine, job_id)
    wait_until(lambda: started(engine, job_id, attempt=1), timeout=10, what="the job to start")

    worker.signal(signal.SIGTERM)
    time.sleep(0.5)  # time for a worker that did not wait for the job to exit
    assert worker.popen.poll() is None, "the first SIGTERM must wait for the running job"
    assert job_row(engine, job_id).state is JobState.RUNNING

    worker.signal(second)
    assert worker.wait(10) == 0
    job = job_row(engine, job_id)
    assert job.state is JobState.AVAILABLE
    assert job.finalized_at is None
    # No attempt spent: as many attempts remain as when it was inserted (attempt 0).
    # (``before`` may have been read after the fetch, so its max_attempts is what counts.)
    assert job.max_attempts - job.attempt == before.max_attempts
    assert job.errors == []
    assert [(r.attempt, r.event) for r in runs(engine, job_id)] == [(1, "start")]


def test_hard_stop_exits_even_if_the_handler_ignores_cancellation(
    engine: Engine, spawn: Spawn
) -> None:
    worker = spawn("stuck", SA_JOBS_TEST_GRACE="0.5")
    worker.wait_ready(engine)
    job_id = add_job(engine, LongJob(first=20, interruptible=False))
    wait_until(lambda: started(engine, job_id, attempt=1), timeout=10, what="the job to start")

    worker.signal(signal.SIGTERM)
    # Handled: the next SIGTERM is a second signal, not one merged with the first.
    worker.wait_logged("SIGTERM: finishing running jobs")
    worker.signal(signal.SIGTERM)
    # The worker gives the job back after the grace period...
    wait_until(
        lambda: job_row(engine, job_id).state is JobState.AVAILABLE,
        what="the stuck job to be given back",
    )
    # ...and then the process must go away rather than keep running the handler.
    assert worker.wait(3) == 0


def test_sigterm_stops_a_worker_whose_handler_raised_an_unstorable_error(
    engine: Engine, spawn: Spawn
) -> None:
    # A NUL in an error text used to make the completer retry one statement forever:
    # every later job stayed running and SIGTERM never stopped the process.
    worker = spawn("poisoned")
    worker.wait_ready(engine)
    with Session(engine) as session, session.begin():
        poison_id = sa_jobs.insert(session, PoisonJob()).job.id
        quick_ids = [
            r.job.id for r in sa_jobs.insert_many(session, [QuickJob(n) for n in range(5)])
        ]
    for job_id in quick_ids:
        wait_until(
            lambda job_id=job_id: job_row(engine, job_id).state is JobState.COMPLETED,
            timeout=15,
            what=f"job {job_id}",
        )
    wait_until(
        lambda: job_row(engine, poison_id).state is not JobState.RUNNING,
        timeout=15,
        what="the poison job",
    )

    worker.signal(signal.SIGTERM)
    assert worker.wait(15) == 0
    poisoned = job_row(engine, poison_id)
    assert poisoned.state is JobState.RETRYABLE
    assert poisoned.errors[-1]["error"] == "ValueError: poison \ufffd in the message"
