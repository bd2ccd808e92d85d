"""Running one job: the handler call, its outcome, and interruptions.

An :class:`Execution` is one run of one job. Exactly one party *settles* it — the
thread or task that ran the handler, or the watchdog when a timeout's grace period ran
out — decided by :meth:`Execution.try_finish`, so a late result from a run that was
already settled is dropped here, and the statement that writes outcomes drops it again
in the database: it changes only a row still ``running`` with that run's ``run_count``
(:func:`sa_jobs._act.complete.finish_statement`).

The run's timeout starts when its handler starts (:meth:`Execution.begin`), never while
it waits for a thread, so a job is never failed for a timeout it did not run into.

Running the handler itself is :mod:`.handler_runs`. Sync handlers run in a thread pool
and learn of an interruption through
``job.cancelled`` / ``job.check_cancelled()``. Async handlers run on the worker's event
loop and are cancelled for real (``Task.cancel``).

Whatever a handler raises, an outcome is made: :meth:`Execution.outcome_for_exception`
never raises, and every error record it makes is storable (:mod:`sa_jobs._base.error_records`).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import attrs

from sa_jobs._base.error_records import describe, error_record, message_record
from sa_jobs._base.records import Ending, Outcome
from sa_jobs._declare.output import encode_output
from sa_jobs._table.models import Job
from sa_jobs._table.schema import OUTPUT_BRANCH
from sa_jobs.errors import (
    InvalidOutputError,
    JobCancel,
    JobCancelledError,
    JobDiscard,
    JobInterruptedError,
    JobSnooze,
    JobStateError,
    JobTimeoutError,
    SchemaMissingError,
    WorkerShutdownError,
)
from sa_jobs.hooks import AttemptResult, WorkHooks
from sa_jobs.worker.handlers import Handler
from sa_jobs.worker.missing_rows import (
    UNCHECKED,
    Verdict,
)
from sa_jobs.worker.retry import RetryPolicy, retry_delay

__all__ = ["Execution", "Interrupt", "OutputSettings"]

log = logging.getLogger("sa_jobs.worker")


class Interrupt(enum.Enum):
    """Why the worker asked a running job to stop."""

    TIMEOUT = JobTimeoutError
    CANCELLED = JobCancelledError
    SHUTDOWN = WorkerShutdownError


#: Receives the settled execution, the outcome to write (``None``: already written) and
#: whether the party settling it is the one that ran the handler.
Settle = Callable[["Execution", Outcome | None, bool], None]

#: Writes a run's output at once (``job.record_output``); False when the run is over.
Recorder = Callable[[Job[Any], Any], bool]
#: The same, for ``await job.record_output_async`` (on the worker's async engine).
AsyncRecorder = Callable[[Job[Any], Any], Awaitable[bool]]


@attrs.frozen
class OutputSettings:
    """How a worker treats its handlers' return values.

    Attributes:
        stored: The database has the ``sa_jobs_output`` branch. Without it, return values
            are dropped (with a warning): a worker refuses to start with a kind that
            declares ``output=`` there, so these are untyped values a handler written
            before outputs existed may return.
        max_bytes: The worker's cap on an output's encoded JSON; None: 1 MiB. A kind's
            own ``max_output_bytes`` wins.
        recorder: Writes ``job.record_output`` values; None where nothing can (the
            method then raises).
        reader: Reads ``job.output_of(step)`` (:mod:`sa_jobs._act.workflow_outputs`); None
            where nothing can.
        async_recorder, async_reader: The same for ``record_output_async`` and
            ``output_of_async``, awaited on the handler's event loop; None where there is
            none (the sync forms then run in a thread, off the loop).
    """

    stored: bool = True
    max_bytes: int | None = None
    recorder: Recorder | None = None
    reader: Callable[[Job[Any], str], Any] | None = None
    async_recorder: AsyncRecorder | None = None
    async_reader: Callable[[Job[Any], str], Awaitable[Any]] | None = None


_DEFAULT_OUTPUTS = OutputSettings()
_warned_dropped: set[str] = set()


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
        outputs: OutputSettings = _DEFAULT_OUTPUTS,
    ) -> None:
        self.job = job
        self.outputs = outputs
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
        #: The fetched batch's check of the rows the job references (worker.missing_rows):
        #: UNCHECKED when it did not cover the job, which is then checked alone.
        self.rows_verdict: Verdict | object = UNCHECKED
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

    # -- outputs

    def encode_result(self, result: object) -> Any:
        """The JSON to store for the handler's return value ``result``; None for none.

        Raises:
            InvalidOutputError: it cannot be stored (the attempt fails).
        """
        if result is None:
            return None
        if not self.outputs.stored:
            kind = self.job.kind
            if kind not in _warned_dropped:
                _warned_dropped.add(kind)
                log.warning(
                    "the handler of kind %r returned a value, which is not stored: the "
                    "sa_jobs 'sa_jobs_output' migration branch is not installed (run "
                    "`sa-jobs migrate`)",
                    kind,
                )
            return None
        return encode_output(self.job.job_kind, result, self.outputs.max_bytes)

    def record_output(self, value: object) -> None:
        """``job.record_output(value)``: store it now, guarded by this run."""
        recorder = self.outputs.recorder
        data = self._output_to_record(value, recorder)
        if data is not None:
            assert recorder is not None
            self._check_recorded(self._finishing or not recorder(self.job, data))

    async def record_output_async(self, value: object) -> None:
        """``await job.record_output_async(value)``: the same, off the event loop."""
        data = self._output_to_record(value, self.outputs.recorder)
        if data is None:
            return
        recorder = self.outputs.async_recorder
        if recorder is not None:
            written = await recorder(self.job, data)
        else:
            assert self.outputs.recorder is not None
            written = await asyncio.to_thread(self.outputs.recorder, self.job, data)
        self._check_recorded(self._finishing or not written)

    def _output_to_record(self, value: object, recorder: Recorder | None) -> Any:
        job = self.job
        if recorder is None:
            raise JobStateError(
                job.id, "run where outputs cannot be recorded", "record the output of", []
            )
        if not self.outputs.stored:
            raise SchemaMissingError(OUTPUT_BRANCH, "job.record_output() stores it there")
        return encode_output(job.job_kind, value, self.outputs.max_bytes)

    def _check_recorded(self, too_late: bool) -> None:
        job = self.job
        if too_late:
            raise JobStateError(
                job.id,
                f"no longer running its run {job.run_count}",
                "record the output of",
                [f"running run {job.run_count}"],
            )

    def output_of(self, step: str) -> Any:
        """``job.output_of(step)``: read through the worker's reader."""
        return self._reader()(self.job, step)

    async def output_of_async(self, step: str) -> Any:
        """``await job.output_of_async(step)``: the same, off the event loop."""
        reader = self._reader()
        if self.outputs.async_reader is not None:
            return await self.outputs.async_reader(self.job, step)
        return await asyncio.to_thread(reader, self.job, step)

    def _reader(self) -> Callable[[Job[Any], str], Any]:
        reader = self.outputs.reader
        if reader is None:
            raise JobStateError(
                self.job.id, "run where outputs cannot be read", "read a step's output for", []
            )
        return reader

    # -- outcomes (none of these raise)

    def outcome_for_return(self, result: object = None) -> Outcome:
        """The outcome of a handler that returned ``result`` (its output)."""
        if self._interrupt is Interrupt.TIMEOUT:
            # A timed-out attempt is a failure even if the handler finished late.
            return self.outcome_for_interrupt(Interrupt.TIMEOUT)
        if result is None:
            return Outcome.completed(self.job)
        try:
            data = self.encode_result(result)
        except InvalidOutputError as exc:
            self.raised = exc
            return self._failure(exc, with_trace=False)
        except Exception as exc:  # a converter hook's own error: still a failed attempt
            return self.outcome_for_exception(exc)
        return Outcome.of(self.job, Ending.COMPLETED, output=data)

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
        if isinstance(exc, JobDiscard):
            return Outcome.of(
                job, Ending.DISCARDED, error=error_record(job.attempt, exc, with_trace=False)
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
