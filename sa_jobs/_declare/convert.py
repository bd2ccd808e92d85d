"""Converting job args to the JSON stored in a row, and back: :class:`ArgsConverter`.

Every value must survive a round trip through a PostgreSQL ``jsonb`` column unchanged,
so the converter refuses, before anything is written, what could not come back:

* values ``jsonb`` would reject or alter — naive datetimes (ambiguous between processes
  in different zones), non-finite floats, strings holding NUL characters or lone
  surrogates, non-string object keys, documents nested more than :data:`MAX_DEPTH`
  levels deep;
* **field types it could write but not read back**, checked once per args class (when
  it is declared, or on first use when its annotations are forward references):
  ``object``, unions whose members look alike in JSON (``str | datetime``,
  ``list[int] | list[str]``, two attrs classes or dataclasses nothing tells apart),
  dicts with non-string keys, and types the converter has no hook for.

Unions of plain JSON values (``int | str``, ``float | int``, ``list[int] | str``) do
round-trip: the value's JSON type picks the member. A type known only through a hook of
the user's (a pydantic model, say) has no JSON shape sa_jobs can see, so it may share a
union with ``None`` and nothing else. (One caveat, from ``jsonb`` itself:
it stores numbers as ``numeric``, so in a ``float | int`` field a float in exponent form
such as ``1e20`` comes back as the int ``100000000000000000000``.)

The default converter knows time-zone-aware datetimes, dates, UUIDs, Decimals, enums,
nested attrs classes and dataclasses, and lists/dicts of these; a kind can be given its
own (:class:`ArgsConverter` wraps a cattrs converter, reachable as ``.cattrs`` to
register hooks on).
"""

from __future__ import annotations

import collections.abc as cabc
import datetime as dt
import enum
import threading
import types
import typing
import uuid
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from decimal import Decimal
from typing import Any, TypeVar

import cattrs
from cattrs.errors import StructureHandlerNotFoundError
from cattrs.strategies import configure_union_passthrough
from cattrs.v import format_exception

from sa_jobs._base.jsonvalue import MAX_DEPTH, dumps, find_unstorable
from sa_jobs._declare.args_check import check_reads_back, explain_unstorable, explain_unwritable
from sa_jobs._declare.args_paths import Unresolved, is_record, record_field_types
from sa_jobs._declare.refs import is_ref_type, mapper_of, ref_model, register_ref_hooks
from sa_jobs.errors import InvalidJobArgsError

__all__ = ["ArgsConverter", "default_converter"]

T = TypeVar("T")

# --------------------------------------------------------------------------- the converter


class ArgsConverter:
    """Turns job args instances into JSON-ready dicts and back (see the module docstring)."""

    def __init__(self, converter: cattrs.Converter | None = None) -> None:
        self.cattrs = converter if converter is not None else _make_cattrs_converter()
        self._checked: set[type] = set()
        self._lock = threading.Lock()

    def check_class(self, cls: type, *, unresolved_ok: bool = False) -> None:
        """Make sure every field of ``cls`` reads back what it writes (once per class).

        With ``unresolved_ok``, annotations that cannot be resolved yet (forward
        references in a module still importing) postpone the check to the first use.

        Raises:
            InvalidJobArgsError: a field type would be written but could not be read back,
                or the annotations cannot be resolved.
        """
        if cls in self._checked:
            return
        with self._lock:
            try:
                problem = _undecodable(self.cattrs, cls, cls.__qualname__, set())
            except Unresolved as exc:
                if unresolved_ok:
                    return
                raise InvalidJobArgsError(str(exc)) from exc.__cause__
            if problem is not None:
                raise InvalidJobArgsError(
                    f"{problem}; sa_jobs would store such args but could not read them back, "
                    "so the job could never run"
                )
            self._checked.add(cls)

    def check_type(self, tp: Any, where: str) -> None:
        """Make sure values of ``tp`` (a kind's output type) read back what they write.

        Raises:
            InvalidJobArgsError: they would be written but could not be read back.
        """
        try:
            problem = _undecodable(self.cattrs, tp, where, set())
        except Unresolved as exc:
            raise InvalidJobArgsError(str(exc)) from exc.__cause__
        if problem is not None:
            raise InvalidJobArgsError(
                f"{problem}; sa_jobs could store such outputs but not read them back"
            )

    def to_json(self, args: object) -> dict[str, Any]:
        """Return the JSON object stored in the job row for ``args``.

        The JSON is read back as the worker will read it, and must give back the same
        document (:func:`sa_jobs._declare.args_check.check_reads_back`): a wrong-typed value is
        refused here rather than failing every attempt later.

        Raises:
            InvalidJobArgsError: the value cannot be stored faithfully, naming the field,
                the value and the declared type.
        """
        cls = type(args)
        self.check_class(cls)
        try:
            data = self.cattrs.unstructure(args, unstructure_as=cls)
        except RecursionError:
            raise InvalidJobArgsError(
                f"{cls.__qualname__} args are nested more than {MAX_DEPTH} levels deep; "
                "flatten them"
            ) from None
        except Exception as exc:
            where = explain_unwritable(self.cattrs, cls, args)
            if where is not None:
                raise InvalidJobArgsError(where) from None
            if isinstance(exc, InvalidJobArgsError):
                raise
            raise InvalidJobArgsError(
                f"cannot convert {cls.__qualname__} args to JSON: {exc}; register an unstructure "
                "hook for that type on the kind's converter"
            ) from exc
        if not isinstance(data, dict):
            raise InvalidJobArgsError(
                f"{cls.__qualname__} args must convert to a JSON object, got {type(data).__name__}"
            )
        problem = find_unstorable(data)
        if problem is not None:
            raise InvalidJobArgsError(explain_unstorable(cls, args, problem))
        check_reads_back(self.cattrs, cls, data, args)
        return data

    def check_stored(self, cls: type, data: Any) -> None:
        """Refuse JSON given as it is (a ``Job`` built by hand) that the worker could not
        read back as an instance of ``cls``, or would read back as other JSON.

        Raises:
            InvalidJobArgsError: naming the field, the value and the declared type.
        """
        self.check_class(cls)
        check_reads_back(self.cattrs, cls, data)

    def from_json(self, cls: type[T], data: Any) -> T:
        """Build an instance of ``cls`` from the JSON stored in a job row.

        Raises:
            InvalidJobArgsError: the stored JSON no longer fits the class.
        """
        self.check_class(cls)
        try:
            return self.cattrs.structure(data, cls)
        except Exception as exc:
            detail = _describe_structure_error(exc)
            raise InvalidJobArgsError(
                f"stored args do not convert to {cls.__qualname__}: {detail}; if the class "
                "changed, give new fields defaults so older jobs still load"
            ) from exc


def _make_cattrs_converter() -> cattrs.Converter:
    conv = cattrs.Converter(
        forbid_extra_keys=False,
        # Sets become arrays in a canonical order (a set's own order varies by process).
        unstruct_collection_overrides={AbstractSet: lambda items: sorted(items, key=dumps)},
    )

    def unstructure_datetime(value: dt.datetime) -> str:
        offset = value.utcoffset()
        if offset is None:
            raise InvalidJobArgsError(
                f"naive datetime {value.isoformat()} in job args; use a time-zone-aware datetime "
                "such as datetime.now(timezone.utc)"
            )
        if offset % dt.timedelta(seconds=1):
            raise InvalidJobArgsError(
                f"datetime {value.isoformat()} has a UTC offset with a fraction of a second, "
                "which does not survive storage; use a whole-second offset"
            )
        return value.isoformat()

    def structure_datetime(value: Any, _: type) -> dt.datetime:
        parsed = dt.datetime.fromisoformat(value)
        if parsed.tzinfo is None:
            raise ValueError(f"stored datetime {value!r} has no time zone")
        return parsed

    conv.register_unstructure_hook(dt.datetime, unstructure_datetime)
    conv.register_structure_hook(dt.datetime, structure_datetime)
    conv.register_unstructure_hook(dt.date, lambda value: value.isoformat())
    conv.register_structure_hook(dt.date, lambda value, _: dt.date.fromisoformat(value))
    # Decimals travel as strings: a JSON number would pass through float precision.
    conv.register_unstructure_hook(Decimal, str)
    conv.register_structure_hook(Decimal, lambda value, _: Decimal(value))
    conv.register_unstructure_hook(uuid.UUID, str)
    conv.register_structure_hook(uuid.UUID, lambda value, _: uuid.UUID(value))
    # jsonb stores numbers as numeric: 1e20 comes back as the integer 100000000000000000000.
    conv.register_structure_hook(float, lambda value, _: float(value))
    # Unions of JSON's own types are told apart by the decoded value's type; any other
    # member of a union (a list, an attrs class) is handed to the converter.
    configure_union_passthrough(str | int | float | bool | None, conv)
    register_ref_hooks(conv)
    return conv


default_converter = ArgsConverter()


# --------------------------------------------------------------------------- decodability


class _Shape(enum.Enum):
    """What a value of a type looks like once it is JSON."""

    STRING = "a JSON string"
    NUMBER = "a JSON number"
    BOOLEAN = "a JSON boolean"
    NULL = "null"
    ARRAY = "a JSON array"
    OBJECT = "a JSON object"
    ANYTHING = "any JSON value"


_STRING_LIKE = (str, dt.datetime, dt.date, dt.time, uuid.UUID, Decimal, bytes)


_ARRAY_ORIGINS = (list, tuple, set, frozenset, cabc.Sequence, cabc.Set)
_OBJECT_ORIGINS = (dict, cabc.Mapping)


def _shape(tp: Any) -> _Shape | None:
    """The JSON shape of ``tp``'s values; None when it cannot be told."""
    if tp is Any:
        return _Shape.ANYTHING
    if tp is None or tp is type(None):
        return _Shape.NULL
    origin = typing.get_origin(tp) or tp
    if origin is typing.Literal:
        shapes = {_shape(type(value)) for value in typing.get_args(tp)}
        return shapes.pop() if len(shapes) == 1 else None
    if not isinstance(origin, type):
        return None
    if issubclass(origin, enum.Enum):
        values = {type(member.value) for member in origin}
        return _shape(values.pop()) if len(values) == 1 else None
    if issubclass(origin, bool):
        return _Shape.BOOLEAN
    if issubclass(origin, int | float):
        return _Shape.NUMBER
    if issubclass(origin, _STRING_LIKE):
        return _Shape.STRING
    if issubclass(origin, _ARRAY_ORIGINS):
        return _Shape.ARRAY
    if issubclass(origin, _OBJECT_ORIGINS) or is_record(origin):
        return _Shape.OBJECT
    return None


def _undecodable(converter: cattrs.Converter, tp: Any, where: str, seen: set[Any]) -> str | None:
    """Why values of ``tp`` (found at ``where``) would not read back, or None."""
    if tp is Any or tp is None or tp is type(None):
        return None
    if tp is object:
        return f"{where} is annotated `object`; use typing.Any for free-form JSON"
    if is_ref_type(tp):
        model = ref_model(tp)
        if model is None:
            return f"{where} is a bare Ref; name the model it references: Ref[Invoice]"
        try:
            mapper_of(model)
        except InvalidJobArgsError as exc:
            return f"{where}: {exc}"
        return None
    if is_record(tp):
        if tp in seen:
            return None
        seen.add(tp)
        for name, field_type in record_field_types(tp):
            problem = _undecodable(converter, field_type, f"{where}.{name}", seen)
            if problem is not None:
                return problem
        return None
    origin = typing.get_origin(tp)
    arguments = typing.get_args(tp)
    if origin is typing.Union or origin is types.UnionType:
        return _undecodable_union(converter, tp, arguments, where, seen)
    if origin is typing.Literal:
        return None
    if origin is not None and isinstance(origin, type) and issubclass(origin, Mapping):
        if arguments:
            key_shape = _shape(arguments[0])
            if key_shape not in (_Shape.STRING, _Shape.ANYTHING):
                return (
                    f"{where} is a dict with {_name(arguments[0])} keys; JSON object keys are "
                    "strings, so use dict[str, ...]"
                )
            return _undecodable(converter, arguments[1], f"{where}[value]", seen)
        return None
    if origin is not None and arguments:
        for argument in arguments:
            if argument is Ellipsis:
                continue
            problem = _undecodable(converter, argument, f"{where}[item]", seen)
            if problem is not None:
                return problem
    try:
        converter.get_structure_hook(tp)
    except StructureHandlerNotFoundError:
        return (
            f"{where} is a {_name(tp)}, which the converter cannot read back; give the kind "
            "a converter with hooks for it (conv = sa_jobs.ArgsConverter(); "
            "conv.cattrs.register_structure_hook(...) and register_unstructure_hook(...); "
            "@job_args(..., converter=conv)), as docs/job-args.md shows for pydantic models"
        )
    return None


def _undecodable_union(
    converter: cattrs.Converter, tp: Any, members: tuple[Any, ...], where: str, seen: set[Any]
) -> str | None:
    for member in members:
        problem = _undecodable(converter, member, where, seen)
        if problem is not None:
            return problem
    by_shape: dict[_Shape | None, list[Any]] = {}
    for member in members:
        by_shape.setdefault(_shape(member), []).append(member)
    records = [m for m in by_shape.get(_Shape.OBJECT, []) if is_record(m)]
    for shape, alike in by_shape.items():
        if shape is _Shape.NUMBER and all(m in (int, float) for m in alike):
            continue  # an int and a float stay apart in JSON
        if shape is _Shape.OBJECT and len(alike) == len(records):
            continue  # attrs classes, dataclasses: cattrs tells them apart by their fields
        if shape is None and len(alike) == 1 and set(by_shape) == {None, _Shape.NULL}:
            # A hook-only type (a pydantic model) or None: cattrs checks for None first,
            # and the hook reads back everything else.
            continue
        if len(alike) > 1 or (shape is _Shape.ANYTHING and len(members) > 1) or shape is None:
            described = shape.value if shape is not None else "an unknown JSON shape"
            names = " and ".join(_name(m) for m in alike)
            return (
                f"{where} is the union {_name(tp)}, whose members {names} are all stored as "
                f"{described}; reading it back could not tell which one was written"
            )
    try:
        converter.get_structure_hook(tp)
    except (StructureHandlerNotFoundError, TypeError, ValueError) as exc:
        # cattrs raises TypeError for classes it cannot tell apart by their fields.
        return f"{where} is the union {_name(tp)}, which the converter cannot read back ({exc})"
    return None


def _name(tp: Any) -> str:
    if isinstance(tp, type) and not typing.get_args(tp):
        return tp.__qualname__
    return str(tp).replace("typing.", "")


def _describe_structure_error(exc: Exception) -> str:
    if isinstance(exc, cattrs.BaseValidationError):
        messages = cattrs.transform_error(exc, format_exception=_format_leaf_error)
        return "; ".join(messages)
    return str(exc) or type(exc).__name__


def _format_leaf_error(exc: BaseException, type_: type | None) -> str:
    # cattrs' wording ("invalid value for type, expected datetime") plus the hook's reason.
    reason = str(exc)
    base = format_exception(exc, type_)
    return f"{base} ({reason})" if reason and reason not in base else base
