"""The names every layer shares: job states, what an insert did, and the metadata keys
the state transitions write. A leaf module: it imports nothing of sa_jobs.

See ``docs/state-machine.md`` for every transition and the module that performs it.
"""

from __future__ import annotations

import enum

__all__ = [
    "CANCEL_ATTEMPTED_KEY",
    "FINAL_STATES",
    "JOB_KEY_REPLACED_KEY",
    "RUNS_AGAIN_STATES",
    "UNIQUE_CONFLICT_KEY",
    "InsertAction",
    "JobState",
]


class JobState(enum.StrEnum):
    """Where a job is in its life.

    ``available`` is due and waiting for a worker; ``scheduled`` waits for its time;
    ``pending`` waits for something other than time (a sequence); ``running`` is held by a
    worker; ``retryable`` failed and waits for its next attempt; ``completed``,
    ``cancelled`` and ``discarded`` (attempts spent) are final.
    """

    AVAILABLE = "available"
    SCHEDULED = "scheduled"
    PENDING = "pending"
    RUNNING = "running"
    RETRYABLE = "retryable"
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    DISCARDED = "discarded"


#: States a job never leaves on its own (a manual retry can revive it).
FINAL_STATES = frozenset({JobState.COMPLETED, JobState.CANCELLED, JobState.DISCARDED})
#: States from which a finished run leads to another run.
RUNS_AGAIN_STATES = frozenset({JobState.AVAILABLE, JobState.SCHEDULED, JobState.RETRYABLE})


class InsertAction(enum.StrEnum):
    """What an insert did."""

    #: A new job was written.
    INSERTED = "inserted"
    #: A unique job already existed; nothing was written.
    SKIPPED_DUPLICATE = "skipped_duplicate"
    #: A job key's existing job was replaced (``replace`` or ``preserve_run_at``).
    REPLACED = "replaced"
    #: A job key's existing job was returned untouched (``unsafe_dedupe``).
    DEDUPLICATED = "deduplicated"


#: Set in a job's metadata by ``cancel_job`` on a running job: whatever the run ends as
#: (short of completing), the job ends ``cancelled``.
CANCEL_ATTEMPTED_KEY = "cancel_attempted_at"
#: Set in a job's metadata when a new add took the job key of this (running) job: it
#: finishes, but never runs again.
JOB_KEY_REPLACED_KEY = "job_key_replaced_at"
#: Set in the metadata of a job discarded because its unique key was taken meanwhile.
UNIQUE_CONFLICT_KEY = "unique_key_conflict"
