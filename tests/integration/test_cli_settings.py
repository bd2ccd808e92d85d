"""``sa-jobs`` options: before or after the command, from ``SA_JOBS_*`` variables (the
command line wins), ``--version``, and ``work``'s queues and ``--until-idle``."""

from __future__ import annotations

import importlib.metadata
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import URL, Engine
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import JobState
from sa_jobs.cli import main
from sa_jobs.devdb import Server, throwaway_database
from tests.factories import job_row, make_job
from tests.helpers import url_text
from tests.integration.cli_worker_app import QUEUE, Touch

ROOT = Path(__file__).parents[2]
APP = "tests.integration.cli_worker_app:make_worker"
NOWHERE = "postgresql://nobody@127.0.0.1:1/nowhere"
VARIABLES = (
    "SA_JOBS_DATABASE_URL",
    "DATABASE_URL",
    "SA_JOBS_LOG_LEVEL",
    "SA_JOBS_WORKER",
    "SA_JOBS_QUEUES",
    "SA_JOBS_CONCURRENCY",
    "SA_JOBS_PROCESSES",
    "SA_JOBS_UNTIL_IDLE",
    "SA_JOBS_MIGRATE_TARGET",
)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No SA_JOBS_* variable from the machine leaks in; ``work --url`` exports the URL
    to the app, and monkeypatch puts the environment back afterwards."""
    for variable in VARIABLES:
        monkeypatch.delenv(variable, raising=False)


def one_line_error(err: str, *fragments: str) -> None:
    assert err.startswith("sa-jobs"), err
    assert err.count("\n") == 1, err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in err, err


# ---------------------------------------------------------------------- --version


def test_version_is_the_installed_distributions(capsys: pytest.CaptureFixture[str]) -> None:
    installed = importlib.metadata.version("sa-jobs")
    assert sa_jobs.__version__ == installed

    with pytest.raises(SystemExit) as exited:
        main(["--version"])

    assert exited.value.code == 0
    assert capsys.readouterr().out == f"sa-jobs {installed}\n"


# ---------------------------------------------------------------------- global options


@pytest.mark.parametrize(
    "argv",
    [
        ["--url", "{url}", "jobs", "list"],
        ["jobs", "--url", "{url}", "list"],
        ["jobs", "list", "--url", "{url}"],
        ["--log-level", "debug", "jobs", "list", "--url", "{url}"],
        ["jobs", "list", "--url", "{url}", "--log-level", "ERROR"],
    ],
    ids=["before", "between", "after", "level-before", "level-after"],
)
def test_global_options_go_before_or_after_the_command(
    argv: list[str], database_url: URL, engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    job_id = make_job(engine)
    url = url_text(database_url)

    code = main([part.replace("{url}", url) for part in argv])

    out, err = capsys.readouterr()
    assert (code, err) == (0, "")
    assert out.splitlines()[1].split()[0] == str(job_id)


def test_the_command_line_url_wins_over_the_environment(
    database_url: URL, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_job(engine)
    monkeypatch.setenv("SA_JOBS_DATABASE_URL", NOWHERE)
    assert main(["jobs", "list", "--url", url_text(database_url)]) == 0


def test_sa_jobs_database_url_wins_over_database_url(
    database_url: URL, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_job(engine)
    monkeypatch.setenv("DATABASE_URL", NOWHERE)
    monkeypatch.setenv("SA_JOBS_DATABASE_URL", url_text(database_url))
    assert main(["jobs", "list"]) == 0


def test_a_bad_log_level_fails_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--log-level", "loud", "jobs", "list"])
    assert exited.value.code == 2
    one_line_error(capsys.readouterr().err, "'loud' is not a log level")

    monkeypatch.setenv("SA_JOBS_LOG_LEVEL", "loud")
    assert main(["jobs", "list", "--url", NOWHERE]) == 2
    one_line_error(capsys.readouterr().err, "$SA_JOBS_LOG_LEVEL", "'loud' is not a log level")


def test_the_log_level_comes_from_the_option_or_the_environment(pg_server: Server) -> None:
    """Alembic says "Running upgrade" at INFO: shown only when the level asks for it
    (a subprocess, so that pytest's own logging setup is out of the way)."""

    def migrate_log(*argv: str, **env: str) -> str:
        with throwaway_database(pg_server, prefix="sa_jobs_test_cli_log") as url:
            command = [sys.executable, "-m", "sa_jobs.cli", "migrate", "--url", url_text(url)]
            done = subprocess.run(
                [*command, *argv],
                env={**_environment(), **env},
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            )
        return done.stderr

    assert migrate_log() == ""
    assert "Running upgrade" in migrate_log("--log-level", "INFO")
    assert "Running upgrade" in migrate_log(SA_JOBS_LOG_LEVEL="info")
    assert migrate_log("--log-level", "WARNING", SA_JOBS_LOG_LEVEL="INFO") == ""


def _environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in VARIABLES}


# ---------------------------------------------------------------------- work: bad values


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("mail=0", "'mail=0': the concurrency after '=' must be a whole number of at least 1"),
        ("mail=many", "'mail=many': the concurrency after '='"),
        ("=5", "'=5' is not a queue: expected NAME or NAME=CONCURRENCY"),
    ],
)
def test_a_bad_queue_is_refused_before_the_app_is_imported(
    value: str, message: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The app does not exist: a refusal that names the queue came before the import.
    with pytest.raises(SystemExit) as exited:
        main(["work", "no_such_module_anywhere:worker", "-q", value])
    assert exited.value.code == 2
    one_line_error(capsys.readouterr().err, message)

    monkeypatch.setenv("SA_JOBS_QUEUES", f"default=2, {value}")
    assert main(["work", "no_such_module_anywhere:worker"]) == 2
    one_line_error(capsys.readouterr().err, "$SA_JOBS_QUEUES", message)


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("SA_JOBS_CONCURRENCY", "0", "must be at least 1, got 0"),
        ("SA_JOBS_PROCESSES", "two", "'two' is not a whole number"),
        ("SA_JOBS_UNTIL_IDLE", "maybe", "'maybe' is not a switch"),
    ],
)
def test_a_bad_variable_is_refused_with_its_name(
    variable: str,
    value: str,
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(variable, value)
    assert main(["work", "no_such_module_anywhere:worker"]) == 2
    one_line_error(capsys.readouterr().err, f"${variable}: {message}")


def test_a_queue_named_twice_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["work", "no_such_module_anywhere:worker", "-q", "mail", "-q", "mail=3"]) == 2
    one_line_error(capsys.readouterr().err, "queue 'mail' is named twice")


def test_work_without_a_worker_says_how_to_name_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["work"]) == 2
    one_line_error(capsys.readouterr().err, "sa-jobs work MODULE:ATTRIBUTE", "SA_JOBS_WORKER")


# ---------------------------------------------------------------------- work: queues, until idle


def _touch(engine: Engine, label: str, queue: str) -> int:
    with Session(engine) as session, session.begin():
        return sa_jobs.insert(session, Touch(label=label), queue=queue).job.id


def test_until_idle_works_the_named_queues_and_returns(
    database_url: URL,
    engine: Engine,
    no_workers_or_leader: None,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    mail = [_touch(engine, f"mail {n}", "mail") for n in range(3)]
    own = _touch(engine, "own queue", QUEUE)
    caplog.set_level(logging.INFO, logger="sa_jobs.worker")

    code = main(["work", APP, "--url", url_text(database_url), "-q", "mail", "--until-idle"])

    assert code == 0
    assert [job_row(engine, job_id).state for job_id in mail] == [JobState.COMPLETED] * 3
    # -q replaces the worker's own queues: its queue was not worked.
    assert job_row(engine, own).state is JobState.AVAILABLE
    assert "touched mail 0" in capsys.readouterr().out
    started = [r.getMessage() for r in caplog.records if "started: queues" in r.getMessage()]
    assert started and started[0].endswith("started: queues {'mail': 10}")


def test_the_environment_names_the_worker_its_queues_and_until_idle(
    database_url: URL,
    engine: Engine,
    no_workers_or_leader: None,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    mail = _touch(engine, "mail", "mail")
    other = _touch(engine, "other", "other")
    monkeypatch.setenv("SA_JOBS_DATABASE_URL", url_text(database_url))
    monkeypatch.setenv("SA_JOBS_WORKER", APP)
    monkeypatch.setenv("SA_JOBS_QUEUES", "mail=3, other")
    monkeypatch.setenv("SA_JOBS_CONCURRENCY", "2")
    monkeypatch.setenv("SA_JOBS_UNTIL_IDLE", "yes")
    caplog.set_level(logging.INFO, logger="sa_jobs.worker")

    assert main(["work"]) == 0

    assert job_row(engine, mail).state is JobState.COMPLETED
    assert job_row(engine, other).state is JobState.COMPLETED
    started = [r.getMessage() for r in caplog.records if "started: queues" in r.getMessage()]
    assert started[0].endswith("started: queues {'mail': 3, 'other': 2}")


def test_concurrency_without_queues_applies_to_the_workers_own(
    database_url: URL,
    engine: Engine,
    no_workers_or_leader: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    own = _touch(engine, "own", QUEUE)
    caplog.set_level(logging.INFO, logger="sa_jobs.worker")

    url = url_text(database_url)
    assert main(["work", APP, "--url", url, "--concurrency", "7", "--until-idle"]) == 0

    assert job_row(engine, own).state is JobState.COMPLETED
    started = [r.getMessage() for r in caplog.records if "started: queues" in r.getMessage()]
    assert started[0].endswith(f"started: queues {{'{QUEUE}': 7}}")


def test_the_command_line_wins_over_the_queues_and_until_idle_of_the_environment(
    database_url: URL,
    engine: Engine,
    no_workers_or_leader: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The environment says: work "other", forever. The command line says: "mail", until
    idle. Returning at all shows --until-idle won over $SA_JOBS_UNTIL_IDLE=0, and the job
    in "other" left alone shows -q won over $SA_JOBS_QUEUES."""
    mail = _touch(engine, "mail", "mail")
    other = _touch(engine, "other", "other")
    monkeypatch.setenv("SA_JOBS_QUEUES", "other")
    monkeypatch.setenv("SA_JOBS_UNTIL_IDLE", "0")

    url = url_text(database_url)
    assert main(["work", APP, "--url", url, "-q", "mail", "--until-idle"]) == 0

    assert job_row(engine, mail).state is JobState.COMPLETED
    assert job_row(engine, other).state is JobState.AVAILABLE


def test_work_url_wins_over_the_environment_for_the_apps_engine(
    database_url: URL,
    engine: Engine,
    no_workers_or_leader: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The app builds its engine from $SA_JOBS_DATABASE_URL; ``--url`` is exported to it."""
    own = _touch(engine, "own", QUEUE)
    monkeypatch.setenv("SA_JOBS_DATABASE_URL", NOWHERE)

    assert main(["work", APP, "--until-idle", "--url", url_text(database_url)]) == 0

    assert job_row(engine, own).state is JobState.COMPLETED


# ---------------------------------------------------------------------- demo


def test_demo_runs_on_the_server_given_by_url(
    pg_server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    url = url_text(pg_server.url)

    assert main(["demo", "--url", url]) == 0

    out = capsys.readouterr().out
    shown = pg_server.url.render_as_string(hide_password=True)
    assert out.startswith(f"using --url ({shown})\n")
