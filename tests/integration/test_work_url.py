"""``sa-jobs work --url``: the worker works its own engine's database, so a ``--url`` (or
``$SA_JOBS_DATABASE_URL``) naming another one is refused before anything runs, with
both named (issue 22, item 3); the same database spelt another way is accepted."""

from __future__ import annotations

import logging

import pytest
from sqlalchemy import URL, Engine

from sa_jobs import JobState
from sa_jobs.cli import main
from tests.factories import job_row
from tests.helpers import add_job, engine_at, url_text
from tests.integration.own_engine_app import Touch

APP = "tests.integration.own_engine_app:make_worker"


@pytest.fixture
def app_on_test_db(database_url: URL, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OWN_ENGINE_APP_URL", url_text(database_url))
    monkeypatch.delenv("SA_JOBS_DATABASE_URL", raising=False)
    monkeypatch.delenv("DATABASE_URL", raising=False)


def test_a_url_naming_another_database_is_refused_naming_both(
    engine: Engine,
    core_only_url: URL,
    app_on_test_db: None,
    database_url: URL,
    no_workers_or_leader: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    job_id = add_job(engine, Touch(label="x"))

    code = main(["work", APP, "--until-idle", "--url", url_text(core_only_url)])

    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert f"--url names database {core_only_url.database!r} at {_server(core_only_url)}" in err
    assert f"builds its own engine on database {database_url.database!r}" in err
    assert "leave --url out" in err
    # Nothing was worked, on either database.
    assert job_row(engine, job_id).state is JobState.AVAILABLE


def test_the_variable_is_named_when_the_url_came_from_it(
    core_only_url: URL,
    app_on_test_db: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("DATABASE_URL", url_text(core_only_url))
    assert main(["work", APP, "--until-idle"]) == 2
    assert "$DATABASE_URL names database" in capsys.readouterr().err


def test_the_same_database_spelt_another_way_is_worked(
    engine: Engine,
    database_url: URL,
    app_on_test_db: None,
    no_workers_or_leader: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    job_id = add_job(engine, Touch(label="x"))
    caplog.set_level(logging.INFO, logger="sa_jobs.cli")
    same = url_text(database_url.set(host="localhost"))
    with engine_at(same) as probe, probe.connect():
        pass  # the server answers on this name too (else the test would prove nothing)

    assert main(["work", APP, "--until-idle", "--url", same]) == 0

    assert job_row(engine, job_id).state is JobState.COMPLETED
    said = [r.getMessage() for r in caplog.records if "its own engine" in r.getMessage()]
    assert said == [
        f"{APP} works database {database_url.database!r} at {_server(database_url)} "
        "(its own engine; --url names the same)"
    ]


def _server(url: URL) -> str:
    """``host:port`` as the messages name the test server (not always 127.0.0.1:5432)."""
    return f"{url.host}:{url.port or 5432}"
