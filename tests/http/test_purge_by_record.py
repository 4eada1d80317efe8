"""DELETE /admin/cache?record=…, as docs/purging.md describes it: every entry of every
caller that holds a record, on every instance, and no other; soft, served stale and
refreshed once; a bad reference refused before anything is purged."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis.asyncio as redis
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from pytest_aiohttp import AiohttpServer

from gateway.demo import REQUEST_LOG, RequestLog, create_demo_app
from gateway.http.binding import UPSTREAMS

from ..conftest import FakeClock, GatewayFactory, base_url, near_of, redis_cache, until
from ..redis_server import RedisServer
from ..test_cli import run_cli

Client = TestClient[web.Request, web.Application]
ADMIN = {"Authorization": "Bearer admin-token-0123456789abcdef"}
TOKENS = ("demo-token", "second-caller-token")


async def gateway(
    factory: GatewayFactory, upstream: TestServer, cache: dict[str, Any], **extra: Any
) -> Client:
    client = await factory(
        base_url(upstream), cache=cache, admin={"token": ADMIN["Authorization"][7:]}, **extra
    )
    if cache.get("backend") == "redis":
        await until(lambda: near_of(client).live)
    return client


async def read(client: Client, path: str, token: str = TOKENS[0]) -> tuple[str, Any]:
    response = await client.get(path, headers={"Authorization": f"Bearer {token}"})
    assert response.status == 200, await response.text()
    return response.headers["X-Cache"], orjson.loads(await response.read())


async def purge(client: Client, query: str) -> tuple[int, Any]:
    response = await client.delete(f"/admin/cache?{query}", headers=ADMIN)
    return response.status, orjson.loads(await response.read())


def holds(answer: Any, account: str, user: str) -> bool:
    """Whether a page or a record holds the account or the user, embedded or not."""
    records = answer.get("data", [answer])
    for record in records:
        if "username" in record and record["id"] == user:
            return True
        if (
            record.get("account", {}).get("id") == account
            or record.get("user", {}).get("id") == user
        ):
            return True
    return False


def calls(log: RequestLog, path: str) -> int:
    return sum(1 for entry in log.entries if entry.path == path)


async def test_a_record_purge_reaches_every_callers_entries_on_every_instance(
    gateway_factory: GatewayFactory, aiohttp_server: AiohttpServer, redis_url: str
) -> None:
    server = await aiohttp_server(create_demo_app(tokens=frozenset(TOKENS)))
    log: RequestLog = server.app[REQUEST_LOG]
    first = await gateway(gateway_factory, server, redis_cache(redis_url))
    second = await gateway(gateway_factory, server, redis_cache(redis_url))
    x_cache, page = await read(second, "/expenses?limit=5")
    assert x_cache == "MISS"
    expense = page["data"][0]
    detail = f"/expenses/{expense['id']}"
    cached = [
        ("/expenses?limit=5", TOKENS[0]),
        ("/expenses?limit=5", TOKENS[1]),
        (detail, TOKENS[0]),
        ("/expenses?page=3&limit=5", TOKENS[0]),
        ("/users", TOKENS[0]),
    ]
    assert (await read(second, "/expenses?limit=5", TOKENS[1]))[0] == "MISS"
    assert (await read(second, detail))[0] == "MISS"
    assert (await read(second, "/expenses?page=3&limit=5"))[0] == "MISS"
    assert (await read(second, "/users"))[0] == "MISS"
    assert len(near_of(second)) == 5
    before = len(log.entries)

    status, body = await purge(first, f"record=expense:{expense['id'].upper()}")
    assert status == 200, body
    assert body == {
        "purged": "records",
        "records": [f"expense:{expense['id']}"],
        "mode": "hard",
        "entries": 3,  # the first page of both callers, and the expense itself
        "backend": "redis",
        "instances": {"told": 2, "confirmed": 2},
    }
    assert len(near_of(second)) == 2  # its copies of what the purge reached are gone
    for token in TOKENS:
        assert (await read(second, "/expenses?limit=5", token))[0] == "MISS"
    assert (await read(second, detail))[0] == "MISS"
    assert (await read(second, "/expenses?page=3&limit=5"))[0] == "HIT"
    assert (await read(second, "/users"))[0] == "HIT"
    assert len(log.entries) - before == 3
    assert (await read(first, detail))[0] == "HIT"  # stored again by the fill after it

    # embedded records: the expense's account and user, in whatever entry holds them
    account, user = expense["account"]["id"], expense["user"]["id"]
    held = {
        (path, token): holds(answer, account, user)
        for path, token in cached
        for answer in [(await read(first, path, token))[1]]
    }
    assert held[("/expenses?limit=5", TOKENS[1])]
    assert held[(detail, TOKENS[0])]
    status, body = await purge(second, f"record=account:{account}&record=user:{user}")
    assert status == 200, body
    assert body["records"] == [f"account:{account}", f"user:{user}"]
    assert body["entries"] == sum(held.values())
    assert body["instances"] == {"told": 2, "confirmed": 2}
    for (path, token), holding in held.items():
        assert (await read(first, path, token))[0] == ("MISS" if holding else "HIT"), path


async def test_a_soft_record_purge_serves_stale_and_refreshes_once(
    gateway_factory: GatewayFactory, aiohttp_server: AiohttpServer, redis_url: str, clock: FakeClock
) -> None:
    server = await aiohttp_server(create_demo_app(latency_ms=100))
    log: RequestLog = server.app[REQUEST_LOG]
    client = await gateway(gateway_factory, server, redis_cache(redis_url), clock=clock)
    _, record = await read(client, "/expenses?limit=1")
    expense_id = record["data"][0]["id"]
    assert (await read(client, f"/expenses/{expense_id}"))[0] == "MISS"
    clock.advance(5)

    status, body = await purge(client, f"record=expense:{expense_id}&mode=soft")
    assert (status, body["mode"], body["entries"]) == (200, "soft", 2)
    assert body["instances"] == {"told": 1, "confirmed": 1}
    before = calls(log, f"/expenses/{expense_id}")
    answers = await asyncio.gather(*(read(client, f"/expenses/{expense_id}") for _ in range(5)))
    assert {x_cache for x_cache, _ in answers} == {"STALE"}
    assert {orjson.dumps(answer) for _, answer in answers} == {orjson.dumps(answers[0][1])}
    pipeline = client.app[UPSTREAMS].current.pipeline
    await until(lambda: calls(log, f"/expenses/{expense_id}") == before + 1)
    await until(lambda: not pipeline.in_flight)  # the one refresh, in the background
    assert (await read(client, f"/expenses/{expense_id}"))[0] == "HIT"
    assert calls(log, f"/expenses/{expense_id}") == before + 1


async def test_a_bad_reference_is_refused_and_nothing_is_purged(
    gateway_factory: GatewayFactory, upstream: TestServer, upstream_log: RequestLog
) -> None:
    client = await gateway(gateway_factory, upstream, {"backend": "memory"})
    _, page = await read(client, "/expenses?limit=2")
    good = f"record=expense:{page['data'][0]['id']}"
    refused = {
        f"{good}&record=invoice:12": ("record", "'invoice:12': the kind must be one of"),
        f"{good}&record=expense:12": ("record", "'expense:12': expense ids are UUIDs"),
        "record=account:": ("record", "'account:': the id is empty"),
        "record=account:%0Aevil": ("record", "an account's id is printable text"),
        "record=account:%FF": ("record", "an account's id is printable text"),
        "record=account:%E2%80%8Bzero-width": ("record", "an account's id is printable text"),
        "record=account:next%C2%85line": ("record", "an account's id is printable text"),
        f"record=account:{'x' * 201}": ("record", "the id is longer than 200 characters"),
        "record=expense": ("record", "must be <kind>:<id>"),
        f"{good}&mode=later": ("mode", "must be given once, hard or soft"),
        f"{good}&route=expenses": ("route", "a purge is by route or by record, not both"),
        f"{good}&tag=x": ("tag", "unknown query parameter"),
        "&".join([good] * 101): ("record", "given 101 times; at most 100"),
        "route=expenses&mode=soft": ("mode", "a purge by route is hard; soft goes with record"),
        "mode=hard&mode=hard": ("mode", "a purge by route is hard"),
    }
    for query, (parameter, message) in refused.items():
        status, problem = await purge(client, query)
        assert status == 400, query
        assert problem["type"].endswith(":invalid-parameters"), problem
        assert [p["parameter"] for p in problem["errors"]][-1:] == [parameter], (query, problem)
        assert message in problem["errors"][-1]["message"], (query, problem)
    # nothing was purged: the page is still a hit
    assert (await read(client, "/expenses?limit=2"))[0] == "HIT"
    assert len(upstream_log.entries) == 1


async def test_a_record_purge_on_the_memory_backend(
    gateway_factory: GatewayFactory, upstream: TestServer, upstream_log: RequestLog
) -> None:
    client = await gateway(gateway_factory, upstream, {"backend": "memory"})
    _, page = await read(client, "/clients?limit=3")
    client_id = page["data"][1]["id"]
    await read(client, "/clients?page=2&limit=3")
    status, body = await purge(client, f"record=client:{client_id}")
    assert (status, body["entries"], body["backend"]) == (200, 1, "memory")
    assert "instances" not in body
    assert (await read(client, "/clients?limit=3"))[0] == "MISS"
    assert (await read(client, "/clients?page=2&limit=3"))[0] == "HIT"
    await purge(client, f"record=client:{client_id}&mode=soft")
    scrape = await (await client.get("/metrics")).text()
    for sample in (
        'gateway_cache_record_purges_total{mode="hard",outcome="done"} 1.0',
        'gateway_cache_record_purges_total{mode="soft",outcome="done"} 1.0',
        'gateway_cache_record_purged_entries_total{mode="hard"} 1.0',
        'gateway_cache_record_purged_entries_total{mode="soft"} 1.0',
        'gateway_cache_record_purge_duration_seconds_count{mode="hard"} 1.0',
    ):
        assert sample in scrape, sample


async def test_with_no_cache_a_record_purge_finds_nothing(
    gateway_factory: GatewayFactory, upstream: TestServer
) -> None:
    client = await gateway(gateway_factory, upstream, {"backend": "none"})
    status, body = await purge(client, "record=user:0c6f8d3e-1111-4000-8000-000000000001")
    assert (status, body["entries"], body["backend"]) == (200, 0, "none")


async def test_a_record_purge_during_a_redis_stall_says_its_outcome_is_unknown_and_still_happens(
    gateway_factory: GatewayFactory, upstream: TestServer, own_redis: RedisServer
) -> None:
    cache = redis_cache(own_redis.url, redis_timeout_ms=50)
    first = await gateway(gateway_factory, upstream, cache)
    second = await gateway(gateway_factory, upstream, cache)
    _, page = await read(second, "/expenses?limit=2")
    record = f"record=expense:{page['data'][0]['id']}"
    assert (await read(second, "/expenses?limit=2"))[0] == "HIT"
    await read(first, "/users")
    assert (len(near_of(first)), len(near_of(second))) == (1, 1)
    own_redis.freeze()
    try:
        status, problem = await purge(first, record)
        # this instance drops every copy at once: it cannot know which hold the record
        assert len(near_of(first)) == 0
    finally:
        await asyncio.sleep(0.3)  # shorter than the breaker's reset (5 s)
        own_redis.thaw()
    assert status == 503
    assert problem["type"].endswith(":purge-outcome-unknown")
    assert problem["outcome"] == "unknown"
    scrape = await (await first.get("/metrics")).text()
    assert 'gateway_cache_record_purges_total{mode="hard",outcome="unknown"} 1.0' in scrape
    # retried in the background: the other instance drops its copy, Redis's entry goes
    await until(lambda: len(near_of(second)) == 0)
    await until(lambda: near_of(second).live)
    assert (await read(second, "/expenses?limit=2"))[0] == "MISS"


async def test_the_purge_command_purges_records_of_the_running_gateway(
    gateway_factory: GatewayFactory, upstream: TestServer, redis_url: str, tmp_path: Path
) -> None:
    client = await gateway(gateway_factory, upstream, redis_cache(redis_url))
    _, page = await read(client, "/expenses?limit=2")
    expense_id = page["data"][0]["id"]
    await read(client, "/users")
    config = tmp_path / "gateway.toml"
    config.write_text(
        f'[server]\nport = {client.server.port}\n[admin]\ntoken = "{ADMIN["Authorization"][7:]}"\n'
    )

    code, out, err = await run_cli(
        "purge", "--config", str(config), "--record", f"expense:{expense_id.upper()}", "--soft"
    )
    assert (code, err) == (0, "")
    assert (
        out == f"1 entries holding expense:{expense_id} marked stale; 1 of 1 instances confirmed\n"
    )
    code, out, _ = await run_cli(
        "purge", "--config", str(config), "--record", f"expense:{expense_id}", "--json"
    )
    assert code == 0
    assert json.loads(out)["entries"] == 1
    assert (await read(client, "/expenses?limit=2"))[0] == "MISS"
    assert (await read(client, "/users"))[0] == "HIT"

    for args, message in (
        (("--record", "expense:12"), "--record 'expense:12': expense ids are UUIDs"),
        (("--soft",), "--soft goes with --record"),
        ((), "say what to purge"),
    ):
        code, out, err = await run_cli("purge", "--config", str(config), *args)
        assert (code, out) == (2, ""), args
        assert message in err
    assert (await read(client, "/users"))[0] == "HIT"  # none of them purged anything


async def test_a_record_purge_that_a_process_did_not_confirm_is_not_said_done(
    gateway_factory: GatewayFactory, upstream: TestServer, redis_url: str
) -> None:
    """A process Redis told but that does not confirm (an older gateway, a stalled
    one) may still serve what was purged: 503, with the counts."""
    client = await gateway(gateway_factory, upstream, redis_cache(redis_url))
    _, page = await read(client, "/expenses?limit=1")
    store = redis.Redis.from_url(redis_url)
    channels: list[bytes] = await store.pubsub_channels()  # type: ignore[assignment]
    (channel,) = [c for c in channels if c.endswith(b":invalidate")]
    silent = store.pubsub()
    await silent.subscribe(channel)
    try:
        status, problem = await purge(client, f"record=expense:{page['data'][0]['id']}")
    finally:
        await silent.aclose()  # type: ignore[no-untyped-call]
        await store.aclose()
    assert status == 503
    assert problem["type"].endswith(":purge-outcome-unknown")
    assert problem["instances"] == {"told": 2, "confirmed": 1}
    assert (await read(client, "/expenses?limit=1"))[0] == "MISS"  # done here all the same


async def test_the_index_size_reaches_the_metrics(
    gateway_factory: GatewayFactory,
    upstream: TestServer,
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """gateway_cache_record_index_keys and _bytes (docs/purging.md), asked of the
    backend every minute (here every 50 ms): with Redis, the sets of the records an
    entry holds."""
    monkeypatch.setattr("gateway.http.app.INDEX_SIZE_S", 0.05)
    client = await gateway(gateway_factory, upstream, redis_cache(redis_url, namespace="sized"))
    _, page = await read(client, "/expenses?limit=2")
    records = {f"expense:{item['id']}" for item in page["data"]}
    records |= {
        f"{kind}:{item[kind]['id']}"
        for item in page["data"]
        for kind in ("account", "client", "user")
    }

    async def gauges() -> tuple[float, float]:
        scrape = await (await client.get("/metrics")).text()
        found = dict(
            line.split(" ")
            for line in scrape.splitlines()
            if line.startswith("gateway_cache_record_index_")
        )
        return float(found["gateway_cache_record_index_keys"]), float(
            found["gateway_cache_record_index_bytes"]
        )

    sized: list[tuple[float, float]] = []

    async def measured() -> bool:
        sized.append(await gauges())
        return sized[-1][0] > 0

    async with asyncio.timeout(10):
        while not await measured():
            await asyncio.sleep(0.05)
    keys, size_bytes = sized[-1]
    assert keys >= len(records)  # every record's set (and the purge counter, if made)
    assert size_bytes > keys * 50
