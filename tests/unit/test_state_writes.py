"""Every change of ``state`` goes through ``entering()``, which writes ``finalized_at`` with it.

The table's ``finalized_iff_final`` CHECK would refuse a transition that forgot
``finalized_at``; this test catches a new writer that spells the pair out by hand — the
way two writers drift apart — before any database sees it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sqlalchemy import null
from sqlalchemy.sql.functions import now

from sa_jobs._base.states import FINAL_STATES, JobState
from sa_jobs._table.models import entering

PACKAGE = Path(__file__).resolve().parents[2] / "sa_jobs"

#: Where ``state`` may be written without ``entering()``: the function itself, the
#: migrations (DDL), and the benchmark's raw-SQL floor (psycopg without sa_jobs, on purpose).
EXEMPT = {"_table/models.py", "benchmark/floor.py"}

#: A ``state`` value written by hand: a values/set_ dict entry, or a keyword of
#: ``.values()`` (``state=``, as ruff formats a keyword), giving a state member or an
#: expression (``JobState(row.state)``, a conversion of a value read, is not a write).
BY_HAND = re.compile(
    r"""(["']state["']|columns\.state|Job\.state)\s*:\s*(JobState\.|case|sql_cast|cast)"""
    r"""|^\s*state=(JobState\.|case|sql_cast|cast)"""
)


def test_no_module_writes_state_but_through_entering() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative in EXEMPT or relative.startswith("migrations/"):
            continue
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if BY_HAND.search(line):
                found.append(f"{relative}:{number}: {line.strip()}")
    assert found == []


@pytest.mark.parametrize("state", list(JobState), ids=lambda state: state.value)
def test_entering_a_state_sets_finalized_at_exactly_when_it_is_final(state: JobState) -> None:
    values = entering(state)
    # Written into the statement as a literal (not a bound parameter).
    assert str(values["state"]) == f"'{state.value}'"
    if state in FINAL_STATES:
        assert isinstance(values["finalized_at"], now)
    else:
        assert values["finalized_at"].compare(null())
