"""Mistakes in declarations surface where they are made: at ``@job_args`` and at
``@worker.handler``, not as a job discarded after its attempts."""

from __future__ import annotations

import datetime as dt
import enum
import uuid
from typing import Any, Literal

import attrs
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import Job
from sa_jobs._declare.args import kind_of
from sa_jobs.errors import DuplicateHandlerError, InvalidJobArgsError, InvalidOptionsError
from sa_jobs.worker.handlers import HandlerRegistry

# An engine that is never connected to: registration needs none.
ENGINE = create_engine("postgresql+psycopg://nobody@127.0.0.1:1/nowhere")


def declare(annotation: Any, **options: Any) -> type:
    namespace: dict[str, Any] = {"__annotations__": {"value": annotation}}
    cls = type("Declared", (), namespace)
    return sa_jobs.job_args(kind="declared", registry=sa_jobs.KindRegistry(), **options)(cls)


def roundtrip(cls: type, value: Any) -> Any:
    kind = kind_of(cls)
    return kind.decode(kind.encode(cls(value))).value


# ----------------------------------------------------------------- args that could not be read back


class Color(enum.Enum):
    RED = "red"


@attrs.define
class Point:
    x: int
    y: int


@attrs.define
class Other:
    x: int
    y: int


@pytest.mark.parametrize(
    ("annotation", "says"),
    [
        (object, "annotated `object`; use typing.Any"),
        (str | dt.datetime, "str and datetime are all stored as a JSON string"),
        (list[int] | list[str], "stored as a JSON array"),
        (str | Color, "stored as a JSON string"),
        (dict[int, str], "dict with int keys; JSON object keys are strings"),
        (dict[tuple[int, int], str], "JSON object keys are strings"),
        (list[object], "annotated `object`"),
        (Any | int, "any JSON value"),
        (Point | Other, "cannot read back"),
    ],
    ids=[
        "object",
        "str-or-datetime",
        "two-lists",
        "str-or-str-enum",
        "int-keys",
        "tuple-keys",
        "list-of-object",
        "any-or-int",
        "twin-attrs-classes",
    ],
)
def test_a_field_that_would_not_read_back_is_refused_at_declaration(
    annotation: Any, says: str
) -> None:
    with pytest.raises(InvalidJobArgsError) as exc:
        declare(annotation)
    assert "Declared.value" in str(exc.value)
    assert says in str(exc.value)
    assert "could not read them back" in str(exc.value)


@pytest.mark.parametrize(
    ("annotation", "value"),
    [
        (int | str, 7),
        (int | str, "seven"),
        (float | int, 2.5),
        (float | int, 3),
        (list[int] | str, [1, 2]),
        (list[int] | str, "1,2"),
        (bool | None, True),
        (uuid.UUID | None, uuid.UUID(int=5)),
        (Literal["a", "b"], "b"),
        (dict[str, int | str], {"n": 1, "s": "x"}),
        (Point | None, Point(1, 2)),
        (Any, {"free": ["form", 1]}),
    ],
)
def test_unions_of_distinct_json_shapes_round_trip(annotation: Any, value: Any) -> None:
    back = roundtrip(declare(annotation), value)
    assert back == value
    assert type(back) is type(value)


def test_a_class_with_forward_references_is_checked_on_first_use() -> None:
    # Names defined after the class (a module still importing) cannot be checked at
    # declaration; the check runs before the first job of the kind is written.
    cls = declare("LaterDefined")
    with pytest.raises(InvalidJobArgsError, match="cannot resolve"):
        sa_jobs.insert_job(cls(1))


# ----------------------------------------------------------------- handler signatures


@sa_jobs.job_args(kind="declaration_mistakes", registry=sa_jobs.KindRegistry())
class Task:
    n: int = 0


@sa_jobs.job_args(kind="declaration_mistakes_other", registry=sa_jobs.KindRegistry())
class OtherTask:
    n: int = 0


def register(function: Any, **kwargs: Any) -> sa_jobs.Worker:
    worker = sa_jobs.Worker(ENGINE, **kwargs)
    worker.handler(Task)(function)
    return worker


def test_a_second_parameter_that_is_not_the_session_is_refused() -> None:
    def handle(job: Job, mailer: object) -> None: ...

    with pytest.raises(InvalidOptionsError, match="second parameter 'mailer' is not a session"):
        register(handle)


def test_too_many_parameters_are_refused() -> None:
    def handle(job: Job, session: Session, extra: int) -> None: ...

    with pytest.raises(InvalidOptionsError, match=r"cannot fill \(extra\)"):
        register(handle)


def test_a_required_keyword_only_parameter_is_refused() -> None:
    def handle(job: Job, *, verbose: bool) -> None: ...

    with pytest.raises(InvalidOptionsError, match="keyword-only parameter 'verbose'"):
        register(handle)


def test_a_handler_without_a_parameter_for_the_job_is_refused() -> None:
    def handle() -> None: ...

    with pytest.raises(InvalidOptionsError, match="takes no parameter for the job"):
        register(handle)


def test_a_session_is_recognised_by_its_name_or_its_annotation() -> None:
    def by_name(job: Job, session: Any) -> None: ...

    def by_annotation(job: Job, db: Session) -> None: ...

    async def by_async_annotation(job: Job, db: AsyncSession) -> None: ...

    def optional_extra(job: Job, verbose: bool = False) -> None: ...

    worker = sa_jobs.Worker(ENGINE)
    assert worker.handlers.register(Task, by_name).wants_session
    worker = sa_jobs.Worker(ENGINE)
    assert worker.handlers.register(Task, by_annotation).wants_session
    worker = sa_jobs.Worker(ENGINE)
    assert worker.handlers.register(Task, by_async_annotation).wants_session
    worker = sa_jobs.Worker(ENGINE)
    assert not worker.handlers.register(Task, optional_extra).wants_session


def test_an_async_session_handler_without_an_async_engine_is_refused_at_registration() -> None:
    async def handle(job: Job, session: AsyncSession) -> None: ...

    registry = HandlerRegistry(None, lambda: "the engine's driver (pg8000) has no async form")
    with pytest.raises(InvalidOptionsError, match=r"is async and takes a session, but .*pg8000"):
        registry.register(Task, handle)
    # Without a session it needs no async engine.

    async def plain(job: Job) -> None: ...

    assert registry.register(Task, plain).is_async


def test_a_second_handler_for_a_kind_says_handler() -> None:
    def first(job: Job) -> None: ...

    def second(job: Job) -> None: ...

    worker = register(first)
    with pytest.raises(DuplicateHandlerError, match="already has a handler") as exc:
        worker.handler(Task)(second)
    assert "first" in str(exc.value)
    assert "job class" not in str(exc.value)
    worker.handler(OtherTask)(second)


def test_a_retry_policy_without_next_delay_is_refused() -> None:
    with pytest.raises(InvalidOptionsError, match="next_delay"):
        sa_jobs.Worker(ENGINE, retry_policy=dt.timedelta(seconds=5))  # type: ignore[arg-type]


@sa_jobs.job_args(kind="mistake_annotated_email")
class Email:
    to: str


@sa_jobs.job_args(kind="mistake_annotated_report")
class Report:
    name: str


def test_a_handler_annotated_for_another_args_class_is_refused_at_registration() -> None:
    worker = sa_jobs.Worker(create_engine("postgresql+psycopg://localhost/app"))
    wrong_annotation = r"annotated Job\[Report\]; annotate it Job\[Email\]"
    with pytest.raises(InvalidOptionsError, match=wrong_annotation):

        @worker.handler(Email)
        def wrong(job: sa_jobs.Job[Report]) -> None:
            pass

    # The right annotation, Job[Any], a bare Job and none at all are all accepted.
    @worker.handler(Email)
    def right(job: sa_jobs.Job[Email]) -> None:
        pass

    for loose in (sa_jobs.Job[Any], sa_jobs.Job, None):
        other = sa_jobs.Worker(create_engine("postgresql+psycopg://localhost/app"))

        def handler(job):  # type: ignore[no-untyped-def]
            pass

        if loose is not None:
            handler.__annotations__["job"] = loose
        other.handler(Email)(handler)


def test_queues_are_checked_when_set_and_the_default_stuck_limit_follows_them() -> None:
    engine = create_engine("postgresql+psycopg://localhost/app")
    worker = sa_jobs.Worker(engine, queues={"default": 2})
    assert worker.stuck_thread_limit == 2
    worker.queues = {"mail": 10, "default": 5}  # what `sa-jobs work -q` does
    assert worker.queues == {"mail": 10, "default": 5}
    assert worker.stuck_thread_limit == 15
    with pytest.raises(InvalidOptionsError, match="concurrency of queue 'mail'"):
        worker.queues = {"mail": 0}
    assert worker.queues == {"mail": 10, "default": 5}  # unchanged by the refusal

    chosen = sa_jobs.Worker(engine, queues={"default": 2}, stuck_thread_limit=1)
    chosen.queues = {"default": 50}
    assert chosen.stuck_thread_limit == 1  # a limit the user chose stays


def test_a_session_annotated_for_the_other_kind_of_handler_is_refused() -> None:
    worker = sa_jobs.Worker(create_engine("postgresql+psycopg://localhost/app"))
    with pytest.raises(InvalidOptionsError, match="an AsyncSession, but it is annotated Session"):

        @worker.handler(Email)
        async def async_with_sync_session(job: Job[Email], session: Session) -> None:
            session.execute(text("SELECT 1"))  # would only make a coroutine

    with pytest.raises(InvalidOptionsError, match="a Session, but it is annotated AsyncSession"):

        @worker.handler(Report)
        def sync_with_async_session(job: Job[Report], session: AsyncSession) -> None:
            pass
