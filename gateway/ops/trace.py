"""What one request did, gathered for its access log line while it runs.

The HTTP edge starts a :class:`RequestTrace` in a context variable; the layers below
fill what they know (the upstream call's status and duration, the token's
fingerprint) without being handed the request.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass


@dataclass(slots=True)
class RequestTrace:
    upstream_status: str | None = None
    upstream_ms: float | None = None
    token_fingerprint: str | None = None


CURRENT_TRACE: ContextVar[RequestTrace | None] = ContextVar("request_trace", default=None)


def current_trace() -> RequestTrace | None:
    return CURRENT_TRACE.get()
