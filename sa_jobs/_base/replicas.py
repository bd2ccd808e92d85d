"""Reads from a streaming standby: which server a read goes to, and why.

``read_engine=`` (the dashboard, ``stats()``, ``sa-jobs stats``/``jobs list``, the
Prometheus gauges, the polling side of ``wait_for``) names a replica of the primary's
database. Every write and every fetch stays on the primary; the reads those surfaces
make go to the replica — unless it is too far behind.

**The replay-lag guard.** Each read first asks the replica, on the connection it reads
on, how far behind it is (one statement of PostgreSQL's recovery functions, nothing
written anywhere):

* nothing received and not yet replayed (``pg_last_wal_receive_lsn() =
  pg_last_wal_replay_lsn()``): 0 s — it has everything it was sent;
* otherwise the time since the last transaction it replayed committed on the primary
  (``clock_timestamp() - pg_last_xact_replay_timestamp()``): an upper bound, which grows
  while replay is stopped (``pg_wal_replay_pause()``, a conflict, a broken disk).

Past ``max_lag`` seconds (default :data:`DEFAULT_MAX_LAG`) the guard does what
``on_lag`` says: ``"fall_back"`` (the default) reads on the primary instead, and
``"report"`` keeps reading the replica. Either way the :class:`ReplicaStatus` of the
read says where it went and how far behind the replica was, for the dashboard's banner
and the metrics. What a standby cannot tell (it receives no WAL at all because the
primary is gone or the network is cut) it reports as caught up: that is the primary's
own failure, which the worker and the failover manager see first.

**Identity.** The replica must be a copy of the primary's database: the same
``system_identifier`` (``pg_control_system()``; a standby shares its primary's, any
other cluster has its own), the same database name and oid, the same ``sa_job`` table.
Anything else is refused (:class:`~sa_jobs.errors.InvalidOptionsError`), before a read
runs there — the pages would show another database's jobs. A read engine that reaches a
server not in recovery is the primary itself (or a promoted standby, after a failover):
allowed, logged once as a warning, since its reads take nothing off the primary.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any, Literal

import attrs
from sqlalchemy import Connection, Engine, Text, case, cast, column, func, literal, select, table
from sqlalchemy.dialects.postgresql import OID
from sqlalchemy.ext.asyncio import AsyncEngine

from sa_jobs.errors import InvalidOptionsError

__all__ = [
    "DEFAULT_MAX_LAG",
    "ON_LAG",
    "OnLag",
    "ReplicaReads",
    "ReplicaStatus",
    "identity_of",
]

log = logging.getLogger("sa_jobs.replica")

#: Seconds a replica may be behind before the guard acts (``max_replica_lag=``).
DEFAULT_MAX_LAG = 5.0
OnLag = Literal["fall_back", "report"]
#: What the guard may do past the limit (``on_replica_lag=``).
ON_LAG: tuple[OnLag, ...] = ("fall_back", "report")

_standby = func.pg_is_in_recovery()
#: Where the server stands: in recovery, its lag (None on a primary), replay paused.
_LAG = select(
    _standby,
    case(
        (~_standby, None),
        (
            func.pg_last_wal_receive_lsn().is_not_distinct_from(func.pg_last_wal_replay_lsn()),
            literal(0.0),
        ),
        else_=func.extract(
            "epoch",
            func.clock_timestamp()
            - func.coalesce(func.pg_last_xact_replay_timestamp(), func.pg_postmaster_start_time()),
        ),
    ),
    case((_standby, func.pg_is_wal_replay_paused()), else_=False),
)
_pg_database = table("pg_database", column("oid"), column("datname"))
#: What tells a database apart, across a primary and its standbys (see the module).
_IDENTITY = select(
    select(column("system_identifier")).select_from(func.pg_control_system()).scalar_subquery(),
    func.current_database(),
    select(_pg_database.c.oid)
    .where(_pg_database.c.datname == func.current_database())
    .scalar_subquery(),
    cast(func.to_regclass(literal("sa_job", Text)), OID),
)


def identity_of(connection: Connection) -> tuple[Any, ...]:
    """``(system_identifier, database name, database oid, sa_job's oid)`` of the
    database ``connection`` reaches: equal on a primary and its standbys, different for
    any other database."""
    return tuple(connection.execute(_IDENTITY).one())


@attrs.frozen
class ReplicaStatus:
    """Where one read went, and what the guard saw.

    Attributes:
        source: ``"replica"`` or ``"primary"`` (the guard fell back).
        lag: Seconds the replica was behind (see the module); None when the read
            engine reached a server not in recovery (nothing to be behind).
        paused: The replica's WAL replay is paused (``pg_wal_replay_pause()``).
        max_lag: The limit the guard judged by.
        on_lag: What it does past the limit.
    """

    source: Literal["replica", "primary"]
    lag: float | None
    paused: bool
    max_lag: float
    on_lag: OnLag

    @property
    def behind(self) -> bool:
        """The replica is past ``max_lag``."""
        return self.lag is not None and self.lag > self.max_lag

    def describe(self) -> str:
        """One line for a page or a log: where the figures come from."""
        if self.lag is None:
            return "read engine: not a standby (the primary itself?)"
        state = f"replica {self.lag:.1f} s behind" + (", replay paused" if self.paused else "")
        if not self.behind:
            return f"read from the {state}"
        if self.source == "primary":
            return f"{state} (limit {self.max_lag:g} s): read from the primary instead"
        return f"read from the {state} (past the limit of {self.max_lag:g} s): figures are stale"


class ReplicaReads:
    """A read engine and its guard, shared by every read of one surface.

    Args:
        engine: The replica's engine (``read_engine=``).
        max_lag: Seconds behind past which the guard acts; positive.
        on_lag: ``"fall_back"`` (read the primary) or ``"report"`` (keep the replica).
        option: The surface's name for the engine, for messages.

    Raises:
        InvalidOptionsError: not an engine, or a bad limit or choice.
    """

    def __init__(
        self,
        engine: Engine | AsyncEngine,
        *,
        max_lag: float = DEFAULT_MAX_LAG,
        on_lag: str = "fall_back",
        option: str = "read_engine",
    ) -> None:
        if not isinstance(engine, Engine | AsyncEngine):
            raise InvalidOptionsError(
                option,
                f"must be a SQLAlchemy Engine or AsyncEngine on a replica, not "
                f"{type(engine).__name__}",
            )
        if engine.dialect.name != "postgresql":
            raise InvalidOptionsError(option, f"must be PostgreSQL's, not {engine.dialect.name}")
        self.max_lag = check_max_lag(max_lag)
        self.on_lag: OnLag = check_on_lag(on_lag)
        self.engine = engine
        self.option = option
        self._checked = False
        self._lock = threading.Lock()

    @property
    def sync_engine(self) -> Engine:
        """The sync form of the engine: an ``AsyncEngine``'s works inside SQLAlchemy's
        greenlet bridge (``AsyncSession.run_sync``), where sync session code runs."""
        engine = self.engine
        return engine.sync_engine if isinstance(engine, AsyncEngine) else engine

    def check(self, replica: Connection, primary: Callable[[], Connection]) -> None:
        """Refuse (once per instance) a replica of another database; warn for a read
        engine on a writable server. ``primary`` opens a connection to the primary."""
        if self._checked:
            return
        with self._lock:
            if self._checked:
                return
            found = identity_of(replica)
            wanted = identity_of(primary())
            if found != wanted:
                raise InvalidOptionsError(
                    self.option,
                    f"reaches database {found[1]!r} of another cluster or database than the "
                    f"primary's {wanted[1]!r} (system identifier, database oid or sa_job table "
                    "differ); give it an engine on a streaming standby of the primary",
                )
            if not replica.scalar(select(_standby)):
                log.warning(
                    "%s reaches a server that is not in recovery: the primary itself (or a "
                    "promoted standby); its reads take nothing off the primary",
                    self.option,
                )
            self._checked = True

    @contextlib.contextmanager
    def reading(
        self, primary: Callable[[], AbstractContextManager[Connection]]
    ) -> Iterator[tuple[Connection, ReplicaStatus]]:
        """A transaction to read in — on the replica, or on the primary when the guard
        falls back — and the replica's status. ``primary`` opens a transaction on the
        primary; it is called only when needed (the first identity check, a fall-back)."""
        with contextlib.ExitStack() as stack:
            replica = stack.enter_context(self.sync_engine.begin())
            opened: list[Connection] = []

            def on_primary() -> Connection:
                if not opened:
                    opened.append(stack.enter_context(primary()))
                return opened[0]

            self.check(replica, on_primary)
            status = self.measure(replica)
            yield (replica if status.source == "replica" else on_primary()), status

    def measure(self, replica: Connection) -> ReplicaStatus:
        """The replica's lag, read on ``replica``, and the guard's verdict on it."""
        standby, lag, paused = replica.execute(_LAG).one()
        seconds = None if not standby or lag is None else max(0.0, float(lag))
        status = ReplicaStatus("replica", seconds, bool(paused), self.max_lag, self.on_lag)
        if status.behind and self.on_lag == "fall_back":
            return attrs.evolve(status, source="primary")
        return status


def check_max_lag(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidOptionsError("max_replica_lag", f"must be a number of seconds, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise InvalidOptionsError(
            "max_replica_lag", f"must be a positive number of seconds, got {value!r}"
        )
    return float(value)


def check_on_lag(value: object) -> OnLag:
    for choice in ON_LAG:
        if value == choice:
            return choice
    raise InvalidOptionsError(
        "on_replica_lag", f"must be one of {', '.join(map(repr, ON_LAG))}, got {value!r}"
    )
