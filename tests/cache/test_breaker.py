"""The circuit breaker and the guarded cache: faults become misses, logged once per change."""

from __future__ import annotations

import logging

import pytest

from gateway.cache.breaker import CircuitBreaker, CircuitState, GuardedCache
from gateway.cache.entry import CacheEntry, CacheKey, Generations, Lookup
from gateway.errors import CacheUnavailable


class FlakyBackend:
    name = "flaky"

    def __init__(self) -> None:
        self.broken = True
        self.calls = 0

    async def get(self, key: CacheKey) -> Lookup:
        self.calls += 1
        if self.broken:
            raise CacheUnavailable("redis GET: ConnectionError: refused")
        return Lookup(None, Generations())

    async def set(self, key: CacheKey, entry: CacheEntry, lifetime_s: float) -> None:
        self.calls += 1
        if self.broken:
            raise CacheUnavailable("redis SET: ConnectionError: refused")

    def fresh(self, key: CacheKey) -> CacheEntry | None:
        return None

    async def purge(self, route: str | None) -> None: ...

    async def ping(self) -> None: ...

    def start(self) -> None: ...

    async def announce(self, route: str | None) -> None: ...

    async def close(self) -> None: ...


def state_of(cache: GuardedCache) -> CircuitState:
    return cache.breaker.state


class Monotonic:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_breaker_opens_skips_then_retries_and_closes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.cache")
    backend, monotonic = FlakyBackend(), Monotonic()
    cache = GuardedCache(backend, CircuitBreaker(failures=3, reset_s=5, monotonic=monotonic))
    key = CacheKey("users", "k")
    for _ in range(10):
        assert await cache.get(key) is None
    assert backend.calls == 3  # the breaker opened after three failures
    assert state_of(cache) is CircuitState.OPEN
    assert cache.errors == 3

    monotonic.now += 5
    assert await cache.get(key) is None  # the one trial fails: open again
    assert backend.calls == 4
    assert state_of(cache) is CircuitState.OPEN

    backend.broken = False
    monotonic.now += 5
    assert await cache.get(key) == Lookup(None, Generations())
    assert state_of(cache) is CircuitState.CLOSED
    assert await cache.set(key, CacheEntry(b"x", '"x"', 1.0, 30), 60) is True

    transitions = [(r.getMessage(), getattr(r, "to", None)) for r in caplog.records]
    assert [to for _, to in transitions] == ["open", "half-open", "open", "half-open", "closed"]
