"""The OpenTelemetry tracer (the ``otel`` extra): spans made with OpenTelemetry's SDK
and exported in batches over OTLP/HTTP. Imported only when ``tracing.otlp_endpoint``
is set (``gateway.ops.tracers.tracer_for``), and by the tests.

A request's span is a server span named ``<method> <route template>``, with
``http.request.method``, ``http.route``, ``http.response.status_code``,
``gateway.cache.result`` and ``gateway.request_id``; its status is an error for a 5xx.
Its children are ``cache.get`` (internal; ``gateway.cache.lookup``: ``found``,
``absent`` or ``unavailable``) and the upstream call, a client span named
``GET <route template>`` with ``http.request.method``, ``url.template``,
``server.address``, ``server.port``, and ``http.response.status_code`` or
``error.type`` (an error for a 4xx, a 5xx or no answer). The span id of the client
span is the parent id of the ``traceparent`` the upstream gets.

A caller's ``traceparent`` is the remote parent of the request's span: the trace
goes on, and the sampler (``ParentBased(TraceIdRatioBased(tracing.sample_ratio))``)
follows the caller's sampled flag; only a trace the gateway starts is sampled by
ratio. The tracer never uses OpenTelemetry's global provider or its current context:
each app has its own provider, and a span's parent is always given.
"""

from __future__ import annotations

import time
from types import TracebackType

from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import (
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
    set_span_in_context,
)

from gateway.ops.tracecontext import TraceParent, format_traceparent
from gateway.ops.tracing import Attributes, ChildSpan, RequestSpan, Untraced, UpstreamCall

# what one export to the collector may take: at a stop, what is left is sent within it
EXPORT_TIMEOUT_S = 5.0
_SCOPE = "records-gateway"
_NOT_SAMPLED = TraceFlags(TraceFlags.DEFAULT)
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)


def otlp_exporter(traces_url: str) -> SpanExporter:
    """The OTLP/HTTP exporter to ``traces_url`` (the collector's ``/v1/traces``)."""
    return OTLPSpanExporter(endpoint=traces_url, timeout=EXPORT_TIMEOUT_S)


# how often the offset between the wall clock and perf_counter is read again (the wall
# clock may be stepped or slewed meanwhile)
CLOCK_OFFSET_TTL_S = 60.0


class _ClockOffset:
    """The wall time less ``time.perf_counter()``, in ns, read once a minute: the same
    ``perf`` value is then the same wall time for every span made of it (a request's
    span and its children begun at one instant stay in order), where reading both
    clocks on each call would put tens of ns of jitter between them."""

    def __init__(self) -> None:
        self._read_at = -CLOCK_OFFSET_TTL_S
        self._offset_ns = 0

    def epoch_ns(self, perf: float) -> int:
        now = time.perf_counter()
        if now - self._read_at >= CLOCK_OFFSET_TTL_S:
            self._offset_ns = time.time_ns() - int(now * 1e9)
            self._read_at = now
        return self._offset_ns + int(perf * 1e9)


_CLOCK = _ClockOffset()


def _epoch_ns(perf: float | None) -> int | None:
    """The wall time, in ns, of the ``time.perf_counter()`` value ``perf`` (None: now)."""
    if perf is None:
        return None
    return _CLOCK.epoch_ns(perf)


class _Child:
    """A span inside a request's."""

    __slots__ = ("_span",)

    def __init__(self, span: Span) -> None:
        self._span = span

    def set(self, key: str, value: str | int | bool) -> None:
        self._span.set_attribute(key, value)

    def end(self) -> None:
        self._span.end()

    def __enter__(self) -> _Child:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if error is not None:
            self._span.set_status(Status(StatusCode.ERROR, type(error).__name__))
        self._span.end()


class _Call:
    """The client span of an upstream call."""

    __slots__ = ("_span", "traceparent", "tracestate")

    def __init__(self, span: Span, tracestate: str | None) -> None:
        self._span = span
        context = span.get_span_context()
        self.traceparent = format_traceparent(
            f"{context.trace_id:032x}", f"{context.span_id:016x}", context.trace_flags.sampled
        )
        self.tracestate = tracestate

    def end(self, outcome: str) -> None:
        span = self._span
        if outcome.isdigit():
            status = int(outcome)
            span.set_attribute("http.response.status_code", status)
            if status >= 400:
                span.set_attribute("error.type", outcome)
                span.set_status(Status(StatusCode.ERROR))
        else:
            span.set_attribute("error.type", outcome)
            span.set_status(Status(StatusCode.ERROR))
        span.end()


class OtelRequestSpan:
    """The server span of one request."""

    __slots__ = ("_context", "_span", "_tracer", "_tracestate")

    def __init__(self, tracer: OtelTracer, span: Span, tracestate: str | None) -> None:
        self._tracer = tracer
        self._span = span
        self._tracestate = tracestate
        self._context: Context | None = None

    @property
    def trace_id(self) -> str:
        return f"{self._span.get_span_context().trace_id:032x}"

    def _parent(self) -> Context:
        context = self._context
        if context is None:
            context = self._context = set_span_in_context(self._span, Context())
        return context

    def child(self, name: str, started: float | None = None) -> ChildSpan:
        span = self._tracer.otel.start_span(
            name, context=self._parent(), kind=SpanKind.INTERNAL, start_time=_epoch_ns(started)
        )
        return _Child(span)

    def call(self, name: str, attributes: Attributes) -> UpstreamCall:
        span = self._tracer.otel.start_span(
            name, context=self._parent(), kind=SpanKind.CLIENT, attributes=dict(attributes)
        )
        return _Call(span, self._tracestate)

    def end(self, status: int | None, cache: str) -> None:
        span = self._span
        span.set_attribute("gateway.cache.result", cache)
        if status is None:
            span.set_status(Status(StatusCode.ERROR, "the caller went away"))
        else:
            span.set_attribute("http.response.status_code", status)
            if status >= 500:
                span.set_status(Status(StatusCode.ERROR))
        span.end()

    def detached(self) -> RequestSpan:
        sampled = self._span.get_span_context().trace_flags.sampled
        return Untraced(self.trace_id, sampled, self._tracestate)


class OtelTracer:
    """Spans through OpenTelemetry's SDK, on a provider of the tracer's own."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.otel = provider.get_tracer(_SCOPE)

    @classmethod
    def build(cls, exporter: SpanExporter, *, service_name: str, sample_ratio: float) -> OtelTracer:
        """A tracer whose spans go to ``exporter`` in batches, from a background thread
        (the tests give an in-memory exporter)."""
        provider = TracerProvider(
            sampler=ParentBased(TraceIdRatioBased(sample_ratio)),
            resource=Resource.create({SERVICE_NAME: service_name}),
            shutdown_on_exit=False,  # the app's cleanup shuts it down
        )
        provider.add_span_processor(BatchSpanProcessor(exporter))
        return cls(provider)

    recording = True

    def request(
        self,
        method: str,
        route: str,
        caller: TraceParent | None,
        request_id: str,
        started: float,
    ) -> RequestSpan:
        parent = Context()
        tracestate = None
        if caller is not None:
            tracestate = caller.tracestate
            remote = SpanContext(
                trace_id=int(caller.trace_id, 16),
                span_id=int(caller.parent_id, 16),
                is_remote=True,
                trace_flags=_SAMPLED if caller.sampled else _NOT_SAMPLED,
                trace_state=TraceState.from_header([tracestate]) if tracestate else None,
            )
            parent = set_span_in_context(NonRecordingSpan(remote), parent)
        span = self.otel.start_span(
            f"{method} {route}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={
                "http.request.method": method,
                "http.route": route,
                "gateway.request_id": request_id,
            },
            start_time=_epoch_ns(started),
        )
        return OtelRequestSpan(self, span, tracestate)

    def flush(self) -> None:
        """Export every ended span now (blocking)."""
        self.provider.force_flush()

    def shutdown(self) -> None:
        self.provider.shutdown()
