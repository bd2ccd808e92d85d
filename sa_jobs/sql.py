"""Small SQLAlchemy Core idioms several modules share (a leaf: imports nothing of sa_jobs)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, literal
from sqlalchemy.sql.expression import ColumnElement

__all__ = ["seconds_interval"]


def seconds_interval(seconds: Any) -> ColumnElement[Any]:
    """An ``interval`` of ``seconds`` (a column, an expression or a Python number)."""
    if isinstance(seconds, int | float):
        seconds = literal(float(seconds))
    return func.make_interval(0, 0, 0, 0, 0, 0, seconds)
