"""OpenTelemetry spans (sa_jobs.otel) across a real worker: the insert's PRODUCER span is
a child of the enqueuing request, its context travels in the job's metadata, and each
attempt's CONSUMER span links to it (or is its child), with errors recorded."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode, get_tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from sqlalchemy import Engine
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import Job
from sa_jobs.errors import InvalidOptionsError
from sa_jobs.hooks import INSERT_HOOKS, add_insert_hook
from sa_jobs.otel import METADATA_KEY, OpenTelemetryHooks
from tests.helpers import NO_DELAY, get_job, make_worker


@sa_jobs.job_args(kind="otel_task", queue="otel", max_attempts=2)
class Task:
    fail_first: bool = False


@pytest.fixture(autouse=True)
def _no_insert_hooks() -> Iterator[None]:
    INSERT_HOOKS.active = ()
    yield
    INSERT_HOOKS.active = ()


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def _hooks(provider: TracerProvider, **options: Any) -> OpenTelemetryHooks:
    return OpenTelemetryHooks(
        tracer_provider=provider, propagator=TraceContextTextMapPropagator(), **options
    )


def _enqueue_in_request(engine: Engine, provider: TracerProvider, *args: Task) -> list[int]:
    with (
        get_tracer("test", tracer_provider=provider).start_as_current_span("request"),
        Session(engine) as session,
        session.begin(),
    ):
        jobs = [sa_jobs.enqueue(one) for one in args]
        session.add_all(jobs)
        session.flush()
        return [job.id for job in jobs]


def _named(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [span for span in spans if span.name == name]


def _work(engine: Engine, otel: OpenTelemetryHooks, provider: TracerProvider, kind: str) -> None:
    worker = make_worker(engine, queues={"otel": 2}, hooks=[otel], retry_policy=NO_DELAY)
    inner = get_tracer("handler", tracer_provider=provider)

    if kind == "sync":

        @worker.handler(Task)
        def handle(job: Job[Task]) -> None:
            with inner.start_as_current_span("inside handler"):
                if job.args.fail_first and job.attempt == 1:
                    raise ValueError("first attempt fails")

    else:

        @worker.handler(Task)
        async def handle_async(job: Job[Task]) -> None:
            with inner.start_as_current_span("inside handler"):
                await asyncio.sleep(0)
                if job.args.fail_first and job.attempt == 1:
                    raise ValueError("first attempt fails")

    worker.run_until_idle()


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_attempt_spans_link_to_the_insert_span_through_the_jobs_metadata(
    engine: Engine, provider: TracerProvider, exporter: InMemorySpanExporter, kind: str
) -> None:
    otel = _hooks(provider)
    add_insert_hook(otel)
    [job_id] = _enqueue_in_request(engine, provider, Task(fail_first=True))

    _work(engine, otel, provider, kind)

    spans = exporter.get_finished_spans()
    [request] = _named(spans, "request")
    [insert] = _named(spans, "send otel")
    assert insert.kind is SpanKind.PRODUCER
    assert insert.parent is not None and insert.parent.span_id == request.context.span_id
    assert dict(insert.attributes or {}) == {
        "messaging.system": "sa_jobs",
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": "otel",
        "sa_jobs.job.kind": "otel_task",
        "messaging.message.id": str(job_id),
    }
    carried = get_job(engine, job_id).metadata_[METADATA_KEY]
    assert carried["traceparent"].split("-")[1:3] == [
        f"{insert.context.trace_id:032x}",
        f"{insert.context.span_id:016x}",
    ]

    failed, completed = sorted(
        _named(spans, "process otel"), key=lambda span: span.attributes["sa_jobs.job.attempt"]
    )
    for attempt in (failed, completed):
        assert attempt.kind is SpanKind.CONSUMER
        assert attempt.parent is None  # a trace of its own, linked to the insert
        assert [link.context.span_id for link in attempt.links] == [insert.context.span_id]
        assert attempt.attributes is not None
        assert attempt.attributes["messaging.message.id"] == str(job_id)
        assert attempt.attributes["messaging.destination.name"] == "otel"
        assert attempt.attributes["messaging.operation.type"] == "process"
        assert attempt.attributes["messaging.operation.name"] == "process"
        assert attempt.attributes["sa_jobs.job.kind"] == "otel_task"
    assert failed.attributes is not None and completed.attributes is not None
    assert failed.attributes["sa_jobs.attempt.outcome"] == "failed"
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.status.description == "ValueError: first attempt fails"
    assert [event.name for event in failed.events] == ["exception"]
    assert completed.attributes["sa_jobs.attempt.outcome"] == "completed"
    assert completed.status.status_code is StatusCode.UNSET

    # The handler's own spans are children of the attempt's span.
    inside = _named(spans, "inside handler")
    assert sorted(span.parent.span_id for span in inside if span.parent) == sorted(
        [failed.context.span_id, completed.context.span_id]
    )


def test_attempt_parent_child_puts_the_attempt_in_the_requests_trace(
    engine: Engine, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    otel = _hooks(provider, attempt_parent="child")
    add_insert_hook(otel)
    _enqueue_in_request(engine, provider, Task())

    _work(engine, otel, provider, "sync")

    spans = exporter.get_finished_spans()
    [insert] = _named(spans, "send otel")
    [attempt] = _named(spans, "process otel")
    assert attempt.parent is not None and attempt.parent.span_id == insert.context.span_id
    assert attempt.context.trace_id == insert.context.trace_id
    assert attempt.links == ()


def test_a_batch_insert_is_one_span_whose_context_every_job_carries(
    engine: Engine, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    add_insert_hook(OpenTelemetryHooks(tracer_provider=provider))  # the global propagator
    with Session(engine, expire_on_commit=False) as session, session.begin():
        results = sa_jobs.insert_many(session, [Task(), Task(), Task()])

    [insert] = exporter.get_finished_spans()
    assert insert.attributes is not None
    assert insert.attributes["messaging.batch.message_count"] == 3
    assert "messaging.message.id" not in insert.attributes
    parents = {get_job(engine, r.job.id).metadata_[METADATA_KEY]["traceparent"] for r in results}
    assert len(parents) == 1 and f"{insert.context.span_id:016x}" in parents.pop()


def test_a_job_without_trace_context_gets_an_unlinked_span(
    engine: Engine, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    otel = _hooks(provider)
    with Session(engine) as session, session.begin():
        session.add(sa_jobs.enqueue(Task(), metadata={METADATA_KEY: {"traceparent": "junk"}}))

    _work(engine, otel, provider, "sync")

    [attempt] = _named(exporter.get_finished_spans(), "process otel")
    assert attempt.links == () and attempt.parent is None


def test_attempt_parent_must_be_link_or_child() -> None:
    with pytest.raises(InvalidOptionsError, match="attempt_parent"):
        OpenTelemetryHooks(attempt_parent="sibling")  # type: ignore[arg-type]


def test_span_names_are_operation_and_queue(
    engine: Engine, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    # The messaging conventions' "{operation} {destination}"; a batch over two queues
    # has no one destination.
    add_insert_hook(OpenTelemetryHooks(tracer_provider=provider))
    with Session(engine) as session, session.begin():
        sa_jobs.insert(session, Task(), queue="mail")
        session.add_all([sa_jobs.enqueue(Task(), queue="a"), sa_jobs.enqueue(Task(), queue="b")])
    assert sorted(span.name for span in exporter.get_finished_spans()) == ["send", "send mail"]
