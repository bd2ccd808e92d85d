"""The :class:`Worker`: wires producers, executions, the completer and maintenance."""

from __future__ import annotations

import datetime as dt
import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Literal, TypeVar

from sqlalchemy import Engine, exists, func, select

from sa_jobs.args import UNSET
from sa_jobs.complete import Outcome
from sa_jobs.errors import InvalidOptionsError, SchemaMissingError
from sa_jobs.models import Job, JobState
from sa_jobs.options import check_queue
from sa_jobs.schema import (
    CORE_BRANCH,
    JOB_KEY_BRANCH,
    SEQUENCE_BRANCH,
    UNIQUE_BRANCH,
    installed_branches,
)
from sa_jobs.worker.aio import EventLoopThread
from sa_jobs.worker.completer import BatchCompleter, Completer, InlineCompleter
from sa_jobs.worker.execution import Execution, Interrupt, run_async, run_sync
from sa_jobs.worker.handlers import Handler, HandlerRegistry
from sa_jobs.worker.maintenance.leader import LeaderElection
from sa_jobs.worker.maintenance.loop import MaintenanceConfig, MaintenanceLoop
from sa_jobs.worker.maintenance.presence import Presence
from sa_jobs.worker.notifier import Notifier
from sa_jobs.worker.pool import DaemonThreadPool
from sa_jobs.worker.producer import Producer, fetch_jobs
from sa_jobs.worker.retry import ExponentialRetry, RetryPolicy
from sa_jobs.worker.watchdog import Watchdog

__all__ = ["Worker"]

log = logging.getLogger("sa_jobs.worker")
F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_JOB_TIMEOUT = dt.timedelta(minutes=1)


class Worker:
    """Runs handlers for jobs of the given queues.

    Args:
        engine: A SQLAlchemy engine on the jobs' database (psycopg 3).
        queues: Queue name to concurrency (jobs of that queue run at once in this
            process). Default ``{"default": 10}``.
        job_timeout: Default run time limit; ``None`` (or a negative duration) for none.
        retry_policy: When failed jobs run again; default ``attempt ** 4`` s, jittered.
        poll_interval: Seconds between fetches when no notification arrives.
        completer: ``"batch"`` (default: outcomes written in batches) or ``"inline"``.
        maintenance: Intervals for heartbeats, leadership and the maintenance services.
        interrupt_grace: Seconds a timed-out, cancelled or shut-down job gets to stop
            before the worker settles it without waiting for the handler.
        worker_id: A unique name for this process; default ``host-pid-random``.
    """

    def __init__(
        self,
        engine: Engine,
        queues: Mapping[str, int] | None = None,
        *,
        job_timeout: dt.timedelta | float | None = DEFAULT_JOB_TIMEOUT,
        retry_policy: RetryPolicy | None = None,
        poll_interval: float = 1.0,
        completer: Literal["batch", "inline"] = "batch",
        maintenance: MaintenanceConfig | None = None,
        interrupt_grace: float = 5.0,
        worker_id: str | None = None,
    ) -> None:
        from sa_jobs.options import check_timeout

        self.engine = engine
        self.queues = dict(queues if queues is not None else {"default": 10})
        _check_queues(self.queues)
        self.id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.retry_policy: RetryPolicy = retry_policy or ExponentialRetry()
        self.handlers = HandlerRegistry(check_timeout(job_timeout))
        self.maintenance_config = maintenance or MaintenanceConfig()
        self.poll_interval = poll_interval
        self._completer_kind = completer
        self._interrupt_grace = interrupt_grace
        self._executions: dict[int, Execution] = {}
        self._lock = threading.Lock()
        self._started = False
        self._stop_lock = threading.Lock()
        self._stop_requested = threading.Event()
        self._cancel_requested = threading.Event()
        self._stopped = threading.Event()
        self._stopping_fetch = threading.Event()
        self._closing = threading.Event()

    # ------------------------------------------------------------------ registration

    def handler(
        self,
        args_class: type,
        *,
        timeout: dt.timedelta | float | Any | None = UNSET,
        retry_policy: RetryPolicy | None = None,
    ) -> Callable[[F], F]:
        """Register the decorated function for jobs of ``args_class``'s kind.

        The function takes ``(job)`` or ``(job, session)``; with a ``session`` the worker
        opens a transaction, passes it in, and completes the job in that same transaction
        before committing. ``async def`` handlers run on the worker's event loop (their
        session is an ``AsyncSession``).
        """

        def register(function: F) -> F:
            self.handlers.register(args_class, function, timeout=timeout, retry_policy=retry_policy)
            return function

        return register

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start fetching and working in background threads; returns at once."""
        if self._started:
            raise InvalidOptionsError("worker", "a Worker can be started once")
        self._started = True
        with self.engine.connect() as connection:
            self.branches = installed_branches(connection)
        if CORE_BRANCH not in self.branches:
            raise SchemaMissingError(CORE_BRANCH, "the worker found no sa_job table")
        unique = UNIQUE_BRANCH in self.branches
        sequence = SEQUENCE_BRANCH in self.branches
        handlers = self.handlers.all()
        total = sum(self.queues.values())
        # Twice the slots: a thread stuck in a handler that ignores its timeout keeps its
        # thread, while the watchdog frees its slot.
        self._pool = DaemonThreadPool(total * 2, "sa_jobs-job")
        self._loop = EventLoopThread(self.engine) if any(h.is_async for h in handlers) else None
        self._completer: Completer = (
            BatchCompleter(self.engine, sequences=sequence)
            if self._completer_kind == "batch"
            else InlineCompleter(self.engine, sequences=sequence)
        )
        self._watchdog = Watchdog(self._interrupt_grace)
        self._producers = {
            queue: Producer(
                queue,
                concurrency,
                fetch=lambda q, limit: fetch_jobs(
                    self.engine, q, limit, self.id, unique=unique, sequence=sequence
                ),
                dispatch=self._dispatch,
                poll_interval=self.poll_interval,
                stopping=self._stopping_fetch,
            )
            for queue, concurrency in self.queues.items()
        }
        self._maintenance = MaintenanceLoop(
            self.engine,
            self.maintenance_config,
            Presence(
                self.id, list(self.queues), self._running_ids, self.cancel_running, self._held_ids
            ),
            LeaderElection(self.id, self.maintenance_config.leader_ttl),
            self._closing,
            unique=unique,
            sequence=sequence,
            job_key=JOB_KEY_BRANCH in self.branches,
        )
        self._notifier = Notifier(
            self.engine,
            on_queue=self._wake_queue,
            on_cancel=self.cancel_running,
            on_connect=self._wake_all,
            stopping=self._closing,
        )
        self._maintenance.start()
        self._completer.start()
        self._watchdog.start()
        if self._loop is not None:
            self._loop.start()
        for producer in self._producers.values():
            producer.start()
        self._notifier.start()
        log.info("worker %s started: queues %s", self.id, self.queues)

    def run(self) -> None:
        """Work until SIGTERM/SIGINT (or :meth:`stop`).

        The first signal stops fetching and lets running jobs finish; a second one
        cancels them (they go back to ``available`` without spending an attempt).
        """
        self.start()
        with self._signals_stop():
            while not self._stop_requested.wait(0.2):
                pass
            self.stop(cancel=self._cancel_requested.is_set())

    def run_until_idle(self, timeout: float | None = 60.0) -> None:
        """Work every job that is due now in this worker's queues, then stop.

        Scheduled and retryable jobs that become due meanwhile are worked too; jobs due
        later are left alone. Meant for tests and scripts.

        Raises:
            TimeoutError: still busy after ``timeout`` seconds (the worker is stopped).
        """
        self.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                with self.engine.begin() as connection:
                    promoted = self._maintenance.make_due_jobs_available(connection)
                self._wake_all()
                while not self._idle():
                    if deadline is not None and time.monotonic() > deadline:
                        raise TimeoutError(f"worker still busy after {timeout} s")
                    time.sleep(0.002)
                if not promoted and not self._due_work_left():
                    return
        finally:
            self.stop()

    def stop(self, cancel: bool = False, timeout: float | None = None) -> None:
        """Stop fetching, wait for running jobs, write their outcomes, and shut down.

        With ``cancel=True`` (or once ``timeout`` seconds have passed) running jobs are
        interrupted and go back to ``available`` without spending an attempt. Calling
        ``stop(cancel=True)`` while a plain ``stop()`` is waiting escalates it.
        """
        if cancel:
            self._cancel_requested.set()
        self._stop_requested.set()
        with self._stop_lock:
            if self._stopped.is_set() or not self._started:
                return
            self._stopping_fetch.set()
            for producer in self._producers.values():
                producer.wake()
                producer.join()
            self._drain(timeout)
            self._completer.stop()
            self._watchdog.stop()
            if self._loop is not None:
                self._loop.stop()
            self._pool.shutdown()
            self._closing.set()
            self._notifier.join()
            self._maintenance.join()
            self._stopped.set()
            log.info("worker %s stopped", self.id)

    def _drain(self, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        interrupted = False
        while self._running_ids():
            late = deadline is not None and time.monotonic() > deadline
            if (self._cancel_requested.is_set() or late) and not interrupted:
                interrupted = True
                log.info("interrupting %d running jobs", len(self._running_ids()))
                for execution in self._running_executions():
                    self._watchdog.interrupt_now(execution, Interrupt.SHUTDOWN)
            time.sleep(0.01)

    @contextmanager
    def _signals_stop(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def on_signal(signum: int, _frame: object) -> None:
            if self._stop_requested.is_set():
                log.info("second %s: cancelling running jobs", signal.Signals(signum).name)
                self._cancel_requested.set()
            else:
                log.info("%s: finishing running jobs, then stopping", signal.Signals(signum).name)
                self._stop_requested.set()

        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    # ------------------------------------------------------------------ running jobs

    def _dispatch(self, job: Job) -> None:
        handler: Handler | None
        try:
            handler = self.handlers.get(job.kind)
        except LookupError:
            handler = None
        execution = Execution(job, handler, self.retry_policy, self._settled)
        with self._lock:
            self._executions[job.id] = execution
        self._watchdog.watch(execution)
        if handler is not None and handler.is_async:
            assert self._loop is not None
            self._loop.submit(run_async(execution, self._loop.async_engine))
        else:
            self._pool.submit(run_sync, execution, self.engine)

    def _settled(self, execution: Execution, outcome: Outcome | None) -> None:
        job = execution.job
        if outcome is not None:
            self._completer.submit(outcome)
            if outcome.error is not None:
                log.warning(
                    "job %d (%s) attempt %d: %s",
                    job.id,
                    job.kind,
                    job.attempt,
                    outcome.error.get("error"),
                )
        with self._lock:
            self._executions.pop(job.id, None)
        self._producers[job.queue].release()

    def cancel_running(self, job_id: int) -> bool:
        """Interrupt a job this process is running (what ``cancel_job`` triggers)."""
        with self._lock:
            execution = self._executions.get(job_id)
        if execution is None:
            return False
        self._watchdog.interrupt_now(execution, Interrupt.CANCELLED)
        return True

    def _held_ids(self) -> list[int]:
        """Jobs this process is running or has an unwritten outcome for."""
        return self._running_ids() + list(self._completer.pending_ids())

    def _running_ids(self) -> list[int]:
        with self._lock:
            return list(self._executions)

    def _running_executions(self) -> list[Execution]:
        with self._lock:
            return list(self._executions.values())

    def _wake_queue(self, queue: str) -> None:
        producer = self._producers.get(queue)
        if producer is not None:
            producer.wake()

    def _wake_all(self) -> None:
        for producer in self._producers.values():
            producer.wake()

    def _idle(self) -> bool:
        return (
            all(p.drained for p in self._producers.values())
            and not self._running_ids()
            and self._completer.pending() == 0
        )

    def _due_work_left(self) -> bool:
        queues = list(self.queues)
        due = exists().where(
            Job.queue.in_(queues),
            Job.scheduled_at <= func.now(),
            Job.state.in_([JobState.AVAILABLE, JobState.SCHEDULED, JobState.RETRYABLE]),
        )
        with self.engine.connect() as connection:
            return bool(connection.scalar(select(due)))


def _check_queues(queues: Mapping[str, int]) -> None:
    if not queues:
        raise InvalidOptionsError("queues", "name at least one queue, e.g. {'default': 10}")
    for name, concurrency in queues.items():
        check_queue(name)
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise InvalidOptionsError(
                "queues", f"concurrency of queue {name!r} must be a positive int"
            )
