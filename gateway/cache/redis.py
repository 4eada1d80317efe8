"""The Redis cache backend: every call bounded in time, on any of the three topologies.

A read is the entry and the two purge generations it is checked against. Reads made
in the same turn of the event loop go to Redis together (:class:`ReadBatch`): one MGET
of every entry and generation they need on a standalone server or a Sentinel-managed
primary; on a cluster, where the entries and the generations live in different slots,
the entries by slot and one MGET of the generations, sent at once (one round trip of
latency). Under load, a read thus costs a share of one command instead of a command
of its own. A store is one SET with an expiry; a purge is one SET of a new random
generation; a fill lease is one SET NX PX; removing one entry (a caller the upstream
refused) is one DEL. Every Redis failure or timeout becomes CacheUnavailable, which the
pipeline treats as a miss. Made with its topology's pub/sub (``gateway.cache.pubsub``),
it publishes invalidations, and the registry puts the near cache in front of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from gateway.cache.backend import PUBLISHING, SHARED, InvalidationChannel, Purged, QuietBackend
from gateway.cache.entry import (
    CacheCorrupt,
    CacheEntry,
    CacheKey,
    Generations,
    Lookup,
)
from gateway.cache.fleet import Fleet
from gateway.cache.keyspace import generation_key, lease_key, probe_key
from gateway.cache.topology import REDIS_ERRORS, Commands
from gateway.errors import CacheUnavailable

log = logging.getLogger("gateway.cache")

T = TypeVar("T")

# Deletes a lease only if it is still the one taken (compare and delete, atomically).
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


# a generation fits the entry's unsigned 64-bit fields; one outside (written by hand) is
# a cache fault, never a crash of the store
_GENERATION_BOUND = 2**64


# the most keys one batched read asks for; reads past it go in the next batch
BATCH_MAX_KEYS = 256


class ReadBatch:
    """The reads of one turn of the event loop, sent to Redis as one command.

    :meth:`read` returns a future of ``[entry, everything generation, route
    generation]`` as stored; the first read of a turn schedules the batch's send for
    the end of that turn, so that every read the turn's requests make goes with it.
    A read that stops waiting (its caller's timeout) leaves the others' batch alone:
    the batch runs on its own, bounded by ``timeout_s``, and fails as a whole when
    Redis fails (each waiting read then gets that error)."""

    def __init__(self, client: Commands, *, everything_key: str, timeout_s: float) -> None:
        self._client = client
        self._cluster = isinstance(client, RedisCluster)
        self._everything_key = everything_key
        self._timeout_s = timeout_s
        self._waiting: list[tuple[str, str, asyncio.Future[list[Any]]]] = []
        self._sending: set[asyncio.Task[None]] = set()

    def read(self, entry_key: str, route_key: str) -> asyncio.Future[list[Any]]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[Any]] = loop.create_future()
        if not self._waiting:
            loop.call_soon(self._send)
        self._waiting.append((entry_key, route_key, future))
        return future

    def _send(self) -> None:
        waiting, self._waiting = self._waiting, []
        for start in range(0, len(waiting), BATCH_MAX_KEYS):
            task = asyncio.ensure_future(
                self._read_together(waiting[start : start + BATCH_MAX_KEYS])
            )
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _read_together(self, reads: list[tuple[str, str, asyncio.Future[list[Any]]]]) -> None:
        entries = [entry_key for entry_key, _, _ in reads]
        generation_keys = list(dict.fromkeys((self._everything_key, *(r for _, r, _ in reads))))
        try:
            async with asyncio.timeout(self._timeout_s):
                if self._cluster:
                    # the generations share one slot; the entries are spread over many
                    stored, generations = await asyncio.gather(
                        self._client.mget_nonatomic(entries),  # type: ignore[union-attr]
                        self._client.mget(generation_keys),
                    )
                else:
                    values = await self._client.mget([*entries, *generation_keys])
                    stored, generations = values[: len(entries)], values[len(entries) :]
        except BaseException as exc:
            for _, _, future in reads:
                if not future.done():
                    future.set_exception(exc if isinstance(exc, Exception) else RedisError(exc))
            if not isinstance(exc, Exception):
                raise
            return
        current = dict(zip(generation_keys, generations, strict=True))
        everything = current[self._everything_key]
        for (_, route_key, future), raw in zip(reads, stored, strict=True):
            if not future.done():
                future.set_result([raw, everything, current[route_key]])

    async def close(self) -> None:
        """Let the batches sent finish (within the timeout: their reads are answered
        as usual at a graceful stop), then cancel what is left."""
        if self._sending:
            await asyncio.wait(list(self._sending), timeout=self._timeout_s)
        for task in list(self._sending):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def new_generation() -> int:
    """A random generation, never 0 (0 is what an entry stored without a cache has)."""
    return secrets.randbits(63) | 1


class RedisBackend(QuietBackend):
    """Entries in a Redis shared by every gateway instance of one namespace and upstream."""

    name = "redis"

    def __init__(
        self,
        client: Commands,
        *,
        prefix: str,
        timeout_s: float,
        invalidations: InvalidationChannel | None = None,
    ) -> None:
        """``invalidations``: the topology's pub/sub (``gateway.cache.pubsub``); without
        it, the backend does not publish invalidations."""
        self._client = client
        self._invalidations = invalidations
        self.capabilities = SHARED if invalidations is None else PUBLISHING
        self._cluster = isinstance(client, RedisCluster)
        self._prefix = prefix
        self._timeout_s = timeout_s
        self._everything_key = generation_key(prefix, None)
        self._batch = ReadBatch(client, everything_key=self._everything_key, timeout_s=timeout_s)

    @property
    def invalidations(self) -> InvalidationChannel:
        if self._invalidations is None:
            raise AttributeError("invalidations: this Redis backend was made without pub/sub")
        return self._invalidations

    def fleet(self, fingerprint: Callable[[], str], on_read: Callable[[int], None]) -> Fleet:
        """The fleet announcements in a hash of this prefix (``gateway.cache.fleet``)."""
        return Fleet(self._client, prefix=self._prefix, fingerprint=fingerprint, on_read=on_read)

    @contextlib.contextmanager
    def _faults(self, what: str) -> Iterator[None]:
        """A timeout or a Redis error inside becomes CacheUnavailable."""
        try:
            yield
        except TimeoutError as exc:
            raise CacheUnavailable(
                f"redis {what}: no answer within {self._timeout_s * 1000:g} ms"
            ) from exc
        except REDIS_ERRORS as exc:
            raise CacheUnavailable(f"redis {what}: {type(exc).__name__}: {exc}") from exc

    async def _call(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        with self._faults(what):
            async with asyncio.timeout(self._timeout_s):
                return await call()

    async def get(self, key: CacheKey) -> Lookup:
        route_key = generation_key(self._prefix, key.route)
        with self._faults("GET"):
            # bounded by the batch's own timeout, which starts within this turn
            raw, everything, route = await self._batch.read(key.text, route_key)
        if everything is None or route is None:
            # a generation is missing (never made, deleted, evicted): make it anew; no
            # entry stored before can match a fresh random generation
            everything, route = await self._call("GET", lambda: self._new_generations(route_key))
        try:
            current = Generations(int(everything), int(route))
        except ValueError as exc:
            raise CacheUnavailable(f"redis GET: a purge generation is not a number: {exc}") from exc
        if not (
            0 <= current.everything < _GENERATION_BOUND and 0 <= current.route < _GENERATION_BOUND
        ):
            raise CacheUnavailable(f"redis GET: a purge generation is out of range: {current}")
        if not isinstance(raw, bytes):
            return Lookup(None, current)
        try:
            entry = CacheEntry.decode(raw)
        except (CacheCorrupt, UnicodeDecodeError, ValueError):
            return Lookup(None, current)
        if entry.generations != current:
            return Lookup(None, current)
        return Lookup(entry, current)

    async def _new_generations(self, route_key: str) -> list[Any]:
        for key in (self._everything_key, route_key):
            await self._client.set(key, new_generation(), nx=True)
        values: list[Any] = await self._client.mget(self._everything_key, route_key)
        if None in values:
            raise RedisError("a purge generation vanished as it was made")
        return values

    async def set(self, key: CacheKey, entry: CacheEntry, lifetime_s: float) -> None:
        milliseconds = max(1, int(lifetime_s * 1000))
        await self._call("SET", lambda: self._client.set(key.text, entry.encode(), px=milliseconds))

    async def purge(self, route: str | None) -> Purged:
        """A new random generation: every entry stored before is a miss from now on.
        Generations have no expiry (a handful of small keys per namespace and
        upstream), so that no eviction policy that spares persistent keys takes them."""
        await self._call(
            "SET", lambda: self._client.set(generation_key(self._prefix, route), new_generation())
        )
        return Purged()

    async def remove(self, key: CacheKey) -> bool:
        """One DEL of the entry: no instance reads it from Redis after this."""
        return bool(await self._call("DEL", lambda: self._client.delete(key.text)))

    async def take_lease(self, key: CacheKey, milliseconds: int) -> bytes | None:
        token = secrets.token_hex(8).encode()
        taken = await self._call(
            "SET", lambda: self._client.set(lease_key(key), token, nx=True, px=milliseconds)
        )
        return token if taken else None

    async def leased(self, key: CacheKey) -> bool:
        return bool(await self._call("GET", lambda: self._client.exists(lease_key(key))))

    async def drop_lease(self, key: CacheKey, token: bytes) -> None:
        await self._call("EVAL", lambda: self._client.eval(_RELEASE, 1, lease_key(key), token))

    async def probe(self) -> None:
        """A write and a read as traffic makes them, on a probe key of this prefix."""
        probe = CacheKey("probe", probe_key(self._prefix))
        await self._call("SET", lambda: self._client.set(probe.text, b"1", px=10_000))
        await self.get(probe)

    async def close(self) -> None:
        """Close the batch and the client; a Redis that fails to close (a timeout, a
        reset) is logged, not raised: what closes after the backend still closes."""
        await self._batch.close()
        try:
            await self._client.aclose()
        except REDIS_ERRORS as exc:
            log.warning(
                "redis: the client did not close cleanly",
                extra={"event": "redis_close_failed", "error": type(exc).__name__},
            )
