"""When a failed job runs again.

The default is River's: ``(errors + 1) ** 4`` seconds, where ``errors`` is the number of
errors the job has recorded before this failure, with up to 10% jitter either way (1 s,
16 s, 81 s, 4.3 min, ... about 4.5 days after 24 errors), capped at 7 days. Counting
errors rather than attempts means a snooze never makes the next retry wait longer. A
policy is anything with a ``next_delay(job) -> timedelta`` method; set one per worker or
per handler.

Whatever a policy answers, :func:`retry_delay` turns it into a delay the database can
store: a policy that raises, or answers something negative, NaN or not a duration, is
logged and replaced by the default policy's answer; an answer longer than
:data:`~sa_jobs._base.durations.MAX_DELAY` (365 days) is clamped to it.
"""

from __future__ import annotations

import datetime as dt
import logging
import random
from typing import Any, Protocol

import attrs

from sa_jobs._base.durations import delay_seconds
from sa_jobs._base.error_records import describe
from sa_jobs._table.models import Job

__all__ = ["DEFAULT_RETRY_POLICY", "ExponentialRetry", "RetryPolicy", "retry_delay"]

log = logging.getLogger("sa_jobs.worker")


class RetryPolicy(Protocol):
    def next_delay(self, job: Job[Any]) -> dt.timedelta:
        """How long after this failed attempt the job should run again."""
        ...


@attrs.frozen
class ExponentialRetry:
    """``(recorded errors + 1) ** exponent`` seconds, jittered, capped at ``max_delay``."""

    exponent: float = 4.0
    jitter: float = 0.1
    max_delay: dt.timedelta = dt.timedelta(days=7)

    def next_delay(self, job: Job[Any]) -> dt.timedelta:
        base = float(len(job.errors or ()) + 1) ** self.exponent
        jittered = base * (1 + random.uniform(-self.jitter, self.jitter))
        return min(dt.timedelta(seconds=jittered), self.max_delay)


DEFAULT_RETRY_POLICY = ExponentialRetry()


def retry_delay(policy: RetryPolicy, job: Job[Any]) -> tuple[float, str | None]:
    """Seconds until ``job`` runs again after a failed attempt, per ``policy``.

    Returns the delay and, when the policy misbehaved, a note saying how (also logged);
    the default policy's delay is used then. Never raises.
    """
    try:
        answer = policy.next_delay(job)
    except Exception as exc:
        note = f"retry policy {policy!r} raised {describe(exc)}"
    else:
        try:
            return delay_seconds(answer), None
        except ValueError as exc:
            note = f"retry policy {policy!r}: its delay {exc}"
    note += "; the default backoff was used"
    log.error("job %d: %s", job.id, note)
    if policy is DEFAULT_RETRY_POLICY:
        return 1.0, note
    return retry_delay(DEFAULT_RETRY_POLICY, job)[0], note
