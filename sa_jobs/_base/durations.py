"""Bounds on every duration and instant sa_jobs writes, so none can break the database.

A delay ends up in ``scheduled_at``, a TTL in ``unique_expires_at``, a timeout in a
``threading`` wait. Each of those has a range, and a value outside it used to surface
far from where it was made — as a ``DataError`` that aborted a transaction, a completer
retrying one statement forever, a watchdog thread killed by ``OverflowError``. Here each
kind of value is checked where it is made:

* **Delays** (a snooze, a retry policy's answer): negative or non-finite is a mistake
  and raises; longer than :data:`MAX_DELAY` (365 days) is clamped to it.
* **Timeouts**: longer than :data:`MAX_TIMEOUT` (365 days) is clamped to it; ``None``
  means no limit.
* **TTLs** (``UniqueOpts.ttl``): at least one second, at most :data:`MAX_TTL`
  (365 days); anything else raises.
* **Instants** (``scheduled_at``, and ``scheduled_at + ttl``): their UTC instant must lie
  between :data:`EARLIEST_INSTANT` and :data:`LATEST_INSTANT` (0001-01-02 00:00:00 and
  9999-12-30 00:00:00 UTC, both included), a day inside what both PostgreSQL and Python
  can represent in any time zone, so a stored value can always be read back. The core
  schema enforces exactly the same range with a CHECK.

This module is a leaf (it imports nothing of sa_jobs): its checks raise ``ValueError``
with a message, which callers turn into :class:`~sa_jobs.errors.InvalidOptionsError`
naming the option.
"""

from __future__ import annotations

import datetime as dt
import math

__all__ = [
    "EARLIEST_INSTANT",
    "LATEST_INSTANT",
    "MAX_DELAY",
    "MAX_TIMEOUT",
    "MAX_TTL",
    "RANGE_TEXT",
    "check_instant",
    "delay_seconds",
]

#: The longest a snooze or a retry can put a job off; longer ones are clamped to it.
MAX_DELAY = dt.timedelta(days=365)
#: The longest run time limit; longer ones are clamped to it (``None`` means no limit).
MAX_TIMEOUT = dt.timedelta(days=365)
#: The longest unique TTL lock (Faktory's ``unique_for``).
MAX_TTL = dt.timedelta(days=365)
#: The earliest and latest ``scheduled_at`` (as UTC instants). One day inside Python's
#: ``datetime`` range, so the value reads back in any session time zone.
EARLIEST_INSTANT = dt.datetime(1, 1, 2, tzinfo=dt.UTC)
LATEST_INSTANT = dt.datetime(9999, 12, 30, tzinfo=dt.UTC)


def delay_seconds(value: object, *, maximum: dt.timedelta = MAX_DELAY) -> float:
    """``value`` (a timedelta or a number of seconds) as seconds in ``[0, maximum]``.

    Raises:
        ValueError: not a duration, negative, NaN or infinite.
    """
    if isinstance(value, dt.timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int) and not isinstance(value, bool):
        # An int too large for a float is past the maximum anyway.
        seconds = float(min(max(value, -1), maximum.total_seconds() + 1))
    elif isinstance(value, float):
        seconds = value
    else:
        raise ValueError(f"must be a timedelta or a number of seconds, got {value!r}")
    if math.isnan(seconds) or math.isinf(seconds):
        raise ValueError(f"must be a finite duration, got {value!r}")
    if seconds < 0:
        raise ValueError(f"cannot be negative, got {value!r}")
    return min(seconds, maximum.total_seconds())


def check_instant(value: dt.datetime, *, plus: dt.timedelta | None = None) -> None:
    """Refuse an aware datetime whose UTC instant (``+ plus``) PostgreSQL could store but
    Python could not read back.

    Raises:
        ValueError: out of range.
    """
    try:
        instant = value.astimezone(dt.UTC)
        end = instant + plus if plus is not None else instant
    except OverflowError:
        raise ValueError(_out_of_range(value, plus)) from None
    if not (EARLIEST_INSTANT <= instant <= LATEST_INSTANT and end <= LATEST_INSTANT):
        raise ValueError(_out_of_range(value, plus))


def _out_of_range(value: dt.datetime, plus: dt.timedelta | None) -> str:
    what = f"{value.isoformat()}" + (f" plus the unique ttl of {plus}" if plus else "")
    return f"{what} falls outside the instants sa_jobs can store and read back ({RANGE_TEXT})"


def _instant_text(instant: dt.datetime) -> str:
    return instant.replace(tzinfo=None).isoformat(sep=" ")


#: The range as messages and docs say it: both ends are instants, not whole days (the
#: last day, 9999-12-30, is outside but for its first instant), as the table's CHECK
#: ``BETWEEN '0001-01-02 00:00:00+00' AND '9999-12-30 00:00:00+00'`` has them.
RANGE_TEXT = (
    f"from {_instant_text(EARLIEST_INSTANT)} to {_instant_text(LATEST_INSTANT)} UTC, both included"
)
