"""The multi-process Redis topologies of tests/redis_topologies.py, used by redis-py the way
the gateway uses it: a Redis Cluster of three primaries and a Sentinel-managed primary.

The topologies' start, reset and failover block the event loop while they wait (seconds):
nothing else runs on it meanwhile, and an interrupt then stops them where they are."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import redis.asyncio as redis
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.cluster import RedisCluster as ClusterClient
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import MasterNotFoundError, Sentinel
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError, RedisClusterException

from ..redis_topologies import RedisCluster, SentinelSet

pytestmark = pytest.mark.integration

KEYS = 300


def no_retry() -> Retry:
    """For a client that is to be refused: redis-py retries an AuthenticationError (a
    ConnectionError) with backoff, 3.5 s per command by default, 11 s for Sentinel's
    discover_master over three Sentinels."""
    return Retry(NoBackoff(), 0)


def cluster_client(nodes: list[str], **kwargs: Any) -> ClusterClient:
    startup = [ClusterNode(host, int(port)) for host, _, port in (n.rpartition(":") for n in nodes)]
    return ClusterClient(startup_nodes=startup, decode_responses=True, **kwargs)


async def write_keys(client: ClusterClient) -> None:
    for index in range(KEYS):
        await client.set(f"record:{index}", str(index))
    assert await client.get("record:7") == "7"
    assert await client.get(f"record:{KEYS - 1}") == str(KEYS - 1)


@asynccontextmanager
async def sentinel_client(topology: SentinelSet, **kwargs: Any) -> AsyncIterator[Sentinel]:
    """redis-py's Sentinel on the topology's Sentinels, its connections closed after."""
    sentinel = Sentinel(  # type: ignore[no-untyped-call]
        topology.sentinel_addresses, socket_timeout=2, **kwargs
    )
    try:
        yield sentinel
    finally:
        for client in sentinel.sentinels:
            await client.aclose()


async def test_cluster_spreads_keys_over_every_primary(
    redis_cluster: RedisCluster, redis_cluster_nodes: list[str]
) -> None:
    assert len(redis_cluster_nodes) == 3
    assert redis_cluster.dbsizes() == dict.fromkeys(redis_cluster_nodes, 0)
    client = cluster_client(redis_cluster_nodes)
    try:
        await write_keys(client)
    finally:
        await client.aclose()
    sizes = redis_cluster.dbsizes()
    assert sum(sizes.values()) == KEYS
    assert all(size > 0 for size in sizes.values()), sizes


async def test_a_stopped_node_comes_back_with_its_slots(
    redis_cluster: RedisCluster, redis_cluster_nodes: list[str]
) -> None:
    stopped = redis_cluster.servers[1]
    stopped.stop()
    assert not stopped.running
    redis_cluster.reset()  # what redis_cluster_nodes does first
    assert redis_cluster.nodes == redis_cluster_nodes  # the same ports
    client = cluster_client(redis_cluster_nodes)
    try:
        await write_keys(client)
    finally:
        await client.aclose()
    assert all(size > 0 for size in redis_cluster.dbsizes().values())


async def test_a_password_cluster_refuses_a_client_without_it() -> None:
    with RedisCluster(password="cluster-secret") as cluster:
        cluster.start()
        for kwargs in ({}, {"password": "wrong"}):
            refused = cluster_client(cluster.nodes, **kwargs)
            try:
                with pytest.raises(RedisClusterException):
                    await refused.set("record:1", "1")
            finally:
                await refused.aclose()
        plain = redis.Redis(host="127.0.0.1", port=cluster.ports[0], retry=no_retry())
        try:
            with pytest.raises(AuthenticationError):
                await plain.ping()
        finally:
            await plain.aclose()

        client = cluster_client(cluster.nodes, password="cluster-secret")
        try:
            await write_keys(client)
        finally:
            await client.aclose()
        assert all(size > 0 for size in cluster.dbsizes().values())


async def test_sentinel_master_moves_on_failover(redis_sentinel: SentinelSet) -> None:
    name = redis_sentinel.master_name
    old = redis_sentinel.master_address()
    async with sentinel_client(redis_sentinel) as sentinel:
        assert await sentinel.discover_master(name) == old
        master = sentinel.master_for(name, socket_timeout=2)
        try:
            assert await master.set("before", "1")
            assert await master.get("before") == b"1"
            assert await master.wait(1, 2000) == 1  # on the replica too
        finally:
            await master.aclose()

        new = redis_sentinel.failover()

        assert new != old
        assert redis_sentinel.master_address() == new
        assert await sentinel.discover_master(name) == new
        fresh = sentinel.master_for(name, socket_timeout=2)
        try:
            assert await fresh.set("after", "2")
            assert await fresh.get("before") == b"1"  # replicated before the failover
        finally:
            await fresh.aclose()

    direct = redis.Redis(host=new[0], port=new[1])
    try:
        assert (await direct.role())[0] == b"master"
        assert await direct.get("after") == b"2"
    finally:
        await direct.aclose()
    old_node = redis_sentinel.node_at(old)
    role = old_node.command("ROLE")
    assert isinstance(role, list)
    assert role[:3] == ["slave", new[0], new[1]]


async def test_password_sentinels_and_data_nodes() -> None:
    with SentinelSet(password="data-secret", sentinel_password="sentinel-secret") as topology:
        topology.start()
        name = topology.master_name
        async with sentinel_client(
            topology, password="data-secret", sentinel_kwargs={"retry": no_retry()}
        ) as without:
            with pytest.raises(MasterNotFoundError):
                await without.discover_master(name)
        async with sentinel_client(
            topology, sentinel_kwargs={"password": "sentinel-secret"}, password="data-secret"
        ) as sentinel:
            assert await sentinel.discover_master(name) == topology.master_address()
            master = sentinel.master_for(name, socket_timeout=2)
            try:
                assert await master.set("record:1", "1")
                assert await master.get("record:1") == b"1"
            finally:
                await master.aclose()
        plain = redis.Redis(host="127.0.0.1", port=topology.master_address()[1], retry=no_retry())
        try:
            with pytest.raises(AuthenticationError):
                await plain.ping()
        finally:
            await plain.aclose()
