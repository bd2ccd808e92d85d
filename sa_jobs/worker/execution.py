"""Running one job: the handler call, its outcome, and interruptions.

An :class:`Execution` is one run of one job. Exactly one party *settles* it — the
thread or task that ran the handler, or the watchdog when a timeout's grace period ran
out — decided by :meth:`Execution.try_finish`, so a late result from a run that was
already settled is dropped here, and the ``(id, attempt)`` guard in
:func:`sa_jobs.complete.jobs_finish` drops it again in the database.

Sync handlers run in a thread pool and learn of an interruption through
``job.cancelled`` / ``job.check_cancelled()``. Async handlers run on the worker's event
loop and are cancelled for real (``Task.cancel``).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import enum
import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from sa_jobs.complete import Ending, Outcome, complete_in, error_record
from sa_jobs.errors import (
    JobCancel,
    JobCancelledError,
    JobInterruptedError,
    JobSnooze,
    JobTimeoutError,
    WorkerShutdownError,
)
from sa_jobs.models import Job
from sa_jobs.worker.handlers import Handler
from sa_jobs.worker.retry import RetryPolicy

__all__ = ["Execution", "Interrupt", "run_async", "run_sync"]


class Interrupt(enum.Enum):
    """Why the worker asked a running job to stop."""

    TIMEOUT = JobTimeoutError
    CANCELLED = JobCancelledError
    SHUTDOWN = WorkerShutdownError


#: Receives the settled execution and the outcome to write (``None``: already written).
Settle = Callable[["Execution", Outcome | None], None]


class Execution:
    """One run of one job."""

    def __init__(
        self, job: Job, handler: Handler | None, retry_policy: RetryPolicy, settle: Settle
    ) -> None:
        self.job = job
        self.handler = handler
        self.retry_policy = retry_policy
        self._settle = settle
        self._lock = threading.Lock()
        self._interrupt: Interrupt | None = None
        self._finishing = False
        self._task: asyncio.Task[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.started = time.monotonic()
        timeout = handler.timeout if handler is not None else None
        self.deadline = self.started + timeout.total_seconds() if timeout is not None else None
        job.__dict__["_sa_jobs_execution"] = self

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

    def settle(self, outcome: Outcome | None) -> None:
        self._settle(self, outcome)

    # -- outcomes

    def outcome_for_return(self) -> Outcome:
        if self._interrupt is Interrupt.TIMEOUT:
            # A timed-out attempt is a failure even if the handler finished late.
            return self.outcome_for_interrupt(Interrupt.TIMEOUT)
        return Outcome.completed(self.job)

    def outcome_for_interrupt(self, reason: Interrupt) -> Outcome:
        job = self.job
        error = reason.value(job.id, _interrupt_detail(reason, self))
        if reason is Interrupt.TIMEOUT:
            return self._failure(error, with_trace=False)
        if reason is Interrupt.CANCELLED:
            return Outcome.of(job, Ending.CANCELLED, error=_record(job, error))
        return Outcome.of(job, Ending.RETURNED)

    def outcome_for_exception(self, exc: BaseException) -> Outcome:
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
            return Outcome.of(job, Ending.CANCELLED, error=_record(job, exc))
        return self._failure(exc)

    def _failure(self, exc: BaseException, *, with_trace: bool = True) -> Outcome:
        job = self.job
        policy = (
            self.handler.retry_policy
            if self.handler is not None and self.handler.retry_policy is not None
            else self.retry_policy
        )
        try:
            delay = policy.next_delay(job).total_seconds()
        except Exception:  # a broken policy must not lose the failure
            delay = 1.0
        return Outcome.of(
            job,
            Ending.FAILED,
            delay=max(delay, 0.0),
            error=error_record(job.attempt, exc, with_trace=with_trace),
        )


def _record(job: Job, exc: BaseException) -> dict[str, Any]:
    return error_record(job.attempt, exc, with_trace=False)


def _interrupt_detail(reason: Interrupt, execution: Execution) -> str:
    if reason is Interrupt.TIMEOUT and execution.handler is not None:
        timeout = execution.handler.timeout or dt.timedelta(0)
        return f"ran longer than its timeout of {timeout.total_seconds():g} s"
    return ""


class _Superseded(Exception):
    """The run was settled by someone else (a timeout) before it could commit."""


def _prepare(execution: Execution) -> Handler:
    """Decode the args up front so a class that no longer fits fails like any error."""
    handler = execution.handler
    job = execution.job
    if handler is None:
        from sa_jobs.errors import NoHandlerError

        raise NoHandlerError(job.kind)
    job.__dict__["_sa_jobs_kind"] = handler.kind
    job.remember_args(handler.kind.decode(job.args_json))
    return handler


def run_sync(execution: Execution, engine: Engine) -> None:
    """Run a sync handler in the calling (pool) thread and settle the execution."""
    claimed = False
    try:
        handler = _prepare(execution)
        if handler.wants_session:
            with Session(engine) as session, session.begin():
                handler.function(execution.job, session)
                claimed = execution.try_finish()
                if not claimed:
                    raise _Superseded
                if execution.interrupt_reason is Interrupt.TIMEOUT:
                    raise JobTimeoutError(execution.job.id)
                complete_in(session, execution.job)
            execution.settle(None)
            return
        handler.function(execution.job)
        outcome = execution.outcome_for_return()
    except _Superseded:
        return
    except BaseException as exc:  # the handler's failure is data, not a crash
        outcome = execution.outcome_for_exception(exc)
    if claimed or execution.try_finish():
        execution.settle(outcome)


async def run_async(execution: Execution, async_engine: Callable[[], AsyncEngine]) -> None:
    """Run an async handler as a task on the worker's loop and settle the execution."""
    task = asyncio.current_task()
    assert task is not None
    claimed = False
    try:
        if not execution.attach_task(task, asyncio.get_running_loop()):
            execution.raise_if_interrupted()
        handler = _prepare(execution)
        if handler.wants_session:
            async with AsyncSession(async_engine()) as session, session.begin():
                await handler.function(execution.job, session)
                claimed = execution.try_finish()
                if not claimed:
                    raise _Superseded
                if execution.interrupt_reason is Interrupt.TIMEOUT:
                    raise JobTimeoutError(execution.job.id)
                await session.run_sync(complete_in, execution.job)
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
