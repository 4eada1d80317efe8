"""The upstream's circuit breaker, as callers see it: an upstream that hangs or fails
is not called again until its reset time, stale entries come back at once meanwhile,
and a request without one gets a 503 with Retry-After at once."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from prometheus_client.parser import text_string_to_metric_families
from pytest_aiohttp import AiohttpServer

from gateway.demo import create_demo_app
from gateway.errors import UpstreamContractError

from ..conftest import AUTH, FakeClock, GatewayFactory, base_url

Client = TestClient[web.Request, web.Application]


class FaultyUpstream:
    """The reference upstream behind a switch: ``mode`` "ok" serves, "hang" never
    answers, "503" fails, "not-json" answers 200 with a body that is not JSON;
    ``calls`` lists every request that reached it."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.modes: dict[str, str] = {}  # by path: overrides ``mode``
        self.calls: list[str] = []

    def app(self) -> web.Application:
        app = create_demo_app()

        @web.middleware
        async def fault(
            request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
        ) -> web.StreamResponse:
            self.calls.append(request.path_qs)
            mode = self.modes.get(request.path, self.mode)
            if mode == "hang":
                await asyncio.sleep(3600)
            if mode == "503":
                return web.Response(status=503, text="down for maintenance")
            if mode == "not-json":
                return web.Response(
                    text="<html>maintenance</html>", content_type="application/json"
                )
            return await handler(request)

        app.middlewares.insert(0, fault)  # before the demo's own: every request counts
        return app


@pytest.fixture
async def faulty(aiohttp_server: AiohttpServer) -> tuple[FaultyUpstream, str]:
    upstream = FaultyUpstream()
    server = await aiohttp_server(upstream.app())
    return upstream, base_url(server)


def cache(**extra: Any) -> dict[str, Any]:
    """A memory cache whose /users answers go stale after 5 s and stand in for an
    upstream failure for 600 s more."""
    return {
        "backend": "memory",
        "ttl_s": {"users": 5},
        "stale_while_revalidate_s": 0,
        "stale_if_error_s": 600,
        **extra,
    }


async def get(client: Client, path: str) -> tuple[int, dict[str, str], bytes]:
    response = await client.get(path, headers=AUTH)
    return response.status, dict(response.headers), await response.read()


async def cached_pages(client: Client, count: int) -> list[str]:
    """``count`` pages of /users, each fetched once (now in the cache)."""
    pages = [f"/users?page={page}" for page in range(1, count + 1)]
    for path in pages:
        assert (await get(client, path))[0] == 200
    return pages


def circuit_metrics(text: str) -> dict[str, float]:
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "gateway_upstream_circuit_state":
                found["state"] = sample.value
            elif sample.name == "gateway_upstream_circuit_changes_total":
                found[sample.labels["state"]] = sample.value
    return found


async def test_a_hanging_upstream_opens_the_circuit_and_stale_entries_come_back_without_calling_it(
    faulty: tuple[FaultyUpstream, str], gateway_factory: GatewayFactory, clock: FakeClock
) -> None:
    """Held for docs/deployment.md, "When the upstream fails": hangs."""
    upstream, url = faulty
    client = await gateway_factory(
        url,
        clock,
        cache=cache(),
        upstream={"timeout_s": 1.0, "breaker_failures": 2, "breaker_reset_s": 600},
    )
    pages = await cached_pages(client, 12)
    fresh = {path: (await get(client, path))[2] for path in pages}
    clock.advance(10)  # every entry stale, within stale_if_error_s
    upstream.mode = "hang"
    before = len(upstream.calls)

    # two requests wait for the upstream's timeout, and are served stale after it (or
    # as the circuit opens, whichever they see first)
    first = await asyncio.gather(*(get(client, path) for path in pages[:2]))
    for status, headers, _body in first:
        assert (status, headers["X-Cache"]) == (200, "STALE")
        assert "fwd=stale" in headers["Cache-Status"] or "circuit-open" in headers["Cache-Status"]
    assert len(upstream.calls) == before + 2

    # the circuit is open: every other stale entry comes back without an upstream call
    for path in pages[2:]:
        status, headers, body = await get(client, path)
        assert (status, headers["X-Cache"]) == (200, "STALE")
        assert body == fresh[path]
        assert headers["Cache-Status"].endswith("detail=upstream-circuit-open")
        assert headers["Cache-Status"].startswith("records-gateway; hit; ttl=-")
    assert len(upstream.calls) == before + 2

    # a request with nothing stale to serve gets a 503 at once, and calls nobody
    status, headers, body = await get(client, "/users?page=99")
    assert status == 503
    assert headers["Content-Type"] == "application/problem+json"
    assert headers["X-Request-ID"]
    assert 1 <= int(headers["Retry-After"]) <= 600
    assert headers["Cache-Status"] == "records-gateway; detail=upstream-circuit-open"
    problem = await (await client.get("/users?page=99", headers=AUTH)).json(content_type=None)
    assert problem["type"] == "urn:records-gateway:problem:upstream-unavailable"
    assert problem["status"] == 503
    assert "failed repeatedly" in problem["detail"]
    assert "page=" not in problem["detail"], "nothing of other callers' requests"
    assert len(upstream.calls) == before + 2


async def test_requests_waiting_with_a_stale_answer_get_it_as_soon_as_the_circuit_opens(
    faulty: tuple[FaultyUpstream, str], gateway_factory: GatewayFactory, clock: FakeClock
) -> None:
    """Held for docs/deployment.md, "When the upstream fails": hangs."""
    upstream, url = faulty
    client = await gateway_factory(
        url,
        clock,
        cache=cache(),
        upstream={"timeout_s": 60, "breaker_failures": 1, "breaker_reset_s": 600},
    )
    pages = await cached_pages(client, 3)
    clock.advance(10)
    upstream.modes["/users"] = "hang"
    waiting = [asyncio.ensure_future(get(client, path)) for path in pages]
    while len(upstream.calls) < 6:
        await asyncio.sleep(0.01)  # the three calls hang upstream
    assert not any(request.done() for request in waiting)
    upstream.modes["/clients"] = "503"
    assert (await get(client, "/clients"))[0] == 502  # the failure that opens the circuit
    async with asyncio.timeout(30):  # (a guard against a hang: the timeout is 60 s)
        answers = await asyncio.gather(*waiting)
    for status, headers, _ in answers:
        assert (status, headers["X-Cache"]) == (200, "STALE")
        assert headers["Cache-Status"].endswith("detail=upstream-circuit-open")


async def test_while_the_upstream_hangs_it_sees_at_most_one_request_per_reset_interval(
    faulty: tuple[FaultyUpstream, str], gateway_factory: GatewayFactory, clock: FakeClock
) -> None:
    """Held for docs/deployment.md, "When the upstream fails": hangs."""
    upstream, url = faulty
    ticks = FakeClock()  # the breaker's time, moved by hand
    client = await gateway_factory(
        url,
        clock,
        ticks,
        cache=cache(),
        upstream={"timeout_s": 0.3, "breaker_failures": 1, "breaker_reset_s": 5},
    )
    pages = await cached_pages(client, 5)
    clock.advance(10)
    upstream.mode = "hang"
    status, headers, _ = await get(client, pages[0])  # waits the timeout; opens the circuit
    assert (status, headers["X-Cache"]) == (200, "STALE")

    trials = []
    for _interval in range(4):
        before = len(upstream.calls)
        for _ in range(3):
            for path in pages:
                status, headers, _ = await get(client, path)
                # never a caller waiting on the hanging upstream: each answer is the
                # stale entry, given without calling it (a trial runs in the background)
                assert (status, headers["X-Cache"]) == (200, "STALE")
                assert headers["Cache-Status"].endswith("detail=upstream-circuit-open")
        await asyncio.sleep(0.4)  # a trial under way times out (0.3 s) meanwhile
        trials.append(len(upstream.calls) - before)
        ticks.advance(5)  # the next reset interval
    assert trials == [0, 1, 1, 1]


async def test_a_failing_upstream_is_left_alone_then_tried_once_and_closed_again(
    faulty: tuple[FaultyUpstream, str],
    gateway_factory: GatewayFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Held for docs/deployment.md, "When the upstream fails": answers 5xx."""
    upstream, url = faulty
    ticks = FakeClock()
    client = await gateway_factory(url, None, ticks, cache={"backend": "none"})
    caplog.set_level(logging.INFO, logger="gateway.upstream")
    upstream.mode = "503"
    statuses = [(await get(client, "/users"))[0] for _ in range(5)]
    assert statuses == [502] * 5
    assert len(upstream.calls) == 5

    for _ in range(20):
        status, headers, _ = await get(client, "/users")
        assert status == 503
        assert headers["Retry-After"] == "5"
    problem = await (await client.get("/users", headers=AUTH)).json(content_type=None)
    assert problem["retryAfter"] == 5
    assert len(upstream.calls) == 5, "an open circuit calls nobody"
    metrics = circuit_metrics(await (await client.get("/metrics")).text())
    assert metrics["state"] == 2
    assert metrics["open"] == 1

    upstream.mode = "ok"
    ticks.advance(5)
    assert (await get(client, "/users"))[0] == 200  # the trial
    assert (await get(client, "/users"))[0] == 200
    assert len(upstream.calls) == 7
    metrics = circuit_metrics(await (await client.get("/metrics")).text())
    assert metrics == {"state": 0, "open": 1, "half-open": 1, "closed": 1}
    changes = [
        (record.levelname, getattr(record, "to", None))
        for record in caplog.records
        if getattr(record, "event", None) == "upstream_circuit"
    ]
    assert changes == [("WARNING", "open"), ("INFO", "half-open"), ("INFO", "closed")]


async def test_answers_about_one_request_never_open_the_circuit(
    faulty: tuple[FaultyUpstream, str], gateway_factory: GatewayFactory
) -> None:
    """Held for docs/deployment.md, "When the upstream fails": answers 401, 403, 404 or 429."""
    upstream, url = faulty
    client = await gateway_factory(url, cache={"backend": "none"}, upstream={"breaker_failures": 2})
    for _ in range(10):
        assert (await get(client, "/expenses/00000000-0000-4000-8000-000000000000"))[0] == 404
        response = await client.get(
            "/users", headers={"Authorization": "Bearer wrong-secret-token"}
        )
        assert response.status == 401
    assert (await get(client, "/users"))[0] == 200
    assert len(upstream.calls) == 21


async def test_failures_far_apart_are_not_a_streak(
    faulty: tuple[FaultyUpstream, str], gateway_factory: GatewayFactory
) -> None:
    upstream, url = faulty
    ticks = FakeClock()
    client = await gateway_factory(
        url,
        None,
        ticks,
        cache={"backend": "none"},
        upstream={"breaker_failures": 2, "breaker_window_s": 10},
    )
    upstream.mode = "503"
    assert (await get(client, "/users"))[0] == 502
    ticks.advance(11)
    assert (await get(client, "/users"))[0] == 502, "a failure past the window starts anew"
    ticks.advance(9)
    assert (await get(client, "/users"))[0] == 502  # the second in a row: opens it
    assert (await get(client, "/users"))[0] == 503
    assert len(upstream.calls) == 3


async def test_readiness_reports_the_open_circuit_without_calling_the_upstream(
    faulty: tuple[FaultyUpstream, str], gateway_factory: GatewayFactory
) -> None:
    """Held for docs/deployment.md, "When the upstream fails": answers 5xx."""
    upstream, url = faulty
    client = await gateway_factory(
        url,
        cache={"backend": "memory"},
        upstream={"breaker_failures": 1, "breaker_reset_s": 600},
        health={"check_interval_s": 0},
    )
    upstream.mode = "503"
    assert (await get(client, "/users"))[0] == 502
    calls = len(upstream.calls)
    response = await client.get("/readyz")
    body = await response.json()
    assert body["components"]["upstream"]["status"] == "down"
    assert body["components"]["upstream"]["circuit"] == "open"
    assert "the gateway does not call it for about" in body["components"]["upstream"]["lastError"]
    assert len(upstream.calls) == calls


async def test_the_readiness_check_is_the_trial_that_closes_the_circuit_on_probation(
    faulty: tuple[FaultyUpstream, str], gateway_factory: GatewayFactory
) -> None:
    """Held for docs/deployment.md, "When the upstream fails": comes back."""
    upstream, url = faulty
    ticks = FakeClock()
    client = await gateway_factory(
        url,
        None,
        ticks,
        cache={"backend": "memory"},
        upstream={"breaker_failures": 3, "breaker_reset_s": 5},
        health={"check_interval_s": 0},
    )
    upstream.mode = "503"
    for _ in range(3):
        assert (await get(client, "/users"))[0] == 502
    upstream.mode = "ok"
    ticks.advance(5)
    body = await (await client.get("/readyz")).json()
    assert body["components"]["upstream"]["circuit"] == "closed"
    assert upstream.calls[-1] == "/users", "the check's own call, without a token"
    # on probation: the check's 401 proves the upstream answers, not that it works, so
    # the next failure opens the circuit again at once
    upstream.mode = "503"
    assert (await get(client, "/users?page=2"))[0] == 502
    assert (await get(client, "/users?page=3"))[0] == 503
    upstream.mode = "ok"
    ticks.advance(5)
    assert (await get(client, "/users?page=3"))[0] == 200  # a caller's trial: a fresh start
    upstream.mode = "503"
    assert (await get(client, "/users?page=4"))[0] == 502
    assert (await get(client, "/users?page=5"))[0] == 502, "three in a row again to open it"


async def test_an_upstream_that_refuses_connections_opens_the_circuit_and_stale_entries_come_back(
    aiohttp_server: AiohttpServer, gateway_factory: GatewayFactory, clock: FakeClock
) -> None:
    """Held for docs/deployment.md, "When the upstream fails": refuses connections."""
    upstream = FaultyUpstream()
    server = await aiohttp_server(upstream.app())
    client = await gateway_factory(
        base_url(server),
        clock,
        cache=cache(),
        upstream={"breaker_failures": 2, "breaker_reset_s": 600},
    )
    pages = await cached_pages(client, 5)
    await server.close()  # the port refuses connections from now on
    clock.advance(10)
    details = [(await get(client, path))[1]["Cache-Status"] for path in pages]
    # the first failure: the stale entry instead of the error; the second opens the
    # circuit (its caller gets the stale entry either way); then no more calls
    assert details[0].startswith("records-gateway; fwd=stale")
    assert "connection refused" not in details[0].lower()
    assert all(detail.endswith("detail=upstream-circuit-open") for detail in details[2:])
    status, headers, _ = await get(client, "/users?page=99")
    assert (status, headers["Retry-After"]) == (503, "600")
    metrics = circuit_metrics(await (await client.get("/metrics")).text())
    assert metrics == {"state": 2, "open": 1}


async def test_an_entry_within_stale_while_revalidate_says_the_circuit_is_open(
    faulty: tuple[FaultyUpstream, str], gateway_factory: GatewayFactory, clock: FakeClock
) -> None:
    upstream, url = faulty
    client = await gateway_factory(
        url,
        clock,
        cache=cache(stale_while_revalidate_s=60),
        upstream={"breaker_failures": 1, "breaker_reset_s": 600},
    )
    assert (await get(client, "/users?page=1"))[0] == 200
    upstream.mode = "503"
    assert (await get(client, "/users?page=2"))[0] == 502  # opens the circuit
    calls = len(upstream.calls)
    clock.advance(10)  # within stale_while_revalidate_s
    status, headers, _ = await get(client, "/users?page=1")
    assert (status, headers["X-Cache"]) == (200, "STALE")
    assert headers["Cache-Status"] == ("records-gateway; hit; ttl=-5; detail=upstream-circuit-open")
    await asyncio.sleep(0.05)
    assert len(upstream.calls) == calls, "no background refresh while the circuit is open"


async def test_a_broken_answer_while_a_stale_entry_waits_is_freed_without_the_collector(
    faulty: tuple[FaultyUpstream, str], gateway_factory: GatewayFactory, clock: FakeClock
) -> None:
    # a request holding a stale entry waits for the fill or the circuit, whichever comes
    # first; the fill's failure (its frames hold the upstream's body) is freed with the
    # request, not when the worker's rarely running collector comes by
    upstream, url = faulty
    client = await gateway_factory(url, clock, cache=cache(), upstream={"breaker_failures": 2})
    pages = await cached_pages(client, 1)
    clock.advance(10)  # stale, within stale_if_error_s
    upstream.mode = "not-json"
    gc.collect()
    gc.disable()
    try:
        status, headers, _ = await get(client, pages[0])
        assert status == 502
        assert headers["Content-Type"] == "application/problem+json"
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        held = [found for found in gc.garbage if isinstance(found, UpstreamContractError)]
        assert held == []
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
