"""Partition keys: which args fields a kind is counted and rotated by, and the key's text.

A kind declares its key where it is declared, ``@sa_jobs.job_args(kind=...,
partition_by=["tenant_id"])``, so every process that inserts it — whatever worker
configuration it does or does not know — writes the same ``partition_key``. Limits by
key (``ConcurrencyLimit(..., by_args=[...])``) and fair queues (``sa_jobs.Queue(10,
fair_by=[...])``) name the same fields, and the worker checks that they agree with the
kinds it handles (:func:`check_fields_declared`).

**The key's text.** One field: a string value as it is, any other value as its compact
JSON (``42``, ``true``, ``{"a":1}``). Several fields: the JSON array of their values,
in the declared order (``["acme",3]``). A field that is missing or ``None`` in every
named position gives no key (NULL): such a job is not counted by key, and a fair queue
serves it after the keyed jobs (``docs/queues.md``, "Jobs without a key").

**A reference as a key.** A ``sa_jobs.Ref`` field keys by the row it names:
``table:key`` (``refs_invoice:7``, a composite key as its JSON array), whatever else
the stored reference holds, so two jobs on one row share a key.

**A key from the metadata.** ``job_args(partition_by_metadata="tenant")`` takes the key
from the job's ``metadata`` instead (the value's text as above), for apps that tag every
job with its tenant where it is enqueued (a middleware) rather than in each args class;
limits and fair queues name it with ``by_metadata="tenant"`` / ``fair_by_metadata=``.
An insert whose metadata lacks the key is refused (:func:`metadata_key_of`): a
forgotten tenant would otherwise escape every limit by key in silence.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import attrs

from sa_jobs._base.jsonvalue import dumps
from sa_jobs.errors import InvalidJobArgsError, InvalidOptionsError

__all__ = [
    "MAX_KEY_LENGTH",
    "KeySpec",
    "check_field_names",
    "check_fields_declared",
    "check_fields_of",
    "check_metadata_key",
    "class_fields",
    "key_spec_of",
    "metadata_key_of",
    "partition_key_of",
]

#: The longest key text stored: it is an index entry, and a btree entry over ~2.7 kB fails.
MAX_KEY_LENGTH = 512


@attrs.frozen
class KeySpec:
    """Where a job's partition key comes from: args fields (``source="args"``) or one
    key of its metadata (``source="metadata"``, ``names`` of one). Two specs are the same
    key only if they are equal: a job has one ``partition_key``."""

    source: Literal["args", "metadata"]
    names: tuple[str, ...]

    def describe(self, args_option: str = "by_args", metadata_option: str = "by_metadata") -> str:
        """The spec as its option is written (``by_args=['tenant_id']``)."""
        if self.source == "metadata":
            return f"{metadata_option}={self.names[0]!r}"
        return f"{args_option}={list(self.names)!r}"


def key_spec_of(
    fields: tuple[str, ...] | None, metadata: str | None, args_option: str, metadata_option: str
) -> KeySpec | None:
    """The spec of an option pair (``by_args``/``by_metadata``, ...): at most one given.

    Raises:
        InvalidOptionsError: both are given.
    """
    if fields is not None and metadata is not None:
        raise InvalidOptionsError(
            metadata_option,
            f"give {args_option}= or {metadata_option}=, not both: a job has one partition key",
        )
    if fields is not None:
        return KeySpec("args", fields)
    if metadata is not None:
        return KeySpec("metadata", (metadata,))
    return None


def check_metadata_key(option: str, name: object) -> str:
    """A metadata key to take the partition key from: a non-empty string.

    Raises:
        InvalidOptionsError: anything else (a list is a hint that ``*_by=`` was meant).
    """
    if not isinstance(name, str) or not name:
        raise InvalidOptionsError(
            option, f"must be one metadata key as a non-empty string, e.g. 'tenant', got {name!r}"
        )
    return name


def check_field_names(option: str, fields: object) -> tuple[str, ...]:
    """``fields`` as a tuple of distinct, non-empty field names.

    Raises:
        InvalidOptionsError: not a non-empty list of strings, or a name given twice.
    """
    if isinstance(fields, str):
        raise InvalidOptionsError(option, f"must be a list of field names, e.g. [{fields!r}]")
    if not isinstance(fields, Iterable):
        raise InvalidOptionsError(option, f"must be a list of field names, got {fields!r}")
    names = tuple(fields)
    if not names:
        raise InvalidOptionsError(option, "name at least one args field, e.g. ['tenant_id']")
    for name in names:
        if not isinstance(name, str) or not name:
            raise InvalidOptionsError(
                option, f"field names must be non-empty strings, got {name!r}"
            )
    if len(set(names)) != len(names):
        raise InvalidOptionsError(option, f"names a field twice: {list(names)!r}")
    return names


def check_fields_of(option: str, fields: Sequence[str], cls: type, declared: Sequence[str]) -> None:
    """Every one of ``fields`` is a field of the args class ``cls`` (its fields:
    ``declared``).

    Raises:
        InvalidOptionsError: naming the first missing field, the class and its fields.
    """
    for name in fields:
        if name not in declared:
            raise InvalidOptionsError(
                option,
                f"{cls.__qualname__} has no field {name!r} (its fields: "
                f"{', '.join(declared) or 'none'}); name fields of the args class",
            )


def check_fields_declared(
    option: str, spec: KeySpec, kind_name: str, cls: type, declared: KeySpec | None
) -> None:
    """A limit or fair queue that counts ``kind_name`` by ``spec`` agrees with the kind's
    own key (``declared``: its ``partition_by`` or ``partition_by_metadata``), the key
    its inserts write.

    Raises:
        InvalidOptionsError: the class has no such field, or declares no key, or another.
    """
    if spec.source == "args":
        check_fields_of(option, spec.names, cls, class_fields(cls))
    wanted = spec.describe("partition_by", "partition_by_metadata")
    if declared is None:
        raise InvalidOptionsError(
            option,
            f"kind {kind_name!r} ({cls.__qualname__}) declares no partition key, so its jobs "
            f"are stored without one; add {wanted} to its @sa_jobs.job_args(...) (inserts "
            "then write the key the fetch counts by)",
        )
    if declared != spec:
        raise InvalidOptionsError(
            option,
            f"kind {kind_name!r} ({cls.__qualname__}) declares "
            f"{declared.describe('partition_by', 'partition_by_metadata')}, another key; a "
            "job has one key: make the two the same",
        )


def class_fields(cls: type) -> list[str]:
    if attrs.has(cls):
        return [item.name for item in attrs.fields(cls)]
    if dataclasses.is_dataclass(cls):
        return [item.name for item in dataclasses.fields(cls)]
    return []


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    ref = _ref_text(value)
    return ref if ref is not None else dumps(value)


def _ref_text(value: Any) -> str | None:
    """A stored ``sa_jobs.Ref`` (``{"table": t, "pk": [..]}``) as ``table:key``: the row
    it names, not the JSON of the reference (``refs_invoice:7``; a composite key as its
    JSON array, ``refs_line:[7,2]``). Read by shape, as the refs index reads it
    (``docs/references.md``): the field's type is not at hand where rows are built."""
    if not isinstance(value, Mapping) or len(value) != 2:
        return None
    table, pk = value.get("table"), value.get("pk")
    if not isinstance(table, str) or not isinstance(pk, list) or not pk:
        return None
    return f"{table}:{_text(pk[0]) if len(pk) == 1 else dumps(pk)}"


def _checked(kind_name: str, what: str, key: str) -> str:
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidJobArgsError(
            f"kind {kind_name!r}: the partition key ({what}) is {len(key)} characters, over "
            f"{MAX_KEY_LENGTH}; key by a shorter value (an id, not a document)"
        )
    return key


def partition_key_of(kind_name: str, fields: Sequence[str], args_json: Any) -> str | None:
    """The key text of a job of ``kind_name`` whose stored args are ``args_json``.

    Raises:
        InvalidJobArgsError: a key longer than :data:`MAX_KEY_LENGTH` characters.
    """
    if not isinstance(args_json, Mapping):
        return None
    values = [args_json.get(name) for name in fields]
    if all(value is None for value in values):
        return None
    if len(values) == 1:
        key = _text(values[0])
    else:  # a reference among several fields is its row's text too
        key = dumps([_ref_text(value) or value for value in values])
    return _checked(kind_name, ", ".join(fields), key)


def metadata_key_of(kind_name: str, name: str, metadata: Mapping[str, Any]) -> str | None:
    """The key text of a job of ``kind_name`` keyed by its metadata's ``name``: the
    value's text (as one args field's), or None for an explicit ``None`` (no key, like
    an args field that is ``None``).

    Raises:
        InvalidOptionsError: the metadata has no ``name`` (nothing is written).
        InvalidJobArgsError: a key longer than :data:`MAX_KEY_LENGTH` characters.
    """
    if name not in metadata:
        raise InvalidOptionsError(
            "metadata",
            f"kind {kind_name!r} is keyed by its metadata's {name!r} "
            f"(job_args(partition_by_metadata={name!r})), but this insert's metadata has no "
            f"{name!r}: pass metadata={{{name!r}: ...}} (or {{{name!r}: None}} for a job of "
            "no key, which no limit by key counts)",
        )
    value = metadata[name]
    if value is None:
        return None
    return _checked(kind_name, f"metadata {name!r}", _text(value))
