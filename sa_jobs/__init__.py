"""sa_jobs: a PostgreSQL job queue for SQLAlchemy applications.

Jobs are rows written in your own transaction, deduplicated by the database, and worked
at least once. See the README and ``docs/`` for a tour.
"""

from __future__ import annotations

from importlib import metadata as _metadata

from sa_jobs import errors, hooks
from sa_jobs.args import KindRegistry, field, job_args
from sa_jobs.bulk import BulkResult, cancel_jobs, delete_jobs, retry_jobs
from sa_jobs.complete import complete_in
from sa_jobs.control import cancel_job, retry_job
from sa_jobs.convert import ArgsConverter
from sa_jobs.enqueue import enqueue
from sa_jobs.errors import SaJobsError
from sa_jobs.health import Health, HealthThresholds, check_health
from sa_jobs.hooks import InsertHook, WorkHook, add_insert_hook, remove_insert_hook
from sa_jobs.insert import InsertManyParams, InsertResult, insert, insert_job, insert_many
from sa_jobs.job_key import RemoveOutcome, remove_job
from sa_jobs.limits import ConcurrencyLimit, RateLimit
from sa_jobs.models import Job, metadata
from sa_jobs.options import InsertOptions, InsertOpts, JobKeyMode, SequenceOpts, UniqueOpts
from sa_jobs.periodic import PeriodicJob
from sa_jobs.queue_stats import Stats, stats
from sa_jobs.queues import QueueState, pause_queue, queue_states, resume_queue
from sa_jobs.schema import downgrade, migrate
from sa_jobs.states import InsertAction, JobState
from sa_jobs.worker import ExponentialRetry, MaintenanceConfig, Retention, RetryPolicy, Worker

try:
    __version__ = _metadata.version("sa-jobs")
except _metadata.PackageNotFoundError:  # imported from a checkout that was never installed
    __version__ = "0+unknown"

__all__ = [
    "ArgsConverter",
    "BulkResult",
    "ConcurrencyLimit",
    "ExponentialRetry",
    "Health",
    "HealthThresholds",
    "InsertAction",
    "InsertHook",
    "InsertManyParams",
    "InsertOptions",
    "InsertOpts",
    "InsertResult",
    "Job",
    "JobKeyMode",
    "JobState",
    "KindRegistry",
    "MaintenanceConfig",
    "PeriodicJob",
    "QueueState",
    "RateLimit",
    "RemoveOutcome",
    "Retention",
    "RetryPolicy",
    "SaJobsError",
    "SequenceOpts",
    "Stats",
    "UniqueOpts",
    "WorkHook",
    "Worker",
    "add_insert_hook",
    "cancel_job",
    "cancel_jobs",
    "check_health",
    "complete_in",
    "delete_jobs",
    "downgrade",
    "enqueue",
    "errors",
    "field",
    "hooks",
    "insert",
    "insert_job",
    "insert_many",
    "job_args",
    "metadata",
    "migrate",
    "pause_queue",
    "queue_states",
    "remove_insert_hook",
    "remove_job",
    "resume_queue",
    "retry_job",
    "retry_jobs",
    "stats",
]
