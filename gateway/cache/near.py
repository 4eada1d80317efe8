"""A bounded in-process near cache in front of Redis, invalidated through pub/sub.

A hit served from Redis costs a network round trip and the client's CPU on every
request; a hit served from this process costs a dictionary lookup. The near cache
keeps a copy of fresh entries only, for the rest of their freshness, so stale
serving and expiry still follow Redis.

Consistency it promises (docs/near-cache.md):

- a purge, or a TTL change applied by a reload, on any instance empties the matching
  near entries of every instance as soon as the pub/sub message arrives (normally
  well under a second);
- while the invalidation channel is down (Redis unreachable, the subscription
  dropped) the near cache is not used at all and is emptied, so nothing older than
  the channel's last confirmed state is served; it is used again once the
  subscription is back;
- a near entry is never served past the freshness of the Redis entry it copies.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import redis.asyncio as redis
from redis.exceptions import RedisError

from gateway.cache.backend import CacheBackend
from gateway.cache.clock import Clock
from gateway.cache.entry import CacheEntry, CacheKey, Generations, Lookup
from gateway.cache.memory import MemoryBackend

log = logging.getLogger("gateway.cache")

INVALIDATION_CHANNEL = "invalidate"
_EVERYTHING = b"*"
_PING_EVERY_S = 0.5
_SILENCE_LIMIT_S = 2.0
_RETRY_S = 0.5


def invalidation_channel(prefix: str) -> str:
    return f"{prefix}:{INVALIDATION_CHANNEL}"


class NearCache:
    """Fresh copies of Redis entries in this process, used only while the
    invalidation channel is live."""

    def __init__(self, *, max_bytes: int, clock: Clock) -> None:
        self._store = MemoryBackend(max_bytes=max_bytes, clock=clock)
        self._clock = clock
        self.live = False
        # The purge generations Redis last reported per route; dropped by every
        # invalidation, so that an answer fetched before a purge is never kept here.
        self._known: dict[str, Generations] = {}
        # Bumped by every invalidation: what a Redis read that overlapped one
        # reported is not learnt.
        self.epoch = 0

    def learn(self, route: str, generations: Generations, epoch: int) -> None:
        """Redis reported these as the current generations of ``route``, in a read
        that began at ``epoch``."""
        if epoch == self.epoch:
            self._known[route] = generations

    def get(self, key: CacheKey) -> CacheEntry | None:
        if not self.live:
            return None
        # kept only while fresh (put's lifetime is the freshness left): fresh or gone
        return self._store.fresh_text(key.text, None)

    def put(self, key: CacheKey, entry: CacheEntry) -> None:
        """Keep a copy of ``entry`` if it was stored under the generations Redis last
        reported for its route (not if a purge came in between)."""
        if not self.live or self._known.get(key.route) != entry.generations:
            return
        left = entry.left(self._clock())
        if left > 0:
            self._store.put(key.text, entry, left, route=key.route)

    def invalidate(self, route: str | None) -> None:
        self.epoch += 1
        if route is None:
            self._store.clear()
            self._known.clear()
        else:
            self._store.drop_route(route)
            self._known.pop(route, None)

    def set_live(self, live: bool) -> None:
        if live != self.live:
            self.epoch += 1
            self._store.clear()
            self._known.clear()
            self.live = live

    def __len__(self) -> int:
        return len(self._store)


class TieredBackend:
    """The near cache in front of a Redis backend, with the invalidation listener."""

    name = "redis"

    def __init__(
        self,
        far: CacheBackend,
        near: NearCache,
        *,
        client: redis.Redis,
        channel: str,
    ) -> None:
        self._far = far
        self.near = near
        self._client = client
        self._channel = channel
        self._listener: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start listening for invalidations (the near cache is off until subscribed)."""
        if self._listener is None:
            self._listener = asyncio.ensure_future(self._listen())

    async def get(self, key: CacheKey) -> Lookup:
        entry = self.near.get(key)
        if entry is not None:
            return Lookup(entry, entry.generations)
        epoch = self.near.epoch
        lookup = await self._far.get(key)
        self.near.learn(key.route, lookup.generations, epoch)
        if lookup.entry is not None:
            self.near.put(key, lookup.entry)
        return lookup

    def fresh(self, key: CacheKey) -> CacheEntry | None:
        return self.near.get(key)

    async def set(self, key: CacheKey, entry: CacheEntry, lifetime_s: float) -> None:
        await self._far.set(key, entry, lifetime_s)
        self.near.put(key, entry)

    async def purge(self, route: str | None) -> None:
        await self._far.purge(route)
        self.near.invalidate(route)
        await self.announce(route)

    async def announce(self, route: str | None) -> None:
        """Tell every instance to drop its near entries of ``route`` (None: all)."""
        self.near.invalidate(route)
        message = _EVERYTHING if route is None else route.encode()
        with contextlib.suppress(RedisError, OSError, TimeoutError):
            async with asyncio.timeout(1.0):
                await self._client.publish(self._channel, message)

    async def ping(self) -> None:
        await self._far.ping()

    async def probe(self) -> None:
        await self._far.probe()

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listener
        await self._far.close()
        await self._client.aclose()

    async def _listen(self) -> None:
        failures = 0
        while True:
            try:
                await self._subscribed_loop()
            except asyncio.CancelledError:
                self.near.set_live(False)
                raise
            except (RedisError, OSError, TimeoutError) as exc:
                if self.near.live or failures == 0:
                    log.warning(
                        "near cache off: the invalidation channel is down",
                        extra={"event": "near_cache", "live": False, "error": str(exc)},
                    )
                self.near.set_live(False)
                failures += 1
                await asyncio.sleep(_RETRY_S)

    async def _subscribed_loop(self) -> None:
        pubsub = self._client.pubsub()
        try:
            async with asyncio.timeout(2.0):
                await pubsub.subscribe(self._channel)
                await pubsub.ping()
            heard = time.monotonic()
            pinged = heard
            self.near.set_live(True)
            log.info(
                "near cache on: subscribed to invalidations",
                extra={"event": "near_cache", "live": True},
            )
            while True:
                message = await pubsub.get_message(timeout=_PING_EVERY_S)
                now = time.monotonic()
                if message is not None:
                    heard = now
                    if message.get("type") == "message":
                        data = message.get("data")
                        self.near.invalidate(None if data == _EVERYTHING else bytes(data).decode())
                if now - pinged >= _PING_EVERY_S:
                    async with asyncio.timeout(1.0):
                        await pubsub.ping()
                    pinged = now
                if now - heard > _SILENCE_LIMIT_S:
                    raise TimeoutError("no answer on the invalidation channel")
        finally:
            with contextlib.suppress(RedisError, OSError, TimeoutError, RuntimeError):
                async with asyncio.timeout(1.0):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]
