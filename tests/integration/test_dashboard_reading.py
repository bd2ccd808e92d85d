"""The dashboard as an operator used to Sidekiq, Oban Web or River UI reads it (issue 22):
when each listed job runs next, has run for or finished; sequence keys as the args that
make them; the filters' known names and the state tabs' counts; bulk buttons only where
they apply; and queues no worker serves, highlighted on the overview."""

from __future__ import annotations

import datetime as dt
import html
import re
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, insert, update
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import JobState
from sa_jobs._declare.args import KindRegistry
from sa_jobs._declare.unique_sequence_keys import canonical_bytes, key_digest
from sa_jobs._table.models import Job
from sa_jobs._table.service_tables import WorkerProcess
from sa_jobs.dashboard import create_app, list_choices, sequence_keys
from sa_jobs.dashboard.sequence_keys import SequenceKeys, SequenceParts
from tests.dashboard import DashboardClient
from tests.factories import make_job, make_worker_row


@pytest.fixture
def client(engine: Engine, no_workers_or_leader: None) -> Iterator[DashboardClient]:
    with DashboardClient(create_app(engine)) as client:
        yield client


def cells(page: str, job_id: int) -> dict[str, str]:
    """The cells of job ``job_id``'s row in the jobs table, by class, as text."""
    row = re.search(
        rf'<tr>\s*(?:<td><input[^>]*></td>\s*)?<td><a href="/jobs/{job_id}">.*?</tr>', page, re.S
    )
    assert row is not None, page
    return {
        name: html.unescape(re.sub(r"<[^>]+>", "", text)).strip()
        for name, text in re.findall(r'<td class="([\w-]+)"[^>]*>(.*?)</td>', row.group(0), re.S)
    }


def titles(page: str, job_id: int) -> dict[str, str]:
    row = re.search(rf'<td><a href="/jobs/{job_id}">.*?</tr>', page, re.S)
    assert row is not None
    return dict(re.findall(r'<td class="([\w-]+)" title="([^"]*)"', row.group(0)))


def created_ago(engine: Engine, job_id: int, age: dt.timedelta) -> None:
    with engine.begin() as connection:
        connection.execute(
            update(Job).where(Job.id == job_id).values(created_at=Job.created_at - age)
        )


# ---------------------------------------------------------------------- when


def test_retryable_and_scheduled_lists_say_when_the_next_attempt_runs(
    client: DashboardClient, engine: Engine
) -> None:
    retrying = make_job(
        engine,
        state=JobState.RETRYABLE,
        attempt=1,
        scheduled_at=dt.timedelta(minutes=3, seconds=20),
    )
    later = make_job(engine, state=JobState.SCHEDULED, scheduled_at=dt.timedelta(hours=2))
    created_ago(engine, retrying, dt.timedelta(minutes=13))
    page = client.get("/jobs?state=retryable").text
    assert "<th>next attempt</th>" in page and "<th>created</th>" not in page
    assert cells(page, retrying)["next-attempt"] == "in 3 min"
    assert titles(page, retrying)["next-attempt"].endswith(" UTC")
    assert "13 min ago" not in page
    assert cells(client.get("/jobs?state=scheduled").text, later)["next-attempt"] == "in 2.0 h"


def test_the_running_list_says_for_how_long_and_on_which_worker(
    client: DashboardClient, engine: Engine
) -> None:
    job_id = make_job(
        engine,
        state=JobState.RUNNING,
        attempt=2,
        attempted_at=dt.timedelta(seconds=-5),
        attempted_by=["web-1.aaa", "web-2.bbb"],
    )
    created_ago(engine, job_id, dt.timedelta(minutes=13))
    page = client.get("/jobs?state=running").text
    found = cells(page, job_id)
    assert re.fullmatch(r"[5-9]\.\d s", found["running-for"]), found  # not "13 min"
    assert found["worker"] == "web-2.bbb"  # the last attempt's
    assert titles(page, job_id)["running-for"].startswith("started ")
    assert "13 min" not in page


def test_finished_lists_say_when_and_how_long_the_run_took(
    client: DashboardClient, engine: Engine
) -> None:
    completed = make_job(
        engine,
        state=JobState.COMPLETED,
        attempt=1,
        attempted_at=dt.timedelta(minutes=-5, seconds=-6),
        finalized_at=dt.timedelta(minutes=-5),
    )
    never_ran = make_job(engine, state=JobState.CANCELLED)
    # Failed after 2 s, waited to retry, then cancelled an hour later: it ran for 2 s.
    failed_then_cancelled = make_job(
        engine,
        state=JobState.CANCELLED,
        attempt=1,
        attempted_at=dt.timedelta(hours=-2),
        finalized_at=dt.timedelta(hours=-1),
    )
    with engine.begin() as connection:
        connection.execute(
            update(Job)
            .where(Job.id == failed_then_cancelled)
            .values(
                errors=[
                    {
                        "attempt": 1,
                        "error": "ValueError: no",
                        "at": (
                            dt.datetime.now(dt.UTC)
                            - dt.timedelta(hours=2)
                            + dt.timedelta(seconds=2)
                        ).isoformat(),
                    }
                ]
            )
        )
    page = client.get("/jobs?state=completed").text
    assert "<th>finished</th><th>duration</th>" in page
    assert cells(page, completed)["finished"] == "5 min ago"
    assert cells(page, completed)["duration"] == "6.0 s"
    cancelled = client.get("/jobs?state=cancelled").text
    assert cells(cancelled, never_ran)["duration"] == "—"
    assert re.fullmatch(r"2\.\d s", cells(cancelled, failed_then_cancelled)["duration"])


def test_a_list_of_every_state_says_what_each_job_is_doing(
    client: DashboardClient, engine: Engine
) -> None:
    running = make_job(engine, state=JobState.RUNNING, attempted_by=["web-3.ccc"])
    retrying = make_job(engine, state=JobState.RETRYABLE, scheduled_at=dt.timedelta(minutes=10))
    done = make_job(
        engine,
        state=JobState.DISCARDED,
        attempted_at=dt.timedelta(seconds=-3),
        finalized_at=dt.timedelta(0),
    )
    page = client.get("/jobs").text
    assert re.fullmatch(r"running for \S+ \S+ on web-3\.ccc", cells(page, running)["when"])
    assert re.fullmatch(r"next attempt in (9|10) min", cells(page, retrying)["when"])
    assert re.fullmatch(r"finished \S+ \S+ ago, ran 3\.0 s", cells(page, done)["when"])


def test_error_times_on_the_job_page_are_humanised_with_the_exact_time_on_hover(
    client: DashboardClient, engine: Engine
) -> None:
    at = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=7)
    job_id = make_job(
        engine,
        state=JobState.RETRYABLE,
        errors=[
            {"attempt": 1, "error": "ValueError: first", "at": at.isoformat()},
            {"attempt": 2, "error": "ValueError: odd", "at": "not a time"},
        ],
    )
    page = client.get(f"/jobs/{job_id}").text
    exact = at.strftime("%Y-%m-%d %H:%M:%S UTC")
    assert f'<span class="error-at" title="{exact}">7 min ago</span>' in page
    assert at.isoformat() not in page
    assert '<span class="error-at" title="not a time">not a time</span>' in page


# ---------------------------------------------------------------------- sequences


@sa_jobs.job_args(kind="dashboard_customer_sync", sequence=sa_jobs.SequenceOpts(by_args=True))
class CustomerSync:
    customer_id: int = sa_jobs.field(sequence=True)
    full: bool = False
    note: str = ""


def insert_job(
    engine: Engine, args: object, *, queue: str | None = None, sequence: Any = None
) -> int:
    with Session(engine) as session, session.begin():
        return sa_jobs.insert(session, args, queue=queue, sequence=sequence).job.id


def test_the_job_page_and_the_sequences_page_show_the_customer_not_a_hash(
    client: DashboardClient, engine: Engine
) -> None:
    first = insert_job(engine, CustomerSync(42, note="x"))
    insert_job(engine, CustomerSync(42, full=True))
    with Session(engine) as session, session.begin():
        sa_jobs.cancel_job(session, first)  # halts the sequence of customer 42
    page = client.get(f"/jobs/{first}").text
    assert "<code>customer_id=42</code>" in page
    assert "kind</span> dashboard_customer_sync" in page
    assert "<code>full=" not in page and "<code>note=" not in page  # not in the key
    sequences = client.get("/sequences").text
    assert "<code>customer_id=42</code>" in sequences
    assert re.search(r"<code[^>]*>[0-9a-f]{16}", sequences) is None  # no hash shown


def test_without_the_class_declared_the_marked_field_is_found_all_the_same(
    client: DashboardClient, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A standalone ``sa-jobs dashboard`` imports no job classes: the key is rebuilt from
    each subset of the args' fields until its hash is the stored key."""
    job_id = insert_job(engine, CustomerSync(7, full=True, note="nightly"))
    monkeypatch.setattr(sequence_keys, "default_registry", KindRegistry())
    page = client.get(f"/jobs/{job_id}").text
    assert "<code>customer_id=7</code>" in page and "<code>note=" not in page


@sa_jobs.job_args(kind="dashboard_per_queue")
class PerQueue:
    n: int = 0


@pytest.mark.parametrize(
    ("options", "fields", "kind", "queue"),
    [
        (sa_jobs.SequenceOpts(), [], "dashboard_per_queue", None),
        (sa_jobs.SequenceOpts(by_queue=True, exclude_kind=True), [], None, "imports"),
        (sa_jobs.SequenceOpts(by_args=True), [("n", "3")], "dashboard_per_queue", None),
        (
            sa_jobs.SequenceOpts(by_args=True, by_queue=True),
            [("n", "3")],
            "dashboard_per_queue",
            "imports",
        ),
    ],
)
def test_each_way_a_key_is_made_is_told_apart_by_its_hash(
    engine: Engine,
    options: sa_jobs.SequenceOpts,
    fields: list[tuple[str, str]],
    kind: str | None,
    queue: str | None,
) -> None:
    job_id = insert_job(engine, PerQueue(3), queue="imports", sequence=options)
    with Session(engine) as session:
        job = session.get_one(Job, job_id)
        key = job.sequence_key
        assert key is not None
        for registry in (None, KindRegistry()):  # declared here, and not
            parts = SequenceKeys(registry).describe(key, job.kind, job.queue, job.args_json)
            assert parts is not None
            assert (list(parts.fields), parts.kind, parts.queue) == (fields, kind, queue)


def test_a_way_remembered_for_a_kind_does_not_hide_another() -> None:
    keys = SequenceKeys(KindRegistry())
    by_customer = key_digest(canonical_bytes("sequence", kind="k", args='{"customer_id":1}'))
    found = keys.describe(by_customer, "k", "q", {"customer_id": 1, "note": "a"})
    assert found == SequenceParts("k", [("customer_id", "1")], None)
    # Tried first for the kind's next key, the remembered subset names a field these
    # args lack; the key (made by queue) is found all the same.
    by_queue = key_digest(canonical_bytes("sequence", kind="k", queue="q"))
    assert keys.describe(by_queue, "k", "q", {"note": "b"}) == SequenceParts("k", [], "q")
    assert keys.describe(b"\0" * 32, "k", "q", {"a": 1, "b": 2}) is None
    assert keys.describe(by_customer, "k", "q", None) is None  # args too large to read


def test_a_key_no_way_rebuilds_shows_its_hash(client: DashboardClient, engine: Engine) -> None:
    job_id = insert_job(engine, CustomerSync(5))
    with engine.begin() as connection:  # args changed by hand since: the key is not theirs
        connection.execute(update(Job).where(Job.id == job_id).values(args_json={"customer_id": 6}))
    with Session(engine) as session:
        key = session.get_one(Job, job_id).sequence_key
        assert key is not None
    page = client.get(f"/jobs/{job_id}").text
    assert f"<code>{key.hex()}</code>" in page
    assert "not rebuilt from this job's args" in page


# ---------------------------------------------------------------------- filters and tabs


def test_the_filters_offer_the_known_queues_and_kinds(
    client: DashboardClient, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(list_choices, "KIND_WINDOW", 5)
    make_job(engine, kind="dashboard_old_kind", queue="archive", state=JobState.COMPLETED)
    for _ in range(5):
        make_job(engine, kind="dashboard_recent_kind", queue="mail")
    with engine.begin() as connection:
        connection.execute(
            insert(WorkerProcess).values(id="w-1", hostname="h", pid=1, queues=["media"])
        )
    with Session(engine) as session, session.begin():
        sa_jobs.pause_queue(session, "later", allow_unknown=True)
    page = client.get("/jobs").text
    assert 'name="queue" value="" size="12" list="known-queues"' in page
    assert 'name="kind" value="" size="16" list="known-kinds"' in page
    queues = re.search(r'<datalist id="known-queues">(.*?)</datalist>', page, re.S)
    kinds = re.search(r'<datalist id="known-kinds">(.*?)</datalist>', page, re.S)
    assert queues is not None and kinds is not None
    offered_queues = re.findall(r'<option value="([^"]*)">', queues.group(1))
    offered_kinds = re.findall(r'<option value="([^"]*)">', kinds.group(1))
    # Jobs in it (any state), a worker serving it, a control row.
    assert {"archive", "mail", "media", "later"} <= set(offered_queues)
    assert "dashboard_recent_kind" in offered_kinds
    assert "dashboard_customer_sync" in offered_kinds  # declared, no job yet
    assert "dashboard_old_kind" not in offered_kinds  # older than the window reads


def test_state_tabs_show_counts_of_the_queue_filtered(
    client: DashboardClient, engine: Engine
) -> None:
    for _ in range(3):
        make_job(engine, queue="mail")
    make_job(engine, queue="mail", state=JobState.RUNNING, attempted_by=["w"])
    make_job(engine, queue="other")
    everything = tabs(client.get("/jobs").text)
    assert everything["all"] == ("/jobs", "5", True)
    assert everything["available"] == ("/jobs?state=available", "4", False)
    assert everything["completed"] == ("/jobs?state=completed", "0", False)
    page = client.get("/jobs?queue=mail&state=running").text
    mail = tabs(page)
    assert mail["available"] == ("/jobs?state=available&queue=mail", "3", False)
    assert mail["running"] == ("/jobs?state=running&queue=mail", "1", True)
    assert "Jobs per state in queue mail" in page


def tabs(page: str) -> dict[str, tuple[str, str, bool]]:
    """The state tabs: name -> (link, count, current)."""
    nav = re.search(r'<nav class="state-tabs"[^>]*>(.*?)</nav>', page, re.S)
    assert nav is not None
    return {
        name: (html.unescape(href), count, bool(current))
        for href, current, name, count in re.findall(
            r'<a href="([^"]*)"[^>]*?( aria-current="page")?>'
            r'(\w+) <span class="count">([~\d,]+)</span>',
            nav.group(1),
        )
    }


@pytest.mark.parametrize(
    ("state", "offered", "not_offered"),
    [
        (JobState.RUNNING, ["Cancel"], ["Retry", "Delete"]),
        (JobState.AVAILABLE, ["Cancel", "Delete"], ["Retry"]),
        (JobState.COMPLETED, ["Retry", "Delete"], ["Cancel"]),
        (JobState.RETRYABLE, ["Retry", "Cancel", "Delete"], []),
    ],
)
def test_bulk_buttons_are_offered_only_where_they_apply(
    client: DashboardClient,
    engine: Engine,
    state: JobState,
    offered: list[str],
    not_offered: list[str],
) -> None:
    make_job(engine, state=state, attempted_by=["w"] if state is JobState.RUNNING else None)
    page = client.get(f"/jobs?state={state.value}").text
    for label in offered:
        assert f">{label} all…</button>" in page and f">{label}…</button>" in page
    for label in not_offered:
        assert f">{label} all…</button>" not in page and f">{label}…</button>" not in page
    if not_offered:
        assert f"No {' and '.join(not_offered)} here:" in page
    else:
        assert "not-offered" not in page


# ---------------------------------------------------------------------- unserved queues


def test_the_overview_highlights_a_queue_no_live_worker_serves(
    client: DashboardClient, engine: Engine
) -> None:
    for _ in range(8):
        make_job(engine, queue="mial", scheduled_at=dt.timedelta(minutes=-12))
    make_job(engine)  # default: served by a live worker
    make_worker_row(engine, "w-live")
    make_job(engine, queue="held")
    with Session(engine) as session, session.begin():
        sa_jobs.pause_queue(session, "held")  # waiting on purpose: not flagged
    page = client.get("/").text
    alert = re.search(r'<div class="unserved-alert" id="unserved">(.*?)</div>', page, re.S)
    assert alert is not None, page
    text = html.unescape(re.sub(r"<[^>]+>", "", alert.group(1)))
    assert "1 queue with jobs waiting and no worker serving it" in text
    assert "mial: 8 available, oldest 12 min, 0 workers" in text
    assert "-q mial=N" in text
    rows = {
        name: row
        for row in page.split("<tr")[1:]
        for name in ("mial", "default", "held")
        if f">{name}</a>" in row
    }
    assert rows["mial"].startswith(' class="unserved"') and "no worker" in rows["mial"]
    assert "unserved" not in rows["default"] and "unserved" not in rows["held"]


def test_no_highlight_when_every_queue_with_jobs_is_served(
    client: DashboardClient, engine: Engine
) -> None:
    make_job(engine)
    make_worker_row(engine, "w-live")
    make_worker_row(engine, "w-gone", heartbeat_at=dt.timedelta(hours=-1))
    assert 'id="unserved"' not in client.get("/").text
    with engine.begin() as connection:  # only the gone worker is left: nobody serves it
        connection.execute(
            update(WorkerProcess)
            .where(WorkerProcess.id == "w-live")
            .values(heartbeat_at=WorkerProcess.heartbeat_at - dt.timedelta(hours=1))
        )
    assert 'id="unserved"' in client.get("/").text
