"""The near cache in front of any shared backend that publishes invalidations
(``Capabilities.publishes_invalidations``): reads and writes go to the shared backend,
fresh copies are kept in process, and the backend's :class:`InvalidationChannel`
carries purges, removals and their confirmations between the processes.

What it promises is written in ``gateway.cache.near`` and docs/near-cache.md; the
registry puts one in front of every backend registered as publishing invalidations.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gateway.cache.backend import (
    BeforeStore,
    CacheBackend,
    Heard,
    IndexSize,
    InvalidationChannel,
    Noted,
    Publishing,
    Purged,
    RecordsPurged,
)
from gateway.cache.entry import CacheEntry, CacheKey, Lookup
from gateway.cache.keyspace import ack_channel, invalidation_channel
from gateway.cache.near import (
    NearCache,
    invalidation_message,
    parse_invalidation,
    parse_removal,
    parse_removals,
    removal_message,
    removals_messages,
)
from gateway.cache.tasks import stop
from gateway.errors import CacheUnavailable

if TYPE_CHECKING:
    from gateway.cache.fleet import Fleet

log = logging.getLogger("gateway.cache")

_PING_EVERY_S = 0.25
_SILENCE_LIMIT_S = 0.75
# a wait on the channel that ends this much later than asked was a hold-up of the
# process (its event loop did not run), not silence of the channel
_HELD_UP_S = 0.25
_RETRY_S = 0.25
# how long subscribing (and its first sign of life) may take
_SUBSCRIBE_WAIT_S = 2.0
# how long a purge waits for every process to confirm, at most
CONFIRM_WAIT_S = 1.0
# how long a purge whose outcome is unknown is retried in the background
PURGE_RETRY_S = 10.0


class ChannelDown(Exception):
    """The subscription stopped being where invalidations are published."""


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


class TieredBackend:
    """The near cache in front of a shared backend, with the channel's listener. Its
    name and capabilities are the shared backend's."""

    def __init__(self, far: CacheBackend, near: NearCache, *, prefix: str) -> None:
        """``far`` must offer :class:`Publishing` (its ``invalidations``)."""
        if not isinstance(far, Publishing):
            raise TypeError(f"{far.name}: a near cache needs a backend that publishes")
        self._far = far
        self._invalidations: InvalidationChannel = far.invalidations
        self.near = near
        self.name = far.name
        self.capabilities = far.capabilities
        self._channel = invalidation_channel(prefix)
        self._acks = ack_channel(prefix)
        self._listener: asyncio.Task[None] | None = None
        self._pending: dict[str, _Confirmations] = {}
        self._background: set[asyncio.Future[None]] = set()
        self._came_live = 0  # how many times the subscription came live

    def start(self) -> None:
        """Start listening for invalidations (the near cache is off until subscribed)."""
        self._far.start()
        self._invalidations.start()
        if self._listener is None:
            self._listener = asyncio.ensure_future(self._listen())

    async def get(self, key: CacheKey) -> Lookup:
        """A read of the shared backend (copied into the near cache when fresh). The
        near cache answers through :meth:`fresh`, which the guarded cache asks first: a
        hit from this process is not a read of the store and must not count as one."""
        epoch = self.near.epoch
        lookup = await self._far.get(key)
        self.near.learn(key.route, lookup.generations, epoch)
        if lookup.entry is not None and self.near.epoch == epoch:
            # not after an invalidation that overlapped the read: the entry may be one
            # it removed, even when a later read learnt the route again meanwhile
            self.near.put(key, lookup.entry)
        return lookup

    def fresh(self, key: CacheKey) -> CacheEntry | None:
        return self.near.get(key)

    def read_held(self, key: CacheKey) -> CacheEntry | Lookup | None:
        return None  # the shared backend's entries are read by get

    async def set(self, key: CacheKey, entry: CacheEntry, lifetime_s: float) -> None:
        epoch = self.near.epoch
        await self._far.set(key, entry, lifetime_s)
        if self.near.epoch == epoch:
            self.near.put(key, entry)

    async def purge(self, route: str | None) -> Purged:
        """The purge in the shared backend, then every subscribed process told and
        waited for (up to CONFIRM_WAIT_S). When the backend does not confirm the
        purge, this process drops its copies at once, the purge and its invalidation
        are retried in the background for PURGE_RETRY_S, and CacheUnavailable is
        raised: the purge may or may not have happened. The same when the purge is
        done but the invalidation could not be published: it is retried until it is."""
        self.near.invalidate(route)
        try:
            await self._far.purge(route)
        except CacheUnavailable:
            self._in_background(self._retry_purge(route, purged=False))
            raise
        try:
            return await self._tell(route, confirm=True)
        except CacheUnavailable:
            # the purge is done in the shared backend; the instances were not told
            self._in_background(self._retry_purge(route, purged=True))
            raise

    async def set_holding(
        self,
        key: CacheKey,
        entry: CacheEntry,
        lifetime_s: float,
        held: Mapping[str, str],
        since: int,
    ) -> bool:
        epoch = self.near.epoch
        stored = await self._far.set_holding(key, entry, lifetime_s, held, since)
        await self._kept(key, entry, stored, epoch)
        return stored

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
        """:meth:`set_holding`, one version of each record kept in ``scope``: before
        the shared backend stores the entry, the entries it removed for holding another
        version are dropped here, and every subscribed process is told to drop its
        copies of them and waited for (up to CONFIRM_WAIT_S). When a process does not
        confirm, the removals are published again in the background for
        PURGE_RETRY_S (a copy a process keeps meanwhile ends with its freshness);
        ``confirmed`` says so."""
        epoch = self.near.epoch
        noted = await self._far.set_consistent(
            key, entry, lifetime_s, held, since, scope, self._dropped_everywhere
        )
        await self._kept(key, entry, noted.stored, epoch)
        return noted

    async def _dropped_everywhere(self, keys: tuple[CacheKey, ...]) -> bool:
        """Drop the copies of ``keys`` in every process, waiting for their confirmations;
        whether every process confirmed (if not, the removals go again in the background)."""
        for other in keys:
            self.near.remove(other)
        try:
            told = await self._confirmed(lambda purge_id: removals_messages(keys, purge_id))
        except CacheUnavailable:
            told = Purged(None, None)
        if told.told is not None and (told.confirmed or 0) >= told.told:
            return True

        async def attempt() -> None:
            await self._publish_removals(keys)

        self._in_background(self._retried(attempt, "consistency removals", {"entries": len(keys)}))
        return False

    async def _publish_removals(self, keys: tuple[CacheKey, ...]) -> None:
        """Tell every process again to drop its copies of ``keys`` (no confirmation)."""
        for message in removals_messages(keys, ""):
            await self._publish(self._channel, message)

    async def _kept(self, key: CacheKey, entry: CacheEntry, stored: bool, epoch: int) -> None:
        """The near copy of an entry the shared backend stored, unless an invalidation
        came while it was stored (``epoch``: the near cache's before; it may have removed
        this very entry); or, refused, none anywhere (it may have been in the store for
        a moment, and copied by a read)."""
        if stored:
            if self.near.epoch == epoch:
                self.near.put(key, entry)
            return
        self.near.remove(key)
        with contextlib.suppress(CacheUnavailable, TimeoutError):
            async with asyncio.timeout(CONFIRM_WAIT_S):
                await self._invalidations.publish(self._channel, removal_message(key))

    async def purge_sequence(self) -> int:
        return await self._far.purge_sequence()

    async def purge_records(self, refs: Sequence[str], *, soft: bool) -> RecordsPurged:
        """The purge in the shared backend, then every subscribed process told to drop
        its copies of the entries it reached, and waited for (as :meth:`purge`). When
        the backend does not answer, this process drops all its copies (it cannot know
        which hold the records), the purge is retried in the background for
        PURGE_RETRY_S, and CacheUnavailable is raised: its outcome is unknown."""
        try:
            purged = await self._far.purge_records(refs, soft=soft)
        except CacheUnavailable:
            self.near.invalidate(None)
            self._in_background(self._retry_records(refs, soft=soft, keys=None))
            raise
        reached = purged.reached or purged.keys
        for key in reached:
            self.near.remove(key)
        try:
            told = await self._confirmed(lambda purge_id: removals_messages(reached, purge_id))
        except CacheUnavailable:
            self._in_background(self._retry_records(refs, soft=soft, keys=reached))
            raise
        return RecordsPurged(purged.keys, told.told, told.confirmed, reached)

    async def _retry_records(
        self, refs: Sequence[str], *, soft: bool, keys: tuple[CacheKey, ...] | None
    ) -> None:
        """Purge by record (unless ``keys`` says it was done, and what it reached) and
        publish the removals, until both are done or PURGE_RETRY_S has passed. When the
        first try's outcome is unknown, it may have removed entries before Redis stopped
        answering, which no later try finds: every process is told to drop all its
        copies."""

        async def attempt() -> None:
            if keys is None:
                await self._far.purge_records(refs, soft=soft)
                await self._tell(None, confirm=False)
            else:
                await self._publish_removals(keys)

        await self._retried(attempt, "purge by record", {"purged_records": list(refs)})

    async def remove(self, key: CacheKey) -> bool:
        """Drop this process's copy, remove the shared entry, and when there was one,
        tell every instance to drop its copy (not waited for: a copy that the message
        does not reach ends with its freshness, or with the channel)."""
        self.near.remove(key)
        removed = await self._far.remove(key)
        if removed:
            with contextlib.suppress(CacheUnavailable, TimeoutError):
                async with asyncio.timeout(CONFIRM_WAIT_S):
                    await self._invalidations.publish(self._channel, removal_message(key))
        return removed

    async def announce(self, route: str | None) -> None:
        """Tell every instance to drop its near entries of ``route`` (None: all)."""
        self.near.invalidate(route)
        with contextlib.suppress(CacheUnavailable):
            await self._tell(route, confirm=False)

    async def _publish(self, channel: str, message: bytes) -> int:
        """PUBLISH within CONFIRM_WAIT_S; raises CacheUnavailable otherwise."""
        try:
            async with asyncio.timeout(CONFIRM_WAIT_S):
                return await self._invalidations.publish(channel, message)
        except TimeoutError as exc:
            raise CacheUnavailable(f"{self.name} PUBLISH: TimeoutError: {exc}") from exc

    async def _tell(self, route: str | None, *, confirm: bool) -> Purged:
        if not confirm:
            return Purged(await self._publish(self._channel, invalidation_message(route)), None)
        return await self._confirmed(lambda purge_id: [invalidation_message(route, purge_id)])

    async def _confirmed(self, messages: Callable[[str], list[bytes]]) -> Purged:
        """Publish ``messages(purge id)`` in order, the last asking every process to
        confirm; wait for the confirmations (up to CONFIRM_WAIT_S)."""
        purge_id = secrets.token_hex(8)
        confirmations = _Confirmations()
        self._pending[purge_id] = confirmations
        try:
            for message in messages(purge_id):
                told = await self._publish(self._channel, message)
            confirmations.expect(told)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CONFIRM_WAIT_S):
                    await confirmations.done.wait()
            return Purged(told, min(confirmations.count, told))
        finally:
            self._pending.pop(purge_id, None)

    async def _retry_purge(self, route: str | None, *, purged: bool) -> None:
        """Purge (unless ``purged``) and publish the invalidation, until both are done
        or PURGE_RETRY_S has passed."""

        async def attempt() -> None:
            nonlocal purged
            if not purged:
                await self._far.purge(route)
                purged = True
            await self._tell(route, confirm=False)

        await self._retried(attempt, "cache purge", {"purged_route": route or "*"})

    async def _retried(
        self, attempt: Callable[[], Awaitable[None]], what: str, purged: dict[str, object]
    ) -> None:
        """``attempt()`` every _RETRY_S until it passes or PURGE_RETRY_S has passed
        (CacheUnavailable: not yet); either way logged, as ``what`` of ``purged``."""
        deadline = time.monotonic() + PURGE_RETRY_S
        while time.monotonic() < deadline:
            await asyncio.sleep(_RETRY_S)
            try:
                await attempt()
            except CacheUnavailable:
                continue
            log.info(
                f"{what} done on a retry",
                extra={"event": "cache_purge", **purged, "retried": True},
            )
            return
        log.error(
            f"{what} given up: the shared backend did not confirm it; purge again",
            extra={"event": "cache_purge", **purged, "retried": True, "backend": self.name},
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

    async def claim(self, name: str, lifetime_s: float) -> bool:
        return await self._far.claim(name, lifetime_s)

    async def index_size(self) -> IndexSize | None:
        return await self._far.index_size()

    async def probe(self) -> None:
        await self._far.probe()

    def fleet(self, fingerprint: Callable[[], str], on_read: Callable[[int], None]) -> Fleet | None:
        return self._far.fleet(fingerprint, on_read)

    async def close(self) -> None:
        for task in [*self._background, self._listener]:
            await stop(task)
        await self._far.close()
        await self._invalidations.close()

    async def _listen(self) -> None:
        failures = 0
        while True:
            came_live = self._came_live
            try:
                await self._subscribed()
            except asyncio.CancelledError:
                self.near.set_live(False)
                raise
            except (CacheUnavailable, ChannelDown, TimeoutError) as exc:
                if self._came_live != came_live:  # it was on, and is off now
                    failures = 0
                if failures == 0:
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
            await asyncio.sleep(_RETRY_S)

    def _heard(self, heard: Heard) -> None:
        if heard.channel is None:
            return
        data = heard.data
        if heard.channel == self._acks:
            confirmations = self._pending.get(data.decode("ascii", "replace"))
            if confirmations is not None:
                confirmations.add()
            return
        many = parse_removals(data)
        if many is not None:
            purge_id, keys = many
            for key in keys:
                self.near.remove(key)
            if purge_id != "-":
                self._in_background(self._confirm(purge_id))
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
        with contextlib.suppress(CacheUnavailable):
            await self._publish(self._acks, purge_id.encode())

    async def _subscribed(self) -> None:
        """Subscribe, then hear until the channel goes quiet or moves (raises then)."""
        async with asyncio.timeout(_SUBSCRIBE_WAIT_S):
            subscription = await self._invalidations.subscribe(self._channel, self._acks)
        try:
            async with asyncio.timeout(_SUBSCRIBE_WAIT_S):
                await subscription.ping()
            self.near.set_live(True)
            self._came_live += 1
            log.info(
                "near cache on: subscribed to invalidations",
                extra={"event": "near_cache", "live": True},
            )
            heard = pinged = time.monotonic()
            while True:
                waited = time.monotonic()
                message = await subscription.receive(_PING_EVERY_S)
                now = time.monotonic()
                if message is not None:
                    heard = now
                    self._heard(message)
                elif now - waited > _PING_EVERY_S + _HELD_UP_S:
                    # this process was held up, not the channel silent: what Redis
                    # sent meanwhile waits in the socket. The channel is judged
                    # again from a ping sent now.
                    heard, pinged = now, now - _PING_EVERY_S
                if now - pinged >= _PING_EVERY_S:
                    if not subscription.in_place():
                        raise ChannelDown("the channel moved to another node")
                    async with asyncio.timeout(_SILENCE_LIMIT_S):
                        await subscription.ping()
                    pinged = now
                if now - heard > _SILENCE_LIMIT_S:
                    raise TimeoutError("no answer on the invalidation channel")
        finally:
            # off before the subscription ends: no copy is served while unsubscribed
            self.near.set_live(False)
            with contextlib.suppress(CacheUnavailable, TimeoutError):
                async with asyncio.timeout(_SUBSCRIBE_WAIT_S):
                    await subscription.close()
