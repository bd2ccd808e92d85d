"""What ``sa-jobs bench`` counts per worked job (``sa_jobs/benchmark/dbcost.py``), on the
real server: psycopg's statements and round trips as the protocol sends them, and the
server probe's CPU of its own database's backends only."""

from __future__ import annotations

import multiprocessing as mp
from typing import Any

from sqlalchemy import URL, Engine, text

from sa_jobs.benchmark.dbcost import ClientCounts, ServerProbe
from sa_jobs.benchmark.floor import conninfo


def count_in_child(url: str, out: Any) -> None:
    """Spawned, so the wrapped psycopg stays in a process of its own (module level)."""
    import psycopg

    from sa_jobs.benchmark import dbcost

    sent = dbcost.client_counter()
    found = []
    before = sent()
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("SELECT 1")
        connection.execute("SELECT 2")
        found.append(sent() - before)
        before = sent()
        with connection.cursor() as cursor:  # one pipeline, one Sync
            cursor.executemany("SELECT %s", [(1,), (2,), (3,)])
        found.append(sent() - before)
    with psycopg.connect(url) as connection:
        before = sent()
        connection.execute("SELECT 1")  # BEGIN first, on a round trip of its own
        connection.execute("SELECT 2")
        connection.commit()
        found.append(sent() - before)
    out.put([(counts.statements, counts.round_trips) for counts in found])


def test_statements_and_round_trips_are_counted_as_the_protocol_sends_them(
    database_url: URL,
) -> None:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    child = ctx.Process(target=count_in_child, args=(conninfo(database_url), out))
    child.start()
    try:
        found = [ClientCounts(*pair) for pair in out.get(timeout=60)]
    finally:
        child.join(timeout=60)
    assert found == [
        ClientCounts(statements=2, round_trips=2),  # autocommit: a statement, a round trip
        ClientCounts(statements=3, round_trips=1),  # executemany: pipelined
        ClientCounts(statements=2, round_trips=4),  # BEGIN and COMMIT are round trips
    ]


def test_the_server_probe_counts_its_databases_backends_but_not_the_excluded(
    engine: Engine,
) -> None:
    work = text(
        "CREATE TABLE bench_probe_work AS SELECT g, md5(g::text) FROM generate_series(1, 300000) g"
    )
    with engine.connect() as busy:
        pid = int(busy.scalar(text("SELECT pg_backend_pid()")) or 0)
        busy.rollback()
        found: dict[bool, Any] = {}
        for excluded in (True, False):
            probe = ServerProbe(engine)
            probe.start(excluded=[pid] if excluded else [])
            busy.execute(work)
            busy.commit()
            found[excluded] = probe.stop()
            busy.execute(text("DROP TABLE bench_probe_work"))
            busy.commit()
    # The test server runs on this host: both CPU figures are there.
    counted, left_out = found[False], found[True]
    assert counted.backend_cpu is not None and left_out.backend_cpu is not None
    assert counted.backend_cpu >= 0.05  # md5 of 300,000 rows and their WAL
    assert left_out.backend_cpu < counted.backend_cpu / 2
    # The whole server holds the drain's backends (and the rest of the server).
    assert counted.server_cpu is not None and counted.server_cpu >= counted.backend_cpu
    # 300,000 rows are several MB of WAL, whoever else writes.
    assert counted.wal_bytes > 5_000_000 and left_out.wal_bytes > 5_000_000
