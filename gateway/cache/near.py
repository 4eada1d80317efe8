"""A bounded in-process near cache in front of Redis, invalidated through pub/sub, and
the channel every instance of a prefix listens on.

A hit served from Redis costs a network round trip and the client's CPU on every
request; a hit served from this process costs a dictionary lookup. The near cache
keeps a copy of fresh entries only, for the rest of their freshness, so stale
serving and expiry still follow Redis.

Consistency it promises (docs/near-cache.md):

- a purge on any instance empties the matching near entries of every instance before
  the purge is answered 200: every process subscribed to the channel confirms that it
  dropped them (up to 1 s is waited for the confirmations);
- a purge whose outcome is unknown (Redis did not answer in time) still drops this
  process's copies at once and is retried, with its invalidation, in the background;
- while the invalidation channel is down (Redis unreachable, the subscription
  dropped, nothing heard for 0.75 s) the near cache is not used at all and is
  emptied, so that an instance that cannot be told stops serving copies within 1 s;
  it is used again once the subscription is back;
- a near entry is never served past the freshness of the Redis entry it copies;
- an entry removed for a caller the upstream refused (``TieredBackend.remove``) is
  dropped by every process when its one-key message arrives (not waited for).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as redis
from redis.exceptions import RedisError

from gateway.cache.backend import SHARED, CacheBackend, Purged
from gateway.cache.clock import Clock
from gateway.cache.entry import CacheEntry, CacheKey, Generations, Lookup
from gateway.cache.keyspace import ack_channel, invalidation_channel
from gateway.cache.memory import MemoryBackend
from gateway.cache.topology import REDIS_ERRORS, RedisTopology, stop
from gateway.errors import CacheUnavailable

log = logging.getLogger("gateway.cache")

_EVERYTHING = b"*"
_ONE_KEY = b"="  # what begins the target of a message that names one key
_PING_EVERY_S = 0.25
_SILENCE_LIMIT_S = 0.75
_RETRY_S = 0.25
# how long a purge waits for every process to confirm, at most
CONFIRM_WAIT_S = 1.0
# how long a purge whose outcome is unknown is retried in the background
PURGE_RETRY_S = 10.0


def invalidation_message(route: str | None, purge_id: str = "") -> bytes:
    """``<purge id> <route or *>``; the id names the confirmations to send back."""
    return f"{purge_id or '-'} ".encode() + (_EVERYTHING if route is None else route.encode())


def removal_message(key: CacheKey) -> bytes:
    """``- =<route> <key>``: drop the copies of one key (no confirmation asked). A
    gateway that does not know this form reads it as a route that matches nothing."""
    return b"- " + _ONE_KEY + key.route.encode() + b" " + key.text.encode()


def parse_removal(data: bytes) -> CacheKey | None:
    """The key a :func:`removal_message` names; None for any other message."""
    _, _, target = data.partition(b" ")
    if not target.startswith(_ONE_KEY):
        return None
    route, _, text = target[len(_ONE_KEY) :].partition(b" ")
    if not route or not text:
        return None
    return CacheKey(route.decode("utf-8", "replace"), text.decode("utf-8", "replace"))


def parse_invalidation(data: bytes) -> tuple[str, str | None]:
    """(purge id, route or None for all); ids "-" ask for no confirmation."""
    purge_id, _, target = data.partition(b" ")
    if not target:  # the message of an older gateway: the route alone
        purge_id, target = b"-", purge_id
    route = None if target == _EVERYTHING else target.decode("utf-8", "replace")
    return purge_id.decode("ascii", "replace"), route


@dataclass(slots=True)
class _Confirmations:
    """The confirmations of one purge, as they arrive."""

    count: int = 0
    expected: int | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def add(self) -> None:
        self.count += 1
        self._check()

    def expect(self, expected: int) -> None:
        self.expected = expected
        self._check()

    def _check(self) -> None:
        if self.expected is not None and self.count >= self.expected:
            self.done.set()


class NearCache:
    """Fresh copies of Redis entries in this process, used only while the
    invalidation channel is live."""

    def __init__(self, *, max_bytes: int, clock: Clock, enabled: bool = True) -> None:
        self._store = MemoryBackend(max_bytes=max_bytes, clock=clock)
        self._clock = clock
        # disabled (cache.near_cache = false): nothing kept, the channel still listened
        # to, so that purges of other instances are confirmed
        self.enabled = enabled
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
        if not self.live or not self.enabled or self._known.get(key.route) != entry.generations:
            return
        now = self._clock()
        if entry.is_fresh(now):
            self._store.put(key.text, entry, entry.left(now), route=key.route)

    def invalidate(self, route: str | None) -> None:
        self.epoch += 1
        if route is None:
            self._store.clear()
            self._known.clear()
        else:
            self._store.drop_route(route)
            self._known.pop(route, None)

    def remove(self, key: CacheKey) -> None:
        """Drop the copy of ``key``. Until Redis is read again for its route, no copy
        of that route is kept: a read that overlapped the removal may carry the
        removed entry."""
        self.epoch += 1
        self._known.pop(key.route, None)
        self._store.drop(key.text)

    def set_live(self, live: bool) -> None:
        if live != self.live:
            self.epoch += 1
            self._store.clear()
            self._known.clear()
            self.live = live

    def __len__(self) -> int:
        return len(self._store)


class TieredBackend:
    """The near cache in front of a Redis backend, with the channel's listener."""

    name = "redis"
    capabilities = SHARED

    def __init__(
        self,
        far: CacheBackend,
        near: NearCache,
        *,
        topology: RedisTopology,
        prefix: str,
    ) -> None:
        self._far = far
        self.near = near
        self._topology = topology
        self._channel = invalidation_channel(prefix)
        self._acks = ack_channel(prefix)
        self._listener: asyncio.Task[None] | None = None
        self._pending: dict[str, _Confirmations] = {}
        self._background: set[asyncio.Future[None]] = set()

    @property
    def topology(self) -> RedisTopology:
        return self._topology

    def start(self) -> None:
        """Start listening for invalidations (the near cache is off until subscribed)."""
        self._topology.start()
        if self._listener is None:
            self._listener = asyncio.ensure_future(self._listen())

    async def get(self, key: CacheKey) -> Lookup:
        """A read of Redis (copied into the near cache when fresh). The near cache
        answers through :meth:`fresh`, which the guarded cache asks first: a hit
        from this process is not a Redis call and must not count as one."""
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

    async def purge(self, route: str | None) -> Purged:
        """The new generation in Redis, then every subscribed process told and waited
        for (up to CONFIRM_WAIT_S). When Redis does not confirm the new generation,
        this process drops its copies at once, the purge and its invalidation are
        retried in the background for PURGE_RETRY_S, and CacheUnavailable is raised:
        the purge may or may not have happened. The same when the new generation is
        in Redis but the invalidation could not be published: it is retried until it
        is."""
        self.near.invalidate(route)
        try:
            await self._far.purge(route)
        except CacheUnavailable:
            self._in_background(self._retry_purge(route, purged=False))
            raise
        try:
            return await self._tell(route, confirm=True)
        except CacheUnavailable:
            # the new generation is in Redis; the instances were not told
            self._in_background(self._retry_purge(route, purged=True))
            raise

    async def remove(self, key: CacheKey) -> bool:
        """Drop this process's copy, DEL the entry in Redis, and when there was one
        there, tell every instance to drop its copy (not waited for: a copy that the
        message does not reach ends with its freshness, or with the channel)."""
        self.near.remove(key)
        removed = await self._far.remove(key)
        if removed:
            with contextlib.suppress(*REDIS_ERRORS, TimeoutError):
                async with asyncio.timeout(CONFIRM_WAIT_S):
                    await self._topology.publish(self._channel, removal_message(key))
        return removed

    async def announce(self, route: str | None) -> None:
        """Tell every instance to drop its near entries of ``route`` (None: all)."""
        self.near.invalidate(route)
        with contextlib.suppress(CacheUnavailable):
            await self._tell(route, confirm=False)

    async def _tell(self, route: str | None, *, confirm: bool) -> Purged:
        purge_id = secrets.token_hex(8) if confirm else ""
        confirmations = _Confirmations()
        if confirm:
            self._pending[purge_id] = confirmations
        try:
            try:
                async with asyncio.timeout(CONFIRM_WAIT_S):
                    told = await self._topology.publish(
                        self._channel, invalidation_message(route, purge_id)
                    )
            except (*REDIS_ERRORS, TimeoutError) as exc:
                raise CacheUnavailable(f"redis PUBLISH: {type(exc).__name__}: {exc}") from exc
            if not confirm:
                return Purged(told, None)
            confirmations.expect(told)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CONFIRM_WAIT_S):
                    await confirmations.done.wait()
            return Purged(told, min(confirmations.count, told))
        finally:
            self._pending.pop(purge_id, None)

    async def _retry_purge(self, route: str | None, *, purged: bool) -> None:
        """Make the new generation (unless ``purged``) and publish the invalidation,
        until both are done or PURGE_RETRY_S has passed."""
        deadline = time.monotonic() + PURGE_RETRY_S
        while time.monotonic() < deadline:
            await asyncio.sleep(_RETRY_S)
            try:
                if not purged:
                    await self._far.purge(route)
                    purged = True
                await self._tell(route, confirm=False)
            except CacheUnavailable:
                continue
            log.info(
                "cache purge done on a retry",
                extra={"event": "cache_purge", "purged_route": route or "*", "retried": True},
            )
            return
        log.error(
            "cache purge given up: Redis did not confirm it; purge again",
            extra={"event": "cache_purge", "purged_route": route or "*", "retried": True},
        )

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def take_lease(self, key: CacheKey, milliseconds: int) -> bytes | None:
        return await self._far.take_lease(key, milliseconds)

    async def leased(self, key: CacheKey) -> bool:
        return await self._far.leased(key)

    async def drop_lease(self, key: CacheKey, token: bytes) -> None:
        await self._far.drop_lease(key, token)

    async def probe(self) -> None:
        await self._far.probe()

    async def close(self) -> None:
        for task in [*self._background, self._listener]:
            await stop(task)
        await self._far.close()
        await self._topology.close()

    async def _listen(self) -> None:
        failures = 0
        while True:
            client: redis.Redis | None = None
            try:
                async with asyncio.timeout(2.0):
                    client = await self._topology.subscriber(self._channel)
                await self._subscribed_loop(client)
            except asyncio.CancelledError:
                self.near.set_live(False)
                raise
            except (*REDIS_ERRORS, TimeoutError) as exc:
                if self.near.live or failures == 0:
                    log.warning(
                        "near cache off: the invalidation channel is down",
                        extra={"event": "near_cache", "live": False, "error": str(exc)},
                    )
                self.near.set_live(False)
                failures += 1
            except Exception:
                # whatever else went wrong, a near cache without its channel is off
                log.exception("near cache off: the invalidation listener failed")
                self.near.set_live(False)
                failures += 1
            finally:
                if client is not None:
                    await self._topology.forget(client)
            await asyncio.sleep(_RETRY_S)

    def _heard(self, message: dict[str, object]) -> None:
        if message.get("type") != "message":
            return
        data = message.get("data")
        if not isinstance(data, bytes):
            return
        if message.get("channel") == self._acks.encode():
            confirmations = self._pending.get(data.decode("ascii", "replace"))
            if confirmations is not None:
                confirmations.add()
            return
        removed = parse_removal(data)
        if removed is not None:
            self.near.remove(removed)
            return
        purge_id, route = parse_invalidation(data)
        self.near.invalidate(route)
        if purge_id != "-":
            self._in_background(self._confirm(purge_id))

    async def _confirm(self, purge_id: str) -> None:
        with contextlib.suppress(*REDIS_ERRORS, TimeoutError):
            async with asyncio.timeout(CONFIRM_WAIT_S):
                await self._topology.publish(self._acks, purge_id.encode())

    async def _subscribed_loop(self, client: redis.Redis) -> None:
        pubsub = client.pubsub()
        try:
            async with asyncio.timeout(2.0):
                await pubsub.subscribe(self._channel, self._acks)
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
                    self._heard(message)
                if now - pinged >= _PING_EVERY_S:
                    if not self._topology.follows(client, self._channel):
                        raise RedisError("the channel's cluster slot moved to another node")
                    async with asyncio.timeout(_SILENCE_LIMIT_S):
                        await pubsub.ping()
                    pinged = now
                if now - heard > _SILENCE_LIMIT_S:
                    raise TimeoutError("no answer on the invalidation channel")
        finally:
            with contextlib.suppress(*REDIS_ERRORS, TimeoutError, RuntimeError):
                async with asyncio.timeout(1.0):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]
