"""``sa-jobs dashboard``: loopback unless credentials are set, basic auth from the
environment, and a real server process that serves the pages."""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from sqlalchemy import URL, Engine

from sa_jobs.cli import main
from sa_jobs.cli.dashboard import PASSWORD_VARIABLE, USER_VARIABLE, is_loopback
from tests.dashboard import free_port
from tests.factories import make_job
from tests.helpers import url_text


@pytest.fixture(autouse=True)
def _no_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in (USER_VARIABLE, PASSWORD_VARIABLE, "SA_JOBS_DASHBOARD_HOST"):
        monkeypatch.delenv(variable, raising=False)


def test_loopback_addresses() -> None:
    assert is_loopback("127.0.0.1")
    assert is_loopback("::1")
    assert is_loopback("localhost")
    assert not is_loopback("0.0.0.0")
    assert not is_loopback("::")
    assert not is_loopback("192.168.1.10")


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3"])
def test_refuses_another_interface_without_credentials(
    host: str, database_url: URL, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["dashboard", "--url", url_text(database_url), "--host", host])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith(f"sa-jobs: refusing to serve the dashboard on {host} without auth")
    assert USER_VARIABLE in err and PASSWORD_VARIABLE in err


def test_one_credential_without_the_other_is_refused(
    database_url: URL, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(USER_VARIABLE, "ops")
    assert main(["dashboard", "--url", url_text(database_url)]) == 1
    assert "set both" in capsys.readouterr().err


def test_a_bad_port_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["dashboard", "--port", "70000"])
    assert exit_info.value.code == 2


@pytest.mark.slow
def test_serves_the_dashboard_behind_basic_auth_until_sigterm(
    database_url: URL, engine: Engine
) -> None:
    job_id = make_job(engine, kind="dashboard_cli_job")
    port = free_port()
    env = {**os.environ, USER_VARIABLE: "ops", PASSWORD_VARIABLE: "pa55"}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sa_jobs.cli",
            "dashboard",
            "--url",
            url_text(database_url),
            "--port",
            str(port),
            "--read-only",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        page = _get_when_up(f"{base}/jobs/{job_id}", ("ops", "pa55"))
        assert "dashboard_cli_job" in page
        assert "read-only" in page
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{base}/")
        assert refused.value.code == 401
    finally:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=20)
    assert f"sa_jobs dashboard on {base}/ (read-only)" in out
    assert "Traceback" not in err


def _get_when_up(url: str, credentials: tuple[str, str]) -> str:
    token = base64.b64encode(":".join(credentials).encode()).decode()
    request = urllib.request.Request(url, headers={"Authorization": f"Basic {token}"})
    deadline = time.monotonic() + 20
    while True:
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return str(response.read().decode())
        except (urllib.error.URLError, ConnectionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
