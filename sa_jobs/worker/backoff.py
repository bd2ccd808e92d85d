"""Talking to the database from the worker: retries with backoff through outages, and
autocommit for work that is one statement."""

from __future__ import annotations

import logging
import random
import threading
import weakref
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError, OperationalError

__all__ = ["Backoff", "autocommit", "is_transient"]

T = TypeVar("T")
log = logging.getLogger("sa_jobs.worker")


_autocommit_engines: weakref.WeakKeyDictionary[Engine, Engine] = weakref.WeakKeyDictionary()


def autocommit(engine: Engine) -> Engine:
    """The engine in autocommit mode (same pool): single statements skip BEGIN/COMMIT."""
    found = _autocommit_engines.get(engine)
    if found is None:
        found = engine.execution_options(isolation_level="AUTOCOMMIT")
        _autocommit_engines[engine] = found
    return found


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
