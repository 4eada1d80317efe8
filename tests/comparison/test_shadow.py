"""Shadow traffic through the whole gateway: the reference upstream as the primary, a
twin of it (identical, drifting, hanging or down) as the candidate, on loopback."""

from __future__ import annotations

import asyncio
import gc
import json
import re
import warnings
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from pytest_aiohttp import AiohttpClient, AiohttpServer

from gateway.comparison.shadow import Shadow
from gateway.config.live import ConfigSource
from gateway.demo import REQUEST_LOG, create_demo_app
from gateway.http.admin import SHADOW
from gateway.http.app import create_app

from ..config.test_live import ConfigFile
from ..conftest import AUTH, TOKEN, base_url, gateway_client, make_settings, until
from ..test_cli import run_cli

ADMIN_TOKEN = "admin-token-0123456789"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
Client = TestClient[web.Request, web.Application]
Start = Callable[..., Awaitable[Client]]


@pytest.fixture
def start_gateway(aiohttp_client: AiohttpClient) -> Start:
    """A gateway in front of ``primary`` whose shadow sends every upstream call (or the
    ``sample_ratio`` given) to ``candidate``."""

    async def start(primary: str, candidate: str | None, **shadow: Any) -> Client:
        section: dict[str, Any] = {"sample_ratio": 1.0, **shadow}
        if candidate is not None:
            section["base_url"] = candidate
        else:
            section["sample_ratio"] = 0.0
        settings = make_settings(
            primary, upstream={"shadow": section}, admin={"token": ADMIN_TOKEN}
        )
        return await gateway_client(aiohttp_client, create_app(settings))

    return start


async def _settled(client: Client) -> Shadow:
    """The gateway's shadow once no comparison is under way."""
    shadow = client.app[SHADOW]
    await until(lambda: shadow.in_flight == 0)
    return shadow


async def _report(client: Client) -> dict[str, Any]:
    await _settled(client)
    response = await client.get("/admin/shadow", headers=ADMIN)
    assert response.status == 200
    report: dict[str, Any] = await response.json()
    return report


@pytest.fixture
async def twin(aiohttp_server: AiohttpServer) -> TestServer:
    """A second reference upstream on the same data: an identical candidate."""
    return await aiohttp_server(create_demo_app())


ROUTES = ["/users", "/clients", "/expenses?limit=20", "/accounts", "/accounts?type=CASH"]


async def test_an_identical_twin_gives_an_all_identical_report(
    start_gateway: Start, upstream: TestServer, twin: TestServer
) -> None:
    """Held for docs/switching-upstreams.md, "What shadow traffic promises": an
    identical twin gives an all-identical report; no token in the report, the metrics or
    the logs.
    """
    client = await start_gateway(base_url(upstream), base_url(twin))
    for target in ROUTES:
        response = await client.get(target, headers=AUTH)
        assert response.status == 200
    report = await _report(client)
    assert report["totals"]["compared"] == len(ROUTES)
    assert report["totals"]["identical"] == len(ROUTES)
    assert report["totals"]["identicalShare"] == 1.0
    assert report["candidate"] == base_url(twin)
    for route in report["routes"].values():
        assert route["fields"] == []
        assert route["noise"] == []
        assert route["candidateErrors"] == {}
    # the candidate got each request once, with the caller's own token and request id
    candidate_calls = list(twin.app[REQUEST_LOG].entries)
    assert sorted(call.raw_path for call in candidate_calls) == sorted(
        call.raw_path for call in upstream.app[REQUEST_LOG].entries
    )
    assert {call.authorization for call in candidate_calls} == {f"Bearer {TOKEN}"}
    assert TOKEN not in orjson.dumps(report).decode()


async def test_hits_are_never_shadowed(
    start_gateway: Start, upstream: TestServer, twin: TestServer
) -> None:
    """Held for docs/switching-upstreams.md, "What shadow traffic promises": hits are
    never shadowed.
    """
    client = await start_gateway(base_url(upstream), base_url(twin))
    for _ in range(3):
        assert (await client.get("/users", headers=AUTH)).status == 200
    report = await _report(client)
    assert report["totals"]["compared"] == 1
    assert len(twin.app[REQUEST_LOG]) == 1


async def test_the_caller_is_answered_while_the_candidate_still_hangs(
    start_gateway: Start, upstream: TestServer, aiohttp_server: AiohttpServer
) -> None:
    """Held for docs/switching-upstreams.md, "What shadow traffic promises": the
    caller is answered, and its cache filled with the primary's answer, while the candidate
    still hangs.
    """
    asked = asyncio.Event()
    release = asyncio.Event()

    async def hang(request: web.Request) -> web.Response:
        asked.set()
        await release.wait()
        return web.json_response({"data": [], "total": 0, "page": 1, "limit": 10})

    hanging = web.Application()
    hanging.router.add_get("/users", hang)
    candidate = await aiohttp_server(hanging)
    client = await start_gateway(base_url(upstream), base_url(candidate))

    response = await client.get("/users", headers=AUTH)
    body = await response.read()
    assert response.status == 200
    assert orjson.loads(body)["total"] > 0  # the primary's answer
    await asyncio.wait_for(asked.wait(), 10)
    assert client.app[SHADOW].in_flight == 1  # the candidate has not answered yet
    # the cache holds the primary's answer, whatever the candidate will say
    again = await client.get("/users", headers=AUTH)
    assert again.headers["X-Cache"] == "HIT"
    assert await again.read() == body
    release.set()
    report = await _report(client)
    users = report["routes"]["users"]
    assert users["different"] == 1
    assert {item["field"] for item in users["fields"]} >= {"data", "total"}


async def test_a_candidate_that_is_down_is_counted_as_candidate_errors(
    start_gateway: Start, upstream: TestServer, unused_tcp_port: int
) -> None:
    """Held for docs/switching-upstreams.md, "What shadow traffic promises": a
    candidate that is down, or fails with a status, is counted as candidate errors by status.
    """
    client = await start_gateway(base_url(upstream), f"http://127.0.0.1:{unused_tcp_port}")
    for target in ("/users", "/clients"):
        assert (await client.get(target, headers=AUTH)).status == 200
    report = await _report(client)
    assert report["totals"]["candidateErrors"] == 2
    assert report["routes"]["users"]["candidateErrors"] == {"unreachable": 1}
    assert report["totals"]["compared"] == 0


async def test_a_candidate_failing_with_a_status_is_counted_by_status(
    start_gateway: Start, upstream: TestServer, aiohttp_server: AiohttpServer
) -> None:
    """Held for docs/switching-upstreams.md, "What shadow traffic promises": a
    candidate that is down, or fails with a status, is counted as candidate errors by status.
    """

    async def fail(request: web.Request) -> web.Response:
        return web.Response(status=503)

    failing = web.Application()
    failing.router.add_get("/users", fail)
    candidate = await aiohttp_server(failing)
    client = await start_gateway(base_url(upstream), base_url(candidate))
    assert (await client.get("/users", headers=AUTH)).status == 200
    report = await _report(client)
    assert report["routes"]["users"]["candidateErrors"] == {"503": 1}


async def test_a_404_of_both_is_identical_and_a_404_of_the_candidate_alone_differs(
    start_gateway: Start, upstream: TestServer, aiohttp_server: AiohttpServer
) -> None:
    """Held for docs/switching-upstreams.md, "What shadow traffic promises": statuses
    are compared.
    """

    async def missing(request: web.Request) -> web.Response:
        return web.json_response({"error": "not_found"}, status=404)

    empty = web.Application()
    empty.router.add_get("/accounts/{id}", missing)
    candidate = await aiohttp_server(empty)
    client = await start_gateway(base_url(upstream), base_url(candidate))
    assert (await client.get("/accounts/no-such-account", headers=AUTH)).status == 404
    first = (await (await client.get("/accounts?limit=1", headers=AUTH)).json())["data"][0]
    assert (await client.get(f"/accounts/{first['id']}", headers=AUTH)).status == 200
    report = await _report(client)
    account = report["routes"]["account"]
    assert account["identical"] == 1
    assert account["different"] == 1
    assert account["fields"][0]["field"] == "(status)"
    assert account["fields"][0]["examples"][0]["primary"] == 200
    assert account["fields"][0]["examples"][0]["candidate"] == 404


async def test_beyond_max_in_flight_requests_are_skipped(
    start_gateway: Start, upstream: TestServer, aiohttp_server: AiohttpServer
) -> None:
    """Held for docs/switching-upstreams.md, "What shadow traffic promises": beyond
    `max_in_flight`, sampled requests are skipped.
    """
    release = asyncio.Event()

    async def hang(request: web.Request) -> web.Response:
        await release.wait()
        return web.Response(status=503)

    hanging = web.Application()
    hanging.router.add_get("/expenses", hang)
    candidate = await aiohttp_server(hanging)
    client = await start_gateway(base_url(upstream), base_url(candidate), max_in_flight=2)
    for page in range(1, 6):
        assert (await client.get(f"/expenses?page={page}", headers=AUTH)).status == 200
    assert client.app[SHADOW].in_flight == 2
    release.set()
    report = await _report(client)
    expenses = report["routes"]["expenses"]
    assert expenses["skipped"] == 3
    assert expenses["candidateErrors"] == {"503": 2}


async def test_a_sample_ratio_of_zero_sends_nothing(
    start_gateway: Start, upstream: TestServer, twin: TestServer
) -> None:
    client = await start_gateway(base_url(upstream), base_url(twin), sample_ratio=0.0)
    assert (await client.get("/users", headers=AUTH)).status == 200
    report = await _report(client)
    assert report["enabled"] is False
    assert report["totals"]["compared"] == 0
    assert len(twin.app[REQUEST_LOG]) == 0


async def test_the_report_is_reset_by_delete_and_needs_the_admin_token(
    start_gateway: Start, upstream: TestServer, twin: TestServer
) -> None:
    client = await start_gateway(base_url(upstream), base_url(twin))
    assert (await client.get("/users", headers=AUTH)).status == 200
    await _settled(client)
    assert (await client.get("/admin/shadow")).status == 401
    assert (await client.get("/admin/shadow", headers=AUTH)).status == 401
    assert (await client.delete("/admin/shadow")).status == 401
    assert (await _report(client))["totals"]["compared"] == 1
    response = await client.delete("/admin/shadow", headers=ADMIN)
    assert response.status == 200
    assert (await _report(client))["totals"]["compared"] == 0
    refused = await client.get("/admin/shadow?route=users", headers=ADMIN)
    assert refused.status == 400
    assert refused.content_type == "application/problem+json"


async def test_the_metrics_count_requests_by_outcome_and_fields_by_kind(
    start_gateway: Start, upstream: TestServer, aiohttp_server: AiohttpServer
) -> None:
    """Held for docs/switching-upstreams.md, "What shadow traffic promises": the
    metrics count requests by outcome and fields by kind.
    """

    async def other_total(request: web.Request) -> web.Response:
        return web.json_response({"data": [], "total": 0, "page": 1, "limit": 10})

    app = web.Application()
    app.router.add_get("/clients", other_total)
    candidate = await aiohttp_server(app)
    client = await start_gateway(base_url(upstream), base_url(candidate))
    assert (await client.get("/clients", headers=AUTH)).status == 200
    await _settled(client)
    text = await (await client.get("/metrics")).text()
    assert 'gateway_shadow_requests_total{outcome="different",route="clients"} 1.0' in text
    assert (
        'gateway_shadow_field_differences_total{field="total",kind="value",route="clients"} 1.0'
        in text
    )
    assert 'field="data",kind="length",route="clients"} 1.0' in text
    # the candidate's call is not an upstream call; the primary's recheck is one
    assert 'gateway_upstream_requests_total{route="clients",status="200"} 2.0' in text
    assert len(upstream.app[REQUEST_LOG].for_path("/clients")) == 2
    assert TOKEN not in text


async def test_shadow_report_prints_the_running_gateways_report(
    start_gateway: Start, upstream: TestServer, aiohttp_server: AiohttpServer, tmp_path: Path
) -> None:
    async def fewer(request: web.Request) -> web.Response:
        return web.json_response({"data": [], "total": 0, "page": 1, "limit": 10})

    app = web.Application()
    app.router.add_get("/clients", fewer)
    candidate = await aiohttp_server(app)
    client = await start_gateway(base_url(upstream), base_url(candidate))
    assert (await client.get("/clients", headers=AUTH)).status == 200
    await _settled(client)
    config = tmp_path / "gateway.toml"
    config.write_text(
        f'[server]\nhost = "0.0.0.0"\nport = {client.server.port}\n'
        f'[admin]\ntoken = "{ADMIN_TOKEN}"\n'
    )

    code, out, err = await run_cli("shadow-report", "--config", str(config))
    assert (code, err) == (0, "")
    assert f"candidate: {base_url(candidate)}" in out
    assert "== clients: 1 compared, 0 identical (0.0%), 1 different" in out
    table = out[out.index("differences (worst first)") :]
    assert re.search(r"^\s+data\s+1\s+length 1\s+10 -> 0", table, re.MULTILINE), table
    assert re.search(r"^\s+total\s+1\s+value 1\s+", table, re.MULTILINE), table
    assert ADMIN_TOKEN not in out

    code, out, err = await run_cli("shadow-report", "--config", str(config), "--json")
    assert code == 0
    assert json.loads(out)["routes"]["clients"]["different"] == 1


async def test_shadow_report_without_an_admin_token_or_a_gateway_fails_clearly(
    tmp_path: Path, unused_tcp_port: int
) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text(f"[server]\nport = {unused_tcp_port}\n")
    code, out, err = await run_cli("shadow-report", "--config", str(config))
    assert (code, out) == (2, "")
    assert "admin.token is not set" in err
    config.write_text(f'[server]\nport = {unused_tcp_port}\n[admin]\ntoken = "{ADMIN_TOKEN}"\n')
    code, out, err = await run_cli("shadow-report", "--config", str(config))
    assert (code, out) == (1, "")
    assert f"cannot ask the gateway at http://127.0.0.1:{unused_tcp_port}/admin/shadow" in err
    assert ADMIN_TOKEN not in err


async def test_a_reload_turns_the_shadow_on_points_it_elsewhere_and_turns_it_off(
    aiohttp_client: AiohttpClient,
    aiohttp_server: AiohttpServer,
    upstream: TestServer,
    twin: TestServer,
    tmp_path: Path,
) -> None:
    """Held for docs/switching-upstreams.md, "What shadow traffic promises": a reload
    turns the shadow on, points it elsewhere (a new report) and off.
    """
    other = await aiohttp_server(create_demo_app())
    config = ConfigFile(
        tmp_path / "gateway.toml",
        {
            "upstream": {"base_url": base_url(upstream)},
            "cache": {"backend": "memory"},
            "admin": {"token": ADMIN_TOKEN},
        },
    )
    source = ConfigSource(config.path)
    client = await gateway_client(aiohttp_client, create_app(source.load(), source=source))

    async def reload() -> dict[str, Any]:
        response = await client.post("/admin/reload", headers=ADMIN)
        assert response.status == 200
        result: dict[str, Any] = await response.json()
        return result

    async def miss(page: int) -> None:
        response = await client.get(f"/expenses?page={page}", headers=AUTH)
        assert response.headers["X-Cache"] == "MISS"

    await miss(1)
    assert len(twin.app[REQUEST_LOG]) == 0

    config.set("upstream", "shadow.base_url", base_url(twin))
    config.set("upstream", "shadow.sample_ratio", 1.0)
    assert set((await reload())["applied"]) == {
        "upstream.shadow.base_url",
        "upstream.shadow.sample_ratio",
    }
    await miss(2)
    report = await _report(client)
    assert (report["enabled"], report["candidate"]) == (True, base_url(twin))
    assert report["routes"]["expenses"]["identical"] == 1
    assert [call.raw_path for call in twin.app[REQUEST_LOG].entries] == [
        "/expenses?page=2&limit=10"
    ]

    config.set("upstream", "shadow.base_url", base_url(other))
    await reload()
    report = await _report(client)
    assert (report["candidate"], report["totals"]["compared"]) == (base_url(other), 0)
    await miss(3)
    assert (await _report(client))["routes"]["expenses"]["identical"] == 1
    assert len(other.app[REQUEST_LOG]) == 1
    assert len(twin.app[REQUEST_LOG]) == 1

    config.set("upstream", "shadow.sample_ratio", 0.0)
    await reload()
    await miss(4)
    assert (await _report(client))["enabled"] is False
    assert len(other.app[REQUEST_LOG]) == 1


# the drifting twin: each kind of drift is reported as exactly the fields it changes

TRAFFIC = [
    "/users",
    "/clients",
    "/expenses?limit=20",
    "/expenses?limit=20&page=2",
    "/accounts",
    "/accounts?limit=20",
]


MISSES = len(TRAFFIC) + 8


async def _drive(client: Client) -> None:
    """``MISSES`` misses on every route: the lists, then expenses and accounts by id."""
    for target in TRAFFIC:
        assert (await client.get(target, headers=AUTH)).status == 200
    expenses = await (await client.get("/expenses?limit=3", headers=AUTH)).json()
    for item in expenses["data"]:
        assert (await client.get(f"/expenses/{item['id']}", headers=AUTH)).status == 200
    accounts = await (await client.get("/accounts?limit=3", headers=AUTH)).json()
    for item in accounts["data"]:
        assert (await client.get(f"/accounts/{item['id']}", headers=AUTH)).status == 200


def _found(report: dict[str, Any]) -> dict[str, dict[str, set[str]]]:
    """Per route, the fields that differ and their kinds (noise apart, as "noise:")."""
    found: dict[str, dict[str, set[str]]] = {}
    for name, route in report["routes"].items():
        fields = {item["field"]: set(item["kinds"]) for item in route["fields"]}
        fields.update({f"noise:{item['field']}": set(item["kinds"]) for item in route["noise"]})
        if fields:
            found[name] = fields
    return found


@pytest.mark.parametrize(
    ("drift", "expected"),
    [
        (
            "amount-scale",
            {"expenses": {"data[].amount": {"value"}}, "expense": {"amount": {"value"}}},
        ),
        (
            "order",
            {
                "users": {"data": {"order"}},
                "clients": {"data": {"order"}},
                "expenses": {"data": {"order"}},
                "accounts": {"data": {"order"}},
            },
        ),
        (
            # the published bankCode of a listed account is its bank's code
            "drop-bank",
            {"accounts": {"data[].bank": {"missing"}, "data[].bankCode": {"missing"}}},
        ),
        (
            "enum-case",
            {"expenses": {"data[].status": {"value"}}, "expense": {"status": {"value"}}},
        ),
        (
            # on the candidate alone, a changing paymentId is a regression, not noise
            "noise",
            {"expenses": {"data[].paymentId": {"value"}}, "expense": {"paymentId": {"value"}}},
        ),
    ],
)
async def test_a_drifting_twin_is_reported_as_exactly_its_drifted_fields(
    start_gateway: Start,
    upstream: TestServer,
    aiohttp_server: AiohttpServer,
    drift: str,
    expected: dict[str, dict[str, set[str]]],
) -> None:
    candidate = await aiohttp_server(create_demo_app(drift=[drift]))
    client = await start_gateway(base_url(upstream), base_url(candidate))
    await _drive(client)
    report = await _report(client)
    assert _found(report) == expected
    different = {name for name, route in report["routes"].items() if route["different"]}
    assert different == set(expected)
    assert report["totals"]["candidateErrors"] == 0
    # every miss was compared once; the candidate got each of them once
    assert report["totals"]["compared"] == MISSES == len(candidate.app[REQUEST_LOG])


async def test_noise_on_both_twins_is_reported_as_noise_not_as_differences(
    start_gateway: Start, aiohttp_server: AiohttpServer
) -> None:
    primary = await aiohttp_server(create_demo_app(drift=["noise"]))
    candidate = await aiohttp_server(create_demo_app(drift=["noise"]))
    client = await start_gateway(base_url(primary), base_url(candidate))
    await _drive(client)
    report = await _report(client)
    assert _found(report) == {
        "expenses": {"noise:data[].paymentId": {"value"}},
        "expense": {"noise:paymentId": {"value"}},
    }
    assert report["totals"]["different"] == 0
    assert report["routes"]["expenses"]["noiseOnly"] == 3
    assert report["routes"]["expense"]["noiseOnly"] == 3
    evidence = report["routes"]["expense"]["noise"][0]["evidence"][0]
    assert evidence["primary"] != evidence["candidate"]  # the primary against itself
    metrics = await (await client.get("/metrics")).text()
    assert 'gateway_shadow_requests_total{outcome="noise",route="expenses"} 3.0' in metrics
    assert "gateway_shadow_field_differences_total{" not in metrics


async def test_noise_is_known_by_field_and_kind_so_live_data_hides_no_regression(
    start_gateway: Start, aiohttp_server: AiohttpServer
) -> None:
    """A primary whose list grows between two calls (live data) makes the list's length
    and its extra record noise; a candidate that reorders the list and leaves a record
    out still differs.

    Held for docs/switching-upstreams.md, "What shadow traffic promises": noise is
    known by field and kind: live data hides no regression.
    """
    grown = {"users": 5}

    def user(n: int) -> dict[str, Any]:
        return {"id": f"11111111-1111-4111-8111-{n:012d}", "username": f"u{n}", "role": "ADMIN"}

    async def primary_users(request: web.Request) -> web.Response:
        grown["users"] += 1  # a record more on every call
        items = [user(n) for n in range(grown["users"])]
        return web.json_response({"data": items, "total": len(items), "page": 1, "limit": 50})

    async def candidate_users(request: web.Request) -> web.Response:
        items = [user(n) for n in range(1, grown["users"])][::-1]  # reordered, one gone
        return web.json_response({"data": items, "total": grown["users"], "page": 1, "limit": 50})

    primary_app, candidate_app = web.Application(), web.Application()
    primary_app.router.add_get("/users", primary_users)
    candidate_app.router.add_get("/users", candidate_users)
    primary, candidate = await aiohttp_server(primary_app), await aiohttp_server(candidate_app)
    client = await start_gateway(base_url(primary), base_url(candidate), recheck_ratio=1.0)
    for limit in range(20, 30):
        assert (await client.get(f"/users?limit={limit}", headers=AUTH)).status == 200
        await _settled(client)
    users = (await _report(client))["routes"]["users"]
    assert (users["compared"], users["different"], users["noiseOnly"]) == (10, 10, 0)
    assert {item["field"]: item["kinds"] for item in users["fields"]} == {
        "data": {"order": 10},
        "data[]": {"missing": 10},
    }
    # what the primary did to itself (length, extra, value) is noise, and only that
    noise = {item["field"]: item["kinds"] for item in users["noise"]}
    assert noise == {"data": {"length": 10}, "data[]": {}, "total": {}}
    assert {(item["field"], e["kind"]) for item in users["noise"] for e in item["evidence"]} == {
        ("data", "length"),
        ("data[]", "extra"),
        ("total", "value"),
    }


async def test_a_token_an_upstream_echoes_is_never_shown(
    start_gateway: Start, upstream: TestServer, aiohttp_server: AiohttpServer
) -> None:
    """Held for docs/switching-upstreams.md, "What shadow traffic promises": a token
    an upstream echoes is shown as `[redacted]`.
    """

    async def echo(request: web.Request) -> web.Response:
        """The reference upstream's answer, with the caller's header as every phone."""
        headers = {"Authorization": request.headers["Authorization"]}
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"{base_url(upstream)}/users", headers=headers) as answer,
        ):
            page = await answer.json()
        for item in page["data"]:
            item["phone"] = request.headers["Authorization"]
        return web.json_response(page)

    echoing = web.Application()
    echoing.router.add_get("/users", echo)
    candidate = await aiohttp_server(echoing)
    client = await start_gateway(base_url(upstream), base_url(candidate))
    assert (await client.get("/users", headers=AUTH)).status == 200
    report = await _report(client)
    phones = report["routes"]["users"]["fields"][0]
    assert phones["field"] == "data[].phone"
    assert {example["candidate"] for example in phones["examples"]} == {"[redacted]"}
    assert TOKEN not in orjson.dumps(report).decode()


@pytest.mark.parametrize("change", ["another candidate", "off", "nothing"])
async def test_a_stop_after_a_reload_closes_every_candidate_connection(
    aiohttp_client: AiohttpClient,
    aiohttp_server: AiohttpServer,
    upstream: TestServer,
    tmp_path: Path,
    change: str,
) -> None:
    """A comparison hangs on the candidate, a reload replaces the candidate (or turns
    the shadow off), and the gateway stops: every candidate session is closed (an
    unclosed one is a ResourceWarning, an error in this suite).

    Held for docs/switching-upstreams.md, "What shadow traffic promises": every
    candidate connection is closed at a stop, after a reload replaced the candidate too.
    """
    asked = asyncio.Event()

    async def hang(request: web.Request) -> web.Response:
        asked.set()
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    hanging = web.Application()
    hanging.router.add_get("/users", hang)
    first, second = await aiohttp_server(hanging), await aiohttp_server(web.Application())
    config = ConfigFile(
        tmp_path / "gateway.toml",
        {
            "upstream": {
                "base_url": base_url(upstream),
                "shadow": {"base_url": base_url(first), "sample_ratio": 1.0},
            },
            "admin": {"token": ADMIN_TOKEN},
        },
    )
    source = ConfigSource(config.path)
    client = await gateway_client(aiohttp_client, create_app(source.load(), source=source))
    assert (await client.get("/users", headers=AUTH)).status == 200
    await asyncio.wait_for(asked.wait(), 10)
    shadow = client.app[SHADOW]
    if change == "another candidate":
        config.set("upstream", "shadow.base_url", base_url(second))
    elif change == "off":
        config.set("upstream", "shadow.sample_ratio", 0.0)
    assert (await client.post("/admin/reload", headers=ADMIN)).status == 200
    assert shadow.in_flight == 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        await client.close()
        gc.collect()
    assert [str(w.message) for w in caught] == []
    assert shadow.in_flight == 0


@pytest.mark.parametrize("body", [b"{}", b'{"totals": {}, "routes": null}', b"[1]"])
async def test_shadow_report_refuses_an_answer_that_is_not_a_report(
    aiohttp_server: AiohttpServer, tmp_path: Path, body: bytes
) -> None:
    async def garbage(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_get("/admin/shadow", garbage)
    server = await aiohttp_server(app)
    config = tmp_path / "gateway.toml"
    config.write_text(f'[server]\nport = {server.port}\n[admin]\ntoken = "{ADMIN_TOKEN}"\n')
    code, out, err = await run_cli("shadow-report", "--config", str(config))
    assert (code, out) == (1, "")
    assert "records-gateway shadow-report:" in err
    assert "Traceback" not in err


async def test_after_a_switch_of_upstream_the_shadow_compares_the_new_primary(
    aiohttp_client: AiohttpClient,
    aiohttp_server: AiohttpServer,
    upstream: TestServer,
    twin: TestServer,
    tmp_path: Path,
) -> None:
    """Held for docs/switching-upstreams.md, "What shadow traffic promises": after a
    switch of upstream, the report starts again and compares the new primary.
    """
    new_primary = await aiohttp_server(create_demo_app())
    config = ConfigFile(
        tmp_path / "gateway.toml",
        {
            "upstream": {
                "base_url": base_url(upstream),
                "shadow": {"base_url": base_url(twin), "sample_ratio": 1.0},
            },
            "admin": {"token": ADMIN_TOKEN},
        },
    )
    source = ConfigSource(config.path)
    client = await gateway_client(aiohttp_client, create_app(source.load(), source=source))
    assert (await client.get("/users", headers=AUTH)).status == 200
    assert (await _report(client))["totals"]["identical"] == 1

    config.set("upstream", "base_url", base_url(new_primary))
    response = await client.post("/admin/reload", headers=ADMIN)
    assert "upstream.base_url" in (await response.json())["applied"]
    report = await _report(client)
    assert (report["primary"], report["totals"]["compared"]) == (base_url(new_primary), 0)
    assert (await client.get("/users", headers=AUTH)).status == 200  # cold: a miss
    assert (await _report(client))["totals"]["identical"] == 1
    assert len(new_primary.app[REQUEST_LOG]) == 1
    assert len(twin.app[REQUEST_LOG]) == 2


async def test_the_candidate_gets_the_caller_s_trace_id_with_a_parent_id_of_its_own(
    start_gateway: Start, upstream: TestServer, twin: TestServer
) -> None:
    """Held for docs/operations.md, "Tracing"."""
    client = await start_gateway(base_url(upstream), base_url(twin))
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    headers = {
        **AUTH,
        "traceparent": f"00-{trace_id}-00f067aa0ba902b7-01",
        "tracestate": "rojo=1",
    }
    assert (await client.get("/users", headers=headers)).status == 200
    assert (await client.get("/clients", headers=AUTH)).status == 200
    await _settled(client)
    (primary, other) = upstream.app[REQUEST_LOG].entries
    (candidate, candidate_other) = twin.app[REQUEST_LOG].entries
    for call in (primary, candidate):
        assert call.traceparent is not None
        assert call.traceparent.startswith(f"00-{trace_id}-")
        assert call.tracestate == "rojo=1"
    assert primary.traceparent != candidate.traceparent  # each call a parent id of its own
    assert other.traceparent is not None
    assert candidate_other.traceparent is not None
    assert other.traceparent[3:35] == candidate_other.traceparent[3:35] != trace_id


async def test_the_whole_answers_of_every_example_of_the_report_are_kept(
    start_gateway: Start, upstream: TestServer, aiohttp_server: AiohttpServer, tmp_path: Path
) -> None:
    """docs/console.md, "Switching upstreams": each example the report lists leads to
    the two whole answers of its request, from the admin API and from shadow-report
    --answers; a request no example names is a 404."""
    candidate = await aiohttp_server(create_demo_app(drift=["amount-scale"]))
    client = await start_gateway(base_url(upstream), base_url(candidate))
    sent = [f"page-{page}" for page in range(1, 13)]
    for page, request_id in enumerate(sent, 1):
        headers = {**AUTH, "X-Request-ID": request_id}
        path = f"/expenses?page={page}&limit=1"
        assert (await client.get(path, headers=headers)).status == 200
        await _settled(client)
    report = await _report(client)
    (amounts,) = report["routes"]["expenses"]["fields"]
    named = [example["requestId"] for example in amounts["examples"]]
    assert len(named) == 5  # the first five requests whose amount differed
    for request_id in named:
        answer = await client.get(f"/admin/shadow/answers/{request_id}", headers=ADMIN)
        assert answer.status == 200
        body = await answer.json()
        page = int(request_id.removeprefix("page-"))
        assert (body["requestId"], body["route"]) == (request_id, "expenses")
        assert body["target"] == f"/expenses?page={page}&limit=1"
        primary, other = json.loads(body["primary"]), json.loads(body["candidate"])
        assert primary["page"] == other["page"] == page
        assert primary["data"][0]["id"] == other["data"][0]["id"]
        assert primary["data"][0]["amount"] != other["data"][0]["amount"]
        assert TOKEN not in await answer.text()
    for unknown in [*(set(sent) - set(named)), "no-such-request"]:
        answer = await client.get(f"/admin/shadow/answers/{unknown}", headers=ADMIN)
        assert answer.status == 404, unknown
        assert (await answer.json())["type"] == "urn:records-gateway:problem:not-found"
    assert (await client.get(f"/admin/shadow/answers/{named[0]}", headers=AUTH)).status == 401
    kept = named

    config = tmp_path / "gateway.toml"
    config.write_text(f'[server]\nport = {client.server.port}\n[admin]\ntoken = "{ADMIN_TOKEN}"\n')
    code, out, err = await run_cli("shadow-report", "--config", str(config), "--answers", kept[0])
    assert (code, err) == (0, "")
    assert out.startswith(f"request {kept[0]} (expenses): /expenses?page=")
    changed = [line for line in out.splitlines() if line.startswith(("-  ", "+  "))]
    assert changed
    assert all('"amount"' in line for line in changed)
    code, out, err = await run_cli("shadow-report", "--config", str(config), "--answers", "x y")
    assert code == 2
    assert "--answers" in err


async def test_the_shadow_is_pointed_changed_and_stopped_from_the_admin_api_and_the_cli(
    start_gateway: Start, upstream: TestServer, aiohttp_server: AiohttpServer, tmp_path: Path
) -> None:
    """docs/console.md, "Switching upstreams": PUT /admin/shadow (and `records-gateway
    shadow`) turns the shadow on towards a candidate, changes its share, turns it off,
    as a reload of those keys would; what it refuses never changes the shadow."""
    client = await start_gateway(base_url(upstream), None)
    twin = await aiohttp_server(create_demo_app(drift=["amount-scale"]))
    put = {**ADMIN, "Content-Type": "application/json"}
    answer = await client.put(
        "/admin/shadow", data=json.dumps({"baseUrl": base_url(twin), "sampleRatio": 1}), headers=put
    )
    assert answer.status == 200
    body = await answer.json()
    assert body["ok"] is True
    assert set(body["applied"]) == {"upstream.shadow.base_url", "upstream.shadow.sample_ratio"}
    assert body["shadow"] == {"baseUrl": base_url(twin), "sampleRatio": 1.0}
    assert (await client.get("/expenses", headers=AUTH)).status == 200
    report = await _report(client)
    assert (report["enabled"], report["candidate"]) == (True, base_url(twin))
    assert report["routes"]["expenses"]["different"] == 1

    refused = [
        (b"{}", "body"),
        (b"not json", "body"),
        (b'{"sampleRatio": 2}', "sampleRatio"),
        (b'{"baseUrl": "ftp://x"}', "baseUrl"),
        (b'{"candidate": "http://x"}', "candidate"),
        (b'{"sampleRatio": true}', "sampleRatio"),
        (b'{"sampleRatio": "0.5"}', "sampleRatio"),
        (b'{"baseUrl": 5}', "baseUrl"),
        (b'{"sampleRatio": 0.5, "padding": "' + b"x" * 5000 + b'"}', "body"),
    ]
    for sent, named in refused:
        answer = await client.put("/admin/shadow", data=sent, headers=put)
        assert answer.status == 400, sent
        problem = await answer.json()
        assert [error["parameter"] for error in problem["errors"]] == [named], sent
    assert (
        await client.put("/admin/shadow", data=b'{"sampleRatio": 0}', headers=AUTH)
    ).status == 401
    assert (await _report(client))["candidate"] == base_url(twin)  # unchanged by the refusals

    async def in_pieces() -> Any:  # a body that comes in several reads (chunked)
        yield b'{"sampleRatio":'
        await asyncio.sleep(0.01)
        yield b" 0.25}"

    answer = await client.put("/admin/shadow", data=in_pieces(), headers=put)
    assert answer.status == 200
    assert (await answer.json())["shadow"]["sampleRatio"] == 0.25

    config = tmp_path / "gateway.toml"
    config.write_text(f'[server]\nport = {client.server.port}\n[admin]\ntoken = "{ADMIN_TOKEN}"\n')
    code, out, err = await run_cli(
        "shadow", "--config", str(config), "--candidate", base_url(twin), "--ratio", "0.5"
    )
    assert (code, err) == (0, "")
    assert (
        out.strip() == f"shadow traffic on: candidate {base_url(twin)}, 50% of upstream calls;"
        " applied: upstream.shadow.sample_ratio"
    )
    code, out, err = await run_cli("shadow", "--config", str(config), "--off")
    assert (code, err) == (0, "")
    assert out.startswith("shadow traffic off")
    report = await _report(client)
    assert report["enabled"] is False
    assert report["sampleRatio"] == 0.0
