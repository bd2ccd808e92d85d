"""sa_jobs: a PostgreSQL job queue for SQLAlchemy applications.

Jobs are rows written in your own transaction, deduplicated by the database, and worked
at least once. See the README and ``docs/`` for a tour.
"""

from __future__ import annotations

from importlib import metadata as _metadata

from sa_jobs import errors, hooks
from sa_jobs._act.by_filter import BulkResult, cancel_jobs, delete_jobs, retry_jobs
from sa_jobs._act.complete import complete_in
from sa_jobs._act.control import cancel_job, retry_job
from sa_jobs._act.queues import QueueState, pause_queue, queue_states, resume_queue
from sa_jobs._act.waiting import wait_for, wait_for_all
from sa_jobs._act.workflow_extend import AddedStep, add_to_workflow
from sa_jobs._act.workflow_status import (
    FailedStep,
    WorkflowStatus,
    cancel_workflow,
    workflow_status,
)
from sa_jobs._base.records import InsertResult
from sa_jobs._base.states import InsertAction, JobState
from sa_jobs._declare.args import KindRegistry, field, job_args
from sa_jobs._declare.convert import ArgsConverter
from sa_jobs._declare.limits import ConcurrencyLimit, RateLimit
from sa_jobs._declare.options import InsertOptions, InsertOpts, JobKeyMode, SequenceOpts, UniqueOpts
from sa_jobs._declare.queue_config import Queue
from sa_jobs._declare.refs import Ref
from sa_jobs._declare.workflow import Batch, Step, Workflow, chain, chord, group
from sa_jobs._insert.enqueue import enqueue
from sa_jobs._insert.insert import (
    InsertManyParams,
    insert,
    insert_job,
    insert_many,
    insert_many_fast,
)
from sa_jobs._insert.job_key import RemoveOutcome, remove_job
from sa_jobs._insert.workflow import InsertedWorkflow, insert_workflow
from sa_jobs._inspect.health import Health, HealthThresholds, check_health
from sa_jobs._inspect.queue_stats import Stats, stats
from sa_jobs._inspect.ref_jobs import jobs_for
from sa_jobs._table.models import Job, metadata
from sa_jobs._table.schema import downgrade, migrate
from sa_jobs.errors import SaJobsError
from sa_jobs.hooks import InsertHook, WorkHook, add_insert_hook, remove_insert_hook
from sa_jobs.periodic import PeriodicJob
from sa_jobs.worker import ExponentialRetry, MaintenanceConfig, Retention, RetryPolicy, Worker

try:
    __version__ = _metadata.version("sa-jobs")
except _metadata.PackageNotFoundError:  # imported from a checkout that was never installed
    __version__ = "0+unknown"

__all__ = [
    "AddedStep",
    "ArgsConverter",
    "Batch",
    "BulkResult",
    "ConcurrencyLimit",
    "ExponentialRetry",
    "FailedStep",
    "Health",
    "HealthThresholds",
    "InsertAction",
    "InsertHook",
    "InsertManyParams",
    "InsertOptions",
    "InsertOpts",
    "InsertResult",
    "InsertedWorkflow",
    "Job",
    "JobKeyMode",
    "JobState",
    "KindRegistry",
    "MaintenanceConfig",
    "PeriodicJob",
    "Queue",
    "QueueState",
    "RateLimit",
    "Ref",
    "RemoveOutcome",
    "Retention",
    "RetryPolicy",
    "SaJobsError",
    "SequenceOpts",
    "Stats",
    "Step",
    "UniqueOpts",
    "WorkHook",
    "Worker",
    "Workflow",
    "WorkflowStatus",
    "add_insert_hook",
    "add_to_workflow",
    "cancel_job",
    "cancel_jobs",
    "cancel_workflow",
    "chain",
    "check_health",
    "chord",
    "complete_in",
    "delete_jobs",
    "downgrade",
    "enqueue",
    "errors",
    "field",
    "group",
    "hooks",
    "insert",
    "insert_job",
    "insert_many",
    "insert_many_fast",
    "insert_workflow",
    "job_args",
    "jobs_for",
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
    "wait_for",
    "wait_for_all",
    "workflow_status",
]
