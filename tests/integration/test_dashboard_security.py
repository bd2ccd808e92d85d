"""Who gets in and what a request may do: the auth hook's verdicts, the warning for a
dashboard without auth, the CSRF cookie's shape and its https form, the origin check
behind a reverse proxy, and errors answered as pages with the security headers."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text

from sa_jobs import JobState
from sa_jobs.dashboard import create_app, database
from sa_jobs.devdb import Server, throwaway_database
from tests.dashboard import DashboardClient
from tests.factories import job_row, make_job
from tests.helpers import engine_at


def discarded(engine: Engine) -> int:
    return make_job(engine, state=JobState.DISCARDED, attempt=1, max_attempts=1)


# ---------------------------------------------------------------------- auth


@pytest.mark.parametrize(("verdict", "status"), [(1, 200), ("ops", 200), (None, 403), (0, 403)])
def test_an_auth_verdict_is_read_as_a_truth_value(
    engine: Engine, verdict: object, status: int
) -> None:
    with DashboardClient(create_app(engine, auth=lambda request: verdict)) as client:
        assert client.get("/").status_code == status


def test_a_dashboard_without_auth_warns_once_when_made(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="sa_jobs.dashboard"):
        app = create_app(engine)
        with DashboardClient(app) as client:
            client.get("/")
            client.get("/jobs")
    (record,) = [r for r in caplog.records if r.name == "sa_jobs.dashboard"]
    assert "auth=None: every request is let in" in record.getMessage()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="sa_jobs.dashboard"):
        create_app(engine, auth=lambda request: True)
    assert caplog.records == []


# ---------------------------------------------------------------------- CSRF


@pytest.mark.parametrize(
    "cookie", ["", "short", "x" * 42, "x" * 44, "x" * 42 + "!", "a b" * 14 + "c"]
)
def test_a_csrf_cookie_not_shaped_like_a_token_is_refused_and_replaced(
    engine: Engine, cookie: str
) -> None:
    job_id = discarded(engine)
    with DashboardClient(create_app(engine)) as client:
        client.cookies.set("sa_jobs_csrf", cookie)
        response = client.post(
            f"/jobs/{job_id}/retry", data={"csrf": cookie}, follow_redirects=False
        )
        assert response.status_code == 403
        # The refusal's page gave the browser a real token in place of the odd one.
        fresh = response.cookies.get("sa_jobs_csrf")
        assert fresh is not None and fresh != cookie and len(fresh) == 43
    assert job_row(engine, job_id).state is JobState.DISCARDED


def test_over_https_the_csrf_cookie_is_secure_and_host_prefixed(engine: Engine) -> None:
    job_id = discarded(engine)
    app = create_app(engine, base_path="/ops")
    with DashboardClient(app, base_url="https://dash.example") as client:
        set_cookie = client.get("/").headers["set-cookie"]
        assert set_cookie.startswith("__Host-sa_jobs_csrf=")
        assert "Secure" in set_cookie and "Path=/;" in set_cookie + ";"
        assert "sa_jobs_csrf" not in client.cookies  # only the prefixed one
        assert client.act(f"/jobs/{job_id}/retry").status_code == 303
    assert job_row(engine, job_id).state is JobState.AVAILABLE
    with DashboardClient(create_app(engine)) as client:
        set_cookie = client.get("/").headers["set-cookie"]
        assert set_cookie.startswith("sa_jobs_csrf=") and "Secure" not in set_cookie


# ---------------------------------------------------------------------- reverse proxy


def test_behind_a_proxy_that_rewrites_host_the_origin_check_reads_x_forwarded_host(
    engine: Engine,
) -> None:
    job_id = discarded(engine)
    with DashboardClient(create_app(engine)) as client:
        form = {"csrf": client.token()}
        browser = {"origin": "https://jobs.example.com", "host": "127.0.0.1:8178"}
        refused = client.post(
            f"/jobs/{job_id}/retry", data=form, headers=browser, follow_redirects=False
        )
        assert refused.status_code == 403
        assert "another origin" in refused.text
        assert job_row(engine, job_id).state is JobState.DISCARDED
        forwarded = {**browser, "x-forwarded-host": "jobs.example.com"}
        accepted = client.post(
            f"/jobs/{job_id}/retry", data=form, headers=forwarded, follow_redirects=False
        )
        assert accepted.status_code == 303
    assert job_row(engine, job_id).state is JobState.AVAILABLE


# ---------------------------------------------------------------------- errors as pages


@pytest.fixture
def table_locked(engine: Engine) -> Iterator[None]:
    """sa_job locked by another transaction until the test ends."""
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        with engine.begin() as connection:
            connection.execute(text("LOCK TABLE sa_job IN ACCESS EXCLUSIVE MODE"))
            locked.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    assert locked.wait(5)
    try:
        yield
    finally:
        release.set()
        holder.join()


def test_a_query_past_the_statement_timeout_is_a_503_page(
    engine: Engine, table_locked: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(database, "STATEMENT_TIMEOUT_MS", 200)
    with DashboardClient(create_app(engine)) as client:
        for path in ("/", "/jobs"):
            response = client.get(path)
            assert response.status_code == 503, response.text
            assert "ran longer than the dashboard allows (0.2 s)" in response.text
            assert response.headers["content-security-policy"].startswith("default-src 'none'")
            assert '<link rel="stylesheet"' in response.text


@pytest.fixture
def no_schema(pg_server: Server) -> Iterator[Engine]:
    with (
        throwaway_database(pg_server, prefix="sa_jobs_test_dashboard_blank") as url,
        engine_at(url) as blank,
    ):
        yield blank


def test_a_database_without_sa_jobs_tables_is_a_page_that_says_how_to_install_them(
    no_schema: Engine,
) -> None:
    with DashboardClient(create_app(no_schema)) as client:
        for path in ("/", "/jobs", "/jobs/1", "/workers"):
            response = client.get(path)
            assert response.status_code == 500, (path, response.text)
            assert "sa-jobs migrate" in response.text
            assert "content-security-policy" in response.headers


def test_an_unknown_path_is_a_page_too(engine: Engine) -> None:
    with DashboardClient(create_app(engine)) as client:
        response = client.get("/nowhere")
        assert response.status_code == 404
        assert "content-security-policy" in response.headers
        assert client.get("/jobs/1/retry").headers["allow"] == "POST"
