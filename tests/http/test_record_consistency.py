"""cache.record_consistency, as docs/purging.md describes it: a mixed workload of list
and detail reads by several callers over records that change upstream, replayed with
consistency off (callers are served records older than ones they were served before)
and on (never, for the caller, or with "all", for anyone), on one instance and on two
sharing Redis."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import orjson
import pytest
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestClient
from pytest_aiohttp import AiohttpServer

from gateway.demo import REQUEST_LOG, RequestLog, create_demo_app
from gateway.demo.dataset import generate_dataset
from gateway.demo.monotonic import MixedReads, Monotonic

from ..conftest import FakeClock, GatewayFactory, base_url, near_of, redis_cache, until

Client = TestClient[web.Request, web.Application]
CALLERS = ("caller-one-token", "caller-two-token", "caller-three-token")
# each record changes about once a minute; the workload moves the clocks 1 s a read
RATES = {"expenses": 1.0, "accounts": 1.0, "clients": 1.0, "users": 1.0}
READS = 500


async def replay(
    factory: GatewayFactory,
    server_factory: AiohttpServer,
    consistency: str,
    cache: dict[str, Any],
    instances: int = 1,
) -> tuple[Monotonic, int]:
    """The workload's outcome, and the upstream calls it made."""
    clock = FakeClock()
    upstream = await server_factory(
        create_demo_app(tokens=frozenset(CALLERS), change_rates=RATES, clock=clock)
    )
    log: RequestLog = upstream.app[REQUEST_LOG]
    section = {**cache, "record_consistency": consistency, "stale_while_revalidate_s": 0}
    gateways = [
        await factory(base_url(upstream), clock=clock, cache=section) for _ in range(instances)
    ]
    if cache["backend"] == "redis":
        for near in [near_of(gateway) for gateway in gateways]:
            await until(lambda: near.live)  # noqa: B023 (awaited here)
    dataset = generate_dataset()
    seen = Monotonic(dataset)
    reads = MixedReads(dataset)
    turns = itertools.cycle(itertools.product(gateways, CALLERS))
    for _ in range(READS):
        gateway, caller = next(turns)
        path = reads.next_path()
        response = await gateway.get(path, headers={"Authorization": f"Bearer {caller}"})
        assert response.status == 200, await response.text()
        answer = orjson.loads(await response.read())
        reads.learn(answer)
        seen.served(caller, answer)
        clock.advance(1.0)
    return seen, len(log.entries)


@pytest.mark.parametrize(
    "cache",
    [
        {"backend": "memory"},
        {"backend": "redis", "namespace": "consistency"},
    ],
    ids=["memory", "redis"],
)
async def test_a_caller_is_never_served_a_record_older_than_one_it_was_served(
    gateway_factory: GatewayFactory,
    aiohttp_server: AiohttpServer,
    redis_url: str,
    cache: dict[str, Any],
) -> None:
    if cache["backend"] == "redis":
        cache = {**redis_cache(redis_url), **cache}
    instances = 2 if cache["backend"] == "redis" else 1
    off, calls_off = await replay(gateway_factory, aiohttp_server, "off", cache, instances)
    caller, calls_caller = await replay(gateway_factory, aiohttp_server, "caller", cache, instances)
    everyone, calls_all = await replay(gateway_factory, aiohttp_server, "all", cache, instances)
    # today's figure: some answers go back in time for their own caller
    assert off.older_for_caller > 0, off.report()
    assert caller.older_for_caller == 0, caller.report()
    assert everyone.older_for_caller == 0, everyone.report()
    assert everyone.older_for_anyone == 0, everyone.report()
    # what it costs: more upstream calls, never more than one a read
    assert calls_off < calls_caller <= calls_all <= READS * 2, (calls_off, calls_caller, calls_all)


class HeldBack:
    """The reference upstream, its expenses changing on ``clock``, behind a relay that
    holds back the first ``holding`` answers to pages of three expenses, each as the
    upstream made it, until its gate is set."""

    def __init__(self, clock: FakeClock, holding: int) -> None:
        self.clock = clock
        self.holding = holding
        self.asked: list[str] = []
        self.gates: list[asyncio.Event] = []

    async def start(self, aiohttp_server: AiohttpServer) -> str:
        """The relay's base URL."""
        demo = await aiohttp_server(
            create_demo_app(
                tokens=frozenset(CALLERS), change_rates={"expenses": 60.0}, clock=self.clock
            )
        )

        async def relay(request: web.Request) -> web.Response:
            self.asked.append(request.path_qs)
            async with (
                ClientSession() as session,
                session.get(f"{base_url(demo)}{request.path_qs}", headers=request.headers) as got,
            ):
                body, status = await got.read(), got.status
            if "limit=3" in request.path_qs and len(self.gates) < self.holding:
                gate = asyncio.Event()
                self.gates.append(gate)
                await gate.wait()
            return web.Response(body=body, status=status, content_type="application/json")

        relay_app = web.Application()
        relay_app.router.add_get("/{tail:.*}", relay)
        return base_url(await aiohttp_server(relay_app))


async def test_an_answer_older_than_one_served_is_asked_for_again(
    gateway_factory: GatewayFactory, aiohttp_server: AiohttpServer
) -> None:
    """A page fetched before a detail that brought an expense's next version, and
    answered after it: not stored, and asked for once more (docs/purging.md)."""
    clock = FakeClock()
    upstream = HeldBack(clock, holding=1)
    gateway = await gateway_factory(
        await upstream.start(aiohttp_server),
        clock=clock,
        cache={"backend": "memory", "record_consistency": "caller"},
    )
    auth = {"Authorization": f"Bearer {CALLERS[0]}"}
    first = (await (await gateway.get("/expenses?limit=2", headers=auth)).json())["data"][0]
    page = asyncio.ensure_future(gateway.get("/expenses?limit=3", headers=auth))
    await until(lambda: len(upstream.gates) == 1)  # the page's answer is made, held back
    clock.advance(120.0)  # the expense changed upstream, about twice a second
    detail = await (await gateway.get(f"/expenses/{first['id']}", headers=auth)).json()
    assert detail["method"] != first["method"]
    upstream.gates[0].set()
    answer = await page
    assert answer.status == 200
    newest = (await answer.json())["data"][0]
    assert newest["id"] == first["id"]
    assert newest["method"] == detail["method"]  # not the page made before the detail
    assert len([path for path in upstream.asked if "limit=3" in path]) == 2
    metrics = await (await gateway.get("/metrics")).text()
    assert 'gateway_consistency_refetches_total{route="expenses"} 1.0' in metrics
    # the older page of two, fetched before the detail, was removed by it
    again = await gateway.get("/expenses?limit=2", headers=auth)
    assert again.headers["X-Cache"] == "MISS"


async def test_an_answer_refused_twice_purges_its_records_for_every_caller(
    gateway_factory: GatewayFactory, aiohttp_server: AiohttpServer
) -> None:
    """Asked again, the page is refused again (a fill of a third version overlapped
    it): it is served, and every entry holding its records is purged, so that no
    caller is served the versions it may be newer than (docs/purging.md)."""
    clock = FakeClock()
    upstream = HeldBack(clock, holding=2)
    gateway = await gateway_factory(
        await upstream.start(aiohttp_server),
        clock=clock,
        cache={"backend": "memory", "record_consistency": "caller"},
    )
    gates = upstream.gates
    auth = {"Authorization": f"Bearer {CALLERS[0]}"}
    first = (await (await gateway.get("/expenses?limit=2", headers=auth)).json())["data"][0]
    page = asyncio.ensure_future(gateway.get("/expenses?limit=3", headers=auth))
    await until(lambda: len(gates) == 1)  # the page at its first version, held back
    clock.advance(120.0)
    await gateway.get(f"/expenses/{first['id']}", headers=auth)  # the next version, noted
    gates[0].set()
    await until(lambda: len(gates) == 2)  # refused, asked again: held back too
    clock.advance(120.0)
    again = await gateway.get("/expenses?limit=2", headers=auth)  # a third version, noted
    assert again.headers["X-Cache"] == "MISS"
    gates[1].set()
    answer = await page
    assert answer.status == 200
    # refused twice: every entry holding its records is gone
    for path in ("/expenses?limit=2", f"/expenses/{first['id']}"):
        response = await gateway.get(path, headers=auth)
        assert response.headers["X-Cache"] == "MISS", path
    metrics = await (await gateway.get("/metrics")).text()
    assert 'gateway_consistency_refetches_total{route="expenses"} 1.0' in metrics
