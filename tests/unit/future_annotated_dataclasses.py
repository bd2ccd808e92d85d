"""Dataclass job args with string annotations, one naming a class defined further down.

Under ``from __future__ import annotations`` a dataclass's field types are strings;
sa_jobs resolves them from this module when it first needs them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from decimal import Decimal as Money

import sa_jobs


@sa_jobs.job_args(kind="tests.unit.future_annotated_dataclasses.order")
@dataclasses.dataclass(frozen=True)
class Order:
    total: Money
    lines: list[OrderLine]
    shipped_on: dt.date | None = None


@dataclasses.dataclass(frozen=True)
class OrderLine:
    label: str
    booked_at: dt.datetime
