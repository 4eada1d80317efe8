"""Purge by record at the backends' seam (docs/purging.md): what each entry holds is
noted as it is stored, a purge removes or marks stale every entry that holds a record
and no other, and a fill that began before a purge is not kept."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as redis

from gateway.cache.backend import CacheBackend, ProcessClaims
from gateway.cache.entry import CacheEntry, CacheKey, etag_of
from gateway.cache.keyspace import record_key, record_sequence_key
from gateway.cache.memory import HOLDING_OVERHEAD_BYTES, MemoryBackend
from gateway.cache.redis import LONGEST_LIFETIME_S, RedisBackend
from gateway.config.settings import CacheSettings
from gateway.routing.routes import MAX_TTL_S

from ..conftest import FakeClock
from .stores import indexed_store

PREFIX = "rg:test"
EXPENSE = "expense:0c6f8d3e-1111-4000-8000-000000000001"
OTHER = "expense:0c6f8d3e-1111-4000-8000-000000000002"
ACCOUNT = "account:Main account"


@pytest.fixture(params=["memory", "redis"])
async def store(
    request: pytest.FixtureRequest, clock: FakeClock, redis_url: str
) -> AsyncIterator[CacheBackend]:
    made = await indexed_store(request.param, clock, redis_url, PREFIX)
    yield made
    await made.close()


async def holders(client: redis.Redis, index: str) -> list[bytes]:
    """The keys of the entries a record's set names, sorted (not its purge mark)."""
    members: list[bytes] = await client.zrange(index, 0, -1)  # type: ignore[assignment]
    return sorted(member.split(b"|", 1)[1] for member in members if member != b"!")


def k(route: str, text: str) -> CacheKey:
    return CacheKey(route, f"{PREFIX}:e:{route}|{text}")


async def entry(store: CacheBackend, key: CacheKey, at: float) -> CacheEntry:
    """An entry to store under ``key`` at ``at``, under the purge generations the store
    has now (a first read makes them)."""
    body = b'{"data":[]}'
    generations = (await store.get(key)).generations
    return CacheEntry(
        body=body, etag=etag_of(body), stored_at=at, ttl_s=30, generations=generations
    )


PAGE = k("expenses", "page=1|alice")
DETAIL = k("expense", "0c6f8d3e|bob")
SECOND_PAGE = k("expenses", "page=2|alice")


async def stored(store: CacheBackend, key: CacheKey) -> CacheEntry | None:
    return (await store.get(key)).entry


async def fill(store: CacheBackend, clock: FakeClock, key: CacheKey, *held: str) -> None:
    since = await store.purge_sequence()
    kept = await store.set_holding(
        key, await entry(store, key, clock()), 60, dict.fromkeys(held, "v1"), since
    )
    assert kept


async def test_a_purge_by_record_removes_every_entry_that_holds_it_and_no_other(
    store: CacheBackend, clock: FakeClock
) -> None:
    await fill(store, clock, PAGE, EXPENSE, ACCOUNT)
    await fill(store, clock, DETAIL, EXPENSE)
    await fill(store, clock, SECOND_PAGE, OTHER, ACCOUNT)

    purged = await store.purge_records([EXPENSE], soft=False)
    assert sorted(purged.keys) == sorted([PAGE, DETAIL])
    assert await stored(store, PAGE) is None
    assert await stored(store, DETAIL) is None
    assert await stored(store, SECOND_PAGE) is not None

    # the account's other holder; the page that held it too is gone already
    assert (await store.purge_records([ACCOUNT], soft=False)).keys == (SECOND_PAGE,)
    assert await stored(store, SECOND_PAGE) is None
    assert (await store.purge_records([EXPENSE, ACCOUNT], soft=False)).keys == ()


async def test_one_purge_names_several_records_and_counts_each_entry_once(
    store: CacheBackend, clock: FakeClock
) -> None:
    await fill(store, clock, PAGE, EXPENSE, ACCOUNT)
    await fill(store, clock, SECOND_PAGE, OTHER)
    purged = await store.purge_records([EXPENSE, ACCOUNT, OTHER], soft=False)
    assert sorted(purged.keys) == sorted([PAGE, SECOND_PAGE])


async def test_a_soft_purge_by_record_leaves_its_entries_stale(
    store: CacheBackend, clock: FakeClock
) -> None:
    await fill(store, clock, PAGE, EXPENSE)
    await fill(store, clock, SECOND_PAGE, OTHER)
    kept = await stored(store, PAGE)
    clock.advance(10.5)

    assert (await store.purge_records([EXPENSE], soft=True)).keys == (PAGE,)
    stale = await stored(store, PAGE)
    assert stale is not None
    assert (stale.body, stale.etag, stale.stored_at) == (kept.body, kept.etag, kept.stored_at)  # type: ignore[union-attr]
    assert not stale.is_fresh(clock())
    assert stale.ttl_s == 10  # stale from now: its stale windows begin now
    fresh = await stored(store, SECOND_PAGE)
    assert fresh is not None
    assert fresh.is_fresh(clock())
    # a hard purge after it still finds the entry
    assert (await store.purge_records([EXPENSE], soft=False)).keys == (PAGE,)
    assert await stored(store, PAGE) is None


async def test_a_fill_that_began_before_a_purge_of_its_record_is_not_kept(
    store: CacheBackend, clock: FakeClock
) -> None:
    since = await store.purge_sequence()  # the fill asks the upstream
    assert (await store.purge_records([EXPENSE], soft=False)).keys == ()  # meanwhile
    assert not await store.set_holding(
        PAGE, await entry(store, PAGE, clock()), 60, {EXPENSE: "v0"}, since
    )
    assert await stored(store, PAGE) is None
    # one that holds none of the purged records is kept
    assert await store.set_holding(
        DETAIL, await entry(store, DETAIL, clock()), 60, {OTHER: "v1"}, since
    )
    # and so is one that asked the upstream after the purge, at once
    after = await store.purge_sequence()
    assert after > since
    assert await store.set_holding(
        PAGE, await entry(store, PAGE, clock()), 60, {EXPENSE: "v1"}, after
    )
    assert await stored(store, PAGE) is not None
    # purges of other records leave it alone
    assert (await store.purge_records([OTHER], soft=False)).keys == (DETAIL,)
    assert await store.set_holding(
        SECOND_PAGE, await entry(store, SECOND_PAGE, clock()), 60, {EXPENSE: "v1"}, after
    )


async def test_the_purge_number_of_redis_outlives_its_counter(
    clock: FakeClock, redis_url: str
) -> None:
    """A counter evicted or deleted starts again at or beyond every number it gave: a
    fill that reads it after is never taken for one that began before an earlier
    purge, and a purge after it is numbered after that fill's number."""
    client = redis.Redis.from_url(redis_url)
    store = RedisBackend(client, prefix=PREFIX, timeout_s=1.0, clock=clock)
    for _ in range(3):
        await store.purge_records([EXPENSE], soft=False)
    before = await store.purge_sequence()
    await client.delete(record_sequence_key(PREFIX))
    since = await store.purge_sequence()
    assert since >= before
    assert await store.set_holding(
        PAGE, await entry(store, PAGE, clock()), 60, {EXPENSE: "v1"}, since
    )
    await store.purge_records([EXPENSE], soft=False)
    assert not await store.set_holding(
        PAGE, await entry(store, PAGE, clock()), 60, {EXPENSE: "v1"}, since
    )
    await store.close()


async def test_an_entry_stored_again_without_a_record_is_not_purged_for_it(
    store: CacheBackend, clock: FakeClock
) -> None:
    await fill(store, clock, PAGE, EXPENSE)
    clock.advance(1)
    await fill(store, clock, PAGE, OTHER)  # the page no longer holds the expense
    assert (await store.purge_records([EXPENSE], soft=False)).keys == ()
    assert await stored(store, PAGE) is not None
    assert (await store.purge_records([OTHER], soft=False)).keys == (PAGE,)


async def test_the_redis_index_of_a_record_expires_with_its_entries(
    clock: FakeClock, redis_url: str
) -> None:
    client = redis.Redis.from_url(redis_url)
    store = RedisBackend(client, prefix=PREFIX, timeout_s=1.0, clock=clock)
    await fill(store, clock, PAGE, EXPENSE)
    index = record_key(PREFIX, EXPENSE)
    assert 59_000 < await client.pttl(index) <= 60_000
    await store.set_holding(DETAIL, await entry(store, DETAIL, clock()), 3600, {EXPENSE: "v1"}, 0)
    assert 3_599_000 < await client.pttl(index) <= 3_600_000  # as long as its longest
    assert await holders(client, index) == sorted([PAGE.text.encode(), DETAIL.text.encode()])
    # an entry stored again is one member still, scored by when it was stored
    clock.advance(30)
    await fill(store, clock, PAGE, EXPENSE)
    assert await holders(client, index) == sorted([PAGE.text.encode(), DETAIL.text.encode()])
    assert await client.zscore(index, f"{PAGE.route}|{PAGE.text}") == clock()
    # members stored longer ago than any entry lives are let go as others are noted
    clock.advance(LONGEST_LIFETIME_S - 10)
    await fill(store, clock, SECOND_PAGE, EXPENSE)
    assert await holders(client, index) == sorted([PAGE.text.encode(), SECOND_PAGE.text.encode()])
    await store.close()


def test_no_entry_lives_longer_than_the_index_keeps_its_members() -> None:
    longest = max(
        CacheSettings.model_fields[name].metadata[-1].le
        for name in ("stale_while_revalidate_s", "stale_if_error_s")
    )
    assert MAX_TTL_S + longest <= LONGEST_LIFETIME_S


async def test_the_memory_index_counts_against_the_bound_and_leaves_with_its_entry(
    clock: FakeClock,
) -> None:
    store = MemoryBackend(max_bytes=1 << 20, clock=clock)
    await store.set(PAGE, await entry(store, PAGE, clock()), 60)
    plain = store.size_bytes
    await store.remove(PAGE)
    await fill(store, clock, PAGE, EXPENSE, ACCOUNT)
    held = len(EXPENSE) + len(ACCOUNT) + 2 * HOLDING_OVERHEAD_BYTES
    assert store.size_bytes == plain + held
    await store.remove(PAGE)
    assert store.size_bytes == 0
    assert (await store.purge_records([EXPENSE], soft=False)).keys == ()


async def test_a_hard_purge_lets_go_of_the_members_it_removed_and_keeps_newer_ones(
    clock: FakeClock, redis_url: str
) -> None:
    client = redis.Redis.from_url(redis_url)
    store = RedisBackend(client, prefix=PREFIX, timeout_s=1.0, clock=clock)
    await fill(store, clock, PAGE, EXPENSE)
    await fill(store, clock, DETAIL, EXPENSE)
    index = record_key(PREFIX, EXPENSE)
    assert (await store.purge_records([EXPENSE], soft=True)).keys != ()
    assert len(await holders(client, index)) == 2  # soft: the entries still hold it
    assert len((await store.purge_records([EXPENSE], soft=False)).keys) == 2
    assert await holders(client, index) == []
    await store.close()


async def test_a_store_refused_for_a_purge_leaves_the_entry_before_it_findable(
    store: CacheBackend, clock: FakeClock
) -> None:
    """A page holding the account is refreshed while an expense its new answer holds
    is purged: the refreshed answer is not stored, and the page as it was stays
    reachable by the account's purge."""
    await fill(store, clock, PAGE, ACCOUNT)
    since = await store.purge_sequence()
    await store.purge_records([EXPENSE], soft=False)  # while the refresh is upstream
    clock.advance(1)
    refreshed = await entry(store, PAGE, clock())
    assert not await store.set_holding(PAGE, refreshed, 60, {ACCOUNT: "", EXPENSE: ""}, since)
    # the memory backend drops the page at once; Redis leaves it, findable
    await store.purge_records([ACCOUNT], soft=False)
    assert await stored(store, PAGE) is None


async def test_a_purge_names_every_key_it_found_for_the_copies_elsewhere(
    clock: FakeClock, redis_url: str
) -> None:
    """An entry gone from Redis (evicted) may still have copies in other processes:
    the purge names its key for them to drop, though it removed nothing."""
    client = redis.Redis.from_url(redis_url)
    store = RedisBackend(client, prefix=PREFIX, timeout_s=1.0, clock=clock)
    await fill(store, clock, PAGE, EXPENSE)
    await fill(store, clock, DETAIL, EXPENSE)
    await client.delete(PAGE.text)
    purged = await store.purge_records([EXPENSE], soft=False)
    assert purged.keys == (DETAIL,)
    assert sorted(purged.reached) == sorted([PAGE, DETAIL])
    await store.close()


async def test_a_record_held_by_many_entries_is_purged_in_steps_within_the_timeout(
    clock: FakeClock, redis_url: str
) -> None:
    """2,000 holders with the default 50 ms timeout: each step (a page of the set, a
    batch of entries) has its own time."""
    client = redis.Redis.from_url(redis_url)
    store = RedisBackend(client, prefix=PREFIX, timeout_s=0.05, clock=clock)
    keys = [k("expenses", f"page={n}|caller") for n in range(2000)]
    generations = (await store.get(keys[0])).generations
    body = b'{"data":[]}'
    for key in keys:
        held = {ACCOUNT: "", f"expense:{key.text[-12:]}": ""}
        made = CacheEntry(body, etag_of(body), clock(), 30, generations=generations)
        assert await store.set_holding(key, made, 60, held, 0)
    purged = await store.purge_records([ACCOUNT], soft=False)
    assert len(purged.keys) == len(keys)
    assert await holders(client, record_key(PREFIX, ACCOUNT)) == []
    await store.close()


async def test_an_entry_too_large_for_the_memory_bound_replaces_the_one_before(
    clock: FakeClock,
) -> None:
    store = MemoryBackend(max_bytes=4096, clock=clock)
    await fill(store, clock, PAGE, ACCOUNT)
    body = b"x" * 8192
    huge = CacheEntry(body, etag_of(body), clock(), 30)
    assert await store.set_holding(PAGE, huge, 60, {EXPENSE: ""}, 0)
    assert await stored(store, PAGE) is None  # neither the old answer nor the new
    assert (await store.purge_records([EXPENSE], soft=False)).keys == ()
    assert (await store.purge_records([ACCOUNT], soft=False)).keys == ()


async def test_a_name_is_claimed_once_for_its_lifetime(
    store: CacheBackend, clock: FakeClock
) -> None:
    """What refuses a signed change notice sent again (docs/purging.md)."""
    assert await store.claim("notice:a", 0.2)
    assert not await store.claim("notice:a", 0.2)
    assert await store.claim("notice:b", 0.2)
    if isinstance(store, MemoryBackend):
        clock.advance(0.25)
    else:
        await asyncio.sleep(0.3)  # Redis's own expiry
    assert await store.claim("notice:a", 0.2)


def test_a_process_holds_at_most_its_limit_of_claims_the_oldest_let_go() -> None:
    now = [0.0]
    claims = ProcessClaims(lambda: now[0], limit=3)
    for name in ("a", "b", "c"):
        assert claims.claim(name, 10)
    now[0] = 1.0
    assert claims.claim("d", 10)  # "a", the oldest, let go
    assert not claims.claim("b", 10)
    assert claims.claim("a", 10)
    assert not claims.claim("d", 10)


async def test_the_index_says_its_size(
    store: CacheBackend, clock: FakeClock, redis_url: str
) -> None:
    """What gateway_cache_record_index_keys and _bytes show (docs/purging.md): in
    memory, the records noted and what they are charged; with Redis, the index's keys
    (the records' sets and the counter of purges) and their bytes, measured by one
    instance and read by the others."""
    if isinstance(store, RedisBackend):
        await store.close()
        prefix = f"rg:size{time.time_ns()}"
        store = RedisBackend(redis.Redis.from_url(redis_url), prefix=prefix, timeout_s=1.0)
    await store.purge_records([OTHER], soft=False)  # the counter, with Redis
    held = {EXPENSE: "", ACCOUNT: ""}
    for n in range(3):
        key = k("expenses", f"page={n}")
        await store.set_holding(key, await entry(store, key, clock()), 60, held, 0)
    size = await store.index_size()
    assert size is not None
    if isinstance(store, MemoryBackend):
        assert size == (2, 3 * (len(EXPENSE) + len(ACCOUNT) + 2 * HOLDING_OVERHEAD_BYTES))
        await store.remove(k("expenses", "page=0"))
        assert await store.index_size() == (2, 2 * (len(EXPENSE) + len(ACCOUNT) + 320))
        return
    assert size.keys == 4  # two sets, the purged record's set, the counter
    assert 4 * 50 < size.bytes < 4 * 2000
    # another instance reads the figure measured (for 5 minutes)
    other = RedisBackend(redis.Redis.from_url(redis_url), prefix=prefix, timeout_s=1.0)
    await other.purge_records([EXPENSE], soft=False)
    assert await other.index_size() == size
    await other.close()
    await store.close()
