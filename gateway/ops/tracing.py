"""The seam between the gateway and OpenTelemetry: a :class:`Tracer` makes the span of
each request, whose children are the cache read and the upstream call.

Without ``tracing.otlp_endpoint`` the tracer is :data:`NO_TRACER`: it records nothing,
and no ``opentelemetry`` module is ever imported. Its request spans only carry the
trace context: the caller's trace id (or a new one, made when first asked for), and
for each upstream call a ``traceparent`` with that trace id and a new parent id. With
the endpoint set, ``gateway.ops.tracers.tracer_for`` builds the OpenTelemetry tracer
(``gateway.ops.otel``, imported then and only then).

The layers below the HTTP edge never see a tracer: they reach the span of the request
they serve through ``gateway.ops.trace`` (the request's context variable), so that a
background refresh, which runs in a copy of the context of the request that started
it, makes its upstream span in that request's trace.

What spans may carry is fixed here and in ``gateway.ops.otel``: methods, route
templates, status codes, cache results, request ids, the upstream's host and port.
Never a token, an ``Authorization`` field, a raw path or a query string.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType
from typing import Protocol

from gateway.ops.tracecontext import (
    TraceParent,
    format_traceparent,
    new_span_id,
    new_trace_id,
)

Attributes = Mapping[str, str | int]


class ChildSpan(Protocol):
    """A span inside a request's (the cache read): ended by ``end``, or on leaving its
    ``with`` block."""

    def set(self, key: str, value: str | int | bool) -> None: ...

    def end(self) -> None: ...

    def __enter__(self) -> ChildSpan: ...

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


class UpstreamCall(Protocol):
    """The span of one upstream call: the trace context fields its request carries
    (``traceparent`` names this span as the parent), ended with the call's outcome."""

    @property
    def traceparent(self) -> str: ...

    @property
    def tracestate(self) -> str | None: ...

    def end(self, outcome: str) -> None:
        """``outcome``: the upstream's status code, or what went wrong (``timeout``,
        ``unreachable``, ``invalid-body``, ``error``)."""
        ...


class RequestSpan(Protocol):
    """The span of one request the gateway serves."""

    @property
    def trace_id(self) -> str:
        """The trace's id (32 lower-case hex digits): the caller's, or the gateway's."""
        ...

    def child(self, name: str, started: float | None = None) -> ChildSpan:
        """A span inside this one, begun at ``started`` (``time.perf_counter()``) or now."""
        ...

    def call(self, name: str, attributes: Attributes) -> UpstreamCall:
        """The span of an upstream call made for this request, begun now."""
        ...

    def end(self, status: int | None, cache: str) -> None:
        """End this span: the answer's status (None: the caller went away first) and
        cache result (``hit``, ``miss``, ``stale``, ``bypass``, ``none``)."""
        ...

    def detached(self) -> RequestSpan:
        """A span of the same trace that records nothing (for the shadow traffic)."""
        ...


class Tracer(Protocol):
    """Makes the spans of requests (see the module's docstring)."""

    @property
    def recording(self) -> bool:
        """Whether spans are recorded at all (the fast path asks before it spends)."""
        ...

    def request(
        self,
        method: str,
        route: str,
        caller: TraceParent | None,
        request_id: str,
        started: float,
    ) -> RequestSpan:
        """The span of a request of ``method`` on the route template ``route``,
        begun at ``started`` (``time.perf_counter()``), continuing ``caller``'s trace
        when it sent one."""
        ...

    def shutdown(self) -> None:
        """Export what is left and stop (blocking: run it in a thread)."""
        ...


class _NoSpan:
    """A child span that records nothing."""

    __slots__ = ()

    def set(self, key: str, value: str | int | bool) -> None:
        pass

    def end(self) -> None:
        pass

    def __enter__(self) -> _NoSpan:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        pass


NO_SPAN = _NoSpan()


class _UntracedCall:
    """The trace context fields of an upstream call no span records."""

    __slots__ = ("traceparent", "tracestate")

    def __init__(self, traceparent: str, tracestate: str | None) -> None:
        self.traceparent = traceparent
        self.tracestate = tracestate

    def end(self, outcome: str) -> None:
        pass


class Untraced:
    """A request's trace context, without a recorded span: the caller's trace, or a new
    one. A trace the gateway starts is marked sampled, as an OpenTelemetry SDK's
    default sampler would: an upstream that follows its caller's decision keeps
    recording its part, and the access log's trace id leads there."""

    __slots__ = ("_sampled", "_trace_id", "_tracestate")

    def __init__(
        self, trace_id: str | None = None, sampled: bool = True, tracestate: str | None = None
    ) -> None:
        self._trace_id = trace_id
        self._sampled = sampled
        self._tracestate = tracestate

    @classmethod
    def of(cls, caller: TraceParent | None) -> Untraced:
        """The trace context of a request whose caller sent ``caller`` (None: none)."""
        if caller is None:
            return cls()
        return cls(caller.trace_id, caller.sampled, caller.tracestate)

    @property
    def trace_id(self) -> str:
        trace_id = self._trace_id
        if trace_id is None:  # made when first asked for: most hits never need one
            trace_id = self._trace_id = new_trace_id()
        return trace_id

    def child(self, name: str, started: float | None = None) -> ChildSpan:
        return NO_SPAN

    def call(self, name: str, attributes: Attributes) -> UpstreamCall:
        traceparent = format_traceparent(self.trace_id, new_span_id(), self._sampled)
        return _UntracedCall(traceparent, self._tracestate)

    def end(self, status: int | None, cache: str) -> None:
        pass

    def detached(self) -> Untraced:
        return Untraced(self.trace_id, self._sampled, self._tracestate)


class NoTracer:
    """The tracer without OpenTelemetry: trace context only, no spans recorded."""

    recording = False

    def request(
        self,
        method: str,
        route: str,
        caller: TraceParent | None,
        request_id: str,
        started: float,
    ) -> RequestSpan:
        return Untraced.of(caller)

    def shutdown(self) -> None:
        pass


NO_TRACER: Tracer = NoTracer()
