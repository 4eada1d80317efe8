"""/healthz and /readyz end to end, and the readiness report with fakes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families
from pytest_aiohttp import AiohttpServer

from gateway.demo import REQUEST_LOG, RequestLog, create_demo_app
from gateway.errors import CacheUnavailable, UpstreamUnavailable
from gateway.ops.health import CacheOutcomes, Readiness, Tally
from gateway.upstream.health import UpstreamHealth

from ..conftest import AUTH, GatewayFactory, base_url, redis_cache
from ..redis_server import RedisServer

Client = TestClient[web.Request, web.Application]
SECRET = "test-key-secret-0123456789"
NO_CHECK_LIMIT = {"check_interval_s": 0}


def cache_component(
    status: str = "ok",
    last_error: str | None = None,
    *,
    source: str = "check",
    circuit: str = "closed",
    reads: tuple[int, int] = (0, 0),
    writes: tuple[int, int] = (0, 0),
    probes: tuple[int, int] = (1, 0),
) -> dict[str, Any]:
    """The cache's part of /readyz; the counts are (ok, failed) over the window."""
    return {
        "status": status,
        "lastError": last_error,
        "source": source,
        "circuit": circuit,
        "reads": {"ok": reads[0], "failed": reads[1]},
        "writes": {"ok": writes[0], "failed": writes[1]},
        "probes": {"ok": probes[0], "failed": probes[1]},
    }


def all_ok(*, upstream_circuit: bool = True, **cache: Any) -> dict[str, Any]:
    """The report of a gateway whose parts are fine, as checks (not traffic) say (a
    Readiness made without the upstream's circuit reports none)."""
    upstream: dict[str, Any] = {"status": "ok", "lastError": None, "source": "check"}
    if upstream_circuit:
        upstream["circuit"] = "closed"
    return {
        "status": "ok",
        "components": {"upstream": upstream, "cache": cache_component(**cache)},
    }


ALL_OK = all_ok()
# the fakes' cache check records no probe
FAKES_OK = all_ok(probes=(0, 0), upstream_circuit=False)


async def circuit_states(client: Client) -> list[float]:
    """The values of gateway_cache_circuit_state on /metrics."""
    text = await (await client.get("/metrics")).text()
    return [
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "gateway_cache_circuit_state"
    ]


async def ready(client: Client) -> tuple[int, Any]:
    """GET /readyz without a token: the status and the report, without the fleet
    component of a Redis-backed gateway (tests/cache/test_fleet.py has it), which is
    checked here to agree (a lone instance)."""
    response = await client.get("/readyz")
    assert response.headers["Content-Type"] == "application/json"
    assert response.headers["Cache-Control"] == "no-store"
    report = await response.json()
    fleet = report["components"].pop("fleet", None)
    if fleet is not None:
        assert fleet["status"] in ("ok", "unknown")
    return response.status, report


async def test_healthz_answers_without_a_token_and_touches_nothing(
    gateway: Client, upstream_log: RequestLog
) -> None:
    response = await gateway.get("/healthz")
    assert response.status == 200
    assert await response.read() == b'{"status":"ok"}'
    assert response.headers["Content-Type"] == "application/json"
    assert response.headers["Cache-Control"] == "no-store"
    assert len(upstream_log) == 0


async def test_readyz_is_ok_with_redis_and_the_upstream(
    gateway_factory: GatewayFactory,
    upstream: TestServer,
    upstream_log: RequestLog,
    redis_url: str,
) -> None:
    client = await gateway_factory(base_url(upstream), cache=redis_cache(redis_url))
    assert await ready(client) == (200, ALL_OK)
    # the check proves the upstream answers; it carries no token
    assert [(r.path, r.authorization) for r in upstream_log.entries] == [("/users", None)]


async def test_readyz_while_redis_is_stopped_then_back(
    gateway_factory: GatewayFactory, upstream: TestServer, own_redis: RedisServer
) -> None:
    """Held for docs/deployment.md, "Faults, and what callers see": Redis down (refused)."""
    client = await gateway_factory(
        base_url(upstream), cache=redis_cache(own_redis.url), health=NO_CHECK_LIMIT
    )
    assert await ready(client) == (200, ALL_OK)
    port = own_redis.port

    own_redis.stop()
    status, report = await ready(client)
    assert (status, report["status"]) == (200, "degraded")
    assert report["components"]["upstream"] == {
        "status": "ok",
        "lastError": None,
        "source": "check",
        "circuit": "closed",
    }
    cache = report["components"]["cache"]
    # no traffic, and the probe (a real write and read, not a PING) failed: down
    assert (cache["status"], cache["source"]) == ("down", "check")
    assert cache["lastError"].startswith("redis SET: ConnectionError")
    assert cache["probes"] == {"ok": 1, "failed": 1}
    # requests are still served, from the upstream
    reply = await client.get("/users", headers=AUTH)
    assert reply.status == 200
    assert reply.headers["X-Cache"] == "MISS"
    cache = (await ready(client))[1]["components"]["cache"]
    assert (cache["status"], cache["source"], cache["reads"]) == (
        "down",
        "traffic",
        {"ok": 0, "failed": 1},
    )

    own_redis.start()
    assert own_redis.port == port  # the same address: the gateway's client reconnects
    status, report = await ready(client)
    assert (status, report["status"]) == (200, "degraded")
    cache = report["components"]["cache"]
    # the probe passes again, but the read that failed is still within the window
    assert (cache["status"], cache["circuit"], cache["reads"]) == (
        "degraded",
        "closed",
        {"ok": 0, "failed": 1},
    )
    # the latest error: the probe's while Redis was stopped
    assert cache["lastError"].startswith("redis SET: ConnectionError")
    for page in range(2, 12):
        assert (await client.get(f"/users?page={page}", headers=AUTH)).status == 200
    status, report = await ready(client)
    assert (status, report["status"]) == (200, "ok")
    cache = report["components"]["cache"]
    # one failed read among ten that passed is below the share that degrades it
    assert (cache["status"], cache["source"]) == ("ok", "traffic")
    assert cache["reads"]["failed"] == 1
    assert cache["reads"]["ok"] >= 10
    # the latest error stays on show
    assert cache["lastError"].startswith("redis SET: ConnectionError")


RESET_S = 0.3


async def with_open_circuit(
    gateway_factory: GatewayFactory, upstream: TestServer, own_redis: RedisServer
) -> Client:
    """A gateway on ``own_redis`` whose circuit opened: Redis stopped, one request made."""
    client = await gateway_factory(
        base_url(upstream),
        cache=redis_cache(own_redis.url, breaker_failures=1, breaker_reset_s=RESET_S),
        health=NO_CHECK_LIMIT,
    )
    own_redis.stop()
    assert (await client.get("/users", headers=AUTH)).status == 200  # opens the circuit
    return client


async def test_readyz_recovers_through_traffic_after_the_circuit_opened(
    gateway_factory: GatewayFactory, upstream: TestServer, own_redis: RedisServer
) -> None:
    client = await with_open_circuit(gateway_factory, upstream, own_redis)
    assert await circuit_states(client) == [2.0]
    status, report = await ready(client)
    assert status == 200
    assert report["status"] == "degraded"
    cache = report["components"]["cache"]
    assert (cache["status"], cache["circuit"]) == ("down", "open")
    assert cache["lastError"].startswith("redis SET: ")

    own_redis.start()
    await asyncio.sleep(RESET_S + 0.1)
    trial = await client.get("/users?page=2", headers=AUTH)
    assert trial.headers["Cache-Status"] == "records-gateway; fwd=miss; stored"
    assert await circuit_states(client) == [0.0]
    cache = (await ready(client))[1]["components"]["cache"]
    # closed, but one read of two failed within the window
    assert (cache["status"], cache["circuit"]) == ("degraded", "closed")
    for page in range(3, 12):
        assert (await client.get(f"/users?page={page}", headers=AUTH)).status == 200
    status, report = await ready(client)
    assert (status, report["status"], report["components"]["cache"]["status"]) == (200, "ok", "ok")


async def test_readyz_recovers_without_traffic_after_the_circuit_opened(
    gateway_factory: GatewayFactory, upstream: TestServer, own_redis: RedisServer
) -> None:
    client = await with_open_circuit(gateway_factory, upstream, own_redis)
    assert (await ready(client))[1]["status"] == "degraded"
    own_redis.start()
    await asyncio.sleep(RESET_S + 0.1)
    # Redis reads and writes again: the readiness probe is the breaker's trial and
    # closes the circuit (this once stayed open until a request passed through it)
    status, report = await ready(client)
    assert await circuit_states(client) == [0.0]
    cache = report["components"]["cache"]
    assert (status, report["status"]) == (200, "degraded")
    # the failed read of the outage is still within the window
    assert (cache["status"], cache["circuit"], cache["reads"]) == (
        "degraded",
        "closed",
        {"ok": 0, "failed": 1},
    )
    assert cache["probes"]["ok"] >= 1


async def test_readyz_503_when_the_upstream_is_down_and_there_is_no_cache(
    gateway_factory: GatewayFactory, aiohttp_server: AiohttpServer
) -> None:
    server = await aiohttp_server(create_demo_app())
    client = await gateway_factory(
        base_url(server), cache={"backend": "none"}, health=NO_CHECK_LIMIT
    )
    assert (await ready(client))[1]["status"] == "ok"
    await server.close()
    status, report = await ready(client)
    assert status == 503
    assert report["status"] == "down"
    upstream = report["components"]["upstream"]
    assert (upstream["status"], upstream["source"]) == ("down", "check")
    assert upstream["lastError"].startswith("readiness check: ")
    assert report["components"]["cache"] == {"status": "disabled", "lastError": None}


async def test_readyz_degraded_when_the_upstream_is_down_but_a_cache_can_serve(
    gateway_factory: GatewayFactory, aiohttp_server: AiohttpServer
) -> None:
    server = await aiohttp_server(create_demo_app())
    client = await gateway_factory(
        base_url(server), cache={"backend": "memory"}, health=NO_CHECK_LIMIT
    )
    await server.close()
    status, report = await ready(client)
    assert status == 200
    assert report["status"] == "degraded"
    assert report["components"]["upstream"]["status"] == "down"
    assert report["components"]["cache"] == cache_component()


async def test_readyz_reports_an_upstream_5xx_as_down(
    gateway_factory: GatewayFactory, aiohttp_server: AiohttpServer
) -> None:
    async def failing(request: web.Request) -> web.Response:
        return web.Response(status=503)

    app = web.Application()
    app.router.add_get("/users", failing)
    server = await aiohttp_server(app)
    client = await gateway_factory(base_url(server), cache={"backend": "none"})
    status, report = await ready(client)
    assert status == 503
    assert report["components"]["upstream"] == {
        "status": "down",
        "lastError": "readiness check: upstream status 503",
        "source": "check",
        "circuit": "closed",  # one failure: the circuit opens after five
    }


async def test_readyz_from_failed_traffic_without_a_check(
    gateway_factory: GatewayFactory, aiohttp_server: AiohttpServer
) -> None:
    server = await aiohttp_server(create_demo_app())
    client = await gateway_factory(base_url(server), cache={"backend": "none"})
    await server.close()
    assert (await client.get("/users", headers=AUTH)).status == 502
    status, report = await ready(client)
    assert status == 503
    upstream = report["components"]["upstream"]
    assert (upstream["status"], upstream["source"]) == ("down", "traffic")
    # the fault, not the request it was for: /readyz is for anyone to read
    assert upstream["lastError"].startswith("cannot connect to the upstream")


async def test_ten_probes_make_at_most_one_upstream_check(
    gateway: Client, upstream_log: RequestLog
) -> None:
    reports = [await ready(gateway) for _ in range(10)]
    assert reports == [(200, ALL_OK)] * 10
    assert [(r.path, r.authorization) for r in upstream_log.entries] == [("/users", None)]


async def test_concurrent_probes_share_one_upstream_check(
    gateway_factory: GatewayFactory, aiohttp_server: AiohttpServer
) -> None:
    slow = await aiohttp_server(create_demo_app(latency_ms=100))
    client = await gateway_factory(base_url(slow))
    reports = await asyncio.gather(*(ready(client) for _ in range(10)))
    assert reports == [(200, ALL_OK)] * 10
    assert len(slow.app[REQUEST_LOG]) == 1


async def test_probes_make_no_upstream_call_after_recent_good_traffic(
    gateway: Client, upstream_log: RequestLog
) -> None:
    assert (await gateway.get("/users", headers=AUTH)).status == 200
    upstream_log.clear()
    for _ in range(10):
        status, report = await ready(gateway)
        assert status == 200
        assert report["components"]["upstream"] == {
            "status": "ok",
            "lastError": None,
            "source": "traffic",
            "circuit": "closed",
        }
    assert len(upstream_log) == 0


# Readiness with fakes


class FakeMonotonic:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeCheck:
    """An awaitable check that counts its runs and fails with ``error`` when set;
    ``then`` stands for what the check changes (a probe that closes the circuit)."""

    def __init__(self) -> None:
        self.calls = 0
        self.error: Exception | None = None
        self.gate: asyncio.Event | None = None
        self.then: Callable[[], None] | None = None

    async def __call__(self) -> None:
        self.calls += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.then is not None:
            self.then()
        if self.error is not None:
            raise self.error


def outcomes(
    circuit: str = "closed",
    last_error: str | None = None,
    *,
    reads: tuple[int, int] = (0, 0),
    writes: tuple[int, int] = (0, 0),
    probes: tuple[int, int] = (0, 0),
) -> CacheOutcomes:
    return CacheOutcomes(circuit, last_error, Tally(*reads), Tally(*writes), Tally(*probes))


class Parts:
    def __init__(self, *, cache: bool = True, interval_s: float = 5.0) -> None:
        self.clock = FakeMonotonic()
        self.health = UpstreamHealth(self.clock)
        self.upstream_check = FakeCheck()
        self.cache_check = FakeCheck()
        self.cache = outcomes()
        self.readiness = Readiness(
            upstream=self.health,
            upstream_check=self.upstream_check,
            cache_state=lambda: self.cache,
            cache_check=self.cache_check if cache else None,
            interval_s=interval_s,
            monotonic=self.clock,
        )

    async def cache_report(self) -> dict[str, Any]:
        _, report = await self.readiness.report()
        cache: dict[str, Any] = report["components"]["cache"]
        return cache


@pytest.fixture
def parts() -> Parts:
    return Parts()


async def test_checks_run_at_most_once_per_interval(parts: Parts) -> None:
    for _ in range(5):
        assert await parts.readiness.report() == (200, FAKES_OK)
        parts.clock.now += 1
    assert (parts.upstream_check.calls, parts.cache_check.calls) == (1, 1)
    parts.clock.now += 0.5  # 5.5 s after the first check
    await parts.readiness.report()
    assert (parts.upstream_check.calls, parts.cache_check.calls) == (2, 2)


async def test_a_check_failure_is_remembered_for_the_interval(parts: Parts) -> None:
    parts.upstream_check.error = UpstreamUnavailable("readiness check: Connection refused")
    assert await parts.readiness.report() == (
        200,
        {
            "status": "degraded",
            "components": {
                "upstream": {
                    "status": "down",
                    "lastError": "readiness check: Connection refused",
                    "source": "check",
                },
                "cache": cache_component(probes=(0, 0)),
            },
        },
    )
    parts.upstream_check.error = None
    parts.clock.now += 4
    assert (await parts.readiness.report())[1]["status"] == "degraded"
    parts.clock.now += 2
    assert await parts.readiness.report() == (200, FAKES_OK)
    assert parts.upstream_check.calls == 2


async def test_an_error_without_a_message_is_named_by_its_type(parts: Parts) -> None:
    parts.cache_check.error = ConnectionResetError()
    _, report = await parts.readiness.report()
    assert report["components"]["cache"] == cache_component(
        "down", "ConnectionResetError", probes=(0, 0)
    )


async def test_recent_traffic_stands_in_for_the_upstream_check(parts: Parts) -> None:
    parts.health.failed("GET /users: the upstream failed with status 500")
    parts.clock.now += 1
    parts.health.succeeded()
    _, report = await parts.readiness.report()
    assert report["components"]["upstream"] == {
        "status": "ok",
        "lastError": "GET /users: the upstream failed with status 500",
        "source": "traffic",
    }
    parts.clock.now += 1
    parts.health.failed("GET /users: cannot connect to the upstream (Connection refused)")
    _, report = await parts.readiness.report()
    assert report["components"]["upstream"]["status"] == "down"
    assert report["components"]["upstream"]["source"] == "traffic"
    assert parts.upstream_check.calls == 0
    parts.clock.now += 6  # traffic too old to say anything: check
    _, report = await parts.readiness.report()
    assert report["components"]["upstream"]["source"] == "check"
    assert parts.upstream_check.calls == 1


async def test_upstream_down_without_a_cache_is_not_ready() -> None:
    parts = Parts(cache=False)
    parts.health.failed("GET /users: the upstream did not answer within 10 s")
    assert await parts.readiness.report() == (
        503,
        {
            "status": "down",
            "components": {
                "upstream": {
                    "status": "down",
                    "lastError": "GET /users: the upstream did not answer within 10 s",
                    "source": "traffic",
                },
                "cache": {"status": "disabled", "lastError": None},
            },
        },
    )


async def test_successful_traffic_stands_in_for_the_cache_check(parts: Parts) -> None:
    parts.cache = outcomes(reads=(120, 0), writes=(40, 0))
    assert await parts.cache_report() == cache_component(
        source="traffic", reads=(120, 0), writes=(40, 0), probes=(0, 0)
    )
    assert parts.cache_check.calls == 0


async def test_every_failed_write_degrades_the_cache_while_reads_pass(parts: Parts) -> None:
    oom = "redis SET: OutOfMemoryError: command not allowed when used memory > 'maxmemory'."
    parts.cache = outcomes(last_error=oom, reads=(500, 0), writes=(0, 30))
    status, report = await parts.readiness.report()
    assert (status, report["status"]) == (200, "degraded")
    assert report["components"]["cache"] == cache_component(
        "degraded", oom, source="traffic", reads=(500, 0), writes=(0, 30), probes=(0, 0)
    )
    assert parts.cache_check.calls == 0  # PING or probe: traffic already said it


@pytest.mark.parametrize(
    ("reads", "writes", "probes", "status"),
    [
        ((999, 1), (500, 0), (0, 0), "ok"),  # one blip among a thousand reads
        ((91, 10), (100, 0), (0, 0), "ok"),  # just under a tenth
        ((9, 1), (100, 0), (0, 0), "degraded"),  # a tenth of the reads
        ((100, 0), (9, 1), (0, 0), "degraded"),  # a tenth of the writes
        ((100, 0), (100, 0), (1, 1), "ok"),  # a failed probe: traffic says more
    ],
)
async def test_a_tenth_of_the_reads_or_the_writes_failing_degrades_the_cache(
    parts: Parts,
    reads: tuple[int, int],
    writes: tuple[int, int],
    probes: tuple[int, int],
    status: str,
) -> None:
    parts.cache = outcomes(last_error="redis GET: x", reads=reads, writes=writes, probes=probes)
    cache = await parts.cache_report()
    assert (cache["status"], cache["lastError"], cache["source"]) == (
        status,
        "redis GET: x",
        "traffic",
    )


async def test_a_circuit_that_is_not_closed_degrades_the_cache(parts: Parts) -> None:
    for circuit in ("open", "half-open"):
        parts.cache = outcomes(circuit, "redis GET: no answer within 50 ms", reads=(50, 0))
        cache = await parts.cache_report()
        assert (cache["status"], cache["circuit"], cache["lastError"]) == (
            "degraded",
            circuit,
            "redis GET: no answer within 50 ms",
        )
    assert parts.cache_check.calls == 0


async def test_without_traffic_the_probe_decides(parts: Parts) -> None:
    assert await parts.cache_report() == cache_component(probes=(0, 0))
    parts.cache_check.error = CacheUnavailable(
        "redis SET: ReadOnlyError: You can't write against a read only replica."
    )
    parts.clock.now += 6
    assert await parts.cache_report() == cache_component(
        "down",
        "redis SET: ReadOnlyError: You can't write against a read only replica.",
        probes=(0, 0),
    )
    # the probe passes, but the circuit is open (its reset time has not passed)
    parts.cache_check.error = None
    parts.cache = outcomes("open", "redis GET: refused")
    parts.clock.now += 6
    assert await parts.cache_report() == cache_component(
        "degraded", "redis GET: refused", circuit="open", probes=(0, 0)
    )
    assert parts.cache_check.calls == 3


async def test_failed_traffic_alone_asks_the_probe(parts: Parts) -> None:
    parts.cache = outcomes("open", "redis GET: ConnectionError: refused", reads=(0, 5))
    parts.cache_check.error = CacheUnavailable("redis SET: ConnectionError: refused")
    assert await parts.cache_report() == cache_component(
        "down",
        "redis SET: ConnectionError: refused",
        source="traffic",
        circuit="open",
        reads=(0, 5),
        probes=(0, 0),
    )
    # the probe passes (as the breaker's trial it closed the circuit): the failed
    # reads are still within the window
    parts.cache_check.error = None

    def closed() -> None:
        parts.cache = outcomes(
            "closed", "redis GET: ConnectionError: refused", reads=(0, 5), probes=(1, 0)
        )

    parts.cache_check.then = closed
    parts.clock.now += 6
    assert await parts.cache_report() == cache_component(
        "degraded", "redis GET: ConnectionError: refused", source="traffic", reads=(0, 5)
    )
    assert parts.cache_check.calls == 2


async def test_the_report_reads_the_cache_again_after_its_probe(parts: Parts) -> None:
    parts.cache = outcomes("open", "redis GET: refused")

    def trial_passed() -> None:
        parts.cache = outcomes("closed", "redis GET: refused", probes=(1, 0))

    parts.cache_check.then = trial_passed
    assert await parts.cache_report() == cache_component("ok", "redis GET: refused", probes=(1, 0))


async def test_concurrent_reports_share_one_running_check(parts: Parts) -> None:
    parts.upstream_check.gate = asyncio.Event()
    reports = [asyncio.ensure_future(parts.readiness.report()) for _ in range(5)]
    await asyncio.sleep(0)
    parts.upstream_check.gate.set()
    assert await asyncio.gather(*reports) == [(200, FAKES_OK)] * 5
    assert parts.upstream_check.calls == 1


async def test_the_interval_is_live(parts: Parts) -> None:
    await parts.readiness.report()
    parts.readiness.interval_s = 0
    parts.clock.now += 0.001
    await parts.readiness.report()
    assert (parts.upstream_check.calls, parts.cache_check.calls) == (2, 2)


async def test_a_cancelled_report_does_not_count_as_a_passed_check(parts: Parts) -> None:
    parts.upstream_check.gate = asyncio.Event()  # the upstream hangs
    parts.upstream_check.error = UpstreamUnavailable("readiness check: timeout")
    first = asyncio.ensure_future(parts.readiness.report())
    await asyncio.sleep(0)
    first.cancel()  # the prober gave up
    with pytest.raises(asyncio.CancelledError):
        await first
    parts.clock.now += 1
    second = asyncio.ensure_future(parts.readiness.report())
    await asyncio.sleep(0)
    parts.upstream_check.gate.set()
    status, report = await second
    # the second report waited for the check still running, and shares its failure
    assert (status, report["status"]) == (200, "degraded")
    assert report["components"]["upstream"] == {
        "status": "down",
        "lastError": "readiness check: timeout",
        "source": "check",
    }
    assert parts.upstream_check.calls == 1
