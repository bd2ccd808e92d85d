"""Small SQLAlchemy Core idioms several modules share (a leaf: imports nothing of sa_jobs)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    BigInteger,
    Integer,
    Select,
    Text,
    bindparam,
    cast,
    false,
    func,
    literal,
    literal_column,
    select,
    true,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.sql.expression import ColumnClause, ColumnElement
from sqlalchemy.sql.selectable import CTE, TableValuedAlias

__all__ = ["constant", "id_array", "json_recordset", "runs_first", "seconds_interval"]


def constant(value: str | int | bool) -> ColumnElement[Any]:
    """``value`` written into the statement's text, not sent as a bound parameter.

    For the constants of statements run once per batch on the hot path: psycopg parses a
    statement's text for its placeholders at every execution when the text is longer than
    it caches (4,096 bytes), at a cost that grows with their number — a workflow step's
    one-statement completion had 40 bound constants and spent ~0.15-0.3 ms per batch on
    them. Only our own constants come here (state names, JSON keys, channel names), never
    user data; a quote is refused rather than escaped.
    """
    if isinstance(value, bool):
        return true() if value else false()
    if isinstance(value, int):
        return literal_column(str(value), Integer)
    if "'" in value or "\\" in value:
        raise ValueError(f"not a plain SQL constant: {value!r}")
    return literal_column(f"'{value}'", Text)


def id_array(aggregate: Select[Any]) -> ColumnElement[Any]:
    """``aggregate`` (one ``array_agg`` of ids) as an array to compare with ``= ANY``:
    computed once, over every row it aggregates, before the rows compared are read (an
    InitPlan). The cast makes it an array expression: ``= ANY (SELECT ...)`` would compare
    with each row of the subquery instead."""
    return cast(aggregate.scalar_subquery(), ARRAY(BigInteger))


def seconds_interval(seconds: Any) -> ColumnElement[Any]:
    """An ``interval`` of ``seconds`` (a column, an expression or a Python number)."""
    if isinstance(seconds, int | float):
        seconds = literal(float(seconds))
    return func.make_interval(0, 0, 0, 0, 0, 0, seconds)


def json_recordset(
    param: str, columns: Sequence[ColumnClause[Any]], name: str, value: Any = None
) -> TableValuedAlias:
    """``jsonb_to_recordset(:param) AS name(columns...)``: how batch statements take rows.

    Any number of rows travel as one bound JSON array, so a statement is built once and
    never meets PostgreSQL's limit of 65,535 parameters. With ``value`` the parameter
    carries it (a statement to execute as is); without, the statement is a template
    each execution fills in.
    """
    rows = bindparam(param, type_=JSONB) if value is None else bindparam(param, value, type_=JSONB)
    return (
        func.jsonb_to_recordset(rows)
        .table_valued(*columns)
        .render_derived(name=name, with_types=True)
    )


def runs_first(statement: Select[Any], cte: CTE) -> Select[Any]:
    """``statement`` made to run ``cte`` (a lock-taking or data-modifying CTE) before it
    produces its first row: referencing its count in the WHERE clause makes PostgreSQL
    evaluate it once, up front (an InitPlan)."""
    return statement.where(select(func.count()).select_from(cte).scalar_subquery() >= 0)
