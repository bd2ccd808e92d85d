"""The hot indexes under a steady load for an hour, with the reindexer and without it.

Not a test. Side by side, each in a throwaway database of its own (``_shared.database``):
a real :class:`sa_jobs.Worker` (``queues={"default": 20}``, a no-op handler) and a
producer thread inserting ``--rate`` jobs/s (``insert_many`` batches every 0.1 s, paced
by the clock). Each queue starts with ``--backlog`` available jobs (default 2,000) and its
handler is paced to finish ``--rate`` jobs/s, so the backlog stays put: a queue whose
workers run at capacity. (Without a backlog the fetch index barely grows: a job's dead
entry is still on the page new entries go to, and a B-tree deletes killed entries from a
page before splitting it. ``--backlog 0`` lets the handler run free.) One database's
worker runs the reindexer (``MaintenanceConfig(reindex_interval=--reindex-interval)``,
``ReindexSettings`` with ``min_bytes = --min-kb`` kB; give ``--min-kb`` twice for two
such databases); the other's does not. Finished jobs keep the default retention (24 h:
the cleaner deletes none of them in an hour, so the table grows by ``rate * 3600`` rows,
as a real queue's would).

Vacuum: PostgreSQL's autovacuum if the server runs it. If it is off (as on the machine
this was written on, whose configuration is not ours to change), ``--vacuum auto``
stands in for it: a thread per database that every 60 s (autovacuum's naptime) runs
``VACUUM`` / ``ANALYZE`` on ``sa_job`` when autovacuum would, with the server's
thresholds and ``sa_job``'s own (the schema's ``autovacuum_vacuum_scale_factor`` of
0.01); like autovacuum it skips the table when another holds its lock (a rebuild), but
it is not throttled by a cost delay. ``--vacuum pg-default`` uses the stand-in with
PostgreSQL's defaults only (a vacuum once 20 % of the rows are dead: a table whose
setting was reset); ``--vacuum none`` runs no vacuum at all.

Every ``--sample`` seconds, for each database: the hot indexes' sizes and estimated live
entries (:meth:`Reindexer.sizes`), the fetch's median time (the fetch's own SELECT of 10
due jobs of ``default``, read only — no row locks, so the worker is not disturbed — 50
times) and the pages one such SELECT touches (``EXPLAIN (ANALYZE, BUFFERS)``), the jobs
inserted and worked, the backlog, the vacuums run, and the rebuilds: an index's
``relfilenode`` changes when it is rebuilt, polled every 0.1 s, and the worker's log line
"reindexer: rebuilding" marks when each began (so a rebuild's time is known to ~0.1 s).

    python bench/reindex_steady.py --minutes 60 --rate 150 --sample 60 \\
        --reindex-interval 120 --backlog 2000 --json /tmp/reindex_steady.json
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import UTC, datetime
from typing import Any

from _shared import database
from sqlalchemy import Engine, create_engine, select, text
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs._table.models import Job
from sa_jobs._table.schema import Features
from sa_jobs.benchmark.report import environment
from sa_jobs.worker.db_access import autocommit
from sa_jobs.worker.maintenance.reindexer import HOT_INDEXES, Reindexer, ReindexSettings
from sa_jobs.worker.producer import FETCH_ORDER, due_in_queue

log = logging.getLogger("sa_jobs.worker")

TICK = 0.1  # the producer's batch period, and the rebuild watcher's


@sa_jobs.job_args(kind="bench_reindex_noop")
class Noop:
    n: int = 0


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


class Side:
    """One database: its worker, its producer, what has been counted so far."""

    def __init__(
        self,
        label: str,
        engine: Engine,
        min_kb: int | None,
        interval: float,
        *,
        backlog: int,
        rate: float,
    ) -> None:
        self.label = label
        self.backlog = backlog
        self.engine = engine  # the worker's
        # The bench's own connections, apart from the worker's pool.
        self.own = create_engine(engine.url.render_as_string(hide_password=False), pool_size=4)
        self.reindexing = min_kb is not None
        settings = ReindexSettings(min_bytes=(min_kb or 1024) * 1024)
        maintenance = sa_jobs.MaintenanceConfig(
            reindex_interval=interval if self.reindexing else None, reindex=settings
        )
        self.worker = sa_jobs.Worker(engine, queues={"default": 20}, maintenance=maintenance)
        self.lock = threading.Lock()
        self.worked = 0
        self.inserted = 0
        self.vacuums = 0
        self.analyzes = 0
        self.vacuum_skipped = 0
        self.rebuilds: list[dict[str, Any]] = []

        self.slot = 0.0  # when the paced handler may finish its next job

        @self.worker.handler(Noop)
        def noop(job: sa_jobs.Job[Noop]) -> None:
            if backlog:
                # The worker works exactly --rate jobs/s, as the producer inserts them, so
                # the backlog stays where it began: a queue whose workers are at capacity.
                # After a stall it catches up at full speed.
                with self.lock:
                    self.slot = max(self.slot, self.began) + 1 / rate
                    wait = self.slot - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
            with self.lock:
                self.worked += 1

        with engine.connect() as connection:
            features = Features.of(connection)
        probe = (
            select(Job.id)
            .where(*due_in_queue(features))
            .order_by(*FETCH_ORDER)
            .limit(10)
            .params(fetch_queue="default")
        )
        self.probe_sql = str(
            probe.compile(
                dialect=postgresql.dialect(),  # type: ignore[no-untyped-call]
                compile_kwargs={"literal_binds": True},
            )
        )

    # -- the producer --------------------------------------------------------------

    def start(self) -> None:
        """Insert the standing backlog, then start the worker; the clock starts now."""
        for first in range(0, self.backlog, 1000):
            with Session(self.own) as session, session.begin():
                count = min(1000, self.backlog - first)
                sa_jobs.insert_many(session, [Noop(-1 - first - n) for n in range(count)])
        self.began = time.monotonic()
        self.worker.start()

    def produce(self, rate: float, stop: threading.Event) -> None:
        while not stop.wait(TICK):
            due = int((time.monotonic() - self.began) * rate) - self.inserted
            if due <= 0:
                continue
            with Session(self.own) as session, session.begin():
                sa_jobs.insert_many(session, [Noop(self.inserted + n) for n in range(due)])
            self.inserted += due

    # -- autovacuum's stand-in -------------------------------------------------------

    def vacuum_like_autovacuum(self, stop: threading.Event, *, table_options: bool) -> None:
        """Every 60 s, VACUUM and/or ANALYZE ``sa_job`` if autovacuum would: with the
        server's thresholds, and ``sa_job``'s own (the schema sets its
        ``autovacuum_vacuum_scale_factor`` to 0.01) unless ``table_options`` is false."""
        counts = text(
            "SELECT s.n_dead_tup, s.n_ins_since_vacuum, s.n_mod_since_analyze,"
            " greatest(c.reltuples, 0) AS reltuples"
            " FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid"
            " WHERE s.relid = 'sa_job'::regclass"
        )
        with self.own.connect() as connection:
            found = connection.execute(
                text("SELECT name, setting FROM pg_settings WHERE name LIKE 'autovacuum_%'")
            )
            limits = {row.name: row.setting for row in found}
            reloptions = connection.scalar(
                text("SELECT reloptions FROM pg_class WHERE oid = 'sa_job'::regclass")
            )
        if table_options:
            limits.update(option.split("=", 1) for option in reloptions or [])
        self.vacuum_settings = {
            name: float(limits[name])
            for name in (
                "autovacuum_vacuum_threshold",
                "autovacuum_vacuum_scale_factor",
                "autovacuum_vacuum_insert_threshold",
                "autovacuum_vacuum_insert_scale_factor",
                "autovacuum_analyze_threshold",
                "autovacuum_analyze_scale_factor",
            )
        }
        t = {
            name.removeprefix("autovacuum_"): value for name, value in self.vacuum_settings.items()
        }
        while not stop.wait(60.0):
            with autocommit(self.own).connect() as connection:
                row = connection.execute(counts).one()
                vacuum = (
                    row.n_dead_tup
                    > t["vacuum_threshold"] + t["vacuum_scale_factor"] * row.reltuples
                    or row.n_ins_since_vacuum
                    > t["vacuum_insert_threshold"] + t["vacuum_insert_scale_factor"] * row.reltuples
                )
                analyze = (
                    row.n_mod_since_analyze
                    > t["analyze_threshold"] + t["analyze_scale_factor"] * row.reltuples
                )
                if not (vacuum or analyze):
                    continue
                what = "VACUUM ANALYZE" if vacuum and analyze else "VACUUM" if vacuum else "ANALYZE"
                # Autovacuum takes the table's lock only if it is free (a rebuild holds it).
                connection.execute(text("SET lock_timeout = '10ms'"))
                try:
                    connection.execute(text(f"{what} sa_job"))
                except Exception:
                    self.vacuum_skipped += 1
                    continue
                finally:
                    connection.execute(text("RESET lock_timeout"))
                self.vacuums += vacuum
                self.analyzes += analyze

    # -- the rebuilds ---------------------------------------------------------------

    def relfilenodes(self, connection: Any) -> dict[str, int]:
        rows = connection.execute(
            text(
                "SELECT relname, relfilenode FROM pg_class WHERE relkind = 'i'"
                " AND relname = ANY(:names)"
            ),
            {"names": list(HOT_INDEXES)},
        )
        return {row.relname: row.relfilenode for row in rows}

    def watch_rebuilds(self, started: dict[str, tuple[float, int]], stop: threading.Event) -> None:
        """Poll the hot indexes' relfilenodes; a change is a finished rebuild, timed from
        the worker's "rebuilding" log line (``started``)."""
        with autocommit(self.own).connect() as connection:
            known = self.relfilenodes(connection)
            while not stop.wait(TICK):
                now = self.relfilenodes(connection)
                for name, node in now.items():
                    if known.get(name, node) != node:
                        at = time.time()
                        began, kb = started.pop(name, (None, 0))
                        self.rebuilds.append(
                            {
                                "index": name,
                                "at": at,
                                "seconds": None if began is None else round(at - began, 2),
                                "kb_before": kb,
                            }
                        )
                known = now

    # -- a sample -------------------------------------------------------------------

    def sample(self) -> dict[str, Any]:
        with autocommit(self.own).connect() as connection:
            sizes = Reindexer().sizes(connection)
            times = []
            for _ in range(50):
                began = time.perf_counter()
                connection.execute(text(self.probe_sql)).all()
                times.append(time.perf_counter() - began)
            plan = connection.execute(
                text("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + self.probe_sql)
            ).scalar_one()
            backlog = connection.scalar(
                text("SELECT count(*) FROM sa_job WHERE state = 'available'")
            )
            table = connection.scalar(text("SELECT pg_relation_size('sa_job')"))
        top = plan[0]["Plan"]
        return {
            "indexes": {
                size.name: {"bytes": size.bytes, "entries": size.entries} for size in sizes
            },
            "probe_ms": round(statistics.median(times) * 1e3, 3),
            "probe_buffers": top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0),
            "probe_indexes": _indexes_of(top),
            "inserted": self.inserted,
            "worked": self.worked,
            "backlog": backlog,
            "table_bytes": table,
            "vacuums": self.vacuums,
            "analyzes": self.analyzes,
            "vacuums_skipped": self.vacuum_skipped,
            "rebuilds": len(self.rebuilds),
        }


def _indexes_of(plan: dict[str, Any]) -> list[str]:
    """The indexes the probe's plan reads: the fetch index, and the queue branch's
    paused check on ``sa_job_queue``."""
    found = [str(plan["Index Name"])] if "Index Name" in plan else []
    for child in plan.get("Plans", []):
        found += _indexes_of(child)
    return found


class RebuildLog(logging.Handler):
    """Keeps the start of each rebuild the worker logs, and counts failed passes."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.started: dict[str, tuple[float, int]] = {}
        self.failures: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args
        if str(record.msg).startswith("reindexer: rebuilding") and isinstance(args, tuple):
            name, kb = args[0], args[1]
            size = kb if isinstance(kb, int) else 0
            self.started[str(name).rsplit(".", 1)[-1]] = (record.created, size)
        elif "reindex" in record.getMessage() and record.levelno >= logging.WARNING:
            self.failures.append(f"{utc_now()} {record.getMessage()}")


def show(minute: float, side: Side, found: dict[str, Any]) -> str:
    indexes = "  ".join(
        f"{name.removeprefix('sa_job_').removesuffix('_idx')} {index['bytes'] / 1024:,.0f} kB"
        f" ({max(index['entries'], 0):,.0f})"
        for name, index in found["indexes"].items()
    )
    return (
        f"{minute:6.1f} min  {side.label:<19} {indexes}  | fetch {found['probe_ms']:.3f} ms"
        f" {found['probe_buffers']} pages | worked {found['worked']:,}, inserted"
        f" {found['inserted']:,}, backlog {found['backlog']:,} | table"
        f" {found['table_bytes'] / 2**20:,.0f} MB | vacuums {found['vacuums']}"
        f" | rebuilds {found['rebuilds']}"
    )


def server_autovacuum(engine: Engine) -> bool:
    with engine.connect() as connection:
        return bool(connection.scalar(text("SHOW autovacuum")) == "on")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--rate", type=float, default=150.0, help="jobs/s per database")
    parser.add_argument("--sample", type=float, default=60.0, help="seconds between samples")
    parser.add_argument("--reindex-interval", type=float, default=120.0)
    parser.add_argument(
        "--min-kb",
        type=int,
        action="append",
        help="ReindexSettings.min_bytes / 1024 of a database with the reindexer (default "
        "1024, the library's); give it twice for two such databases",
    )
    parser.add_argument(
        "--backlog",
        type=int,
        action="append",
        help="available jobs the queue keeps (inserted first; the worker is then paced at "
        "--rate); default 2000; 0 lets the worker run free; give it twice for both",
    )
    parser.add_argument(
        "--vacuum",
        choices=["auto", "pg-default", "none"],
        default="auto",
        help="auto: the server's autovacuum, or the stand-in with sa_job's own settings if "
        "it is off; pg-default: the stand-in with PostgreSQL's defaults, ignoring sa_job's "
        "autovacuum_vacuum_scale_factor of 0.01; none: no vacuum",
    )
    parser.add_argument("--json", help="write every sample and rebuild to this file")
    options = parser.parse_args()
    min_kbs: list[int | None] = [*(options.min_kb or [1024]), None]

    rebuild_log = RebuildLog()
    log.addHandler(rebuild_log)
    log.setLevel(logging.INFO)
    stop = threading.Event()
    record: dict[str, Any] = {
        "command": " ".join(["python", *sys.argv]),
        "started": utc_now(),
        "load_start": environment()["load_average"],
        "options": vars(options),
        "samples": [],
    }
    print(f"{record['started']}  load average {record['load_start']}", flush=True)
    with ExitStack() as stack:
        sides = []
        for backlog in options.backlog or [2000]:
            for min_kb in min_kbs:
                engine = stack.enter_context(database("sa_jobs_bench_reindex", pool_size=10))
                label = "without" if min_kb is None else f"with {min_kb} kB"
                side = Side(
                    f"{backlog}: {label}",
                    engine,
                    min_kb,
                    options.reindex_interval,
                    backlog=backlog,
                    rate=options.rate,
                )
                sides.append(side)
        autovacuum = server_autovacuum(sides[0].engine)
        record["server_autovacuum"] = autovacuum
        emulate = options.vacuum == "pg-default" or (options.vacuum == "auto" and not autovacuum)
        print(
            "vacuum: "
            + (
                "none"
                if not emulate
                else "autovacuum's stand-in, PostgreSQL's default thresholds"
                if options.vacuum == "pg-default"
                else "autovacuum's stand-in, sa_job's thresholds (the server's is off)"
                if not autovacuum
                else "the server's autovacuum"
            ),
            flush=True,
        )
        threads = []
        for side in sides:
            side.start()
            stack.callback(side.own.dispose)
            stack.callback(side.worker.stop)
            jobs: list[Any] = [(side.produce, (options.rate, stop))]
            if emulate:
                table_options = options.vacuum == "auto"
                vacuum = functools.partial(side.vacuum_like_autovacuum, table_options=table_options)
                jobs.append((vacuum, (stop,)))
            jobs.append((side.watch_rebuilds, (rebuild_log.started, stop)))
            for target, args in jobs:
                threads.append(threading.Thread(target=target, args=args, daemon=True))
        for thread in threads:
            thread.start()
        began = time.monotonic()
        try:
            for minute in _samples(began, options.minutes, options.sample):
                for side in sides:
                    found = {"minute": round(minute, 2), "side": side.label, **side.sample()}
                    record["samples"].append(found)
                    print(show(minute, side, found), flush=True)
        finally:
            stop.set()
            for thread in threads:
                thread.join()
        record["vacuum_settings"] = {
            side.label: getattr(side, "vacuum_settings", None) for side in sides
        }
        wall = time.time() - (time.monotonic() - began)
        record["rebuilds"] = [
            {"side": side.label, **rebuild, "at_minute": round((rebuild["at"] - wall) / 60, 2)}
            for side in sides
            for rebuild in side.rebuilds
        ]
    record["reindex_failures"] = rebuild_log.failures
    record["ended"] = utc_now()
    record["load_end"] = environment()["load_average"]
    print(f"{record['ended']}  load average {record['load_end']}")
    for rebuild in record["rebuilds"]:
        print(
            f"rebuild: {rebuild['side']}, {rebuild['index']} at {rebuild['at_minute']:.1f} min,"
            f" {rebuild['kb_before']:,} kB before, took {rebuild['seconds']} s"
        )
    for failure in rebuild_log.failures:
        print(f"reindex failure: {failure}")
    if options.json:
        with open(options.json, "w") as out:
            json.dump(record, out, indent=1)


def _samples(began: float, minutes: float, every: float) -> Iterator[float]:
    """Sleep until each sample's time; yield the minutes since ``began``."""
    count = 0
    while True:
        count += 1
        at = min(count * every, minutes * 60)
        time.sleep(max(0.0, began + at - time.monotonic()))
        yield at / 60
        if at >= minutes * 60:
            return


if __name__ == "__main__":
    main()
