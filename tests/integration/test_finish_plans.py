"""The statements that finish a batch of runs read each job by its primary key, whatever
the statistics say about the number of running jobs.

PostgreSQL's statistics on ``sa_job`` are as old as its last ANALYZE, and autovacuum runs
one only after a tenth of a big table has changed: the statistics may well have been
taken while about no job ran. The planner then believes ``state = 'running'`` matches one
row and reads ``sa_job_running_idx`` — every running row — for each batch it finishes,
instead of one primary-key probe per outcome. These tests make those statistics (ANALYZE
with many finished jobs and none running), then start 500, and read the plan of the real
statement (``EXPLAIN ANALYZE`` in a transaction that rolls back).
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine
from sqlalchemy.sql.dml import ReturningUpdate

from sa_jobs._act.complete import (
    COMPLETED_IDS_PARAM,
    COMPLETED_RUNS_PARAM,
    completed_statement,
)
from tests.helpers import plan_nodes

RUNNING = 500
BATCH = 10


def _stale_statistics_and_running_jobs(engine: Engine) -> list[int]:
    with engine.begin() as connection:
        connection.exec_driver_sql(
            "INSERT INTO sa_job (kind, queue, args, state, finalized_at) "
            "SELECT 'plan_probe', 'default', '{}', 'completed', now() "
            "FROM generate_series(1, 20000)"
        )
    with engine.connect() as connection:
        connection.exec_driver_sql("ANALYZE sa_job")
        connection.commit()
    with engine.begin() as connection:
        ids = connection.exec_driver_sql(
            "INSERT INTO sa_job (kind, queue, args, state, attempt, run_count, attempted_at) "
            f"SELECT 'plan_probe', 'default', '{{}}', 'running', 1, 1, now() "
            f"FROM generate_series(1, {RUNNING}) RETURNING id"
        )
        return sorted(row[0] for row in ids)


def _explain(engine: Engine, statement: ReturningUpdate[Any], ids: list[int]) -> dict[str, Any]:
    compiled = statement.compile(dialect=engine.dialect)
    params = {**compiled.params, COMPLETED_IDS_PARAM: ids, COMPLETED_RUNS_PARAM: [1] * len(ids)}
    with engine.connect() as connection:
        explained = connection.exec_driver_sql(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + str(compiled), params
        ).scalar_one()
        connection.rollback()
    root: dict[str, Any] = explained[0]["Plan"]
    return root


@pytest.mark.parametrize(
    "options",
    [{}, {"workflow": True}, {"sequence": True, "job_key": True}],
    ids=["plain", "workflow", "sequence-job-key"],
)
def test_a_batch_is_finished_by_primary_key_with_stale_statistics(
    engine: Engine, options: dict[str, bool]
) -> None:
    running = _stale_statistics_and_running_jobs(engine)
    plan = _explain(engine, completed_statement(**options), running[:BATCH])
    assert plan["Actual Rows"] == BATCH
    nodes = plan_nodes(plan)
    assert not [node for node in nodes if node.get("Index Name") == "sa_job_running_idx"]
    job_reads = [node for node in nodes if node.get("Relation Name") == "sa_job"]
    assert job_reads, nodes
    # One probe per outcome: no node reads more rows of sa_job than the batch has.
    assert max(node["Actual Rows"] * node["Actual Loops"] for node in job_reads) <= BATCH
