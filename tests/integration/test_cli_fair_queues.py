"""``sa-jobs work -q``'s fairness: ``NAME[=N]:fair_by=F[+F]`` / ``:fair_by_metadata=K``
declares a fair queue, and a ``-q`` (or ``--concurrency``) that only changes a fair
queue's concurrency keeps the fairness its code declares."""

from __future__ import annotations

import argparse
import logging

import pytest
from sqlalchemy import URL, Engine
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import JobState
from sa_jobs.cli import main
from sa_jobs.cli.settings import QueueSpec, queue_spec
from sa_jobs.cli.work import _child_command
from tests.factories import job_row
from tests.helpers import url_text
from tests.integration.cli_fair_app import FAIR, PLAIN, Tenanted

APP = "tests.integration.cli_fair_app:make_worker"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("SA_JOBS_DATABASE_URL", "DATABASE_URL", "SA_JOBS_QUEUES"):
        monkeypatch.delenv(variable, raising=False)
    for variable in ("SA_JOBS_CONCURRENCY", "SA_JOBS_PROCESSES", "SA_JOBS_UNTIL_IDLE"):
        monkeypatch.delenv(variable, raising=False)


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("mail", QueueSpec("mail")),
        ("mail=3", QueueSpec("mail", 3)),
        ("reports=10:fair_by=tenant_id", QueueSpec("reports", 10, fair_by=("tenant_id",))),
        ("reports:fair_by=region+customer", QueueSpec("reports", fair_by=("region", "customer"))),
        ("reports=2:fair_by_metadata=tenant", QueueSpec("reports", 2, fair_by_metadata="tenant")),
        # A colon that starts no fairness option belongs to the queue's name.
        ("a:b=3", QueueSpec("a:b", 3)),
        ("a:b:fair_by=t", QueueSpec("a:b", fair_by=("t",))),
    ],
)
def test_queue_specs_read_fairness(text: str, spec: QueueSpec) -> None:
    assert queue_spec(text) == spec
    assert queue_spec(spec.text()) == spec


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("r=2:fair_by=", "field names must be non-empty"),
        ("r:fair_by=a+a", "names a field twice"),
        ("r:fair_by=a:fair_by_metadata=t", "not both"),
        ("r:fair_by=a:fair_by=b", "fair_by is given twice"),
        ("r:fair_by_metadata=", "non-empty string"),
    ],
)
def test_bad_fairness_is_refused_before_the_app_is_imported(
    value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["work", "no_such_module_anywhere:worker", "-q", value])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def _add(engine: Engine, queue: str, tenants: str) -> list[int]:
    with Session(engine) as session, session.begin():
        results = sa_jobs.insert_many(session, [Tenanted(t) for t in tenants], queue=queue)
        return [result.job.id for result in results]


def _started(caplog: pytest.LogCaptureFixture) -> str:
    return next(r.getMessage() for r in caplog.records if "started: queues" in r.getMessage())


@pytest.mark.parametrize(
    "options",
    [["-q", f"{FAIR}=3"], ["--concurrency", "3"]],
    ids=["-q NAME=N", "--concurrency"],
)
def test_a_new_concurrency_keeps_the_codes_fairness_and_weights(
    options: list[str],
    database_url: URL,
    engine: Engine,
    no_workers_or_leader: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    ids = _add(engine, FAIR, "abc")
    caplog.set_level(logging.INFO, logger="sa_jobs.worker")
    url = url_text(database_url)
    assert main(["work", APP, "--url", url, *options, "--until-idle"]) == 0
    assert [job_row(engine, i).state for i in ids] == [JobState.COMPLETED] * 3
    # Before: the worker's queues became {FAIR: 3}, a plain queue, and nothing said so.
    assert f"{FAIR!r}: 3" in _started(caplog)
    assert _started(caplog).endswith(
        f"; fair {{{FAIR!r}: \"fair_by=['tenant'], weights={{'acme': 2}}\"}}"
    )


def test_q_declares_a_fair_queue(
    database_url: URL,
    engine: Engine,
    no_workers_or_leader: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    ids = _add(engine, PLAIN, "ab")
    caplog.set_level(logging.INFO, logger="sa_jobs.worker")
    url = url_text(database_url)
    spec = f"{PLAIN}=2:fair_by=tenant"
    assert main(["work", APP, "--url", url, "-q", spec, "--until-idle"]) == 0
    assert [job_row(engine, i).state for i in ids] == [JobState.COMPLETED] * 2
    assert _started(caplog).endswith(f"; fair {{{PLAIN!r}: \"fair_by=['tenant']\"}}")


def test_a_fair_key_the_handled_kinds_do_not_declare_is_refused_at_start(
    database_url: URL,
    engine: Engine,
    no_workers_or_leader: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ids = _add(engine, FAIR, "a")
    url = url_text(database_url)
    spec = f"{FAIR}:fair_by_metadata=tenant"
    assert main(["work", APP, "--url", url, "-q", spec, "--until-idle"]) != 0
    err = capsys.readouterr().err
    assert "Queue(fair_by_metadata='tenant')" in err, err
    assert "declares partition_by=['tenant'], another key" in err, err
    assert job_row(engine, ids[0]).state is JobState.AVAILABLE


def test_processes_children_get_the_fair_queues(engine: Engine) -> None:
    worker = sa_jobs.Worker(
        engine,
        queues={
            "r": sa_jobs.Queue(3, fair_by=["region", "customer"]),
            "m": sa_jobs.Queue(2, fair_by_metadata="tenant"),
            "p": 4,
        },
    )
    options = argparse.Namespace(
        app="x:y",
        log_level="INFO",
        default_log_level="INFO",
        until_idle=True,
        replace_stuck=False,
    )
    command = _child_command(options, worker)
    specs = [queue_spec(command[i + 1]) for i, part in enumerate(command) if part == "-q"]
    assert specs == [
        QueueSpec("r", 3, fair_by=("region", "customer")),
        QueueSpec("m", 2, fair_by_metadata="tenant"),
        QueueSpec("p", 4),
    ]
