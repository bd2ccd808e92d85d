"""The plain fetch runs one generic plan per connection, and that plan is safe.

PostgreSQL plans a prepared statement afresh at every run unless its generic plan looks
no dearer than the custom ones; for the fetch it never did (its ``LIMIT :fetch_limit`` is
taken for a tenth of the queue), so each fetch was planned, which cost about what
running it does. The fetch now opens its transaction with ``SET LOCAL plan_cache_mode =
force_generic_plan`` and reads ``sa_job`` by primary key (``= ANY`` of the locked ids),
so the generic plan cannot turn into a join over the whole table. These tests read
``pg_prepared_statements`` on the fetching connection, and the generic plan's
``EXPLAIN ANALYZE`` on a queue with a big backlog, whose statistics say so.
"""

from __future__ import annotations

import re

import psycopg
from psycopg import sql
from sqlalchemy import URL, Engine

from sa_jobs._table.schema import Features
from sa_jobs.worker.producer import fetch_jobs, jobs_fetch_available
from tests.helpers import engine_at, plan_nodes

BACKLOG = 200_000


def _add_available(engine: Engine, count: int) -> None:
    with engine.begin() as connection:
        connection.exec_driver_sql(
            "INSERT INTO sa_job (kind, queue, args, state) "
            f"SELECT 'plan_probe', 'default', '{{}}', 'available' FROM generate_series(1, {count})"
        )
    with engine.connect() as connection:
        connection.exec_driver_sql("ANALYZE sa_job")
        connection.commit()


def test_a_connection_runs_the_fetch_on_one_generic_plan(database_url: URL) -> None:
    # One connection, so every fetch and the check below share a server session.
    with engine_at(database_url, pool_size=1, max_overflow=0) as engine:
        _add_available(engine, 100)
        fetched = [len(fetch_jobs(engine, "default", 5, "plan-probe")) for _ in range(10)]
        with engine.connect() as connection:
            plans = connection.exec_driver_sql(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                "WHERE position('SKIP LOCKED' in statement) > 0"
            ).all()
    assert fetched == [5] * 10
    # psycopg prepares a statement at its fifth run; every run of it since used the
    # generic plan (planned once), none was planned afresh.
    assert len(plans) == 1
    generic, custom = plans[0]
    assert generic >= 5
    assert custom == 0


def test_the_generic_plan_reads_by_index_on_a_big_backlog(
    engine: Engine, database_url: URL
) -> None:
    """200,000 available jobs in one queue, analysed: the generic plan must still take the
    fetch index in order (not sort the queue) and update by primary key (not scan)."""
    _add_available(engine, BACKLOG)
    with engine.connect() as connection:
        features = Features.of(connection)
    compiled = jobs_fetch_available(features).compile(dialect=engine.dialect)
    names: list[str] = []

    def positional(match: re.Match[str]) -> str:
        names.append(match.group(1))
        return f"${len(names)}"

    text = re.sub(r"%\((\w+)\)s", positional, str(compiled))
    values = {
        **compiled.params,
        "fetch_queue": "default",
        "fetch_limit": 5,
        "fetch_worker_id": "plan-probe",
    }
    dsn = database_url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn) as connection:
        connection.execute(sql.SQL("PREPARE fetch_probe AS ") + sql.SQL(text))  # type: ignore[arg-type]
        connection.execute("SET plan_cache_mode = force_generic_plan")
        explain = sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE fetch_probe ({})").format(
            sql.SQL(", ").join(sql.Literal(values[name]) for name in names)
        )
        row = connection.execute(explain).fetchone()
        connection.rollback()
    assert row is not None
    plan = row[0][0]["Plan"]
    assert plan["Actual Rows"] == 5
    nodes = plan_nodes(plan)
    on_jobs = [node for node in nodes if node.get("Relation Name") == "sa_job"]
    assert on_jobs, nodes
    assert all(node["Node Type"] not in ("Seq Scan", "Bitmap Heap Scan") for node in on_jobs)
    assert not [node for node in nodes if node["Node Type"] in ("Sort", "Hash Join")]
    assert {node.get("Index Name") for node in on_jobs} >= {"sa_job_fetch_idx", "sa_job_pkey"}
