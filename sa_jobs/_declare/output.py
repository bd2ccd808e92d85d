"""Recorded job outputs: converting a handler's return value to the JSON stored in
``sa_job.output``, and back.

A kind declares its output type with ``@job_args(kind=..., output=Thumbnail)`` (an attrs
class, a dataclass, or any type its converter reads and writes: ``int``,
``list[Thumbnail]``, ``dict[str, float]``); without ``output=`` any JSON value is stored
as it is. Either way the value must come back unchanged from ``jsonb``, and its encoding
must fit the cap (:data:`DEFAULT_MAX_OUTPUT_BYTES` unless the kind or the worker says
otherwise). A value that does not is refused with :class:`~sa_jobs.errors.InvalidOutputError`
before anything is written: from a handler, that fails the attempt.

``None`` is "no output": nothing is written, and a value recorded earlier in the run
(``job.record_output``) stays.
"""

from __future__ import annotations

import json
import typing
from typing import Any

from sa_jobs._base.jsonvalue import MAX_DEPTH, dumps, find_unstorable, render_path
from sa_jobs._declare.args import JobKind
from sa_jobs.errors import InvalidOutputError, OutputTooLargeError

__all__ = [
    "DEFAULT_MAX_OUTPUT_BYTES",
    "PREVIEW_CHARACTERS",
    "decode_output",
    "encode_output",
    "output_limit",
    "output_preview",
]

#: The default cap on an output's encoded JSON, in bytes (1 MiB): a job row is read by
#: the dashboard and the CLI, and a waiter receives it whole.
DEFAULT_MAX_OUTPUT_BYTES = 1 << 20


#: How much of an output the dashboard and ``sa-jobs jobs show`` print.
PREVIEW_CHARACTERS = 4000


def output_preview(data: Any, limit: int = PREVIEW_CHARACTERS) -> str:
    """A stored output as indented JSON, cut after ``limit`` characters (saying so)."""
    text = json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False)
    if len(text) <= limit:
        return text
    return (
        text[:limit]
        + f"\n... ({len(text) - limit:,} more characters; the whole output is in the job's "
        "output column)"
    )


def output_limit(kind: JobKind, worker_limit: int | None = None) -> int:
    """The cap for ``kind``'s outputs: the kind's own, else the worker's, else 1 MiB."""
    if kind.max_output_bytes is not None:
        return kind.max_output_bytes
    return worker_limit if worker_limit is not None else DEFAULT_MAX_OUTPUT_BYTES


def encode_output(kind: JobKind, value: Any, max_bytes: int | None = None) -> Any:
    """The JSON stored for ``value``, an output of a job of ``kind``.

    Raises:
        InvalidOutputError: ``value`` is not of the declared output type, does not
            convert, would not read back as given, or holds what ``jsonb`` alters.
        OutputTooLargeError: its encoding is over the cap.
    """
    output_type = kind.output_type
    data = value if output_type is None else _unstructure(kind, output_type, value)
    problem = find_unstorable(data)
    if problem is not None:
        at = f" at {render_path('output', problem.path)}" if problem.path else ""
        detail = (
            f"is nested more than {MAX_DEPTH} levels deep; flatten it"
            if problem.reason == "depth"
            else f"holds {problem.what}{at}{problem.why}"
        )
        raise InvalidOutputError(f"the output of kind {kind.name!r} {detail}")
    if output_type is not None:
        _check_reads_back(kind, output_type, data)
    limit = output_limit(kind, max_bytes)
    size = len(dumps(data).encode("utf-8"))
    if size > limit:
        raise OutputTooLargeError(kind.name, size, limit)
    return data


def decode_output(kind: JobKind | None, data: Any) -> Any:
    """The output stored as ``data``, as the kind's output type (as JSON when the kind
    declares none, or is not known here).

    Raises:
        InvalidOutputError: the stored JSON no longer fits the declared type.
    """
    if data is None or kind is None or kind.output_type is None:
        return data
    try:
        return kind.converter.cattrs.structure(data, kind.output_type)
    except Exception as exc:
        raise InvalidOutputError(
            f"the stored output of a {kind.name!r} job does not convert to "
            f"{_name(kind.output_type)}: {exc}; if the type changed, give new fields "
            "defaults so older outputs still load"
        ) from exc


def _unstructure(kind: JobKind, output_type: Any, value: Any) -> Any:
    origin = typing.get_origin(output_type) or output_type
    if isinstance(origin, type) and not _accepts(origin, value):
        raise InvalidOutputError(
            f"the handler of kind {kind.name!r} returned {_describe(value)}, but the kind "
            f"declares output={_name(output_type)}; return {_article(_name(output_type))} "
            "(or None for no output)"
        )
    try:
        return kind.converter.cattrs.unstructure(value, unstructure_as=output_type)
    except RecursionError:
        raise InvalidOutputError(
            f"the output of kind {kind.name!r} is nested too deeply; flatten it"
        ) from None
    except Exception as exc:
        raise InvalidOutputError(
            f"the output of kind {kind.name!r} ({_describe(value)}) does not convert to "
            f"JSON as {_name(output_type)}: {exc}; register an unstructure hook for it on "
            "the kind's converter"
        ) from exc


def _accepts(origin: type, value: Any) -> bool:
    # JSON numbers: an int where a float is declared is a float to every reader.
    if origin is float and isinstance(value, int) and not isinstance(value, bool):
        return True
    if origin in (int, float) and isinstance(value, bool):
        return False
    return isinstance(value, origin)


def _check_reads_back(kind: JobKind, output_type: Any, data: Any) -> None:
    converter = kind.converter.cattrs
    try:
        again = converter.unstructure(
            converter.structure(data, output_type), unstructure_as=output_type
        )
    except Exception as exc:
        raise InvalidOutputError(
            f"the output of kind {kind.name!r} would be stored as {_short(data)} but could "
            f"not be read back as {_name(output_type)}: {exc}"
        ) from exc
    if dumps(again) != dumps(data):
        raise InvalidOutputError(
            f"the output of kind {kind.name!r} would be stored as {_short(data)} but read "
            f"back as {_short(again)}; return a value of the declared type "
            f"{_name(output_type)}"
        )


def _name(tp: Any) -> str:
    if isinstance(tp, type) and not typing.get_args(tp):
        return tp.__qualname__
    return str(tp).replace("typing.", "")


def _article(noun: str) -> str:
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def _describe(value: Any) -> str:
    return f"{_article(type(value).__qualname__)} ({_short(value)})"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
