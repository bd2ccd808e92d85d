"""One start-to-stop run of a :class:`~sa_jobs.worker.Worker`: its threads and state.

``Worker.start`` builds a :class:`WorkerRun` and ``Worker.stop`` tears it down, so a
worker can be started again. The run wires the pieces, each in its own module:
producers fetch (:mod:`.producer`; :mod:`.limited_fetch` for limited queues), a pool
of threads and an event loop run handlers (:mod:`.pool`, :mod:`.aio`,
:mod:`.execution`), the watchdog enforces timeouts
(:mod:`.watchdog`), the completer writes outcomes (:mod:`.completer`), the notifier
listens (:mod:`.notifier`) and the maintenance thread keeps the table healthy
(:mod:`.maintenance.loop`).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Literal, Protocol

from sqlalchemy import Engine

from sa_jobs._act.complete import record_output_in
from sa_jobs._act.workflow_outputs import read_step_output
from sa_jobs._base.records import Outcome
from sa_jobs._declare.limits import Limit, unhandled_kind_limits
from sa_jobs._declare.queue_config import Queue
from sa_jobs._table.models import Job
from sa_jobs._table.schema import (
    FAIRNESS_BRANCH,
    LIMITS_BRANCH,
    OUTPUT_BRANCH,
    PERIODIC_BRANCH,
    Features,
)
from sa_jobs.errors import SchemaMissingError
from sa_jobs.hooks import WorkHook, WorkHooks
from sa_jobs.periodic.definition import PeriodicJob
from sa_jobs.worker.aio import EventLoopThread
from sa_jobs.worker.completer import BatchCompleter, Completer, InlineCompleter, OutcomeWriter
from sa_jobs.worker.db_access import autocommit
from sa_jobs.worker.engines import WorkerEngines, prepare_warning
from sa_jobs.worker.execution import Execution, Interrupt, OutputSettings
from sa_jobs.worker.handler_runs import run_async, run_sync
from sa_jobs.worker.handlers import HandlerRegistry
from sa_jobs.worker.keyed_fetch import fetch_keyed, plan_keyed
from sa_jobs.worker.limited_fetch import fetch_limited, plan_limits
from sa_jobs.worker.maintenance.loop import MaintenanceConfig, MaintenanceLoop
from sa_jobs.worker.maintenance.periodic import PeriodicTicker
from sa_jobs.worker.maintenance.periodic_thread import PeriodicThread
from sa_jobs.worker.missing_rows import UNCHECKED, check_batch
from sa_jobs.worker.notifier import ListenOptions, Notifier, check_same_database
from sa_jobs.worker.outage import OutageLog
from sa_jobs.worker.pool import HandlerThreads
from sa_jobs.worker.producer import Producer, fetch_jobs
from sa_jobs.worker.queue_checks import QueueNotes
from sa_jobs.worker.retry import RetryPolicy
from sa_jobs.worker.watchdog import Watchdog

__all__ = ["SHUTDOWN_FLUSH_TIMEOUT", "THREAD_JOIN_TIMEOUT", "RunSettings", "WorkerRun"]

log = logging.getLogger("sa_jobs.worker")

#: How long :meth:`~sa_jobs.worker.Worker.stop` gives the completer to write the last outcomes, by
#: default, and each background thread to finish, before leaving them to the rescuer.
SHUTDOWN_FLUSH_TIMEOUT = 10.0
THREAD_JOIN_TIMEOUT = 5.0


class RunSettings(Protocol):
    """What a run needs of its worker (the :class:`~sa_jobs.worker.Worker` itself)."""

    engine: Engine
    queues: dict[str, int]
    id: str
    retry_policy: RetryPolicy
    engines: WorkerEngines
    handlers: HandlerRegistry
    maintenance_config: MaintenanceConfig
    poll_interval: float
    interrupt_grace: float
    stuck_thread_limit: int
    listen: ListenOptions
    periodic: list[PeriodicJob]
    hooks: list[WorkHook]
    queue_notes: QueueNotes
    max_output_bytes: int | None

    @property
    def limits(self) -> tuple[Limit, ...]: ...

    @property
    def fair(self) -> dict[str, Queue]: ...

    @property
    def completer_kind(self) -> Literal["batch", "inline"]: ...

    def retry_delay_for(self, job: Job[Any]) -> tuple[float, str | None]: ...


def job_fields(job: Job[Any]) -> dict[str, object]:
    """The ``extra`` of every log record about a job: ``job_id``, ``kind``, ``queue`` and
    ``attempt`` become attributes of the record, for structured log handlers."""
    return {"job_id": job.id, "kind": job.kind, "queue": job.queue, "attempt": job.attempt}


def _log_ending(job: Job[Any], outcome: Outcome | None) -> None:
    """A finished run: DEBUG when it went well, WARNING with the error when not."""
    ending = outcome.ending.value if outcome is not None else "completed"
    error = outcome.error.get("error") if outcome is not None and outcome.error else None
    if error is None:
        if not log.isEnabledFor(logging.DEBUG):
            return  # the common case: skip building the record's fields for every job
        log.debug(
            "job %d (%s) attempt %d %s",
            job.id,
            job.kind,
            job.attempt,
            ending,
            extra=job_fields(job),
        )
    else:
        log.warning(
            "job %d (%s) attempt %d %s: %s",
            job.id,
            job.kind,
            job.attempt,
            ending,
            error,
            extra=job_fields(job),
        )


class WorkerRun:
    """One start-to-stop run of a worker: every thread and piece of state it needs."""

    def __init__(self, worker: RunSettings) -> None:
        self.worker = worker
        self.engine = worker.engine
        self.stop_requested = threading.Event()
        self.cancel_requested = threading.Event()
        #: Producers stop fetching; the other services keep going until ``closing``.
        self.stopping_fetch = threading.Event()
        self.closing = threading.Event()
        self._lock = threading.Lock()
        self._executions: dict[int, Execution] = {}
        #: Attempts settled during this run (``run_until_idle``'s ``worked``).
        self.settled_count = 0
        #: Batches dispatched during this run: ``run_until_idle`` reads it around its
        #: check of the database, to notice a job taken while it looked.
        self.dispatched_batches = 0
        self._started: list[str] = []
        #: Queues a pause notification said are paused: their insert notifications
        #: wake nobody (the fetch would find nothing). Only a hint — the fetch statement
        #: enforces a pause, and the producers' polls still run.
        self._paused_hint: set[str] = set()

    # -- start and stop

    def start(self) -> None:
        worker = self.worker
        engines = worker.engines
        handlers = worker.handlers.all()
        self.hooks = WorkHooks(worker.hooks) if worker.hooks else None
        # A derived or passed engine is checked before anything else uses it.
        two_engines = engines.sync is not engines.given
        async_sessions = any(h.is_async and h.wants_session for h in handlers)
        needs_loop = two_engines or any(h.is_async for h in handlers)
        self.loop = EventLoopThread(engines) if needs_loop else None
        if self.loop is not None:
            self.loop.start()
            self._started.append("loop")
            if two_engines or async_sessions:
                self.loop.check_engines()
        with self.engine.connect() as connection:
            features = Features.of(connection)
            behind_pooler = prepare_warning(connection)
        if behind_pooler is not None:
            log.warning("%s", behind_pooler)
        if worker.periodic and not features.periodic:
            raise SchemaMissingError(
                PERIODIC_BRANCH, "Worker(periodic=[...]) keeps its state there"
            )
        if worker.listen.engine is not None:
            check_same_database(worker.listen.engine, self.engine)
        typed = sorted(h.kind.name for h in handlers if h.kind.output_type is not None)
        if typed and not features.output:
            raise SchemaMissingError(
                OUTPUT_BRANCH, f"kinds {typed} declare output= and their outputs are kept there"
            )
        # The async forms of record_output/output_of use the loop's async engine only
        # where it was checked to reach this very database (as for async handlers'
        # sessions); elsewhere they run the sync forms in a thread, off the loop too.
        checked_async = self.loop is not None and (two_engines or async_sessions)
        self.outputs = OutputSettings(
            stored=features.output,
            max_bytes=worker.max_output_bytes,
            recorder=self._record_output,
            reader=self._read_step_output if features.workflow else None,
            async_recorder=self._record_output_async if checked_async else None,
            async_reader=(
                self._read_step_output_async if features.workflow and checked_async else None
            ),
        )
        limited = plan_limits(worker.limits, worker.queues)
        if limited and not features.limits:
            raise SchemaMissingError(LIMITS_BRANCH, "the worker declares limits")
        for warning in unhandled_kind_limits(worker.limits, [h.kind.name for h in handlers]):
            log.warning("%s", warning)
        keyed = plan_keyed(worker.queues, worker.fair, worker.limits, limited, handlers)
        if keyed and not features.fairness:
            raise SchemaMissingError(
                FAIRNESS_BRANCH, "the worker has a fair queue or a limit by key"
            )
        # Before the heartbeat row exists: this process must not count as serving (or
        # naming) its own queues.
        worker.queue_notes.check(
            self.engine,
            worker_id=worker.id,
            queues=worker.queues,
            handlers=handlers,
            periodic=worker.periodic,
        )
        self.pool = HandlerThreads("sa_jobs-job", worker.stuck_thread_limit, self._release_slot)
        writer = OutcomeWriter(
            self.engine,
            features=features,
            give_up_after=worker.maintenance_config.rescue_after,
            retry_delay=lambda job: worker.retry_delay_for(job)[0],
        )
        self.completer: Completer = (
            BatchCompleter(writer) if worker.completer_kind == "batch" else InlineCompleter(writer)
        )
        self.watchdog = Watchdog(worker.interrupt_grace)

        def fetch(queue: str, free: int) -> list[Job[Any]]:
            by_key = keyed.get(queue)
            if by_key is not None:
                return fetch_keyed(self.engine, by_key, free, worker.id, features=features)
            limits = limited.get(queue)
            if limits is None:  # the plain fetch, as if limits did not exist
                return fetch_jobs(self.engine, queue, free, worker.id, features=features)
            return fetch_limited(self.engine, limits, free, worker.id, features=features)

        self.producers = {
            queue: Producer(
                queue,
                concurrency,
                fetch=fetch,
                dispatch=self._dispatch,
                poll_interval=worker.poll_interval,
                stopping=self.stopping_fetch,
            )
            for queue, concurrency in worker.queues.items()
        }
        self.maintenance = MaintenanceLoop(
            self.engine,
            worker.maintenance_config,
            worker_id=worker.id,
            queues=list(worker.queues),
            held_ids=self.held_ids,
            running_ids=self.running_ids,
            on_cancel=self.cancel_running,
            features=features,
            retry_delay=worker.retry_delay_for,
            stopping=self.closing,
        )
        self.maintenance.heartbeat.stuck = self.pool.stuck_figures
        self.periodic = (
            PeriodicThread(
                self.engine,
                PeriodicTicker(worker.periodic),
                worker.maintenance_config.periodic_interval,
                self.closing,
            )
            if worker.periodic
            else None
        )
        self.notifier = Notifier(
            self.engine,
            on_queue=self.wake_queue,
            on_cancel=self.cancel_running,
            on_connect=self.wake_all,
            on_queue_control=self.queue_control,
            stopping=self.closing,
            listen=worker.listen,
            poll_interval=worker.poll_interval,
            heartbeat_interval=worker.maintenance_config.heartbeat_interval,
        )
        # One outage log for every thread (see .outage); its end wakes the producers.
        self.outage = OutageLog()
        self.outage.on_end(self.wake_all)
        writer.outage = self.outage
        for service in (self.maintenance, self.periodic, self.notifier, *self.producers.values()):
            if service is not None:
                service.outage = self.outage
        self.maintenance.start()
        self._started.append("maintenance")
        if self.periodic is not None:
            self.periodic.start()
            self._started.append("periodic")
        self.completer.start()
        self._started.append("completer")
        self.watchdog.start()
        self._started.append("watchdog")
        for producer in self.producers.values():
            producer.start()
        self._started.append("producers")
        self.notifier.start()
        self._started.append("notifier")
        fair = {name: queue.fairness() for name, queue in worker.fair.items()}
        # Said when any: a fair queue dropped by a configuration mistake shows here.
        log.info(
            "worker %s started: queues %s%s",
            worker.id,
            worker.queues,
            f"; fair {fair}" if fair else "",
        )

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
        if "periodic" in started and self.periodic is not None:
            self.periodic.join(THREAD_JOIN_TIMEOUT)
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
                log.info("interrupting the running jobs (%d)", len(self.running_ids()))
                for execution in self._running_executions():
                    self.watchdog.interrupt_now(execution, Interrupt.SHUTDOWN)
            time.sleep(0.01)

    # -- running jobs

    def _dispatch(self, jobs: list[Job[Any]]) -> None:
        """Start a fetched batch: its runs are registered under one lock, and handed to
        the thread pool and to the event loop in one go each."""
        find = self.worker.handlers.find
        policy, settled, watch = self.worker.retry_policy, self._settled, self.watchdog.watch
        outputs = self.outputs
        executions = [
            Execution(
                job,
                find(job.kind),
                policy,
                settled,
                on_begin=watch,
                hooks=self.hooks,
                outputs=outputs,
            )
            for job in jobs
        ]
        # The rows the batch references: one query per table for all of it.
        verdicts = check_batch(self.engine, jobs)
        for execution in executions:
            execution.rows_verdict = verdicts.get(execution.job.id, UNCHECKED)
        with self._lock:
            for execution in executions:
                self._executions[execution.job.id] = execution
            self.dispatched_batches += 1
        on_loop = [execution for execution in executions if execution.is_async]
        if on_loop:
            assert self.loop is not None
            engine = self.loop.async_engine
            self.loop.submit_many([run_async(execution, engine) for execution in on_loop])
        if len(on_loop) < len(executions):
            in_threads = [execution for execution in executions if not execution.is_async]
            self.pool.submit_many(run_sync, in_threads, self.engine)

    def _record_output(self, job: Job[Any], data: Any) -> bool:
        """``job.record_output``: one short autocommitted statement, guarded by the run."""
        with autocommit(self.engine).connect() as connection:
            return record_output_in(connection, job, data)

    def _read_step_output(self, job: Job[Any], step: str) -> Any:
        """``job.output_of(step)``: one short read (sa_jobs._act.workflow_outputs)."""
        with self.engine.connect() as connection:
            return read_step_output(connection, job.id, step)

    async def _record_output_async(self, job: Job[Any], data: Any) -> bool:
        """``await job.record_output_async``: the same statement, autocommitted, on the
        loop's async engine (the engine an async handler's session comes from)."""
        assert self.loop is not None
        engine = self.loop.async_engine().execution_options(isolation_level="AUTOCOMMIT")
        async with engine.connect() as connection:
            return await connection.run_sync(record_output_in, job, data)

    async def _read_step_output_async(self, job: Job[Any], step: str) -> Any:
        """``await job.output_of_async``: the same read, on the loop's async engine."""
        assert self.loop is not None
        async with self.loop.async_engine().connect() as connection:
            return await connection.run_sync(read_step_output, job.id, step)

    def _settled(self, execution: Execution, outcome: Outcome | None, by_runner: bool) -> None:
        job = execution.job
        if outcome is not None:
            self.completer.submit(outcome)
        _log_ending(job, outcome)
        with self._lock:
            self._executions.pop(job.id, None)
            self.settled_count += 1
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
        if producer is not None and queue not in self._paused_hint:
            producer.wake()

    def wake_all(self) -> None:
        # (Re)connected: notifications may have been missed, so forget the hints too.
        self._paused_hint.clear()
        for producer in self.producers.values():
            producer.wake()

    def queue_control(self, queue: str, paused: bool) -> None:
        """A queue was paused or resumed (a control notification)."""
        if paused:
            self._paused_hint.add(queue)
            return
        self._paused_hint.discard(queue)
        producer = self.producers.get(queue)
        if producer is not None:
            producer.wake()

    def idle(self) -> bool:
        with self._lock:
            running = bool(self._executions)  # no copy: run_until_idle asks often
        return (
            not running
            and all(p.drained for p in self.producers.values())
            and self.completer.pending() == 0
        )
