"""sa_jobs is typed end to end: ``mypy --strict`` over a small user module sees generic
jobs, typed insert options and awaitables for async sessions, and catches the mistakes
users make (``tests/typing/``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

mypy_api = pytest.importorskip("mypy.api")

HERE = Path(__file__).resolve().parent.parent / "typing"
REPO = HERE.parent.parent


def mypy(module: str) -> list[tuple[int, str, str]]:
    """``(line, "error" | "note", message)`` of ``mypy --strict`` over ``tests/typing/module``."""
    stdout, stderr, _status = mypy_api.run(
        ["--strict", "--no-error-summary", "--show-absolute-path", str(HERE / module)]
    )
    assert not stderr, stderr
    found = []
    for line in stdout.splitlines():
        match = re.match(r".*?\.py:(\d+): (error|note): (.*)", line)
        if match:
            found.append((int(match[1]), match[2], match[3]))
    return found


def test_a_user_module_type_checks_and_sees_the_types_a_user_expects() -> None:
    found = mypy("user_app.py")
    assert [entry for entry in found if entry[1] == "error"] == []
    revealed = [message for _, kind, message in found if message.startswith("Revealed type")]
    expected = [
        "str",  # job.args.to in a handler of Job[SendEmail]
        "int",  # what a decorated async handler returns, awaited
        "sa_jobs._base.records.InsertResult[tests.typing.user_app.SendEmail]",
        "str",  # result.job.args.to
        "list[sa_jobs._base.records.InsertResult[Any]]",
        "sa_jobs._table.models.Job[tests.typing.user_app.SendEmail]",  # enqueue()
        "sa_jobs._table.models.Job[Any]",  # cancel_job()
        "sa_jobs._base.records.InsertResult[tests.typing.user_app.SendEmail]",  # awaited
        "typing.Coroutine[Any, Any, "
        "sa_jobs._base.records.InsertResult[tests.typing.user_app.SendEmail]]",
        "sa_jobs._table.models.Job[Any]",  # await retry_job()
        "sa_jobs._insert.job_key.RemoveOutcome",
    ]
    assert revealed == [f'Revealed type is "{t}"' for t in expected]


def test_a_ref_loads_as_its_model() -> None:
    found = mypy("user_refs.py")
    assert [entry for entry in found if entry[1] == "error"] == []
    revealed = [message for _, kind, message in found if message.startswith("Revealed type")]
    expected = [
        "list[sa_jobs._table.models.Job[Any]]",  # jobs_for()
        "tests.typing.user_refs.Invoice",  # ref.load(session, for_update=True)
        "tests.typing.user_refs.Invoice | None",  # ref.get(session)
        "tests.typing.user_refs.Invoice",  # await ref.load(async_session)
    ]
    assert revealed == [f'Revealed type is "{t}"' for t in expected]


def test_mypy_catches_each_mistake_on_its_line() -> None:
    source = (HERE / "user_mistakes.py").read_text().splitlines()
    marked = {number for number, line in enumerate(source, 1) if "# E:" in line}
    errors = {line for line, kind, _ in mypy("user_mistakes.py") if kind == "error"}
    assert len(marked) == 6
    assert errors == marked
