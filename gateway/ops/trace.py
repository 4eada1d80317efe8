"""What one request did, gathered for its access log line while it runs, and the span
it runs in.

The HTTP edge starts a :class:`RequestTrace` in a context variable; the layers below
fill what they know (the upstream call's status and duration, the token's
fingerprint) without being handed the request, and make the spans of what they do
inside it (:func:`cache_read`, :func:`upstream_call`). A background refresh or a
coalesced fill runs in a copy of the context of the request that started it: its
upstream call is part of that request's trace.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass

from gateway.ops.tracing import (
    NO_SPAN,
    Attributes,
    ChildSpan,
    RequestSpan,
    Untraced,
    UpstreamCall,
)

CACHE_READ = "cache.get"
# the attribute of a cache read's span: "found", "absent" or "unavailable"
CACHE_LOOKUP = "gateway.cache.lookup"


@dataclass(slots=True)
class RequestTrace:
    span: RequestSpan
    upstream_status: str | None = None
    upstream_ms: float | None = None
    token_fingerprint: str | None = None

    @property
    def trace_id(self) -> str:
        return self.span.trace_id

    def detached(self) -> RequestTrace:
        """A trace of the same trace id for work done apart from the request (the
        shadow traffic): it records no span and fills nothing of the request's line."""
        return RequestTrace(self.span.detached())


CURRENT_TRACE: ContextVar[RequestTrace | None] = ContextVar("request_trace", default=None)


def current_trace() -> RequestTrace | None:
    return CURRENT_TRACE.get()


def cache_read() -> ChildSpan:
    """The span of a cache read made for the current request (``with cache_read():``)."""
    trace = CURRENT_TRACE.get()
    if trace is None:
        return NO_SPAN
    return trace.span.child(CACHE_READ)


def upstream_call(name: str, attributes: Attributes) -> UpstreamCall:
    """The span of an upstream call made for the current request; outside any request
    (the probe), a call of a trace of its own."""
    trace = CURRENT_TRACE.get()
    span = Untraced() if trace is None else trace.span
    return span.call(name, attributes)
