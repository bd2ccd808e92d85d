"""A worker is an object you can start again, and stop from any thread at any time."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import Engine, event

import sa_jobs
from sa_jobs import Job, JobState
from sa_jobs.errors import InvalidOptionsError
from tests.helpers import (
    add_job,
    fetching_stopped,
    make_worker,
    wait_for_state,
    wait_until,
)


@sa_jobs.job_args(kind="lifecycle_job")
class Step:
    n: int = 0


def counting_worker(engine: Engine) -> tuple[sa_jobs.Worker, list[int]]:
    worker = make_worker(engine)
    ran: list[int] = []

    @worker.handler(Step)
    def step(job: Job) -> None:
        ran.append(job.args.n)

    return worker, ran


def test_run_until_idle_can_be_called_again(engine: Engine) -> None:
    worker, ran = counting_worker(engine)
    add_job(engine, Step(1))
    worker.run_until_idle()
    add_job(engine, Step(2))
    worker.run_until_idle()
    assert ran == [1, 2]
    assert not worker.is_running


def test_a_stopped_worker_starts_again_with_its_handlers(engine: Engine) -> None:
    worker, ran = counting_worker(engine)
    first = add_job(engine, Step(1))
    worker.start()
    wait_for_state(engine, first, JobState.COMPLETED)
    worker.stop()
    second = add_job(engine, Step(2))
    worker.start()
    try:
        wait_for_state(engine, second, JobState.COMPLETED)
    finally:
        worker.stop()
    assert ran == [1, 2]


def test_starting_a_running_worker_is_refused(engine: Engine) -> None:
    worker, _ = counting_worker(engine)
    worker.start()
    try:
        with pytest.raises(InvalidOptionsError, match="running already"):
            worker.start()
    finally:
        worker.stop()


def test_stop_before_start_and_stop_twice_do_nothing(engine: Engine) -> None:
    worker, _ = counting_worker(engine)
    worker.stop()
    worker.start()
    worker.stop()
    worker.stop()
    assert not worker.is_running


def test_stop_called_while_start_is_starting_stops_it_cleanly(engine: Engine) -> None:
    worker, _ = counting_worker(engine)
    in_start = threading.Event()
    proceed = threading.Event()

    # Hold start() at its first database round trip, then call stop() from here.
    def hold(*_args: object) -> None:
        if threading.current_thread().name == "starter" and not in_start.is_set():
            in_start.set()
            proceed.wait(10)

    event.listen(engine, "before_cursor_execute", hold)
    errors: list[BaseException] = []

    def start() -> None:
        try:
            worker.start()
        except BaseException as exc:
            errors.append(exc)

    starter = threading.Thread(target=start, name="starter")
    try:
        starter.start()
        assert in_start.wait(10)
        stopper = threading.Thread(target=worker.stop)
        stopper.start()
        time.sleep(0.2)  # time for a stop() that did not wait for start() to return
        assert stopper.is_alive()
        proceed.set()
        starter.join(10)
        stopper.join(20)
        assert not stopper.is_alive()
    finally:
        proceed.set()
        event.remove(engine, "before_cursor_execute", hold)
    assert errors == []
    assert not worker.is_running
    # ... and it can still start afterwards.
    job_id = add_job(engine, Step(3))
    worker.start()
    try:
        wait_for_state(engine, job_id, JobState.COMPLETED)
    finally:
        worker.stop()
    wait_until(lambda: not worker.is_running)


def test_run_until_idle_returns_when_stopped_from_another_thread(engine: Engine) -> None:
    """A script's drain can be stopped (by a signal handler or another thread): running
    jobs finish, the rest stays queued, and run_until_idle returns instead of polling
    a stopped worker."""
    release = threading.Event()
    started = threading.Event()
    worker = make_worker(engine, queues={"default": 1})

    @worker.handler(Step)
    def step(job: Job[Step]) -> None:
        started.set()
        release.wait(10)

    first = add_job(engine, Step(1))
    second = add_job(engine, Step(2))
    drain = threading.Thread(target=worker.run_until_idle, kwargs={"timeout": 30})
    drain.start()
    assert started.wait(5)
    stopper = threading.Thread(target=worker.stop)
    stopper.start()
    wait_until(lambda: fetching_stopped(worker), what="the stop to reach the producers")
    release.set()
    drain.join(10)
    stopper.join(10)
    assert not drain.is_alive(), "run_until_idle kept polling a stopped worker"
    assert wait_for_state(engine, first, JobState.COMPLETED)
    assert wait_for_state(engine, second, JobState.AVAILABLE)
