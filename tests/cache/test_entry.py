"""Cache entries, keys, and one suite that every backend passes (memory, fakeredis, real Redis)."""

from __future__ import annotations

import gzip
import hashlib
import hmac
import re
import struct
from collections.abc import AsyncIterator
from typing import Any

import fakeredis
import pytest
import redis.asyncio as redis

from gateway.cache.backend import CacheBackend
from gateway.cache.entry import (
    GZIP,
    IDENTITY,
    NO_GENERATIONS,
    CacheCorrupt,
    CacheEntry,
    CacheKey,
    Generations,
    etag_of,
)
from gateway.cache.memory import ENTRY_OVERHEAD_BYTES, MemoryBackend
from gateway.cache.redis import RedisBackend
from gateway.records.credentials import Credentials
from gateway.records.keys import Keyer
from gateway.records.routes import parse_record_query
from gateway.routing.standard import ACCOUNT, EXPENSES, USERS

from ..conftest import FakeClock

SECRET = b"0123456789abcdef0123456789abcdef"


def creds(token: str) -> Credentials:
    return Credentials(authorization=f"Bearer {token}", token=token)


def entry(
    body: bytes = b'{"a":1}',
    *,
    at: float = 1000.0,
    ttl: int = 30,
    generations: Generations = NO_GENERATIONS,
) -> CacheEntry:
    return CacheEntry(
        body=body, etag=etag_of(body), stored_at=at, ttl_s=ttl, generations=generations
    )


def test_entry_round_trips_in_one_value() -> None:
    original = CacheEntry(
        body=b'{"amount":"12.5000"}',
        etag='"abc"',
        stored_at=1_800_000_000.25,
        ttl_s=30,
        status=200,
        generations=Generations(3, 7),
    )
    assert CacheEntry.decode(original.encode()) == original


PAGE = b'{"data":[' + b",".join([b'{"amount":"1694.8300","status":"PAID"}'] * 40) + b"]}"


def gzip_entry(body: bytes = PAGE, *, generations: Generations = NO_GENERATIONS) -> CacheEntry:
    """An entry as a fill stores a body long enough to compress: gzip bytes, the ETag
    of the identity body."""
    return CacheEntry(
        body=gzip.compress(body, mtime=0),
        etag=etag_of(body),
        stored_at=1_800_000_000.5,
        ttl_s=30,
        generations=generations,
        coding=GZIP,
    )


def test_a_gzip_entry_round_trips_with_its_coding() -> None:
    stored = gzip_entry(generations=Generations(5, 9))
    raw = stored.encode()
    assert raw[:4] == b"RGC2"
    decoded = CacheEntry.decode(raw)
    assert decoded == stored
    assert decoded.coding == GZIP
    assert gzip.decompress(decoded.body) == PAGE
    assert CacheEntry.decode(entry(PAGE).encode()).coding == IDENTITY


def test_a_value_of_the_format_before_codings_is_read_as_an_identity_entry() -> None:
    """What a gateway of the version before stored (``RGC1``: no coding byte) is read
    by this one, so that a rolling upgrade keeps the entries already in Redis."""
    etag = etag_of(PAGE).encode()
    header = struct.pack("!4sdIHQQB", b"RGC1", 1_800_000_000.25, 60, 200, 3, 7, len(etag))
    decoded = CacheEntry.decode(header + etag + PAGE)
    assert decoded == CacheEntry(
        body=PAGE,
        etag=etag_of(PAGE),
        stored_at=1_800_000_000.25,
        ttl_s=60,
        status=200,
        generations=Generations(3, 7),
        coding=IDENTITY,
    )


def value(magic: bytes = b"RGC2", coding: int = 1, body: bytes = b"") -> bytes:
    """A value laid out as this version's header says: ``coding`` 0 identity, 1 gzip."""
    etag = etag_of(PAGE).encode()
    header = struct.pack("!4sdIHQQBB", magic, 1.0, 30, 200, 0, 0, len(etag), coding)
    return header + etag + (body or gzip.compress(PAGE, mtime=0))


def test_values_are_laid_out_as_the_header_says() -> None:
    """The layout is what other versions read: it does not change within ``RGC2``."""
    compressed = CacheEntry(gzip.compress(PAGE, mtime=0), etag_of(PAGE), 1.0, 30, coding=GZIP)
    assert compressed.encode() == value()
    assert CacheEntry.decode(value()) == compressed
    plain = CacheEntry(PAGE, etag_of(PAGE), 1.0, 30, coding=IDENTITY)
    assert plain.encode() == value(coding=0, body=PAGE)


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"RGC2",
        value()[:30],
        value(magic=b"RGC9"),  # a format after this one
        value(coding=1, body=PAGE),  # "gzip" that is not
        value(coding=7),
    ],
    ids=["empty", "magic-only", "header-cut", "unknown-format", "not-gzip", "unknown-coding"],
)
def test_a_value_of_another_format_is_corrupt(raw: bytes) -> None:
    with pytest.raises(CacheCorrupt):
        CacheEntry.decode(raw)


def test_the_etag_is_128_bits_of_the_bodys_sha256() -> None:
    # SHA-256's published test vector: the hash of "abc"
    assert etag_of(b"abc") == '"ba7816bf8f01cfea414140de5dae2223"'
    page = b'{"data":[{"amount":"1694.8300"}],"total":1}'
    assert etag_of(page) == etag_of(b"".join([page[:9], page[9:]]))  # by content
    assert etag_of(page) != etag_of(page.replace(b"1694.8300", b"1694.8301"))
    assert re.fullmatch(r'"[0-9a-f]{32}"', etag_of(page * 500))


def test_keys_are_canonical_and_per_token() -> None:
    keyer = Keyer(namespace="rg", base_url="http://up.example/v2", secret=SECRET)

    def key(query: list[tuple[str, str]], token: str = "t1") -> str:
        return keyer.key(parse_record_query(USERS, None, query, max_limit=100), creds(token)).text

    assert key([]) == key([("page", "1")]) == key([("limit", "10"), ("page", "1")])
    assert key([("page", "2")]) != key([])
    assert key([], "t1") != key([], "t2")
    expenses = keyer.key(
        parse_record_query(EXPENSES, None, [("type", "cash"), ("amount", "12.50")], max_limit=100),
        creds("t1"),
    )
    same = keyer.key(
        parse_record_query(EXPENSES, None, [("amount", "12.5"), ("type", "CASH")], max_limit=100),
        creds("t1"),
    )
    assert expenses == same
    assert expenses.route == "expenses"
    assert key([]).startswith("rg:")


def test_keys_change_with_the_upstream_and_never_hold_the_token() -> None:
    token = "very-secret-token-value"
    query = parse_record_query(ACCOUNT, "Caja chica", [], max_limit=100)
    one = Keyer(namespace="rg", base_url="http://a.example", secret=SECRET).key(query, creds(token))
    two = Keyer(namespace="rg", base_url="http://b.example", secret=SECRET).key(query, creds(token))
    assert one.text != two.text
    assert token not in one.text
    other_secret = Keyer(namespace="rg", base_url="http://a.example", secret=b"x" * 32)
    assert other_secret.key(query, creds(token)) != one


@pytest.mark.parametrize(
    "authorization", ["Bearer t1", "Bearer " + "x" * 4000, "bearer  Ünïcödé-tøken "]
)
def test_the_token_fingerprint_is_hmac_sha256_under_the_key_secret(authorization: str) -> None:
    """Whichever SHA-256 implementation the keyer uses, the fingerprint is the standard
    HMAC-SHA256 (OpenSSL's here), shortened: keys stay the same across Pythons and
    instances."""
    keyer = Keyer(namespace="rg", base_url="http://a.example", secret=SECRET)
    expected = hmac.new(
        SECRET, authorization.encode("utf-8", "surrogateescape"), hashlib.sha256
    ).hexdigest()[:32]
    assert keyer.fingerprint(authorization) == expected
    assert keyer.fingerprint(authorization) == expected  # the keyed state is not consumed
    assert keyer.key_for(
        parse_record_query(USERS, None, [], max_limit=100), expected
    ).text.endswith("|" + expected)


@pytest.fixture(params=["memory", "fakeredis", "redis"])
async def backend(
    request: pytest.FixtureRequest, clock: FakeClock, redis_url: str
) -> AsyncIterator[CacheBackend]:
    """Each backend, behind the same interface."""
    made: Any
    if request.param == "memory":
        made = MemoryBackend(max_bytes=1024 * 1024, clock=clock)
    elif request.param == "fakeredis":
        made = RedisBackend(fakeredis.FakeAsyncRedis(), prefix="rg:test", timeout_s=1.0)
    else:
        made = RedisBackend(redis.Redis.from_url(redis_url), prefix="rg:test", timeout_s=1.0)
    yield made
    await made.close()


def k(route: str, text: str) -> CacheKey:
    return CacheKey(route=route, text=f"rg:test:e:{text}")


async def test_backend_get_set(backend: CacheBackend) -> None:
    lookup = await backend.get(k("users", "a"))
    assert lookup.entry is None
    assert (await backend.get(k("users", "a"))).generations == lookup.generations
    stored = entry(b'{"users":[]}', generations=lookup.generations)
    await backend.set(k("users", "a"), stored, 60)
    assert (await backend.get(k("users", "a"))).entry == stored
    assert (await backend.get(k("users", "b"))).entry is None


async def test_backend_keeps_a_gzip_entry_as_it_was_stored(backend: CacheBackend) -> None:
    lookup = await backend.get(k("users", "z"))
    stored = gzip_entry(generations=lookup.generations)
    await backend.set(k("users", "z"), stored, 60)
    held = (await backend.get(k("users", "z"))).entry
    assert held == stored
    assert held is not None
    assert gzip.decompress(held.body) == PAGE


async def test_a_value_this_version_cannot_read_is_a_miss(redis_url: str) -> None:
    """A value of a format this gateway does not know (a later version's) is no entry:
    a miss, as a gateway of the version before reads this version's ``RGC2`` values.

    Held for docs/deployment.md, "Redis".
    """
    client = redis.Redis.from_url(redis_url)
    backend = RedisBackend(client, prefix="rg:test", timeout_s=1.0)
    generations = (await backend.get(k("users", "a"))).generations
    await client.set("rg:test:e:a", b"RGC9" + gzip_entry(generations=generations).encode()[4:])
    assert (await backend.get(k("users", "a"))).entry is None
    await backend.close()


async def test_backend_purge_of_one_route(backend: CacheBackend) -> None:
    users, expenses = k("users", "u"), k("expenses", "e")
    before = (await backend.get(users)).generations
    await backend.set(users, entry(generations=before), 60)
    await backend.set(expenses, entry(generations=before), 60)
    await backend.purge("expenses")
    assert (await backend.get(users)).entry is not None
    lookup = await backend.get(expenses)
    assert lookup.entry is None
    assert lookup.generations.everything == before.everything
    assert lookup.generations.route != before.route
    # an entry stored under the old generation stays purged; under the new one it is served
    await backend.set(expenses, entry(at=2000.0, generations=before), 60)
    stale_generation = await backend.get(expenses)
    assert stale_generation.entry is None
    fresh = CacheEntry(b"x", '"x"', 2000.0, 30, generations=lookup.generations)
    await backend.set(expenses, fresh, 60)
    assert (await backend.get(expenses)).entry == fresh


async def test_backend_purge_of_everything(backend: CacheBackend) -> None:
    users_before = (await backend.get(k("users", "u"))).generations
    account_before = (await backend.get(k("account", "a"))).generations
    await backend.set(k("users", "u"), entry(generations=users_before), 60)
    await backend.set(k("account", "a"), entry(generations=account_before), 60)
    assert (await backend.get(k("users", "u"))).entry is not None
    await backend.purge(None)
    assert (await backend.get(k("users", "u"))).entry is None
    lookup = await backend.get(k("account", "a"))
    assert lookup.entry is None
    assert lookup.generations.everything != account_before.everything
    assert lookup.generations.route == account_before.route


async def test_memory_backend_expires_by_its_clock(clock: FakeClock) -> None:
    backend = MemoryBackend(max_bytes=1024 * 1024, clock=clock)
    await backend.set(k("users", "a"), entry(), 10)
    clock.advance(9.9)
    assert (await backend.get(k("users", "a"))).entry is not None
    clock.advance(0.2)
    assert (await backend.get(k("users", "a"))).entry is None
    assert len(backend) == 0


async def test_memory_backend_fresh_is_within_ttl_unpurged_and_kept_recently_used(
    clock: FakeClock,
) -> None:
    """``fresh`` (the hit path's lookup) answers only what ``get`` would serve as a
    fresh hit; a stale entry stays for ``get`` (stale serving), a purged one goes."""
    backend = MemoryBackend(max_bytes=1024 * 1024, clock=clock)
    stored_at = clock()
    users, expenses = k("users", "a"), k("expenses", "e")
    await backend.set(users, entry(at=stored_at, ttl=10), 60)
    await backend.set(expenses, entry(at=stored_at, ttl=10), 60)
    assert backend.fresh(k("users", "missing")) is None
    assert backend.fresh(users) == entry(at=stored_at, ttl=10)
    clock.advance(10.0)  # its TTL is over: not fresh, still there to serve stale
    assert backend.fresh(users) is None
    assert (await backend.get(users)).entry == entry(at=stored_at, ttl=10)
    clock.advance(50.0)  # past its lifetime: gone
    assert backend.fresh(users) is None
    assert (await backend.get(users)).entry is None
    await backend.set(users, entry(at=clock(), ttl=10), 60)
    await backend.purge("users")
    assert backend.fresh(users) is None  # stored before the purge: dropped
    assert len(backend) == 1  # only the expenses entry: past its lifetime, not looked up
    await backend.set(expenses, entry(at=clock(), ttl=10), 60)
    assert backend.fresh(expenses) is not None


def test_memory_backend_fresh_marks_the_entry_recently_used(clock: FakeClock) -> None:
    body = b"x" * 400_000
    backend = MemoryBackend(max_bytes=1024 * 1024, clock=clock)
    backend.put("a", entry(body, at=clock()), 60, route="users")
    backend.put("b", entry(body, at=clock()), 60, route="users")
    assert backend.fresh(CacheKey("users", "a")) is not None
    backend.put("c", entry(body, at=clock()), 60, route="users")  # evicts b, not a
    assert backend.peek("a") is not None
    assert backend.peek("b") is None


async def test_redis_backend_sets_an_expiry_on_entries_and_leases(redis_url: str) -> None:
    """Entries and leases expire; purge generations do not (a handful of keys per
    prefix), so that no policy that spares persistent keys evicts them."""
    client = redis.Redis.from_url(redis_url)
    backend = RedisBackend(client, prefix="rg:test", timeout_s=1.0)
    await backend.set(k("users", "a"), entry(), 90)
    assert await backend.take_lease(k("users", "b"), 5_000) is not None
    await backend.purge("users")
    await backend.purge(None)
    assert 89_000 < await client.pttl("rg:test:e:a") <= 90_000
    assert 4_000 < await client.pttl("rg:test:e:b:lease") <= 5_000
    assert await client.pttl("rg:test:{rg:test:gen}") == -1
    assert await client.pttl("rg:test:{rg:test:gen}:users") == -1
    assert sorted([key async for key in client.scan_iter("*")]) == [
        b"rg:test:e:a",
        b"rg:test:e:b:lease",
        b"rg:test:{rg:test:gen}",
        b"rg:test:{rg:test:gen}:users",
    ]
    await backend.close()


async def test_memory_backend_holds_its_bound_evicting_least_recently_used(
    clock: FakeClock,
) -> None:
    body = b"x" * 10_000
    per_entry = len(body) + ENTRY_OVERHEAD_BYTES + len("rg:test:e:000")
    backend = MemoryBackend(max_bytes=1024 * 1024, clock=clock)
    await backend.set(k("users", "000"), entry(body), 60)
    for index in range(1, 300):
        await backend.get(k("users", "000"))  # keep the first one recently used
        await backend.set(k("users", f"{index:03d}"), entry(body), 60)
        assert backend.size_bytes <= 1024 * 1024
    assert len(backend) == (1024 * 1024) // per_entry
    assert (await backend.get(k("users", "000"))).entry is not None
    assert (await backend.get(k("users", "001"))).entry is None
    assert (await backend.get(k("users", "299"))).entry is not None


def test_the_memory_backend_charges_the_bytes_it_holds_compressed(clock: FakeClock) -> None:
    stored = gzip_entry()
    backend = MemoryBackend(max_bytes=1024 * 1024, clock=clock)
    backend.put("rg:test:e:z", stored, 60, route="users")
    assert len(stored.body) < len(PAGE) // 4
    assert backend.size_bytes == len("rg:test:e:z") + len(stored.body) + ENTRY_OVERHEAD_BYTES
