"""One run of one job (:class:`sa_jobs.worker.execution.Execution`), without a database.

What a handler does becomes an outcome: it returns (completed), raises (failed, retried
after the retry policy's delay), snoozes, cancels itself, or is interrupted by a
timeout, a cancel or a shutdown. Exactly one party settles a run — the thread that ran
the handler or the watchdog — and a handler sees an interruption through
``job.cancelled`` / ``job.check_cancelled()``. Sync handlers without a session are run
here through :func:`run_sync` itself, which needs no engine for them.
"""

from __future__ import annotations

import asyncio
import collections
import datetime as dt
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import sa_jobs
from sa_jobs._base.records import Ending, Outcome
from sa_jobs._declare.args import kind_of
from sa_jobs._table.models import Job
from sa_jobs.errors import (
    JobCancel,
    JobCancelledError,
    JobInterruptedError,
    JobSnooze,
    JobTimeoutError,
    WorkerShutdownError,
)
from sa_jobs.worker.execution import Execution, Interrupt
from sa_jobs.worker.handler_runs import run_async, run_sync
from sa_jobs.worker.handlers import Handler

JOB_ID = 7


@sa_jobs.job_args(kind="execution.work", registry=sa_jobs.KindRegistry())
class Work:
    n: int = 0


class FixedDelay:
    """A retry policy that always answers ``seconds``."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def next_delay(self, job: Job) -> dt.timedelta:
        return dt.timedelta(seconds=self.seconds)

    def __repr__(self) -> str:
        return f"FixedDelay({self.seconds})"


WORKER_POLICY = FixedDelay(3)


class Settlements:
    """The ``settle`` callback of an execution: records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[Execution, Outcome | None, bool]] = []
        self._lock = threading.Lock()

    def __call__(self, execution: Execution, outcome: Outcome | None, by_runner: bool) -> None:
        with self._lock:
            self.calls.append((execution, outcome, by_runner))

    @property
    def only(self) -> tuple[Outcome, bool]:
        """The one outcome written, and whether the runner wrote it."""
        assert len(self.calls) == 1, self.calls
        _, outcome, by_runner = self.calls[0]
        assert outcome is not None
        return outcome, by_runner


def a_job(job_id: int = JOB_ID, *, attempt: int = 1, run_count: int | None = None) -> Job:
    return sa_jobs.Job(
        id=job_id,
        kind=kind_of(Work).name,
        attempt=attempt,
        run_count=attempt if run_count is None else run_count,
        max_attempts=25,
        args_json={},
        errors=[],
    )


def a_handler(
    function: Callable[..., Any] = lambda job: None,
    *,
    timeout: float | None = None,
    retry_policy: Any = None,
    is_async: bool = False,
) -> Handler:
    return Handler(
        kind=kind_of(Work),
        function=function,
        is_async=is_async,
        wants_session=False,
        timeout=dt.timedelta(seconds=timeout) if timeout is not None else None,
        retry_policy=retry_policy,
    )


def an_execution(
    function: Callable[..., Any] = lambda job: None,
    *,
    job: Job | None = None,
    timeout: float | None = 0.5,
    retry_policy: Any = None,
) -> tuple[Execution, Settlements]:
    settled = Settlements()
    handler = a_handler(function, timeout=timeout, retry_policy=retry_policy)
    return Execution(job or a_job(), handler, WORKER_POLICY, settled), settled


def run(function: Callable[..., Any], **options: Any) -> tuple[Outcome, bool]:
    """Run ``function`` as a sync handler to its end; the outcome it was settled with."""
    execution, settled = an_execution(function, **options)
    run_sync(execution, None)  # type: ignore[arg-type]  # no session: no engine needed
    return settled.only


def raises(exc: BaseException) -> Callable[[Job], None]:
    def handler(job: Job) -> None:
        raise exc

    return handler


# --------------------------------------------------------------------------- outcomes


def test_a_handler_that_returns_completes_the_run() -> None:
    seen: list[object] = []
    job = a_job(attempt=2, run_count=5)
    job.args_json = {"n": 4}

    outcome, by_runner = run(lambda job: seen.append(job.args), job=job)

    assert seen == [Work(4)]
    assert outcome == Outcome(JOB_ID, 5, Ending.COMPLETED)
    assert by_runner is True


def test_a_handler_that_raises_fails_the_attempt_with_the_policys_delay_and_its_error() -> None:
    def broken(job: Job) -> None:
        raise ValueError("boom")

    outcome, by_runner = run(broken, job=a_job(attempt=3))

    assert (outcome.ending, outcome.delay, by_runner) == (Ending.FAILED, 3.0, True)
    assert outcome.error is not None
    assert outcome.error["attempt"] == 3
    assert outcome.error["error"] == "ValueError: boom"
    assert "in broken" in outcome.error["trace"]
    assert outcome.error["trace"].rstrip().endswith("ValueError: boom")


def test_a_snooze_runs_the_job_again_after_its_delay_without_an_error() -> None:
    outcome, _ = run(raises(JobSnooze(dt.timedelta(seconds=30))))
    assert (outcome.ending, outcome.delay, outcome.error) == (Ending.SNOOZED, 30.0, None)


def test_a_handler_that_cancels_its_job_ends_it_for_good_saying_why() -> None:
    outcome, _ = run(raises(JobCancel("the account is closed")), job=a_job(attempt=2))

    assert (outcome.ending, outcome.delay) == (Ending.CANCELLED, None)
    assert outcome.error == {"attempt": 2, "error": "JobCancel: the account is closed"}


def test_a_snooze_that_is_out_of_range_fails_the_attempt_with_the_reason() -> None:
    def snoozes_badly(job: Job) -> None:
        raise JobSnooze(-1)

    outcome, _ = run(snoozes_badly)

    assert outcome.ending is Ending.FAILED
    assert outcome.error is not None
    assert outcome.error["error"].startswith("InvalidOptionsError: snooze delay")


def test_a_kind_without_a_handler_fails_the_attempt_saying_so() -> None:
    settled = Settlements()
    execution = Execution(a_job(), None, WORKER_POLICY, settled)

    run_sync(execution, None)  # type: ignore[arg-type]

    outcome, _ = settled.only
    assert (outcome.ending, outcome.delay) == (Ending.FAILED, 3.0)
    assert outcome.error is not None
    assert outcome.error["error"].startswith("NoHandlerError: this worker has no handler")


def test_args_that_no_longer_convert_fail_the_attempt_before_the_handler_runs() -> None:
    called: list[Job] = []
    job = a_job()
    job.args_json = {"n": "many"}

    outcome, _ = run(called.append, job=job)

    assert called == []
    assert outcome.ending is Ending.FAILED
    assert outcome.error is not None
    assert "stored args do not convert to Work" in outcome.error["error"]


# --------------------------------------------------------------------------- interruptions


def start(function: Callable[[Job], None], **options: Any) -> tuple[Execution, Settlements, Any]:
    """Run ``function`` as a sync handler on a thread of its own."""
    execution, settled = an_execution(function, **options)
    thread = threading.Thread(target=run_sync, args=(execution, None), daemon=True)
    thread.start()
    return execution, settled, thread


def waits_until_asked_to_stop(
    then: Callable[[Job], None],
) -> tuple[Callable[[Job], None], threading.Event]:
    """A handler that signals it started, waits until interrupted, then does ``then``."""
    running = threading.Event()

    def handler(job: Job) -> None:
        running.set()
        deadline = time.monotonic() + 5
        while not job.cancelled and time.monotonic() < deadline:
            time.sleep(0.001)
        then(job)

    return handler, running


def check_cancelled(job: Job) -> None:
    job.check_cancelled()


@pytest.mark.parametrize(
    ("reason", "ending", "error", "delay"),
    [
        (
            Interrupt.TIMEOUT,
            Ending.FAILED,
            "JobTimeoutError: job 7 was timed out: ran longer than its timeout of 0.5 s",
            3.0,
        ),
        (Interrupt.CANCELLED, Ending.CANCELLED, "JobCancelledError: job 7 was cancelled", None),
        (Interrupt.SHUTDOWN, Ending.RETURNED, None, None),
    ],
    ids=["timeout", "cancel", "shutdown"],
)
def test_a_handler_that_stops_when_interrupted_ends_the_way_the_interruption_says(
    reason: Interrupt, ending: Ending, error: str | None, delay: float | None
) -> None:
    handler, running = waits_until_asked_to_stop(check_cancelled)
    execution, settled, thread = start(handler)
    assert running.wait(5)

    execution.interrupt(reason)
    thread.join(5)

    outcome, by_runner = settled.only
    assert (outcome.ending, outcome.delay, by_runner) == (ending, delay, True)
    if error is None:
        assert outcome.error is None
    else:
        assert outcome.error == {"attempt": 1, "error": error}  # no trace: not a bug


@pytest.mark.parametrize(
    "then",
    [lambda job: None, raises(KeyError("unrelated"))],
    ids=["returns-late", "raises-something-else"],
)
def test_a_timed_out_attempt_is_a_timeout_failure_whatever_the_handler_does_after(
    then: Callable[[Job], None],
) -> None:
    handler, running = waits_until_asked_to_stop(then)
    execution, settled, thread = start(handler)
    assert running.wait(5)

    execution.interrupt(Interrupt.TIMEOUT)
    thread.join(5)

    outcome, _ = settled.only
    assert outcome.ending is Ending.FAILED
    assert outcome.error is not None
    assert outcome.error["error"].startswith("JobTimeoutError: job 7 was timed out")


def test_an_async_handler_is_cancelled_for_real() -> None:
    reached_the_end: list[bool] = []

    async def sleeps(job: Job) -> None:
        await asyncio.sleep(10)
        reached_the_end.append(True)

    settled = Settlements()
    handler = a_handler(sleeps, timeout=0.5, is_async=True)
    execution = Execution(a_job(), handler, WORKER_POLICY, settled)

    async def main() -> None:
        task = asyncio.create_task(run_async(execution, lambda: None))  # type: ignore[arg-type,return-value]
        await asyncio.sleep(0.01)
        execution.interrupt(Interrupt.TIMEOUT)
        await asyncio.wait_for(task, 5)

    started = time.monotonic()
    asyncio.run(main())

    assert time.monotonic() - started < 2
    assert reached_the_end == []
    outcome, _ = settled.only
    assert outcome.ending is Ending.FAILED
    assert outcome.error is not None
    assert outcome.error["error"].startswith("JobTimeoutError")


@pytest.mark.parametrize(
    ("reason", "error_class"),
    [
        (Interrupt.TIMEOUT, JobTimeoutError),
        (Interrupt.CANCELLED, JobCancelledError),
        (Interrupt.SHUTDOWN, WorkerShutdownError),
    ],
)
def test_an_interrupted_job_says_so_and_check_cancelled_raises_the_reason(
    reason: Interrupt, error_class: type[JobInterruptedError]
) -> None:
    execution, _ = an_execution()
    job = execution.job
    assert not job.cancelled
    job.check_cancelled()

    execution.interrupt(reason)

    assert job.cancelled
    assert execution.interrupt_reason is reason
    with pytest.raises(error_class) as exc:
        job.check_cancelled()
    assert type(exc.value) is error_class
    assert isinstance(exc.value, JobInterruptedError)
    assert exc.value.job_id == JOB_ID


def test_a_job_no_worker_runs_is_never_cancelled() -> None:
    job = a_job()
    assert not job.cancelled
    job.check_cancelled()


def test_the_first_interruption_is_the_one_that_counts() -> None:
    execution, _ = an_execution()

    execution.interrupt(Interrupt.TIMEOUT)
    execution.interrupt(Interrupt.CANCELLED)

    assert execution.interrupt_reason is Interrupt.TIMEOUT
    with pytest.raises(JobTimeoutError):
        execution.job.check_cancelled()


def test_interrupting_a_settled_run_does_nothing() -> None:
    execution, _ = an_execution()
    assert execution.try_finish()

    execution.interrupt(Interrupt.CANCELLED)

    assert not execution.job.cancelled
    assert execution.interrupt_reason is None


@pytest.mark.parametrize(
    ("is_async", "says_thread"),
    [(False, True), (True, False)],
    ids=["sync", "async"],
)
def test_an_abandoned_run_says_its_handler_did_not_stop_within_the_grace(
    is_async: bool, says_thread: bool
) -> None:
    handler = a_handler(timeout=2, is_async=is_async)
    execution = Execution(a_job(), handler, WORKER_POLICY, Settlements())

    outcome = execution.outcome_for_interrupt(Interrupt.TIMEOUT, abandoned=True)

    assert outcome.error is not None
    message = outcome.error["error"]
    assert "ran longer than its timeout of 2 s" in message
    assert "did not stop within the worker's interrupt_grace" in message
    assert ("its thread abandoned" in message) is says_thread


# --------------------------------------------------------------------------- begin


def test_begin_starts_the_timeout_when_the_handler_starts() -> None:
    begun: list[Execution] = []
    execution = Execution(
        a_job(), a_handler(timeout=30), WORKER_POLICY, Settlements(), begun.append
    )
    assert (execution.started, execution.deadline) == (None, None)

    before = time.monotonic()
    assert execution.begin()

    assert execution.started is not None
    assert before <= execution.started <= time.monotonic()
    assert execution.deadline == execution.started + 30
    assert begun == [execution]


@pytest.mark.parametrize(
    "handler", [a_handler(timeout=None), None], ids=["no-timeout", "no-handler"]
)
def test_a_run_without_a_timeout_has_no_deadline(handler: Handler | None) -> None:
    execution = Execution(a_job(), handler, WORKER_POLICY, Settlements())
    assert execution.begin()
    assert execution.started is not None
    assert execution.deadline is None


def test_begin_refuses_a_run_that_was_settled_already() -> None:
    begun: list[Execution] = []
    called: list[Job] = []
    settled = Settlements()
    execution = Execution(
        a_job(), a_handler(called.append, timeout=30), WORKER_POLICY, settled, begun.append
    )
    assert execution.try_finish()  # a shutdown settled it while it waited for a thread

    assert not execution.begin()
    run_sync(execution, None)  # type: ignore[arg-type]

    assert (execution.started, execution.deadline) == (None, None)
    assert begun == []
    assert called == []
    assert settled.calls == []


# --------------------------------------------------------------------------- settling


def test_exactly_one_of_many_racing_threads_settles_each_run() -> None:
    settled = Settlements()
    executions = [Execution(a_job(n), None, WORKER_POLICY, settled) for n in range(300)]
    racers = 8
    barrier = threading.Barrier(racers)

    def race(name: int) -> None:
        barrier.wait()
        for execution in executions:
            if execution.try_finish():
                execution.settle(None, by_runner=name == 0)

    threads = [threading.Thread(target=race, args=(n,)) for n in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)

    times_settled = collections.Counter(id(execution) for execution, _, _ in settled.calls)
    assert len(settled.calls) == len(executions)
    assert set(times_settled.values()) == {1}
    assert all(execution.finished for execution in executions)
    assert not any(execution.try_finish() for execution in executions)


def test_a_late_result_of_a_run_settled_by_someone_else_is_dropped() -> None:
    release = threading.Event()
    running = threading.Event()

    def stuck(job: Job) -> None:
        running.set()
        release.wait(5)

    execution, settled, thread = start(stuck)
    assert running.wait(5)
    # The watchdog's move: claim the run and settle it without the thread.
    assert execution.try_finish()
    execution.settle(
        execution.outcome_for_interrupt(Interrupt.TIMEOUT, abandoned=True), by_runner=False
    )

    release.set()
    thread.join(5)

    outcome, by_runner = settled.only
    assert (outcome.ending, by_runner) == (Ending.FAILED, False)


# --------------------------------------------------------------------------- retry policy


@pytest.mark.parametrize(
    ("handler_policy", "delay"),
    [(FixedDelay(7), 7.0), (None, 3.0)],
    ids=["handlers", "workers"],
)
def test_a_failure_is_retried_per_the_handlers_policy_else_the_workers(
    handler_policy: FixedDelay | None, delay: float
) -> None:
    outcome, _ = run(raises(RuntimeError("x")), retry_policy=handler_policy)

    execution, _ = an_execution(retry_policy=handler_policy)
    assert execution.policy() is (handler_policy or WORKER_POLICY)
    assert outcome.delay == delay


def test_a_timeout_is_retried_per_the_handlers_policy_too() -> None:
    execution, _ = an_execution(retry_policy=FixedDelay(11))
    execution.interrupt(Interrupt.TIMEOUT)

    outcome = execution.outcome_for_exception(JobTimeoutError(JOB_ID))

    assert (outcome.ending, outcome.delay) == (Ending.FAILED, 11.0)


def test_a_snooze_or_a_cancel_asks_no_retry_policy() -> None:
    class Refuses:
        def next_delay(self, job: Job) -> dt.timedelta:
            raise AssertionError("asked")

    execution = Execution(a_job(), a_handler(), Refuses(), Settlements())

    assert execution.outcome_for_exception(JobSnooze(1)).ending is Ending.SNOOZED
    assert execution.outcome_for_exception(JobCancel()).ending is Ending.CANCELLED
    assert execution.outcome_for_interrupt(Interrupt.SHUTDOWN).ending is Ending.RETURNED
