"""Job args declared the way most applications write them: with string annotations.

Under ``from __future__ import annotations`` every annotation is a string, resolved from
*this* module's globals on first use — so it may name an alias only this module imports,
or a class defined further down. A name imported only for type checkers cannot resolve.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal as Money
from typing import TYPE_CHECKING

import attrs

import sa_jobs

if TYPE_CHECKING:
    from uuid import UUID


@sa_jobs.job_args(kind="tests.unit.future_annotated_args.invoice")
class Invoice:
    total: Money
    lines: list[InvoiceLine]
    due: dt.date | None = None


@attrs.frozen
class InvoiceLine:
    label: str
    amount: Money
    booked_at: dt.datetime


@sa_jobs.job_args(kind="tests.unit.future_annotated_args.type_checking_only")
class TypeCheckingOnly:
    customer_id: UUID
