"""The seam every cache backend fits (memory, Redis, the near cache in front of a shared
backend), the channel a shared backend offers for the near cache's invalidations, and
defaults for backends without background work."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Protocol, runtime_checkable

from gateway.cache.clock import Clock, system_clock
from gateway.cache.entry import CacheEntry, CacheKey, Lookup

if TYPE_CHECKING:
    from gateway.cache.fleet import Fleet


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a backend can do: all the rest of the gateway asks of its kind (never its
    name). ``stores``: it keeps entries at all (not ``cache.backend = "none"``).
    ``shared``: its entries are seen by other processes, so that a purge or an entry
    stored reaches them through it, a fill may be another instance's, and it is bound
    to one upstream (a backend of one process is kept across upstream switches, and
    the other workers of an instance are told of its purges one by one).
    ``publishes_invalidations``: it also carries messages between the processes that
    share it (an :class:`InvalidationChannel`, as its ``invalidations``), so a near
    cache of fresh copies can sit in front of it and still drop them on every process
    when a purge or a removal happens anywhere: the registry puts one there.
    ``purges_records``: it notes the records each entry holds
    (:meth:`CacheBackend.set_holding`) and purges the entries that hold a record
    (:meth:`CacheBackend.purge_records`)."""

    stores: bool
    shared: bool
    publishes_invalidations: bool = False
    purges_records: bool = False


IN_PROCESS = Capabilities(stores=True, shared=False, purges_records=True)
SHARED = Capabilities(stores=True, shared=True)
# shared, with a channel for invalidations: what a near cache needs in front of it
PUBLISHING = Capabilities(stores=True, shared=True, publishes_invalidations=True)
# all of it: what the Redis backend can do
PUBLISHING_INDEXED = Capabilities(
    stores=True, shared=True, publishes_invalidations=True, purges_records=True
)
NOTHING = Capabilities(stores=False, shared=False)


class Heard(NamedTuple):
    """What a subscription heard: a message ``data`` published on ``channel``, or with
    ``channel`` None, any other sign that the subscription is alive (the answer to a
    ping, the confirmation of a subscription)."""

    channel: str | None
    data: bytes = b""


class Subscription(Protocol):
    """Channels of a shared store listened to. Every method raises CacheUnavailable
    when the store fails or cannot be reached."""

    async def receive(self, timeout_s: float) -> Heard | None:
        """What was heard next, waiting at most ``timeout_s``; None when nothing was."""
        ...

    async def ping(self) -> None:
        """Ask the store for a sign of life on this subscription; it is heard through
        :meth:`receive` like a message."""
        ...

    def in_place(self) -> bool:
        """Whether it still listens where :meth:`InvalidationChannel.publish` sends
        (in a Redis Cluster, a failover or a resharding can move a channel's slot)."""
        ...

    async def close(self) -> None: ...


class InvalidationChannel(Protocol):
    """Publish-subscribe between every process sharing a backend, at most once and
    in order per channel. Raises CacheUnavailable when the store fails or cannot be
    reached. Channel names begin with the backend's prefix (``gateway.cache.keyspace``)."""

    async def publish(self, channel: str, message: bytes) -> int:
        """Send ``message`` to every subscriber of ``channel``; how many it reached."""
        ...

    async def subscribe(self, *channels: str) -> Subscription:
        """A new subscription to ``channels``, subscribed when it is returned."""
        ...

    def start(self) -> None:
        """Begin background work, if any (in the running event loop)."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class Publishing(Protocol):
    """What a backend registered with ``publishes_invalidations`` offers besides
    :class:`CacheBackend`."""

    @property
    def invalidations(self) -> InvalidationChannel: ...


class Purged(NamedTuple):
    """What a purge reached: the processes that were told (the subscribers Redis
    handed the invalidation to) and those that confirmed they dropped their copies;
    None for a backend that lives in one process."""

    told: int | None = None
    confirmed: int | None = None


class RecordsPurged(NamedTuple):
    """What a purge by record reached: the entries it removed (or, soft, marked stale);
    every key the index named for the records, whose copies every process drops (an
    entry evicted from the store, or stored again since, may still have near copies);
    and as for :class:`Purged`, the processes told and those that confirmed."""

    keys: tuple[CacheKey, ...] = ()
    told: int | None = None
    confirmed: int | None = None
    reached: tuple[CacheKey, ...] = ()


class Noted(NamedTuple):
    """What :meth:`CacheBackend.set_consistent` did: whether the entry was stored
    (False: its answer may be older than a version of one of its records already
    noted, or than a purge of one), and the keys of the other entries it removed,
    each noted with another version of one of its records (their copies in every
    process are for the caller to drop)."""

    stored: bool
    invalidated: tuple[CacheKey, ...] = ()
    # False when a process that keeps copies did not confirm it dropped theirs
    confirmed: bool = True


# The scope of set_consistent that spans every caller (cache.record_consistency = "all").
EVERY_CALLER = "*"

# What set_consistent awaits between removing the entries that hold an older version
# and storing its own, with their keys: whether every copy of them is gone.
BeforeStore = Callable[[tuple[CacheKey, ...]], Awaitable[bool]]


class IndexSize(NamedTuple):
    """The records' index of a backend that purges by record: its keys (with Redis,
    each record's set and hash of versions, and the counter of purges; in memory, the
    records noted) and their bytes (with Redis, estimated from a sample's MEMORY USAGE;
    in memory, what it is charged against the bound)."""

    keys: int
    bytes: int


# How long a purge by record is remembered, so that a fill that began before it and
# stores after it is not kept as fresh (longer than any upstream call is waited for:
# upstream.timeout_s and connect_timeout_s are at most 600 s each).
RECORD_PURGE_MARK_S = 3600.0

# What take_lease answers to a backend with no one else to share misses with.
OWN_LEASE = b""


class ProcessClaims:
    """:meth:`CacheBackend.claim` in one process: each name held for its lifetime, at
    most ``limit`` of them (those expired let go first, then the oldest)."""

    def __init__(self, clock: Clock = system_clock, limit: int = 100_000) -> None:
        self._clock = clock
        self._limit = limit
        self._until: dict[str, float] = {}

    def claim(self, name: str, lifetime_s: float) -> bool:
        now = self._clock()
        until = self._until.get(name)
        if until is not None and until > now:
            return False
        if len(self._until) >= self._limit:
            self._until = {held: end for held, end in self._until.items() if end > now}
            while len(self._until) >= self._limit:
                del self._until[next(iter(self._until))]
        self._until.pop(name, None)
        self._until[name] = now + lifetime_s
        return True


class QuietBackend:
    """Defaults for backends with nothing in the background, no one to tell and
    nothing held in the process."""

    def fresh(self, key: CacheKey) -> CacheEntry | None:
        return None

    def read_held(self, key: CacheKey) -> CacheEntry | Lookup | None:
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

    def fleet(self, fingerprint: Callable[[], str], on_read: Callable[[int], None]) -> Fleet | None:
        return None

    async def purge_records(self, refs: Sequence[str], *, soft: bool) -> RecordsPurged:
        return RecordsPurged()

    async def purge_sequence(self) -> int:
        return 0

    async def index_size(self) -> IndexSize | None:
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

    def read_held(self, key: CacheKey) -> CacheEntry | Lookup | None:
        """One read of ``key``, made now without I/O or waiting, when this backend
        holds every entry in this process (not ``capabilities.shared``): the entry
        itself when :meth:`fresh` would give it, otherwise what ``get`` would return.
        None when its reads are ``get``'s to make."""
        ...

    async def purge(self, route: str | None) -> Purged:
        """Make every entry (of one route, or all) a miss, for every instance."""
        ...

    async def set_holding(
        self,
        key: CacheKey,
        entry: CacheEntry,
        lifetime_s: float,
        held: Mapping[str, str],
        since: int,
    ) -> bool:
        """:meth:`set`, for a backend that ``purges_records``: ``entry`` holds the
        records ``held`` (``{reference: version}``, ``gateway.normalise.holdings``),
        noted before it is stored. False when one of them was purged after
        :meth:`purge_sequence` answered ``since`` (read before the fill asked the
        upstream): its answer may be older than that purge, so it is not stored
        (or removed again)."""
        ...

    async def set_consistent(
        self,
        key: CacheKey,
        entry: CacheEntry,
        lifetime_s: float,
        held: Mapping[str, str],
        since: int,
        scope: str,
        before_store: BeforeStore | None = None,
    ) -> Noted:
        """:meth:`set_holding`, keeping one version of each record within ``scope``
        (:data:`EVERY_CALLER`, or one caller's fingerprint: ``cache.record_consistency``).
        ``held`` gives each record's version; ``since`` is :meth:`purge_sequence`'s
        answer before the upstream was asked. Not stored when one of the records was
        purged after ``since``, or when, within the scope, another version of one of
        them was noted by a fill whose answer came after ``since``: the two calls
        overlapped, and this answer may be older than one already served. Otherwise
        every other entry in the scope noted with another version of one of the
        records (or before versions were noted) is removed from the store, then
        ``before_store`` is awaited with their keys (a near cache drops its copies
        everywhere: whether all confirmed), and only then is the entry stored, so that
        nobody is served it while an older entry can still be read."""
        ...

    async def purge_sequence(self) -> int:
        """A number that orders this call among the purges by record and the other
        calls, for every instance that shares the backend: greater than the number of
        every purge before it, and than every call before it on another fill's behalf
        (with Redis, the server's time in microseconds, or more). A fill reads it before
        it asks the upstream and gives it to :meth:`set_holding`."""
        ...

    async def purge_records(self, refs: Sequence[str], *, soft: bool) -> RecordsPurged:
        """Remove every entry that holds one of the records ``refs``, for every
        instance (``soft``: mark them stale instead, so that they are served while
        ``stale_while_revalidate_s`` allows and refreshed once)."""
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

    async def index_size(self) -> IndexSize | None:
        """The size of the records' index (None: the backend keeps none). Cheap to ask
        every minute: with Redis, one instance of the fleet measures it at most every
        few minutes and the others read its figure."""
        ...

    async def claim(self, name: str, lifetime_s: float) -> bool:
        """True when no one claimed ``name`` within the last ``lifetime_s`` seconds (it
        is claimed now): for every instance that shares this backend, or with a backend
        of one process, in it. What refuses a signed change notice sent again."""
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

    def fleet(self, fingerprint: Callable[[], str], on_read: Callable[[int], None]) -> Fleet | None:
        """The fleet announcements (``gateway.cache.fleet``) over this backend's store,
        not started; None for a backend that cannot hold them."""
        ...

    async def close(self) -> None: ...
