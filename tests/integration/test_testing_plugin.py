"""The pytest plugin, as a user's test suite meets it: pytest runs in a child process on
a directory of the user's files, the plugin loaded by its entry point or ``-p``.

The worked example of ``docs/testing.md`` is ``examples/testing/``; it runs here, and
the page must show those files as they are.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from sa_jobs.devdb import Server
from tests.helpers import url_text

REPO = Path(__file__).parents[2]
EXAMPLE = REPO / "examples" / "testing"
PLUGIN = "sa_jobs.testing.plugin"

pytestmark = pytest.mark.slow


def plugin_args() -> list[str]:
    """``-p`` for the plugin, unless sa_jobs is installed with its entry point (then
    pytest loads it already, and loading it twice is an error)."""
    installed = any(ep.value == PLUGIN for ep in importlib.metadata.entry_points(group="pytest11"))
    return [] if installed else ["-p", PLUGIN]


def run_pytest(
    directory: Path, server: Server, *args: str, plugin: bool = True
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(directory)])
    env.pop("PYTEST_ADDOPTS", None)
    command = [
        sys.executable,
        "-m",
        "pytest",
        *(plugin_args() if plugin else []),
        "-p",
        "no:cacheprovider",
        "--sa-jobs-url",
        url_text(server.url),
        *args,
    ]
    return subprocess.run(
        command, cwd=directory, env=env, capture_output=True, text=True, timeout=240
    )


def summary_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stdout.strip().splitlines()
    return lines[-1] if lines else result.stderr


def test_the_worked_example_of_docs_testing_md_passes(tmp_path: Path, pg_server: Server) -> None:
    for name in ("signup.py", "conftest.py", "test_signup.py"):
        shutil.copy(EXAMPLE / name, tmp_path / name)
    (tmp_path / "pytest.ini").write_text("[pytest]\nsa_jobs_worker = signup:worker\n")

    result = run_pytest(tmp_path, pg_server)

    assert re.search(r"\b4 passed\b", summary_line(result)), result.stdout + result.stderr
    assert result.returncode == 0


def test_docs_testing_md_shows_the_example_files_as_they_are() -> None:
    page = (REPO / "docs" / "testing.md").read_text()
    blocks = re.findall(r"```python\n# (\S+)\n(.*?)```", page, re.DOTALL)
    shown = {name: body for name, body in blocks}
    assert sorted(shown) == ["conftest.py", "signup.py", "test_signup.py"]
    for name, body in shown.items():
        assert body == (EXAMPLE / name).read_text(), f"docs/testing.md shows an old {name}"


TEST_ROLLBACK = """
from pathlib import Path

from sqlalchemy import func, select

import sa_jobs
from sa_jobs import Job
from conftest import SEEN


@sa_jobs.job_args(kind="plugin_probe")
class Probe:
    n: int = 0


def test_a_commits(sa_jobs_session, sa_jobs_database_url):
    Path("database.txt").write_text(sa_jobs_database_url.database)
    sa_jobs.insert(sa_jobs_session, Probe(1))
    sa_jobs_session.commit()  # the code under test commits: a savepoint, really
    assert sa_jobs_session.scalar(select(func.count()).select_from(Job)) == 1


def test_b_sees_nothing_of_it(sa_jobs_session, sa_jobs_tester):
    assert sa_jobs_session.scalar(select(func.count()).select_from(Job)) == 0
    sa_jobs_tester.assert_not_enqueued(Probe)  # assertions need no worker


def test_c_runs_jobs_with_the_worker_of_the_conftest_fixture(sa_jobs_session, sa_jobs_tester):
    sa_jobs.insert(sa_jobs_session, Probe(3))
    assert sa_jobs_tester.run_jobs().as_dict() == {"completed": 1}
    assert SEEN == [3]
"""

CONFTEST_WORKER = """
import pytest
from sqlalchemy import create_engine

import sa_jobs

SEEN = []


@pytest.fixture
def sa_jobs_worker():
    from test_rollback import Probe

    worker = sa_jobs.Worker(create_engine("postgresql+psycopg:///never_used"))
    worker.handler(Probe)(lambda job: SEEN.append(job.args.n))
    return worker
"""


def test_each_test_is_rolled_back_a_conftest_worker_is_used_and_the_database_dropped(
    tmp_path: Path, pg_server: Server
) -> None:
    (tmp_path / "test_rollback.py").write_text(TEST_ROLLBACK)
    (tmp_path / "conftest.py").write_text(CONFTEST_WORKER)

    result = run_pytest(tmp_path, pg_server)

    assert re.search(r"\b3 passed\b", summary_line(result)), result.stdout + result.stderr
    database = (tmp_path / "database.txt").read_text()
    assert f"sa_jobs: tests used the throwaway database {database} on " in result.stdout
    assert database.startswith("sa_jobs_test_")
    admin = create_engine(pg_server.url, poolclass=NullPool)
    try:
        with admin.connect() as connection:
            left = connection.scalar(
                text("SELECT count(*) FROM pg_database WHERE datname = :name"), {"name": database}
            )
    finally:
        admin.dispose()
    assert left == 0, f"the throwaway database {database} was not dropped"


TEST_NEEDS_WORKER = """
def test_runs_jobs(sa_jobs_tester):
    sa_jobs_tester.run_jobs()
"""


def test_a_missing_or_wrong_worker_setting_says_what_to_write(
    tmp_path: Path, pg_server: Server
) -> None:
    (tmp_path / "test_worker.py").write_text(TEST_NEEDS_WORKER)

    missing = run_pytest(tmp_path, pg_server)

    assert "1 error" in summary_line(missing) or "1 failed" in summary_line(missing)
    assert "sa_jobs_worker = myapp.jobs:worker" in missing.stdout
    assert "def sa_jobs_worker():" in missing.stdout

    (tmp_path / "pytest.ini").write_text("[pytest]\nsa_jobs_worker = no_such_app:worker\n")
    wrong = run_pytest(tmp_path, pg_server)

    assert "sa_jobs_worker = no_such_app:worker: cannot import module 'no_such_app'" in (
        wrong.stdout
    )


def test_the_entry_point_in_pyproject_makes_pytest_load_the_plugin(
    tmp_path: Path, pg_server: Server
) -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    entry_points = project["entry-points"]["pytest11"]
    assert entry_points == {"sa_jobs": PLUGIN}
    # What installing the wheel writes, without building it: a distribution whose
    # entry_points.txt declares the pyproject's pytest11 entry point.
    site = tmp_path / "site"
    dist_info = site / "sa_jobs_entry_point_probe-0.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: sa-jobs-entry-point-probe\nVersion: 0\n"
    )
    (dist_info / "entry_points.txt").write_text(
        "[pytest11]\n" + "".join(f"{name} = {value}\n" for name, value in entry_points.items())
    )
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_fixture.py").write_text(
        "def test_the_fixtures_are_there(sa_jobs_engine):\n    assert sa_jobs_engine\n"
    )
    env_site = f"{site}{os.pathsep}{tests}"

    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--sa-jobs-url",
         url_text(pg_server.url)],
        cwd=tests,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), env_site])},
        capture_output=True,
        text=True,
        timeout=240,
    )  # fmt: skip

    assert re.search(r"\b1 passed\b", summary_line(result)), result.stdout + result.stderr
