"""The gateway on a real Redis Cluster (three primaries) and a real Sentinel set (a
primary, a replica, three sentinels), started by the suite: entries spread over the
shards, purges across slots, one upstream call per cold key across instances, and a
Sentinel failover under load that loses no request."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis.asyncio as redis
import trustme
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.cluster import RedisCluster as ClusterClient
from redis.asyncio.connection import SSLConnection
from redis.crc import key_slot

from gateway.cache.entry import CacheEntry, CacheKey, etag_of
from gateway.cache.keyspace import generation_key, invalidation_channel
from gateway.cache.redis import RedisBackend
from gateway.cache.topology import connect
from gateway.config.settings import CacheSettings
from gateway.demo import RequestLog
from gateway.http.binding import UPSTREAMS

from ..conftest import (
    AUTH,
    KEY_SECRET,
    GatewayFactory,
    base_url,
    near_cache_live,
    near_of,
    until,
)
from ..redis_server import RedisServer, free_port
from ..redis_topologies import RedisCluster, SentinelSet

pytestmark = pytest.mark.integration

Client = TestClient[web.Request, web.Application]
ADMIN_TOKEN = "admin-token-0123456789abcdef"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def cluster_cache(nodes: list[str], **extra: Any) -> dict[str, Any]:
    return {
        "backend": "redis",
        "redis_mode": "cluster",
        "redis_nodes": nodes,
        "key_secret": KEY_SECRET,
        "redis_timeout_ms": 1000,
        **extra,
    }


def sentinel_cache(sentinels: SentinelSet, **extra: Any) -> dict[str, Any]:
    return {
        "backend": "redis",
        "redis_mode": "sentinel",
        "redis_nodes": sentinels.sentinels,
        "redis_sentinel_master": sentinels.master_name,
        "key_secret": KEY_SECRET,
        "redis_timeout_ms": 1000,
        **extra,
    }


async def instances(
    factory: GatewayFactory, upstream: TestServer, cache: dict[str, Any], n: int
) -> list[Client]:
    clients = [
        await factory(base_url(upstream), cache=cache, admin={"token": ADMIN_TOKEN})
        for _ in range(n)
    ]
    for client in clients:
        await near_cache_live(client)
    return clients


async def fetch(client: Client, path: str) -> tuple[int, bytes, str]:
    response = await client.get(path, headers=AUTH)
    return response.status, await response.read(), response.headers.get("X-Cache", "")


async def test_cluster_spreads_entries_over_every_shard_and_purges_across_slots(
    gateway_factory: GatewayFactory,
    upstream: TestServer,
    upstream_log: RequestLog,
    redis_cluster_nodes: list[str],
) -> None:
    (client,) = await instances(
        gateway_factory, upstream, cluster_cache(redis_cluster_nodes, near_cache=False), 1
    )
    paths = [f"/expenses?page={page}&limit=2" for page in range(1, 61)]
    for path in paths:
        assert (await fetch(client, path))[2] == "MISS"
    for path in paths:
        assert (await fetch(client, path))[2] == "HIT"  # read from Redis: no near cache
    assert len(upstream_log) == 60
    prefix = client.app[UPSTREAMS].current.pipeline.keyer.prefix
    per_node = []
    for node in redis_cluster_nodes:
        host, port = node.split(":")
        shard = redis.Redis(host=host, port=int(port))
        per_node.append(len([key async for key in shard.scan_iter(f"{prefix}:e:*")]))
        await shard.aclose()
    assert sum(per_node) == 60
    assert max(per_node) <= 30, per_node  # none holds more than half

    response = await client.delete("/admin/cache?route=expenses", headers=ADMIN)
    assert response.status == 200
    assert {x_cache for _, _, x_cache in [await fetch(client, p) for p in paths[:10]]} == {"MISS"}
    assert (await fetch(client, "/users"))[2] == "MISS"
    assert (await client.delete("/admin/cache", headers=ADMIN)).status == 200
    assert (await fetch(client, "/users"))[2] == "MISS"
    assert (await fetch(client, "/users"))[2] == "HIT"


async def test_cluster_fleet_makes_one_upstream_call_per_cold_key_and_purges_everywhere(
    gateway_factory: GatewayFactory,
    upstream: TestServer,
    upstream_log: RequestLog,
    redis_cluster_nodes: list[str],
) -> None:
    clients = await instances(gateway_factory, upstream, cluster_cache(redis_cluster_nodes), 3)
    for burst in range(3):
        before = len(upstream_log)
        path = f"/users?page={burst + 1}&limit=4"
        answers = await asyncio.gather(*(fetch(clients[i % 3], path) for i in range(150)))
        assert {status for status, _, _ in answers} == {200}
        assert len(upstream_log) - before == 1
    for client in clients:
        await fetch(client, "/users?page=1&limit=4")
        assert len(near_of(client)) >= 1
    response = await clients[2].delete("/admin/cache?route=users", headers=ADMIN)
    assert response.status == 200
    assert (await response.json())["instances"] == {"told": 3, "confirmed": 3}
    assert [len(near_of(client)) for client in clients] == [0, 0, 0]


async def record_purge_across_slots(clients: list[Client], upstream_log: RequestLog) -> None:
    """Entries of many keys (spread over the cluster's slots, or not) that hold one
    account, purged by that record from the last instance: every one of them goes,
    on every instance, and no other."""
    first = clients[0]
    status, body, _ = await fetch(first, "/expenses?limit=1")
    assert status == 200
    expense = orjson.loads(body)["data"][0]
    account = expense["account"]["id"]
    paths = [f"/expenses?page={page}&limit=2" for page in range(1, 31)]
    holding = set()
    for path in paths:
        status, body, x_cache = await fetch(first, path)
        assert (status, x_cache) == (200, "MISS")
        if any(item["account"]["id"] == account for item in orjson.loads(body)["data"]):
            holding.add(path)
    assert 0 < len(holding) < len(paths)
    for client in clients[1:]:
        for path in paths:
            assert (await fetch(client, path))[2] == "HIT"
    before = len(upstream_log)

    response = await clients[-1].delete(f"/admin/cache?record=account:{account}", headers=ADMIN)
    assert response.status == 200
    answer = await response.json()
    # the first page of one item is among them: the expense's own page
    assert answer["entries"] == len(holding) + 1
    assert answer["instances"] == {"told": len(clients), "confirmed": len(clients)}
    for client in clients:
        for path in paths:
            expected = "MISS" if path in holding and client is first else "HIT"
            assert (await fetch(client, path))[2] == expected, path
    assert len(upstream_log) - before == len(holding)


async def test_cluster_purges_a_record_whatever_slot_its_entries_live_in(
    gateway_factory: GatewayFactory,
    upstream: TestServer,
    upstream_log: RequestLog,
    redis_cluster_nodes: list[str],
) -> None:
    clients = await instances(gateway_factory, upstream, cluster_cache(redis_cluster_nodes), 2)
    await record_purge_across_slots(clients, upstream_log)


async def test_cluster_stores_every_answer_of_a_burst_of_misses(
    gateway_factory: GatewayFactory,
    upstream: TestServer,
    upstream_log: RequestLog,
    redis_cluster_nodes: list[str],
) -> None:
    """Many misses at once: each read spread over the nodes, each store noting its
    records on theirs, all at the same time (redis-py's cluster pipelines race when
    several run at once): every answer is served, and every one is stored."""
    (client,) = await instances(
        gateway_factory, upstream, cluster_cache(redis_cluster_nodes, near_cache=False), 1
    )
    paths = [f"/expenses?page={page}&limit=2" for page in range(1, 101)]
    first = await asyncio.gather(*(fetch(client, path) for path in paths))
    assert {(status, x_cache) for status, _, x_cache in first} == {(200, "MISS")}
    again = await asyncio.gather(*(fetch(client, path) for path in paths))
    assert {(status, x_cache) for status, _, x_cache in again} == {(200, "HIT")}
    assert len(upstream_log) == len(paths)


async def test_cluster_backend_sends_its_spread_commands_one_batch_at_a_time(
    redis_cluster_nodes: list[str],
) -> None:
    """Stores and reads spread over the nodes, 200 at once, all pass: redis-py's
    cluster pipelines, run several at once, race on a connection (8.1: an
    AttributeError), so the backend sends them one batch at a time."""
    host, port = redis_cluster_nodes[0].split(":")
    client = ClusterClient(host=host, port=int(port), max_connections=256)
    backend = RedisBackend(client, prefix="rg:t", timeout_s=5.0)
    generations = (await backend.get(CacheKey("users", "rg:t:e:probe"))).generations
    body = b'{"data":[]}'
    keys = [CacheKey("users", f"rg:t:e:users||page={n}|caller") for n in range(200)]

    async def store(key: CacheKey) -> bool:
        entry = CacheEntry(body, etag_of(body), time.time(), 30, generations=generations)
        held = {f"user:{key.text[-16:]}": "v1", "account:shared": "v1"}
        return await backend.set_holding(key, entry, 60, held, 0)

    for _ in range(3):
        assert await asyncio.gather(*(store(key) for key in keys)) == [True] * len(keys)
        found = await asyncio.gather(*(backend.get(key) for key in keys))
        assert all(lookup.entry is not None for lookup in found)
    assert len((await backend.purge_records(["account:shared"], soft=False)).keys) == len(keys)
    await backend.close()


async def test_cluster_keeps_one_version_of_a_record_whatever_slot_its_entries_live_in(
    redis_cluster_nodes: list[str],
) -> None:
    """cache.record_consistency on a cluster (docs/purging.md): a newer version noted
    by one instance removes the entries of every slot holding the older one; an older
    fill of another instance is refused."""
    host, port = redis_cluster_nodes[0].split(":")
    backends = [
        RedisBackend(ClusterClient(host=host, port=int(port)), prefix="rg:v", timeout_s=5.0)
        for _ in range(2)
    ]
    body = b'{"data":[]}'
    generations = (await backends[0].get(CacheKey("users", "rg:v:e:probe"))).generations
    caller = "c" * 32
    keys = [CacheKey("expenses", f"rg:v:e:expenses||page={n}|{caller}") for n in range(30)]
    assert len({key_slot(key.text.encode()) for key in keys}) > 20

    def made() -> CacheEntry:
        return CacheEntry(body, etag_of(body), time.time(), 30, generations=generations)

    held = {"account:shared": "v1"}
    old = await backends[0].purge_sequence()
    for n, key in enumerate(keys):
        noted = await backends[n % 2].set_consistent(key, made(), 60, held, old, caller)
        assert noted.stored
    newer = await backends[1].purge_sequence()
    detail = CacheKey("account", f"rg:v:e:account||shared|{caller}")
    noted = await backends[1].set_consistent(
        detail, made(), 60, {"account:shared": "v2"}, newer, caller
    )
    assert set(noted.invalidated) == set(keys)
    found = await asyncio.gather(*(backends[0].get(key) for key in keys))
    assert [lookup.entry for lookup in found] == [None] * len(keys)
    refused = await backends[0].set_consistent(keys[0], made(), 60, held, old, caller)
    assert not refused.stored
    assert (await backends[1].get(keys[0])).entry is None
    for backend in backends:
        await backend.close()


async def test_cluster_counts_the_records_index_in_its_slot(
    redis_cluster_nodes: list[str],
) -> None:
    """The index's size on a cluster (docs/purging.md): its slot's keys, counted."""
    host, port = redis_cluster_nodes[0].split(":")
    prefix = f"rg:n{time.time_ns()}"
    backend = RedisBackend(ClusterClient(host=host, port=int(port)), prefix=prefix, timeout_s=5.0)
    generations = (await backend.get(CacheKey("users", f"{prefix}:e:probe"))).generations
    body = b'{"data":[]}'
    for n in range(20):
        key = CacheKey("users", f"{prefix}:e:users||page={n}|caller")
        entry = CacheEntry(body, etag_of(body), time.time(), 30, generations=generations)
        assert await backend.set_holding(key, entry, 60, {f"user:{n}": "", "account:x": ""}, 0)
    size = await backend.index_size()
    assert size is not None
    assert size.keys == 21  # a set for each of 20 users and for the account
    assert size.bytes > 21 * 50
    await backend.close()


async def test_cluster_instances_take_a_signed_notice_once_between_them(
    redis_cluster_nodes: list[str],
) -> None:
    """The memory of signed change notices (docs/purging.md) is one key for the fleet:
    what one instance claimed, another refuses."""
    host, port = redis_cluster_nodes[0].split(":")
    backends = [
        RedisBackend(ClusterClient(host=host, port=int(port)), prefix="rg:t", timeout_s=5.0)
        for _ in range(2)
    ]
    names = [f"notice:{n:032x}" for n in range(20)]  # spread over the slots
    assert [await backends[n % 2].claim(name, 60) for n, name in enumerate(names)] == [True] * 20
    assert [await backends[1 - n % 2].claim(name, 60) for n, name in enumerate(names)] == [
        False
    ] * 20
    for backend in backends:
        await backend.close()


async def test_sentinel_mode_purges_by_record(
    gateway_factory: GatewayFactory,
    upstream: TestServer,
    upstream_log: RequestLog,
    redis_sentinel: SentinelSet,
) -> None:
    clients = await instances(gateway_factory, upstream, sentinel_cache(redis_sentinel), 2)
    await record_purge_across_slots(clients, upstream_log)


async def test_cluster_readiness_is_ok(
    gateway_factory: GatewayFactory, upstream: TestServer, redis_cluster_nodes: list[str]
) -> None:
    (client,) = await instances(gateway_factory, upstream, cluster_cache(redis_cluster_nodes), 1)
    await fetch(client, "/users")
    report = await (await client.get("/readyz")).json()
    assert report["components"]["cache"]["status"] == "ok", report


async def test_sentinel_mode_serves_and_purges(
    gateway_factory: GatewayFactory,
    upstream: TestServer,
    upstream_log: RequestLog,
    redis_sentinel: SentinelSet,
) -> None:
    (client,) = await instances(
        gateway_factory, upstream, sentinel_cache(redis_sentinel, near_cache=False), 1
    )
    assert (await fetch(client, "/users"))[2] == "MISS"
    assert (await fetch(client, "/users"))[2] == "HIT"
    assert (await client.delete("/admin/cache?route=users", headers=ADMIN)).status == 200
    assert (await fetch(client, "/users"))[2] == "MISS"
    assert len(upstream_log) == 2
    # what was written went to the primary the sentinels name
    host, port = redis_sentinel.master_address()
    primary = redis.Redis(host=host, port=port)
    prefix = client.app[UPSTREAMS].current.pipeline.keyer.prefix
    assert len([key async for key in primary.scan_iter(f"{prefix}:e:*")]) == 1
    await primary.aclose()


async def test_a_sentinel_failover_under_load_loses_no_request(
    gateway_factory: GatewayFactory,
    upstream: TestServer,
    redis_sentinel: SentinelSet,
) -> None:
    """Held for docs/deployment.md, "Faults, and what callers see": Sentinel failover."""
    clients = await instances(gateway_factory, upstream, sentinel_cache(redis_sentinel), 3)
    old_primary = redis_sentinel.master_address()
    statuses: list[int] = []
    stop = asyncio.Event()

    async def load(client: Client, offset: int) -> None:
        index = 0
        while not stop.is_set():
            page = (index + offset) % 40 + 1
            status, _, _ = await fetch(client, f"/expenses?page={page}&limit=3")
            statuses.append(status)
            index += 1
            await asyncio.sleep(0.002)

    loaders = [asyncio.ensure_future(load(client, i * 7)) for i, client in enumerate(clients)]
    await asyncio.sleep(0.5)
    primary = redis.Redis(host=old_primary[0], port=old_primary[1], single_connection_client=True)
    connections_before = await gateway_connections(primary)
    await primary.aclose()
    new_primary = await asyncio.to_thread(redis_sentinel.failover)
    assert new_primary != old_primary
    await asyncio.sleep(0.5)
    stop.set()
    await asyncio.gather(*loaders)
    assert len(statuses) > 100
    assert set(statuses) == {200}

    # the cache is used again within a few seconds: a new key is stored and read back
    # from Redis by another instance
    async def cache_works() -> bool:
        path = f"/clients?page={len(statuses) % 50 + 1}&limit=2"
        await fetch(clients[0], path)
        return (await fetch(clients[1], path))[2] == "HIT"

    async with asyncio.timeout(10):
        while not await cache_works():
            await asyncio.sleep(0.2)
        for client in clients:
            await near_cache_live(client)

    # a purge made after the failover is in force on every instance
    for client in clients:
        await fetch(client, "/users")
        await fetch(client, "/users")
        assert len(near_of(client)) >= 1
    response = await clients[1].delete("/admin/cache", headers=ADMIN)
    assert response.status == 200
    assert (await response.json())["instances"] == {"told": 3, "confirmed": 3}
    assert [len(near_of(client)) for client in clients] == [0, 0, 0]
    assert (await fetch(clients[2], "/users"))[2] == "MISS"
    # no connection of any instance is left to the demoted primary (it had them)
    assert connections_before > 0
    demoted = redis.Redis(host=old_primary[0], port=old_primary[1], single_connection_client=True)
    assert (await demoted.role())[0] == b"slave"
    async with asyncio.timeout(10):
        while await gateway_connections(demoted):
            await asyncio.sleep(0.1)
    await demoted.aclose()


async def test_a_sentinel_port_used_as_a_standalone_server(
    gateway_factory: GatewayFactory, upstream: TestServer, redis_sentinel: SentinelSet
) -> None:
    """A sentinel answers PING but refuses every read and write: the cache is down,
    never ok, and every request is answered from the upstream.

    Held for docs/deployment.md, "Faults, and what callers see": a Sentinel port configured as a
    standalone server.
    """
    client = await gateway_factory(
        base_url(upstream),
        cache={
            "backend": "redis",
            "redis_url": f"redis://{redis_sentinel.sentinels[0]}/0",
            "key_secret": KEY_SECRET,
            "redis_timeout_ms": 1000,
        },
    )
    store = redis.Redis.from_url(f"redis://{redis_sentinel.sentinels[0]}/0")
    assert await store.ping()
    await store.aclose()
    report = await (await client.get("/readyz")).json()
    cache = report["components"]["cache"]
    assert (report["status"], cache["status"]) == ("degraded", "down")
    assert "unknown command" in cache["lastError"], cache["lastError"]
    for _ in range(3):
        response = await client.get("/users", headers=AUTH)
        assert response.status == 200
        assert response.headers["Cache-Status"] == (
            "records-gateway; fwd=miss; detail=cache-unavailable"
        )


async def test_a_password_cluster(
    gateway_factory: GatewayFactory, upstream: TestServer, upstream_log: RequestLog
) -> None:
    with RedisCluster(password="cluster-secret-0123") as cluster:
        cluster.start()
        cache = cluster_cache(cluster.nodes, redis_password="cluster-secret-0123")
        (client,) = await instances(gateway_factory, upstream, cache, 1)
        assert (await fetch(client, "/users"))[2] == "MISS"
        assert (await fetch(client, "/clients"))[2] == "MISS"
        assert (await fetch(client, "/users"))[2] == "HIT"
        assert len(upstream_log) == 2
        report = await (await client.get("/readyz")).json()
        assert report["components"]["cache"]["status"] == "ok"
        await client.close()


async def test_password_sentinels_and_data_nodes(
    gateway_factory: GatewayFactory, upstream: TestServer, upstream_log: RequestLog
) -> None:
    with SentinelSet(password="data-secret-0123", sentinel_password="sentinel-secret-0") as set_:
        set_.start()
        cache = sentinel_cache(
            set_,
            near_cache=False,
            redis_password="data-secret-0123",
            redis_sentinel_password="sentinel-secret-0",
        )
        (client,) = await instances(gateway_factory, upstream, cache, 1)
        assert (await fetch(client, "/users"))[2] == "MISS"
        assert (await fetch(client, "/users"))[2] == "HIT"  # read back from the primary
        assert len(upstream_log) == 1
        assert (await client.delete("/admin/cache", headers=ADMIN)).status == 200
        assert (await fetch(client, "/users"))[2] == "MISS"
        await client.close()


@pytest.fixture
def tls_redis(tmp_path: Path) -> Iterator[tuple[RedisServer, int, Path]]:
    """A redis-server that also listens with TLS, its certificate signed by a private CA
    of the test's own: (server, TLS port, the CA's PEM file)."""
    ca = trustme.CA()
    certificate = ca.issue_cert("127.0.0.1", "localhost")
    ca_file, cert_file, key_file = (tmp_path / name for name in ("ca.pem", "cert.pem", "key.pem"))
    ca.cert_pem.write_to_path(str(ca_file))
    certificate.cert_chain_pems[0].write_to_path(str(cert_file))
    certificate.private_key_pem.write_to_path(str(key_file))
    tls_port = free_port()
    server = RedisServer(
        "--tls-port",
        str(tls_port),
        "--tls-cert-file",
        str(cert_file),
        "--tls-key-file",
        str(key_file),
        "--tls-ca-cert-file",
        str(ca_file),
        "--tls-auth-clients",
        "no",
    )
    server.start()
    yield server, tls_port, ca_file
    server.close()


async def test_tls_to_a_redis_with_a_private_ca(
    gateway_factory: GatewayFactory,
    upstream: TestServer,
    upstream_log: RequestLog,
    tls_redis: tuple[RedisServer, int, Path],
) -> None:
    server, tls_port, ca_file = tls_redis
    tls = {
        "backend": "redis",
        "redis_url": f"redis://127.0.0.1:{tls_port}/0",
        "redis_tls": True,
        "redis_tls_ca_file": str(ca_file),
        "key_secret": KEY_SECRET,
        "redis_timeout_ms": 1000,
    }
    (client,) = await instances(gateway_factory, upstream, tls, 1)
    assert (await fetch(client, "/users"))[2] == "MISS"
    assert (await fetch(client, "/users"))[2] == "HIT"
    report = await (await client.get("/readyz")).json()
    assert report["components"]["cache"]["status"] == "ok"
    # the entry is in that Redis (read over its plain port)
    plain = redis.Redis.from_url(server.url)
    assert len([key async for key in plain.scan_iter("*:e:*")]) == 1
    await plain.aclose()

    # without the CA the server's certificate is refused: no cache, answers still served
    untrusted = await gateway_factory(
        base_url(upstream),
        cache={**tls, "redis_tls_ca_file": None, "redis_url": f"rediss://127.0.0.1:{tls_port}/0"},
        health={"check_interval_s": 0},
    )
    response = await untrusted.get("/users", headers=AUTH)
    assert response.status == 200
    assert response.headers["Cache-Status"] == "records-gateway; fwd=miss; detail=cache-unavailable"
    report = await (await untrusted.get("/readyz")).json()
    assert "CERTIFICATE_VERIFY_FAILED" in report["components"]["cache"]["lastError"]
    assert len([r for r in upstream_log.entries if r.authorization]) == 2


def test_passwords_and_tls_reach_every_client_of_every_mode(tmp_path: Path) -> None:
    ca_file = tmp_path / "ca.pem"
    trustme.CA().cert_pem.write_to_path(str(ca_file))
    common = {
        "backend": "redis",
        "key_secret": KEY_SECRET,
        "redis_tls": True,
        "redis_tls_ca_file": ca_file,
        "redis_username": "gateway",
        "redis_password": "data-secret",
    }
    cluster = connect(CacheSettings(**common, redis_mode="cluster", redis_nodes=("10.0.0.1:7000",)))
    assert isinstance(cluster.commands, ClusterClient)
    kwargs = cluster.commands.get_connection_kwargs()
    assert kwargs["connection_class"] is SSLConnection
    assert (kwargs["ssl_ca_certs"], kwargs["username"], kwargs["password"]) == (
        str(ca_file),
        "gateway",
        "data-secret",
    )

    sentinel = connect(
        CacheSettings(
            **common,
            redis_mode="sentinel",
            redis_nodes=("10.0.0.1:26379",),
            redis_sentinel_master="records",
            redis_sentinel_password="sentinel-secret",
        )
    )
    assert isinstance(sentinel.commands, redis.Redis)
    pool = sentinel.commands.connection_pool
    assert issubclass(pool.connection_class, SSLConnection)
    assert (pool.connection_kwargs["ssl_ca_certs"], pool.connection_kwargs["password"]) == (
        str(ca_file),
        "data-secret",
    )
    assert sentinel.sentinel is not None
    (one,) = sentinel.sentinel.sentinels
    assert one.connection_pool.connection_class is SSLConnection
    assert one.connection_pool.connection_kwargs["password"] == "sentinel-secret"
    assert one.connection_pool.connection_kwargs["ssl_ca_certs"] == str(ca_file)

    standalone = connect(CacheSettings(**common, redis_url="redis://10.0.0.1:6380/2"))
    assert isinstance(standalone.commands, redis.Redis)
    pool = standalone.commands.connection_pool
    assert pool.connection_class is SSLConnection  # redis_tls makes redis:// TLS
    assert pool.connection_kwargs["ssl_ca_certs"] == str(ca_file)
    assert pool.connection_kwargs["db"] == 2


async def test_a_cluster_purge_while_the_generations_node_stalls(
    gateway_factory: GatewayFactory,
    upstream: TestServer,
    redis_cluster: RedisCluster,
    redis_cluster_nodes: list[str],
) -> None:
    """The purge generations and the channel share one slot: when the node that holds
    them stalls, the purge's outcome is unknown and every near cache goes off with
    it; when the node is back the purge is in force everywhere.

    Held for docs/deployment.md, "Faults, and what callers see": a cluster node that holds the
    generations stalls during a purge.
    """
    first, second = await instances(
        gateway_factory, upstream, cluster_cache(redis_cluster_nodes, redis_timeout_ms=200), 2
    )
    prefix = first.app[UPSTREAMS].current.pipeline.keyer.prefix
    assert key_slot(generation_key(prefix, "users").encode()) == key_slot(
        invalidation_channel(prefix).encode()
    )
    for client in (first, second):
        await fetch(client, "/users")
        assert (await fetch(client, "/users"))[2] == "HIT"
    probe = ClusterClient(
        startup_nodes=[ClusterNode(*node.split(":")) for node in redis_cluster_nodes]
    )
    await probe.initialize()
    holder = probe.get_node_from_key(generation_key(prefix, "users"))
    assert holder is not None
    await probe.aclose()
    stalled = redis_cluster.server_at(f"{holder.host}:{holder.port}")
    stalled.freeze()
    try:
        response = await first.delete("/admin/cache?route=users", headers=ADMIN)
        assert response.status == 503
        assert (await response.json())["outcome"] == "unknown"
        # the other instance listens on the stalled node: its near cache goes off
        await until(lambda: not near_of(second).live)
    finally:
        await asyncio.sleep(0.2)
        stalled.thaw()  # within the cluster's node timeout: no failover
    await near_cache_live(second)
    assert (await fetch(second, "/users"))[2] == "MISS"


async def test_a_hung_first_sentinel_is_passed_over(
    gateway_factory: GatewayFactory,
    upstream: TestServer,
    upstream_log: RequestLog,
    redis_sentinel: SentinelSet,
) -> None:
    """The first sentinel listed accepts connections but never answers (SIGSTOP): a
    gateway started then still finds the primary through the others and uses it.

    Held for docs/deployment.md, "Faults, and what callers see": the first sentinel listed hangs.
    """
    redis_sentinel.sentinel_nodes[0].freeze()
    try:
        cache = sentinel_cache(redis_sentinel, near_cache=False, redis_timeout_ms=50)
        client = await gateway_factory(base_url(upstream), cache=cache)

        async def cache_works() -> bool:
            path = f"/users?page={len(upstream_log) + 1}"
            await fetch(client, path)
            return (await fetch(client, path))[2] == "HIT"

        async with asyncio.timeout(15):
            while not await cache_works():
                await asyncio.sleep(0.1)
    finally:
        redis_sentinel.sentinel_nodes[0].thaw()


async def test_subscriptions_follow_the_channels_slot_to_another_node(
    gateway_factory: GatewayFactory, upstream: TestServer, redis_cluster_nodes: list[str]
) -> None:
    """The slot of the generations and channels moves to another primary: each
    instance learns it from Redis's MOVED and subscribes there, and purges are
    confirmed by both again."""
    clients = await instances(gateway_factory, upstream, cluster_cache(redis_cluster_nodes), 2)
    prefix = clients[0].app[UPSTREAMS].current.pipeline.keyer.prefix
    slot = key_slot(invalidation_channel(prefix).encode())
    nodes = [
        redis.Redis(host=host, port=int(port))
        for host, port in (node.split(":") for node in redis_cluster_nodes)
    ]
    ids = [(await node.execute_command("CLUSTER", "MYID")).decode() for node in nodes]  # type: ignore[no-untyped-call]
    owned = [_slots_of(await node.execute_command("CLUSTER", "NODES")) for node in nodes]  # type: ignore[no-untyped-call]
    owner = next(index for index, slots in enumerate(owned) if slot in slots)
    target = (owner + 1) % len(nodes)
    # the slot's keys (the generations) go; then every node is told the new owner
    keys = await nodes[owner].execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100)  # type: ignore[no-untyped-call]
    if keys:
        await nodes[owner].delete(*keys)
    for node in nodes:
        await node.execute_command("CLUSTER", "SETSLOT", slot, "NODE", ids[target])  # type: ignore[no-untyped-call]
    # traffic meets MOVED and teaches each instance the new owner
    for client in clients:
        await fetch(client, "/users")
    for client in clients:
        await until(lambda client=client: near_of(client).live)  # type: ignore[misc]

    async def confirmed() -> Any:
        response = await clients[0].delete("/admin/cache?route=users", headers=ADMIN)
        if response.status == 503:
            # the outcome unknown (the slot's node still settling, on a loaded machine):
            # sending the purge again is always safe, and what the loop does
            body = await response.json(content_type=None)
            assert body["type"].endswith("purge-outcome-unknown")
            return None
        assert response.status == 200
        return (await response.json())["instances"]

    async with asyncio.timeout(15):
        while await confirmed() != {"told": 2, "confirmed": 2}:
            await asyncio.sleep(0.2)
    for node in nodes:
        await node.aclose()


def _slots_of(nodes_text: bytes) -> set[int]:
    """The slots the ``myself`` line of CLUSTER NODES owns."""
    for line in nodes_text.decode().splitlines():
        if "myself" in line:
            slots: set[int] = set()
            for part in line.split()[8:]:
                if part.startswith("["):
                    continue
                low, _, high = part.partition("-")
                slots.update(range(int(low), int(high or low) + 1))
            return slots
    return set()


async def gateway_connections(node: redis.Redis) -> int:
    """Connections to ``node`` but the sentinels' (named ``sentinel-...``), replication
    links and the asking client's own (``node`` has a single connection): the
    gateway's."""
    own = await node.client_id()
    clients = await node.client_list()
    return len(
        [
            c
            for c in clients
            if not c.get("name", "").startswith("sentinel-")
            and int(c["id"]) != own
            and not set(c.get("flags", "")) & {"M", "S"}  # replication links
        ]
    )
