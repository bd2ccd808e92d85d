"""The ``sa_jobs_limits`` branch's schema: starts counted per time window.

Only fetches of limited queues read or write it. Running jobs are counted through the
core's ``sa_job_running_idx``: an index of its own (queue, kind) cost every started job
an index entry, limits or not (measured in ``docs/performance.md``, "Limits").
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import CheckConstraint, DateTime, Integer, Table, Text
from sqlalchemy.orm import Mapped, mapped_column

from sa_jobs._table.models import Base

__all__ = ["RateWindow", "rate_window_table"]


class RateWindow(Base):
    """How many jobs of one scope (``queue:NAME`` or ``kind:NAME``) started in one short
    window of time; a :class:`~sa_jobs.RateLimit` sums the windows that end inside its
    period. Written only under the scope's advisory lock (``sa_jobs.worker.limited_fetch``).
    """

    __tablename__ = "sa_job_rate_window"

    scope: Mapped[str] = mapped_column(Text, primary_key=True)
    window_start: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    #: Every start counted in this row happened before ``window_end``.
    window_end: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))
    #: No period that needs the row reaches back past it once this instant passed.
    keep_until: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))
    starts: Mapped[int] = mapped_column(Integer)

    __table_args__ = (CheckConstraint("starts >= 0", name="starts"),)


rate_window_table: Table = RateWindow.__table__  # type: ignore[assignment]
