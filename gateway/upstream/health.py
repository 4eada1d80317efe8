"""What recent traffic says about the upstream: the outcome of its latest call."""

from __future__ import annotations

import time
from collections.abc import Callable

from gateway.ops.health import DOWN, OK


class UpstreamHealth:
    """The outcome of the latest upstream call, from real traffic."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self.last_ok: float | None = None
        self.last_failure: float | None = None
        self.last_error: str | None = None

    def succeeded(self) -> None:
        self.last_ok = self._monotonic()

    def failed(self, error: str) -> None:
        self.last_failure = self._monotonic()
        self.last_error = error

    def status(self) -> str | None:
        """ok or down by the latest outcome; None when there was no traffic yet."""
        if self.last_failure is None and self.last_ok is None:
            return None
        if self.last_failure is not None and (
            self.last_ok is None or self.last_failure > self.last_ok
        ):
            return DOWN
        return OK

    def age(self) -> float | None:
        latest = max((t for t in (self.last_ok, self.last_failure) if t is not None), default=None)
        return None if latest is None else self._monotonic() - latest
