"""Declarative job args: the ``@job_args`` decorator, ``field``, kinds and their registry.

A job args class is an ordinary attrs class or dataclass that carries its *kind* (the
string stored in every job row) and per-kind insert defaults::

    @sa_jobs.job_args(kind="send_email", queue="mail", max_attempts=5)
    class SendEmail:
        to: str
        template: str = "welcome"

A plain class is made an attrs class; an attrs class or a ``@dataclass`` is kept as it is
(only the kind is attached to it), so its own semantics — ``eq``, ``frozen``, ``slots`` —
stay those its author chose.

Values are converted to and from JSON by an :class:`~sa_jobs._declare.convert.ArgsConverter`
(cattrs underneath; see :mod:`sa_jobs._declare.convert`); a kind can be given its own. A class
whose fields could be written but not read back is refused here, when it is declared.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar, dataclass_transform

import attrs

from sa_jobs._base.jsonvalue import unstorable_text
from sa_jobs._declare.convert import ArgsConverter, default_converter
from sa_jobs._declare.option_checks import check_tags, check_timeout
from sa_jobs._declare.options import (
    UNSET,
    KindDefaults,
    SequenceOpts,
    UniqueOpts,
    validate_kind_defaults,
)
from sa_jobs._declare.partitions import (
    KeySpec,
    check_field_names,
    check_fields_of,
    check_metadata_key,
    key_spec_of,
)
from sa_jobs._declare.refs import mentions_ref, ref_to_instance
from sa_jobs.errors import (
    DuplicateKindError,
    InvalidJobArgsError,
    InvalidOptionsError,
    UnknownKindError,
)

__all__ = [
    "JobKind",
    "KindRegistry",
    "check_kind",
    "default_registry",
    "field",
    "job_args",
    "kind_of",
]

T = TypeVar("T")

#: The key under which sa_jobs keeps its per-field flags in attrs field metadata.
FIELD_METADATA_KEY = "sa_jobs"

MAX_KIND_LENGTH = 128

#: What the worker does when a row a field references (``sa_jobs.Ref``) is gone.
ON_MISSING = ("cancel", "discard", "run")


# --------------------------------------------------------------------------- kinds


@attrs.frozen
class JobKind:
    """A registered kind: its name, its args class, its defaults and its converter.

    With ``list_field`` (``job_args(list_payload=True)``) the stored payload is that one
    field's list itself, a JSON array, so job keys can merge payloads (Graphile's array
    payload merging).
    """

    name: str
    args_class: type
    defaults: KindDefaults
    converter: ArgsConverter
    list_field: str | None = None
    #: The type of the jobs' recorded output (``job_args(output=...)``); None: any JSON.
    output_type: Any = None
    #: The cap on an output's encoded JSON, in bytes; None: the worker's (1 MiB default).
    max_output_bytes: int | None = None
    #: The args fields its jobs are keyed by (``job_args(partition_by=...)``), or None.
    partition_by: tuple[str, ...] | None = None
    #: The metadata key its jobs are keyed by (``job_args(partition_by_metadata=...)``).
    partition_by_metadata: str | None = None

    @property
    def partition_spec(self) -> KeySpec | None:
        """Where its jobs' partition key comes from, if they have one."""
        if self.partition_by is not None:
            return KeySpec("args", self.partition_by)
        if self.partition_by_metadata is not None:
            return KeySpec("metadata", (self.partition_by_metadata,))
        return None

    def encode(self, args: object) -> Any:
        """The JSON stored for ``args``, checked to read back as given.

        Raises:
            InvalidJobArgsError: the converter's refusal, naming this kind.
        """
        try:
            data = self.converter.to_json(args)
        except InvalidJobArgsError as exc:
            raise InvalidJobArgsError(f"kind {self.name!r}: {exc}") from exc.__cause__
        return data[self.list_field] if self.list_field is not None else data

    def check_stored(self, data: Any) -> None:
        """Refuse stored JSON given as it is (a ``Job`` built by hand) that the worker
        could not read back, or would read back as other JSON.

        Raises:
            InvalidJobArgsError: naming this kind, the field, the value and its type.
        """
        if self.list_field is not None and isinstance(data, list):
            data = {self.list_field: data}
        try:
            self.converter.check_stored(self.args_class, data)
        except InvalidJobArgsError as exc:
            raise InvalidJobArgsError(f"kind {self.name!r}: {exc}") from exc.__cause__

    def decode(self, data: Any) -> Any:
        if self.list_field is not None:
            if not isinstance(data, list):
                raise InvalidJobArgsError(
                    f"stored args of kind {self.name!r} must be a JSON array (the class "
                    f"declares list_payload=True), got {type(data).__name__}"
                )
            data = {self.list_field: data}
        return self.converter.from_json(self.args_class, data)


class KindRegistry:
    """Maps kind strings to their args classes; thread-safe."""

    def __init__(self) -> None:
        self._kinds: dict[str, JobKind] = {}
        self._lock = threading.Lock()

    def register(self, kind: JobKind) -> None:
        with self._lock:
            existing = self._kinds.get(kind.name)
            if existing is not None and not _same_class(existing.args_class, kind.args_class):
                raise DuplicateKindError(kind.name, existing.args_class, kind.args_class)
            self._kinds[kind.name] = kind

    def get(self, name: str) -> JobKind:
        try:
            return self._kinds[name]
        except KeyError:
            raise UnknownKindError(name) from None

    def __contains__(self, name: object) -> bool:
        return name in self._kinds

    def names(self) -> list[str]:
        return sorted(self._kinds)


def _same_class(a: type, b: type) -> bool:
    # Re-executing a module (reload, a script run twice) makes a new class object with the
    # same identity; that is a redefinition, not a clash.
    return (a.__module__, a.__qualname__) == (b.__module__, b.__qualname__)


default_registry = KindRegistry()


def kind_of(args_or_class: object) -> JobKind:
    """Return the :class:`JobKind` of a job args instance or class.

    Raises:
        InvalidJobArgsError: the object was not declared with :func:`job_args`.
    """
    cls = args_or_class if isinstance(args_or_class, type) else type(args_or_class)
    kind = cls.__dict__.get("__sa_jobs_kind__")
    if not isinstance(kind, JobKind):
        raise InvalidJobArgsError(
            f"{cls.__qualname__} is not a job args class; decorate it with "
            "@sa_jobs.job_args(kind=...)"
        )
    return kind


# --------------------------------------------------------------------------- declaration


def field(
    *,
    default: Any = attrs.NOTHING,
    factory: Callable[[], Any] | None = None,
    unique: bool = False,
    sequence: bool = False,
    converter: Callable[[Any], Any] | None = None,
    validator: Any = None,
    metadata: Mapping[str, Any] | None = None,
    on_missing: str | None = None,
) -> Any:
    """An attrs field with sa_jobs flags.

    Args:
        unique: Part of the subset of args that makes up the unique key.
        sequence: Part of the subset of args that makes up the sequence key.
        on_missing: For a field holding references (``sa_jobs.Ref``): what the worker
            does when a referenced row is gone before the handler runs — ``"cancel"``
            the job (the default), ``"discard"`` it, or ``"run"`` the handler anyway
            (whose ``ref.get`` then returns None). Never spends a retry. Unset, a field
            inside a nested args class takes the setting of the field holding it.

    The other arguments are those of :func:`attrs.field`.

    Raises:
        InvalidJobArgsError: ``on_missing`` is not one of the three.
    """
    if on_missing is not None and on_missing not in ON_MISSING:
        raise InvalidJobArgsError(
            f"field(on_missing={on_missing!r}): choose one of {', '.join(map(repr, ON_MISSING))}"
        )
    merged = dict(metadata or {})
    flags: dict[str, Any] = {"unique": unique, "sequence": sequence}
    if on_missing is not None:
        flags["on_missing"] = on_missing
    merged[FIELD_METADATA_KEY] = flags
    return attrs.field(
        default=default,
        factory=factory,
        converter=converter,
        validator=validator,
        metadata=merged,
    )


@dataclass_transform(frozen_default=True, field_specifiers=(attrs.field, field))
def job_args(
    *,
    kind: str,
    queue: str | None = None,
    priority: int | None = None,
    max_attempts: int | None = None,
    tags: Iterable[str] | None = None,
    timeout: dt.timedelta | float | None = UNSET,
    unique: UniqueOpts | None = None,
    sequence: SequenceOpts | None = None,
    converter: ArgsConverter | None = None,
    registry: KindRegistry | None = None,
    frozen: bool | None = None,
    list_payload: bool = False,
    output: Any = None,
    max_output_bytes: int | None = None,
    partition_by: Iterable[str] | None = None,
    partition_by_metadata: str | None = None,
) -> Callable[[type[T]], type[T]]:
    """Declare a job args class.

    A plain class becomes an attrs class (frozen by default); an attrs class or a
    ``@dataclass`` is kept as it is. Either way it is registered under ``kind``. Per-kind
    defaults are validated now, so a bad declaration fails at import.

    Args:
        kind: The stable name stored in job rows (1-128 characters).
        queue: Default queue for jobs of this kind.
        priority: Default priority, 1 (highest) to 4.
        max_attempts: Default number of attempts before the job is discarded.
        tags: Default tags.
        timeout: Default run time limit for the worker; ``None`` for no limit.
        unique: Default :class:`sa_jobs.UniqueOpts` for jobs of this kind.
        sequence: Default :class:`sa_jobs.SequenceOpts`: jobs of this kind run one at a
            time per sequence key, in order.
        converter: Converter for this kind's args; the shared default if omitted.
        registry: Registry to record the kind in; the default registry if omitted.
        frozen: Make instances of a plain class immutable (the default; args are
            values). An attrs class or a dataclass is frozen or not by its own decorator;
            for a mutable one pass ``frozen=False`` too, so type checkers (which read it
            here) know, and a value that disagrees with the class is refused.
        list_payload: The class has exactly one field, a list, and the stored payload is
            that list (a JSON array) rather than an object: adding a job with the key of
            a job whose payload is also an array concatenates the two.
        output: The type of the jobs' recorded output (a handler's return value): an
            attrs class, a dataclass, or any type the converter reads and writes. Without
            it, any JSON value is stored as it is (see docs/results.md).
        max_output_bytes: The cap on an output's encoded JSON for this kind; the worker's
            (1 MiB by default) if omitted.
        partition_by: The args fields that make the job's partition key (its tenant,
            customer...), written into ``partition_key`` at insert: what limits by key
            (``ConcurrencyLimit(..., by_args=...)``) count and fair queues
            (``sa_jobs.Queue(n, fair_by=...)``) rotate by. Needs the ``sa_jobs_fairness``
            branch.
        partition_by_metadata: The key of the job's ``metadata`` that makes its
            partition key instead (``by_metadata=`` / ``fair_by_metadata=`` name it);
            every insert of the kind must then give that metadata key.
    """
    check_kind_name(kind)
    defaults = KindDefaults(
        queue=queue,
        priority=priority,
        max_attempts=max_attempts,
        tags=check_tags(tags) if tags is not None else None,
        timeout=check_timeout(timeout) if timeout is not UNSET else UNSET,
        unique=unique,
        sequence=sequence,
    )
    validate_kind_defaults(defaults)
    if max_output_bytes is not None and (
        not isinstance(max_output_bytes, int)
        or isinstance(max_output_bytes, bool)
        or max_output_bytes < 1
    ):
        raise InvalidOptionsError(
            "max_output_bytes", f"must be a positive int, got {max_output_bytes!r}"
        )
    key_fields = (
        check_field_names("partition_by", partition_by) if partition_by is not None else None
    )
    key_metadata = (
        check_metadata_key("partition_by_metadata", partition_by_metadata)
        if partition_by_metadata is not None
        else None
    )
    key_spec_of(key_fields, key_metadata, "partition_by", "partition_by_metadata")

    def decorate(cls: type[T]) -> type[T]:
        args_cls = _args_class(cls, frozen)
        if key_fields is not None:
            if list_payload:
                raise InvalidOptionsError(
                    "partition_by", "a list payload has no fields to key by; drop one of the two"
                )
            check_fields_of("partition_by", key_fields, args_cls, _field_names(args_cls))
        kind_converter = converter or default_converter
        # Refuse now a class whose args could be stored but never read back.
        kind_converter.check_class(args_cls, unresolved_ok=True)
        if output is not None:
            kind_converter.check_type(output, f"{kind}'s output")
        job_kind = JobKind(
            name=kind,
            args_class=args_cls,
            defaults=defaults,
            converter=kind_converter,
            list_field=_list_field(args_cls) if list_payload else None,
            output_type=output,
            max_output_bytes=max_output_bytes,
            partition_by=key_fields,
            partition_by_metadata=key_metadata,
        )
        (registry or default_registry).register(job_kind)
        # A class attribute, set past any __setattr__: frozen classes accept it, slotted
        # ones too (slots restrict instances, not the class), and dataclass eq, hash and
        # repr only look at fields.
        type.__setattr__(args_cls, "__sa_jobs_kind__", job_kind)
        return args_cls

    return decorate


# What attrs.field() returns: in a dataclass it would silently become a default value.
_ATTRS_FIELD_TYPE = type(attrs.field())


def _args_class(cls: type[T], frozen: bool | None) -> type[T]:
    """``cls`` as a job args class: attrs classes and dataclasses as they are, else attrs."""
    name = cls.__qualname__
    if _is_pydantic_model(cls):
        raise InvalidJobArgsError(
            f"{name} is a pydantic model, and job args are a plain class, an attrs class or "
            f"a dataclass: declare one with a field of type {name} and give the kind a "
            "converter with pydantic hooks (see 'Pydantic models' in docs/job-args.md)"
        )
    own_attrs = "__attrs_attrs__" in cls.__dict__
    own_dataclass = "__dataclass_fields__" in cls.__dict__
    if (own_attrs or own_dataclass) and frozen is not None:
        # Type checkers read frozen= from job_args (frozen unless told otherwise), so a
        # mutable class says frozen=False here too; it must agree with the class.
        actual = _declared_frozen(cls)
        if actual is not None and actual != frozen:
            what = "an attrs class" if own_attrs else "a dataclass"
            state = "frozen" if actual else "not frozen"
            raise InvalidJobArgsError(
                f"job_args(frozen={frozen}) disagrees with {name}, which is already {what} "
                f"and {state}; job_args cannot change that, so make the two agree (or drop "
                "frozen= here)"
            )
    if own_attrs:
        return cls
    if own_dataclass:
        _check_dataclass_fields(cls)
        return cls
    if dataclasses.is_dataclass(cls):
        raise InvalidJobArgsError(
            f"{name} inherits from a dataclass but is not one itself, so its own annotations "
            "are not fields; decorate it with @dataclass too (below @job_args)"
        )
    return attrs.define(
        cls, frozen=True if frozen is None else frozen, field_transformer=_refs_from_instances
    )


def _refs_from_instances(_cls: type, fields: list[attrs.Attribute[Any]]) -> list[Any]:
    """A field annotated with a ``Ref`` takes the mapped instance itself too
    (``SendInvoice(invoice=inv)``): it is turned into ``Ref.to(inv)`` when the args are
    built. A field's own converter is kept."""
    return [
        item.evolve(converter=ref_to_instance)
        if item.converter is None and mentions_ref(item.type)
        else item
        for item in fields
    ]


def _declared_frozen(cls: type) -> bool | None:
    """Whether an attrs class or a dataclass is frozen; None when attrs cannot say."""
    params = cls.__dict__.get("__dataclass_params__")
    if params is not None:
        return bool(params.frozen)
    inspect = getattr(attrs, "inspect", None)  # attrs 25.4+
    return bool(inspect(cls).is_frozen) if inspect is not None else None


def _check_dataclass_fields(cls: type) -> None:
    # Unique and sequence keys read their field marks from attrs fields only, so a mark
    # on a dataclass field would be silently ignored: refuse it instead.
    for item in dataclasses.fields(cls):
        if isinstance(item.default, _ATTRS_FIELD_TYPE):
            what = "is a sa_jobs.field() (an attrs field), which would become its default"
        elif item.metadata.get(FIELD_METADATA_KEY):
            what = f"carries sa_jobs' {FIELD_METADATA_KEY!r} field metadata"
        else:
            continue
        raise InvalidJobArgsError(
            f"{cls.__qualname__}.{item.name} {what}; marking fields unique= or sequence= "
            "needs an attrs class: drop @dataclass and let job_args make one (a dataclass's "
            "unique and sequence keys use all its args), or use dataclasses.field() for a "
            "plain default"
        )


def _is_pydantic_model(cls: type) -> bool:
    # Duck-typed so sa_jobs does not import pydantic: every pydantic 2 model has these.
    return all(hasattr(cls, name) for name in ("model_fields", "model_validate", "model_dump"))


def _list_field(cls: type) -> str:
    names = _field_names(cls)
    if len(names) != 1:
        raise InvalidJobArgsError(
            f"{cls.__qualname__} declares list_payload=True, so it must have exactly one "
            f"field (the list); it has {len(names)}"
        )
    return names[0]


def _field_names(cls: type) -> list[str]:
    """The field names of an attrs class or a dataclass, in declaration order."""
    if attrs.has(cls):
        return [item.name for item in attrs.fields(cls)]
    return [item.name for item in dataclasses.fields(cls)]


def check_kind(kind: object) -> str:
    """A kind named by an option (a filter's ``kind=``, a limit's ``kind=``): its args
    class (or an instance) or its kind string, as the kind string.

    The one resolver for every option that names a kind, so the same mistake gets the
    same error everywhere. (It lives here rather than in :mod:`sa_jobs._declare.option_checks`
    because resolving a class needs :func:`kind_of`, and this module imports that one.)

    Raises:
        InvalidOptionsError: neither a job args class nor a storable kind string of 1 to
            128 characters.
    """
    if isinstance(kind, str):
        try:
            check_kind_name(kind)
        except InvalidJobArgsError as exc:
            raise InvalidOptionsError(
                "kind", f"must be a job args class or a kind string: {exc}"
            ) from None
        return kind
    try:
        return kind_of(kind).name
    except InvalidJobArgsError as exc:
        raise InvalidOptionsError("kind", f"{exc} (or pass the kind as a string)") from None


def check_kind_name(kind: object) -> None:
    if not isinstance(kind, str) or not kind.strip():
        raise InvalidJobArgsError(f"kind must be a non-empty string, got {kind!r}")
    if len(kind) > MAX_KIND_LENGTH:
        raise InvalidJobArgsError(
            f"kind {kind[:40]!r}... is {len(kind)} characters; the limit is {MAX_KIND_LENGTH}"
        )
    problem = unstorable_text(kind)
    if problem is not None:
        raise InvalidJobArgsError(f"kind {kind!r} holds {problem}, which PostgreSQL cannot store")


def encode_args(args: object) -> tuple[JobKind, dict[str, Any]]:
    """Return the kind of ``args`` and its JSON form, validating both."""
    kind = kind_of(args)
    return kind, kind.encode(args)
