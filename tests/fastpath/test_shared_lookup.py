"""A hit whose entry this process does not hold, answered from the bytes once it is read
from Redis (``GatewayConnection._look_up``, ``RecordPipeline.stored_fresh``), and the
batched reads under it (``gateway.cache.redis.ReadBatch``), against a real redis-server.

What a caller sees: the hit answered without aiohttp's request handling, the same
reply aiohttp's way gives, answers in the order of the requests however many wait for
Redis, one cache read per request whichever way it is answered, and the connection
left alone by a caller that leaves while its entry is read.
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import socket
import struct
from typing import Any

import pytest
import redis.asyncio as redis
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gateway.cache.entry import CacheEntry, CacheKey, Generations
from gateway.cache.keyspace import generation_key
from gateway.cache.redis import BATCH_MAX_KEYS, RedisBackend
from gateway.errors import CacheUnavailable
from gateway.fastpath.connection import HELD_MAX, GatewayConnection
from gateway.http.binding import UPSTREAMS
from gateway.records.pipeline import StoredRead

from ..conftest import GatewayFactory, base_url, near_cache_live, near_of, redis_cache
from ..http.test_wire import (
    Answer,
    count_full_reads,
    exchange,
    read_answer,
    request_bytes,
    upstream_calls,
)
from ..redis_server import RedisServer

Client = TestClient[web.Request, web.Application]
FAST = {"fast_path": True}
PAGES = [f"/expenses?limit=3&page={page}" for page in range(1, 7)]


async def mgets(url: str) -> int:
    """The MGET commands the redis-server at ``url`` has run so far."""
    client = redis.Redis.from_url(url)
    try:
        stats = await client.info("commandstats")
    finally:
        await client.aclose()
    return int(stats.get("cmdstat_mget", {}).get("calls", 0))


async def fast_gateway(
    gateway_factory: GatewayFactory, upstream: TestServer, redis_url: str, **cache: Any
) -> tuple[Client, int]:
    client = await gateway_factory(
        base_url(upstream), server=FAST, cache=redis_cache(redis_url, **cache)
    )
    assert client.port is not None
    return client, client.port


async def test_a_redis_hit_is_answered_from_the_bytes_as_aiohttp_s_way_answers_it(
    gateway_factory: GatewayFactory,
    upstream: TestServer,
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Near cache off: every hit is a Redis read. The fast path answers it, with the
    body, ETag and headers a request taken aiohttp's way gets for the same entry."""
    client, port = await fast_gateway(gateway_factory, upstream, redis_url, near_cache=False)
    (stored,) = await exchange(port, request_bytes(PAGES[0]))
    assert stored.headers["x-cache"] == "MISS"
    full_reads = count_full_reads(client.app, monkeypatch)
    (fast,) = await exchange(port, request_bytes(PAGES[0]))
    (full,) = await exchange(port, request_bytes(PAGES[0], Cache_Control="max-age=60"))
    assert full_reads == [1], "only the request with Cache-Control took aiohttp's way"
    assert fast.headers["x-cache"] == full.headers["x-cache"] == "HIT"
    assert fast.body == full.body == stored.body
    assert fast.headers["etag"] == stored.headers["etag"]
    assert fast.comparable() == full.comparable()


async def test_a_redis_hit_is_answered_from_the_bytes_in_either_representation(
    gateway_factory: GatewayFactory,
    upstream: TestServer,
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A caller that accepts gzip gets the stored bytes as Redis holds them, one that
    does not gets the identity body: both from the bytes, both as aiohttp's way."""
    client, port = await fast_gateway(gateway_factory, upstream, redis_url, near_cache=False)
    (stored,) = await exchange(port, request_bytes(PAGES[2]))
    full_reads = count_full_reads(client.app, monkeypatch)
    zipped, plain = await exchange(
        port, request_bytes(PAGES[2], Accept_Encoding="gzip"), request_bytes(PAGES[2])
    )
    (by_handler,) = await exchange(
        port, request_bytes(PAGES[2], Accept_Encoding="gzip", Cache_Control="max-age=60")
    )
    assert full_reads == [1]
    assert zipped.headers["content-encoding"] == "gzip"
    assert gzip.decompress(zipped.body) == plain.body == stored.body
    assert zipped.headers["etag"] == stored.headers["etag"][:-1] + '-gzip"'
    assert zipped.comparable() == by_handler.comparable()
    assert zipped.body == by_handler.body
    assert "content-encoding" not in plain.headers


async def test_an_entry_another_instance_stored_is_read_once_then_held(
    gateway_factory: GatewayFactory,
    upstream: TestServer,
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two instances on one Redis: what one stored, the other's fast path reads from
    Redis (its near cache did not have it) and keeps in its near cache; the next
    request is a hit held in the process. Neither goes upstream or aiohttp's way."""
    _first, first_port = await fast_gateway(gateway_factory, upstream, redis_url)
    second, second_port = await fast_gateway(gateway_factory, upstream, redis_url)
    await near_cache_live(second)
    (stored,) = await exchange(first_port, request_bytes(PAGES[1]))
    assert stored.headers["x-cache"] == "MISS"
    calls = upstream_calls(upstream)
    full_reads = count_full_reads(second.app, monkeypatch)
    before = await mgets(redis_url)
    answers = await exchange(second_port, request_bytes(PAGES[1]))
    assert len(near_of(second)) == 1
    answers += await exchange(second_port, request_bytes(PAGES[1]))
    assert await mgets(redis_url) - before == 1, "the second was held in the process"
    for answer in answers:
        assert answer.headers["x-cache"] == "HIT"
        assert answer.body == stored.body
    assert full_reads == [0]
    assert upstream_calls(upstream) == calls


async def test_pipelined_requests_are_answered_in_order_around_redis_reads_and_a_miss(
    gateway_factory: GatewayFactory,
    upstream: TestServer,
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One write of many requests: Redis hits, a miss between them, hits again. Each
    is answered in order with its own entry; only the miss goes upstream and takes
    aiohttp's way, and the hits after it are its too (aiohttp then has the
    connection's earlier request in hand)."""
    client, port = await fast_gateway(gateway_factory, upstream, redis_url, near_cache=False)
    stored = {path: (await exchange(port, request_bytes(path)))[0] for path in PAGES[:5]}
    cold = "/expenses?limit=3&page=40"
    order = [*PAGES[:5], cold, *PAGES[4::-1]] * 3
    calls = upstream_calls(upstream)
    full_reads = count_full_reads(client.app, monkeypatch)
    answers = await exchange(port, *(request_bytes(path) for path in order))
    assert len(answers) == len(order)
    for path, answer in zip(order, answers, strict=True):
        assert answer.status_line == "HTTP/1.1 200 OK"
        if path == cold:
            continue
        assert answer.body == stored[path].body
        assert answer.headers["etag"] == stored[path].headers["etag"]
    assert [a.headers["x-cache"] for a in answers[:6]] == ["HIT"] * 5 + ["MISS"]
    assert upstream_calls(upstream) == calls + 1
    assert 1 <= full_reads[0] < len(order)


async def test_a_miss_reads_the_cache_as_often_whichever_way_it_is_answered(
    gateway_factory: GatewayFactory, upstream: TestServer, redis_url: str, fast_path: bool
) -> None:
    """A miss is one read of its entry, then the fill's own read once it holds the
    lease: two MGETs, with the fast path (whose read aiohttp's way then takes as its
    own) as without it."""
    client = await gateway_factory(
        base_url(upstream), cache=redis_cache(redis_url, near_cache=False)
    )
    assert (await client.get(PAGES[2], headers=AUTH_HEADERS)).status == 200  # generations made
    before = await mgets(redis_url)
    answer = await client.get(PAGES[3], headers=AUTH_HEADERS)
    assert (answer.status, answer.headers["X-Cache"]) == (200, "MISS")
    assert await mgets(redis_url) - before == 2


async def test_a_caller_gone_while_its_entry_is_read_leaves_no_error(
    gateway_factory: GatewayFactory,
    upstream: TestServer,
    redis_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A caller that sends a request and closes before Redis answers: nothing is
    written, nothing is logged as an error, and the gateway goes on serving."""
    _, port = await fast_gateway(gateway_factory, upstream, redis_url, near_cache=False)
    (stored,) = await exchange(port, request_bytes(PAGES[0]))
    for _ in range(20):
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request_bytes(PAGES[0]) * 3)
        writer.close()
        await writer.wait_closed()
    (after,) = await exchange(port, request_bytes(PAGES[0]))
    assert after.body == stored.body
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


AUTH_HEADERS = {"Authorization": "Bearer demo-token"}


async def _stored(backend: RedisBackend, key: CacheKey, body: bytes) -> None:
    lookup = await backend.get(key)  # makes the generations
    entry = CacheEntry(body, f'"{body.hex()}"', 0.0, 60, generations=lookup.generations)
    await backend.set(key, entry, 60)


async def test_reads_of_one_turn_go_to_redis_as_one_command(redis_url: str) -> None:
    """Reads made together are answered by one MGET (per BATCH_MAX_KEYS keys), each
    with its own entry, a missing one as missing, of whichever route."""
    client = redis.Redis.from_url(redis_url)
    backend = RedisBackend(client, prefix="rg:batch", timeout_s=5.0)
    try:
        keys = [CacheKey("expenses" if n % 2 else "users", f"rg:batch:e:{n}") for n in range(40)]
        for key in keys[:30]:
            await _stored(backend, key, key.text.encode())
        before = await mgets(redis_url)
        lookups = await asyncio.gather(*(backend.get(key) for key in keys))
        assert await mgets(redis_url) - before == 1
        for key, lookup in zip(keys, lookups, strict=True):
            stored = int(key.text.rpartition(":")[2]) < 30
            assert (lookup.entry.body if lookup.entry else None) == (
                key.text.encode() if stored else None
            )
        many = [CacheKey("users", f"rg:batch:m:{n}") for n in range(BATCH_MAX_KEYS + 1)]
        before = await mgets(redis_url)
        assert not any(lookup.entry for lookup in await asyncio.gather(*map(backend.get, many)))
        assert await mgets(redis_url) - before == 2
    finally:
        await backend.close()


async def test_a_purge_between_two_batches_is_seen_by_the_second(redis_url: str) -> None:
    """Each batch reads the generations with the entries: an entry read after a purge
    is a miss, even when the read before it in the same process was a hit."""
    client = redis.Redis.from_url(redis_url)
    backend = RedisBackend(client, prefix="rg:purge", timeout_s=5.0)
    try:
        key = CacheKey("users", "rg:purge:e:1")
        await _stored(backend, key, b"body")
        assert (await backend.get(key)).entry is not None
        await backend.purge("users")
        lookup = await backend.get(key)
        assert lookup.entry is None
        assert lookup.generations != Generations()
        assert await client.exists(generation_key("rg:purge", "users"))
    finally:
        await backend.close()


async def test_a_batch_redis_does_not_answer_fails_every_read_in_it(own_redis: RedisServer) -> None:
    """A frozen Redis: every read of the batch fails as a cache fault within the
    backend's timeout (the pipeline treats it as a miss), none hangs."""
    client = redis.Redis.from_url(own_redis.url)
    backend = RedisBackend(client, prefix="rg:frozen", timeout_s=0.2)
    try:
        key = CacheKey("users", "rg:frozen:e:1")
        await _stored(backend, key, b"body")
        own_redis.freeze()
        outcomes = await asyncio.gather(
            *(backend.get(CacheKey("users", f"rg:frozen:e:{n}")) for n in range(10)),
            return_exceptions=True,
        )
        assert all(isinstance(outcome, CacheUnavailable) for outcome in outcomes)
    finally:
        own_redis.thaw()
        await backend.close()


ADMIN = "admin-token-0123456789abcdef"


async def test_a_read_left_by_a_caller_gone_is_never_another_request_s(
    gateway_factory: GatewayFactory, upstream: TestServer, own_redis: RedisServer
) -> None:
    """A caller leaves while its entry (stale) is read from Redis; the entry is then
    purged. A request sent after the purge's 200 gets no pre-purge entry: the read
    belonged to the request that made it, and went with it."""
    client = await gateway_factory(
        base_url(upstream),
        server=FAST,
        cache=redis_cache(
            own_redis.url, near_cache=False, stale_while_revalidate_s=600, ttl_s={"expenses": 1}
        ),
        admin={"token": ADMIN},
    )
    port = client.port
    assert port is not None
    (first,) = await exchange(port, request_bytes(PAGES[0]))
    assert first.headers["x-cache"] == "MISS"
    await asyncio.sleep(1.2)  # stale in Redis, within stale_while_revalidate
    gone = socket.create_connection(("127.0.0.1", port))
    gone.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    own_redis.freeze()  # its read waits for Redis
    try:
        gone.sendall(request_bytes(PAGES[0]))
        await asyncio.sleep(0.05)
        gone.close()  # reset while its read is in flight
        await asyncio.sleep(0.05)
    finally:
        own_redis.thaw()
    await asyncio.sleep(0.05)
    purged = await client.delete("/admin/cache", headers={"Authorization": f"Bearer {ADMIN}"})
    assert purged.status == 200
    # a request taken aiohttp's way (a directive the gateway ignores), on a new connection
    (after,) = await exchange(port, request_bytes(PAGES[0], Cache_Control="max-age=0"))
    assert after.headers["x-cache"] == "MISS", after.headers["cache-status"]


async def test_a_caller_pipelining_on_and_on_is_held_within_bounds(
    gateway_factory: GatewayFactory,
    upstream: TestServer,
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """8,000 pipelined hits (720 KB, past the bound) whose entries are read from Redis
    (slowly here): every one answered, in order, and never more than HELD_MAX held by
    the connection while reads are in flight (aiohttp's way takes what is pipelined past
    LOOKUP_REST_MAX)."""
    client, port = await fast_gateway(gateway_factory, upstream, redis_url, near_cache=False)
    (stored,) = await exchange(port, request_bytes(PAGES[0]))
    pipeline = client.app[UPSTREAMS].current.pipeline
    read = pipeline.stored_fresh

    async def slow(key: CacheKey) -> StoredRead:
        await asyncio.sleep(0.002)  # a loaded or distant Redis
        return await read(key)

    monkeypatch.setattr(pipeline, "stored_fresh", slow)
    held = [0]
    received = GatewayConnection.data_received

    def watched(self: GatewayConnection, data: bytes) -> None:
        received(self, data)
        held[0] = max(held[0], len(self._read_meanwhile))

    monkeypatch.setattr(GatewayConnection, "data_received", watched)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    count, chunk = 8_000, 40

    async def send() -> None:
        for _ in range(count // chunk):  # in pieces, as a busy client's writes arrive
            writer.write(request_bytes(PAGES[0]) * chunk)
            await asyncio.sleep(0)

    sending = asyncio.ensure_future(send())
    try:
        async with asyncio.timeout(120):
            for _ in range(count):
                answer = await read_answer(reader)
                assert answer.body == stored.body
    finally:
        await sending
        writer.close()
        await writer.wait_closed()
    assert held[0] <= HELD_MAX + 64 * 1024  # one read of the socket past the bound
    assert held[0] >= HELD_MAX // 2  # the pipeline was long enough to press on the bound


async def reading_from_frozen_redis(
    gateway_factory: GatewayFactory,
    upstream: TestServer,
    own_redis: RedisServer,
    server: dict[str, Any],
) -> tuple[Client, Answer, asyncio.StreamReader, asyncio.StreamWriter]:
    """A gateway (``server`` settings, near cache off) with an entry stored in Redis,
    then Redis frozen and a request for the entry sent on a new connection: the
    gateway, the stored answer, and the connection. The caller thaws Redis."""
    client = await gateway_factory(
        base_url(upstream), server=server, cache=redis_cache(own_redis.url, near_cache=False)
    )
    port = client.port
    assert port is not None
    (stored,) = await exchange(port, request_bytes(PAGES[0]))
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    own_redis.freeze()
    writer.write(request_bytes(PAGES[0]))
    return client, stored, reader, writer


async def test_a_graceful_stop_answers_a_request_whose_entry_is_being_read(
    gateway_factory: GatewayFactory, upstream: TestServer, own_redis: RedisServer
) -> None:
    """The server stops while a request waits for its entry from Redis: the request is
    answered (aiohttp takes such a connection for idle and would close it unanswered)."""
    client, stored, reader, writer = await reading_from_frozen_redis(
        gateway_factory, upstream, own_redis, FAST
    )
    try:
        await asyncio.sleep(0.1)  # its read waits for Redis
        runner = client.server.runner
        server = None if runner is None else runner.server
        assert server is not None
        stopping = asyncio.ensure_future(server.shutdown(5))
        await asyncio.sleep(0.1)
    finally:
        own_redis.thaw()
    async with asyncio.timeout(10):
        answer = await read_answer(reader)
        await stopping
    assert answer.status_line == "HTTP/1.1 200 OK"
    assert answer.body == stored.body
    writer.close()


async def test_a_request_whose_entry_is_being_read_keeps_its_connection_alive(
    gateway_factory: GatewayFactory, upstream: TestServer, own_redis: RedisServer
) -> None:
    """A connection's keep-alive time runs out while its request waits for Redis: the
    request is answered and the connection kept (it is not idle)."""
    _, stored, reader, writer = await reading_from_frozen_redis(
        gateway_factory, upstream, own_redis, {**FAST, "keepalive_timeout_s": 0.3}
    )
    try:
        await asyncio.sleep(0.8)  # past the keep-alive time, its read still waiting
    finally:
        own_redis.thaw()
    async with asyncio.timeout(10):
        answer = await read_answer(reader)
    assert answer.body == stored.body
    writer.write(request_bytes(PAGES[0]))
    async with asyncio.timeout(10):
        assert (await read_answer(reader)).body == stored.body
    writer.close()
