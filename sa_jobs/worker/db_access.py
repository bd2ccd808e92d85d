"""Talking to the database from the worker: which errors are worth retrying, and
autocommit for work that is one statement."""

from __future__ import annotations

import weakref

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError, OperationalError

__all__ = ["autocommit", "is_transient"]


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
