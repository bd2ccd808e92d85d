"""The :class:`Worker`: configuration, handlers, and the start/stop of its runs.

A ``Worker`` is configuration plus handlers; each :meth:`Worker.start` builds a fresh
:class:`WorkerRun` (threads, pools, producers) and :meth:`Worker.stop` tears it down, so a
worker can be started again after it stopped — the natural shape of a test that drains,
moves the clock, and drains again. Handler registrations belong to the worker and
survive.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import signal
import socket
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Literal, Protocol, TypeVar, cast, overload

from sqlalchemy import URL, Engine
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from sa_jobs._declare.limits import Limit, check_worker_limits
from sa_jobs._declare.option_checks import check_timeout
from sa_jobs._declare.options import UNSET
from sa_jobs._declare.queue_config import Queue
from sa_jobs._table.models import Job
from sa_jobs.errors import InvalidOptionsError
from sa_jobs.hooks import WorkHook, WorkHooks
from sa_jobs.periodic.definition import PeriodicJob, check_periodic_jobs
from sa_jobs.worker.engines import WorkerEngines
from sa_jobs.worker.handlers import HandlerRegistry
from sa_jobs.worker.idle import IdleResult, drain_until_idle, unserved_due_jobs
from sa_jobs.worker.maintenance.loop import MaintenanceConfig
from sa_jobs.worker.notifier import ListenOptions
from sa_jobs.worker.queue_checks import (
    QueueNotes,
    check_worker_queues,
    fair_queues,
    serve_hint,
)
from sa_jobs.worker.retry import DEFAULT_RETRY_POLICY, RetryPolicy, retry_delay
from sa_jobs.worker.run import SHUTDOWN_FLUSH_TIMEOUT, WorkerRun

__all__ = ["Worker"]

log = logging.getLogger("sa_jobs.worker")
F = TypeVar("F", bound=Callable[..., Any])
A = TypeVar("A")
R = TypeVar("R")


class Register(Protocol[A]):
    """What ``@worker.handler(Args)`` returns, as mypy sees it: it takes a handler of
    ``Job[Args]`` — ``(job)`` or ``(job, session)``, sync or async — and gives it back
    with its own type, so a decorated handler can still be called (say, in a unit test).
    """

    @overload
    def __call__(self, handler: Callable[[Job[A]], R], /) -> Callable[[Job[A]], R]: ...

    @overload
    def __call__(
        self, handler: Callable[[Job[A], Session], R], /
    ) -> Callable[[Job[A], Session], R]: ...

    @overload
    def __call__(
        self, handler: Callable[[Job[A], AsyncSession], R], /
    ) -> Callable[[Job[A], AsyncSession], R]: ...


DEFAULT_JOB_TIMEOUT = dt.timedelta(minutes=1)
#: How long :meth:`Worker.run_until_idle` waits before looking again for due jobs that
#: its limits held back.
LIMITED_RECHECK = 0.05


class Worker:
    """Runs handlers for jobs of the given queues.

    Args:
        engine: A SQLAlchemy ``Engine`` or ``AsyncEngine`` on the jobs' database, on
            psycopg 3, psycopg2, asyncpg (or pg8000, which polls). With an ``Engine``,
            every connection of the worker's threads comes from it — its pool,
            ``creator``, ``connect_args`` and events — including the ``LISTEN``
            connection. With an ``AsyncEngine``, async handlers' sessions use it (with a
            pool of their own) and the worker's threads use ``sync_engine``.
        queues: Queue name to concurrency (jobs of that queue run at once in this
            process), a mapping: ``{"mail": 10}``; a value may be a
            ``sa_jobs.Queue(10, fair_by=[...], weights={...})`` for a queue fetched
            round-robin across partition keys (``docs/queues.md``, "Limits by key and
            fair queues"). Default ``{"default": 10}``. At start
            the worker warns about a handler whose kind defaults to a queue it does not
            serve, and about a queue nothing else names (a typo?).
        job_timeout: Default run time limit; ``None`` (or a negative duration) for none.
            Longer than 365 days is clamped to it.
        retry_policy: When failed jobs run again; default ``attempt ** 4`` s, jittered.
        poll_interval: Seconds between fetches when no notification arrives.
        completer: ``"batch"`` (default: outcomes written in batches) or ``"inline"``.
        maintenance: Intervals for heartbeats, leadership and the maintenance services.
        interrupt_grace: Seconds a timed-out, cancelled or shut-down job gets to stop
            before the worker settles it without waiting for the handler.
        worker_id: A unique name for this process; default ``host-pid-random``.
        async_engine: For an ``Engine``: the engine async handlers' sessions use.
            Default: one derived from ``engine``'s URL (psycopg 3's async form), checked
            at start to reach the same database.
        sync_engine: For an ``AsyncEngine``: the engine of the worker's threads and of
            sync handlers' sessions. Default: one derived from ``engine``'s URL
            (psycopg 3), checked at start to reach the same database.
        stuck_thread_limit: How many threads stuck in handlers that ignore their timeout
            are replaced before the worker stops reusing their slots (default: the
            total concurrency). See ``docs/workers.md``.
        listen_engine: Where the ``LISTEN`` connection comes from, when the worker's
            engine cannot hold one: behind PgBouncer in transaction mode, an ``Engine``
            (or a URL) with a **direct** connection to the same database (psycopg 3 or
            psycopg2; checked at start). Default: the worker's engine.
        poll_only: Never ``LISTEN``: poll for new jobs every ``poll_interval`` and find
            cancel requests at each heartbeat. Without either option, a listen
            connection that receives no notification (a transaction pooler) makes the
            worker poll with a warning. See ``docs/operations.md``.
        hooks: Work hooks (:class:`sa_jobs.hooks.WorkHook`) called around every
            attempt, in this order; more with :meth:`add_hook`. See
            ``docs/observability.md``.
        max_output_bytes: The cap on a handler's output (its return value, encoded as
            JSON); default 1 MiB. A kind's ``job_args(max_output_bytes=...)`` wins. An
            output over it fails that attempt. See ``docs/results.md``.
    """

    def __init__(
        self,
        engine: Engine | AsyncEngine,
        queues: Mapping[str, int | Queue] | None = None,
        *,
        job_timeout: dt.timedelta | float | None = DEFAULT_JOB_TIMEOUT,
        retry_policy: RetryPolicy | None = None,
        poll_interval: float = 1.0,
        completer: Literal["batch", "inline"] = "batch",
        maintenance: MaintenanceConfig | None = None,
        interrupt_grace: float = 5.0,
        worker_id: str | None = None,
        async_engine: AsyncEngine | None = None,
        stuck_thread_limit: int | None = None,
        sync_engine: Engine | None = None,
        listen_engine: Engine | URL | str | None = None,
        poll_only: bool = False,
        periodic: Iterable[PeriodicJob] = (),
        hooks: Iterable[WorkHook] = (),
        limits: Iterable[Limit] = (),
        max_output_bytes: int | None = None,
    ) -> None:
        if max_output_bytes is not None and (
            isinstance(max_output_bytes, bool)
            or not isinstance(max_output_bytes, int)
            or max_output_bytes < 1
        ):
            raise InvalidOptionsError(
                "max_output_bytes", f"must be a positive int, got {max_output_bytes!r}"
            )
        #: The cap on handlers' outputs (None: 1 MiB); a kind's own cap wins.
        self.max_output_bytes = max_output_bytes
        #: The periodic jobs this process fires (checked: distinct names).
        self.periodic: list[PeriodicJob] = check_periodic_jobs(periodic)
        #: Where notifications come from (``listen_engine``, ``poll_only``).
        self.listen = ListenOptions.build(listen_engine, poll_only)
        self.engines = WorkerEngines(engine, sync_engine=sync_engine, async_engine=async_engine)
        #: The engine of the worker's threads (the given one, unless that is async).
        self.engine: Engine = self.engines.sync
        self._run: WorkerRun | None = None
        self._stuck_limit_given = stuck_thread_limit
        self._limits: tuple[Limit, ...] = ()
        self._fair: dict[str, Queue] = {}
        #: What was said at start about the queues (each finding once).
        self.queue_notes = QueueNotes()
        self.queues = queues if queues is not None else {"default": 10}
        self._limits = check_worker_limits(limits, self.queues)
        self.id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        if retry_policy is not None and not callable(getattr(retry_policy, "next_delay", None)):
            raise InvalidOptionsError(
                "retry_policy", f"must have a next_delay(job) method, got {retry_policy!r}"
            )
        self.retry_policy: RetryPolicy = retry_policy or DEFAULT_RETRY_POLICY
        self.handlers = HandlerRegistry(check_timeout(job_timeout), self._async_session_problem)
        self.maintenance_config = maintenance or MaintenanceConfig()
        self.poll_interval = _positive("poll_interval", poll_interval)
        if completer not in ("batch", "inline"):
            raise InvalidOptionsError(
                "completer", f"must be 'batch' or 'inline', got {completer!r}"
            )
        self.completer_kind: Literal["batch", "inline"] = completer
        self.interrupt_grace = _positive("interrupt_grace", interrupt_grace)
        if stuck_thread_limit is not None and (
            isinstance(stuck_thread_limit, bool)
            or not isinstance(stuck_thread_limit, int)
            or stuck_thread_limit < 0
        ):
            raise InvalidOptionsError(
                "stuck_thread_limit", f"must be an int of at least 0, got {stuck_thread_limit!r}"
            )
        if stuck_thread_limit is not None:
            self.stuck_thread_limit = stuck_thread_limit
        self._lifecycle = threading.Lock()
        #: Work hooks, in the order their ``before_work`` is called.
        self.hooks: list[WorkHook] = []
        for hook in hooks:
            self.add_hook(hook)

    @property
    def queues(self) -> dict[str, int]:
        """Queue name to concurrency. Settable while the worker is stopped (the command
        line's ``-q`` does); the default ``stuck_thread_limit`` follows the total."""
        return self._queues

    @queues.setter
    def queues(self, queues: Mapping[str, int | Queue]) -> None:
        if self._run is not None:
            raise InvalidOptionsError("queues", "cannot change while the worker runs; stop() it")
        checked = check_worker_queues(queues)
        check_worker_limits(self._limits, checked)
        self._queues = checked
        self._fair = fair_queues(queues)
        if self._stuck_limit_given is None:
            self.stuck_thread_limit = sum(checked.values())

    @property
    def limits(self) -> tuple[Limit, ...]:
        """The limits this worker's fetches enforce (checked against its queues)."""
        return self._limits

    @property
    def fair(self) -> dict[str, Queue]:
        """The fair queues among :attr:`queues`: name -> its ``sa_jobs.Queue``."""
        return dict(self._fair)

    # ------------------------------------------------------------------ registration

    def handler(
        self,
        args_class: type[A],
        *,
        timeout: dt.timedelta | float | None = UNSET,
        retry_policy: RetryPolicy | None = None,
    ) -> Register[A]:
        """Register the decorated function for jobs of ``args_class``'s kind.

        The function takes ``(job)`` or ``(job, session)``; with a ``session`` the worker
        opens a transaction, passes it in, and completes the job in that same transaction
        before committing. ``async def`` handlers run on the worker's event loop (their
        session is an ``AsyncSession``). The signature is checked here, and so is the
        job parameter's annotation: ``job: Job[SendEmail]`` for ``SendEmail`` jobs
        (mypy checks the same statically).
        """

        def register(function: F) -> F:
            if self._run is not None:
                raise InvalidOptionsError(
                    "handler", "cannot be registered while the worker runs; stop() it first"
                )
            self.handlers.register(args_class, function, timeout=timeout, retry_policy=retry_policy)
            return function

        return cast(Register[A], register)

    def add_hook(self, hook: WorkHook) -> None:
        """Call ``hook`` around every attempt, after the hooks added before it.

        Raises:
            InvalidOptionsError: ``hook`` lacks ``before_work`` or ``after_work``, or
                the worker is running (stop() it first).
        """
        WorkHooks.check(hook)
        if self._run is not None:
            raise InvalidOptionsError("hooks", "cannot be added while the worker runs; stop() it")
        self.hooks.append(hook)

    def _async_session_problem(self) -> str | None:
        return self.engines.async_problem

    def retry_delay_for(self, job: Job[Any]) -> tuple[float, str | None]:
        """When ``job`` runs again after a failed attempt: its handler's retry policy, else
        the worker's (used by the rescuer too)."""
        handler = self.handlers.find(job.kind)
        policy = handler.retry_policy if handler is not None else None
        return retry_delay(policy or self.retry_policy, job)

    # ------------------------------------------------------------------ lifecycle

    @property
    def is_running(self) -> bool:
        return self._run is not None

    @property
    def listening(self) -> threading.Event:
        """Set while the worker's LISTEN connection is up (a test signal: a NOTIFY sent
        after it is set reaches the worker)."""
        run = self._run
        return run.notifier.connected if run is not None else threading.Event()

    @property
    def stuck_threads(self) -> int:
        """Threads currently stuck in handlers whose runs were settled without them."""
        run = self._run
        return run.pool.stuck if run is not None else 0

    @property
    def stuck_thread_limit_reached(self) -> bool:
        """``stuck_thread_limit`` handler threads are stuck: the next stuck run keeps its
        slot for good (or one does already). Restart the process to get them back
        (``sa-jobs work --replace-stuck`` does)."""
        run = self._run
        return run.pool.limit_reached if run is not None else False

    def start(self) -> None:
        """Start fetching and working in background threads; returns once they run.

        A stopped worker can be started again.

        Raises:
            InvalidOptionsError: the worker is running already, or its async engine
                reaches another database.
            SchemaMissingError: the database has no sa_jobs schema.
        """
        with self._lifecycle:
            if self._run is not None:
                raise InvalidOptionsError("worker", "is running already; stop() it first")
            run = WorkerRun(self)
            self._run = run
            try:
                run.start()
            except BaseException:
                run.stop(cancel=True, timeout=0, flush_timeout=0)
                self._run = None
                self.engines.dispose_derived()
                raise

    async def start_async(self) -> None:
        """:meth:`start` for async apps: starts the worker's threads without blocking the
        caller's event loop (say, in a FastAPI lifespan). The worker runs its own loop
        for async handlers; the app's loop only awaits these calls."""
        await asyncio.to_thread(self.start)

    async def stop_async(
        self,
        cancel: bool = False,
        timeout: float | None = None,
        *,
        flush_timeout: float = SHUTDOWN_FLUSH_TIMEOUT,
    ) -> None:
        """:meth:`stop` without blocking the caller's event loop."""
        await asyncio.to_thread(self.stop, cancel, timeout, flush_timeout=flush_timeout)

    async def run_until_idle_async(self, timeout: float | None = 60.0) -> IdleResult:
        """:meth:`run_until_idle` without blocking the caller's event loop. Cancelling
        the awaiting task stops the worker (gracefully) before the cancellation goes on."""
        try:
            return await asyncio.to_thread(self.run_until_idle, timeout)
        except asyncio.CancelledError:
            # The thread would otherwise drain on, unseen, after the task is gone.
            await asyncio.to_thread(self.stop)
            raise

    async def __aenter__(self) -> Worker:
        """``async with worker:`` starts it and stops it (gracefully) on the way out."""
        await self.start_async()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.stop_async()

    def run(self) -> None:
        """Work until SIGTERM/SIGINT (or :meth:`stop`).

        The first signal stops fetching and lets running jobs finish; a second one
        cancels them (they go back to ``available`` without spending an attempt).
        """
        self.start()
        run = self._run
        if run is None:  # stop() from another thread got in first
            return
        with self._signals_stop(run):
            while not run.stop_requested.wait(0.2):
                pass
            self.stop(cancel=run.cancel_requested.is_set())

    def run_until_idle(self, timeout: float | None = 60.0) -> IdleResult:
        """Work every job that is due now in this worker's queues, then stop.

        Scheduled and retryable jobs that become due meanwhile are worked too; jobs due
        later, and jobs of paused queues, are left alone; jobs a limit holds back are
        waited for (a rate limit's next window, another process's running jobs). Meant
        for tests and scripts; can be called again. It returns early, gracefully, on
        :meth:`stop` from another thread or — called from the main thread — on
        SIGTERM/SIGINT, as :meth:`run` does (a second signal cancels the running jobs);
        what is left stays queued.

        Due jobs of queues this worker does not serve are not its work, but they are
        counted, logged as a warning, and returned: a script that "worked everything"
        learns that a job still waits in a queue nobody served.

        Returns:
            An :class:`~sa_jobs.worker.idle.IdleResult`: attempts worked, available jobs
            left in queues this worker does not serve (``unserved``), and whether it
            stopped early.

        Raises:
            TimeoutError: still busy after ``timeout`` seconds (the worker is stopped).
        """
        self.start()
        run = self._run
        if run is None:  # stop() from another thread got in first
            return IdleResult(stopped_early=True)
        stopped_early, unserved = True, {}
        try:
            with self._signals_stop(run):
                recheck = LIMITED_RECHECK if self._limits else None
                if drain_until_idle(run, self.engine, self.queues, timeout, recheck):
                    stopped_early, unserved = False, self._report_unserved()
                else:
                    log.info("stopped before the queues were idle; what is left stays queued")
        finally:
            self.stop(cancel=run.cancel_requested.is_set())
        # Counted after stop(): the jobs still running when a signal came have ended.
        return IdleResult(worked=run.settled_count, unserved=unserved, stopped_early=stopped_early)

    def _report_unserved(self) -> dict[str, int]:
        unserved = unserved_due_jobs(self.engine, self.queues)
        if unserved:
            counts = ", ".join(f"{queue!r} ({count})" for queue, count in unserved.items())
            served = ", ".join(repr(queue) for queue in self.queues)
            log.warning(
                "idle, but available jobs remain in queues this worker does not serve: %s "
                "(it serves %s); they wait until a worker serves them: %s",
                counts,
                served,
                serve_hint(self.queues, unserved),
            )
        return unserved

    def stop(
        self,
        cancel: bool = False,
        timeout: float | None = None,
        *,
        flush_timeout: float = SHUTDOWN_FLUSH_TIMEOUT,
    ) -> None:
        """Stop fetching, wait for running jobs, write their outcomes, and shut down.

        With ``cancel=True`` (or once ``timeout`` seconds have passed) running jobs are
        interrupted and go back to ``available`` without spending an attempt; a handler
        that does not stop is settled after ``interrupt_grace``. Calling
        ``stop(cancel=True)`` while a plain ``stop()`` is waiting escalates it.

        How long it takes: waiting for running jobs is bounded by their timeouts (plus
        ``interrupt_grace``), or by ``timeout``; then the last outcomes get at most
        ``flush_timeout`` seconds (default 10) to be written and each background thread
        at most ``THREAD_JOIN_TIMEOUT`` (5 s) to end; whatever is left then is left to
        the rescuer. Called while :meth:`start` runs in another thread, it waits for the
        start to finish, then stops.
        """
        run = self._run
        if run is not None:
            run.request_stop(cancel)
        with self._lifecycle:
            run = self._run
            if run is None:
                return
            try:
                run.stop(cancel=cancel, timeout=timeout, flush_timeout=flush_timeout)
            finally:
                self._run = None
                self.engines.dispose_derived()

    @contextmanager
    def _signals_stop(self, run: WorkerRun) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def on_signal(signum: int, _frame: object) -> None:
            name = signal.Signals(signum).name
            if run.stop_requested.is_set():
                log.info("second %s: cancelling running jobs", name)
                run.request_stop(cancel=True)
            else:
                # No lock here: the main thread may hold one when the signal arrives.
                log.info(
                    "%s: finishing running jobs, then stopping; a second SIGINT or SIGTERM "
                    "(Ctrl-C again) cancels them, and they go back to 'available' without "
                    "spending an attempt",
                    name,
                )
                run.request_stop(cancel=False)

        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def cancel_running(self, job_id: int) -> bool:
        """Interrupt a job this process is running (what ``cancel_job`` triggers)."""
        run = self._run
        return run.cancel_running(job_id) if run is not None else False


def _positive(option: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise InvalidOptionsError(option, f"must be a positive number of seconds, got {value!r}")
    if value == float("inf"):
        raise InvalidOptionsError(option, "must be finite")
    return float(value)
