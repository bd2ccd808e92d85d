"""What holds the database's xmin horizon back, and the dead rows of ``sa_job``: read from
PostgreSQL's catalogs and statistics views (judged in :mod:`sa_jobs._inspect.health`).

The horizon of a table is the oldest transaction id or snapshot anything that can see
the table still holds: an open transaction of a session of the same database (its
``backend_xmin``, or its ``backend_xid`` once it has written), a standby's
``hot_standby_feedback`` (a walsender, any database), a prepared transaction of the same
database, a replication slot's ``xmin``. A logical slot's ``catalog_xmin`` keeps catalog
rows only. Vacuum removes no dead row younger than the horizon.

What a role can see: ``pg_replication_slots``, ``pg_prepared_xacts`` and
``pg_stat_user_tables`` are readable by every role. ``pg_stat_activity`` shows the
transaction of another role's session only to members of ``pg_read_all_stats`` (part of
``pg_monitor``) and superusers; for anyone else, those rows carry no transaction ids at
all, so :func:`sees_all_sessions` is false and :func:`oldest_xid_age` — the oldest
transaction id still running on the server, from ``pg_current_snapshot()``, which every
role can read — stands in: it sees writers of every role, not read-only snapshots.
"""

from __future__ import annotations

import datetime as dt
import enum
from typing import Any

import attrs
from sqlalchemy import BigInteger, Connection, Text, column, func, or_, select, table
from sqlalchemy import cast as sql_cast
from sqlalchemy.sql.expression import ColumnClause

from sa_jobs._table.models import job_table

__all__ = [
    "HOLDERS_LISTED",
    "DeadTuples",
    "HolderKind",
    "HorizonHolder",
    "dead_tuples",
    "horizon_holders",
    "oldest_xid_age",
    "sees_all_sessions",
    "vacuum_trigger",
]

#: How many holders of the horizon of each kind are read (the oldest first).
HOLDERS_LISTED = 10
#: How much of a holder's current query is kept.
QUERY_CHARS = 100


class HolderKind(enum.StrEnum):
    """What holds the horizon back."""

    #: An open transaction (or a standby's ``hot_standby_feedback``, seen as a walsender).
    TRANSACTION = "transaction"
    #: A prepared transaction (``PREPARE TRANSACTION``) nobody committed or rolled back.
    PREPARED = "prepared transaction"
    #: A replication slot's ``xmin``.
    SLOT = "replication slot"
    #: A (logical) replication slot's ``catalog_xmin``: keeps catalog rows, not job rows,
    #: so it is listed but never raises the level.
    SLOT_CATALOG = "replication slot (catalog)"


@attrs.frozen
class HorizonHolder:
    """One thing holding the xmin horizon back.

    Attributes:
        kind: What it is.
        name: Which one: ``pid 1234``, the slot's name, the prepared transaction's gid.
        xid_age: How many transaction ids ago its snapshot or transaction began.
        age: How long it has been open (a slot has no start time: None).
        detail: The role, application, state and query of a session; a slot's type and
            whether it is active; a prepared transaction's owner.
    """

    kind: HolderKind
    name: str
    xid_age: int
    age: dt.timedelta | None
    detail: str

    @property
    def holds_job_rows(self) -> bool:
        return self.kind is not HolderKind.SLOT_CATALOG


@attrs.frozen
class DeadTuples:
    """``pg_stat_user_tables`` for ``sa_job`` (the statistics collector's counts, which
    lag behind by up to a second or so and are estimates after a crash)."""

    live: int
    dead: int
    last_vacuum: dt.datetime | None
    last_autovacuum: dt.datetime | None
    vacuum_count: int
    autovacuum_count: int
    #: How many dead rows make autovacuum vacuum ``sa_job``: its
    #: ``autovacuum_vacuum_threshold + autovacuum_vacuum_scale_factor * live`` (the
    #: table's own settings, else the server's); None when autovacuum is off for it.
    vacuum_trigger: int | None = None


def vacuum_trigger(live: int, reloptions: list[str] | None, settings: dict[str, str]) -> int | None:
    """The dead rows at which autovacuum vacuums a table of ``live`` rows, from its
    ``reloptions`` (``["autovacuum_vacuum_scale_factor=0.01", ...]``) and the server's
    ``autovacuum``, ``autovacuum_vacuum_threshold`` and ``autovacuum_vacuum_scale_factor``;
    None when autovacuum will not vacuum it."""
    table = dict(option.split("=", 1) for option in reloptions or () if "=" in option)
    enabled = table.get("autovacuum_enabled", "on").lower() not in ("off", "false", "0", "no")
    if settings.get("autovacuum", "on") != "on" or not enabled:
        return None
    threshold = int(table.get("autovacuum_vacuum_threshold", settings["threshold"]))
    scale = float(table.get("autovacuum_vacuum_scale_factor", settings["scale_factor"]))
    return threshold + round(scale * max(live, 0))


_activity = table(
    "pg_stat_activity",
    *(
        column(name)
        for name in (
            "pid",
            "datname",
            "usename",
            "application_name",
            "backend_type",
            "state",
            "xact_start",
            "backend_xid",
            "backend_xmin",
            "query",
        )
    ),
)
_prepared = table("pg_prepared_xacts", *map(column, ("gid", "prepared", "owner", "database")))
_prepared_xid: ColumnClause[Any] = column("transaction")
_slots = table(
    "pg_replication_slots", *map(column, ("slot_name", "slot_type", "active", "database"))
)
_slot_xmin: ColumnClause[Any] = column("xmin")
_slot_catalog_xmin: ColumnClause[Any] = column("catalog_xmin")
_class = table("pg_class", column("oid"), column("reloptions"))

_table_stats = table(
    "pg_stat_user_tables",
    *map(
        column,
        (
            "relid",
            "n_live_tup",
            "n_dead_tup",
            "last_vacuum",
            "last_autovacuum",
            "vacuum_count",
            "autovacuum_count",
        ),
    ),
)


def _sessions(connection: Connection) -> list[HorizonHolder]:
    a = _activity.c
    xid_age = func.greatest(func.age(a.backend_xmin), func.age(a.backend_xid))
    statement = (
        select(
            a.pid,
            a.usename,
            a.application_name,
            a.backend_type,
            a.state,
            (func.now() - a.xact_start).label("age"),
            xid_age.label("xid_age"),
            func.left(a.query, QUERY_CHARS).label("query"),
        )
        .where(
            or_(a.backend_xmin.is_not(None), a.backend_xid.is_not(None)),
            a.pid != func.pg_backend_pid(),
            # Autovacuum's own snapshot is ignored by other vacuums.
            a.backend_type != "autovacuum worker",
            # A data table's horizon counts the sessions of its own database, and
            # walsenders (a standby's hot_standby_feedback holds every database).
            or_(a.datname == func.current_database(), a.backend_type == "walsender"),
        )
        .order_by(xid_age.desc())
        .limit(HOLDERS_LISTED)
    )
    holders = []
    for row in connection.execute(statement):
        who = ", ".join(
            part
            for part in (
                row.usename and f"role {row.usename}",
                row.application_name and f"application {row.application_name!r}",
                row.backend_type if row.backend_type != "client backend" else "",
                row.state,
                row.query and f"query {row.query!r}",
            )
            if part
        )
        holders.append(
            HorizonHolder(HolderKind.TRANSACTION, f"pid {row.pid}", row.xid_age, row.age, who)
        )
    return holders


def _prepared_transactions(connection: Connection) -> list[HorizonHolder]:
    p = _prepared.c
    statement = (
        select(
            p.gid,
            p.owner,
            (func.now() - p.prepared).label("age"),
            func.age(_prepared_xid).label("xid_age"),
        )
        .select_from(_prepared)
        .where(p.database == func.current_database())
    )
    return [
        HorizonHolder(HolderKind.PREPARED, row.gid, row.xid_age, row.age, f"owner {row.owner}")
        for row in connection.execute(statement)
    ]


def _replication_slots(connection: Connection) -> list[HorizonHolder]:
    s = _slots.c
    statement = (
        select(
            s.slot_name,
            s.slot_type,
            s.active,
            func.age(_slot_xmin).label("xid_age"),
            func.age(_slot_catalog_xmin).label("catalog_xid_age"),
        )
        .select_from(_slots)
        .where(or_(_slot_xmin.is_not(None), _slot_catalog_xmin.is_not(None)))
    )
    holders = []
    for row in connection.execute(statement):
        detail = f"{row.slot_type}, {'active' if row.active else 'inactive'}"
        if row.xid_age is not None:
            holders.append(HorizonHolder(HolderKind.SLOT, row.slot_name, row.xid_age, None, detail))
        if row.catalog_xid_age is not None:
            holders.append(
                HorizonHolder(
                    HolderKind.SLOT_CATALOG, row.slot_name, row.catalog_xid_age, None, detail
                )
            )
    return holders


def oldest_xid_age(connection: Connection) -> int:
    """Transaction ids since the oldest one still running on the server began."""
    # xmax is the next id to be given out, xmin the oldest still running; as xid8 they
    # never wrap, so their difference is an age (xid8 has no minus: through bigint).
    snapshot = func.pg_current_snapshot()
    xmax = sql_cast(sql_cast(func.pg_snapshot_xmax(snapshot), Text), BigInteger)
    xmin = sql_cast(sql_cast(func.pg_snapshot_xmin(snapshot), Text), BigInteger)
    return int(connection.scalar(select(xmax - xmin)) or 0)


def dead_tuples(connection: Connection) -> DeadTuples | None:
    """``sa_job``'s row in ``pg_stat_user_tables``; None when the statistics have none."""
    t = _table_stats.c
    c = _class.c
    # to_regclass follows the search_path, as every other statement on sa_job does.
    relid = func.to_regclass(job_table.name)
    row = connection.execute(
        select(
            t.n_live_tup,
            t.n_dead_tup,
            t.last_vacuum,
            t.last_autovacuum,
            t.vacuum_count,
            t.autovacuum_count,
            c.reloptions,
            func.current_setting("autovacuum").label("autovacuum"),
            func.current_setting("autovacuum_vacuum_threshold").label("threshold"),
            func.current_setting("autovacuum_vacuum_scale_factor").label("scale_factor"),
        )
        .join_from(_table_stats, _class, c.oid == t.relid)
        .where(t.relid == relid)
    ).one_or_none()
    if row is None:
        return None
    return DeadTuples(
        live=row.n_live_tup,
        dead=row.n_dead_tup,
        last_vacuum=row.last_vacuum,
        last_autovacuum=row.last_autovacuum,
        vacuum_count=row.vacuum_count,
        autovacuum_count=row.autovacuum_count,
        vacuum_trigger=vacuum_trigger(
            row.n_live_tup,
            row.reloptions,
            {
                "autovacuum": row.autovacuum,
                "threshold": row.threshold,
                "scale_factor": row.scale_factor,
            },
        ),
    )


def sees_all_sessions(connection: Connection) -> bool:
    """The role sees the transactions of every role's sessions (``pg_read_all_stats``)."""
    # True for superusers as well (they have every role's privileges).
    return bool(connection.scalar(select(func.pg_has_role("pg_read_all_stats", "USAGE"))))


def horizon_holders(connection: Connection) -> list[HorizonHolder]:
    """Open transactions, prepared transactions and replication slots holding the
    horizon, the oldest (in transaction ids) first."""
    holders = [
        *_sessions(connection),
        *_prepared_transactions(connection),
        *_replication_slots(connection),
    ]
    holders.sort(key=lambda holder: holder.xid_age, reverse=True)
    return holders
