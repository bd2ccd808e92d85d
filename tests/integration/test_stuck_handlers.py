"""Handlers that ignore cancellation cannot starve the worker.

A sync handler stuck past its timeout and grace is settled without it, but keeps its
thread. The worker replaces stuck threads up to ``stuck_thread_limit``; past it, the
stuck job's slot stays taken and the worker fetches fewer jobs. Either way no job is
ever failed for a timeout it did not run into — which used to happen once stuck threads
filled the pool and freed slots dispatched jobs no thread picked up.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from sqlalchemy import Engine

import sa_jobs
from sa_jobs import Job, JobState
from tests.helpers import (
    AN_HOUR,
    add_jobs,
    get_job,
    make_worker,
    stuck_total,
    wait_for_state,
    wait_until,
)


@sa_jobs.job_args(kind="stuck_handler")
class Stuck:
    n: int


@sa_jobs.job_args(kind="stuck_quick")
class Quick:
    n: int


class Scenario:
    """One slot, a 1 s timeout, 0.5 s grace; ``Stuck`` handlers ignore every interruption
    until ``release`` is set. Records which jobs' handlers started."""

    def __init__(self, engine: Engine, **options: Any) -> None:
        self.release = threading.Event()
        self.started: set[int] = set()
        self.worker = make_worker(
            engine,
            queues={"default": 1},
            job_timeout=1.0,
            interrupt_grace=0.5,
            retry_policy=AN_HOUR,
            **options,
        )

        @self.worker.handler(Stuck)
        def stuck(job: Job) -> None:
            self.started.add(job.id)
            self.release.wait(60)  # ignores job.cancelled

        @self.worker.handler(Quick)
        def quick(job: Job) -> None:
            self.started.add(job.id)


def assert_no_job_timed_out_without_running(
    engine: Engine, ids: list[int], started: set[int]
) -> None:
    for job_id in ids:
        job = get_job(engine, job_id)
        if any("timed out" in error["error"] for error in job.errors):
            assert job_id in started, f"job {job_id} was failed for a timeout it never ran into"


def test_past_the_cap_a_stuck_jobs_slot_stays_taken_and_no_job_is_failed_unrun(
    engine: Engine,
) -> None:
    scenario = Scenario(engine)  # the cap: one stuck thread (the total concurrency)
    stuck = add_jobs(engine, [Stuck(n) for n in range(3)])
    quick = add_jobs(engine, [Quick(n) for n in range(3)])
    worker = scenario.worker
    worker.start()
    try:
        first = wait_for_state(engine, stuck[0], JobState.RETRYABLE, timeout=10)
        second = wait_for_state(engine, stuck[1], JobState.RETRYABLE, timeout=10)
        for job in (first, second):
            (error,) = job.errors
            assert "ran longer than its timeout of 1 s" in error["error"]
            assert "its thread abandoned" in error["error"]
        # Two threads are stuck; one was replaced (the cap), the second keeps the slot.
        assert worker.stuck_threads == 1
        wait_until(lambda: stuck_total(worker) == 2)
        time.sleep(1.5)  # longer than a timeout plus its grace: no other job may time out
        assert get_job(engine, stuck[2]).state is JobState.AVAILABLE
        assert all(get_job(engine, job_id).state is JobState.AVAILABLE for job_id in quick)
        assert_no_job_timed_out_without_running(engine, stuck + quick, scenario.started)

        # The stuck handlers return: their threads go back to work, the slot with them.
        scenario.release.set()
        for job_id in quick:
            wait_for_state(engine, job_id, JobState.COMPLETED, timeout=10)
        wait_for_state(engine, stuck[2], JobState.COMPLETED, timeout=10)
        wait_until(lambda: worker.stuck_threads == 0)
    finally:
        scenario.release.set()
        worker.stop(cancel=True)
    assert_no_job_timed_out_without_running(engine, stuck + quick, scenario.started)


def test_below_the_cap_stuck_threads_are_replaced_and_later_jobs_run(engine: Engine) -> None:
    scenario = Scenario(engine, stuck_thread_limit=3)
    stuck = add_jobs(engine, [Stuck(n) for n in range(3)])
    quick = add_jobs(engine, [Quick(n) for n in range(3)])
    worker = scenario.worker
    worker.start()
    try:
        for job_id in quick:
            wait_for_state(engine, job_id, JobState.COMPLETED, timeout=15)
        # All three handlers are still blocked, their runs settled without them.
        assert not scenario.release.is_set()
        assert worker.stuck_threads == 3
        for job_id in stuck:
            assert get_job(engine, job_id).state is JobState.RETRYABLE
        assert_no_job_timed_out_without_running(engine, stuck + quick, scenario.started)
    finally:
        scenario.release.set()
        worker.stop(cancel=True)
    assert scenario.started == set(stuck + quick)
