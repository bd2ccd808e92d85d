"""Every worker process: a heartbeat row, and a look for cancel requests it may have missed."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Sequence

from sqlalchemy import Connection, delete, func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert

from sa_jobs.models import Job, WorkerProcess
from sa_jobs.states import CANCEL_ATTEMPTED_KEY
from sa_jobs.worker.maintenance.rescuer import Rescuer

__all__ = ["Presence"]


class Presence:
    def __init__(
        self,
        worker_id: str,
        queues: Sequence[str],
        running_ids: Callable[[], list[int]],
        on_cancel: Callable[[int], object],
        held_ids: Callable[[], list[int]] | None = None,
        rescuer: Rescuer | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.queues = list(queues)
        self._running_ids = running_ids
        self._on_cancel = on_cancel
        self._held_ids = held_ids or running_ids
        self.rescuer = rescuer

    def run_once(self, connection: Connection) -> int:
        """Heartbeat, rescue our own lost jobs, and interrupt jobs someone asked to cancel.

        A job can be ``running`` for this process's id without this process holding it: a
        fetch whose COMMIT landed but whose reply was lost, or a predecessor that used the
        same worker id. Our heartbeat would keep the rescuer away from it forever, so we
        rescue it ourselves (after ``rescue_after``, so a fetch in flight is never taken).

        The cancel NOTIFY is the fast path; the check here catches one sent while our
        listen connection was down. Returns the number of jobs rescued or cancelled.
        """
        self.heartbeat(connection)
        rescued = 0
        if self.rescuer is not None:
            rescued = self.rescuer.run_once(connection, own=(self.worker_id, self._held_ids()))
        ids = self._running_ids()
        if not ids:
            return rescued
        cancelled = connection.scalars(
            select(Job.id).where(Job.id.in_(ids), Job.metadata_.has_key(CANCEL_ATTEMPTED_KEY))
        ).all()
        for job_id in cancelled:
            self._on_cancel(job_id)
        return rescued + len(cancelled)

    def heartbeat(self, connection: Connection) -> None:
        statement = pg_insert(WorkerProcess).values(
            id=self.worker_id,
            hostname=socket.gethostname(),
            pid=os.getpid(),
            queues=self.queues,
        )
        connection.execute(
            statement.on_conflict_do_update(
                index_elements=[WorkerProcess.id], set_={"heartbeat_at": func.now()}
            )
        )

    def deregister(self, connection: Connection) -> None:
        connection.execute(delete(WorkerProcess).where(WorkerProcess.id == self.worker_id))
