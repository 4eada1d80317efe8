"""The near cache in front of Redis: fresh copies in process, dropped on every
instance by a purge or a TTL change, and not used while its channel is down."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
import redis as sync_redis
import redis.asyncio as redis
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gateway.cache.entry import CacheKey
from gateway.cache.near import (
    invalidation_message,
    parse_invalidation,
    parse_removal,
    removal_message,
)
from gateway.config.live import ConfigSource
from gateway.demo import REQUEST_LOG, RequestLog, create_demo_app
from gateway.http.admin import LIVE

from ..conftest import (
    AUTH,
    KEPT,
    REVOKED,
    Gatekeeper,
    GatewayFactory,
    base_url,
    near_of,
    redis_cache,
    until,
)
from ..redis_server import RedisServer

Client = TestClient[web.Request, web.Application]
SECRET = "test-key-secret-0123456789"
ADMIN = "admin-token-0123456789abcdef"


async def gateway_on(
    factory: GatewayFactory, upstream: TestServer, url: str, **extra: Any
) -> Client:
    client = await factory(
        base_url(upstream),
        cache=redis_cache(url),
        admin={"token": ADMIN},
        **extra,
    )
    await until(lambda: near_of(client).live)
    return client


async def x_cache(client: Client, path: str) -> str:
    response = await client.get(path, headers=AUTH)
    assert response.status == 200
    return response.headers["X-Cache"]


async def test_hits_come_from_the_process_without_redis(
    gateway_factory: GatewayFactory, upstream: TestServer, redis_url: str
) -> None:
    client = await gateway_on(gateway_factory, upstream, redis_url)
    assert await x_cache(client, "/users") == "MISS"
    assert len(near_of(client)) == 1
    store = redis.Redis.from_url(redis_url)
    await store.flushall()  # Redis forgets; the near copy still answers while fresh
    assert await x_cache(client, "/users") == "HIT"
    await store.aclose()


async def test_a_purge_on_one_instance_empties_the_other(
    gateway_factory: GatewayFactory, upstream: TestServer, upstream_log: RequestLog, redis_url: str
) -> None:
    first = await gateway_on(gateway_factory, upstream, redis_url)
    second = await gateway_on(gateway_factory, upstream, redis_url)
    assert await x_cache(second, "/users") == "MISS"
    assert await x_cache(second, "/expenses") == "MISS"
    assert await x_cache(second, "/users") == "HIT"
    assert len(near_of(second)) == 2

    response = await first.delete(
        "/admin/cache?route=users", headers={"Authorization": f"Bearer {ADMIN}"}
    )
    assert response.status == 200
    await until(lambda: len(near_of(second)) == 1)
    assert await x_cache(second, "/users") == "MISS"
    assert await x_cache(second, "/expenses") == "HIT"

    await first.delete("/admin/cache", headers={"Authorization": f"Bearer {ADMIN}"})
    await until(lambda: len(near_of(second)) == 0)
    assert await x_cache(second, "/expenses") == "MISS"
    assert [r.path for r in upstream_log.entries] == ["/users", "/expenses", "/users", "/expenses"]


async def test_a_ttl_change_on_reload_empties_that_route_everywhere(
    gateway_factory: GatewayFactory, upstream: TestServer, redis_url: str, tmp_path: Path
) -> None:
    config = tmp_path / "config.toml"
    cache = f'backend = "redis"\nredis_url = "{redis_url}"\nkey_secret = "{SECRET}"\n'
    config.write_text(f'[upstream]\nbase_url = "{base_url(upstream)}"\n[cache]\n{cache}')
    first = await gateway_on(gateway_factory, upstream, redis_url)
    first.app[LIVE]._source = ConfigSource(config)
    second = await gateway_on(gateway_factory, upstream, redis_url)
    await x_cache(second, "/users")
    await x_cache(second, "/clients")
    assert len(near_of(second)) == 2

    config.write_text(
        f'[upstream]\nbase_url = "{base_url(upstream)}"\n[cache]\n{cache}[cache.ttl_s]\nusers = 5\n'
    )
    result = await first.app[LIVE].reload()
    assert result.applied == ["cache.ttl_s"]
    await until(lambda: len(near_of(second)) == 1)
    assert await x_cache(second, "/clients") == "HIT"


async def test_the_near_cache_is_off_while_its_channel_is_down(
    gateway_factory: GatewayFactory, upstream: TestServer, redis_url: str
) -> None:
    client = await gateway_on(gateway_factory, upstream, redis_url)
    await x_cache(client, "/users")
    assert len(near_of(client)) == 1
    store = redis.Redis.from_url(redis_url)
    killed = await store.client_kill_filter(_type="pubsub")
    assert killed >= 1
    await until(lambda: not near_of(client).live, within_s=10.0)
    assert len(near_of(client)) == 0
    await until(lambda: near_of(client).live, within_s=10.0)  # resubscribed
    assert await x_cache(client, "/users") == "HIT"  # from Redis, copied near again
    assert len(near_of(client)) == 1
    await store.aclose()


async def test_an_event_loop_held_up_is_not_a_silent_channel(
    gateway_factory: GatewayFactory,
    upstream: TestServer,
    redis_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A process that was held up (a long computation, a starved machine) missed nothing:
    what Redis published meanwhile waits in its socket. Its near cache stays on, the
    invalidation published while it was held is in force the moment it runs again, and
    the next purge reaches it."""
    client = await gateway_on(gateway_factory, upstream, redis_url)
    assert await x_cache(client, "/users") == "MISS"
    assert await x_cache(client, "/clients") == "MISS"
    with sync_redis.Redis.from_url(redis_url) as store:
        (channel,) = [c for c in store.pubsub_channels() if c.endswith(b":invalidate")]
        assert store.publish(channel, invalidation_message("users")) == 1
        time.sleep(1.5)  # noqa: ASYNC251 (the point: the loop held, twice the silence limit)
    await asyncio.sleep(0.5)  # the listener runs again, and pings
    assert near_of(client).live
    assert [r.message for r in caplog.records if r.name == "gateway.cache"] == [
        "near cache on: subscribed to invalidations"
    ]
    assert len(near_of(client)) == 1  # the copy of /users dropped, /clients kept
    assert await x_cache(client, "/clients") == "HIT"
    response = await client.delete(
        "/admin/cache?route=users", headers={"Authorization": f"Bearer {ADMIN}"}
    )
    assert (await response.json())["instances"] == {"told": 1, "confirmed": 1}


async def test_redis_frozen_turns_the_near_cache_off_and_requests_go_on(
    gateway_factory: GatewayFactory, upstream: TestServer, own_redis: RedisServer
) -> None:
    client = await gateway_on(gateway_factory, upstream, own_redis.url)
    await x_cache(client, "/users")
    own_redis.freeze()
    await until(lambda: not near_of(client).live, within_s=10.0)
    assert await x_cache(client, "/users") == "MISS"  # answered from the upstream
    own_redis.thaw()
    await until(lambda: near_of(client).live, within_s=10.0)


async def test_an_answer_fetched_across_a_purge_is_not_kept_near(
    gateway_factory: GatewayFactory, aiohttp_server: Any, redis_url: str
) -> None:
    slow = await aiohttp_server(create_demo_app(latency_ms=400))
    client = await gateway_on(gateway_factory, slow, redis_url)
    admin = {"Authorization": f"Bearer {ADMIN}"}
    fetching = asyncio.ensure_future(client.get("/clients?limit=5", headers=AUTH))
    log = slow.app[REQUEST_LOG]
    await until(lambda: len(log) == 1)  # the fetch is at the upstream
    purged = await client.delete("/admin/cache?route=clients", headers=admin)
    assert purged.status == 200
    response = await fetching
    assert response.headers["Cache-Status"] == "records-gateway; fwd=miss; stored"
    # stored under the generations read before the purge: neither Redis nor the near
    # cache may answer with it
    assert len(near_of(client)) == 0
    assert await x_cache(client, "/clients?limit=5") == "MISS"
    assert len(log) == 2


async def test_a_connection_repeating_one_request_sees_a_purge_made_on_another_instance(
    gateway_factory: GatewayFactory, upstream: TestServer, upstream_log: RequestLog, redis_url: str
) -> None:
    """The hit a connection answers from its bytes (gateway.fastpath.connection) is the near cache's
    too: once the purge reaches this instance, the same request goes upstream."""
    first = await gateway_on(gateway_factory, upstream, redis_url)
    second = await gateway_on(gateway_factory, upstream, redis_url)
    assert second.port is not None
    head = f"GET /users HTTP/1.1\r\nHost: gw\r\nAuthorization: {AUTH['Authorization']}\r\n\r\n"
    reader, writer = await asyncio.open_connection("127.0.0.1", second.port)

    async def ask() -> str:
        writer.write(head.encode())
        block = await reader.readuntil(b"\r\n\r\n")
        fields = dict(
            line.split(": ", 1) for line in block.decode("latin-1").split("\r\n")[1:] if line
        )
        await reader.readexactly(int(fields["Content-Length"]))
        return fields["X-Cache"]

    async with asyncio.timeout(10):
        assert [await ask(), await ask(), await ask()] == ["MISS", "HIT", "HIT"]
        response = await first.delete(
            "/admin/cache?route=users", headers={"Authorization": f"Bearer {ADMIN}"}
        )
        assert response.status == 200
        await until(lambda: len(near_of(second)) == 0)
        assert [await ask(), await ask()] == ["MISS", "HIT"]
    writer.close()
    await writer.wait_closed()
    assert [r.path for r in upstream_log.entries] == ["/users", "/users"]


async def test_a_refused_callers_entry_leaves_redis_and_every_near_cache(
    gateway_factory: GatewayFactory, aiohttp_server: Any, redis_url: str
) -> None:
    gatekeeper = Gatekeeper()
    server = await aiohttp_server(gatekeeper.app)
    first = await gateway_on(gateway_factory, server, redis_url)
    second = await gateway_on(gateway_factory, server, redis_url)

    async def read(client: Client, token: str, **headers: str) -> tuple[int, str]:
        response = await client.get(
            "/users", headers={"Authorization": f"Bearer {token}", **headers}
        )
        await response.read()
        return response.status, response.headers.get("X-Cache", "")

    for token in (KEPT, REVOKED):
        assert await read(second, token) == (200, "MISS")
        assert await read(first, token) == (200, "HIT")
    assert len(near_of(second)) == 2

    # the upstream refuses a token whose answer every instance holds fresh
    gatekeeper.verdicts[REVOKED] = 401
    assert (await read(first, REVOKED, **{"Cache-Control": "no-cache"}))[0] == 401
    store = redis.Redis.from_url(redis_url)
    entries = [key async for key in store.scan_iter("*:e:*")]
    await store.aclose()
    assert len(entries) == 1  # the other token's
    await until(lambda: len(near_of(second)) == 1, within_s=5)
    assert await read(second, KEPT) == (200, "HIT")
    assert (await read(second, REVOKED))[0] == 401
    assert gatekeeper.count(REVOKED) == 3  # the fill, the no-cache fetch, second's miss


def test_a_one_key_message_names_its_key_and_no_route() -> None:
    key = CacheKey("users", "rg:abc:e:users||page=1&limit=10|0123abcd")
    message = removal_message(key)
    assert parse_removal(message) == key
    assert parse_removal(invalidation_message("users")) is None
    assert parse_removal(invalidation_message(None, "p1")) is None
    # a gateway that knows only purges reads it as a route no entry has
    assert parse_invalidation(message)[1] not in {None, "users"}
