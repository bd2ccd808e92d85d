"""The dashboard as a person uses it: Debian's chromium, driven by Playwright, against a
real uvicorn server, the real database and a real worker."""

from __future__ import annotations

import datetime as dt
import re
import threading
import time
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import JobState
from sa_jobs.dashboard import create_app
from tests.dashboard import chromium, serving
from tests.factories import job_row, make_job
from tests.helpers import (
    add_job,
    fast_maintenance,
    make_worker,
    running,
    wait_for_state,
    wait_until,
)

pytestmark = pytest.mark.slow


@sa_jobs.job_args(kind="dashboard_browser_job", max_attempts=1)
class Flaky:
    label: str = ""


#: While set, Flaky's handler fails.
broken = threading.Event()


def flaky(job: sa_jobs.Job[Flaky]) -> None:
    if broken.is_set():
        raise ValueError(f"{job.args.label} is broken <today>")


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    path = chromium()
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=path)
        yield launched
        launched.close()


@pytest.fixture
def base_url(engine: Engine, no_workers_or_leader: None) -> Iterator[str]:
    with serving(create_app(engine)) as url:
        yield url


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context()
    context.set_default_timeout(10_000)
    page = context.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    page.dialogs = dialogs  # type: ignore[attr-defined]
    yield page
    context.close()


def test_find_a_failed_job_retry_it_and_see_a_worker_complete_it(
    engine: Engine, base_url: str, page: Page
) -> None:
    worker = make_worker(engine, queues={"default": 2})
    worker.handler(Flaky)(flaky)
    make_job(engine, kind="other_kind", state=JobState.COMPLETED)
    broken.set()
    try:
        with running(worker):
            job_id = add_job(engine, Flaky("printer"))
            wait_for_state(engine, job_id, JobState.DISCARDED)
            broken.clear()

            page.goto(base_url + "/")
            expect(page.get_by_role("heading", name="Overview")).to_be_visible()
            expect(page.locator("svg.chart")).to_be_visible()

            page.get_by_role("link", name="Jobs", exact=True).click()
            page.get_by_label("State").select_option("discarded")
            page.get_by_label("Kind").fill("dashboard_browser_job")
            page.get_by_role("button", name="Filter").click()
            rows = page.locator("table.jobs tbody tr")
            expect(rows).to_have_count(1)
            expect(rows.first).to_contain_text("printer is broken <today>")

            page.get_by_role("link", name=str(job_id), exact=True).click()
            expect(page.get_by_role("heading", level=1)).to_contain_text(f"Job {job_id}")
            expect(page.locator(".error-record")).to_contain_text(
                "ValueError: printer is broken <today>"
            )
            expect(page.locator("pre.trace")).to_contain_text("Traceback (most recent call last)")

            page.get_by_role("button", name="Retry").click()
            expect(page.get_by_role("status")).to_contain_text("Retried")
            wait_for_state(engine, job_id, JobState.COMPLETED)
            page.reload()
            expect(page.locator("h1 .state")).to_have_text("completed")
    finally:
        broken.clear()
    assert job_row(engine, job_id).attempt == 2


@sa_jobs.job_args(kind="dashboard_browser_report")
class Report:
    label: str = ""


def job_ids(engine: Engine, kind: str) -> list[int]:
    with Session(engine) as session:
        found = session.scalars(
            select(sa_jobs.Job.id).where(sa_jobs.Job.kind == kind).order_by(sa_jobs.Job.id)
        )
        return list(found)


def periodic_job_ids(engine: Engine, name: str) -> list[int]:
    with Session(engine) as session:
        jobs = session.scalars(select(sa_jobs.Job).order_by(sa_jobs.Job.id)).all()
        return [job.id for job in jobs if job.metadata_.get("periodic", {}).get("name") == name]


def test_run_a_periodic_job_now_and_see_a_worker_complete_it(
    engine: Engine, base_url: str, page: Page
) -> None:
    done: list[str] = []
    worker = make_worker(
        engine,
        # Hourly: no scheduled instant comes during the test, only the requested run.
        periodic=[sa_jobs.PeriodicJob(dt.timedelta(hours=1), Report("hourly"), name="hourly")],
        maintenance=fast_maintenance(periodic_interval=0.1),
    )
    worker.handler(Report)(lambda job: done.append(job.args.label))
    with running(worker):
        page.goto(base_url + "/")
        page.get_by_role("link", name="Periodic", exact=True).click()
        expect(page.get_by_role("heading", level=1)).to_have_text("Periodic jobs")
        row = page.locator("table.periodic tbody tr", has_text="hourly")
        expect(row).to_contain_text("every")
        expect(row).to_contain_text("in 60 min")  # the first instant, an hour away
        assert periodic_job_ids(engine, "hourly") == []

        row.get_by_role("button", name="Run now").click()
        expect(page.get_by_role("status")).to_contain_text("Run requested")
        (job_id,) = wait_until(
            lambda: periodic_job_ids(engine, "hourly"), timeout=10, what="the requested run"
        )
        completed = wait_for_state(engine, job_id, JobState.COMPLETED)
        assert completed.metadata_["periodic"]["run_now"] is True
        page.reload()
        expect(row.get_by_role("link", name=str(job_id))).to_be_visible()
        expect(row.locator(".state")).to_have_text("completed")
        expect(row).not_to_contain_text("pending")
        expect(row.get_by_role("button", name="Run now")).to_be_visible()
    assert done == ["hourly"]
    assert len(periodic_job_ids(engine, "hourly")) == 1  # the schedule itself did not fire


@sa_jobs.job_args(kind="dashboard_browser_task")
class Task:
    n: int = 0


def test_pause_a_queue_and_see_the_worker_stop_taking_from_it(
    engine: Engine, base_url: str, page: Page
) -> None:
    worker = make_worker(engine, queues={"alpha": 2, "beta": 2})
    worker.handler(Task)(lambda job: None)
    with running(worker):
        page.goto(base_url + "/")
        alpha = page.locator("table.queues tbody tr", has_text="alpha")
        # Listed though it has no jobs yet: one worker serves it.
        expect(alpha.locator("td.workers")).to_have_text("1")
        alpha.get_by_role("button", name="Pause").click()
        expect(page.get_by_role("status")).to_contain_text("Queue paused")
        expect(alpha.locator(".badge")).to_have_text("paused")

        paused = [add_job(engine, Task(n), queue="alpha") for n in range(3)]
        served = [add_job(engine, Task(n), queue="beta") for n in range(3)]
        for job_id in served:
            wait_for_state(engine, job_id, JobState.COMPLETED)
        time.sleep(0.5)  # ten of the worker's polls
        assert [job_row(engine, job_id).state for job_id in paused] == [JobState.AVAILABLE] * 3

        page.reload()
        expect(alpha.locator('a[href*="state=available"]')).to_have_text("3")  # waiting
        alpha.get_by_role("button", name="Resume").click()
        expect(page.get_by_role("status")).to_contain_text("Queue resumed")
        for job_id in paused:
            wait_for_state(engine, job_id, JobState.COMPLETED)
        page.reload()
        expect(alpha.locator(".badge")).to_have_count(0)


def test_tick_failed_jobs_confirm_and_retry_them_then_delete_one(
    engine: Engine, base_url: str, page: Page
) -> None:
    failed = [
        make_job(engine, kind="dashboard_bulk", state=JobState.DISCARDED, args={"n": n})
        for n in range(3)
    ]
    page.goto(f"{base_url}/jobs?kind=dashboard_bulk")
    for job_id in failed[:2]:
        page.get_by_label(f"select job {job_id}").check()
    page.get_by_role("button", name="Retry…").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Retry 2 of the 2 ticked jobs?")
    assert job_row(engine, failed[0]).state is JobState.DISCARDED  # asked, not done
    page.get_by_role("button", name="Retry 2 jobs").click()
    expect(page.get_by_role("status")).to_have_text("Retried 2 jobs.")
    assert [job_row(engine, job_id).state for job_id in failed] == [
        JobState.AVAILABLE,
        JobState.AVAILABLE,
        JobState.DISCARDED,
    ]

    page.get_by_role("link", name=str(failed[2]), exact=True).click()
    page.get_by_role("button", name="Delete…").click()
    expect(page.get_by_role("heading", level=1)).to_have_text(f"Delete job {failed[2]}?")
    page.get_by_role("button", name=f"Delete job {failed[2]}").click()
    expect(page.get_by_role("status")).to_have_text("Deleted.")
    # An exact link name: a substring check on an id matches "753 ms ago" too.
    expect(page.get_by_role("link", name=str(failed[2]), exact=True)).to_have_count(0)
    expect(page.get_by_role("link", name=str(failed[1]), exact=True)).to_have_count(1)
    assert job_ids(engine, "dashboard_bulk") == failed[:2]
    assert page.dialogs == []  # type: ignore[attr-defined]


def test_a_job_whose_args_hold_a_script_shows_it_as_text(
    engine: Engine, base_url: str, page: Page
) -> None:
    script = "<script>alert('args')</script>"
    job_id = make_job(
        engine,
        kind="dashboard_xss",
        args={"note": script},
        state=JobState.DISCARDED,
        errors=[{"attempt": 1, "error": "<img src=x onerror=alert('error')>", "trace": script}],
    )
    page.goto(f"{base_url}/jobs/{job_id}")
    expect(page.locator("pre.json").first).to_contain_text(script)
    expect(page.locator(".error-record")).to_contain_text("<img src=x onerror=alert('error')>")
    page.goto(f"{base_url}/jobs?q=script")
    expect(page.locator("table.jobs")).to_contain_text(script)
    assert page.evaluate("document.querySelectorAll('img').length") == 0
    assert page.dialogs == []  # type: ignore[attr-defined]


def test_reading_works_without_javascript(engine: Engine, base_url: str, browser: Browser) -> None:
    job_id = make_job(engine, kind="dashboard_nojs", args={"n": 1}, state=JobState.RETRYABLE)
    context = browser.new_context(java_script_enabled=False)
    try:
        page = context.new_page()
        page.goto(base_url + "/")
        page.get_by_role("link", name="Jobs", exact=True).click()
        page.get_by_label("State").select_option("retryable")
        page.get_by_role("button", name="Filter").click()
        page.get_by_role("link", name=str(job_id), exact=True).click()
        expect(page.locator("h1")).to_contain_text("dashboard_nojs")
        for name in ("Sequences", "Periodic", "Workers"):
            page.get_by_role("link", name=name, exact=True).click()
            expect(page.get_by_role("heading", level=1)).to_be_visible()
    finally:
        context.close()


# ---------------------------------------------------------------------- issue 22: reading it


@sa_jobs.job_args(kind="dashboard_browser_hold")
class Hold:
    n: int = 0


#: Set to let Hold's handler return.
released = threading.Event()


def test_each_list_says_when_its_jobs_run_and_offers_only_what_applies(
    engine: Engine, base_url: str, page: Page
) -> None:
    worker = make_worker(engine, queues={"default": 1})
    worker.handler(Hold)(lambda job: released.wait(10))
    retrying = make_job(
        engine,
        state=JobState.RETRYABLE,
        attempt=1,
        scheduled_at=dt.timedelta(minutes=3, seconds=20),
    )
    done = make_job(
        engine,
        kind="dashboard_browser_done",
        state=JobState.COMPLETED,
        attempt=1,
        attempted_at=dt.timedelta(minutes=-2, seconds=-6),
        finalized_at=dt.timedelta(minutes=-2),
    )
    released.clear()
    try:
        with running(worker):
            held = add_job(engine, Hold(1))
            runner = wait_for_state(engine, held, JobState.RUNNING).attempted_by
            assert runner

            page.goto(base_url + "/jobs")
            tabs = page.get_by_role("navigation", name="Job counts")
            expect(tabs.get_by_role("link", name="running 1", exact=True)).to_be_visible()
            expect(tabs.get_by_role("link", name="retryable 1", exact=True)).to_be_visible()
            expect(tabs.get_by_role("link", name="all 3", exact=True)).to_be_visible()
            # The filters suggest the names they know (a datalist: no script needed).
            expect(page.get_by_label("Kind")).to_have_attribute("list", "known-kinds")
            expect(
                page.locator('#known-kinds option[value="dashboard_browser_done"]')
            ).to_have_count(1)
            expect(page.locator('#known-queues option[value="default"]')).to_have_count(1)

            tabs.get_by_role("link", name="running 1", exact=True).click()
            row = page.locator("table.jobs tbody tr", has_text="dashboard_browser_hold")
            expect(row.locator("td.worker")).to_have_text(runner[-1])
            expect(row.locator("td.running-for")).to_have_text(re.compile(r"^\d+(\.\d)? (ms|s)$"))
            # Running jobs are neither deleted nor retried: no button that would say 400.
            expect(page.get_by_role("button", name="Cancel all…")).to_be_visible()
            for refused in ("Delete all…", "Retry all…", "Delete…", "Retry…"):
                expect(page.get_by_role("button", name=refused, exact=True)).to_have_count(0)
            expect(page.locator(".not-offered")).to_contain_text("cancel them first")

            tabs.get_by_role("link", name="retryable 1", exact=True).click()
            expect(page.get_by_role("columnheader", name="next attempt")).to_be_visible()
            cell = page.locator(
                "table.jobs tbody tr", has=page.get_by_role("link", name=str(retrying), exact=True)
            ).locator("td.next-attempt")
            expect(cell).to_have_text("in 3 min")
            expect(cell).to_have_attribute(
                "title", re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$")
            )

            tabs.get_by_role("link", name="completed 1", exact=True).click()
            row = page.locator(
                "table.jobs tbody tr", has=page.get_by_role("link", name=str(done), exact=True)
            )
            expect(row.locator("td.finished")).to_have_text("2 min ago")
            expect(row.locator("td.duration")).to_have_text("6.0 s")
            expect(page.get_by_role("button", name="Cancel all…")).to_have_count(0)
            released.set()
            wait_for_state(engine, held, JobState.COMPLETED)
    finally:
        released.set()


@sa_jobs.job_args(
    kind="dashboard_browser_customer",
    sequence=sa_jobs.SequenceOpts(by_args=True),
    max_attempts=1,
)
class CustomerSync:
    customer_id: int = sa_jobs.field(sequence=True)
    full: bool = False


def test_a_halted_sequence_reads_as_its_customer_and_its_error_as_minutes_ago(
    engine: Engine, base_url: str, page: Page
) -> None:
    worker = make_worker(engine)

    @worker.handler(CustomerSync)
    def sync(job: sa_jobs.Job[CustomerSync]) -> None:
        raise RuntimeError(f"upstream refused customer {job.args.customer_id}")

    first = add_job(engine, CustomerSync(42))
    add_job(engine, CustomerSync(42, full=True))  # waits behind the first
    with running(worker):
        wait_for_state(engine, first, JobState.DISCARDED)
    key = job_row(engine, first).sequence_key
    assert key is not None

    page.goto(base_url + "/sequences")
    row = page.locator("tbody tr", has_text="dashboard_browser_customer")
    expect(row.locator(".sequence-parts")).to_have_text(
        re.compile(r"customer_id=42\s+kind\s+dashboard_browser_customer")
    )
    expect(row.locator(".sequence-parts")).to_have_attribute("title", f"sequence key {key.hex()}")
    expect(row).not_to_contain_text(key.hex()[:16])

    row.get_by_role("link", name=str(first), exact=True).click()
    fields = page.locator("table.fields")
    expect(fields).to_contain_text("customer_id=42")
    expect(fields).not_to_contain_text(key.hex())
    expect(fields).not_to_contain_text("full=")
    at = page.locator(".error-record .error-at")
    expect(at).to_have_text(re.compile(r"^\d+(\.\d)? (ms|s) ago$"))
    expect(at).to_have_attribute("title", re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$"))


@sa_jobs.job_args(kind="dashboard_browser_mail", queue="mail")
class Mail:
    to: str = ""


def test_the_overview_points_at_a_queue_no_worker_serves_until_one_does(
    engine: Engine, base_url: str, page: Page
) -> None:
    default_only = make_worker(engine)  # Worker(engine) serves "default" alone
    default_only.handler(Mail)(lambda job: None)
    with running(default_only):
        job_id = add_job(engine, Mail("ops@example.com"))  # its kind's queue: mail
        page.goto(base_url + "/")
        alert = page.locator("#unserved")
        expect(alert).to_be_visible()
        expect(alert).to_contain_text("mail: 1 available")
        expect(alert).to_contain_text("0 workers")
        expect(alert).to_contain_text("-q mail=N")
        mail = page.locator("table.queues tbody tr", has_text="mail")
        expect(mail.locator(".badge")).to_have_text("no worker")
        expect(
            page.locator("table.queues tbody tr", has_text="default").locator(".badge")
        ).to_have_count(0)

        serving_mail = make_worker(engine, queues={"mail": 1})
        serving_mail.handler(Mail)(lambda job: None)
        with running(serving_mail):
            wait_for_state(engine, job_id, JobState.COMPLETED)
            page.reload()
            expect(page.locator("#unserved")).to_have_count(0)
            expect(mail.locator("td.workers")).to_have_text("1")


@sa_jobs.job_args(kind="dashboard_browser_step")
class BrowserStep:
    n: int = 0


def test_see_a_workflow_drawn_follow_a_step_and_cancel_the_workflow(
    engine: Engine, base_url: str, page: Page
) -> None:
    wf = sa_jobs.Workflow("nightly report")
    fetch = wf.add(BrowserStep(1), name="fetch")
    left = wf.add(BrowserStep(2), name="left", after=[fetch])
    right = wf.add(BrowserStep(3), name="right", after=[fetch])
    wf.add(BrowserStep(4), name="merge", after=[left, right])
    with Session(engine) as session, session.begin():
        inserted = sa_jobs.insert_workflow(session, wf)

    page.goto(base_url + "/")
    page.get_by_role("link", name="Workflows", exact=True).click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Workflows")
    row = page.locator("table.workflows tbody tr", has_text="nightly report")
    row.get_by_role("link", name=str(inserted.id), exact=True).click()
    expect(page.get_by_role("heading", level=1)).to_contain_text(f"Workflow {inserted.id}")
    graph = page.locator(".wf-graph svg")
    expect(graph).to_be_visible()
    expect(graph.locator("a.wf-node")).to_have_count(4)
    expect(graph.locator("path.wf-edge")).to_have_count(4)
    # A node is a link to its step's job page, which links back to the workflow.
    graph.locator("a.wf-node", has_text="merge").click()
    expect(page.get_by_role("heading", level=1)).to_contain_text(f"Job {inserted.jobs['merge']}")
    expect(page.locator("table.workflow-place")).to_contain_text("left")
    page.locator("table.workflow-place").get_by_role("link", name="nightly report").click()

    page.get_by_role("button", name="Cancel workflow…").click()
    expect(page.get_by_role("heading", level=1)).to_contain_text("Cancel workflow")
    page.get_by_role("button", name=f"Cancel workflow {inserted.id}").click()
    expect(page.get_by_role("status")).to_contain_text("Workflow cancelled: 4 jobs")
    expect(page.locator(".wf-graph a.wf-node.node-cancelled")).to_have_count(4)
    with engine.connect() as connection:
        states = connection.execute(
            select(sa_jobs.Job.state).where(sa_jobs.Job.id.in_(inserted.jobs.values()))
        ).scalars()
        assert set(states) == {JobState.CANCELLED}
