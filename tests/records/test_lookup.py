"""The records' lookup port (``gateway.records.lookup``), used alike by the route's
handler and by the fast path: a miss the fast path looked up is served by the handler
with what the lookup already did (the token's HMAC, the validated query, the cache
read), and a miss handed on reaches only the handler of its own route."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from gateway.config.live import ConfigSource, LiveConfig
from gateway.http.admin import LIVE
from gateway.http.binding import UPSTREAMS
from gateway.records import lookup as lookup_module
from gateway.records.keys import Keyer
from gateway.records.lookup import Miss, RecordLookup, Target, handing
from gateway.routing.standard import ROUTES

from ..conftest import GatewayFactory, base_url, make_settings, redis_cache
from ..http.test_wire import exchange, request_bytes, upstream_calls

PAGE = "/expenses?limit=3&page=2"


def count_fingerprints(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many HMACs of a token the gateway computes from now on."""
    counted = [0]
    fingerprint = Keyer.fingerprint

    def counting(keyer: Keyer, authorization: str) -> str:
        counted[0] += 1
        return fingerprint(keyer, authorization)

    monkeypatch.setattr(Keyer, "fingerprint", counting)
    return counted


@pytest.mark.parametrize("backend", ["memory", "redis"])
async def test_a_miss_is_keyed_once_and_read_once_with_the_fast_path(
    gateway_factory: GatewayFactory,
    upstream: TestServer,
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
    backend: str,
) -> None:
    """A miss on a fresh connection, with the fast path on: the token's HMAC is
    computed once (by the lookup, not again by the handler), the upstream is called
    once; the next request is a hit."""
    cache: dict[str, Any] = {"backend": "memory"}
    if backend == "redis":
        cache = redis_cache(redis_url, near_cache=False)
    client = await gateway_factory(base_url(upstream), server={"fast_path": True}, cache=cache)
    assert client.port is not None
    hmacs = count_fingerprints(monkeypatch)
    calls = upstream_calls(upstream)
    (miss,) = await exchange(client.port, request_bytes(PAGE))
    assert miss.headers["x-cache"] == "MISS"
    assert hmacs == [1]
    assert upstream_calls(upstream) == calls + 1
    (hit,) = await exchange(client.port, request_bytes(PAGE))
    assert hit.headers["x-cache"] == "HIT"
    assert hit.body == miss.body


async def test_the_same_request_on_another_connection_is_not_keyed_again(
    gateway_factory: GatewayFactory, upstream: TestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request resolved once (its query validated, its token's HMAC, its key) is
    resolved from memory when any connection sends it again."""
    client = await gateway_factory(base_url(upstream), server={"fast_path": True})
    assert client.port is not None
    hmacs = count_fingerprints(monkeypatch)
    (miss,) = await exchange(client.port, request_bytes(PAGE))
    hits = [(await exchange(client.port, request_bytes(PAGE)))[0] for _ in range(3)]

    assert miss.headers["x-cache"] == "MISS"
    assert [hit.headers["x-cache"] for hit in hits] == ["HIT"] * 3
    assert all(hit.body == miss.body for hit in hits)
    assert hmacs == [1]


async def test_a_remembered_request_is_resolved_again_under_reloaded_limits(
    gateway_factory: GatewayFactory, upstream: TestServer
) -> None:
    """A request remembered as valid under ``limits.max_limit = 100`` is a 400 problem,
    with no upstream call, once a reload lowers the limit below what it asks."""
    client = await gateway_factory(base_url(upstream), server={"fast_path": True})
    assert client.port is not None
    wide = "/users?limit=50"
    (first,) = await exchange(client.port, request_bytes(wide))
    (again,) = await exchange(client.port, request_bytes(wide))
    assert first.status_line == "HTTP/1.1 200 OK"
    assert again.headers["x-cache"] == "HIT"
    live = client.app[LIVE]
    narrower = live.settings.model_copy(
        update={"limits": live.settings.limits.model_copy(update={"max_limit": 20})}
    )
    assert live.take(narrower).ok
    calls = upstream_calls(upstream)

    (refused,) = await exchange(client.port, request_bytes(wide))

    assert refused.status_line == "HTTP/1.1 400 Bad Request"
    assert refused.headers["content-type"] == "application/problem+json"
    assert b"limit" in refused.body
    assert upstream_calls(upstream) == calls


class _Fingerprints:
    def known(self, keyer: Keyer, authorization: str) -> str | None:
        return None

    def remember(self, keyer: Keyer, authorization: str) -> str:
        return keyer.fingerprint(authorization)


def test_what_resolve_remembers_is_bounded_in_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lookup_module, "TARGETS_MAX_BYTES", 10_000)
    lookup = RecordLookup(make_settings_live(), lambda reply: {}, lambda accept: False, ROUTES)
    pipeline: Any = SimpleNamespace(
        caches=True, keyer=Keyer(namespace="t", base_url="http://u", secret=b"s" * 32)
    )
    lookup.pipeline = pipeline
    fingerprints = _Fingerprints()
    first = lookup.resolve("/users", "page=1", "Bearer token-a", None, fingerprints)
    assert first is not None
    assert lookup.resolve("/users", "page=1", "Bearer token-a", None, fingerprints) is first
    for page in range(2, 200):
        assert lookup.resolve("/users", f"page={page}", "Bearer token-a", None, fingerprints)
        assert lookup.targets_bytes <= 10_000
    # the first was let go to stay within the bound, and is resolved anew
    again = lookup.resolve("/users", "page=1", "Bearer token-a", None, fingerprints)
    assert again is not first
    assert again == first
    # a request too long to remember is resolved each time
    long_token = "Bearer " + "t" * 5000
    long_first = lookup.resolve("/users", "page=1", long_token, None, fingerprints)
    assert long_first is not None
    assert lookup.resolve("/users", "page=1", long_token, None, fingerprints) is not long_first


def test_a_handed_miss_reaches_its_own_route_within_the_block_only() -> None:
    lookup = RecordLookup(make_settings_live(), lambda reply: {}, lambda accept: False, ROUTES)
    users, expenses = (next(r for r in ROUTES if r.name == name) for name in ("users", "expenses"))
    query = lookup.query("/users", "limit=2", 1000)
    assert query is not None
    assert query.route is users
    pipeline: Any = object()
    lookup.pipeline = pipeline
    miss = Miss(Target(query, Any, "f" * 32, pipeline, 1000, False), None)  # type: ignore[arg-type]
    assert lookup.handed(users) is None
    with handing(miss):
        assert lookup.handed(users) is miss
        assert lookup.handed(expenses) is None
        lookup.pipeline = None  # a reload since: the miss no longer holds
        assert lookup.handed(users) is None
        lookup.pipeline = pipeline
    assert lookup.handed(users) is None


def make_settings_live() -> LiveConfig:
    settings = make_settings("http://127.0.0.1:9", limits={"max_limit": 1000})
    return LiveConfig(settings, ConfigSource())


def count_cache_reads(backend: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How often, from now on, the real ``backend`` is probed in process (``fresh``,
    ``read_held``) and read (``get``): spies around its own methods."""
    counted = {"fresh": 0, "read_held": 0, "get": 0}
    fresh, read_held, get = backend.fresh, backend.read_held, backend.get

    def counting_fresh(key: Any) -> Any:
        counted["fresh"] += 1
        return fresh(key)

    def counting_read_held(key: Any) -> Any:
        counted["read_held"] += 1
        return read_held(key)

    async def counting_get(key: Any) -> Any:
        counted["get"] += 1
        return await get(key)

    monkeypatch.setattr(backend, "fresh", counting_fresh)
    monkeypatch.setattr(backend, "read_held", counting_read_held)
    monkeypatch.setattr(backend, "get", counting_get)
    return counted


@pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "aiohttp"])
@pytest.mark.parametrize("backend", ["memory", "redis-near"])
async def test_a_miss_probes_the_process_once_and_reads_the_store_once(
    gateway_factory: GatewayFactory,
    upstream: TestServer,
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
    backend: str,
    fast: bool,
) -> None:
    """A miss, whichever way in: the entries this process holds (the memory backend,
    or the near cache in front of Redis) are looked in once, and Redis is read once
    before the upstream is called (the fill's read after taking its lease aside):
    docs/architecture.md, "A request"."""
    cache: dict[str, Any] = {"backend": "memory"}
    if backend == "redis-near":
        cache = redis_cache(redis_url, near_cache=True)
    client = await gateway_factory(base_url(upstream), server={"fast_path": fast}, cache=cache)
    assert client.port is not None
    guarded = client.app[UPSTREAMS].current.cache
    reads = count_cache_reads(guarded.backend, monkeypatch)
    calls = upstream_calls(upstream)
    (miss,) = await exchange(client.port, request_bytes(PAGE))
    assert miss.headers["x-cache"] == "MISS"
    assert upstream_calls(upstream) == calls + 1
    if backend == "memory":
        # the memory backend is the process's: its read is the one probe
        assert reads["fresh"] + reads["read_held"] + reads["get"] == 1
    else:
        assert reads["fresh"] == 1
        # Redis: this request's read, and the fill's check after taking the lease
        assert reads["get"] == 2
    (hit,) = await exchange(client.port, request_bytes(PAGE))
    assert hit.headers["x-cache"] == "HIT"
    assert hit.body == miss.body


@pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "aiohttp"])
async def test_a_memory_miss_is_counted_as_one_cache_read_whichever_way_in(
    gateway_factory: GatewayFactory, upstream: TestServer, fast: bool
) -> None:
    """The one read a miss makes of the memory backend counts once among the reads
    readiness reports and in the breaker's window, as the handler's own read counts;
    a hit from the fast path's probe, or from the gateway's server's, counts as none."""
    client = await gateway_factory(
        base_url(upstream), server={"fast_path": fast}, cache={"backend": "memory"}
    )
    assert client.port is not None
    guarded = client.app[UPSTREAMS].current.cache
    reads, window = guarded.outcomes().reads.ok, guarded.breaker.tally().ok
    (miss,) = await exchange(client.port, request_bytes(PAGE))
    assert miss.headers["x-cache"] == "MISS"
    assert guarded.outcomes().reads.ok == reads + 1
    assert guarded.breaker.tally().ok == window + 3  # the read, the lease, the store
    counted = guarded.outcomes().reads.ok
    (hit,) = await exchange(client.port, request_bytes(PAGE))
    assert hit.headers["x-cache"] == "HIT"
    assert guarded.outcomes().reads.ok == counted
