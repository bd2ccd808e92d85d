"""OpenTelemetry tracing for sa_jobs, built on :mod:`sa_jobs.hooks` (extra ``otel``).

:class:`OpenTelemetryHooks` is both an insert hook and a work hook::

    otel = OpenTelemetryHooks()
    sa_jobs.add_insert_hook(otel)                   # every insert of this process
    worker = sa_jobs.Worker(engine, hooks=[otel])   # every attempt of this worker

* Each insert call (``insert``, ``insert_many``, the flush of ``session.add(enqueue())``
  jobs) gets a ``PRODUCER`` span named ``send <queue>``, a child of whatever span is
  current (the request that enqueued). Its context is injected, through the propagator
  API (W3C ``traceparent`` by default), into every job's ``metadata`` under
  :data:`METADATA_KEY`.
* Each attempt gets a ``CONSUMER`` span named ``process <queue>``, current while the
  handler runs (so the handler's own spans are its children). It is **linked** to the
  context extracted from the job's metadata, as the messaging semantic conventions
  recommend for a message processed long after it was created; ``attempt_parent="child"``
  makes it a child of that context instead, putting the whole job in the enqueuing
  request's trace.
* A failed or discarded attempt records its exception and sets the span's status to
  ``ERROR``; cancelled, snoozed and completed attempts leave the status unset.

Attribute names follow the messaging semantic conventions where one fits
(``messaging.system``, ``messaging.operation.type``/``.name``,
``messaging.destination.name`` = the queue, ``messaging.message.id`` = the job id,
``messaging.batch.message_count``) and use ``sa_jobs.*`` otherwise (``sa_jobs.job.kind``:
span names are the conventions' ``{operation} {destination}``, so the kind is there).
"""

from __future__ import annotations

import contextvars
from collections.abc import Sequence
from typing import Any, Literal

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.propagators.textmap import TextMapPropagator
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode

from sa_jobs import __version__
from sa_jobs._table.models import Job
from sa_jobs.errors import InvalidOptionsError
from sa_jobs.hooks import AttemptResult, Ending, InsertHook, InsertingJob, WorkHook

__all__ = ["METADATA_KEY", "OpenTelemetryHooks"]

METADATA_KEY = "otel"
"""The key of a job's ``metadata`` holding the propagated trace context (a dict of the
propagator's fields, such as ``traceparent`` and ``tracestate``)."""

SYSTEM = "sa_jobs"

#: A span and the tokens that undo what starting it changed, kept between the two calls.
_Started = tuple[Span, "contextvars.Token[otel_context.Context]", contextvars.Token[Any]]


class OpenTelemetryHooks(InsertHook, WorkHook):
    """Spans for inserts and attempts, and the trace context carried between them.

    Args:
        tracer_provider: Default: the global one (``trace.set_tracer_provider``).
        propagator: How the context is written into and read from ``metadata``.
            Default: the global text-map propagator at each call (W3C trace context
            and baggage unless configured otherwise).
        attempt_parent: ``"link"`` (default): each attempt's span starts a trace of its
            own, linked to the span that inserted the job. ``"child"``: the attempt's
            span is a child of the inserting span.
    """

    def __init__(
        self,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        propagator: TextMapPropagator | None = None,
        attempt_parent: Literal["link", "child"] = "link",
    ) -> None:
        if attempt_parent not in ("link", "child"):
            raise InvalidOptionsError(
                "attempt_parent", f"must be 'link' or 'child', got {attempt_parent!r}"
            )
        self._tracer = trace.get_tracer("sa_jobs", __version__, tracer_provider=tracer_provider)
        self._propagator = propagator
        self._child = attempt_parent == "child"
        # One var per instance and side: an insert made inside an attempt nests cleanly.
        self._insert: contextvars.ContextVar[_Started | None] = contextvars.ContextVar(
            "sa_jobs_otel_insert", default=None
        )
        self._attempt: contextvars.ContextVar[_Started | None] = contextvars.ContextVar(
            "sa_jobs_otel_attempt", default=None
        )

    @property
    def propagator(self) -> TextMapPropagator:
        return self._propagator or propagate.get_global_textmap()

    # ------------------------------------------------------------------ inserts

    def before_insert(self, jobs: Sequence[InsertingJob]) -> None:
        kinds = {job.kind for job in jobs}
        queues = {job.queue for job in jobs}
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
        }
        if len(queues) == 1:
            attributes["messaging.destination.name"] = next(iter(queues))
        if len(kinds) == 1:
            attributes["sa_jobs.job.kind"] = next(iter(kinds))
        if len(jobs) != 1:
            attributes["messaging.batch.message_count"] = len(jobs)
        # The conventions' span name, "{operation} {destination}" ("send mail"); a batch
        # over several queues has no one destination. The kind is an attribute.
        name = f"send {next(iter(queues))}" if len(queues) == 1 else "send"
        span = self._tracer.start_span(name, kind=SpanKind.PRODUCER, attributes=attributes)
        with_span = trace.set_span_in_context(span)
        carrier: dict[str, str] = {}
        self.propagator.inject(carrier, context=with_span)
        for job in jobs:
            job.metadata[METADATA_KEY] = dict(carrier)
        token = otel_context.attach(with_span)
        restore = self._insert.set(None)  # reset(restore) brings back what was there
        self._insert.set((span, token, restore))

    def after_insert(self, jobs: Sequence[InsertingJob], error: BaseException | None) -> None:
        started = self._insert.get()
        if started is None:  # before_insert failed, or another instance's call
            return
        span, token, var_token = started
        if len(jobs) == 1 and jobs[0].id is not None:
            span.set_attribute("messaging.message.id", str(jobs[0].id))
        if error is not None:
            _record_error(span, error, None)
        self._insert.reset(var_token)
        otel_context.detach(token)
        span.end()

    # ------------------------------------------------------------------ attempts

    def before_work(self, job: Job[Any]) -> None:
        carrier = (job.metadata_ or {}).get(METADATA_KEY)
        current = otel_context.get_current()
        links: list[Link] = []
        if isinstance(carrier, dict):
            created = self.propagator.extract(carrier)
            creation = trace.get_current_span(created).get_span_context()
            if creation.is_valid:
                if self._child:
                    current = created
                else:
                    links.append(Link(creation))
        span = self._tracer.start_span(
            f"process {job.queue}",
            context=current,
            kind=SpanKind.CONSUMER,
            links=links,
            attributes={
                "messaging.system": SYSTEM,
                "messaging.operation.type": "process",
                "messaging.operation.name": "process",
                "messaging.destination.name": job.queue,
                "messaging.message.id": str(job.id),
                "sa_jobs.job.kind": job.kind,
                "sa_jobs.job.attempt": job.attempt,
            },
        )
        token = otel_context.attach(trace.set_span_in_context(span, current))
        restore = self._attempt.set(None)
        self._attempt.set((span, token, restore))

    def after_work(self, job: Job[Any], result: AttemptResult) -> None:
        started = self._attempt.get()
        if started is None:
            return
        span, token, var_token = started
        span.set_attribute("sa_jobs.attempt.outcome", result.outcome)
        if result.ending is Ending.FAILED:
            _record_error(span, result.exception, result.error)
        self._attempt.reset(var_token)
        otel_context.detach(token)
        span.end()


def _record_error(span: Span, exception: BaseException | None, message: str | None) -> None:
    if exception is not None:
        span.record_exception(exception)
    description = message or (f"{type(exception).__name__}: {exception}" if exception else None)
    span.set_status(Status(StatusCode.ERROR, description))
