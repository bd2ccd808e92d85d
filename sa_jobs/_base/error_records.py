"""The records appended to a job's ``errors``: always storable, whatever was raised.

A handler may raise anything: an exception whose text holds NUL characters or lone
surrogates (which PostgreSQL's ``jsonb`` refuses), a megabyte of message, an exception
whose ``__str__`` itself raises. None of that may stop the outcome from being written —
one unwritable record used to hold up every later outcome of the process — so a record
is made storable here, before it goes anywhere near the database:

* NUL characters and lone surrogates become U+FFFD (the replacement character);
* a message longer than :data:`MAX_MESSAGE` characters keeps its beginning and ends with
  ``[… N more characters]``; a traceback longer than :data:`MAX_TRACE` keeps its end (the
  innermost frames) and starts with ``[… N earlier characters]``;
* an exception whose ``str()`` raises is recorded as
  ``ValueError: <str() raised TypeError: …>``.
"""

from __future__ import annotations

import re
import traceback
from typing import Any

__all__ = ["MAX_MESSAGE", "MAX_TRACE", "describe", "error_record", "message_record", "storable"]

#: Characters of an error message kept in a record.
MAX_MESSAGE = 2_000
#: Characters of a traceback kept in a record (the last ones).
MAX_TRACE = 8_000

REPLACEMENT = "\ufffd"
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def storable(text: str) -> str:
    """``text`` with the characters PostgreSQL cannot store replaced by U+FFFD."""
    return _UNSTORABLE.sub(REPLACEMENT, text)


def _head(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}[… {len(text) - limit} more characters]"


def _tail(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"[… {len(text) - limit} earlier characters]\n{text[-limit:]}"


def describe(exc: BaseException) -> str:
    """``"TypeName: message"`` for any exception, even one whose ``str()`` raises."""
    name = type(exc).__name__
    try:
        message = str(exc)
    except Exception as broken:  # a user's __str__ may do anything
        message = f"<str() raised {type(broken).__name__}>"
    return storable(_head(f"{name}: {message or name}", MAX_MESSAGE))


def _trace(exc: BaseException) -> str:
    try:
        text = "".join(traceback.format_exception(exc))
    except Exception as broken:
        text = f"<the traceback could not be formatted: {type(broken).__name__}>"
    return storable(_tail(text, MAX_TRACE))


def error_record(attempt: int, exc: BaseException, *, with_trace: bool = True) -> dict[str, Any]:
    """The JSON appended to ``errors`` for an attempt that raised ``exc``.

    The time is added by the database when the record is written (``"at"``).
    """
    record: dict[str, Any] = {"attempt": attempt, "error": describe(exc)}
    if with_trace:
        record["trace"] = _trace(exc)
    return record


def message_record(attempt: int | None, error: str) -> dict[str, Any]:
    """A record for an ending the worker describes itself (a rescue, an unwritable outcome).

    ``attempt`` may be unknown (None) to a writer that has only the outcome."""
    return {"attempt": attempt, "error": storable(_head(error, MAX_MESSAGE))}
