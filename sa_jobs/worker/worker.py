"""The :class:`Worker`: wires producers, executions, the completer and maintenance.

A ``Worker`` is configuration plus handlers; each :meth:`Worker.start` builds a fresh
:class:`_Run` (threads, pools, producers) and :meth:`Worker.stop` tears it down, so a
worker can be started again after it stopped — the natural shape of a test that drains,
moves the clock, and drains again. Handler registrations belong to the worker and
survive.
"""

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
from sqlalchemy.ext.asyncio import AsyncEngine

from sa_jobs.complete import Outcome
from sa_jobs.errors import InvalidOptionsError, SchemaMissingError
from sa_jobs.models import Job
from sa_jobs.options import UNSET, check_queue, check_timeout
from sa_jobs.schema import (
    CORE_BRANCH,
    SEQUENCE_BRANCH,
    UNIQUE_BRANCH,
    installed_branches,
)
from sa_jobs.states import JobState
from sa_jobs.worker.aio import ASYNC_DRIVERS, EventLoopThread
from sa_jobs.worker.completer import BatchCompleter, Completer, InlineCompleter, OutcomeWriter
from sa_jobs.worker.execution import Execution, Interrupt, run_async, run_sync
from sa_jobs.worker.handlers import HandlerRegistry
from sa_jobs.worker.maintenance.leader import LeaderElection
from sa_jobs.worker.maintenance.loop import MaintenanceConfig, MaintenanceLoop
from sa_jobs.worker.maintenance.presence import Presence
from sa_jobs.worker.notifier import Notifier
from sa_jobs.worker.pool import HandlerThreads
from sa_jobs.worker.producer import Producer, fetch_jobs
from sa_jobs.worker.retry import DEFAULT_RETRY_POLICY, RetryPolicy, retry_delay
from sa_jobs.worker.watchdog import Watchdog

__all__ = ["Worker"]

log = logging.getLogger("sa_jobs.worker")
F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_JOB_TIMEOUT = dt.timedelta(minutes=1)
#: How long :meth:`Worker.stop` gives the completer to write the last outcomes, and each
#: background thread to finish, before leaving them to the rescuer.
SHUTDOWN_FLUSH_TIMEOUT = 10.0
THREAD_JOIN_TIMEOUT = 5.0


class Worker:
    """Runs handlers for jobs of the given queues.

    Args:
        engine: A SQLAlchemy engine on the jobs' database (psycopg 3). Every connection
            the worker opens comes from it — its pool, ``creator``, ``connect_args`` and
            events — including the ``LISTEN`` connection.
        queues: Queue name to concurrency (jobs of that queue run at once in this
            process). Default ``{"default": 10}``.
        job_timeout: Default run time limit; ``None`` (or a negative duration) for none.
            Longer than 365 days is clamped to it.
        retry_policy: When failed jobs run again; default ``attempt ** 4`` s, jittered.
        poll_interval: Seconds between fetches when no notification arrives.
        completer: ``"batch"`` (default: outcomes written in batches) or ``"inline"``.
        maintenance: Intervals for heartbeats, leadership and the maintenance services.
        interrupt_grace: Seconds a timed-out, cancelled or shut-down job gets to stop
            before the worker settles it without waiting for the handler.
        worker_id: A unique name for this process; default ``host-pid-random``.
        async_engine: The engine async handlers' sessions use. Default: one derived from
            ``engine``'s URL, checked at start to reach the same database.
        stuck_thread_limit: How many threads stuck in handlers that ignore their timeout
            are replaced before the worker stops reusing their slots (default: the
            total concurrency). See ``docs/workers.md``.
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
        async_engine: AsyncEngine | None = None,
        stuck_thread_limit: int | None = None,
    ) -> None:
        self.engine = engine
        self.queues = dict(queues if queues is not None else {"default": 10})
        _check_queues(self.queues)
        self.id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        if retry_policy is not None and not callable(getattr(retry_policy, "next_delay", None)):
            raise InvalidOptionsError(
                "retry_policy", f"must have a next_delay(job) method, got {retry_policy!r}"
            )
        self.retry_policy: RetryPolicy = retry_policy or DEFAULT_RETRY_POLICY
        self.async_engine = async_engine
        self.handlers = HandlerRegistry(check_timeout(job_timeout), self._async_session_problem)
        self.maintenance_config = maintenance or MaintenanceConfig()
        self.poll_interval = _positive("poll_interval", poll_interval)
        if completer not in ("batch", "inline"):
            raise InvalidOptionsError(
                "completer", f"must be 'batch' or 'inline', got {completer!r}"
            )
        self._completer_kind = completer
        self.interrupt_grace = _positive("interrupt_grace", interrupt_grace)
        total = sum(self.queues.values())
        if stuck_thread_limit is not None and (
            isinstance(stuck_thread_limit, bool)
            or not isinstance(stuck_thread_limit, int)
            or stuck_thread_limit < 0
        ):
            raise InvalidOptionsError(
                "stuck_thread_limit", f"must be an int of at least 0, got {stuck_thread_limit!r}"
            )
        self.stuck_thread_limit = total if stuck_thread_limit is None else stuck_thread_limit
        self._lifecycle = threading.Lock()
        self._run: _Run | None = None

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
        session is an ``AsyncSession``). The signature is checked here.
        """

        def register(function: F) -> F:
            self.handlers.register(args_class, function, timeout=timeout, retry_policy=retry_policy)
            return function

        return register

    def _async_session_problem(self) -> str | None:
        if self.async_engine is not None or self.engine.dialect.driver in ASYNC_DRIVERS:
            return None
        return (
            f"the engine's driver ({self.engine.dialect.driver}) has no async form; pass "
            "Worker(..., async_engine=...) or make the handler sync"
        )

    def retry_delay_for(self, job: Job) -> tuple[float, str | None]:
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
            run = _Run(self)
            self._run = run
            try:
                run.start()
            except BaseException:
                run.stop(cancel=True, timeout=0, flush_timeout=0)
                self._run = None
                raise

    def run(self) -> None:
        """Work until SIGTERM/SIGINT (or :meth:`stop`).

        The first signal stops fetching and lets running jobs finish; a second one
        cancels them (they go back to ``available`` without spending an attempt).
        """
        self.start()
        run = self._run
        assert run is not None
        with self._signals_stop(run):
            while not run.stop_requested.wait(0.2):
                pass
            self.stop(cancel=run.cancel_requested.is_set())

    def run_until_idle(self, timeout: float | None = 60.0) -> None:
        """Work every job that is due now in this worker's queues, then stop.

        Scheduled and retryable jobs that become due meanwhile are worked too; jobs due
        later are left alone. Meant for tests and scripts; can be called again.

        Raises:
            TimeoutError: still busy after ``timeout`` seconds (the worker is stopped).
        """
        self.start()
        run = self._run
        assert run is not None
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                with self.engine.begin() as connection:
                    promoted = run.maintenance.make_due_jobs_available(connection)
                run.wake_all()
                while not run.idle():
                    if deadline is not None and time.monotonic() > deadline:
                        raise TimeoutError(f"worker still busy after {timeout} s")
                    time.sleep(0.002)
                if not promoted and not self._due_work_left():
                    return
        finally:
            self.stop()

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

    @contextmanager
    def _signals_stop(self, run: _Run) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def on_signal(signum: int, _frame: object) -> None:
            if run.stop_requested.is_set():
                log.info("second %s: cancelling running jobs", signal.Signals(signum).name)
                run.request_stop(cancel=True)
            else:
                log.info("%s: finishing running jobs, then stopping", signal.Signals(signum).name)
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

    def _due_work_left(self) -> bool:
        queues = list(self.queues)
        due = exists().where(
            Job.queue.in_(queues),
            Job.scheduled_at <= func.now(),
            Job.state.in_([JobState.AVAILABLE, JobState.SCHEDULED, JobState.RETRYABLE]),
        )
        with self.engine.connect() as connection:
            return bool(connection.scalar(select(due)))


class _Run:
    """One start-to-stop run of a worker: every thread and piece of state it needs."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.engine = worker.engine
        self.stop_requested = threading.Event()
        self.cancel_requested = threading.Event()
        #: Producers stop fetching; the other services keep going until ``closing``.
        self.stopping_fetch = threading.Event()
        self.closing = threading.Event()
        self._lock = threading.Lock()
        self._executions: dict[int, Execution] = {}
        self._started: list[str] = []

    # -- start and stop

    def start(self) -> None:
        worker = self.worker
        with self.engine.connect() as connection:
            branches = installed_branches(connection)
        if CORE_BRANCH not in branches:
            raise SchemaMissingError(CORE_BRANCH, "the worker found no sa_job table")
        unique = UNIQUE_BRANCH in branches
        sequence = SEQUENCE_BRANCH in branches
        handlers = worker.handlers.all()
        self.pool = HandlerThreads("sa_jobs-job", worker.stuck_thread_limit, self._release_slot)
        needs_loop = any(h.is_async for h in handlers)
        self.loop = EventLoopThread(self.engine, worker.async_engine) if needs_loop else None
        writer = OutcomeWriter(
            self.engine,
            sequences=sequence,
            give_up_after=worker.maintenance_config.rescue_after,
            retry_delay=lambda job: worker.retry_delay_for(job)[0],
        )
        self.completer: Completer = (
            BatchCompleter(writer) if worker._completer_kind == "batch" else InlineCompleter(writer)
        )
        self.watchdog = Watchdog(worker.interrupt_grace)
        self.producers = {
            queue: Producer(
                queue,
                concurrency,
                fetch=lambda q, limit: fetch_jobs(
                    self.engine, q, limit, worker.id, unique=unique, sequence=sequence
                ),
                dispatch=self._dispatch,
                poll_interval=worker.poll_interval,
                stopping=self.stopping_fetch,
            )
            for queue, concurrency in worker.queues.items()
        }
        self.maintenance = MaintenanceLoop(
            self.engine,
            worker.maintenance_config,
            Presence(
                worker.id, list(worker.queues), self.running_ids, self.cancel_running, self.held_ids
            ),
            LeaderElection(worker.id, worker.maintenance_config.leader_ttl),
            self.closing,
            unique=unique,
            sequence=sequence,
            retry_delay=worker.retry_delay_for,
        )
        self.notifier = Notifier(
            self.engine,
            on_queue=self.wake_queue,
            on_cancel=self.cancel_running,
            on_connect=self.wake_all,
            stopping=self.closing,
        )
        if self.loop is not None:
            self.loop.start()
            self._started.append("loop")
            if any(h.is_async and h.wants_session for h in handlers):
                self.loop.check_async_engine()
        self.maintenance.start()
        self._started.append("maintenance")
        self.completer.start()
        self._started.append("completer")
        self.watchdog.start()
        self._started.append("watchdog")
        for producer in self.producers.values():
            producer.start()
        self._started.append("producers")
        self.notifier.start()
        self._started.append("notifier")
        log.info("worker %s started: queues %s", worker.id, worker.queues)

    def request_stop(self, cancel: bool) -> None:
        if cancel:
            self.cancel_requested.set()
        self.stop_requested.set()

    def stop(
        self, *, cancel: bool, timeout: float | None, flush_timeout: float = SHUTDOWN_FLUSH_TIMEOUT
    ) -> None:
        self.request_stop(cancel)
        started = set(self._started)
        self.stopping_fetch.set()
        if "producers" in started:
            for producer in self.producers.values():
                producer.wake()
            for producer in self.producers.values():
                producer.join(THREAD_JOIN_TIMEOUT)
        if "watchdog" in started:
            self._drain(timeout)
        if "completer" in started:
            self.completer.stop(flush_timeout)
        if "watchdog" in started:
            self.watchdog.stop(THREAD_JOIN_TIMEOUT)
        if "loop" in started and self.loop is not None:
            self.loop.stop(THREAD_JOIN_TIMEOUT)
        if hasattr(self, "pool"):
            self.pool.shutdown()
        self.closing.set()
        if "notifier" in started:
            self.notifier.join(THREAD_JOIN_TIMEOUT)
        if "maintenance" in started:
            self.maintenance.join(THREAD_JOIN_TIMEOUT)
        log.info("worker %s stopped", self.worker.id)

    def _drain(self, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        interrupted = False
        while self.running_ids():
            late = deadline is not None and time.monotonic() > deadline
            if (self.cancel_requested.is_set() or late) and not interrupted:
                interrupted = True
                log.info("interrupting %d running jobs", len(self.running_ids()))
                for execution in self._running_executions():
                    self.watchdog.interrupt_now(execution, Interrupt.SHUTDOWN)
            time.sleep(0.01)

    # -- running jobs

    def _dispatch(self, job: Job) -> None:
        handler = self.worker.handlers.find(job.kind)
        execution = Execution(
            job, handler, self.worker.retry_policy, self._settled, on_begin=self.watchdog.watch
        )
        with self._lock:
            self._executions[job.id] = execution
        if handler is not None and handler.is_async:
            assert self.loop is not None
            self.loop.submit(run_async(execution, self.loop.async_engine))
        else:
            self.pool.submit(run_sync, execution, self.engine)

    def _settled(self, execution: Execution, outcome: Outcome | None, by_runner: bool) -> None:
        job = execution.job
        if outcome is not None:
            self.completer.submit(outcome)
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
        if by_runner:
            self._release_slot(execution)
        else:
            self.pool.settled_without_thread(execution)

    def _release_slot(self, execution: Execution) -> None:
        self.producers[execution.job.queue].release()

    def cancel_running(self, job_id: int) -> bool:
        with self._lock:
            execution = self._executions.get(job_id)
        if execution is None:
            return False
        self.watchdog.interrupt_now(execution, Interrupt.CANCELLED)
        return True

    def held_ids(self) -> list[int]:
        """Jobs this process is running or has an unwritten outcome for."""
        return self.running_ids() + list(self.completer.pending_ids())

    def running_ids(self) -> list[int]:
        with self._lock:
            return list(self._executions)

    def _running_executions(self) -> list[Execution]:
        with self._lock:
            return list(self._executions.values())

    def wake_queue(self, queue: str) -> None:
        producer = self.producers.get(queue)
        if producer is not None:
            producer.wake()

    def wake_all(self) -> None:
        for producer in self.producers.values():
            producer.wake()

    def idle(self) -> bool:
        return (
            all(p.drained for p in self.producers.values())
            and not self.running_ids()
            and self.completer.pending() == 0
        )


def _positive(option: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise InvalidOptionsError(option, f"must be a positive number of seconds, got {value!r}")
    if value == float("inf"):
        raise InvalidOptionsError(option, "must be finite")
    return float(value)


def _check_queues(queues: Mapping[str, int]) -> None:
    if not queues:
        raise InvalidOptionsError("queues", "name at least one queue, e.g. {'default': 10}")
    for name, concurrency in queues.items():
        check_queue(name)
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise InvalidOptionsError(
                "queues", f"concurrency of queue {name!r} must be a positive int"
            )
