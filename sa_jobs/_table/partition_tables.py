"""The ``sa_jobs_fairness`` branch's table: starts counted per partition key and window.

A :class:`~sa_jobs.RateLimit` with ``by_args`` sums, per key, the rows whose window ends
inside its period, as :class:`~sa_jobs._table.limit_tables.RateWindow` does per scope. Only
fetches of queues with such a limit read or write it, under the limit's advisory lock
(:mod:`sa_jobs.worker.keyed_fetch`). (The branch's column, ``sa_job.partition_key``, and
its index are on :class:`~sa_jobs._table.models.Job`.)
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import CheckConstraint, DateTime, Integer, Table, Text
from sqlalchemy.orm import Mapped, mapped_column

from sa_jobs._table.models import Base

__all__ = ["KeyRateWindow", "key_rate_window_table"]


class KeyRateWindow(Base):
    """How many jobs of one key of one limited scope started in one short window."""

    __tablename__ = "sa_job_key_rate_window"

    scope: Mapped[str] = mapped_column(Text, primary_key=True)
    window_start: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    partition_key: Mapped[str] = mapped_column(Text(collation="C"), primary_key=True)
    window_end: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))
    keep_until: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))
    starts: Mapped[int] = mapped_column(Integer)

    __table_args__ = (CheckConstraint("starts >= 0", name="starts"),)


key_rate_window_table: Table = KeyRateWindow.__table__  # type: ignore[assignment]
