"""The demo and every ``examples/*.py`` run, and print exactly what they always print.

Only the first line ("using ...", naming the server) differs between machines.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sa_jobs.cli import demo
from sa_jobs.devdb import Server
from tests.helpers import url_text

EXAMPLES = Path(__file__).parents[2] / "examples"

DEMO_OUTPUT = """\
schema installed (sa_jobs.migrate)
a rolled-back enqueue leaves 0 jobs
a committed transaction left 9 jobs:
  #2   demo_send_email    available to=ada@example.com
  #3   demo_send_email    available to=grace@example.com
  #4   demo_send_email    scheduled to=later@example.com
  #5   demo_send_email    available to=user0@example.com
  #6   demo_send_email    available to=user1@example.com
  #7   demo_send_email    available to=user2@example.com
  #8   demo_resize_image  available image=cat.png
  #9   demo_record_signup available email=ada@example.com
  #10  demo_flaky_report  available name=monthly
a worker worked everything due (Worker.run_until_idle):
  the sync handler sent 5 emails:
    ada@example.com (welcome)
    grace@example.com (reminder)
    user0@example.com (welcome)
    user1@example.com (welcome)
    user2@example.com (welcome)
  the async handler resized cat.png to 128 px
  the session handler wrote demo_signup ['ada@example.com'] in the transaction that completed its job
  the flaky report failed its first attempt and was retried at once
final state of every job:
  #2   demo_send_email    completed attempt 1/5
  #3   demo_send_email    completed attempt 1/5
  #4   demo_send_email    scheduled attempt 0/5
  #5   demo_send_email    completed attempt 1/5
  #6   demo_send_email    completed attempt 1/5
  #7   demo_send_email    completed attempt 1/5
  #8   demo_resize_image  completed attempt 1/25
  #9   demo_record_signup completed attempt 1/25
  #10  demo_flaky_report  completed attempt 2/3  (attempt 1 failed: RuntimeError: report 'monthly' is not ready yet)
the scheduled email stays scheduled: run_until_idle works only what is due now
"""  # noqa: E501

EXAMPLE_OUTPUTS = {
    "quickstart.py": """\
signed up 2 users: 2 users, 2 jobs
a failed transaction took its jobs with it: 2 users, 2 jobs
the worker sent:
  Welcome, ada@example.com!
  Welcome, grace@example.com!
user ada@example.com: welcomed=True
user grace@example.com: welcomed=True
job #1 send_welcome_email user_id=1: completed
job #2 send_welcome_email user_id=2: completed
""",
    "transactional_work.py": """\
3 invoices, each with a charge_invoice job
invoice 3 voided and its job cancelled in one transaction
invoice 1: paid, payments [100]
invoice 2: paid, payments [250]
invoice 3: void, payments []
job #1 invoice 1: completed, attempt 1/3 (no failures)
job #2 invoice 2: completed, attempt 2/3 (ConnectionError: the payment gateway timed out)
job #3 invoice 3: cancelled, attempt 0/3 (no failures)
""",
}


def test_the_demo_enqueues_works_and_reports_every_job(pg_server: Server) -> None:
    lines: list[str] = []

    demo.run(lines.append, server=pg_server)

    assert lines[0] == f"using {pg_server.source}"
    assert "\n".join(lines[1:]) + "\n" == DEMO_OUTPUT


def test_every_example_has_its_expected_output() -> None:
    assert sorted(path.name for path in EXAMPLES.glob("*.py")) == sorted(EXAMPLE_OUTPUTS)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXAMPLE_OUTPUTS))
def test_example_prints_what_it_always_prints(name: str, pg_server: Server) -> None:
    # The example makes its throwaway database on the server the tests use.
    env = {
        **os.environ,
        "SA_JOBS_DATABASE_URL": url_text(pg_server.url),
    }
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / name)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert result.returncode == 0, result.stderr
    first, _, rest = result.stdout.partition("\n")
    assert first.startswith("using $SA_JOBS_DATABASE_URL")
    assert rest == EXAMPLE_OUTPUTS[name]
