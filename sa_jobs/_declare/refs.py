"""``Ref[Model]``: a typed reference to an ORM row, stored in job args as table + primary key.

A reference is made from a mapped instance (:meth:`Ref.to`, or by giving the instance to
a ``Ref`` field of a ``@job_args`` class) or from a primary key (``Ref(Invoice, 7)``).
It is stored in the args JSON as::

    {"table": "invoice", "pk": [7]}

``table`` is the mapped table's name (schema-qualified when the table has a schema),
which stays the same when the class is renamed or moved; ``pk`` lists the primary key's
values in the order of the table's primary-key columns, each in its JSON form (what the
kind's converter writes for the column's Python type: ints as numbers, UUIDs and
Decimals as strings). The model a stored reference reads back as comes from the field's
annotation, ``Ref[Invoice]``, not from the JSON.

A reference to a *pending* instance (no primary key yet) has no JSON until its instance
is flushed; :mod:`sa_jobs._insert.enqueue` writes such jobs after the flush has given the
instance its key (see :data:`PENDING` and :func:`placeholder_pks`).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import re
import typing
from collections.abc import Coroutine, Iterator
from typing import Any, Generic, TypeVar, overload

import attrs
from sqlalchemy import ColumnElement, inspect
from sqlalchemy.exc import NoInspectionAvailable
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Mapper, Session, scoped_session
from sqlalchemy.orm.exc import UnmappedInstanceError

from sa_jobs.errors import InvalidJobArgsError, RowMissingError

__all__ = [
    "PendingRefError",
    "Ref",
    "is_ref_type",
    "iter_refs",
    "mapper_of",
    "ref_model",
    "ref_to_instance",
]

M = TypeVar("M")


class PendingRefError(InvalidJobArgsError):
    """A reference's instance has no primary key yet (it is pending or transient)."""

    def __init__(self, ref: Ref[Any]) -> None:
        super().__init__(
            f"{ref.model.__qualname__} instance {ref.instance!r} has no primary key yet: "
            "flush it first, or enqueue the job (session.add(sa_jobs.enqueue(...))), which "
            "is written after the flush that gives the instance its key"
        )
        self.ref = ref


def mapper_of(model: object, *, what: str = "Ref") -> Mapper[Any]:
    """The mapper of a mapped class.

    Raises:
        InvalidJobArgsError: ``model`` is not a mapped class.
    """
    try:
        mapper = inspect(model) if isinstance(model, type) else None
    except NoInspectionAvailable:
        mapper = None
    if not isinstance(mapper, Mapper):
        name = model.__qualname__ if isinstance(model, type) else repr(model)
        raise InvalidJobArgsError(
            f"{what} to {name}: not a mapped SQLAlchemy class; a Ref names an ORM model "
            "(a class mapped with DeclarativeBase or registry.map_imperatively)"
        )
    return mapper


def _table_name(mapper: Mapper[Any]) -> str:
    table = mapper.local_table
    return str(getattr(table, "fullname", None) or getattr(table, "name", ""))


def _python_type(column: ColumnElement[Any]) -> type | None:
    try:
        kind = column.type.python_type
    except NotImplementedError:
        return None
    return kind if isinstance(kind, type) else None


class Ref(Generic[M]):
    """A reference to one row of ``model``, by primary key.

    ``Ref(Invoice, 7)``, ``Ref(Line, (7, 2))`` for a composite key (in primary-key column
    order), or ``Ref.to(invoice)``. Two references are equal when they name the same
    table and key. ``load`` and ``get`` read the row in the session given (a ``Session``
    or an ``AsyncSession``, whose calls are awaited).
    """

    __slots__ = ("_instance", "_pk", "model")

    model: type[M]

    def __init__(self, model: type[M], pk: Any) -> None:
        mapper = mapper_of(model)
        values = tuple(pk) if isinstance(pk, tuple | list) else (pk,)
        columns = mapper.primary_key
        if len(values) != len(columns):
            names = ", ".join(str(column.key) for column in columns)
            raise InvalidJobArgsError(
                f"Ref({model.__qualname__}, {pk!r}): {model.__qualname__}'s primary key has "
                f"{len(columns)} column(s) ({names}), so give {len(columns)} value(s)"
                + (" as a tuple, in that order" if len(columns) > 1 else "")
            )
        for column, value in zip(columns, values, strict=True):
            expected = _python_type(column)
            wrong = value is None or (
                expected is not None
                and (
                    not isinstance(value, expected)
                    or (isinstance(value, bool) and expected is not bool)
                )
            )
            if wrong:
                wanted = expected.__name__ if expected is not None else "a value"
                raise InvalidJobArgsError(
                    f"Ref({model.__qualname__}, {pk!r}): {column.key} is {value!r} "
                    f"({type(value).__name__}); the column holds {wanted}"
                )
        self.model = model
        self._pk: tuple[Any, ...] | None = values
        self._instance: M | None = None

    @classmethod
    def to(cls, instance: M) -> Ref[M]:
        """A reference to a mapped instance. A pending one (no primary key yet) gets its
        key when the session flushes it, before the job referencing it is written.

        Raises:
            InvalidJobArgsError: ``instance`` is not an instance of a mapped class.
        """
        try:
            state = inspect(instance)
        except (NoInspectionAvailable, UnmappedInstanceError):
            state = None
        if state is None or not hasattr(state, "mapper"):
            raise InvalidJobArgsError(
                f"Ref.to({instance!r}): not an instance of a mapped SQLAlchemy class"
            ) from None
        ref: Ref[M] = cls.__new__(cls)
        ref.model = type(instance)
        ref._instance = instance
        ref._pk = None
        return ref

    @property
    def instance(self) -> M | None:
        """The instance this reference was made from, if it was made from one."""
        return self._instance

    @property
    def table(self) -> str:
        """The referenced table's name, as stored."""
        return _table_name(mapper_of(self.model))

    @property
    def pk(self) -> tuple[Any, ...]:
        """The primary key's values, in primary-key column order.

        Raises:
            PendingRefError: made from an instance that has no primary key yet.
        """
        if self._pk is not None:
            return self._pk
        instance = self._instance
        if instance is None:  # a stand-in read back from a placeholder
            raise PendingRefError(self)
        state = inspect(instance)
        identity = state.identity
        values = (
            tuple(identity)
            if identity is not None
            else tuple(state.mapper.primary_key_from_instance(instance))
        )
        if any(value is None for value in values):
            raise PendingRefError(self)
        if identity is not None:
            self._pk = values  # an identity does not change
        return values

    @property
    def is_pending(self) -> bool:
        """Made from an instance that has no primary key yet."""
        try:
            _ = self.pk
        except PendingRefError:
            return True
        return False

    def _key(self) -> tuple[str, tuple[Any, ...]]:
        return self.table, self.pk

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Ref):
            return NotImplemented
        if self._instance is not None and self._instance is other._instance:
            return True
        try:
            return self._key() == other._key()
        except PendingRefError:
            return False

    def __hash__(self) -> int:
        try:
            return hash(self._key())
        except PendingRefError:
            # Equal only to references to the same instance until it has a key.
            return hash((self.table, id(self._instance)))

    def __repr__(self) -> str:
        try:
            pk = self.pk
        except PendingRefError:
            return f"Ref.to({self._instance!r})"
        shown = repr(pk[0]) if len(pk) == 1 else repr(pk)
        return f"Ref({self.model.__qualname__}, {shown})"

    # -- reading the row

    @overload
    def load(self, session: Session | scoped_session[Any], /, *, for_update: bool = False) -> M: ...

    @overload
    def load(
        self, session: AsyncSession, /, *, for_update: bool = False
    ) -> Coroutine[Any, Any, M]: ...

    def load(self, session: Any, /, *, for_update: bool = False) -> Any:
        """The referenced row, in ``session`` (``for_update``: locked ``FOR UPDATE`` until
        the transaction ends, read fresh even if the session holds it).

        Raises:
            RowMissingError: no such row.
        """
        if isinstance(session, AsyncSession):
            return session.run_sync(self._load, for_update)
        return self._load(session, for_update)

    @overload
    def get(
        self, session: Session | scoped_session[Any], /, *, for_update: bool = False
    ) -> M | None: ...

    @overload
    def get(
        self, session: AsyncSession, /, *, for_update: bool = False
    ) -> Coroutine[Any, Any, M | None]: ...

    def get(self, session: Any, /, *, for_update: bool = False) -> Any:
        """The referenced row in ``session``, or None if there is none."""
        if isinstance(session, AsyncSession):
            return session.run_sync(self._get, for_update)
        return self._get(session, for_update)

    def _get(self, session: Session, for_update: bool) -> M | None:
        return session.get(
            self.model,
            self.pk if len(self.pk) > 1 else self.pk[0],
            with_for_update=True if for_update else None,
        )

    def _load(self, session: Session, for_update: bool) -> M:
        found = self._get(session, for_update)
        if found is None:
            raise RowMissingError(self.model.__qualname__, self.table, self.pk)
        return found


# --------------------------------------------------------------------------- types


def is_ref_type(tp: Any) -> bool:
    """``Ref`` or ``Ref[Model]``."""
    return tp is Ref or typing.get_origin(tp) is Ref


def ref_model(tp: Any) -> type | None:
    """The model of ``Ref[Model]``; None for a bare ``Ref``."""
    arguments = typing.get_args(tp)
    return arguments[0] if arguments and isinstance(arguments[0], type) else None


# ---------------------------------------------------------------- instances given to a field

#: An annotation that mentions Ref (a string under ``from __future__ import annotations``).
_MENTIONS_REF = re.compile(r"(?<![\w])Ref\[")


def mentions_ref(annotation: Any) -> bool:
    if isinstance(annotation, str):
        return bool(_MENTIONS_REF.search(annotation))
    return bool(_MENTIONS_REF.search(repr(annotation))) or is_ref_type(annotation)


def ref_to_instance(value: Any) -> Any:
    """The attrs converter of a ``Ref`` field: a mapped instance becomes ``Ref.to(value)``;
    anything else is left for the converter to judge at enqueue."""
    if value is None or isinstance(value, Ref):
        return value
    try:
        state = inspect(value)
    except (NoInspectionAvailable, UnmappedInstanceError):
        return value
    return Ref.to(value) if hasattr(state, "mapper") else value


# --------------------------------------------------------------------------- placeholders

#: While set, references with no primary key yet are written with ``"pk": null``: enqueue
#: checks everything else about the args before the instance has its key.
_PLACEHOLDER = contextvars.ContextVar("sa_jobs_ref_placeholder", default=False)


@contextlib.contextmanager
def placeholder_pks() -> Iterator[None]:
    token = _PLACEHOLDER.set(True)
    try:
        yield
    finally:
        _PLACEHOLDER.reset(token)


def placeholders_allowed() -> bool:
    return _PLACEHOLDER.get()


# --------------------------------------------------------------------------- JSON


def register_ref_hooks(conv: Any) -> None:
    """Teach a cattrs converter ``Ref[Model]``: ``{"table": ..., "pk": [...]}`` and back."""
    conv.register_unstructure_hook_factory(is_ref_type, lambda tp: _unstructure_ref(conv, tp))
    conv.register_structure_hook_factory(
        lambda tp: is_ref_type(tp) and ref_model(tp) is not None,
        lambda tp: _structure_ref(conv, tp),
    )


def _unstructure_ref(conv: Any, tp: Any) -> Any:
    declared = ref_model(tp)

    def unstructure(ref: Any) -> dict[str, Any]:
        if not isinstance(ref, Ref):
            raise InvalidJobArgsError(
                f"{ref!r} ({type(ref).__name__}) given for a Ref"
                + (f"[{declared.__qualname__}]" if declared is not None else "")
                + "; give a mapped instance, Ref.to(instance) or Ref(Model, pk)"
            )
        if declared is not None and not issubclass(ref.model, declared):
            raise InvalidJobArgsError(
                f"a reference to {ref.model.__qualname__} given for a "
                f"Ref[{declared.__qualname__}]; the field holds {declared.__qualname__} rows"
            )
        mapper = mapper_of(ref.model)
        try:
            pk = ref.pk
        except PendingRefError:
            if not placeholders_allowed():
                raise
            return {"table": _table_name(mapper), "pk": None}
        values = [
            conv.unstructure(value, unstructure_as=_python_type(column) or type(value))
            for column, value in zip(mapper.primary_key, pk, strict=True)
        ]
        return {"table": _table_name(mapper), "pk": values}

    return unstructure


def _structure_ref(conv: Any, tp: Any) -> Any:
    model = ref_model(tp)
    assert model is not None

    def structure(data: Any, _tp: Any) -> Ref[Any]:
        mapper = mapper_of(model)
        table = _table_name(mapper)
        if not isinstance(data, dict) or set(data) != {"table", "pk"}:
            raise ValueError(
                f'a reference is stored as {{"table": ..., "pk": [...]}}, not {data!r}'
            )
        if data["table"] != table:
            raise ValueError(
                f"stored reference to table {data['table']!r}, but {model.__qualname__} maps "
                f"{table!r}"
            )
        pk = data["pk"]
        if pk is None and placeholders_allowed():
            ref: Ref[Any] = Ref.__new__(Ref)
            ref.model, ref._pk, ref._instance = model, None, None
            return ref
        if not isinstance(pk, list) or len(pk) != len(mapper.primary_key):
            raise ValueError(
                f"stored key {pk!r} does not fit {model.__qualname__}'s primary key of "
                f"{len(mapper.primary_key)} column(s)"
            )
        values = tuple(
            conv.structure(value, _python_type(column)) if _python_type(column) else value
            for column, value in zip(mapper.primary_key, pk, strict=True)
        )
        return Ref(model, values)

    return structure


# --------------------------------------------------------------------------- finding refs


def iter_refs(
    value: Any, policy: str = "cancel", metadata_key: str = "sa_jobs"
) -> Iterator[tuple[Ref[Any], str]]:
    """Every reference in an args instance, with the ``on_missing`` of the field holding
    it (an inner field's own setting wins over the outer one's)."""
    if isinstance(value, Ref):
        yield value, policy
    elif isinstance(value, str | bytes | int | float | bool) or value is None:
        return
    elif attrs.has(type(value)):
        for item in attrs.fields(type(value)):
            own = item.metadata.get(metadata_key, {}).get("on_missing")
            yield from iter_refs(getattr(value, item.name), own or policy, metadata_key)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for data_field in dataclasses.fields(value):
            yield from iter_refs(getattr(value, data_field.name), policy, metadata_key)
    elif isinstance(value, dict):
        for item_value in value.values():
            yield from iter_refs(item_value, policy, metadata_key)
    elif isinstance(value, list | tuple | set | frozenset):
        for element in value:
            yield from iter_refs(element, policy, metadata_key)
