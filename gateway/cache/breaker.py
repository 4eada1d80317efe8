"""Cache faults never fail a request: the breaker and the guarded cache.

Every backend call is bounded in time by the backend itself; :class:`GuardedCache`
turns a failure into "no cache for this request". The breaker skips the backend for
``reset_s`` seconds (closed -> open) after ``failures`` failures in a row, or when over
the last ``window_s`` seconds at least ``min_calls`` calls were made and at least
``failure_share`` of them failed (a Redis that refuses every write while reads pass
never fails ``failures`` times in a row); then one call tries it (half-open), whose
success closes the circuit with a fresh window and whose failure opens it again.
State changes are logged once each, not once per request; failures are counted.

The guarded cache also keeps, per kind (reads, writes, its own probes) and over the
same window, how many calls passed and failed: what readiness reports.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from gateway.cache.backend import OWN_LEASE, CacheBackend
from gateway.cache.entry import CacheEntry, CacheKey, Lookup
from gateway.errors import CacheUnavailable
from gateway.ops.health import CacheOutcomes, Tally

log = logging.getLogger("gateway.cache")
T = TypeVar("T")

# a window is kept in this many buckets: it spans the last nine tenths of
# ``window_s`` to the whole of it, whatever its length
_BUCKETS = 10


class CircuitState(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"


_CLOSED = CircuitState.CLOSED
_OPEN = CircuitState.OPEN
_HALF_OPEN = CircuitState.HALF_OPEN


class OutcomeWindow:
    """Calls and failures over the last ``window_s`` seconds: a ring of buckets and
    running totals, so that adding an outcome is O(1) and allocates nothing."""

    __slots__ = ("_bucket", "_calls", "_failed", "_per_s", "calls", "failed")

    def __init__(self, window_s: float) -> None:
        self._per_s = _BUCKETS / window_s
        self._calls = [0] * _BUCKETS
        self._failed = [0] * _BUCKETS
        self._bucket = -(2**62)  # the newest bucket's number (time * _per_s)
        self.calls = 0  # totals over the window as of the latest add or tally
        self.failed = 0

    def add(self, now: float, failed: bool) -> None:
        bucket = int(now * self._per_s)
        if bucket != self._bucket:
            self._advance(bucket)
        slot = self._bucket % _BUCKETS
        self._calls[slot] += 1
        self.calls += 1
        if failed:
            self._failed[slot] += 1
            self.failed += 1

    def tally(self, now: float) -> Tally:
        """What passed and failed over the window ending at ``now``."""
        self._advance(int(now * self._per_s))
        return Tally(ok=self.calls - self.failed, failed=self.failed)

    def _advance(self, bucket: int) -> None:
        # empties the buckets between the newest one and ``bucket``, at most all of them
        newest = self._bucket
        if bucket <= newest:
            return  # a clock that went back: keep adding to the newest bucket
        for number in range(newest + 1, newest + 1 + min(bucket - newest, _BUCKETS)):
            slot = number % _BUCKETS
            self.calls -= self._calls[slot]
            self.failed -= self._failed[slot]
            self._calls[slot] = self._failed[slot] = 0
        self._bucket = bucket

    def clear(self) -> None:
        for slot in range(_BUCKETS):
            self._calls[slot] = self._failed[slot] = 0
        self.calls = self.failed = 0


class CircuitBreaker:
    """Opens after ``failures`` failures in a row, or on a failure share of at least
    ``failure_share`` over the last ``window_s`` seconds once ``min_calls`` calls were
    made in it; lets one trial through after ``reset_s``.

    Callers ask :meth:`allow` before a call and report it with :meth:`succeeded` or
    :meth:`failed` (or :meth:`abandoned` when it never finished). Outcomes reported
    while the circuit is open (calls that began before it opened) change nothing.
    """

    def __init__(
        self,
        *,
        failures: int,
        reset_s: float,
        window_s: float = 10.0,
        failure_share: float = 0.5,
        min_calls: int = 20,
        monotonic: Callable[[], float] = time.monotonic,
        on_change: Callable[[CircuitState], None] | None = None,
    ) -> None:
        self._on_change = on_change
        self._threshold = failures
        self._reset_s = reset_s
        self._share = failure_share
        self._min_calls = min_calls
        self.window_s = window_s
        self.monotonic = monotonic
        self._window = OutcomeWindow(window_s)
        self._in_a_row = 0
        self._opened_at = 0.0
        self._trial_running = False
        self.state = CircuitState.CLOSED
        self.last_error: str | None = None

    def allow(self) -> bool:
        """Whether a call may go to the backend now; in half-open, only the trial."""
        if self.state is _CLOSED:
            return True
        if self.state is _OPEN:
            if self.monotonic() - self._opened_at < self._reset_s:
                return False
            self._change(_HALF_OPEN, None)
        if self._trial_running:
            return False
        self._trial_running = True
        return True

    def succeeded(self) -> None:
        state = self.state
        if state is _CLOSED:
            self._in_a_row = 0
            window = self._window
            window.add(self.monotonic(), False)
            # the call that brings the window to min_calls may be a success
            if window.failed and self._share_reached(window):
                self._open(self.last_error)
        elif state is _HALF_OPEN:
            self._trial_running = False
            self._in_a_row = 0
            self._window.clear()  # failures from before the outage must not reopen it
            self._change(_CLOSED, None)

    def failed(self, error: str) -> None:
        self.last_error = error
        state = self.state
        if state is _CLOSED:
            self._in_a_row += 1
            window = self._window
            window.add(self.monotonic(), True)
            if self._in_a_row >= self._threshold or self._share_reached(window):
                self._open(error)
        elif state is _HALF_OPEN:
            self._trial_running = False
            self._open(error)

    def abandoned(self) -> None:
        """A call :meth:`allow` let through will not report (it was cancelled): in
        half-open, another call may be the trial."""
        if self.state is _HALF_OPEN:
            self._trial_running = False

    def tally(self) -> Tally:
        """Calls that passed and failed over the window (since the circuit last closed)."""
        return self._window.tally(self.monotonic())

    def _share_reached(self, window: OutcomeWindow) -> bool:
        return window.calls >= self._min_calls and window.failed / window.calls >= self._share

    def _open(self, error: str | None) -> None:
        self._opened_at = self.monotonic()
        self._change(_OPEN, error)

    def _change(self, state: CircuitState, error: str | None) -> None:
        previous, self.state = self.state, state
        if self._on_change is not None:
            self._on_change(state)
        if state is _OPEN:
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
    """A backend behind the breaker: reads, writes and fill leases that never raise,
    and what their recent outcomes say (:meth:`outcomes`). Purges go to the backend
    itself (their failure is the caller's answer) and are not counted here."""

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
        self.last_error: str | None = None
        self._on_error = on_error
        self._monotonic = breaker.monotonic
        self._reads = OutcomeWindow(breaker.window_s)
        self._writes = OutcomeWindow(breaker.window_s)
        self._probes = OutcomeWindow(breaker.window_s)

    async def get(self, key: CacheKey) -> Lookup | None:
        """The lookup, or None when the cache cannot be used now (a miss). A fresh
        entry held in this process answers first, while the circuit is closed, and is
        not counted: it says nothing of the backend (a near-cache hit taken for a
        Redis success would close a half-open circuit or dilute the failure share)."""
        breaker = self.breaker
        if breaker.state is _CLOSED:
            held = self.backend.fresh(key)
            if held is not None:
                return Lookup(held, held.generations)
        if not breaker.allow():
            return None
        try:
            lookup = await self.backend.get(key)
        except CacheUnavailable as exc:
            self._failed(self._reads, exc)
            breaker.failed(str(exc))
            return None
        except asyncio.CancelledError:
            breaker.abandoned()
            raise
        breaker.succeeded()
        self._reads.add(self._monotonic(), False)
        return lookup

    def fresh(self, key: CacheKey) -> CacheEntry | None:
        """A fresh entry held in this process (see CacheBackend.fresh), only while the
        circuit is closed: a hit from here is neither a trial nor a success."""
        if self.breaker.state is not _CLOSED:
            return None
        return self.backend.fresh(key)

    async def set(self, key: CacheKey, entry: CacheEntry, lifetime_s: float) -> bool:
        """Store; False when the cache could not take it."""
        breaker = self.breaker
        if not breaker.allow():
            return False
        try:
            await self.backend.set(key, entry, lifetime_s)
        except CacheUnavailable as exc:
            self._failed(self._writes, exc)
            breaker.failed(str(exc))
            return False
        except asyncio.CancelledError:
            breaker.abandoned()
            raise
        breaker.succeeded()
        self._writes.add(self._monotonic(), False)
        return True

    async def check(self) -> None:
        """The readiness check: one real read and one real write (``backend.probe``),
        never a PING; a failure raises CacheUnavailable. Its outcome counts among the
        probes of :meth:`outcomes`. It reaches the breaker only as a call the breaker
        allows: an ordinary one while closed, the trial once the open circuit's reset
        time has passed; otherwise (open, or a trial already running) it leaves the
        breaker as it is."""
        breaker = self.breaker
        counted = breaker.allow()
        try:
            await self.backend.probe()
        except CacheUnavailable as exc:
            self._failed(self._probes, exc)
            if counted:
                breaker.failed(str(exc))
            raise
        except asyncio.CancelledError:
            if counted:
                breaker.abandoned()
            raise
        self._probes.add(self._monotonic(), False)
        if counted:
            breaker.succeeded()

    async def take_lease(self, key: CacheKey, milliseconds: int) -> bytes | None:
        """The fill lease of ``key`` (CacheBackend.take_lease); OWN_LEASE, "fill it
        yourself", when the cache cannot be used now. Counted as a write."""
        return await self._guarded(
            self._writes, lambda: self.backend.take_lease(key, milliseconds), OWN_LEASE
        )

    async def leased(self, key: CacheKey) -> bool:
        """Whether some instance holds the fill lease of ``key``; False when the cache
        cannot be used now. Counted as a read."""
        return await self._guarded(self._reads, lambda: self.backend.leased(key), False)

    async def drop_lease(self, key: CacheKey, token: bytes) -> None:
        """Give the lease back (a lease the cache could not take, or not give back now,
        expires by itself). Counted as a write."""
        if token != OWN_LEASE:
            await self._guarded(self._writes, lambda: self.backend.drop_lease(key, token), None)

    async def _guarded(
        self, window: OutcomeWindow, call: Callable[[], Awaitable[T]], fallback: T
    ) -> T:
        breaker = self.breaker
        if not breaker.allow():
            return fallback
        try:
            result = await call()
        except CacheUnavailable as exc:
            self._failed(window, exc)
            breaker.failed(str(exc))
            return fallback
        except asyncio.CancelledError:
            breaker.abandoned()
            raise
        breaker.succeeded()
        window.add(self._monotonic(), False)
        return result

    def outcomes(self) -> CacheOutcomes:
        """The breaker's state and the reads, writes and probes that passed and
        failed over the window, with the latest error."""
        now = self._monotonic()
        return CacheOutcomes(
            circuit=self.breaker.state.value,
            last_error=self.last_error,
            reads=self._reads.tally(now),
            writes=self._writes.tally(now),
            probes=self._probes.tally(now),
        )

    def _failed(self, window: OutcomeWindow, exc: CacheUnavailable) -> None:
        self.errors += 1
        self.last_error = str(exc)
        window.add(self._monotonic(), True)
        if self._on_error is not None:
            self._on_error()
