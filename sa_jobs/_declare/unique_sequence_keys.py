"""Unique and sequence keys: canonical bytes, hashed.

A key is the SHA-256 of its canonical bytes, so the same options and args give the
same key in every process, on every host, in every time zone. The canonical bytes are
UTF-8 text, one ``name=value`` line per dimension in this fixed order, joined by ``\\n``
(no trailing newline)::

    sa_jobs:unique:v1              first line: what the key is for, and its version
    kind="reconcile_account"       unless exclude_kind; the kind as a JSON string
    args={"account_id":1}          if by_args; see "args" below
    period=1700000000000000        if by_period; see "period" below
    queue="default"                if by_queue; the queue as a JSON string

JSON strings escape newlines, so no value can forge a line.

**args** — the job's stored args JSON object (as the converter wrote it), restricted to
the fields marked ``sa_jobs.field(unique=True)`` if the class marks any. A field holding
a nested attrs class that marks fields of its own contributes only those, marked or not
itself; any other marked field is kept whole. The top-level keys are sorted; nested
values keep the converter's order (River sorts the top level only, and so do we).
Serialised compactly: ``separators=(",", ":")``, non-ASCII characters as themselves.

**period** — the insert time, or ``scheduled_at`` when given, as whole microseconds
since the Unix epoch in UTC, floored to a multiple of the period in microseconds. A
15-minute period puts 15:21 in the bucket starting 15:15.

Sequence keys (``sa_jobs:sequence:v1``) are built the same way from the fields marked
``sa_jobs.field(sequence=True)``, without a period.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
from collections.abc import Mapping
from json.encoder import encode_basestring
from typing import Any

import attrs

from sa_jobs._base.jsonvalue import dumps
from sa_jobs._declare.args import FIELD_METADATA_KEY

__all__ = ["canonical_bytes", "key_digest", "period_start_us"]

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


#: Compact, non-ASCII kept, NaN refused: the encoding the canonical bytes document.
_json = dumps

#: What ``_json`` writes for the scalars most args are made of. A key costs one
#: ``_json`` call per value otherwise, and setting up the encoder for each call was most
#: of a unique insert's Python time; these write the same text without it.
_SCALAR_JSON: dict[type, Any] = {
    str: encode_basestring,  # the escaping _json applies with ensure_ascii=False
    int: int.__repr__,
    bool: lambda value: "true" if value else "false",
    type(None): lambda _value: "null",
}


def _encode(value: Any) -> str:
    """Exactly ``_json(value)``; scalars of the exact types above take a shortcut."""
    shortcut = _SCALAR_JSON.get(type(value))
    return shortcut(value) if shortcut is not None else _json(value)


def period_start_us(at: dt.datetime, period: dt.timedelta) -> int:
    """``at`` floored to a multiple of ``period``, in microseconds since the epoch (UTC)."""
    elapsed = at - _EPOCH
    elapsed_us = (elapsed.days * 86_400 + elapsed.seconds) * 1_000_000 + elapsed.microseconds
    period_us = (period.days * 86_400 + period.seconds) * 1_000_000 + period.microseconds
    return (elapsed_us // period_us) * period_us


def marked_subset(args_class: type, data: Mapping[str, Any], flag: str) -> dict[str, Any] | None:
    """``data`` restricted to the fields of ``args_class`` marked with ``flag``.

    Returns None when the class marks no field (directly or in nested attrs classes).
    """
    plan = _marked_fields(args_class, flag)
    if plan is None:
        return None
    kept: dict[str, Any] = {}
    for name, nested_type in plan:
        if name not in data:
            continue
        value = data[name]
        if nested_type is None:
            kept[name] = value
        elif isinstance(value, Mapping):
            nested = marked_subset(nested_type, value, flag)
            if nested is not None:
                kept[name] = nested
    return kept or None


@functools.cache
def _marked_fields(args_class: type, flag: str) -> tuple[tuple[str, type | None], ...] | None:
    """Per class, once: the marked fields (None) and the nested attrs classes to look into."""
    if not attrs.has(args_class):
        return None
    plan: list[tuple[str, type | None]] = []
    for field in attrs.fields(args_class):
        marked = field.metadata.get(FIELD_METADATA_KEY, {}).get(flag)
        if isinstance(field.type, type) and _marked_fields(field.type, flag) is not None:
            # A nested class that marks fields of its own contributes only those,
            # whether or not the field holding it is marked (River recurses the same way).
            plan.append((field.name, field.type))
        elif marked:
            plan.append((field.name, None))
    return tuple(plan) or None


def canonical_args(args_class: type, data: Any, flag: str) -> str:
    """The ``args=`` value: the marked subset (or everything), top-level keys sorted."""
    if not isinstance(data, Mapping):
        # Array payloads (job keys) have no fields to pick from.
        return _json(data)
    chosen = marked_subset(args_class, data, flag)
    source = chosen if chosen is not None else data
    return "{" + ",".join(f"{_encode(k)}:{_encode(source[k])}" for k in sorted(source)) + "}"


def canonical_bytes(
    purpose: str,
    *,
    kind: str | None,
    args: str | None = None,
    period_us: int | None = None,
    queue: str | None = None,
) -> bytes:
    """Assemble the canonical bytes; each ``None`` dimension is left out."""
    lines = [f"sa_jobs:{purpose}:v1"]
    if kind is not None:
        lines.append(f"kind={_encode(kind)}")
    if args is not None:
        lines.append(f"args={args}")
    if period_us is not None:
        lines.append(f"period={period_us}")
    if queue is not None:
        lines.append(f"queue={_encode(queue)}")
    return "\n".join(lines).encode("utf-8")


def key_digest(canonical: bytes) -> bytes:
    return hashlib.sha256(canonical).digest()
