"""Running one job: the handler call, its outcome, and interruptions.

An :class:`Execution` is one run of one job. Exactly one party *settles* it — the
thread or task that ran the handler, or the watchdog when a timeout's grace period ran
out — decided by :meth:`Execution.try_finish`, so a late result from a run that was
already settled is dropped here, and the ``(id, attempt)`` guard in
:func:`sa_jobs.complete.jobs_finish` drops it again in the database.

The run's timeout starts when its handler starts (:meth:`Execution.begin`), never while
it waits for a thread, so a job is never failed for a timeout it did not run into.

Sync handlers run in a thread pool and learn of an interruption through
``job.cancelled`` / ``job.check_cancelled()``. Async handlers run on the worker's event
loop and are cancelled for real (``Task.cancel``).

Whatever a handler raises, an outcome is made: :meth:`Execution.outcome_for_exception`
never raises, and every error record it makes is storable (:mod:`sa_jobs.error_records`).
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from sa_jobs.complete import Ending, Outcome, complete_in
from sa_jobs.error_records import describe, error_record, message_record
from sa_jobs.errors import (
    JobCancel,
    JobCancelledError,
    JobInterruptedError,
    JobSnooze,
    JobTimeoutError,
    NoHandlerError,
    WorkerShutdownError,
)
from sa_jobs.hooks import AttemptResult, WorkHooks
from sa_jobs.models import Job
from sa_jobs.worker.handlers import Handler
from sa_jobs.worker.retry import RetryPolicy, retry_delay

__all__ = ["Execution", "Interrupt", "prepare", "run_async", "run_sync"]

log = logging.getLogger("sa_jobs.worker")


class Interrupt(enum.Enum):
    """Why the worker asked a running job to stop."""

    TIMEOUT = JobTimeoutError
    CANCELLED = JobCancelledError
    SHUTDOWN = WorkerShutdownError


#: Receives the settled execution, the outcome to write (``None``: already written) and
#: whether the party settling it is the one that ran the handler.
Settle = Callable[["Execution", Outcome | None, bool], None]


class Execution:
    """One run of one job."""

    def __init__(
        self,
        job: Job[Any],
        handler: Handler | None,
        retry_policy: RetryPolicy,
        settle: Settle,
        on_begin: Callable[[Execution], None] = lambda _execution: None,
        hooks: WorkHooks | None = None,
    ) -> None:
        self.job = job
        self.handler = handler
        self.retry_policy = retry_policy
        self._settle = settle
        self._on_begin = on_begin
        #: The worker's work hooks; None when it has none (the common, free case).
        self.hooks = hooks
        #: What the run was settled with (None: completed in the handler's session);
        #: the exception the handler raised, if it raised. For the ``after_work`` hooks.
        self.settled_with: Outcome | _Unsettled | None = UNSETTLED
        self.raised: BaseException | None = None
        self._lock = threading.Lock()
        self._interrupt: Interrupt | None = None
        self._finishing = False
        self._task: asyncio.Task[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        #: When the handler started (``time.monotonic()``), and when its timeout ends.
        self.started: float | None = None
        self.deadline: float | None = None
        #: Thread bookkeeping, changed only under the pool's lock (see worker.pool).
        self.in_handler = False
        self.stuck = False
        self.counted_stuck = False
        self.slot_held = False
        job.extras.execution = self

    @property
    def timeout(self) -> float | None:
        timeout = self.handler.timeout if self.handler is not None else None
        return timeout.total_seconds() if timeout is not None else None

    @property
    def is_async(self) -> bool:
        return self.handler is not None and self.handler.is_async

    def begin(self) -> bool:
        """The handler is about to run: start its timeout.

        Returns False when the run was settled already (a shutdown or cancel that came
        first); the handler must not be called then.
        """
        with self._lock:
            if self._finishing:
                return False
            self.started = time.monotonic()
            timeout = self.timeout
            self.deadline = self.started + timeout if timeout is not None else None
        self._on_begin(self)
        if self.hooks is not None:
            self.hooks.before(self.job)
        return True

    # -- interruption, seen by the handler through the Job

    @property
    def interrupted(self) -> bool:
        return self._interrupt is not None

    @property
    def interrupt_reason(self) -> Interrupt | None:
        return self._interrupt

    def raise_if_interrupted(self) -> None:
        if self._interrupt is not None:
            raise self._interrupt.value(self.job.id)

    def interrupt(self, reason: Interrupt) -> None:
        """Ask the run to stop; the first reason given is the one that counts."""
        with self._lock:
            if self._finishing:
                return
            if self._interrupt is None:
                self._interrupt = reason
            task, loop = self._task, self._loop
        if task is not None and loop is not None:
            loop.call_soon_threadsafe(task.cancel)

    def attach_task(self, task: asyncio.Task[Any], loop: asyncio.AbstractEventLoop) -> bool:
        """Record the task running an async handler; False if it was interrupted already."""
        with self._lock:
            self._task, self._loop = task, loop
            return self._interrupt is None

    # -- settling

    def try_finish(self) -> bool:
        """Claim the right to settle this run; only the first caller gets True."""
        with self._lock:
            if self._finishing:
                return False
            self._finishing = True
            return True

    @property
    def finished(self) -> bool:
        return self._finishing

    def settle(self, outcome: Outcome | None, *, by_runner: bool = True) -> None:
        self.settled_with = outcome
        self._settle(self, outcome, by_runner)

    # -- outcomes (none of these raise)

    def outcome_for_return(self) -> Outcome:
        if self._interrupt is Interrupt.TIMEOUT:
            # A timed-out attempt is a failure even if the handler finished late.
            return self.outcome_for_interrupt(Interrupt.TIMEOUT)
        return Outcome.completed(self.job)

    def outcome_for_interrupt(self, reason: Interrupt, *, abandoned: bool = False) -> Outcome:
        """The outcome of a run stopped for ``reason``; ``abandoned`` when the handler did
        not stop within the grace period and is left running."""
        job = self.job
        detail = self._interrupt_detail(reason, abandoned)
        error = reason.value(job.id, detail)
        if reason is Interrupt.TIMEOUT:
            return self._failure(error, with_trace=False)
        if reason is Interrupt.CANCELLED:
            return Outcome.of(
                job, Ending.CANCELLED, error=error_record(job.attempt, error, with_trace=False)
            )
        return Outcome.of(job, Ending.RETURNED)

    def outcome_for_exception(self, exc: BaseException) -> Outcome:
        """The outcome of a handler that raised ``exc``."""
        self.raised = exc
        try:
            return self._outcome_for_exception(exc)
        except Exception as broken:  # an outcome must come out of any exception
            log.exception("job %d: building the outcome of %s failed", self.job.id, describe(exc))
            record = message_record(
                self.job.attempt, f"{describe(exc)} (recording it failed: {describe(broken)})"
            )
            return Outcome.of(self.job, Ending.FAILED, delay=1.0, error=record)

    def _outcome_for_exception(self, exc: BaseException) -> Outcome:
        job = self.job
        if self._interrupt is not None and isinstance(
            exc, JobInterruptedError | asyncio.CancelledError
        ):
            return self.outcome_for_interrupt(self._interrupt)
        if self._interrupt is Interrupt.TIMEOUT:
            return self.outcome_for_interrupt(Interrupt.TIMEOUT)
        if isinstance(exc, JobSnooze):
            return Outcome.of(job, Ending.SNOOZED, delay=exc.seconds)
        if isinstance(exc, JobCancel):
            return Outcome.of(
                job, Ending.CANCELLED, error=error_record(job.attempt, exc, with_trace=False)
            )
        return self._failure(exc)

    def policy(self) -> RetryPolicy:
        """The retry policy for this job: the handler's, else the worker's."""
        if self.handler is not None and self.handler.retry_policy is not None:
            return self.handler.retry_policy
        return self.retry_policy

    def _failure(self, exc: BaseException, *, with_trace: bool = True) -> Outcome:
        job = self.job
        delay, note = retry_delay(self.policy(), job)
        record = error_record(job.attempt, exc, with_trace=with_trace)
        if note is not None:
            record["retry_policy_error"] = note
        return Outcome.of(job, Ending.FAILED, delay=delay, error=record)

    def _interrupt_detail(self, reason: Interrupt, abandoned: bool) -> str:
        detail = ""
        if reason is Interrupt.TIMEOUT and self.timeout is not None:
            detail = f"ran longer than its timeout of {self.timeout:g} s"
        if abandoned:
            detail += (
                ("; " if detail else "")
                + "the handler did not stop within the worker's interrupt_grace, so its "
                "run was settled without it"
                + (" and its thread abandoned" if not self.is_async else "")
            )
        return detail

    def attempt_result(self) -> AttemptResult:
        """How the attempt ended, for the ``after_work`` hooks (never raises)."""
        duration = time.monotonic() - self.started if self.started is not None else 0.0
        outcome = self.settled_with
        if isinstance(outcome, _Unsettled):
            # Settled by the watchdog, which claimed the run but has not written it yet.
            outcome = self.outcome_for_interrupt(
                self._interrupt or Interrupt.TIMEOUT, abandoned=True
            )
        if outcome is None:  # completed in the handler's own transaction
            return AttemptResult(Ending.COMPLETED, duration)
        job = self.job
        return AttemptResult(
            outcome.ending,
            duration,
            discarded=outcome.ending is Ending.FAILED and job.attempt >= job.max_attempts,
            exception=self.raised if outcome.ending is not Ending.COMPLETED else None,
            error=outcome.error.get("error") if outcome.error else None,
            delay=outcome.delay,
        )


class _Unsettled(enum.Enum):
    UNSETTLED = enum.auto()


UNSETTLED = _Unsettled.UNSETTLED


class _Superseded(Exception):
    """The run was settled by someone else (a timeout) before it could commit."""


def prepare(execution: Execution) -> Handler:
    """The handler of the run, with the job's args decoded up front, so a class that no
    longer fits fails like any error. Public for ``sa_jobs.testing.inline``, which runs
    handlers the same way.

    Raises:
        NoHandlerError: no handler for the job's kind.
    """
    handler = execution.handler
    job = execution.job
    if handler is None:
        raise NoHandlerError(job.kind)
    job.extras.kind = handler.kind
    job.remember_args(handler.kind.decode(job.args_json))
    return handler


def run_sync(execution: Execution, engine: Engine) -> None:
    """Run a sync handler in the calling (pool) thread and settle the execution."""
    hooks = execution.hooks
    if hooks is None:
        _run_sync(execution, engine)
        return
    try:
        _run_sync(execution, engine)
    finally:
        if execution.started is not None:  # begin() ran the before_work hooks
            hooks.after(execution.job, execution.attempt_result())


def _run_sync(execution: Execution, engine: Engine) -> None:
    if not execution.begin():
        return
    claimed = False
    try:
        handler = prepare(execution)
        if handler.wants_session:
            with Session(engine) as session, session.begin():
                _sync_result(handler.function(execution.job, session))
                claimed = execution.try_finish()
                if not claimed:
                    raise _Superseded
                if execution.interrupt_reason is Interrupt.TIMEOUT:
                    raise JobTimeoutError(execution.job.id)
                complete_in(session, execution.job)
            execution.settle(None)
            return
        _sync_result(handler.function(execution.job))
        outcome = execution.outcome_for_return()
    except _Superseded:
        return
    except BaseException as exc:  # the handler's failure is data, not a crash
        outcome = execution.outcome_for_exception(exc)
    if claimed or execution.try_finish():
        execution.settle(outcome)


def _sync_result(result: object) -> None:
    """A sync handler that returns an awaitable (a plain wrapper around an ``async def``)
    did not do its work: calling it only made a coroutine. Fail the attempt, loudly,
    rather than complete a job whose handler never ran."""
    if inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()  # never awaited, on purpose: no "never awaited" warning
        raise TypeError(
            "the handler returned an awaitable instead of doing its work; declare the "
            "handler itself `async def` (a sync wrapper around an async function hides it)"
        )


async def run_async(execution: Execution, async_engine: Callable[[], AsyncEngine]) -> None:
    """Run an async handler as a task on the worker's loop and settle the execution."""
    hooks = execution.hooks
    if hooks is None:
        await _run_async(execution, async_engine)
        return
    try:
        await _run_async(execution, async_engine)
    finally:
        if execution.started is not None:  # begin() ran the before_work hooks
            hooks.after(execution.job, execution.attempt_result())


async def _run_async(execution: Execution, async_engine: Callable[[], AsyncEngine]) -> None:
    task = asyncio.current_task()
    assert task is not None
    if not execution.begin():
        return
    claimed = False
    try:
        if not execution.attach_task(task, asyncio.get_running_loop()):
            execution.raise_if_interrupted()
        handler = prepare(execution)
        if handler.wants_session:
            async with AsyncSession(async_engine()) as session, session.begin():
                await handler.function(execution.job, session)
                claimed = execution.try_finish()
                if not claimed:
                    raise _Superseded
                if execution.interrupt_reason is Interrupt.TIMEOUT:
                    raise JobTimeoutError(execution.job.id)
                await complete_in(session, execution.job)
            execution.settle(None)
            return
        await handler.function(execution.job)
        outcome = execution.outcome_for_return()
    except _Superseded:
        return
    except BaseException as exc:
        outcome = execution.outcome_for_exception(exc)
    if claimed or execution.try_finish():
        execution.settle(outcome)
