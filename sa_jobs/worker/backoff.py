"""Retrying database work through outages: exponential backoff, logged, never silent."""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy.exc import DBAPIError, OperationalError

__all__ = ["Backoff", "is_transient"]

T = TypeVar("T")
log = logging.getLogger("sa_jobs.worker")


def is_transient(exc: BaseException) -> bool:
    """A lost connection or a server going away: worth retrying."""
    if isinstance(exc, OperationalError):
        return True
    return isinstance(exc, DBAPIError) and exc.connection_invalidated


class Backoff:
    def __init__(self, what: str, *, first: float = 0.1, cap: float = 5.0) -> None:
        self.what = what
        self.first = first
        self.cap = cap

    def retry_forever(self, action: Callable[[], T]) -> T:
        """Run ``action`` until it succeeds; transient and other errors alike are retried.

        Outcomes must not be lost, so even an unexpected error only delays them.
        """
        delay = self.first
        while True:
            try:
                return action()
            except Exception as exc:
                level = logging.WARNING if is_transient(exc) else logging.ERROR
                log.log(level, "%s failed (%s); retrying in %.1f s", self.what, exc, delay)
                threading.Event().wait(delay * random.uniform(0.8, 1.2))
                delay = min(delay * 2, self.cap)
