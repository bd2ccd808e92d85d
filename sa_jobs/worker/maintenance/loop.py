"""The maintenance thread: presence for every process, services for the leader only."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import attrs
from sqlalchemy import Connection, Engine

from sa_jobs.errors import InvalidOptionsError
from sa_jobs.sequence import SequencePromoter
from sa_jobs.worker.backoff import is_transient
from sa_jobs.worker.maintenance.cleaner import Cleaner, Retention
from sa_jobs.worker.maintenance.leader import LeaderElection
from sa_jobs.worker.maintenance.presence import Presence
from sa_jobs.worker.maintenance.rescuer import Rescuer, RetryDelay
from sa_jobs.worker.maintenance.scheduler import Scheduler

__all__ = ["MaintenanceConfig", "MaintenanceLoop"]

log = logging.getLogger("sa_jobs.worker")


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
    """

    heartbeat_interval: float = attrs.field(default=5.0, validator=_positive)
    rescue_after: float = attrs.field(default=60.0, validator=_positive)
    leader_ttl: float = attrs.field(default=15.0, validator=_positive)
    scheduler_interval: float = attrs.field(default=1.0, validator=_positive)
    rescuer_interval: float = attrs.field(default=5.0, validator=_positive)
    cleaner_interval: float = attrs.field(default=60.0, validator=_positive)
    retention: Retention = attrs.field(factory=Retention)

    def __attrs_post_init__(self) -> None:
        if self.rescue_after <= 2 * self.heartbeat_interval:
            raise InvalidOptionsError(
                "rescue_after",
                f"{self.rescue_after} s must exceed twice heartbeat_interval "
                f"({self.heartbeat_interval} s), or live workers' jobs would be rescued",
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


class MaintenanceLoop:
    def __init__(
        self,
        engine: Engine,
        config: MaintenanceConfig,
        presence: Presence,
        election: LeaderElection,
        closing: threading.Event,
        *,
        unique: bool = False,
        sequence: bool = False,
        retry_delay: RetryDelay | None = None,
    ) -> None:
        self._engine = engine
        self.config = config
        self.presence = presence
        self.election = election
        self.scheduler = Scheduler(unique=unique, sequence=sequence)
        self.rescuer = Rescuer(config.rescue_after, sequence=sequence)
        if retry_delay is not None:
            self.rescuer.retry_delay = retry_delay
        # Every process rescues the jobs its own id holds but it does not (see Presence).
        presence.rescuer = self.rescuer
        self.cleaner = Cleaner(config.retention, sequence=sequence)
        self._closing = closing
        self.is_leader = False
        self._services = [
            _Periodic("scheduler", config.scheduler_interval, self.scheduler.run_once),
            _Periodic("rescuer", config.rescuer_interval, self.rescuer.run_once),
            _Periodic("cleaner", config.cleaner_interval, self.cleaner.run_once),
        ]
        self.sequence_promoter = SequencePromoter() if sequence else None
        if self.sequence_promoter is not None:
            repair = self.sequence_promoter.run_once
            self._services.append(_Periodic("sequence repair", config.scheduler_interval, repair))
        self._thread = threading.Thread(target=self._loop, name="sa_jobs-maintenance", daemon=True)

    def start(self) -> None:
        # The heartbeat row must exist before the first fetch, or a rescuer elsewhere could
        # take this process's first jobs for orphans.
        self._step("heartbeat", self.presence.heartbeat)
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._step("resign", self.election.resign)
        self._step("deregister", self.presence.deregister)

    def make_due_jobs_available(self, connection: Connection) -> int:
        """The scheduler's and the sequence repair's work, now (for ``run_until_idle``)."""
        count = self.scheduler.run_once(connection)
        if self.sequence_promoter is not None:
            count += self.sequence_promoter.run_once(connection)
        return count

    def _loop(self) -> None:
        next_presence = 0.0
        while not self._closing.is_set():
            now = time.monotonic()
            if now >= next_presence:
                next_presence = now + self.config.heartbeat_interval
                self._step("presence", self.presence.run_once)
                was_leader = self.is_leader
                self.is_leader = bool(self._step("leader election", self.election.run_once))
                if self.is_leader != was_leader:
                    log.info("%s maintenance leadership", "took" if self.is_leader else "lost")
            if self.is_leader:
                for service in self._services:
                    if now >= service.next_at:
                        service.next_at = now + service.interval
                        count = self._step(service.name, service.run_once)
                        if count:
                            log.info("%s: %d jobs", service.name, count)
            self._closing.wait(0.05)

    def _step(self, name: str, action: Callable[[Connection], int | None]) -> int:
        try:
            with self._engine.begin() as connection:
                return action(connection) or 0
        except Exception as exc:
            level = logging.WARNING if is_transient(exc) else logging.ERROR
            log.log(level, "maintenance step %s failed: %s", name, exc)
            return 0
