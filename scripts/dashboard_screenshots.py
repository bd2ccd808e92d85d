"""Screenshots of every dashboard page, for docs/dashboard.md (docs/img/dashboard-*.png).

Run it from the repository root after a change to the dashboard's look:

    .venv/bin/python scripts/dashboard_screenshots.py

It finds a PostgreSQL the way the tests do ($SA_JOBS_DATABASE_URL, the local server,
or an embedded one), makes a throwaway database, fills it with an hour of plausible
history (rows written directly, so the chart has something to show), lets a real
Worker fail a few jobs and hold one running, serves the dashboard with uvicorn on a free
port, and photographs each page with Playwright driving Debian's chromium. The database
is dropped at the end. Not part of the test suite: the pictures change with any styling.
"""

from __future__ import annotations

import datetime as dt
import random
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import uvicorn
from playwright.sync_api import sync_playwright
from sqlalchemy import Engine, create_engine, func, insert, select
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs.dashboard import create_app
from sa_jobs.devdb import find_server, throwaway_database
from sa_jobs._table.models import Job, PeriodicState, WorkerProcess

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "img"
CHROMIUM = "/usr/bin/chromium"


@sa_jobs.job_args(kind="send_email", queue="mail", max_attempts=3)
class SendEmail:
    to: str
    template: str = "welcome"


@sa_jobs.job_args(kind="resize_image", queue="media")
class ResizeImage:
    path: str
    width: int = 800


@sa_jobs.job_args(kind="sync_account", sequence=sa_jobs.SequenceOpts(by_args=True), max_attempts=1)
class SyncAccount:
    account_id: int = sa_jobs.field(sequence=True)
    full: bool = False


@sa_jobs.job_args(kind="charge_card", queue="billing", max_attempts=1)
class ChargeCard:
    invoice: str
    cents: int


@sa_jobs.job_args(kind="nightly_report", queue="default")
class NightlyReport:
    team: str = "ops"


@sa_jobs.job_args(kind="refresh_exchange_rates", queue="default")
class RefreshRates:
    source: str = "ecb"


PERIODIC = [
    sa_jobs.PeriodicJob("0 3 * * *", NightlyReport(), name="nightly_report", tz="Europe/Paris"),
    sa_jobs.PeriodicJob(
        dt.timedelta(minutes=15), RefreshRates(), name="refresh_exchange_rates", run_on_start=True
    ),
]

hold = threading.Event()


def send_email(job: sa_jobs.Job[SendEmail]) -> None:
    if job.args.to.endswith("@bounce.example"):
        raise ConnectionError(f"SMTP 550: mailbox {job.args.to} unavailable")


def resize_image(job: sa_jobs.Job[ResizeImage]) -> None:
    hold.wait(60)  # stays running while the pictures are taken


def sync_account(job: sa_jobs.Job[SyncAccount]) -> None:
    if job.args.account_id == 42:
        raise RuntimeError("upstream API answered 503 for account 42")


def charge_card(job: sa_jobs.Job[ChargeCard]) -> None:
    if job.args.cents > 100_000:
        raise ValueError(f"amount {job.args.cents} exceeds the card's limit")


def seed_history(engine: Engine) -> None:
    """An hour of finished jobs, written directly with spread-out timestamps."""
    rng = random.Random(17)
    with engine.begin() as connection:
        now = connection.scalar(select(func.now()))
        assert now is not None
        rows: list[dict[str, Any]] = []
        for minute in range(60):
            busy = 30 + int(25 * (1 + (minute % 20) / 10)) + rng.randint(0, 15)
            for _ in range(busy):
                finished = now - dt.timedelta(minutes=minute, seconds=rng.uniform(0, 59))
                wait = rng.uniform(0.02, 0.4) * (3 if 20 <= minute <= 26 else 1)
                run = rng.uniform(0.01, 0.3)
                started = finished - dt.timedelta(seconds=run)
                failed = rng.random() < 0.02
                rows.append(
                    {
                        "kind": rng.choice(["send_email", "resize_image", "charge_card"]),
                        "args_json": {"seeded": True},
                        "queue": rng.choice(["mail", "media", "billing", "default"]),
                        "state": "discarded" if failed else "completed",
                        "attempt": 1,
                        "scheduled_at": started - dt.timedelta(seconds=wait),
                        "created_at": started - dt.timedelta(seconds=wait),
                        "attempted_at": started,
                        "attempted_by": ["web-1.a1b2c3"],
                        "finalized_at": finished,
                        "errors": [{"attempt": 1, "error": "TimeoutError: upstream"}]
                        if failed
                        else [],
                    }
                )
        connection.execute(insert(Job), rows)


def seed_live(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        sa_jobs.insert_many(
            session,
            [SendEmail(f"user{n}@example.com") for n in range(6)]
            + [SendEmail("old-address@bounce.example", template="receipt")]
            + [SyncAccount(42), SyncAccount(42, full=True), SyncAccount(42), SyncAccount(7)]
            + [ResizeImage("uploads/cat.jpg", 1200)],
        )
        # Unique per invoice and one at a time per customer: the job page shows both keys.
        for invoice, cents in (("INV-2041", 2_500), ("INV-2042", 250_000)):
            sa_jobs.insert(
                session,
                ChargeCard(invoice, cents),
                unique=sa_jobs.UniqueOpts(by_args=True),
                sequence=sa_jobs.SequenceOpts(),
            )
        # A job key (it cannot be combined with unique or sequence options).
        sa_jobs.insert(
            session,
            SendEmail("ops@example.com", template="daily-digest"),
            job_key="digest:ops",
            scheduled_at=dt.datetime.now(dt.UTC) + dt.timedelta(hours=1),
        )
        sa_jobs.insert(
            session,
            SendEmail("later@example.com", template="reminder"),
            scheduled_at=dt.datetime.now(dt.UTC) + dt.timedelta(hours=3),
            tags=["reminder"],
        )
        # A queue no worker serves (the overview highlights it): its jobs wait for good.
        sa_jobs.insert_many(
            session,
            [ResizeImage(f"exports/page-{n}.png") for n in range(4)],
            queue="exports",
            scheduled_at=dt.datetime.now(dt.UTC) - dt.timedelta(minutes=12),
        )


def seed_periodic(engine: Engine) -> None:
    """A periodic job no running worker has any more, with a run requested that waits."""
    with engine.begin() as connection:
        connection.execute(
            insert(PeriodicState).values(
                name="purge_sessions",
                schedule="every 3600s",
                next_run_at=func.now() - dt.timedelta(hours=30),
                last_run_at=func.now() - dt.timedelta(hours=31),
                seen_at=func.now() - dt.timedelta(hours=30, minutes=20),
                run_now_requested_at=func.now() - dt.timedelta(minutes=4),
            )
        )


def seed_gone_worker(engine: Engine) -> None:
    """A worker that stopped heartbeating an hour ago (its row stays a day), with a job it
    started moments ago: the Workers page shows it gone and the job an orphan (the
    rescuer leaves the job until it has been running for rescue_after)."""
    with engine.begin() as connection:
        connection.execute(
            insert(WorkerProcess).values(
                id="web-2.d4e5f6",
                hostname="web-2",
                pid=4242,
                queues=["mail", "billing"],
                started_at=func.now() - dt.timedelta(hours=5),
                heartbeat_at=func.now() - dt.timedelta(hours=1),
            )
        )
        connection.execute(
            insert(Job).values(
                kind="send_email",
                args_json={"to": "stuck@example.com", "template": "welcome"},
                queue="mail",
                state="running",
                attempt=1,
                attempted_at=func.now(),
                attempted_by=["web-2.d4e5f6"],
            )
        )


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def main() -> int:
    server = find_server()
    try:
        with throwaway_database(server, "sa_jobs_shots") as url:
            engine = create_engine(url, pool_size=10)
            try:
                sa_jobs.migrate(engine)
                seed_history(engine)
                seed_live(engine)
                seed_periodic(engine)
                seed_gone_worker(engine)
                shoot(engine)
            finally:
                engine.dispose()
    finally:
        server.stop()
    return 0


def shoot(engine: Engine) -> None:
    worker = sa_jobs.Worker(
        engine,
        queues={"default": 2, "mail": 2, "media": 1, "billing": 1},
        poll_interval=0.1,
        periodic=PERIODIC,
    )
    worker.handler(SendEmail)(send_email)
    worker.handler(ResizeImage)(resize_image)
    worker.handler(SyncAccount)(sync_account)
    worker.handler(ChargeCard)(charge_card)
    worker.handler(NightlyReport)(lambda job: None)
    worker.handler(RefreshRates)(lambda job: None)
    worker.start()
    port = free_port()
    web = uvicorn.Server(
        uvicorn.Config(create_app(engine), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=web.run, daemon=True)
    thread.start()
    try:
        time.sleep(3)  # the worker works what is due; the image job stays running
        with Session(engine) as session, session.begin():
            # A paused queue, as the overview shows it (its new job waits; the running
            # one goes on).
            sa_jobs.pause_queue(session, "media")
            sa_jobs.insert(session, ResizeImage("uploads/dog.jpg"))
        base = f"http://127.0.0.1:{port}"
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM)
            page = browser.new_page(viewport={"width": 1280, "height": 820})
            with Session(engine) as session:
                failed = session.scalar(
                    select(Job.id).where(Job.args_json["invoice"].astext == "INV-2042")
                )
                keyed = session.scalar(
                    select(Job.id).where(Job.args_json["template"].astext == "daily-digest")
                )
            for name, path in pages(failed):
                page.goto(base + path)
                # The jobs list is as tall as its 50 rows: its first screen says enough.
                full = name != "jobs"
                page.screenshot(path=str(OUT / f"dashboard-{name}.png"), full_page=full)
                print(f"docs/img/dashboard-{name}.png  {path}")
            page.goto(f"{base}/jobs/{keyed}")
            page.locator("table.fields").screenshot(path=str(OUT / "dashboard-job-key.png"))
            print(f"docs/img/dashboard-job-key.png  /jobs/{keyed} (its fields)")
            # A bulk action's confirmation: tick the newest jobs (one running), press Delete.
            page.goto(base + "/jobs")
            for box in page.locator('input[name="id"]').all()[:6]:
                box.check()
            page.get_by_role("button", name="Delete…").click()
            page.screenshot(path=str(OUT / "dashboard-confirm.png"), full_page=True)
            print("docs/img/dashboard-confirm.png  (delete the ticked jobs)")
            browser.close()
    finally:
        hold.set()
        web.should_exit = True
        thread.join(10)
        worker.stop(cancel=True)
    return None


def pages(failed_job: int | None) -> list[tuple[str, str]]:
    return [
        ("overview", "/"),
        ("jobs", "/jobs"),
        ("jobs-filtered", "/jobs?state=discarded&q=INV"),
        ("job", f"/jobs/{failed_job}"),
        ("sequences", "/sequences"),
        ("periodic", "/periodic"),
        ("workers", "/workers"),
    ]


if __name__ == "__main__":
    sys.exit(main())
