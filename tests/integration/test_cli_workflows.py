"""``sa-jobs workflows list|show|cancel`` in-process against the test database."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import URL, Engine
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import JobState
from sa_jobs._base.records import Ending, Outcome
from sa_jobs.cli import main
from tests.helpers import CliRun, fetch_one, finish_outcomes, job_states, url_text
from tests.helpers import insert_workflow as insert


@sa_jobs.job_args(kind="cli_wf_step")
class Step:
    n: int = 0


@sa_jobs.job_args(kind="cli_wf_done")
class Done:
    n: int = 0


def diamond(name: str = "diamond") -> sa_jobs.Workflow:
    wf = sa_jobs.Workflow(name, on_complete=Done(1))
    a = wf.add(Step(1), name="a")
    b = wf.add(Step(2), name="b", after=[a])
    c = wf.add(Step(3), name="c", after=[a])
    wf.add(Step(4), name="d", after=[b, c])
    return wf


def rows(out: str) -> list[list[str]]:
    return [re.split(r"\s{2,}", line) for line in out.splitlines() if line and line[0] != "("]


def test_list_says_when_there_are_none(cli: CliRun) -> None:
    assert cli("workflows", "list") == (0, "no workflows\n", "")


def test_list_shows_newest_first_with_the_counters(cli: CliRun, engine: Engine) -> None:
    first = insert(engine, diamond("first"))
    second = insert(engine, diamond("second"))
    with Session(engine) as session, session.begin():
        sa_jobs.complete_in(session, fetch_one(engine))  # first's step a
    code, out, err = cli("workflows", "list")
    assert (code, err) == (0, "")
    table = rows(out)
    assert table[0][:7] == [
        "id",
        "name",
        "created (UTC)",
        "steps",
        "completed",
        "failed",
        "unfinished",
    ]
    assert [r[0] for r in table[1:]] == [str(second.id), str(first.id)]
    assert table[2][3:] == ["4", "1", "0", "3", "no"]
    code, out, _ = cli("workflows", "list", "--limit", "1")
    assert [r[0] for r in rows(out)[1:]] == [str(second.id)]
    assert "(more workflows" in out


def test_list_unfinished_leaves_finished_workflows_out(cli: CliRun, engine: Engine) -> None:
    done = insert(engine, diamond("done"))
    with Session(engine) as session, session.begin():
        sa_jobs.cancel_workflow(session, done.id)
    running = insert(engine, diamond("running"))
    _, out, _ = cli("workflows", "list", "--unfinished")
    assert [r[0] for r in rows(out)[1:]] == [str(running.id)]


def test_show_prints_counts_callbacks_failed_steps_and_what_each_step_waits_for(
    cli: CliRun, engine: Engine
) -> None:
    inserted = insert(engine, diamond())
    a = fetch_one(engine)
    with Session(engine) as session, session.begin():
        sa_jobs.complete_in(session, a)
    b = fetch_one(engine)
    assert b.id == inserted.jobs["b"]
    finish_outcomes(engine, [Outcome.of(b, Ending.CANCELLED)])  # d is cancelled with it
    code, out, err = cli("workflows", "show", str(inserted.id))
    assert (code, err) == (0, "")
    assert out.startswith(f"workflow {inserted.id}: diamond\n")
    assert "steps       4: 1 completed, 2 failed, 1 unfinished" in out
    assert f"on_complete job {inserted.callbacks['on_complete']} (pending)" in out
    assert f"d (job {inserted.jobs['d']}): cancelled, because job {b.id} failed" in out
    table = {r[0]: r for r in rows(out.split("\n\n", 1)[1])}
    assert table["d"][4] == "b (cancelled), c (available)"
    assert table["b"][4] == "a"  # resolved
    assert table["a"][4] == "-"
    assert table["c"][3] == "available"


def test_show_pages_the_steps_by_name(cli: CliRun, engine: Engine) -> None:
    inserted = insert(engine, diamond())
    _, out, _ = cli("workflows", "show", str(inserted.id), "--steps", "2")
    assert [r[0] for r in rows(out.split("\n\n", 1)[1])][1:] == ["a", "b"]
    assert "(more steps; see --after b)" in out
    _, out, _ = cli("workflows", "show", str(inserted.id), "--steps", "2", "--after", "b")
    assert [r[0] for r in rows(out.split("\n\n", 1)[1])][1:] == ["c", "d"]
    assert "more steps" not in out


def test_cancel_cancels_the_unfinished_steps_and_the_callbacks(cli: CliRun, engine: Engine) -> None:
    inserted = insert(engine, diamond())
    code, out, err = cli("workflows", "cancel", str(inserted.id))
    assert (code, err) == (0, "")
    assert out.startswith(f"workflow {inserted.id}: 5 jobs cancelled")
    states = job_states(engine)
    ids = [*inserted.jobs.values(), inserted.callbacks["on_complete"]]
    assert {states[i] for i in ids} == {JobState.CANCELLED}


@pytest.mark.parametrize("action", ["show", "cancel"])
def test_an_unknown_workflow_is_one_line_on_stderr(cli: CliRun, action: str) -> None:
    code, out, err = cli("workflows", action, "424242")
    assert (code, out) == (1, "")
    assert err == "sa-jobs: no workflow with id 424242; use the id insert_workflow() returned\n"


def test_a_bad_id_is_a_usage_error(cli: CliRun) -> None:
    with pytest.raises(SystemExit) as exited:
        cli("workflows", "show", "abc")
    assert exited.value.code == 2


def test_without_the_workflow_branch_the_error_names_it(
    core_only: Engine, core_only_url: URL, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv in (["list"], ["show", "1"], ["cancel", "1"]):
        assert main(["workflows", *argv, "--url", url_text(core_only_url)]) == 1
        err = capsys.readouterr().err
        assert "'sa_jobs_workflow' migration branch is not installed" in err, err
