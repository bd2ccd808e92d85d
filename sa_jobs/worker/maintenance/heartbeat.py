"""Every worker process's heartbeat row: the rescuer's proof that its jobs are not orphans."""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence

from sqlalchemy import Connection, delete, func
from sqlalchemy.dialects.postgresql import insert as pg_insert

from sa_jobs.models import WorkerProcess

__all__ = ["Heartbeat"]


class Heartbeat:
    """Writes (and at the end removes) this process's row in ``sa_job_worker``."""

    def __init__(self, worker_id: str, queues: Sequence[str]) -> None:
        self.worker_id = worker_id
        self.queues = list(queues)

    def run_once(self, connection: Connection) -> int:
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
        return 0

    def deregister(self, connection: Connection) -> None:
        connection.execute(delete(WorkerProcess).where(WorkerProcess.id == self.worker_id))
