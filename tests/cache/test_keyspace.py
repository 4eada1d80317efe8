"""Every key and channel the gateway uses in Redis begins with ``cache.namespace`` and
``:`` (docs/deployment.md, "Redis"): a Redis user confined to ``~<namespace>:*`` and
``&<namespace>:*`` serves hits, purges and near-cache invalidations, on a standalone
server, through Sentinel and on a Cluster, and ``SCAN MATCH <namespace>:*`` finds
every key the gateway wrote."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import pytest
import redis.asyncio as redis
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from redis.crc import key_slot

from gateway.cache.keyspace import generation_key, invalidation_channel, shared_slot

from ..conftest import AUTH, KEY_SECRET, GatewayFactory, base_url, near_cache_live
from ..redis_server import RedisServer
from ..redis_topologies import RedisCluster, SentinelSet, command

pytestmark = pytest.mark.integration

Client = TestClient[web.Request, web.Application]
NAMESPACE = "acc"
USER = "gateway"
PASSWORD = "gateway-password-0123456789"
ADMIN_TOKEN = "admin-token-0123456789abcdef"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
# what the confined user may do: its own keys and channels, every command but the
# dangerous ones (FLUSHALL, CONFIG, KEYS, DEBUG...)
ACL_RULES = ("on", f">{PASSWORD}", "resetkeys", "resetchannels", f"~{NAMESPACE}:*",
             f"&{NAMESPACE}:*", "+@all", "-@dangerous")  # fmt: skip


def confine(address: tuple[str, int]) -> None:
    """Create the confined user on one node (ACLs are per node, in a Cluster too)."""
    command(address, "ACL", "SETUSER", USER, "reset", *ACL_RULES)


@pytest.fixture
def confined_redis() -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    confine(("127.0.0.1", server.port))
    yield server
    server.close()


def confined_cache(**extra: Any) -> dict[str, Any]:
    return {
        "backend": "redis",
        "namespace": NAMESPACE,
        "redis_username": USER,
        "redis_password": PASSWORD,
        "key_secret": KEY_SECRET,
        "redis_timeout_ms": 1000,
        **extra,
    }


async def fetch(client: Client, path: str) -> str:
    response = await client.get(path, headers=AUTH)
    assert response.status == 200, await response.text()
    return response.headers.get("X-Cache", "")


async def purge(client: Client, query: str = "") -> dict[str, Any]:
    response = await client.delete(f"/admin/cache{query}", headers=ADMIN)
    body: dict[str, Any] = await response.json()
    assert response.status == 200, body
    return body


async def serve_hits_purges_and_invalidations(first: Client, second: Client) -> None:
    """Two instances on one confined Redis: a hit from Redis, near-cache hits, and
    purges on one instance that the other's near cache sees at once."""
    for client in (first, second):
        await near_cache_live(client)  # subscribed to the namespace's channel
    assert await fetch(first, "/users") == "MISS"
    assert await fetch(second, "/users") == "HIT"  # stored in Redis by the first
    assert await fetch(second, "/users") == "HIT"  # and now a near copy
    assert await fetch(second, "/expenses?limit=2") == "MISS"
    assert await fetch(first, "/expenses?limit=2") == "HIT"

    body = await purge(first, "?route=users")
    assert body["instances"] == {"told": 2, "confirmed": 2}  # both processes dropped their copies
    assert await fetch(second, "/users") == "MISS"  # the near copy is gone too
    assert await fetch(first, "/expenses?limit=2") == "HIT"  # another route untouched

    body = await purge(second)
    assert body["instances"] == {"told": 2, "confirmed": 2}
    assert await fetch(first, "/expenses?limit=2") == "MISS"
    assert await fetch(second, "/users") == "MISS"
    assert await fetch(first, "/users") == "HIT"


async def keys_of(client: redis.Redis, pattern: str) -> set[bytes]:
    return {key async for key in client.scan_iter(match=pattern)}


def assert_under_namespace(everything: set[bytes], matched: set[bytes]) -> None:
    assert everything, "the gateway wrote no key"
    assert matched == everything
    # entries, purge generations and the fleet's announcements, all of them
    assert any(b":e:" in key for key in everything), everything
    assert any(key.endswith(b":gen}") for key in everything), everything
    assert any(key.endswith(b":fleet") for key in everything), everything


async def test_a_user_confined_to_the_namespace_serves_on_standalone(
    gateway_factory: GatewayFactory, upstream: TestServer, confined_redis: RedisServer
) -> None:
    cache = confined_cache(redis_url=confined_redis.url)
    first, second = [
        await gateway_factory(base_url(upstream), cache=cache, admin={"token": ADMIN_TOKEN})
        for _ in range(2)
    ]
    await serve_hits_purges_and_invalidations(first, second)

    admin = redis.Redis.from_url(confined_redis.url)  # the default user sees everything
    try:
        assert_under_namespace(await keys_of(admin, "*"), await keys_of(admin, f"{NAMESPACE}:*"))
        channels = cast(list[bytes], await admin.pubsub_channels())  # typed as str
        assert len(channels) == 2  # invalidations and their confirmations
        assert all(channel.startswith(f"{NAMESPACE}:".encode()) for channel in channels)
    finally:
        await admin.aclose()


async def test_a_user_confined_to_the_namespace_serves_on_a_cluster(
    gateway_factory: GatewayFactory,
    upstream: TestServer,
    redis_cluster: RedisCluster,
    redis_cluster_nodes: list[str],
) -> None:
    for server in redis_cluster.servers:
        confine(server.address)
    cache = confined_cache(redis_mode="cluster", redis_nodes=redis_cluster_nodes)
    first, second = [
        await gateway_factory(base_url(upstream), cache=cache, admin={"token": ADMIN_TOKEN})
        for _ in range(2)
    ]
    await serve_hits_purges_and_invalidations(first, second)

    everything: set[bytes] = set()
    matched: set[bytes] = set()
    for server in redis_cluster.servers:
        shard = redis.Redis(host=server.address[0], port=server.address[1])
        try:
            everything |= await keys_of(shard, "*")
            matched |= await keys_of(shard, f"{NAMESPACE}:*")
        finally:
            await shard.aclose()
    assert_under_namespace(everything, matched)


def test_the_hash_tag_comes_after_the_namespace_and_keeps_one_slot() -> None:
    """In a Cluster the generations and the channels share one slot (one MGET reads
    both generations; the node that holds them is the one every subscriber listens on)."""
    prefix = f"{NAMESPACE}:c53393b2a8e1"
    slot = shared_slot(prefix)
    assert slot == f"{prefix}:{{{prefix}:gen}}"  # the hash tag after the prefix
    slots = {
        key_slot(name.encode())
        for name in (generation_key(prefix, None), generation_key(prefix, "users"),
                     invalidation_channel(prefix))
    }  # fmt: skip
    assert len(slots) == 1


async def test_a_user_confined_to_the_namespace_serves_through_sentinel(
    gateway_factory: GatewayFactory, upstream: TestServer, redis_sentinel: SentinelSet
) -> None:
    for server in redis_sentinel.data_nodes:
        confine(server.address)
    cache = confined_cache(
        redis_mode="sentinel",
        redis_nodes=redis_sentinel.sentinels,
        redis_sentinel_master=redis_sentinel.master_name,
    )
    first, second = [
        await gateway_factory(base_url(upstream), cache=cache, admin={"token": ADMIN_TOKEN})
        for _ in range(2)
    ]
    await serve_hits_purges_and_invalidations(first, second)

    primary = redis_sentinel.primary()
    admin = redis.Redis(host=primary.address[0], port=primary.address[1])
    try:
        assert_under_namespace(await keys_of(admin, "*"), await keys_of(admin, f"{NAMESPACE}:*"))
    finally:
        await admin.aclose()
