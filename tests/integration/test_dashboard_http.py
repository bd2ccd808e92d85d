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
from sa_jobs.dashboard import basic_auth, create_app
from sa_jobs.errors import InvalidOptionsError
from sa_jobs.models import PeriodicState
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
