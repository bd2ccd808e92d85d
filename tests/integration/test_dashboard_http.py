"""The dashboard over plain HTTP: every page renders from the real database, actions go
through the session functions, and nobody acts who should not (auth, CSRF, read-only),
mounted in FastAPI or behind a proxy prefix, on a sync or an async engine."""

from __future__ import annotations

import base64
import datetime as dt
import re
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI
from sqlalchemy import URL, Engine
from sqlalchemy.ext.asyncio import create_async_engine

import sa_jobs
from sa_jobs import JobState
from sa_jobs._table.service_tables import PeriodicState
from sa_jobs.dashboard import basic_auth, create_app
from sa_jobs.errors import InvalidOptionsError
from tests.dashboard import DashboardClient, forms_posting
from tests.factories import job_row, make_job, seconds

SCRIPT = "<script>alert('owned')</script>"
ERROR = {
    "attempt": 1,
    "at": "2024-01-01T00:00:00Z",
    "error": "ValueError: boom <b>x</b>",
    "trace": 'Traceback (most recent call last):\n  File "app.py", line 1\nValueError: boom',
}


@pytest.fixture
def client(engine: Engine) -> Iterator[DashboardClient]:
    with DashboardClient(create_app(engine)) as client:
        yield client


def discarded_job(engine: Engine, **options: Any) -> int:
    return make_job(
        engine,
        kind="dashboard_http",
        args={"text": "hello"},
        state=JobState.DISCARDED,
        attempt=1,
        max_attempts=1,
        errors=[ERROR],
        **options,
    )


def test_every_page_renders_from_the_database(client: DashboardClient, engine: Engine) -> None:
    job_id = discarded_job(engine)
    for path in ("/", "/jobs", f"/jobs/{job_id}", "/sequences", "/periodic", "/workers"):
        response = client.get(path)
        assert response.status_code == 200, (path, response.text)
        assert response.headers["content-security-policy"].startswith("default-src 'none'")
    page = client.get(f"/jobs/{job_id}").text
    assert "ValueError: boom &lt;b&gt;x&lt;/b&gt;" in page  # the error, escaped
    assert "Traceback (most recent call last):" in page
    assert "dashboard_http" in client.get("/jobs").text
    assert client.get("/static/dashboard.css").status_code == 200


def test_the_overview_shows_stats_per_queue_and_the_health_figures(
    client: DashboardClient, engine: Engine
) -> None:
    make_job(engine, queue="dashboard_mail", state=JobState.AVAILABLE, scheduled_at=-seconds(90))
    make_job(engine, queue="dashboard_mail", state=JobState.RETRYABLE)
    discarded_job(engine, queue="dashboard_mail")
    page = client.get("/").text
    assert 'href="/jobs?queue=dashboard_mail&amp;state=available">1</a>' in page
    assert 'href="/jobs?queue=dashboard_mail&amp;state=discarded">1</a>' in page
    assert "1.5 min" in page or "2 min" in page  # the oldest available job's wait
    assert re.search(r'id="health-level">(ok|warning|critical)<', page)
    assert "dead rows in sa_job" in page and "xmin horizon" in page


def test_a_job_that_does_not_exist_is_a_404(client: DashboardClient) -> None:
    assert client.get("/jobs/987654").status_code == 404
    assert client.act("/jobs/987654/retry").status_code == 404


def test_args_and_errors_are_escaped(client: DashboardClient, engine: Engine) -> None:
    job_id = make_job(
        engine,
        kind="dashboard_xss",
        args={"text": SCRIPT},
        state=JobState.DISCARDED,
        errors=[{**ERROR, "error": SCRIPT, "trace": SCRIPT}],
    )
    for path in (f"/jobs/{job_id}", "/jobs", "/jobs?q=script"):
        page = client.get(path).text
        assert "<script" not in page, path
        assert "&lt;script&gt;" in page, path
    # And no page may run a script at all, escaped or not.
    assert "script-src" not in client.get("/").headers["content-security-policy"]


def test_retry_and_cancel_go_through_the_session_functions(
    client: DashboardClient, engine: Engine
) -> None:
    job_id = discarded_job(engine)
    response = client.act(f"/jobs/{job_id}/retry")
    assert response.status_code == 303
    assert response.headers["location"] == f"/jobs/{job_id}?notice=retried"
    row = job_row(engine, job_id)
    assert row.state is JobState.AVAILABLE
    assert row.max_attempts == 2  # retry_job's own rule: one more attempt when spent
    assert client.act(f"/jobs/{job_id}/cancel").status_code == 303
    assert job_row(engine, job_id).state is JobState.CANCELLED


def test_an_action_the_state_refuses_is_a_409_that_says_why(
    client: DashboardClient, engine: Engine
) -> None:
    job_id = make_job(engine, state=JobState.RUNNING, attempted_by=["w"])
    response = client.act(f"/jobs/{job_id}/retry")
    assert response.status_code == 409
    assert "running" in response.text
    assert job_row(engine, job_id).state is JobState.RUNNING


@pytest.mark.parametrize(
    ("fields", "headers"),
    [
        ({}, {}),  # no token
        ({"csrf": "x" * 43}, {}),  # a token that is not the cookie's
        (None, {"origin": "http://evil.example"}),  # the right token, from another site
        (None, {"sec-fetch-site": "cross-site"}),
    ],
)
def test_an_action_without_the_forms_csrf_token_is_refused(
    client: DashboardClient, engine: Engine, fields: dict[str, str] | None, headers: dict[str, str]
) -> None:
    job_id = discarded_job(engine)
    data = {"csrf": client.token()} if fields is None else fields
    response = client.post(
        f"/jobs/{job_id}/retry", data=data, headers=headers, follow_redirects=False
    )
    assert response.status_code == 403
    assert job_row(engine, job_id).state is JobState.DISCARDED


def test_an_action_is_never_a_get(client: DashboardClient, engine: Engine) -> None:
    job_id = discarded_job(engine)
    assert client.get(f"/jobs/{job_id}/retry").status_code == 405
    assert job_row(engine, job_id).state is JobState.DISCARDED


def test_read_only_hides_and_refuses_actions(engine: Engine) -> None:
    job_id = discarded_job(engine)
    with DashboardClient(create_app(engine, read_only=True)) as client:
        page = client.get(f"/jobs/{job_id}").text
        assert forms_posting(page) == []
        assert "read-only" in page
        response = client.act(f"/jobs/{job_id}/retry")
        assert response.status_code == 403
    assert job_row(engine, job_id).state is JobState.DISCARDED
    with DashboardClient(create_app(engine)) as client:
        assert f"/jobs/{job_id}/retry" in forms_posting(client.get(f"/jobs/{job_id}").text)


def test_the_auth_hook_sees_every_request(engine: Engine) -> None:
    seen: list[str] = []

    def auth(request: Any) -> bool:
        seen.append(request.url.path)
        return request.headers.get("x-user") == "ops"

    with DashboardClient(create_app(engine, auth=auth)) as client:
        assert client.get("/").status_code == 403
        assert client.get("/static/dashboard.css").status_code == 403
        assert client.get("/", headers={"x-user": "ops"}).status_code == 200
    assert seen == ["/", "/static/dashboard.css", "/"]


def test_an_async_auth_hook(engine: Engine) -> None:
    async def auth(request: Any) -> bool:
        return request.query_params.get("key") == "k"

    with DashboardClient(create_app(engine, auth=auth)) as client:
        assert client.get("/jobs").status_code == 403
        assert client.get("/jobs?key=k").status_code == 200


def test_basic_auth_challenges_and_admits_the_right_credentials(engine: Engine) -> None:
    def header(credentials: str) -> dict[str, str]:
        return {"authorization": "Basic " + base64.b64encode(credentials.encode()).decode()}

    with DashboardClient(create_app(engine, auth=basic_auth("ops", "s3cret"))) as client:
        refused = client.get("/")
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"].startswith("Basic ")
        assert client.get("/", headers=header("ops:wrong")).status_code == 401
        assert client.get("/", headers={"authorization": "Basic !!"}).status_code == 401
        assert client.get("/", headers=header("ops:s3cret")).status_code == 200


def test_mounted_in_fastapi_under_a_prefix(engine: Engine) -> None:
    job_id = discarded_job(engine)
    api = FastAPI()
    api.mount("/admin/jobs", create_app(engine))
    with DashboardClient(api) as client:
        page = client.get(f"/admin/jobs/jobs/{job_id}")
        assert page.status_code == 200
        assert 'href="/admin/jobs/static/dashboard.css"' in page.text
        assert f'action="/admin/jobs/jobs/{job_id}/retry"' in page.text
        assert client.cookies.get("sa_jobs_csrf")
        response = client.act(f"/admin/jobs/jobs/{job_id}/retry")
        assert response.status_code == 303
        assert response.headers["location"] == f"/admin/jobs/jobs/{job_id}?notice=retried"
    assert job_row(engine, job_id).state is JobState.AVAILABLE


def test_base_path_prefixes_every_link(engine: Engine) -> None:
    job_id = discarded_job(engine)
    with DashboardClient(create_app(engine, base_path="/ops/queue")) as client:
        page = client.get(f"/jobs/{job_id}").text
        assert 'href="/ops/queue/static/dashboard.css"' in page
        assert f'action="/ops/queue/jobs/{job_id}/retry"' in page
        # The cookie is set for the browser's path (/ops/queue); the proxy strips it.
        cookie = client.cookies.jar
        (token,) = [c for c in cookie if c.name == "sa_jobs_csrf" and c.path == "/ops/queue"]
        response = client.post(
            f"/jobs/{job_id}/retry",
            data={"csrf": token.value},
            headers={"cookie": f"sa_jobs_csrf={token.value}"},
            follow_redirects=False,
        )
        assert response.headers["location"] == f"/ops/queue/jobs/{job_id}?notice=retried"


def test_an_async_engine_works_the_same(database_url: URL, engine: Engine) -> None:
    job_id = discarded_job(engine)
    async_engine = create_async_engine(database_url.set(drivername="postgresql+psycopg"))
    try:
        with DashboardClient(create_app(async_engine)) as client:
            for path in ("/", "/jobs", f"/jobs/{job_id}", "/sequences", "/workers"):
                assert client.get(path).status_code == 200, path
            assert client.act(f"/jobs/{job_id}/retry").status_code == 303
    finally:
        # Disposed on the client's loop is not possible once it closed; the pool's
        # connections are simply dropped.
        async_engine.sync_engine.dispose()
    assert job_row(engine, job_id).state is JobState.AVAILABLE


def test_filters_and_pages(client: DashboardClient, engine: Engine) -> None:
    ids = [
        make_job(engine, kind="dashboard_page", args={"n": n}, queue="q1" if n % 2 else "q2")
        for n in range(120)
    ]
    first = client.get("/jobs?kind=dashboard_page").text
    assert f'href="/jobs/{ids[-1]}"' in first and f'href="/jobs/{ids[-50]}"' in first
    assert f'href="/jobs/{ids[-51]}"' not in first
    assert f"before={ids[-50]}" in first
    second = client.get(f"/jobs?kind=dashboard_page&before={ids[-50]}").text
    assert f'href="/jobs/{ids[-51]}"' in second
    only_q1 = client.get("/jobs?queue=q1&q=%22n%22%3A+7%7D").text  # text: "n": 7}
    assert f'href="/jobs/{ids[7]}"' in only_q1
    assert f'href="/jobs/{ids[9]}"' not in only_q1
    assert client.get("/jobs?state=bogus").status_code == 400
    assert client.get("/jobs?before=-3").status_code == 400


@pytest.mark.parametrize(
    "options",
    [{"base_path": "ops"}, {"base_path": "/ops/"}, {"auth": "admin:secret"}],
)
def test_bad_options_are_refused_when_the_app_is_made(engine: Engine, options: Any) -> None:
    with pytest.raises(InvalidOptionsError):
        create_app(engine, **options)
    with pytest.raises(InvalidOptionsError):
        create_app("postgresql://localhost/db")  # type: ignore[arg-type]


def test_basic_auth_refuses_empty_credentials() -> None:
    with pytest.raises(InvalidOptionsError):
        basic_auth("ops", "")


def test_sa_jobs_insert_shows_up(client: DashboardClient, engine: Engine) -> None:
    from sqlalchemy.orm import Session

    @sa_jobs.job_args(kind="dashboard_http_insert")
    class Hello:
        name: str = ""

    with Session(engine) as session, session.begin():
        job_id = sa_jobs.insert(session, Hello("<world>"), tags=["greeting"]).job.id
    page = client.get("/jobs?tag=greeting").text
    assert f'href="/jobs/{job_id}"' in page
    assert "&lt;world&gt;" in page


# ---------------------------------------------------------------------- periodic jobs


def periodic_row(engine: Engine, name: str, **values: Any) -> None:
    """A periodic job's stored state, as a worker that has it in its code leaves it."""
    from sqlalchemy import func, insert

    row: dict[str, Any] = {
        "name": name,
        "schedule": "every 60s",
        "next_run_at": func.now() + dt.timedelta(seconds=30),
        "seen_at": func.now(),
        **values,
    }
    with engine.begin() as connection:
        connection.execute(insert(PeriodicState).values(row))


def periodic_state(engine: Engine, name: str) -> PeriodicState:
    from sqlalchemy.orm import Session

    with Session(engine, expire_on_commit=False) as session:
        found = session.get(PeriodicState, name)
        assert found is not None
        return found


def test_the_periodic_page_shows_schedules_last_and_next_runs(
    client: DashboardClient, engine: Engine
) -> None:
    last_job = make_job(engine, kind="nightly_report", state=JobState.COMPLETED)
    periodic_row(
        engine,
        "nightly <report>",
        schedule="0 3 * * * (Europe/Paris)",
        last_run_at=dt.datetime(2026, 5, 4, 1, 0, tzinfo=dt.UTC),
        last_job_id=last_job,
    )
    periodic_row(engine, "gone", seen_at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    page = client.get("/periodic").text
    assert "nightly &lt;report&gt;" in page  # escaped, like everything a user named
    assert "0 3 * * * (Europe/Paris)" in page
    assert "2026-05-04 01:00:00 UTC" in page
    assert f'href="/jobs/{last_job}">{last_job}</a>' in page
    assert "state-completed" in page
    assert re.search(r"\(in (2\d|30)\.\d s\)", page)  # the next run, from the database's clock
    # "gone" is in no running worker's code: seen months ago.
    rows = {row.split("</td>")[0]: row for row in page.split("<tr>\n  <td>")[1:]}
    assert "no worker has it" in rows["gone"]
    assert "no worker has it" not in rows["nightly &lt;report&gt;"]
    assert forms_posting(page) == ["/periodic/run", "/periodic/run"]


def test_run_now_stores_a_request_through_run_now(client: DashboardClient, engine: Engine) -> None:
    periodic_row(engine, "minutely")
    response = client.act("/periodic/run", name="minutely")
    assert response.status_code == 303
    assert response.headers["location"] == "/periodic?notice=ran"
    requested = periodic_state(engine, "minutely").run_now_requested_at
    assert requested is not None
    page = client.get("/periodic?notice=ran").text
    assert "Run requested" in page and "pending" in page
    assert forms_posting(page) == []  # one request is pending: no second button
    assert client.act("/periodic/run", name="minutely").status_code == 303
    assert periodic_state(engine, "minutely").run_now_requested_at == requested  # same one


def test_run_now_refuses_unknown_names_missing_names_and_forged_forms(
    client: DashboardClient, engine: Engine
) -> None:
    periodic_row(engine, "minutely")
    unknown = client.act("/periodic/run", name="nope")
    assert unknown.status_code == 404
    assert "no periodic job named &#39;nope&#39;" in unknown.text
    assert client.act("/periodic/run").status_code == 400
    forged = client.post("/periodic/run", data={"name": "minutely"}, follow_redirects=False)
    assert forged.status_code == 403
    assert client.get("/periodic/run").status_code == 405
    assert periodic_state(engine, "minutely").run_now_requested_at is None


def test_read_only_shows_periodic_jobs_and_refuses_run_now(engine: Engine) -> None:
    periodic_row(engine, "minutely")
    with DashboardClient(create_app(engine, read_only=True)) as client:
        page = client.get("/periodic").text
        assert "<td>minutely</td>" in page
        assert forms_posting(page) == []
        assert client.act("/periodic/run", name="minutely").status_code == 403
    assert periodic_state(engine, "minutely").run_now_requested_at is None


def test_without_the_periodic_branch_the_page_and_run_now_say_so(core_only: Engine) -> None:
    with DashboardClient(create_app(core_only)) as client:
        page = client.get("/periodic")
        assert page.status_code == 200
        assert "sa_jobs_periodic" in page.text and "sa-jobs migrate" in page.text
        refused = client.act("/periodic/run", name="minutely")
        assert refused.status_code == 409
        assert "sa_jobs_periodic" in refused.text and "not installed" in refused.text


# ---------------------------------------------------------------------- queue controls


def paused_queues(engine: Engine) -> list[str]:
    from sqlalchemy.orm import Session

    with Session(engine) as session:
        return [state.name for state in sa_jobs.queue_states(session, paused_only=True)]


def test_pause_and_resume_a_queue_from_the_overview(
    client: DashboardClient, engine: Engine
) -> None:
    make_job(engine, queue="dashboard_mail")
    page = client.get("/").text
    assert "/queues/pause" in forms_posting(page)
    response = client.act("/queues/pause", queue="dashboard_mail")
    assert response.status_code == 303
    assert response.headers["location"] == "/?notice=paused"
    assert paused_queues(engine) == ["dashboard_mail"]
    page = client.get("/?notice=paused").text
    (row,) = [row for row in page.split("<tr") if "dashboard_mail</a>" in row]
    assert ">paused</span>" in row and "/queues/resume" in row
    assert "Queue paused" in page
    assert client.act("/queues/resume", queue="dashboard_mail").status_code == 303
    assert paused_queues(engine) == []


def test_a_paused_queue_without_jobs_still_has_its_row(
    client: DashboardClient, engine: Engine
) -> None:
    from sqlalchemy.orm import Session

    with Session(engine) as session, session.begin():
        sa_jobs.pause_queue(session, "dashboard_later", allow_unknown=True)
    page = client.get("/").text
    (row,) = [row for row in page.split("<tr") if "dashboard_later</a>" in row]
    assert ">paused</span>" in row


def test_pausing_a_queue_nothing_names_is_refused(client: DashboardClient, engine: Engine) -> None:
    response = client.act("/queues/pause", queue="dashboard_mial")
    assert response.status_code == 400
    assert "no job, worker or queue control names queue &#39;dashboard_mial&#39;" in response.text
    assert client.act("/queues/pause").status_code == 400
    assert paused_queues(engine) == []


def test_read_only_shows_paused_queues_but_no_pause_buttons(engine: Engine) -> None:
    make_job(engine, queue="dashboard_mail")
    with DashboardClient(create_app(engine, read_only=True)) as client:
        assert forms_posting(client.get("/").text) == []
        assert client.act("/queues/pause", queue="dashboard_mail").status_code == 403
    assert paused_queues(engine) == []


# ---------------------------------------------------------------------- delete, bulk


def test_deleting_a_job_asks_first(client: DashboardClient, engine: Engine) -> None:
    job_id = discarded_job(engine)
    assert f"/jobs/{job_id}/delete" in forms_posting(client.get(f"/jobs/{job_id}").text)
    asked = client.act(f"/jobs/{job_id}/delete")
    assert asked.status_code == 200
    assert f"Delete job {job_id}?" in asked.text
    assert forms_posting(asked.text) == [f"/jobs/{job_id}/delete"]
    assert 'name="confirm" value="yes"' in asked.text
    assert job_row(engine, job_id).state is JobState.DISCARDED  # nothing yet
    done = client.act(f"/jobs/{job_id}/delete", confirm="yes")
    assert done.status_code == 303
    assert done.headers["location"] == "/jobs?notice=deleted"
    assert client.get(f"/jobs/{job_id}").status_code == 404
    assert client.act(f"/jobs/{job_id}/delete", confirm="yes").status_code == 404


def test_a_running_job_is_never_deleted(client: DashboardClient, engine: Engine) -> None:
    job_id = make_job(engine, state=JobState.RUNNING, attempted_by=["w"])
    assert f"/jobs/{job_id}/delete" not in forms_posting(client.get(f"/jobs/{job_id}").text)
    refused = client.act(f"/jobs/{job_id}/delete", confirm="yes")
    assert refused.status_code == 409
    assert "cancel them first" in refused.text
    assert job_row(engine, job_id).state is JobState.RUNNING


def test_ticked_jobs_are_confirmed_then_acted_on_and_running_ones_left_alone(
    client: DashboardClient, engine: Engine
) -> None:
    discarded = discarded_job(engine)
    running = make_job(engine, kind="dashboard_http", state=JobState.RUNNING, attempted_by=["w"])
    completed = make_job(engine, kind="dashboard_http", state=JobState.COMPLETED)
    kept = make_job(engine, kind="dashboard_http", state=JobState.COMPLETED)
    listing = client.get("/jobs?kind=dashboard_http").text
    assert "/jobs/bulk" in forms_posting(listing)
    assert f'name="id" value="{running}"' in listing
    ticked = [str(discarded), str(running), str(completed)]
    form = {"csrf": client.token(), "operation": "delete", "kind": "dashboard_http", "id": ticked}
    asked = client.post("/jobs/bulk", data=form, follow_redirects=False)
    assert asked.status_code == 200
    assert "Delete 2 of the 3 ticked jobs?" in asked.text
    (running_row,) = [row for row in asked.text.split("<tr") if f">{running}</a>" in row]
    assert "left as it is" in running_row
    assert job_row(engine, discarded).state is JobState.DISCARDED  # asked, not done
    done = client.post("/jobs/bulk", data={**form, "confirm": "yes"}, follow_redirects=False)
    assert done.status_code == 303
    assert done.headers["location"] == "/jobs?kind=dashboard_http&n=2&notice=bulk-deleted"
    assert "Deleted 2 jobs" in client.get(done.headers["location"]).text
    remaining = client.get("/jobs?kind=dashboard_http").text
    assert f'href="/jobs/{running}"' in remaining and f'href="/jobs/{kept}"' in remaining
    assert f'href="/jobs/{discarded}"' not in remaining
    assert f'href="/jobs/{completed}"' not in remaining


def test_retry_every_job_matching_the_filter(client: DashboardClient, engine: Engine) -> None:
    mine = [discarded_job(engine, queue="dashboard_q1") for _ in range(5)]
    other = discarded_job(engine, queue="dashboard_q2")
    form = {"scope": "filter", "operation": "retry", "queue": "dashboard_q1", "state": "discarded"}
    asked = client.act("/jobs/bulk", **form)
    assert asked.status_code == 200
    assert "5 jobs match now" in asked.text
    assert "queue = dashboard_q1" in asked.text and "state = discarded" in asked.text
    assert all(job_row(engine, job_id).state is JobState.DISCARDED for job_id in mine)
    done = client.act("/jobs/bulk", **form, confirm="yes")
    assert done.status_code == 303
    assert "n=5&notice=bulk-retried" in done.headers["location"]
    assert all(job_row(engine, job_id).state is JobState.AVAILABLE for job_id in mine)
    assert job_row(engine, other).state is JobState.DISCARDED


def test_a_whole_filter_is_worked_in_rounds_that_offer_to_continue(
    client: DashboardClient, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sa_jobs.dashboard import confirmed_actions

    monkeypatch.setattr(confirmed_actions, "BATCH", 2)
    monkeypatch.setattr(confirmed_actions, "TIME_BUDGET", 0.0)  # stop after every transaction
    ids = [make_job(engine, queue="dashboard_rounds", state=JobState.COMPLETED) for _ in range(5)]
    form: dict[str, Any] = {
        "scope": "filter",
        "operation": "delete",
        "queue": "dashboard_rounds",
        "confirm": "yes",
    }
    rounds = 0
    while True:
        response = client.act("/jobs/bulk", **form)
        rounds += 1
        if response.status_code == 303:
            break
        assert response.status_code == 200
        after = re.search(r'name="after_id" value="(\d+)"', response.text)
        assert after is not None, response.text
        form["after_id"] = after.group(1)
    assert rounds == 4  # 2, 2, 1, then the round that finds none left and redirects
    assert client.get("/jobs?queue=dashboard_rounds").text.count('href="/jobs/') == 0
    assert all(client.get(f"/jobs/{job_id}").status_code == 404 for job_id in ids)


@pytest.mark.parametrize(
    ("form", "message"),
    [
        ({"scope": "filter", "operation": "delete"}, "Filter the list first"),
        ({"scope": "filter", "operation": "delete", "tag": "x"}, "tick the jobs instead"),
        (
            {"scope": "filter", "operation": "delete", "state": "running"},
            "running jobs are never deleted",
        ),
        ({"scope": "filter", "operation": "retry", "kind": "dashboard_nokind"}, "no job has it"),
        ({"operation": "delete"}, "No jobs were ticked"),
        ({"operation": "explode", "id": "1"}, "no known action"),
        ({"operation": "delete", "id": "x"}, "is not a job id"),
    ],
)
def test_bulk_forms_the_api_would_refuse_are_refused(
    client: DashboardClient, engine: Engine, form: dict[str, str], message: str
) -> None:
    job_id = make_job(engine, state=JobState.RUNNING, attempted_by=["w"])
    response = client.act("/jobs/bulk", **form, confirm="yes")
    assert response.status_code == 400, response.text
    assert message in response.text
    assert job_row(engine, job_id).state is JobState.RUNNING


def test_bulk_actions_need_the_forms_token_and_are_hidden_read_only(engine: Engine) -> None:
    job_id = discarded_job(engine)
    data = {"operation": "delete", "id": str(job_id), "confirm": "yes"}
    with DashboardClient(create_app(engine)) as client:
        client.get("/")
        assert client.post("/jobs/bulk", data=data).status_code == 403
    with DashboardClient(create_app(engine, read_only=True)) as client:
        assert forms_posting(client.get("/jobs").text) == []
        assert forms_posting(client.get("/jobs?state=discarded").text) == []
        assert client.act("/jobs/bulk", **data).status_code == 403
    assert job_row(engine, job_id).state is JobState.DISCARDED


def test_without_the_queue_branch_queues_show_but_cannot_be_paused(core_only: Engine) -> None:
    make_job(core_only, queue="dashboard_mail")
    with DashboardClient(create_app(core_only)) as client:
        page = client.get("/").text
        assert "dashboard_mail</a>" in page
        assert "/queues/pause" not in forms_posting(page)
        assert "sa_jobs_queue" in page
        refused = client.act("/queues/pause", queue="dashboard_mail")
        assert refused.status_code == 409
        assert "sa_jobs_queue" in refused.text and "not installed" in refused.text
