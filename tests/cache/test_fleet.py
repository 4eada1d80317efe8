"""Several gateway instances on one real Redis: one upstream call per cold key across
them, purges that are in force everywhere before they are answered (or say that their
outcome is unknown), and generations that no deletion or eviction can turn back."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as redis
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gateway.cache.fleet import Fleet
from gateway.cache.keyspace import generation_key, lease_key
from gateway.config.live import ConfigSource
from gateway.demo import RequestLog
from gateway.http.admin import LIVE
from gateway.http.binding import UPSTREAMS
from gateway.records.credentials import parse_authorization
from gateway.records.routes import parse_record_query
from gateway.routing.standard import ROUTES

from ..conftest import (
    AUTH,
    KEY_SECRET,
    FakeClock,
    GatewayFactory,
    base_url,
    fleet_of,
    near_cache_live,
    near_of,
    redis_cache,
    until,
)
from ..redis_server import RedisServer
from ..test_cli import run_cli

Client = TestClient[web.Request, web.Application]
ADMIN = {"Authorization": "Bearer admin-token-0123456789abcdef"}


async def fleet(
    factory: GatewayFactory,
    server: TestServer,
    url: str,
    n: int = 3,
    cache: dict[str, Any] | None = None,
    **sections: dict[str, Any],
) -> list[Client]:
    clients = [
        await factory(
            base_url(server),
            cache=redis_cache(url, **(cache or {})),
            admin={"token": ADMIN["Authorization"].removeprefix("Bearer ")},
            **sections,
        )
        for _ in range(n)
    ]
    for client in clients:
        await near_cache_live(client)
    return clients


async def fetch(client: Client, path: str) -> tuple[int, bytes, str, str]:
    response = await client.get(path, headers=AUTH)
    body = await response.read()
    return (
        response.status,
        body,
        response.headers.get("X-Cache", ""),
        response.headers.get("Cache-Status", ""),
    )


def prefix_of(client: Client) -> str:
    pipeline = client.app[UPSTREAMS].current.pipeline
    return pipeline.keyer.prefix


async def test_a_burst_over_three_instances_makes_one_upstream_call(
    gateway_factory: GatewayFactory, upstream: TestServer, upstream_log: RequestLog, redis_url: str
) -> None:
    clients = await fleet(gateway_factory, upstream, redis_url)
    for burst in range(5):
        path = f"/expenses?page={burst + 1}&limit=7"
        before = len(upstream_log)
        answers = await asyncio.gather(*(fetch(clients[index % 3], path) for index in range(300)))
        assert {status for status, *_ in answers} == {200}
        assert len({body for _, body, *_ in answers}) == 1
        assert len(upstream_log) - before == 1, f"burst {burst}"
    metrics = await (await clients[0].get("/metrics")).text()
    assert 'gateway_coalesced_requests_total{kind="process",route="expenses"}' in metrics


async def test_the_others_wait_for_the_filled_entry_and_say_so(
    gateway_factory: GatewayFactory, upstream: TestServer, upstream_log: RequestLog, redis_url: str
) -> None:
    first, second = await fleet(gateway_factory, upstream, redis_url, n=2)
    store = redis.Redis.from_url(redis_url)
    # another instance holds the lease of /users (it is calling the upstream)
    lease = lease_of_users(second)
    await store.set(lease, b"someone-else", px=10_000)
    waiting = asyncio.ensure_future(fetch(second, "/users"))
    await asyncio.sleep(0.2)
    assert not waiting.done()  # it waits for the entry rather than calling the upstream
    assert len(upstream_log) == 0
    # the holder fills the entry (here: the first instance, without a lease of its own)
    await store.delete(lease)
    assert (await fetch(first, "/users"))[2] == "MISS"
    status, _, x_cache, cache_status = await waiting
    assert status == 200
    assert (x_cache, cache_status) == ("MISS", "records-gateway; fwd=miss; collapsed")
    assert len(upstream_log) == 1
    metrics = await (await second.get("/metrics")).text()
    assert 'gateway_coalesced_requests_total{kind="fleet",route="users"} 1.0' in metrics
    await store.aclose()


def lease_of_users(client: Client) -> str:
    """The Redis key of the fill lease of ``GET /users`` with AUTH's token."""
    users = next(route for route in ROUTES if route.name == "users")
    query = parse_record_query(users, None, [], max_limit=100)
    keyer = client.app[UPSTREAMS].current.keyer
    key = keyer.key(query, parse_authorization(AUTH["Authorization"]))
    return lease_key(key)


async def test_a_lease_that_is_never_filled_costs_at_most_the_upstream_timeout(
    gateway_factory: GatewayFactory, upstream: TestServer, upstream_log: RequestLog, redis_url: str
) -> None:
    """Held for docs/deployment.md, "Faults, and what callers see": an instance killed while
    filling a key.
    """
    (client,) = await fleet(gateway_factory, upstream, redis_url, n=1, upstream={"timeout_s": 1.0})
    store = redis.Redis.from_url(redis_url)
    # a holder that died: its lease stays for 60 s, longer than the upstream timeout
    await store.set(lease_of_users(client), b"dead-instance", px=60_000)
    status, _, x_cache, cache_status = await fetch(client, "/users")
    assert status == 200
    assert (x_cache, cache_status) == ("MISS", "records-gateway; fwd=miss; stored")
    assert len(upstream_log) == 1
    await store.aclose()


async def test_a_purge_is_in_force_on_every_instance_before_it_is_answered(
    gateway_factory: GatewayFactory, upstream: TestServer, redis_url: str
) -> None:
    clients = await fleet(gateway_factory, upstream, redis_url)
    for client in clients:
        await fetch(client, "/users")
        await fetch(client, "/clients")
        assert len(near_of(client)) == 2
    response = await clients[0].delete("/admin/cache?route=users", headers=ADMIN)
    assert response.status == 200
    body = await response.json()
    # checked as the answer arrives, without waiting: every process had confirmed
    assert [len(near_of(client)) for client in clients] == [1, 1, 1]
    assert body == {
        "purged": "users",
        "backend": "redis",
        "instances": {"told": 3, "confirmed": 3},
    }
    for client in clients:
        assert (await fetch(client, "/clients"))[2] == "HIT"
    assert (await fetch(clients[1], "/users"))[2] == "MISS"


async def test_a_purge_during_a_redis_stall_says_its_outcome_is_unknown_and_still_happens(
    gateway_factory: GatewayFactory, upstream: TestServer, own_redis: RedisServer
) -> None:
    """Held for docs/deployment.md, "Faults, and what callers see": a purge during a Redis stall."""
    first, second = await fleet(
        gateway_factory, upstream, own_redis.url, n=2, cache={"redis_timeout_ms": 50}
    )
    for client in (first, second):
        await fetch(client, "/users")
        await fetch(client, "/users")
        assert len(near_of(client)) == 1
    own_redis.freeze()
    try:
        response = await first.delete("/admin/cache?route=users", headers=ADMIN)
        # this instance stops serving its copies at once, whatever Redis did
        assert len(near_of(first)) == 0
    finally:
        await asyncio.sleep(0.3)  # a stall shorter than the breaker's reset (5 s)
        own_redis.thaw()
    assert response.status == 503
    problem = await response.json()
    assert problem["type"].endswith(":purge-outcome-unknown")
    assert problem["outcome"] == "unknown"
    assert "may have happened or not" in problem["detail"]
    # the purge is retried in the background: the other instance drops its copy and
    # Redis's entry is purged (a miss, not a hit from Redis)
    await until(lambda: len(near_of(second)) == 0)
    await until(lambda: near_of(second).live)
    assert (await fetch(second, "/users"))[2] == "MISS"


async def test_a_deleted_generation_never_brings_back_a_purged_entry(
    gateway_factory: GatewayFactory, upstream: TestServer, upstream_log: RequestLog, redis_url: str
) -> None:
    """Held for docs/deployment.md, "Faults, and what callers see": a generation key deleted,
    evicted, or overwritten by hand.
    """
    (client,) = await fleet(gateway_factory, upstream, redis_url, n=1, cache={"near_cache": False})
    assert (await fetch(client, "/users"))[2] == "MISS"
    assert (await fetch(client, "/users"))[2] == "HIT"
    assert (await client.delete("/admin/cache?route=users", headers=ADMIN)).status == 200
    store = redis.Redis.from_url(redis_url)
    prefix = prefix_of(client)
    assert await store.delete(generation_key(prefix, None), generation_key(prefix, "users")) == 2
    assert (await fetch(client, "/users"))[2] == "MISS"
    assert len(upstream_log) == 2
    await store.aclose()


async def test_an_evicting_redis_never_serves_a_purged_entry(
    gateway_factory: GatewayFactory, upstream: TestServer, own_redis: RedisServer
) -> None:
    """Held for docs/deployment.md, "Faults, and what callers see": a generation key deleted,
    evicted, or overwritten by hand.
    """
    store = redis.Redis.from_url(own_redis.url)
    await store.config_set("maxmemory", 4 * 1024 * 1024)
    await store.config_set("maxmemory-policy", "allkeys-lru")
    (client,) = await fleet(
        gateway_factory, upstream, own_redis.url, n=1, cache={"near_cache": False}
    )
    paths = [f"/expenses?page={page}&limit=5" for page in range(1, 21)]
    for path in paths:
        assert (await fetch(client, path))[2] == "MISS"
    assert (await client.delete("/admin/cache?route=expenses", headers=ADMIN)).status == 200
    entries = [key async for key in store.scan_iter(f"{prefix_of(client)}:e:*")]
    assert len(entries) == len(paths)
    generation = generation_key(prefix_of(client), "expenses")
    # Redis's LRU clock counts whole seconds: let the generations grow older than
    # the entries, which are touched below while Redis fills up
    await asyncio.sleep(1.1)
    filler = b"x" * 64 * 1024
    for index in range(2000):  # fill Redis until eviction takes the route's generation
        await store.set(f"filler:{index}", filler)
        for entry in entries:
            await store.get(entry)  # the entries stay recently used
        if not await store.exists(generation):
            break
    assert not await store.exists(generation)
    fillers = [key async for key in store.scan_iter("filler:*")]
    await store.delete(*fillers)  # room again, the purged entries kept
    # (counted once there is room: while Redis is full, it may evict one more)
    survivors = [entry for entry in entries if await store.exists(entry)]
    assert survivors  # purged entries still in Redis: what must not be served
    answers = [await fetch(client, path) for path in paths]
    assert {x_cache for _, _, x_cache, _ in answers} == {"MISS"}
    await store.aclose()


@pytest.mark.parametrize("near_cache", [True, False])
async def test_within_one_process_every_burst_makes_exactly_one_call(
    gateway_factory: GatewayFactory,
    upstream: TestServer,
    upstream_log: RequestLog,
    redis_url: str,
    near_cache: bool,
) -> None:
    """The reference upstream answers within a millisecond or two: a fill often ends
    while later requests of the burst are still reading Redis."""
    (client,) = await fleet(
        gateway_factory, upstream, redis_url, n=1, cache={"near_cache": near_cache}
    )
    extra = []
    for burst in range(40):
        before = len(upstream_log)
        path = f"/expenses?page={burst + 1}&limit=3"
        answers = await asyncio.gather(*(fetch(client, path) for _ in range(200)))
        assert {status for status, *_ in answers} == {200}
        if len(upstream_log) - before != 1:
            extra.append((burst, len(upstream_log) - before))
    assert extra == []


async def test_instances_that_disagree_on_the_cache_configuration_are_reported(
    gateway_factory: GatewayFactory,
    upstream: TestServer,
    redis_url: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Held for docs/deployment.md, "Faults, and what callers see": instances with
    different TTLs."""
    config = tmp_path / "config.toml"
    cache = f'backend = "redis"\nredis_url = "{redis_url}"\nkey_secret = "{KEY_SECRET}"\n'
    config.write_text(f'[upstream]\nbase_url = "{base_url(upstream)}"\n[cache]\n{cache}')
    first, second = await fleet(gateway_factory, upstream, redis_url, n=2)
    first.app[LIVE]._source = ConfigSource(config)

    async def announce_all() -> None:
        for client in (first, second):
            await fleet_of(client).announce()

    await announce_all()
    for client in (first, second):
        report = await (await client.get("/readyz")).json()
        assert report["status"] == "ok"
        assert report["components"]["fleet"]["status"] == "ok"
        assert report["components"]["fleet"]["instances"] == 2
    assert "gateway_fleet_configurations 1.0" in await (await first.get("/metrics")).text()

    # a reload (SIGHUP) on one instance only changes its TTLs
    config.write_text(
        f'[upstream]\nbase_url = "{base_url(upstream)}"\n[cache]\n{cache}[cache.ttl_s]\nusers = 5\n'
    )
    assert (await first.app[LIVE].reload()).applied == ["cache.ttl_s"]
    caplog.clear()
    for _ in range(3):
        await announce_all()
    for client in (first, second):
        response = await client.get("/readyz")
        assert response.status == 200
        report = await response.json()
        assert report["status"] == "degraded"
        fleet_report = report["components"]["fleet"]
        assert fleet_report["status"] == "degraded"
        assert sorted(fleet_report["configurations"].values()) == [1, 1]
        metrics = await (await client.get("/metrics")).text()
        assert "gateway_fleet_configurations 2.0" in metrics
    # an entry keeps the TTL of the instance that stored it, on every instance
    stored = await first.get("/users?limit=3", headers=AUTH)
    assert stored.headers["Cache-Control"] == "private, max-age=5"
    read = await second.get("/users?limit=3", headers=AUTH)
    assert read.headers["X-Cache"] == "HIT"
    assert read.headers["Cache-Control"] in ("private, max-age=5", "private, max-age=4")
    logged = [r for r in caplog.records if getattr(r, "event", None) == "fleet_disagreement"]
    assert len(logged) == 2  # once by each instance, not once per announcement
    assert {r.__dict__["theirs"] for r in logged} == {
        fleet_of(first).report()["fingerprint"],
        fleet_of(second).report()["fingerprint"],
    }

    # the instance that differed stops: the fleet agrees again
    await first.close()
    await fleet_of(second).announce()
    report = await (await second.get("/readyz")).json()
    assert report["components"]["fleet"]["status"] == "ok"
    assert report["components"]["fleet"]["instances"] == 1


async def test_an_instance_that_stopped_announcing_leaves_the_fleet(redis_url: str) -> None:
    """A killed instance deletes nothing: its announcement expires after three periods
    and the next reader removes it.

    Held for docs/deployment.md, "Faults, and what callers see": an instance killed while filling a
    key.
    """
    store = redis.Redis.from_url(redis_url)
    now = [1000.0]
    killed = Fleet(store, prefix="rg:t", fingerprint=lambda: "aaa", wall=lambda: now[0])
    alive = Fleet(store, prefix="rg:t", fingerprint=lambda: "bbb", wall=lambda: now[0])
    await killed.announce()
    await alive.announce()
    assert alive.report()["status"] == "degraded"
    assert alive.configurations() == 2
    now[0] += 3 * alive.every_s + 1
    await alive.announce()
    assert alive.report() == {
        "status": "ok",
        "fingerprint": "bbb",
        "instances": 1,
        "configurations": {"bbb": 1},
        "lastError": None,
    }
    assert await store.hkeys("rg:t:fleet") == [alive.instance.encode()]
    await store.aclose()


async def test_a_purge_whose_invalidation_cannot_be_published_is_retried_until_it_is(
    gateway_factory: GatewayFactory, upstream: TestServer, own_redis: RedisServer
) -> None:
    """The new generation reaches Redis but PUBLISH is refused (here by an ACL): the
    answer says the outcome is unknown, and the invalidation is published as soon as
    Redis takes it, so the other instance drops its copy."""
    store = redis.Redis.from_url(own_redis.url)
    await store.acl_setuser(
        "gateway",
        enabled=True,
        passwords=["+gateway-secret-1"],
        keys=["*"],
        channels=["*"],
        commands=["+@all"],
    )
    first, second = await fleet(
        gateway_factory,
        upstream,
        own_redis.url,
        n=2,
        cache={"redis_username": "gateway", "redis_password": "gateway-secret-1"},
    )
    for client in (first, second):
        await fetch(client, "/users")
        await fetch(client, "/users")
        assert len(near_of(client)) == 1
    await store.acl_setuser("gateway", commands=["-publish"])
    response = await first.delete("/admin/cache?route=users", headers=ADMIN)
    assert response.status == 503
    assert (await response.json())["outcome"] == "unknown"
    assert len(near_of(first)) == 0
    assert len(near_of(second)) == 1  # not told yet
    await store.acl_setuser("gateway", commands=["+publish"])
    await until(lambda: len(near_of(second)) == 0)
    assert (await fetch(second, "/users"))[2] == "MISS"  # the generation was new
    await store.aclose()


async def test_while_another_instance_fills_a_stale_entry_is_served_at_once(
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
            near_cache=False,
            stale_while_revalidate_s=0,
            stale_if_error_s=600,
            ttl_s={"users": 10},
        ),
    )
    assert (await fetch(client, "/users"))[2] == "MISS"
    clock.advance(30)  # past the TTL and the revalidate window, within stale-if-error
    store = redis.Redis.from_url(redis_url)
    await store.set(lease_of_users(client), b"another-instance", px=10_000)
    status, _, x_cache, cache_status = await fetch(client, "/users")
    assert (status, x_cache) == (200, "STALE")
    assert cache_status == "records-gateway; fwd=stale; collapsed"
    assert len(upstream_log) == 1
    metrics = await (await client.get("/metrics")).text()
    assert 'gateway_coalesced_requests_total{kind="fleet",route="users"} 1.0' in metrics
    await store.aclose()


async def test_a_purge_while_redis_is_down_says_its_outcome_is_unknown(
    gateway_factory: GatewayFactory, upstream: TestServer, own_redis: RedisServer
) -> None:
    """Held for docs/deployment.md, "Faults, and what callers see": Redis down (refused)."""
    (client,) = await fleet(gateway_factory, upstream, own_redis.url, n=1)
    own_redis.stop()
    response = await client.delete("/admin/cache", headers=ADMIN)
    assert response.status == 503
    problem = await response.json()
    assert problem["type"].endswith(":purge-outcome-unknown")
    assert problem["outcome"] == "unknown"
    reply = await client.get("/users", headers=AUTH)
    assert reply.status == 200
    assert reply.headers["Cache-Status"] == "records-gateway; fwd=miss; detail=cache-unavailable"


async def test_every_instance_announces_its_readiness_and_a_stopped_one_leaves(
    redis_url: str,
) -> None:
    """docs/console.md, "Fleet": each instance's readiness as it last announced it; one
    that stopped announcing is gone after three periods, its field removed."""
    store = redis.Redis.from_url(redis_url)
    now = [2000.0]

    def said(status: str) -> Any:
        return lambda: {"status": status, "components": {"upstream": status}, "circuit": "closed"}

    killed = Fleet(store, prefix="rg:r", fingerprint=lambda: "aaa", wall=lambda: now[0])
    alive = Fleet(store, prefix="rg:r", fingerprint=lambda: "aaa", wall=lambda: now[0])
    killed._readiness, alive._readiness = said("down"), said("ok")  # as start() sets them
    await killed.announce()
    now[0] += 2
    await alive.announce()
    seen = {item["instance"]: item for item in alive.instances()}
    assert seen[killed.instance]["status"] == "down"
    assert seen[killed.instance]["secondsAgo"] == 2.0
    assert seen[alive.instance] == {
        "instance": alive.instance,
        "mine": True,
        "fingerprint": "aaa",
        "secondsAgo": 0.0,
        "status": "ok",
        "components": {"upstream": "ok"},
        "circuit": "closed",
    }
    now[0] += 3 * alive.every_s + 1
    await alive.announce()
    assert [item["instance"] for item in alive.instances()] == [alive.instance]
    assert await store.hkeys("rg:r:fleet-ready") == [alive.instance.encode()]
    await store.aclose()


async def test_admin_fleet_lists_every_instance_on_the_redis_and_one_alone_without(
    gateway_factory: GatewayFactory, upstream: TestServer, redis_url: str
) -> None:
    """GET /admin/fleet (docs/console.md, "Fleet"): the instances sharing a Redis, each
    with its readiness; on the memory backend, the process answering alone."""
    clients = await fleet(gateway_factory, upstream, redis_url, n=2)
    for page, client in enumerate(clients, 1):  # traffic that says how the upstream is
        assert (await fetch(client, f"/users?page={page}"))[0] == 200
    for client in (*clients, clients[0]):  # the first reads what the second announced
        binding_fleet = client.app[UPSTREAMS].current.fleet
        assert binding_fleet is not None
        await binding_fleet.announce()
    answer = await clients[0].get("/admin/fleet", headers=ADMIN)
    assert answer.status == 200
    body = await answer.json()
    assert body["shared"] is True
    assert len(body["instances"]) == 2
    assert [item["mine"] for item in body["instances"]].count(True) == 1
    for item in body["instances"]:
        assert item["status"] == "ok"
        assert set(item["components"]) == {"upstream", "cache", "fleet"}
        assert item["circuit"] == "closed"
    assert (await clients[0].get("/admin/fleet")).status == 401

    alone = await gateway_factory(
        base_url(upstream), admin={"token": ADMIN["Authorization"].removeprefix("Bearer ")}
    )
    body = await (await alone.get("/admin/fleet", headers=ADMIN)).json()
    assert body["shared"] is False
    assert [item["mine"] for item in body["instances"]] == [True]
    # nothing said yet of the upstream: unknown, not ok
    assert body["instances"][0]["status"] == "unknown"


async def test_the_cli_says_what_the_console_s_fleet_view_shows(
    gateway_factory: GatewayFactory, upstream: TestServer, redis_url: str, tmp_path: Path
) -> None:
    """docs/console.md ("nothing on the page the CLI cannot say"): `records-gateway
    fleet` lists the processes and their readiness, `running-config` the configuration
    in force, secrets redacted."""
    token = ADMIN["Authorization"].removeprefix("Bearer ")
    clients = await fleet(gateway_factory, upstream, redis_url, n=2)
    for client in (*clients, clients[0]):
        binding_fleet = client.app[UPSTREAMS].current.fleet
        assert binding_fleet is not None
        await binding_fleet.announce()
    config = tmp_path / "gateway.toml"
    config.write_text(f'[server]\nport = {clients[0].server.port}\n[admin]\ntoken = "{token}"\n')
    code, out, err = await run_cli("fleet", "--config", str(config))
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["instance", "status", "circuit", "seen"]
    assert len(lines) == 3
    assert sum("(this)" in line for line in lines) == 1
    code, out, err = await run_cli("running-config", "--config", str(config))
    assert (code, err) == (0, "")
    running = json.loads(out)
    assert running["cache"]["backend"] == "redis"
    assert running["admin"]["token"] == "**********"
    assert token not in out
