"""The records' lookup port (``gateway.records.lookup``), used alike by the route's
handler and by the fast path: a miss the fast path looked up is served by the handler
with what the lookup already did (the token's HMAC, the validated query, the cache
read), and a miss handed on reaches only the handler of its own route."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from gateway.config.live import ConfigSource, LiveConfig
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
