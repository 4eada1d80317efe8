"""GET /metrics after known sequences of requests: exact counts, bounded labels."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import ClientResponse, web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.parser import text_string_to_metric_families
from pytest_aiohttp import AiohttpServer
from yarl import URL

from gateway.demo import REQUEST_LOG, RequestLog, create_demo_app
from gateway.http.service import METRICS
from gateway.ops.metrics import LATENCY_BUCKETS, MULTIPROC_ENV, Metrics

from ..conftest import AUTH, TOKEN, GatewayFactory, base_url, redis_cache
from ..redis_server import RedisServer

Client = TestClient[web.Request, web.Application]
Labels = frozenset[tuple[str, str]]
SECRET = "test-key-secret-0123456789"
ROUTE_LABELS = {
    "users",
    "clients",
    "expenses",
    "expense",
    "accounts",
    "account",
    "healthz",
    "readyz",
    "metrics",
    "openapi",
    "other",
}


@pytest.fixture(autouse=True)
def _single_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests read one process's registry, not a multiprocess directory."""
    monkeypatch.delenv(MULTIPROC_ENV, raising=False)


class Scrape:
    """One parsed text exposition: every sample by name and labels."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.samples: dict[tuple[str, Labels], float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                self.samples[(sample.name, frozenset(sample.labels.items()))] = sample.value

    def value(self, name: str, **labels: str) -> float | None:
        return self.samples.get((name, frozenset(labels.items())))

    def series(self, name: str, *without: str) -> dict[Labels, float]:
        """Every sample called ``name``, keyed by its labels minus ``without``."""
        return {
            frozenset((k, v) for k, v in labels if k not in without): value
            for (sample_name, labels), value in self.samples.items()
            if sample_name == name
        }

    def label_values(self) -> list[tuple[str, str, str]]:
        return [(name, k, v) for (name, labels) in self.samples for k, v in labels]


def labels(**values: str) -> Labels:
    return frozenset(values.items())


async def scrape(client: Client) -> Scrape:
    response = await client.get("/metrics")
    assert response.status == 200
    assert response.headers["Content-Type"] == CONTENT_TYPE_LATEST
    assert response.headers["Cache-Control"] == "no-store"
    return Scrape(await response.text())


async def get(client: Client, path: str, headers: dict[str, str] | None = None) -> ClientResponse:
    """GET ``path`` (sent as written) with the demo token unless ``headers`` say otherwise."""
    response = await client.get(
        URL(path, encoded=True), headers=AUTH if headers is None else headers
    )
    await response.read()
    return response


async def test_exact_counts_after_a_known_sequence(
    gateway_factory: GatewayFactory, upstream: TestServer
) -> None:
    client = await gateway_factory(base_url(upstream), cache={"backend": "memory"})

    first = await get(client, "/users")
    assert (first.status, first.headers["X-Cache"]) == (200, "MISS")
    second = await get(client, "/users")
    assert (second.status, second.headers["X-Cache"]) == (200, "HIT")
    invalid = await get(client, "/expenses?limit=0")
    assert invalid.status == 400
    assert (await invalid.json(content_type=None))["errors"][0]["parameter"] == "limit"
    anonymous = await get(client, "/clients", headers={})
    assert anonymous.status == 401
    assert anonymous.headers["WWW-Authenticate"].startswith("Bearer")
    unknown = await get(client, "/no/such/route")
    assert unknown.status == 404
    assert "X-Cache" not in unknown.headers
    expenses = await get(client, "/expenses")
    assert (expenses.status, expenses.headers["X-Cache"]) == (200, "MISS")
    assert len((await expenses.json())["data"]) == 10

    metrics = await scrape(client)
    assert metrics.series("gateway_requests_total") == {
        labels(route="users", status="200", cache="miss"): 1,
        labels(route="users", status="200", cache="hit"): 1,
        labels(route="expenses", status="400", cache="none"): 1,
        labels(route="clients", status="401", cache="none"): 1,
        labels(route="other", status="404", cache="none"): 1,
        labels(route="expenses", status="200", cache="miss"): 1,
    }
    assert metrics.series("gateway_cache_results_total") == {
        labels(route="users", result="miss"): 1,
        labels(route="users", result="hit"): 1,
        labels(route="expenses", result="miss"): 1,
    }
    assert metrics.series("gateway_upstream_requests_total") == {
        labels(route="users", status="200"): 1,
        labels(route="expenses", status="200"): 1,
    }
    assert metrics.series("gateway_request_duration_seconds_count") == {
        labels(route="users", cache="miss"): 1,
        labels(route="users", cache="hit"): 1,
        labels(route="expenses", cache="none"): 1,
        labels(route="clients", cache="none"): 1,
        labels(route="other", cache="none"): 1,
        labels(route="expenses", cache="miss"): 1,
    }
    # every observation lands in the +Inf bucket and took some time
    counts = metrics.series("gateway_request_duration_seconds_count")
    assert metrics.series("gateway_request_duration_seconds_bucket", "le") != {}
    for series, count in counts.items():
        assert (
            metrics.samples[("gateway_request_duration_seconds_bucket", series | {("le", "+Inf")})]
            == count
        )
        assert metrics.samples[("gateway_request_duration_seconds_sum", series)] > 0
    assert metrics.series("gateway_upstream_duration_seconds_count") == {
        labels(route="users"): 1,
        labels(route="expenses"): 1,
    }
    # each upstream answer normalised once; the hit and the rejected requests not at all
    assert metrics.series("gateway_normalise_duration_seconds_count") == {
        labels(route="users"): 1,
        labels(route="expenses"): 1,
    }
    for route in ("users", "expenses"):
        assert metrics.samples[("gateway_normalise_duration_seconds_sum", labels(route=route))] > 0
    assert (
        metrics.value(
            "gateway_normaliser_coercions_total",
            field="Client.taxRetentionPercentage",
            kind="string->number",
        )
        == 10
    )
    assert metrics.series("gateway_coalesced_requests_total") == {}
    assert metrics.series("gateway_cache_errors_total") == {labels(backend="memory"): 0}
    assert metrics.series("gateway_cache_circuit_state") == {labels(backend="memory"): 0}
    assert metrics.value("gateway_fleet_configurations") == 0  # no fleet: a memory cache
    assert metrics.value("gateway_requests_in_flight") == 1  # the scrape itself

    again = await scrape(client)
    assert again.value("gateway_requests_total", route="metrics", status="200", cache="none") == 1
    assert again.value("gateway_requests_total", route="users", status="200", cache="miss") == 1
    assert again.value("gateway_upstream_requests_total", route="users", status="200") == 1
    assert again.value("gateway_requests_in_flight") == 1


async def test_coercions_accumulate_per_page(
    gateway_factory: GatewayFactory, upstream: TestServer
) -> None:
    client = await gateway_factory(base_url(upstream), cache={"backend": "memory"})
    for page in (1, 2):
        assert (await get(client, f"/expenses?page={page}")).status == 200
    assert (await get(client, "/expenses?page=1")).headers["X-Cache"] == "HIT"
    metrics = await scrape(client)
    # a hit normalises nothing: two pages of 10, not three
    assert (
        metrics.value(
            "gateway_normaliser_coercions_total",
            field="Client.taxRetentionPercentage",
            kind="string->number",
        )
        == 20
    )
    coercions = [dict(found) for found in metrics.series("gateway_normaliser_coercions_total")]
    assert coercions
    for found in coercions:
        assert set(found) == {"field", "kind"}
        assert "->" in found["kind"]


async def test_upstream_statuses_and_errors_are_labelled_by_outcome(
    gateway_factory: GatewayFactory, aiohttp_server: AiohttpServer
) -> None:
    server = await aiohttp_server(create_demo_app())
    client = await gateway_factory(base_url(server), cache={"backend": "none"})
    assert (await get(client, "/users")).headers["X-Cache"] == "BYPASS"
    refused = await get(client, "/users", headers={"Authorization": "Bearer wrong-secret-token"})
    assert refused.status == 401
    assert (await refused.json(content_type=None))["upstreamStatus"] == 401
    await server.close()
    down = await get(client, "/clients")
    assert down.status == 502
    assert (await down.json(content_type=None))["title"] == "The upstream cannot be reached"

    metrics = await scrape(client)
    assert metrics.series("gateway_upstream_requests_total") == {
        labels(route="users", status="200"): 1,
        labels(route="users", status="401"): 1,
        labels(route="clients", status="unreachable"): 1,
    }
    assert metrics.series("gateway_requests_total") == {
        labels(route="users", status="200", cache="bypass"): 1,
        labels(route="users", status="401", cache="none"): 1,
        labels(route="clients", status="502", cache="none"): 1,
    }
    assert metrics.series("gateway_cache_results_total") == {
        labels(route="users", result="bypass"): 1,
    }
    assert metrics.series("gateway_upstream_duration_seconds_count") == {
        labels(route="users"): 2,
        labels(route="clients"): 1,
    }


async def test_concurrent_cold_requests_count_as_coalesced(
    gateway_factory: GatewayFactory, aiohttp_server: AiohttpServer
) -> None:
    slow = await aiohttp_server(create_demo_app(latency_ms=100))
    client = await gateway_factory(base_url(slow), cache={"backend": "memory"})
    n = 12
    replies = await asyncio.gather(*(get(client, "/expenses?limit=5") for _ in range(n)))
    assert {r.status for r in replies} == {200}
    assert {r.headers["X-Cache"] for r in replies} == {"MISS"}
    assert len({r.headers["ETag"] for r in replies}) == 1
    assert len(slow.app[REQUEST_LOG]) == 1

    metrics = await scrape(client)
    assert metrics.series("gateway_coalesced_requests_total") == {
        labels(kind="process", route="expenses"): n - 1
    }
    assert metrics.series("gateway_upstream_requests_total") == {
        labels(route="expenses", status="200"): 1
    }
    assert metrics.series("gateway_requests_total") == {
        labels(route="expenses", status="200", cache="miss"): n
    }
    assert metrics.series("gateway_cache_results_total") == {
        labels(route="expenses", result="miss"): n
    }


async def test_cache_errors_and_circuit_state_when_redis_stops_and_returns(
    gateway_factory: GatewayFactory,
    upstream: TestServer,
    upstream_log: RequestLog,
    own_redis: RedisServer,
) -> None:
    """Held for docs/deployment.md, "Faults, and what callers see": Redis down (refused)."""
    reset_s = 1.0
    client = await gateway_factory(
        base_url(upstream),
        # no near cache: every read goes to Redis, so every read while it is down fails
        cache=redis_cache(
            own_redis.url, near_cache=False, breaker_failures=2, breaker_reset_s=reset_s
        ),
    )
    assert (await get(client, "/users")).headers["X-Cache"] == "MISS"
    assert (await get(client, "/users")).headers["X-Cache"] == "HIT"
    metrics = await scrape(client)
    assert metrics.series("gateway_cache_errors_total") == {labels(backend="redis"): 0}
    assert metrics.series("gateway_cache_circuit_state") == {labels(backend="redis"): 0}

    own_redis.stop()
    for _ in range(3):
        reply = await get(client, "/users")
        assert reply.status == 200
        assert reply.headers["X-Cache"] == "MISS"
        assert reply.headers["Cache-Status"] == (
            "records-gateway; fwd=miss; detail=cache-unavailable"
        )
    metrics = await scrape(client)
    # two failures open the circuit; the third request does not touch Redis
    assert metrics.series("gateway_cache_errors_total") == {labels(backend="redis"): 2}
    assert metrics.series("gateway_cache_circuit_state") == {labels(backend="redis"): 2}
    assert metrics.value("gateway_upstream_requests_total", route="users", status="200") == 4
    assert metrics.series("gateway_requests_total") == {
        labels(route="users", status="200", cache="miss"): 4,
        labels(route="users", status="200", cache="hit"): 1,
        labels(route="metrics", status="200", cache="none"): 1,
    }
    assert len(upstream_log) == 4

    own_redis.start()
    await asyncio.sleep(reset_s + 0.1)
    trial = await get(client, "/users")
    assert trial.headers["X-Cache"] == "MISS"
    assert trial.headers["Cache-Status"] == "records-gateway; fwd=miss; stored"
    assert (await get(client, "/users")).headers["X-Cache"] == "HIT"
    metrics = await scrape(client)
    assert metrics.series("gateway_cache_errors_total") == {labels(backend="redis"): 2}
    assert metrics.series("gateway_cache_circuit_state") == {labels(backend="redis"): 0}


async def test_no_label_carries_a_path_an_id_or_a_token(
    gateway_factory: GatewayFactory, upstream: TestServer
) -> None:
    client = await gateway_factory(base_url(upstream), cache={"backend": "memory"})
    listed = await (await get(client, "/expenses")).json()
    expense_id = listed["data"][0]["id"]
    accounts = await (await get(client, "/accounts")).json()
    account_id = accounts["data"][0]["id"]
    wrong = "wrong-secret-token"
    unknown_id = "00000000-0000-4000-8000-000000000000"

    sequence: list[tuple[str, dict[str, str] | None, int]] = [
        (f"/expenses/{expense_id}", None, 200),
        (f"/expenses/{unknown_id}", None, 404),
        (f"/accounts/{account_id}", None, 200),
        ("/accounts/a%2Fb", None, 404),
        (f"/users/{expense_id}", None, 404),
        ("/a/b/c", None, 404),
        ("/users?password=1", None, 400),
        ("/users", {"Authorization": f"Bearer {wrong}"}, 401),
        ("/clients", {"Authorization": f"Basic {TOKEN}"}, 401),
    ]
    for path, headers, status in sequence:
        assert (await get(client, path, headers)).status == status, path
    assert (await client.post("/users", headers=AUTH)).status == 405

    metrics = await scrape(client)
    values = metrics.label_values()
    assert values
    for name, key, value in values:
        for forbidden in (TOKEN, wrong, expense_id, unknown_id, account_id, "/"):
            assert forbidden not in value, (name, key, value)
    routes = {value for _, key, value in values if key == "route"}
    assert routes <= ROUTE_LABELS
    assert metrics.series("gateway_requests_total", "cache") == {
        labels(route="expenses", status="200"): 1,
        labels(route="accounts", status="200"): 1,
        labels(route="expense", status="200"): 1,
        labels(route="expense", status="404"): 1,
        labels(route="account", status="200"): 1,
        labels(route="account", status="404"): 1,
        labels(route="other", status="404"): 2,
        labels(route="users", status="400"): 1,
        labels(route="users", status="401"): 1,
        labels(route="clients", status="401"): 1,
        labels(route="users", status="405"): 1,
    }


def test_flushed_tallies_expose_what_one_call_per_request_would() -> None:
    """Metrics.count_answer tallies and flush() hands them over in bulk; the exposition
    must be the one prometheus-client gives for one inc/observe per request."""
    answers = [
        ("expenses", 200, "hit", 0.0001),
        ("expenses", 200, "hit", 0.0005),  # on a bucket's bound: counted in that bucket
        ("expenses", 200, "hit", 0.003),
        ("expenses", 200, "miss", 0.7),
        ("users", 502, "none", 12.0),  # past the last bound: +Inf only
        ("expenses", 200, "hit", 0.0005),
    ]
    tallied = Metrics()
    for route, status, cache, seconds in answers:
        tallied.count_answer(route, status, cache, seconds)
    before = Scrape(generate_latest(tallied.registry).decode())
    assert before.series("gateway_requests_total") == {}, "nothing before a flush"
    tallied.flush()

    # what prometheus-client's own metrics, one inc/observe per request, expose
    direct = CollectorRegistry()
    requests = Counter("gateway_requests_total", "", ["route", "status", "cache"], registry=direct)
    durations = Histogram(
        "gateway_request_duration_seconds",
        "",
        ["route", "cache"],
        buckets=LATENCY_BUCKETS,
        registry=direct,
    )
    results = Counter("gateway_cache_results_total", "", ["route", "result"], registry=direct)
    Gauge("gateway_requests_in_flight", "", registry=direct).set(0)
    Gauge("gateway_fleet_configurations", "", registry=direct).set(0)
    Gauge("gateway_upstream_circuit_state", "", registry=direct).set(0)
    Counter("gateway_upstream_switches_total", "", registry=direct)
    Counter("gateway_identity_decompressions_total", "", registry=direct)
    Counter("gateway_consistency_unconfirmed_total", "", registry=direct)
    Gauge("gateway_cache_record_index_keys", "", registry=direct).set(0)
    Gauge("gateway_cache_record_index_bytes", "", registry=direct).set(0)
    for route, status, cache, seconds in answers:
        requests.labels(route, str(status), cache).inc()
        durations.labels(route, cache).observe(seconds)
        if cache != "none":
            results.labels(route, cache).inc()

    def samples(registry: CollectorRegistry) -> dict[tuple[str, Labels], float]:
        scrape = Scrape(generate_latest(registry).decode())
        return {key: value for key, value in scrape.samples.items() if "_created" not in key[0]}

    assert samples(tallied.registry) == samples(direct)
    assert (
        samples(tallied.registry)[
            (
                "gateway_request_duration_seconds_bucket",
                labels(route="expenses", cache="hit", le="0.0005"),
            )
        ]
        == 3
    )
    tallied.flush()  # nothing new: nothing added twice
    assert samples(tallied.registry) == samples(direct)


async def test_a_failed_hand_over_neither_stops_the_next_nor_fails_the_shutdown(
    gateway_factory: GatewayFactory, upstream: TestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = await gateway_factory(base_url(upstream), cache={"backend": "memory"})
    metrics = client.app[METRICS]
    flush = metrics.flush
    calls = 0

    def failing_once() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise OSError(28, "No space left on device")
        flush()

    monkeypatch.setattr(metrics, "flush", failing_once)
    assert (await client.get("/users", headers=AUTH)).status == 200
    async with asyncio.timeout(10):  # the once-a-second hand-over goes on after a failure
        while calls < 2:
            await asyncio.sleep(0.05)
    assert (await client.get("/users", headers=AUTH)).status == 200
    await client.close()  # the last hand-over at shutdown must not raise either
    exposition = Scrape(generate_latest(metrics.registry).decode())
    assert exposition.value("gateway_requests_total", route="users", status="200", cache="hit") == 1


@pytest.mark.parametrize(("memo_bytes", "decompressions"), [(16 * 1024 * 1024, 1), (0, 3)])
async def test_identity_decompressions_count_what_the_memo_did_not_hold(
    gateway_factory: GatewayFactory, upstream: TestServer, memo_bytes: int, decompressions: int
) -> None:
    """docs/caching.md, "Compression", and docs/operations.md, "Metrics": a caller that
    does not accept gzip is sent the body decompressed, once per body while the memo
    holds it, and the counter says how
    often the memo did not."""
    client = await gateway_factory(
        base_url(upstream), cache={"backend": "memory", "identity_memo_max_bytes": memo_bytes}
    )
    identity = {**AUTH, "Accept-Encoding": "identity"}
    gzip = {**AUTH, "Accept-Encoding": "gzip"}
    first = await get(client, "/expenses?limit=10", identity)  # the miss stores it gzip
    assert first.headers["X-Cache"] == "MISS"
    for headers in (identity, gzip, identity, gzip, identity):
        answer = await get(client, "/expenses?limit=10", headers)
        assert answer.headers["X-Cache"] == "HIT"
        assert answer.headers.get("Content-Encoding") == (None if headers is identity else "gzip")
        assert await answer.read() == await first.read()  # aiohttp decodes the gzip ones

    metrics = await scrape(client)
    # the miss's answer is the body it normalised, not a decompression; gzip hits need none
    assert metrics.value("gateway_identity_decompressions_total") == decompressions
