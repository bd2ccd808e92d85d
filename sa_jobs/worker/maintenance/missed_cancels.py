"""Cancel requests this process may have missed: the ``NOTIFY`` is the fast path, and a
request sent while the listen connection was down is found here, on the next pass."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import Connection, select

from sa_jobs._base.states import CANCEL_ATTEMPTED_KEY
from sa_jobs._table.models import Job

__all__ = ["MissedCancels"]


class MissedCancels:
    """Interrupts running jobs of this process whose metadata says someone cancelled them.

    Args:
        running_ids: The jobs this process runs now.
        on_cancel: Interrupts one of them.
    """

    def __init__(
        self, running_ids: Callable[[], list[int]], on_cancel: Callable[[int], object]
    ) -> None:
        self._running_ids = running_ids
        self._on_cancel = on_cancel

    def run_once(self, connection: Connection) -> int:
        """Returns the number of jobs interrupted."""
        ids = self._running_ids()
        if not ids:
            return 0
        cancelled = connection.scalars(
            select(Job.id).where(Job.id.in_(ids), Job.metadata_.has_key(CANCEL_ATTEMPTED_KEY))
        ).all()
        for job_id in cancelled:
            self._on_cancel(job_id)
        return len(cancelled)
