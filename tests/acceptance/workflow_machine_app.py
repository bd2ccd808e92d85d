"""A worker process for the workflow state machine (``test_workflow_machine.py``).

Run as ``python -m tests.acceptance.workflow_machine_app`` with the environment of
:mod:`tests.acceptance.worker_app` (``SA_JOBS_TEST_URL``, ``SA_JOBS_TEST_WORKER_ID``).

A step's handler follows its plan: the outcome of its n-th run is ``plan[n]`` (the runs
before it counted in ``acceptance_runs``), ``complete`` once the plan is spent. Before
anything else it checks, in the database, that every dependency it does not run despite
has completed, and records ``violation`` if not — the invariant, observed at the moment
the step starts, in the process that started it. Retries are immediate (``NO_DELAY``),
snoozes 50 ms, so an example settles in a second or two.
"""

from __future__ import annotations

import logging
import os
import sys
import time

import attrs
from sqlalchemy import Engine, create_engine, text

import sa_jobs
from sa_jobs import Job, Worker
from sa_jobs.errors import JobCancel, JobSnooze
from tests.acceptance.worker_app import RUNS_TABLE
from tests.helpers import NO_DELAY, fast_maintenance

QUEUE = "wf_machine"

#: A fast scheduler (retries and snoozes come back within 50 ms), and no rescue within a
#: test: on a loaded machine a heartbeat a second late would have the rescuer run a
#: callback again — at least once, as it should, but the test counts runs to check that
#: each callback is released once.
MAINTENANCE = fast_maintenance(scheduler_interval=0.05, rescue_after=60.0)
OUTCOMES = ("complete", "fail", "cancel", "snooze")


@sa_jobs.job_args(kind="wf_machine_step", queue=QUEUE, max_attempts=2)
class MachineStep:
    """A step; two failures discard it (``max_attempts=2``)."""

    plan: list[str] = attrs.field(factory=list)


@sa_jobs.job_args(kind="wf_machine_callback", queue=QUEUE)
class MachineCallback:
    role: str = ""


class PlannedFailure(Exception):
    pass


_engine: Engine | None = None

_UNMET = text(
    "SELECT count(*) FROM sa_job_dep d JOIN sa_job j ON j.id = d.depends_on_id "
    "WHERE d.job_id = :id AND NOT d.run_on_failure AND j.state <> 'completed'"
)
_RUNS_BEFORE = text(f"SELECT count(*) FROM {RUNS_TABLE} WHERE job_id = :id AND event LIKE 'start%'")
_RECORD = text(
    f"INSERT INTO {RUNS_TABLE} (job_id, attempt, pid, event) VALUES (:id, :attempt, :pid, :event)"
)


def _record(job: Job, event: str) -> None:
    assert _engine is not None
    with _engine.begin() as connection:
        connection.execute(
            _RECORD, {"id": job.id, "attempt": job.attempt, "pid": os.getpid(), "event": event}
        )


def step(job: Job[MachineStep]) -> None:
    assert _engine is not None
    with _engine.begin() as connection:
        unmet = connection.scalar(_UNMET, {"id": job.id})
        runs_before = int(connection.scalar(_RUNS_BEFORE, {"id": job.id}) or 0)
    if unmet:
        _record(job, f"violation {unmet} dependencies not completed")
    _record(job, f"start {job.run_count}")
    plan = job.args.plan
    outcome = plan[runs_before] if runs_before < len(plan) else "complete"
    time.sleep(0.005)  # the step's work
    _record(job, f"end {job.run_count} {outcome}")
    if outcome == "fail":
        raise PlannedFailure("planned failure")
    if outcome == "cancel":
        raise JobCancel("planned cancel")
    if outcome == "snooze":
        raise JobSnooze(0.05)


def callback(job: Job[MachineCallback]) -> None:
    _record(job, f"start {job.run_count}")


def main() -> None:
    global _engine
    logging.basicConfig(
        level=logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(process)d %(threadName)s %(levelname)s %(name)s: %(message)s",
    )
    url = os.environ["SA_JOBS_TEST_URL"]
    engine = create_engine(url, pool_size=12)
    _engine = create_engine(url, pool_size=12)
    worker = Worker(
        engine,
        queues={QUEUE: 8},
        job_timeout=None,
        poll_interval=0.2,
        maintenance=MAINTENANCE,
        retry_policy=NO_DELAY,
        interrupt_grace=2.0,
        worker_id=os.environ.get("SA_JOBS_TEST_WORKER_ID"),
    )
    worker.handler(MachineStep)(step)
    worker.handler(MachineCallback)(callback)
    worker.run()
    engine.dispose()
    _engine.dispose()


if __name__ == "__main__":
    main()
