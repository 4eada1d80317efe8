"""Hits answered by the gateway's server ahead of the application (gateway.http.hits),
without the fast path: what they carry, what they leave to the application, and that a
fault there costs the caller nothing (docs: the serving core, "Without the fast path")."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from gateway.cache.coding import Representation
from gateway.cache.entry import CacheEntry
from gateway.http.binding import UPSTREAMS
from gateway.http.hits import FAULT, HitFields

from ..conftest import GatewayFactory, base_url
from .test_wire import (
    LIST,
    continued,
    count_full_reads,
    count_server_hits,
    exchange,
    request_bytes,
    upstream_calls,
)

PLAIN = {"fast_path": False}


async def plain_gateway(gateway_factory: GatewayFactory, upstream: TestServer) -> tuple[Any, int]:
    client = await gateway_factory(base_url(upstream), server=PLAIN)
    assert client.port is not None
    (miss,) = await exchange(client.port, request_bytes(LIST))
    assert miss.headers["x-cache"] == "MISS"
    return client, client.port


async def test_a_hit_and_its_304_are_the_full_ways_field_for_field(
    gateway_factory: GatewayFactory, upstream: TestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, port = await plain_gateway(gateway_factory, upstream)
    full_reads = count_full_reads(client.app, monkeypatch)
    server_hits = count_server_hits(monkeypatch)
    hit, full = await exchange(
        port, request_bytes(LIST), request_bytes(LIST, Cache_Control="max-age=60")
    )
    assert (server_hits, full_reads) == ([1], [1])
    assert hit.status_line == full.status_line == "HTTP/1.1 200 OK"
    assert hit.body == full.body
    assert hit.comparable() == full.comparable()
    etag = hit.headers["etag"]
    short_304, full_304 = await exchange(
        port,
        request_bytes(LIST, If_None_Match=etag),
        request_bytes(LIST, If_None_Match=etag, Cache_Control="max-age=60"),
    )
    assert (server_hits, full_reads) == ([2], [2])
    assert short_304.status_line == full_304.status_line == "HTTP/1.1 304 Not Modified"
    assert short_304.body == full_304.body == b""
    assert short_304.comparable() == full_304.comparable()
    assert "content-type" not in short_304.headers


@pytest.mark.parametrize(
    "request_",
    [
        request_bytes(LIST, method="HEAD"),
        request_bytes(LIST, version="1.0"),
        request_bytes(LIST, Cache_Control="max-age=60"),
        request_bytes(LIST, Pragma="no-cache"),
        request_bytes(LIST, Expect="100-continue"),
        request_bytes(LIST, TE="trailers"),
        request_bytes(LIST, **{"cache-control": "max-age=60"}),
        request_bytes(LIST, PRAGMA="no-cache"),
    ],
    ids=["head", "http-1.0", "cache-control", "pragma", "expect", "te", "lower", "upper"],
)
async def test_what_is_not_a_plain_get_is_the_applications(
    gateway_factory: GatewayFactory,
    upstream: TestServer,
    monkeypatch: pytest.MonkeyPatch,
    request_: bytes,
) -> None:
    client, port = await plain_gateway(gateway_factory, upstream)
    full_reads = count_full_reads(client.app, monkeypatch)
    server_hits = count_server_hits(monkeypatch)
    if b"Expect" in request_:
        _interim, answer = await continued(port, request_)
    else:
        (answer,) = await exchange(port, request_, head=request_.startswith(b"HEAD"))
    assert answer.status_line.endswith("200 OK")
    assert (server_hits, full_reads) == ([0], [1])


async def test_a_miss_is_read_once_and_fetched_once(
    gateway_factory: GatewayFactory, upstream: TestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, port = await plain_gateway(gateway_factory, upstream)
    guarded = client.app[UPSTREAMS].current.cache
    reads = guarded.outcomes().reads.ok
    calls = upstream_calls(upstream)
    (miss,) = await exchange(port, request_bytes("/expenses?limit=7"))
    assert miss.headers["x-cache"] == "MISS"
    assert guarded.outcomes().reads.ok == reads + 1, "the server's read, handed on"
    assert upstream_calls(upstream) == calls + 1


async def test_a_request_without_a_token_is_the_applications_401(
    gateway_factory: GatewayFactory, upstream: TestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    _client, port = await plain_gateway(gateway_factory, upstream)
    server_hits = count_server_hits(monkeypatch)
    (answer,) = await exchange(port, f"GET {LIST} HTTP/1.1\r\nHost: gateway\r\n\r\n".encode())
    assert answer.status_line == "HTTP/1.1 401 Unauthorized"
    assert answer.headers["content-type"] == "application/problem+json"
    assert server_hits == [0]


async def test_a_fault_before_the_application_still_answers_the_request_with_its_id(
    gateway_factory: GatewayFactory,
    upstream: TestServer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    client, port = await plain_gateway(gateway_factory, upstream)
    pipeline = client.app[UPSTREAMS].current.pipeline

    def broken(*args: Any) -> Any:
        raise RuntimeError("a bug in the hit path")

    monkeypatch.setattr(pipeline, "held", broken)
    caplog.set_level(logging.ERROR)
    (answer,) = await exchange(port, request_bytes(LIST, X_Request_ID="caller-id-9"))
    assert answer.status_line == "HTTP/1.1 200 OK"
    assert answer.headers["x-request-id"] == "caller-id-9"
    assert answer.headers["x-cache"] == "HIT"
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == [FAULT]


def test_the_fields_made_are_kept_within_their_bound() -> None:
    made: list[str] = []

    def fields_of(entry: CacheEntry, now: float, representation: Representation) -> list[Any]:
        made.append(representation.etag)
        age = int(now)
        return [
            ("Content-Type", "application/json"),
            ("X-Cache", "HIT"),
            ("Cache-Status", f"records-gateway; hit; ttl={60 - age}"),
            ("Age", str(age)),
            ("Cache-Control", f"private, max-age={60 - age}"),
            ("Vary", "Accept-Encoding"),
            ("ETag", representation.etag),
        ]

    fields = HitFields(fields_of, size=4)
    entry = CacheEntry(b"{}", '"a"', stored_at=0.0, ttl_s=60)
    for n in range(20):
        representation = Representation(b"{}", f'"e{n}"', "identity")
        got = fields(entry, float(n % 3), representation, True)
        assert got["ETag"] == f'"e{n}"'
        assert got["Age"] == str(n % 3)
        assert len(fields) <= 8
    again = fields(entry, 1.0, Representation(b"{}", '"e19"', "identity"), False)
    assert "Content-Type" not in again
    assert again["ETag"] == '"e19"'
    assert len(made) >= 20  # each new ETag made its fields once
