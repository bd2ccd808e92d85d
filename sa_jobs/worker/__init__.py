"""The worker: fetches jobs, runs their handlers, writes outcomes, keeps the table healthy.

:class:`Worker` is the entry point; each concern lives in its own module (``producer``
fetches, ``execution`` runs, ``completer`` writes, ``watchdog`` enforces timeouts,
``notifier`` listens, ``maintenance/`` keeps the table healthy).
"""

from __future__ import annotations

from sa_jobs.worker.idle import IdleResult
from sa_jobs.worker.maintenance.cleaner import Retention
from sa_jobs.worker.maintenance.loop import MaintenanceConfig
from sa_jobs.worker.maintenance.reindexer import ReindexSettings
from sa_jobs.worker.retry import ExponentialRetry, RetryPolicy
from sa_jobs.worker.worker import Worker

__all__ = [
    "ExponentialRetry",
    "IdleResult",
    "MaintenanceConfig",
    "ReindexSettings",
    "Retention",
    "RetryPolicy",
    "Worker",
]
