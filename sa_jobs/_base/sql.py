"""Small SQLAlchemy Core idioms several modules share (a leaf: imports nothing of sa_jobs)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Select, bindparam, func, literal, select
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.sql.expression import ColumnClause, ColumnElement
from sqlalchemy.sql.selectable import CTE, TableValuedAlias

__all__ = ["json_recordset", "runs_first", "seconds_interval"]


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
