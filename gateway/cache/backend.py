"""The seam every cache backend fits (memory, Redis, the near cache in front of Redis),
and defaults for backends without background work."""

from __future__ import annotations

from typing import Protocol

from gateway.cache.entry import CacheEntry, CacheKey, Lookup


class QuietBackend:
    """Defaults for backends with nothing in the background, no one to tell and
    nothing held in the process."""

    def fresh(self, key: CacheKey) -> CacheEntry | None:
        return None

    async def ping(self) -> None:
        return None

    async def probe(self) -> None:
        return None

    def start(self) -> None:
        return None

    async def announce(self, route: str | None) -> None:
        return None


class CacheBackend(Protocol):
    """Where entries live. Implementations raise only CacheUnavailable."""

    name: str

    async def get(self, key: CacheKey) -> Lookup:
        """The entry (None when absent, expired from the store, or purged)."""
        ...

    async def set(self, key: CacheKey, entry: CacheEntry, lifetime_s: float) -> None:
        """Store ``entry`` for ``lifetime_s`` seconds (its TTL plus the stale windows)."""
        ...

    def fresh(self, key: CacheKey) -> CacheEntry | None:
        """The entry under ``key`` if this process holds it, it is within its TTL and
        no purge came after it; no I/O, no waiting. None says nothing: ``get`` decides."""
        ...

    async def purge(self, route: str | None) -> None:
        """Make every entry (of one route, or all) a miss, for every instance."""
        ...

    async def ping(self) -> None:
        """Raise CacheUnavailable when the backend does not answer at all."""
        ...

    async def probe(self) -> None:
        """One real read and one real write, as traffic makes them (a probe key of
        its own); raise CacheUnavailable when either fails. What readiness and a
        half-open breaker trust when there is no traffic: a PING can succeed where
        reads or writes fail (a full noeviction Redis, a read-only replica, a
        cluster node asked for keys of another slot)."""
        ...

    def start(self) -> None:
        """Begin background work, if the backend has any (in the running event loop)."""
        ...

    async def announce(self, route: str | None) -> None:
        """Tell every instance that entries of ``route`` (None: all) changed, so that
        copies kept in process are dropped; a no-op for backends without any."""
        ...

    async def close(self) -> None: ...
