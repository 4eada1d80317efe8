"""The seam every cache backend fits (memory, Redis, the near cache in front of Redis),
and defaults for backends without background work."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol

from gateway.cache.entry import CacheEntry, CacheKey, Lookup


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a backend can do: all the rest of the gateway asks of its kind (never its
    name). ``stores``: it keeps entries at all (not ``cache.backend = "none"``).
    ``shared``: its entries are seen by other processes, so that a purge or an entry
    stored reaches them through it, a fill may be another instance's, and it is bound
    to one upstream (a backend of one process is kept across upstream switches, and
    the other workers of an instance are told of its purges one by one)."""

    stores: bool
    shared: bool


IN_PROCESS = Capabilities(stores=True, shared=False)
SHARED = Capabilities(stores=True, shared=True)
NOTHING = Capabilities(stores=False, shared=False)


class Purged(NamedTuple):
    """What a purge reached: the processes that were told (the subscribers Redis
    handed the invalidation to) and those that confirmed they dropped their copies;
    None for a backend that lives in one process."""

    told: int | None = None
    confirmed: int | None = None


# What take_lease answers to a backend with no one else to share misses with.
OWN_LEASE = b""


class QuietBackend:
    """Defaults for backends with nothing in the background, no one to tell and
    nothing held in the process."""

    def fresh(self, key: CacheKey) -> CacheEntry | None:
        return None

    async def probe(self) -> None:
        return None

    def start(self) -> None:
        return None

    async def announce(self, route: str | None) -> None:
        return None

    async def take_lease(self, key: CacheKey, milliseconds: int) -> bytes | None:
        return OWN_LEASE

    async def leased(self, key: CacheKey) -> bool:
        return False

    async def drop_lease(self, key: CacheKey, token: bytes) -> None:
        return None


class CacheBackend(Protocol):
    """Where entries live. Implementations raise only CacheUnavailable."""

    name: str  # for metrics labels and answers; nothing is decided by it
    capabilities: Capabilities

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

    async def purge(self, route: str | None) -> Purged:
        """Make every entry (of one route, or all) a miss, for every instance."""
        ...

    async def remove(self, key: CacheKey) -> bool:
        """Remove the entry under ``key``, fresh or stale, for every instance that
        shares this backend (copies other instances keep in process included); True
        when there was one."""
        ...

    async def take_lease(self, key: CacheKey, milliseconds: int) -> bytes | None:
        """Take the fill lease of ``key`` for ``milliseconds``: its token when taken
        (the caller fetches and stores the entry), None when another instance holds
        it (the caller waits for that instance's entry)."""
        ...

    async def leased(self, key: CacheKey) -> bool:
        """Whether some instance still holds the fill lease of ``key``."""
        ...

    async def drop_lease(self, key: CacheKey, token: bytes) -> None:
        """Give the lease back, if it is still the one ``token`` took."""
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
