"""Electing the one process that runs maintenance.

A lease in ``sa_job_leader``: the holder renews it every ``interval``; if it dies, the
lease expires after ``ttl`` and another process takes it. A leader that stops cleanly
resigns at once so a successor need not wait.

The holder's belief that it leads ends by its own clock: ``ttl`` after it *asked*, which is
no later than the lease's end in the database (``clock_timestamp()`` there, read while the
statement runs, after the asking; a driver may have sent ``BEGIN`` before, so not
``now()``). A holder held up past its ttl (a slow step, a stalled connection) stops
leading before another process can take the lease, so two never lead at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlalchemy import Connection, case, delete, func
from sqlalchemy.dialects.postgresql import insert as pg_insert

from sa_jobs._base.sql import seconds_interval
from sa_jobs._table.service_tables import Leader

__all__ = ["LeaderElection"]

LEADER_NAME = "maintenance"


class LeaderElection:
    def __init__(
        self, worker_id: str, ttl: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.worker_id = worker_id
        self.ttl = ttl
        self._clock = clock
        self._lease_until = float("-inf")

    @property
    def is_leader(self) -> bool:
        """Whether this process holds the lease now, by its own (conservative) clock."""
        return self._clock() < self._lease_until

    def lapse(self) -> None:
        """Forget the lease: the transaction that took or renewed it did not commit."""
        self._lease_until = float("-inf")

    def run_once(self, connection: Connection) -> int:
        """Take or renew the lease; returns 1 while this process leads, else 0.

        The caller commits, and calls :meth:`lapse` if the commit fails.
        """
        asked_at = self._clock()
        expires = func.clock_timestamp() + seconds_interval(self.ttl)
        claim = pg_insert(Leader).values(
            name=LEADER_NAME, leader_id=self.worker_id, elected_at=func.now(), expires_at=expires
        )
        excluded = claim.excluded
        statement = claim.on_conflict_do_update(
            index_elements=[Leader.name],
            set_={
                "leader_id": excluded.leader_id,
                # A renewal keeps the original election time; a takeover starts anew.
                "elected_at": case(
                    (Leader.leader_id == excluded.leader_id, Leader.elected_at),
                    else_=func.now(),
                ),
                "expires_at": excluded.expires_at,
            },
            where=(Leader.leader_id == excluded.leader_id) | (Leader.expires_at < func.now()),
        ).returning(Leader.leader_id)
        won = connection.execute(statement).first() is not None
        self._lease_until = asked_at + self.ttl if won else float("-inf")
        return 1 if won else 0

    def resign(self, connection: Connection) -> None:
        self.lapse()
        connection.execute(
            delete(Leader).where(Leader.name == LEADER_NAME, Leader.leader_id == self.worker_id)
        )
