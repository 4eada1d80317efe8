"""Switching ``upstream.base_url`` by a reload (gateway.http.binding): new requests go to
the new upstream, requests in flight finish on the old one, whose pool closes after
them; the cache never mixes the two upstreams, a switch starts cold, switching back
finds the old entries while they live; purge and readiness follow the upstream in use."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from aiohttp.typedefs import Handler
from prometheus_client.parser import text_string_to_metric_families
from pytest_aiohttp import AiohttpClient, AiohttpServer

from gateway.config.live import ConfigSource
from gateway.demo import REQUEST_LOG, create_demo_app
from gateway.http.app import create_app
from gateway.http.binding import UPSTREAMS, Upstreams

from ..config.test_live import ConfigFile
from ..conftest import (
    AUTH,
    FakeClock,
    base_url,
    gateway_client,
    near_cache_live,
    near_of,
    redis_cache,
    until,
)

Client = TestClient[web.Request, web.Application]
ADMIN = "admin-token-0123456789abcdef"
ADMIN_AUTH = {"Authorization": f"Bearer {ADMIN}"}


class Gate:
    """Holds the next requests an upstream receives, once logged, until released (a
    middleware after the reference upstream's own, which logs every request as it
    arrives); the others pass."""

    def __init__(self) -> None:
        self._to_hold = 0
        self._released = asyncio.Event()
        self.held: set[str] = set()  # the X-Request-ID of each request held now

    def hold(self, count: int) -> None:
        self._to_hold = count
        self._released.clear()

    def release(self) -> None:
        self._released.set()

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self._to_hold > 0:
            self._to_hold -= 1
            request_id = request.headers.get("X-Request-ID", "")
            self.held.add(request_id)
            try:
                await self._released.wait()
            finally:
                self.held.discard(request_id)
        return await handler(request)


async def gated_upstream(aiohttp_server: AiohttpServer, gate: Gate, *, seed: int) -> TestServer:
    app = create_demo_app(seed=seed)
    app.middlewares.append(gate.middleware)
    return await aiohttp_server(app)


def logged_ids(server: TestServer) -> set[str | None]:
    return {entry.request_id for entry in server.app[REQUEST_LOG].entries}


def open_connections(server: TestServer) -> int:
    assert server.runner is not None
    assert server.runner.server is not None
    return len(server.runner.server.connections)


Start = Callable[..., Awaitable[Client]]


@pytest.fixture
def start(aiohttp_client: AiohttpClient) -> Start:
    """A gateway whose settings come from ``config``, as the CLI makes it (with the
    wall time of cache entries from ``clock``, when given)."""

    async def start(config: ConfigFile, clock: FakeClock | None = None) -> Client:
        source = ConfigSource(config.path)
        times: dict[str, Any] = {} if clock is None else {"clock": clock}
        app = create_app(source.load(), source=source, **times)
        return await gateway_client(aiohttp_client, app)

    return start


def config_file(tmp_path: Path, upstream: str, cache: dict[str, Any] | None = None) -> ConfigFile:
    return ConfigFile(
        tmp_path / "gateway.toml",
        {
            "upstream": {"base_url": upstream},
            "cache": cache or {"backend": "memory"},
            "admin": {"token": ADMIN},
        },
    )


async def switch(client: Client, config: ConfigFile, upstream: str) -> None:
    config.set("upstream", "base_url", upstream)
    response = await client.post("/admin/reload", headers=ADMIN_AUTH)
    assert response.status == 200
    assert (await response.json())["applied"] == ["upstream.base_url"]


def upstreams(client: Client) -> Upstreams:
    return client.app[UPSTREAMS]


async def drained(client: Client) -> None:
    """Wait until every binding switched away from is closed."""
    await until(lambda: not upstreams(client).draining)


BEFORE, DURING, AFTER = "before", "during", "after"


@dataclass
class Answer:
    request_id: str
    sent: str  # BEFORE the reload was asked for, DURING it, AFTER its answer
    own_call: bool  # its key is asked by no other request: a miss calls the upstream itself
    status: int = 0
    x_cache: str = ""
    answered: str = ""  # BEFORE the reload was asked for, DURING it, AFTER its answer


@dataclass
class Load:
    """Clients that keep asking the gateway, each request with its own X-Request-ID:
    a page of expenses no one asked before (a miss), users with ``no-cache`` (the
    upstream called, not coalesced) and clients (hits, once filled)."""

    client: Client
    answers: list[Answer] = field(default_factory=list)
    phase: str = BEFORE
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    _ids: itertools.count[int] = field(default_factory=itertools.count)

    async def worker(self) -> None:
        while not self.stop.is_set():
            n = next(self._ids)
            answer = Answer(f"load-{n}", self.phase, own_call=n % 3 != 2)
            headers = {**AUTH, "X-Request-ID": answer.request_id}
            if n % 3 == 0:
                path = f"/expenses?page={n + 1}"
            elif n % 3 == 1:
                path, headers["Cache-Control"] = "/users", "no-cache"
            else:
                path = "/clients"
            self.answers.append(answer)
            async with self.client.get(path, headers=headers) as response:
                await response.read()
                answer.status = response.status
                answer.x_cache = response.headers.get("X-Cache", "")
                answer.answered = self.phase

    def done(self, sent: str) -> int:
        return sum(1 for a in self.answers if a.status and a.sent == sent)

    def sent(self, sent: str) -> list[Answer]:
        return [a for a in self.answers if a.sent == sent]


@pytest.mark.parametrize("backend", ["memory", "redis"])
async def test_a_switch_under_load_fails_no_request_and_sends_the_new_ones_to_the_new_upstream(
    start: Start,
    aiohttp_server: AiohttpServer,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    redis_url: str,
    backend: str,
) -> None:
    """Held for docs/switching-upstreams.md, "4. Switch": under load (memory, Redis): no failed
    request; requests after the reload reach the new upstream only, those in flight finish
    on the old one, whose pool closes after them; logged and counted.
    """
    gate = Gate()
    old = await gated_upstream(aiohttp_server, gate, seed=1)
    new = await aiohttp_server(create_demo_app(seed=2))
    cache = redis_cache(redis_url) if backend == "redis" else {"backend": "memory"}
    config = config_file(tmp_path, base_url(old), cache)
    client = await start(config)
    load = Load(client)
    workers = [asyncio.ensure_future(load.worker()) for _ in range(12)]
    await until(lambda: load.done(BEFORE) >= 30)

    # requests held by the old upstream: in flight through the reload
    gate.hold(4)
    await until(lambda: len(gate.held) == 4)
    before = upstreams(client).current
    load.phase = DURING
    await switch(client, config, base_url(new))
    load.phase = AFTER
    in_flight = set(gate.held)
    assert len(in_flight) == 4
    # the old binding drains: its pool stays open while its requests are in flight
    assert upstreams(client).draining == [before]
    assert not before.link.closed
    assert upstreams(client).current is not before

    await until(lambda: load.done(AFTER) >= 60)
    assert not before.link.closed
    gate.release()
    load.stop.set()
    await asyncio.gather(*workers)

    assert [a.status for a in load.answers] == [200] * len(load.answers), "no failed request"
    old_ids, new_ids = logged_ids(old), logged_ids(new)
    by_id = {a.request_id: a for a in load.answers}
    # the requests in flight at the reload were answered by the old upstream
    assert in_flight <= old_ids
    assert not in_flight & new_ids
    assert {by_id[i].status for i in in_flight} == {200}
    after = load.sent(AFTER)
    assert len(after) >= 60
    # every request sent after the reload's answer reached the new upstream only
    assert not {a.request_id for a in after} & old_ids
    called = [a for a in after if a.own_call]
    assert {a.x_cache for a in called} <= {"MISS", "BYPASS"}
    assert len(called) >= 40
    assert {a.request_id for a in called} <= new_ids
    # those answered before the reload was asked for reached the old one; those sent
    # before its answer and answered after, either one (which, depends on whether the
    # gateway began them before the switch), never both
    answered_before = {a.request_id for a in load.answers if a.answered == BEFORE and a.own_call}
    assert len(answered_before) >= 10
    assert answered_before <= old_ids
    assert not answered_before & new_ids
    for answer in load.answers:
        if answer.own_call and answer.sent != AFTER and answer.answered != BEFORE:
            assert (answer.request_id in old_ids) != (answer.request_id in new_ids)

    # the old pool closes once its requests are done; the old upstream sees no connection
    await drained(client)
    assert before.link.closed
    assert not upstreams(client).current.link.closed
    await until(lambda: open_connections(old) == 0)

    switches = [r for r in caplog.records if getattr(r, "event", None) == "upstream_switch"]
    assert [(r.from_url, r.to_url) for r in switches] == [(base_url(old), base_url(new))]
    assert switches[0].in_flight >= len(in_flight)
    drains = [r for r in caplog.records if getattr(r, "event", None) == "upstream_drained"]
    assert [r.unfinished for r in drains] == [0]
    metrics = await (await client.get("/metrics")).text()
    assert metric(metrics, "gateway_upstream_switches_total") == 1


def metric(text: str, name: str) -> float:
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    )


async def x_cache(client: Client, path: str = "/users") -> str:
    response = await client.get(path, headers=AUTH)
    assert response.status == 200
    return response.headers["X-Cache"]


def users_calls(server: TestServer) -> int:
    return len(server.app[REQUEST_LOG].for_path("/users"))


@pytest.mark.parametrize("backend", ["memory", "redis"])
async def test_a_switch_starts_cold_and_switching_back_finds_the_old_entries(
    start: Start,
    aiohttp_server: AiohttpServer,
    tmp_path: Path,
    redis_url: str,
    backend: str,
) -> None:
    """Held for docs/switching-upstreams.md, "4. Switch": a cold cache, and switching back finds
    the old entries (memory, Redis).
    """
    first = await aiohttp_server(create_demo_app(seed=1))
    second = await aiohttp_server(create_demo_app(seed=2))
    cache = {"backend": "memory"}
    if backend == "redis":
        cache = redis_cache(redis_url)
    config = config_file(tmp_path, base_url(first), cache)
    client = await start(config)
    assert await x_cache(client) == "MISS"
    assert await x_cache(client) == "HIT"
    first_body = await (await client.get("/users", headers=AUTH)).read()

    await switch(client, config, base_url(second))
    assert await x_cache(client) == "MISS", "a switch starts with a cold cache"
    assert await x_cache(client) == "HIT"
    second_body = await (await client.get("/users", headers=AUTH)).read()
    assert second_body != first_body
    assert (users_calls(first), users_calls(second)) == (1, 1)

    await switch(client, config, base_url(first))
    response = await client.get("/users", headers=AUTH)
    assert response.headers["X-Cache"] == "HIT", "the first upstream's entry, still fresh"
    assert await response.read() == first_body
    assert (users_calls(first), users_calls(second)) == (1, 1)
    await drained(client)


async def test_switching_back_finds_the_old_entries_only_while_they_live(
    start: Start, aiohttp_server: AiohttpServer, tmp_path: Path, clock: FakeClock
) -> None:
    """Held for docs/switching-upstreams.md, "4. Switch": the old entries only while they live:
    fresh, then stale, then gone.
    """
    first = await aiohttp_server(create_demo_app(seed=1))
    second = await aiohttp_server(create_demo_app(seed=2))
    cache = {
        "backend": "memory",
        "ttl_s": {"users": 60, "clients": 60},
        "stale_while_revalidate_s": 30,
        "stale_if_error_s": 0,
    }
    config = config_file(tmp_path, base_url(first), cache)
    client = await start(config, clock)
    assert await x_cache(client) == "MISS"
    assert await x_cache(client, "/clients") == "MISS"

    await switch(client, config, base_url(second))
    clock.advance(70)  # /users and /clients: past their TTL, within the stale window
    await switch(client, config, base_url(first))
    assert await x_cache(client) == "STALE"  # (and refreshed from the first upstream)
    await drained(client)
    await until(lambda: users_calls(first) == 2)
    clock.advance(30)  # /clients: past its TTL and its stale window, gone
    assert await x_cache(client, "/clients") == "MISS"
    assert len(first.app[REQUEST_LOG].for_path("/clients")) == 2
    assert len(second.app[REQUEST_LOG]) == 0


@pytest.mark.parametrize(
    ("backend", "after_switching_back"), [("memory", "MISS"), ("redis", "HIT")]
)
async def test_a_purge_after_a_switch_reaches_the_new_upstreams_entries(
    start: Start,
    aiohttp_server: AiohttpServer,
    tmp_path: Path,
    redis_url: str,
    backend: str,
    after_switching_back: str,
) -> None:
    """Held for docs/switching-upstreams.md, "4. Switch": a purge after a switch."""
    first = await aiohttp_server(create_demo_app(seed=1))
    second = await aiohttp_server(create_demo_app(seed=2))
    cache = {"backend": "memory"}
    if backend == "redis":
        cache = redis_cache(redis_url)
    config = config_file(tmp_path, base_url(first), cache)
    client = await start(config)
    assert await x_cache(client) == "MISS"
    await switch(client, config, base_url(second))
    assert await x_cache(client) == "MISS"
    assert await x_cache(client) == "HIT"

    response = await client.delete("/admin/cache", headers=ADMIN_AUTH)
    assert response.status == 200
    assert await x_cache(client) == "MISS"
    assert users_calls(second) == 2

    # Redis: the purge was the second upstream's alone; memory: it dropped everything
    await switch(client, config, base_url(first))
    assert await x_cache(client) == after_switching_back
    assert users_calls(first) == (1 if after_switching_back == "HIT" else 2)


async def test_instances_switched_to_an_upstream_share_its_purges_with_those_started_on_it(
    start: Start,
    aiohttp_server: AiohttpServer,
    tmp_path: Path,
    redis_url: str,
) -> None:
    """Held for docs/switching-upstreams.md, "4. Switch": instances switched to an upstream and
    started on it share its entries and purges.
    """
    first = await aiohttp_server(create_demo_app(seed=1))
    second = await aiohttp_server(create_demo_app(seed=2))
    cache = redis_cache(redis_url)
    (tmp_path / "on-second").mkdir()
    (tmp_path / "switched").mkdir()
    started_on_second = await start(config_file(tmp_path / "on-second", base_url(second), cache))
    config = config_file(tmp_path / "switched", base_url(first), cache)
    switched = await start(config)
    await near_cache_live(started_on_second)
    assert await x_cache(started_on_second) == "MISS"

    # before the switch: nothing shared, neither entries nor purges
    await near_cache_live(switched)
    assert await x_cache(switched) == "MISS"
    response = await switched.delete("/admin/cache?route=users", headers=ADMIN_AUTH)
    assert (await response.json())["instances"] == {"told": 1, "confirmed": 1}
    assert await x_cache(started_on_second) == "HIT"
    assert (users_calls(first), users_calls(second)) == (1, 1)

    await switch(switched, config, base_url(second))
    await near_cache_live(switched)
    # one key space: what one instance filled, the other finds
    assert await x_cache(switched) == "HIT"
    assert len(near_of(started_on_second)) == 1
    # one invalidation channel and one set of purge generations
    response = await switched.delete("/admin/cache?route=users", headers=ADMIN_AUTH)
    assert (await response.json())["instances"] == {"told": 2, "confirmed": 2}
    assert len(near_of(started_on_second)) == 0
    assert await x_cache(started_on_second) == "MISS"
    assert (users_calls(first), users_calls(second)) == (1, 2)


async def test_readiness_follows_the_upstream_in_use(
    start: Start, aiohttp_server: AiohttpServer, tmp_path: Path
) -> None:
    """Held for docs/switching-upstreams.md, "4. Switch": `/readyz`."""
    up = await aiohttp_server(create_demo_app())
    gone = await aiohttp_server(create_demo_app())
    gone_url = base_url(gone)
    await gone.close()
    config = config_file(tmp_path, base_url(up), {"backend": "none"})
    client = await start(config)
    response = await client.get("/readyz")
    assert (response.status, (await response.json())["status"]) == (200, "ok")

    await switch(client, config, gone_url)
    response = await client.get("/readyz")
    body = await response.json()
    assert response.status == 503
    assert body["components"]["upstream"]["status"] == "down"

    await switch(client, config, base_url(up))
    response = await client.get("/readyz")
    assert (response.status, (await response.json())["status"]) == (200, "ok")


async def test_a_reload_that_keeps_base_url_keeps_the_binding_and_its_pool(
    start: Start, aiohttp_server: AiohttpServer, tmp_path: Path
) -> None:
    """Held for docs/switching-upstreams.md, "4. Switch": a reload that keeps the URL keeps the
    pool.
    """
    up = await aiohttp_server(create_demo_app())
    config = config_file(tmp_path, base_url(up))
    client = await start(config)
    assert await x_cache(client) == "MISS"
    assert up.runner is not None
    assert up.runner.server is not None
    (connection,) = up.runner.server.connections
    binding = upstreams(client).current

    config.set("upstream", "timeout_s", 3.0)
    config.set("cache", "ttl_s", {"clients": 10})
    response = await client.post("/admin/reload", headers=ADMIN_AUTH)
    assert (await response.json())["applied"] == ["cache.ttl_s", "upstream.timeout_s"]
    assert upstreams(client).current is binding
    assert upstreams(client).draining == []
    assert binding.upstream.timeout_s == 3.0
    assert await x_cache(client) == "HIT"
    assert await x_cache(client, "/clients") == "MISS"
    # the same connection to the upstream carried the call after the reload
    assert up.runner.server.connections == [connection]
    metrics = await (await client.get("/metrics")).text()
    assert metric(metrics, "gateway_upstream_switches_total") == 0


async def test_a_shutdown_during_a_drain_closes_every_binding(
    start: Start, aiohttp_server: AiohttpServer, tmp_path: Path
) -> None:
    """Held for docs/switching-upstreams.md, "4. Switch": a shutdown during a switch closes both
    pools.
    """
    gate = Gate()
    old = await gated_upstream(aiohttp_server, gate, seed=1)
    new = await aiohttp_server(create_demo_app(seed=2))
    config = config_file(tmp_path, base_url(old))
    client = await start(config)
    gate.hold(1)
    held = asyncio.ensure_future(client.get("/users", headers=AUTH))
    await until(lambda: len(gate.held) == 1)
    before = upstreams(client).current
    await switch(client, config, base_url(new))
    assert upstreams(client).draining == [before]

    # what the app's cleanup does at shutdown: it does not wait for the old request
    await upstreams(client).close()
    assert before.link.closed
    assert upstreams(client).current.link.closed
    assert upstreams(client).draining == []
    gate.release()
    # (the request is cut short, as a shutdown's cleanup cuts what is still running)
    with contextlib.suppress(aiohttp.ServerDisconnectedError):
        (await held).release()
