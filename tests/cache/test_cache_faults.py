"""Redis faults that a PING does not see, against real redis-servers: a full noeviction
Redis, a read-only replica, a cluster node asked for keys of other slots, a frozen
server. Each request is still answered from the upstream; /readyz names the fault; the
breaker skips a Redis whose writes fail although its reads pass."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis.asyncio as redis
from aiohttp import ClientResponse, web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families
from redis.exceptions import OutOfMemoryError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.cache.redis import RedisBackend
from gateway.demo import RequestLog
from gateway.http.binding import UPSTREAMS
from gateway.ops.circuit import CircuitState

from ..conftest import AUTH, GatewayFactory, base_url, redis_cache
from ..redis_server import RedisServer

Client = TestClient[web.Request, web.Application]
NO_CHECK_LIMIT = {"check_interval_s": 0}
OPEN = 2.0
# redis-py names the server's error code (OOM, READONLY, MOVED, CROSSSLOT) by its class
OOM = "redis SET: OutOfMemoryError: command not allowed when used memory > 'maxmemory'."
READONLY = "ReadOnlyError: You can't write against a read only replica."


async def get(client: Client, path: str) -> ClientResponse:
    reply = await client.get(path, headers=AUTH)
    await reply.read()
    return reply


async def ready(client: Client) -> tuple[int, dict[str, Any]]:
    reply = await client.get("/readyz")
    report: dict[str, Any] = await reply.json()
    return reply.status, report


async def circuit_state(client: Client) -> float:
    """gateway_cache_circuit_state on /metrics: 0 closed, 1 half-open, 2 open."""
    text = await (await client.get("/metrics")).text()
    (value,) = [
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "gateway_cache_circuit_state"
    ]
    return value


async def served_from_the_upstream(client: Client, path: str) -> None:
    reply = await get(client, path)
    assert reply.status == 200
    assert reply.headers["X-Cache"] == "MISS"


async def seed(gateway_factory: GatewayFactory, upstream: TestServer, url: str) -> None:
    """Another instance on the same Redis serves /users first: the purge generations
    exist and one entry is stored, as on a Redis that has been in use."""
    other = await gateway_factory(base_url(upstream), cache=redis_cache(url, near_cache=False))
    assert (await get(other, "/users")).headers["Cache-Status"].endswith("stored")


async def fill(url: str) -> None:
    """Make the Redis at ``url`` a full one that evicts nothing: writes fail with OOM."""
    control = redis.Redis.from_url(url)
    try:
        await control.config_set("maxmemory-policy", "noeviction")
        used = int((await control.info("memory"))["used_memory"])
        await control.config_set("maxmemory", used + 1024 * 1024)
        for number in range(100):
            try:
                await control.set(f"filler:{number}", b"x" * 64 * 1024)
            except OutOfMemoryError:
                break
        else:
            raise AssertionError("Redis never filled up")
        # That refusal counted the filler's own request buffer, freed since: put the
        # bound well below what the data alone now takes, so that every write fails.
        used = int((await control.info("memory"))["used_memory"])
        await control.config_set("maxmemory", used - 256 * 1024)
        with pytest.raises(OutOfMemoryError):
            await control.set("filler:small", b"x")
    finally:
        await control.aclose()


async def test_a_full_noeviction_redis_degrades_readiness_and_opens_the_breaker(
    gateway_factory: GatewayFactory,
    upstream: TestServer,
    upstream_log: RequestLog,
    own_redis: RedisServer,
) -> None:
    """Held for docs/deployment.md, "Faults, and what callers see": Redis full
    (`noeviction`, OOM)."""
    await seed(gateway_factory, upstream, own_redis.url)
    client = await gateway_factory(
        base_url(upstream),
        cache=redis_cache(own_redis.url, near_cache=False),
        health=NO_CHECK_LIMIT,
    )
    await fill(own_redis.url)
    assert (await get(client, "/users")).headers["X-Cache"] == "HIT"  # reads still pass
    upstream_log.clear()

    for page in (2, 3):
        await served_from_the_upstream(client, f"/users?page={page}")
    status, report = await ready(client)
    assert (status, report["status"]) == (200, "degraded")
    cache = report["components"]["cache"]
    # PING answers and every read passed, but every write failed
    assert (cache["status"], cache["source"], cache["circuit"]) == (
        "degraded",
        "traffic",
        "closed",
    )
    assert cache["lastError"] == OOM
    assert cache["reads"]["failed"] == 0
    assert cache["reads"]["ok"] >= 3
    assert cache["writes"]["ok"] == 0
    assert cache["writes"]["failed"] >= 2

    # half of the calls or more fail, never five in a row: the share opens the breaker
    for page in range(4, 14):
        await served_from_the_upstream(client, f"/users?page={page}")
    assert await circuit_state(client) == OPEN
    assert client.app[UPSTREAMS].current.cache.breaker.state is CircuitState.OPEN
    cache = (await ready(client))[1]["components"]["cache"]
    assert (cache["status"], cache["circuit"]) == ("degraded", "open")
    assert cache["lastError"] == OOM
    # every request was answered by the upstream (the token-less calls are /readyz's)
    assert len([r for r in upstream_log.entries if r.authorization is not None]) == 12


async def test_a_read_only_replica_degrades_readiness(
    gateway_factory: GatewayFactory,
    upstream: TestServer,
    own_redis: RedisServer,
) -> None:
    """Held for docs/deployment.md, "Faults, and what callers see": a read-only replica configured
    as the server.
    """
    replica = RedisServer()
    replica.start()
    try:
        await seed(gateway_factory, upstream, own_redis.url)
        await make_replica(replica, own_redis)
        client = await gateway_factory(
            base_url(upstream),
            cache=redis_cache(replica.url, near_cache=False),
            health=NO_CHECK_LIMIT,
        )
        # no traffic yet: the probe's write is refused (a PING would pass)
        status, report = await ready(client)
        cache = report["components"]["cache"]
        assert (status, report["status"]) == (200, "degraded")
        assert (cache["status"], cache["source"]) == ("down", "check")
        assert cache["lastError"] == "redis SET: " + READONLY

        assert (await get(client, "/users")).headers["X-Cache"] == "HIT"  # replicated
        for page in (2, 3, 4):
            await served_from_the_upstream(client, f"/users?page={page}")
        status, report = await ready(client)
        cache = report["components"]["cache"]
        assert (status, report["status"]) == (200, "degraded")
        assert (cache["status"], cache["source"]) == ("degraded", "traffic")
        assert cache["lastError"] == "redis SET: " + READONLY
        assert cache["reads"]["failed"] == 0
        assert cache["reads"]["ok"] >= 4
        assert cache["writes"]["failed"] >= 3
    finally:
        replica.close()


async def make_replica(replica: RedisServer, primary: RedisServer) -> None:
    """REPLICAOF, then wait (bounded) until the replica's link is up and it holds what
    the primary holds."""
    control = redis.Redis.from_url(replica.url)
    source = redis.Redis.from_url(primary.url)
    try:
        await control.replicaof("127.0.0.1", primary.port)
        deadline = time.monotonic() + 10
        while True:
            info = await control.info("replication")
            if info.get("master_link_status") == "up" and (
                await control.dbsize() == await source.dbsize()
            ):
                return
            assert time.monotonic() < deadline, f"the replica did not sync: {info}"
            await asyncio.sleep(0.05)
    finally:
        await control.aclose()
        await source.aclose()


@pytest.fixture
def frozen(own_redis: RedisServer) -> Iterator[RedisServer]:
    """``own_redis``, thawed after the test whatever happened."""
    yield own_redis
    own_redis.thaw()


async def test_a_frozen_redis_times_out_and_readiness_says_so(
    gateway_factory: GatewayFactory, upstream: TestServer, frozen: RedisServer
) -> None:
    """Held for docs/deployment.md, "Faults, and what callers see": Redis frozen (no answer)."""
    client = await gateway_factory(
        base_url(upstream),
        cache=redis_cache(frozen.url, near_cache=False, redis_timeout_ms=100),
        health=NO_CHECK_LIMIT,
    )
    assert (await get(client, "/users")).headers["Cache-Status"].endswith("stored")
    frozen.freeze()
    for page in range(2, 8):
        await served_from_the_upstream(client, f"/users?page={page}")
    assert await circuit_state(client) == OPEN
    status, report = await ready(client)
    cache = report["components"]["cache"]
    assert (status, report["status"]) == (200, "degraded")
    # reads passed within the window, then timed out: degraded, not down
    assert (cache["status"], cache["lastError"]) == (
        "degraded",
        "redis GET: no answer within 100 ms",
    )
    assert (cache["source"], cache["circuit"]) == ("traffic", "open")


async def test_a_frozen_redis_without_traffic_is_down(
    gateway_factory: GatewayFactory, upstream: TestServer, frozen: RedisServer
) -> None:
    client = await gateway_factory(
        base_url(upstream),
        cache=redis_cache(frozen.url, near_cache=False, redis_timeout_ms=100),
        health=NO_CHECK_LIMIT,
    )
    assert (await ready(client))[1]["components"]["cache"]["status"] == "ok"
    frozen.freeze()
    status, report = await ready(client)
    cache = report["components"]["cache"]
    assert (status, report["status"]) == (200, "degraded")
    # the probe's write timed out (not a PING)
    assert (cache["status"], cache["lastError"]) == ("down", "redis SET: no answer within 100 ms")
    assert cache["source"] == "check"
    await served_from_the_upstream(client, "/users")


async def test_a_cluster_node_used_as_a_standalone_server(
    gateway_factory: GatewayFactory, upstream: TestServer, redis_cluster_nodes: list[str]
) -> None:
    """Held for docs/deployment.md, "Faults, and what callers see": a cluster node configured as a
    standalone server.
    """
    client = await gateway_factory(
        base_url(upstream),
        cache=redis_cache(f"redis://{redis_cluster_nodes[0]}/0", near_cache=False),
        health=NO_CHECK_LIMIT,
    )

    def cluster_error(text: str) -> bool:
        return "ClusterCrossSlotError: " in text or "MovedError: " in text

    # PING answers, but the probe's read of keys in several slots does not
    status, report = await ready(client)
    cache = report["components"]["cache"]
    assert (status, report["status"]) == (200, "degraded")
    assert (cache["status"], cache["source"]) == ("down", "check")
    assert cluster_error(cache["lastError"]), cache["lastError"]

    for page in range(1, 7):
        reply = await get(client, f"/users?page={page}")
        assert reply.status == 200
        assert reply.headers["Cache-Status"] == (
            "records-gateway; fwd=miss; detail=cache-unavailable"
        )
    assert await circuit_state(client) == OPEN
    status, report = await ready(client)
    cache = report["components"]["cache"]
    assert (status, report["status"]) == (200, "degraded")
    assert (cache["status"], cache["source"], cache["circuit"]) == ("down", "traffic", "open")
    assert cache["reads"]["ok"] == 0
    assert cluster_error(cache["lastError"]), cache["lastError"]


class ClosesLate(redis.Redis):
    """A client whose connections do not close within their timeout (a loaded
    machine, a Redis that stopped reading): its close raises redis-py's TimeoutError
    once it has let go of them."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        raise RedisTimeoutError("Timed out closing connection after 0.1")


async def test_a_redis_client_that_does_not_close_in_time_is_logged_not_raised(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Closing the Redis backend whose client times out while closing: the close
    returns (what closes after it, the upstream's connection pool, still closes), and
    the log says so."""
    backend = RedisBackend(ClosesLate.from_url(redis_url), prefix="rg:test", timeout_s=1.0)
    await backend.probe()
    await backend.close()
    events = [
        (r.levelname, getattr(r, "event", None), getattr(r, "error", None)) for r in caplog.records
    ]
    assert ("WARNING", "redis_close_failed", "TimeoutError") in events
