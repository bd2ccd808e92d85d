"""The keys of fair and key-limited queues, seen: ``stats()`` (and ``as_dict``), the
Prometheus gauges and the dashboard (its overview's keys table, the jobs list's key
filter), with bounded work however many keys there are."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs._inspect.key_stats import KEYS_LISTED, queue_keys
from sa_jobs._inspect.queue_stats import as_dict
from sa_jobs.dashboard import create_app
from sa_jobs.prometheus import PrometheusMetrics
from tests.dashboard import DashboardClient

pytestmark = pytest.mark.usefixtures("no_workers_or_leader")


def linked_jobs(page: str) -> list[int]:
    """The job ids the page's jobs table links to, in order."""
    table = page.split('<table class="jobs">', 1)[-1].split("</table>", 1)[0]
    return [int(found) for found in re.findall(r'<a href="/jobs/(\d+)">\1</a>', table)]


@sa_jobs.job_args(kind="test_seen_tenant", queue="tenants", partition_by=["tenant"])
class TenantJob:
    tenant: str


@sa_jobs.job_args(kind="test_seen_plain", queue="plain")
class PlainJob:
    n: int = 0


@pytest.fixture
def tenants(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        sa_jobs.insert_many(session, [TenantJob("big")] * 30)
        sa_jobs.insert_many(
            session, [TenantJob(f"t{n:02d}") for n in range(15) for _ in range(n % 3 + 1)]
        )
        sa_jobs.insert_many(session, [PlainJob()] * 3)
    with engine.begin() as connection:
        # "big" has waited longest.
        connection.execute(
            text(
                "UPDATE sa_job SET scheduled_at = now() - interval '1 hour'"
                " WHERE partition_key = 'big'"
            )
        )


@pytest.mark.usefixtures("tenants")
def test_stats_show_the_keys_with_the_most_jobs_and_their_oldest_wait(engine: Engine) -> None:
    with Session(engine) as session:
        figures = sa_jobs.stats(session)
    keys = figures.queues["tenants"].keys
    assert keys is not None
    assert figures.queues["plain"].keys is None
    assert keys.keys == 16
    assert not keys.estimated
    assert len(keys.top) == KEYS_LISTED
    assert keys.top[0].key == "big"
    assert keys.top[0].available == 30
    assert keys.top[0].oldest_available_age is not None
    assert keys.top[0].oldest_available_age.total_seconds() >= 3600
    assert [k.available for k in keys.top[1:]] == [3] * 5 + [2] * 4
    dumped = as_dict(figures)
    assert dumped["queues"]["tenants"]["keys"]["top"][0]["key"] == "big"


@pytest.mark.usefixtures("tenants")
def test_past_the_exact_limit_the_counts_are_estimated(engine: Engine) -> None:
    with engine.connect() as connection:
        keys = queue_keys(connection, "tenants", exact_limit=10)
    assert keys is not None
    assert keys.estimated
    assert keys.top[0].key == "big"


@pytest.mark.usefixtures("tenants")
def test_the_prometheus_gauges_list_the_top_keys(engine: Engine) -> None:
    registry = CollectorRegistry()
    PrometheusMetrics(registry, engine=engine)
    scraped = generate_latest(registry).decode()
    assert 'sa_jobs_queue_keys{queue="tenants"} 16.0' in scraped
    assert 'sa_jobs_key_available_jobs{key="big",queue="tenants"} 30.0' in scraped
    series = re.findall(r"^sa_jobs_key_available_jobs\{", scraped, re.MULTILINE)
    assert len(series) == KEYS_LISTED
    assert 'sa_jobs_key_oldest_available_seconds{key="big",queue="tenants"}' in scraped


@pytest.fixture
def client(engine: Engine) -> Iterator[DashboardClient]:
    with DashboardClient(create_app(engine)) as client:
        yield client


@pytest.mark.usefixtures("tenants")
def test_the_dashboard_shows_the_keys_and_filters_the_jobs_list_by_key(
    client: DashboardClient, engine: Engine
) -> None:
    overview = client.get("/").text
    assert "Keys of tenants" in overview
    assert "/jobs?queue=tenants&amp;state=available&amp;key=big" in overview
    with engine.connect() as connection:
        big = set(connection.scalars(text("SELECT id FROM sa_job WHERE partition_key = 'big'")))
    for query in ("/jobs?key=big", "/jobs?queue=tenants&state=available&key=big"):
        page = client.get(query).text
        assert set(linked_jobs(page)) == big, query
