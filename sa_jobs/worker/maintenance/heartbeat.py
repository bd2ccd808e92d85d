"""Every worker process's heartbeat row: the rescuer's proof that its jobs are not orphans."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Connection, delete, func
from sqlalchemy.dialects.postgresql import insert as pg_insert

from sa_jobs._table.schema import has_stuck_columns
from sa_jobs._table.service_tables import WorkerProcess

__all__ = ["Heartbeat"]


class Heartbeat:
    """Writes (and at the end removes) this process's row in ``sa_job_worker``, with
    its stuck handler threads and ``stuck_thread_limit`` (``stuck``, set by the run)
    where the database has those columns (revision ``sajobs_core_0006``)."""

    def __init__(self, worker_id: str, queues: Sequence[str]) -> None:
        self.worker_id = worker_id
        self.queues = list(queues)
        #: ``(threads stuck now, stuck_thread_limit)``; None writes neither.
        self.stuck: Callable[[], tuple[int, int]] | None = None
        self._has_stuck_columns: bool | None = None

    def run_once(self, connection: Connection) -> int:
        values: dict[str, Any] = {}
        if self.stuck is not None and self._stuck_columns(connection):
            stuck, limit = self.stuck()
            values = {"stuck_threads": stuck, "stuck_thread_limit": limit}
        statement = pg_insert(WorkerProcess).values(
            id=self.worker_id,
            hostname=socket.gethostname(),
            pid=os.getpid(),
            queues=self.queues,
            **values,
        )
        connection.execute(
            statement.on_conflict_do_update(
                index_elements=[WorkerProcess.id], set_={"heartbeat_at": func.now(), **values}
            )
        )
        return 0

    def _stuck_columns(self, connection: Connection) -> bool:
        # Once per process: a database migrated meanwhile is seen after a restart.
        if self._has_stuck_columns is None:
            self._has_stuck_columns = has_stuck_columns(connection)
        return self._has_stuck_columns

    def deregister(self, connection: Connection) -> None:
        connection.execute(delete(WorkerProcess).where(WorkerProcess.id == self.worker_id))
