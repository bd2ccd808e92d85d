"""Run time limits: how a handler's timeout is chosen, and what happens when a run
exceeds it — async handlers are cancelled for real, sync ones are asked to stop and, if
they do not, settled by the watchdog without them."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import threading
import time
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import Job, JobState, Worker
from sa_jobs._declare.args import kind_of
from sa_jobs._declare.options import UNSET
from sa_jobs.errors import InvalidOptionsError, JobTimeoutError
from tests.helpers import (
    AN_HOUR,
    NO_DELAY,
    add_job,
    add_jobs,
    effects,
    get_job,
    make_worker,
    reset_effects,
    running,
    wait_event,
    wait_for_state,
    wait_stuck_handlers_returned,
    wait_until,
    write_effect,
    write_effect_async,
)


@sa_jobs.job_args(kind="timeouts_plain")
class Plain:
    n: int = 0


@sa_jobs.job_args(kind="timeouts_kind_default", timeout=dt.timedelta(seconds=7))
class KindDefault:
    n: int = 0


@sa_jobs.job_args(kind="timeouts_kind_unlimited", timeout=None)
class KindUnlimited:
    n: int = 0


def timeout_error(timeout: float) -> str:
    return f"ran longer than its timeout of {timeout:g} s"


# ------------------------------------------------------------------ which timeout applies


def handler_timeout(worker: Worker, args_class: type, **handler_options: Any) -> Any:
    @worker.handler(args_class, **handler_options)
    def handle(job: Job) -> None:
        pass

    return worker.handlers.get(kind_of(args_class).name).timeout


def test_the_default_job_timeout_is_one_minute(engine: Engine) -> None:
    assert handler_timeout(Worker(engine), Plain) == dt.timedelta(minutes=1)


S = dt.timedelta(seconds=1)


@pytest.mark.parametrize(
    ("worker_timeout", "args_class", "handler_timeout_option", "expected"),
    [
        pytest.param(10, Plain, UNSET, 10 * S, id="worker default"),
        pytest.param(dt.timedelta(seconds=10), Plain, UNSET, 10 * S, id="worker timedelta"),
        pytest.param(10, KindDefault, UNSET, 7 * S, id="args class beats worker"),
        pytest.param(10, KindDefault, 3, 3 * S, id="handler beats args class"),
        pytest.param(10, KindDefault, None, None, id="handler None means no limit"),
        pytest.param(10, KindUnlimited, UNSET, None, id="args class None means no limit"),
        pytest.param(None, Plain, UNSET, None, id="worker None means no limit"),
        pytest.param(-1, Plain, UNSET, None, id="worker negative means no limit"),
        pytest.param(10, Plain, -1, None, id="handler negative means no limit"),
        pytest.param(10, Plain, -S, None, id="handler negative timedelta"),
        pytest.param(None, KindDefault, UNSET, 7 * S, id="args class without worker limit"),
    ],
)
def test_a_handlers_timeout_comes_from_the_handler_then_the_args_class_then_the_worker(
    engine: Engine,
    worker_timeout: Any,
    args_class: type,
    handler_timeout_option: Any,
    expected: dt.timedelta | None,
) -> None:
    worker = Worker(engine, job_timeout=worker_timeout)
    options = {} if handler_timeout_option is UNSET else {"timeout": handler_timeout_option}
    assert handler_timeout(worker, args_class, **options) == expected


def test_a_zero_timeout_is_refused(engine: Engine) -> None:
    with pytest.raises(InvalidOptionsError, match="use None for no limit"):
        handler_timeout(Worker(engine), Plain, timeout=0)
    with pytest.raises(InvalidOptionsError):
        Worker(engine, job_timeout=0)


def test_without_a_timeout_a_handler_runs_past_the_workers_default(engine: Engine) -> None:
    job_id = add_job(engine, Plain())
    worker = make_worker(engine, job_timeout=0.2)

    @worker.handler(Plain, timeout=None)
    def slow(job: Job) -> None:
        for _ in range(50):
            time.sleep(0.01)  # half a second of work in small steps
            job.check_cancelled()

    worker.run_until_idle()

    assert get_job(engine, job_id).state is JobState.COMPLETED


# ------------------------------------------------------------------ async handlers


def test_an_async_handler_past_its_timeout_is_cancelled_and_the_job_is_retryable(
    engine: Engine,
) -> None:
    job_id = add_job(engine, Plain())
    events: list[str] = []
    # A long grace: the run must end because the task was cancelled, not because the
    # watchdog gave up on it.
    worker = make_worker(engine, interrupt_grace=5.0)

    @worker.handler(Plain, timeout=0.2)
    async def sleepy(job: Job) -> None:
        events.append("started")
        try:
            await asyncio.sleep(3)
        except asyncio.CancelledError:
            events.append("cancelled")
            raise
        events.append("woke up")

    started = time.monotonic()
    worker.run_until_idle()
    elapsed = time.monotonic() - started

    assert events == ["started", "cancelled"]
    assert elapsed < 1.5
    job = get_job(engine, job_id)
    assert (job.state, job.attempt) == (JobState.RETRYABLE, 1)
    assert job.finalized_at is None
    error = job.errors[0]["error"]
    assert error.startswith(f"JobTimeoutError: job {job_id} was timed out")
    assert timeout_error(0.2) in error


def test_a_timed_out_async_job_is_discarded_when_it_was_its_last_attempt(
    engine: Engine,
) -> None:
    job_id = add_job(engine, Plain(), max_attempts=1)
    worker = make_worker(engine)

    @worker.handler(Plain, timeout=0.2)
    async def sleepy(job: Job) -> None:
        await asyncio.sleep(3)

    worker.run_until_idle()

    job = get_job(engine, job_id)
    assert job.state is JobState.DISCARDED
    assert job.finalized_at is not None
    assert job.errors[0]["error"].startswith("JobTimeoutError")


def test_an_async_handler_that_swallows_its_timeout_cancellation_still_fails(
    engine: Engine,
) -> None:
    # A timeout is a failure even if the handler returns after it (docs/dev/decisions.md).
    job_id = add_job(engine, Plain())
    worker = make_worker(engine, retry_policy=AN_HOUR, interrupt_grace=5.0)

    @worker.handler(Plain, timeout=0.2)
    async def swallows(job: Job) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(3)

    worker.run_until_idle()

    job = get_job(engine, job_id)
    assert (job.state, job.attempt) == (JobState.RETRYABLE, 1)
    assert [e["error"].split(":")[0] for e in job.errors] == ["JobTimeoutError"]


def test_an_async_session_handler_that_swallows_its_timeout_does_not_commit_its_writes(
    engine: Engine,
) -> None:
    reset_effects(engine)
    job_id = add_job(engine, Plain())
    worker = make_worker(engine, retry_policy=AN_HOUR, interrupt_grace=5.0)

    @worker.handler(Plain, timeout=0.2)
    async def swallows(job: Job, session: AsyncSession) -> None:
        await write_effect_async(session, job, "after timeout")
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(3)

    worker.run_until_idle()

    job = get_job(engine, job_id)
    assert (job.state, job.attempt) == (JobState.RETRYABLE, 1)
    assert [e["error"].split(":")[0] for e in job.errors] == ["JobTimeoutError"]
    assert effects(engine) == []


# ------------------------------------------------------------------ sync handlers


def test_a_sync_handler_that_checks_for_cancellation_stops_at_its_timeout(
    engine: Engine,
) -> None:
    job_id = add_job(engine, Plain())
    steps: list[int] = []
    raised: list[type[BaseException]] = []
    worker = make_worker(engine, interrupt_grace=5.0)

    @worker.handler(Plain, timeout=0.2)
    def polite(job: Job) -> None:
        try:
            for step in range(300):
                job.check_cancelled()
                steps.append(step)
                time.sleep(0.01)  # three seconds of work in small steps
        except BaseException as exc:
            raised.append(type(exc))
            raise

    started = time.monotonic()
    worker.run_until_idle()
    elapsed = time.monotonic() - started

    assert raised == [JobTimeoutError]
    assert 5 < len(steps) < 100  # stopped near 0.2 s, far from the 3 s of work
    assert elapsed < 1.5  # ended by the handler, well before the 5 s grace
    job = get_job(engine, job_id)
    assert job.state is JobState.RETRYABLE
    assert job.errors[0]["error"].startswith(f"JobTimeoutError: job {job_id} was timed out")


def test_a_sync_handler_sees_job_cancelled_turn_true_at_its_timeout(engine: Engine) -> None:
    job_id = add_job(engine, Plain())
    flags: list[bool] = []
    worker = make_worker(engine, interrupt_grace=5.0)

    @worker.handler(Plain, timeout=0.2)
    def polite(job: Job) -> None:
        flags.append(job.cancelled)
        deadline = time.monotonic() + 3
        while not job.cancelled and time.monotonic() < deadline:
            time.sleep(0.01)  # a handler that looks at job.cancelled between steps
        flags.append(job.cancelled)

    worker.run_until_idle()

    # Returning after the timeout does not make the run a success.
    assert flags == [False, True]
    job = get_job(engine, job_id)
    assert job.state is JobState.RETRYABLE
    assert job.errors[0]["error"].startswith("JobTimeoutError")


def test_a_sync_handler_that_ignores_its_timeout_is_settled_by_the_watchdog_after_grace(
    engine: Engine,
) -> None:
    # Concurrency 1: the stuck job's slot must be freed for the next job.
    stuck_id, next_id = add_jobs(engine, [Plain(n=1), Plain(n=2)])
    woke_up = threading.Event()
    worker = make_worker(engine, queues={"default": 1}, retry_policy=AN_HOUR, interrupt_grace=0.3)

    @worker.handler(Plain, timeout=0.2)
    def stubborn(job: Job) -> None:
        if job.args.n == 1:
            time.sleep(1.2)  # never looks at job.cancelled
            woke_up.set()

    with running(worker):
        started = time.monotonic()
        job = wait_for_state(engine, stuck_id, JobState.RETRYABLE, timeout=3)
        settled_after = time.monotonic() - started
        # Settled at timeout + grace (0.5 s) while the thread is still asleep.
        assert not woke_up.is_set()
        assert 0.4 < settled_after < 1.1
        assert job.attempt == 1
        assert [e["error"].split(":")[0] for e in job.errors] == ["JobTimeoutError"]
        # ... and the slot it held went to the next job.
        wait_for_state(engine, next_id, JobState.COMPLETED, timeout=3)
        assert not woke_up.is_set()

        wait_event(woke_up, "the stuck handler to return", timeout=3)
        # Its late result is dealt with; stopping the worker writes whatever it submitted.
        wait_stuck_handlers_returned(worker)

    # The late return changed nothing: still the timeout failure, not completed.
    job = get_job(engine, stuck_id)
    assert (job.state, job.attempt) == (JobState.RETRYABLE, 1)
    assert len(job.errors) == 1
    assert job.finalized_at is None


def test_the_late_return_of_a_timed_out_run_does_not_touch_its_completed_rerun(
    engine: Engine,
) -> None:
    job_id = add_job(engine, Plain(), max_attempts=5)
    woke_up = threading.Event()
    release = threading.Event()
    attempts: list[int] = []
    worker = make_worker(engine, retry_policy=NO_DELAY, interrupt_grace=0.2)

    @worker.handler(Plain, timeout=0.2)
    def handle(job: Job) -> None:
        attempts.append(job.attempt)
        if job.attempt == 1:
            # Settled by the watchdog at 0.4 s and rerun at once; it returns only once
            # the rerun has completed (an event, not a sleep: no race on a loaded machine).
            release.wait(10)
            woke_up.set()

    with running(worker):
        wait_for_state(engine, job_id, JobState.COMPLETED, timeout=5)
        assert not woke_up.is_set()
        release.set()
        wait_event(woke_up, "attempt 1 to return", timeout=5)
        # Its late result is dealt with; stopping the worker writes whatever it submitted.
        wait_stuck_handlers_returned(worker)

    job = get_job(engine, job_id)
    assert attempts == [1, 2]
    assert (job.state, job.attempt) == (JobState.COMPLETED, 2)
    assert [(e["attempt"], e["error"].split(":")[0]) for e in job.errors] == [
        (1, "JobTimeoutError")
    ]


# ------------------------------------------------------------------ handlers with a session


@pytest.mark.parametrize(
    "sleep",
    [
        pytest.param(0.35, id="returns within the grace period"),
        pytest.param(0.8, id="returns after the watchdog settled it"),
    ],
)
def test_a_session_handler_that_finishes_after_its_timeout_does_not_commit_its_writes(
    engine: Engine, sleep: float
) -> None:
    reset_effects(engine)
    job_id = add_job(engine, Plain())
    returned = threading.Event()
    worker = make_worker(engine, retry_policy=AN_HOUR, interrupt_grace=0.3)

    @worker.handler(Plain, timeout=0.2)
    def slow_writer(job: Job, session: Session) -> None:
        write_effect(session, job, "late")
        time.sleep(sleep)  # ignores cancellation
        returned.set()

    with running(worker):
        job = wait_for_state(engine, job_id, JobState.RETRYABLE, timeout=3)
        wait_event(returned, "the handler to return", timeout=3)
        # The worker would commit right after the return; give it the chance.
        wait_until(lambda: not _in_transaction(engine), timeout=3, what="the handler's rollback")

    assert effects(engine) == []
    job = get_job(engine, job_id)
    assert (job.state, job.attempt) == (JobState.RETRYABLE, 1)
    assert [e["error"].split(":")[0] for e in job.errors] == ["JobTimeoutError"]


def _in_transaction(engine: Engine) -> bool:
    """Is any other connection to this database inside a transaction right now?"""
    with engine.connect() as connection:
        count = connection.scalar(
            text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid() AND state LIKE 'idle in transaction%'"
            )
        )
    return bool(count)
