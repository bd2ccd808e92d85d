"""A sequence key as what makes it — ``customer_id=42`` — rather than its 64-hex hash.

A sequence key is the SHA-256 of canonical bytes
(:mod:`sa_jobs._declare.unique_sequence_keys`): the kind (unless
``exclude_kind``), the args (``by_args``: the fields marked ``sequence=True``, or all of
them), the queue (``by_queue``). A hash cannot be inverted, but every job of a sequence
carries the values it was made from, so the dashboard rebuilds the canonical bytes from
a job's kind, queue and args for each way the key could have been made, and keeps the one
whose hash **is** the stored key. What it shows is therefore never a guess: either the
parts that hash to the key, or nothing (and the page shows the hash).

The ways tried, for a job of kind K:

* with K declared in this process (``sa_jobs._declare.args.default_registry``: a mounted
  dashboard imports the app's job classes), first the args its class marks (or all of
  them, when it marks none) — whatever ``SequenceOpts`` an insert passed, the class
  decides which args a key holds;
* all the args, and every subset of the top-level fields of args with at most
  :data:`MAX_FIELDS` of them — what a standalone ``sa-jobs dashboard``, which imports no
  app code, relies on (a marked field nested in an attrs class is not tried);
* each with and without the kind, with and without the queue, and with no args at all.

At most a few hundred SHA-256s of short texts per job — and a :class:`SequenceKeys` keeps
the way that matched each kind, so a page of sequences of one kind tries it first and
mostly hashes once per row.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import attrs

from sa_jobs._declare.args import KindRegistry, default_registry
from sa_jobs._declare.unique_sequence_keys import canonical_args, canonical_bytes

__all__ = ["MAX_FIELDS", "SequenceKeys", "SequenceParts"]

#: Args with more top-level fields than this are only tried whole (2**n subsets).
MAX_FIELDS = 8
#: Args whose canonical text is longer than this are only tried whole.
MAX_GUESSED_TEXT = 16_384

_ALL = "all"
_MARKED = "marked"
#: An args text no key is made of (args were not read).
_IMPOSSIBLE = ""
#: Which args a key holds: none, all of them, those the declared class marks, or these
#: top-level fields.
_ArgsShape = None | str | tuple[str, ...]


@attrs.frozen
class _Shape:
    """One way a key can be made (the dimensions of ``SequenceOpts``)."""

    with_kind: bool
    args: _ArgsShape
    with_queue: bool


@attrs.frozen
class SequenceParts:
    """What a sequence key is made of.

    Attributes:
        kind: The kind, or None when the key leaves it out (``exclude_kind``).
        fields: The args in the key, each as ``(name, JSON text)``; empty when the key
            holds no args. Args that are not an object (a list payload) are one field
            named ``args``.
        queue: The queue, or None when the key leaves it out.
    """

    kind: str | None
    fields: Sequence[tuple[str, str]]
    queue: str | None


class SequenceKeys:
    """Describes sequence keys; remembers, per kind, the way the last key was made."""

    def __init__(self, registry: KindRegistry | None = None) -> None:
        self._registry = registry or default_registry
        self._found: dict[str, _Shape] = {}
        #: Kinds whose key no way matched: their next keys skip the subsets of fields.
        self._missed: set[str] = set()

    def describe(
        self, key: bytes | memoryview, kind: str, queue: str, args: Any
    ) -> SequenceParts | None:
        """The parts of job ``kind``/``queue``/``args`` that hash to ``key``; None when no
        way tried gives it (or ``args`` were not read: too large)."""
        wanted = bytes(key)
        pairs = _pairs(args)
        texts: dict[_ArgsShape, str | None] = {}  # each args text serialised once
        known = self._found.get(kind)
        tried = itertools.chain([known] if known else [], self._shapes(kind, pairs))
        for shape in tried:
            if shape.args not in texts:
                texts[shape.args] = self._args_text(shape.args, kind, args, pairs)
            text = texts[shape.args]
            if text == _IMPOSSIBLE:
                continue
            canonical = canonical_bytes(
                "sequence",
                kind=kind if shape.with_kind else None,
                args=text,
                queue=queue if shape.with_queue else None,
            )
            if hashlib.sha256(canonical).digest() == wanted:
                self._found[kind] = shape
                return _parts(shape, kind, queue, text)
        self._missed.add(kind)
        return None

    def _shapes(self, kind: str, pairs: Mapping[str, str] | None) -> Iterator[_Shape]:
        arg_shapes: list[_ArgsShape] = [None, _ALL]
        if kind in self._registry:
            # The class says which args a key holds (its marked fields, or all): first.
            arg_shapes.insert(1, _MARKED)
        if pairs is not None and kind not in self._missed and _guessable(pairs):
            names = sorted(pairs)
            for size in range(1, len(names)):
                arg_shapes += itertools.combinations(names, size)
        for args_shape in arg_shapes:
            for with_kind in (True, False):
                for with_queue in (False, True):
                    if not with_kind and args_shape is None and not with_queue:
                        continue  # SequenceOpts refuses exclude_kind alone
                    yield _Shape(with_kind, args_shape, with_queue)

    def _args_text(
        self, shape: _ArgsShape, kind: str, args: Any, pairs: Mapping[str, str] | None
    ) -> str | None:
        """The ``args=`` line's value for ``shape`` (None: no args in the key), or
        :data:`_IMPOSSIBLE` when these args cannot make it."""
        if shape is None:
            return None
        if args is None:
            return _IMPOSSIBLE
        if shape == _MARKED:
            return canonical_args(self._registry.get(kind).args_class, args, "sequence")
        if shape == _ALL:
            return canonical_args(object, args, "sequence")
        if pairs is None or any(name not in pairs for name in shape):
            return _IMPOSSIBLE  # a subset remembered from another job of the kind
        return "{" + ",".join(pairs[name] for name in shape) + "}"


def _guessable(pairs: Mapping[str, str]) -> bool:
    """Few and short enough fields to try every subset of."""
    return 1 < len(pairs) <= MAX_FIELDS and sum(map(len, pairs.values())) <= MAX_GUESSED_TEXT


def _pairs(args: Any) -> dict[str, str] | None:
    """Each top-level field of an args object as its canonical ``"name":value`` text
    (a subset's canonical text is these joined in name order)."""
    if not isinstance(args, Mapping):
        return None
    return {
        name: canonical_args(object, {name: value}, "sequence")[1:-1]
        for name, value in args.items()
    }


def _parts(shape: _Shape, kind: str, queue: str, args_text: str | None) -> SequenceParts:
    """The parts, the args read back from the very text that was hashed."""
    fields: list[tuple[str, str]] = []
    if args_text is not None:
        value = json.loads(args_text)
        if isinstance(value, dict):
            fields = [(name, _json(item)) for name, item in value.items()]
        else:
            fields = [("args", _json(value))]
    return SequenceParts(
        kind=kind if shape.with_kind else None,
        fields=fields,
        queue=queue if shape.with_queue else None,
    )


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
