"""When a periodic job fires: cron expressions (parsed by cronsim) and fixed intervals.

A schedule answers two questions about instants (aware datetimes, compared as instants):
the first fire strictly after ``t`` and the last one strictly before ``t``, given an
*anchor* — an instant the job fires at (its row's next fire). Cron ignores the anchor
(its instants are absolute); an interval counts from it, so a restart keeps its phase.
Which instants are due and which were missed is built on these in
:mod:`sa_jobs.periodic.plan`.

Cron expressions are evaluated in their time zone the way Debian's (Vixie) cron does,
which is what cronsim implements: a job at a fixed local time that a spring-forward
jump skips runs once, right after the jump; a fixed time that a fall-back repeats runs
once, at its first occurrence; a job with a wildcard minute or hour follows real time
(``0 * * * *`` fires every real hour, twice in the repeated local hour). See
``docs/periodic-jobs.md``.
"""

from __future__ import annotations

import datetime as dt
import zoneinfo
from collections.abc import Iterator
from typing import Protocol

import attrs
from cronsim import CronSim, CronSimError

from sa_jobs.errors import InvalidOptionsError

__all__ = ["CronSchedule", "IntervalSchedule", "Schedule", "build_schedule"]

#: The shortest schedule: an interval under this (and cron has seconds at most) is refused.
MIN_INTERVAL = dt.timedelta(seconds=1)


class Schedule(Protocol):
    """The instants a periodic job fires at."""

    @property
    def description(self) -> str:
        """A canonical text of the schedule, stored in the row; a change of it makes the
        periodic job start over from its new schedule."""
        ...

    def after(self, anchor: dt.datetime, instant: dt.datetime) -> dt.datetime:
        """The first fire strictly after ``instant``."""
        ...

    def before(self, anchor: dt.datetime, instant: dt.datetime) -> dt.datetime | None:
        """The last fire strictly before ``instant``, if any (None: none in the
        searchable past)."""
        ...

    def walk(
        self, anchor: dt.datetime, instant: dt.datetime, *, reverse: bool = False
    ) -> Iterator[dt.datetime]:
        """The fires strictly after ``instant`` in order (or strictly before it, newest
        first, with ``reverse``), from one iterator: a catch-up walks many instants."""
        ...


@attrs.frozen
class IntervalSchedule:
    """Every ``interval``, counted from an anchor: the row's first fire instant. The
    instants are ``anchor + k * interval``, so a restart keeps the phase."""

    interval: dt.timedelta

    @property
    def description(self) -> str:
        return f"every {interval_text(self.interval)}"

    def after(self, anchor: dt.datetime, instant: dt.datetime) -> dt.datetime:
        steps = (instant - anchor) // self.interval + 1
        return anchor + steps * self.interval

    def before(self, anchor: dt.datetime, instant: dt.datetime) -> dt.datetime | None:
        steps = -((anchor - instant) // self.interval) - 1  # ceil((instant - anchor) / i) - 1
        return anchor + steps * self.interval

    def walk(
        self, anchor: dt.datetime, instant: dt.datetime, *, reverse: bool = False
    ) -> Iterator[dt.datetime]:
        found = self.before(anchor, instant) if reverse else self.after(anchor, instant)
        step = -self.interval if reverse else self.interval
        while found is not None:
            yield found
            found += step


@attrs.frozen
class CronSchedule:
    """A cron expression (5 fields, or 6 with seconds first) in a time zone."""

    expression: str
    tz: dt.tzinfo

    @property
    def description(self) -> str:
        return f"{self.expression} ({_zone_name(self.tz)})"

    def after(self, anchor: dt.datetime, instant: dt.datetime) -> dt.datetime:
        found = next(self.walk(anchor, instant), None)
        if found is None:
            raise InvalidOptionsError(
                "schedule", f"{self.expression!r} never fires after {instant.isoformat()}"
            )
        return found

    def before(self, anchor: dt.datetime, instant: dt.datetime) -> dt.datetime | None:
        return next(self.walk(anchor, instant, reverse=True), None)

    def walk(
        self, anchor: dt.datetime, instant: dt.datetime, *, reverse: bool = False
    ) -> Iterator[dt.datetime]:
        # cronsim works on local wall time and, for fixed-time jobs, forgets the fold of
        # its start; from an instant in a repeated hour it can answer an instant on the
        # wrong side of the start. Comparing as instants (with the last one yielded)
        # and stepping on fixes that.
        last = instant
        try:
            for found in CronSim(self.expression, instant.astimezone(self.tz), reverse=reverse):
                if (found < last) if reverse else (found > last):
                    last = found
                    yield found.astimezone(dt.UTC)
        except CronSimError as exc:  # pragma: no cover - parsed when built
            raise InvalidOptionsError("schedule", str(exc)) from None


def interval_text(interval: dt.timedelta) -> str:
    """An exact, readable text of a positive interval: ``"1h 30m"``, ``"14d 1s"``,
    ``"1.000001s"``. Distinct intervals give distinct texts (the row's schedule is
    compared as text), which a float rendering like ``"1.2096e+06s"`` would not."""
    days, rest = interval.days, interval.seconds
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    parts = [
        f"{value}{unit}" for value, unit in ((days, "d"), (hours, "h"), (minutes, "m")) if value
    ]
    if interval.microseconds:
        parts.append(f"{seconds}.{interval.microseconds:06d}".rstrip("0") + "s")
    elif seconds or not parts:
        parts.append(f"{seconds}s")
    return " ".join(parts)


def build_schedule(schedule: object, tz: object) -> Schedule:
    """A :class:`Schedule` from what ``PeriodicJob`` was given, checked.

    Raises:
        InvalidOptionsError: a bad cron expression, time zone, or interval, or a time
            zone with an interval.
    """
    if isinstance(schedule, dt.timedelta):
        if tz is not None:
            raise InvalidOptionsError(
                "tz", "applies to cron expressions only; an interval is the same in every zone"
            )
        if schedule < MIN_INTERVAL:
            raise InvalidOptionsError(
                "schedule", f"{schedule} is under one second; the shortest interval is 1 s"
            )
        return IntervalSchedule(schedule)
    if not isinstance(schedule, str):
        raise InvalidOptionsError(
            "schedule",
            f"must be a cron expression (str) or a datetime.timedelta, got {schedule!r}",
        )
    expression = _expand_macro(" ".join(schedule.split()))
    zone = _zone(tz)
    try:
        CronSim(expression, dt.datetime.now(zone))
    except CronSimError as exc:
        raise InvalidOptionsError(
            "schedule",
            f"{schedule!r} is not a valid cron expression ({exc}); expected 5 fields "
            "'minute hour day-of-month month day-of-week' (or 6, seconds first), "
            "e.g. '0 9 * * MON-FRI'",
        ) from None
    cron = CronSchedule(expression, zone)
    now = dt.datetime.now(dt.UTC)
    cron.after(now, now)  # one that never fires (Feb 30) fails here
    return cron


#: Cron's "@" shorthands, as the expressions they stand for (cronsim has none of them).
MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


def _expand_macro(expression: str) -> str:
    if not expression.startswith("@"):
        return expression
    if expression.lower() == "@reboot":
        raise InvalidOptionsError(
            "schedule",
            "'@reboot' means every start of a process, which a durable schedule shared by "
            "all workers does not have; use run_on_start=True to fire once when the "
            "schedule is new, or a real schedule",
        )
    expanded = MACROS.get(expression.lower())
    if expanded is None:
        raise InvalidOptionsError(
            "schedule",
            f"{expression!r} is not a cron shorthand; known ones: {', '.join(MACROS)}",
        )
    return expanded


def _zone(tz: object) -> dt.tzinfo:
    if tz is None:
        return dt.UTC
    if isinstance(tz, dt.tzinfo):
        return tz
    if not isinstance(tz, str):
        raise InvalidOptionsError("tz", f"must be an IANA zone name or a tzinfo, got {tz!r}")
    try:
        return zoneinfo.ZoneInfo(tz)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise InvalidOptionsError(
            "tz", f"{tz!r} is not a known time zone; use an IANA name such as 'Europe/Paris'"
        ) from None


def _zone_name(tz: dt.tzinfo) -> str:
    key = getattr(tz, "key", None)
    return key if isinstance(key, str) else str(tz)
