"""The examples that are whole apps run as their users would run them, and the README's
quickstart runs exactly as written.

* ``examples/fastapi_app``: its own httpx test suite (``pytest examples/fastapi_app``)
  against a throwaway database, on asyncpg.
* The README's quickstart block: extracted, its URL pointed at a throwaway database,
  and run as a script.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sa_jobs.devdb import Server, throwaway_database
from tests.helpers import url_text

REPO = Path(__file__).parents[2]
QUICKSTART_URL = "postgresql+psycopg://localhost/myapp"


@pytest.mark.slow
def test_the_fastapi_example_passes_its_own_tests(pg_server: Server) -> None:
    with throwaway_database(pg_server, prefix="sa_jobs_test_fastapi") as url:
        env = {**os.environ, "DATABASE_URL": url_text(url.set(drivername="postgresql"))}
        env.pop("SA_JOBS_DATABASE_URL", None)  # it would win over the throwaway database
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "examples/fastapi_app",
                "-q",
                "-p",
                "no:cacheprovider",
            ],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"\b3 passed\b", result.stdout), result.stdout


def quickstart() -> str:
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Quickstart", 1)[1]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    assert blocks, "the README's quickstart has no python block"
    return str(blocks[0])


@pytest.mark.slow
def test_the_readme_quickstart_runs_as_written(pg_server: Server, tmp_path: Path) -> None:
    code = quickstart()
    assert QUICKSTART_URL in code
    with throwaway_database(pg_server, prefix="sa_jobs_test_quickstart") as url:
        script = tmp_path / "quickstart.py"
        script.write_text(code.replace(QUICKSTART_URL, url_text(url)))
        result = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert result.returncode == 0, result.stderr
    # Handlers run on ten threads: the lines come in any order (and may interleave).
    sent = re.findall(r"sent: welcome to [a-e]@example\.com", result.stdout)
    assert sorted(sent) == [
        "sent: welcome to a@example.com",
        "sent: welcome to b@example.com",
        "sent: welcome to c@example.com",
        "sent: welcome to d@example.com",
        "sent: welcome to e@example.com",
    ]
