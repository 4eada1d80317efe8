"""One version of a record across views at the backends' seam (docs/purging.md, "One
version of a record"): a fill that brings another version removes the entries in its
scope that hold the older one; a fill that began before one that noted another version
is not stored; another caller's entries stay in the caller scope."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as redis

from gateway.cache.backend import EVERY_CALLER, CacheBackend
from gateway.cache.entry import CacheEntry, CacheKey, etag_of
from gateway.cache.keyspace import record_key
from gateway.cache.memory import MemoryBackend
from gateway.cache.redis import RedisBackend

from ..conftest import FakeClock, until
from .stores import fresh_redis, indexed_store

PREFIX = "rg:consistency"
EXPENSE = "expense:0c6f8d3e-1111-4000-8000-000000000001"
ACCOUNT = "account:Main account"
ALICE, BOB = "a" * 32, "b" * 32


@pytest.fixture(params=["memory", "redis"])
async def store(
    request: pytest.FixtureRequest, clock: FakeClock, redis_url: str
) -> AsyncIterator[CacheBackend]:
    made = await indexed_store(request.param, clock, redis_url, PREFIX)
    yield made
    await made.close()


def k(route: str, query: str, caller: str) -> CacheKey:
    return CacheKey(route, f"{PREFIX}:e:{route}|{query}|{caller}")


async def entry(store: CacheBackend, key: CacheKey, at: float) -> CacheEntry:
    body = f'{{"key":"{key.text}"}}'.encode()
    generations = (await store.get(key)).generations
    return CacheEntry(
        body=body, etag=etag_of(body), stored_at=at, ttl_s=30, generations=generations
    )


async def present(store: CacheBackend, *keys: CacheKey) -> list[bool]:
    return [(await store.get(key)).entry is not None for key in keys]


async def test_a_newer_version_removes_the_callers_entries_holding_the_older(
    store: CacheBackend, clock: FakeClock
) -> None:
    page, detail, users = (
        k("expenses", "page=1", ALICE),
        k("expense", "1", ALICE),
        k("users", "page=1", ALICE),
    )
    others = k("expenses", "page=1", BOB)
    first = await store.purge_sequence()
    held = {EXPENSE: "v1", ACCOUNT: "a1"}
    for key in (page, others):
        scope = ALICE if key is page else BOB
        noted = await store.set_consistent(
            key, await entry(store, key, clock()), 60, held, first, scope
        )
        assert noted.stored
        assert noted.invalidated == ()
    noted = await store.set_consistent(
        users, await entry(store, users, clock()), 60, {"user:x": "u1"}, first, ALICE
    )
    assert noted.stored

    # a later fill of the detail brings the expense's next version
    later = await store.purge_sequence()
    assert later > first
    noted = await store.set_consistent(
        detail,
        await entry(store, detail, clock()),
        60,
        {EXPENSE: "v2", ACCOUNT: "a1"},
        later,
        ALICE,
    )
    assert noted.stored
    assert noted.invalidated == (page,)
    assert await present(store, detail, page, users, others) == [True, False, True, True]

    # the page fetched before the detail (an older stamp), bringing v1: refused
    noted = await store.set_consistent(
        page, await entry(store, page, clock()), 60, held, first, ALICE
    )
    assert not noted.stored
    assert await present(store, page) == [False]
    # fetched after it, at v2: stored, removing nothing
    again = await store.purge_sequence()
    noted = await store.set_consistent(
        page, await entry(store, page, clock()), 60, {EXPENSE: "v2", ACCOUNT: "a1"}, again, ALICE
    )
    assert noted == (True, (), True)


async def test_every_caller_scope_removes_every_callers_older_entries(
    store: CacheBackend, clock: FakeClock
) -> None:
    alice, bob = k("accounts", "page=1", ALICE), k("accounts", "page=1", BOB)
    first = await store.purge_sequence()
    for key in (alice, bob):
        assert (
            await store.set_consistent(
                key, await entry(store, key, clock()), 60, {ACCOUNT: "a1"}, first, EVERY_CALLER
            )
        ).stored
    later = await store.purge_sequence()
    single = k("account", "Main", BOB)
    noted = await store.set_consistent(
        single, await entry(store, single, clock()), 60, {ACCOUNT: "a2"}, later, EVERY_CALLER
    )
    assert set(noted.invalidated) == {alice, bob}
    assert await present(store, alice, bob, single) == [False, False, True]


async def test_a_fill_older_than_a_purge_of_its_record_is_refused(
    store: CacheBackend, clock: FakeClock
) -> None:
    page = k("expenses", "page=1", ALICE)
    since = await store.purge_sequence()
    await store.purge_records([EXPENSE], soft=False)
    noted = await store.set_consistent(
        page, await entry(store, page, clock()), 60, {EXPENSE: "v1"}, since, ALICE
    )
    assert not noted.stored
    assert await present(store, page) == [False]


async def test_the_same_version_from_an_older_fill_is_kept(
    store: CacheBackend, clock: FakeClock
) -> None:
    page, detail = k("expenses", "page=1", ALICE), k("expense", "1", ALICE)
    first = await store.purge_sequence()
    later = await store.purge_sequence()
    assert (
        await store.set_consistent(
            detail, await entry(store, detail, clock()), 60, {EXPENSE: "v1"}, later, ALICE
        )
    ).stored
    noted = await store.set_consistent(
        page, await entry(store, page, clock()), 60, {EXPENSE: "v1"}, first, ALICE
    )
    assert noted == (True, (), True)
    assert await present(store, page, detail) == [True, True]


async def test_a_fill_of_the_new_version_waits_for_copies_of_the_old_to_go_too(
    redis_url: str, clock: FakeClock
) -> None:
    """Two fills bring a record's next version at once: the second does not store its
    entry (and so no caller is served the new version from it) before every copy of an
    entry holding the old one is gone: until the first fill's removals are confirmed
    everywhere, it removes them itself and waits for its own."""
    store = await fresh_redis(redis_url, PREFIX, clock)
    old_page, detail, users = (
        k("expenses", "page=1", ALICE),
        k("expense", "1", ALICE),
        k("users", "page=1", ALICE),
    )
    first = await store.purge_sequence()
    await store.set_consistent(
        old_page, await entry(store, old_page, clock()), 60, {EXPENSE: "v1"}, first, EVERY_CALLER
    )
    newer = await store.purge_sequence()
    released = asyncio.Event()
    told: list[tuple[CacheKey, ...]] = []

    async def held_up(keys: tuple[CacheKey, ...]) -> bool:
        told.append(keys)
        await released.wait()  # the first fill's removals, not yet confirmed
        return True

    async def at_once(keys: tuple[CacheKey, ...]) -> bool:
        told.append(keys)
        return True

    slow = asyncio.ensure_future(
        store.set_consistent(
            detail,
            await entry(store, detail, clock()),
            60,
            {EXPENSE: "v2"},
            newer,
            EVERY_CALLER,
            held_up,
        )
    )
    await until(lambda: len(told) == 1)
    second = await store.set_consistent(
        users, await entry(store, users, clock()), 60, {EXPENSE: "v2"}, newer, EVERY_CALLER, at_once
    )
    assert second.stored
    assert old_page in told[1]  # it removed the old copies itself before storing
    released.set()
    assert (await slow).stored
    # settled: a third fill of the same version removes nothing more
    third = await store.set_consistent(
        k("expense", "2", ALICE),
        await entry(store, k("expense", "2", ALICE), clock()),
        60,
        {EXPENSE: "v2"},
        await store.purge_sequence(),
        EVERY_CALLER,
        at_once,
    )
    assert third.invalidated == ()
    await store.close()


async def test_an_entry_noted_and_not_yet_stored_is_found_by_the_next_change(
    redis_url: str, clock: FakeClock
) -> None:
    """A fill's removals may name an entry another fill has noted and not stored yet:
    nothing is removed then, and the entry's note stays, so that the next change of the
    record finds the entry once it is stored."""
    store = await fresh_redis(redis_url, PREFIX, clock)
    old_key, slow_key, fast_key, last_key = (k("expenses", f"page={n}", ALICE) for n in range(4))

    async def fill(key: CacheKey, version: str, hook: Any = None) -> Any:
        since = await store.purge_sequence()
        made = await entry(store, key, clock())
        return await store.set_consistent(key, made, 60, {EXPENSE: version}, since, ALICE, hook)

    await fill(old_key, "v1")
    released = asyncio.Event()
    noted = asyncio.Event()

    async def held_up(keys: tuple[CacheKey, ...]) -> bool:
        noted.set()
        await released.wait()
        return True

    slow = asyncio.ensure_future(fill(slow_key, "v2", held_up))
    await noted.wait()  # slow_key is noted with v2, not stored
    fast = await fill(fast_key, "v2", lambda keys: asyncio.sleep(0, True))
    assert slow_key in fast.invalidated  # named, but not there to remove
    released.set()
    assert (await slow).stored
    assert await present(store, slow_key) == [True]
    last = await fill(last_key, "v3", lambda keys: asyncio.sleep(0, True))
    assert set(last.invalidated) >= {slow_key, fast_key}
    assert await present(store, slow_key, fast_key, last_key) == [False, False, True]
    await store.close()


async def test_the_versions_of_many_callers_stay_bounded(
    store: CacheBackend, clock: FakeClock, redis_url: str
) -> None:
    """With tokens that rotate, every caller adds its scope to the records it reads:
    past 256 scopes, those noted long ago go (Redis: older than an hour; memory: the
    older half), and a fill of a caller let go that began before is still refused."""
    detail = k("expense", "1", ALICE)
    if isinstance(store, RedisBackend):
        client = redis.Redis.from_url(redis_url)
        versions = record_key(PREFIX, EXPENSE) + ":v"
        hour_ago = (time.time() - 7200) * 1_000_000
        await client.hset(
            versions, mapping={f"{n:032x}": f"{hour_ago:.0f}:1:v1" for n in range(300)}
        )
        since = await store.purge_sequence()
        noted = await store.set_consistent(
            detail, await entry(store, detail, clock()), 60, {EXPENSE: "v1"}, since, ALICE
        )
        assert noted.stored
        assert await client.hlen(versions) == 1  # the old ones let go, Alice's kept
        await client.aclose()
        return
    early = await store.purge_sequence()  # a fill of caller 0 begins, and takes long
    for n in range(300):
        key = k("expense", "1", f"{n:032x}")
        since = await store.purge_sequence()
        assert (
            await store.set_consistent(
                key, await entry(store, key, clock()), 60, {EXPENSE: "v1"}, since, f"{n:032x}"
            )
        ).stored
    assert isinstance(store, MemoryBackend)
    assert len(store._versions[EXPENSE]) <= 256
    first = k("expense", "page", f"{0:032x}")
    late = await store.set_consistent(
        first, await entry(store, first, clock()), 60, {EXPENSE: "v0"}, early, f"{0:032x}"
    )
    assert not late.stored  # caller 0's scope was let go; its older fill is not kept


async def test_a_change_of_a_record_held_by_many_entries_removes_them_all(
    redis_url: str, clock: FakeClock
) -> None:
    """A set of more members than one script reads is read by the fill in pages: all
    600 entries holding the older version go."""
    store = await fresh_redis(redis_url, PREFIX, clock)
    keys = [k("expenses", f"page={n}", f"{n:032x}") for n in range(600)]
    since = await store.purge_sequence()
    for key in keys:
        made = await entry(store, key, clock())
        assert (
            await store.set_consistent(key, made, 60, {ACCOUNT: "a1"}, since, EVERY_CALLER)
        ).stored
    detail = k("account", "Main", ALICE)
    later = await store.purge_sequence()
    noted = await store.set_consistent(
        detail, await entry(store, detail, clock()), 60, {ACCOUNT: "a2"}, later, EVERY_CALLER
    )
    assert set(noted.invalidated) == set(keys)
    assert await present(store, keys[0], keys[-1], detail) == [False, False, True]
    await store.close()
