"""The threads sync handlers run in (:class:`sa_jobs.worker.pool.HandlerThreads`).

Every run gets a thread at once — an idle one, or a new one — so its timeout only starts
when its handler does. A run settled by the watchdog while its thread is still inside
the handler is *stuck*: up to ``stuck_limit`` stuck threads, its slot is released at
once (and the next job gets a new thread); past the limit, its slot stays taken until
the thread returns. Real threads; each handler here waits for the test to let it go.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import sa_jobs
from sa_jobs.worker.execution import Execution
from sa_jobs.worker.pool import HandlerThreads
from sa_jobs.worker.retry import DEFAULT_RETRY_POLICY
from tests.helpers import eventually


def an_execution(job_id: int) -> Execution:
    job = sa_jobs.Job(
        id=job_id,
        kind="pool.work",
        attempt=1,
        run_count=1,
        max_attempts=25,
        args_json={},
        errors=[],
    )
    return Execution(job, None, DEFAULT_RETRY_POLICY, lambda *_: None)


class Handlers:
    """A handler function that records where it ran and waits to be let go."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._started: dict[int, threading.Event] = {}
        self._release: dict[int, threading.Event] = {}
        self.thread_of: dict[int, str] = {}
        self.calls: list[tuple[int, tuple[Any, ...]]] = []

    def _event(self, events: dict[int, threading.Event], job_id: int) -> threading.Event:
        with self._lock:
            return events.setdefault(job_id, threading.Event())

    def __call__(self, execution: Execution, *args: Any) -> None:
        job_id = execution.job.id
        with self._lock:
            self.thread_of[job_id] = threading.current_thread().name
            self.calls.append((job_id, args))
        self._event(self._started, job_id).set()
        self._event(self._release, job_id).wait(5)

    def wait_started(self, job_id: int) -> None:
        assert self._event(self._started, job_id).wait(2), f"job {job_id} did not start"

    def let_go(self, *job_ids: int) -> None:
        for job_id in job_ids:
            self._event(self._release, job_id).set()

    def let_everything_go(self) -> None:
        with self._lock:
            known = set(self._started) | set(self._release)
        self.let_go(*known)


class Slots:
    """The pool's ``release_slot`` callback."""

    def __init__(self) -> None:
        self.released: list[int] = []

    def __call__(self, execution: Execution) -> None:
        self.released.append(execution.job.id)


@pytest.fixture
def handlers() -> Iterator[Handlers]:
    made = Handlers()
    yield made
    made.let_everything_go()


def a_pool(slots: Slots, stuck_limit: int = 1) -> HandlerThreads:
    return HandlerThreads("test-pool", stuck_limit, slots)


def idle_threads(pool: HandlerThreads) -> int:
    # No public signal says a thread is back in the idle set; read the count.
    return pool._idle


def run(pool: HandlerThreads, handlers: Handlers, job_id: int, *args: Any) -> Execution:
    """Submit job ``job_id`` and wait until its handler runs."""
    execution = an_execution(job_id)
    pool.submit(handlers, execution, *args)
    handlers.wait_started(job_id)
    return execution


# --------------------------------------------------------------------------- threads


def test_every_run_gets_a_thread_at_once_the_pool_growing_when_none_is_idle(
    handlers: Handlers,
) -> None:
    pool = a_pool(Slots())

    for job_id in (1, 2, 3):
        run(pool, handlers, job_id)

    assert pool.size == 3
    assert len(set(handlers.thread_of.values())) == 3
    assert all(name.startswith("test-pool-") for name in handlers.thread_of.values())


def test_an_idle_thread_is_reused_before_a_new_one_is_made(handlers: Handlers) -> None:
    pool = a_pool(Slots())

    for job_id in range(1, 6):
        handlers.let_go(job_id)
        run(pool, handlers, job_id)
        assert eventually(lambda: idle_threads(pool) == 1)

    assert pool.size == 1
    assert len(set(handlers.thread_of.values())) == 1


def test_the_function_gets_the_execution_and_the_extra_arguments(handlers: Handlers) -> None:
    pool = a_pool(Slots())
    handlers.let_go(1)

    run(pool, handlers, 1, "engine", 42)

    assert handlers.calls == [(1, ("engine", 42))]


def test_a_run_is_in_its_handler_only_while_its_function_runs(handlers: Handlers) -> None:
    pool = a_pool(Slots())
    execution = run(pool, handlers, 1)
    assert execution.in_handler

    handlers.let_go(1)

    assert eventually(lambda: not execution.in_handler)


def test_an_unexpected_error_is_logged_and_the_thread_goes_back_to_work(
    handlers: Handlers, caplog: pytest.LogCaptureFixture
) -> None:
    pool = a_pool(Slots())

    def broken(execution: Execution) -> None:
        raise RuntimeError("a bug in run_sync")

    pool.submit(broken, an_execution(1))
    assert eventually(lambda: idle_threads(pool) == 1)
    handlers.let_go(2)
    run(pool, handlers, 2)

    assert "unexpected error running job 1" in caplog.text
    assert pool.size == 1


def test_shutdown_ends_idle_threads_now_and_busy_ones_after_their_run(
    handlers: Handlers,
) -> None:
    pool = a_pool(Slots())
    run(pool, handlers, 1)  # stays busy
    handlers.let_go(2)
    run(pool, handlers, 2)  # a second thread, idle once job 2 returns
    assert eventually(lambda: idle_threads(pool) == 1)
    assert pool.size == 2

    pool.shutdown()

    assert eventually(lambda: pool.size == 1)
    handlers.let_go(1)
    assert eventually(lambda: pool.size == 0)


# --------------------------------------------------------------------------- stuck threads


def test_a_run_settled_outside_its_handler_frees_its_slot_and_is_not_stuck() -> None:
    slots = Slots()
    pool = a_pool(slots)
    waiting = an_execution(1)  # settled (a shutdown) before any thread took it

    pool.settled_without_thread(waiting)

    assert slots.released == [1]
    assert (pool.stuck, pool.stuck_total, waiting.stuck) == (0, 0, False)


def test_stuck_threads_free_their_slots_up_to_the_limit_then_hold_them_until_they_return(
    handlers: Handlers, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sa_jobs.worker")
    slots = Slots()
    pool = a_pool(slots, stuck_limit=1)
    first = run(pool, handlers, 1)
    second = run(pool, handlers, 2)

    # Within the limit: counted stuck, slot freed at once, and the next job gets a thread.
    pool.settled_without_thread(first)
    assert slots.released == [1]
    assert (pool.stuck, pool.stuck_total) == (1, 1)
    assert first.stuck and first.counted_stuck and not first.slot_held
    run(pool, handlers, 3)
    assert pool.size == 3

    # Past the limit: the slot stays taken.
    pool.settled_without_thread(second)
    assert slots.released == [1]
    assert pool.stuck_total == 2
    assert second.stuck and second.slot_held
    assert "its slot stays taken (1 threads are stuck already)" in caplog.text

    # ...until its thread returns.
    handlers.let_go(2)
    assert eventually(lambda: slots.released == [1, 2])
    assert eventually(lambda: "the stuck handler of job 2 (pool.work) returned" in caplog.text)

    # A returning thread within the limit is counted out; its slot is not freed twice.
    handlers.let_go(1)
    assert eventually(lambda: pool.stuck == 0)
    assert eventually(lambda: not first.in_handler)
    assert slots.released == [1, 2]
    assert pool.stuck_total == 2
    assert "job 1 (pool.work) is stuck in its handler" in caplog.text


def test_with_a_stuck_limit_of_zero_every_stuck_run_holds_its_slot(handlers: Handlers) -> None:
    slots = Slots()
    pool = a_pool(slots, stuck_limit=0)
    execution = run(pool, handlers, 1)

    pool.settled_without_thread(execution)

    assert slots.released == []
    assert execution.slot_held
    handlers.let_go(1)
    assert eventually(lambda: slots.released == [1])


def test_a_freed_slot_goes_to_a_thread_that_came_back_from_being_stuck(
    handlers: Handlers,
) -> None:
    slots = Slots()
    pool = a_pool(slots, stuck_limit=1)
    stuck = run(pool, handlers, 1)
    pool.settled_without_thread(stuck)
    handlers.let_go(1)
    assert eventually(lambda: idle_threads(pool) == 1)

    handlers.let_go(2)
    run(pool, handlers, 2)

    assert handlers.thread_of[2] == handlers.thread_of[1]
    assert pool.size == 1
