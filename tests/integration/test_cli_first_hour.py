"""What a new user meets in the first hour, command by command: a database not created
yet, a URL of another database, a queue or kind misspelt, a port in use, a bare ``-1``
downgrade, and the log lines of ``import sa_jobs`` (issue 22)."""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import URL, Engine, create_engine
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs._table.schema import BRANCHES, recorded_versions
from sa_jobs.cli import main
from sa_jobs.cli.dashboard import PASSWORD_VARIABLE, USER_VARIABLE
from sa_jobs.devdb import Server, throwaway_database
from sa_jobs.errors import InvalidOptionsError, UnknownQueueError
from tests.dashboard import free_port
from tests.factories import make_job
from tests.helpers import CliRun, url_text

REPO = Path(__file__).parents[2]


def one_line(err: str) -> str:
    """The single ``sa-jobs: ...`` line a mistake prints (no traceback)."""
    assert err.startswith("sa-jobs: "), err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


# ------------------------------------------------------------ the database not created


def test_a_missing_database_says_the_server_answered_and_how_to_create_it(
    pg_server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    name = f"sa_jobs_never_created_{uuid.uuid4().hex[:8]}"
    url = url_text(pg_server.url.set(database=name))
    for command in (["migrate"], ["jobs", "list"], ["stats"], ["queue", "list"]):
        assert main([*command, "--url", url]) == 1
        err = one_line(capsys.readouterr().err)
        assert f'the server answered, but it has no database "{name}"' in err, err
        assert f"createdb {name}" in err and f"CREATE DATABASE {name};" in err
        assert "cannot reach" not in err


def test_an_unreachable_server_is_still_called_unreachable(
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/myapp"
    assert main(["migrate", "--url", url]) == 1
    err = one_line(capsys.readouterr().err)
    assert err.startswith("sa-jobs: cannot reach the database: ")
    assert "createdb" not in err


# ------------------------------------------------------------ not PostgreSQL


COMMANDS_WITH_A_URL = [
    ["migrate"],
    ["migrate", "--status"],
    ["jobs", "list"],
    ["jobs", "show", "1"],
    ["jobs", "delete", "--state", "completed"],
    ["queue", "pause", "mail"],
    ["queue", "list"],
    ["periodic", "list"],
    ["stats"],
    ["health"],
    ["dashboard"],
    ["bench", "--jobs", "10"],
    ["demo"],
    ["work", "tests.integration.cli_worker_app:make_worker", "--until-idle"],
]


@pytest.mark.parametrize("scheme", ["mysql", "sqlite", "mysql+pymysql"])
@pytest.mark.parametrize("command", COMMANDS_WITH_A_URL, ids=" ".join)
def test_a_url_of_another_database_is_refused_in_one_line(
    command: list[str],
    scheme: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SA_JOBS_DATABASE_URL", os.environ.get("SA_JOBS_DATABASE_URL", ""))
    url = f"{scheme}:///{tmp_path / 'app.db'}" if scheme == "sqlite" else f"{scheme}://u@h/app"
    assert main([*command, "--url", url]) == 1
    err = one_line(capsys.readouterr().err)
    assert "sa_jobs needs PostgreSQL" in err and "postgresql://" in err, err
    assert not (tmp_path / "app.db").exists()  # nothing was connected to


def test_worker_and_migrate_refuse_an_engine_of_another_database() -> None:
    engine = create_engine("sqlite://")
    with pytest.raises(InvalidOptionsError, match=r"^engine: sa_jobs needs PostgreSQL"):
        sa_jobs.Worker(engine)
    with pytest.raises(InvalidOptionsError, match=r"^bind: sa_jobs needs PostgreSQL"):
        sa_jobs.migrate(engine)


# ------------------------------------------------------------ misspelt names


def test_pausing_a_queue_nothing_names_says_how_to_pause_it_anyway(
    cli: CliRun, session_factory: Callable[[], Session]
) -> None:
    code, _, err = cli("queue", "pause", "mial")
    assert code == 1
    assert "queue 'mial'" in one_line(err) and "--allow-unknown" in err
    assert "allow_unknown=True" not in err

    with session_factory() as session, pytest.raises(UnknownQueueError) as refused:
        sa_jobs.pause_queue(session, "mial")
    assert "allow_unknown=True" in str(refused.value)

    code, out, _ = cli("queue", "pause", "mial", "--allow-unknown")
    assert code == 0 and out.startswith("queue 'mial': paused since")


def test_a_paused_queue_names_its_zone_once(cli: CliRun, engine: Engine) -> None:
    make_job(engine, queue="mail")
    code, out, _ = cli("queue", "pause", "mail")
    assert code == 0
    assert re.fullmatch(r"queue 'mail': paused since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\n", out)
    row = cli("queue", "list")[1].splitlines()[1]
    assert "+00:00" not in row  # the header says (UTC)


def test_listing_jobs_of_an_unknown_queue_or_kind_warns_like_the_bulk_actions(
    cli: CliRun, engine: Engine
) -> None:
    make_job(engine, queue="mail", kind="send_email_first_hour")

    code, out, err = cli("jobs", "list", "--queue", "mial")
    assert (code, out) == (0, "no jobs\n")
    assert err == (
        "sa-jobs: warning: no job, worker or queue control names queue 'mial'; check its spelling\n"
    )
    # The very message the bulk action refuses with.
    bulk_code, _, bulk_err = cli("jobs", "delete", "--queue", "mial")
    assert bulk_code == 1 and bulk_err == err.replace("warning: ", "")

    code, out, err = cli("jobs", "list", "--kind", "send_emial_first_hour")
    assert (code, out) == (0, "no jobs\n")
    assert "kind 'send_emial_first_hour'" in err and "check its spelling" in err

    # Known names are listed without a word, whether they match jobs or not.
    code, out, err = cli("jobs", "list", "--queue", "mail", "--kind", "send_email_first_hour")
    assert code == 0 and err == "" and "send_email_first_hour" in out
    assert cli("jobs", "list", "--queue", "mail", "--state", "completed") == (0, "no jobs\n", "")


# ------------------------------------------------------------ the dashboard


@pytest.fixture
def no_dashboard_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in (USER_VARIABLE, PASSWORD_VARIABLE, "SA_JOBS_DASHBOARD_HOST"):
        monkeypatch.delenv(variable, raising=False)


@pytest.mark.usefixtures("no_dashboard_credentials")
def test_a_dashboard_port_in_use_is_said_before_any_url(
    database_url: URL, engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(["dashboard", "--url", url_text(database_url), "--port", str(port)])
    out, err = capsys.readouterr()
    assert code == 2  # a usage error: another --port; not health's 3
    assert out == ""  # no URL that leads to the other server
    assert f"port {port} on 127.0.0.1 is already in use" in one_line(err) and "--port" in err


@pytest.mark.slow
@pytest.mark.usefixtures("no_dashboard_credentials")
def test_the_dashboard_on_loopback_starts_without_the_mounting_advice(
    database_url: URL, engine: Engine
) -> None:
    port = free_port()
    command = [sys.executable, "-m", "sa_jobs.cli", "dashboard", "--port", str(port)]
    process = subprocess.Popen(
        [*command, "--url", url_text(database_url), "--log-level", "INFO"],
        env={k: v for k, v in os.environ.items() if k not in (USER_VARIABLE, PASSWORD_VARIABLE)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as page:
                    assert page.status == 200  # no auth on loopback, as before
                break
            except (urllib.error.URLError, ConnectionError):
                assert time.monotonic() < deadline, "the dashboard did not start"
                time.sleep(0.1)
    finally:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=20)
    assert out.startswith(f"sa_jobs dashboard on http://127.0.0.1:{port}/")
    assert "auth=None" not in err and "create_app(" not in err, err


# ------------------------------------------------------------ a bare -1 downgrade


@pytest.fixture
def blank_url(pg_server: Server) -> Iterator[URL]:
    with throwaway_database(pg_server, prefix="sa_jobs_test_first_hour") as url:
        yield url


def installed(url: URL) -> tuple[str, ...]:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return tuple(recorded_versions(connection))
    finally:
        engine.dispose()


def test_a_bare_relative_downgrade_is_refused_before_alembic_says_anything(
    blank_url: URL, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    url = url_text(blank_url)
    assert main(["migrate", "--url", url]) == 0
    before = installed(blank_url)
    assert len(before) == len(BRANCHES)
    capsys.readouterr()
    caplog.clear()
    caplog.set_level(logging.INFO)

    code = main(["migrate", "--url", url, "--downgrade=-1", "--log-level", "INFO"])

    err = one_line(capsys.readouterr().err)
    assert code == 1
    assert "'-1' is ambiguous" in err and "nothing was downgraded" in err
    assert "sa_jobs_unique@-1" in err and "sa_jobs_core@base" in err
    assert [r.getMessage() for r in caplog.records if r.name.startswith("alembic")] == []
    assert installed(blank_url) == before

    engine = create_engine(blank_url)
    try:
        with pytest.raises(InvalidOptionsError, match="ambiguous"):
            sa_jobs.downgrade(engine, "-2")
    finally:
        engine.dispose()
    assert installed(blank_url) == before


def test_a_relative_downgrade_of_a_single_branch_still_runs(
    blank_url: URL, capsys: pytest.CaptureFixture[str]
) -> None:
    url = url_text(blank_url)
    assert main(["migrate", "--url", url, "--target", "sa_jobs_core@head"]) == 0
    assert main(["migrate", "--url", url, "--downgrade=-1"]) == 0
    assert "removed sajobs_core_0006" in capsys.readouterr().out
    assert installed(blank_url) == ("sajobs_core_0005",)


# ------------------------------------------------------------ import sa_jobs


def test_importing_sa_jobs_logs_nothing_at_info() -> None:
    code = "import logging; logging.basicConfig(level=logging.INFO); import sa_jobs"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert result.returncode == 0
    assert result.stderr == ""


def test_migrate_logs_its_revisions_but_not_alembics_plugin_setup(blank_url: URL) -> None:
    code = (
        "import logging, sys; logging.basicConfig(level=logging.INFO); import sa_jobs; "
        "from sqlalchemy import create_engine; "
        "sa_jobs.migrate(create_engine(sys.argv[1]), 'sa_jobs_core@head')"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, url_text(blank_url)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    assert "Running upgrade" in result.stderr
    assert "setup plugin" not in result.stderr


# ------------------------------------------------------------ which PostgreSQL the tests use


def test_the_test_run_names_its_postgresql_in_the_header() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/unit/test_urls.py", "-p", "no:cacheprovider"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stdout
    header = result.stdout.split("collected", 1)[0]
    assert re.search(r"^sa_jobs tests use .+$", header, flags=re.MULTILINE), header
