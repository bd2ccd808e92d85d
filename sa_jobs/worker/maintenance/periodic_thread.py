"""The thread that ticks a process's periodic jobs, apart from the maintenance thread.

A tick may wait on the database (a lock, a slow insert) and runs the user's args
factories; on the maintenance thread either would delay the heartbeat, and a process
whose heartbeat is silent for ``rescue_after`` has its running jobs rescued by another
process — run twice. On its own thread a slow tick delays only periodic jobs.
"""

from __future__ import annotations

import logging
import threading

from sqlalchemy import Engine

from sa_jobs.worker.db_access import is_transient
from sa_jobs.worker.maintenance.periodic import PeriodicTicker
from sa_jobs.worker.service import Service

__all__ = ["PeriodicThread"]

log = logging.getLogger("sa_jobs.worker")


class PeriodicThread(Service):
    """Runs ``ticker`` every ``interval`` seconds, one transaction per tick, until
    ``stopping`` is set. A failed tick is logged and tried again at the next one."""

    def __init__(
        self, engine: Engine, ticker: PeriodicTicker, interval: float, stopping: threading.Event
    ) -> None:
        super().__init__("periodic", stopping)
        self._engine = engine
        self.ticker = ticker
        self.interval = interval

    def run_loop(self) -> None:
        while not self.stopping.is_set():
            self.tick()
            self.passed()
            self.stopping.wait(self.interval)

    def tick(self) -> int:
        """One tick now; the number of jobs it inserted (0 when it failed)."""
        try:
            with self._engine.begin() as connection:
                count = self.ticker.run_once(connection)
        except Exception as exc:
            if is_transient(exc):
                self.outage.failed("periodic", f"periodic jobs: tick failed: {exc}")
            else:
                log.error("periodic jobs: tick failed: %s", exc)
            return 0
        self.outage.succeeded()
        if count:
            log.info("periodic jobs: %d %s", count, "job" if count == 1 else "jobs")
        return count
