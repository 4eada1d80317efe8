"""Shared fixtures: the reference upstream and the gateway, both on real loopback sockets.

Every test that serves the gateway runs twice: with the fast path (``server.fast_path``
on, the default) and as plain aiohttp (off). The ``fast_path`` fixture says which; the
settings made by :func:`make_settings` and the runner of :func:`gateway_client` follow it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, cast

import pytest
import redis.asyncio as redis
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from pytest_aiohttp import AiohttpClient, AiohttpServer

from gateway.cache.fleet import Fleet
from gateway.cache.near import NearCache
from gateway.cache.tiered import TieredBackend
from gateway.config.settings import Settings
from gateway.demo import REQUEST_LOG, RequestLog, create_demo_app
from gateway.fastpath.server import make_runner
from gateway.http.app import create_app
from gateway.http.binding import UPSTREAMS
from gateway.ops.logs import JsonFormatter
from gateway.routing.routes import RouteTable
from gateway.routing.standard import ROUTES

from . import profiles  # noqa: F401  (loads the Hypothesis profile)
from .redis_server import RedisServer
from .redis_topologies import RedisCluster, SentinelSet

TOKEN = "demo-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}

GatewayFactory = Callable[..., Awaitable[TestClient[web.Request, web.Application]]]

# the test modules whose tests serve the gateway over HTTP: each runs both ways
_SERVING_MODULES = frozenset(
    {
        "tests.cache.test_near",
        "tests.fastpath.test_fingerprints",
        "tests.http.test_openapi",
        "tests.http.test_records",
        "tests.http.test_upstream_switch",
        "tests.http.test_wire",
        "tests.ops.test_health",
        "tests.ops.test_logs",
        "tests.ops.test_metrics",
        "tests.ops.test_otel",
        "tests.config.test_live",
        "tests.records.test_pipeline",
        "tests.upstream.test_client",
    }
)
_MODE = {"fast_path": True}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    module = metafunc.module.__name__
    serves = {"gateway", "gateway_factory"} & set(metafunc.fixturenames)
    if serves or (module in _SERVING_MODULES and "aiohttp_client" in metafunc.fixturenames):
        metafunc.parametrize("fast_path", [True, False], ids=["fast", "plain"], indirect=True)


@pytest.fixture(autouse=True)
def fast_path(request: pytest.FixtureRequest) -> Iterator[bool]:
    """Whether the gateways this test serves use the fast path (``server.fast_path``)."""
    mode: bool = getattr(request, "param", True)
    _MODE["fast_path"] = mode
    yield mode
    _MODE["fast_path"] = True


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests build their settings themselves; a GATEWAY_* variable must not leak in."""
    import os

    for name in list(os.environ):
        if name.startswith("GATEWAY_"):
            monkeypatch.delenv(name)


def base_url(server: TestServer) -> str:
    return str(server.make_url("")).rstrip("/")


KEY_SECRET = "test-key-secret-0123456789"


def redis_cache(url: str, **extra: Any) -> dict[str, Any]:
    """A [cache] section for the redis backend. Its Redis timeout is generous: a test
    machine under load must not turn a slow first connection into a cache fault (the
    tests of faults set their own)."""
    return {
        "backend": "redis",
        "redis_url": url,
        "key_secret": KEY_SECRET,
        "redis_timeout_ms": 1000,
        **extra,
    }


def make_settings(upstream_url: str, **sections: dict[str, Any]) -> Settings:
    """Settings for a test: the given upstream plus any section overrides, served the
    way the ``fast_path`` fixture says unless ``server.fast_path`` is given."""
    data: dict[str, Any] = {
        **sections,
        "upstream": {"base_url": upstream_url, **sections.get("upstream", {})},
        "server": {"fast_path": _MODE["fast_path"], **sections.get("server", {})},
    }
    return Settings(**data)


@pytest.fixture
async def upstream(aiohttp_server: AiohttpServer) -> TestServer:
    """The reference upstream (seed 42, token demo-token) on a loopback port."""
    return await aiohttp_server(create_demo_app())


@pytest.fixture
def upstream_log(upstream: TestServer) -> RequestLog:
    return upstream.app[REQUEST_LOG]


async def gateway_client(
    aiohttp_client: AiohttpClient, app: web.Application
) -> TestClient[web.Request, web.Application]:
    """A test client of ``app`` run as the gateway's server runs it."""
    client: Any = await aiohttp_client(GatewayTestServer(app))
    return cast(TestClient[web.Request, web.Application], client)


class GatewayTestServer(TestServer):
    """aiohttp's TestServer running the app with the runner the gateway's server uses
    (``gateway.fastpath.server.make_runner``: the fast path unless the app's settings
    turn it off)."""

    async def _make_runner(self, **kwargs: Any) -> web.AppRunner:
        return make_runner(self.app, **kwargs)


@pytest.fixture
def gateway_factory(aiohttp_client: AiohttpClient) -> GatewayFactory:
    """Start a gateway on a loopback port in front of ``upstream_url``."""

    async def start(
        upstream_url: str,
        clock: Any = None,
        monotonic: Any = None,
        routes: RouteTable = ROUTES,
        **sections: dict[str, Any],
    ) -> TestClient[web.Request, web.Application]:
        settings = make_settings(upstream_url, **sections)
        times: dict[str, Any] = {"clock": clock, "monotonic": monotonic}
        given = {name: t for name, t in times.items() if t is not None}
        app = create_app(settings, routes=routes, **given)
        return await gateway_client(aiohttp_client, app)

    return start


@pytest.fixture
async def gateway(
    gateway_factory: GatewayFactory, upstream: TestServer
) -> TestClient[web.Request, web.Application]:
    """The gateway in front of the reference upstream, default settings."""
    return await gateway_factory(base_url(upstream))


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One real redis-server for the session; tests flush it before use."""
    server = RedisServer()
    server.start()
    yield server
    server.close()


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A redis-server of this test's own, which it may stop or freeze."""
    server = RedisServer()
    server.start()
    yield server
    server.close()


@pytest.fixture
async def redis_url(redis_server: RedisServer) -> str:
    """The shared redis-server, emptied for this test."""
    client = redis.Redis.from_url(redis_server.url)
    await client.flushall()
    await client.aclose()
    return redis_server.url


@pytest.fixture(scope="module")
def redis_cluster() -> Iterator[RedisCluster]:
    """Three real Redis Cluster primaries (no replicas) for the module's tests; a test
    takes it through ``redis_cluster_nodes``, which heals and empties it first."""
    cluster = RedisCluster()
    cluster.start()
    yield cluster
    cluster.close()


@pytest.fixture
def redis_cluster_nodes(redis_cluster: RedisCluster) -> list[str]:
    """The module's cluster for this test: nodes an earlier test froze or stopped are
    back, its state is ok, every primary is flushed. Its nodes' "127.0.0.1:port"."""
    redis_cluster.reset()
    return redis_cluster.nodes


@pytest.fixture
def redis_sentinel() -> Iterator[SentinelSet]:
    """A primary, a replica and three Sentinels of this test's own (it may fail them over,
    freeze or kill them), master name "gwmaster"."""
    sentinel_set = SentinelSet()
    sentinel_set.start()
    yield sentinel_set
    sentinel_set.close()


class FakeClock:
    """Wall time that a test moves forward by hand."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


# the tokens of a Gatekeeper's tests: one it goes on accepting, one it comes to refuse
KEPT = "kept-token-secret"
REVOKED = "revoked-token-secret"

# Every token the tests send. No log line of the whole run may contain one.
TOKENS_SENT = (
    TOKEN,
    "wrong-secret-token",
    "token-0-secret",
    "token-1-secret",
    "token-2-secret",
    "token-3-secret",
    "test-key-secret-0123456789",
    "admin-token-0123456789abcdef",
    KEPT,
    REVOKED,
)


class _Recorder(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.setFormatter(JsonFormatter())
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture(scope="session", autouse=True)
def _no_token_in_any_log_line() -> Iterator[None]:
    """Record every log line of the run, formatted as the gateway writes them, and
    check at the end that no token ever reached one.

    Held for docs/switching-upstreams.md, "What shadow traffic promises": no token in
    the report, the metrics or the logs.
    """
    recorder = _Recorder()
    root = logging.getLogger()
    previous = root.level
    root.addHandler(recorder)
    root.setLevel(logging.DEBUG)
    yield
    root.removeHandler(recorder)
    root.setLevel(previous)
    leaked = [line for line in recorder.lines if any(token in line for token in TOKENS_SENT)]
    assert leaked == [], f"{len(leaked)} log lines contain a token, e.g. {leaked[:1]}"


def token_upstream(tokens: list[str]) -> web.Application:
    """An upstream whose data depends on the token: token n sees user n."""

    async def users(request: web.Request) -> web.Response:
        token = request.headers["Authorization"].removeprefix("Bearer ")
        await asyncio.sleep(0.001)
        n = tokens.index(token)
        user = {"id": f"00000000-0000-4000-8000-{n:012d}", "username": f"user-{n}", "role": "ADMIN"}
        return web.json_response({"data": [user], "total": 1, "page": 1, "limit": 10})

    app = web.Application()
    app.router.add_get("/users", users)
    return app


ACCOUNT = {
    "id": "ACC-001",
    "name": "Cuenta Corriente Principal",
    "accountNumber": "0071234567",
    "description": "Operating account",
    "type": "BANK",
    "bankCode": "007",
    "liquidityThreshold": "5000.00",
    "lastBalance": "182345.6700",
}


class Gatekeeper:
    """An upstream whose answer to each token a test decides: ``verdicts`` maps a token
    to the status it gets (401, 403, 404, 503, or "slow" for no answer in time);
    every other token gets its record. ``calls`` is (token, path) of every request."""

    def __init__(self) -> None:
        self.verdicts: dict[str, int | str] = {}
        self.calls: list[tuple[str, str]] = []
        self.app = web.Application()
        self.app.router.add_get("/users", self._users)
        self.app.router.add_get("/accounts/{id}", self._account)

    def count(self, token: str) -> int:
        return sum(1 for caller, _ in self.calls if caller == token)

    async def _verdict(self, request: web.Request) -> web.Response | None:
        token = request.headers["Authorization"].removeprefix("Bearer ")
        self.calls.append((token, request.path))
        verdict = self.verdicts.get(token)
        if verdict == "slow":
            await asyncio.sleep(5)
        elif verdict is not None:
            assert isinstance(verdict, int)
            return web.json_response({"message": "no"}, status=verdict)
        return None

    async def _users(self, request: web.Request) -> web.Response:
        refused = await self._verdict(request)
        if refused is not None:
            return refused
        token = request.headers["Authorization"].removeprefix("Bearer ")
        user = {
            "id": "00000000-0000-4000-8000-000000000001",
            "username": token[:4],
            "role": "ADMIN",
        }
        return web.json_response({"data": [user], "total": 1, "page": 1, "limit": 10})

    async def _account(self, request: web.Request) -> web.Response:
        refused = await self._verdict(request)
        if refused is not None:
            return refused
        return web.json_response({**ACCOUNT, "id": request.match_info["id"]})


def fleet_of(client: TestClient[web.Request, web.Application]) -> Fleet:
    """The fleet announcements of a gateway whose cache is Redis."""
    fleet = client.app[UPSTREAMS].current.fleet
    assert fleet is not None
    return fleet


def near_of(client: TestClient[web.Request, web.Application]) -> NearCache:
    """The near cache of a gateway whose cache is Redis."""
    backend = client.app[UPSTREAMS].current.cache.backend
    assert isinstance(backend, TieredBackend)
    return backend.near


async def until(predicate: Callable[[], object], within_s: float = 15.0) -> None:
    """Wait for ``predicate()`` to hold; ``within_s`` only guards against a hang (how long
    propagation takes is the bench's to measure, not a test's)."""
    async with asyncio.timeout(within_s):
        while not predicate():
            await asyncio.sleep(0.005)


async def near_cache_live(client: TestClient[web.Request, web.Application]) -> None:
    """Wait until the gateway's near cache is subscribed to its channel."""
    await until(lambda: near_of(client).live)
