"""The evidence of how often answers change: every way the upstream replaces a cached
answer counts whether it changed and how old it was; GET /admin/ttl and
``records-gateway ttl-advice`` turn it into advice."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from pytest_aiohttp import AiohttpClient, AiohttpServer

from gateway.demo import create_demo_app, start_demo_server
from gateway.http.app import create_app
from gateway.http.binding import UPSTREAMS

from ..conftest import AUTH, FakeClock, base_url, gateway_client, make_settings, until
from ..process.test_supervisor import GatewayProcess, serve
from ..test_cli import run_cli

ADMIN_TOKEN = "admin-token-0123456789"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
Client = TestClient[web.Request, web.Application]


class Versioned:
    """An upstream whose one user's name is at a version a test moves on."""

    def __init__(self) -> None:
        self.version = 0
        self.calls = 0

    def app(self) -> web.Application:
        async def users(request: web.Request) -> web.Response:
            self.calls += 1
            user = {"id": "11111111-1111-4111-8111-000000000001", "username": f"v{self.version}"}
            return web.json_response({"data": [user], "total": 1, "page": 1, "limit": 10})

        app = web.Application()
        app.router.add_get("/users", users)
        return app


async def _gateway(
    aiohttp_client: AiohttpClient, url: str, clock: FakeClock, **cache: Any
) -> Client:
    settings = make_settings(
        url,
        cache={
            "ttl_s": {"users": 60},
            "stale_while_revalidate_s": 30,
            "stale_if_error_s": 600,
            **cache,
        },
        admin={"token": ADMIN_TOKEN},
    )
    return await gateway_client(aiohttp_client, create_app(settings, clock=clock))


async def _evidence(client: Client) -> dict[tuple[str, str], float]:
    """gateway_refreshes_total and the age sums of route users, by changed."""
    text = await (await client.get("/metrics")).text()
    found: dict[tuple[str, str], float] = {}
    pattern = (
        r"^gateway_(refreshes_total|refresh_age_seconds_sum)"
        r'\{changed="(\w+)",route="users"\} (\S+)$'
    )
    for name, changed, value in re.findall(pattern, text, re.MULTILINE):
        found[(name, changed)] = float(value)
    return found


async def _settled(client: Client) -> None:
    pipeline = client.app[UPSTREAMS].current.pipeline
    await until(lambda: pipeline.in_flight == 0)


async def test_each_way_an_answer_is_replaced_counts_whether_it_changed_and_its_age(
    aiohttp_client: AiohttpClient, aiohttp_server: AiohttpServer, clock: FakeClock
) -> None:
    upstream = Versioned()
    server = await aiohttp_server(upstream.app())
    client = await _gateway(aiohttp_client, base_url(server), clock)

    async def get(**headers: str) -> str:
        response = await client.get("/users", headers={**AUTH, **headers})
        assert response.status == 200
        await _settled(client)
        return response.headers["X-Cache"]

    assert await get() == "MISS"  # nothing replaced
    assert await _evidence(client) == {}

    clock.advance(70)  # expired, within stale-while-revalidate: a background refresh
    assert await get() == "STALE"
    assert await _evidence(client) == {
        ("refreshes_total", "false"): 1.0,
        ("refresh_age_seconds_sum", "false"): 70.0,
    }

    upstream.version = 1
    clock.advance(20)  # a caller's no-cache replaces a fresh answer, 20 s old
    assert await get(**{"Cache-Control": "no-cache"}) == "BYPASS"

    upstream.version = 2
    clock.advance(100)  # past stale-while-revalidate: a miss that replaces it
    assert await get() == "MISS"
    assert await _evidence(client) == {
        ("refreshes_total", "false"): 1.0,
        ("refresh_age_seconds_sum", "false"): 70.0,
        ("refreshes_total", "true"): 2.0,
        ("refresh_age_seconds_sum", "true"): 120.0,
    }
    assert upstream.calls == 4


async def test_admin_ttl_advises_from_the_evidence_and_the_cli_prints_it(
    aiohttp_client: AiohttpClient, aiohttp_server: AiohttpServer, clock: FakeClock, tmp_path: Path
) -> None:
    upstream = Versioned()
    server = await aiohttp_server(upstream.app())
    client = await _gateway(aiohttp_client, base_url(server), clock, max_stale_share=0.1)

    response = await client.get("/admin/ttl", headers=ADMIN)
    assert response.status == 200
    advice = {item["route"]: item for item in (await response.json())["routes"]}
    assert advice["users"]["advisedTtl"] is None
    assert advice["users"]["reason"] == "not enough data: 0 refreshes seen, 30 needed"

    # 40 refreshes at 70 s, every other one changed: about 0.6 changes a minute
    assert (await client.get("/users", headers=AUTH)).status == 200
    for round_ in range(40):
        for _ in range(3):  # hits
            assert (await client.get("/users", headers=AUTH)).status == 200
        clock.advance(70)
        upstream.version += round_ % 2
        assert (await client.get("/users", headers=AUTH)).status == 200
        await _settled(client)
    body = await (await client.get("/admin/ttl", headers=ADMIN)).json()
    assert (body["maxStaleShare"], body["minTtl"], body["maxTtl"]) == (0.1, 5, 3600)
    users = {item["route"]: item for item in body["routes"]}["users"]
    assert users["ttl"] == 60
    assert users["refreshes"] == 40
    assert users["changedShare"] == 0.5
    assert users["changesPerHour"] == pytest.approx(3600 * 0.6931 / 70, rel=0.02)
    # changing this often, 60 s serves too many stale answers; 5 s would serve fewer
    assert 5 < users["advisedTtl"] < 60
    assert users["advised"]["staleShare"] <= 0.1 < users["current"]["staleShare"]
    assert users["reason"].startswith("changes 35.6 times an hour (40 refreshes, 50.0% changed)")
    # the curve the advice is read from (docs/console.md, "TTLs"): over 5..3600 s and
    # at the TTL now, the stale share rising with the TTL, under the aim at the advised
    ttls = [point["ttl"] for point in users["curve"]]
    assert ttls == sorted(ttls)
    assert (ttls[0], ttls[-1]) == (5, 3600)
    assert 60 in ttls
    shares = [point["staleShare"] for point in users["curve"]]
    assert shares == sorted(shares)
    at_now = next(point for point in users["curve"] if point["ttl"] == 60)
    assert at_now["staleShare"] == users["current"]["staleShare"]
    assert shares[0] <= 0.1 < shares[-1]
    # the route's traffic: 1 miss, 40 rounds of 3 hits and a request after expiry
    assert users["traffic"]["requests"] == 161
    # (each request after expiry is stale, refreshed in the background)
    traffic = users["traffic"]
    assert (traffic["hits"], traffic["stale"], traffic["misses"]) == (120, 40, 1)
    assert traffic["staleShare"] == round(40 / 161, 4)
    assert traffic["upstreamCalls"] == upstream.calls == 41
    # one key: every request after the first could have been a hit
    assert traffic["distinctKeys"] == 1
    assert traffic["bestHitRatio"] == round(160 / 161, 4)
    metrics = await (await client.get("/metrics")).text()
    assert f'gateway_ttl_advised_seconds{{route="users"}} {users["advisedTtl"]}.0' in metrics
    assert 'gateway_ttl_seconds{route="users"} 60.0' in metrics
    assert 'gateway_answer_changes_per_hour{route="users"}' in metrics

    config = tmp_path / "gateway.toml"
    config.write_text(f'[server]\nport = {client.server.port}\n[admin]\ntoken = "{ADMIN_TOKEN}"\n')
    code, out, err = await run_cli("ttl-advice", "--config", str(config))
    assert (code, err) == (0, "")
    line = next(line for line in out.splitlines() if line.startswith("users "))
    assert line.split()[:5] == ["users", "60", str(_share(users["hitRatio"])), "40", "50.0%"]
    assert str(users["advisedTtl"]) in line.split()
    assert users["reason"] in out
    code, out, err = await run_cli("ttl-advice", "--config", str(config), "--json")
    assert code == 0
    assert json.loads(out)["routes"] == body["routes"]


def _share(value: float) -> str:
    return f"{value:.1%}"


async def test_admin_ttl_needs_the_admin_token(
    aiohttp_client: AiohttpClient, upstream: TestServer, clock: FakeClock
) -> None:
    client = await _gateway(aiohttp_client, base_url(upstream), clock)
    assert (await client.get("/admin/ttl")).status == 401
    assert (await client.get("/admin/ttl", headers=AUTH)).status == 401
    assert (await client.get("/admin/ttl?route=users", headers=ADMIN)).status == 400
    await asyncio.sleep(0)


async def test_the_advice_counts_the_refreshes_of_every_worker(tmp_path: Path) -> None:
    """Two worker processes, each replacing the answers it cached: /admin/ttl (from
    either) counts every replacement. Real time: a TTL of one second."""
    upstream = await start_demo_server()
    processes: list[GatewayProcess] = []
    try:
        extra = f'[server]\nworkers = 2\n[admin]\ntoken = "{ADMIN_TOKEN}"\n'
        gateway = await serve(
            processes, tmp_path, upstream.url, users_ttl=1, extra=extra, workers=2
        )
        # a kept-alive connection stays with one worker, whose cache holds its key
        sessions = [
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) for _ in range(16)
        ]
        try:
            for n, http in enumerate(sessions, 1):
                async with http.get(f"{gateway.url}/users?page={n}", headers=AUTH) as r:
                    assert r.headers["X-Cache"] == "MISS"
            await asyncio.sleep(1.2)  # every entry expires (within its revalidate window)
            for n, http in enumerate(sessions, 1):
                async with http.get(f"{gateway.url}/users?page={n}", headers=AUTH) as r:
                    assert r.headers["X-Cache"] == "STALE"
        finally:
            for http in sessions:
                await http.close()
        pids = {line["pid"] for line in gateway.lines if line.get("logger") == "gateway.access"}
        assert len(pids) == 2, "both workers answered"
        async with aiohttp.ClientSession() as http:
            async with asyncio.timeout(20):
                while True:
                    async with http.get(f"{gateway.url}/admin/ttl", headers=ADMIN) as response:
                        routes = {item["route"]: item for item in (await response.json())["routes"]}
                    if routes["users"]["refreshes"] == 16:
                        break
                    assert routes["users"]["refreshes"] < 16
                    await asyncio.sleep(0.1)
    finally:
        for process in processes:
            await process.kill()
        await upstream.close()


# the advice against truth: the reference upstream's expenses change at a known rate


async def _estimate(
    aiohttp_client: AiohttpClient,
    aiohttp_server: AiohttpServer,
    clock: FakeClock,
    per_minute: float,
    max_stale_share: float = 0.05,
) -> dict[str, Any]:
    """The advice for route ``expense`` after six rounds of lookups of 100 expenses whose
    records change ``per_minute`` times a minute, 35 s apart with a TTL of 30 s (each
    round a refresh of every entry: 500 refreshes)."""
    upstream = await aiohttp_server(
        create_demo_app(change_rates={"expenses": per_minute}, clock=clock, seed=7)
    )
    settings = make_settings(
        base_url(upstream),
        cache={"ttl_s": {"expense": 30}, "max_stale_share": max_stale_share},
        admin={"token": ADMIN_TOKEN},
    )
    client = await gateway_client(aiohttp_client, create_app(settings, clock=clock))
    page = await (await client.get("/expenses?limit=100", headers=AUTH)).json()
    ids = [item["id"] for item in page["data"]]
    for _ in range(6):
        for expense_id in ids:
            assert (await client.get(f"/expenses/{expense_id}", headers=AUTH)).status == 200
        await _settled(client)
        clock.advance(35)
    body = await (await client.get("/admin/ttl", headers=ADMIN)).json()
    advice: dict[str, Any] = {item["route"]: item for item in body["routes"]}["expense"]
    return advice


@pytest.mark.parametrize("per_minute", [0.25, 1.0, 4.0])
async def test_the_estimated_rate_is_within_a_quarter_of_the_true_one(
    aiohttp_client: AiohttpClient, aiohttp_server: AiohttpServer, per_minute: float
) -> None:
    advice = await _estimate(aiohttp_client, aiohttp_server, FakeClock(), per_minute)
    assert advice["refreshes"] == 500
    assert advice["changesPerHour"] == pytest.approx(per_minute * 60, rel=0.25)


async def test_the_advised_ttl_moves_the_right_way(
    aiohttp_client: AiohttpClient, aiohttp_server: AiohttpServer
) -> None:
    slow = await _estimate(aiohttp_client, aiohttp_server, FakeClock(), 0.25)
    fast = await _estimate(aiohttp_client, aiohttp_server, FakeClock(), 1.0)
    strict = await _estimate(aiohttp_client, aiohttp_server, FakeClock(), 0.25, 0.01)
    assert fast["advisedTtl"] < slow["advisedTtl"]
    assert strict["advisedTtl"] < slow["advisedTtl"]
