"""What the dashboard's pages show, against the real database: the jobs list paged along
each state's index, the Workers page (gone workers, per-worker lists, the leader), the
hour's figures per queue, halted sequences and resuming them, a job's keys."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, func, select, text
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import JobState
from sa_jobs._table.service_tables import Leader
from sa_jobs.dashboard import create_app, job_list, queries, workers_view
from sa_jobs.dashboard.list_filter import ListFilter
from tests.dashboard import DashboardClient, forms_posting
from tests.factories import job_row, make_job, make_worker_row
from tests.helpers import db_now, fetch_one, finish_run


@pytest.fixture
def client(engine: Engine) -> Iterator[DashboardClient]:
    with DashboardClient(create_app(engine)) as client:
        yield client


def linked_jobs(page: str) -> list[int]:
    """The job ids the page's jobs table links to, in order."""
    table = page.split('<table class="jobs">', 1)[-1].split("</table>", 1)[0]
    return [int(found) for found in re.findall(r'<a href="/jobs/(\d+)">\1</a>', table)]


def next_link(page: str) -> str | None:
    found = re.search(r'<a rel="next" href="([^"]+)"', page)
    return found.group(1).replace("&amp;", "&") if found else None


def completed_jobs(engine: Engine, count: int, *, kind: str = "dashboard_filler") -> None:
    """``count`` completed jobs in one statement (finished a second apart, newest last)."""
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO sa_job (kind, args, state, queue, attempt, attempted_at, "
                "finalized_at) SELECT :kind, jsonb_build_object('n', g), 'completed', "
                "'default', 1, now() - make_interval(secs => :count - g + 1), "
                "now() - make_interval(secs => :count - g) FROM generate_series(1, :count) g"
            ),
            {"kind": kind, "count": count},
        )


# ---------------------------------------------------------------------- the jobs list


def test_an_overview_count_leads_to_old_available_jobs_behind_newer_finished_ones(
    client: DashboardClient, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(job_list, "SCAN_WINDOW", 100)
    stuck = [make_job(engine, queue="stuck") for _ in range(3)]
    completed_jobs(engine, 300)  # newer than the window reaches
    overview = client.get("/").text
    link = re.search(r'href="(/jobs\?queue=stuck&amp;state=available)">3</a>', overview)
    assert link is not None, overview
    page = client.get(link.group(1).replace("&amp;", "&")).text
    assert linked_jobs(page) == stuck  # in fetch order: oldest first
    assert "No jobs match" not in page
    assert next_link(page) is None


def test_a_state_is_paged_along_its_own_order_with_a_cursor(
    client: DashboardClient, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(job_list, "PAGE_SIZE", 2)
    available = [make_job(engine, queue="paged", priority=1 + n % 2) for n in range(5)]
    finished = [
        make_job(engine, state=JobState.DISCARDED, finalized_at=dt.timedelta(seconds=-n))
        for n in range(5)
    ]
    for jobs_filter, expected in (
        # Fetch order: priority, then scheduled time (the same here), then id.
        (
            "state=available&queue=paged",
            sorted(available, key=lambda i: (available.index(i) % 2, i)),
        ),
        ("state=discarded", finished),  # most recently finished first
    ):
        seen: list[int] = []
        link: str | None = f"/jobs?{jobs_filter}"
        while link is not None:
            page = client.get(link)
            assert page.status_code == 200, page.text
            seen += linked_jobs(page.text)
            link = next_link(page.text)
        assert seen == expected, jobs_filter
    assert client.get("/jobs?state=available&after=bogus").status_code == 400


def test_a_page_that_runs_out_of_its_window_offers_to_search_older_jobs(
    client: DashboardClient, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(job_list, "SCAN_WINDOW", 100)
    rare = make_job(engine, kind="dashboard_rare")
    completed_jobs(engine, 150)
    first = client.get("/jobs?kind=dashboard_rare").text
    assert linked_jobs(first) == []
    assert "No jobs match among the 100 jobs searched" in first
    link = next_link(first)
    assert link is not None and "search older jobs" in first
    second = client.get(link).text
    assert linked_jobs(second) == [rare]
    assert next_link(second) is None


@pytest.mark.parametrize("state", list(JobState))
def test_a_state_page_reads_its_index_and_never_scans_the_table(
    engine: Engine, state: JobState, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A table forty times the window, as on a big table (a window holding a whole
    # state's rows may rightly be read by a scan and a sort).
    monkeypatch.setattr(job_list, "SCAN_WINDOW", 500)
    completed_jobs(engine, 20_000)
    for other in JobState:
        if other is not JobState.PENDING:
            make_job(engine, state=other, attempted_by=["w"] if other is JobState.RUNNING else None)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.execute(text("ANALYZE sa_job"))
    order = job_list.STATE_ORDERS[state]
    first_row = {
        "id": 1,
        "queue": "default",
        "priority": 1,
        "sequence_key": b"\x01",
        **{
            name: dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
            for name in order.columns
            if name.endswith("_at")
        },
    }
    cursor = tuple(first_row[name] for name in order.columns)
    for statement in (
        job_list.page_statement(ListFilter(state=state)),
        job_list.page_statement(ListFilter(state=state, kind="x"), cursor),
    ):
        compiled = statement.compile(engine)
        with engine.connect() as connection:
            plan = "\n".join(
                row[0]
                for row in connection.exec_driver_sql("EXPLAIN " + str(compiled), compiled.params)
            )
        assert "Seq Scan" not in plan, plan
        assert order.index in plan, plan


def test_the_list_works_without_the_feature_branches(core_only: Engine) -> None:
    job_id = make_job(core_only, kind="dashboard_core")
    with DashboardClient(create_app(core_only)) as client:
        for path in ("/jobs", "/jobs?state=available", "/jobs?state=pending"):
            page = client.get(path)
            assert page.status_code == 200, (path, page.text)
        assert linked_jobs(client.get("/jobs?state=available").text) == [job_id]


# ---------------------------------------------------------------------- workers


def test_a_worker_without_a_heartbeat_is_gone_and_its_jobs_are_orphans(
    client: DashboardClient, engine: Engine, no_workers_or_leader: None
) -> None:
    make_worker_row(engine, "dashboard-live")
    make_worker_row(engine, "dashboard-dead", heartbeat_at=-dt.timedelta(hours=1))
    orphan = make_job(engine, state=JobState.RUNNING, attempted_by=["dashboard-dead"])
    page = client.get("/workers").text
    (dead,) = [row for row in page.split("<tr") if "dashboard-dead</code>" in row]
    assert "no heartbeat for 1.0 h" in dead and 'class="gone"' in dead
    (live,) = [row for row in page.split("<tr") if "dashboard-live</code>" in row]
    assert "no heartbeat" not in live
    orphans = page.split('<ul class="orphans">', 1)[1].split("</ul>", 1)[0]
    assert f'href="/jobs/{orphan}"' in orphans
    overview = client.get("/").text
    assert re.search(r'id="live-workers"><a href="/workers">1</a>', overview)
    assert "1 gone (no heartbeat)" in overview
    (queue,) = [row for row in overview.split("<tr") if ">default</a>" in row]
    assert '<td class="num workers">1</td>' in queue  # the live one serves it; not two


def test_each_worker_lists_its_own_running_jobs_and_the_leader_is_marked(
    client: DashboardClient,
    engine: Engine,
    no_workers_or_leader: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(workers_view, "LIST_CAP", 2)
    make_worker_row(engine, "dashboard-a")
    make_worker_row(engine, "dashboard-b")
    busy = [
        make_job(
            engine,
            kind="dashboard_long",
            state=JobState.RUNNING,
            attempted_by=["dashboard-a"],
            attempted_at=-dt.timedelta(minutes=10 - n),
        )
        for n in range(3)
    ]
    newest = make_job(
        engine, kind="dashboard_short", state=JobState.RUNNING, attempted_by=["dashboard-b"]
    )
    with Session(engine) as session, session.begin():
        session.add(
            Leader(
                name="maintenance",
                leader_id="dashboard-b",
                elected_at=func.now(),
                expires_at=func.now() + dt.timedelta(seconds=15),
            )
        )
    page = client.get("/workers").text
    assert "Leader (runs maintenance): <code>dashboard-b</code>" in page
    rows = {
        name: row
        for row in page.split("<tr")
        for name in ("dashboard-a", "dashboard-b")
        if f"{name}</code>" in row
    }
    assert ">leader</span>" in rows["dashboard-b"] and ">leader</span>" not in rows["dashboard-a"]
    assert '<td class="num running-count">3</td>' in rows["dashboard-a"]
    assert [f'href="/jobs/{job}"' in rows["dashboard-a"] for job in busy] == [True, True, False]
    assert "and 1 more" in rows["dashboard-a"]
    assert f'href="/jobs/{newest}"' in rows["dashboard-b"] and "idle" not in rows["dashboard-b"]
    assert '<td class="num running-count">1</td>' in rows["dashboard-b"]


# ---------------------------------------------------------------------- the last hour


def finished_at(
    engine: Engine,
    queue: str,
    finalized: dt.datetime,
    *,
    wait: float,
    run: float,
    state: JobState = JobState.COMPLETED,
) -> int:
    started = finalized - dt.timedelta(seconds=run)
    return make_job(
        engine,
        queue=queue,
        state=state,
        attempt=1,
        scheduled_at=started - dt.timedelta(seconds=wait),
        attempted_at=started,
        finalized_at=finalized,
    )


def test_the_hour_counts_jobs_per_queue_and_minute_with_their_wait_and_run(
    engine: Engine,
) -> None:
    minute = db_now(engine).replace(second=0, microsecond=0) - dt.timedelta(minutes=5)
    for wait in (10.0, 20.0):
        finished_at(engine, "dashboard_a", minute + dt.timedelta(seconds=5), wait=wait, run=3.0)
    finished_at(
        engine,
        "dashboard_a",
        minute + dt.timedelta(seconds=8),
        wait=0,
        run=0,
        state=JobState.DISCARDED,
    )
    finished_at(
        engine, "dashboard_b", minute + dt.timedelta(minutes=1, seconds=1), wait=2.0, run=1.0
    )
    finished_at(
        engine, "dashboard_b", minute - dt.timedelta(hours=2), wait=99.0, run=1.0
    )  # too old
    with Session(engine) as session:
        hour = queries.throughput(session)
        capped = queries.throughput(session, cap=2)
    by_start = {m.start: m for m in hour.minutes}
    assert by_start[minute] == queries.Minute(minute, completed=2, discarded=1, wait=15.0, run=3.0)
    after = minute + dt.timedelta(minutes=1)
    assert by_start[after] == queries.Minute(after, completed=1, wait=2.0, run=1.0)
    assert sum(m.completed for m in hour.minutes) == 3
    assert set(hour.queues) == {"dashboard_a", "dashboard_b"}
    a, b = hour.queues["dashboard_a"], hour.queues["dashboard_b"]
    assert (a.completed, a.discarded, a.wait) == (2, 1, 15.0)
    assert (b.completed, b.discarded, b.wait) == (1, 0, 2.0)
    assert not hour.capped
    assert capped.capped and sum(m.completed for m in capped.minutes) == 2


def test_the_overview_shows_each_queues_hour(client: DashboardClient, engine: Engine) -> None:
    now = db_now(engine)
    for _ in range(3):
        finished_at(engine, "dashboard_a", now - dt.timedelta(minutes=2), wait=12.0, run=1.0)
    finished_at(engine, "dashboard_b", now - dt.timedelta(minutes=3), wait=0.5, run=1.0)
    page = client.get("/").text
    rows = {
        name: row
        for row in page.split("<tr")
        for name in ("dashboard_a", "dashboard_b")
        if f">{name}</a>" in row
    }
    assert '<td class="num hour-completed">3</td>' in rows["dashboard_a"]
    assert '<td class="num hour-wait">12.0 s</td>' in rows["dashboard_a"]
    assert '<td class="num hour-completed">1</td>' in rows["dashboard_b"]
    assert '<td class="num hour-wait">500 ms</td>' in rows["dashboard_b"]
    assert rows["dashboard_a"].count("<rect") == 2 and "3 completed" in rows["dashboard_a"]


# ---------------------------------------------------------------------- sequences


@sa_jobs.job_args(kind="dashboard_sequenced", sequence=sa_jobs.SequenceOpts())
class Sequenced:
    n: int = 0


def halted_sequence(engine: Engine) -> tuple[int, int]:
    """A sequence halted by its first job (cancelled), and the job waiting behind it."""
    with Session(engine) as session, session.begin():
        first = sa_jobs.insert(session, Sequenced(1)).job.id
        second = sa_jobs.insert(session, Sequenced(2)).job.id
    with Session(engine) as session, session.begin():
        sa_jobs.cancel_job(session, first)
    assert job_row(engine, second).state is JobState.PENDING
    return first, second


def test_the_sequences_page_shows_the_halting_job_and_resume_runs_the_sequence_on(
    client: DashboardClient, engine: Engine
) -> None:
    halting, waiting = halted_sequence(engine)
    page = client.get("/sequences").text
    assert f'href="/jobs/{halting}"' in page and "dashboard_sequenced" in page
    assert f"/sequences/{halting}/resume" in forms_posting(page)
    response = client.act(f"/sequences/{halting}/resume")
    assert response.status_code == 303
    assert response.headers["location"] == "/sequences?notice=resumed"
    assert job_row(engine, halting).state is JobState.AVAILABLE
    assert f'href="/jobs/{halting}"' not in client.get("/sequences").text
    finish_run(engine, fetch_one(engine))  # the resumed job runs and completes
    assert job_row(engine, waiting).state is JobState.AVAILABLE  # the next one is promoted


def test_resume_refuses_a_job_that_does_not_halt_a_sequence(
    client: DashboardClient, engine: Engine
) -> None:
    _, waiting = halted_sequence(engine)
    plain = make_job(engine, state=JobState.DISCARDED)
    for job_id in (plain, waiting):
        response = client.act(f"/sequences/{job_id}/resume")
        assert response.status_code == 409, response.text
        assert "does not halt a sequence" in response.text
    assert job_row(engine, plain).state is JobState.DISCARDED
    assert job_row(engine, waiting).state is JobState.PENDING
    assert client.act("/sequences/987654/resume").status_code == 404


# ---------------------------------------------------------------------- one job


@sa_jobs.job_args(kind="dashboard_keyed")
class Keyed:
    account: int = 0


def test_the_job_page_shows_its_unique_key_sequence_and_job_key(
    client: DashboardClient, engine: Engine
) -> None:
    with Session(engine) as session, session.begin():
        job_id = sa_jobs.insert(
            session,
            Keyed(7),
            unique=sa_jobs.UniqueOpts(by_args=True),
            sequence=sa_jobs.SequenceOpts(by_args=True),
        ).job.id
        keyed_id = sa_jobs.insert(session, Keyed(8), job_key="account-8").job.id
    stored = session_job(engine, job_id)
    page = client.get(f"/jobs/{job_id}").text
    assert f"<code>{stored.unique_key.hex()}</code>" in page
    # The sequence key as the args that make it (its hash on hover), not 64 hex digits.
    assert f'title="sequence key {stored.sequence_key.hex()}"' in page
    assert "<code>account=7</code>" in page
    assert f"<code>{stored.sequence_key.hex()}</code>" not in page
    assert "active job of its sequence (0 waiting)" in page
    assert "started 0 times" in page
    keyed_page = client.get(f"/jobs/{keyed_id}").text
    assert "<code>account-8</code> (revision 0)" in keyed_page
    started = fetch_one(engine)
    assert "(started 1 time)" in client.get(f"/jobs/{started.id}").text


def session_job(engine: Engine, job_id: int) -> sa_jobs.Job[Keyed]:
    from sqlalchemy.orm import undefer

    with Session(engine, expire_on_commit=False) as session:
        found = session.execute(
            select(sa_jobs.Job)
            .where(sa_jobs.Job.id == job_id)
            .options(undefer(sa_jobs.Job.unique_key), undefer(sa_jobs.Job.sequence_key))
        ).scalar_one()
        return found


# ---------------------------------------------------------------------- notices


@pytest.mark.parametrize(
    ("state", "notice", "says"),
    [
        (JobState.AVAILABLE, "cancelled", "Cancelled."),
        (JobState.RUNNING, "cancel-requested", "Cancel requested"),
        (JobState.COMPLETED, "already-finished", "had already finished"),
    ],
)
def test_cancel_says_what_happened(
    client: DashboardClient, engine: Engine, state: JobState, notice: str, says: str
) -> None:
    job_id = make_job(
        engine, state=state, attempted_by=["w"] if state is JobState.RUNNING else None
    )
    response = client.act(f"/jobs/{job_id}/cancel")
    assert response.status_code == 303
    assert response.headers["location"] == f"/jobs/{job_id}?notice={notice}"
    assert says in client.get(response.headers["location"]).text
