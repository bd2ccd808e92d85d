"""A failed assertion of the testing helpers shows the test's line and the message, not
sa_jobs' internals: pytest runs in a child process on a user's test file, as in
``test_testing_plugin.py``, and its report is read."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sa_jobs.devdb import Server
from tests.integration.test_testing_plugin import run_pytest

pytestmark = pytest.mark.slow

USER_TESTS = """
import asyncio

from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

import sa_jobs
from sa_jobs.testing import assert_enqueued, assert_not_enqueued


@sa_jobs.job_args(kind="tracebacks_welcome")
class SendWelcome:
    email: str


def test_assert_enqueued(sa_jobs_session):
    sa_jobs_session.add(sa_jobs.enqueue(SendWelcome("bob@example.com")))
    assert_enqueued(sa_jobs_session, SendWelcome, email="ada@example.com")


def test_assert_not_enqueued(sa_jobs_session):
    sa_jobs_session.add(sa_jobs.enqueue(SendWelcome("bob@example.com")))
    assert_not_enqueued(sa_jobs_session, SendWelcome)


def test_tester_assert_enqueued(sa_jobs_tester):
    sa_jobs_tester.assert_enqueued(SendWelcome, email="ada@example.com")


def test_tester_assert_not_enqueued(sa_jobs_tester):
    sa_jobs_tester.session.add(sa_jobs.enqueue(SendWelcome("bob@example.com")))
    sa_jobs_tester.assert_not_enqueued(SendWelcome)


def test_async_assert_enqueued(sa_jobs_engine):
    async def check():
        engine = create_async_engine(sa_jobs_engine.url.set(drivername="postgresql+psycopg"))
        try:
            async with AsyncSession(engine) as session:
                await assert_enqueued(session, SendWelcome, email="ada@example.com")
        finally:
            await engine.dispose()

    asyncio.run(check())
"""


def sections(output: str) -> dict[str, str]:
    """Each failed test's report, by test name."""
    found = re.split(r"^_{3,} (test_\w+) _{3,}$", output, flags=re.MULTILINE)
    reports = dict(zip(found[1::2], found[2::2], strict=True))
    last = next(reversed(reports))
    reports[last] = reports[last].split("=====")[0]
    return reports


def test_a_failed_assertion_shows_the_tests_line_and_the_message_only(
    tmp_path: Path, pg_server: Server
) -> None:
    (tmp_path / "test_user.py").write_text(USER_TESTS)

    result = run_pytest(tmp_path, pg_server, "test_user.py")

    reports = sections(result.stdout)
    assert len(reports) == 5, result.stdout + result.stderr
    for name, report in reports.items():
        frames = re.findall(r"^(\S+\.py):\d+: ", report, flags=re.MULTILINE)
        assert all(frame.endswith("test_user.py") or "asyncio" in frame for frame in frames), (
            name,
            report,
        )
        assert re.search(r"^E\s+AssertionError: expected (a|no) job of kind", report, re.M), (
            name,
            report,
        )
        # The test's own lines, the message and the asyncio runner's frames for the async
        # one; before, some 70 lines of sa_jobs internals came first.
        limit = 35 if "async" in name else 15
        assert len(report.strip().splitlines()) <= limit, (name, report)
