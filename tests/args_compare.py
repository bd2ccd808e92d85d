"""Comparing job args with what came back from storage, datetimes included.

``==`` between aware datetimes with different tzinfo objects compares instants, except
that Python makes it ``False`` for a wall time in a DST fold or gap; stored args come back
with a fixed offset rather than the zone. So datetimes are compared by wall time and UTC
offset (what the stored ISO string carries), everything else by value and type.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import attrs


def comparable(value: Any) -> Any:
    """``value`` as nested tuples in which datetimes are (wall time, offset) pairs."""
    if isinstance(value, dt.datetime):
        return ("datetime", value.replace(tzinfo=None), value.utcoffset())
    if attrs.has(type(value)):
        fields = attrs.fields(type(value))
        return (type(value), tuple(comparable(getattr(value, f.name)) for f in fields))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.fields(value)
        return (type(value), tuple(comparable(getattr(value, f.name)) for f in fields))
    if hasattr(type(value), "model_fields"):  # a pydantic model
        names = type(value).model_fields
        return (type(value), tuple(comparable(getattr(value, name)) for name in names))
    if isinstance(value, dict):
        return (dict, tuple(sorted((k, comparable(v)) for k, v in value.items())))
    if isinstance(value, list | tuple):
        return (type(value), tuple(comparable(item) for item in value))
    return (type(value), value)
