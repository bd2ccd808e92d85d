"""Paths into job args, and what is declared there: for errors that name a field.

A path is the keys and indices from the args object down to one value (``["lines", 2,
"sku"]``); :func:`walk` renders it from the class (``Order.lines[2].sku``) and finds the
type declared there, :func:`value_at` the value the caller gave, :func:`fits` whether
that value is of the declared type (only to word an error: what is refused is decided
elsewhere). Also the two facts about records every module that reads annotations needs:
:func:`is_record` and :func:`record_field_types`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import types
import typing
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

import attrs

from sa_jobs._base.jsonvalue import Segment, render_path

__all__ = [
    "Unresolved",
    "advice",
    "fits",
    "is_record",
    "item_type",
    "json_at",
    "mapping_types",
    "narrowed",
    "record_field_types",
    "segment_kinds",
    "show",
    "type_name",
    "value_at",
    "walk",
]

#: How much of a value's repr an error shows.
_SHOWN = 80


def is_record(tp: Any) -> bool:
    """An attrs class or a dataclass: a JSON object of its fields, which cattrs knows."""
    return isinstance(tp, type) and (attrs.has(tp) or dataclasses.is_dataclass(tp))


class Unresolved(Exception):
    """An annotation names something not defined (yet)."""


def record_field_types(tp: type) -> list[tuple[str, Any]]:
    """Each field's name and resolved type (string annotations evaluated).

    Raises:
        Unresolved: an annotation names something not defined.
    """
    try:
        if attrs.has(tp):
            attrs.resolve_types(tp)
            return [(item.name, item.type) for item in attrs.fields(tp)]
        hints = typing.get_type_hints(tp)
    except NameError as exc:
        raise Unresolved(
            f"cannot resolve the type annotations of {tp.__qualname__}: {exc}"
        ) from exc
    return [(item.name, hints.get(item.name, Any)) for item in dataclasses.fields(tp)]


def walk(cls: type, path: Sequence[Segment]) -> tuple[str, Any]:
    """``path`` rendered from ``cls`` (``SendEmail.items[2].sku``) and the type declared
    there (``Any`` where the annotations do not say)."""
    tp: Any = cls
    for segment in path:
        tp = _step(tp, segment)
    return render_path(cls.__qualname__, path, segment_kinds(cls, path)), tp


def segment_kinds(cls: type, path: Sequence[Segment]) -> list[str]:
    """For each segment: ``field``, ``key``, ``index`` or ``element`` (of a set)."""
    kinds = []
    tp: Any = cls
    for segment in path:
        inner = narrowed(tp, segment)
        origin = typing.get_origin(inner) or inner
        if is_record(inner) and isinstance(segment, str):
            kinds.append("field")
        elif isinstance(origin, type) and issubclass(origin, AbstractSet):
            kinds.append("element")
        elif isinstance(segment, int):
            kinds.append("index")
        else:
            kinds.append("key")
        tp = _step(tp, segment)
    return kinds


def _step(tp: Any, segment: Segment) -> Any:
    tp = narrowed(tp, segment)
    if is_record(tp):
        try:
            return dict(record_field_types(tp)).get(str(segment), Any)
        except Unresolved:
            return Any
    origin = typing.get_origin(tp) or tp
    if isinstance(origin, type) and issubclass(origin, Mapping):
        return mapping_types(tp)[1]
    if isinstance(origin, type) and issubclass(origin, AbstractSet | list | tuple | Sequence):
        return item_type(tp, segment if isinstance(segment, int) else 0)
    return Any


def narrowed(tp: Any, hint: object) -> Any:
    """A union narrowed to the member ``hint`` (a value or a path segment) belongs to:
    ``X | None`` to ``X``, else the first member of the right shape."""
    origin = typing.get_origin(tp)
    if origin is not typing.Union and origin is not types.UnionType:
        return tp
    members = [m for m in typing.get_args(tp) if m is not type(None)]
    if len(members) == 1:
        return members[0]
    for member in members:
        shape = typing.get_origin(member) or member
        if not isinstance(shape, type):
            continue
        if isinstance(hint, int) and issubclass(shape, list | tuple | AbstractSet):
            return member
        if isinstance(hint, str) and (is_record(shape) or issubclass(shape, Mapping)):
            return member
        if isinstance(hint, Mapping) and (is_record(shape) or issubclass(shape, Mapping)):
            return member
        if is_record(shape) and isinstance(hint, shape):
            return member
    return tp


def mapping_types(tp: Any) -> tuple[Any, Any]:
    """A mapping type's key and value types (``Any`` where it does not say)."""
    arguments = typing.get_args(tp)
    return (arguments[0], arguments[1]) if len(arguments) == 2 else (Any, Any)


def item_type(tp: Any, index: int) -> Any:
    """The type of a sequence's item at ``index`` (a tuple's own, else the one)."""
    arguments = [a for a in typing.get_args(narrowed(tp, index)) if a is not Ellipsis]
    origin = typing.get_origin(tp)
    if origin is tuple and len(arguments) > 1 and 0 <= index < len(arguments):
        return arguments[index]
    return arguments[0] if arguments else Any


def value_at(original: object, data: Any, path: Sequence[Segment]) -> tuple[Any, bool]:
    """The value at ``path``: the Python one when it can be followed in ``original``
    (fields, list indices, string keys), else the stored JSON's; and whether found."""
    if original is not None:
        value: Any = original
        for segment in path:
            if is_record(type(value)) and isinstance(segment, str) and hasattr(value, segment):
                value = getattr(value, segment)
            elif isinstance(value, list | tuple) and isinstance(segment, int):
                if not 0 <= segment < len(value):
                    break
                value = value[segment]
            elif isinstance(value, Mapping) and segment in value:
                value = value[segment]
            elif isinstance(value, AbstractSet) and segment in value:
                value = segment
            else:
                break
        else:
            return value, True
    return json_at(data, path)


def json_at(data: Any, path: Sequence[Segment]) -> tuple[Any, bool]:
    """The JSON value at ``path`` in ``data``, and whether there is one."""
    value = data
    for segment in path:
        in_object = isinstance(value, dict) and segment in value
        in_array = (
            isinstance(value, list | tuple) and isinstance(segment, int) and segment < len(value)
        )
        if not (in_object or in_array):
            return None, False
        value = value[segment]
    return value, True


def fits(value: Any, tp: Any) -> bool | None:
    """Whether ``value`` is of the declared type ``tp``, as far as a glance can tell
    (None: cannot tell). Only for wording errors: the check itself is the read back."""
    if tp is Any:
        return True
    if tp is None or tp is type(None):
        return value is None
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        answers = [fits(value, member) for member in typing.get_args(tp)]
        return True if True in answers else (None if None in answers else False)
    if origin is typing.Literal:
        return any(type(value) is type(a) and value == a for a in typing.get_args(tp))
    target = origin or tp
    if not isinstance(target, type):
        return None
    if target is bool:
        return isinstance(value, bool)
    if target is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if target is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if target is dt.date:
        # A datetime is a date to isinstance, but not to a date field's reader.
        return isinstance(value, dt.date) and not isinstance(value, dt.datetime)
    return isinstance(value, target)


def type_name(tp: Any) -> str:
    """A type as a reader writes it: ``list[int] | None``, ``datetime``, ``Address``."""
    if tp is Any:
        return "Any"
    if tp is None or tp is type(None):
        return "None"
    origin = typing.get_origin(tp)
    arguments = typing.get_args(tp)
    if origin is typing.Union or origin is types.UnionType:
        return " | ".join(type_name(member) for member in arguments)
    if origin is typing.Literal:
        return f"Literal[{', '.join(map(repr, arguments))}]"
    if origin is not None and arguments:
        inner = ", ".join("..." if a is Ellipsis else type_name(a) for a in arguments)
        return f"{type_name(origin)}[{inner}]"
    if isinstance(tp, type):
        return tp.__qualname__
    return str(tp).replace("typing.", "")


def advice(declared: Any) -> str:
    """What to do about a value that is not of the ``declared`` type."""
    return f"pass a value of type {type_name(declared)} (or change the field's annotation)"


def show(value: Any, *, with_type: bool = True) -> str:
    """``value`` as an error shows it: its repr, shortened, and its type."""
    text = repr(value)
    if len(text) > _SHOWN:
        text = text[: _SHOWN - 3] + "..."
    return f"{text} ({type(value).__qualname__})" if with_type else text
