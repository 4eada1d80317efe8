"""What a client sees of the fast path itself (``server.fast_path`` on, set explicitly
here): the gateway served by ``FastPathRunner``, whose connections
(gateway.fastpath.connection.GatewayConnection) answer a fresh hit on a plain
kept-alive GET from the bytes they receive, and answer what aiohttp's parser rejects,
or an error outside every handler, as a problem.

It holds a hit answered from the bytes to the fields, ages and freshness aiohttp's
way (and a gateway without the fast path) sends for the same reply, logged and
counted as every other answer; a request aiohttp's parser rejects to a problem that
quotes nothing of it; and the fast path to skipping nothing the application would
run. What must hold whichever way the gateway is served is in tests/http/test_wire.py.
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.http import SERVER_SOFTWARE
from aiohttp.test_utils import TestClient, TestServer
from pytest_aiohttp import AiohttpClient

from gateway.cache.coding import Representation
from gateway.cache.entry import IDENTITY, CacheEntry
from gateway.fastpath.connection import FastPathServer, WireHeads
from gateway.fastpath.server import FastPathRunner, make_runner
from gateway.http.app import create_app
from gateway.http.binding import UPSTREAMS
from gateway.http.hits import FAULT
from gateway.http.records import RECORDS
from gateway.http.replies import reply_headers
from gateway.http.service import METRICS
from gateway.records.pipeline import hit_reply
from gateway.records.routes import QueryMemo

from ..conftest import AUTH, FakeClock, GatewayTestServer, base_url, gateway_client, make_settings
from ..http.test_wire import (
    ACCOUNT,
    LIST,
    Answer,
    count_full_reads,
    exchange,
    filter_parser_log,
    read_answer,
    request_bytes,
    send_and_read_all,
)

Client = TestClient[web.Request, web.Application]
FAST = {"fast_path": True}


async def served_fast(
    aiohttp_client: AiohttpClient,
    upstream_url: str,
    clock: FakeClock | None = None,
    **sections: dict[str, Any],
) -> tuple[Client, int]:
    """A gateway served with the fast path in front of ``upstream_url``: its client
    and port."""
    settings = make_settings(upstream_url, server=FAST, **sections)
    app = create_app(settings) if clock is None else create_app(settings, clock=clock)
    client = await gateway_client(aiohttp_client, app)
    assert isinstance(client.server.runner, FastPathRunner)
    port = client.port
    assert port is not None
    return client, port


async def test_a_hit_from_the_bytes_carries_what_a_gateway_without_the_fast_path_sends(
    aiohttp_client: AiohttpClient,
    upstream: TestServer,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two gateways on one clock, one with the fast path and one without, each with
    the same entry stored: the same hit, field for field, and the same body, from the
    bytes, from the gateway's server (without the fast path) and by the full way (the
    route's handler)."""
    fast, fast_port = await served_fast(aiohttp_client, base_url(upstream), clock)
    plain_settings = make_settings(base_url(upstream), server={"fast_path": False})
    plain = await gateway_client(aiohttp_client, create_app(plain_settings, clock=clock))
    assert not isinstance(plain.server.runner, FastPathRunner)
    plain_port = plain.port
    assert plain_port is not None
    for client in (fast, plain):
        assert (await client.get(LIST, headers=AUTH)).headers["X-Cache"] == "MISS"
    clock.advance(7.5)
    fast_reads = count_full_reads(fast.app, monkeypatch)
    plain_reads = count_full_reads(plain.app, monkeypatch)
    (from_bytes,) = await exchange(fast_port, request_bytes(LIST))
    (from_aiohttp,) = await exchange(plain_port, request_bytes(LIST))
    assert (fast_reads, plain_reads) == ([0], [0])
    (full,) = await exchange(plain_port, by_the_full_way(LIST))
    assert plain_reads == [1]
    assert from_bytes.status_line == from_aiohttp.status_line == full.status_line
    assert from_bytes.status_line == "HTTP/1.1 200 OK"
    assert from_bytes.body == from_aiohttp.body == full.body
    assert from_bytes.comparable() == from_aiohttp.comparable() == full.comparable()
    assert from_bytes.headers["age"] == "7"
    assert from_bytes.headers["server"] == SERVER_SOFTWARE
    # the fast path's bytes end with the request id; aiohttp's with what it adds
    assert from_bytes.fields[-1][0] == "x-request-id"
    assert from_aiohttp.fields[-1][0] != "x-request-id"


def by_the_full_way(path: str, **headers: str) -> bytes:
    """A request for ``path`` with a Cache-Control the gateway ignores: its hit is the
    same, by aiohttp's router and the route's handler."""
    return request_bytes(path, Cache_Control="max-age=60", **headers)


async def test_hits_from_the_bytes_follow_each_entry_s_age_second_by_second(
    aiohttp_client: AiohttpClient,
    upstream: TestServer,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two entries of different TTLs, asked in turn as the clock moves: each hit
    carries its own ETag, Age and freshness left (Cache-Status, Cache-Control), the
    same as aiohttp's way gives, never another entry's or another second's."""
    client, port = await served_fast(aiohttp_client, base_url(upstream), clock)
    accounts = "/accounts?limit=5"  # 60 s fresh
    expenses = LIST  # 30 s fresh
    etags = {}
    for path in (accounts, expenses):
        (miss,) = await exchange(port, request_bytes(path))
        assert miss.headers["x-cache"] == "MISS"
        etags[path] = miss.headers["etag"]
    assert etags[accounts] != etags[expenses]
    full_reads = count_full_reads(client.app, monkeypatch)

    def expected(answer: Answer, path: str, age: int, left: int) -> None:
        assert answer.headers["x-cache"] == "HIT"
        assert answer.headers["etag"] == etags[path]
        assert answer.headers["age"] == str(age)
        assert answer.headers["cache-status"] == f"records-gateway; hit; ttl={left}"
        assert answer.headers["cache-control"] == f"private, max-age={left}"

    clock.advance(0.5)
    answers = await exchange(
        port,
        request_bytes(accounts),
        request_bytes(expenses),
        request_bytes(accounts),
        by_the_full_way(expenses),
    )
    expected(answers[0], accounts, 0, 59)
    expected(answers[1], expenses, 0, 29)
    expected(answers[2], accounts, 0, 59)
    assert answers[1].comparable() == answers[3].comparable()
    clock.advance(11.5)
    answers = await exchange(
        port,
        request_bytes(expenses),
        request_bytes(accounts),
        request_bytes(expenses),
        by_the_full_way(accounts),  # last: what follows one aiohttp handles is its too
    )
    expected(answers[0], expenses, 12, 18)
    expected(answers[1], accounts, 12, 48)
    expected(answers[2], expenses, 12, 18)
    assert answers[1].comparable() == answers[3].comparable()
    assert full_reads == [2], "the others were answered from the bytes"


async def test_a_hit_on_a_query_never_seen_in_that_form_is_answered_from_the_bytes(
    aiohttp_client: AiohttpClient, upstream: TestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An entry stored by one spelling of a query is a hit for every spelling of it
    (the key is the canonical query), and the fast path validates a spelling it has not
    seen itself: each is answered from the bytes, with the stored body and ETag; an
    invalid query still gets the route's own problem."""
    client, port = await served_fast(aiohttp_client, base_url(upstream))
    (stored,) = await exchange(port, request_bytes("/expenses?limit=5&page=2"))
    assert stored.headers["x-cache"] == "MISS"
    full_reads = count_full_reads(client.app, monkeypatch)
    spellings = (
        "/expenses?page=2&limit=5",
        "/expenses?limit=05&page=002",
        "/expenses?page=2&limit=5&",
    )
    answers = await exchange(port, *(request_bytes(path) for path in spellings))
    for answer in answers:
        assert answer.status_line == "HTTP/1.1 200 OK"
        assert answer.headers["x-cache"] == "HIT"
        assert answer.headers["etag"] == stored.headers["etag"]
        assert answer.body == stored.body
    assert full_reads == [0], "every spelling was answered from the bytes"
    (invalid,) = await exchange(port, request_bytes("/expenses?limit=0&page=2"))
    assert invalid.status_line.startswith("HTTP/1.1 400")
    assert orjson.loads(invalid.body)["errors"][0]["parameter"] == "limit"
    assert full_reads == [0], "refused before the pipeline, by the route's handler"


async def test_a_query_of_32_pairs_or_more_is_the_handler_s_alone(
    aiohttp_client: AiohttpClient, upstream: TestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A query with 32 pairs or more (empty ones count: the fast path does not read
    them) goes aiohttp's way, valid or not: the handler reads it once; one with fewer
    is the fast path's."""
    client, port = await served_fast(aiohttp_client, base_url(upstream))
    (stored,) = await exchange(port, request_bytes("/expenses?limit=5&page=2"))
    full_reads = count_full_reads(client.app, monkeypatch)
    short, long = await exchange(
        port,
        request_bytes("/expenses?limit=5&page=2" + "&" * 30),
        request_bytes("/expenses?limit=5&page=2" + "&" * 31),
    )
    assert full_reads == [1]
    assert short.body == long.body == stored.body
    assert short.headers["x-cache"] == long.headers["x-cache"] == "HIT"


async def test_a_hit_on_an_id_with_escapes_is_answered_from_the_bytes(
    aiohttp_client: AiohttpClient, upstream: TestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An id sent with percent escapes (an account name with spaces and accents) is
    decoded as aiohttp's router decodes it: each spelling of it is a hit answered from
    the bytes; an escape that is not UTF-8 still gets the route's own problem."""
    client, port = await served_fast(aiohttp_client, base_url(upstream))
    (stored,) = await exchange(port, request_bytes(ACCOUNT))
    assert stored.headers["x-cache"] == "MISS"
    full_reads = count_full_reads(client.app, monkeypatch)
    spellings = (ACCOUNT, ACCOUNT.replace("%C3%A1", "%c3%a1"), ACCOUNT.replace("%20c", "%20%63"))
    answers = await exchange(port, *(request_bytes(path) for path in spellings))
    for answer in answers:
        assert answer.headers["x-cache"] == "HIT"
        assert answer.body == stored.body
        assert answer.headers["etag"] == stored.headers["etag"]
    assert full_reads == [0]
    (invalid,) = await exchange(port, request_bytes("/accounts/Caja%C3"))
    assert invalid.status_line.startswith("HTTP/1.1 400")
    assert orjson.loads(invalid.body)["errors"][0]["parameter"] == "accountId"


async def test_more_distinct_hits_than_the_fast_path_remembers_are_each_answered_right(
    aiohttp_client: AiohttpClient, upstream: TestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Far more distinct entries than the memo of validated queries and the ready-made
    heads hold (shrunk here): each hit, asked in a mixed order, is answered from the
    bytes with its own body and ETag."""
    client, port = await served_fast(aiohttp_client, base_url(upstream))
    records = client.app[RECORDS]
    lookup = records.lookup
    monkeypatch.setattr(lookup, "_memos", {name: QueryMemo(size=3) for name in lookup._memos})
    runner = client.server.runner
    assert runner is not None
    server = runner.server
    assert isinstance(server, FastPathServer)
    server.hits.heads = WireHeads(lookup.hit_fields, size=3)
    paths = [f"/expenses?limit={limit}&page={page}" for limit in (1, 2, 3) for page in (1, 2, 3, 4)]
    stored = {}
    for path in paths:
        (miss,) = await exchange(port, request_bytes(path))
        assert miss.headers["x-cache"] == "MISS"
        stored[path] = miss
    full_reads = count_full_reads(client.app, monkeypatch)
    mixed = paths[::3] + paths[1::3] + paths[2::3] + paths[::-1]
    answers = await exchange(port, *(request_bytes(path) for path in mixed))
    for path, answer in zip(mixed, answers, strict=True):
        assert answer.headers["x-cache"] == "HIT"
        assert answer.headers["etag"] == stored[path].headers["etag"]
        assert answer.body == stored[path].body
    assert full_reads == [0]
    assert len(server.hits.heads) <= 6  # three of each bounded part
    assert max(len(memo) for memo in lookup._memos.values()) == 3


def _reply_fields(
    entry: CacheEntry, now: float, representation: Representation
) -> list[tuple[str, str]]:
    return list(reply_headers(hit_reply(entry, now, representation)).items())


def test_wire_heads_are_each_reply_s_fields_as_bytes_up_to_the_date() -> None:
    """The ready-made head of a hit: the status line, the reply's headers in order,
    Content-Length and Server; Date and the request id follow. Its parts are kept per
    coding, per whole seconds of age and freshness left, and per representation, and
    past their bound none is mixed up with another."""
    heads = WireHeads(_reply_fields, size=2)
    one = CacheEntry(body=b"{}", etag='"one"', stored_at=1000.0, ttl_s=60)
    two = CacheEntry(body=b"[1,2]", etag='"two"', stored_at=1000.0, ttl_s=30)
    as_one, as_two = (Representation(e.body, e.etag, IDENTITY) for e in (one, two))
    first = heads(one, 1000.5, as_one)
    fields = {
        "Content-Type": "application/json",
        "X-Cache": "HIT",
        "Cache-Status": "records-gateway; hit; ttl=59",
        "Age": "0",
        "Cache-Control": "private, max-age=59",
        "Vary": "Accept-Encoding",
        "ETag": '"one"',
    }
    assert dict(reply_headers(hit_reply(one, 1000.5, as_one))) == fields
    wire = first.decode("latin-1")
    assert wire.startswith("HTTP/1.1 200 OK\r\n")
    assert wire.endswith("\r\n")
    assert not wire.endswith("\r\n\r\n")  # Date and the request id follow
    lines = wire.split("\r\n")[1:-1]
    assert lines == [
        *(f"{name}: {value}" for name, value in fields.items()),
        "Content-Length: 2",
        f"Server: {SERVER_SOFTWARE}",
    ]
    assert heads(one, 1000.9, as_one) == first  # the same second of the same entry
    later_two = heads(two, 1012.0, as_two)
    assert b"Cache-Status: records-gateway; hit; ttl=18\r\n" in later_two
    assert b"Age: 12\r\n" in later_two
    assert b"Content-Length: 5\r\n" in later_two
    assert b'ETag: "two"\r\n' in later_two
    later = heads(one, 1030.2, as_one)  # a third second and entry: past the bound
    assert b"Age: 30\r\nCache-Control: private, max-age=29\r\nVary: Accept-Encoding\r\n" in later
    assert b'\r\nETag: "one"\r\nContent-Length: 2\r\n' in later
    assert heads(two, 1012.0, as_two) == later_two
    assert heads(one, 1000.5, as_one) == first
    assert len(heads) <= 4
    # a 304's: the same less the fields of a body, whichever was made first
    not_modified = heads(one, 1000.5, as_one, False).decode("latin-1")
    assert not_modified.split("\r\n")[:-1] == [
        "HTTP/1.1 304 Not Modified",
        *(f"{name}: {value}" for name, value in fields.items() if name != "Content-Type"),
        f"Server: {SERVER_SOFTWARE}",
    ]
    assert heads(one, 1000.5, as_one) == first
    # each part is its reply's, whatever else was made in between
    for entry, now, representation in ((one, 1012.0, as_one), (two, 1000.5, as_two)):
        reply = hit_reply(entry, now, representation)
        made = heads(entry, now, representation).decode("latin-1").split("\r\n")[1:-3]
        assert made == [f"{name}: {value}" for name, value in reply_headers(reply).items()]


@pytest.fixture
def access_records(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="gateway.access")
    return caplog


async def test_a_hit_from_the_bytes_is_logged_and_counted_as_aiohttp_s_own_answer(
    aiohttp_client: AiohttpClient,
    upstream: TestServer,
    monkeypatch: pytest.MonkeyPatch,
    access_records: pytest.LogCaptureFixture,
) -> None:
    """What the gateway records of an answer (its access log line, its metrics) is
    the same for a hit from the bytes as for the same hit by aiohttp's way."""
    client, port = await served_fast(aiohttp_client, base_url(upstream))
    assert (await client.get(LIST, headers=AUTH)).headers["X-Cache"] == "MISS"
    full_reads = count_full_reads(client.app, monkeypatch)
    access_records.clear()
    from_bytes, full = await exchange(
        port,
        request_bytes(LIST, X_Request_ID="from-the-bytes"),
        by_the_full_way(LIST, X_Request_ID="the-full-way"),
    )
    assert full_reads == [1]
    assert from_bytes.headers["x-request-id"] == "from-the-bytes"
    assert full.headers["x-request-id"] == "the-full-way"
    lines = {
        getattr(record, "request_id", None): record
        for record in access_records.records
        if record.name == "gateway.access"
    }
    assert set(lines) == {"from-the-bytes", "the-full-way"}

    def logged(request_id: str) -> tuple[Any, ...]:
        record = lines[request_id]
        names = ("method", "route", "status", "cache", "upstream_status", "upstream_ms")
        return (record.getMessage(), *(getattr(record, name) for name in names))

    assert logged("from-the-bytes") == logged("the-full-way")
    assert logged("from-the-bytes") == ("request", "GET", "expenses", 200, "hit", None, None)
    fingerprint = client.app[UPSTREAMS].current.pipeline.keyer.fingerprint(AUTH["Authorization"])
    for record in lines.values():
        assert vars(record)["token_fingerprint"] == fingerprint
        assert vars(record)["duration_ms"] >= 0
    exposition = client.app[METRICS].exposition().decode()
    assert 'gateway_requests_total{cache="hit",route="expenses",status="200"} 2.0' in exposition


async def test_a_hit_from_the_bytes_logs_the_caller_s_trace_id_or_a_new_one(
    aiohttp_client: AiohttpClient,
    upstream: TestServer,
    monkeypatch: pytest.MonkeyPatch,
    access_records: pytest.LogCaptureFixture,
) -> None:
    """Held for docs/operations.md, "Tracing"."""
    client, port = await served_fast(aiohttp_client, base_url(upstream))
    assert (await client.get(LIST, headers=AUTH)).headers["X-Cache"] == "MISS"
    full_reads = count_full_reads(client.app, monkeypatch)
    access_records.clear()
    caller = "4bf92f3577b34da6a3ce929d0e0e4736"
    traceparent = f"00-{caller}-00f067aa0ba902b7-01"
    answers = await exchange(
        port,
        request_bytes(LIST, X_Request_ID="traced", traceparent=traceparent),
        request_bytes(LIST, X_Request_ID="traced-again", traceparent=traceparent),
        request_bytes(LIST, X_Request_ID="own"),
        request_bytes(LIST, X_Request_ID="own-again"),
        request_bytes(LIST, X_Request_ID="invalid", traceparent=traceparent.upper()),
    )
    assert full_reads == [0]
    assert [answer.headers["x-cache"] for answer in answers] == ["HIT"] * 5
    assert "traceparent" not in answers[0].headers  # no header of a draft on the answer
    traces = {
        getattr(record, "request_id", None): str(getattr(record, "trace_id", None))
        for record in access_records.records
        if record.name == "gateway.access"
    }
    assert traces["traced"] == traces["traced-again"] == caller
    own = [traces[request_id] for request_id in ("own", "own-again", "invalid")]
    assert all(re.fullmatch(r"[0-9a-f]{32}", trace_id) for trace_id in own)
    assert len({caller, *own}) == 4


async def test_requests_pipelined_behind_a_close_are_not_answered(
    aiohttp_client: AiohttpClient, upstream: TestServer
) -> None:
    """``Connection: close``, or ``Proxy-Connection: close`` as aiohttp reads it, then
    more requests on the connection: the hit, and the connection closed; nothing
    behind it is answered. (Plain aiohttp's parser refuses such a pipeline whole, with
    a 400, before answering the first.)"""
    client, port = await served_fast(aiohttp_client, base_url(upstream))
    await client.get(LIST, headers=AUTH)
    for closing in ({"Proxy_Connection": "close"}, {"Connection": "close"}):
        data = request_bytes(LIST, **closing) + request_bytes(LIST)
        (answer,), rest = await send_and_read_all(port, data, 1)
        assert answer.status_line == "HTTP/1.1 200 OK", closing
        assert answer.headers["x-cache"] == "HIT"
        assert answer.headers["connection"] == "close"
        assert rest == b"", closing


MALFORMED = b"GET /users HTTP/1.1\r\nBad Header\r\n\r\n"


@pytest.mark.parametrize("backend", ["memory", "none"])
@pytest.mark.parametrize("ahead", [2, 40], ids=["a-few", "past-aiohttp-s-queue"])
async def test_requests_pipelined_ahead_of_a_malformed_one_are_all_answered_before_its_400(
    aiohttp_client: AiohttpClient,
    upstream: TestServer,
    monkeypatch: pytest.MonkeyPatch,
    backend: str,
    ahead: int,
) -> None:
    """A miss (aiohttp busy with it), requests behind it (hits where the cache holds
    them), then a head aiohttp's parser refuses, all in one write: every request ahead
    of it is answered, in order, then the 400 problem, then the connection closes.
    (Plain aiohttp's parser drops the requests it read in the same piece as the
    malformed one: the 400 alone.)"""
    filter_parser_log(monkeypatch)
    client, port = await served_fast(aiohttp_client, base_url(upstream), cache={"backend": backend})
    await client.get(LIST, headers=AUTH)
    data = request_bytes("/expenses?limit=7", X_Request_ID="r-miss")
    data += b"".join(request_bytes(LIST, X_Request_ID=f"r-{n}") for n in range(ahead))
    answers, rest = await send_and_read_all(port, data + MALFORMED, ahead + 2)
    *ahead_of_it, refused = answers
    assert [a.headers["x-request-id"] for a in ahead_of_it] == ["r-miss"] + [
        f"r-{n}" for n in range(ahead)
    ]
    assert {a.status_line for a in ahead_of_it} == {"HTTP/1.1 200 OK"}
    assert refused.status_line == "HTTP/1.0 400 Bad Request"
    assert orjson.loads(refused.body)["type"] == "urn:records-gateway:problem:malformed-request"
    assert refused.headers["x-request-id"]
    assert rest == b"", "closed after the 400"


HANDING_OVER = {
    "content-length": request_bytes(LIST, X_Request_ID="r-over", Content_Length="0"),
    "empty-lines": b"\r\n\r\n" + request_bytes(LIST, X_Request_ID="r-over"),
}


@pytest.mark.parametrize("over", HANDING_OVER.values(), ids=HANDING_OVER.keys())
async def test_requests_ahead_of_a_malformed_one_are_answered_after_aiohttp_takes_over(
    aiohttp_client: AiohttpClient,
    upstream: TestServer,
    monkeypatch: pytest.MonkeyPatch,
    over: bytes,
) -> None:
    """A hit, then a request that hands the rest of the connection to aiohttp's parser
    (one that may announce a body, empty lines before a request), two
    requests and a head the parser refuses, all in one write: every request ahead of
    the malformed one is answered, in order, then the 400 problem, then the
    connection closes. (aiohttp's parser drops the requests it read in the same piece
    as the malformed one.)"""
    filter_parser_log(monkeypatch)
    client, port = await served_fast(aiohttp_client, base_url(upstream))
    await client.get(LIST, headers=AUTH)
    data = request_bytes(LIST, X_Request_ID="r-hit") + over
    data += request_bytes(LIST, X_Request_ID="r-1") + request_bytes("/nowhere", X_Request_ID="r-2")
    answers, rest = await send_and_read_all(port, data + MALFORMED, 5)
    *ahead_of_it, refused = answers
    assert [a.headers["x-request-id"] for a in ahead_of_it] == ["r-hit", "r-over", "r-1", "r-2"]
    assert ahead_of_it[-1].status_line == "HTTP/1.1 404 Not Found"
    assert refused.status_line == "HTTP/1.0 400 Bad Request"
    assert orjson.loads(refused.body)["type"] == "urn:records-gateway:problem:malformed-request"
    assert rest == b"", "closed after the 400"


async def test_words_that_name_body_fields_elsewhere_in_a_head_keep_the_pipeline_answered(
    aiohttp_client: AiohttpClient, upstream: TestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A query or a field whose text holds ``upgrade:`` or ``content-length:`` does not
    announce a body: the requests ahead of a malformed one are still all answered."""
    filter_parser_log(monkeypatch)
    client, port = await served_fast(aiohttp_client, base_url(upstream))
    await client.get(LIST, headers=AUTH)
    data = request_bytes("/expenses?concept=upgrade:x", X_Request_ID="r-query")
    data += request_bytes(LIST, X_Request_ID="r-field", X_Upgrade="1", X_Note="content-length: 3")
    data += request_bytes(LIST, X_Request_ID="r-hit")
    answers, rest = await send_and_read_all(port, data + MALFORMED, 4)
    assert [a.headers.get("x-request-id") for a in answers[:3]] == ["r-query", "r-field", "r-hit"]
    assert answers[3].status_line == "HTTP/1.0 400 Bad Request"
    assert rest == b""


@pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "gateway-server"])
@pytest.mark.parametrize("value", [b"foo", b"\xff"])
async def test_a_target_with_no_path_and_an_expectation_is_a_417_problem(
    upstream: TestServer, caplog: pytest.LogCaptureFixture, value: bytes, fast: bool
) -> None:
    """``CONNECT host:port``, which aiohttp's router offers to no resource, with an
    Expect the gateway does not meet: the 417 problem every route gives (aiohttp's own
    handler would answer plain text, and a 500 with a traceback for a field that is not
    UTF-8), with the fast path or without it: the gateway's server answers a target
    without a path before aiohttp's application (docs/errors.md, "`not-found`")."""
    app = create_app(make_settings(base_url(upstream), server={"fast_path": fast}))
    raw = b"CONNECT example.com:443 HTTP/1.1\r\nHost: g\r\nX-Request-ID: connect-1\r\n"
    status_line, headers, body = await exchange_raw(app, raw + b"Expect: " + value + b"\r\n\r\n")
    assert status_line == "HTTP/1.1 417 Expectation Failed"
    assert headers["X-Request-ID"] == "connect-1"
    assert headers["Content-Type"] == "application/problem+json"
    assert orjson.loads(body)["type"] == "urn:records-gateway:problem:expectation-failed"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize(
    "raw",
    [b"CONNECT  \r\nHost: g\r\n\r\n", b"CONNECT  \r\n\r\n"],
    ids=["with-fields", "bare"],
)
async def test_a_connect_with_no_target_is_answered(
    upstream: TestServer, caplog: pytest.LogCaptureFixture, raw: bytes
) -> None:
    """aiohttp's parser makes a message without a URL of it, on which aiohttp's own
    request factory fails the connection's task: no answer, and the connection left
    open. With the fast path: a problem (the line has no version: HTTP/0.9's 505, in an
    HTTP/1.1 status line), and the connection closed."""
    app = create_app(make_settings(base_url(upstream), server=FAST))
    status_line, headers, body = await exchange_raw(app, raw)
    assert status_line == "HTTP/1.1 505 HTTP Version Not Supported"
    assert headers["Content-Type"] == "application/problem+json"
    assert orjson.loads(body)["requestId"] == headers["X-Request-ID"]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def exchange_raw(app: web.Application, raw: bytes) -> tuple[str, dict[str, str], bytes]:
    """Send ``raw`` to ``app`` served as the gateway serves it; read until it closes."""
    client: Client = TestClient(GatewayTestServer(app))
    await client.start_server()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", client.port)
        writer.write(raw)
        async with asyncio.timeout(10):
            answer = await reader.read()  # the whole answer, then the gateway closes
        writer.close()
        await writer.wait_closed()
    finally:
        await client.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines)
    assert len(body) == int(headers["Content-Length"])
    return status_line, headers, body


@pytest.mark.parametrize(
    ("raw", "detail"),
    [
        (
            b"GET /users HTTP/1.1\r\nHost: g\r\n"
            b"Authorization: Bearer wrong-secret\x01-token\r\n\r\n",
            "the request is not valid HTTP/1.1: a malformed request line or header",
        ),
        (
            b"GET /users HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer wrong-secret-token"
            + b"x" * 40_000  # over aiohttp's 8 KiB here, and the served gateway's 32 KiB
            + b"\r\n\r\n",
            "the request line or a header is longer than the gateway accepts",
        ),
        (
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03wrong-secret-token\r\n\r\n",
            "not an HTTP/1.1 request (TLS to a plain-HTTP port, or an unknown method)",
        ),
    ],
    ids=["control-byte", "too-long", "tls"],
)
async def test_a_request_the_http_parser_rejects_gets_a_problem_that_quotes_nothing(
    raw: bytes,
    detail: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    filter_parser_log(monkeypatch)
    # aiohttp logs a first request that is not HTTP at all (TLS) at debug level: seen
    # here whatever level an earlier test left the root logger at
    caplog.set_level(logging.DEBUG, logger="aiohttp.server")
    app = create_app(make_settings("http://127.0.0.1:9", server=FAST))
    status_line, headers, body = await exchange_raw(app, raw)
    assert status_line == "HTTP/1.0 400 Bad Request"  # as aiohttp answers it, then closes
    assert headers["Content-Type"] == "application/problem+json"
    assert orjson.loads(body) == {
        "type": "urn:records-gateway:problem:malformed-request",
        "title": "Malformed HTTP request",
        "status": 400,
        "detail": detail,
        "instance": "/",
        "requestId": headers["X-Request-ID"],
    }
    assert b"secret" not in body
    assert "secret" not in caplog.text
    assert "rejected a malformed HTTP request" in caplog.text
    # counted as every other answer is
    assert 'route="other",status="400"' in app[METRICS].exposition().decode()


async def test_an_error_outside_every_handler_is_a_problem_with_its_request_id_logged(
    upstream: TestServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A fault in aiohttp's own handling before the edge that catches the handlers'
    errors (here its router) still gets a problem, the caller's request id, and a
    log line that carries it."""
    app = create_app(make_settings(base_url(upstream), server=FAST))

    async def broken(request: web.Request) -> Any:
        raise RuntimeError("a bug outside the handlers")

    monkeypatch.setattr(app.router, "resolve", broken)
    raw = (
        b"GET /users HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer demo-token\r\n"
        b"X-Request-ID: caller-id-7\r\n\r\n"
    )
    status_line, headers, body = await exchange_raw(app, raw)
    assert status_line == "HTTP/1.1 500 Internal Server Error"
    assert headers["X-Request-ID"] == "caller-id-7"
    assert headers["Content-Type"] == "application/problem+json"
    problem = orjson.loads(body)
    assert (problem["type"], problem["status"], problem["requestId"]) == (
        "urn:records-gateway:problem:internal",
        500,
        "caller-id-7",
    )
    logged = [r for r in caplog.records if getattr(r, "request_id", None) == "caller-id-7"]
    # the error line, and the access line as for every answer
    assert [r.getMessage() for r in logged] == ["unhandled error outside the handlers", "request"]


async def test_a_fault_in_a_hit_from_the_bytes_still_answers_the_request_with_its_id(
    aiohttp_client: AiohttpClient,
    upstream: TestServer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A fault while answering a hit from the bytes costs the caller nothing: the
    request goes to aiohttp's way, which answers the hit with the caller's request id,
    and the fault is logged as an error (by the fast path, then by the gateway's
    server, which meets it again and leaves the request to the application)."""
    client, port = await served_fast(aiohttp_client, base_url(upstream))
    await client.get(LIST, headers=AUTH)
    pipeline = client.app[UPSTREAMS].current.pipeline

    def broken(*args: Any) -> Any:
        raise RuntimeError("a bug in the hit path")

    monkeypatch.setattr(pipeline, "held", broken)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request_bytes(LIST, X_Request_ID="caller-id-8"))
    try:
        async with asyncio.timeout(10):
            answer = await read_answer(reader)
    finally:
        writer.close()
    assert answer.headers["x-request-id"] == "caller-id-8"
    assert answer.status_line == "HTTP/1.1 200 OK"
    assert answer.headers["x-cache"] == "HIT"
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [r.getMessage() for r in errors] == [
        "fast path: a hit failed; aiohttp answers the request",
        FAULT,
    ]


def test_the_app_has_nothing_the_fast_path_would_skip() -> None:
    """Hits answered from the bytes bypass aiohttp's middlewares and
    on_response_prepare; the gateway must not rely on either (add one, and those hits
    would miss it)."""
    app = create_app(make_settings("http://127.0.0.1:9", server=FAST))
    assert list(app.middlewares) == []
    assert list(app.on_response_prepare) == []


async def test_a_server_option_aiohttp_does_not_take_fails_the_setup() -> None:
    """aiohttp's own server drops it with a warning; the fast path's would fail every
    connection without a word. It fails at once instead."""
    app = create_app(make_settings("http://127.0.0.1:9", server=FAST))
    runner = make_runner(app, keep_alive_timeout=5)  # keepalive_timeout, misspelt
    assert isinstance(runner, FastPathRunner)
    try:
        with pytest.raises(TypeError):
            await runner.setup()
    finally:
        await runner.cleanup()
    good = make_runner(create_app(make_settings("http://127.0.0.1:9", server=FAST)))
    await good.setup()
    await good.cleanup()


async def test_aiohttp_s_task_is_made_only_for_a_connection_handed_a_request(
    aiohttp_client: AiohttpClient, upstream: TestServer
) -> None:
    """docs/architecture.md, "A request" (the server): a connection whose requests are all hits
    never makes aiohttp's handler or its task (nor waits a turn of the event loop for
    it), nor sets TCP keep-alive; the first request handed on makes both and sets it,
    as aiohttp does, and the connection's answers go on either way."""
    client, port = await served_fast(aiohttp_client, base_url(upstream))
    assert (await client.get(LIST, headers=AUTH)).headers["X-Cache"] == "MISS"
    await asyncio.sleep(0.05)
    before = len(asyncio.all_tasks())
    known = set(connections_of(client))
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for _ in range(3):
        writer.write(request_bytes(LIST))
        assert (await read_answer(reader)).headers["x-cache"] == "HIT"
    await asyncio.sleep(0.05)
    assert len(asyncio.all_tasks()) == before, "hits alone: no task of aiohttp's"
    assert set(connections_of(client)) == known, "hits alone: no handler of aiohttp's"
    (opening,) = fast_server(client).opening
    assert opening.transport is not None
    sock = opening.transport.get_extra_info("socket")
    assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 0
    writer.write(request_bytes("/no-such-route"))
    assert (await read_answer(reader)).status_line == "HTTP/1.1 404 Not Found"
    await asyncio.sleep(0.05)
    assert len(asyncio.all_tasks()) == before + 1, "aiohttp's, waiting for the next request"
    assert fast_server(client).opening == []
    (connection,) = set(connections_of(client)) - known
    assert connection.transport.get_extra_info("socket").fileno() == sock.fileno()
    assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) != 0
    writer.write(request_bytes(LIST))
    assert (await read_answer(reader)).headers["x-cache"] == "HIT"
    writer.close()
    await writer.wait_closed()


def connections_of(client: Client) -> list[Any]:
    """The server's open connections aiohttp has a handler of."""
    return [c for c in fast_server(client).connections if c.transport is not None]


def fast_server(client: Client) -> FastPathServer:
    runner = client.server.runner
    assert runner is not None
    assert isinstance(runner.server, FastPathServer)
    return runner.server
