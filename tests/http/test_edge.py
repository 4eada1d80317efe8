"""What the edge (gateway/http/edge.py) answers before any route's own work, as a client
sees it on the wire, whichever way the gateway is served (ids [fast]/[plain]): the
``Expect`` field (only ``100-continue`` is met; anything else is a 417 problem), a
request line of a version the gateway does not speak (a 505 problem, the connection
closed), and header fields of bytes that are not ASCII (never a 500). Every answer
carries its request id and is counted and logged like any other.
"""

from __future__ import annotations

import asyncio
import logging

import orjson
import pytest
from aiohttp.test_utils import TestServer

from ..conftest import TOKEN, GatewayFactory, base_url
from ..ops.test_metrics import Scrape
from .test_wire import continued, exchange, send_and_read_all, upstream_calls

PROBLEM = "urn:records-gateway:problem:"


def head(target: str, *fields: bytes, method: str = "GET", version: str = "1.1") -> bytes:
    """A request head with a Host, the token and ``fields`` as raw lines."""
    lines = [
        f"{method} {target} HTTP/{version}".encode(),
        b"Host: g",
        f"Authorization: Bearer {TOKEN}".encode(),
        *fields,
    ]
    return b"\r\n".join(lines) + b"\r\n\r\n"


@pytest.mark.parametrize(
    "value",
    [b"\xff", b"foo", b"100-continue, foo", b"100-continue;x=1", b"\xc3\xa9"],
    ids=["not-utf-8", "unknown", "one-of-two", "with-parameter", "non-ascii"],
)
@pytest.mark.parametrize(
    "target",
    ["/users", "/accounts/ACC-002", "/nowhere", "/use%0d%0ars", "*"],
    ids=["list-route", "id-route", "unknown-path", "line-feed-in-path", "asterisk"],
)
async def test_an_expectation_other_than_100_continue_is_a_417_problem(
    gateway_factory: GatewayFactory,
    upstream: TestServer,
    caplog: pytest.LogCaptureFixture,
    value: bytes,
    target: str,
) -> None:
    """Whatever the route (or none): a 417 problem with the caller's request id,
    nothing sent upstream, counted and access-logged; the connection stays open for
    the next request. (aiohttp's own answer: plain text, and a 500 with a traceback
    when the field is not UTF-8.)"""
    client = await gateway_factory(base_url(upstream))
    port = client.port
    assert port is not None
    calls = upstream_calls(upstream)
    caplog.set_level(logging.INFO, logger="gateway.access")
    method = "OPTIONS" if target == "*" else "GET"
    expecting = head(target, b"Expect: " + value, b"X-Request-ID: expecting-1", method=method)
    answer, after = await exchange(port, expecting, head("/healthz"))
    assert answer.status_line == "HTTP/1.1 417 Expectation Failed"
    assert answer.headers["content-type"] == "application/problem+json"
    assert answer.headers["x-request-id"] == "expecting-1"
    body = orjson.loads(answer.body)
    assert body["type"] == PROBLEM + "expectation-failed"
    assert (body["status"], body["requestId"]) == (417, "expecting-1")
    assert after.status_line == "HTTP/1.1 200 OK"
    assert upstream_calls(upstream) == calls
    assert [
        record.__dict__["status"]
        for record in caplog.records
        if record.name == "gateway.access" and record.__dict__["request_id"] == "expecting-1"
    ] == [417]
    scrape = Scrape(await (await client.get("/metrics")).text())
    counted = scrape.series("gateway_requests_total", "route", "cache")
    assert counted[frozenset({("status", "417")})] == 1
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_417_to_a_request_that_announces_a_body_closes_the_connection(
    gateway_factory: GatewayFactory, upstream: TestServer
) -> None:
    """Whether a body follows is the caller's choice once it is refused: no next request
    could be told from it, so the 417 says the connection closes (aiohttp then reads
    what body comes for a while, and closes)."""
    client = await gateway_factory(base_url(upstream))
    port = client.port
    assert port is not None
    data = head("/users", b"Expect: foo", b"Content-Length: 5", method="POST")
    (answer,) = await exchange(port, data)
    assert answer.status_line == "HTTP/1.1 417 Expectation Failed"
    assert answer.headers["connection"] == "close"
    (kept,) = await exchange(port, head("/users", b"Expect: foo"))
    assert "connection" not in kept.headers  # no body announced: the connection is kept


UPGRADES = {
    "foo": (b"Upgrade: foo", b"Connection: upgrade"),
    "h2c": (b"Upgrade: h2c", b"Connection: Upgrade, HTTP2-Settings", b"HTTP2-Settings: AAMAAABk"),
    "websocket": (
        b"Upgrade: websocket",
        b"Connection: keep-alive, Upgrade",
        b"Sec-WebSocket-Version: 13",
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
    ),
}


@pytest.mark.parametrize("fields", UPGRADES.values(), ids=UPGRADES.keys())
@pytest.mark.parametrize("target", ["/users", "/nowhere"])
async def test_an_upgrade_the_gateway_does_not_take_is_answered_and_its_connection_closed(
    gateway_factory: GatewayFactory, upstream: TestServer, fields: tuple[bytes, ...], target: str
) -> None:
    """A request asking to switch protocols, with two requests pipelined behind it in
    the same write: the gateway takes no upgrade, so it answers the request as HTTP/1.1
    with ``Connection: close`` and closes the connection at once, whatever the route
    (or none) and whether its answer is held in the cache. Nothing behind it is lost
    to a connection left open: the caller sees the close and sends them again.
    (aiohttp's parser drops what follows the upgrade request in the same read, and
    the connection then waits for the keep-alive timeout.)"""
    client = await gateway_factory(base_url(upstream))
    port = client.port
    assert port is not None
    assert (await exchange(port, head("/users")))[0].headers["x-cache"] == "MISS"
    data = head(target, b"X-Request-ID: switching", *fields)
    data += head("/users", b"X-Request-ID: behind-1") + head("/nowhere", b"X-Request-ID: behind-2")
    (answer,), rest = await send_and_read_all(port, data, 1)
    status = "200 OK" if target == "/users" else "404 Not Found"
    assert answer.status_line == f"HTTP/1.1 {status}"
    assert answer.headers["x-request-id"] == "switching"
    assert answer.headers["connection"] == "close"
    assert rest == b"", "closed after the answer to the upgrade request"


@pytest.mark.parametrize("malformed", [False, True], ids=["valid-behind", "malformed-behind"])
async def test_a_connect_is_answered_and_its_connection_closed(
    gateway_factory: GatewayFactory, upstream: TestServer, malformed: bool
) -> None:
    """``CONNECT host:port`` with requests pipelined behind it in the same write (a
    malformed one among them or not): the gateway tunnels nothing, so the CONNECT gets
    its 404 problem with ``Connection: close`` and the connection closes at once;
    nothing behind it waits on an open connection, unanswered. (aiohttp's parser takes
    a CONNECT as an upgrade and drops what follows it in the same read.)"""
    client = await gateway_factory(base_url(upstream))
    port = client.port
    assert port is not None
    data = head("example.com:443", b"X-Request-ID: tunnel", method="CONNECT")
    data += head("/users", b"X-Request-ID: behind-1")
    if malformed:
        data += b"GET /users HTTP/1.1\r\nHost: g\r\nBad Header\r\n\r\n"
    data += head("/nowhere", b"X-Request-ID: behind-2")
    (answer,), rest = await send_and_read_all(port, data, 1)
    assert answer.status_line == "HTTP/1.1 404 Not Found"
    assert answer.headers["x-request-id"] == "tunnel"
    assert answer.headers["connection"] == "close"
    assert rest == b"", "closed after the answer to the CONNECT"


async def test_an_upgrade_field_without_connection_upgrade_keeps_the_connection(
    gateway_factory: GatewayFactory, upstream: TestServer
) -> None:
    """``Upgrade`` not named in ``Connection`` asks for nothing (RFC 9110 7.8): the
    request and the ones pipelined behind it are all answered, the connection kept."""
    client = await gateway_factory(base_url(upstream))
    port = client.port
    assert port is not None
    answers = await exchange(
        port,
        head("/users", b"Upgrade: h2c", b"X-Request-ID: plain-1"),
        head("/nowhere", b"X-Request-ID: plain-2"),
        head("/users", b"X-Request-ID: plain-3"),
    )
    assert [a.headers["x-request-id"] for a in answers] == ["plain-1", "plain-2", "plain-3"]
    assert [a.status_line for a in answers] == [
        "HTTP/1.1 200 OK",
        "HTTP/1.1 404 Not Found",
        "HTTP/1.1 200 OK",
    ]
    assert all("connection" not in a.headers for a in answers)


@pytest.mark.parametrize("value", [b"100-continue", b"100-CONTINUE", b"100-continue, "])
async def test_100_continue_is_met_on_http_1_1_and_passed_over_on_http_1_0(
    gateway_factory: GatewayFactory, upstream: TestServer, value: bytes
) -> None:
    """HTTP/1.1: the interim 100, then the answer. HTTP/1.0 has no interim answers
    (RFC 9110 10.1.1): the answer alone."""
    client = await gateway_factory(base_url(upstream))
    port = client.port
    assert port is not None
    interim, answer = await continued(port, head("/users", b"Expect: " + value))
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert answer.status_line == "HTTP/1.1 200 OK"
    (old,), rest = await send_and_read_all(
        port, head("/users", b"Expect: " + value, version="1.0"), 1
    )
    assert old.status_line == "HTTP/1.0 200 OK"
    assert old.body == answer.body
    assert rest == b""


async def test_a_caller_gone_before_its_100_continue_is_not_an_error_in_the_log(
    gateway_factory: GatewayFactory, upstream: TestServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A caller that asks for 100-continue (with a body announced) and closes at once:
    the interim answer cannot be written, and nothing is logged at error level (else
    anyone could fill the error log)."""
    caplog.set_level(logging.INFO)
    client = await gateway_factory(base_url(upstream))
    port = client.port
    assert port is not None
    for _ in range(20):
        _reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(head("/users", b"Expect: 100-continue", b"Content-Length: 5"))
        writer.transport.abort()
    await asyncio.sleep(0.3)  # (the gateway reads the requests and meets the closed sockets)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert (await client.get("/users", headers={"Authorization": f"Bearer {TOKEN}"})).status == 200


@pytest.mark.parametrize("version", ["0.9", "2.0"])
@pytest.mark.parametrize("target", ["/users", "/nowhere"])
async def test_a_request_line_of_another_version_is_a_505_problem_and_the_connection_closes(
    gateway_factory: GatewayFactory, upstream: TestServer, version: str, target: str
) -> None:
    """The versions aiohttp's parser reads besides HTTP/1.x (it refuses the others
    itself, with a 400), even for an answer held in the cache: a 505 problem, nothing
    served, nothing sent upstream, and the connection closed; an Expect field does not
    change it. The status line is HTTP/1.1's (aiohttp's own would echo the request's
    version: ``HTTP/2.0 505``)."""
    client = await gateway_factory(base_url(upstream))
    port = client.port
    assert port is not None
    assert (await exchange(port, head("/users")))[0].headers["x-cache"] == "MISS"
    calls = upstream_calls(upstream)
    for extra in ((), (b"Expect: foo",)):
        data = head(target, b"X-Request-ID: versioned-1", *extra, version=version)
        (answer,), rest = await send_and_read_all(port, data, 1)
        # HTTP/1.1, the version the gateway speaks: not the request's, which the
        # caller cannot read an answer in (HTTP/0.9 has no status line, HTTP/2 no text)
        assert answer.status_line == "HTTP/1.1 505 HTTP Version Not Supported"
        assert answer.headers["connection"] == "close"
        assert answer.headers["content-type"] == "application/problem+json"
        assert answer.headers["x-request-id"] == "versioned-1"
        body = orjson.loads(answer.body)
        assert body["type"] == PROBLEM + "http-version-not-supported"
        assert f"HTTP/{version}" in body["detail"]
        assert "x-cache" not in answer.headers
        assert rest == b"", "closed after the 505"
    assert upstream_calls(upstream) == calls


@pytest.mark.parametrize(
    "name",
    [
        b"Authorization",
        b"Cache-Control",
        b"Pragma",
        b"X-Request-ID",
        b"Host",
        b"If-None-Match",
        b"Accept",
        b"Expect",
        b"Connection",
        b"Cookie",
        b"X-Other",
    ],
)
async def test_bytes_that_are_not_ascii_in_any_header_never_make_a_500(
    gateway_factory: GatewayFactory, upstream: TestServer, fast_path: bool, name: bytes
) -> None:
    """A field given (again) with bytes that are not ASCII, or not UTF-8, on any kind
    of route: some answer that is not a 500, with a request id, and a problem when it
    is an error (served as plain aiohttp, a request its parser rejects gets aiohttp's
    own 400, as docs/errors.md says)."""
    client = await gateway_factory(base_url(upstream))
    port = client.port
    assert port is not None
    for value in (b"\xff", b"Bearer " + TOKEN.encode() + b"\xff", b"Bearer t\xc3\xa9"):
        for target in ("/users", "/accounts/ACC-002", "/nowhere"):
            lines = [f"GET {target} HTTP/1.1".encode(), b"Host: g", name + b": " + value]
            if name != b"Authorization":
                lines.insert(2, f"Authorization: Bearer {TOKEN}".encode())
            (answer,) = await exchange(port, b"\r\n".join(lines) + b"\r\n\r\n")
            status = int(answer.status_line.split(" ")[1])
            assert status < 500, (value, target, answer)
            if answer.status_line == "HTTP/1.0 400 Bad Request" and not fast_path:
                continue  # aiohttp's parser refused it, and answered itself
            assert answer.headers["x-request-id"], (value, target)
            if status >= 400:
                assert answer.headers["content-type"] == "application/problem+json"
                assert orjson.loads(answer.body)["status"] == status
