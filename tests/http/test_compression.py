"""Answers compressed for callers that accept gzip, as a caller sees them on the wire:
the gateway and the reference upstream on loopback sockets, Redis a real redis-server,
answers read byte for byte from raw sockets (``test_wire.exchange``: no client that
decompresses or adds an Accept-Encoding of its own). Every test that serves a gateway
runs with the fast path and as plain aiohttp.

Entries are stored gzip once (tiny bodies identity), served as stored to callers that
accept gzip, decompressed for the others; every record reply says
``Vary: Accept-Encoding``; each representation has its own ETag, Content-Length and
304; problems are never compressed.
"""

from __future__ import annotations

import asyncio
import gzip
import struct
from collections.abc import AsyncIterator

import orjson
import pytest
import redis.asyncio as redis
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from pytest_aiohttp import AiohttpServer

from gateway.cache.coding import gzip_etag, stored_body
from gateway.cache.entry import GZIP, IDENTITY, CacheEntry, etag_of
from gateway.demo import REQUEST_LOG, RequestLog, create_demo_app
from gateway.http.binding import UPSTREAMS
from gateway.records import fill as fill_module

from ..conftest import FakeClock, GatewayFactory, base_url, redis_cache
from .test_wire import Answer, count_full_reads, exchange, request_bytes, upstream_calls

Client = TestClient[web.Request, web.Application]
ADMIN = "admin-token-0123456789abcdef"
EXPENSE_ID = "b1a6b1f1-620e-49d3-bb33-f3d8269cd696"
LIST = "/expenses?limit=10"
# one path of each route; an account's answer (about 230 bytes) is too short to compress
PATHS = {
    "users": "/users",
    "clients": "/clients",
    "expenses": LIST,
    "expense": f"/expenses/{EXPENSE_ID}",
    "accounts": "/accounts",
    "account": "/accounts/Caja%20chica%20Bogot%C3%A1",
}
STORED_GZIP = {route: route != "account" for route in PATHS}

# Accept-Encoding as sent (None: no field) and whether gzip is served
REPRESENTATIONS: list[tuple[str | None, bool]] = [
    (None, False),
    ("", False),
    ("gzip", True),
    ("GZIP", True),
    ("x-gzip", True),
    ("gzip, deflate", True),
    ("gzip, deflate, br, zstd", True),
    ("identity", False),
    ("deflate, br", False),
    ("*", True),
    ("gzip;q=0", False),
    ("gzip;q=0, *", False),
    ("identity;q=0", False),  # nothing acceptable: identity all the same, not a 406
    ("gzip;q=0, identity;q=0", False),
    ("*;q=0", False),
    ("gzip, identity;q=0", True),
    ("gzip;q=0.4, identity;q=0.5", False),
    ("identity;q=0.4, gzip;q=0.5", True),
    ("gzip;q=0.5, identity;q=0.5", True),
    ("gzip;q=2", False),  # malformed members are ignored
    ("gzip;level=9", False),
    (";;;,,,=", False),
    ("gzip;q=0.5;x, identity", False),
    ("br;q=0.5, " * 600 + "gzip", False),  # thousands of codings: the first ones are read
    ("gzip, " + "br;q=0.5, " * 600, True),
]


def port_of(client: Client) -> int:
    assert client.port is not None
    return client.port


def sent(accept_encoding: str | None, **headers: str) -> dict[str, str]:
    """The headers of a request with ``accept_encoding`` (None: no Accept-Encoding)."""
    if accept_encoding is not None:
        headers["Accept_Encoding"] = accept_encoding
    return headers


def gzip_request(path: str, **headers: str) -> bytes:
    return request_bytes(path, Accept_Encoding="gzip", **headers)


def identity_of(answer: Answer) -> bytes:
    """The identity body of ``answer``: decompressed once when it says gzip."""
    coding = answer.headers.get("content-encoding")
    if coding is None:
        return answer.body
    assert coding == "gzip"
    return gzip.decompress(answer.body)


def check_representation(answer: Answer, identity: bytes, identity_etag: str, gzip_: bool) -> None:
    """``answer`` is the representation it should be of the ``identity`` body: gzip
    (its own ETag, Content-Encoding and length) or identity."""
    headers = answer.headers
    assert answer.status_line == "HTTP/1.1 200 OK"
    assert headers["vary"] == "Accept-Encoding"
    assert headers["content-type"] == "application/json"
    assert int(headers["content-length"]) == len(answer.body)
    if gzip_:
        assert headers["content-encoding"] == "gzip"
        assert answer.body[:2] == b"\x1f\x8b"
        assert gzip.decompress(answer.body) == identity  # once: JSON, not gzip again
        assert headers["etag"] == identity_etag[:-1] + '-gzip"'
    else:
        assert "content-encoding" not in headers
        assert answer.body == identity
        assert headers["etag"] == identity_etag


@pytest.fixture
async def gateway_on(gateway_factory: GatewayFactory, upstream: TestServer) -> tuple[Client, int]:
    """A gateway with the memory backend and an admin token: its client and port."""
    client = await gateway_factory(base_url(upstream), admin={"token": ADMIN})
    return client, port_of(client)


@pytest.mark.parametrize("route", list(PATHS))
async def test_every_route_serves_each_caller_its_representation_of_one_entry(
    gateway_on: tuple[Client, int], upstream_log: RequestLog, route: str
) -> None:
    """One upstream call per route; then every way of writing Accept-Encoding gets the
    gzip or the identity representation of that one entry, byte for byte."""
    _, port = gateway_on
    path = PATHS[route]
    (miss,) = await exchange(port, request_bytes(path))
    assert miss.headers["x-cache"] == "MISS"
    identity, identity_etag = miss.body, miss.headers["etag"]
    assert identity_etag == etag_of(identity)
    orjson.loads(identity)
    check_representation(miss, identity, identity_etag, False)
    for accept_encoding, gzip_ in REPRESENTATIONS:
        (hit,) = await exchange(port, request_bytes(path, **sent(accept_encoding)))
        assert hit.headers["x-cache"] == "HIT", accept_encoding
        check_representation(hit, identity, identity_etag, gzip_ and STORED_GZIP[route])
    assert len(upstream_log) == 1


@pytest.mark.parametrize("backend", ["memory", "redis"])
async def test_a_miss_is_compressed_for_the_caller_that_accepts_gzip(
    gateway_factory: GatewayFactory,
    upstream: TestServer,
    upstream_log: RequestLog,
    redis_url: str,
    backend: str,
) -> None:
    """A gzip caller's miss, then hits of either representation (with Redis, from the
    near cache once it is live, else from Redis)."""
    cache = {"backend": "memory"} if backend == "memory" else redis_cache(redis_url)
    client = await gateway_factory(base_url(upstream), cache=cache)
    port = port_of(client)
    (miss,) = await exchange(port, gzip_request(LIST))
    assert miss.headers["x-cache"] == "MISS"
    identity = gzip.decompress(miss.body)
    check_representation(miss, identity, etag_of(identity), True)
    for request, gzip_ in ((request_bytes(LIST), False), (gzip_request(LIST), True)) * 2:
        (hit,) = await exchange(port, request)
        assert hit.headers["x-cache"] == "HIT"
        check_representation(hit, identity, etag_of(identity), gzip_)
    assert len(upstream_log) == 1


async def test_a_miss_shared_by_two_callers_is_one_upstream_call_in_two_representations(
    gateway_factory: GatewayFactory, aiohttp_server: AiohttpServer
) -> None:
    """A slow upstream and two callers of one cold key, one accepting gzip and one not:
    one upstream call, and each its own representation of the one answer."""
    slow = await aiohttp_server(create_demo_app(latency_ms=300))
    client = await gateway_factory(base_url(slow))
    port = port_of(client)
    zipped, plain = await asyncio.gather(
        exchange(port, gzip_request(LIST)), exchange(port, request_bytes(LIST))
    )
    assert len(slow.app[REQUEST_LOG]) == 1
    identity = plain[0].body
    for answer, gzip_ in ((zipped[0], True), (plain[0], False)):
        assert answer.headers["x-cache"] == "MISS"
        check_representation(answer, identity, etag_of(identity), gzip_)


async def test_if_none_match_is_compared_with_the_etag_of_the_representation_served(
    gateway_factory: GatewayFactory, upstream: TestServer
) -> None:
    """A 304 only for the ETag of the representation the request would get: the other
    representation's ETag gets a 200 with the body. On a miss as on a hit, each 304
    has the 200's Vary and ETag and no body, Content-Type or Content-Encoding."""
    client = await gateway_factory(base_url(upstream))
    port = port_of(client)
    (zipped,) = await exchange(port, gzip_request(LIST))
    (plain,) = await exchange(port, request_bytes(LIST))
    gzip_tag, identity_tag = zipped.headers["etag"], plain.headers["etag"]
    assert gzip_tag == gzip_etag(identity_tag) != identity_tag

    def not_modified(answer: Answer, etag: str, x_cache: str) -> None:
        assert answer.status_line == "HTTP/1.1 304 Not Modified"
        assert answer.body == b""
        assert answer.headers["etag"] == etag
        assert answer.headers["vary"] == "Accept-Encoding"
        assert answer.headers["x-cache"] == x_cache
        for field in ("content-type", "content-encoding", "content-length"):
            assert field not in answer.headers

    for request, etag in (
        (gzip_request(LIST, If_None_Match=gzip_tag), gzip_tag),
        (request_bytes(LIST, If_None_Match=identity_tag), identity_tag),
    ):
        cold = await gateway_factory(base_url(upstream))  # another process: a miss
        (answer,) = await exchange(port_of(cold), request)
        not_modified(answer, etag, "MISS")
    answers = await exchange(
        port,
        gzip_request(LIST, If_None_Match=gzip_tag),
        request_bytes(LIST, If_None_Match=identity_tag),
        gzip_request(LIST, If_None_Match=f'"other", W/{gzip_tag}'),
        request_bytes(LIST, If_None_Match=gzip_tag),  # the other representation's
        gzip_request(LIST, If_None_Match=identity_tag),
    )
    for answer, etag in zip(answers[:3], (gzip_tag, identity_tag, gzip_tag), strict=True):
        not_modified(answer, etag, "HIT")
    check_representation(answers[3], plain.body, identity_tag, False)
    check_representation(answers[4], plain.body, identity_tag, True)


@pytest.mark.parametrize("accept_encoding", [None, "gzip"])
async def test_head_has_exactly_the_headers_get_has_in_each_representation(
    gateway_factory: GatewayFactory,
    upstream: TestServer,
    clock: FakeClock,
    accept_encoding: str | None,
) -> None:
    """HEAD and GET, a miss (HEAD first) and a hit, at one moment: the same fields, the
    Content-Length of the representation's body, and no body after HEAD's head."""
    client = await gateway_factory(base_url(upstream), clock=clock)
    port = port_of(client)
    headers = sent(accept_encoding)
    (head_miss,) = await exchange(port, request_bytes(LIST, method="HEAD", **headers), head=True)
    (get,) = await exchange(port, request_bytes(LIST, **headers))
    (head_hit,) = await exchange(port, request_bytes(LIST, method="HEAD", **headers), head=True)
    assert head_miss.headers["x-cache"] == "MISS"
    assert get.headers["x-cache"] == head_hit.headers["x-cache"] == "HIT"
    assert head_hit.comparable() == get.comparable()
    assert {n: v for n, v in head_miss.comparable() if n not in ("x-cache", "cache-status")} == {
        n: v for n, v in get.comparable() if n not in ("x-cache", "cache-status")
    }
    assert int(head_hit.headers["content-length"]) == len(get.body) > 0
    assert get.headers.get("content-encoding") == accept_encoding


async def test_every_record_reply_says_vary_accept_encoding(
    gateway_factory: GatewayFactory, aiohttp_server: AiohttpServer, clock: FakeClock
) -> None:
    """Misses, hits, bypasses (no-cache, no-store, a route whose TTL is 0), stale
    answers (while revalidating, and instead of an upstream failure), each compressed
    for a gzip caller and not for another."""
    server = await aiohttp_server(create_demo_app())
    client = await gateway_factory(base_url(server), clock=clock, cache={"ttl_s": {"users": 0}})
    port = port_of(client)
    pipeline = client.app[UPSTREAMS].current.pipeline
    answered: list[tuple[Answer, str, bool]] = []  # the answer, its path, gzip or not

    async def ask(path: str, x_cache: str, *accept_encodings: str | None, **headers: str) -> None:
        for accept_encoding in accept_encodings:
            (answer,) = await exchange(
                port, request_bytes(path, **sent(accept_encoding, **headers))
            )
            assert answer.headers["x-cache"] == x_cache
            answered.append((answer, path, accept_encoding is not None))

    await ask(LIST, "MISS", None)
    await ask(LIST, "HIT", None, "gzip")
    await ask(LIST, "BYPASS", None, "gzip", Cache_Control="no-cache")
    await ask(LIST, "BYPASS", None, "gzip", Cache_Control="no-store")
    await ask("/users", "BYPASS", None, "gzip")
    clock.advance(30 + 5)  # stale, within stale_while_revalidate_s: served, refreshed
    await ask(LIST, "STALE", "gzip")
    async with asyncio.timeout(10):
        while pipeline.in_flight:
            await asyncio.sleep(0.01)
    await server.close()
    clock.advance(30 + 31 + 100)  # past both windows, within stale_if_error_s
    await ask(LIST, "STALE", None, "gzip")
    assert answered[-1][0].headers["cache-status"] == "records-gateway; fwd=stale"
    identity = {path: answer.body for answer, path, gzip_ in answered if not gzip_}
    for answer, path, gzip_ in answered:
        check_representation(answer, identity[path], etag_of(identity[path]), gzip_)


async def test_problems_are_never_compressed(
    gateway_factory: GatewayFactory, upstream: TestServer
) -> None:
    client = await gateway_factory(base_url(upstream), cache={"negative_ttl_s": 60})
    port = port_of(client)
    unknown = "/expenses/00000000-0000-4000-8000-000000000000"
    answers = await exchange(
        port,
        gzip_request("/expenses?page=0"),
        gzip_request("/nowhere"),
        gzip_request(unknown),
        gzip_request(unknown),  # the negative entry's 404
    )
    (unauthenticated,) = await exchange(
        port, b"GET /users HTTP/1.1\r\nHost: g\r\nAccept-Encoding: gzip\r\n\r\n"
    )
    statuses = [a.status_line.split()[1] for a in [*answers, unauthenticated]]
    assert statuses == ["400", "404", "404", "404", "401"]
    assert upstream_calls(upstream) == 1
    for answer in (*answers, unauthenticated):
        assert answer.headers["content-type"] == "application/problem+json"
        assert "content-encoding" not in answer.headers
        assert orjson.loads(answer.body)["status"] == int(answer.status_line.split()[1])


async def test_a_purge_drops_the_entry_for_every_representation(
    gateway_on: tuple[Client, int], upstream_log: RequestLog
) -> None:
    client, port = gateway_on
    (first,) = await exchange(port, gzip_request(LIST))
    purged = await client.delete(
        "/admin/cache?route=expenses", headers={"Authorization": f"Bearer {ADMIN}"}
    )
    assert purged.status == 200
    identity = gzip.decompress(first.body)
    for accept_encoding in ("gzip", None):
        (answer,) = await exchange(port, request_bytes(LIST, **sent(accept_encoding)))
        assert answer.headers["x-cache"] == ("MISS" if accept_encoding else "HIT")
        check_representation(answer, identity, etag_of(identity), bool(accept_encoding))
    assert len(upstream_log) == 2


async def test_several_accept_encoding_fields_are_read_as_one_list(
    gateway_on: tuple[Client, int],
) -> None:
    _, port = gateway_on
    (plain,) = await exchange(port, request_bytes(LIST))
    head = request_bytes(LIST)[:-2]
    answers = await exchange(
        port,
        head + b"Accept-Encoding: identity;q=0.5\r\nAccept-Encoding: gzip\r\n\r\n",
        head + b"Accept-Encoding: gzip;q=0.5\r\nAccept-Encoding: identity\r\n\r\n",
        head + b"Accept-Encoding: gz\xffip, \xc3\xa9\r\n\r\n",  # bytes that are not ASCII
    )
    check_representation(answers[0], plain.body, plain.headers["etag"], True)
    check_representation(answers[1], plain.body, plain.headers["etag"], False)
    check_representation(answers[2], plain.body, plain.headers["etag"], False)


async def test_every_representation_of_a_hit_is_answered_from_the_bytes(
    gateway_on: tuple[Client, int], monkeypatch: pytest.MonkeyPatch, fast_path: bool
) -> None:
    """The fast path reads Accept-Encoding: a hit is answered from the bytes in the
    representation the caller gets (identity without the field or with one that does
    not accept gzip, gzip with it), the same as the route's handler gives."""
    client, port = gateway_on
    (plain,) = await exchange(port, request_bytes(LIST))
    full_reads = count_full_reads(client.app, monkeypatch)
    asked = (
        request_bytes(LIST),
        gzip_request(LIST),
        request_bytes(LIST, Accept_Encoding="br"),
        request_bytes(LIST, Accept_Encoding="gzip;q=0.5, identity"),
        request_bytes(LIST, Accept_Encoding="br, x-gzip;q=0.9, identity;q=0"),
    )
    answers = await exchange(port, *asked)
    assert full_reads == [0], "hits, from the bytes or by the gateway's server"
    for answer, gzipped in zip(answers, (False, True, False, False, True), strict=True):
        check_representation(answer, plain.body, plain.headers["etag"], gzipped)
        assert answer.headers["x-cache"] == "HIT"
        assert answer.headers["vary"] == "Accept-Encoding"


async def test_the_memo_of_identity_bodies_stays_within_its_bytes(
    gateway_factory: GatewayFactory, upstream: TestServer
) -> None:
    """Many distinct gzip entries, each asked for by an identity caller: the memo of
    their decompressed bodies never holds more than ``identity_memo_max_bytes``, and
    every caller gets the right body."""
    limit = 40_000
    client = await gateway_factory(base_url(upstream), cache={"identity_memo_max_bytes": limit})
    port = port_of(client)
    memo = client.app[UPSTREAMS].current.pipeline.identity_bodies
    pages = [f"/expenses?limit=10&page={n}" for n in range(1, 21)]
    zipped = await exchange(port, *(gzip_request(page) for page in pages))
    for page, stored in zip(pages, zipped, strict=True):
        for _ in range(2):
            (answer,) = await exchange(port, request_bytes(page))
            assert answer.headers["x-cache"] == "HIT"
            identity = gzip.decompress(stored.body)
            check_representation(answer, identity, etag_of(identity), False)
            assert 0 < memo.size_bytes <= limit
    assert 1 <= len(memo) < len(pages)


@pytest.fixture
async def on_redis(
    gateway_factory: GatewayFactory, upstream: TestServer, redis_url: str
) -> AsyncIterator[tuple[Client, redis.Redis]]:
    """A gateway on a real redis-server without its near cache (every read is a Redis
    read), and a client of that Redis."""
    client = await gateway_factory(
        base_url(upstream), cache=redis_cache(redis_url, near_cache=False)
    )
    store = redis.Redis.from_url(redis_url)
    yield client, store
    await store.aclose()


async def stored_in_redis(client: Client, store: redis.Redis) -> tuple[bytes, bytes, bytes]:
    """LIST fetched once by an identity caller: its body, and its one entry's key and
    value in Redis."""
    (answer,) = await exchange(port_of(client), request_bytes(LIST))
    (key,) = [key async for key in store.scan_iter("*:e:*") if not key.endswith(b":lease")]
    raw = await store.get(key)
    assert isinstance(raw, bytes)
    return answer.body, key, raw


async def test_entries_are_stored_gzip_in_redis_within_a_third_of_the_identity_body(
    on_redis: tuple[Client, redis.Redis],
) -> None:
    """The value in a real redis-server is the gzip entry (its body decompresses to the
    identity body served), and Redis's MEMORY USAGE of a 10-expense page's key is at
    most 0.35 of the identity body (about 1.2 when stored identity).

    Held for docs/deployment.md, "Redis".
    """
    identity, key, raw = await stored_in_redis(*on_redis)
    assert len(orjson.loads(identity)["data"]) == 10
    entry = CacheEntry.decode(raw)
    assert (entry.coding, entry.etag) == (GZIP, etag_of(identity))
    assert gzip.decompress(entry.body) == identity
    assert raw.endswith(stored_body(identity)[0])
    usage = await on_redis[1].memory_usage(key)
    assert usage is not None
    assert usage <= 0.35 * len(identity), (usage, len(identity))


async def test_an_entry_an_older_gateway_stored_is_served_to_every_caller(
    on_redis: tuple[Client, redis.Redis], upstream: TestServer
) -> None:
    """A rolling upgrade: an ``RGC1`` value (the format before codings) in Redis is
    served by this version, identity to every caller, without an upstream call.

    Held for docs/deployment.md, "Redis".
    """
    client, store = on_redis
    identity, key, raw = await stored_in_redis(client, store)
    new = CacheEntry.decode(raw)
    old = rgc1(CacheEntry(identity, new.etag, new.stored_at, new.ttl_s, 200, new.generations))
    await store.set(key, old, px=60_000)
    calls = upstream_calls(upstream)
    for request in (gzip_request(LIST), request_bytes(LIST)):
        (hit,) = await exchange(port_of(client), request)
        assert hit.headers["x-cache"] == "HIT"
        check_representation(hit, identity, new.etag, False)
    assert upstream_calls(upstream) == calls


def rgc1(entry: CacheEntry) -> bytes:
    """``entry`` as a gateway of the version before codings stored it."""
    assert entry.coding == IDENTITY
    etag = entry.etag.encode()
    header = struct.pack(
        "!4sdIHQQB",
        b"RGC1",
        entry.stored_at,
        entry.ttl_s,
        entry.status,
        entry.generations.everything,
        entry.generations.route,
        len(etag),
    )
    return header + etag + entry.body


async def test_a_stored_body_that_does_not_decompress_is_fetched_again_not_a_500(
    on_redis: tuple[Client, redis.Redis], upstream: TestServer
) -> None:
    client, store = on_redis
    identity, key, raw = await stored_in_redis(client, store)
    good = CacheEntry.decode(raw)
    broken = good.body[:10] + bytes(len(good.body) - 10)  # a gzip header, then zeros
    await store.set(key, raw[: -len(good.body)] + broken, px=60_000)
    calls = upstream_calls(upstream)
    (again,) = await exchange(port_of(client), request_bytes(LIST))
    check_representation(again, identity, good.etag, False)
    assert again.headers["cache-status"] == "records-gateway; fwd=miss; stored"
    assert upstream_calls(upstream) == calls + 1
    (zipped,) = await exchange(port_of(client), gzip_request(LIST))  # stored over it
    check_representation(zipped, identity, good.etag, True)
    assert zipped.headers["x-cache"] == "HIT"


async def test_a_bypass_is_compressed_only_for_a_caller_that_accepts_gzip(
    gateway_factory: GatewayFactory, upstream: TestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With nothing to store (``cache.backend = "none"``), an identity caller's answer
    is never compressed (a miss would pay for a compression nobody reads); a gzip
    caller's is, once."""
    client = await gateway_factory(base_url(upstream), cache={"backend": "none"})
    port = port_of(client)
    compressed: list[int] = []
    compress = stored_body

    def counted(body: bytes) -> tuple[bytes, str]:
        compressed.append(len(body))
        return compress(body)

    monkeypatch.setattr(fill_module, "stored_body", counted)
    (plain,) = await exchange(port, request_bytes(LIST))
    assert (plain.headers["x-cache"], compressed) == ("BYPASS", [])
    (zipped,) = await exchange(port, gzip_request(LIST))
    check_representation(zipped, plain.body, plain.headers["etag"], True)
    assert compressed == [len(plain.body)]
