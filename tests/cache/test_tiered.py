"""The near cache in front of any backend that publishes invalidations
(gateway/cache/tiered.py), and a backend added by one registration (the "Adding a
cache backend" section of docs/cache-backends.md).

The backend here exists in this test only: entries in one in-process store that two
gateways share, and a publish-subscribe hub between them. Nothing of Redis is used.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from pytest_aiohttp import AiohttpClient

from gateway.cache.backend import (
    PUBLISHING_INDEXED,
    BeforeStore,
    Heard,
    Noted,
    Purged,
    QuietBackend,
    RecordsPurged,
)
from gateway.cache.clock import Clock, system_clock
from gateway.cache.entry import CacheEntry, CacheKey, Lookup, etag_of
from gateway.cache.memory import MemoryBackend
from gateway.cache.near import NearCache
from gateway.cache.registry import BackendRegistry
from gateway.cache.tiered import TieredBackend
from gateway.config.settings import CacheSettings
from gateway.demo import RequestLog
from gateway.http.app import create_app

from ..conftest import AUTH, KEY_SECRET, base_url, gateway_client, make_settings, near_of, until

Client = TestClient[web.Request, web.Application]
ADMIN = "admin-token-0123456789abcdef"


class Hub:
    """Publish-subscribe between the gateways of one test."""

    def __init__(self) -> None:
        self.subscriptions: set[HubSubscription] = set()
        self.silent = False  # pings go unanswered, messages undelivered
        self.on_close: Callable[[], None] | None = None  # called as a subscription ends


class HubSubscription:
    def __init__(self, hub: Hub, channels: tuple[str, ...]) -> None:
        self._hub = hub
        self.channels = channels
        self.queue: asyncio.Queue[Heard] = asyncio.Queue()

    async def receive(self, timeout_s: float) -> Heard | None:
        try:
            async with asyncio.timeout(timeout_s):
                return await self.queue.get()
        except TimeoutError:
            return None

    async def ping(self) -> None:
        if not self._hub.silent:
            self.queue.put_nowait(Heard(None))

    def in_place(self) -> bool:
        return True

    async def close(self) -> None:
        if self._hub.on_close is not None:
            self._hub.on_close()
        self._hub.subscriptions.discard(self)


class HubChannel:
    def __init__(self, hub: Hub) -> None:
        self._hub = hub

    async def publish(self, channel: str, message: bytes) -> int:
        reached = [s for s in self._hub.subscriptions if channel in s.channels]
        if self._hub.silent:
            return 0
        for subscription in reached:
            subscription.queue.put_nowait(Heard(channel, message))
        return len(reached)

    async def subscribe(self, *channels: str) -> HubSubscription:
        subscription = HubSubscription(self._hub, channels)
        self._hub.subscriptions.add(subscription)
        return subscription

    def start(self) -> None:
        return None

    async def close(self) -> None:
        return None


class SharedStore(QuietBackend):
    """A backend shared by every gateway of the test: one store, one hub."""

    name = "shared-store"
    capabilities = PUBLISHING_INDEXED

    def __init__(self, store: MemoryBackend, hub: Hub) -> None:
        self.store = store
        self._channel = HubChannel(hub)

    @property
    def invalidations(self) -> HubChannel:
        return self._channel

    async def get(self, key: CacheKey) -> Lookup:
        return await self.store.get(key)

    async def set(self, key: CacheKey, entry: CacheEntry, lifetime_s: float) -> None:
        await self.store.set(key, entry, lifetime_s)

    async def set_holding(
        self,
        key: CacheKey,
        entry: CacheEntry,
        lifetime_s: float,
        held: Mapping[str, str],
        since: int,
    ) -> bool:
        return await self.store.set_holding(key, entry, lifetime_s, held, since)

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
        return await self.store.set_consistent(key, entry, lifetime_s, held, since, scope)

    async def purge_sequence(self) -> int:
        return await self.store.purge_sequence()

    async def purge(self, route: str | None) -> Purged:
        return await self.store.purge(route)

    async def purge_records(self, refs: Sequence[str], *, soft: bool) -> RecordsPurged:
        return await self.store.purge_records(refs, soft=soft)

    async def remove(self, key: CacheKey) -> bool:
        return await self.store.remove(key)

    async def claim(self, name: str, lifetime_s: float) -> bool:
        return await self.store.claim(name, lifetime_s)

    async def close(self) -> None:
        return None


async def near_cache_live(client: Client) -> None:
    """Wait for the near cache the registry put in front of the backend to go live."""
    near = near_of(client)
    await until(lambda: near.live)


async def x_cache(client: Client, path: str) -> str:
    response = await client.get(path, headers=AUTH)
    assert response.status == 200
    return response.headers["X-Cache"]


async def gateways_on(
    aiohttp_client: AiohttpClient, upstream: TestServer, store: MemoryBackend, hub: Hub, count: int
) -> list[Client]:
    """``count`` gateways whose cache backend is the test's, registered once, each with
    its near cache live."""

    def make(settings: CacheSettings, prefix: str, clock: Clock) -> SharedStore:
        return SharedStore(store, hub)

    registry = BackendRegistry()
    # the one registration; "redis" because it is a name the settings take
    registry.register("redis", PUBLISHING_INDEXED, make)
    gateways = []
    for _ in range(count):
        settings = make_settings(
            base_url(upstream),
            cache={"backend": "redis", "key_secret": KEY_SECRET},
            admin={"token": ADMIN},
        )
        client = await gateway_client(aiohttp_client, create_app(settings, backends=registry))
        await near_cache_live(client)
        gateways.append(client)
    return gateways


async def test_a_backend_added_by_one_registration_serves_with_the_near_cache_in_front(
    aiohttp_client: AiohttpClient, upstream: TestServer, upstream_log: RequestLog
) -> None:
    store = MemoryBackend(max_bytes=1 << 20, clock=system_clock)
    first, second = await gateways_on(aiohttp_client, upstream, store, Hub(), 2)

    assert await x_cache(second, "/users") == "MISS"
    assert await x_cache(first, "/users") == "HIT"  # from the shared store
    assert len(store) == 1
    store.clear()  # the shared store forgets; each gateway's near copy still answers
    assert await x_cache(first, "/users") == "HIT"
    assert await x_cache(second, "/users") == "HIT"
    assert [entry.path for entry in upstream_log.entries] == ["/users"]

    response = await first.delete(
        "/admin/cache?route=users", headers={"Authorization": f"Bearer {ADMIN}"}
    )
    assert response.status == 200
    body = await response.json()
    assert body["backend"] == "shared-store"
    assert body["instances"] == {"told": 2, "confirmed": 2}
    assert len(near_of(second)) == 0  # confirmed: the purge reached its near cache
    assert await x_cache(second, "/users") == "MISS"
    assert [entry.path for entry in upstream_log.entries] == ["/users", "/users"]


async def test_the_near_cache_is_off_before_its_subscription_ends(
    aiohttp_client: AiohttpClient, upstream: TestServer
) -> None:
    """From the moment a subscription starts to end, a purge may not reach the process:
    no copy is served from then on."""
    hub = Hub()
    store = MemoryBackend(max_bytes=1 << 20, clock=system_clock)
    (client,) = await gateways_on(aiohttp_client, upstream, store, hub, 1)
    live_as_it_ends: list[bool] = []
    hub.on_close = lambda: live_as_it_ends.append(near_of(client).live)
    hub.silent = True
    await until(lambda: live_as_it_ends)
    assert live_as_it_ends == [False]


async def test_a_silent_channel_turns_the_near_cache_off_until_it_answers_again(
    aiohttp_client: AiohttpClient, upstream: TestServer, upstream_log: RequestLog
) -> None:
    store = MemoryBackend(max_bytes=1 << 20, clock=system_clock)
    hub = Hub()
    (client,) = await gateways_on(aiohttp_client, upstream, store, hub, 1)
    assert await x_cache(client, "/users") == "MISS"
    store.clear()
    assert await x_cache(client, "/users") == "HIT"  # the near copy

    hub.silent = True  # a purge could be missed: no copy may answer
    await until(lambda: not near_of(client).live)
    assert len(near_of(client)) == 0
    assert await x_cache(client, "/users") == "MISS"
    assert len(upstream_log.entries) == 2

    hub.silent = False
    await near_cache_live(client)
    store.clear()
    assert await x_cache(client, "/users") == "MISS"  # read from the store, kept near
    assert await x_cache(client, "/users") == "HIT"
    store.clear()
    assert await x_cache(client, "/users") == "HIT"  # the near copy answers again
    assert len(upstream_log.entries) == 3


class PausedStore(SharedStore):
    """A shared store whose reads and writes can be held up once they are done in the
    store, before their caller has the answer."""

    def __init__(self, store: MemoryBackend, hub: Hub) -> None:
        super().__init__(store, hub)
        self.hold: asyncio.Event | None = None
        self.reached = asyncio.Event()

    async def _held(self) -> None:
        hold = self.hold
        if hold is not None:
            self.hold = None
            self.reached.set()
            await hold.wait()

    async def get(self, key: CacheKey) -> Lookup:
        lookup = await super().get(key)
        await self._held()
        return lookup

    async def set(self, key: CacheKey, entry: CacheEntry, lifetime_s: float) -> None:
        await super().set(key, entry, lifetime_s)
        await self._held()


@pytest.mark.parametrize("step", ["read", "write"])
async def test_no_copy_is_kept_of_an_entry_removed_while_it_was_read_or_written(
    step: str,
) -> None:
    """A removal (a purge by record, a consistency removal) that comes while the store
    is read or written: the entry read or written may be the one removed, even once
    another read has told the near cache the route's generations again; it is not
    kept near (docs/near-cache.md)."""
    store = MemoryBackend(max_bytes=1 << 20, clock=system_clock)
    far = PausedStore(store, Hub())
    tiered = TieredBackend(far, NearCache(max_bytes=1 << 20, clock=system_clock), prefix="t")
    tiered.near.set_live(True)
    key, other = CacheKey("users", "t:e:users|a|c"), CacheKey("users", "t:e:users|b|c")
    generations = (await tiered.get(other)).generations
    body = b'{"data":[]}'
    entry = CacheEntry(body, etag_of(body), system_clock(), 30, generations=generations)
    await store.set(key, entry, 60)
    gate = far.hold = asyncio.Event()
    slow = asyncio.ensure_future(tiered.get(key) if step == "read" else tiered.set(key, entry, 60))
    await far.reached.wait()
    tiered.near.remove(key)  # the removal message, heard meanwhile
    await tiered.get(other)  # a later read learns the route's generations again
    gate.set()
    await slow
    assert tiered.near.get(key) is None
    # with nothing in between, a read keeps its copy
    await tiered.get(key)
    assert tiered.near.get(key) == entry
