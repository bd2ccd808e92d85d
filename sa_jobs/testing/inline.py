"""Working due jobs inside a test's own transaction, with the application's real handlers.

:func:`run_jobs` is Oban's ``drain_jobs`` and River's ``rivertest.Worker`` for sa_jobs:
it fetches due jobs of the worker's queues *through the test's session*, runs each with
the handler registered on the worker, and writes the outcome exactly as the worker's
completer would (:func:`sa_jobs._act.complete.finish_in`), all in the session's transaction.
A test that rolls back at the end leaves nothing behind, and a job its code enqueued
without committing is found.

What is the same as a running worker: the fetch statement (attempt and run count go up,
``unique_until="start"`` keys are released), handler lookup and args decoding, the
outcome of a return or an exception (:class:`~sa_jobs.worker.execution.Execution`:
``JobSnooze``, ``JobCancel``, retry policies, discard after ``max_attempts``), the
finishing statement (sequences move on, job keys are released), and the promotion of
due scheduled and retryable jobs between runs.

What differs: jobs run one at a time, in fetch order (priority, scheduled time, id)
across the queues; timeouts are not enforced; a handler that takes a session gets *the
test's session*, inside a savepoint, so its writes are rolled back with the job's
completion when it raises (the worker rolls back its own transaction then).

"Due" is decided by the database clock, and ``now()`` is the time the test's
transaction began: a job inserted in it is due, a failure retried after 0 s is due
again, a retry after the default backoff is not.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, overload

import attrs
from sqlalchemy import func, select, update
from sqlalchemy.exc import MissingGreenlet, StatementError
from sqlalchemy.ext.asyncio import AsyncSession, async_scoped_session
from sqlalchemy.orm import Session, scoped_session

from sa_jobs._act.complete import complete_encoded, finish_in, record_output_in
from sa_jobs._act.queues import queue_not_paused
from sa_jobs._act.workflow_outputs import read_step_output
from sa_jobs._base.records import Outcome
from sa_jobs._base.states import JobState
from sa_jobs._table.models import Job, state_is
from sa_jobs._table.schema import Features
from sa_jobs.worker.execution import Execution, OutputSettings
from sa_jobs.worker.handler_runs import prepare
from sa_jobs.worker.handlers import Handler
from sa_jobs.worker.maintenance.scheduler import Scheduler
from sa_jobs.worker.maintenance.sequence_repair import SequenceRepair
from sa_jobs.worker.missing_rows import check_rows
from sa_jobs.worker.producer import jobs_fetch_available
from sa_jobs.worker.worker import Worker

__all__ = [
    "DEFAULT_MAX_RUNS",
    "InlineUsageError",
    "MaxRunsExceededError",
    "RunSummary",
    "run_jobs",
]

#: How many runs :func:`run_jobs` makes before deciding it is in a loop.
DEFAULT_MAX_RUNS = 1000


@attrs.frozen
class RunSummary:
    """What :func:`run_jobs` did: how many runs ended in each state.

    Compares equal on the counts only, so ``assert run_jobs(...) == RunSummary(completed=2)``
    reads like Oban's ``%{success: 2}``; the repr also shows the errors of failed runs,
    which is what a failed assertion needs.

    Attributes:
        completed: Runs that completed the job.
        retryable: Runs that failed with attempts left (the job will run again).
        discarded: Runs that failed with no attempts left (or whose unique key was taken).
        cancelled: Runs that ended in ``JobCancel`` or a cancel request.
        snoozed: Runs that raised ``JobSnooze`` (the job is scheduled again).
        errors: ``"job 12 (send_email) attempt 1: ValueError: ..."`` for every failed run.
        jobs: The jobs run, in order (objects of the session; expired, so reading an
            attribute shows the row as it is now).
    """

    completed: int = 0
    retryable: int = 0
    discarded: int = 0
    cancelled: int = 0
    snoozed: int = 0
    errors: tuple[str, ...] = attrs.field(default=(), eq=False)
    jobs: tuple[Job[Any], ...] = attrs.field(default=(), eq=False, repr=False)

    @property
    def total(self) -> int:
        """How many runs were made."""
        return self.completed + self.retryable + self.discarded + self.cancelled + self.snoozed

    def as_dict(self) -> dict[str, int]:
        """The counts that are not zero, e.g. ``{"completed": 2, "retryable": 1}``."""
        counts = {
            "completed": self.completed,
            "retryable": self.retryable,
            "discarded": self.discarded,
            "cancelled": self.cancelled,
            "snoozed": self.snoozed,
        }
        return {name: count for name, count in counts.items() if count}


#: The state a finished run leaves its job in -> the RunSummary count it adds to. (A
#: failure retried after 0 s is ``retryable`` here; the next round promotes it.)
_COUNTED = {
    JobState.COMPLETED: "completed",
    JobState.RETRYABLE: "retryable",
    JobState.DISCARDED: "discarded",
    JobState.CANCELLED: "cancelled",
    JobState.SCHEDULED: "snoozed",
}


class MaxRunsExceededError(AssertionError):
    """:func:`run_jobs` ran ``max_runs`` jobs and jobs were still due."""


@overload
def run_jobs(
    session: Session | scoped_session[Any],
    worker: Worker,
    *,
    queues: Iterable[str] | None = ...,
    scheduled: bool = ...,
    max_runs: int = ...,
) -> RunSummary: ...
@overload
def run_jobs(
    session: AsyncSession | async_scoped_session[Any],
    worker: Worker,
    *,
    queues: Iterable[str] | None = ...,
    scheduled: bool = ...,
    max_runs: int = ...,
) -> Awaitable[RunSummary]: ...
def run_jobs(
    session: Session | AsyncSession | scoped_session[Any] | async_scoped_session[Any],
    worker: Worker,
    *,
    queues: Iterable[str] | None = None,
    scheduled: bool = False,
    max_runs: int = DEFAULT_MAX_RUNS,
) -> RunSummary | Awaitable[RunSummary]:
    """Work every due job of ``worker``'s queues in ``session``'s transaction; return counts.

    Jobs that become due meanwhile (enqueued by a handler, retried after 0 s, the next
    job of a sequence) are worked too; jobs due later are left alone.

    Args:
        session: The test's session. With an ``AsyncSession`` this returns an awaitable
            (``summary = await run_jobs(async_session, worker)``), and async handlers that
            take a session get that ``AsyncSession``.
        worker: The application's :class:`~sa_jobs.Worker`: its handlers, retry policy and
            queues are used; it is not started and its engine is not used.
        queues: The queues to work; default the worker's.
        scheduled: Also work jobs that are ``scheduled`` for later, as if their time had
            come (Oban's ``with_scheduled``); only those scheduled before the call.
        max_runs: Give up (``MaxRunsExceededError``) after this many runs, which only a
            loop reaches: a handler that snoozes for 0 s, or re-enqueues itself.

    Supported handlers: sync ``(job)`` and ``(job, session)``; ``async def`` ``(job)``
    (run with ``asyncio.run`` from a sync test; awaited with an ``AsyncSession``); ``async
    def`` ``(job, session)`` only with an ``AsyncSession``.

    Raises:
        TypeError: ``session`` or ``worker`` is not what is expected, or an async handler
            that takes a session met a sync ``Session``.
        MaxRunsExceededError: still jobs due after ``max_runs`` runs.
    """
    if not isinstance(worker, Worker):
        raise TypeError(
            f"run_jobs needs your application's sa_jobs.Worker (the one your handlers are "
            f"registered on), got {type(worker).__name__}"
        )
    if isinstance(max_runs, bool) or not isinstance(max_runs, int) or max_runs < 1:
        raise TypeError(f"max_runs must be a positive int, got {max_runs!r}")
    if isinstance(queues, str):
        raise TypeError(f"queues must be queue names, e.g. queues=[{queues!r}], got {queues!r}")
    runner = _Runner(worker, list(worker.queues if queues is None else queues), max_runs)
    # A scoped session (Flask-SQLAlchemy's db.session) stands for the session it holds.
    if isinstance(session, async_scoped_session | scoped_session):
        session = session()
    if isinstance(session, AsyncSession):
        return runner.run_async(session, scheduled)
    if isinstance(session, Session):
        return runner.run_sync(session, scheduled)
    raise TypeError(
        f"run_jobs needs a sqlalchemy Session or AsyncSession, got {type(session).__name__}"
    )


class _Runner:
    """The state of one :func:`run_jobs` call, shared by its sync and async loops."""

    def __init__(self, worker: Worker, queues: list[str], max_runs: int) -> None:
        if not queues or any(not isinstance(q, str) for q in queues):
            raise TypeError(f"queues must be queue names (strings), got {queues!r}")
        self.worker = worker
        self.queues = queues
        self.max_runs = max_runs
        self.counts = dict.fromkeys(_COUNTED.values(), 0)
        self.errors: list[str] = []
        self.jobs: list[Job[Any]] = []
        #: Outputs ``job.record_output`` kept in the async loop, by job id.
        self.recorded: dict[int, Any] = {}
        #: The async loop's session: ``job.output_of_async`` reads through it.
        self.async_session: AsyncSession | None = None

    # -- the loops

    def run_sync(self, session: Session, scheduled: bool) -> RunSummary:
        if scheduled:
            self.bring_scheduled_forward(session)
        while (job := self.next_job(session)) is not None:
            execution = self.execution(session, job, session)
            outcome: Outcome | None
            try:
                handler = prepare(execution)
                check_rows(session, job)  # a referenced row gone ends it, as in the worker
                if handler.is_async:
                    if handler.wants_session:
                        raise InlineUsageError(_needs_async_session(handler))
                    result = _run_coroutine(handler.function, job)
                    outcome = execution.outcome_for_return(result)
                elif handler.wants_session:
                    _run_in_savepoint(session, execution, handler)
                    outcome = None
                else:
                    result = handler.function(job)
                    outcome = execution.outcome_for_return(result)
            except InlineUsageError:
                raise
            except Exception as exc:  # the handler's failure is data, as in the worker
                outcome = execution.outcome_for_exception(exc)
            self.record(session, job, outcome)
        return self.summary()

    async def run_async(self, session: AsyncSession, scheduled: bool) -> RunSummary:
        self.async_session = session
        if scheduled:
            await session.run_sync(self.bring_scheduled_forward)
        while (job := await session.run_sync(self.next_job)) is not None:
            execution = await session.run_sync(self.execution, job, None)
            outcome: Outcome | None
            try:
                handler = prepare(execution)
                await session.run_sync(check_rows, job)
                if handler.is_async and handler.wants_session:
                    async with session.begin_nested():
                        result = await handler.function(job, session)
                        data = execution.encode_result(result)
                        await session.run_sync(self.complete, job, data)
                    outcome = None
                elif handler.is_async:
                    result = await handler.function(job)
                    outcome = execution.outcome_for_return(result)
                elif handler.wants_session:
                    # In run_sync the handler gets the sync Session behind the
                    # AsyncSession, as a sync handler gets a Session from the worker.
                    await session.run_sync(_run_in_savepoint, execution, handler)
                    outcome = None
                else:
                    # In run_sync too: a sync handler's job.output_of reads through the
                    # session behind the AsyncSession, which works only there.
                    result = await session.run_sync(_call_sync, handler, job)
                    outcome = execution.outcome_for_return(result)
            except InlineUsageError:
                raise
            except Exception as exc:  # the handler's failure is data, as in the worker
                # In run_sync: a savepoint's rollback may have expired the job, and only
                # there may an expired attribute be loaded.
                outcome = await session.run_sync(_failure, execution, exc)
            await session.run_sync(self.record, job, outcome)
        return self.summary()

    # -- the steps both loops share

    def next_job(self, session: Session) -> Job[Any] | None:
        """Promote what became due, then fetch the next due job, as the worker fetches."""
        connection = session.connection()
        features = Features.of(connection)
        Scheduler(features=features).run_once(connection)
        if features.sequence:
            SequenceRepair().run_once(connection)
        # The queue of the job that runs next across all queues (the worker's fetch takes
        # one queue at a time); locked so the fetch below takes that very job.
        due = [
            state_is(Job.state, JobState.AVAILABLE),
            Job.queue.in_(self.queues),
            Job.scheduled_at <= func.now(),
        ]
        if features.queue:
            due.append(queue_not_paused(Job.queue))  # as the fetch below skips them
        queue = session.scalar(
            select(Job.queue)
            .where(*due)
            .order_by(Job.priority, Job.scheduled_at, Job.id)
            .limit(1)
            .with_for_update(skip_locked=True)
        )
        if queue is None:
            return None
        if len(self.jobs) >= self.max_runs:
            raise MaxRunsExceededError(
                f"run_jobs ran {self.max_runs} jobs and jobs are still due (a handler that "
                "snoozes for 0 s, or enqueues a job on every run?); pass max_runs= to allow "
                f"more. Last runs: {self.summary()!r}"
            )
        fetch = (
            select(Job)
            .from_statement(jobs_fetch_available(features))
            # The test may hold this very job (it enqueued it): refresh it in place.
            .execution_options(populate_existing=True)
        )
        params = {"fetch_queue": queue, "fetch_limit": 1, "fetch_worker_id": self.worker.id}
        job = session.scalars(fetch, params).first()
        if job is not None:
            self.jobs.append(job)
        return job

    def execution(self, session: Session, job: Job[Any], direct: Session | None) -> Execution:
        """The run of ``job``, as the worker makes it: the outcome of a missing handler,
        args that do not decode, a return or an exception comes from it.

        ``job.record_output`` writes through ``direct`` (the sync loop's session) at
        once; in the async loop, where a handler cannot use the sync session, the value
        is kept and written before the run's outcome (:meth:`write_recorded`)."""

        def record(job: Job[Any], data: Any) -> bool:
            if direct is not None:
                return record_output_in(direct.connection(), job, data)
            self.recorded[job.id] = data
            return True

        def read(job: Job[Any], step: str) -> Any:
            try:
                return read_step_output((direct or session).connection(), job.id, step)
            except StatementError as exc:
                if not isinstance(exc.orig, MissingGreenlet):
                    raise
                # The async loop's session, from code that is not inside its run_sync:
                # the plain form cannot wait on it there.
                raise InlineUsageError(
                    f"job {job.id} ({job.kind}) called job.output_of({step!r}) under "
                    "`await run_jobs(async_session, worker)`, where the read must go through "
                    f"the AsyncSession: use `await job.output_of_async({step!r})`"
                ) from None

        async def record_async(job: Job[Any], data: Any) -> bool:
            return record(job, data)

        async def read_async(job: Job[Any], step: str) -> Any:
            if self.async_session is None:  # the sync loop: no event loop to spare
                return read(job, step)
            return await self.async_session.run_sync(
                lambda sync: read_step_output(sync.connection(), job.id, step)
            )

        features = Features.of(session.connection())
        outputs = OutputSettings(
            stored=features.output,
            max_bytes=self.worker.max_output_bytes,
            recorder=record,
            reader=read if features.workflow else None,
            async_recorder=record_async,
            async_reader=read_async if features.workflow else None,
        )
        execution = Execution(
            job,
            self.worker.handlers.find(job.kind),
            self.worker.retry_policy,
            _not_settled,
            outputs=outputs,
        )
        execution.begin()
        return execution

    def write_recorded(self, session: Session, job: Job[Any]) -> None:
        """Write what the async loop's ``job.record_output`` kept (see :meth:`execution`)."""
        data = self.recorded.pop(job.id, None)
        if data is not None:
            record_output_in(session.connection(), job, data)

    def complete(self, session: Session, job: Job[Any], data: Any) -> None:
        self.write_recorded(session, job)
        complete_encoded(session, job, data)

    def record(self, session: Session, job: Job[Any], outcome: Outcome | None) -> None:
        """Write the outcome as the completer does (None: the handler's savepoint
        completed the job already) and count the state it left the job in."""
        self.write_recorded(session, job)
        if outcome is None:
            state = JobState.COMPLETED
        else:
            changed = finish_in(session.connection(), [outcome])
            if not changed:
                # The run was no longer current: the handler moved its own job (through
                # the test's session, say). Count the state the row is in.
                session.expire(job)
            state = changed[0][1] if changed else JobState(job.state)
            error = (outcome.error or {}).get("error")
            if error is not None:
                self.errors.append(f"job {job.id} ({job.kind}) attempt {job.attempt}: {error}")
        if state in _COUNTED:
            self.counts[_COUNTED[state]] += 1
        # The row moved on under the ORM object: reload it on next access.
        session.expire(job)

    def bring_scheduled_forward(self, session: Session) -> None:
        session.execute(
            update(Job)
            .where(state_is(Job.state, JobState.SCHEDULED), Job.queue.in_(self.queues))
            .values(scheduled_at=func.now())
            .execution_options(synchronize_session=False)
        )

    def summary(self) -> RunSummary:
        return RunSummary(**self.counts, errors=tuple(self.errors), jobs=tuple(self.jobs))


def _call_sync(_session: Session, handler: Handler, job: Job[Any]) -> Any:
    return handler.function(job)


class InlineUsageError(TypeError):
    """:func:`run_jobs` cannot run a handler from where it was called (an async handler
    that takes a session, given a sync ``Session``; async handlers inside a running
    event loop, given a sync ``Session``)."""


def _needs_async_session(handler: Handler) -> str:
    name = getattr(handler.function, "__qualname__", repr(handler.function))
    return (
        f"the handler {name} of kind {handler.kind.name!r} is async and takes a session, "
        "which must be an AsyncSession: use `await run_jobs(async_session, worker)` in an "
        "async test"
    )


def _not_settled(_execution: Execution, _outcome: Outcome | None, _by_runner: bool) -> None:
    """run_jobs writes outcomes itself; nothing settles an execution behind its back."""


def _failure(_session: Session, execution: Execution, exc: Exception) -> Outcome:
    return execution.outcome_for_exception(exc)


def _run_in_savepoint(session: Session, execution: Execution, handler: Handler) -> None:
    job = execution.job
    with session.begin_nested():
        result = handler.function(job, session)
        complete_encoded(session, job, execution.encode_result(result))


def _run_coroutine(function: Callable[..., Any], job: Job[Any]) -> Any:
    """Run an async handler taking ``(job)`` from sync code, on an event loop of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise InlineUsageError(
            "run_jobs(session, ...) with a sync Session was called inside a running event "
            "loop, where an async handler cannot be run to completion; use an AsyncSession: "
            "`await run_jobs(async_session, worker)`"
        )
    result = function(job)
    if inspect.isawaitable(result):
        return asyncio.run(_awaited(result))
    return result


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable
