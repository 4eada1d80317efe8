"""What a client sees on the wire, whichever way the gateway is served: with the fast
path (``server.fast_path`` on: a fresh hit on a plain kept-alive GET answered from the
connection's bytes, gateway.fastpath.connection) and as plain aiohttp. Every test that
serves a gateway here runs both ways (the ``fast_path`` fixture, ids [fast]/[plain]).

It holds the two to the same answers, byte for byte where the framing is concerned:
a hit carries exactly the fields aiohttp sends for the same reply; pipelined requests
each get a whole answer with their own request id, in request order, whichever way
each is answered; what the bytes would not fit (HEAD, HTTP/1.0, ``Connection:
close``, a 304) is aiohttp's own answer; a hit is only ever for the token that asked
and never survives a purge; a connection closes when idle, not while busy; heads over
the connection's limits and heads aiohttp's parser refuses are refused at once; and a
path gets the answer of the route aiohttp's router gives it.

Where the two ways differ for the client (which way wrote an answer, a parser's
refusal as a problem), a test asks for the ``fast_path`` fixture; what is the fast
path's alone is in tests/fastpath/test_connection.py.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer, make_mocked_request
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict
from pytest_aiohttp import AiohttpClient, AiohttpServer
from yarl import URL

from gateway.demo import REQUEST_LOG, create_demo_app
from gateway.http.app import create_app
from gateway.http.binding import UPSTREAMS
from gateway.http.hits import PlainHits
from gateway.http.unrouted import Unrouted
from gateway.ops.logs import MalformedRequestFilter
from gateway.process.listener import listen
from gateway.records.routes import encode_segment
from gateway.routing.standard import ROUTES

from ..conftest import (
    AUTH,
    TOKEN,
    GatewayFactory,
    GatewayTestServer,
    base_url,
    make_settings,
)
from ..ops.test_metrics import Scrape
from ..profiles import examples

ADMIN = "admin-token-0123456789abcdef"

LIST = "/expenses?limit=5"  # a plain path: the fast path may answer its hits
ACCOUNT = "/accounts/Caja%20chica%20Bogot%C3%A1"  # an id with escapes

# RFC 9110 IMF-fixdate, as aiohttp writes it
IMF_FIXDATE = r"(Mon|Tue|Wed|Thu|Fri|Sat|Sun), \d\d [A-Z][a-z]{2} \d{4} \d\d:\d\d:\d\d GMT"

Client = TestClient[web.Request, web.Application]


@dataclass
class Answer:
    status_line: str
    fields: list[tuple[str, str]]  # as sent, in order, names lower-cased
    body: bytes

    @property
    def headers(self) -> CIMultiDict[str]:
        return CIMultiDict(self.fields)

    def comparable(self) -> list[tuple[str, str]]:
        """The fields, sorted, with the values that differ per request blanked."""
        return sorted((n, "*" if n in ("date", "x-request-id") else v) for n, v in self.fields)


async def read_answer(reader: asyncio.StreamReader, *, head: bool = False) -> Answer:
    """One HTTP/1.x answer, parsed strictly: CRLF lines, one ``name: value`` per
    field, the body exactly ``Content-Length`` bytes (none after a HEAD, or when
    there is no ``Content-Length``: a 304)."""
    block = await reader.readuntil(b"\r\n\r\n")
    status_line, *lines = block[:-4].decode("latin-1").split("\r\n")
    fields = []
    for line in lines:
        name, sep, value = line.partition(": ")
        assert sep, line
        assert (name, value) == (name.strip(), value.strip()), line
        fields.append((name.lower(), value))
    answer = Answer(status_line, fields, b"")
    length = answer.headers.get("content-length")
    if not head and length is not None:
        answer.body = await reader.readexactly(int(length))
    return answer


def request_bytes(path: str, *, method: str = "GET", version: str = "1.1", **headers: str) -> bytes:
    lines = [f"{method} {path} HTTP/{version}", "Host: gateway", f"Authorization: Bearer {TOKEN}"]
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def continued(port: int, request: bytes) -> tuple[bytes, Answer]:
    """Send ``request`` (with ``Expect: 100-continue``) on a connection of its own; its
    interim answer's bytes and its answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    async with asyncio.timeout(10):
        interim = await reader.readuntil(b"\r\n\r\n")
        answer = await read_answer(reader)
    writer.close()
    await writer.wait_closed()
    return interim, answer


async def exchange(port: int, *requests: bytes, head: bool = False) -> list[Answer]:
    """Send ``requests`` in one write on one connection; read an answer to each."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"".join(requests))
    async with asyncio.timeout(10):  # a wrong Content-Length would leave it waiting
        answers = [await read_answer(reader, head=head) for _ in requests]
    writer.close()
    await writer.wait_closed()
    return answers


async def read_all(reader: asyncio.StreamReader, count: int) -> tuple[list[Answer], bytes]:
    """``count`` answers, then whatever comes until the gateway closes (b"" if it
    does so at once)."""
    async with asyncio.timeout(10):  # guards against a hang only
        answers = [await read_answer(reader) for _ in range(count)]
        return answers, await reader.read()


async def send_and_read_all(port: int, data: bytes, count: int) -> tuple[list[Answer], bytes]:
    """``data`` sent on a new connection: ``count`` answers and what follows them
    until the gateway closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    try:
        return await read_all(reader, count)
    finally:
        writer.close()
        await writer.wait_closed()


def count_full_reads(app: web.Application, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many requests reach the pipeline's ``read`` (through aiohttp's router and a
    route's handler); a hit answered from the connection's bytes does not."""
    pipeline = app[UPSTREAMS].current.pipeline
    read = pipeline.read
    counted = [0]

    async def counting(*args: Any, **kwargs: Any) -> Any:
        counted[0] += 1
        return await read(*args, **kwargs)

    monkeypatch.setattr(pipeline, "read", counting)
    return counted


def count_server_hits(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many hits the gateway's server answers (``gateway.http.hits``): ahead of
    aiohttp's router, but not from the connection's bytes."""
    answer = PlainHits._answer
    counted = [0]

    def counting(self: PlainHits, *args: Any) -> Any:
        counted[0] += 1
        return answer(self, *args)

    monkeypatch.setattr(PlainHits, "_answer", counting)
    return counted


def upstream_calls(upstream: TestServer) -> int:
    return len(upstream.app[REQUEST_LOG].entries)


def filter_parser_log(monkeypatch: pytest.MonkeyPatch) -> None:
    """aiohttp's server log with the filter the gateway installs (gateway.ops.logs):
    what aiohttp logs of a request its parser rejects quotes no line of it."""
    server_log = logging.getLogger("aiohttp.server")
    monkeypatch.setattr(server_log, "filters", [MalformedRequestFilter()])


@pytest.fixture
async def served(
    gateway_factory: GatewayFactory, upstream: TestServer
) -> tuple[web.Application, int]:
    """A gateway (memory cache) with LIST and ACCOUNT stored: from then on both are
    hits. Its app and port."""
    client = await gateway_factory(base_url(upstream))
    for path in (LIST, ACCOUNT):
        response = await client.get(path, headers=AUTH)
        assert response.headers["X-Cache"] == "MISS"
    port = client.port
    assert port is not None
    return client.app, port


@pytest.mark.parametrize("path", [LIST, ACCOUNT])
async def test_a_hit_carries_exactly_the_fields_aiohttp_sends_for_the_same_reply(
    served: tuple[web.Application, int],
    monkeypatch: pytest.MonkeyPatch,
    upstream: TestServer,
    fast_path: bool,
    path: str,
) -> None:
    """Three hits on one entry: a plain GET (the fast path's to answer from the bytes,
    escapes in the id or not), the same with a Cache-Control the gateway ignores
    (always aiohttp's router and the route's handler), pipelined behind it so that
    the first's framing must be exact, and the same over HTTP/1.0."""
    app, port = served
    full_reads = count_full_reads(app, monkeypatch)
    calls = upstream_calls(upstream)
    first, full = await exchange(
        port, request_bytes(path), request_bytes(path, Cache_Control="max-age=60")
    )
    (own,) = await exchange(port, request_bytes(path, version="1.0", Cache_Control="max-age=60"))
    from_the_bytes = fast_path
    # the plain GET is a hit either way: from the bytes, or by the gateway's server
    assert full_reads == [2]
    assert upstream_calls(upstream) == calls
    assert first.status_line == full.status_line == "HTTP/1.1 200 OK"
    assert own.status_line == "HTTP/1.0 200 OK"
    assert first.body == full.body == own.body
    assert first.comparable() == full.comparable() == own.comparable()
    assert first.headers["x-cache"] == full.headers["x-cache"] == "HIT"
    assert first.headers["content-length"] == str(len(first.body))
    assert first.headers["x-request-id"] != full.headers["x-request-id"]
    assert "connection" not in first.headers
    for answer in (first, full, own):
        assert re.fullmatch(IMF_FIXDATE, answer.headers["date"])
    # which way wrote each: the fast path's bytes end with the request id, aiohttp's
    # own answer with the fields it adds (Content-Length, Date, Server)
    assert (first.fields[-1][0] == "x-request-id") == from_the_bytes
    assert full.fields[-1][0] != "x-request-id"
    assert own.fields[-1][0] != "x-request-id"


async def test_a_reply_with_caching_off_has_the_same_fields_however_it_is_framed(
    gateway_factory: GatewayFactory, upstream: TestServer
) -> None:
    """Caching off: every answer is the pipeline's, from the upstream; pipelined,
    over HTTP/1.0 or with ``Connection: close``, the same fields."""
    client = await gateway_factory(base_url(upstream), cache={"backend": "none"})
    port = client.port
    assert port is not None
    calls = upstream_calls(upstream)
    first, second = await exchange(port, request_bytes(LIST), request_bytes(ACCOUNT))
    (own,) = await exchange(port, request_bytes(LIST, version="1.0"))
    (closing,) = await exchange(port, request_bytes(LIST, Connection="close"))
    assert upstream_calls(upstream) == calls + 4, "each went upstream"
    assert first.status_line == second.status_line == closing.status_line == "HTTP/1.1 200 OK"
    assert own.status_line == "HTTP/1.0 200 OK"
    assert first.body == own.body == closing.body
    assert orjson.loads(second.body)["id"] == "Caja chica Bogotá"
    assert first.comparable() == own.comparable()
    assert [name for name, _ in first.fields] == [name for name, _ in own.fields]  # in order
    assert [field for field in first.comparable() if field[0] != "connection"] == [
        field for field in closing.comparable() if field[0] != "connection"
    ]
    assert first.headers["x-cache"] == "BYPASS"
    assert first.headers["cache-status"] == "records-gateway; fwd=bypass"
    assert first.headers["content-length"] == str(len(first.body))
    assert first.headers["content-type"] == "application/json"
    assert re.fullmatch(r'"[0-9a-f]{32}"', first.headers["etag"])
    assert first.headers["x-request-id"] != second.headers["x-request-id"]
    assert "connection" not in first.headers
    assert closing.headers["connection"] == "close"


async def test_a_miss_has_the_same_fields_over_http_1_1_and_http_1_0(
    gateway_factory: GatewayFactory, upstream: TestServer
) -> None:
    """Caching on: a kept-alive HTTP/1.1 miss and an HTTP/1.0 miss are both MISS and
    stored, with the same fields in the same order; the next is a hit on the first."""
    client = await gateway_factory(base_url(upstream))
    port = client.port
    assert port is not None
    (kept,) = await exchange(port, request_bytes("/expenses?limit=3"))
    (own,) = await exchange(port, request_bytes("/expenses?limit=4", version="1.0"))
    (hit,) = await exchange(port, request_bytes("/expenses?limit=3"))
    assert kept.status_line == "HTTP/1.1 200 OK"
    assert own.status_line == "HTTP/1.0 200 OK"
    assert [name for name, _ in kept.fields] == [name for name, _ in own.fields]
    for answer in (kept, own):
        assert answer.headers["x-cache"] == "MISS"
        assert answer.headers["cache-status"] == "records-gateway; fwd=miss; stored"
        assert answer.headers["content-length"] == str(len(answer.body))
    assert len(orjson.loads(kept.body)["data"]) == 3
    assert len(orjson.loads(own.body)["data"]) == 4
    assert (hit.headers["x-cache"], hit.body, hit.headers["etag"]) == (
        "HIT",
        kept.body,
        kept.headers["etag"],
    )


async def test_pipelined_hits_each_get_a_whole_answer_and_their_own_request_id(
    served: tuple[web.Application, int],
) -> None:
    _, port = served
    answers = await exchange(
        port,
        request_bytes(LIST),
        request_bytes(ACCOUNT, X_Request_ID="caller-id-1"),
        request_bytes(LIST),
    )
    assert [a.headers["x-cache"] for a in answers] == ["HIT"] * 3
    assert answers[0].body == answers[2].body != answers[1].body
    ids = [a.headers["x-request-id"] for a in answers]
    assert ids[1] == "caller-id-1"
    assert len(set(ids)) == 3


@pytest.mark.parametrize(
    ("request_", "status_line", "connection"),
    [
        (request_bytes(LIST, version="1.0"), "HTTP/1.0 200 OK", None),
        (request_bytes(LIST, Connection="close"), "HTTP/1.1 200 OK", "close"),
        (request_bytes(ACCOUNT, version="1.0"), "HTTP/1.0 200 OK", None),
    ],
    ids=["http-1.0", "connection-close", "http-1.0-escaped-path"],
)
async def test_a_hit_the_bytes_would_not_fit_is_aiohttp_s_own_answer(
    served: tuple[web.Application, int],
    upstream: TestServer,
    request_: bytes,
    status_line: str,
    connection: str | None,
) -> None:
    """HTTP/1.0 or ``Connection: close``: still a hit (no upstream call), answered the
    way aiohttp answers such a request, and the connection closed after it."""
    _, port = served
    calls = upstream_calls(upstream)
    (answer,), rest = await send_and_read_all(port, request_, 1)
    assert rest == b"", "the gateway closed the connection"
    assert upstream_calls(upstream) == calls
    assert answer.status_line == status_line
    assert answer.headers["x-cache"] == "HIT"
    assert answer.headers.get("connection") == connection
    assert len(answer.body) == int(answer.headers["content-length"]) > 0


async def test_a_hit_asked_with_connection_close_is_answered_alike_then_the_connection_closes(
    served: tuple[web.Application, int],
    monkeypatch: pytest.MonkeyPatch,
    upstream: TestServer,
    fast_path: bool,
) -> None:
    """A caller that opens a connection per request (``Connection: close``): its hit,
    with the fields of a kept-alive hit's answer and ``Connection: close``, from the
    bytes with the fast path; then the connection closes."""
    app, port = served
    (kept,) = await exchange(port, request_bytes(LIST))
    full_reads = count_full_reads(app, monkeypatch)
    calls = upstream_calls(upstream)
    data = request_bytes(LIST, Connection="close")
    (answer,), rest = await send_and_read_all(port, data, 1)
    assert rest == b"", "closed after the answer"
    assert answer.status_line == "HTTP/1.1 200 OK"
    assert answer.body == kept.body
    assert answer.comparable() == sorted([*kept.comparable(), ("connection", "close")])
    assert full_reads == [0], "a hit either way: from the bytes, or by the gateway's server"
    assert upstream_calls(upstream) == calls


async def test_a_body_that_does_not_decode_is_a_warning_not_an_error(
    served: tuple[web.Application, int],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A GET with ``Content-Encoding: gzip`` on bytes that are not gzip: the request is
    answered (its body means nothing to a GET), the connection closes after it, and
    aiohttp's complaint about the body is logged as the malformed request it is, a
    warning without a traceback, never an unhandled error."""
    filter_parser_log(monkeypatch)
    caplog.set_level(logging.DEBUG, logger="aiohttp.server")
    _, port = served
    raw = request_bytes(LIST, Content_Encoding="gzip", Content_Length="5") + b"hello"
    (answer,), rest = await send_and_read_all(port, raw, 1)
    assert answer.status_line == "HTTP/1.1 200 OK"
    assert answer.headers["x-cache"] == "HIT"
    assert rest == b"", "closed after it"
    server_records = [r for r in caplog.records if r.name == "aiohttp.server"]
    assert [r.levelname for r in server_records if r.levelno >= logging.ERROR] == []
    assert [r.getMessage() for r in server_records if r.levelno == logging.WARNING] == [
        "rejected a malformed HTTP request (ContentEncodingError)"
    ]
    assert all(r.exc_info is None for r in server_records)


@pytest.mark.parametrize("path", [LIST, ACCOUNT])
async def test_a_head_on_a_hit_has_the_fields_and_no_body(
    served: tuple[web.Application, int], upstream: TestServer, path: str
) -> None:
    """A HEAD and a GET behind it on one connection: the HEAD's answer has the GET's
    fields (its Content-Length too) and no body, so the GET's answer follows at once;
    and the fields of a GET alone on a connection (the fast path's to answer from the
    bytes, when it is on and the path has no escape)."""
    _, port = served
    calls = upstream_calls(upstream)
    (alone,) = await exchange(port, request_bytes(path))
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request_bytes(path, method="HEAD") + request_bytes(path))
    async with asyncio.timeout(10):
        head = await read_answer(reader, head=True)
        get = await read_answer(reader)
    writer.close()
    await writer.wait_closed()
    assert head.status_line == get.status_line == "HTTP/1.1 200 OK"
    assert head.headers["x-cache"] == get.headers["x-cache"] == "HIT"
    assert head.comparable() == get.comparable() == alone.comparable()
    assert int(get.headers["content-length"]) == len(get.body) > 0
    assert get.body.startswith(b"{")  # the GET's answer began right after the HEAD's head
    assert upstream_calls(upstream) == calls


@pytest.mark.parametrize("path", [LIST, ACCOUNT])
async def test_a_hit_named_by_if_none_match_is_a_304_with_the_200_s_fields(
    served: tuple[web.Application, int], upstream: TestServer, path: str
) -> None:
    """``If-None-Match`` with the entry's ETag: aiohttp's 304, with the 200's fields
    less Content-Type and Content-Length, and no body; the GET behind it on the same
    connection gets its whole 200."""
    _, port = served
    (ok,) = await exchange(port, request_bytes(path))
    calls = upstream_calls(upstream)
    etag = ok.headers["etag"]
    not_modified, again = await exchange(
        port, request_bytes(path, If_None_Match=etag), request_bytes(path)
    )
    assert not_modified.status_line == "HTTP/1.1 304 Not Modified"
    assert not_modified.body == b""
    assert not_modified.comparable() == [
        field for field in ok.comparable() if field[0] not in ("content-type", "content-length")
    ]
    assert again.status_line == "HTTP/1.1 200 OK"
    assert (again.body, again.headers["etag"]) == (ok.body, etag)
    assert upstream_calls(upstream) == calls


async def test_conditional_hits_are_answered_alike_and_from_the_bytes_with_the_fast_path(
    served: tuple[web.Application, int],
    monkeypatch: pytest.MonkeyPatch,
    upstream: TestServer,
    fast_path: bool,
) -> None:
    """Pooled callers' HTTP caches send ``If-None-Match``: an ETag list naming the
    entry's and ``*`` are 304s, another ETag the 200; with the fast path all three are
    answered from the bytes (no full read), and the 304s are counted and logged as
    304 hits either way (docs/caching.md, "A token the upstream refuses")."""
    app, port = served
    (ok,) = await exchange(port, request_bytes(LIST))
    etag = ok.headers["etag"]
    full_reads = count_full_reads(app, monkeypatch)
    calls = upstream_calls(upstream)
    named, star, other = await exchange(
        port,
        request_bytes(LIST, If_None_Match=f'"other", W/{etag}', X_Request_ID="c-1"),
        request_bytes(LIST, If_None_Match="*", X_Request_ID="c-2"),
        request_bytes(LIST, If_None_Match='"other"', X_Request_ID="c-3"),
    )
    assert [a.status_line for a in (named, star, other)] == [
        "HTTP/1.1 304 Not Modified",
        "HTTP/1.1 304 Not Modified",
        "HTTP/1.1 200 OK",
    ]
    assert [a.headers["x-request-id"] for a in (named, star, other)] == ["c-1", "c-2", "c-3"]
    assert named.body == star.body == b""
    assert named.comparable() == star.comparable()
    assert other.comparable() == ok.comparable()
    assert other.body == ok.body
    assert full_reads == [0], "all three hits, from the bytes or by the gateway's server"
    assert upstream_calls(upstream) == calls
    client_metrics = await _metrics(port)
    counted = client_metrics.series("gateway_requests_total", "route")
    assert counted[frozenset({("status", "304"), ("cache", "hit")})] == 2


async def _metrics(port: int) -> Scrape:
    (answer,) = await exchange(port, b"GET /metrics HTTP/1.1\r\nHost: gw\r\n\r\n")
    return Scrape(answer.body.decode())


async def test_a_hit_asked_with_expect_100_continue_gets_aiohttp_s_100_first(
    served: tuple[web.Application, int],
) -> None:
    """The router's expect handler answers ``Expect: 100-continue`` before the route's;
    the hit follows, with the fields of a plain GET's."""
    _, port = served
    (plain,) = await exchange(port, request_bytes(LIST))
    interim, answer = await continued(port, request_bytes(LIST, Expect="100-continue"))
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert answer.status_line == "HTTP/1.1 200 OK"
    assert answer.headers["x-cache"] == "HIT"
    assert answer.body == plain.body
    assert answer.comparable() == plain.comparable()


def split_in_two(request: bytes) -> tuple[bytes, bytes]:
    middle = len(request) // 2
    return request[:middle], request[middle:]


async def test_a_head_that_arrives_in_pieces_is_answered_once_whole(
    served: tuple[web.Application, int], monkeypatch: pytest.MonkeyPatch, fast_path: bool
) -> None:
    app, port = served
    full_reads = count_full_reads(app, monkeypatch)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    async with asyncio.timeout(10):
        for piece in (*split_in_two(request_bytes(LIST)), b"GET /expenses?limit=5 HTTP/1.1\r"):
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0.05)  # separate segments, separate data_received calls
        writer.write(f"\nHost: gw\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode())
        answers = [await read_answer(reader), await read_answer(reader)]
    writer.close()
    await writer.wait_closed()
    assert [a.headers["x-cache"] for a in answers] == ["HIT", "HIT"]
    assert answers[0].body == answers[1].body
    assert full_reads == [0], "both hits, from the bytes or by the gateway's server"


async def test_answers_keep_the_order_of_requests_whichever_way_each_is_answered(
    served: tuple[web.Application, int], monkeypatch: pytest.MonkeyPatch, fast_path: bool
) -> None:
    """A hit behind a miss waits for it; a request with a body hands the connection
    to aiohttp, and the hits behind it are still answered, in order."""
    app, port = served
    full_reads = count_full_reads(app, monkeypatch)
    post = b"POST /expenses HTTP/1.1\r\nHost: gw\r\nContent-Length: 5\r\n\r\nhello"
    answers = await exchange(
        port,
        request_bytes(LIST, X_Request_ID="r-1"),
        request_bytes("/expenses?limit=6", X_Request_ID="r-2"),  # not cached yet
        request_bytes(LIST, X_Request_ID="r-3"),
        post,
        request_bytes(LIST, X_Request_ID="r-5"),
        request_bytes("/expenses?limit=6", X_Request_ID="r-6"),
    )
    assert [a.status_line for a in answers] == [
        *["HTTP/1.1 200 OK"] * 3,
        "HTTP/1.1 405 Method Not Allowed",
        *["HTTP/1.1 200 OK"] * 2,
    ]
    assert [a.headers.get("x-cache") for a in answers] == [
        "HIT",
        "MISS",
        "HIT",
        None,
        "HIT",
        "HIT",
    ]
    ids = [a.headers["x-request-id"] for a in answers]
    assert ids[:3] == ["r-1", "r-2", "r-3"]
    assert ids[4:] == ["r-5", "r-6"]
    assert answers[0].body == answers[2].body == answers[4].body != answers[1].body
    assert answers[1].body == answers[5].body
    # the miss alone takes the full way: the hits are the fast path's or the server's
    assert full_reads == [1]


async def test_a_hit_is_only_ever_for_the_token_that_asked(
    served: tuple[web.Application, int], upstream: TestServer
) -> None:
    """One connection, two tokens: the second token's identical request is not
    answered from the first's entry, and the first's are hits again after it."""
    _, port = served
    calls = upstream_calls(upstream)
    other = request_bytes(LIST).replace(TOKEN.encode(), b"someone-else-token")
    answers = await exchange(port, request_bytes(LIST), other, request_bytes(LIST))
    assert [a.status_line for a in answers] == [
        "HTTP/1.1 200 OK",
        "HTTP/1.1 401 Unauthorized",
        "HTTP/1.1 200 OK",
    ]
    assert answers[1].headers["content-type"] == "application/problem+json"
    assert [a.headers.get("x-cache") for a in (answers[0], answers[2])] == ["HIT", "HIT"]
    assert upstream_calls(upstream) == calls + 1, "the other token went upstream"
    assert b"someone-else-token" not in answers[1].body


async def test_a_purge_reaches_a_connection_that_repeats_the_same_request(
    gateway_factory: GatewayFactory, upstream: TestServer
) -> None:
    client = await gateway_factory(base_url(upstream), admin={"token": ADMIN})
    port = client.port
    assert port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    seen = []
    async with asyncio.timeout(10):
        for step in range(4):
            if step == 2:
                purged = await client.delete(
                    "/admin/cache", headers={"Authorization": f"Bearer {ADMIN}"}
                )
                assert purged.status == 200
            writer.write(request_bytes(LIST))
            seen.append((await read_answer(reader)).headers["x-cache"])
    writer.close()
    await writer.wait_closed()
    assert seen == ["MISS", "HIT", "MISS", "HIT"]


async def test_many_pipelined_hits_a_caller_does_not_read_yet_all_arrive_in_order(
    served: tuple[web.Application, int], monkeypatch: pytest.MonkeyPatch, fast_path: bool
) -> None:
    """Answers a caller does not read fill the socket; the rest wait for it to drain
    (aiohttp's way) instead of piling up in the process, and none is lost."""
    app, port = served
    page = "/expenses?limit=100"  # about 100 KB an answer
    assert (await exchange(port, request_bytes(page)))[0].headers["x-cache"] == "MISS"
    full_reads = count_full_reads(app, monkeypatch)
    server_hits = count_server_hits(monkeypatch)
    count = 200  # about 20 MB of answers, far more than the socket buffers hold
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"".join(request_bytes(page, X_Request_ID=f"r-{n}") for n in range(count)))
    await asyncio.sleep(0.5)  # the gateway writes until the socket is full
    async with asyncio.timeout(30):
        answers = [await read_answer(reader) for _ in range(count)]
    writer.close()
    await writer.wait_closed()
    assert [a.headers["x-request-id"] for a in answers] == [f"r-{n}" for n in range(count)]
    assert {a.headers["x-cache"] for a in answers} == {"HIT"}
    assert len({a.body for a in answers}) == 1
    assert full_reads == [0]
    if fast_path:
        assert 0 < server_hits[0] < count, "some were written at once, the rest waited"
    else:
        assert server_hits == [count]


async def test_a_connection_closes_when_idle_not_while_busy(
    aiohttp_client: AiohttpClient, upstream: TestServer
) -> None:
    """The keep-alive timeout counts from the last answer, whichever way each hit
    is answered."""
    app = create_app(make_settings(base_url(upstream)))
    server = GatewayTestServer(app)
    await server.start_server(keepalive_timeout=1.0)  # the runner's options
    client = cast(Client, await aiohttp_client(server))
    port = client.port
    assert port is not None
    await client.get(LIST, headers=AUTH)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    async with asyncio.timeout(20):
        for _ in range(12):  # 2.4 s of requests, past the timeout from the first
            writer.write(request_bytes(LIST))
            assert (await read_answer(reader)).headers["x-cache"] == "HIT"
            await asyncio.sleep(0.2)
        assert await reader.read() == b"", "closed once idle"
    writer.close()
    await writer.wait_closed()


async def test_a_connection_that_sends_nothing_is_closed_after_the_keep_alive_timeout(
    aiohttp_client: AiohttpClient, upstream: TestServer, fast_path: bool
) -> None:
    """A caller that connects and never sends a request does not hold the connection
    past the keep-alive timeout, either way."""
    app = create_app(make_settings(base_url(upstream)))
    server = GatewayTestServer(app)
    await server.start_server(keepalive_timeout=0.5)
    client = cast(Client, await aiohttp_client(server))
    reader, writer = await asyncio.open_connection("127.0.0.1", client.port)
    async with asyncio.timeout(20):  # a deadline, not a measurement
        assert await reader.read() == b"", "closed, nothing answered"
    writer.close()
    await writer.wait_closed()


@pytest.mark.parametrize("requests", [0, 1, 3])
async def test_a_graceful_stop_closes_the_idle_connections_however_they_were_answered(
    gateway_factory: GatewayFactory, upstream: TestServer, fast_path: bool, requests: int
) -> None:
    """Stopping, in the runner's order (the server's ``pre_shutdown``, then its
    ``shutdown`` with a long grace), closes a kept-alive connection that is idle
    without waiting out the grace: one that sent nothing, one that had a hit, and one
    that had hits around a request the application answered (a target no route
    serves)."""
    client = await gateway_factory(base_url(upstream))
    assert (await client.get(LIST, headers=AUTH)).headers["X-Cache"] == "MISS"
    reader, writer = await asyncio.open_connection("127.0.0.1", client.port)
    targets = [LIST, "/no-such-route", LIST][:requests]
    statuses = []
    for target in targets:
        writer.write(request_bytes(target))
        async with asyncio.timeout(10):
            statuses.append((await read_answer(reader)).status_line)
    assert statuses == ["HTTP/1.1 200 OK", "HTTP/1.1 404 Not Found", "HTTP/1.1 200 OK"][:requests]
    runner = client.server.runner
    assert runner is not None
    assert runner.server is not None
    runner.server.pre_shutdown()
    async with asyncio.timeout(20):  # a deadline, not a measurement
        await runner.server.shutdown(60)
        assert await reader.read() == b"", "closed by the stop"
    writer.close()
    await writer.wait_closed()


async def test_a_stream_of_empty_lines_is_left_to_aiohttp(
    served: tuple[web.Application, int], monkeypatch: pytest.MonkeyPatch, fast_path: bool
) -> None:
    """Empty lines are no request (aiohttp skips them): the hits before and after
    40 000 of them are both answered."""
    app, port = served
    full_reads = count_full_reads(app, monkeypatch)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request_bytes(LIST) + b"\r\n\r\n" * 20_000 + request_bytes(LIST))
    async with asyncio.timeout(10):
        answers = [await read_answer(reader) for _ in range(2)]
    writer.close()
    await writer.wait_closed()
    assert [a.headers["x-cache"] for a in answers] == ["HIT", "HIT"]
    # with the fast path, the first from the bytes; after it the connection is aiohttp's,
    # and the gateway's server answers the hit
    assert full_reads == [0]


async def test_a_request_aiohttp_waits_to_see_the_rest_of_keeps_the_connection_aiohttp_s(
    served: tuple[web.Application, int], fast_path: bool
) -> None:
    """An HTTP/2 preface's first line: aiohttp's parser waits for the rest, then refuses
    it; what follows is not answered as requests of its own."""
    _, port = served
    data = b"PRI * HTTP/2.0\r\n\r\n" + request_bytes(LIST) + request_bytes(LIST)
    (answer,), rest = await send_and_read_all(port, data, 1)
    assert answer.status_line.endswith(" 400 Bad Request")  # aiohttp says HTTP/1.0 here
    assert answer.headers["content-type"] == (
        "application/problem+json" if fast_path else "text/plain; charset=utf-8"
    )
    assert rest == b"", "closed after the 400, nothing answered from the cache"


async def test_proxy_connection_close_is_honoured_as_aiohttp_reads_it(
    served: tuple[web.Application, int],
) -> None:
    """aiohttp reads ``Proxy-Connection`` as ``Connection``: the hit, then the
    connection closed. (A request pipelined behind it: tests/fastpath/test_connection.py;
    plain aiohttp's parser refuses such a pipeline whole.)"""
    _, port = served
    (answer,), rest = await send_and_read_all(
        port, request_bytes(LIST, Proxy_Connection="close"), 1
    )
    assert answer.headers["x-cache"] == "HIT"
    assert answer.headers["connection"] == "close"
    assert rest == b""


async def test_an_unfinished_head_over_the_limits_is_refused_at_once(
    served: tuple[web.Application, int], fast_path: bool
) -> None:
    """A request line longer than the connection's aiohttp limits allow is refused
    while the line is still unfinished (not only once the head ends)."""
    _, port = served
    data = b"GET /expenses?limit=3&x=" + b"a" * 40_000  # no line end, ever
    (answer,), rest = await send_and_read_all(port, data, 1)
    assert answer.status_line.endswith(" 400 Bad Request")  # aiohttp says HTTP/1.0 here
    if fast_path:  # a problem
        assert orjson.loads(answer.body)["type"].endswith("malformed-request")
    else:
        assert answer.headers["content-type"] == "text/plain; charset=utf-8"
    assert rest == b""


async def test_a_field_over_the_connection_s_own_limit_is_refused_not_answered(
    served: tuple[web.Application, int],
) -> None:
    """The served gateway here has aiohttp's default limits (8190 bytes a field): a
    head that passes them is a hit, one that does not is refused."""
    _, port = served
    within, beyond = (request_bytes(LIST, X_Pad="p" * size) for size in (6_000, 10_000))
    answers = await exchange(port, within)
    assert answers[0].headers["x-cache"] == "HIT"
    (answer,), rest = await send_and_read_all(port, beyond, 1)
    assert answer.status_line.endswith(" 400 Bad Request")  # aiohttp says HTTP/1.0 here
    assert "x-cache" not in answer.headers
    assert rest == b""


async def test_hits_pipelined_behind_a_miss_past_aiohttp_s_queue_are_all_answered(
    served: tuple[web.Application, int],
) -> None:
    """More requests behind a miss than aiohttp queues (32): aiohttp takes them all,
    its parser holding back what does not fit, and answers each in turn."""
    _, port = served
    count = 80
    requests = [request_bytes("/expenses?limit=9", X_Request_ID="r-miss")]
    requests += [request_bytes(LIST, X_Request_ID=f"r-{n}") for n in range(count)]
    answers = await exchange(port, *requests)
    assert [a.headers["x-request-id"] for a in answers] == ["r-miss"] + [
        f"r-{n}" for n in range(count)
    ]
    assert answers[0].headers["x-cache"] == "MISS"
    assert {a.headers["x-cache"] for a in answers[1:]} == {"HIT"}


@pytest.mark.parametrize(
    "start",
    [
        b"GET /expenses HTTP/1.1\r\nBad Header\r\n",  # a field line without a colon
        b"G\x01T /expenses HTTP/1.1\r\n",  # a control byte in the method
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  # TLS on the HTTP port
    ],
    ids=["no-colon", "control-byte", "tls"],
)
async def test_an_unfinished_head_aiohttp_refuses_is_refused_at_once(
    served: tuple[web.Application, int], start: bytes
) -> None:
    """Not held until the head ends (or the idle timeout closes the connection without
    a word): aiohttp's parser sees it and answers at once."""
    _, port = served
    (answer,), rest = await send_and_read_all(port, start, 1)
    assert answer.status_line.endswith(" 400 Bad Request")
    assert rest == b""


async def test_requests_behind_a_busy_connection_stay_within_aiohttp_s_queue(
    gateway_factory: GatewayFactory, aiohttp_server: AiohttpServer
) -> None:
    """Heads that arrive while aiohttp handles the connection's earlier request reach
    its parser, which holds back what does not fit its queue (32) rather than each
    becoming a queued request; all are answered, in order."""
    # an upstream slow enough that the first request (a miss) is still being handled
    # while the queue is looked at
    upstream = await aiohttp_server(create_demo_app(latency_ms=300))
    client = await gateway_factory(base_url(upstream))
    port = client.port
    runner = client.server.runner
    assert port is not None
    assert runner is not None
    assert runner.server is not None
    count = 400
    requests = [request_bytes("/expenses?limit=11", X_Request_ID="r-miss")]
    requests += [request_bytes("/healthz", X_Request_ID=f"r-{n}") for n in range(count)]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"".join(requests))
    await writer.drain()
    queued = [0]
    for _ in range(40):  # before anything is read
        queued += [len(cast(Any, c)._messages) for c in runner.server.connections]
        await asyncio.sleep(0.002)
    async with asyncio.timeout(30):
        answers = [await read_answer(reader) for _ in range(count + 1)]
    writer.close()
    await writer.wait_closed()
    assert [a.headers["x-request-id"] for a in answers] == ["r-miss"] + [
        f"r-{n}" for n in range(count)
    ]
    assert 0 < max(queued) <= 32


def upgrading(path: str, protocol: str, **headers: str) -> bytes:
    """A GET of ``path`` asking to switch to ``protocol`` (which the gateway never does)."""
    return request_bytes(path, Upgrade=protocol, Connection="upgrade", **headers)


@pytest.mark.parametrize("protocol", ["foo", "h2c", "websocket"])
@pytest.mark.parametrize("path", [LIST, "/healthz", "/nowhere"])
async def test_requests_pipelined_behind_an_upgrade_are_never_left_unanswered(
    served: tuple[web.Application, int], protocol: str, path: str
) -> None:
    """An ``Upgrade`` the gateway does not take, with two requests behind it in the same
    write: the request is answered (no protocol switch), that answer says
    ``Connection: close``, and the connection closes at once; the requests behind it
    are not left waiting for the keep-alive timeout. (docs/errors.md, "`malformed-request`".)"""
    _, port = served
    data = upgrading(path, protocol, X_Request_ID="r-upgrade")
    data += request_bytes(LIST, X_Request_ID="r-1") + request_bytes(LIST, X_Request_ID="r-2")
    (answer,), rest = await send_and_read_all(port, data, 1)
    assert answer.status_line.startswith("HTTP/1.1 ")
    assert answer.status_line != "HTTP/1.1 101 Switching Protocols"
    assert answer.headers["x-request-id"] == "r-upgrade"
    assert answer.headers["connection"] == "close"
    assert rest == b"", "closed after the answer to the upgrade"


async def test_an_upgrade_sent_alone_is_answered_and_the_connection_closed(
    served: tuple[web.Application, int],
) -> None:
    """The same with nothing pipelined: the caller knows at once that its next request
    needs a new connection."""
    _, port = served
    (answer,), rest = await send_and_read_all(port, upgrading(LIST, "h2c"), 1)
    assert answer.headers["x-cache"] == "HIT"
    assert answer.headers["connection"] == "close"
    assert rest == b""


async def test_an_upgrade_with_an_expectation_the_gateway_does_not_meet_closes_too(
    served: tuple[web.Application, int],
) -> None:
    """Refused before any handler runs (the 417 of an ``Expect`` other than
    100-continue): still the answer, then the connection closed."""
    _, port = served
    data = upgrading(LIST, "foo", Expect="foo") + request_bytes(LIST)
    (answer,), rest = await send_and_read_all(port, data, 1)
    assert answer.status_line == "HTTP/1.1 417 Expectation Failed"
    assert answer.headers["connection"] == "close"
    assert rest == b""


MALFORMED = b"GET /users HTTP/1.1\r\nBad Header\r\n\r\n"


@pytest.mark.parametrize(
    ("first", "behind"),
    [
        (request_bytes(LIST, X_Request_ID="r-0"), 1),
        # a request that may announce a body hands the fast path's connection to
        # aiohttp: what follows it is still answered up to the malformed one
        (request_bytes(LIST, X_Request_ID="r-0", Content_Length="0"), 1),
        (request_bytes(LIST, X_Request_ID="r-0", Content_Length="0"), 40),
        (
            request_bytes("/users", method="POST", X_Request_ID="r-0", Content_Length="4")
            + b"\r\n\r\n",
            1,
        ),
    ],
    ids=["plain-gets", "behind-a-content-length", "past-aiohttp-s-queue", "behind-a-body"],
)
async def test_requests_in_the_same_write_ahead_of_a_malformed_one_are_answered_first(
    gateway_factory: GatewayFactory,
    upstream: TestServer,
    monkeypatch: pytest.MonkeyPatch,
    fast_path: bool,
    first: bytes,
    behind: int,
) -> None:
    """Requests, then a head aiohttp's parser refuses, then a valid request, in one
    write, to the gateway listening as ``serve`` listens (gateway.process.listener):
    each request ahead of it is answered, in order, then the 400, then the connection
    closes (the request behind it is not answered), with the fast path and without
    it. (docs/errors.md, "`malformed-request`".)"""
    filter_parser_log(monkeypatch)
    client = await gateway_factory(base_url(upstream))
    for path in (LIST, ACCOUNT):
        assert (await client.get(path, headers=AUTH)).headers["X-Cache"] == "MISS"
    runner = client.server.runner
    assert isinstance(runner, web.AppRunner)
    listener = await listen(runner, "127.0.0.1", 0)
    try:
        port = listener.sockets[0].getsockname()[1]
        ahead = [f"r-{n}" for n in range(behind + 1)]
        data = first + b"".join(request_bytes(LIST, X_Request_ID=rid) for rid in ahead[1:])
        data += MALFORMED + request_bytes(LIST, X_Request_ID="r-behind")
        *answered, refused = await answers_until_closed(port, data)
    finally:
        listener.close()
    ids = [a.headers["x-request-id"] for a in answered]
    assert ids == ahead
    assert [a.headers.get("x-cache") for a in answered[1:]] == ["HIT"] * (len(answered) - 1)
    assert refused.status_line == "HTTP/1.0 400 Bad Request"


async def answers_until_closed(port: int, data: bytes) -> list[Answer]:
    """``data`` sent on a new connection: every answer until the gateway closes it
    (a hang fails the test)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    answers = []
    try:
        async with asyncio.timeout(10):
            while True:
                try:
                    answers.append(await read_answer(reader))
                except asyncio.IncompleteReadError as exc:
                    left = exc.partial
                    break
    finally:
        writer.close()
        await writer.wait_closed()
    assert left == b"", "an answer cut short"
    return answers


async def test_a_malformed_request_ahead_of_valid_ones_is_refused_and_the_connection_closed(
    served: tuple[web.Application, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other order: the 400 first, the connection closed, nothing behind it
    answered (nothing after a malformed head can be told apart as a request)."""
    filter_parser_log(monkeypatch)
    _, port = served
    data = MALFORMED + request_bytes(LIST) + request_bytes(LIST)
    (refused,), rest = await send_and_read_all(port, data, 1)
    assert refused.status_line == "HTTP/1.0 400 Bad Request"
    assert rest == b""


@pytest.mark.parametrize(
    "raw",
    [
        b"GET /users HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer wrong-secret\x01-token\r\n\r\n",
        b"GET /users HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer wrong-secret-token"
        + b"x" * 40_000
        + b"\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03wrong-secret-token\r\n\r\n",
    ],
    ids=["control-byte", "too-long", "tls"],
)
async def test_without_the_fast_path_a_request_the_http_parser_rejects_gets_aiohttp_s_400(
    upstream: TestServer, monkeypatch: pytest.MonkeyPatch, raw: bytes
) -> None:
    """Served as plain aiohttp (``server.fast_path`` off): aiohttp's own 400, then the
    connection closed. (With the fast path it is a problem that quotes nothing of the
    request: tests/fastpath/test_connection.py.)"""
    filter_parser_log(monkeypatch)
    app = create_app(make_settings(base_url(upstream), server={"fast_path": False}))
    client: Client = TestClient(GatewayTestServer(app))
    await client.start_server()
    try:
        port = client.port
        assert port is not None
        (answer,), rest = await send_and_read_all(port, raw, 1)
    finally:
        await client.close()
    assert answer.status_line == "HTTP/1.0 400 Bad Request"
    assert "x-request-id" not in answer.headers  # aiohttp's, not the gateway's
    assert rest == b"", "closed after the 400"


Answerer = Callable[..., Awaitable[tuple[str, bytes]]]


def raw_answerer(port: int) -> Answerer:
    """Ask the gateway for ``target`` as sent (with ``extra`` header lines) on a
    connection of its own: the status line and the body (a problem's request id
    and instance, which differ per request and spelling, blanked)."""

    async def answer(target: str, *extra: str) -> tuple[str, bytes]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        lines = [f"GET {target} HTTP/1.1", "Host: g", f"Authorization: {AUTH['Authorization']}"]
        writer.write(("\r\n".join([*lines, *extra]) + "\r\n\r\n").encode())
        async with asyncio.timeout(10):
            got = await read_answer(reader)
        writer.close()
        await writer.wait_closed()
        body = got.body
        if got.headers["content-type"] == "application/problem+json":
            body = orjson.dumps({**orjson.loads(body), "requestId": "-", "instance": "-"})
        return got.status_line, body

    return answer


async def test_a_path_the_router_reads_otherwise_gets_the_router_s_answer(
    gateway_factory: GatewayFactory, upstream: TestServer
) -> None:
    """Accounts' answers cached: every spelling of their paths gets what a request
    with a Cache-Control the gateway ignores gets (the route's handler's answer to
    what aiohttp's router made of it), a 200 or the router's 404; ``%2F`` is no
    path separator to the router, but is one inside an id."""
    client = await gateway_factory(base_url(upstream))
    port = client.port
    assert port is not None
    answer = raw_answerer(port)
    log = upstream.app[REQUEST_LOG]
    for account in ("Caja%20chica%20Bogot%C3%A1", "ACC-002"):
        primed = await client.get(f"/accounts/{account}", headers=AUTH)
        assert primed.status == 200
        for target in (
            f"/accounts/{account}",
            f"/%61ccounts/{account}",
            f"/accounts%2F{account}",
            f"/accounts%2f{account}",
            f"/accounts//{account}",
            f"/accounts/{account}/",
            f"/accounts/{account}%2F",
            f"http://g/accounts%2F{account}",
            f"http://g/accounts/{account}",
        ):
            plain = await answer(target)
            full = await answer(target, "Cache-Control: max-age=60")
            assert plain == full, target
            assert plain[0] in ("HTTP/1.1 200 OK", "HTTP/1.1 404 Not Found"), target
    # the router gives /accounts%2FACC-002 to no route: its 404, and no upstream call
    calls = len(log)
    status_line, body = await answer("/accounts%2FACC-002")
    assert status_line == "HTTP/1.1 404 Not Found"
    assert orjson.loads(body)["detail"].startswith("no such route")
    assert len(log) == calls
    # and /accounts/a%2Fb to the account route, with the id a/b
    status_line, body = await answer("/accounts/a%2Fb")
    assert status_line == "HTTP/1.1 404 Not Found"
    assert orjson.loads(body)["title"] == "Record not found"
    assert [entry.raw_path for entry in list(log.entries)[calls:]] == ["/accounts/a%2Fb"]


def parsed_request(app: web.Application, target: str) -> web.Request:
    """A GET of ``target`` (origin-form) with the URL aiohttp's HTTP parser makes of it."""
    path, _, query = target.partition("?")
    url = URL.build(path=path, query_string=query, encoded=True)
    return make_mocked_request("GET", "/", app=app).clone(rel_url=url)


def encoded(text: str, how: int) -> str:
    """``text`` as sent: 0 as it is, 1 every character percent-encoded upper-case, 2
    lower-case."""
    if how == 0:
        return text
    escaped = "".join(f"%{byte:02X}" for byte in text.encode())
    return escaped if how == 1 else escaped.lower()


ID_CHARACTERS = ["a", "Z", "0", "-", ".", "_", "~", "+", ";", " ", "/", "%", "{", "}", "ñ", "?"]
# ids the upstream has (the gateway below holds their answers): a plain spelling of
# one is a hit the fast path may answer from the bytes
KNOWN_IDS = ["ACC-002", "Caja chica Bogotá"]
BY_TEMPLATE = {route.template: route for route in ROUTES}
HOWS = st.sampled_from([0, 1, 2])


@st.composite
def targets(draw: st.DrawFn) -> str:
    """A request target: ``/`` parent, separator, id and tail, each part spelt one
    way or another; mostly near a record route's path (a list route's, or an id
    route's with a random or a known id), the rest anything of these parts."""
    kind = draw(st.sampled_from(["list", "id", "anything"]))
    parents = {"list": ["accounts", "expenses", "users"], "id": ["accounts", "expenses"]}
    parent = draw(
        st.sampled_from(parents.get(kind, ["accounts", "expenses", "healthz", "other", ""]))
    )
    parent_how = draw(st.sampled_from([0, 0, 0, 1, 2]) if kind != "anything" else HOWS)
    if kind == "list":
        separator, id_parts = "", []
    else:
        separator = draw(st.sampled_from(["/"] * 5 + ["%2F", "%2f", "//", ""]))
        plain_known = st.sampled_from(KNOWN_IDS).map(lambda id_: [(c, 0) for c in id_])
        spelt_known = st.sampled_from(KNOWN_IDS).flatmap(
            lambda id_: st.tuples(*(st.tuples(st.just(c), HOWS) for c in id_)).map(list)
        )
        random_id = st.lists(st.tuples(st.sampled_from(ID_CHARACTERS), HOWS), max_size=6)
        id_parts = draw(st.one_of(plain_known, spelt_known, random_id))
    tail = draw(st.sampled_from(["", "", "", "/", "?limit=1", "%2F"]))
    # the id's characters: unreserved ones may go as they are, the rest always encoded
    segment = "".join(
        encoded(c, how if how or (c.isascii() and (c.isalnum() or c in "-._~+;")) else 1)
        for c, how in id_parts
    )
    return "/" + encoded(parent, parent_how) + separator + segment + tail


@pytest.fixture
async def routed(
    gateway_factory: GatewayFactory, upstream: TestServer
) -> tuple[web.Application, int, TestServer]:
    """A gateway shared by every example of the property test below (its cache fills
    as they run, so a wrongly routed hit would find another's entry)."""
    client = await gateway_factory(base_url(upstream))
    port = client.port
    assert port is not None
    for path in ("/accounts/ACC-002", "/accounts/Caja%20chica%20Bogot%C3%A1", "/expenses"):
        assert (await client.get(path, headers=AUTH)).status == 200
    return client.app, port, upstream


@settings(
    max_examples=examples(400),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(target=targets())
async def test_the_gateway_answers_a_path_as_aiohttp_s_router_routes_it(
    routed: tuple[web.Application, int, TestServer], target: str
) -> None:
    """For any path, asked twice (the second a hit the fast path may answer from the
    bytes): the answer is that of the route and id aiohttp's router gives it (the
    same as for the route's plain spelling of that id), the upstream is asked for
    that id and nothing else, and a path the router gives no record route never
    reaches the upstream."""
    app, port, upstream = routed
    answer = raw_answerer(port)
    log = upstream.app[REQUEST_LOG]
    match = await app.router.resolve(parsed_request(app, target))
    resource = match.route.resource
    route = BY_TEMPLATE.get(resource.canonical) if resource is not None else None
    calls = len(log)
    first = await answer(target)
    second = await answer(target)
    assert second == first, target
    if route is None or match.http_exception is not None:
        assert len(log) == calls, target
        if isinstance(resource, Unrouted):  # what no route takes
            assert first[0] == "HTTP/1.1 404 Not Found", target
            assert orjson.loads(first[1])["detail"].startswith("no such route"), target
        return
    if route.path_param:
        upstream_path = route.template.split("{", 1)[0] + encode_segment(match[route.path_param])
    else:
        upstream_path = route.template
    _, _, query = target.partition("?")
    canonical = upstream_path + ("?" + query if query else "")
    assert await answer(canonical) == first, (target, canonical)
    asked = {entry.raw_path.partition("?")[0] for entry in list(log.entries)[calls:]}
    assert asked <= {upstream_path}, target
