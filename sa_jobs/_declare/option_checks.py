"""The checks of single option values — queue, priority, attempts, tags, timeout, time,
metadata — with the limits they enforce.

Each raises :class:`~sa_jobs.errors.InvalidOptionsError` naming the option and saying what
to pass instead; they run when options are built, long before any SQL is sent. Used by
:mod:`sa_jobs._declare.options` (per-call and per-kind options) and the worker's own settings.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Mapping
from typing import Any

from sa_jobs._base.durations import MAX_TIMEOUT, check_instant
from sa_jobs._base.jsonvalue import check_json_document, unstorable_text
from sa_jobs.errors import InvalidJobArgsError, InvalidOptionsError

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_PRIORITY",
    "DEFAULT_QUEUE",
    "MAX_ATTEMPTS_LIMIT",
    "MAX_QUEUE_LENGTH",
    "MAX_TAGS",
    "MAX_TAG_LENGTH",
    "PRIORITY_RANGE",
    "check_max_attempts",
    "check_metadata",
    "check_positive_count",
    "check_priority",
    "check_queue",
    "check_scheduled_at",
    "check_tags",
    "check_text",
    "check_timeout",
]

DEFAULT_QUEUE = "default"
DEFAULT_PRIORITY = 1
DEFAULT_MAX_ATTEMPTS = 25

MAX_QUEUE_LENGTH = 128
MAX_TAG_LENGTH = 255
MAX_TAGS = 64
PRIORITY_RANGE = range(1, 5)
# attempt and max_attempts are smallint columns.
MAX_ATTEMPTS_LIMIT = 32_767


def check_queue(queue: object) -> str:
    if not isinstance(queue, str) or not queue.strip():
        raise InvalidOptionsError("queue", f"must be a non-empty string, got {queue!r}")
    if len(queue) > MAX_QUEUE_LENGTH:
        raise InvalidOptionsError(
            "queue",
            f"{queue[:40]!r}... is {len(queue)} characters; the limit is {MAX_QUEUE_LENGTH}",
        )
    check_text("queue", queue)
    return queue


def check_positive_count(
    option: str, value: object, *, maximum: int | None = None, hint: str = ""
) -> int:
    """A whole number of at least 1 (and at most ``maximum``); ``hint`` is added to the
    message, in parentheses."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < 1
        or (maximum is not None and value > maximum)
    ):
        wanted = (
            "a whole number of at least 1" if maximum is None else f"an int from 1 to {maximum}"
        )
        raise InvalidOptionsError(
            option, f"must be {wanted}, got {value!r}" + (f" ({hint})" if hint else "")
        )
    return value


def check_text(option: str, value: str) -> None:
    problem = unstorable_text(value)
    if problem is not None:
        raise InvalidOptionsError(option, f"{value!r} holds {problem}")


def check_priority(priority: object) -> int:
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise InvalidOptionsError("priority", f"must be an int from 1 to 4, got {priority!r}")
    if priority not in PRIORITY_RANGE:
        raise InvalidOptionsError(
            "priority", f"must be from 1 (most urgent) to 4 (least urgent), got {priority}"
        )
    return priority


def check_max_attempts(max_attempts: object) -> int:
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int):
        raise InvalidOptionsError("max_attempts", f"must be a positive int, got {max_attempts!r}")
    if not 1 <= max_attempts <= MAX_ATTEMPTS_LIMIT:
        raise InvalidOptionsError(
            "max_attempts",
            f"must be from 1 to {MAX_ATTEMPTS_LIMIT}, got {max_attempts}; a job runs at least once",
        )
    return max_attempts


def check_tags(tags: object) -> tuple[str, ...]:
    if isinstance(tags, str) or not isinstance(tags, Iterable):
        raise InvalidOptionsError("tags", f"must be a list of strings, got {tags!r}")
    result = tuple(tags)
    if len(result) > MAX_TAGS:
        raise InvalidOptionsError("tags", f"at most {MAX_TAGS} tags, got {len(result)}")
    for tag in result:
        if not isinstance(tag, str) or not tag:
            raise InvalidOptionsError("tags", f"each tag must be a non-empty string, got {tag!r}")
        if len(tag) > MAX_TAG_LENGTH:
            raise InvalidOptionsError(
                "tags",
                f"tag {tag[:40]!r}... is {len(tag)} characters; the limit is {MAX_TAG_LENGTH}",
            )
        check_text("tags", tag)
    return result


def check_timeout(timeout: object) -> dt.timedelta | None:
    """``None`` (or a negative duration, River's -1) means no limit; longer than
    :data:`~sa_jobs._base.durations.MAX_TIMEOUT` (365 days) is clamped to it."""
    if timeout is None:
        return None
    if isinstance(timeout, int | float) and not isinstance(timeout, bool):
        finite = not isinstance(timeout, float) or math.isfinite(timeout)
        if finite and timeout < 0:
            return None  # River's -1, however large
        if not finite:
            raise InvalidOptionsError(
                "timeout",
                f"must be a finite number of seconds, got {timeout!r}; use None for no limit",
            )
        if timeout > MAX_TIMEOUT.total_seconds():
            return MAX_TIMEOUT
        timeout = dt.timedelta(seconds=timeout)
    if not isinstance(timeout, dt.timedelta):
        raise InvalidOptionsError(
            "timeout", f"must be a timedelta, a number of seconds or None, got {timeout!r}"
        )
    if timeout < dt.timedelta(0):
        return None
    if timeout == dt.timedelta(0):
        raise InvalidOptionsError("timeout", "must be positive; use None for no limit")
    return min(timeout, MAX_TIMEOUT)


def check_scheduled_at(scheduled_at: object) -> dt.datetime:
    if not isinstance(scheduled_at, dt.datetime):
        raise InvalidOptionsError(
            "scheduled_at", f"must be a datetime, got {type(scheduled_at).__name__}"
        )
    if scheduled_at.tzinfo is None or scheduled_at.utcoffset() is None:
        raise InvalidOptionsError(
            "scheduled_at",
            f"{scheduled_at.isoformat()} is naive; pass a time-zone-aware datetime such as "
            "datetime.now(timezone.utc) + timedelta(minutes=5)",
        )
    try:
        check_instant(scheduled_at)
    except ValueError as exc:
        raise InvalidOptionsError("scheduled_at", str(exc)) from None
    return scheduled_at


def check_metadata(metadata: object) -> dict[str, Any]:
    if not isinstance(metadata, Mapping):
        raise InvalidOptionsError("metadata", f"must be a dict, got {type(metadata).__name__}")
    result = dict(metadata)
    try:
        check_json_document(result, "metadata")
    except InvalidJobArgsError as exc:
        raise InvalidOptionsError("metadata", str(exc)) from exc
    return result
