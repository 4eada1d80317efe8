"""A bounded record of the requests the reference upstream received.

Tests of the gateway read it to prove what reached the upstream ("nothing", "exactly
one call, carrying this header"). Every request is recorded before authentication,
latency and routing, so rejected and unknown requests appear too.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

DEFAULT_MAX_ENTRIES = 10_000


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One received request.

    ``raw_path`` is aiohttp's ``request.raw_path``: the path as sent, still
    percent-encoded, including the query string. ``path`` is the decoded path without
    the query; ``query`` holds the decoded pairs in the order sent.
    """

    method: str
    path: str
    raw_path: str
    query: tuple[tuple[str, str], ...]
    authorization: str | None
    request_id: str | None
    # the W3C trace context fields (each None when absent)
    traceparent: str | None = None
    tracestate: str | None = None


class RequestLog:
    """The most recent ``max_entries`` requests, oldest first."""

    __slots__ = ("entries",)

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        self.entries: deque[RequestRecord] = deque(maxlen=max_entries)

    def record(self, entry: RequestRecord) -> None:
        self.entries.append(entry)

    def clear(self) -> None:
        self.entries.clear()

    def for_path(self, path: str) -> list[RequestRecord]:
        """The recorded requests whose decoded path is ``path``."""
        return [entry for entry in self.entries if entry.path == path]

    def __len__(self) -> int:
        return len(self.entries)
