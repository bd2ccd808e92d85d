"""The insert-time check that a job's args read back as they were given.

attrs does not check types, so ``SendEmail(to=123)`` builds. The worker rebuilds args
from the stored JSON with the kind's converter (cattrs ``structure``), which is lenient:
``str(123)`` and ``int("12")`` succeed, ``int("abc")`` does not. A wrong-typed value
would therefore either be stored and then fail every attempt, or reach the handler as
another value than the one enqueued (``'123'``, not ``123``).

:func:`check_reads_back` does at insert what the worker will do — structure the JSON
back with the same converter — and writes the result out again: the insert goes ahead
only if that gives back the very JSON being stored. JSON's own types are compared: a
boolean is not a number, ``1`` and ``1.0`` are the same number (so an ``int`` given to a
``float`` field passes), an array is an array whether it came from a list or a tuple.
Otherwise the error names the field (its path, for a nested one), the value and the
declared type.

The same naming serves the two other ways a value can fail before any SQL: the
converter cannot write it (:func:`explain_unwritable`: a ``str`` in a ``datetime``
field, a tuple as a dict key) or ``jsonb`` could not store what it wrote
(:func:`explain_unstorable`: a ``Decimal`` in a ``float`` field, ``NaN``).
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import cattrs
from cattrs.errors import AttributeValidationNote, IterableValidationNote

from sa_jobs._base.jsonvalue import Segment, Unstorable, render_path
from sa_jobs._declare.args_paths import (
    advice,
    fits,
    is_record,
    item_type,
    json_at,
    mapping_types,
    narrowed,
    record_field_types,
    segment_kinds,
    show,
    type_name,
    value_at,
    walk,
)
from sa_jobs.errors import InvalidJobArgsError

__all__ = ["check_reads_back", "explain_unstorable", "explain_unwritable"]


# --------------------------------------------------------------------------- the check


def check_reads_back(
    converter: cattrs.Converter, cls: type, data: Any, original: object = None
) -> None:
    """Refuse ``data`` (the JSON stored for an instance of ``cls``) unless the worker's
    decode reads it back into args that write out the same JSON.

    Args:
        converter: The kind's cattrs converter, the one the worker decodes with.
        cls: The args class.
        data: The JSON object about to be stored (already checked storable).
        original: The args instance ``data`` was made from, to show its values; None
            for JSON given as it is (a ``Job`` built by hand).

    Raises:
        InvalidJobArgsError: naming the field, the value and the declared type.
    """
    try:
        again = converter.unstructure(converter.structure(data, cls), unstructure_as=cls)
    except Exception as exc:
        failed_at, leaf = _failed_at(exc)
        raise InvalidJobArgsError(_unreadable(cls, data, original, failed_at, leaf)) from (
            None if leaf is not exc else exc
        )
    differs_at = _difference(data, again)
    if differs_at is not None:
        raise InvalidJobArgsError(_changed(converter, cls, data, again, original, differs_at))


def _difference(stored: Any, again: Any) -> list[Segment] | None:
    """Where two JSON documents differ (JSON's types: booleans apart from numbers, 1 the
    same number as 1.0, lists and tuples alike), or None where they do not."""
    if stored is again:
        return None
    if isinstance(stored, dict):
        if not isinstance(again, dict):
            return []
        for key, value in stored.items():
            other = again.get(key, _MISSING)
            if value is other:
                continue
            # Most values are strings and numbers of one type: compared here, without a call.
            kind = type(value)
            if kind is type(other) and (kind is str or kind is int or kind is float):
                if value == other:
                    continue
                return [key]
            below = _difference(value, other)
            if below is not None:
                return [key, *below]
        extra = next((key for key in again if key not in stored), None)
        return None if extra is None else [extra]
    if isinstance(stored, list | tuple):
        if not isinstance(again, list | tuple) or len(again) != len(stored):
            return []
        for index, (value, other) in enumerate(zip(stored, again, strict=True)):
            below = _difference(value, other)
            if below is not None:
                return [index, *below]
        return None
    if (
        again is _MISSING
        or isinstance(again, dict | list | tuple)
        or isinstance(stored, bool) != isinstance(again, bool)
    ):
        return []
    if type(stored) is not type(again) and isinstance(stored, int | float):
        return None if _same_number(stored, again) else []
    return None if stored == again else []


#: A key the document read back lacks.
_MISSING = object()


def _same_number(stored: int | float, again: Any) -> bool:
    """An int and a float as JSON numbers: the decimals their JSON text stands for.

    That is what ``jsonb`` keeps (``numeric``): ``3.423166889590815e+16`` is stored as
    ``34231668895908150``, which an ``int`` field reads back as that integer — here
    ``int()`` of the float gave its binary value, ``34231668895908152``, instead.
    """
    if not isinstance(again, int | float) or isinstance(again, bool):
        return False
    exact = _decimal(stored)
    if isinstance(stored, float) and isinstance(again, int) and again == int(stored):
        return exact == exact.to_integral_value()
    return exact == _decimal(again)


def _decimal(number: int | float) -> Decimal:
    # float.__repr__ is the JSON text (an IntEnum's or a float subclass's repr is not).
    return Decimal(float.__repr__(number)) if isinstance(number, float) else Decimal(int(number))


def _failed_at(exc: BaseException) -> tuple[list[Segment], BaseException]:
    """The path cattrs' notes give to the first failure inside ``exc``, and that failure."""
    path: list[Segment] = []
    while isinstance(exc, cattrs.ClassValidationError | cattrs.IterableValidationError):
        with_notes, without = exc.group_exceptions()
        if with_notes:
            inner, note = with_notes[0]
            if isinstance(note, AttributeValidationNote):
                path.append(note.name)
            elif isinstance(note, IterableValidationNote):
                path.append(note.index)
            exc = inner
        elif without:
            exc = without[0]
        else:
            break
    return path, exc


def _unreadable(
    cls: type, data: Any, original: object, path: list[Segment], leaf: BaseException
) -> str:
    where, declared = walk(cls, path)
    value, known = value_at(original, data, path)
    reason = str(leaf) or type(leaf).__name__
    if isinstance(leaf, KeyError):
        return (
            f"{where} is written without a value and the worker could not read it back "
            f"(missing {reason}); check the class's hooks and field aliases"
        )
    if not known:
        return f"{where} does not read back: the worker could not decode it ({reason})"
    if fits(value, declared) is False:
        return (
            f"{where} holds {show(value)}, but it is declared {type_name(declared)}: the worker "
            f"could not read it back ({reason}); {advice(declared)}"
        )
    return f"{where} holds {show(value)}, which the worker could not read back ({reason}); {_OWN}"


def _changed(
    converter: cattrs.Converter,
    cls: type,
    data: Any,
    again: Any,
    original: object,
    path: list[Segment],
) -> str:
    where, declared = walk(cls, path)
    if path and segment_kinds(cls, path)[-1] == "element":
        return _changed_element(converter, where, declared, data, again, path)
    value, _ = value_at(original, data, path)
    back, found = json_at(again, path)
    comes_back = f"as {show(back, with_type=False)}" if found else "without it"
    if fits(value, declared) is False:
        return (
            f"{where} holds {show(value)}, but it is declared {type_name(declared)}: the worker "
            f"would read it back {comes_back}, not as given; {advice(declared)}"
        )
    if isinstance(value, int) and isinstance(back, float):
        return (
            f"{where} holds {show(value)}, which the worker would read back {comes_back}: "
            "no float holds that integer exactly; declare the field int (or Decimal)"
        )
    return f"{where} holds {show(value)}, which the worker would read back {comes_back}; {_OWN}"


def _changed_element(
    converter: cattrs.Converter,
    where: str,
    declared: Any,
    data: Any,
    again: Any,
    path: list[Segment],
) -> str:
    """A set's elements come back sorted anew, so the index that differs says nothing:
    name the element the read back lacks, and what it becomes alone."""
    stored, _ = json_at(data, path[:-1])
    back, _ = json_at(again, path[:-1])
    value = next(
        (x for x in stored or () if all(_difference(x, y) is not None for y in back or ())),
        json_at(data, path)[0],
    )
    try:
        alone = converter.unstructure(converter.structure(value, declared), unstructure_as=declared)
    except Exception as exc:
        outcome = f"could not read it back ({exc})"
    else:
        outcome = f"would read it back as {show(alone, with_type=False)}, not as given"
    if fits(value, declared) is False:
        return (
            f"{where} holds {show(value)}, but it is declared {type_name(declared)}: the worker "
            f"{outcome}; {advice(declared)}"
        )
    return f"{where} holds {show(value)}, which the worker {outcome}; {_OWN}"


#: Advice for a value of the declared type that still does not read back.
_OWN = (
    "its type's hooks on the kind's converter, or the checks its class runs when rebuilt, "
    "do not take back what was written"
)


# --------------------------------------------------------------------------- other failures


def explain_unwritable(converter: cattrs.Converter, cls: type, args: object) -> str | None:
    """Which field of ``args`` the converter failed to write, and why (None: not found).

    Called only after ``converter.unstructure(args)`` raised: each field is written
    again alone, down to the value that fails.
    """
    found = _locate(converter, cls, args, [])
    if found is None:
        return None
    path, value, declared, leaf = found
    where = render_path(cls.__qualname__, path, segment_kinds(cls, path))
    if isinstance(leaf, _BadKey):
        return (
            f"{where} holds a dict key {show(leaf.key)}; JSON object keys must be strings, "
            "so convert the key to a string (for example ','.join(...) of a tuple's parts)"
        )
    if isinstance(leaf, InvalidJobArgsError):
        return f"{where}: {leaf}"
    reason = str(leaf) or type(leaf).__name__
    if fits(value, declared) is False:
        return (
            f"{where} holds {show(value)}, but it is declared {type_name(declared)}, and it "
            f"cannot be written as one ({reason}); {advice(declared)}"
        )
    return (
        f"{where} holds {show(value)}, which the converter cannot write ({reason}); "
        f"register an unstructure hook for {type(value).__qualname__} on the kind's converter"
    )


def explain_unstorable(cls: type, args: object, problem: Unstorable) -> str:
    """``problem`` (found in the JSON written for ``args``) with the field and its type."""
    where, declared = walk(cls, problem.path)
    if problem.reason == "depth":
        return problem.describe(cls.__qualname__)
    value, known = value_at(args, None, problem.path)
    if known and fits(value, declared) is False:
        return (
            f"{where} holds {show(value)}, but it is declared {type_name(declared)}; "
            f"{advice(declared)}"
        )
    return f"{where} holds {problem.what}{problem.why}"


class _BadKey(Exception):
    """A dict key that cannot become a JSON object key."""

    def __init__(self, key: object) -> None:
        super().__init__(f"dict key {key!r}")
        self.key = key


def _locate(
    converter: cattrs.Converter, tp: Any, value: Any, path: list[Segment]
) -> tuple[list[Segment], Any, Any, BaseException] | None:
    """The innermost value under ``value`` (of type ``tp``) that fails to be written."""
    tp = narrowed(tp, value)
    if is_record(tp) and isinstance(value, tp):
        for name, field_type in record_field_types(tp):
            item = getattr(value, name, None)
            failure = _write_failure(converter, item, field_type)
            if failure is not None:
                here = [*path, name]
                return _locate(converter, field_type, item, here) or (
                    here,
                    item,
                    field_type,
                    failure,
                )
        return None
    if isinstance(value, Mapping):
        key_type, value_type = mapping_types(tp)
        for key, item in value.items():
            # A UUID, a date or a str enum becomes a string key; a tuple or an int cannot.
            if not isinstance(key, str) and not isinstance(
                _quietly_written(converter, key, key_type), str
            ):
                return path, value, tp, _BadKey(key)
            failure = _write_failure(converter, item, value_type)
            if failure is not None:
                here = [*path, key if isinstance(key, str) else repr(key)]
                return _locate(converter, value_type, item, here) or (
                    here,
                    item,
                    value_type,
                    failure,
                )
        return None
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            declared = item_type(tp, index)
            failure = _write_failure(converter, item, declared)
            if failure is not None:
                here = [*path, index]
                return _locate(converter, declared, item, here) or (
                    here,
                    item,
                    declared,
                    failure,
                )
        return None
    return None


def _write_failure(converter: cattrs.Converter, value: Any, tp: Any) -> BaseException | None:
    try:
        converter.unstructure(value, unstructure_as=tp if tp is not Any else None)
    except Exception as exc:
        return exc
    return None


def _quietly_written(converter: cattrs.Converter, value: Any, tp: Any) -> Any:
    try:
        return converter.unstructure(value, unstructure_as=tp if tp is not Any else None)
    except Exception:
        return None
