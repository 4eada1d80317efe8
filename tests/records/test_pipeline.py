"""Caching end to end: the gateway, the reference upstream and a real redis-server."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
import redis.asyncio as redis
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from pytest_aiohttp import AiohttpServer

from gateway.cache.keyspace import generation_key
from gateway.cache.memory import MemoryBackend
from gateway.demo import REQUEST_LOG, RequestLog, create_demo_app
from gateway.errors import CacheUnavailable
from gateway.http.binding import UPSTREAMS
from gateway.ops.circuit import CircuitState
from gateway.records.credentials import Credentials
from gateway.records.pipeline import StoredRead
from gateway.records.routes import parse_record_query
from gateway.routing.standard import USERS

from ..conftest import (
    AUTH,
    KEPT,
    REVOKED,
    TOKEN,
    FakeClock,
    Gatekeeper,
    GatewayFactory,
    base_url,
    redis_cache,
    token_upstream,
    until,
)
from ..redis_server import RedisServer

Client = TestClient[web.Request, web.Application]
SECRET = "test-key-secret-0123456789"
ADMIN = "admin-token-0123456789abcdef"


@pytest.fixture
async def cached(
    gateway_factory: GatewayFactory, upstream: TestServer, redis_url: str, clock: FakeClock
) -> Client:
    return await gateway_factory(
        base_url(upstream), clock=clock, cache=redis_cache(redis_url), admin={"token": ADMIN}
    )


async def get(client: Client, path: str, **headers: str) -> tuple[int, bytes, Any]:
    response = await client.get(path, headers={**AUTH, **headers})
    return response.status, await response.read(), response.headers


async def get_identity(client: Client, path: str, **headers: str) -> tuple[int, bytes, Any]:
    """GET ``path`` without the Accept-Encoding aiohttp's client sends by itself (a head
    with one is not the fast path's to answer)."""
    skip = ("Accept-Encoding",)
    response = await client.get(path, headers={**AUTH, **headers}, skip_auto_headers=skip)
    return response.status, await response.read(), response.headers


async def test_miss_then_hit(cached: Client, upstream_log: RequestLog) -> None:
    status, body, headers = await get(cached, "/users")
    assert status == 200
    assert headers["X-Cache"] == "MISS"
    assert headers["Cache-Status"] == "records-gateway; fwd=miss; stored"
    assert headers["Cache-Control"] == "private, max-age=300"
    assert headers["Age"] == "0"
    etag = headers["ETag"]
    status, again, headers = await get(cached, "/users")
    assert status == 200
    assert again == body
    assert headers["X-Cache"] == "HIT"
    assert headers["Cache-Status"] == "records-gateway; hit; ttl=300"
    assert headers["ETag"] == etag
    assert len(upstream_log) == 1


async def test_age_and_remaining_ttl_follow_the_clock(cached: Client, clock: FakeClock) -> None:
    await get(cached, "/expenses")
    clock.advance(12)
    _, _, headers = await get(cached, "/expenses")
    assert headers["Age"] == "12"
    assert headers["Cache-Control"] == "private, max-age=18"
    assert headers["Cache-Status"] == "records-gateway; hit; ttl=18"


async def test_one_key_for_equivalent_queries(cached: Client, upstream_log: RequestLog) -> None:
    for path in ("/users", "/users?page=1", "/users?limit=10&page=1", "/users?page=1&limit=10"):
        assert (await get(cached, path))[0] == 200
    assert len(upstream_log) == 1


async def test_if_none_match_gets_304_on_miss_and_hit(cached: Client) -> None:
    _, _, headers = await get(cached, "/accounts")
    etag = headers["ETag"]
    status, body, headers = await get(cached, "/accounts", **{"If-None-Match": etag})
    assert status == 304
    assert body == b""
    assert headers["ETag"] == etag
    assert headers["X-Cache"] == "HIT"
    status, _, _ = await get(cached, "/accounts", **{"If-None-Match": f'W/{etag}, "other"'})
    assert status == 304
    status, body, _ = await get(cached, "/accounts", **{"If-None-Match": '"other"'})
    assert status == 200
    assert body


async def test_ttl_per_route_and_expiry(
    gateway_factory: GatewayFactory,
    upstream: TestServer,
    upstream_log: RequestLog,
    redis_url: str,
    clock: FakeClock,
) -> None:
    client = await gateway_factory(
        base_url(upstream),
        clock=clock,
        cache=redis_cache(
            redis_url,
            stale_while_revalidate_s=0,
            stale_if_error_s=0,
            ttl_s={"expenses": 5, "users": 100, "clients": 0},
        ),
    )
    for path in ("/expenses", "/users", "/clients"):
        await get(client, path)
    clock.advance(6)
    assert (await get(client, "/users"))[2]["X-Cache"] == "HIT"
    assert (await get(client, "/expenses"))[2]["X-Cache"] == "MISS"
    _, _, headers = await get(client, "/clients")
    assert headers["X-Cache"] == "BYPASS"
    assert headers["Cache-Status"] == "records-gateway; fwd=bypass"
    assert [r.path for r in upstream_log.entries] == [
        "/expenses",
        "/users",
        "/clients",
        "/expenses",
        "/clients",
    ]


async def test_stale_while_revalidate_serves_at_once_and_refreshes_once(
    gateway_factory: GatewayFactory,
    aiohttp_server: AiohttpServer,
    redis_url: str,
    clock: FakeClock,
) -> None:
    slow = await aiohttp_server(create_demo_app(latency_ms=100))
    log = slow.app[REQUEST_LOG]
    client = await gateway_factory(base_url(slow), clock=clock, cache=redis_cache(redis_url))
    _, first, _ = await get(client, "/expenses")
    clock.advance(35)  # ttl 30, within the 30 s window
    replies = await asyncio.gather(*(get(client, "/expenses") for _ in range(20)))
    assert {r[2]["X-Cache"] for r in replies} == {"STALE"}
    assert {r[2]["Cache-Status"] for r in replies} == {"records-gateway; hit; ttl=-5"}
    assert all(r[1] == first for r in replies)
    pipeline = client.app[UPSTREAMS].current.pipeline
    async with asyncio.timeout(10):  # the refresh runs in the background
        while len(log) < 2 or pipeline.in_flight:
            await asyncio.sleep(0.01)
    assert len(log) == 2
    _, _, headers = await get(client, "/expenses")
    assert headers["X-Cache"] == "HIT"
    assert headers["Age"] == "0"


async def test_stale_if_error_with_the_upstream_stopped(
    gateway_factory: GatewayFactory, aiohttp_server: AiohttpServer, redis_url: str, clock: FakeClock
) -> None:
    server = await aiohttp_server(create_demo_app())
    client = await gateway_factory(base_url(server), clock=clock, cache=redis_cache(redis_url))
    _, body, _ = await get(client, "/accounts")
    await server.close()
    clock.advance(60 + 31 + 100)  # past the ttl and the revalidate window, inside 600 s
    status, stale, headers = await get(client, "/accounts")
    assert status == 200
    assert stale == body
    assert headers["X-Cache"] == "STALE"
    assert headers["Cache-Status"] == "records-gateway; fwd=stale"
    clock.advance(600)
    status, problem, _ = await get(client, "/accounts")
    assert status == 502
    assert b"cannot connect to the upstream" in problem


async def test_stale_if_error_reports_the_upstream_status(
    gateway_factory: GatewayFactory, aiohttp_server: AiohttpServer, redis_url: str, clock: FakeClock
) -> None:
    failing = False

    async def users(request: web.Request) -> web.Response:
        if failing:
            return web.Response(status=503)
        return web.json_response({"data": [], "total": 0, "page": 1, "limit": 10})

    app = web.Application()
    app.router.add_get("/users", users)
    server = await aiohttp_server(app)
    client = await gateway_factory(base_url(server), clock=clock, cache=redis_cache(redis_url))
    await get(client, "/users")
    failing = True
    clock.advance(400)
    status, _, headers = await get(client, "/users")
    assert status == 200
    assert headers["Cache-Status"] == "records-gateway; fwd=stale; fwd-status=503"


async def test_client_no_cache_and_no_store(cached: Client, upstream_log: RequestLog) -> None:
    await get(cached, "/clients")
    _, _, headers = await get(cached, "/clients", **{"Cache-Control": "no-cache"})
    assert headers["X-Cache"] == "BYPASS"
    assert headers["Cache-Status"] == "records-gateway; fwd=request; stored"
    assert len(upstream_log) == 2
    _, _, headers = await get(cached, "/clients")
    assert headers["X-Cache"] == "HIT"
    _, _, headers = await get(cached, "/clients?page=2", **{"Cache-Control": "no-store"})
    assert headers["X-Cache"] == "BYPASS"
    assert headers["Cache-Status"] == "records-gateway; fwd=request"
    _, _, headers = await get(cached, "/clients?page=2")
    assert headers["X-Cache"] == "MISS"
    assert len(upstream_log) == 4


async def test_no_cache_can_be_ignored_by_config(
    gateway_factory: GatewayFactory, upstream: TestServer, upstream_log: RequestLog, redis_url: str
) -> None:
    client = await gateway_factory(
        base_url(upstream), cache=redis_cache(redis_url, honor_client_no_cache=False)
    )
    await get(client, "/users")
    _, _, headers = await get(client, "/users", **{"Cache-Control": "no-cache"})
    assert headers["X-Cache"] == "HIT"
    assert len(upstream_log) == 1


async def test_tokens_never_see_each_others_entries(
    gateway_factory: GatewayFactory, aiohttp_server: AiohttpServer, redis_url: str
) -> None:
    tokens = [f"token-{n}-secret" for n in range(4)]
    server = await aiohttp_server(token_upstream(tokens))
    client = await gateway_factory(base_url(server), cache=redis_cache(redis_url))

    async def read(token: str) -> tuple[str, str]:
        response = await client.get("/users", headers={"Authorization": f"Bearer {token}"})
        body = await response.json()
        return token, body["data"][0]["username"]

    results = await asyncio.gather(*(read(tokens[n % 4]) for n in range(40)))
    assert all(username == f"user-{tokens.index(token)}" for token, username in results)

    store = redis.Redis.from_url(redis_url)
    keys = [key async for key in store.scan_iter("*", count=1000)]
    assert len([key for key in keys if b":e:" in key]) == 4  # and the purge generations
    assert any(b":r}:" in key for key in keys)  # and the records they hold
    for key in keys:
        value: Any
        kind = await store.type(key)
        if kind == b"hash":  # the fleet's announcements
            value = repr(await store.hgetall(key)).encode()
        elif kind == b"zset":  # the entries that hold a record (docs/purging.md)
            members: list[bytes] = await store.zrange(key, 0, -1)  # type: ignore[assignment]
            value = b"\n".join(members)
        else:
            value = await store.get(key)
        assert value is not None
        for token in tokens:
            assert token.encode() not in key
            assert token.encode() not in value
    await store.aclose()


async def test_cold_key_under_100_concurrent_requests_makes_one_upstream_call(
    gateway_factory: GatewayFactory, aiohttp_server: AiohttpServer, redis_url: str
) -> None:
    slow = await aiohttp_server(create_demo_app(latency_ms=200))
    client = await gateway_factory(base_url(slow), cache=redis_cache(redis_url))
    replies = await asyncio.gather(*(get(client, "/expenses?limit=5") for _ in range(100)))
    assert {r[0] for r in replies} == {200}
    assert len({r[1] for r in replies}) == 1
    assert [r.path for r in slow.app[REQUEST_LOG].entries] == ["/expenses"]


async def test_negative_entries_for_unknown_records(
    gateway_factory: GatewayFactory, upstream: TestServer, upstream_log: RequestLog, redis_url: str
) -> None:
    client = await gateway_factory(
        base_url(upstream), cache=redis_cache(redis_url, negative_ttl_s=60)
    )
    path = "/expenses/00000000-0000-4000-8000-000000000000"
    for _ in range(3):
        status, body, headers = await get(client, path)
        assert status == 404
        assert headers["Content-Type"] == "application/problem+json"
        assert b"Record not found" in body
    assert len(upstream_log) == 1


@pytest.mark.parametrize("fault", ["stopped", "frozen"])
async def test_redis_faults_never_fail_a_request(
    gateway_factory: GatewayFactory,
    upstream: TestServer,
    upstream_log: RequestLog,
    own_redis: RedisServer,
    fault: str,
) -> None:
    client = await gateway_factory(
        base_url(upstream),
        cache=redis_cache(own_redis.url, redis_timeout_ms=50, near_cache=False),
    )
    assert (await get(client, "/users"))[2]["X-Cache"] == "MISS"
    assert (await get(client, "/users"))[2]["X-Cache"] == "HIT"
    if fault == "stopped":
        own_redis.stop()
    else:
        own_redis.freeze()

    # Concurrent requests while the fault is fresh: each is answered from the upstream.
    replies = await asyncio.gather(*(get(client, f"/users?page={n % 3 + 1}") for n in range(30)))
    assert {status for status, _, _ in replies} == {200}
    assert {headers["X-Cache"] for _, _, headers in replies} == {"MISS"}
    assert sorted(orjson.loads(body)["page"] for _, body, _ in replies) == sorted(
        n % 3 + 1 for n in range(30)
    )
    assert {r.query[0] for r in list(upstream_log.entries)[1:]} == {
        ("page", "1"),
        ("page", "2"),
        ("page", "3"),
    }
    # The breaker opened: later requests do not even try the dead cache (no request
    # waits on it), and the failures were counted.
    cache = client.app[UPSTREAMS].current.cache
    assert cache.breaker.state is CircuitState.OPEN
    failures = cache.errors
    assert failures >= 5
    for page in (4, 5, 6):
        status, _, headers = await get(client, f"/users?page={page}")
        assert status == 200
        assert headers["Cache-Status"] == "records-gateway; fwd=miss; detail=cache-unavailable"
    assert cache.errors == failures
    own_redis.thaw()


async def test_purges_are_seen_by_a_second_instance(
    gateway_factory: GatewayFactory, upstream: TestServer, upstream_log: RequestLog, redis_url: str
) -> None:
    first = await gateway_factory(
        base_url(upstream), cache=redis_cache(redis_url), admin={"token": ADMIN}
    )
    second = await gateway_factory(base_url(upstream), cache=redis_cache(redis_url))
    for path in ("/users", "/expenses"):
        assert (await get(first, path))[2]["X-Cache"] == "MISS"
        assert (await get(second, path))[2]["X-Cache"] == "HIT"

    response = await first.delete(
        "/admin/cache?route=expenses", headers={"Authorization": f"Bearer {ADMIN}"}
    )
    assert response.status == 200
    assert await response.json() == {
        "purged": "expenses",
        "backend": "redis",
        "instances": {"told": 2, "confirmed": 2},
    }
    assert (await get(second, "/users"))[2]["X-Cache"] == "HIT"
    assert (await get(second, "/expenses"))[2]["X-Cache"] == "MISS"

    response = await first.delete("/admin/cache", headers={"Authorization": f"Bearer {ADMIN}"})
    assert await response.json() == {
        "purged": "all",
        "backend": "redis",
        "instances": {"told": 2, "confirmed": 2},
    }
    assert (await get(second, "/users"))[2]["X-Cache"] == "MISS"
    assert (await get(second, "/expenses"))[2]["X-Cache"] == "MISS"
    assert (await get(first, "/expenses"))[2]["X-Cache"] == "HIT"  # stored after the purge


@pytest.mark.parametrize(
    "authorization", [None, "Bearer wrong-admin-token-000000", f"Basic {ADMIN}", "Bearer "]
)
async def test_admin_routes_refuse_without_the_admin_token(
    cached: Client, authorization: str | None
) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    response = await cached.delete("/admin/cache", headers=headers)
    body = await response.json(content_type=None)
    assert response.status == 401
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert body["title"] == "Authentication required"


async def test_admin_routes_are_absent_without_an_admin_token(gateway: Client) -> None:
    response = await gateway.delete("/admin/cache", headers={"Authorization": f"Bearer {ADMIN}"})
    assert response.status == 404


async def test_admin_purge_rejects_an_unknown_route(cached: Client) -> None:
    response = await cached.delete(
        "/admin/cache?route=payments", headers={"Authorization": f"Bearer {ADMIN}"}
    )
    body = await response.json(content_type=None)
    assert response.status == 400
    assert body["errors"][0]["parameter"] == "route"


async def test_memory_and_none_backends(
    gateway_factory: GatewayFactory, upstream: TestServer, upstream_log: RequestLog
) -> None:
    memory = await gateway_factory(base_url(upstream), cache={"backend": "memory"})
    await get(memory, "/users")
    assert (await get(memory, "/users"))[2]["X-Cache"] == "HIT"
    none = await gateway_factory(base_url(upstream), cache={"backend": "none"})
    _, _, headers = await get(none, "/users")
    assert headers["X-Cache"] == "BYPASS"
    assert headers["Cache-Status"] == "records-gateway; fwd=bypass"
    assert len(upstream_log) == 2


async def test_admin_token_that_is_not_utf8_is_a_401(cached: Client) -> None:
    assert cached.server.port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", cached.server.port)
    writer.write(
        b"DELETE /admin/cache HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\xfe\r\n"
        b"Connection: close\r\n\r\n"
    )
    await writer.drain()
    answer = await reader.read()
    writer.close()
    assert answer.startswith(b"HTTP/1.1 401 ")
    assert b"application/problem+json" in answer


async def test_a_purge_takes_one_route(cached: Client) -> None:
    response = await cached.delete(
        "/admin/cache?route=users&route=clients", headers={"Authorization": f"Bearer {ADMIN}"}
    )
    body = await response.json(content_type=None)
    assert response.status == 400
    assert body["errors"] == [
        {"parameter": "route", "message": "given more than once; purge one route"}
    ]


@pytest.mark.parametrize("garbage", ["not-a-number", "-1", str(2**64), "1e3"])
async def test_a_corrupt_purge_generation_is_a_cache_fault_not_a_500(
    gateway_factory: GatewayFactory, upstream: TestServer, redis_url: str, garbage: str
) -> None:
    """Held for docs/deployment.md, "Faults, and what callers see": a generation key deleted,
    evicted, or overwritten by hand.
    """
    client = await gateway_factory(
        base_url(upstream), cache=redis_cache(redis_url, near_cache=False)
    )
    assert (await get(client, "/users"))[0] == 200
    store = redis.Redis.from_url(redis_url, decode_responses=True)
    entries = [key async for key in store.scan_iter("*:e:*")]
    prefix = entries[0].split(":e:")[0]
    await store.set(generation_key(prefix, "users"), garbage)
    for _ in range(2):  # a miss that is stored would fail on the second
        status, _, headers = await get(client, "/users")
        assert status == 200
        assert headers["Cache-Status"] == "records-gateway; fwd=miss; detail=cache-unavailable"
    # a purge of the route writes a good generation again
    assert (await client.app[UPSTREAMS].current.cache.backend.purge("users")) is not None
    assert (await get(client, "/users"))[2]["Cache-Status"] == "records-gateway; fwd=miss; stored"
    await store.aclose()


@pytest.mark.parametrize("backend", ["memory", "redis"])
@pytest.mark.parametrize(
    ("path", "max_age"),
    [
        # a plain path: the fast path answers its hit from the bytes (gateway.fastpath)
        ("/expenses?limit=5&page=2", 22),
        # a path with escapes in the id: decoded as the router decodes it, either way
        ("/accounts/Caja%20chica%20Bogot%C3%A1", 52),
    ],
)
async def test_a_hit_answers_alike_by_the_short_and_the_full_way(
    gateway_factory: GatewayFactory,
    upstream: TestServer,
    redis_url: str,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
    backend: str,
    path: str,
    max_age: int,
    fast_path: bool,
) -> None:
    """A fresh hit held in the process is answered by the fast path from the bytes
    when it can (no pipeline read); a request with a Cache-Control the gateway ignores
    takes the route handler and the pipeline to the same entry. Both answers must be
    the same, header for header."""
    cache = {"backend": "memory"} if backend == "memory" else redis_cache(redis_url)
    client = await gateway_factory(base_url(upstream), clock=clock, cache=cache)
    backend_ = client.app[UPSTREAMS].current.cache.backend
    if backend == "redis":  # the near cache serves hits once its channel is live
        async with asyncio.timeout(10):
            while not backend_.near.live:  # type: ignore[attr-defined]
                await asyncio.sleep(0.01)
    pipeline = client.app[UPSTREAMS].current.pipeline
    full_reads = 0
    read = pipeline.read

    async def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal full_reads
        full_reads += 1
        return await read(*args, **kwargs)

    monkeypatch.setattr(pipeline, "read", counted)
    assert (await get_identity(client, path))[2]["X-Cache"] == "MISS"
    assert full_reads == 1
    clock.advance(7.5)
    # the short way: from the bytes with the fast path, by the gateway's server without
    short_status, short_body, short = await get_identity(client, path)
    assert full_reads == 1, "the hit took the short way"
    reads = full_reads
    full_status, full_body, full = await get_identity(
        client, path, **{"Cache-Control": "max-age=60"}
    )
    assert full_reads == reads + 1, "the hit took the full way"

    def comparable(headers: Any) -> dict[str, str]:
        return {k: v for k, v in headers.items() if k not in ("X-Request-ID", "Date")}

    assert (short_status, short_body) == (full_status, full_body)
    assert short_status == 200
    assert comparable(short) == comparable(full)
    assert short["X-Cache"] == "HIT"
    assert short["Age"] == "7"
    assert short["Cache-Control"] == f"private, max-age={max_age}"
    assert short["Cache-Status"] == f"records-gateway; hit; ttl={max_age}"
    assert short["X-Request-ID"] != full["X-Request-ID"]
    # a caller's request id is echoed on the short way too, and a 304 is answered there
    status, body, headers = await get_identity(
        client, path, **{"X-Request-ID": "abc-123", "If-None-Match": short["ETag"]}
    )
    assert (status, body, headers["X-Request-ID"]) == (304, b"", "abc-123")
    assert "Content-Type" not in headers


class ReadsThatOutliveAFill(MemoryBackend):
    """A memory backend whose next read answers what it found at once, but returns only
    when ``release`` is set: a Redis read that is still on its way while a fill ends."""

    def __init__(self, clock: Any) -> None:
        super().__init__(max_bytes=16 * 1024 * 1024, clock=clock)
        self.release: asyncio.Event | None = None
        self.reading = asyncio.Event()

    def read_held(self, key: Any) -> Any:
        return None  # a read on its way is get's

    async def get(self, key: Any) -> Any:
        lookup = await super().get(key)
        release, self.release = self.release, None
        if release is not None:
            self.reading.set()
            await release.wait()
        return lookup


async def test_a_read_that_returns_after_a_fill_ended_makes_no_second_call(
    gateway_factory: GatewayFactory, upstream: TestServer, upstream_log: RequestLog
) -> None:
    client = await gateway_factory(base_url(upstream))
    backend = ReadsThatOutliveAFill(client.app[UPSTREAMS].current.pipeline.clock)
    client.app[UPSTREAMS].current.cache.backend = backend
    release = backend.release = asyncio.Event()
    late = asyncio.ensure_future(get(client, "/users"))
    await backend.reading.wait()  # its read found nothing and is still on its way
    status, body, headers = await get(client, "/users")
    assert (status, headers["X-Cache"]) == (200, "MISS")
    assert len(upstream_log) == 1
    release.set()  # the late read returns "no entry" after the fill ended
    late_status, late_body, late_headers = await late
    assert (late_status, late_body) == (200, body)
    assert late_headers["X-Cache"] == "MISS"
    assert len(upstream_log) == 1


async def test_a_held_read_made_before_a_fill_ended_is_not_taken(
    gateway_factory: GatewayFactory, upstream: TestServer, upstream_log: RequestLog
) -> None:
    """The fast path reads the memory backend when a head arrives; the handler runs
    later. A fill of the key that ends in between leaves that read behind: the handler
    reads again and serves the filled entry, with no second upstream call."""
    client = await gateway_factory(base_url(upstream))
    pipeline = client.app[UPSTREAMS].current.pipeline
    query = parse_record_query(USERS, None, [], max_limit=100)
    credentials = Credentials(authorization=AUTH["Authorization"], token=TOKEN)
    key = pipeline.keyer.key(query, credentials)
    before = pipeline.held(key)
    assert isinstance(before, StoredRead)
    assert before.lookup is not None
    assert before.lookup.entry is None
    filled = await pipeline.read(query, credentials, "the-fill", key=key)
    assert filled.x_cache == "MISS"
    assert len(upstream_log) == 1
    late = await pipeline.read(query, credentials, "the-late", key=key, prior=before)
    assert (late.x_cache, late.body) == ("HIT", filled.body)
    assert len(upstream_log) == 1


class ReadsThatFailOnDemand(MemoryBackend):
    """A memory backend whose next read fails, as a Redis read that timed out: its
    ``read_held`` answers None, so its reads are ``get``'s (docs/cache-backends.md,
    "Adding a cache backend")."""

    def __init__(self, clock: Any) -> None:
        super().__init__(max_bytes=16 * 1024 * 1024, clock=clock)
        self.fail_next = False

    def read_held(self, key: Any) -> Any:
        return None  # a read that may fail is get's

    async def get(self, key: Any) -> Any:
        if self.fail_next:
            self.fail_next = False
            raise CacheUnavailable("redis GET: no answer within 50 ms")
        return await super().get(key)


async def test_a_request_whose_cache_read_failed_joins_the_fill_in_flight(
    gateway_factory: GatewayFactory, aiohttp_server: AiohttpServer
) -> None:
    """A cold burst where some reads fail (a loaded Redis) still makes one call."""
    slow = await aiohttp_server(create_demo_app(latency_ms=300))
    client = await gateway_factory(base_url(slow))
    backend = ReadsThatFailOnDemand(client.app[UPSTREAMS].current.pipeline.clock)
    client.app[UPSTREAMS].current.cache.backend = backend
    first = asyncio.ensure_future(get(client, "/users"))
    await until(lambda: len(slow.app[REQUEST_LOG]) == 1)  # its fill is calling the upstream
    backend.fail_next = True
    status, body, headers = await get(client, "/users")
    assert status == 200
    assert headers["Cache-Status"] == "records-gateway; fwd=miss; detail=cache-unavailable"
    assert (await first)[1] == body
    assert len(slow.app[REQUEST_LOG]) == 1


# A caller the upstream refuses is refused (docs/caching.md, "A token the upstream
# refuses"): a 401 or 403 for a token drops that token's entry for the key, a 404 drops
# it as gone; stale answers are
# for outages only (5xx, timeouts, refused connections, an open circuit).


def as_caller(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def read_as(client: Client, token: str, path: str, **headers: str) -> tuple[int, Any]:
    response = await client.get(path, headers={**as_caller(token), **headers})
    await response.read()
    return response.status, response.headers


def refusing_cache(backend: str, redis_url: str, **extra: Any) -> dict[str, Any]:
    """Short TTLs and the default stale windows, on ``backend``."""
    windows = {"ttl_s": {"users": 2, "account": 2}, "stale_while_revalidate_s": 30, **extra}
    if backend == "redis":
        return redis_cache(redis_url, **windows)
    return {"backend": "memory", **windows}


async def refreshes_done(client: Client) -> None:
    pipeline = client.app[UPSTREAMS].current.pipeline
    await until(lambda: not pipeline.in_flight)


@pytest.mark.parametrize("backend", ["memory", "redis"])
@pytest.mark.parametrize("refusal", [401, 403])
async def test_a_refusal_seen_by_a_background_refresh_is_the_next_answer(
    gateway_factory: GatewayFactory,
    aiohttp_server: AiohttpServer,
    redis_url: str,
    clock: FakeClock,
    backend: str,
    refusal: int,
) -> None:
    gatekeeper = Gatekeeper()
    server = await aiohttp_server(gatekeeper.app)
    client = await gateway_factory(
        base_url(server),
        clock=clock,
        cache=refusing_cache(backend, redis_url),
        # one failure would open the circuit: a refusal must not count as one
        upstream={"breaker_failures": 1},
    )
    for token in (KEPT, REVOKED):
        assert (await read_as(client, token, "/users"))[0] == 200
    clock.advance(3)  # past the TTL, inside stale_while_revalidate_s
    gatekeeper.verdicts[REVOKED] = refusal

    status, headers = await read_as(client, REVOKED, "/users")
    assert (status, headers["X-Cache"]) == (200, "STALE")  # answered before the refresh
    await refreshes_done(client)
    assert gatekeeper.count(REVOKED) == 2  # the fill and the refused refresh

    for _ in range(3):
        status, headers = await read_as(client, REVOKED, "/users")
        assert status == refusal
        assert headers["Content-Type"] == "application/problem+json"
    assert gatekeeper.count(REVOKED) == 5  # each asked the upstream: nothing cached

    # the other caller's entry is untouched, and the circuit stayed closed
    status, headers = await read_as(client, KEPT, "/users")
    assert (status, headers["X-Cache"]) == (200, "STALE")
    assert headers["Cache-Status"] == "records-gateway; hit; ttl=-1"
    await refreshes_done(client)
    assert (await read_as(client, KEPT, "/users"))[1]["X-Cache"] == "HIT"
    assert gatekeeper.count(KEPT) == 2


@pytest.mark.parametrize("backend", ["memory", "redis"])
@pytest.mark.parametrize("refusal", [401, 403, 404])
async def test_a_refusal_in_the_stale_if_error_window_is_answered_and_drops_the_entry(
    gateway_factory: GatewayFactory,
    aiohttp_server: AiohttpServer,
    redis_url: str,
    clock: FakeClock,
    backend: str,
    refusal: int,
) -> None:
    gatekeeper = Gatekeeper()
    server = await aiohttp_server(gatekeeper.app)
    client = await gateway_factory(
        base_url(server), clock=clock, cache=refusing_cache(backend, redis_url)
    )
    for token in (KEPT, REVOKED):
        assert (await read_as(client, token, "/users"))[0] == 200
    clock.advance(2 + 31)  # past the TTL and stale_while_revalidate_s
    gatekeeper.verdicts[REVOKED] = refusal

    # concurrent callers of the refused token share one upstream call and its refusal
    replies = await asyncio.gather(*(read_as(client, REVOKED, "/users") for _ in range(10)))
    assert {status for status, _ in replies} == {refusal}
    assert gatekeeper.count(REVOKED) == 2

    # once the upstream is down, the refused token has no stale answer left; the other has
    gatekeeper.verdicts = {REVOKED: 503, KEPT: 503}
    status, _ = await read_as(client, REVOKED, "/users")
    assert status == 502
    status, headers = await read_as(client, KEPT, "/users")
    assert (status, headers["Cache-Status"]) == (200, "records-gateway; fwd=stale; fwd-status=503")


@pytest.mark.parametrize("backend", ["memory", "redis"])
@pytest.mark.parametrize("negative_ttl_s", [0, 60])
async def test_a_record_gone_upstream_is_a_404_not_a_stale_answer(
    gateway_factory: GatewayFactory,
    aiohttp_server: AiohttpServer,
    redis_url: str,
    clock: FakeClock,
    backend: str,
    negative_ttl_s: int,
) -> None:
    gatekeeper = Gatekeeper()
    server = await aiohttp_server(gatekeeper.app)
    client = await gateway_factory(
        base_url(server),
        clock=clock,
        cache=refusing_cache(backend, redis_url, negative_ttl_s=negative_ttl_s),
    )
    path = "/accounts/ACC-001"
    for token in (KEPT, REVOKED):
        assert (await read_as(client, token, path))[0] == 200
    clock.advance(3)
    gatekeeper.verdicts[REVOKED] = 404

    assert (await read_as(client, REVOKED, path))[1]["X-Cache"] == "STALE"
    await refreshes_done(client)
    status, headers = await read_as(client, REVOKED, path)
    assert status == 404
    assert headers["Content-Type"] == "application/problem+json"
    # a negative entry (cache.negative_ttl_s) answers the next ones; else the upstream
    assert (await read_as(client, REVOKED, path))[0] == 404
    assert gatekeeper.count(REVOKED) == (2 if negative_ttl_s else 4)
    assert (await read_as(client, KEPT, path))[1]["X-Cache"] == "STALE"


@pytest.mark.parametrize("backend", ["memory", "redis"])
@pytest.mark.parametrize("outage", [503, "slow"])
async def test_an_outage_seen_by_a_background_refresh_keeps_the_stale_answer(
    gateway_factory: GatewayFactory,
    aiohttp_server: AiohttpServer,
    redis_url: str,
    clock: FakeClock,
    backend: str,
    outage: int | str,
) -> None:
    gatekeeper = Gatekeeper()
    server = await aiohttp_server(gatekeeper.app)
    client = await gateway_factory(
        base_url(server),
        clock=clock,
        cache=refusing_cache(backend, redis_url),
        upstream={"timeout_s": 1.0, "breaker_failures": 100},
    )
    assert (await read_as(client, KEPT, "/users"))[0] == 200
    clock.advance(3)
    gatekeeper.verdicts[KEPT] = outage

    assert (await read_as(client, KEPT, "/users"))[1]["X-Cache"] == "STALE"
    await refreshes_done(client)
    assert gatekeeper.count(KEPT) == 2
    status, headers = await read_as(client, KEPT, "/users")
    assert (status, headers["X-Cache"]) == (200, "STALE")
    await refreshes_done(client)
    clock.advance(30)  # past stale_while_revalidate_s: served instead of the failure
    status, headers = await read_as(client, KEPT, "/users")
    assert (status, headers["X-Cache"]) == (200, "STALE")
    assert headers["Cache-Status"].startswith("records-gateway; fwd=stale")


@pytest.mark.parametrize("backend", ["memory", "redis"])
async def test_a_rate_limit_leaves_the_entry_and_is_answered_past_the_revalidate_window(
    gateway_factory: GatewayFactory,
    aiohttp_server: AiohttpServer,
    redis_url: str,
    clock: FakeClock,
    backend: str,
) -> None:
    gatekeeper = Gatekeeper()
    server = await aiohttp_server(gatekeeper.app)
    client = await gateway_factory(
        base_url(server), clock=clock, cache=refusing_cache(backend, redis_url)
    )
    assert (await read_as(client, KEPT, "/users"))[0] == 200
    clock.advance(3)
    gatekeeper.verdicts[KEPT] = 429

    assert (await read_as(client, KEPT, "/users"))[1]["X-Cache"] == "STALE"
    await refreshes_done(client)
    assert (await read_as(client, KEPT, "/users"))[1]["X-Cache"] == "STALE"  # kept
    await refreshes_done(client)
    clock.advance(30)  # a 429 is no outage: answered, not served stale
    assert (await read_as(client, KEPT, "/users"))[0] == 429
    gatekeeper.verdicts[KEPT] = 503  # and the entry is still there for an outage
    status, headers = await read_as(client, KEPT, "/users")
    assert (status, headers["Cache-Status"]) == (200, "records-gateway; fwd=stale; fwd-status=503")
    assert gatekeeper.count(KEPT) == 5


@pytest.mark.parametrize("backend", ["memory", "redis"])
@pytest.mark.parametrize("directive", ["no-cache", "no-store"])
async def test_a_refusal_of_a_fetch_past_a_fresh_entry_removes_it(
    gateway_factory: GatewayFactory,
    aiohttp_server: AiohttpServer,
    redis_url: str,
    clock: FakeClock,
    backend: str,
    directive: str,
) -> None:
    gatekeeper = Gatekeeper()
    server = await aiohttp_server(gatekeeper.app)
    client = await gateway_factory(
        base_url(server), clock=clock, cache=refusing_cache(backend, redis_url)
    )
    for token in (KEPT, REVOKED):
        assert (await read_as(client, token, "/users"))[0] == 200
    gatekeeper.verdicts[REVOKED] = 401
    assert (await read_as(client, REVOKED, "/users", **{"Cache-Control": directive}))[0] == 401
    assert (await read_as(client, REVOKED, "/users"))[0] == 401  # no fresh HIT left
    assert gatekeeper.count(REVOKED) == 3
    assert (await read_as(client, KEPT, "/users"))[1]["X-Cache"] == "HIT"


async def test_with_the_memory_backend_each_worker_removes_its_own_entry_on_its_refusal(
    gateway_factory: GatewayFactory,
    aiohttp_server: AiohttpServer,
    clock: FakeClock,
) -> None:
    """Two gateways with memory backends of their own, as two worker processes are."""
    gatekeeper = Gatekeeper()
    server = await aiohttp_server(gatekeeper.app)
    workers = [
        await gateway_factory(base_url(server), clock=clock, cache=refusing_cache("memory", ""))
        for _ in range(2)
    ]
    for worker in workers:
        assert (await read_as(worker, REVOKED, "/users"))[0] == 200
    clock.advance(3)
    gatekeeper.verdicts[REVOKED] = 401
    for worker in workers:
        assert (await read_as(worker, REVOKED, "/users"))[1]["X-Cache"] == "STALE"
        await refreshes_done(worker)
        assert (await read_as(worker, REVOKED, "/users"))[0] == 401
    assert gatekeeper.count(REVOKED) == 6
