"""Keeping the hot partial indexes small: ``REINDEX INDEX CONCURRENTLY`` when bloated.

Every job passes through the partial indexes of the transient states — it enters
``sa_job_fetch_idx`` when it becomes available and leaves it when it starts — so under a
steady load those indexes hold few live entries but keep growing: VACUUM removes the
dead entries and recycles wholly empty pages, but a B-tree's file never shrinks, and
half-empty pages stay half empty. A public benchmark's sustained runs measured the fetch
index at 2.7 to 8.5 MB with almost nothing in it. River runs a reindexer for this.

The leader checks each index of :data:`HOT_INDEXES` that exists (the branches decide
which do) every ``reindex_interval`` and rebuilds the ones whose size exceeds both
``min_bytes`` and ``bloat_factor`` times an estimate of what their live entries need:
``reltuples`` of the index (kept by VACUUM and ANALYZE, autovacuum included) times a
generous :data:`ENTRY_BYTES` per entry, over B-tree pages filled to 90 %.
(``pgstattuple`` would measure instead of estimating, but it is an extension the
database may not have.)

``REINDEX CONCURRENTLY`` builds a new index beside the old one and swaps them: inserts,
fetches and completions go on throughout (it takes ``SHARE UPDATE EXCLUSIVE`` on the
table, which only conflicts with VACUUM, ANALYZE and schema changes). It cannot run in a
transaction block, so :meth:`Reindexer.run_once` needs an autocommit connection; it
reads the whole table twice, so it runs on a thread of its own
(:class:`~sa_jobs.worker.maintenance.loop.MaintenanceLoop`), never delaying the
heartbeat. A rebuild that fails midway (a lock timeout, a cancelled statement, a process
killed) leaves an invalid ``*_ccnew`` index behind; the next pass drops it.
"""

from __future__ import annotations

import logging
from typing import Any

import attrs
from sqlalchemy import Connection, bindparam, text

from sa_jobs.errors import InvalidOptionsError

__all__ = ["ENTRY_BYTES", "HOT_INDEXES", "IndexSize", "ReindexSettings", "Reindexer"]

log = logging.getLogger("sa_jobs.worker")

#: The partial indexes whose rows are transient states (a job passes through and leaves):
#: the core's fetch, due and running indexes, and the branches' pending and fair-fetch
#: indexes. An index a branch did not install is skipped.
HOT_INDEXES = (
    "sa_job_fetch_idx",
    "sa_job_due_idx",
    "sa_job_running_idx",
    "sa_job_partition_idx",
    "sa_job_sequence_pending_idx",
    "sa_job_workflow_pending_idx",
)

#: Bytes one entry of a hot index takes at most in the common case: the tuple header
#: (8), the keys (the fetch index's queue name, priority, scheduled_at and id are about
#: 40) and the line pointer (4), rounded up so a long queue name does not look like bloat.
ENTRY_BYTES = 64
_PAGE = 8192
_FILL = 0.9


def _positive(_instance: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if value <= 0:
        raise InvalidOptionsError(attribute.name, f"must be positive, got {value}")


@attrs.frozen
class ReindexSettings:
    """When a hot index is rebuilt.

    Attributes:
        min_bytes: Never rebuild an index smaller than this (default 1 MiB): below it a
            bloated index costs a fetch a few page reads.
        bloat_factor: Rebuild when the index is this many times the size its live
            entries need (default 4).
        lock_timeout: Seconds the rebuild waits for each of its locks before giving up
            (and leaving its half-built index for the next pass to drop).
    """

    min_bytes: int = attrs.field(default=1024 * 1024, validator=_positive)
    bloat_factor: float = attrs.field(default=4.0, validator=_positive)
    lock_timeout: float = attrs.field(default=5.0, validator=_positive)


@attrs.frozen
class IndexSize:
    """An index's size on disk, and its live entries as the statistics estimate them."""

    name: str
    bytes: int
    entries: float

    def needed_bytes(self) -> float:
        """What the live entries need: full pages at 90 %, plus the meta and root pages."""
        return (max(self.entries, 0.0) * ENTRY_BYTES / (_PAGE * _FILL) + 2) * _PAGE

    def bloated(self, settings: ReindexSettings) -> bool:
        return self.bytes > max(settings.min_bytes, settings.bloat_factor * self.needed_bytes())


_SIZES = text(
    "SELECT c.oid::regclass::text AS name, pg_relation_size(c.oid) AS bytes,"
    " c.reltuples AS entries"
    " FROM pg_class c JOIN pg_index i ON i.indexrelid = c.oid"
    " WHERE c.relname IN :names AND i.indisvalid"
    " AND c.relnamespace = (SELECT relnamespace FROM pg_class WHERE oid = 'sa_job'::regclass)"
    " AND i.indrelid = 'sa_job'::regclass"
    " ORDER BY c.relname"
).bindparams(bindparam("names", expanding=True))

#: Half-built indexes a failed REINDEX CONCURRENTLY left on sa_job (``_ccnew``, and
#: ``_ccold`` if it failed after the swap): invalid, so no query uses them, but every
#: write still maintains them.
_LEFTOVERS = text(
    "SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname)"
    " FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
    " JOIN pg_namespace n ON n.oid = c.relnamespace"
    " WHERE i.indrelid = 'sa_job'::regclass AND NOT i.indisvalid"
    " AND (c.relname LIKE '%\\_ccnew%' OR c.relname LIKE '%\\_ccold%')"
)

_OWNS_TABLE = text(
    "SELECT pg_has_role(current_user, relowner, 'USAGE') FROM pg_class"
    " WHERE oid = 'sa_job'::regclass"
)


class Reindexer:
    """Rebuilds the bloated hot indexes; see the module's docstring."""

    def __init__(self, settings: ReindexSettings | None = None) -> None:
        self.settings = settings or ReindexSettings()
        self._warned_not_owner = False

    def sizes(self, connection: Connection) -> list[IndexSize]:
        rows = connection.execute(_SIZES, {"names": list(HOT_INDEXES)})
        return [IndexSize(row.name, int(row.bytes), float(row.entries)) for row in rows]

    def run_once(self, connection: Connection) -> int:
        """Drop leftovers of failed rebuilds, then rebuild every bloated hot index;
        returns how many were rebuilt. ``connection`` must be in autocommit mode."""
        if not connection.scalar(_OWNS_TABLE):
            if not self._warned_not_owner:
                self._warned_not_owner = True
                log.warning(
                    "reindexer: the worker's database role does not own sa_job, so it cannot "
                    "rebuild its indexes; run the worker as the table's owner, or leave "
                    "reindex_interval unset and REINDEX from a job of your own"
                )
            return 0
        timeout = f"{int(self.settings.lock_timeout * 1000)}ms"
        connection.execute(
            text("SELECT set_config('lock_timeout', :value, false)"), {"value": timeout}
        )
        try:
            for leftover in connection.execute(_LEFTOVERS).scalars().all():
                log.info("reindexer: dropping %s, left by a failed rebuild", leftover)
                connection.execute(text(f"DROP INDEX CONCURRENTLY IF EXISTS {leftover}"))
            rebuilt = 0
            for index in self.sizes(connection):
                if not index.bloated(self.settings):
                    continue
                log.info(
                    "reindexer: rebuilding %s (%d kB for about %.0f entries)",
                    index.name,
                    index.bytes // 1024,
                    max(index.entries, 0),
                )
                # regclass's text: a name of HOT_INDEXES, quoted and qualified as needed.
                connection.execute(text(f"REINDEX INDEX CONCURRENTLY {index.name}"))
                rebuilt += 1
            return rebuilt
        finally:
            connection.execute(text("RESET lock_timeout"))
