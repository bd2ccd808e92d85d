"""``_base.sql.constant``: our constants written into a statement's text, never a quote."""

from __future__ import annotations

import pytest
from sqlalchemy import select
from sqlalchemy.dialects import postgresql

from sa_jobs._base.sql import constant


def _sql(value: str | int | bool) -> str:
    compiled = select(constant(value).label("c")).compile(dialect=postgresql.dialect())
    assert not compiled.params, "a constant must not become a bound parameter"
    return str(compiled)


@pytest.mark.parametrize(
    ("value", "text"),
    [("pending", "'pending'"), ("sa_jobs_insert", "'sa_jobs_insert'"), (0, "0"), (7, "7")],
)
def test_a_constant_is_written_into_the_statement(value: str | int, text: str) -> None:
    assert _sql(value) == f"SELECT {text} AS c"


def test_booleans_are_sql_booleans() -> None:
    assert _sql(True) == "SELECT true AS c"
    assert _sql(False) == "SELECT false AS c"


@pytest.mark.parametrize("value", ["it's", "back\\slash"])
def test_a_value_that_needs_quoting_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match="not a plain SQL constant"):
        constant(value)
