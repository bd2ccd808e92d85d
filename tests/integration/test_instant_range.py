"""The range of ``scheduled_at``: the Python bound, its message and the table's CHECK
say the same thing, to the microsecond."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import IntegrityError

from sa_jobs._base.durations import RANGE_TEXT
from sa_jobs._declare.options import InsertOpts
from sa_jobs.errors import InvalidOptionsError

ONE_MICROSECOND = dt.timedelta(microseconds=1)


def named_ends() -> list[dt.datetime]:
    """The two instants the error message names as the ends of the range."""
    found = re.findall(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", RANGE_TEXT)
    assert len(found) == 2, RANGE_TEXT
    return [dt.datetime.fromisoformat(f"{end}+00:00") for end in found]


def python_accepts(instant: dt.datetime) -> bool:
    try:
        InsertOpts(scheduled_at=instant)
    except InvalidOptionsError as exc:
        assert RANGE_TEXT in str(exc)
        return False
    return True


def table_accepts(engine: Engine, instant: dt.datetime) -> bool:
    try:
        with engine.begin() as connection:
            connection.execute(
                text("INSERT INTO sa_job (kind, scheduled_at) VALUES ('range_probe', :at)"),
                {"at": instant},
            )
    except IntegrityError as exc:
        assert "sa_job_scheduled_at_range_check" in str(exc)
        return False
    return True


@pytest.mark.parametrize("end", [0, 1], ids=["earliest", "latest"])
def test_the_named_ends_are_inside_and_a_microsecond_past_them_is_out_for_both(
    engine: Engine, end: int
) -> None:
    named = named_ends()[end]
    outside = named - ONE_MICROSECOND if end == 0 else named + ONE_MICROSECOND
    late_in_the_day = named.replace(hour=23, minute=59, second=59)

    assert python_accepts(named) and table_accepts(engine, named)
    assert not python_accepts(outside) and not table_accepts(engine, outside)
    if end == 1:
        # 9999-12-30T23:59:59Z, the example: out for both, as the message says.
        assert not python_accepts(late_in_the_day)
        assert not table_accepts(engine, late_in_the_day)
