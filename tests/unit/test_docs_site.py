"""The documentation site builds with warnings as errors, and its API page shows the whole
public API: every name a documented import path exports (``mkdocs.yml``, ``docs/api.md``).

A name missing from the page is easy to miss by eye: mkdocstrings leaves out, without a
warning, an exported function that a module of the same name shadows, and an attribute
without a docstring.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import sa_jobs
import sa_jobs.alembic_env
import sa_jobs.dashboard
import sa_jobs.errors
import sa_jobs.hooks
import sa_jobs.otel
import sa_jobs.prometheus
import sa_jobs.testing

REPO = Path(__file__).resolve().parents[2]

#: The documented import paths besides ``sa_jobs`` itself, each rendered on the page.
MODULES: tuple[ModuleType, ...] = (
    sa_jobs.hooks,
    sa_jobs.testing,
    sa_jobs.dashboard,
    sa_jobs.otel,
    sa_jobs.prometheus,
    sa_jobs.alembic_env,
)


@pytest.fixture(scope="module")
def api_page(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """The anchors of the built API page's headings (one per documented object)."""
    site = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    page = (site / "api.html").read_text()
    return set(re.findall(r'<h[1-6] id="([^"]+)"', page))


def test_every_name_sa_jobs_exports_is_on_the_api_page(api_page: set[str]) -> None:
    # A function shadowed by its module (sa_jobs.insert) is rendered from that module.
    missing = [
        name
        for name in sa_jobs.__all__
        if f"sa_jobs.{name}" not in api_page and f"sa_jobs.{name}.{name}" not in api_page
    ]
    assert missing == []


@pytest.mark.parametrize("module", MODULES, ids=lambda module: module.__name__)
def test_every_name_a_public_module_exports_is_on_the_api_page(
    api_page: set[str], module: ModuleType
) -> None:
    missing = [name for name in module.__all__ if f"{module.__name__}.{name}" not in api_page]
    assert missing == []


def test_every_error_class_is_on_the_api_page(api_page: set[str]) -> None:
    errors = [
        name
        for name, value in vars(sa_jobs.errors).items()
        if isinstance(value, type)
        and issubclass(value, sa_jobs.errors.SaJobsError)
        and value.__module__ == "sa_jobs.errors"
    ]
    assert len(errors) > 5
    assert [name for name in errors if f"sa_jobs.errors.{name}" not in api_page] == []
