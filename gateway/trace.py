"""What one request did, gathered for its access log line while it runs.

The edge starts a :class:`RequestTrace` in a context variable; the layers below
fill what they know (the upstream call's status and duration, the token's
fingerprint) without being handed the request.
"""

from __future__ import annotations

import itertools
import secrets
from contextvars import ContextVar
from dataclasses import dataclass


class RequestIds:
    """New request ids: a random prefix per process and a counter; unique and cheap."""

    def __init__(self) -> None:
        self._prefix = secrets.token_hex(8)
        self._next = itertools.count(1).__next__

    def new(self) -> str:
        return f"{self._prefix}{self._next():016x}"


@dataclass(slots=True)
class RequestTrace:
    upstream_status: str | None = None
    upstream_ms: float | None = None
    token_fingerprint: str | None = None


CURRENT_TRACE: ContextVar[RequestTrace | None] = ContextVar("request_trace", default=None)


def current_trace() -> RequestTrace | None:
    return CURRENT_TRACE.get()
