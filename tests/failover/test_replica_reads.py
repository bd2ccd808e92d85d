"""Reads from a replica (issue 27, item 3), against a real streaming standby of our own
(:mod:`tests.failover.cluster`, asynchronous: a paused standby must not hold the
primary's commits). One pair for the module.

A standby that stops replaying (``pg_wal_replay_pause()``) is how each surface is shown
to read there: with ``on_replica_lag="report"`` it shows the figures from before the
pause; with the default ``"fall_back"`` it shows the primary's once the lag passes the
limit, and says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import attrs
import prometheus_client
import pytest
from sqlalchemy import Engine, create_engine, select, text
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs.cli import main
from sa_jobs.dashboard import create_app
from sa_jobs.errors import InvalidOptionsError, WaitTimeoutError
from sa_jobs.prometheus import PrometheusMetrics
from tests.dashboard import DashboardClient
from tests.failover.cluster import DATABASE, Cluster
from tests.failover.pair import build_cluster
from tests.helpers import fetch_one, finish_run

#: The guard's limit in these tests: a paused standby passes it within a second.
LIMIT = 0.5


@sa_jobs.job_args(kind="replica_read", queue="replica")
class Noted:
    n: int = 0


@attrs.frozen
class Pair:
    cluster: Cluster
    primary: Engine
    replica: Engine

    def url(self, engine: Engine) -> str:
        return engine.url.render_as_string(hide_password=False)

    def caught_up(self, timeout: float = 10) -> None:
        """Until the standby replayed everything the primary wrote so far."""
        with self.primary.connect() as connection:
            target = connection.scalar(text("SELECT pg_current_wal_lsn()"))
        deadline = time.monotonic() + timeout
        while True:
            with self.replica.connect() as connection:
                if connection.scalar(
                    text("SELECT pg_last_wal_replay_lsn() >= CAST(:lsn AS pg_lsn)"), {"lsn": target}
                ):
                    return
            assert time.monotonic() < deadline, "the standby does not catch up"
            time.sleep(0.05)

    @contextlib.contextmanager
    def replay_paused(self) -> Iterator[None]:
        """The standby stops replaying (it still receives); resumed after."""
        with self.cluster.admin(self.cluster.standby) as admin:
            admin.execute(text("SELECT pg_wal_replay_pause()"))
            while admin.scalar(text("SELECT pg_get_wal_replay_pause_state()")) != "paused":
                time.sleep(0.02)
            try:
                yield
            finally:
                admin.execute(text("SELECT pg_wal_replay_resume()"))
        self.caught_up()

    def add(self, count: int, queue: str = "replica") -> list[int]:
        with Session(self.primary) as session, session.begin():
            results = sa_jobs.insert_many(session, [Noted(n) for n in range(count)], queue=queue)
            return [result.job.id for result in results]

    def behind(self, timeout: float = 10) -> None:
        """Until the paused standby's lag passed :data:`LIMIT`: it received WAL it did
        not replay (a write on the primary), and the limit's time went by."""
        self.add(1, queue="replica-nudge")
        deadline = time.monotonic() + timeout
        while True:
            with self.replica.connect() as connection:
                lag = connection.scalar(
                    text(
                        "SELECT CASE WHEN pg_last_wal_receive_lsn() > pg_last_wal_replay_lsn() "
                        "THEN extract(epoch FROM clock_timestamp() - "
                        "pg_last_xact_replay_timestamp()) END"
                    )
                )
            if lag is not None and lag > LIMIT * 1.5:
                return
            assert time.monotonic() < deadline, "the paused standby never fell behind"
            time.sleep(0.05)


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    cluster = build_cluster(synchronous=False)
    primary = create_engine(cluster.primary.url())
    replica = create_engine(cluster.standby.url())
    try:
        sa_jobs.migrate(primary)
        built = Pair(cluster, primary, replica)
        built.caught_up()
        yield built
    finally:
        primary.dispose()
        replica.dispose()
        cluster.destroy()


def available(pair: Pair, **options: Any) -> tuple[int, sa_jobs.Stats]:
    with Session(pair.primary) as session:
        found = sa_jobs.stats(session, read_engine=pair.replica, **options)
    queue = found.queues.get("replica")
    return (0 if queue is None else queue.counts[sa_jobs.JobState.AVAILABLE]), found


# ---------------------------------------------------------------------- stats()


def test_stats_read_the_replica_and_fall_back_when_it_stops_replaying(pair: Pair) -> None:
    before, found = available(pair)
    pair.add(3)
    pair.caught_up()
    count, found = available(pair, max_replica_lag=LIMIT)
    assert count == before + 3
    assert found.replica is not None
    assert found.replica.source == "replica" and found.replica.lag is not None
    assert found.replica.lag < LIMIT and not found.replica.paused

    with pair.replay_paused():
        pair.add(2)
        pair.behind()
        # Reported: still the replica's figures, from before the pause, and said so.
        stale, found = available(pair, max_replica_lag=LIMIT, on_replica_lag="report")
        assert stale == before + 3
        assert found.replica is not None and found.replica.source == "replica"
        assert found.replica.behind and found.replica.paused
        assert "stale" in found.replica.describe()
        # Fallen back (the default): the primary's figures.
        fresh, found = available(pair, max_replica_lag=LIMIT)
        assert fresh == before + 5
        assert found.replica is not None and found.replica.source == "primary"
        assert found.as_dict()["replica"]["source"] == "primary"
    count, found = available(pair, max_replica_lag=LIMIT)
    assert count == before + 5
    assert found.replica is not None and found.replica.source == "replica"


def test_stats_through_async_engines(pair: Pair) -> None:
    async def run() -> sa_jobs.Stats:
        primary = create_async_engine(pair.cluster.primary.url())
        replica = create_async_engine(pair.cluster.standby.url())
        try:
            async with sa_jobs_async_session(primary) as session:
                return await sa_jobs.stats(session, read_engine=replica)
        finally:
            await primary.dispose()
            await replica.dispose()

    found = asyncio.run(run())
    assert found.replica is not None and found.replica.source == "replica"


def sa_jobs_async_session(engine: Any) -> Any:
    from sqlalchemy.ext.asyncio import AsyncSession

    return AsyncSession(engine)


# ---------------------------------------------------------------------- bad input


def test_a_read_engine_on_another_database_is_refused(pair: Pair) -> None:
    # Another database of the same cluster (same system identifier), and another
    # cluster altogether (the machine's own server would do; the cluster's postgres
    # database is another database too).
    other = create_engine(pair.cluster.standby.url("postgres"))
    try:
        with (
            Session(pair.primary) as session,
            pytest.raises(InvalidOptionsError, match=r"read_engine: .*another cluster or database"),
        ):
            sa_jobs.stats(session, read_engine=other)
        job_id = pair.add(1)[0]
        with pytest.raises(InvalidOptionsError, match="read_engine"):
            sa_jobs.wait_for(pair.primary, job_id, timeout=1, read_engine=other)
    finally:
        other.dispose()
    # Refused before anything was written: the job is not marked watched.
    with pair.primary.connect() as connection:
        watched = connection.scalar(
            text("SELECT output_watched FROM sa_job WHERE id = :id"), {"id": job_id}
        )
    assert watched is False


def test_a_read_engine_on_the_primary_itself_warns_and_works(
    pair: Pair, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        caplog.at_level(logging.WARNING, logger="sa_jobs.replica"),
        Session(pair.primary) as session,
    ):
        found = sa_jobs.stats(session, read_engine=create_engine(pair.cluster.primary.url()))
    assert found.replica is not None and found.replica.lag is None
    assert "not in recovery: the primary itself" in caplog.text


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_replica_lag": 0}, "max_replica_lag"),
        ({"on_replica_lag": "ignore"}, "on_replica_lag"),
    ],
)
def test_bad_guard_options_are_refused(pair: Pair, options: dict[str, Any], message: str) -> None:
    with Session(pair.primary) as session, pytest.raises(InvalidOptionsError, match=message):
        sa_jobs.stats(session, read_engine=pair.replica, **options)


# ---------------------------------------------------------------------- wait_for


def finished_later(pair: Pair, queue: str, delay: float = 0.3) -> int:
    """A job, taken as a worker would, whose run ends on the primary ``delay`` seconds
    from now: after the waiter's first read."""
    (job_id,) = pair.add(1, queue=queue)
    job = fetch_one(pair.primary, queue)
    timer = threading.Timer(delay, finish_run, (pair.primary, job))
    timer.start()
    return job_id


def test_wait_for_polls_the_replica_and_reads_the_primary_after_a_notification(
    pair: Pair,
) -> None:
    replica = {"read_engine": pair.replica, "max_replica_lag": LIMIT}
    with pair.replay_paused():
        pair.behind()
        # Polling only the replica (reported, not fallen back), which replays nothing
        # more: the job is never seen to finish.
        job_id = finished_later(pair, "replica-wait")
        with pytest.raises(WaitTimeoutError):
            sa_jobs.wait_for(
                pair.primary,
                job_id,
                timeout=1.5,
                poll_interval=0.1,
                poll_only=True,
                on_replica_lag="report",
                **replica,
            )
        # The guard falls back to the primary: found.
        job_id = finished_later(pair, "replica-wait")
        started = time.monotonic()
        sa_jobs.wait_for(
            pair.primary, job_id, timeout=5, poll_interval=0.1, poll_only=True, **replica
        )
        assert time.monotonic() - started < 2
        # With LISTEN, the read after the notification is the primary's: found at once
        # although the polls would go to the stalled replica.
        job_id = finished_later(pair, "replica-wait")
        started = time.monotonic()
        sa_jobs.wait_for(
            pair.primary, job_id, timeout=5, poll_interval=3, on_replica_lag="report", **replica
        )
        assert time.monotonic() - started < 2
    # Caught up: polling the replica finds it.
    job_id = finished_later(pair, "replica-wait")
    sa_jobs.wait_for(
        pair.primary,
        job_id,
        timeout=5,
        poll_interval=0.1,
        poll_only=True,
        on_replica_lag="report",
        **replica,
    )


# ---------------------------------------------------------------------- the dashboard


def test_the_dashboard_reads_the_replica_and_says_how_far_behind_it_is(pair: Pair) -> None:
    pair.add(1)
    pair.caught_up()
    with DashboardClient(
        create_app(
            pair.primary,
            auth=lambda request: True,
            read_engine=pair.replica,
            max_replica_lag=LIMIT,
        )
    ) as client:
        page = client.get("/")
        assert page.status_code == 200
        assert 'class="replica"' in page.text and "read from the replica" in page.text
        with pair.replay_paused():
            pair.behind()
            page = client.get("/")
            assert page.status_code == 200
            assert 'class="replica behind"' in page.text
            assert "read from the primary instead" in page.text
            # Actions write through the primary's engine, replica or not.
            done = client.act("/queues/pause", queue="replica")
            assert done.status_code in (303, 302), done.text
        with pair.primary.begin() as connection:
            paused = connection.scalar(
                text("SELECT paused_at IS NOT NULL FROM sa_job_queue WHERE name = 'replica'")
            )
            connection.execute(text("UPDATE sa_job_queue SET paused_at = NULL"))
        assert paused


# ---------------------------------------------------------------------- Prometheus


def test_the_prometheus_gauges_read_the_replica_with_its_lag(pair: Pair) -> None:
    registry = prometheus_client.CollectorRegistry()
    PrometheusMetrics(
        registry, engine=pair.primary, read_engine=pair.replica, max_replica_lag=LIMIT
    )
    pair.caught_up()
    lag = registry.get_sample_value("sa_jobs_replica_lag_seconds")
    assert lag is not None and lag < LIMIT
    assert registry.get_sample_value("sa_jobs_replica_fallback") == 0
    with pair.replay_paused():
        pair.behind()
        assert registry.get_sample_value("sa_jobs_replica_fallback") == 1
        assert registry.get_sample_value("sa_jobs_replica_replay_paused") == 1
        lag = registry.get_sample_value("sa_jobs_replica_lag_seconds")
        assert lag is not None and lag > LIMIT
        depth = registry.get_sample_value(
            "sa_jobs_queue_jobs", {"queue": "replica-nudge", "state": "available"}
        )
        with pair.primary.connect() as connection:
            on_primary = connection.scalar(
                select(text("count(*)"))
                .select_from(text("sa_job"))
                .where(text("queue = 'replica-nudge' AND state = 'available'"))
            )
        assert depth == on_primary


# ---------------------------------------------------------------------- the command line


def test_the_command_line_reads_the_replica(
    pair: Pair, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, read_url = pair.url(pair.primary), pair.url(pair.replica)
    pair.caught_up()
    assert main(["stats", "--json", "--url", url, "--read-url", read_url]) == 0
    assert json.loads(capsys.readouterr().out)["replica"]["source"] == "replica"
    with pair.replay_paused():
        (job_id,) = pair.add(1, queue="replica-cli")
        pair.behind()
        # Reported: the list is the replica's, without the new job, and says why.
        monkeypatch.setenv("SA_JOBS_READ_URL", read_url)
        monkeypatch.setenv("SA_JOBS_MAX_REPLICA_LAG", str(LIMIT))
        code = main(
            ["jobs", "list", "--queue", "replica-cli", "--url", url, "--on-replica-lag", "report"]
        )
        assert code == 0
        out, err = capsys.readouterr()
        assert str(job_id) not in out and "stale" in err
        # Fallen back: the primary's list.
        assert main(["jobs", "list", "--queue", "replica-cli", "--url", url]) == 0
        out, err = capsys.readouterr()
        assert str(job_id) in out and "read from the primary instead" in err
    # Another database: one line, exit 1.
    other = pair.url(pair.primary).replace(f"/{DATABASE}", "/postgres")
    assert main(["stats", "--url", url, "--read-url", other]) == 1
    err = capsys.readouterr().err
    assert err.startswith("sa-jobs: --read-url: reaches database 'postgres'"), err
