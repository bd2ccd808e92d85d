"""``sa-jobs stats`` and ``sa-jobs health``: the tables, ``--json``, and option errors
(the exit codes against a real open transaction are in test_health.py)."""

from __future__ import annotations

import json
import re

import pytest
from sqlalchemy import URL, Engine

from sa_jobs import JobState
from sa_jobs.cli import main
from tests.factories import make_job
from tests.helpers import url_text


def run(database_url: URL, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main([*argv, "--url", url_text(database_url)])
    out, err = capsys.readouterr()
    return code, out, err


def test_stats_prints_a_row_per_queue_and_a_total(
    database_url: URL,
    engine: Engine,
    capsys: pytest.CaptureFixture[str],
    no_workers_or_leader: None,
) -> None:
    for _ in range(2):
        make_job(engine, queue="mail", state=JobState.AVAILABLE)
    make_job(engine, queue="mail", state=JobState.COMPLETED)
    make_job(engine, queue="reports", state=JobState.RUNNING, attempted_by=["w1"])

    code, out, err = run(database_url, capsys, "stats")

    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert re.split(r"\s{2,}", lines[0]) == [
        "queue",
        *(state.value for state in JobState),
        "oldest available",
        "pending steps",  # workflow steps waiting (the test database has the branch)
    ]
    mail = re.split(r"\s{2,}", lines[1])
    # Its available jobs have no live worker to serve them (none is registered).
    assert mail[:2] == ["mail (no live worker)", "2"] and mail[6] == "1"
    assert re.split(r"\s{2,}", lines[3])[:5] == ["total", "2", "0", "0", "1"]
    assert "halted sequences: 0" in out
    assert "health: OK" in out
    assert re.search(r"^w1\s+-\s+-\s+-\s+1\s+none$", out, re.MULTILINE)


def test_stats_marks_estimates(
    database_url: URL, engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    for _ in range(3):
        make_job(engine, state=JobState.COMPLETED)
    code, out, _ = run(database_url, capsys, "stats", "--exact-limit", "2")
    assert code == 0
    assert re.search(r"^default\s+0\s+0\s+0\s+0\s+0\s+~\d", out, re.MULTILINE)
    assert "(~ estimated: more than 2 jobs in that state" in out


def test_stats_json_is_the_whole_result(
    database_url: URL, engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    make_job(engine, queue="mail")
    code, out, _ = run(database_url, capsys, "stats", "--json")
    assert code == 0
    document = json.loads(out)
    assert document["queues"]["mail"]["counts"]["available"] == 1
    assert document["queues"]["mail"]["oldest_available_age"] >= 0
    assert document["estimated"] == []
    assert document["health"]["level"] == "ok"
    assert document["health"]["thresholds"]["xmin_age_warning"] == 300.0


def test_health_prints_the_verdict_and_the_figures(
    database_url: URL, engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(database_url, capsys, "health")
    assert code == 0
    assert out.startswith("health: OK\nxmin horizon: ")
    assert "dead row versions" in out
    code, out, _ = run(database_url, capsys, "health", "--json")
    assert json.loads(out)["level"] == "ok"


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (("--xmin-age-warning", "soon"), "not a duration"),
        (("--dead-tuples-warning", "0"), "must be at least 1"),
        (("--xmin-xids-warning", "10", "--xmin-xids-critical", "5"), "a warning comes first"),
    ],
)
def test_bad_thresholds_are_usage_errors(
    database_url: URL,
    engine: Engine,
    capsys: pytest.CaptureFixture[str],
    argv: tuple[str, ...],
    fragment: str,
) -> None:
    try:
        code = main(["health", *argv, "--url", url_text(database_url)])
    except SystemExit as exited:  # argparse's own refusal
        code = int(exited.code or 0)
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and fragment in err
