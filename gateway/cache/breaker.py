"""Cache faults never fail a request: the breaker and the guarded cache.

Every backend call is bounded in time by the backend itself; :class:`GuardedCache`
turns a failure into "no cache for this request" and, after ``failures`` failures in
a row, skips the backend for ``reset_s`` seconds before trying it again with one
request (closed -> open -> half-open -> closed). State changes are logged once each,
not once per request; failures are counted.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable

from gateway.cache.backend import CacheBackend
from gateway.cache.entry import CacheEntry, CacheKey, Lookup
from gateway.errors import CacheUnavailable

log = logging.getLogger("gateway.cache")


class CircuitState(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"


_CLOSED = CircuitState.CLOSED


class CircuitBreaker:
    """Counts failures in a row; opens after ``failures``, retries after ``reset_s``."""

    def __init__(
        self,
        *,
        failures: int,
        reset_s: float,
        monotonic: Callable[[], float] = time.monotonic,
        on_change: Callable[[CircuitState], None] | None = None,
    ) -> None:
        self._on_change = on_change
        self._threshold = failures
        self._reset_s = reset_s
        self._monotonic = monotonic
        self._failures = 0
        self._opened_at = 0.0
        self._trial_running = False
        self.state = CircuitState.CLOSED
        self.last_error: str | None = None

    def allow(self) -> bool:
        if self.state is CircuitState.CLOSED:
            return True
        if self.state is CircuitState.OPEN:
            if self._monotonic() - self._opened_at < self._reset_s:
                return False
            self._change(CircuitState.HALF_OPEN, None)
        if self._trial_running:
            return False
        self._trial_running = True
        return True

    def succeeded(self) -> None:
        self._failures = 0
        self._trial_running = False
        if self.state is not CircuitState.CLOSED:
            self._change(CircuitState.CLOSED, None)

    def failed(self, error: str) -> None:
        self._failures += 1
        self._trial_running = False
        self.last_error = error
        if self.state is CircuitState.HALF_OPEN or (
            self.state is CircuitState.CLOSED and self._failures >= self._threshold
        ):
            self._opened_at = self._monotonic()
            self._change(CircuitState.OPEN, error)

    def _change(self, state: CircuitState, error: str | None) -> None:
        previous, self.state = self.state, state
        if self._on_change is not None:
            self._on_change(state)
        if state is CircuitState.OPEN:
            log.warning(
                "cache circuit open: skipping the cache for %gs",
                self._reset_s,
                extra={
                    "event": "cache_circuit",
                    "from": previous.value,
                    "to": state.value,
                    "error": error,
                },
            )
        else:
            log.info(
                "cache circuit %s",
                state.value,
                extra={"event": "cache_circuit", "from": previous.value, "to": state.value},
            )


class GuardedCache:
    """A backend behind the breaker: reads and writes that never raise."""

    def __init__(
        self,
        backend: CacheBackend,
        breaker: CircuitBreaker,
        *,
        on_error: Callable[[], None] | None = None,
    ) -> None:
        self.backend = backend
        self.breaker = breaker
        self.errors = 0
        self._on_error = on_error

    async def get(self, key: CacheKey) -> Lookup | None:
        """The lookup, or None when the cache cannot be used now (a miss)."""
        if not self.breaker.allow():
            return None
        try:
            lookup = await self.backend.get(key)
        except CacheUnavailable as exc:
            self._failed(exc)
            return None
        self.breaker.succeeded()
        return lookup

    def fresh(self, key: CacheKey) -> CacheEntry | None:
        """A fresh entry held in this process (see CacheBackend.fresh), only while the
        circuit is closed: a hit from here is neither a trial nor a success."""
        if self.breaker.state is not _CLOSED:
            return None
        return self.backend.fresh(key)

    async def set(self, key: CacheKey, entry: CacheEntry, lifetime_s: float) -> bool:
        """Store; False when the cache could not take it."""
        if not self.breaker.allow():
            return False
        try:
            await self.backend.set(key, entry, lifetime_s)
        except CacheUnavailable as exc:
            self._failed(exc)
            return False
        self.breaker.succeeded()
        return True

    async def check(self) -> None:
        """The readiness check: ping the backend. A success counts as a passed trial
        (an open circuit closes without waiting for traffic); a failure raises."""
        try:
            await self.backend.ping()
        except CacheUnavailable as exc:
            self._failed(exc)
            raise
        self.breaker.succeeded()

    def _failed(self, exc: CacheUnavailable) -> None:
        self.errors += 1
        if self._on_error is not None:
            self._on_error()
        self.breaker.failed(str(exc))
