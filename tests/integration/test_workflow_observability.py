"""Pending workflow steps are counted per queue by ``sa_jobs.stats()``, ``sa-jobs stats``
and the Prometheus gauge — through ``sa_job_workflow_pending_idx``, capped per queue, and
without reading finished steps, plain jobs or sequences' pending jobs."""

from __future__ import annotations

import json
from typing import Any

from prometheus_client import CollectorRegistry
from sqlalchemy import Engine, event, text
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import JobState
from sa_jobs._inspect.job_counts import pending_steps
from sa_jobs.prometheus import PrometheusMetrics
from tests.helpers import CliRun, fetch_one
from tests.helpers import insert_workflow as insert


@sa_jobs.job_args(kind="obs_wf_step")
class Step:
    n: int = 0


def fan_out(queue: str, width: int, name: str = "fan") -> sa_jobs.Workflow:
    """One root and ``width`` steps waiting for it, all in ``queue``."""
    wf = sa_jobs.Workflow(name)
    root = wf.add(Step(0), name="root", queue=queue)
    for n in range(width):
        wf.add(Step(n), name=f"s{n}", after=[root], queue=queue)
    return wf


def test_stats_counts_pending_steps_per_queue(engine: Engine) -> None:
    insert(engine, fan_out("mail", 3))
    insert(engine, fan_out("reports", 2))
    with Session(engine) as session, session.begin():
        sa_jobs.insert_many(session, [Step() for _ in range(4)], queue="mail")  # plain
    with Session(engine) as session:
        found = sa_jobs.stats(session)
    assert found.pending_steps == 5
    assert found.queues["mail"].pending_steps == 3
    assert found.queues["reports"].pending_steps == 2
    assert found.pending_steps_capped is False
    # The roots are available; releasing one's dependents takes them off the count.
    root = fetch_one(engine, queue="reports")
    with Session(engine) as session, session.begin():
        sa_jobs.complete_in(session, root)
    with Session(engine) as session:
        after = sa_jobs.stats(session)
    assert after.queues["reports"].pending_steps == 0
    assert after.queues["reports"].counts[JobState.AVAILABLE] == 2
    assert after.pending_steps == 3


def test_past_the_exact_limit_each_queue_is_capped(engine: Engine) -> None:
    insert(engine, fan_out("big", 12))
    insert(engine, fan_out("small", 2, name="small"))
    with Session(engine) as session:
        found = sa_jobs.stats(session, exact_limit=5)
    assert found.queues["big"].pending_steps == 6  # exact_limit + 1: a floor
    assert found.queues["small"].pending_steps == 2
    assert found.pending_steps_capped is True


def relation_scans(node: dict[str, Any]) -> Any:
    """(node type, index name) of every node of the plan that reads sa_job."""
    if node.get("Relation Name") == "sa_job":
        yield node["Node Type"], node.get("Index Name")
    for child in node.get("Plans", []):
        yield from relation_scans(child)


def test_the_count_reads_only_the_pending_steps_index(engine: Engine) -> None:
    insert(engine, fan_out("mail", 3))
    captured: list[tuple[str, Any]] = []

    def capture(conn: Any, cursor: Any, statement: str, parameters: Any, *rest: Any) -> None:
        captured.append((statement, parameters))

    with engine.begin() as connection:
        # With sequential scans priced out, the plan shows which index serves each read
        # of sa_job (on a small table the planner would rather scan it whole).
        connection.execute(text("SET LOCAL enable_seqscan = off"))
        event.listen(connection, "before_cursor_execute", capture)
        assert pending_steps(connection) == {"mail": 3}
        event.remove(connection, "before_cursor_execute", capture)
        statement, parameters = captured[-1]
        plan = connection.exec_driver_sql(
            "EXPLAIN (FORMAT JSON) " + statement, parameters
        ).scalar_one()
    scans = list(relation_scans(plan[0]["Plan"]))
    assert scans, plan
    assert {index for _, index in scans} == {"sa_job_workflow_pending_idx"}, scans
    assert "Seq Scan" not in json.dumps(plan)


def test_the_prometheus_gauge_counts_pending_steps(engine: Engine) -> None:
    insert(engine, fan_out("mail", 3))
    registry = CollectorRegistry()
    PrometheusMetrics(registry, engine=engine)
    assert registry.get_sample_value("sa_jobs_queue_workflow_steps_pending", {"queue": "mail"}) == 3


def test_sa_jobs_stats_shows_pending_steps(cli: CliRun, engine: Engine) -> None:
    insert(engine, fan_out("mail", 3))
    code, out, err = cli("stats")
    assert (code, err) == (0, "")
    header, *rows = out.split("\n\n", 1)[0].splitlines()
    assert header.rstrip().endswith("pending steps")
    mail = next(row for row in rows if row.startswith("mail"))
    total = next(row for row in rows if row.startswith("total"))
    assert mail.split()[-1] == "3" and total.split()[-1] == "3"
    code, out, _ = cli("stats", "--json")
    found = json.loads(out)
    assert found["pending_steps"] == 3 and found["queues"]["mail"]["pending_steps"] == 3
