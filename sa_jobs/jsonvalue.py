"""JSON values PostgreSQL's ``jsonb`` stores faithfully, and the canonical encoding.

Args, metadata and keys all end up as ``jsonb`` or inside key bytes. :func:`check_json_document`
refuses what ``jsonb`` would reject or alter — NUL characters and lone surrogates in
strings, non-finite floats, non-string object keys, unknown types, nesting deeper than
:data:`MAX_DEPTH` — before anything is sent. :func:`dumps` is the compact encoding key
bytes and set ordering use.
"""

from __future__ import annotations

import json
import math
from typing import Any

from sa_jobs.errors import InvalidJobArgsError

__all__ = ["MAX_DEPTH", "check_json_document", "dumps", "unstorable_text"]

#: How deeply a stored JSON document (args, metadata) may nest.
MAX_DEPTH = 100

# json.dumps with non-default options builds a new encoder per call; keys need thousands.
_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def dumps(data: Any) -> str:
    """Compact JSON, non-ASCII kept, NaN refused: set ordering and canonical key bytes."""
    return _JSON.encode(data)


def check_json_document(data: Any, owner: str) -> None:
    """Reject what PostgreSQL's jsonb would refuse or change.

    Raises:
        InvalidJobArgsError: saying what, and where.
    """
    # Iterative, so a document nested past the limit is refused, not a RecursionError.
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            _check_json_string(value, owner)
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise InvalidJobArgsError(
                    f"{owner} args hold the float {value}, which JSON cannot represent; "
                    "use None or a Decimal"
                )
        elif isinstance(value, dict | list | tuple):
            if depth > MAX_DEPTH:
                raise InvalidJobArgsError(
                    f"{owner} is nested more than {MAX_DEPTH} levels deep; flatten it"
                )
            if isinstance(value, dict):
                for key, item in value.items():
                    if not isinstance(key, str):
                        raise InvalidJobArgsError(
                            f"{owner} args hold a dict key {key!r} ({type(key).__name__}); "
                            "JSON object keys must be strings, so convert the key to a string"
                        )
                    _check_json_string(key, owner)
                    stack.append((item, depth + 1))
            else:
                stack.extend((item, depth + 1) for item in value)
        elif value is None or isinstance(value, bool | int):
            continue
        else:
            raise InvalidJobArgsError(
                f"{owner} args hold a {type(value).__name__}, which the converter does not know; "
                "register an unstructure hook for it on the kind's converter"
            )


def unstorable_text(value: str) -> str | None:
    """Why PostgreSQL cannot store ``value`` as text or in jsonb, or None if it can."""
    if "\x00" in value:
        return "a NUL character"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "a lone surrogate (not valid Unicode)"
    return None


def _check_json_string(value: str, owner: str) -> None:
    problem = unstorable_text(value)
    if problem is not None:
        raise InvalidJobArgsError(
            f"{owner} args hold a string with {problem}, which PostgreSQL's jsonb cannot "
            "store; clean the value or encode it (e.g. base64)"
        )
