"""The maintenance thread: what every process does for itself, and what the leader does
for all.

Every ``heartbeat_interval``, each process writes its heartbeat (:mod:`.heartbeat`),
rescues the jobs its own id holds that it does not run (:class:`.rescuer.Rescuer` with
``own``), looks for cancel requests it missed (:mod:`.missed_cancels`), and takes or
renews the leader's lease (:mod:`.leader`). (Periodic jobs are fired on a thread of
their own, :mod:`.periodic_thread`, so that a slow tick never delays the heartbeat.)
The leader alone also runs the scheduler, the rescuer, the cleaner, and —
with their branches — the sequence repair and the retirement of periodic jobs no code
has any more, each on its own interval. Every step runs in a transaction of its own; a
failed step is logged and tried again next time.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Sequence

import attrs
from sqlalchemy import Connection, Engine

from sa_jobs._table.schema import Features
from sa_jobs.errors import InvalidOptionsError
from sa_jobs.worker.db_access import autocommit, is_transient
from sa_jobs.worker.maintenance.cleaner import Cleaner, Retention
from sa_jobs.worker.maintenance.heartbeat import Heartbeat
from sa_jobs.worker.maintenance.leader import LeaderElection
from sa_jobs.worker.maintenance.missed_cancels import MissedCancels
from sa_jobs.worker.maintenance.periodic import REGISTER_INTERVAL, PeriodicRetirer
from sa_jobs.worker.maintenance.reindexer import Reindexer, ReindexSettings
from sa_jobs.worker.maintenance.rescuer import Rescuer, RetryDelay
from sa_jobs.worker.maintenance.scheduler import Scheduler
from sa_jobs.worker.maintenance.sequence_repair import SequenceRepair
from sa_jobs.worker.service import Service

__all__ = ["MIN_PERIODIC_RETIRE_AFTER", "MaintenanceConfig", "MaintenanceLoop"]

log = logging.getLogger("sa_jobs.worker")

#: The shortest ``periodic_retire_after``: two of the workers' re-registrations
#: (``REGISTER_INTERVAL``, a minute), so that one late or failed registration of a running
#: worker never lets its rows look abandoned.
MIN_PERIODIC_RETIRE_AFTER = 2 * REGISTER_INTERVAL


def _positive(_instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if value <= 0:
        raise InvalidOptionsError(attribute.name, f"must be positive, got {value}")


@attrs.frozen
class MaintenanceConfig:
    """Intervals in seconds.

    Attributes:
        heartbeat_interval: How often each process says it is alive and checks for missed
            cancel requests.
        rescue_after: A running job is rescued once its process has been silent this long.
            Must exceed ``2 * heartbeat_interval``.
        leader_ttl: A dead leader is replaced after at most this long.
        scheduler_interval: How often due scheduled/retryable jobs are made available.
        rescuer_interval: How often orphaned jobs are looked for.
        cleaner_interval: How often finished jobs past retention are deleted.
        retention: How long finished jobs are kept.
        periodic_interval: How often a process with periodic jobs looks for due ones
            (on its own thread).
        periodic_retire_after: A periodic job's row is deleted once no worker has had
            it in its code for this long (default 7 days). At least
            :data:`MIN_PERIODIC_RETIRE_AFTER` (two minutes): running workers mark their
            periodic jobs seen once a minute, and a row retired under a running worker
            loses its state (an interval's phase restarts, ``run_on_start`` fires again).
        reindex_interval: How often the leader checks the hot partial indexes for bloat
            and rebuilds the bloated ones with ``REINDEX INDEX CONCURRENTLY``
            (:mod:`.reindexer`); ``None`` (the default) never does. Needs the worker's
            role to own ``sa_job``.
        reindex: When an index counts as bloated.
    """

    heartbeat_interval: float = attrs.field(default=5.0, validator=_positive)
    rescue_after: float = attrs.field(default=60.0, validator=_positive)
    leader_ttl: float = attrs.field(default=15.0, validator=_positive)
    scheduler_interval: float = attrs.field(default=1.0, validator=_positive)
    rescuer_interval: float = attrs.field(default=5.0, validator=_positive)
    cleaner_interval: float = attrs.field(default=60.0, validator=_positive)
    retention: Retention = attrs.field(factory=Retention)
    periodic_interval: float = attrs.field(default=1.0, validator=_positive)
    periodic_retire_after: float = attrs.field(default=7 * 24 * 3600.0, validator=_positive)
    reindex_interval: float | None = attrs.field(
        default=None, validator=attrs.validators.optional(_positive)
    )
    reindex: ReindexSettings = attrs.field(factory=ReindexSettings)

    def __attrs_post_init__(self) -> None:
        if self.rescue_after <= 2 * self.heartbeat_interval:
            raise InvalidOptionsError(
                "rescue_after",
                f"{self.rescue_after} s must exceed twice heartbeat_interval "
                f"({self.heartbeat_interval} s), or live workers' jobs would be rescued",
            )
        if self.periodic_retire_after < MIN_PERIODIC_RETIRE_AFTER:
            raise InvalidOptionsError(
                "periodic_retire_after",
                f"{self.periodic_retire_after} s is under the minimum of "
                f"{MIN_PERIODIC_RETIRE_AFTER:.0f} s: running workers mark their periodic jobs "
                f"seen every {REGISTER_INTERVAL:.0f} s, so a shorter grace would retire the "
                "schedules of workers that still have them (restarting an interval's phase, "
                "firing run_on_start again); the default is 7 days",
            )
        if self.leader_ttl <= self.heartbeat_interval:
            raise InvalidOptionsError(
                "leader_ttl",
                f"{self.leader_ttl} s must exceed heartbeat_interval ({self.heartbeat_interval} s)"
                ", or the leader's lease would lapse between renewals",
            )


@attrs.define
class _Periodic:
    name: str
    interval: float
    run_once: Callable[[Connection], int]
    next_at: float = 0.0


class MaintenanceLoop(Service):
    """The maintenance thread of one worker process.

    Args:
        engine: The worker's engine.
        config: The intervals.
        worker_id: This process's id (its heartbeat row, its lease, its own jobs).
        queues: The queues it works (recorded in its heartbeat row).
        held_ids: The jobs it runs or has an unwritten outcome for.
        running_ids: The jobs it runs.
        on_cancel: Interrupts one of them.
        features: The database's feature branches.
        retry_delay: When a rescued job runs again (the worker's retry policies).
        stopping: Set when the worker closes.
    """

    def __init__(
        self,
        engine: Engine,
        config: MaintenanceConfig,
        *,
        worker_id: str,
        queues: Sequence[str],
        held_ids: Callable[[], list[int]],
        running_ids: Callable[[], list[int]],
        on_cancel: Callable[[int], object],
        features: Features,
        retry_delay: RetryDelay | None = None,
        stopping: threading.Event,
    ) -> None:
        super().__init__("maintenance", stopping)
        self._engine = engine
        self.config = config
        self.worker_id = worker_id
        self._held_ids = held_ids
        self.heartbeat = Heartbeat(worker_id, queues)
        self.election = LeaderElection(worker_id, config.leader_ttl)
        self._led = False  # what was last logged about leadership
        self.missed_cancels = MissedCancels(running_ids, on_cancel)
        self.scheduler = Scheduler(features=features)
        self.rescuer = Rescuer(config.rescue_after, features=features)
        if retry_delay is not None:
            self.rescuer.retry_delay = retry_delay
        self.cleaner = Cleaner(config.retention, features=features)
        self.sequence_repair = SequenceRepair() if features.sequence else None
        self._leader_steps = [
            _Periodic("scheduler", config.scheduler_interval, self.scheduler.run_once),
            _Periodic("rescuer", config.rescuer_interval, self.rescuer.run_once),
            _Periodic("cleaner", config.cleaner_interval, self.cleaner.run_once),
        ]
        if self.sequence_repair is not None:
            repair = self.sequence_repair.run_once
            self._leader_steps.append(
                _Periodic("sequence repair", config.scheduler_interval, repair)
            )
        if features.periodic:
            retire_after = dt.timedelta(seconds=config.periodic_retire_after)
            self.periodic_retirer = PeriodicRetirer(retire_after)
            self._leader_steps.append(
                _Periodic(
                    "periodic retirement", config.cleaner_interval, self.periodic_retirer.run_once
                )
            )

        self.reindexer = Reindexer(config.reindex)
        self._reindexing: threading.Thread | None = None
        if config.reindex_interval is not None:
            self._leader_steps.append(
                _Periodic("reindex", config.reindex_interval, self._start_reindex)
            )

    def _start_reindex(self, _connection: Connection) -> int:
        """Start a reindex pass on a thread of its own, unless one still runs: a rebuild
        reads the whole table twice and must not hold up the heartbeat."""
        if self._reindexing is not None and self._reindexing.is_alive():
            return 0
        self._reindexing = threading.Thread(
            target=self.reindex_now, name="sa_jobs-reindexer", daemon=True
        )
        self._reindexing.start()
        return 0

    def reindex_now(self) -> int:
        """One reindex pass, on an autocommit connection (``REINDEX CONCURRENTLY`` cannot
        run in a transaction block); errors are logged, not raised."""
        try:
            with autocommit(self._engine).connect() as connection:
                return self.reindexer.run_once(connection)
        except Exception as exc:
            log.error("maintenance step reindex failed: %s", exc)
            return 0

    def start(self) -> None:
        # The heartbeat row must exist before the first fetch, or a rescuer elsewhere could
        # take this process's first jobs for orphans.
        self._step("heartbeat", self.heartbeat.run_once)
        super().start()

    def join(self, timeout: float | None = None) -> None:
        super().join(timeout)
        self._step("resign", self.election.resign)
        self._step("deregister", self.heartbeat.deregister)

    def make_due_jobs_available(self, connection: Connection) -> int:
        """The scheduler's and the sequence repair's work, now (for ``run_until_idle``)."""
        count = self.scheduler.run_once(connection)
        if self.sequence_repair is not None:
            count += self.sequence_repair.run_once(connection)
        return count

    def rescue_own(self, connection: Connection) -> int:
        """Rescue jobs running under this process's id that it does not hold.

        A job can be ``running`` for this id without this process holding it: a fetch
        whose COMMIT landed but whose reply was lost, an outcome the completer gave up
        on, or a predecessor that used the same worker id. The heartbeat would keep the
        rescuer away from them forever, so the process rescues them itself (after
        ``rescue_after``, so a fetch in flight is never taken).
        """
        return self.rescuer.run_once(connection, own=(self.worker_id, self._held_ids()))

    def run_loop(self) -> None:
        next_beat = 0.0
        while not self.stopping.is_set():
            now = time.monotonic()
            if now >= next_beat:
                next_beat = now + self.config.heartbeat_interval
                self._step("heartbeat", self.heartbeat.run_once)
                self._step("own rescue", self.rescue_own)
                self._step("missed cancels", self.missed_cancels.run_once)
                self._elect()
            for step in self._leader_steps:
                # Asked before each step: a slow step can outlast the lease.
                if not self.is_leader:
                    break
                if now >= step.next_at:
                    step.next_at = now + step.interval
                    count = self._step(step.name, step.run_once)
                    if count:
                        log.info("%s: %d %s", step.name, count, _jobs(count))
            self.passed()
            self.stopping.wait(0.05)

    @property
    def is_leader(self) -> bool:
        """Whether this process leads maintenance now (its lease has not run out)."""
        return self.election.is_leader

    def _elect(self) -> None:
        if not self._step("leader election", self.election.run_once):
            self.election.lapse()  # lost, or the renewal's commit failed
        leads = self.is_leader
        if leads != self._led:
            self._led = leads
            log.info("%s maintenance leadership", "took" if leads else "lost")

    def _step(self, name: str, action: Callable[[Connection], int | None]) -> int:
        try:
            with self._engine.begin() as connection:
                done = action(connection) or 0
        except Exception as exc:
            if is_transient(exc):
                self.outage.failed("maintenance", f"maintenance step {name} failed: {exc}")
            else:
                log.error("maintenance step %s failed: %s", name, exc)
            return 0
        self.outage.succeeded()
        return done


def _jobs(count: int) -> str:
    return "job" if count == 1 else "jobs"
