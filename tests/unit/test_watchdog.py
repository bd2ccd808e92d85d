"""The watchdog (:class:`sa_jobs.worker.watchdog.Watchdog`): deadlines, grace, and stop.

At a run's deadline the watchdog interrupts it; if the run has still not settled
``grace`` seconds later, the watchdog settles it itself (``by_runner=False``) with an
error saying the handler was abandoned, so its slot is freed. A run that stops in time
settles itself, once. Real threads and short times; :meth:`Service.wait_passes` says
when the watchdog has acted, instead of a sleep. (``tests/unit/test_bounds.py`` covers
deadlines past ``threading``'s range.)
"""

from __future__ import annotations

import contextlib
import datetime as dt
import gc
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterator

import pytest

import sa_jobs
from sa_jobs._base.records import Ending, Outcome
from sa_jobs._declare.args import kind_of
from sa_jobs._table.models import Job
from sa_jobs.worker.execution import Execution, Interrupt
from sa_jobs.worker.handler_runs import run_sync
from sa_jobs.worker.handlers import Handler
from sa_jobs.worker.retry import DEFAULT_RETRY_POLICY
from sa_jobs.worker.watchdog import Watchdog

#: Long enough that a test never sees a run settled for lack of grace unless it asks.
NO_GRACE_IN_SIGHT = 30.0


@sa_jobs.job_args(kind="watchdog.work", registry=sa_jobs.KindRegistry())
class Work:
    n: int = 0


class Settlements:
    """The ``settle`` callback of executions: records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, Outcome | None, bool]] = []
        self._lock = threading.Lock()

    def __call__(self, execution: Execution, outcome: Outcome | None, by_runner: bool) -> None:
        with self._lock:
            self.calls.append((execution.job.id, outcome, by_runner))


def a_job(job_id: int) -> Job:
    return sa_jobs.Job(
        id=job_id,
        kind=kind_of(Work).name,
        attempt=1,
        run_count=1,
        max_attempts=25,
        args_json={},
        errors=[],
    )


def an_execution(
    job_id: int,
    settled: Settlements,
    *,
    timeout: float | None,
    function: Callable[[Job], None] = lambda job: None,
    on_begin: Callable[[Execution], None] = lambda execution: None,
) -> Execution:
    handler = Handler(
        kind=kind_of(Work),
        function=function,
        is_async=False,
        wants_session=False,
        timeout=dt.timedelta(seconds=timeout) if timeout is not None else None,
    )
    return Execution(a_job(job_id), handler, DEFAULT_RETRY_POLICY, settled, on_begin)


@contextlib.contextmanager
def started_watchdog(grace: float) -> Iterator[Watchdog]:
    watchdog = Watchdog(grace=grace)
    watchdog.start()
    try:
        yield watchdog
    finally:
        watchdog.stop(timeout=2)


@pytest.fixture
def watchdog() -> Iterator[Watchdog]:
    with started_watchdog(NO_GRACE_IN_SIGHT) as started:
        yield started


@pytest.fixture
def impatient_watchdog() -> Iterator[Watchdog]:
    with started_watchdog(0.05) as started:
        yield started


# --------------------------------------------------------------------------- deadlines


def test_a_run_is_interrupted_at_its_deadline_not_before(watchdog: Watchdog) -> None:
    settled = Settlements()
    execution = an_execution(1, settled, timeout=0.05)
    execution.begin()
    watchdog.watch(execution)
    assert not execution.job.cancelled

    assert watchdog.wait_passes(1, timeout=2)

    assert execution.deadline is not None
    assert time.monotonic() >= execution.deadline
    assert execution.job.cancelled
    assert execution.interrupt_reason is Interrupt.TIMEOUT
    assert settled.calls == []  # interrupted, not settled: its grace has not run out


def test_a_run_without_a_timeout_is_never_interrupted(watchdog: Watchdog) -> None:
    settled = Settlements()
    unlimited = an_execution(1, settled, timeout=None)
    limited = an_execution(2, settled, timeout=0.02)
    for execution in (unlimited, limited):
        execution.begin()
        watchdog.watch(execution)

    assert watchdog.wait_passes(1, timeout=2)

    assert limited.interrupted
    assert not unlimited.interrupted


def test_the_earliest_deadline_is_enforced_first_even_when_watched_last(
    watchdog: Watchdog,
) -> None:
    settled = Settlements()
    late = an_execution(1, settled, timeout=0.18)
    middle = an_execution(2, settled, timeout=0.12)
    early = an_execution(3, settled, timeout=0.06)
    for execution in (late, middle, early):  # the loop already sleeps towards `late`
        execution.begin()
        watchdog.watch(execution)

    interrupted_after_each_pass = []
    for _ in range(3):
        assert watchdog.wait_passes(1, timeout=2)
        interrupted_after_each_pass.append(
            {e.job.id for e in (late, middle, early) if e.interrupted}
        )
        if len(interrupted_after_each_pass) == 1:
            assert late.deadline is not None
            assert time.monotonic() < late.deadline  # woken for `early`, not for `late`

    assert interrupted_after_each_pass == [{3}, {2, 3}, {1, 2, 3}]


# --------------------------------------------------------------------------- grace


def test_a_run_still_going_after_its_grace_is_settled_by_the_watchdog(
    impatient_watchdog: Watchdog,
) -> None:
    settled = Settlements()
    execution = an_execution(1, settled, timeout=0.05)
    execution.begin()
    impatient_watchdog.watch(execution)

    assert impatient_watchdog.wait_passes(2, timeout=2)  # the interrupt, then the settle

    assert execution.started is not None
    assert time.monotonic() - execution.started >= 0.05 + 0.05
    [(job_id, outcome, by_runner)] = settled.calls
    assert (job_id, by_runner) == (1, False)
    assert outcome is not None
    assert outcome.ending is Ending.FAILED
    assert outcome.error is not None
    assert "ran longer than its timeout of 0.05 s" in outcome.error["error"]
    assert "did not stop within the worker's interrupt_grace" in outcome.error["error"]
    assert "its thread abandoned" in outcome.error["error"]
    # Whatever the stuck handler returns later is dropped.
    assert not execution.try_finish()


def test_a_run_that_stops_within_its_grace_settles_itself_once() -> None:
    with started_watchdog(0.1) as watchdog:
        settled = Settlements()

        def checks(job: Job) -> None:
            while not job.cancelled:
                time.sleep(0.002)
            job.check_cancelled()

        execution = an_execution(1, settled, timeout=0.03, function=checks, on_begin=watchdog.watch)
        runner = threading.Thread(target=run_sync, args=(execution, None), daemon=True)
        runner.start()

        assert watchdog.wait_passes(2, timeout=2)  # the interrupt, then the grace entry
        runner.join(2)

        [(job_id, outcome, by_runner)] = settled.calls
        assert (job_id, by_runner) == (1, True)
        assert outcome is not None
        assert outcome.ending is Ending.FAILED
        assert outcome.error is not None
        assert "abandoned" not in outcome.error["error"]


def test_a_run_settled_before_its_deadline_leaves_the_watchdog_nothing_to_do(
    impatient_watchdog: Watchdog,
) -> None:
    settled = Settlements()
    execution = an_execution(1, settled, timeout=0.02)
    execution.begin()
    impatient_watchdog.watch(execution)
    assert execution.try_finish()
    execution.settle(Outcome.completed(execution.job))

    assert impatient_watchdog.wait_passes(1, timeout=2)  # the deadline comes and goes
    assert not impatient_watchdog.wait_passes(1, timeout=0.05 + 0.05)  # no grace entry

    assert not execution.interrupted
    assert [(job_id, by_runner) for job_id, _, by_runner in settled.calls] == [(1, True)]


@pytest.mark.parametrize(
    ("reason", "ending"),
    [(Interrupt.CANCELLED, Ending.CANCELLED), (Interrupt.SHUTDOWN, Ending.RETURNED)],
    ids=["cancel", "shutdown"],
)
def test_a_cancel_or_shutdown_a_handler_ignores_is_settled_after_the_grace(
    impatient_watchdog: Watchdog, reason: Interrupt, ending: Ending
) -> None:
    settled = Settlements()
    execution = an_execution(1, settled, timeout=None)
    execution.begin()

    asked = time.monotonic()
    impatient_watchdog.interrupt_now(execution, reason)

    assert execution.interrupt_reason is reason  # at once
    assert settled.calls == []
    assert impatient_watchdog.wait_passes(1, timeout=2)
    assert time.monotonic() - asked >= 0.05
    [(_, outcome, by_runner)] = settled.calls
    assert outcome is not None
    assert (outcome.ending, by_runner) == (ending, False)


def test_a_failure_settling_one_run_does_not_stop_the_others(
    impatient_watchdog: Watchdog, caplog: pytest.LogCaptureFixture
) -> None:
    settled = Settlements()

    def settle_or_break(execution: Execution, outcome: Outcome | None, by_runner: bool) -> None:
        if execution.job.id == 1:
            raise RuntimeError("the completer is gone")
        settled(execution, outcome, by_runner)

    first = Execution(a_job(1), None, DEFAULT_RETRY_POLICY, settle_or_break)
    second = Execution(a_job(2), None, DEFAULT_RETRY_POLICY, settle_or_break)
    for execution in (first, second):
        execution.begin()
    caplog.set_level(logging.ERROR, logger="sa_jobs.worker")

    impatient_watchdog.interrupt_now(first, Interrupt.CANCELLED)
    time.sleep(0.01)
    impatient_watchdog.interrupt_now(second, Interrupt.CANCELLED)

    assert impatient_watchdog.wait_passes(2, timeout=2)
    assert [job_id for job_id, _, _ in settled.calls] == [2]
    assert impatient_watchdog.running
    assert "the watchdog failed to stop job 1" in caplog.text


# --------------------------------------------------------------------------- stop


def test_stop_returns_promptly_with_deadlines_far_away() -> None:
    watchdog = Watchdog(grace=NO_GRACE_IN_SIGHT)
    watchdog.start()
    execution = an_execution(1, Settlements(), timeout=3600)
    execution.begin()
    watchdog.watch(execution)
    time.sleep(0.01)  # let the loop go to sleep towards the deadline

    started = time.monotonic()
    watchdog.stop(timeout=2)

    assert time.monotonic() - started < 0.5
    assert not watchdog.running
    assert not execution.interrupted


def test_stop_returns_promptly_with_nothing_to_watch() -> None:
    watchdog = Watchdog(grace=NO_GRACE_IN_SIGHT)
    watchdog.start()
    time.sleep(0.01)

    started = time.monotonic()
    watchdog.stop(timeout=2)

    assert time.monotonic() - started < 0.5
    assert not watchdog.running


def test_runs_that_finished_long_before_their_deadlines_are_not_kept(watchdog: Watchdog) -> None:
    """A busy worker finishes thousands of jobs a minute before their deadlines; the
    watchdog must not keep each run (its job, args, errors) alive until then."""
    counted: list[int] = []

    def settled(execution: Execution, outcome: Outcome | None, by_runner: bool) -> None:
        counted.append(execution.job.id)  # the id only: a kept outcome would keep its job

    alive = an_execution(0, settled, timeout=60)  # type: ignore[arg-type]
    alive.begin()
    watchdog.watch(alive)
    finished: list[weakref.ref[Execution]] = []
    for job_id in range(1, 5001):
        execution = an_execution(job_id, settled, timeout=60)  # type: ignore[arg-type]
        execution.begin()
        watchdog.watch(execution)
        run_sync(execution, engine=None)  # type: ignore[arg-type]  # no session: no engine
        assert execution.finished
        finished.append(weakref.ref(execution))
        del execution
    gc.collect()

    assert len(counted) == 5000
    assert sum(ref() is not None for ref in finished) == 0  # nothing holds them
    assert len(watchdog._heap) < 2100  # compacted as it grew: the one live run and few more
    assert any(entry[4]() is alive for entry in watchdog._heap)  # its deadline still stands
