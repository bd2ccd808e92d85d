"""JSON values PostgreSQL's ``jsonb`` stores faithfully, and the canonical encoding.

Args, metadata and keys all end up as ``jsonb`` or inside key bytes. :func:`check_json_document`
refuses what ``jsonb`` would reject or alter — NUL characters and lone surrogates in
strings, non-finite floats, non-string object keys, unknown types, nesting deeper than
:data:`MAX_DEPTH` — before anything is sent. :func:`dumps` is the compact encoding key
bytes and set ordering use.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from collections.abc import Iterable
from typing import Any

from sa_jobs.errors import InvalidJobArgsError, a_or_an

__all__ = [
    "MAX_DEPTH",
    "Segment",
    "Unstorable",
    "check_json_document",
    "dumps",
    "find_unstorable",
    "render_path",
    "unstorable_text",
]

#: How deeply a stored JSON document (args, metadata) may nest.
MAX_DEPTH = 100

# json.dumps with non-default options builds a new encoder per call; keys need thousands.
_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def dumps(data: Any) -> str:
    """Compact JSON, non-ASCII kept, NaN refused: set ordering and canonical key bytes."""
    return _JSON.encode(data)


#: One step of a path into a JSON document: an object key (or a field) or an array index.
Segment = str | int


@dataclasses.dataclass(frozen=True)
class Unstorable:
    """A value ``jsonb`` would refuse or change, and where it is.

    Attributes:
        path: The keys and indices leading to it from the document's root.
        what: The value, described (``the float nan``).
        why: Why it cannot be stored, and what to do (from its leading punctuation on).
        reason: ``depth`` for a document nested too deeply, else ``value``.
    """

    path: tuple[Segment, ...]
    what: str
    why: str
    reason: str = "value"

    def describe(self, owner: str) -> str:
        """The error message, for a document belonging to ``owner``."""
        if self.reason == "depth":
            return f"{owner} is nested more than {MAX_DEPTH} levels deep; flatten it"
        at = f" at {render_path('', self.path)}" if self.path else ""
        return f"{owner} args hold {self.what}{at}{self.why}"


def render_path(root: str, path: Iterable[Segment], kinds: Iterable[str] | None = None) -> str:
    """``root`` followed by ``path``: ``.name`` for a field, ``['key']`` for a key,
    ``[2]`` for an index; ``kinds`` says which each segment is (``field``, ``key``,
    ``index``, ``element``), else an int is an index and a string a key."""
    text = root
    named: Iterable[str | None] = kinds if kinds is not None else itertools.repeat(None)
    for segment, kind in zip(path, named, strict=False):
        if kind is None:
            kind = "index" if isinstance(segment, int) else "key"
        if kind == "field":
            text += f".{segment}" if text else str(segment)
        elif kind == "element":
            text += " (an element)"
        elif kind == "index":
            text += f"[{segment}]"
        else:
            text += f"[{segment!r}]"
    return text


def check_json_document(data: Any, owner: str) -> None:
    """Reject what PostgreSQL's jsonb would refuse or change.

    Raises:
        InvalidJobArgsError: saying what, and where.
    """
    problem = find_unstorable(data)
    if problem is not None:
        raise InvalidJobArgsError(problem.describe(owner))


def find_unstorable(data: Any) -> Unstorable | None:
    """The first value of ``data`` that ``jsonb`` would refuse or change, or None."""
    # Iterative, so a document nested past the limit is refused, not a RecursionError.
    # Each entry keeps its parent entry and its key there; a path is built only for an
    # error.
    stack: list[_Entry] = [(data, 1, None, None)]
    while stack:
        entry = stack.pop()
        value, depth = entry[0], entry[1]
        if isinstance(value, str):
            problem = unstorable_text(value)
            if problem is not None:
                return _found(entry, f"a string with {problem}", _TEXT_ADVICE)
        elif isinstance(value, float):
            if not math.isfinite(value):
                return _found(
                    entry,
                    f"the float {value}",
                    ", which JSON cannot represent; use None or a Decimal",
                )
        elif isinstance(value, dict | list | tuple):
            if depth > MAX_DEPTH:
                return Unstorable((), "", "", reason="depth")
            if isinstance(value, dict):
                for key, item in value.items():
                    if not isinstance(key, str):
                        return _found(
                            entry,
                            f"a dict key {key!r} ({type(key).__name__})",
                            "; JSON object keys must be strings, so convert the key to a string",
                        )
                    problem = unstorable_text(key)
                    if problem is not None:
                        return _found(entry, f"a dict key with {problem}", _TEXT_ADVICE)
                    stack.append((item, depth + 1, entry, key))
            else:
                stack.extend((item, depth + 1, entry, index) for index, item in enumerate(value))
        elif value is None or isinstance(value, bool | int):
            continue
        else:
            return _found(
                entry,
                f"{a_or_an(type(value).__name__)} ({value!r:.60})",
                ", which the converter does not know; register an unstructure hook for it on "
                "the kind's converter",
            )
    return None


# (value, depth, parent entry, key or index in the parent)
_Entry = tuple[Any, int, Any, Segment | None]

_TEXT_ADVICE = ", which PostgreSQL's jsonb cannot store; clean the value or encode it (e.g. base64)"


def _found(entry: _Entry, what: str, why: str) -> Unstorable:
    path: list[Segment] = []
    while entry[2] is not None:
        key = entry[3]
        assert key is not None
        path.append(key)
        entry = entry[2]
    return Unstorable(tuple(reversed(path)), what, why)


def unstorable_text(value: str) -> str | None:
    """Why PostgreSQL cannot store ``value`` as text or in jsonb, or None if it can."""
    if "\x00" in value:
        return "a NUL character"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "a lone surrogate (not valid Unicode)"
    return None
