"""``docs/getting-started.md`` followed alone, as a new user would: its python blocks, in
order, in a fresh process, against an empty database, install the schema, enqueue a job
and work it.

The page's URL is pointed at a throwaway database (created first, as the page's
``createdb`` line says); nothing else is changed or added.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from sa_jobs.devdb import Server, throwaway_database
from tests.helpers import url_text

REPO = Path(__file__).parents[2]
PAGE = REPO / "docs" / "getting-started.md"
PAGE_URL = "postgresql+psycopg://localhost/myapp"


def page_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", PAGE.read_text(), flags=re.DOTALL)


def test_the_page_creates_its_database_before_it_migrates() -> None:
    shell = "\n".join(page_blocks("bash"))
    assert "createdb myapp" in shell
    assert shell.index("createdb myapp") < shell.index("sa-jobs migrate")


@pytest.mark.slow
def test_the_getting_started_page_alone_runs_a_job(pg_server: Server, tmp_path: Path) -> None:
    code = "\n".join(page_blocks("python"))
    assert PAGE_URL in code
    assert "run_until_idle" in code, "the page stops before a worker runs the job"
    with throwaway_database(pg_server, prefix="sa_jobs_test_getting_started") as url:
        script = tmp_path / "getting_started.py"
        script.write_text(code.replace(PAGE_URL, url_text(url)))
        result = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "sending welcome to ada@example.com\n"
