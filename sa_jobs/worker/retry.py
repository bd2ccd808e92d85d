"""When a failed job runs again.

The default is River's: ``attempt ** 4`` seconds with up to 10% jitter either way
(1 s, 16 s, 81 s, 4.3 min, ... about 4.5 days for the 24th retry). A policy is anything
with a ``next_delay(job) -> timedelta`` method; set one per worker or per handler.
"""

from __future__ import annotations

import datetime as dt
import random
from typing import Protocol

import attrs

from sa_jobs.models import Job

__all__ = ["ExponentialRetry", "RetryPolicy"]


class RetryPolicy(Protocol):
    def next_delay(self, job: Job) -> dt.timedelta:
        """How long after this failed attempt the job should run again."""
        ...


@attrs.frozen
class ExponentialRetry:
    """``attempt ** exponent`` seconds, jittered, capped at ``max_delay``."""

    exponent: float = 4.0
    jitter: float = 0.1
    max_delay: dt.timedelta = dt.timedelta(days=7)

    def next_delay(self, job: Job) -> dt.timedelta:
        base = float(max(job.attempt, 1)) ** self.exponent
        jittered = base * (1 + random.uniform(-self.jitter, self.jitter))
        return min(dt.timedelta(seconds=jittered), self.max_delay)
